//! Moving a tenant to another shard (spec section 20): copy, verify, switch, with nothing
//! lost or doubled, while the tenant and the others go on appending.
//!
//! A move goes only into an **empty shard** (no tenant ever placed in it; or one holding a
//! crashed move's copy of this tenant, which it verifies and resumes), and copies the source
//! *at the same seqs and times*: the tenant's events as they are, every other event as the
//! default tenant's `tenant.gap` filler (id `gap:<seq>`, no content of the other tenant),
//! which no projection folds and no reactor takes. Every position of the tenant — its
//! `after_sequence`s, `Last-Event-ID`s, cursors, `ntf:<seq>` ids, every seq its models keep —
//! then means the same in the destination: nothing is translated.
//!
//! 1. [`Placement::begin`](crate::placement::Placement::begin): the destination's reactors
//!    hold the copied events (they act on them only once the tenant lives there).
//! 2. Copy while the tenant appends, until the copy is close to the source's head.
//! 3. Fence: take the tenant's gate exclusively (requests that change its data wait; the ones
//!    in flight finish first) and stop the source's reactors acting for it.
//! 4. Copy the tail to the source's head now, `through_seq`, and verify every seq of the
//!    destination through it against the source.
//! 5. Wait for the destination's models to fold it, record `tenant.moved {from, to,
//!    through_seq, reason, by}` in the directory, and switch: the tenant lives in the
//!    destination, its requests go there, its live streams on the source end (a client
//!    resumes with its `Last-Event-ID`, which means the same there).
//!
//! **On a JetStream cluster** every node serves the tenant's requests, so the gate (this
//! process's) holds only this node's. The fence is then also an event: the default tenant's
//! `tenant.fenced` in the source's stream ([`tidemark_log::MOVE_FENCE_TYPE`], appended once:
//! conditioned on the stream holding none of the tenant's), and the stream's order decides.
//! Every node's log refuses an append of the tenant that the stream orders after it
//! (`AppendError::Fenced`: void, no model or reactor acts on it, the copy takes it as a
//! filler), its followers drop those and hold the destination's copy (a shard no tenant was
//! ever placed in), its API refuses the tenant's reads answered from past the fence and
//! waits for the switch, which each node makes when its directory reads `tenant.moved`. A
//! move stopped after its fence cannot give the tenant back to the source (what the stream
//! ordered after the fence is void for good): the tenant stays fenced until the move is run
//! again, from any node, which keeps the fence, verifies and resumes the copy and switches.
//!
//! A delivery attempt in flight in the source at the fence has its outcome recorded there,
//! after `through_seq` (orphaned): the destination, where the delivery is leased, attempts it
//! again once the lease expires, with the same delivery id and `webhook-id`, as after a
//! crash. A crash before the switch leaves the tenant in the source and an inert copy in the
//! destination, which the next move of the tenant there verifies and resumes.

use std::sync::Arc;

use serde_json::json;
use tidemark_log::{AppendError, Condition, Event, EventLog, NewEvent, ReadQuery, StorageError};
use tidemark_projections::names::Stream;
use tidemark_projections::tenants::TenantRow;

use crate::Engine;
use crate::commands::tenants::MoveTenant;
use crate::error::{CommandError, Rejection};
use crate::placement::Busy;

/// Events read per page of a copy.
const PAGE: usize = 1_000;
/// Events read per page of a copy slowed down for a crash test (a small page, so the kill
/// lands mid-copy).
const FAULT_PAGE: usize = 10;
/// Copy rounds before the fence: each copies what the source committed during the one
/// before; the fence comes once a round leaves at most [`CLOSE_ENOUGH`] behind (or after the
/// last round, whatever is left).
const ROUNDS: usize = 20;
const CLOSE_ENOUGH: u64 = 2 * PAGE as u64;

/// A fault injection's wait, in milliseconds from environment variable `var` (tests only),
/// read once into `cell`.
fn fault_ms(
    cell: &'static std::sync::OnceLock<Option<std::time::Duration>>,
    var: &str,
) -> Option<std::time::Duration> {
    *cell.get_or_init(|| {
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map(std::time::Duration::from_millis)
    })
}

/// The move's fault injection for the crash test: wait after each copied page, so a test
/// can kill the process mid-copy.
fn fault_delay() -> Option<std::time::Duration> {
    static DELAY: std::sync::OnceLock<Option<std::time::Duration>> = std::sync::OnceLock::new();
    fault_ms(&DELAY, "TIDEMARK_FAULT_MOVE_DELAY_MS")
}

/// The move's fault injection for the crash test of a cluster's fence: wait this long once
/// the tenant is fenced, before the tail is copied, so a test can kill the process there.
fn fault_fenced_wait() -> Option<std::time::Duration> {
    static WAIT: std::sync::OnceLock<Option<std::time::Duration>> = std::sync::OnceLock::new();
    fault_ms(&WAIT, "TIDEMARK_FAULT_MOVE_FENCED_MS")
}

/// An operator's move.
#[derive(Debug, Clone)]
pub struct MoveRequest {
    pub tenant: String,
    pub to: u32,
    pub reason: String,
    pub by: Option<String>,
}

/// A finished move.
#[derive(Debug, Clone)]
pub struct Moved {
    /// The tenant's directory row after it.
    pub row: TenantRow,
    pub from: u32,
    pub to: u32,
    /// The source's head at the switch: the destination holds the source through it.
    pub through_seq: u64,
    /// Where the copy began: 0, or the end of a crashed move's copy it verified and resumed.
    pub resumed_after: u64,
    /// The tenant's own events among those copied.
    pub tenant_events: u64,
    /// The directory's seq of `tenant.moved` (the home shard's).
    pub directory_seq: u64,
}

fn refused(code: Rejection, detail: impl Into<String>) -> CommandError {
    CommandError::rejected(code, detail)
}

fn storage(what: &str, e: impl std::fmt::Display) -> CommandError {
    CommandError::Storage(StorageError::new(
        what,
        std::io::Error::other(e.to_string()),
    ))
}

/// Ends the move in the placement: switched, or not (an error, a dropped request).
struct Underway {
    placement: Arc<crate::placement::Placement>,
    tenant: String,
    switched: Option<(u32, u64)>,
}

impl Drop for Underway {
    fn drop(&mut self) {
        self.placement.end(&self.tenant, self.switched);
    }
}

/// How long the fence waits for the tenant's requests in flight (a long poll is told to end
/// at once, `Placement::changes`); past it the move gives up, and the tenant goes on where it
/// was.
const FENCE_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Move `req.tenant` to shard `req.to` of `shards` (the deployment's engines, the home shard
/// first). Refused: no such shard (`shard_not_found`); the default tenant, or the shard it
/// lives in (`not_movable`); not a tenant (`tenant_not_found`); shard 0, a destination another
/// tenant is placed in, or one holding events that are not a copy of this tenant's shard
/// (`shard_not_empty`); a move of the tenant or into the shard under way, or requests of the
/// tenant holding the fence past [`FENCE_WAIT`] (`move_in_progress`); a source compacted by
/// retention (`move_unsupported`). On a cluster an error after the fence leaves the tenant
/// fenced, to be finished by running the move again.
pub async fn move_tenant(shards: &[Engine], req: MoveRequest) -> Result<Moved, CommandError> {
    let home = shards
        .first()
        .ok_or_else(|| storage("moving", "no shard"))?;
    if req.reason.trim().is_empty() {
        return Err(refused(
            Rejection::ReasonRequired,
            "a tenant is moved with a reason",
        ));
    }
    let Some(dst) = shards.get(req.to as usize) else {
        return Err(refused(
            Rejection::ShardNotFound,
            format!(
                "the deployment has shards 0 to {}; there is no shard {}",
                shards.len() - 1,
                req.to
            ),
        ));
    };
    if tidemark_log::tenant_of(&req.tenant).is_none() {
        return Err(refused(
            Rejection::NotMovable,
            "the default tenant lives in the home shard: it is not moved",
        ));
    }
    let row = live_row(home, &req.tenant).await?;
    let from = row.shard;
    if from == req.to {
        return Err(refused(
            Rejection::NotMovable,
            format!("tenant {:?} lives in shard {from} already", req.tenant),
        ));
    }
    if req.to == 0 {
        return Err(refused(
            Rejection::ShardNotEmpty,
            "shard 0 holds the default tenant: a tenant moves into an empty shard",
        ));
    }
    let Some(src) = shards.get(from as usize) else {
        return Err(refused(
            Rejection::ShardNotFound,
            format!(
                "tenant {:?} lives in shard {from}, which this node does not serve",
                req.tenant
            ),
        ));
    };
    let placement = home.placement().clone();
    placement
        .begin(&req.tenant, from, req.to)
        .map_err(|Busy(d)| refused(Rejection::MoveInProgress, d))?;
    let mut underway = Underway {
        placement: placement.clone(),
        tenant: req.tenant.clone(),
        switched: None,
    };
    // As of after `begin`: a move that switched meanwhile has placed it elsewhere.
    if live_row(home, &req.tenant).await?.shard != from {
        return Err(refused(
            Rejection::MoveInProgress,
            format!("tenant {:?} was just moved", req.tenant),
        ));
    }
    let directory = {
        let h = home.clone();
        blocking(move || Ok(h.read().tenants()?)).await?
    };
    if let Some(other) = directory.iter().find(|t| t.shard == req.to) {
        return Err(refused(
            Rejection::ShardNotEmpty,
            format!("tenant {:?} is placed in shard {}", other.name, req.to),
        ));
    }
    let first = {
        let s = src.clone();
        blocking(move || Ok(s.first_seq()?)).await?
    };
    if first > 1 {
        return Err(refused(
            Rejection::MoveUnsupported,
            format!(
                "shard {from}'s log was compacted (it begins at seq {first}): the copy keeps \
                 the source's seqs from 1"
            ),
        ));
    }
    let tenant = req.tenant.as_str();
    // On a cluster, the fence of a move that stopped after it (the tenant's events after it
    // in the source are void: the copy takes them as fillers).
    let cluster = src.embedded_log().is_none();
    let mut fence = src.any_log().fence_now(tenant).await?;
    // A crashed move's copy: every event of it is the source's, or a filler of it.
    let resumed_after = dst.head();
    if resumed_after > 0 {
        verify(src, dst, tenant, fence, 0, resumed_after)
            .await
            .map_err(|e| {
                refused(
                    Rejection::ShardNotEmpty,
                    format!(
                        "shard {} holds {resumed_after} events that are not a copy of tenant \
                         {tenant:?}'s shard: {e}",
                        req.to
                    ),
                )
            })?;
        tracing::info!(tenant, to = req.to, resumed_after, "resuming a move's copy");
    }
    let mut copied = copy(src, dst, tenant, fence, resumed_after, src.head()).await?;
    for _ in 1..ROUNDS {
        let head = src.head();
        if head.saturating_sub(dst.head()) <= CLOSE_ENOUGH {
            break;
        }
        copied += copy(src, dst, tenant, fence, dst.head(), head).await?;
    }
    // What is copied so far is verified before the fence, so that the tenant waits only for
    // the tail's.
    let verified = dst.head();
    verify(src, dst, tenant, fence, resumed_after, verified)
        .await
        .map_err(|e| storage("verifying the move's copy", e))?;
    // The fence: no request of the tenant runs from here (those in flight finish first), and
    // the source's reactors and commands no longer act for it.
    let Ok(gate) = tokio::time::timeout(FENCE_WAIT, placement.fence_when_idle(tenant)).await else {
        return Err(refused(
            Rejection::MoveInProgress,
            format!(
                "requests of tenant {tenant:?} kept the fence waiting {FENCE_WAIT:?}; it stays \
                 in shard {from}: try again"
            ),
        ));
    };
    // On a cluster the gate holds this node's requests only: the fence is an event in the
    // source's stream, which orders every node's appends of the tenant before or after it;
    // those after it are void (refused on the node that sent them, never acted on).
    if cluster && fence == 0 {
        fence = fence_out(src, tenant)
            .await
            .map_err(|e| after_fence(e, cluster, tenant, from))?;
    }
    if fence > 0 {
        placement.fenced_at(tenant, from, fence);
    }
    if let Some(d) = fault_fenced_wait() {
        tokio::time::sleep(d).await;
    }
    let tail = async {
        let through_seq = src.head();
        let n = copy(src, dst, tenant, fence, dst.head(), through_seq).await?;
        verify(src, dst, tenant, fence, verified, through_seq)
            .await
            .map_err(|e| storage("verifying the move's copy", e))?;
        let d = dst.clone();
        blocking(move || Ok(d.read().folded_to(through_seq).map(drop)?)).await?;
        Ok::<_, CommandError>((n, through_seq))
    };
    let (n, through_seq) = tail
        .await
        .map_err(|e| after_fence(e, cluster, tenant, from))?;
    copied += n;
    let record = MoveTenant {
        name: req.tenant.clone(),
        from,
        to: req.to,
        through_seq,
        reason: req.reason.clone(),
        by: req.by.clone(),
    };
    let (row, directory_seq) = match home.execute(record).await {
        Ok((row, receipt)) => (row, receipt.last_seq),
        Err(e) => {
            let e = after_fence(e, cluster, tenant, from);
            // An answer lost after the record was made (the log's, say) still switched it:
            // the directory says which, once it can be read (the gate is held meanwhile).
            let mut known = None;
            for _ in 0..60 {
                if let Ok(row) = live_row(home, tenant).await {
                    known = Some(row);
                    break;
                }
            }
            match known {
                Some(row) if row.shard == req.to => {
                    let h = home.head();
                    (row, h)
                }
                _ => return Err(e),
            }
        }
    };
    underway.switched = Some((req.to, through_seq));
    // The directory as the requests the gate releases read it (they look it up again).
    for _ in 0..60 {
        let h = home.clone();
        if blocking(move || Ok(h.read().folded_to(directory_seq).map(drop)?))
            .await
            .is_ok()
        {
            break;
        }
    }
    drop(underway);
    drop(gate);
    tracing::info!(
        tenant,
        from,
        to = req.to,
        through_seq,
        tenant_events = copied,
        "tenant moved"
    );
    Ok(Moved {
        row,
        from,
        to: req.to,
        through_seq,
        resumed_after,
        tenant_events: copied,
        directory_seq,
    })
}

/// Fence `tenant` out of the source shard of a cluster: the default tenant's fence event in
/// the source's stream, appended only if the stream holds none of the tenant's (a move run
/// again after its fence keeps the first). Answers its seq.
async fn fence_out(src: &Engine, tenant: &str) -> Result<u64, CommandError> {
    let subject = tidemark_log::fence_subject(tenant);
    // The same event whoever appends it (a resend, another run of the move): a duplicate.
    let ev = NewEvent::new(
        Some(format!("fence:{tenant}")),
        tidemark_log::MOVE_FENCE_STREAM,
        &subject,
        tidemark_log::MOVE_FENCE_TYPE,
        &json!({ "tenant": tenant }),
    )
    .map_err(|e| storage("the move's fence", e))?;
    let none_yet = Condition::subject(tidemark_log::MOVE_FENCE_STREAM, &subject, 0);
    let fence = match src.log().append_if(vec![ev], none_yet).await {
        // Its own seq (a duplicate's is the original's).
        Ok(r) => r.events.first().map_or(0, |e| e.seq),
        // Another run of the move fenced it first: its fence counts.
        Err(AppendError::ExpectationFailed { .. } | AppendError::Conflict { .. }) => {
            src.any_log().fence_now(tenant).await?
        }
        Err(e) => return Err(storage("appending the move's fence", e)),
    };
    if fence == 0 {
        return Err(storage(
            "appending the move's fence",
            format!("the source's stream holds no fence of tenant {tenant:?} after it"),
        ));
    }
    Ok(fence)
}

/// An error after a cluster's fence says what it leaves: the tenant fenced, its requests
/// refused, until the move is run again (it resumes from the copy and keeps the fence).
fn after_fence(e: CommandError, cluster: bool, tenant: &str, from: u32) -> CommandError {
    // (Another run of the move goes on: it is the one to finish.)
    let concurrent = matches!(
        e,
        CommandError::Rejected {
            code: Rejection::MoveInProgress,
            ..
        }
    );
    if !cluster || concurrent {
        return e;
    }
    tracing::error!(tenant, from, error = %e, "a move failed after its fence");
    storage(
        "moving",
        format!(
            "{e}; tenant {tenant:?} stays fenced out of shard {from} (its requests are refused \
             with 503 tenant_moving) until the move is run again, which resumes it"
        ),
    )
}

/// Live tenant `name`'s row in the directory as of the home shard's head.
async fn live_row(home: &Engine, name: &str) -> Result<TenantRow, CommandError> {
    let (h, t) = (home.clone(), name.to_owned());
    let row = blocking(move || {
        h.read().floor(0)?;
        Ok(h.read().tenant(&t)?)
    })
    .await?;
    row.filter(TenantRow::is_live)
        .ok_or_else(|| refused(Rejection::TenantNotFound, format!("no tenant {name:?}")))
}

/// Run `f` on the blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, CommandError> + Send + 'static,
) -> Result<T, CommandError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| storage("a move's read", e))?
}

/// A page of `engine`'s log after `after` (every tenant's events), blocking.
async fn page(engine: &Engine, after: u64, upto: u64) -> Result<Vec<Event>, CommandError> {
    let e = engine.clone();
    blocking(move || {
        let q = ReadQuery {
            after,
            limit: if fault_delay().is_some() {
                FAULT_PAGE
            } else {
                PAGE
            },
            ..ReadQuery::default()
        };
        let mut events = e
            .log()
            .read(&q)
            .map_err(|e| storage("reading a shard's log", e))?
            .events;
        events.retain(|ev| ev.seq <= upto);
        Ok(events)
    })
    .await
}

/// A page of the source, with the tenant's fence there as known once the page is read (`fence`,
/// or one another run of the move appended meanwhile: the log holds a fence before anything
/// after it, so the page's events past it are known void).
async fn source_page(
    src: &Engine,
    tenant: &str,
    fence: u64,
    after: u64,
    upto: u64,
) -> Result<(Vec<Event>, u64), CommandError> {
    let events = page(src, after, upto).await?;
    if fence > 0 {
        return Ok((events, fence));
    }
    let (s, t) = (src.clone(), tenant.to_owned());
    let now = blocking(move || Ok(s.fence_of(&t)?)).await?;
    Ok((events, now))
}

/// What the destination holds at `ev.seq` of the source: the tenant's event as it is, any
/// other as a filler.
fn copy_of(ev: &Event, tenant: &str, fence: u64) -> Result<NewEvent, CommandError> {
    let bad = |e: tidemark_log::FieldError| storage("copying an event", e);
    if own(ev, tenant, fence) {
        return NewEvent::from_json_text(
            Some(ev.event_id.clone()),
            ev.stream.clone(),
            ev.subject.clone(),
            ev.event_type.clone(),
            &ev.payload,
        )
        .and_then(|n| n.in_tenant(tenant))
        .map_err(bad);
    }
    NewEvent::new(
        Some(filler_id(ev.seq)),
        Stream::Tenants,
        "gap",
        tidemark_log::MOVE_FILLER_TYPE,
        &json!({}),
    )
    .map_err(bad)
}

fn filler_id(seq: u64) -> String {
    format!("gap:{seq}")
}

/// Whether the source's `ev` is the tenant's, to copy as it is: not one the stream ordered
/// after the tenant's fence (void; `fence` 0: none).
fn own(ev: &Event, tenant: &str, fence: u64) -> bool {
    ev.tenant() == tenant && (fence == 0 || ev.seq < fence)
}

/// Copy the source's events after `after` through `upto` into the destination at the same
/// seqs and times (the destination's head must be `after`); answers how many of them are
/// the tenant's.
async fn copy(
    src: &Engine,
    dst: &Engine,
    tenant: &str,
    fence: u64,
    mut after: u64,
    upto: u64,
) -> Result<u64, CommandError> {
    use tidemark_log::transfer::ImportTarget;
    let log = dst.any_log();
    let mut copied = 0;
    while after < upto {
        let (events, fence) = source_page(src, tenant, fence, after, upto).await?;
        if events.is_empty() {
            return Err(storage(
                "copying",
                format!("the source has no event after seq {after} (head {upto})"),
            ));
        }
        // One batch per run of one commit time (the log records one time a batch) and one
        // tenant (a batch is one tenant's: the tenant's events, or fillers).
        for run in events.chunk_by(|a, b| {
            a.time_us == b.time_us && own(a, tenant, fence) == own(b, tenant, fence)
        }) {
            let batch = run
                .iter()
                .map(|ev| copy_of(ev, tenant, fence))
                .collect::<Result<Vec<_>, _>>()?;
            if own(&run[0], tenant, fence) {
                copied += run.len() as u64;
            }
            if let Err(e) = log.import_batch(batch, run[0].seq, run[0].time_us).await {
                // The destination holds what this run was writing: another run of the move
                // (on another node of a cluster) writes it too, the same events at the same
                // seqs; that one goes on.
                return Err(if dst.head() >= run[0].seq {
                    refused(
                        Rejection::MoveInProgress,
                        format!(
                            "another run of this move (on another node?) writes shard {}'s \
                             copy: this one stops, that one goes on",
                            dst.shard()
                        ),
                    )
                } else {
                    storage("writing the copy into the destination", e)
                });
            }
        }
        after = events.last().map_or(upto, |e| e.seq);
        if let Some(d) = fault_delay() {
            tokio::time::sleep(d).await;
        }
    }
    Ok(copied)
}

/// Whether the destination holds the copy of the source after `after` through `upto`: each
/// seq the source's event of the tenant (same id, stream, subject, type, payload, time), or
/// a filler at the source's time.
async fn verify(
    src: &Engine,
    dst: &Engine,
    tenant: &str,
    fence: u64,
    mut after: u64,
    upto: u64,
) -> Result<(), String> {
    while after < upto {
        let (theirs, fence) = source_page(src, tenant, fence, after, upto)
            .await
            .map_err(|e| e.to_string())?;
        let ours = page(dst, after, upto).await.map_err(|e| e.to_string())?;
        if theirs.is_empty() {
            return Err(format!("the source has no event after seq {after}"));
        }
        if ours.len() < theirs.len() {
            return Err(format!(
                "the copy ends at seq {}",
                ours.last().map_or(after, |e| e.seq)
            ));
        }
        for (s, d) in theirs.iter().zip(&ours) {
            let same = s.seq == d.seq
                && s.time_us == d.time_us
                && if own(s, tenant, fence) {
                    d.tenant() == tenant
                        && s.event_id == d.event_id
                        && s.stream == d.stream
                        && s.subject == d.subject
                        && s.event_type == d.event_type
                        && s.payload.get() == d.payload.get()
                } else {
                    d.tenant.is_none()
                        && d.event_type == tidemark_log::MOVE_FILLER_TYPE
                        && d.event_id == filler_id(s.seq)
                };
            if !same {
                return Err(format!("seq {} differs", s.seq));
            }
        }
        after = theirs.last().map_or(upto, |e| e.seq);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_filler_is_the_directorys_gap_type() {
        assert_eq!(
            tidemark_projections::names::EventType::TenantGap.as_str(),
            tidemark_log::MOVE_FILLER_TYPE
        );
    }
}
