//! The keys of the deliveries model: its rows' index entries (the claim indexes and the list
//! filters), written by the fold and read by the view and the queries of this folder.

use super::*;

pub fn us_key(us: i64) -> [u8; 8] {
    (us.max(0) as u64).to_be_bytes()
}

pub fn cat(parts: &[&[u8]]) -> Vec<u8> {
    let mut k = Vec::with_capacity(parts.iter().map(|p| p.len() + 1).sum());
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            k.push(0);
        }
        k.extend_from_slice(p);
    }
    k
}

/// `sink ‖ 0 ‖ time ‖ id` (the time is fixed-width, so no separator after it).
pub fn timed_key(sink: &str, us: i64, id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(sink.len() + 9 + id.len());
    k.extend_from_slice(sink.as_bytes());
    k.push(0);
    k.extend_from_slice(&us_key(us));
    k.extend_from_slice(id.as_bytes());
    k
}

/// `sink ‖ 0 ‖ rank ‖ due ‖ id` ([`DUE_BY_PRIORITY`]).
pub fn due_priority_key(d: &Delivery, due_us: i64) -> Vec<u8> {
    let mut k = Vec::with_capacity(d.sink_name().len() + 10 + d.id.as_str().len());
    k.extend_from_slice(d.sink_name().as_bytes());
    k.push(0);
    k.push(priority_rank(d.priority));
    k.extend_from_slice(&us_key(due_us));
    k.extend_from_slice(d.id.as_str().as_bytes());
    k
}

/// The key a delivery is ordered by in newest-first lists: its creation time (µs).
pub fn created_key(d: &Delivery) -> u64 {
    u64::from_be_bytes(us_key(d.created_at_us))
}

pub fn group_key(route: &str, recipient: &str, group: &str) -> Vec<u8> {
    cat(&[route.as_bytes(), recipient.as_bytes(), group.as_bytes()])
}

/// The digested index rows of `d`; a `held` row (its endpoint's circuit open, or disabled)
/// is not due to a claim.
pub(super) fn index_entries(d: &Delivery, held: bool) -> Vec<(&'static str, Vec<u8>)> {
    let mut out = vec![
        (
            BY_STATUS,
            cat(&[d.status.as_str().as_bytes(), d.id.as_str().as_bytes()]),
        ),
        (
            COUNTS,
            cat(&[d.sink_name().as_bytes(), d.status.as_str().as_bytes()]),
        ),
    ];
    if let Some(t) = &d.task_id {
        out.push((BY_TASK, cat(&[t.as_bytes(), d.id.as_str().as_bytes()])));
    }
    if let Some(due) = d.due_us().filter(|_| !held) {
        out.push((DUE, timed_key(d.sink_name(), due, d.id.as_str())));
    }
    if d.status == DeliveryStatus::Leased
        && let Some(exp) = d.lease_expires_at_us
    {
        let mut k = us_key(exp).to_vec();
        k.extend_from_slice(d.id.as_str().as_bytes());
        out.push((LEASES, k));
    }
    if d.is_pending() {
        out.push((
            PENDING,
            timed_key(d.sink_name(), d.created_at_us, d.id.as_str()),
        ));
    }
    if d.status == DeliveryStatus::Sent {
        out.push((
            SENT,
            timed_key(d.sink_name(), d.delivered_at_us.unwrap_or(0), d.id.as_str()),
        ));
    }
    out
}

/// Rows of the list-filter indexes (`by_sink`, `by_route`, `by_recipient`). They are written
/// with `put_index` / `delete_index`: derived from the row, which the digest hashes, and added
/// after the golden release, whose digests must stay as recorded.
pub(super) fn filter_entries(d: &Delivery, held: bool) -> Vec<(&'static str, Vec<u8>)> {
    let mut out = vec![
        (
            BY_SINK,
            cat(&[d.sink_name().as_bytes(), d.id.as_str().as_bytes()]),
        ),
        (
            BY_ROUTE,
            cat(&[d.route.as_bytes(), d.id.as_str().as_bytes()]),
        ),
        (
            BY_CREATED,
            crate::framework::created_row(created_key(d), d.id.as_str()),
        ),
    ];
    if let Some(r) = &d.recipient {
        out.push((BY_RECIPIENT, cat(&[r.as_bytes(), d.id.as_str().as_bytes()])));
    }
    if let Some(due) = d.due_us() {
        if !held {
            out.push((DUE_BY_PRIORITY, due_priority_key(d, due)));
        }
        if crate::endpoints::delivering(d.sink) {
            out.push((ROUTE_DUE, timed_key(&d.route, due, d.id.as_str())));
        }
    }
    if let Some(t) = &d.ntype {
        out.push((BY_TYPE, cat(&[t.as_bytes(), d.id.as_str().as_bytes()])));
    }
    if let Some(l) = &d.list {
        out.push((BY_LIST, cat(&[l.as_bytes(), d.id.as_str().as_bytes()])));
    }
    for item in d.all_items() {
        out.push((
            BY_NOTIFICATION,
            cat(&[item.notification_id.as_bytes(), d.id.as_str().as_bytes()]),
        ));
    }
    if let Some(site) = &d.source_site {
        out.push((BY_SITE, cat(&[site.as_bytes(), d.id.as_str().as_bytes()])));
        out.push((
            SITE_STATUS,
            cat(&[
                site.as_bytes(),
                d.status.as_str().as_bytes(),
                d.id.as_str().as_bytes(),
            ]),
        ));
        if d.is_pending() {
            out.push((
                SITE_PENDING,
                timed_key(site, d.created_at_us, d.id.as_str()),
            ));
        }
        // A held row waits by design: not stuck, per site as per sink.
        if let Some(due) = d.due_us().filter(|_| !held) {
            out.push((SITE_DUE, timed_key(site, due, d.id.as_str())));
        }
        if d.status == DeliveryStatus::Sent {
            out.push((
                SITE_SENT,
                timed_key(site, d.delivered_at_us.unwrap_or(0), d.id.as_str()),
            ));
        }
    }
    out
}
