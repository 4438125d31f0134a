//! Leases on work that must run once per cluster (spec section 16): a bridge notifier per
//! subscription, a source poller per source, the retention run. On the embedded log a node is
//! the whole cluster and holds every lease; on JetStream each lease is a key of a KV bucket
//! (`<stream>_leases`, every entry expiring `ttl` after its last write) that one node creates
//! and then renews by compare-and-swap on its revision.
//!
//! # How it holds
//! A keeper task renews what this node holds and tries to take what it wants every `ttl / 3`,
//! up to its fair part (the wanted leases over the live nodes): a node holding more hands the
//! excess over, so work spreads over the nodes and moves back when a node returns.
//! A lease counts as held here only until `ttl − ttl / 6` after the start of its last
//! successful write, so a node that cannot reach the cluster stops acting on a lease before
//! the server lets another node take it. A node that dies stops renewing: its keys expire and
//! another node takes them at its next round, within `ttl + ttl / 3` of the last renewal. A
//! node that closes deletes its keys, so the handover is at once.
//!
//! The same bucket says who is alive: each node keeps a key `n.<node>` of its own, and the
//! sorted list of those is the cluster's membership, from which a node takes its share of the
//! due deliveries ([`Share`]).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::kv;
use tokio::sync::watch;

/// A node's place among the live nodes: `index` of `of` (sorted by node id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    pub index: usize,
    pub of: usize,
}

impl Share {
    /// The one node of a single-node setup.
    pub const ALL: Share = Share { index: 0, of: 1 };

    /// Whether `id` falls in this node's share ([`slot`] of the id).
    pub fn owns(&self, id: &str) -> bool {
        self.of <= 1 || slot(id, self.of) == self.index
    }
}

/// Which of `of` slots `id` falls in: a stable hash of the id (FNV-1a), the same on every node
/// and every run.
pub fn slot(id: &str, of: usize) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % of.max(1) as u64) as usize
}

/// This node's leases; cheap to clone.
#[derive(Clone)]
pub struct Leases {
    inner: Arc<Inner>,
}

struct Inner {
    node: String,
    /// `None`: a single node, holding every lease.
    kv: Option<kv::Store>,
    ttl: Duration,
    state: Mutex<State>,
    /// Bumped when a lease is taken or lost, or the membership changes.
    changed: watch::Sender<u64>,
    /// Set once the keeper has made its first round (what is held is known).
    ready: watch::Sender<bool>,
}

#[derive(Default)]
struct State {
    wanted: BTreeSet<String>,
    held: HashMap<String, Held>,
    /// The revision of this node's membership key.
    member: Option<u64>,
    members: Vec<String>,
}

#[derive(Clone, Copy)]
struct Held {
    revision: u64,
    until: Instant,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases")
            .field("node", &self.inner.node)
            .field("cluster", &self.inner.kv.is_some())
            .finish()
    }
}

impl Leases {
    /// A node that is the whole cluster: it holds every lease.
    pub fn single(node: impl Into<String>) -> Leases {
        let node = node.into();
        let (changed, _) = watch::channel(0);
        let (ready, _) = watch::channel(true);
        Leases {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    members: vec![node.clone()],
                    ..State::default()
                }),
                node,
                kv: None,
                ttl: Duration::from_secs(3600),
                changed,
                ready,
            }),
        }
    }

    /// Leases in `kv` (a bucket whose entries expire after `ttl`), kept by a task on `handle`
    /// until `stop` is set.
    pub(crate) fn cluster(
        kv: kv::Store,
        node: String,
        ttl: Duration,
        handle: &tokio::runtime::Handle,
        stop: watch::Receiver<bool>,
    ) -> Leases {
        let (changed, _) = watch::channel(0);
        let (ready, _) = watch::channel(false);
        let leases = Leases {
            inner: Arc::new(Inner {
                node,
                kv: Some(kv),
                ttl,
                state: Mutex::new(State::default()),
                changed,
                ready,
            }),
        };
        handle.spawn(leases.clone().keep(stop));
        leases
    }

    /// This node's id (unique per process).
    pub fn node(&self) -> &str {
        &self.inner.node
    }

    /// How long an unrenewed lease lasts on the cluster.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// Whether several nodes may share the work (a JetStream cluster).
    pub fn clustered(&self) -> bool {
        self.inner.kv.is_some()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ask for `name`: the keeper tries to take it at each round from now on.
    pub fn want(&self, name: &str) {
        if self.inner.kv.is_some() {
            self.state().wanted.insert(name.to_owned());
        }
    }

    /// Whether this node holds `name` now (and asks for it from now on, as [`Leases::want`]).
    pub fn holds(&self, name: &str) -> bool {
        if self.inner.kv.is_none() {
            return true;
        }
        let mut st = self.state();
        if !st.wanted.contains(name) {
            st.wanted.insert(name.to_owned());
        }
        st.held.get(name).is_some_and(|h| h.until > Instant::now())
    }

    /// The leases this node holds now, sorted.
    pub fn held(&self) -> Vec<String> {
        let now = Instant::now();
        let mut v: Vec<String> = self
            .state()
            .held
            .iter()
            .filter(|(_, h)| h.until > now)
            .map(|(n, _)| n.clone())
            .collect();
        v.sort();
        v
    }

    /// The live nodes, sorted (this one alone on a single node).
    pub fn members(&self) -> Vec<String> {
        self.state().members.clone()
    }

    /// This node's share of the work shared by hash ([`Share::owns`]).
    pub fn share(&self) -> Share {
        let st = self.state();
        match st.members.iter().position(|m| *m == self.inner.node) {
            Some(index) => Share {
                index,
                of: st.members.len(),
            },
            None => Share::ALL,
        }
    }

    /// A receiver that changes when a lease is taken or lost, or the membership changes.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.changed.subscribe()
    }

    /// Wait until the keeper has made its first round (at once on a single node).
    pub async fn ready(&self) {
        let mut rx = self.inner.ready.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }

    /// The keeper: a round at once, then every `ttl / 3`, until `stop`.
    async fn keep(self, mut stop: watch::Receiver<bool>) {
        let every = self.inner.ttl / 3;
        loop {
            tokio::select! {
                _ = self.round() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            self.inner.ready.send_replace(true);
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// Renew this node's membership and what it holds, read the membership, then even the
    /// load: a node holding more than its fair part (the wanted leases over the live nodes,
    /// rounded up) hands the excess over (deletes those keys, which another node takes at its
    /// next round), and one holding less takes free leases up to its part.
    async fn round(&self) {
        let Some(kv) = &self.inner.kv else { return };
        let started = Instant::now();
        let until = started + self.inner.ttl - self.inner.ttl / 6;
        let me: Vec<u8> = self.inner.node.clone().into_bytes();
        let node = &self.inner.node;
        let mut changed = false;
        // Membership first: the fair part depends on it.
        let member = self.state().member;
        let key = member_key(node);
        let written = match member {
            Some(revision) => kv.update(&key, me.clone().into(), revision).await.ok(),
            None => kv.create(&key, me.clone().into()).await.ok(),
        };
        self.state().member = match written {
            Some(r) => Some(r),
            // Expired (a long pause) or never made: made again at the next round.
            None if member.is_some() => {
                let _ = kv.delete(&key).await;
                None
            }
            None => None,
        };
        if let Ok(members) = members(kv).await {
            let mut st = self.state();
            if st.members != members {
                st.members = members;
                changed = true;
            }
        }
        let (wanted, held, live) = {
            let st = self.state();
            let wanted: Vec<String> = st.wanted.iter().cloned().collect();
            (wanted, st.held.clone(), st.members.len().max(1))
        };
        let fair = wanted.len().div_ceil(live);
        // Renew what is held.
        let mut kept: Vec<String> = Vec::new();
        for (name, h) in &held {
            let key = lease_key(name);
            let written = kv.update(&key, me.clone().into(), h.revision).await.ok();
            // Not renewed: another node took it after it expired, or the cluster did not
            // answer (then it lapses here when its time is up).
            let lost =
                written.is_none() && (h.until <= Instant::now() || kv_taken(kv, &key, node).await);
            let mut st = self.state();
            if let Some(revision) = written {
                st.held.insert(name.clone(), Held { revision, until });
                kept.push(name.clone());
            } else if lost {
                st.held.remove(name);
                changed = true;
                tracing::info!(lease = %name, node = %node, "lease lost");
            } else {
                kept.push(name.clone());
            }
        }
        kept.sort();
        if kept.len() > fair {
            // More than this node's part: hand the last ones over.
            for name in kept.split_off(fair) {
                let revision = self.state().held.remove(&name).map(|h| h.revision);
                let _ = kv.delete_expect_revision(lease_key(&name), revision).await;
                changed = true;
                tracing::info!(lease = %name, node = %node, "lease handed over");
            }
        } else {
            for name in wanted.iter().filter(|n| !held.contains_key(*n)) {
                if kept.len() >= fair {
                    break;
                }
                if let Ok(revision) = kv.create(lease_key(name), me.clone().into()).await {
                    self.state()
                        .held
                        .insert(name.clone(), Held { revision, until });
                    kept.push(name.clone());
                    changed = true;
                    tracing::info!(lease = %name, node = %node, "lease taken");
                }
            }
        }
        if changed {
            self.inner.changed.send_modify(|g| *g += 1);
        }
    }

    /// Delete every key this node holds (its leases pass on at once); after the keeper stopped.
    pub(crate) async fn release(&self) {
        let Some(kv) = &self.inner.kv else { return };
        let (held, member): (Vec<(String, Held)>, Option<u64>) = {
            let mut st = self.state();
            (st.held.drain().collect(), st.member.take())
        };
        let timeout = Duration::from_secs(2);
        for (name, h) in held {
            let delete = kv.delete_expect_revision(lease_key(&name), Some(h.revision));
            let _ = tokio::time::timeout(timeout, delete).await;
        }
        if member.is_some() {
            let delete = kv.delete_expect_revision(member_key(&self.inner.node), member);
            let _ = tokio::time::timeout(timeout, delete).await;
        }
        self.inner.changed.send_modify(|g| *g += 1);
    }
}

/// Whether `key` now names another node (read back after a failed renewal).
async fn kv_taken(kv: &kv::Store, key: &str, node: &str) -> bool {
    match tokio::time::timeout(Duration::from_secs(2), kv.entry(key)).await {
        Ok(Ok(Some(e))) => e.operation != kv::Operation::Put || e.value != node.as_bytes(),
        Ok(Ok(None)) => true,
        _ => false,
    }
}

/// The live nodes: the `n.` keys of the bucket, sorted.
async fn members(kv: &kv::Store) -> Result<Vec<String>, ()> {
    use futures::TryStreamExt;
    let keys = tokio::time::timeout(Duration::from_secs(2), async {
        kv.keys()
            .await
            .map_err(|_| ())?
            .try_collect::<Vec<String>>()
            .await
            .map_err(|_| ())
    })
    .await
    .map_err(|_| ())??;
    let mut m: Vec<String> = keys
        .into_iter()
        .filter_map(|k| k.strip_prefix("n.").map(str::to_owned))
        .collect();
    m.sort();
    Ok(m)
}

fn member_key(node: &str) -> String {
    format!("n.{node}")
}

/// A lease's key: `l.` and its name, every byte outside `[A-Za-z0-9_-]` written `=XX`.
fn lease_key(name: &str) -> String {
    let mut k = String::from("l.");
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            k.push(b as char);
        } else {
            k.push_str(&format!("={b:02X}"));
        }
    }
    k
}

/// A node id unique per process: the host's name (when it has one), the pid and a few random
/// bits of the clock.
pub fn node_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| {
            h.trim()
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
                .take(32)
                .collect::<String>()
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "node".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{host}-{}-{:05x}", std::process::id(), nanos & 0xfffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_valid_and_shares_cover_everything() {
        assert_eq!(lease_key("source.a b"), "l.source=2Ea=20b");
        let ids: Vec<String> = (0..1000).map(|i| format!("dlv-{i}")).collect();
        for of in 1..4 {
            let mut seen = 0;
            for index in 0..of {
                let s = Share { index, of };
                seen += ids.iter().filter(|i| s.owns(i)).count();
            }
            assert_eq!(seen, ids.len(), "every id in exactly one share of {of}");
        }
        let l = Leases::single("n1");
        assert!(l.holds("anything"));
        assert_eq!(l.share(), Share::ALL);
    }
}
