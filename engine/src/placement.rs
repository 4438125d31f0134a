//! Where each tenant acts (spec section 20), as this process knows it between two folds of
//! the directory: the deployment's shards share one [`Placement`].
//!
//! A tenant's events are in the shard it lives in, and nowhere else, but for a move
//! ([`crate::moves`]): the destination holds a copy of them before the tenant lives there
//! (inert until the switch, and after a crash a prefix of one), and the source keeps them
//! after it has left. So a shard's reactors act on a tenant's events only where it lives
//! ([`Placement::acts`]): the placements the directory recorded (loaded at the start, before
//! any reactor runs), and the moves under way in this process. A tenant not loaded was
//! created since the start, never moved: it acts where its events are.
//!
//! It also holds each tenant's gate: every request that changes a tenant's data holds it
//! shared while it runs ([`Placement::gate`]), and a move holds it exclusively from the fence
//! to the switch.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

use tidemark_projections::tenants::TenantRow;
use tokio::sync::watch;

/// Whether a shard's reactors act on a tenant's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acts {
    /// It lives here (or it is the default tenant, whose events are the home shard's, and a
    /// move's fillers elsewhere that no reactor takes).
    Here,
    /// It lives in another shard: these are a copy (a move's destination before the switch,
    /// or its source after).
    Elsewhere,
    /// It is being moved into this shard (its events here are the copy the switch will make
    /// its own), or out of it and fenced (a move that fails after its fence leaves it here):
    /// wait for the switch, or for the move to fail.
    Wait,
}

/// A move under way in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moving {
    pub from: u32,
    pub to: u32,
    /// The fence is wanted: requests in flight are finishing (long polls end at once).
    pub fencing: bool,
    /// Fenced: its requests wait, and the source's reactors no longer act for it.
    pub fenced: bool,
}

#[derive(Default)]
struct Inner {
    /// Each tenant's shard as the directory recorded it (loaded, then kept by the moves and
    /// by the directory's changes as the home shard's follower reads them).
    shard_of: HashMap<String, u32>,
    /// The shards a tenant has been placed in (shard 0 always): another tenant's events wait
    /// in a shard no tenant was ever placed in (a move's destination before its switch, on
    /// every node of a cluster, the mover's or not) and are dropped in one that held one.
    occupied: HashSet<u32>,
    /// On a cluster, the tenants' fences ([`tidemark_log::MOVE_FENCE_TYPE`]): by tenant and
    /// the shard it is fenced out of, the fence's seq there. Its events after the fence there
    /// are void.
    fences: HashMap<(String, u32), u64>,
    moving: HashMap<String, Moving>,
    /// The tenants moved into a shard by this process: (shard, the source's head at the
    /// switch). Their events through it there are history the switch brought, not news.
    arrived: HashMap<String, (u32, u64)>,
}

impl Inner {
    /// [`Placement::commands_here`] of a tenant, under the lock.
    fn commands_here(&self, tenant: &str, shard: u32) -> bool {
        if let Some(m) = self.moving.get(tenant)
            && (m.to == shard || (m.from == shard && m.fenced))
        {
            return false;
        }
        if self.fenced_out(tenant, shard).is_some() {
            return false;
        }
        self.shard_of.get(tenant).is_none_or(|&s| s == shard)
    }

    /// The seq of `tenant`'s fence out of `shard`, if it has one there.
    fn fenced_out(&self, tenant: &str, shard: u32) -> Option<u64> {
        self.fences.get(&(tenant.to_owned(), shard)).copied()
    }

    /// Whether `tenant` is fenced out of the shard it lives in (its move has not switched).
    fn fenced_where_it_lives(&self, tenant: &str) -> bool {
        self.shard_of
            .get(tenant)
            .is_some_and(|&s| self.fenced_out(tenant, s).is_some())
    }

    fn acts(&self, t: &str, shard: u32) -> Acts {
        if let Some(m) = self.moving.get(t) {
            if m.to == shard {
                return Acts::Wait;
            }
            if m.from == shard && m.fenced {
                return Acts::Wait;
            }
        }
        match self.shard_of.get(t) {
            // A copy in a shard no tenant ever lived in is a move's, before its switch (or a
            // crashed one's, inert until the move is run again).
            Some(&s) if s != shard && !self.occupied.contains(&shard) => Acts::Wait,
            Some(&s) if s != shard => Acts::Elsewhere,
            _ => Acts::Here,
        }
    }
}

/// The deployment's placements in this process, shared by its shards' engines.
pub struct Placement {
    inner: RwLock<Inner>,
    /// Bumped when a move begins, fences, switches or ends.
    changes: watch::Sender<u64>,
    gates: Mutex<HashMap<String, Arc<tokio::sync::RwLock<()>>>>,
    /// Each tenant's commands and appends under way ([`Placement::enter`]), and what tells a
    /// fence that they have all ended.
    inflight: Mutex<HashMap<Arc<str>, usize>>,
    drained: tokio::sync::Notify,
}

impl Default for Placement {
    fn default() -> Self {
        Placement {
            inner: RwLock::default(),
            changes: watch::channel(0).0,
            gates: Mutex::default(),
            inflight: Mutex::default(),
            drained: tokio::sync::Notify::new(),
        }
    }
}

/// A tenant's command or append refused where it does not act ([`Placement::enter`]).
#[derive(Debug, Clone, Copy)]
pub struct NotHere;

/// A command or append under way ([`Placement::enter`]).
pub struct InFlight {
    placement: Arc<Placement>,
    tenant: Arc<str>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut inflight = self
            .placement
            .inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = inflight.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                inflight.remove(&self.tenant);
                self.placement.drained.notify_waiters();
            }
        }
    }
}

/// A move already under way for a tenant, or into a shard.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct Busy(pub String);

impl Placement {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n += 1);
    }

    /// Take the directory's placements (every tenant ever created): before the reactors of
    /// any shard run, and again whenever the directory has been read whole.
    pub fn load(&self, rows: &[TenantRow]) {
        let mut inner = self.write();
        inner.occupied.insert(0);
        for r in rows {
            inner.shard_of.insert(r.name.clone(), r.shard);
            inner.occupied.insert(r.shard);
        }
    }

    /// The directory placed a new tenant (`tenant.created`, as a node's home follower reads
    /// it; a cluster's other nodes learn of it so).
    pub fn created(&self, tenant: &str, shard: u32) {
        let mut inner = self.write();
        inner.shard_of.entry(tenant.to_owned()).or_insert(shard);
        inner.occupied.insert(shard);
    }

    /// The directory recorded a move (`tenant.moved`, as a node's home follower reads it): the
    /// tenant lives in `to` from now on, which holds its source through `through_seq`. On the
    /// node that moved it this is already so; on a cluster's other nodes this is the switch.
    pub fn switched(&self, tenant: &str, from: u32, to: u32, through_seq: u64) {
        {
            let mut inner = self.write();
            // A record read again (a follower replaying the directory at a start) moves
            // nothing: it switches a tenant only from where this process places it.
            if inner.shard_of.get(tenant).is_some_and(|&s| s != from) {
                return;
            }
            inner.shard_of.insert(tenant.to_owned(), to);
            inner.occupied.insert(to);
            inner.arrived.insert(tenant.to_owned(), (to, through_seq));
        }
        self.changed();
    }

    /// On a cluster, `tenant` is fenced out of shard `shard` at `seq` (the fence's event, as a
    /// follower of the shard or the move read it): its events there after it are void, its
    /// commands there refused, its requests wait for the switch. The first fence counts.
    pub fn fenced_at(&self, tenant: &str, shard: u32, seq: u64) {
        {
            let mut inner = self.write();
            if inner.fenced_out(tenant, shard).is_some() {
                return;
            }
            inner.fences.insert((tenant.to_owned(), shard), seq);
        }
        self.changed();
    }

    /// How shard `shard`'s reactors take a run of `tenant`'s events: its verdict, and on a
    /// cluster the seq of the tenant's fence out of the shard, past which its events are void
    /// (dropped whatever the verdict). One look under one lock.
    pub fn verdict(&self, tenant: Option<&str>, shard: u32) -> (Acts, Option<u64>) {
        let Some(t) = tenant else {
            return (Acts::Here, None);
        };
        let inner = self.read();
        (inner.acts(t, shard), inner.fenced_out(t, shard))
    }

    /// On a cluster, whether `tenant` is fenced out of the shard it lives in: its move has
    /// fenced it and this node has not seen the switch yet (its requests wait for it).
    pub fn fenced_where_it_lives(&self, tenant: &str) -> bool {
        self.read().fenced_where_it_lives(tenant)
    }

    /// The seq of `tenant`'s fence out of shard `shard`, as this process knows it.
    pub fn fence_in(&self, tenant: &str, shard: u32) -> Option<u64> {
        self.read().fenced_out(tenant, shard)
    }

    /// Whether shard `shard`'s reactors act on the events of `tenant` (`None`: the default
    /// tenant).
    pub fn acts(&self, tenant: Option<&str>, shard: u32) -> Acts {
        let Some(t) = tenant else {
            return Acts::Here;
        };
        self.read().acts(t, shard)
    }

    /// Whether commands of `tenant` may run in shard `shard` (`None`: the default tenant,
    /// always): not where it does not live, not while a move copies it into the shard, not in
    /// its source once the move is fenced. A reactor's command in flight at a fence is refused
    /// rather than recorded after the copy's end.
    pub fn commands_here(&self, tenant: Option<&str>, shard: u32) -> bool {
        let Some(t) = tenant else {
            return true;
        };
        self.read().commands_here(t, shard)
    }

    /// A command or append of `tenant` (`None`: the default tenant's, never counted) in shard
    /// `shard` begins: refused (`Err`) where [`Placement::commands_here`] says no, else counted
    /// until the answer is dropped. Decided under the same lock a fence takes, so a fence
    /// then waits ([`Placement::drained`]) for every one that began before it: none is
    /// recorded after the move's copy ends.
    pub fn enter(
        self: &Arc<Self>,
        tenant: Option<&Arc<str>>,
        shard: u32,
    ) -> Result<Option<InFlight>, NotHere> {
        let Some(t) = tenant else {
            return Ok(None);
        };
        let inner = self.read();
        if !inner.commands_here(t, shard) {
            return Err(NotHere);
        }
        *self
            .inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(t.clone())
            .or_insert(0) += 1;
        drop(inner);
        Ok(Some(InFlight {
            placement: self.clone(),
            tenant: t.clone(),
        }))
    }

    /// Until no command or append of `tenant` is under way.
    pub async fn drained(&self, tenant: &str) {
        loop {
            let notified = self.drained.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let busy = self
                .inflight
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(tenant);
            if !busy {
                return;
            }
            notified.await;
        }
    }

    /// Until the move of `tenant` this process runs (if one is under way) has ended; then
    /// whether its commands run in shard `shard` (a reactor whose command a fence refused
    /// retries it, or leaves it to the shard the tenant went to). A cluster's fence is for
    /// good: not here, at once, whatever the switch (a reactor waiting for it would hold the
    /// shard's other tenants).
    pub async fn settled(&self, tenant: &str, shard: u32) -> bool {
        let mut changes = self.changes();
        while self.moving(tenant).is_some() {
            if changes.changed().await.is_err() {
                break;
            }
        }
        self.commands_here(Some(tenant), shard)
    }

    /// Whether `ev_seq` of `tenant` in shard `shard` is history a move brought there in this
    /// process (a reactor that tells of what happens from now on passes over it).
    pub fn is_history(&self, tenant: Option<&str>, shard: u32, ev_seq: u64) -> bool {
        let Some(t) = tenant else {
            return false;
        };
        self.read()
            .arrived
            .get(t)
            .is_some_and(|&(s, through)| s == shard && ev_seq <= through)
    }

    /// A number that changes with every step of every move.
    pub fn version(&self) -> u64 {
        *self.changes.borrow()
    }

    /// Whether `tenant` is fenced out of shard `shard` by a move (its models there are no
    /// longer walked).
    pub fn fenced_from(&self, tenant: &str, shard: u32) -> bool {
        let inner = self.read();
        inner
            .moving
            .get(tenant)
            .is_some_and(|m| m.from == shard && m.fenced)
            || inner.fenced_out(tenant, shard).is_some()
    }

    /// The shard `tenant` lives in as this process last knew it (`None`: not loaded).
    pub fn shard_of(&self, tenant: &str) -> Option<u32> {
        self.read().shard_of.get(tenant).copied()
    }

    /// The move of `tenant` under way, if any.
    pub fn moving(&self, tenant: &str) -> Option<Moving> {
        self.read().moving.get(tenant).copied()
    }

    /// Whether a move under way copies from or into `shard`.
    pub fn in_a_move(&self, shard: u32) -> bool {
        self.read()
            .moving
            .values()
            .any(|m| m.from == shard || m.to == shard)
    }

    /// The shards moves are copying into (a new tenant is not placed there).
    pub fn reserved(&self) -> Vec<u32> {
        self.read().moving.values().map(|m| m.to).collect()
    }

    /// Begin moving `tenant` from `from` to `to`: refused while it, or `to`, is in a move.
    pub fn begin(&self, tenant: &str, from: u32, to: u32) -> Result<(), Busy> {
        {
            let mut inner = self.write();
            if inner.moving.contains_key(tenant) {
                return Err(Busy(format!("tenant {tenant:?} is being moved already")));
            }
            if inner.moving.values().any(|m| m.to == to || m.from == to) {
                return Err(Busy(format!("shard {to} is in another move")));
            }
            // A tenant created since the load lives in `from`: its copy in `to` stays inert if
            // the move fails.
            inner.shard_of.entry(tenant.to_owned()).or_insert(from);
            inner.moving.insert(
                tenant.to_owned(),
                Moving {
                    from,
                    to,
                    fencing: false,
                    fenced: false,
                },
            );
        }
        self.changed();
        Ok(())
    }

    /// Fence the move of `tenant` once its requests in flight have finished: new ones wait
    /// from now on, and long polls of it end (they watch [`Placement::changes`]). Answers the
    /// gate held exclusively; the source's reactors and commands no longer act for it.
    pub async fn fence_when_idle(&self, tenant: &str) -> tokio::sync::OwnedRwLockWriteGuard<()> {
        if let Some(m) = self.write().moving.get_mut(tenant) {
            m.fencing = true;
        }
        self.changed();
        let held = self.gate(tenant).write_owned().await;
        self.fence(tenant);
        // The commands and appends that began before the fence (a reactor's) end first.
        self.drained(tenant).await;
        held
    }

    /// The move of `tenant` is fenced: the source's reactors stop acting for it.
    pub fn fence(&self, tenant: &str) {
        if let Some(m) = self.write().moving.get_mut(tenant) {
            m.fenced = true;
        }
        self.changed();
    }

    /// Until `tenant`'s requests should end, for a move's fence: at once while one is wanted.
    pub async fn until_fencing(&self, tenant: &str) {
        let mut changes = self.changes();
        loop {
            {
                let inner = self.read();
                if inner.moving.get(tenant).is_some_and(|m| m.fencing)
                    || inner.fenced_where_it_lives(tenant)
                {
                    return;
                }
            }
            if changes.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// The move of `tenant` has ended: switched (it lives in shard `to` now, holding the
    /// source through `through_seq`) or not.
    pub fn end(&self, tenant: &str, switched: Option<(u32, u64)>) {
        {
            let mut inner = self.write();
            inner.moving.remove(tenant);
            if let Some((to, through)) = switched {
                inner.shard_of.insert(tenant.to_owned(), to);
                inner.occupied.insert(to);
                inner.arrived.insert(tenant.to_owned(), (to, through));
            }
        }
        self.changed();
    }

    /// What changes with each move's steps: a live stream of a tenant ends when its tenant
    /// no longer lives in the shard it reads, a reactor waiting on a move looks again.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The gate of `tenant`'s changes: a request that changes its data holds it shared; a
    /// move holds it exclusively from its fence to its switch.
    pub fn gate(&self, tenant: &str) -> Arc<tokio::sync::RwLock<()>> {
        let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(g) = gates.get(tenant) {
            return g.clone();
        }
        let g = Arc::new(tokio::sync::RwLock::new(()));
        gates.insert(tenant.to_owned(), g.clone());
        g
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, shard: u32) -> TenantRow {
        TenantRow {
            name: name.to_owned(),
            shard,
            ..TenantRow::default()
        }
    }

    #[test]
    fn a_tenant_acts_where_it_lives_and_waits_where_it_is_moving() {
        let p = Placement::default();
        p.load(&[row("acme", 1), row("beta", 0)]);
        assert_eq!(p.acts(None, 0), Acts::Here);
        assert_eq!(p.acts(Some("acme"), 1), Acts::Here);
        assert_eq!(
            p.acts(Some("acme"), 2),
            Acts::Wait,
            "a crashed copy in a shard no tenant lived in is held, inert"
        );
        assert_eq!(
            p.acts(Some("beta"), 1),
            Acts::Elsewhere,
            "a copy in a shard a tenant lives in is dropped"
        );
        assert_eq!(p.acts(Some("new"), 2), Acts::Here, "created since the load");
        p.begin("acme", 1, 2).unwrap();
        assert!(p.begin("acme", 1, 3).is_err());
        assert!(p.begin("beta", 0, 2).is_err(), "shard 2 is in a move");
        assert_eq!(p.reserved(), vec![2]);
        assert_eq!(
            p.acts(Some("acme"), 1),
            Acts::Here,
            "the source acts until the fence"
        );
        assert_eq!(p.acts(Some("acme"), 2), Acts::Wait);
        assert!(p.commands_here(Some("acme"), 1));
        assert!(!p.commands_here(Some("acme"), 2), "not on the copy");
        p.fence("acme");
        assert!(p.fenced_from("acme", 1));
        assert_eq!(
            p.acts(Some("acme"), 1),
            Acts::Wait,
            "held: the move may still fail"
        );
        assert!(!p.commands_here(Some("acme"), 1));
        p.end("acme", Some((2, 40)));
        assert_eq!(p.acts(Some("acme"), 2), Acts::Here);
        assert_eq!(p.acts(Some("acme"), 1), Acts::Elsewhere);
        assert!(p.commands_here(Some("acme"), 2) && !p.commands_here(Some("acme"), 1));
        assert!(p.is_history(Some("acme"), 2, 40) && !p.is_history(Some("acme"), 2, 41));
        assert!(!p.is_history(Some("acme"), 1, 3) && !p.is_history(None, 2, 3));
        p.begin("beta", 0, 3).unwrap();
        p.end("beta", None);
        p.begin("late", 0, 3).unwrap();
        p.end("late", None);
        assert_eq!(
            p.acts(Some("late"), 3),
            Acts::Wait,
            "not loaded, moved in vain: its copy is held where no tenant lives"
        );
        assert_eq!(
            p.acts(Some("beta"), 0),
            Acts::Here,
            "a failed move leaves it"
        );
        assert_eq!(p.acts(Some("beta"), 3), Acts::Wait);
        assert_eq!(
            p.acts(Some("beta"), 1),
            Acts::Elsewhere,
            "shard 1 held acme, which moved out"
        );
        assert!(Arc::ptr_eq(&p.gate("acme"), &p.gate("acme")));
    }

    /// On a cluster's node that does not run the move: the fence read from the source's
    /// log, the switch from the directory.
    #[tokio::test]
    async fn a_clusters_fence_and_switch_are_learned_from_the_log() {
        let p = Arc::new(Placement::default());
        p.load(&[row("acme", 1), row("beta", 1)]);
        assert_eq!(p.verdict(Some("acme"), 2), (Acts::Wait, None), "the copy");
        p.fenced_at("acme", 1, 40);
        p.fenced_at("acme", 1, 55);
        assert_eq!(
            p.verdict(Some("acme"), 1),
            (Acts::Here, Some(40)),
            "acted on through the first fence, void after it"
        );
        assert_eq!(p.verdict(Some("beta"), 1), (Acts::Here, None));
        assert!(p.fenced_where_it_lives("acme") && p.fenced_from("acme", 1));
        assert!(!p.commands_here(Some("acme"), 1) && p.commands_here(Some("beta"), 1));
        let acme: Arc<str> = Arc::from("acme");
        assert!(p.enter(Some(&acme), 1).is_err());
        assert!(
            !p.settled("acme", 1).await,
            "a reactor leaves a fenced tenant's work at once"
        );
        tokio::time::timeout(std::time::Duration::from_secs(5), p.until_fencing("acme"))
            .await
            .expect("a long poll ends at a fence");
        p.switched("acme", 0, 2, 60);
        assert_eq!(p.shard_of("acme"), Some(1), "a record of another move");
        p.switched("acme", 1, 2, 60);
        assert!(!p.fenced_where_it_lives("acme"));
        assert_eq!(p.verdict(Some("acme"), 2), (Acts::Here, None));
        assert_eq!(p.verdict(Some("acme"), 1).0, Acts::Elsewhere);
        assert!(p.is_history(Some("acme"), 2, 60) && !p.is_history(Some("acme"), 2, 61));
        p.switched("acme", 1, 2, 60);
        assert_eq!(p.shard_of("acme"), Some(2), "read again, it moves nothing");
        p.fenced_at("acme", 2, 90);
        assert_eq!(
            (p.fence_in("acme", 1), p.fence_in("acme", 2)),
            (Some(40), Some(90)),
            "a fence a shard"
        );
        p.created("gamma", 3);
        assert_eq!(
            p.acts(Some("acme"), 3),
            Acts::Elsewhere,
            "shard 3 holds a tenant now"
        );
    }

    #[tokio::test]
    async fn a_fence_waits_for_the_commands_that_began_before_it() {
        let p = Arc::new(Placement::default());
        p.load(&[row("acme", 1)]);
        let acme: Arc<str> = Arc::from("acme");
        let before = p.enter(Some(&acme), 1).unwrap();
        assert!(
            p.enter(Some(&acme), 2).is_err(),
            "not where it does not live"
        );
        assert!(
            p.enter(None, 2).unwrap().is_none(),
            "the default tenant is not counted"
        );
        p.begin("acme", 1, 2).unwrap();
        let fencing = {
            let p = p.clone();
            tokio::spawn(async move { drop(p.fence_when_idle("acme").await) })
        };
        while p.enter(Some(&acme), 1).is_ok() {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(
            !fencing.is_finished(),
            "the fence did not wait for the command in flight"
        );
        drop(before);
        fencing.await.unwrap();
        assert!(p.moving("acme").is_some_and(|m| m.fenced));
    }
}
