//! The fold of the deliveries model: row storage with its indexes and counts ([`super::keys`]
//! makes the keys), and the application of settings, recipient, cancellation and delivery events.

use serde::Deserialize;
use tidemark_log::{EventRef, StorageError};

use super::keys::{due_priority_key, filter_entries, index_entries};
use super::*;
use crate::endpoints::{Endpoint, EndpointChange};
use crate::framework::{Fold, Store, be_u64};
use crate::names::{DeliveryEvent, DeliveryTransition, EventType};
use crate::routing::{ApiRoute, NotificationsConfig};

fn add_count(st: &mut Store<'_>, key: &[u8], delta: i64) -> Result<(), StorageError> {
    let cur = st.get(COUNTS, key)?.and_then(|b| be_u64(&b)).unwrap_or(0);
    let next = (cur as i64 + delta).max(0) as u64;
    if next == 0 {
        st.delete(COUNTS, key)
    } else {
        st.put(COUNTS, key, &next.to_be_bytes())
    }
}

/// The index rows of one state of a row: the digested ones and the list filters'.
struct Entries {
    digested: Vec<(&'static str, Vec<u8>)>,
    filters: Vec<(&'static str, Vec<u8>)>,
}

impl Entries {
    /// `d`'s index rows, its endpoint held or not ([`held`]).
    fn of(d: &Delivery, held: bool) -> Self {
        Entries {
            digested: index_entries(d, held),
            filters: filter_entries(d, held),
        }
    }
}

/// Whether `d`'s endpoint holds it (a delivering route whose circuit is open, or disabled):
/// it waits, out of the claim's indexes.
fn endpoint_held(st: &mut Store<'_>, d: &Delivery) -> Result<bool, StorageError> {
    if !crate::endpoints::delivering(d.sink) {
        return Ok(false);
    }
    Ok(st
        .get_val::<Endpoint>(ENDPOINTS, d.route.as_bytes())?
        .is_some_and(|e| e.held()))
}

/// Whether `d` waits, out of the claim's indexes: its endpoint holds it, or it waits behind
/// another delivery of its key ([`order_waits`]).
fn held(st: &mut Store<'_>, d: &Delivery) -> Result<bool, StorageError> {
    Ok(endpoint_held(st, d)? || order_waits(st, d)?.is_some())
}

/// The delivery `d` waits for in its route's order (section 4): the first of its key, when
/// that is not `d` itself.
fn order_waits(st: &mut Store<'_>, d: &Delivery) -> Result<Option<String>, StorageError> {
    let Some(key) = d.holds_order_key() else {
        return Ok(None);
    };
    let prefix = order_prefix(&d.route, key);
    Ok(head_of(st, &prefix)?.filter(|h| h != d.id.as_str()))
}

/// The first delivery of a key in [`ORDER`] (`prefix`: [`order_prefix`]).
fn head_of(st: &mut Store<'_>, prefix: &[u8]) -> Result<Option<String>, StorageError> {
    Ok(st
        .first_key(ORDER, prefix)?
        .and_then(|k| order_entry_id(prefix, &k)))
}

/// Put `row` into the claim's indexes (`on`) or take it out, at its due time.
fn set_due(st: &mut Store<'_>, row: &Delivery, on: bool) -> Result<(), StorageError> {
    let Some(due) = row.due_us() else {
        return Ok(());
    };
    let (dk, pk) = (
        timed_key(row.sink_name(), due, row.id.as_str()),
        due_priority_key(row, due),
    );
    let sk = row
        .source_site
        .as_deref()
        .map(|site| timed_key(site, due, row.id.as_str()));
    if on {
        st.put(DUE, &dk, &[])?;
        st.put_index(DUE_BY_PRIORITY, &pk);
        if let Some(sk) = &sk {
            st.put_index(SITE_DUE, sk);
        }
    } else {
        st.delete(DUE, &dk)?;
        st.delete_index(DUE_BY_PRIORITY, &pk);
        if let Some(sk) = &sk {
            st.delete_index(SITE_DUE, sk);
        }
    }
    Ok(())
}

/// The key of a row's order changed its first delivery from `before` (a delivery left the
/// key, or one came before the others): the old first, when it still waits in the key, leaves
/// the claim's indexes, and the new first joins them (unless their endpoint holds them).
/// `this` is the row the event changed, whose indexes the caller keeps.
fn rehead(
    st: &mut Store<'_>,
    prefix: &[u8],
    before: Option<String>,
    this: &str,
    endpoint_held: bool,
) -> Result<(), StorageError> {
    let after = head_of(st, prefix)?;
    if after == before || endpoint_held {
        return Ok(());
    }
    if let Some(old) = before.filter(|h| h != this)
        && let Some(row) = st.get_row::<Delivery>(ROWS, old.as_bytes())?
        && row.holds_order_key().is_some()
    {
        set_due(st, &row, false)?;
    }
    if let Some(new) = after.filter(|h| h != this)
        && let Some(row) = st.get_row::<Delivery>(ROWS, new.as_bytes())?
    {
        set_due(st, &row, true)?;
    }
    Ok(())
}

/// An `endpoint.*` event: the route's record changes; when it starts or stops holding its
/// deliveries, their rows leave or rejoin the claim's indexes (those waiting in their key's
/// order stay out).
fn fold_endpoint(st: &mut Store<'_>, ty: EventType, ev: &EventRef<'_>) -> Result<(), StorageError> {
    // A bridge webhook subscription's endpoint is the bridges model's.
    if crate::names::ids::subscription_of_endpoint(ev.subject).is_some() {
        return Ok(());
    }
    let c: EndpointChange = parse(ev)?;
    let key = ev.subject.as_bytes();
    let mut e = st
        .get_val::<Endpoint>(ENDPOINTS, key)?
        .unwrap_or_else(|| Endpoint::new(ev.subject, c.sink));
    let was = e.held();
    if !e.apply(ty, &c) {
        return Ok(());
    }
    st.put_val(ENDPOINTS, key, &e)?;
    if e.held() == was {
        return Ok(());
    }
    let mut prefix = ev.subject.as_bytes().to_vec();
    prefix.push(0);
    for k in st.prefix_keys(ROUTE_DUE, &prefix)? {
        let id = &k[prefix.len() + 8..];
        let Some(row) = st.get_row::<Delivery>(ROWS, id)? else {
            continue;
        };
        if order_waits(st, &row)?.is_some() {
            continue;
        }
        set_due(st, &row, !e.held())?;
    }
    Ok(())
}

/// A delivering route's attempt came to an outcome (`delivery.sent`, or
/// `delivery.attempt_failed` with its code): its endpoint counts it.
fn count_attempt(st: &mut Store<'_>, row: &Delivery, c: &Change) -> Result<(), StorageError> {
    let Some(sink) = row.sink.filter(|s| crate::endpoints::delivering(Some(*s))) else {
        return Ok(());
    };
    let key = row.route.as_bytes();
    let mut e = st
        .get_val::<Endpoint>(ENDPOINTS, key)?
        .unwrap_or_else(|| Endpoint::new(&row.route, Some(sink)));
    e.attempted(
        sink,
        c.at_us,
        c.error_code
            .as_deref()
            .or(c.error.as_ref().map(|_| "failed")),
    );
    st.put_val(ENDPOINTS, key, &e)
}

/// Store `new` (under `id`, kept decoded for the next event) in place of the row whose index
/// rows were `before`, keeping every index and counter in step, then its timeline step; `held`:
/// its endpoint holds it ([`held`], looked up once by the caller for both states). The
/// writes are made in the order the digest has always seen them: indexes, row, step.
fn store_row(
    st: &mut Store<'_>,
    before: Option<Entries>,
    held: bool,
    id: &[u8],
    new: Delivery,
    step: &Step,
) -> Result<(), StorageError> {
    let before = before.unwrap_or(Entries {
        digested: Vec::new(),
        filters: Vec::new(),
    });
    let after = Entries::of(&new, held);
    for (t, k) in &before.digested {
        if !after.digested.iter().any(|(u, l)| u == t && l == k) {
            if *t == COUNTS {
                add_count(st, k, -1)?;
            } else {
                st.delete(t, k)?;
            }
        }
    }
    for (t, k) in &after.digested {
        if !before.digested.iter().any(|(u, l)| u == t && l == k) {
            if *t == COUNTS {
                add_count(st, k, 1)?;
            } else {
                st.put(t, k, &[])?;
            }
        }
    }
    for (t, k) in &before.filters {
        if !after.filters.iter().any(|(u, l)| u == t && l == k) {
            st.delete_index(t, k);
        }
    }
    for (t, k) in &after.filters {
        if !before.filters.iter().any(|(u, l)| u == t && l == k) {
            st.put_index(t, k);
        }
    }
    let mut tk = Vec::with_capacity(new.id.as_str().len() + 9);
    tk.extend_from_slice(new.id.as_str().as_bytes());
    tk.push(0);
    tk.extend_from_slice(&step.seq.to_be_bytes());
    st.put_row(ROWS, id, new)?;
    st.put_val(TIMELINE, &tk, step)
}

fn step(seq: u64, t: DeliveryTransition, c: &Change) -> Step {
    Step {
        seq,
        event: DeliveryEvent::Transition(t).as_str().to_owned(),
        at_us: c.at_us,
        owner: c.owner.clone(),
        attempt: c.attempt,
        error_code: c.error_code.clone(),
        error: c.error.clone(),
        reason: c.reason.clone(),
        next_attempt_at_us: c.next_attempt_at_us,
        lease_expires_at_us: c.lease_expires_at_us,
        by: c.by.clone().flatten(),
    }
}

fn raise_routed(st: &mut Store<'_>, seq: u64) -> Result<(), StorageError> {
    let cur = st
        .get(STATE, ROUTED_KEY)?
        .and_then(|b| be_u64(&b))
        .unwrap_or(0);
    if seq > cur {
        st.put(STATE, ROUTED_KEY, &seq.to_be_bytes())?;
    }
    Ok(())
}

fn parse<'a, T: Deserialize<'a>>(ev: &EventRef<'a>) -> Result<T, StorageError> {
    serde_json::from_str(ev.payload)
        .map_err(|e| StorageError::new(format!("{} at seq {}", ev.event_type, ev.seq), e))
}

pub struct Deliveries;

impl Fold for Deliveries {
    const NAME: &'static str = NAME;
    const TABLES: &'static [&'static str] = &[
        ROWS,
        TIMELINE,
        DUE,
        DUE_BY_PRIORITY,
        LEASES,
        PENDING,
        SENT,
        COUNTS,
        BY_STATUS,
        BY_TASK,
        BY_SINK,
        BY_ROUTE,
        BY_RECIPIENT,
        BY_TYPE,
        BY_LIST,
        BY_NOTIFICATION,
        GROUPS,
        SETTINGS,
        ROUTING_INPUTS,
        RECIPIENTS,
        CANCELED,
        STATE,
        NOTIFICATIONS_CANCELED,
        BY_SITE,
        SITE_STATUS,
        SITE_PENDING,
        SITE_SENT,
        SITE_DUE,
        BY_CREATED,
        ENDPOINTS,
        ROUTE_DUE,
        ORDER,
    ];
    /// 2: the list-filter indexes `by_sink`, `by_route`, `by_recipient`; 3: `by_notification`;
    /// 4: the per-site indexes `by_site`, `site_status`, `site_pending`, `site_sent` (all
    /// outside the digest); 5: `site_due` (the per-site stuck count); 6: `by_created`, the
    /// newest-first list (both outside the digest); 7: `by_type` and `by_list` (section 17's
    /// filters, outside the digest); 8: `due_by_priority` (claims by priority, outside the
    /// digest); 9: a row's trailing fields regrouped (the level of type and change counts, `deliveries/row.rs`);
    /// 10: a recipient's trailing fields regrouped (`RecipientExt`: locale, IANA time zone);
    /// 11: routes managed at runtime in the settings rows (`routing_inputs`); 12: the
    /// endpoints of the delivering routes (`endpoints`, `route_due`, section 17); 13: an
    /// endpoint's `unresolved` (an `env:` a node lacks); a resent or retried row keeps no
    /// lease owner and no delivery time; 14: the ordered routes' keys (`order`, section 4);
    /// 15: the priority a `Priority` (no rank past `info` in `due_by_priority` any more).
    /// An older model is rebuilt from the log at the next open, which fills them.
    const VERSION: u32 = 15;

    /// The event type is parsed once, here. A type tidemark does not define (a client's
    /// free-form type, or a reserved one only a newer version writes: a `delivery.*` type this
    /// version does not know among them), or one on another stream than its own, changes
    /// nothing in this model, deliberately.
    fn apply(&self, st: &mut Store<'_>, ev: &EventRef<'_>) -> Result<(), StorageError> {
        let Some(ty) = EventType::of(ev) else {
            return Ok(());
        };
        use EventType as T;
        match ty {
            T::SettingsUpdated => routing_changed(st, ev.seq, RoutingChange::File(ev.payload)),
            T::RouteUpdated => {
                let p: serde_json::Value = serde_json::from_str(ev.payload).unwrap_or_default();
                let route = p
                    .get("route")
                    .and_then(|r| ApiRoute::from_json(r).ok())
                    .map(Box::new);
                routing_changed(st, ev.seq, RoutingChange::Route(ev.subject, route))
            }
            T::RouteDeleted => routing_changed(st, ev.seq, RoutingChange::Route(ev.subject, None)),
            T::EndpointDisabled
            | T::EndpointEnabled
            | T::EndpointCircuitOpened
            | T::EndpointCircuitProbed
            | T::EndpointCircuitClosed
            | T::EndpointUnresolved
            | T::EndpointResolved => fold_endpoint(st, ty, ev),
            T::RecipientUpdated | T::RecipientSuppressed | T::RecipientUnsuppressed => {
                fold_recipient(st, ty, ev)
            }
            T::TaskCanceled => {
                if st.get(CANCELED, ev.subject.as_bytes())?.is_none() {
                    st.put(CANCELED, ev.subject.as_bytes(), &ev.seq.to_be_bytes())?;
                }
                Ok(())
            }
            T::RetentionPurged => purge(st, &crate::retention::Purged::parse(ev.payload)),
            T::NotificationCanceled => {
                if st
                    .get(NOTIFICATIONS_CANCELED, ev.subject.as_bytes())?
                    .is_none()
                {
                    st.put(
                        NOTIFICATIONS_CANCELED,
                        ev.subject.as_bytes(),
                        &ev.seq.to_be_bytes(),
                    )?;
                }
                Ok(())
            }
            t => match t.delivery_event() {
                Some(d) => fold_delivery(st, d, ev),
                // The other types of tidemark change nothing here.
                None => Ok(()),
            },
        }
    }
}

/// `retention.purged`: the named deliveries leave with every index row, count, timeline step
/// and open digest of theirs (a row changed after the decision, or pending, stays); the
/// cancellation marks of the named notifications and tasks go with them.
fn purge(st: &mut Store<'_>, p: &crate::retention::Purged) -> Result<(), StorageError> {
    for id in &p.deliveries {
        let steps = st.prefix_keys(TIMELINE, &[id.as_bytes(), &[0u8]].concat())?;
        let Some(row) = st.take_row::<Delivery>(ROWS, id.as_bytes())? else {
            continue;
        };
        if row.last_seq > p.through_seq || row.is_pending() {
            st.put_row(ROWS, id.as_bytes(), row)?;
            continue;
        }
        let e = Entries::of(&row, held(st, &row)?);
        for (t, k) in &e.digested {
            if *t == COUNTS {
                add_count(st, k, -1)?;
            } else {
                st.delete(t, k)?;
            }
        }
        for (t, k) in &e.filters {
            st.delete_index(t, k);
        }
        if let Some(g) = &row.group_key {
            let key = group_key(&row.route, row.recipient.as_deref().unwrap_or(""), g);
            if st
                .get_val::<Group>(GROUPS, &key)?
                .is_some_and(|grp| grp.delivery_id == row.id)
            {
                st.delete(GROUPS, &key)?;
            }
        }
        st.delete(ROWS, id.as_bytes())?;
        for k in steps {
            st.delete(TIMELINE, &k)?;
        }
        // A parked delivery that held its key leaves it: the next goes on.
        if let (Some(entry), Some(key)) = (row.order_entry(), row.holds_order_key()) {
            let prefix = order_prefix(&row.route, key);
            let first = head_of(st, &prefix)?;
            st.delete_index(ORDER, &entry);
            let eh = endpoint_held(st, &row)?;
            rehead(st, &prefix, first, row.id.as_str(), eh)?;
        }
    }
    for id in &p.notifications {
        st.delete(NOTIFICATIONS_CANCELED, id.as_bytes())?;
    }
    for id in &p.tasks {
        st.delete(CANCELED, id.as_bytes())?;
    }
    Ok(())
}

fn fold_recipient(
    st: &mut Store<'_>,
    ty: EventType,
    ev: &EventRef<'_>,
) -> Result<(), StorageError> {
    let p = ev.payload_value();
    let mut r: Recipient = st
        .get_val(RECIPIENTS, ev.subject.as_bytes())?
        .unwrap_or_default();
    if !r.apply(ty, &p) {
        return Ok(());
    }
    st.put_val(RECIPIENTS, ev.subject.as_bytes(), &r)
}

/// A `delivery.*` event of a type tidemark defines, parsed by `apply` (which leaves the types
/// it does not define alone: the log refuses unknown `delivery.*` types from clients and
/// tidemark writes none).
fn fold_delivery(
    st: &mut Store<'_>,
    kind: DeliveryEvent,
    ev: &EventRef<'_>,
) -> Result<(), StorageError> {
    let id = ev.subject.as_bytes();
    match kind {
        DeliveryEvent::Created => {
            let c: Created = parse(ev)?;
            raise_routed(st, c.notification_seq)?;
            if st.contains(ROWS, id)? {
                return Ok(());
            }
            let row = c.row(ev.seq);
            if let (Some(until), Some(max), Some(g)) =
                (c.digest_until_us, c.digest_max_items, &c.group_key)
            {
                let key = group_key(&c.route, c.recipient.as_deref().unwrap_or(""), g);
                st.put_val(
                    GROUPS,
                    &key,
                    &Group {
                        delivery_id: row.id.to_string(),
                        until_us: until,
                        max_items: max,
                    },
                )?;
            }
            let s = Step {
                seq: ev.seq,
                event: kind.as_str().into(),
                at_us: c.created_at_us,
                owner: None,
                attempt: None,
                error_code: None,
                error: None,
                reason: c.reason,
                next_attempt_at_us: row.next_attempt_at_us,
                lease_expires_at_us: None,
                by: None,
            };
            // Ordered (section 4): it joins its key, behind the deliveries already there.
            let eh = endpoint_held(st, &row)?;
            let order = match (row.order_entry(), row.holds_order_key()) {
                (Some(entry), Some(key)) => {
                    let prefix = order_prefix(&row.route, key);
                    let first = head_of(st, &prefix)?;
                    st.put_index(ORDER, &entry);
                    Some((prefix, first))
                }
                _ => None,
            };
            let held = eh || order_waits(st, &row)?.is_some();
            let rid = row.id.to_string();
            store_row(st, None, held, id, row, &s)?;
            if let Some((prefix, first)) = order {
                rehead(st, &prefix, first, &rid, eh)?;
            }
            Ok(())
        }
        DeliveryEvent::Joined => {
            let j: Joined = parse(ev)?;
            raise_routed(st, j.notification_seq)?;
            let Some(mut row) = st.take_row::<Delivery>(ROWS, id)? else {
                return Ok(());
            };
            let held = held(st, &row)?;
            let before = Entries::of(&row, held);
            join(&mut row, &j, ev.seq);
            let s = Step {
                seq: ev.seq,
                event: kind.as_str().into(),
                at_us: j.at_us,
                owner: None,
                attempt: None,
                error_code: None,
                error: None,
                reason: Some(format!("notification {}", j.notification_id)),
                next_attempt_at_us: None,
                lease_expires_at_us: None,
                by: None,
            };
            store_row(st, Some(before), held, id, row, &s)
        }
        DeliveryEvent::Transition(t) => {
            let c: Change = parse(ev)?;
            if let Some(cs) = c.cancel_seq {
                raise_routed(st, cs)?;
            }
            let Some(mut row) = st.take_row::<Delivery>(ROWS, id)? else {
                return Ok(());
            };
            // One look at the endpoint for both states: a transition never moves a row to
            // another route, and only an `endpoint.*` event holds or releases one.
            let eh = endpoint_held(st, &row)?;
            let mut held = eh || order_waits(st, &row)?.is_some();
            let before = Entries::of(&row, held);
            let entry_before = row.order_entry();
            transition(&mut row, t, &c, ev.seq);
            if entry_before.is_none() && row.holds_order_key().is_some() {
                // Back in its key (a retry after a park that did not hold it, a resend):
                // behind those already there.
                row.order_seq = ev.seq;
            }
            if matches!(
                t,
                DeliveryTransition::Sent | DeliveryTransition::AttemptFailed
            ) {
                count_attempt(st, &row, &c)?;
            }
            // Ordered (section 4): a delivery that is sent (or parked, where parked ones do
            // not hold) leaves its key and the next of the key becomes claimable; one retried
            // or resent comes back to it.
            let entry_after = row.order_entry();
            let mut order = None;
            if entry_before != entry_after
                && let Some(key) = &row.order_key
            {
                let prefix = order_prefix(&row.route, key);
                let first = head_of(st, &prefix)?;
                if let Some(e) = &entry_before {
                    st.delete_index(ORDER, e);
                }
                if let Some(e) = &entry_after {
                    st.put_index(ORDER, e);
                }
                held = eh || order_waits(st, &row)?.is_some();
                order = Some((prefix, first));
            }
            let rid = row.id.to_string();
            store_row(st, Some(before), held, id, row, &step(ev.seq, t, &c))?;
            if let Some((prefix, first)) = order {
                rehead(st, &prefix, first, &rid, eh)?;
            }
            Ok(())
        }
    }
}

/// What changed the routing settings at one seq.
enum RoutingChange<'a> {
    /// `settings.updated`: the configuration file's settings (its payload).
    File(&'a str),
    /// `route.updated` (the route, `None` when it cannot be read) or `route.deleted`.
    Route(&'a str, Option<Box<ApiRoute>>),
}

/// Record the settings in force from `seq` on ([`SETTINGS`]): the file's, with the routes
/// managed at runtime as of `seq`. With none, the row is the file's payload as recorded.
fn routing_changed(
    st: &mut Store<'_>,
    seq: u64,
    change: RoutingChange<'_>,
) -> Result<(), StorageError> {
    const BASE: &[u8] = b"base";
    const ROUTES: &[u8] = b"routes";
    let mut routes: serde_json::Map<String, serde_json::Value> = st
        .get(ROUTING_INPUTS, ROUTES)?
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let file: Vec<u8> = match change {
        RoutingChange::File(payload) => {
            st.put_input(ROUTING_INPUTS, BASE, payload.as_bytes());
            payload.as_bytes().to_vec()
        }
        RoutingChange::Route(name, route) => {
            match route {
                Some(r) => routes.insert(name.to_owned(), r.public()),
                None => routes.remove(name),
            };
            let bytes = serde_json::to_vec(&routes).map_err(StorageError::of)?;
            st.put_input(ROUTING_INPUTS, ROUTES, &bytes);
            st.get(ROUTING_INPUTS, BASE)?
                .unwrap_or_else(|| b"{}".to_vec())
        }
    };
    if routes.is_empty() {
        return st.put(SETTINGS, &seq.to_be_bytes(), &file);
    }
    // The server checked both before recording them.
    let file = serde_json::from_slice(&file)
        .ok()
        .and_then(|v| NotificationsConfig::from_json(&v).ok())
        .unwrap_or_default();
    let api: std::collections::BTreeMap<String, ApiRoute> = routes
        .iter()
        .filter_map(|(n, v)| ApiRoute::from_json(v).ok().map(|r| (n.clone(), r)))
        .collect();
    let composed =
        serde_json::to_vec(&file.with_routes(&api).event_payload()).map_err(StorageError::of)?;
    st.put(SETTINGS, &seq.to_be_bytes(), &composed)
}
