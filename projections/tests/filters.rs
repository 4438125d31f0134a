//! The list filters of the deliveries and notifications models (spec section 7: "a page holds
//! up to `limit` matches whenever that many exist past the cursor"). Every filter and every
//! combination of them is served from indexes intersected by a zig-zag join, so for random
//! rows, random filter combinations, random limits and random starting cursors, paging with
//! the cursor walks exactly the rows an in-memory filter of the whole model picks, in order,
//! and every page but the last is full. A rare match behind more rows than the old scan budget
//! (20,000) examined is on the first page; a model written before the indexes existed is
//! rebuilt at the next open with the indexes filled and its digest unchanged.

mod common;

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::json;
use tidemark_log::{EventLog, Log, LogConfig, NewEvent};
use tidemark_projections::ModelsRead;
use tidemark_projections::deliveries::read::{DeliveryFilter, StuckFilter};
use tidemark_projections::deliveries::{Change, Created, Delivery};
use tidemark_projections::framework::Projection;
use tidemark_projections::framework::paged::{ListOrder, Position};
use tidemark_projections::models;
use tidemark_projections::names::{DeliveryStatus, Priority, Sink, TaskStatus, sink_or_none};
use tidemark_projections::notifications::Notification;
use tidemark_projections::notifications::read::NotificationFilter;
use tidemark_projections::tasks::Task;
use tidemark_projections::tasks::read::TaskFilter;
use tidemark_projections::{deliveries, notifications, tasks};

const SINKS: [&str; 3] = ["app", "none", "email"];
const ROUTES: [&str; 3] = ["desktop", "pager", "sms"];
const RECIPIENTS: [&str; 3] = ["r0", "r1", "r2"];
const PRIORITIES: [&str; 4] = ["urgent", "action", "warning", "info"];
const CREATED_STATUS: [&str; 3] = ["queued", "skipped", "cancelled"];
const KINDS: [&str; 7] = [
    "leased",
    "sent",
    "attempt_failed",
    "lease_expired",
    "discarded",
    "retried",
    "cancelled",
];

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn open(dir: &std::path::Path) -> common::Folded {
    let cfg = LogConfig::new(dir.join("log.redb"));
    common::Folded::open(&cfg).0
}

/// A fresh log with its models store in a temporary directory, and the runtime that drives it.
fn fresh() -> (tempfile::TempDir, tokio::runtime::Runtime, common::Folded) {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path());
    (dir, rt(), log)
}

/// Source sites of the notifications behind the deliveries (`None` for every fourth).
const SITES: [&str; 3] = ["north", "south", "east"];

fn site_of(id: &str) -> Option<&'static str> {
    let n: usize = id.bytes().map(|b| b as usize).sum();
    SITES.get(n % 4).copied()
}

/// The notification's type (`None` for every third) and list (`None` for every other).
const TYPES: [&str; 2] = ["alert", "notice"];
const LISTS: [&str; 1] = ["ops"];

fn type_of(id: &str) -> Option<&'static str> {
    TYPES.get(id_number(id) as usize % 3).copied()
}

fn list_of(id: &str) -> Option<&'static str> {
    LISTS.get((id_number(id) as usize / 3) % 2).copied()
}

/// Creation times spread over 1000 s by id, so the time range and stuck filters split them.
const T0: i64 = 1_700_000_000_000_000;

fn id_number(id: &str) -> i64 {
    let digits = id.trim_start_matches(|c: char| !c.is_ascii_digit());
    digits.parse().unwrap_or(0)
}

fn created_at(id: &str) -> i64 {
    T0 + id_number(id) * 1_000_000
}

/// Titles that the title search can tell apart.
fn title_of(id: &str) -> String {
    let k = id_number(id);
    format!(
        "t{} {}",
        k % 5,
        if k % 2 == 0 {
            "Disk full"
        } else {
            "Build broke"
        }
    )
}

fn created(id: &str, sink: &str, route: &str, recipient: Option<&str>, status: &str) -> NewEvent {
    let at = created_at(id);
    let c = Created {
        route: route.into(),
        sink: sink_or_none::parse(sink).expect("a sink or none"),
        recipient: recipient.map(str::to_owned),
        title: title_of(id),
        status: tidemark_projections::names::DeliveryStatus::parse(status)
            .expect("a delivery status"),
        source_site: site_of(id).map(str::to_owned),
        list: list_of(id).map(str::to_owned),
        ntype: type_of(id).map(str::to_owned),
        ..common::created(id.into(), format!("n-{id}"), 1, at)
    };
    NewEvent::new(
        None,
        "deliveries",
        id,
        "delivery.created",
        &serde_json::to_value(c).unwrap(),
    )
    .unwrap()
}

fn change(id: &str, kind: &str, parked: bool) -> NewEvent {
    let c = Change {
        at_us: 1_700_000_001_000_000,
        owner: Some("o".into()),
        attempt: Some(1),
        lease_expires_at_us: Some(1_700_000_031_000_000),
        next_attempt_at_us: Some(1_700_000_002_000_000),
        parked: Some(parked),
        ..Change::default()
    };
    NewEvent::new(
        None,
        "deliveries",
        id,
        format!("delivery.{kind}"),
        &serde_json::to_value(c).unwrap(),
    )
    .unwrap()
}

fn notification(id: &str, priority: &str, recipient: Option<&str>) -> NewEvent {
    let mut p = json!({"priority": priority, "title": "t"});
    if let Some(r) = recipient {
        p["recipient"] = json!(r);
    }
    NewEvent::new(
        Some(id.into()),
        "notifications",
        id,
        "notification.requested",
        &p,
    )
    .unwrap()
}

/// The events a run of ops writes, and the deliveries they create (in creation order).
#[derive(Default)]
struct Written {
    events: Vec<NewEvent>,
    created_ids: Vec<String>,
}

impl Written {
    /// The `delivery.created` of `id` with the picked sink, route, recipient and status
    /// (indexes into [`SINKS`], [`ROUTES`], [`RECIPIENTS`] and [`CREATED_STATUS`]), unless `id`
    /// was created already.
    fn create(
        &mut self,
        id: String,
        (sink, route, recipient, status): (usize, usize, Option<usize>, usize),
    ) {
        if self.created_ids.contains(&id) {
            return;
        }
        self.events.push(created(
            &id,
            SINKS[sink],
            ROUTES[route],
            recipient.map(|r| RECIPIENTS[r]),
            CREATED_STATUS[status],
        ));
        self.created_ids.push(id);
    }

    /// Transition `kind` (of [`KINDS`]) of the `d`-th delivery created so far (modulo their
    /// number), when there is one.
    fn change(&mut self, d: usize, kind: usize, parked: bool) {
        if !self.created_ids.is_empty() {
            let id = &self.created_ids[d % self.created_ids.len()];
            self.events.push(change(id, KINDS[kind], parked));
        }
    }
}

/// A run's ops, and the filters of two lists it checks.
type OpsAndFilters<O, F, G> = (Vec<O>, Vec<F>, Vec<G>);

/// Up to 300 ops, and 12 filters of each of two lists.
fn ops_and_filters<O: Strategy, F: Strategy, G: Strategy>(
    op: O,
    f: F,
    g: G,
) -> impl Strategy<Value = OpsAndFilters<O::Value, F::Value, G::Value>> {
    (
        proptest::collection::vec(op, 1..300),
        proptest::collection::vec(f, 12),
        proptest::collection::vec(g, 12),
    )
}

/// Append `events` in batches; the seq of each.
fn append(rt: &tokio::runtime::Runtime, log: &Log, events: Vec<NewEvent>) -> Vec<u64> {
    let mut seqs = Vec::with_capacity(events.len());
    for batch in events.chunks(1000) {
        let r = rt.block_on(log.append(batch.to_vec())).unwrap();
        seqs.extend(r.events.iter().map(|a| a.seq));
    }
    seqs
}

/// One page of the deliveries `f` picks, and the cursor of the next.
fn delivery_page(db: &ModelsRead, f: &DeliveryFilter) -> (Vec<Delivery>, Option<Position>) {
    let snapshot = db.snapshot().unwrap();
    deliveries::View::new(&snapshot).unwrap().page(f).unwrap()
}

/// The same for tasks.
fn task_page(db: &ModelsRead, f: &TaskFilter) -> (Vec<Task>, Option<Position>) {
    let snapshot = db.snapshot().unwrap();
    tasks::View::new(&snapshot).unwrap().page(f).unwrap()
}

/// The same for notifications (the cursor is a seq).
fn notification_page(db: &ModelsRead, f: &NotificationFilter) -> (Vec<Notification>, Option<u64>) {
    let snapshot = db.snapshot().unwrap();
    notifications::View::new(&snapshot)
        .unwrap()
        .page(f)
        .unwrap()
}

/// Every page of `f` from its cursor on in its order (each read by `page`), checking that a
/// page with a next cursor is full (`limit` rows) and that the cursor is `cursor` of its last
/// row; `advance` moves the filter to the next cursor.
fn pages<F, R, C>(
    f: &F,
    limit: usize,
    page: impl Fn(&F) -> (Vec<R>, Option<C>),
    cursor: impl Fn(&R) -> C,
    advance: impl Fn(&mut F, C),
) -> Vec<Vec<R>>
where
    F: Clone + std::fmt::Debug,
    C: Clone + PartialEq + std::fmt::Debug,
{
    let mut f = f.clone();
    let mut pages = Vec::new();
    loop {
        let (page, next) = page(&f);
        assert!(page.len() <= limit, "a page over limit: {f:?}");
        match next {
            Some(n) => {
                assert_eq!(
                    page.len(),
                    limit,
                    "a page short of limit before the end: {f:?}"
                );
                assert_eq!(page.last().map(&cursor), Some(n.clone()));
                pages.push(page);
                advance(&mut f, n);
            }
            None => {
                pages.push(page);
                return pages;
            }
        }
        assert!(pages.len() < 10_000, "paging does not end: {f:?}");
    }
}

/// Past cursor `n` of a list in `order`: after its id by id, before it newest first.
fn past(order: ListOrder, after: &mut Option<String>, before: &mut Option<Position>, n: Position) {
    match order {
        ListOrder::Id => *after = Some(n.id),
        ListOrder::Newest => *before = Some(n),
    }
}

fn delivery_pages(db: &ModelsRead, f: &DeliveryFilter) -> Vec<Vec<Delivery>> {
    let page = |f: &DeliveryFilter| delivery_page(db, f);
    let past = |f: &mut DeliveryFilter, n| past(f.order, &mut f.after, &mut f.before, n);
    pages(f, f.limit, page, |r| Position::from(r), past)
}

fn task_pages(db: &ModelsRead, f: &TaskFilter) -> Vec<Vec<Task>> {
    let page = |f: &TaskFilter| task_page(db, f);
    let past = |f: &mut TaskFilter, n| past(f.order, &mut f.after, &mut f.before, n);
    pages(f, f.limit, page, |r| Position::from(r), past)
}

fn notification_pages(db: &ModelsRead, f: &NotificationFilter) -> Vec<Vec<Notification>> {
    pages(
        f,
        f.limit,
        |f| notification_page(db, f),
        |n| n.seq,
        |f, n| f.before_seq = Some(n),
    )
}

fn delivery_ids(pages: &[Vec<Delivery>]) -> Vec<String> {
    pages.iter().flatten().map(|d| d.id.to_string()).collect()
}

fn seqs(pages: &[Vec<Notification>]) -> Vec<u64> {
    pages.iter().flatten().map(|n| n.seq).collect()
}

/// What the filter picks from the whole model, in memory.
fn delivery_matches(all: &[Delivery], f: &DeliveryFilter) -> Vec<String> {
    all.iter()
        .filter(|d| f.after.as_deref().is_none_or(|a| d.id.as_str() > a))
        .filter(|d| f.status.is_none_or(|s| s == d.status))
        .filter(|d| f.sink.is_none_or(|s| s == d.sink))
        .filter(|d| f.route.as_deref().is_none_or(|s| s == d.route))
        .filter(|d| {
            f.recipient
                .as_deref()
                .is_none_or(|s| d.recipient.as_deref() == Some(s))
        })
        .filter(|d| {
            f.notification_id
                .as_deref()
                .is_none_or(|n| d.items.iter().any(|i| i.notification_id == n))
        })
        .filter(|d| {
            f.source_site
                .as_deref()
                .is_none_or(|s| site_of(d.id.as_str()) == Some(s))
        })
        .filter(|d| {
            f.ntype
                .as_deref()
                .is_none_or(|t| type_of(d.id.as_str()) == Some(t))
        })
        .filter(|d| {
            f.list
                .as_deref()
                .is_none_or(|l| list_of(d.id.as_str()) == Some(l))
        })
        .filter(|d| {
            f.created_after_us
                .is_none_or(|t| created_at(d.id.as_str()) >= t)
        })
        .filter(|d| {
            f.created_before_us
                .is_none_or(|t| created_at(d.id.as_str()) < t)
        })
        .filter(|d| {
            f.stuck.is_none_or(|s| {
                // Stuck: due since before the cut (a queued or retry_wait row at its next
                // attempt, a leased one at its lease expiry); terminal rows never are.
                let due = match d.status.as_str() {
                    "queued" | "retry_wait" => {
                        Some(d.next_attempt_at_us.unwrap_or(created_at(d.id.as_str())))
                    }
                    "leased" => d.lease_expires_at_us,
                    _ => None,
                };
                due.is_some_and(|t| t < s.cut_us) == s.stuck_only
            })
        })
        .filter(|d| {
            f.title_contains.as_deref().is_none_or(|q| {
                title_of(d.id.as_str())
                    .to_lowercase()
                    .contains(&q.to_lowercase())
            })
        })
        .map(|d| d.id.to_string())
        .collect()
}

#[derive(Debug, Clone)]
enum Op {
    Create {
        sink: usize,
        route: usize,
        recipient: Option<usize>,
        status: usize,
    },
    /// Transition `kind` of the `d`-th delivery created so far (modulo their number).
    Move { d: usize, kind: usize, parked: bool },
    Notify {
        priority: usize,
        recipient: Option<usize>,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..3usize, 0..3usize, proptest::option::of(0..3usize), 0..3usize).prop_map(
            |(sink, route, recipient, status)| Op::Create { sink, route, recipient, status }
        ),
        2 => (0..1000usize, 0..KINDS.len(), any::<bool>())
            .prop_map(|(d, kind, parked)| Op::Move { d, kind, parked }),
        3 => (0..4usize, proptest::option::of(0..3usize))
            .prop_map(|(priority, recipient)| Op::Notify { priority, recipient }),
    ]
}

/// A filter value: one of the domain, or one no row has.
/// A sink filter: one of [`SINKS`] (a typed filter names no unknown sink), or none.
fn sink_value() -> impl Strategy<Value = Option<Option<Sink>>> {
    proptest::option::weighted(
        0.5,
        (0..SINKS.len()).prop_map(|i| sink_or_none::parse(SINKS[i]).expect("a sink or none")),
    )
}

fn value(domain: &'static [&'static str]) -> impl Strategy<Value = Option<String>> {
    proptest::option::weighted(
        0.5,
        (0..=domain.len()).prop_map(move |i| domain.get(i).copied().unwrap_or("zz").to_owned()),
    )
}

/// The filters no index answers: a creation time range, stuck or not, a title substring.
fn unindexed_filter() -> impl Strategy<
    Value = (
        Option<i64>,
        Option<i64>,
        Option<StuckFilter>,
        Option<String>,
    ),
> {
    let at = || proptest::option::weighted(0.3, (0..1000i64).prop_map(|k| T0 + k * 1_000_000));
    (
        at(),
        at(),
        proptest::option::weighted(
            0.3,
            (0..1000i64, any::<bool>()).prop_map(|(k, stuck_only)| StuckFilter {
                cut_us: T0 + k * 1_000_000,
                stuck_only,
            }),
        ),
        value(&["disk", "BROKE", "t3", "t1 b"]),
    )
}

fn delivery_filter() -> impl Strategy<Value = DeliveryFilter> {
    (
        (
            value(&["queued", "leased", "sent", "skipped", "parked"]),
            sink_value(),
            value(&ROUTES),
            value(&RECIPIENTS),
            proptest::option::of(0..1000usize),
            1..7usize,
            // The notification of the delivery the i-th op may have created (`n-<id>`).
            proptest::option::of(0..300usize),
            value(&SITES),
            value(&TYPES),
            value(&LISTS),
        ),
        unindexed_filter(),
    )
        .prop_map(
            |(
                (
                    status,
                    sink,
                    route,
                    recipient,
                    after,
                    limit,
                    notification,
                    source_site,
                    ntype,
                    list,
                ),
                (created_after_us, created_before_us, stuck, title_contains),
            )| DeliveryFilter {
                status: status.and_then(|s| DeliveryStatus::parse(&s)),
                sink,
                route,
                recipient,
                notification_id: notification.map(|i| format!("n-d{:03}", (i * 37) % 1000)),
                source_site,
                ntype,
                list,
                after: after.map(|k| format!("d{k:03}")),
                before: None,
                order: ListOrder::Id,
                limit,
                created_after_us,
                created_before_us,
                stuck,
                title_contains,
            },
        )
}

fn notification_filter() -> impl Strategy<Value = NotificationFilter> {
    (
        proptest::option::weighted(0.5, proptest::sample::select(Priority::ALL.to_vec())),
        value(&RECIPIENTS),
        proptest::option::of(0..400u64),
        1..7usize,
    )
        .prop_map(
            |(priority, recipient, before_seq, limit)| NotificationFilter {
                priority,
                recipient,
                before_seq,
                limit,
            },
        )
}

/// Newest first (`order=newest`, issue 26): deliveries whose ids do not sort as they were
/// created (`a10` before `a7` by id, after it by time) and that tie on their creation time
/// (`a7` and `b7`), tasks created by `task.created` or by a run's first event (or neither) in
/// any order. Both orders are paged with their own cursor, and each cursor is also a filter of
/// the other order.
#[derive(Debug, Clone)]
enum NewestOp {
    Create {
        n: usize,
        prefix: usize,
        sink: usize,
        route: usize,
        recipient: Option<usize>,
        status: usize,
    },
    Move {
        d: usize,
        kind: usize,
        parked: bool,
    },
    Task {
        t: usize,
        event: usize,
        project: usize,
    },
}

/// Delivery id prefixes: `a7` and `b7` are created at the same time (`created_at` reads the
/// number).
const PREFIXES: [&str; 2] = ["a", "b"];
/// Task events: `task.created` sets the creation seq; a run's first event stands for it while
/// the task has none; `task.canceled` alone leaves it 0.
const TASK_EVENTS: [&str; 4] = [
    "task.created",
    "task.run_started",
    "task.run_completed",
    "task.canceled",
];

fn newest_op() -> impl Strategy<Value = NewestOp> {
    prop_oneof![
        3 => (0..60usize, 0..2usize, 0..3usize, 0..3usize, proptest::option::of(0..3usize), 0..3usize)
            .prop_map(|(n, prefix, sink, route, recipient, status)| NewestOp::Create {
                n, prefix, sink, route, recipient, status,
            }),
        1 => (0..1000usize, 0..KINDS.len(), any::<bool>())
            .prop_map(|(d, kind, parked)| NewestOp::Move { d, kind, parked }),
        3 => (0..15usize, 0..TASK_EVENTS.len(), 0..3usize)
            .prop_map(|(t, event, project)| NewestOp::Task { t, event, project }),
    ]
}

fn order() -> impl Strategy<Value = ListOrder> {
    prop_oneof![3 => Just(ListOrder::Newest), 1 => Just(ListOrder::Id)]
}

fn newest_delivery_filter() -> impl Strategy<Value = DeliveryFilter> {
    let id = || (0..2usize, 0..60usize).prop_map(|(p, n)| format!("{}{n}", PREFIXES[p]));
    (
        delivery_filter(),
        order(),
        proptest::option::weighted(0.3, id()),
        proptest::option::weighted(0.5, id()),
        proptest::option::weighted(0.2, id()),
    )
        .prop_map(|(f, order, notification, before, after)| DeliveryFilter {
            notification_id: notification.map(|id| format!("n-{id}")),
            before: before.map(|id| Position {
                key: created_at(&id) as u64,
                id,
            }),
            after,
            order,
            ..f
        })
}

fn task_filter() -> impl Strategy<Value = TaskFilter> {
    let id = || (0..15usize).prop_map(|t| format!("bt-{t}"));
    (
        value(&["open", "running", "completed", "canceled"]),
        value(&["p0", "p1", "p2"]),
        proptest::option::weighted(0.2, id()),
        proptest::option::weighted(0.5, (0..400u64, id())),
        order(),
        1..7usize,
    )
        .prop_map(
            |(status, project_id, after, before, order, limit)| TaskFilter {
                status: status.and_then(|s| TaskStatus::parse(&s)),
                project_id,
                after,
                before: before.map(|(key, id)| Position { key, id }),
                order,
                limit,
            },
        )
}

/// `matches` (ids with their creation positions) in `order`, past `f`'s `before`.
fn in_order(
    mut matches: Vec<Position>,
    order: ListOrder,
    before: Option<&Position>,
) -> Vec<String> {
    matches.retain(|p| before.is_none_or(|b| p < b));
    match order {
        ListOrder::Id => matches.sort_by(|a, b| a.id.cmp(&b.id)),
        ListOrder::Newest => matches.sort_by(|a, b| b.cmp(a)),
    }
    matches.into_iter().map(|p| p.id).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn paging_a_filter_walks_exactly_its_matches(
        (ops, dfs, nfs) in ops_and_filters(op(), delivery_filter(), notification_filter()),
    ) {
        // (index in `events`, priority, recipient) of each notification.
        let mut notes: Vec<(usize, &str, Option<&str>)> = Vec::new();
        let mut w = Written::default();
        for (i, op) in ops.iter().enumerate() {
            match op {
                Op::Create { sink, route, recipient, status } => {
                    // Ids are not in creation order: the index order is the id order.
                    let id = format!("d{:03}", (i * 37) % 1000);
                    w.create(id, (*sink, *route, *recipient, *status));
                }
                Op::Move { d, kind, parked } => w.change(*d, *kind, *parked),
                Op::Notify { priority, recipient } => {
                    let id = format!("n{i}");
                    let (p, r) = (PRIORITIES[*priority], recipient.map(|r| RECIPIENTS[r]));
                    notes.push((w.events.len(), p, r));
                    w.events.push(notification(&id, p, r));
                }
            }
        }
        let (_dir, rt, log) = fresh();
        let Written { events, created_ids } = w;
        let seqs_of = append(&rt, &log, events);
        let db = log.db();

        // Deliveries: the unfiltered list is every row, by id.
        let all = delivery_ids(&delivery_pages(&db, &DeliveryFilter { limit: 1000, ..Default::default() }));
        let mut want_all = created_ids.clone();
        want_all.sort();
        prop_assert_eq!(&all, &want_all);
        let (rows, _) = delivery_page(&db, &DeliveryFilter { limit: 1000, ..Default::default() });
        for f in &dfs {
            let want = delivery_matches(&rows, f);
            let got = delivery_ids(&delivery_pages(&db, f));
            prop_assert_eq!(got, want, "{:?}", f);
        }

        // The filter indexes hold exactly one row per row and value.
        let key = |v: &str, suffix: &[u8]| [v.as_bytes(), &[0], suffix].concat();
        let want: Vec<Vec<u8>> = rows.iter().map(|d| key(d.sink_name(), d.id.as_str().as_bytes())).collect();
        prop_assert_eq!(index_keys(&db, "deliveries", "by_sink"), sorted(want));
        let want: Vec<Vec<u8>> = rows.iter().map(|d| key(&d.route, d.id.as_str().as_bytes())).collect();
        prop_assert_eq!(index_keys(&db, "deliveries", "by_route"), sorted(want));
        let want: Vec<Vec<u8>> = rows
            .iter()
            .filter_map(|d| Some(key(d.recipient.as_deref()?, d.id.as_str().as_bytes())))
            .collect();
        prop_assert_eq!(index_keys(&db, "deliveries", "by_recipient"), sorted(want));
        let want: Vec<Vec<u8>> = rows
            .iter()
            .flat_map(|d| d.items.iter().map(|i| key(&i.notification_id, d.id.as_str().as_bytes())))
            .collect();
        prop_assert_eq!(index_keys(&db, "deliveries", "by_notification"), sorted(want));

        // Notifications: newest first, from what was appended.
        let by_seq: BTreeMap<u64, (&str, Option<&str>)> = notes
            .iter()
            .map(|(i, p, r)| (seqs_of[*i], (*p, *r)))
            .collect();
        let all = seqs(&notification_pages(&db, &NotificationFilter { limit: 1000, ..Default::default() }));
        prop_assert_eq!(all, by_seq.keys().rev().copied().collect::<Vec<_>>());
        for f in &nfs {
            let want: Vec<u64> = by_seq
                .iter()
                .rev()
                .filter(|(s, _)| f.before_seq.is_none_or(|b| **s < b))
                .filter(|(_, (p, _))| f.priority.is_none_or(|x| x.as_str() == *p))
                .filter(|(_, (_, r))| f.recipient.as_deref().is_none_or(|x| Some(x) == *r))
                .map(|(s, _)| *s)
                .collect();
            let got = seqs(&notification_pages(&db, f));
            prop_assert_eq!(got, want, "{:?}", f);
        }
        let want: Vec<Vec<u8>> = by_seq.iter().map(|(s, (p, _))| key(p, &s.to_be_bytes())).collect();
        prop_assert_eq!(index_keys(&db, "notifications", "by_priority"), sorted(want));
        let want: Vec<Vec<u8>> = by_seq
            .iter()
            .filter_map(|(s, (_, r))| Some(key((*r)?, &s.to_be_bytes())))
            .collect();
        prop_assert_eq!(index_keys(&db, "notifications", "by_recipient"), sorted(want));
        rt.block_on(log.close());
    }

    #[test]
    fn paging_newest_first_walks_exactly_its_matches(
        (ops, dfs, tfs) in ops_and_filters(newest_op(), newest_delivery_filter(), task_filter()),
    ) {
        // Per task: the index in `events` of its first `task.created` and of its first run
        // event.
        let mut tasks: BTreeMap<String, (Option<usize>, Option<usize>)> = BTreeMap::new();
        let mut w = Written::default();
        for (i, op) in ops.iter().enumerate() {
            match op {
                NewestOp::Create { n, prefix, sink, route, recipient, status } => {
                    let id = format!("{}{n}", PREFIXES[*prefix]);
                    w.create(id, (*sink, *route, *recipient, *status));
                }
                NewestOp::Move { d, kind, parked } => w.change(*d, *kind, *parked),
                NewestOp::Task { t, event, project } => {
                    let id = format!("bt-{t}");
                    let ty = TASK_EVENTS[*event];
                    let entry = tasks.entry(id.clone()).or_default();
                    match ty {
                        "task.created" => { entry.0.get_or_insert(w.events.len()); }
                        "task.canceled" => {}
                        _ => { entry.1.get_or_insert(w.events.len()); }
                    }
                    let payload = json!({"project_id": format!("p{project}"), "run_id": "r1"});
                    w.events.push(
                        NewEvent::new(Some(format!("e{i}")), "task_events", &id, ty, &payload).unwrap(),
                    );
                }
            }
        }
        let (_dir, rt, log) = fresh();
        let Written { events, created_ids } = w;
        let seqs_of = append(&rt, &log, events);
        let db = log.db();

        // Deliveries: the model's picks in the filter's order (creation time from the id).
        let (rows, _) = delivery_page(&db, &DeliveryFilter { limit: 1000, ..Default::default() });
        let position = |id: &str| Position { key: created_at(id) as u64, id: id.to_owned() };
        let all = delivery_ids(&delivery_pages(&db, &DeliveryFilter {
            order: ListOrder::Newest, limit: 1000, ..Default::default()
        }));
        prop_assert_eq!(&all, &in_order(created_ids.iter().map(|id| position(id)).collect(), ListOrder::Newest, None));
        for f in &dfs {
            let picked = delivery_matches(&rows, &DeliveryFilter { before: None, ..f.clone() });
            let want = in_order(picked.iter().map(|id| position(id)).collect(), f.order, f.before.as_ref());
            let got = delivery_ids(&delivery_pages(&db, f));
            prop_assert_eq!(got, want, "{:?}", f);
        }
        let want: Vec<Vec<u8>> = created_ids
            .iter()
            .map(|id| [&(created_at(id) as u64).to_be_bytes()[..], id.as_bytes()].concat())
            .collect();
        prop_assert_eq!(index_keys(&db, "deliveries", "by_created"), sorted(want));

        // Tasks: created at their `task.created`, else at their first run event, else 0.
        let key = |t: &(Option<usize>, Option<usize>)| t.0.or(t.1).map_or(0, |i| seqs_of[i]);
        let (rows, _) = task_page(&db, &TaskFilter { limit: 1000, ..Default::default() });
        prop_assert_eq!(rows.iter().map(|t| t.task_id.clone()).collect::<Vec<_>>(), tasks.keys().cloned().collect::<Vec<_>>());
        for f in &tfs {
            let picked: Vec<Position> = rows
                .iter()
                .filter(|t| f.status.is_none_or(|s| s == t.status))
                .filter(|t| f.project_id.as_deref().is_none_or(|p| t.project_id.as_deref() == Some(p)))
                .filter(|t| f.after.as_deref().is_none_or(|a| t.task_id.as_str() > a))
                .map(|t| Position { key: key(&tasks[&t.task_id]), id: t.task_id.clone() })
                .collect();
            let want = in_order(picked, f.order, f.before.as_ref());
            let got: Vec<String> = task_pages(&db, f).iter().flatten().map(|t| t.task_id.clone()).collect();
            prop_assert_eq!(got, want, "{:?}", f);
        }
        let want: Vec<Vec<u8>> = tasks
            .iter()
            .map(|(id, t)| [&key(t).to_be_bytes()[..], id.as_bytes()].concat())
            .collect();
        prop_assert_eq!(index_keys(&db, "tasks", "by_created"), sorted(want));
        rt.block_on(log.close());
    }
}

fn sorted(mut v: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    v.sort();
    v
}

/// Every key of a projection's table, in order.
fn index_keys(db: &ModelsRead, proj: &'static str, table: &'static str) -> Vec<Vec<u8>> {
    db.keys(proj, table).unwrap()
}

/// More rows than the old scan budget (20,000 rows examined per call) between the cursor and
/// a rare match: the first page holds the matches, and the pages of a smaller limit are full
/// until the last.
#[test]
fn a_rare_match_behind_many_rows_is_on_the_first_page() {
    const BULK: usize = 25_000;
    let (_dir, rt, log) = fresh();
    // Rare notifications first (the oldest: the far end of a newest-first list), then the bulk:
    // same priority other recipient, and the recipient's other priority.
    let mut events = vec![
        notification("rare-1", "urgent", Some("rare")),
        notification("rare-2", "urgent", Some("rare")),
        notification("rare-3", "urgent", Some("rare")),
    ];
    for i in 0..BULK {
        events.push(notification(
            &format!("bulk-{i:05}"),
            "urgent",
            Some("bulk"),
        ));
    }
    for i in 0..50 {
        events.push(notification(&format!("other-{i:02}"), "info", Some("rare")));
    }
    // Rare deliveries last by id: bulk ids sort before `dlv-z`.
    for i in 0..BULK {
        events.push(created(
            &format!("dlv-a{i:05}"),
            "app",
            "desktop",
            Some("bulk"),
            "queued",
        ));
    }
    for i in 0..50 {
        events.push(created(
            &format!("dlv-b{i:02}"),
            "none",
            "pager",
            Some("rare"),
            "skipped",
        ));
    }
    for i in 0..3 {
        events.push(created(
            &format!("dlv-z{i}"),
            "app",
            "desktop",
            Some("rare"),
            "queued",
        ));
    }
    let seqs = append(&rt, &log, events);
    let db = log.db();

    let f = NotificationFilter {
        priority: Some(Priority::Urgent),
        recipient: Some("rare".into()),
        before_seq: None,
        limit: 10,
    };
    let limit = |limit| NotificationFilter { limit, ..f.clone() };
    let pages = notification_pages(&db, &limit(2));
    let rare = ["rare-3", "rare-2", "rare-1"];
    let id = |n: &Notification| n.notification_id.clone();
    the_rare_ones(notification_page(&db, &f), id, rare, &pages);
    assert_eq!(crate::seqs(&pages), [seqs[2], seqs[1], seqs[0]]);
    // Either filter alone.
    let mut g = limit(60);
    g.priority = None;
    let (page, _) = notification_page(&db, &g);
    assert_eq!(page.len(), 53);
    let mut g = limit(5);
    g.recipient = None;
    let (page, next) = notification_page(&db, &g);
    assert_eq!(page.len(), 5);
    assert_eq!(next, Some(page[4].seq));

    let f = DeliveryFilter {
        sink: Some(Some(Sink::App)),
        recipient: Some("rare".into()),
        limit: 10,
        ..DeliveryFilter::default()
    };
    let pages = delivery_pages(
        &db,
        &DeliveryFilter {
            limit: 2,
            ..f.clone()
        },
    );
    let rare = ["dlv-z0", "dlv-z1", "dlv-z2"];
    let id = |d: &Delivery| d.id.to_string();
    the_rare_ones(delivery_page(&db, &f), id, rare, &pages);
    assert_eq!(delivery_ids(&pages), rare);
    // Three filters, and a status that only the rare ones have past the bulk.
    let (page, _) = delivery_page(
        &db,
        &DeliveryFilter {
            route: Some("desktop".into()),
            status: Some(DeliveryStatus::Queued),
            after: Some("dlv-a99999".into()),
            ..f.clone()
        },
    );
    assert_eq!(page.len(), 3);
    let (page, next) = delivery_page(
        &db,
        &DeliveryFilter {
            sink: None,
            status: Some(DeliveryStatus::Queued),
            ..f.clone()
        },
    );
    assert_eq!(page.len(), 3);
    assert_eq!(next, None);
    rt.block_on(log.close());
}

/// The first page of a filter (`first`) is its last and holds the `rare` rows (by `id`), and
/// the `pages` of the filter at a limit of 2 are a full page and a last one.
fn the_rare_ones<R, C: PartialEq + std::fmt::Debug>(
    (page, next): (Vec<R>, Option<C>),
    id: impl Fn(&R) -> String,
    rare: [&str; 3],
    pages: &[Vec<R>],
) {
    assert_eq!(page.iter().map(id).collect::<Vec<_>>(), rare);
    assert_eq!(next, None);
    assert_eq!(pages.iter().map(Vec::len).collect::<Vec<_>>(), [2, 1]);
}

/// A model of version 1 (no filter indexes) is rebuilt from the log at the next open: the
/// indexes are filled, the digest is the one it had (the indexes are outside the digest). The
/// tasks model too, whose `by_created` index came later still.
#[test]
fn a_model_without_the_indexes_is_rebuilt_with_them_and_the_same_digest() {
    let (dir, rt, log) = fresh();
    let mut events = Vec::new();
    for i in 0..40 {
        let r = ["a", "b"][i % 2];
        events.push(notification(
            &format!("n{i:02}"),
            PRIORITIES[i % 4],
            Some(r),
        ));
        events.push(created(
            &format!("d{i:02}"),
            SINKS[i % 3],
            ROUTES[i % 2],
            Some(r),
            "queued",
        ));
    }
    // Tasks created in the order 9, 10, 8: by id 10 comes first, newest first 8 does.
    for t in [9, 10, 8] {
        events.push(
            NewEvent::new(
                None,
                "task_events",
                format!("bt-{t}"),
                "task.created",
                &json!({"project_id": "p"}),
            )
            .unwrap(),
        );
    }
    append(&rt, &log, events);
    let head = log.head();
    let before = models::projections(&log.db(), head).unwrap();
    rt.block_on(log.close());
    drop(log);
    // Make it what a build before the indexes left: version 1, no index tables.
    common::edit_models(dir.path(), |txn| {
        for name in ["deliveries", "notifications", "tasks"] {
            let current = match name {
                "deliveries" => tidemark_projections::deliveries::Deliveries.version(),
                "tasks" => tidemark_projections::tasks::Tasks.version(),
                _ => tidemark_projections::notifications::Notifications.version(),
            };
            common::edit_meta(txn, name, |m| {
                assert_eq!(m.version, current, "{name}");
                m.version = 1;
            });
        }
        for table in [
            "p.deliveries.by_sink.g0",
            "p.deliveries.by_route.g0",
            "p.deliveries.by_recipient.g0",
            "p.deliveries.by_notification.g0",
            "p.notifications.by_priority.g0",
            "p.notifications.by_recipient.g0",
            "p.deliveries.by_created.g0",
            "p.tasks.by_created.g0",
        ] {
            let def: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new(table);
            assert!(txn.delete_table(def).unwrap(), "{table} was written");
        }
    });
    let log = open(dir.path());
    let after = models::projections(&log.db(), head).unwrap();
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(a.digest, b.digest, "digest of {}", a.name);
        assert_eq!(a.checkpoint, b.checkpoint, "checkpoint of {}", a.name);
        let rebuilt = ["deliveries", "notifications", "tasks"].contains(&a.name.as_str());
        assert_eq!(
            a.generation,
            b.generation + u32::from(rebuilt),
            "{}",
            a.name
        );
    }
    let db = log.db();
    // The ids on the first page of a filter.
    let deliveries = |f: DeliveryFilter| delivery_ids(&[delivery_page(&db, &f).0]);
    let limit = |limit| DeliveryFilter {
        limit,
        ..DeliveryFilter::default()
    };
    // i ≡ 0 (mod 3) and i even: 0, 6, ..., 36.
    let got = deliveries(DeliveryFilter {
        sink: Some(Some(Sink::App)),
        recipient: Some("a".into()),
        ..limit(100)
    });
    assert_eq!(got, ["d00", "d06", "d12", "d18", "d24", "d30", "d36"]);
    let got = deliveries(DeliveryFilter {
        notification_id: Some("n-d07".into()),
        ..limit(100)
    });
    assert_eq!(
        got,
        ["d07"],
        "the notification index is filled by the rebuild"
    );
    let (page, _) = notification_page(
        &db,
        &NotificationFilter {
            priority: Some(Priority::Action),
            recipient: Some("b".into()),
            before_seq: None,
            limit: 100,
        },
    );
    let got: Vec<&str> = page.iter().map(|n| n.notification_id.as_str()).collect();
    assert_eq!(
        got,
        [
            "n37", "n33", "n29", "n25", "n21", "n17", "n13", "n09", "n05", "n01"
        ]
    );
    let got = deliveries(DeliveryFilter {
        order: ListOrder::Newest,
        ..limit(3)
    });
    assert_eq!(got, ["d39", "d38", "d37"], "the by_created index is filled");
    let (page, _) = task_page(
        &db,
        &TaskFilter {
            order: ListOrder::Newest,
            limit: 10,
            ..TaskFilter::default()
        },
    );
    let got: Vec<&str> = page.iter().map(|t| t.task_id.as_str()).collect();
    assert_eq!(
        got,
        ["bt-8", "bt-10", "bt-9"],
        "the tasks' by_created is filled"
    );
    rt.block_on(log.close());
}
