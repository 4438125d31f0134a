//! What handlers read requests with, in one place: the JSON body extractor that checks what
//! its type declares ([`ValidatedJson`]), bounded text ([`Text`]: one declaration is both the
//! OpenAPI schema and the check), and a path id ([`PathId`]).
//!
//! A body type declares its bounds in its field types; whatever a type cannot say (a range
//! across fields, a pattern of its own) it says in [`Validate`]. The answers are the ones the
//! handlers gave when each checked its own body by hand: a body that is not JSON, or not the
//! declared shape, is `400 malformed_json`; a well-formed body without a required field is
//! `422 field_required` naming it (`422 reason_required` for a missing `reason`, as for a blank
//! one); a text field out of its bounds is `422 invalid_field` naming the field
//! (`deliveries.id` for an item's) — the malformed answer wins when a body has both, as it did.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

use tidemark_projections::names::Name;

use crate::error::ApiError;

/// Text of 1 to `MAX` printable characters (no control characters): the schema says so, and a
/// body holding anything else is refused naming the field.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Text<const MAX: usize>(String);

impl<const MAX: usize> Text<MAX> {
    pub fn into_string(self) -> String {
        self.0
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `v` is within the bounds.
    pub fn fits(v: &str) -> bool {
        !v.is_empty() && v.chars().count() <= MAX && !v.chars().any(char::is_control)
    }
}

impl<const MAX: usize> std::ops::Deref for Text<MAX> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl<const MAX: usize> From<Text<MAX>> for String {
    fn from(t: Text<MAX>) -> String {
        t.0
    }
}

/// Any string: the bounds are checked after the body's shape ([`Bounded::check_at`], called
/// from the body's [`Validate`]), so a body malformed besides is answered as malformed.
impl<'de, const MAX: usize> Deserialize<'de> for Text<MAX> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Text)
    }
}

/// A text field whose bounds its type declares: `422 invalid_field` naming `field` (by its
/// path without positions: `deliveries.id`) and the bound when it is out of them.
pub trait Bounded {
    fn check_at(&self, field: &str) -> Result<(), ApiError>;
}

impl<const MAX: usize> Bounded for Text<MAX> {
    fn check_at(&self, field: &str) -> Result<(), ApiError> {
        check_text(field, &self.0, MAX)
    }
}

/// An optional field is within bounds when absent.
impl<T: Bounded> Bounded for Option<T> {
    fn check_at(&self, field: &str) -> Result<(), ApiError> {
        self.as_ref().map_or(Ok(()), |t| t.check_at(field))
    }
}

impl<const MAX: usize> utoipa::PartialSchema for Text<MAX> {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        crate::openapi::printable_string(1, MAX).into()
    }
}

impl<const MAX: usize> utoipa::ToSchema for Text<MAX> {}

/// One of the names of `N` (a sink, a mode, a status): its schema is the enum of `N`'s names
/// (`#[schema(inline, value_type = openapi::SinkName)]`, [`crate::openapi`]), so the OpenAPI
/// document and the clients follow the type. In a body it reads as any string
/// and its body's [`Validate`] checks it ([`Bounded::check_at`]: `422 invalid_field` naming
/// the field and the names), so a body malformed besides is answered as malformed; in an
/// answer it is served as its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OneOf<N>(Result<N, String>);

impl<N: Name> OneOf<N> {
    /// The name, once the body's [`Validate`] has checked it.
    pub fn get(&self) -> N {
        match &self.0 {
            Ok(n) => *n,
            Err(v) => unreachable!("{v:?} was not checked by its body's Validate"),
        }
    }
}

impl<N: Name> From<N> for OneOf<N> {
    fn from(n: N) -> Self {
        OneOf(Ok(n))
    }
}

impl<N: Name> Bounded for OneOf<N> {
    fn check_at(&self, field: &str) -> Result<(), ApiError> {
        match &self.0 {
            Ok(_) => Ok(()),
            Err(_) => Err(invalid(
                field,
                format!("{field} must be one of {}", N::joined()),
            )),
        }
    }
}

impl<'de, N: Name> Deserialize<'de> for OneOf<N> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(OneOf(N::parse(&s).ok_or(s)))
    }
}

impl<N: Name> serde::Serialize for OneOf<N> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.0 {
            Ok(n) => s.serialize_str(n.as_str()),
            Err(v) => s.serialize_str(v),
        }
    }
}

/// A query parameter that names one of `N` (`?status=queued`): `400 invalid_query` naming
/// the parameter and the names when it names none.
pub(crate) fn query_name<N: Name>(param: &str, v: Option<&str>) -> Result<Option<N>, ApiError> {
    v.map(|s| {
        N::parse(s).ok_or_else(|| {
            ApiError::invalid_query(format!("{param} must be one of {}", N::joined()))
        })
    })
    .transpose()
}

/// Checks of a body beyond its shape: the bounds of its [`Text`]s first ([`Bounded`], in the
/// order of its fields), then ranges, patterns of its own, rules across fields.
pub trait Validate {
    fn validate(&self) -> Result<(), ApiError> {
        Ok(())
    }
}

/// A JSON body of `T`, read once and checked: `Content-Type` JSON, within the body limit, the
/// declared shape, then [`Validate`] (every [`Text`] within its bounds, then the rest).
pub struct ValidatedJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Validate> FromRequest<S> for ValidatedJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let (parts, body) = req.into_parts();
        let bytes = Bytes::from_request(Request::from_parts(parts.clone(), body), state).await;
        let t: T = json_body(&parts.headers, bytes)?;
        t.validate()?;
        Ok(ValidatedJson(t))
    }
}

/// A handler's query parameters: one that fails to parse is `invalid_query`, naming it.
pub struct Params<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(q)| Params(q))
            .map_err(|r: axum::extract::rejection::QueryRejection| {
                ApiError::invalid_query(r.body_text())
            })
    }
}

/// An optional JSON body: none (or an empty one) is `T::default()`.
pub struct OptionalJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Validate + Default> FromRequest<S> for OptionalJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let (parts, body) = req.into_parts();
        let bytes = Bytes::from_request(Request::from_parts(parts.clone(), body), state)
            .await
            .map_err(body_rejection)?;
        if bytes.is_empty() {
            return Ok(OptionalJson(T::default()));
        }
        let t = json_body::<Option<T>>(&parts.headers, Ok(bytes))?.unwrap_or_default();
        t.validate()?;
        Ok(OptionalJson(t))
    }
}

/// A body read as `T`, answering as every handler did (see the module's documentation).
pub(crate) fn json_body<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let body = body.map_err(body_rejection)?;
    require_json(headers)?;
    read_body(&body)
}

fn read_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let malformed = |e: serde_json::Error| ApiError::bad_request("malformed_json", e.to_string());
    // One parse on the hot path (claims, completes); the detour through a Value only for a
    // body the direct parse refused, which may hold an integer written as `1.0`.
    let first = match serde_json::from_slice(body) {
        Ok(t) => return Ok(t),
        Err(e) => e,
    };
    if first.to_string().starts_with(MISSING_FIELD)
        && let Some(e) = missing_field::<T>(body)
    {
        return Err(e);
    }
    let mut v: serde_json::Value = serde_json::from_slice(body).map_err(malformed)?;
    if !integral_floats_as_integers(&mut v) {
        return Err(malformed(first));
    }
    serde_json::from_value(v).map_err(malformed)
}

/// How serde says a required field is absent.
const MISSING_FIELD: &str = "missing field `";

/// The answer for a well-formed body that lacks a required field: one code for one mistake,
/// whatever the endpoint — `422 reason_required` for a `reason` (as a blank one is), else `422
/// field_required` naming the field by its path (`route.sink`).
fn missing_field<T: DeserializeOwned>(body: &[u8]) -> Option<ApiError> {
    let mut v: serde_json::Value = serde_json::from_slice(body).ok()?;
    integral_floats_as_integers(&mut v);
    let e = serde_path_to_error::deserialize::<_, T>(&v).err()?;
    let name = e
        .inner()
        .to_string()
        .strip_prefix(MISSING_FIELD)?
        .split('`')
        .next()?
        .to_owned();
    let mut field = String::new();
    for seg in e.path() {
        if let serde_path_to_error::Segment::Map { key } = seg {
            field.push_str(key);
            field.push('.');
        }
    }
    field.push_str(&name);
    if field == "reason" {
        return Some(
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "reason_required",
                "this action needs a non-empty reason (\"reason\"), recorded with it",
            )
            .at(0, Some("reason")),
        );
    }
    Some(
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "field_required",
            format!("{field} is required"),
        )
        .at(0, Some(&field)),
    )
}

/// JSON does not tell `1.0` from `1` (JSON Schema calls both integers), so a command body's
/// integral floats are read as the integers they are: `{"lease_ms": 60000.0}` is 60000.
/// Fractional ones stay floats and fail an integer field. Answers whether it changed any.
fn integral_floats_as_integers(v: &mut serde_json::Value) -> bool {
    use serde_json::Value;
    match v {
        Value::Number(n) if n.is_f64() => {
            let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0) else {
                return false;
            };
            if (0.0..18_446_744_073_709_551_616.0).contains(&f) {
                *v = Value::from(f as u64);
            } else if (-9_223_372_036_854_775_808.0..0.0).contains(&f) {
                *v = Value::from(f as i64);
            } else {
                return false;
            }
            true
        }
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |changed, i| integral_floats_as_integers(i) | changed),
        Value::Object(map) => map
            .values_mut()
            .fold(false, |changed, i| integral_floats_as_integers(i) | changed),
        _ => false,
    }
}

pub(crate) fn body_rejection(r: BytesRejection) -> ApiError {
    if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            "the request body is larger than the server's limit (server.max_body_bytes)",
        )
    } else {
        ApiError::bad_request("malformed_json", r.body_text())
    }
}

pub(crate) fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mime = ct.split(';').next().unwrap_or("").trim();
    if mime.eq_ignore_ascii_case("application/json") || mime.ends_with("+json") {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send the body as Content-Type: application/json",
        ))
    }
}

/// `422 invalid_field` unless a list holds 1 to 1000 items: `what` names them (`ids`).
pub(crate) fn check_count(field: &str, n: usize, what: &str) -> Result<(), ApiError> {
    if n == 0 || n > 1000 {
        return Err(invalid(
            field,
            format!("{field} must hold 1 to 1000 {what}"),
        ));
    }
    Ok(())
}

/// `422 invalid_field` naming `field`.
pub(crate) fn invalid(field: &str, detail: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_field", detail).at(0, Some(field))
}

/// A required reason (a reset, a list change): not blank, at most 4096 printable characters.
/// Read as any text, checked by [`Reason::check`] after the body's shape, naming the action:
/// a blank one is `422 reason_required`.
#[derive(Debug, Clone, Deserialize)]
#[serde(transparent)]
pub struct Reason(String);

/// Printable, with at least one character that is not white space.
const NON_BLANK: &str = "^[^\\x00-\\x1F\\x7F-\\x9F]*[^\\x00-\\x20\\x7F-\\xA0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000][^\\x00-\\x1F\\x7F-\\x9F]*$";

impl Reason {
    /// `what` names the action: `a cursor reset`.
    pub fn check(&self, what: &str) -> Result<(), ApiError> {
        check_reason(what, &self.0)
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl utoipa::PartialSchema for Reason {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(4096))
            .pattern(Some(NON_BLANK))
            .into()
    }
}

impl utoipa::ToSchema for Reason {}

/// A required reason (operator actions, list changes): `422 reason_required` when blank, else
/// 1–4096 printable characters. `what` names the action (`a cursor reset`).
fn check_reason(what: &str, reason: &str) -> Result<(), ApiError> {
    if reason.trim().is_empty() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "reason_required",
            format!("{what} needs a non-empty reason"),
        )
        .at(0, Some("reason")));
    }
    check_text("reason", reason, 4096)
}

/// `422 invalid_field` unless `v` is 1–`max` printable characters (for text whose bound is not
/// its type's: query values, list members).
pub(crate) fn check_text(field: &str, v: &str, max: usize) -> Result<(), ApiError> {
    if v.is_empty() || v.chars().count() > max || v.chars().any(char::is_control) {
        return Err(invalid(
            field,
            format!("{field} must be 1–{max} printable characters"),
        ));
    }
    Ok(())
}

pub use tidemark_projections::ids::{
    BridgeId, DeliveryId, Kind as IdKind, NotificationId, SubscriptionId, TaskId,
};

/// A resource id in a path, typed by what it names: 1–128 printable characters, else `400
/// invalid_path` naming the kind. Read before the body, so a bad id is answered as such
/// whatever the body holds.
pub struct PathId<K>(pub K);

impl<S: Send + Sync, K: IdKind + ParseId> FromRequestParts<S> for PathId<K> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let axum::extract::Path(id) =
            axum::extract::Path::<String>::from_request_parts(parts, state)
                .await
                .map_err(|_| invalid_path(K::WHAT))?;
        path_id(id).map(PathId)
    }
}

impl<K: std::fmt::Display> std::fmt::Display for PathId<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// An id type that checks the ids it is made from outside with.
pub trait ParseId: Sized {
    fn parse_id(id: String) -> Result<Self, tidemark_projections::ids::IdError>;
}

macro_rules! parse_id {
    ($($t:ty),*) => {$(
        impl ParseId for $t {
            fn parse_id(id: String) -> Result<Self, tidemark_projections::ids::IdError> {
                <$t>::parse(id)
            }
        }
    )*};
}
parse_id!(BridgeId, DeliveryId, NotificationId, SubscriptionId, TaskId);

/// One segment of a path with several ids, checked as [`PathId`] checks its one and typed.
pub(crate) fn path_id<K: IdKind + ParseId>(id: String) -> Result<K, ApiError> {
    K::parse_id(id).map_err(|e| ApiError::bad_request("invalid_path", e.to_string()))
}

fn invalid_path(what: &str) -> ApiError {
    ApiError::bad_request(
        "invalid_path",
        format!("a {what} id is 1–128 printable characters"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Item {
        id: Text<4>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        owner: Text<8>,
        items: Vec<Item>,
        #[expect(dead_code, reason = "read by the deserializer only")]
        n: Option<u32>,
    }

    impl Validate for Body {
        fn validate(&self) -> Result<(), ApiError> {
            self.owner.check_at("owner")?;
            self.items
                .iter()
                .try_for_each(|i| i.id.check_at("items.id"))
        }
    }

    fn read(body: &str) -> Result<Body, (u16, String, String)> {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
        json_body::<Body>(&h, Ok(Bytes::from(body.to_owned())))
            .and_then(|b| b.validate().map(|()| b))
            .map_err(|e| {
                (
                    e.status.as_u16(),
                    e.problem.kind.rsplit('/').next().unwrap().to_owned(),
                    e.problem.detail.clone(),
                )
            })
    }

    #[test]
    fn a_text_out_of_bounds_is_refused_naming_its_field_and_bound() {
        assert!(read(r#"{"owner":"w1","items":[{"id":"a"}],"n":3.0}"#).is_ok());
        let e = read(r#"{"owner":"123456789","items":[]}"#).unwrap_err();
        assert_eq!((e.0, e.1.as_str()), (422, "invalid_field"));
        assert_eq!(e.2, "owner must be 1–8 printable characters");
        let e = read(r#"{"owner":"w","items":[{"id":"a"},{"id":"a\u0007"}],"n":2.0}"#).unwrap_err();
        assert_eq!(e.2, "items.id must be 1–4 printable characters");
        let e = read(r#"{"owner":"","items":[]}"#).unwrap_err();
        assert_eq!(e.2, "owner must be 1–8 printable characters");
    }

    #[test]
    fn a_malformed_body_is_malformed_even_with_a_bad_text_before_the_fault() {
        // A missing field is its own mistake (`422 field_required`), named whatever else the
        // body holds.
        let e = read(r#"{"owner":"123456789"}"#).unwrap_err();
        assert_eq!((e.0, e.1.as_str()), (422, "field_required"), "{e:?}");
        assert_eq!(e.2, "items is required");
        for body in [
            r#"{"owner":"123456789","items":[],"n":"x"}"#,
            r#"{"owner":"123456789","items":[],"extra":1}"#,
            r#"{"owner":"123456789","items":[],"n":1.5}"#,
        ] {
            let e = read(body).unwrap_err();
            assert_eq!(
                (e.0, e.1.as_str()),
                (400, "malformed_json"),
                "{body}: {e:?}"
            );
            assert!(!e.2.contains("printable"), "{}", e.2);
        }
    }
}
