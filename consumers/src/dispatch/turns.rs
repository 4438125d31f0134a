//! Which tenants a sink's loop claims for, in what order, and when their first delivery falls
//! due (spec section 20: a shard's loop walks the tenants the directory places in it).

use std::time::{Duration, Instant};

use tidemark_engine::Engine;
use tidemark_projections::names::Sink;

/// The tenants a dispatcher claims for, read again at most once a second (a tenant created
/// meanwhile is claimed for from then on), and whose turn comes first.
#[derive(Default)]
pub(super) struct Tenants {
    pub(super) all: Vec<Engine>,
    read_at: Option<Instant>,
    next: usize,
    /// The last refresh was skipped (a second had not passed): the list may lack a tenant
    /// created since, whose due deliveries no wait would wake for.
    stale: bool,
}

impl Tenants {
    /// Read the tenants again when a second has passed (the default tenant alone until a
    /// first read succeeds).
    pub(super) async fn refresh(&mut self, engine: &Engine) {
        self.stale = self
            .read_at
            .is_some_and(|at| at.elapsed() < Duration::from_secs(1));
        if self.stale {
            return;
        }
        let e = engine.clone();
        match tokio::task::spawn_blocking(move || e.every_tenant()).await {
            Ok(Ok(all)) => {
                self.all = all.into_iter().map(|(e, _)| e).collect();
                self.read_at = Some(Instant::now());
            }
            _ if self.all.is_empty() => self.all = vec![engine.clone()],
            _ => {}
        }
    }

    /// How long until a skipped refresh may be made, when one was skipped: a loop that would
    /// sleep without a timer wakes then, once, to read the tenants again (a tenant created in
    /// the second after the last read, in a shard with no other, had its deliveries wait for
    /// the next page of the shard).
    pub(super) fn stale_for(&self) -> Option<Duration> {
        let at = self.read_at.filter(|_| self.stale)?;
        Some(Duration::from_secs(1).saturating_sub(at.elapsed()))
    }

    /// Every tenant, in the order to claim for (popped from the end): one place on from last
    /// time.
    pub(super) fn turn(&mut self) -> Vec<Engine> {
        self.next = (self.next + 1) % self.all.len().max(1);
        let mut order = self.all.clone();
        order.rotate_left(self.next);
        order.reverse();
        order
    }
}

/// When the first delivery of `sink` falls due, read once the models have folded (and
/// committed) the log up to the head: the claim just decided saw all of it, and the decider
/// commits what it folds only after its replies, batched; a read of the store as it stood
/// would still show the leases this sink's last completion ended, due at their expiry. The
/// wait (a reader waiting has the decider commit at once) is off the async workers.
pub(super) async fn earliest_due(tenants: &[Engine], sink: Sink) -> Result<Option<i64>, String> {
    let qs: Vec<_> = tenants.iter().map(|e| e.read().clone()).collect();
    tokio::task::spawn_blocking(move || {
        let mut earliest: Option<i64> = None;
        for q in qs {
            q.floor(0).map_err(|e| e.to_string())?;
            if let Some(at) = q.earliest_due(sink).map_err(|e| e.to_string())? {
                earliest = Some(earliest.map_or(at, |e| e.min(at)));
            }
        }
        Ok(earliest)
    })
    .await
    .map_err(|e| e.to_string())?
}
