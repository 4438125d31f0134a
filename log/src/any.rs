//! Either backend, chosen by configuration at start: the embedded redb log or the JetStream
//! log (spec section 16). The engine and everything above it run on this type by default, so
//! a node's backend is a setting, not a build.

use tokio::sync::watch;

use crate::{
    AppendError, AppendReceipt, Compacted, Condition, Event, EventChunk, EventLog, JetStreamLog,
    Log, NewEvent, ReadError, ReadPage, ReadQuery,
};

/// The log of a node: embedded, or on a JetStream cluster.
#[derive(Clone)]
pub enum AnyLog {
    Embedded(Log),
    JetStream(JetStreamLog),
}

impl From<Log> for AnyLog {
    fn from(l: Log) -> Self {
        AnyLog::Embedded(l)
    }
}

impl From<JetStreamLog> for AnyLog {
    fn from(l: JetStreamLog) -> Self {
        AnyLog::JetStream(l)
    }
}

impl AnyLog {
    /// The embedded log, when it is one (its own operations: `tidemark` admin tools).
    pub fn embedded(&self) -> Option<&Log> {
        match self {
            AnyLog::Embedded(l) => Some(l),
            AnyLog::JetStream(_) => None,
        }
    }

    /// This node's leases on once-per-cluster work (every one held on the embedded log).
    pub fn leases(&self) -> crate::Leases {
        match self {
            AnyLog::Embedded(_) => {
                static SINGLE: std::sync::OnceLock<crate::Leases> = std::sync::OnceLock::new();
                SINGLE
                    .get_or_init(|| crate::Leases::single(crate::lease::node_id()))
                    .clone()
            }
            AnyLog::JetStream(l) => l.leases().clone(),
        }
    }

    /// The seq of `tenant`'s fence in this log (0: none), spec section 20. On a cluster a
    /// move fences a tenant out of its source stream with an event every node's replica
    /// holds ([`crate::MOVE_FENCE_TYPE`]); the embedded log holds none (a move there fences
    /// by its process's gate, every request of the tenant being this process's).
    pub fn fence_of(&self, tenant: &str) -> Result<u64, crate::StorageError> {
        match self {
            AnyLog::Embedded(_) => Ok(0),
            AnyLog::JetStream(l) => l.fence_of(tenant),
        }
    }

    /// [`AnyLog::fence_of`] as of the log's head now (a cluster's replica caught up first).
    pub async fn fence_now(&self, tenant: &str) -> Result<u64, AppendError> {
        match self {
            AnyLog::Embedded(_) => Ok(0),
            AnyLog::JetStream(l) => l.fence_now(tenant).await,
        }
    }

    /// Which backend, for logs and metrics.
    pub fn backend(&self) -> &'static str {
        match self {
            AnyLog::Embedded(_) => "embedded",
            AnyLog::JetStream(_) => "jetstream",
        }
    }
}

macro_rules! each {
    ($self:ident, $l:ident => $e:expr) => {
        match $self {
            AnyLog::Embedded($l) => $e,
            AnyLog::JetStream($l) => $e,
        }
    };
}

impl AnyLog {
    fn lookups(&self) -> &dyn crate::Lookups {
        each!(self, l => l as &dyn crate::Lookups)
    }
}

crate::lookups_through!(AnyLog, |any| any.lookups());

impl EventLog for AnyLog {
    async fn append(&self, events: Vec<NewEvent>) -> Result<AppendReceipt, AppendError> {
        each!(self, l => EventLog::append(l, events).await)
    }
    async fn append_if(
        &self,
        events: Vec<NewEvent>,
        condition: Condition,
    ) -> Result<AppendReceipt, AppendError> {
        each!(self, l => EventLog::append_if(l, events, condition).await)
    }
    async fn append_all(
        &self,
        batches: Vec<(Vec<NewEvent>, Condition)>,
    ) -> Vec<Result<AppendReceipt, AppendError>> {
        each!(self, l => EventLog::append_all(l, batches).await)
    }
    fn read(&self, q: &ReadQuery) -> Result<ReadPage, ReadError> {
        each!(self, l => EventLog::read(l, q))
    }
    fn get_by_id(&self, tenant: Option<&str>, event_id: &str) -> Result<Option<Event>, ReadError> {
        each!(self, l => EventLog::get_by_id(l, tenant, event_id))
    }
    fn head(&self) -> u64 {
        each!(self, l => EventLog::head(l))
    }
    fn subscribe(&self) -> watch::Receiver<u64> {
        each!(self, l => EventLog::subscribe(l))
    }
    fn read_chunk(&self, after: u64, upto: u64, out: &mut EventChunk) -> Result<(), ReadError> {
        each!(self, l => EventLog::read_chunk(l, after, upto, out))
    }
    fn queued(&self) -> usize {
        each!(self, l => EventLog::queued(l))
    }
    fn check_space(&self) -> Result<(), AppendError> {
        each!(self, l => EventLog::check_space(l))
    }
    fn free_bytes(&self) -> Option<u64> {
        each!(self, l => EventLog::free_bytes(l))
    }
    fn space(&self) -> Option<tokio::sync::watch::Receiver<crate::SpaceState>> {
        each!(self, l => EventLog::space(l))
    }
    fn is_poisoned(&self) -> bool {
        each!(self, l => EventLog::is_poisoned(l))
    }
    async fn close(&self) {
        each!(self, l => EventLog::close(l).await);
    }
    async fn compact(&self, through: u64) -> Result<Compacted, AppendError> {
        each!(self, l => EventLog::compact(l, through).await)
    }
}

/// A move's copy writes the source's events at their seqs and times, on either backend.
impl crate::transfer::ImportTarget for AnyLog {
    async fn import_batch(
        &self,
        events: Vec<NewEvent>,
        first_seq: u64,
        at_us: i64,
    ) -> Result<AppendReceipt, AppendError> {
        each!(self, l => l.import_batch(events, first_seq, at_us).await)
    }
}
