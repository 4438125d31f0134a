//! The body of `POST /v1/events`: one event or a batch, read once from its bytes when it is
//! valid and canonical, else the long way (a value tree), which finds and words every error.

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;
use tidemark_log::{NewEvent, limits};
use tidemark_projections::names::EventType;
use tidemark_projections::schema::{self, SchemaError};

use axum::http::StatusCode;

use super::EventInput;
use crate::error::ApiError;

/// Turn one JSON event into a validated [`NewEvent`], or the error for it.
fn to_new_event(index: usize, v: Value) -> Result<NewEvent, ApiError> {
    let input: EventInput = serde_json::from_value(v).map_err(|e| {
        ApiError::bad_request("malformed_json", format!("event {index}: {e}")).at(index, None)
    })?;
    let payload = input
        .payload
        .unwrap_or_else(|| Value::Object(Default::default()));
    let event_id = event_id_of(index, input.event_id, &input.subject, &input.event_type)?;
    let ev = NewEvent::new(
        event_id,
        input.stream,
        input.subject,
        input.event_type,
        &payload,
    )
    .map_err(|e| {
        let too_large = e.kind == tidemark_log::InvalidKind::TooLarge;
        let (status, code) = if too_large {
            (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large")
        } else {
            (StatusCode::BAD_REQUEST, "invalid_field")
        };
        ApiError::new(status, code, format!("event {index}: {e}")).at(index, Some(e.field))
    })?;
    check_schema(index, &ev, &payload)?;
    Ok(ev)
}

/// The event's id by the API's own rules: a notification's id is its subject (taken from it
/// when absent, refused when another), and tidemark's id prefixes are its own.
fn event_id_of(
    index: usize,
    event_id: Option<String>,
    subject: &str,
    event_type: &str,
) -> Result<Option<String>, ApiError> {
    let mut event_id = event_id;
    if event_type == EventType::NotificationRequested.as_str() {
        match &event_id {
            None if !subject.is_empty() => event_id = Some(subject.to_owned()),
            Some(id) if id != subject => {
                return Err(ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "schema_violation",
                    format!(
                        "event {index}: a notification.requested event's subject must equal its event_id (the notification id)"
                    ),
                )
                .at(index, Some("subject")));
            }
            _ => {}
        }
    }
    if let Some(id) = &event_id
        && let Some(prefix) = tidemark_projections::names::ids::RESERVED_PREFIXES
            .iter()
            .find(|p| id.starts_with(**p))
    {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "reserved_event_id",
            format!("event {index}: event_ids starting with {prefix:?} are made by tidemark only"),
        )
        .at(index, Some("event_id")));
    }
    Ok(event_id)
}

/// The schema of tidemark's own types (section 2); `payload` is read only for those
/// ([`schema::reads_payload`]).
fn check_schema(index: usize, ev: &NewEvent, payload: &Value) -> Result<(), ApiError> {
    schema::check_client_event(&ev.stream, &ev.subject, &ev.event_type, payload).map_err(
        |e| match e {
            SchemaError::ServerOnly(_) => ApiError::new(
                StatusCode::FORBIDDEN,
                "server_only_type",
                format!("event {index}: {e}"),
            )
            .at(index, Some("type")),
            SchemaError::Invalid(_) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "schema_violation",
                format!("event {index}: {e}"),
            )
            .at(index, Some("payload")),
        },
    )
}

/// Parse and validate a whole request body; nothing is appended unless all of it is valid.
///
/// A body is read once, from its bytes into the events to append, with each payload kept as
/// the client's text when it is already canonical ([`NewEvent::from_json_text`]). Anything
/// that path does not take (a malformed body, an invalid event, a duplicate key) is read again
/// the long way, through a value tree, which finds the error and words it: the answers and the
/// stored bytes are the same either way.
pub fn parse_append_body(body: &[u8]) -> Result<Vec<NewEvent>, ApiError> {
    match parse_once(body) {
        Some(events) => Ok(events),
        None => parse_the_long_way(body),
    }
}

/// An event as sent, its payload borrowed from the body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Sent<'a> {
    event_id: Option<String>,
    stream: String,
    #[serde(default)]
    subject: String,
    #[serde(rename = "type")]
    event_type: String,
    #[serde(borrow)]
    payload: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SentBatch<'a> {
    #[serde(borrow)]
    events: Vec<Sent<'a>>,
}

/// The events of a valid body, or `None` for the long way to judge.
fn parse_once(body: &[u8]) -> Option<Vec<NewEvent>> {
    // serde reads a struct from an array too; the long way takes an object only.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return None;
    }
    let sent = match serde_json::from_slice::<SentBatch<'_>>(body) {
        Ok(batch) => batch.events,
        Err(_) => vec![serde_json::from_slice::<Sent<'_>>(body).ok()?],
    };
    if sent.is_empty() || sent.len() > limits::BATCH_MAX_EVENTS {
        return None;
    }
    sent.into_iter()
        .map(|e| {
            let payload: &RawValue = match e.payload {
                Some(p) => p,
                None => empty_object(),
            };
            // A deep payload is the long way's to judge: the whole body through a value tree
            // meets serde_json's recursion limit where it always has.
            if tidemark_log::canonical::nesting_depth(payload.get())
                > tidemark_log::canonical::MAX_DEPTH
            {
                return None;
            }
            // The same rules as the long way; their errors are its to word.
            let event_id = event_id_of(0, e.event_id, &e.subject, &e.event_type).ok()?;
            let ev = NewEvent::from_json_text(event_id, e.stream, e.subject, e.event_type, payload)
                .ok()?;
            let parsed: Value = if schema::reads_payload(&ev.event_type) {
                serde_json::from_str(payload.get()).ok()?
            } else {
                Value::Null
            };
            check_schema(0, &ev, &parsed).ok()?;
            Some(ev)
        })
        .collect()
}

fn empty_object() -> &'static RawValue {
    serde_json::from_str("{}").expect("an empty object is JSON")
}

/// The body through a value tree: every error found and worded.
fn parse_the_long_way(body: &[u8]) -> Result<Vec<NewEvent>, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request("malformed_json", format!("the body is not JSON: {e}"))
    })?;
    let Value::Object(mut obj) = v else {
        return Err(ApiError::bad_request(
            "malformed_json",
            "the body must be an event object or {\"events\": [...]}",
        ));
    };
    let raw: Vec<Value> = if obj.contains_key("events") {
        if obj.len() != 1 {
            return Err(ApiError::bad_request(
                "malformed_json",
                "a batch body has the single key \"events\"",
            ));
        }
        match obj.remove("events") {
            Some(Value::Array(items)) => items,
            _ => {
                return Err(ApiError::bad_request(
                    "malformed_json",
                    "\"events\" must be an array of event objects",
                ));
            }
        }
    } else {
        vec![Value::Object(obj)]
    };
    if raw.is_empty() {
        return Err(ApiError::bad_request(
            "empty_batch",
            "the batch has no events",
        ));
    }
    if raw.len() > limits::BATCH_MAX_EVENTS {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "batch_too_large",
            format!(
                "the batch has {} events, more than the {} allowed",
                raw.len(),
                limits::BATCH_MAX_EVENTS
            ),
        ));
    }
    raw.into_iter()
        .enumerate()
        .map(|(i, v)| to_new_event(i, v))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn outcome(r: Result<Vec<NewEvent>, ApiError>) -> String {
        match r {
            Ok(evs) => evs
                .iter()
                .map(|e| {
                    format!(
                        "{:?}|{}|{}|{}|{}",
                        e.event_id,
                        e.stream,
                        e.subject,
                        e.event_type,
                        String::from_utf8_lossy(e.payload_bytes())
                    )
                })
                .collect::<Vec<_>>()
                .join("\n"),
            Err(e) => format!("{} {:?}", e.status, e.problem),
        }
    }

    fn one_of(values: &'static [&'static str]) -> impl Strategy<Value = Option<String>> {
        prop::option::weighted(0.8, prop::sample::select(values).prop_map(str::to_owned))
    }

    /// An event's fields, each present or not, mostly well-formed.
    fn event() -> impl Strategy<Value = String> {
        (
            one_of(&[
                r#""event_id":"e-1""#,
                r#""event_id":"n1""#,
                r#""event_id":"dlv:x""#,
                r#""event_id":"ntf:n1""#,
                r#""event_id":null"#,
                r#""event_id":7"#,
            ]),
            one_of(&[
                r#""stream":"orders""#,
                r#""stream":"notifications""#,
                r#""stream":"Bad""#,
            ]),
            one_of(&[
                r#""subject":"n1""#,
                r#""subject":"a\u0007""#,
                r#""subject":"""#,
            ]),
            one_of(&[
                r#""type":"order.placed""#,
                r#""type":"notification.requested""#,
                r#""type":"delivery.sent""#,
                r#""type":"task.created""#,
            ]),
            one_of(&[
                r#""payload":{"a":1,"b":"x"}"#,
                r#""payload":{"b":1,"a":[1,2.5,"x"]}"#,
                r#""payload":{"a":1,"b":"\u0041"}"#,
                r#""payload":{ "a" : 1 }"#,
                r#""payload":{"priority":"info","recipient":"u1","title":"Hi"}"#,
                r#""payload":{"recipient":"u1","title":"Hi"}"#,
                r#""payload":[1]"#,
                r#""payload":null"#,
                r#""payload":{"a":1,"a":2}"#,
            ]),
            prop::option::weighted(0.1, Just(r#""extra":1"#.to_owned())),
            any::<bool>(),
        )
            .prop_map(|(id, stream, subject, ty, payload, extra, reversed)| {
                let mut f: Vec<String> = [id, stream, subject, ty, payload, extra]
                    .into_iter()
                    .flatten()
                    .collect();
                if reversed {
                    f.reverse();
                }
                format!("{{{}}}", f.join(","))
            })
    }

    fn body() -> impl Strategy<Value = String> {
        prop_oneof![
            event(),
            prop::collection::vec(event(), 0..4)
                .prop_map(|e| format!(r#"{{"events":[{}]}}"#, e.join(","))),
            prop::collection::vec(event(), 1..3)
                .prop_map(|e| format!(r#" {{ "events" : [ {} ] , "x":1}}"#, e.join(" , "))),
            event().prop_map(|e| format!("[{e}]")),
            Just(r#"["e","orders","","order.placed",{}]"#.to_owned()),
            (95usize..135, any::<bool>()).prop_map(|(n, batch)| {
                let payload = format!("{}1{}", r#"{"a":"#.repeat(n), "}".repeat(n));
                let event =
                    format!(r#"{{"stream":"orders","type":"order.placed","payload":{payload}}}"#);
                if batch {
                    format!(r#"{{"events":[{event}]}}"#)
                } else {
                    event
                }
            }),
        ]
    }

    proptest! {
        /// Read once or the long way, every body gets the same answer: the same events with
        /// the same stored payload bytes, or the same error.
        #[test]
        fn reading_once_answers_as_the_long_way(body in body()) {
            let once = parse_once(body.as_bytes());
            let long = outcome(parse_the_long_way(body.as_bytes()));
            if let Some(evs) = once {
                prop_assert_eq!(outcome(Ok(evs)), long.clone());
            }
            prop_assert_eq!(outcome(parse_append_body(body.as_bytes())), long);
        }
    }

    #[test]
    fn the_common_body_is_read_once() {
        for body in [
            r#"{"stream":"orders","subject":"o1","type":"order.placed","payload":{"a":1,"b":"x"}}"#,
            r#"{"events":[{"event_id":"e1","stream":"orders","type":"order.placed"}]}"#,
            r#"{"stream":"notifications","subject":"n1","type":"notification.requested","payload":{"priority":"info","recipient":"u1","title":"Hi"}}"#,
        ] {
            assert!(parse_once(body.as_bytes()).is_some(), "{body}");
        }
    }
}
