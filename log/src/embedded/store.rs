//! The redb file: table definitions, open and recovery, and reads.

use std::sync::RwLock;

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde_json::value::RawValue;

use super::codec;
use super::postings::{self, Block, STREAM_BLOCKS, SUBJECT_BLOCKS, TYPE_BLOCKS};
use super::tail::{Part, Posting, Tail};
use crate::envelope::{Event, EventRef};
use crate::error::{OpenError, ReadError, StorageError, storage};
use crate::{ReadPage, ReadQuery};

/// seq -> stored envelope (see `codec`).
pub(crate) const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("events");
/// Small named counters of the log itself.
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("log_meta");
pub(crate) const META_INDEXED_THROUGH: &str = "indexed_through";
/// Present once the posting indexes (`postings`: subject, type and stream, in blocks of seqs)
/// cover every event up to `indexed_through`; a log written by an earlier release (one row
/// per event per index, or no type and stream index at all) is indexed again at its first
/// open.
const META_POSTING_BLOCKS: &str = "posting_blocks";
/// An earlier release's posting indexes, one row per event: `(key, seq) → stream`, and the
/// markers it kept for two of them. Dropped when the blocks are built.
const LEGACY_POSTINGS: [&str; 3] = ["subject_seq", "type_seq", "stream_seq"];
const LEGACY_MARKERS: [&str; 2] = ["types_indexed", "streams_indexed"];

/// A stored event borrowed from its bytes: nothing is copied, and the payload is taken as the
/// JSON text it was stored as (validated at its append; its UTF-8 is checked here).
pub(crate) fn decode_event_ref(seq: u64, bytes: &[u8]) -> Result<EventRef<'_>, ReadError> {
    let rec = codec::decode(bytes).map_err(|detail| ReadError::Format { seq, detail })?;
    let payload = std::str::from_utf8(rec.payload).map_err(|e| ReadError::Format {
        seq,
        detail: e.to_string(),
    })?;
    Ok(EventRef {
        seq,
        tenant: rec.tenant,
        event_id: rec.event_id,
        stream: rec.stream,
        subject: rec.subject,
        event_type: rec.event_type,
        time_us: rec.time_us,
        payload,
    })
}

pub(crate) fn decode_event(seq: u64, bytes: &[u8]) -> Result<Event, ReadError> {
    let rec = codec::decode(bytes).map_err(|detail| ReadError::Format { seq, detail })?;
    let payload_text = std::str::from_utf8(rec.payload).map_err(|e| ReadError::Format {
        seq,
        detail: e.to_string(),
    })?;
    let payload =
        RawValue::from_string(payload_text.to_owned()).map_err(|e| ReadError::Format {
            seq,
            detail: e.to_string(),
        })?;
    Ok(Event {
        seq,
        tenant: rec.tenant.map(str::to_owned),
        event_id: rec.event_id.to_owned(),
        stream: rec.stream.to_owned(),
        subject: rec.subject.to_owned(),
        event_type: rec.event_type.to_owned(),
        time_us: rec.time_us,
        payload,
    })
}

/// What `open` found in the file.
pub(crate) struct Opened {
    pub db: Database,
    /// The runs of the `event_id` index.
    pub runs: super::ids::Runs,
    /// The journal, started over once its records are back in the events table.
    pub journal: super::journal::Journal,
    /// Events put back from the journal at this open.
    pub replayed: u64,
    pub head: u64,
    pub last_time_us: i64,
    pub tail: Tail,
    pub repaired: bool,
}

/// Open redb on `stores` (replaying the journal past its last checkpoint) and load what the
/// writer and readers keep in memory. Called at open, and again in process after a full disk
/// failed a redb commit (I10).
pub(crate) fn open(
    cfg: &super::LogConfig,
    stores: &super::storage::Opened,
) -> Result<Opened, OpenError> {
    let path = cfg.path.as_path();
    let repaired = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = repaired.clone();
    let mut builder = Database::builder();
    builder
        .set_cache_size(cfg.cache_bytes)
        .set_repair_callback(move |session| {
            if !flag.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!("log file was not closed cleanly; repairing");
            }
            tracing::debug!(progress = session.progress(), "repairing log file");
        });
    let db = builder
        .create_with_backend(super::storage::Backend {
            store: stores.db.clone(),
            cause: stores.cause.clone(),
        })
        .map_err(|e| OpenError::Database {
            path: path.to_owned(),
            source: Box::new(e),
        })?;
    let st = |e: redb::Error| OpenError::Storage(storage(e));
    {
        let txn = db.begin_write().map_err(|e| st(e.into()))?;
        txn.open_table(EVENTS).map_err(|e| st(e.into()))?;
        txn.open_table(super::ids::LEGACY)
            .map_err(|e| st(e.into()))?;
        txn.open_table(super::ids::RUNS).map_err(|e| st(e.into()))?;
        txn.open_table(super::ids::BLOOM)
            .map_err(|e| st(e.into()))?;
        txn.open_table(super::ids::MERGING)
            .map_err(|e| st(e.into()))?;
        let moved = super::ids::migrate_dev_runs(&txn).map_err(OpenError::Storage)?;
        if moved > 0 {
            tracing::warn!(
                ids = moved,
                "moved a development build's id runs into the id table"
            );
        }
        for def in [SUBJECT_BLOCKS, TYPE_BLOCKS, STREAM_BLOCKS] {
            txn.open_table(def).map_err(|e| st(e.into()))?;
        }
        txn.open_table(META).map_err(|e| st(e.into()))?;
        build_postings(&txn).map_err(OpenError::Storage)?;
        txn.commit().map_err(|e| st(e.into()))?;
    }
    // The lean commit: groups past redb's last checkpoint are in the journal. Put their events
    // back (durably) before anything reads the events table.
    let journal_stores = stores.journal.clone();
    let log_id = log_id(&db).map_err(OpenError::Storage)?;
    let replayed = replay(&db, &journal_stores, log_id).map_err(OpenError::Storage)?;
    if replayed > 0 {
        tracing::warn!(
            events = replayed,
            "replayed the journal past the last checkpoint"
        );
    }
    let mut journal = super::journal::Journal::start(
        journal_stores,
        log_id,
        cfg.checkpoint_groups,
        cfg.journal_prealloc,
    )
    .map_err(OpenError::Storage)?;
    journal.set_sync(cfg.sync);
    let txn = db.begin_read().map_err(|e| st(e.into()))?;
    let events = txn.open_table(EVENTS).map_err(|e| st(e.into()))?;
    let meta = txn.open_table(META).map_err(|e| st(e.into()))?;
    let (head, last_time_us) = match events.last().map_err(|e| st(e.into()))? {
        Some((k, v)) => {
            let seq = k.value();
            let ev = decode_event(seq, v.value()).map_err(|e| OpenError::Format {
                seq,
                detail: e.to_string(),
            })?;
            (seq, ev.time_us)
        }
        None => (0, i64::MIN),
    };
    // I1: seqs are dense from 1 (from the first retained seq after a compaction), so the
    // number of rows is the last seq less the compacted prefix. A file that says otherwise was
    // damaged outside tidemark; refuse it rather than serve a gap.
    let rows = events.len().map_err(|e| st(e.into()))?;
    let first = meta
        .get(super::compact::META_FIRST_SEQ)
        .map_err(|e| st(e.into()))?
        .map(|v| v.value())
        .unwrap_or(1);
    if head > 0 && (head + 1 < first || rows != head + 1 - first) {
        return Err(OpenError::Storage(
            format!("the events table holds {rows} rows but its last seq is {head}").into(),
        ));
    }
    let indexed_through = meta
        .get(META_INDEXED_THROUGH)
        .map_err(|e| st(e.into()))?
        .map(|g| g.value())
        .unwrap_or(0);
    let mut tail = Tail::new(indexed_through);
    for row in events
        .range(indexed_through + 1..)
        .map_err(|e| st(e.into()))?
    {
        let (k, v) = row.map_err(|e| st(e.into()))?;
        let seq = k.value();
        let rec = codec::decode(v.value()).map_err(|detail| OpenError::Format { seq, detail })?;
        let keys = [rec.event_id, rec.stream, rec.subject, rec.event_type];
        tail.insert(seq, rec.tenant, keys);
    }
    drop(events);
    drop(meta);
    let runs = super::ids::Runs::load(&txn, cfg.id_filter_cache).map_err(OpenError::Storage)?;
    drop(txn);
    Ok(Opened {
        runs,
        db,
        journal,
        replayed,
        head,
        last_time_us,
        tail,
        repaired: repaired.load(std::sync::atomic::Ordering::Relaxed),
    })
}

/// The last seq committed in `txn`'s view of the log.
fn head_of(events: &redb::ReadOnlyTable<u64, &[u8]>) -> Result<u64, ReadError> {
    let st = |e: redb::Error| ReadError::Storage(storage(e));
    Ok(events
        .last()
        .map_err(|e| st(e.into()))?
        .map(|(k, _)| k.value())
        .unwrap_or(0))
}

/// Read a page as of one read transaction. Its head is the last event that transaction sees,
/// not the published head: a read model read a moment earlier (also in its own transaction)
/// never names a seq this read cannot reach. The writer puts a group's events into the index
/// tail before it commits them, so every event a transaction sees is indexed.
pub(crate) fn read<'q>(
    db: &Database,
    tail: &RwLock<Tail>,
    q: &'q ReadQuery,
) -> Result<ReadPage, ReadError> {
    let st = |e: redb::Error| ReadError::Storage(storage(e));
    let limit = q.limit.max(1);
    let mut out = Vec::new();
    let first = super::compact::first_seq(db).map_err(ReadError::Storage)?;
    if q.after + 1 < first {
        return Err(ReadError::Compacted { first });
    }
    // Each filter given (subject, type, stream) has an index: the matches are the seqs in
    // every one of their posting lists, found by a leapfrog join, so the page holds up to
    // `limit` matches whenever they exist however rare they are (spec section 7).
    // The keys are the query's tenant's (`envelope::scoped`): another tenant's events of the
    // same stream, subject or type are under other keys.
    let tenant = q.tenant.as_deref().and_then(crate::envelope::tenant_of);
    let scoped = |k: Option<&'q str>| k.map(|k| crate::envelope::scoped(tenant, k));
    let keys = [
        (scoped(q.subject.as_deref()), Posting::Subject),
        (scoped(q.event_type.as_deref()), Posting::Type),
        (scoped(q.stream.as_deref()), Posting::Stream),
    ];
    let postings: Vec<(&str, Posting)> = keys
        .iter()
        .filter_map(|(k, p)| Some((k.as_deref()?, *p)))
        .collect();
    if !postings.is_empty() {
        let mut head_seen = None;
        let mut matched: Vec<u64> = Vec::new();
        let mut from = q.after + 1;
        let mut exhausted = false;
        let mut txn;
        // In rounds of at most JOIN_ROUND seeks, each under the tail's lock with a read
        // transaction at the same merge point, so that a long join never holds the writer off
        // the tail. Events up to the first round's head never change, so rounds agree.
        loop {
            let tail = tail.read().unwrap_or_else(|p| p.into_inner());
            txn = db.begin_read().map_err(|e| st(e.into()))?;
            let head = match head_seen {
                Some(h) => h,
                None => {
                    let h = head_of(&txn.open_table(EVENTS).map_err(|e| st(e.into()))?)?;
                    head_seen = Some(h);
                    h
                }
            };
            if from > head {
                exhausted = true;
                break;
            }
            let indexed_end = tail.indexed_through.min(head);
            let mut cursors = Vec::with_capacity(postings.len());
            for &(key, posting) in &postings {
                let def = match posting {
                    Posting::Subject => SUBJECT_BLOCKS,
                    Posting::Type => TYPE_BLOCKS,
                    Posting::Stream => STREAM_BLOCKS,
                };
                cursors.push(PostingCursor {
                    index: txn.open_table(def).map_err(|e| st(e.into()))?,
                    key,
                    indexed_end,
                    tail: tail.postings(posting, key),
                    tail_from: tail.indexed_through + 1,
                    head,
                    block: std::cell::RefCell::new(None),
                });
            }
            match leapfrog(&cursors, &mut from, limit, &mut matched, JOIN_ROUND)? {
                Join::Full => break,
                Join::Exhausted => {
                    exhausted = true;
                    break;
                }
                Join::Paused => continue,
            }
        }
        let head = head_seen.unwrap_or(q.after);
        let events = txn.open_table(EVENTS).map_err(|e| st(e.into()))?;
        for &seq in &matched {
            let Some(v) = events.get(seq).map_err(|e| st(e.into()))? else {
                return Err(ReadError::Storage(
                    format!("indexed event {seq} is missing").into(),
                ));
            };
            out.push(decode_event(seq, v.value())?);
        }
        let next_after = match (exhausted, matched.last()) {
            (true, _) | (false, None) => head.max(q.after),
            (false, Some(&last)) => last,
        };
        return Ok(ReadPage {
            events: out,
            next_after,
            head,
        });
    }
    let txn = db.begin_read().map_err(|e| st(e.into()))?;
    let events = txn.open_table(EVENTS).map_err(|e| st(e.into()))?;
    let head = head_of(&events)?;
    if q.after >= head {
        return Ok(ReadPage {
            events: out,
            next_after: q.after,
            head,
        });
    }
    let mut next_after = head;
    for row in events.range(q.after + 1..=head).map_err(|e| st(e.into()))? {
        let (k, v) = row.map_err(|e| st(e.into()))?;
        let seq = k.value();
        // Only the query's tenant's, when it names one: no index lists a tenant's events
        // alone, so a tenant's page without filters is a scan of its shard's log.
        let kept = match q.tenant.as_deref() {
            None => true,
            Some(crate::DEFAULT_TENANT) => super::codec::is_default_tenant(v.value()),
            Some(_) => of_tenant(&decode_event_ref(seq, v.value())?, q),
        };
        if !kept {
            continue;
        }
        out.push(decode_event(seq, v.value())?);
        if out.len() >= limit {
            next_after = seq;
            break;
        }
    }
    Ok(ReadPage {
        events: out,
        next_after,
        head,
    })
}

/// Whether `e` is of the tenant `q` names (any, when it names none).
pub(crate) fn of_tenant(e: &EventRef<'_>, q: &ReadQuery) -> bool {
    q.tenant.as_deref().is_none_or(|t| e.tenant() == t)
}

/// Seeks a join makes under one hold of the tail's lock.
const JOIN_ROUND: usize = 4096;

/// One filter's posting list as of one merge point: the index table up to `indexed_end`,
/// then the tail's list from `tail_from`, both cut at `head`.
struct PostingCursor<'a> {
    index: redb::ReadOnlyTable<(&'static str, u64), &'static [u8]>,
    key: &'a str,
    indexed_end: u64,
    /// The tail's frozen part's list, then its active part's.
    tail: [&'a [(u64, std::sync::Arc<str>)]; 2],
    tail_from: u64,
    head: u64,
    /// The block the last seek read, with the seq that seek started from: the first block
    /// whose last seq is at or past any later `from` up to that last seq (seeks only move
    /// forward), so the join's next seeks need no lookup.
    block: std::cell::RefCell<Option<(u64, u64, Block)>>,
}

impl PostingCursor<'_> {
    /// The first seq `>= from` in the list, if any up to `head`.
    fn seek(&self, from: u64) -> Result<Option<u64>, ReadError> {
        if from <= self.indexed_end {
            let mut cached = self.block.borrow_mut();
            if !cached
                .as_ref()
                .is_some_and(|(start, last, _)| *start <= from && from <= *last)
            {
                *cached = postings::block_from(&self.index, self.key, from)
                    .map_err(ReadError::Storage)?
                    .map(|(last, b)| (from, last, b));
            }
            if let Some((_, _, b)) = cached.as_ref()
                && let Some((_, s)) = b.seek(from)
                && s <= self.indexed_end
            {
                return Ok(Some(s));
            }
        }
        let from = from.max(self.tail_from);
        for list in self.tail {
            let i = list.partition_point(|(s, _)| *s < from);
            if let Some((s, _)) = list.get(i) {
                return Ok(Some(*s).filter(|s| *s <= self.head));
            }
        }
        Ok(None)
    }
}

enum Join {
    /// `limit` matches found.
    Full,
    /// No match past the last one up to the head.
    Exhausted,
    /// The round's seeks ran out; `from` is where to go on.
    Paused,
}

/// Leapfrog join of sorted posting lists: push onto `matched` every seq `>= *from` in all of
/// them, in order, until `limit` are matched, the lists end, or `budget` seeks were made.
fn leapfrog(
    cursors: &[PostingCursor<'_>],
    from: &mut u64,
    limit: usize,
    matched: &mut Vec<u64>,
    budget: usize,
) -> Result<Join, ReadError> {
    let n = cursors.len();
    let mut seeks = 0;
    let mut i = 0;
    let mut agree = 0;
    loop {
        if matched.len() >= limit {
            return Ok(Join::Full);
        }
        if seeks >= budget {
            return Ok(Join::Paused);
        }
        seeks += 1;
        match cursors[i].seek(*from)? {
            None => return Ok(Join::Exhausted),
            Some(s) if s == *from => agree += 1,
            Some(s) => {
                *from = s;
                agree = 1;
            }
        }
        i = (i + 1) % n;
        if agree == n {
            matched.push(*from);
            *from += 1;
            agree = 0;
        }
    }
}

/// Build the posting blocks for every event up to `indexed_through` if they are not there yet
/// (a log written by an earlier release): once, streamed in seq order in runs of
/// [`REBUILD_RUN`] events, in the open transaction; an earlier release's tables and markers
/// go, and [`META_POSTING_BLOCKS`] records it.
fn build_postings(txn: &redb::WriteTransaction) -> Result<(), StorageError> {
    if txn
        .open_table(META)
        .map_err(storage)?
        .get(META_POSTING_BLOCKS)
        .map_err(storage)?
        .is_some()
    {
        return Ok(());
    }
    for name in LEGACY_POSTINGS {
        txn.delete_table(TableDefinition::<(&str, u64), &str>::new(name))
            .map_err(storage)?;
    }
    for def in [SUBJECT_BLOCKS, TYPE_BLOCKS, STREAM_BLOCKS] {
        txn.delete_table(def).map_err(storage)?;
        txn.open_table(def).map_err(storage)?;
    }
    let through = txn
        .open_table(META)
        .map_err(storage)?
        .get(META_INDEXED_THROUGH)
        .map_err(storage)?
        .map(|g| g.value())
        .unwrap_or(0);
    let mut indexed = 0u64;
    if through > 0 {
        let events = txn.open_table(EVENTS).map_err(storage)?;
        let mut part = Part::default();
        for row in events.range(..=through).map_err(storage)? {
            let (k, v) = row.map_err(storage)?;
            let seq = k.value();
            let rec = codec::decode(v.value())
                .map_err(|detail| StorageError::msg(format!("event {seq}: {detail}")))?;
            let keys = [rec.event_id, rec.stream, rec.subject, rec.event_type];
            part.insert_postings(seq, rec.tenant, keys);
            indexed += 1;
            if indexed.is_multiple_of(REBUILD_RUN) {
                write_part(txn, &std::mem::take(&mut part))?;
            }
        }
        write_part(txn, &part)?;
    }
    let mut meta = txn.open_table(META).map_err(storage)?;
    for m in LEGACY_MARKERS {
        meta.remove(m).map_err(storage)?;
    }
    meta.insert(META_POSTING_BLOCKS, 1).map_err(storage)?;
    if indexed > 0 {
        tracing::warn!(
            events = indexed,
            "indexed the log's subjects, types and streams in blocks (first open by this release)"
        );
    }
    Ok(())
}

/// Events per run of the posting rebuild at open.
const REBUILD_RUN: u64 = 100_000;

/// Write a tail part's posting lists into the block tables.
pub(crate) fn write_part(txn: &redb::WriteTransaction, part: &Part) -> Result<(), StorageError> {
    postings::write(txn, SUBJECT_BLOCKS, &part.subjects, true)?;
    postings::write(txn, TYPE_BLOCKS, &part.types, false)?;
    postings::write(txn, STREAM_BLOCKS, &part.by_stream, false)
}

/// The seq of `event_id` in the merged `event_id` index (the newest events are in the tail).
pub(crate) fn seq_of_id(
    db: &Database,
    runs: &super::ids::Runs,
    event_id: &str,
) -> Result<Option<u64>, ReadError> {
    let txn = db
        .begin_read()
        .map_err(|e| ReadError::Storage(storage(e)))?;
    runs.lookup(&txn, event_id).map_err(ReadError::Storage)
}

pub(crate) fn get(db: &Database, seq: u64) -> Result<Option<Event>, ReadError> {
    let st = |e: redb::Error| ReadError::Storage(storage(e));
    let txn = db.begin_read().map_err(|e| st(e.into()))?;
    let events = txn.open_table(EVENTS).map_err(|e| st(e.into()))?;
    match events.get(seq).map_err(|e| st(e.into()))? {
        Some(v) => Ok(Some(decode_event(seq, v.value())?)),
        None => Ok(None),
    }
}

/// Put the journal's events past the events table's last seq back into it, in one durable
/// commit; how many. A journal that skips a seq is refused: it would leave a gap (I1).
fn replay(
    db: &Database,
    journal: &[std::sync::Arc<dyn super::storage::Store>; 2],
    log_id: u64,
) -> Result<u64, StorageError> {
    let records = super::journal::read(journal, log_id)?;
    if records.is_empty() {
        return Ok(0);
    }
    let mut txn = db.begin_write().map_err(storage)?;
    txn.set_quick_repair(true);
    let mut n = 0;
    {
        let mut t = txn.open_table(EVENTS).map_err(storage)?;
        let mut head = t
            .last()
            .map_err(storage)?
            .map(|(k, _)| k.value())
            .unwrap_or(0);
        for (seq, bytes) in &records {
            if *seq <= head {
                continue;
            }
            if *seq != head + 1 {
                return Err(format!(
                    "the journal holds seq {seq} after {head}: a gap; restore the log from a backup"
                )
                .into());
            }
            decode_event(*seq, bytes).map_err(StorageError::of)?;
            t.insert(*seq, bytes.as_slice()).map_err(storage)?;
            head = *seq;
            n += 1;
        }
    }
    txn.commit().map_err(storage)?;
    Ok(n)
}

/// The log's identity, made at its first open: its journal records carry it, so a journal
/// left beside another log (or by the history before a restore) is never replayed into it.
fn log_id(db: &Database) -> Result<u64, StorageError> {
    const KEY: &str = "log_id";
    let txn = db.begin_write().map_err(storage)?;
    let id = {
        let mut meta = txn.open_table(META).map_err(storage)?;
        let found = meta.get(KEY).map_err(storage)?.map(|g| g.value());
        match found {
            Some(id) => id,
            None => {
                let id = uuid::Uuid::now_v7().as_u64_pair().1 | 1;
                meta.insert(KEY, id).map_err(storage)?;
                id
            }
        }
    };
    txn.commit().map_err(storage)?;
    Ok(id)
}
