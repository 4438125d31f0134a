//! The two orders of the lists of tasks and deliveries (`order=id|newest`) and their cursors.
//!
//! In id order a page continues with `after` (an id); newest first with `before`, a position
//! `<key>:<id>`: the row's creation key (a task's creation seq, a delivery's creation time in
//! µs since the epoch) and its id, which tells apart rows created at the same key. The key is
//! digits only, so the first `:` ends it whatever the id holds. Each cursor is also a filter
//! that holds in either order (`after`: ids after it; `before`: rows created before it), so
//! every combination of the parameters is an answer, never a conflict.

use tidemark_projections::framework::paged::{ListOrder, Position};

use crate::error::ApiError;

/// `order`: `id` (the default) or `newest`.
pub(crate) fn parse_order(v: Option<&str>) -> Result<ListOrder, ApiError> {
    match v {
        None | Some("id") => Ok(ListOrder::Id),
        Some("newest") => Ok(ListOrder::Newest),
        Some(v) => Err(ApiError::invalid_query(format!(
            "order must be id or newest, not {:?}",
            shown(v)
        ))),
    }
}

/// `before`: `<key>:<id>` as a page's `next_before` gives it; `key` names the key in the
/// message (`creation seq`, `creation time in µs`).
pub(crate) fn parse_before(v: Option<&str>, key: &str) -> Result<Option<Position>, ApiError> {
    let Some(v) = v else { return Ok(None) };
    let bad = || {
        ApiError::invalid_query(format!(
            "before must be <{key}>:<id> as a page's next_before gives it (1–19 digits, a colon, \
             then 1–256 printable characters), not {:?}",
            shown(v)
        ))
    };
    let (k, id) = v.split_once(':').ok_or_else(bad)?;
    if k.is_empty()
        || k.len() > 19
        || !k.bytes().all(|b| b.is_ascii_digit())
        || id.is_empty()
        || id.chars().count() > 256
        || id.chars().any(char::is_control)
    {
        return Err(bad());
    }
    Ok(Some(Position {
        key: k.parse().map_err(|_| bad())?,
        id: id.to_owned(),
    }))
}

/// The cursors of the next page, `(next_after, next_before)`: the one of `order`, from the
/// position of the page's last row when more may follow.
pub(crate) fn next_cursors(
    order: ListOrder,
    next: Option<Position>,
) -> (Option<String>, Option<String>) {
    match (order, next) {
        (_, None) => (None, None),
        (ListOrder::Id, Some(p)) => (Some(p.id), None),
        (ListOrder::Newest, Some(p)) => (None, Some(format!("{}:{}", p.key, p.id))),
    }
}

/// A value as an error message quotes it: at most 64 characters.
fn shown(v: &str) -> String {
    v.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_round_trips_and_its_key_ends_at_the_first_colon() {
        let p = Position {
            key: 1_700_000_000_000_001,
            id: "dlv:n-1:desktop".into(),
        };
        let (_, token) = next_cursors(ListOrder::Newest, Some(p.clone()));
        let token = token.unwrap();
        assert_eq!(token, "1700000000000001:dlv:n-1:desktop");
        assert_eq!(parse_before(Some(&token), "k").unwrap(), Some(p));
        let max = format!("{}:x", "9".repeat(19));
        assert!(parse_before(Some(&max), "k").unwrap().is_some());
    }

    #[test]
    fn malformed_values_are_refused() {
        for v in [
            "",
            "12",
            ":bt-1",
            "12:",
            "-1:bt-1",
            "1a:bt-1",
            "bt-1",
            "12:a\u{7}b",
            "99999999999999999999:bt-1",
        ] {
            assert!(parse_before(Some(v), "k").is_err(), "{v:?}");
        }
        assert!(parse_before(Some(&format!("1:{}", "x".repeat(257))), "k").is_err());
        assert!(parse_order(Some("oldest")).is_err());
        assert_eq!(parse_order(None).unwrap(), ListOrder::Id);
        assert_eq!(parse_order(Some("newest")).unwrap(), ListOrder::Newest);
    }
}
