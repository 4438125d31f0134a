//! The engine of tidemark: the one boundary between the HTTP API and reactors above and the
//! log and read models below. Data flows one way: commands → log → followers → queries.
//!
//! - [`Engine::execute`] runs a [`Command`] (one type per command, one module per family in
//!   [`commands`]): the decider ([`decider`]) decides it against the read models at the head
//!   and appends its events to the log on a condition; answers the command's own
//!   [`Command::Answer`].
//! - [`Engine::log`] is the log behind its narrow interface ([`EventLog`]: append, conditional
//!   append, read, get, head, commit notification); nothing of storage crosses it.
//! - [`Engine::read`] is the one reader of the read models ([`Queries`]), which live in the
//!   models store ([`tidemark_projections::Models`], a file of their own).
//! - The clock enters here ([`Clock`]): commands take `now` from it when they are decided, so
//!   a test can drive due times and lease expiry.
//!
//! # Public surface
//! `Engine` (open, execute, log, read, rebuild, now_us, queued, is_poisoned, close), the
//! `Command` trait and the command types of its families, `Queries`, `Clock`.

// No unsafe code but the two libc calls of `yield_cpu` (which allows itself).
#![deny(unsafe_code)]

pub mod commands;
pub mod decider;
pub mod error;
pub mod labels;
pub mod moves;
pub mod pages;
pub mod placement;
pub mod privacy;
mod queries;

use std::sync::Arc;

use tidemark_log::{
    AnyLog, AppendReceipt, EventLog, Log, LogConfig, NewEvent, OpenError, OpenReport, StorageError,
};
use tidemark_projections::names::EventType;
use tidemark_projections::rebuild::RebuildReport;
use tidemark_projections::{Models, ModelsConfig};

pub use commands::admission::{Admission, Admit};
pub use commands::{Command, Decided};
pub use error::{CommandError, RejectKind, Rejection};

/// How long a request refused for pending work (`outbox_full`, a source held back)
/// asks its caller to wait before trying again: pending work drains over seconds. The HTTP
/// answer's `Retry-After` and a source poll's backoff both use it.
pub const OVERLOADED_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(5);
pub use decider::FOLLOW_BATCH;
pub use queries::{LAG_CAP, Lag, Queries, QueryError, READ_WAIT, Stopped};

/// Why a client's append was refused.
#[derive(Debug, thiserror::Error)]
pub enum ClientAppendError {
    #[error(transparent)]
    Command(#[from] CommandError),
    /// The batch requests notifications (0-based `indexes`) for recipients suppressed at the
    /// head: nothing of it was appended (the crisis hard-block, spec section 14).
    #[error("the batch requests notifications for suppressed recipients")]
    RecipientBlocked { indexes: Vec<usize> },
    /// The batch's deliveries (`adding`) would take the `pending` ones above `max_pending`
    /// (I8: refused, nothing appended); retry after `retry_after_s` (the drain rate's
    /// estimate).
    #[error(
        "{pending} deliveries are pending or being routed and this request adds {adding}, \
         above outbox.max_pending ({max_pending}); retry later"
    )]
    OutboxFull {
        pending: u64,
        adding: u64,
        max_pending: u64,
        retry_after_s: u64,
    },
}

/// Where commands read the time (microseconds since the epoch).
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// Lower the calling thread's CPU priority (nice 10): for work that must not compete with the
/// request path (a rebuild). Linux keeps the nice value per thread; elsewhere, or when refused,
/// the thread runs at the normal priority.
#[expect(
    unsafe_code,
    reason = "setpriority and gettid: libc has no safe wrapper (the SAFETY note below)"
)]
fn yield_cpu() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid and setpriority take and return plain integers; on Linux a thread id
        // names that one thread for PRIO_PROCESS.
        let refused = unsafe {
            let tid = nix::libc::gettid();
            nix::libc::setpriority(nix::libc::PRIO_PROCESS, tid as nix::libc::id_t, 10)
        };
        if refused != 0 {
            tracing::debug!("the rebuild thread's priority was not lowered");
        }
    }
}

/// The wall clock.
pub fn wall_clock() -> Clock {
    Arc::new(tidemark_log::time::now_micros)
}

/// Handle to an open engine. Cheap to clone; all clones share one log and one decider
/// (stopped by [`Engine::close`]).
#[derive(Clone)]
pub struct Engine<L = AnyLog> {
    log: L,
    models: Models,
    clock: Clock,
    queries: Queries<L>,
    decider: Arc<decider::Decider>,
    /// What the decider read, handed on to the reactors' follower.
    pages: Arc<pages::Pages>,
    knobs: Arc<std::sync::RwLock<decider::Knobs>>,
    /// The key of the redacting routes (section 14), from the configuration only.
    privacy: Option<Arc<privacy::Privacy>>,
    /// The tenant this handle acts for (`None`: the default tenant): [`Engine::in_tenant`].
    tenant: Option<Arc<str>>,
    /// Which shard of the deployment this engine's log is (spec section 20; 0: the home
    /// shard, which holds the default tenant and the tenants' directory).
    shard: u32,
    /// The home shard's engine, whose directory says which tenants live here (`None`: this
    /// is the home shard).
    home: Option<Arc<Engine<L>>>,
    /// Where each tenant acts, shared by the deployment's shards ([`placement`]).
    placement: Arc<placement::Placement>,
}

/// The models store beside the log of `cfg` (its file in the same directory).
pub fn models_config(cfg: &LogConfig) -> ModelsConfig {
    let dir = cfg
        .path
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default();
    ModelsConfig::in_dir(&dir)
}

impl Engine {
    /// The embedded log under this engine (`None` on a JetStream cluster): what a tenant's
    /// move copies into at exact seqs ([`moves`]).
    pub fn embedded_log(&self) -> Option<&Log> {
        self.log.embedded()
    }

    /// The log under this engine, as either backend.
    pub fn any_log(&self) -> &AnyLog {
        &self.log
    }

    /// The seq of `tenant`'s fence out of this shard (0: none), spec section 20: on a cluster
    /// the tenant's events the stream orders after it are void here.
    pub fn fence_of(&self, tenant: &str) -> Result<u64, tidemark_log::StorageError> {
        self.log.fence_of(tenant)
    }

    /// Open (or create) the log and the models store beside it (blocking: call from a
    /// blocking context in async code). A data directory of the layout before the models
    /// store had one is migrated first ([`tidemark_projections::models::migrate`]).
    pub fn open(cfg: &LogConfig) -> Result<(Engine, OpenReport), OpenError> {
        Self::open_with(cfg, &models_config(cfg))
    }

    /// [`Engine::open`] with the models store at `models`.
    pub fn open_with(
        cfg: &LogConfig,
        models: &ModelsConfig,
    ) -> Result<(Engine, OpenReport), OpenError> {
        if matches!(cfg.storage, tidemark_log::storage::Storage::File) && models.store.is_none() {
            tidemark_projections::models::migrate(&cfg.path, models)?;
        }
        let (log, report) = Log::open(cfg)?;
        let engine = Self::on_log(AnyLog::Embedded(log), models)?;
        Ok((engine, report))
    }

    /// Open a node on a JetStream cluster (spec section 16): the stream of `cfg`, its local
    /// replica, and the models store at `models` (blocking, like [`Engine::open`]).
    pub fn open_jetstream(
        cfg: &tidemark_log::JetStreamConfig,
        models: &ModelsConfig,
    ) -> Result<(Engine, OpenReport), OpenError> {
        let log = tidemark_log::JetStreamLog::open(cfg)?;
        let report = OpenReport {
            head: EventLog::head(&log),
            ..OpenReport::default()
        };
        let engine = Self::on_log(AnyLog::JetStream(log), models)?;
        engine
            .knobs
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .shared_outbox = true;
        Ok((engine, report))
    }

    /// This node's leases on once-per-cluster work (spec section 16): every one is held on
    /// the embedded log; on a cluster, by one node at a time.
    pub fn leases(&self) -> tidemark_log::Leases {
        self.log.leases()
    }

    /// The leases of the deployment's home shard (spec section 20): where the lease on
    /// serving each shard (`shard.<n>`) is held, one node at a time on a cluster.
    pub fn home_leases(&self) -> tidemark_log::Leases {
        self.home.as_deref().unwrap_or(self).leases()
    }
}

/// The engine over any log backend ([`EventLog`]): the same commands, decider, read models and
/// queries whichever log holds the events (spec section 3).
impl<L: EventLog + Clone> Engine<L> {
    /// An engine over an open log with a models store of its own: several engines over one
    /// log are independent deciders (the log's conditions keep them apart).
    pub fn on_log(log: L, models: &ModelsConfig) -> Result<Engine<L>, OpenError> {
        let derived = |source| OpenError::Derived {
            what: format!("the read models' store {}", models.path.display()),
            source,
        };
        let models = Models::open(models).map_err(derived)?;
        let progress = Arc::new(decider::Progress::default());
        progress.advance(models.checkpoint().map_err(derived)?);
        let clock = wall_clock();
        let knobs = Arc::new(std::sync::RwLock::new(decider::Knobs {
            clock: clock.clone(),
            privacy: None,
            shared_outbox: false,
            pacer: Arc::default(),
        }));
        let pages = Arc::new(pages::Pages::default());
        let decider = decider::Decider::spawn(
            log.clone(),
            models.clone(),
            progress.clone(),
            knobs.clone(),
            pages.clone(),
        )
        .map_err(|e| OpenError::Storage(StorageError::new("cannot start the decider", e)))?;
        Ok(Engine {
            queries: Queries::new(log.clone(), models.clone(), progress.clone()),
            log,
            models,
            clock,
            decider: Arc::new(decider),
            pages,
            knobs,
            privacy: None,
            tenant: None,
            shard: 0,
            home: None,
            placement: Arc::default(),
        })
    }

    /// This engine as shard `shard` of a deployment whose home shard is `home` (spec section
    /// 20): its reactors walk the tenants the home shard's directory places here, and the
    /// default tenant only if it is the home shard.
    pub fn as_shard(mut self, shard: u32, home: &Engine<L>) -> Engine<L> {
        self.shard = shard;
        self.home = (shard != 0).then(|| Arc::new(home.in_tenant(tidemark_log::DEFAULT_TENANT)));
        self.placement = home.placement.clone();
        self
    }

    /// Where each tenant of the deployment acts, and its gate ([`placement`]).
    pub fn placement(&self) -> &Arc<placement::Placement> {
        &self.placement
    }

    /// The home shard's engine, acting for the default tenant (this one, on the home shard):
    /// where the deployment's own records go (the directory, `node.*`).
    pub fn home(&self) -> Engine<L> {
        self.home
            .as_deref()
            .cloned()
            .unwrap_or_else(|| self.clone())
    }

    /// Which shard of the deployment this engine's log is (0: the home shard).
    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// The same engine acting for `tenant` (spec section 20): its commands decide on that
    /// tenant's models and append that tenant's events, its queries read that tenant's rows
    /// and events, and its clients' events are appended as the tenant's. The default
    /// tenant's name gives the engine as it was.
    pub fn in_tenant(&self, tenant: &str) -> Engine<L> {
        let tenant: Option<Arc<str>> = tidemark_log::tenant_of(tenant).map(Arc::from);
        let mut e = self.clone();
        e.queries.set_tenant(tenant.clone());
        e.tenant = tenant;
        e
    }

    /// The tenant this handle acts for, by name.
    pub fn tenant(&self) -> &str {
        self.tenant
            .as_deref()
            .unwrap_or(tidemark_log::DEFAULT_TENANT)
    }

    /// This engine for each tenant the directory places in this shard (the default tenant
    /// first, in the home shard), each with the seq of this shard's log it was created at (0
    /// for the default, and for a tenant of another shard than the home one): what a reactor
    /// that looks at every tenant's models walks (blocking).
    pub fn every_tenant(&self) -> Result<Vec<(Engine<L>, u64)>, QueryError> {
        let mut out = Vec::new();
        if self.shard == 0 {
            out.push((self.in_tenant(tidemark_log::DEFAULT_TENANT), 0));
        }
        // The directory as the home shard's models hold it, not waiting for the head: a
        // tenant created a moment ago is walked from the next call on. Its seq counts in this
        // shard's log only for the home shard's tenants (elsewhere the shard's log begins
        // with the tenant: 0).
        let directory = self.home.as_deref().unwrap_or(self);
        for t in directory.queries.unwaited().tenants()? {
            if t.is_live()
                && t.shard == self.shard
                && !self.placement.fenced_from(&t.name, self.shard)
            {
                let created = if self.shard == 0 { t.created_seq } else { 0 };
                out.push((self.in_tenant(&t.name), created));
            }
        }
        Ok(out)
    }

    /// Every tenant the directory places in this shard, removed ones too (a removed tenant's
    /// cursors still pin the log): `None` for the home shard, whose own models hold the
    /// directory (blocking).
    pub fn placed_here(&self) -> Result<Option<Vec<String>>, QueryError> {
        let Some(directory) = self.home.as_deref() else {
            return Ok(None);
        };
        Ok(Some(
            directory
                .queries
                .unwaited()
                .tenants()?
                .into_iter()
                .filter(|t| t.shard == self.shard)
                .map(|t| t.name)
                .collect(),
        ))
    }

    /// Wait (at most the read wait) until the home shard's models hold the directory as of its
    /// head now (blocking): a walk of [`Engine::every_tenant`] after it misses no tenant the
    /// log has placed, even while the models catch up after a start or a restore
    /// (`QueryError::Lagging` when they have not by then; the caller retries).
    pub fn settle_directory(&self) -> Result<(), QueryError> {
        let directory = self.home.as_deref().unwrap_or(self);
        directory.queries.floor(0).map(drop)
    }

    /// The seq every tenant's `checkpoint` has reached at least (a tenant's counts from its
    /// creation: it has no event before it): where a reactor that keeps a checkpoint in each
    /// tenant's models resumes (blocking).
    pub fn least_checkpoint(
        &self,
        checkpoint: impl Fn(&Queries<L>) -> Result<u64, QueryError>,
    ) -> Result<u64, QueryError> {
        let mut least = u64::MAX;
        for (e, created) in self.every_tenant()? {
            least = least.min(checkpoint(e.read())?.max(created));
        }
        // A shard with no tenant yet: whatever comes is a tenant's placed after the start,
        // from its beginning.
        Ok(if least == u64::MAX { 0 } else { least })
    }

    /// The same engine reading time from `clock` (tests drive due times with it).
    pub fn with_clock(mut self, clock: Clock) -> Engine<L> {
        self.clock = clock.clone();
        self.knobs.write().unwrap_or_else(|p| p.into_inner()).clock = clock;
        self
    }

    /// The same engine with the key of the redacting routes (zero-PII deliveries, spec
    /// section 14): routing hashes with it, and lookups by notification id or recipient
    /// compute the hashes at query time.
    pub fn with_privacy(mut self, privacy: Option<privacy::Privacy>) -> Engine<L> {
        let p = privacy.map(Arc::new);
        self.queries.set_privacy(p.clone());
        self.privacy = p.clone();
        self.knobs
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .privacy = p;
        self
    }

    /// The same engine sharing its outbox bound with other deciders on the same log (spec
    /// section 16; set for a JetStream node): admissions that add deliveries append on the
    /// condition that no other admission came in since ([`commands::admission`]).
    pub fn with_shared_outbox(self, shared: bool) -> Engine<L> {
        self.knobs
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .shared_outbox = shared;
        self
    }

    /// The key of the redacting routes, if one is configured.
    pub fn privacy(&self) -> Option<&privacy::Privacy> {
        self.privacy.as_deref()
    }

    /// The commits the decider read, handed on (the reactors' follower takes them from here
    /// rather than reading the log again).
    pub fn pages(&self) -> &pages::Pages {
        &self.pages
    }

    /// Write a backup of the log into `dir` (spec section 18): the events after `after`
    /// through the head as of now, read in pages while appends go on, and a manifest.
    pub async fn backup(
        &self,
        dir: std::path::PathBuf,
        after: u64,
    ) -> Result<tidemark_log::transfer::Manifest, tidemark_log::transfer::TransferError>
    where
        L: 'static,
    {
        let log = self.log.clone();
        tokio::task::spawn_blocking(move || tidemark_log::transfer::backup(&log, &dir, after))
            .await
            .map_err(|e| tidemark_log::transfer::TransferError::Io {
                what: "the backup's task".into(),
                source: std::io::Error::other(e.to_string()),
            })?
    }

    /// The log through its narrow interface.
    pub fn log(&self) -> &(impl EventLog + Clone + use<L>) {
        &self.log
    }

    /// The first seq the log holds (after a compaction, the first retained one; blocking).
    pub fn first_seq(&self) -> Result<u64, StorageError> {
        self.log.first_seq()
    }

    /// The models store.
    pub fn models(&self) -> &Models {
        &self.models
    }

    /// The highest committed seq (the log's head).
    pub fn head(&self) -> u64 {
        self.log.head()
    }

    /// The read models.
    pub fn read(&self) -> &Queries<L> {
        &self.queries
    }

    /// The routes' paces this node's decider keeps (section 4).
    pub fn pacer(&self) -> Arc<commands::outbox::Pacer> {
        self.knobs
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .pacer
            .clone()
    }

    /// The engine's clock now.
    pub fn now_us(&self) -> i64 {
        (self.clock)()
    }

    /// Execute `cmd`: the decider decides it against the read models at the head and appends
    /// its events on the condition that what it decided on has not changed since (deciding
    /// again when it has). Answers the command's answer and the log's receipt. A refusal
    /// (`CommandError::Rejected`) appends nothing.
    pub async fn execute<C: Command>(
        &self,
        cmd: C,
    ) -> Result<(C::Answer, AppendReceipt), CommandError> {
        // A tenant's command runs only in the shard it lives in, and not while a move fences
        // it (spec section 20): refused then, and one that began before the fence ends before
        // the move reads where its copy ends.
        let _flight = self.enter()?;
        let name = C::NAME;
        let r = self.decider.execute(self.tenant.clone(), cmd).await;
        if let Err(CommandError::Append(e)) = &r {
            self.note_fence(e);
        }
        let result = match &r {
            Ok(_) => "ok",
            Err(CommandError::Rejected { .. }) => "refused",
            Err(_) => "error",
        };
        metrics::counter!("tidemark_commands_total", "command" => name, "result" => result,
            "tenant" => labels::tenant_label(self.tenant()))
        .increment(1);
        r
    }

    /// Append `events` as this handle's tenant's (spec section 20): what a reactor records of
    /// its work for the tenant (a mismatch, a failed attempt, an operational note). The log's
    /// own `append` takes each event's tenant as the event says.
    pub async fn append_own(
        &self,
        mut events: Vec<NewEvent>,
    ) -> Result<AppendReceipt, tidemark_log::AppendError> {
        // Refused as invalid where the tenant does not act (a reactor does not retry it), as
        // the log's fence where a cluster's move fenced it.
        let _flight = self.enter().map_err(|e| match e {
            CommandError::Append(fenced) => fenced,
            e => tidemark_log::AppendError::Invalid {
                index: 0,
                field: "tenant",
                reason: e.to_string(),
                kind: tidemark_log::InvalidKind::Field,
            },
        })?;
        for e in &mut events {
            e.tenant = self.tenant.as_deref().map(str::to_owned);
        }
        let r = self.log.append(events).await;
        if let Err(e) = &r {
            self.note_fence(e);
        }
        r
    }

    /// A fence the log refused an append of the tenant by (on a cluster, spec section 20):
    /// this node's placement knows it from now on, before its follower reads it.
    fn note_fence(&self, e: &tidemark_log::AppendError) {
        if let tidemark_log::AppendError::Fenced { tenant, fence_seq } = e {
            self.placement.fenced_at(tenant, self.shard, *fence_seq);
        }
    }

    /// A client's plain append (no admission to judge).
    async fn append_plain(&self, events: Vec<NewEvent>) -> Result<AppendReceipt, CommandError> {
        self.log.append(events).await.map_err(|e| {
            self.note_fence(&e);
            CommandError::from(e)
        })
    }

    /// A command or append of this handle's tenant begins here ([`placement::Placement::enter`]):
    /// refused in a shard the tenant does not live in, is being moved into, or is fenced out of.
    fn enter(&self) -> Result<Option<placement::InFlight>, CommandError> {
        self.placement
            .enter(self.tenant.as_ref(), self.shard)
            .map_err(|placement::NotHere| {
                // On a cluster, fenced out of this shard: the log's refusal (503
                // `tenant_moving` to a client, which sends it again).
                if let Some(fence_seq) = self.placement.fence_in(self.tenant(), self.shard) {
                    return CommandError::Append(tidemark_log::AppendError::Fenced {
                        tenant: self.tenant().to_owned(),
                        fence_seq,
                    });
                }
                CommandError::rejected(
                    Rejection::MoveInProgress,
                    format!(
                        "tenant {:?} is being moved, or lives in another shard than {}",
                        self.tenant(),
                        self.shard
                    ),
                )
            })
    }

    /// Append a client's batch (atomic, idempotent). A batch that requests notifications is
    /// judged at the head first (spec section 14, `commands::admission`): an `event_id` already
    /// in the log with other content is left to the log's conflict; a notification for a
    /// recipient suppressed at the head refuses the whole batch
    /// ([`ClientAppendError::RecipientBlocked`]; nothing is appended, nothing of it logged);
    /// new deliveries that would take the outbox above `max_pending` refuse it
    /// ([`ClientAppendError::OutboxFull`], I8; the bound is never exceeded). Exact duplicates
    /// are answered `duplicate: true` and never blocked or counted; lifecycle events and
    /// dashboard-only notifications are never refused for the bound.
    pub async fn append_from_client(
        &self,
        mut events: Vec<NewEvent>,
        max_pending: u64,
    ) -> Result<AppendReceipt, ClientAppendError> {
        let _flight = self.enter()?;
        // The handle's tenant's events, whatever the client named.
        for e in &mut events {
            e.tenant = self.tenant.as_deref().map(str::to_owned);
        }
        if !events
            .iter()
            .any(|e| EventType::parse(&e.event_type) == Some(EventType::NotificationRequested))
        {
            return Ok(self.append_plain(events).await?);
        }
        // On a cluster the admission's `outbox.admitted` goes in the same atomic batch, whose
        // bound is the stream's (1,000 messages): a client's batch of notifications holds one
        // event fewer, said as such rather than as a batch one larger than the client sent.
        let shared = self
            .knobs
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .shared_outbox;
        let max = tidemark_log::limits::BATCH_MAX_EVENTS - 1;
        if shared && events.len() > max {
            return Err(CommandError::from(tidemark_log::AppendError::Invalid {
                index: max,
                field: "events",
                reason: format!(
                    "the batch has {} events; on a cluster a batch that requests notifications \
                     holds at most {max} (the server adds its admission record to it)",
                    events.len()
                ),
                kind: tidemark_log::InvalidKind::BatchTooLarge,
            })
            .into());
        }
        // Which events the log already holds with the same content (answered as duplicates);
        // one with other content is the log's 409, before any other check.
        let mut known = vec![false; events.len()];
        for (i, e) in events.iter().enumerate() {
            let Some(id) = &e.event_id else { continue };
            let Some(prev) = self
                .log
                .get_by_id(e.tenant.as_deref(), id)
                .map_err(|e| CommandError::Storage(StorageError::of(e)))?
            else {
                continue;
            };
            if prev.stream == e.stream
                && prev.subject == e.subject
                && prev.event_type == e.event_type
                && prev.payload.get().as_bytes() == e.payload_bytes()
            {
                known[i] = true;
            } else {
                return Ok(self.append_plain(events).await?);
            }
        }
        let sent = events.len();
        let (admission, mut receipt) = self
            .execute(Admit {
                events,
                known,
                max_pending,
            })
            .await?;
        match admission {
            // The client is answered for its own events (on a cluster the admission's
            // `outbox.admitted` follows them).
            Admission::Accept => {
                receipt.events.truncate(sent);
                Ok(receipt)
            }
            Admission::Blocked(indexes) => Err(ClientAppendError::RecipientBlocked { indexes }),
            Admission::Full {
                pending,
                adding,
                retry_after_s,
            } => Err(ClientAppendError::OutboxFull {
                pending,
                adding,
                max_pending,
                retry_after_s,
            }),
        }
    }

    /// Rebuild (`swap`) or verify projection `name` from the log, on the models' side (appends
    /// never wait for it); `None` when there is no such projection. `progress(done, head)` is
    /// called between chunks.
    pub async fn rebuild(
        &self,
        name: &str,
        swap: bool,
        progress: impl Fn(u64, u64) + Send + 'static,
    ) -> Option<Result<RebuildReport, CommandError>> {
        let p = tidemark_projections::by_name(name)?;
        let (models, log) = (self.models.clone(), self.log.clone());
        // A thread of its own at a lower priority: a rebuild is CPU-bound for seconds, and on a
        // small machine it would otherwise take a core from the log's writer and the requests
        // (the append p99 during a rebuild is that contention, docs/benchmarks.md).
        let (tx, rx) = tokio::sync::oneshot::channel();
        let started = std::thread::Builder::new()
            .name("tidemark-rebuild".into())
            .spawn(move || {
                yield_cpu();
                let r = tidemark_projections::rebuild::rebuild(&models, &log, p, swap, progress)
                    .map_err(CommandError::Models);
                let _ = tx.send(r);
            });
        Some(match started {
            Ok(_) => rx.await.unwrap_or_else(|_| {
                Err(CommandError::Models(StorageError::msg(
                    "the rebuild stopped (its thread panicked)",
                )))
            }),
            Err(e) => Err(CommandError::Models(StorageError::new(
                "cannot start the rebuild's thread",
                e,
            ))),
        })
    }

    /// Decisions the log refused because what they decided on had changed (another decider
    /// over the same log), each decided again.
    pub fn redecided(&self) -> u64 {
        self.decider.redecided()
    }

    /// Requests waiting for the log writer and the decider.
    pub fn queued(&self) -> usize {
        self.log.queued() + self.decider.queued()
    }

    /// `Err(InsufficientStorage)` while the log's disk is short of space (checked now).
    pub fn check_space(&self) -> Result<(), tidemark_log::AppendError> {
        self.log.check_space()
    }

    /// Whether a storage failure has stopped appends.
    pub fn is_poisoned(&self) -> bool {
        self.log.is_poisoned()
    }

    /// Bytes free on the log's disk, if known.
    pub fn disk_free(&self) -> Option<u64> {
        self.log.free_bytes()
    }

    /// The storage state of section 18: `poisoned` (a storage failure stopped appends until a
    /// restart), `full` (appends refused until space returns), or `ok`.
    pub fn storage_state(&self) -> &'static str {
        if self.log.is_poisoned() {
            "poisoned"
        } else if self.log.check_space().is_err() {
            "full"
        } else {
            "ok"
        }
    }

    /// Why the decider, the models store's writer, panicked, if it has: commands are refused
    /// (`CommandError::Models`) until a restart; appends and the log are not affected.
    pub fn models_poisoned(&self) -> Option<&StorageError> {
        self.decider.poisoned()
    }

    /// Why the models are poisoned, once they are: waits until then (for ever on a healthy
    /// node).
    pub async fn models_poisoned_wait(&self) -> StorageError {
        self.decider.poisoned_wait().await
    }

    /// Stop the decider (the models synced), then the log's writer after the requests already
    /// queued, and wait for both.
    pub async fn close(&self) {
        self.decider.stop().await;
        self.log.close().await;
    }
}
