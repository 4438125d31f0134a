//! What a command decides against: the round it is decided in ([`Round`]) and what it may
//! read of the log besides the models ([`Lookups`]).

use std::collections::HashSet;

use tidemark_log::Lookups;

use crate::privacy::Privacy;

/// What one command decides against: the round's time and head, and what the round's earlier
/// commands did that the models do not show yet. Only the decider ([`crate::decider`]) makes
/// one.
pub struct Round<'a> {
    pub(crate) now_us: i64,
    /// The head the models were folded to.
    pub(crate) head: u64,
    pub(crate) privacy: Option<&'a Privacy>,
    pub(crate) log: &'a dyn Lookups,
    /// `stream ‖ 0 ‖ subject` of every subject an earlier command of the round appends to or
    /// read.
    pub(crate) touched: HashSet<Vec<u8>>,
    /// Deliveries the round's earlier accepted batches will add (the outbox bound).
    pub(crate) pending_added: u64,
    /// Other nodes admit to the same outbox (spec section 16): an admission that adds
    /// deliveries also writes `outbox.admitted` on the one subject every node's admissions
    /// write, so it is appended only if no other admission came in since the models it was
    /// judged on (`max_pending` is never exceeded across nodes).
    pub(crate) shared_outbox: bool,
    /// The routes' paces (section 4).
    pub(crate) pacer: &'a crate::commands::outbox::Pacer,
    /// The tenant of the command deciding (`None`: the default tenant).
    pub(crate) tenant: Option<std::sync::Arc<str>>,
}

/// `stream ‖ 0 ‖ subject` of `tenant`'s subject (the stream scoped to the tenant).
pub(crate) fn key(tenant: Option<&str>, stream: &str, subject: &str) -> Vec<u8> {
    let stream = tidemark_log::scoped(tenant, stream);
    let mut k = Vec::with_capacity(stream.len() + 1 + subject.len());
    k.extend_from_slice(stream.as_bytes());
    k.push(0);
    k.extend_from_slice(subject.as_bytes());
    k
}

impl<'a> Round<'a> {
    /// A round at `now_us` over the models folded to `head`, with the decider's knobs.
    pub(crate) fn new(
        now_us: i64,
        head: u64,
        log: &'a dyn Lookups,
        knobs: &'a crate::decider::Knobs,
    ) -> Self {
        Round {
            now_us,
            head,
            privacy: knobs.privacy.as_deref(),
            log,
            touched: HashSet::new(),
            pending_added: 0,
            shared_outbox: knobs.shared_outbox,
            pacer: &knobs.pacer,
            tenant: None,
        }
    }

    /// Whether an earlier command of the round appends to (or read) this subject of the
    /// deciding command's tenant.
    pub(crate) fn touches(&self, stream: &str, subject: &str) -> bool {
        self.touched
            .contains(&key(self.tenant.as_deref(), stream, subject))
    }
}
