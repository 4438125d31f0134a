//! The OpenAPI document as served: what the handlers' annotations cannot say by themselves,
//! added once for every operation (the answers of the shared layers, path ids, closed request
//! bodies, the configured long-poll bound, the create→get/act links).

use utoipa::openapi::OpenApi;

/// Complete the generated document (before the server reads its parameters from it).
pub(crate) fn shape(doc: &mut OpenApi, max_wait_ms: u64) {
    common_answers(doc);
    path_parameters(doc);
    wait_bound(doc, max_wait_ms);
    links(doc);
    closed_bodies(doc);
}

/// The document as served.
pub(crate) fn to_json(doc: &OpenApi) -> String {
    links_in_camel_case(doc)
}

/// A string schema of `min..=max` printable characters (no control characters: what
/// `char::is_control` refuses), as the handlers check text.
pub(crate) fn printable_string(min: usize, max: usize) -> utoipa::openapi::schema::Object {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(min))
        .max_length(Some(max))
        .pattern(Some(if min == 0 {
            PRINTABLE_OR_EMPTY
        } else {
            PRINTABLE
        }))
        .build()
}

/// The schemas of the [`crate::request::OneOf`]s: a string, one of the enum's names. A field
/// names its own (`#[schema(inline, value_type = openapi::SinkName)]`), so its description is
/// the field's. (An optional one that may be `null` says its names as a pattern with
/// `value_type = Option<String>`: utoipa would wrap an inline nullable enum in a `oneOf` the
/// client generators read as any value.)
macro_rules! name_schemas {
    ($($schema:ident = $n:ident),* $(,)?) => {$(
        #[doc = concat!("The names of [`", stringify!($n), "`].")]
        pub(crate) struct $schema;

        impl utoipa::PartialSchema for $schema {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                use utoipa::openapi::schema::{ObjectBuilder, Type};
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(
                        tidemark_projections::names::$n::ALL.iter().map(|n| n.as_str()),
                    ))
                    .into()
            }
        }

        impl utoipa::ToSchema for $schema {}
    )*};
}

name_schemas!(
    SinkName = Sink,
    BridgeModeName = BridgeMode,
    DeliveryStatusName = DeliveryStatus,
    TaskStatusName = TaskStatus,
    SourceStateName = SourceState,
    PriorityName = Priority,
);

pub(crate) const PRINTABLE: &str = "^[^\\x00-\\x1F\\x7F-\\x9F]+$";
const PRINTABLE_OR_EMPTY: &str = "^[^\\x00-\\x1F\\x7F-\\x9F]*$";

/// Every path parameter is a resource id or name the handlers check as 1–128 printable
/// characters (`request::PathId`, `request::path_id`; anything else is `400 invalid_path`).
fn path_parameters(doc: &mut OpenApi) {
    use utoipa::openapi::path::ParameterIn;
    for (_, op) in operations(doc) {
        for p in op.parameters.iter_mut().flatten() {
            if matches!(p.parameter_in, ParameterIn::Path) {
                p.schema = Some(printable_string(1, 128).into());
            }
        }
    }
}

/// Every operation of `doc`, with its path.
pub(crate) fn operations(
    doc: &mut OpenApi,
) -> impl Iterator<Item = (&str, &mut utoipa::openapi::path::Operation)> {
    doc.paths.paths.iter_mut().flat_map(|(path, i)| {
        [
            &mut i.get,
            &mut i.put,
            &mut i.post,
            &mut i.delete,
            &mut i.patch,
        ]
        .into_iter()
        .flatten()
        .map(move |op| (path.as_str(), op))
    })
}

/// `wait_ms` is bounded by `server.max_wait_ms` of this server's configuration.
fn wait_bound(doc: &mut OpenApi, max_wait_ms: u64) {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    for (_, op) in operations(doc) {
        for p in op.parameters.iter_mut().flatten() {
            if p.name == "wait_ms" {
                p.schema = Some(
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .minimum(Some(0))
                        .maximum(Some(max_wait_ms as f64))
                        .into(),
                );
            }
        }
    }
}

/// The create→get/act chains of the API as OpenAPI `links`: what a client (or a stateful
/// fuzzer) does next with an answer. One link a line: the operation and status it is on, its
/// name, the operation it leads to, then `parameter=expression` pairs and, last, `body=` and
/// the next call's body as JSON; expressions are runtime expressions over the answer and the
/// request.
const LINKS: &str = r##"
createBridgeSubscription 201 GetSubscription getBridgeSubscription id=$request.path.id subscription_id=$response.body#/subscription_id
createBridgeSubscription 201 ExplainSubscription explainBridgeSubscription id=$request.path.id subscription_id=$response.body#/subscription_id
createBridgeSubscription 201 DeleteSubscription deleteBridgeSubscription id=$request.path.id subscription_id=$response.body#/subscription_id
createBridgeSubscription 201 PullDeliveries pullBridgeDeliveries bridge_id=$response.body#/bridge_id
createBridgeSubscription 200 GetSubscription getBridgeSubscription id=$request.path.id subscription_id=$response.body#/subscription_id
listBridgeSubscriptions 200 GetSubscription getBridgeSubscription id=$request.path.id subscription_id=$response.body#/subscriptions/0/subscription_id
pullBridgeDeliveries 200 AckDelivery ackBridgeDelivery bridge_id=$request.path.bridge_id delivery_id=$response.body#/deliveries/0/delivery_id
pullBridgeDeliveries 200 NackDelivery nackBridgeDelivery bridge_id=$request.path.bridge_id delivery_id=$response.body#/deliveries/0/delivery_id
claimDeliveries 200 CompleteDelivery completeDelivery id=$response.body#/deliveries/0/id body={"owner": "$request.body#/owner"}
claimDeliveries 200 FailDelivery failDelivery id=$response.body#/deliveries/0/id body={"owner": "$request.body#/owner", "error_code": "fuzz", "retryable": false}
claimDeliveries 200 ExtendDeliveryLease extendDeliveryLease id=$response.body#/deliveries/0/id body={"owner": "$request.body#/owner"}
claimDeliveries 200 GetDelivery getDelivery id=$response.body#/deliveries/0/id
listDeliveries 200 GetDelivery getDelivery id=$response.body#/deliveries/0/id
listDeliveries 200 RetryDelivery retryDelivery id=$response.body#/deliveries/0/id
listDeliveries 200 DiscardDelivery discardDelivery id=$response.body#/deliveries/0/id
failDelivery 200 RetryDelivery retryDelivery id=$request.path.id
listTasks 200 GetTask getTask id=$response.body#/tasks/0/task_id
listTasks 200 ListSubscriptions listBridgeSubscriptions id=$response.body#/tasks/0/task_id
listNotifications 200 GetNotificationStatus getNotificationStatus id=$response.body#/notifications/0/notification_id
listSources 200 GetSource getSource name=$response.body#/sources/0/name
listSources 200 PollSource pollSource name=$response.body#/sources/0/name
listProjections 200 VerifyProjection verifyProjection name=$response.body#/projections/0/name
listProjections 200 RebuildProjection rebuildProjection name=$response.body#/projections/0/name
"##;

/// utoipa 5.5 writes a link's `operationId` and `requestBody` as `operation_id` and
/// `request_body`, which OpenAPI readers do not know: rename them in the served document.
fn links_in_camel_case(doc: &OpenApi) -> String {
    let Ok(mut v) = serde_json::to_value(doc) else {
        return "{}".into();
    };
    let links = v["paths"]
        .as_object_mut()
        .into_iter()
        .flat_map(|p| p.values_mut())
        .filter_map(|item| item.as_object_mut())
        .flat_map(|item| item.values_mut())
        .filter_map(|op| op.get_mut("responses").and_then(|r| r.as_object_mut()))
        .flat_map(|r| r.values_mut())
        .filter_map(|resp| resp.get_mut("links").and_then(|l| l.as_object_mut()))
        .flat_map(|l| l.values_mut())
        .filter_map(|link| link.as_object_mut());
    for link in links {
        for (from, to) in [
            ("operation_id", "operationId"),
            ("request_body", "requestBody"),
        ] {
            if let Some(x) = link.remove(from) {
                link.insert(to.to_owned(), x);
            }
        }
    }
    plain_inline_schemas(&mut v);
    serde_json::to_string_pretty(&v).unwrap_or_else(|_| "{}".into())
}

/// utoipa wraps an inline schema that has its own description (a field of a bounded type such
/// as [`crate::request::Text`]) in a one-element `oneOf`, and an optional one in `oneOf` with
/// `null`: written out as the plain schema (`type: [string, null]` for the optional one), as
/// the same field declared with attributes reads.
fn plain_inline_schemas(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::Array(items) => items.iter_mut().for_each(plain_inline_schemas),
        Value::Object(map) => {
            map.values_mut().for_each(plain_inline_schemas);
            if map.contains_key("type") || map.contains_key("$ref") {
                return;
            }
            let Some(Value::Array(one_of)) = map.get("oneOf") else {
                return;
            };
            let is_null = |s: &Value| {
                s.as_object()
                    .is_some_and(|o| o.len() == 1 && o.get("type") == Some(&Value::from("null")))
            };
            let (inner, nullable) = match one_of.as_slice() {
                [only] => (only.clone(), false),
                [a, b] if is_null(a) => (b.clone(), true),
                [a, b] if is_null(b) => (a.clone(), true),
                _ => return,
            };
            let Value::Object(mut inner) = inner else {
                return;
            };
            let Some(Value::String(ty)) = inner.get("type").cloned() else {
                return;
            };
            if nullable {
                inner.insert("type".into(), Value::from(vec![ty, "null".to_owned()]));
            }
            map.remove("oneOf");
            for (k, x) in inner {
                map.entry(k).or_insert(x);
            }
        }
        _ => {}
    }
}

fn links(doc: &mut OpenApi) {
    use utoipa::openapi::RefOr;
    use utoipa::openapi::link::LinkBuilder;
    for line in LINKS.lines().filter(|l| !l.is_empty()) {
        let (line, body) = line
            .split_once(" body=")
            .map_or((line, None), |(l, b)| (l, Some(b)));
        let mut words = line.split(' ');
        let mut next = || {
            words
                .next()
                .expect("a link names from, status, name and to")
        };
        let (from, status, name, to) = (next(), next(), next(), next());
        let mut link = LinkBuilder::new().operation_id(to);
        for (p, expr) in words.filter_map(|w| w.split_once('=')) {
            link = link.parameter(p, expr);
        }
        if let Some(b) = body {
            let v: serde_json::Value = serde_json::from_str(b).expect("a link body is JSON");
            link = link.request_body(Some(v));
        }
        let op = operations(doc).find(|(_, op)| op.operation_id.as_deref() == Some(from));
        let Some((_, op)) = op else {
            panic!("link {name}: no operation {from}");
        };
        let Some(RefOr::T(resp)) = op.responses.responses.get_mut(status) else {
            panic!("link {name}: {from} documents no {status}");
        };
        resp.links.insert(name.to_owned(), RefOr::T(link.build()));
    }
}

/// Every request body type refuses fields it does not know (`deny_unknown_fields`, `400`), so
/// its schema says `additionalProperties: false`; so do the objects it holds.
fn closed_bodies(doc: &mut OpenApi) {
    use utoipa::openapi::RefOr;
    use utoipa::openapi::schema::{AdditionalProperties, ArrayItems, Schema};
    fn refs_in(s: &RefOr<Schema>, out: &mut Vec<String>) {
        match s {
            RefOr::Ref(r) => out.extend(
                r.ref_location
                    .strip_prefix("#/components/schemas/")
                    .map(str::to_owned),
            ),
            RefOr::T(Schema::Object(o)) => o.properties.values().for_each(|p| refs_in(p, out)),
            RefOr::T(Schema::Array(a)) => {
                if let ArrayItems::RefOrSchema(i) = &a.items {
                    refs_in(i, out);
                }
            }
            RefOr::T(Schema::OneOf(o)) => o.items.iter().for_each(|i| refs_in(i, out)),
            _ => {}
        }
    }
    let mut todo = Vec::new();
    for item in doc.paths.paths.values() {
        for op in [&item.post, &item.put, &item.patch].into_iter().flatten() {
            for c in op.request_body.iter().flat_map(|b| b.content.values()) {
                if let Some(s) = &c.schema {
                    refs_in(s, &mut todo);
                }
            }
        }
    }
    let Some(components) = doc.components.as_mut() else {
        return;
    };
    let mut done = std::collections::BTreeSet::new();
    while let Some(name) = todo.pop() {
        if !done.insert(name.clone()) {
            continue;
        }
        let Some(schema) = components.schemas.get_mut(&name) else {
            continue;
        };
        let closed = Some(Box::new(AdditionalProperties::FreeForm(false)));
        match schema {
            RefOr::T(Schema::Object(o)) if !o.properties.is_empty() => {
                o.additional_properties = closed;
            }
            // An untagged enum of bodies (`POST /v1/events`: a batch or one event).
            RefOr::T(Schema::OneOf(one)) => {
                for item in &mut one.items {
                    if let RefOr::T(Schema::Object(o)) = item {
                        o.additional_properties = closed.clone();
                    }
                }
            }
            _ => {}
        }
        refs_in(schema, &mut todo);
    }
}

/// Document on every operation the answers the shared layers give (the same for all, so they
/// are declared here once rather than on each handler): `400` for a malformed query or an
/// unknown parameter; with a body `413`, `415` and `422`; behind a token `401`, `403` and the
/// token's rate limit `429`; with path parameters `404`; and `503` while the server stops or
/// its storage fails. A handler's own description of a code is kept.
fn common_answers(doc: &mut OpenApi) {
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
    let problem = |what: &str| {
        ResponseBuilder::new()
            .description(what)
            .content(
                "application/problem+json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("Problem")))
                    .build(),
            )
            .build()
    };
    for (path, op) in operations(doc) {
        let mut codes: Vec<(&str, &str)> = vec![
            (
                "400",
                "Malformed request: a bad or unknown query parameter or header",
            ),
            ("503", "Shutting down, or the storage is unavailable"),
        ];
        if op.request_body.is_some() {
            codes.extend([
                ("413", "The body is larger than server.max_body_bytes"),
                ("415", "The body is not Content-Type: application/json"),
                ("422", "A field of the body is invalid"),
            ]);
        }
        let secured = op.security.as_ref().is_some_and(|s| !s.is_empty());
        if secured {
            codes.extend([
                (
                    "401",
                    "No token, or not a valid one (WWW-Authenticate: Bearer)",
                ),
                ("403", "The token lacks the scope this operation needs"),
                ("429", "The token's rate limit is spent (Retry-After)"),
            ]);
        }
        if path.contains('{') {
            codes.push(("404", "No such resource"));
        }
        for (code, what) in codes {
            op.responses
                .responses
                .entry(code.to_owned())
                .or_insert_with(|| problem(what).into());
        }
    }
}
