//! A delivery's row: one flat [`Delivery`] for everyone who reads it, and its stored form,
//! private to this file, which keeps the shape of its release history.
//!
//! The stored row is postcard (fields in order, no names, no lengths): the fields of the
//! golden release, then the fields each later release added as one trailing *level*, written
//! only when it or a later level holds something other than its defaults, so a row that uses
//! none of them keeps the bytes (and the digest, spec I10) it had before. Reading, a row that
//! ends before a level reads that level and the later ones as their defaults; a level that is
//! there but does not decode, or bytes after the last level, are an error (before, any tail
//! that failed to decode read silently as defaults). This is redb's `Legacy<T>` shape: the old
//! encoding stays at the storage boundary, the type everyone uses is the current one.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tidemark_log::StorageError;

use crate::framework::Row;
use crate::ids::DeliveryId;
use crate::names::{DeliveryStatus, DeliveryTransition, Priority, Sink};

use super::{allowed, order_prefix};

/// One notification inside a (digest) delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    pub notification_id: String,
    pub notification_seq: u64,
    pub title: String,
    pub body: Option<String>,
}

/// A delivery (spec section 5): what its notification asked, where it stands, and what its
/// route keeps for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub id: DeliveryId,
    pub notification_id: String,
    pub notification_seq: u64,
    /// The log position the delivery stands for: the lifecycle event a routed notification
    /// comes from, else the notification itself. A task cancellation at a later seq cancels it.
    pub source_seq: u64,
    pub route: String,
    /// The sink that takes it; none for a skipped delivery.
    pub sink: Option<Sink>,
    pub recipient: Option<String>,
    pub priority: Priority,
    pub title: String,
    pub body: Option<String>,
    /// The sink should play a sound (priority in `desktop.sound_priorities`).
    pub sound: bool,
    pub task_id: Option<String>,
    pub group_key: Option<String>,
    pub status: DeliveryStatus,
    /// Why it was skipped, cancelled or parked.
    pub reason: Option<String>,
    /// Leases taken (attempts started) since creation or the last operator retry.
    pub attempts: u32,
    pub max_attempts: u32,
    pub next_attempt_at_us: Option<i64>,
    pub lease_owner: Option<String>,
    pub lease_expires_at_us: Option<i64>,
    pub last_error_code: Option<String>,
    pub last_error: Option<String>,
    pub external_id: Option<String>,
    pub created_at_us: i64,
    pub updated_at_us: i64,
    pub delivered_at_us: Option<i64>,
    /// The notifications it carries: one, or several for a digest.
    pub items: Vec<Item>,
    /// Notifications of the same recipient and group may join until then (digest policy).
    pub digest_until_us: Option<i64>,
    /// Seq of the last event that changed it.
    pub last_seq: u64,
    /// Digest items past `max_items`, without their body: counted as `more` (section 4), kept
    /// so that the status record of each finds the digest and a cancel can promote one.
    pub more_items: Vec<Item>,
    /// The notification's `source.site_id` (section 2): the per-site KPIs and filter.
    pub source_site: Option<String>,
    /// A zero-PII delivery (section 14): `recipient` holds the recipient's HMAC and
    /// `notification_id` (and each item's) the intent key.
    pub redacted: bool,
    /// Its notification was canceled while it was leased: cancelled when the lease ends.
    pub cancel_pending: bool,
    /// Whom a delivery by tidemark's dispatcher reached (section 17): the addresses, or the
    /// endpoint's scheme, host and port; snapshotted by `delivery.sent` for audit.
    pub resolved_targets: Vec<String>,
    /// The notification list its targets are (section 17).
    pub list: Option<String>,
    /// The notification's `type` (section 2): `?type=` and the claim's answer.
    pub ntype: Option<String>,
    /// Items that stand for more than one change (a source poll's notification carries its
    /// `count`, section 12): notification id → count. A digest counts changes.
    pub counts: Vec<(String, u64)>,
    /// The key its route's `ordering` keeps it in (section 4): at most one delivery of a
    /// key is in flight, the next waits until the one before is sent (`None`: not ordered).
    pub order_key: Option<String>,
    /// Parked, it no longer holds its key (`on_park = "skip"`).
    pub order_skips_parked: bool,
    /// Its place in its key: the seq of its creation, or of the retry or resend that brought
    /// it back to the key (behind those already there: the first of a key changes only by
    /// leaving it).
    pub order_seq: u64,
}

impl Delivery {
    /// What a template sees: `notification`, `delivery`, `task` (null when the notification
    /// names none) and `console_url` (the delivery in the console, null when the server does not
    /// know its public address).
    pub fn template_context(&self, console: Option<&str>) -> Value {
        let d = self;
        let items: Vec<Value> = d
            .items
            .iter()
            .map(
                |i| json!({"notification_id": i.notification_id, "title": i.title, "body": i.body}),
            )
            .collect();
        json!({
            "notification": {
                "id": d.notification_id,
                "title": d.title,
                "body": d.body,
                "priority": d.priority,
                "recipient": d.recipient,
                "group_key": d.group_key,
            },
            "delivery": {
                "id": d.id.as_str(),
                "route": d.route,
                "attempt": d.attempts.max(1),
                "items": items,
                "more": d.item_count() - d.items.len(),
            },
            "task": d.task_id.as_ref().map(|t| json!({"id": t})),
            "console_url": console.map(|base| crate::routing::body::console_link(base, d.id.as_str())),
        })
    }

    /// Its sink's name as stored in its keys and served: `"none"` when no sink takes it.
    pub const fn sink_name(&self) -> &'static str {
        crate::names::sink_or_none::name(self.sink)
    }

    /// Notifications it carries: the listed items and those counted in `more`.
    pub fn item_count(&self) -> usize {
        self.items.len() + self.more_items.len()
    }

    /// The changes it carries: each notification counts its `count` (1 unless a source poll
    /// gathered several). The `{count}` of a digest's title.
    pub fn change_count(&self) -> usize {
        self.all_items()
            .map(|i| self.count_of(&i.notification_id) as usize)
            .fold(0, usize::saturating_add)
    }

    /// The `count` of notification `nid` (1 unless it stands for more changes).
    pub fn count_of(&self, nid: &str) -> u64 {
        self.counts
            .iter()
            .find(|(n, _)| n == nid)
            .map_or(1, |(_, c)| *c)
    }

    /// Every notification it carries, listed or counted.
    pub fn all_items(&self) -> impl Iterator<Item = &Item> {
        self.items.iter().chain(&self.more_items)
    }

    pub fn is_pending(&self) -> bool {
        self.status.is_pending()
    }

    /// The key of its route's `ordering` it holds now (section 4): pending, or parked on a
    /// route whose parked deliveries hold their key. `None`: it holds none.
    pub fn holds_order_key(&self) -> Option<&str> {
        let key = self.order_key.as_deref()?;
        let holds = self.status.is_pending()
            || (self.status == DeliveryStatus::Parked && !self.order_skips_parked);
        holds.then_some(key)
    }

    /// Its entry in [`ORDER`], while it holds its key.
    pub fn order_entry(&self) -> Option<Vec<u8>> {
        let key = self.holds_order_key()?;
        let mut k = order_prefix(&self.route, key);
        k.extend_from_slice(&self.order_seq.to_be_bytes());
        k.extend_from_slice(self.id.as_str().as_bytes());
        Some(k)
    }

    /// Transition `t` may be applied to it now ([`allowed`] from its status).
    pub fn allows(&self, t: DeliveryTransition) -> bool {
        allowed(self.status, t)
    }

    /// When it can next be claimed, if it can be claimed at all.
    pub fn due_us(&self) -> Option<i64> {
        use DeliveryStatus as S;
        match self.status {
            S::Queued | S::RetryWait => Some(self.next_attempt_at_us.unwrap_or(self.created_at_us)),
            S::Leased => self.lease_expires_at_us,
            S::Sent | S::Parked | S::Discarded | S::Skipped | S::Cancelled => None,
        }
    }
}

/// The stored row's layout, in order: the golden release's fields, then each later release's
/// level. One list serves the encoder and the decoder; a field stored through a wrapper names
/// it (`sink via StoredSink`).
macro_rules! stored_row {
    (
        golden { $($g:ident $(via $gw:ident)?),* $(,)? }
        $(level { $($l:ident),* $(,)? })*
    ) => {
        impl Row for Delivery {
            fn encode(&self, mut buf: Vec<u8>) -> Result<Vec<u8>, StorageError> {
                $( buf = put!(self, buf, $g $(, $gw)?); )*
                // The levels up to the last that holds something other than its defaults.
                let used = [$( false $(|| !is_default(&self.$l))* ),*];
                let levels = used.iter().rposition(|u| *u).map_or(0, |i| i + 1);
                let mut level = 0;
                $(
                    level += 1;
                    if level <= levels {
                        $( buf = put!(self, buf, $l); )*
                    }
                )*
                Ok(buf)
            }

            fn decode(bytes: &[u8]) -> Result<Self, StorageError> {
                let mut de = postcard::Deserializer::from_bytes(bytes);
                $( let $g = get!(de $(, $gw)?); )*
                let mut rest = de.finalize().map_err(StorageError::of)?;
                $(
                    $( let mut $l = Default::default(); )*
                    if !rest.is_empty() {
                        let mut de = postcard::Deserializer::from_bytes(rest);
                        $( $l = get!(de); )*
                        rest = de.finalize().map_err(StorageError::of)?;
                    }
                )*
                if !rest.is_empty() {
                    return Err(StorageError::msg(format!(
                        "a delivery row with {} bytes after its last field",
                        rest.len()
                    )));
                }
                Ok(Delivery { $($g,)* $($($l,)*)* })
            }
        }
    };
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

macro_rules! put {
    ($d:ident, $buf:ident, $f:ident) => {
        postcard::to_extend(&$d.$f, $buf).map_err(StorageError::of)?
    };
    ($d:ident, $buf:ident, $f:ident, $w:ident) => {
        postcard::to_extend(&$w($d.$f), $buf).map_err(StorageError::of)?
    };
}

macro_rules! get {
    ($de:ident) => {
        Deserialize::deserialize(&mut $de).map_err(StorageError::of)?
    };
    ($de:ident, $w:ident) => {
        <$w as Deserialize>::deserialize(&mut $de)
            .map_err(StorageError::of)?
            .0
    };
}

/// A row's sink as stored: its name, or `none`.
#[derive(Serialize, Deserialize)]
#[serde(transparent)]
struct StoredSink(#[serde(with = "crate::names::sink_or_none")] Option<Sink>);

stored_row! {
    golden {
        id, notification_id, notification_seq, source_seq, route, sink via StoredSink,
        recipient, priority, title, body, sound, task_id, group_key, status, reason, attempts,
        max_attempts, next_attempt_at_us, lease_owner, lease_expires_at_us, last_error_code,
        last_error, external_id, created_at_us, updated_at_us, delivered_at_us, items,
        digest_until_us, last_seq,
    }
    level { more_items, source_site, redacted, cancel_pending }
    level { resolved_targets, list }
    level { ntype, counts }
    level { order_key, order_skips_parked, order_seq }
}

#[cfg(test)]
mod the_stored_bytes {
    //! The flat row against the nested one it replaced (`Delivery` → `ext` → `more` →
    //! `later` → `later`, each a `crate::trailing` field): the same bytes both ways.
    use proptest::prelude::*;
    use serde::{Deserialize, Serialize};

    use super::{Delivery, Item, Row};
    use crate::ids::DeliveryId;
    use crate::names::{DeliveryStatus, Sink};

    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    struct OldDelivery {
        id: DeliveryId,
        notification_id: String,
        notification_seq: u64,
        source_seq: u64,
        route: String,
        #[serde(with = "crate::names::sink_or_none")]
        sink: Option<Sink>,
        recipient: Option<String>,
        priority: String,
        title: String,
        body: Option<String>,
        sound: bool,
        task_id: Option<String>,
        group_key: Option<String>,
        status: DeliveryStatus,
        reason: Option<String>,
        attempts: u32,
        max_attempts: u32,
        next_attempt_at_us: Option<i64>,
        lease_owner: Option<String>,
        lease_expires_at_us: Option<i64>,
        last_error_code: Option<String>,
        last_error: Option<String>,
        external_id: Option<String>,
        created_at_us: i64,
        updated_at_us: i64,
        delivered_at_us: Option<i64>,
        items: Vec<Item>,
        digest_until_us: Option<i64>,
        last_seq: u64,
        #[serde(default, with = "crate::trailing")]
        ext: OldExt,
    }

    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
    struct OldExt {
        more_items: Vec<Item>,
        source_site: Option<String>,
        redacted: bool,
        cancel_pending: bool,
        #[serde(default, with = "crate::trailing")]
        more: OldExt2,
    }

    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
    struct OldExt2 {
        resolved_targets: Vec<String>,
        list: Option<String>,
        #[serde(default, with = "crate::trailing")]
        later: OldExt3,
    }

    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
    struct OldExt3 {
        ntype: Option<String>,
        counts: Vec<(String, u64)>,
        #[serde(default, with = "crate::trailing")]
        later: OldExt4,
    }

    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
    struct OldExt4 {
        order_key: Option<String>,
        order_skips_parked: bool,
        order_seq: u64,
    }

    fn old(d: &Delivery) -> OldDelivery {
        OldDelivery {
            id: d.id.clone(),
            notification_id: d.notification_id.clone(),
            notification_seq: d.notification_seq,
            source_seq: d.source_seq,
            route: d.route.clone(),
            sink: d.sink,
            recipient: d.recipient.clone(),
            priority: d.priority.as_str().to_owned(),
            title: d.title.clone(),
            body: d.body.clone(),
            sound: d.sound,
            task_id: d.task_id.clone(),
            group_key: d.group_key.clone(),
            status: d.status,
            reason: d.reason.clone(),
            attempts: d.attempts,
            max_attempts: d.max_attempts,
            next_attempt_at_us: d.next_attempt_at_us,
            lease_owner: d.lease_owner.clone(),
            lease_expires_at_us: d.lease_expires_at_us,
            last_error_code: d.last_error_code.clone(),
            last_error: d.last_error.clone(),
            external_id: d.external_id.clone(),
            created_at_us: d.created_at_us,
            updated_at_us: d.updated_at_us,
            delivered_at_us: d.delivered_at_us,
            items: d.items.clone(),
            digest_until_us: d.digest_until_us,
            last_seq: d.last_seq,
            ext: OldExt {
                more_items: d.more_items.clone(),
                source_site: d.source_site.clone(),
                redacted: d.redacted,
                cancel_pending: d.cancel_pending,
                more: OldExt2 {
                    resolved_targets: d.resolved_targets.clone(),
                    list: d.list.clone(),
                    later: OldExt3 {
                        ntype: d.ntype.clone(),
                        counts: d.counts.clone(),
                        later: OldExt4 {
                            order_key: d.order_key.clone(),
                            order_skips_parked: d.order_skips_parked,
                            order_seq: d.order_seq,
                        },
                    },
                },
            },
        }
    }

    fn item() -> impl Strategy<Value = Item> {
        (
            "[a-z]{1,4}",
            any::<u64>(),
            "[a-z ]{0,6}",
            proptest::option::of("[a-z]{1,3}"),
        )
            .prop_map(|(notification_id, notification_seq, title, body)| Item {
                notification_id,
                notification_seq,
                title,
                body,
            })
    }

    fn opt() -> impl Strategy<Value = Option<String>> {
        proptest::option::weighted(0.3, "[a-z]{1,5}")
    }

    prop_compose! {
        fn delivery()(
            head in ("[a-z]{1,6}", any::<u64>(), any::<bool>(), 0usize..4, opt(), proptest::collection::vec(item(), 0..3)),
            l1 in (proptest::collection::vec(item(), 0..2), opt(), proptest::bool::weighted(0.2), proptest::bool::weighted(0.2)),
            l2 in (proptest::collection::vec("[a-z]{1,3}", 0..2), opt()),
            l3 in (opt(), proptest::collection::vec(("[a-z]{1,3}", 0u64..5), 0..2)),
            l4 in (opt(), proptest::bool::weighted(0.2), prop_oneof![Just(0u64), any::<u64>()]),
        ) -> Delivery {
            let (id, seq, sound, status, reason, items) = head;
            Delivery {
                id: crate::ids::DeliveryId::new(id),
                notification_id: "n".into(),
                notification_seq: seq,
                source_seq: seq / 2,
                route: "r".into(),
                sink: [None, Some(Sink::Webhook), Some(Sink::Email), Some(Sink::App)][status],
                recipient: reason.clone(),
                priority: crate::names::Priority::Info,
                title: "t".into(),
                body: None,
                sound,
                task_id: None,
                group_key: reason.clone(),
                status: DeliveryStatus::ALL[status],
                reason,
                attempts: status as u32,
                max_attempts: 5,
                next_attempt_at_us: Some(seq as i64 / 3),
                lease_owner: None,
                lease_expires_at_us: None,
                last_error_code: None,
                last_error: None,
                external_id: None,
                created_at_us: 1,
                updated_at_us: 2,
                delivered_at_us: None,
                items,
                digest_until_us: None,
                last_seq: seq,
                more_items: l1.0,
                source_site: l1.1,
                redacted: l1.2,
                cancel_pending: l1.3,
                resolved_targets: l2.0,
                list: l2.1,
                ntype: l3.0,
                counts: l3.1,
                order_key: l4.0,
                order_skips_parked: l4.1,
                order_seq: l4.2,
            }
        }
    }

    proptest! {
        #[test]
        fn the_flat_row_has_the_nested_rows_bytes(d in delivery()) {
            let bytes = postcard::to_stdvec(&old(&d)).unwrap();
            prop_assert_eq!(&d.encode(Vec::new()).unwrap(), &bytes);
            prop_assert_eq!(&Delivery::decode(&bytes).unwrap(), &d);
        }

        #[test]
        fn a_tail_that_does_not_decode_is_an_error(
            d in delivery(),
            junk in proptest::collection::vec(any::<u8>(), 1..4),
        ) {
            // A level cut short: never read as its defaults.
            let bytes = d.encode(Vec::new()).unwrap();
            let golden = postcard::to_stdvec(&OldDelivery { ext: OldExt::default(), ..old(&d) })
                .unwrap();
            if bytes.len() > golden.len() {
                prop_assert!(Delivery::decode(&bytes[..bytes.len() - 1]).is_err());
            }
            // Bytes after the last level.
            let full = Delivery { order_seq: d.order_seq.max(1), ..d };
            let mut bytes = full.encode(Vec::new()).unwrap();
            bytes.extend_from_slice(&junk);
            prop_assert!(Delivery::decode(&bytes).is_err());
        }
    }

    #[test]
    fn a_level_that_is_not_its_type_is_an_error() {
        let d = Delivery::decode(
            &postcard::to_stdvec(&OldDelivery {
                ext: OldExt::default(),
                ..old(&delivery_with_no_tail())
            })
            .unwrap(),
        )
        .unwrap();
        let mut bytes = d.encode(Vec::new()).unwrap();
        // The first level starts with a vec length; 1 item, then a string of length 200 with
        // no bytes behind it.
        bytes.extend_from_slice(&[1, 200]);
        assert!(Delivery::decode(&bytes).is_err());
    }

    fn delivery_with_no_tail() -> Delivery {
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let mut d = delivery().new_tree(&mut runner).unwrap().current();
        d.more_items.clear();
        d.source_site = None;
        d.redacted = false;
        d.cancel_pending = false;
        d.resolved_targets.clear();
        d.list = None;
        d.ntype = None;
        d.counts.clear();
        d.order_key = None;
        d.order_skips_parked = false;
        d.order_seq = 0;
        d
    }
}
