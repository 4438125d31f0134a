//! The pull-sink cache the notifier keeps for the HTTP handlers.

use std::collections::HashMap;

use tidemark_projections::bridges::Subscription;
use tidemark_projections::ids::{BridgeId, SubscriptionId};

/// Pull-sink state shared by the notifier and the HTTP handlers of one shard: per tenant and
/// bridge (two tenants may name a bridge alike), the envelope each
/// pull subscription has pending (as of the notifier's last look at it) and a wake-up counter
/// for long-polls. The notifier updates an entry whenever the log changes anything the entry
/// depends on (the task, the cursor, the subscription), then bumps the bridge, so a long-poll
/// costs nothing until its own bridge has news. An ack lowers nothing: it raises the
/// subscription's floor, so an entry computed before the ack is never served after it.
#[derive(Clone)]
pub struct PullHub(
    std::sync::Arc<std::sync::Mutex<Hub>>,
    /// How far the notifier has looked at the log.
    tokio::sync::watch::Sender<Looked>,
    /// The engine whose follower feeds the notifier (set when the reactors start): a wait
    /// for the notifier holds its pages, so commits with nothing for the bridges are looked
    /// at too.
    std::sync::Arc<std::sync::OnceLock<tidemark_engine::Engine>>,
);

impl Default for PullHub {
    fn default() -> Self {
        PullHub(
            Default::default(),
            tokio::sync::watch::channel(Looked::default()).0,
            Default::default(),
        )
    }
}

/// How far the notifier has looked at the log. The follower hands it only the pages that
/// concern the bridges; the others are looked at by being passed over, once the notifier has
/// finished every page handed to it before.
#[derive(Debug, Default, Clone, Copy)]
pub struct Looked {
    /// The log head the notifier's last completed pass looked at.
    seen: u64,
    /// The end of the last page handed to the notifier.
    handed: u64,
    /// The end of the last page passed over (nothing in it for the bridges).
    passed: u64,
}

impl Looked {
    /// Every event up to this seq has been looked at.
    fn upto(&self) -> u64 {
        if self.seen >= self.handed {
            self.seen.max(self.passed)
        } else {
            self.seen
        }
    }
}

/// A bridge or subscription of one tenant (by the tenant's name).
type Of<T> = (String, T);

#[derive(Default)]
struct Hub {
    /// Set after the notifier's first full pass; before it, handlers compute from the log.
    ready: bool,
    wake: HashMap<Of<BridgeId>, tokio::sync::watch::Sender<u64>>,
    /// bridge → subscription → (seq, envelope).
    pending:
        HashMap<Of<BridgeId>, std::collections::BTreeMap<SubscriptionId, (u64, serde_json::Value)>>,
    /// subscription → highest seq acked through the API.
    floor: HashMap<Of<SubscriptionId>, u64>,
}

fn of<T: Clone>(tenant: &str, id: &T) -> Of<T> {
    (tenant.to_owned(), id.clone())
}

impl PullHub {
    fn lock(&self) -> std::sync::MutexGuard<'_, Hub> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A receiver that changes when `tenant`'s `bridge_id` may have something new.
    pub fn subscribe(
        &self,
        tenant: &str,
        bridge_id: &BridgeId,
    ) -> tokio::sync::watch::Receiver<u64> {
        self.lock()
            .wake
            .entry(of(tenant, bridge_id))
            .or_insert_with(|| tokio::sync::watch::channel(0).0)
            .subscribe()
    }

    /// Wait (at most `limit`) until the notifier has looked at the log up to `head`; `false`
    /// when it has not by then.
    pub async fn caught_up(&self, head: u64, limit: std::time::Duration) -> bool {
        let mut rx = self.1.subscribe();
        if rx.borrow().upto() >= head {
            return true;
        }
        // The follower passes over a commit with nothing for anyone without waking: held, it
        // looks at every commit (and now at those passed over), so the notifier's mark moves.
        let engine = self.2.get().cloned();
        let _held = engine.as_ref().map(|e| e.pages().hold());
        tokio::time::timeout(limit, rx.wait_for(|l| l.upto() >= head))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// The bridge's pending envelopes, or `None` until the notifier has looked at everything.
    pub fn pending(&self, tenant: &str, bridge_id: &BridgeId) -> Option<Vec<serde_json::Value>> {
        let h = self.lock();
        if !h.ready {
            return None;
        }
        Some(
            h.pending
                .get(&of(tenant, bridge_id))
                .map(|m| m.values().map(|(_, v)| v.clone()).collect())
                .unwrap_or_default(),
        )
    }

    /// A delivery was acked through the API: never serve it (or anything before it) again.
    pub fn acked(
        &self,
        tenant: &str,
        bridge_id: &BridgeId,
        subscription_id: &SubscriptionId,
        seq: u64,
    ) {
        let mut h = self.lock();
        let f = h.floor.entry(of(tenant, subscription_id)).or_insert(0);
        *f = (*f).max(seq);
        if let Some(m) = h.pending.get_mut(&of(tenant, bridge_id))
            && m.get(subscription_id).is_some_and(|(s, _)| *s <= seq)
        {
            m.remove(subscription_id);
        }
    }

    pub(super) fn set(
        &self,
        tenant: &str,
        sub: &Subscription,
        entry: Option<(u64, serde_json::Value)>,
    ) {
        let mut h = self.lock();
        let floor = h
            .floor
            .get(&of(tenant, &sub.subscription_id))
            .copied()
            .unwrap_or(0);
        let m = h
            .pending
            .entry(of(tenant, &sub.target.bridge_id))
            .or_default();
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
    pub(super) fn forget(&self, tenant: &str, subscription_id: &SubscriptionId, reset: bool) {
        let mut h = self.lock();
        for (_, m) in h.pending.iter_mut().filter(|((t, _), _)| t == tenant) {
            m.remove(subscription_id);
        }
        if reset {
            h.floor.remove(&of(tenant, subscription_id));
        }
    }

    /// The engine whose follower feeds the notifier.
    pub(crate) fn attach(&self, engine: &tidemark_engine::Engine) {
        let _ = self.2.set(engine.clone());
    }

    pub(super) fn set_ready(&self) {
        self.lock().ready = true;
    }

    pub(super) fn seen(&self, head: u64) {
        self.update(|l| l.seen = l.seen.max(head));
    }

    /// The follower's page ending at `upto` is handed to the notifier (`wanted`) or passed
    /// over; called in page order, before the page is handed.
    pub(crate) fn offered(&self, upto: u64, wanted: bool) {
        self.update(|l| {
            if wanted {
                l.handed = l.handed.max(upto);
            } else {
                l.passed = l.passed.max(upto);
            }
        });
    }

    fn update(&self, f: impl FnOnce(&mut Looked)) {
        self.1.send_if_modified(|l| {
            let was = l.upto();
            f(l);
            l.upto() != was
        });
    }

    pub(super) fn bump(&self, tenant: &str, bridge_id: &BridgeId) {
        let h = self.lock();
        if let Some(tx) = h.wake.get(&of(tenant, bridge_id)) {
            tx.send_modify(|n| *n += 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::PullHub;

    /// A page passed over counts as looked at only once the notifier has finished every page
    /// handed to it before; never earlier.
    #[tokio::test]
    async fn passed_pages_count_once_the_handed_ones_are_looked_at() {
        let hub = PullHub::default();
        let now = |hub: &PullHub, head| {
            let hub = hub.clone();
            async move { hub.caught_up(head, Duration::ZERO).await }
        };
        hub.offered(10, false);
        assert!(
            now(&hub, 10).await,
            "nothing was handed: passing over is looking"
        );
        hub.offered(20, true);
        hub.offered(30, false);
        assert!(
            !now(&hub, 11).await,
            "the page up to 20 is not looked at yet"
        );
        hub.seen(20);
        assert!(now(&hub, 30).await);
        assert!(!now(&hub, 31).await);
        // A long-poll waiting for the head is answered when the notifier gets there.
        let waiting = tokio::spawn({
            let hub = hub.clone();
            async move { hub.caught_up(40, Duration::from_secs(60)).await }
        });
        hub.offered(40, true);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        hub.seen(40);
        assert!(waiting.await.unwrap());
    }
}
