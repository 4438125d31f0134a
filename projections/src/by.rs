//! The `by` of an operator action (spec section 8): on `delivery.retried`,
//! `delivery.discarded` and a `retention.purged` run by hand it is the token's name, or `null`
//! in open mode; on everything else it is absent. In a payload struct that is
//! `Option<Option<String>>`, written with
//!
//! ```ignore
//! #[serde(skip_serializing_if = "Option::is_none", default, deserialize_with = "crate::by::present")]
//! pub by: Option<Option<String>>,
//! ```

use serde::Deserialize;

/// A field that is present is `Some`, also when it is `null` (`Some(None)`); an absent one
/// is `None` (through `default`).
pub fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}
