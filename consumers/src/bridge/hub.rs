//! The pull-sink cache the notifier keeps for the HTTP handlers.

use std::collections::HashMap;

use tidemark_projections::bridges::Subscription;
use tidemark_projections::ids::{BridgeId, SubscriptionId};

/// Pull-sink state shared by the notifier and the HTTP handlers: per bridge, the envelope each
/// pull subscription has pending (as of the notifier's last look at it) and a wake-up counter
/// for long-polls. The notifier updates an entry whenever the log changes anything the entry
/// depends on (the task, the cursor, the subscription), then bumps the bridge, so a long-poll
/// costs nothing until its own bridge has news. An ack lowers nothing: it raises the
/// subscription's floor, so an entry computed before the ack is never served after it.
#[derive(Clone)]
pub struct PullHub(
    std::sync::Arc<std::sync::Mutex<Hub>>,
    /// The log head the notifier's last completed pass looked at.
    tokio::sync::watch::Sender<u64>,
);

impl Default for PullHub {
    fn default() -> Self {
        PullHub(Default::default(), tokio::sync::watch::channel(0).0)
    }
}

#[derive(Default)]
struct Hub {
    /// Set after the notifier's first full pass; before it, handlers compute from the log.
    ready: bool,
    wake: HashMap<BridgeId, tokio::sync::watch::Sender<u64>>,
    /// bridge → subscription → (seq, envelope).
    pending:
        HashMap<BridgeId, std::collections::BTreeMap<SubscriptionId, (u64, serde_json::Value)>>,
    /// subscription → highest seq acked through the API.
    floor: HashMap<SubscriptionId, u64>,
}

impl PullHub {
    fn lock(&self) -> std::sync::MutexGuard<'_, Hub> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A receiver that changes when `bridge_id` may have something new.
    pub fn subscribe(&self, bridge_id: &BridgeId) -> tokio::sync::watch::Receiver<u64> {
        self.lock()
            .wake
            .entry(bridge_id.clone())
            .or_insert_with(|| tokio::sync::watch::channel(0).0)
            .subscribe()
    }

    /// Wait (at most `limit`) until the notifier has looked at the log up to `head`; `false`
    /// when it has not by then.
    pub async fn caught_up(&self, head: u64, limit: std::time::Duration) -> bool {
        let mut rx = self.1.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|seen| *seen >= head))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// The bridge's pending envelopes, or `None` until the notifier has looked at everything.
    pub fn pending(&self, bridge_id: &BridgeId) -> Option<Vec<serde_json::Value>> {
        let h = self.lock();
        if !h.ready {
            return None;
        }
        Some(
            h.pending
                .get(bridge_id)
                .map(|m| m.values().map(|(_, v)| v.clone()).collect())
                .unwrap_or_default(),
        )
    }

    /// A delivery was acked through the API: never serve it (or anything before it) again.
    pub fn acked(&self, bridge_id: &BridgeId, subscription_id: &SubscriptionId, seq: u64) {
        let mut h = self.lock();
        let f = h.floor.entry(subscription_id.clone()).or_insert(0);
        *f = (*f).max(seq);
        if let Some(m) = h.pending.get_mut(bridge_id)
            && m.get(subscription_id).is_some_and(|(s, _)| *s <= seq)
        {
            m.remove(subscription_id);
        }
    }

    pub(super) fn set(&self, sub: &Subscription, entry: Option<(u64, serde_json::Value)>) {
        let mut h = self.lock();
        let floor = h.floor.get(&sub.subscription_id).copied().unwrap_or(0);
        let m = h.pending.entry(sub.target.bridge_id.clone()).or_default();
        match entry {
            Some((seq, v)) if seq > floor => {
                m.insert(sub.subscription_id.clone(), (seq, v));
            }
            _ => {
                m.remove(&sub.subscription_id);
            }
        }
    }

    /// The subscription is gone, or its cursor was reset (the floor no longer holds).
    pub(super) fn forget(&self, subscription_id: &SubscriptionId, reset: bool) {
        let mut h = self.lock();
        for m in h.pending.values_mut() {
            m.remove(subscription_id);
        }
        if reset {
            h.floor.remove(subscription_id);
        }
    }

    pub(super) fn set_ready(&self) {
        self.lock().ready = true;
    }

    pub(super) fn seen(&self, head: u64) {
        self.1.send_if_modified(|s| {
            let changed = head > *s;
            *s = (*s).max(head);
            changed
        });
    }

    pub(super) fn bump(&self, bridge_id: &BridgeId) {
        let h = self.lock();
        if let Some(tx) = h.wake.get(bridge_id) {
            tx.send_modify(|n| *n += 1);
        }
    }
}
