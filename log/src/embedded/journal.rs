//! The journal: the log's durable point. Each group commit appends one record holding the
//! group's stored events to a sequential file and syncs it once (`fdatasync`); that sync is the
//! acknowledgement. The redb commit of the group's events and indexes follows later, made by
//! the indexer without a sync; a checkpoint — one durable redb commit — makes everything
//! before it durable in redb. On open, the events of records past redb's durable head are put
//! back into the events table before anything else looks at it, so an acknowledged group is
//! never lost.
//!
//! Record: `len: u32 LE` (of the body) ‖ `check: [u8; 8]` (blake3 of the body, first 8 bytes)
//! ‖ body = `log id: u64 LE` (the log the journal belongs to: a journal left by another log,
//! or by the history before a restore, is not replayed) ‖ `count: u32 LE` then per event
//! `seq: u64 LE`, `len: u32 LE`, the stored envelope (the bytes of the events table). A torn or
//! unchecked record ends a segment: it was never synced, so nothing acknowledged is in it.
//!
//! # Two segments
//! The journal is two files (segments) written in turn. When the current one holds
//! [`CHECKPOINT_BYTES`] (or `every` groups), the writer moves to the other one and writes it
//! from offset 0 again — but only once a durable checkpoint covers every record of the other
//! one ([`Journal::rotate`]). Until then it goes on appending to the current segment and asks
//! the indexer for a checkpoint, so an append never waits for redb: the journal is reset only
//! after a durable checkpoint that covers it. At open, both segments are read and their records
//! past redb's durable head must follow each other seq by seq.
//!
//! Each file is written full of zeros once (half of `prealloc` bytes, in 4 KiB writes, so the page
//! cache holds it in 4 KiB pages and a small record dirties one page, not a large folio) and
//! then only overwritten: a sync of an overwrite need not write the file's size or allocate
//! blocks, which on ext4 halves an `fdatasync`. The records of an earlier round that are still
//! there behind the new ones have lower seqs, so reading stops where the seqs stop rising.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::storage::Store;
use crate::error::StorageError;

/// Move to the other segment when the current one holds this many bytes.
pub(crate) const CHECKPOINT_BYTES: u64 = 8 << 20;

const HEADER: usize = 12;

/// The size of the zero writes that preallocate a segment.
const PREALLOC_WRITE: usize = 4 << 10;

/// Why a record did not become durable. A failed write left no complete record (a torn one
/// fails its check); a failed sync may have left a complete one on disk, so the group's
/// outcome is unknown.
#[derive(Debug)]
pub(crate) enum AppendFailed {
    Write(StorageError),
    Sync(StorageError),
}

/// The journal's two segments and where the next record goes.
pub(crate) struct Journal {
    segs: [Arc<dyn Store>; 2],
    /// The segment being written.
    cur: usize,
    /// The log's id (in its `log_meta`), written into every record.
    log_id: u64,
    end: u64,
    groups: u64,
    /// Move to the other segment after this many group commits.
    every: u64,
    /// The last seq written into the current segment since it was started over (0: none).
    last: u64,
    /// The last seq the other segment holds that a checkpoint may not cover yet (0: none).
    other_last: u64,
    buf: Vec<u8>,
    /// The preallocation did not fit on the disk (see [`Journal::start`]).
    short_of_space: bool,
    /// Sync each record (off only for a log that is a disposable copy of another).
    sync: bool,
}

static ZEROS: [u8; PREALLOC_WRITE] = [0; PREALLOC_WRITE];

fn check(body: &[u8]) -> [u8; 8] {
    let h = blake3::hash(body);
    h.as_bytes()[..8].try_into().expect("8 bytes")
}

/// Fill `store` with zeros up to `prealloc` bytes; `Ok(false)` when the disk is too full (the
/// store is left as it was).
fn preallocate(store: &dyn Store, prealloc: u64) -> Result<bool, StorageError> {
    let err = |e| StorageError::new("preparing the journal", e);
    let start = store.len().map_err(err)?;
    if start >= prealloc {
        return Ok(true);
    }
    let mut len = start;
    let filled = (|| -> std::io::Result<()> {
        while len < prealloc {
            let n = (prealloc - len).min(ZEROS.len() as u64) as usize;
            store.write(len, &ZEROS[..n])?;
            len += n as u64;
        }
        store.sync_data()
    })();
    match filled {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::StorageFull => {
            store.set_len(start).map_err(err)?;
            store.sync_data().map_err(err)?;
            Ok(false)
        }
        Err(e) => Err(err(e)),
    }
}

impl Journal {
    /// A journal on `segs`, writing segment 0 from its start (call once `replay` put its
    /// records back and a durable commit covers them), `prealloc` bytes long in all (each
    /// segment half of it: the journal takes the disk space one file took before it had two). A disk too full for the preallocation is not an error: the segments are left as
    /// they were (they grow with each record instead) and [`Journal::short_of_space`] says so,
    /// for the log to start refusing appends until space returns (I10: a full disk at start
    /// starts the log read-only).
    pub(crate) fn start(
        segs: [Arc<dyn Store>; 2],
        log_id: u64,
        every: u64,
        prealloc: u64,
    ) -> Result<Journal, StorageError> {
        let mut short = false;
        for s in &segs {
            if !preallocate(&**s, prealloc / 2)? {
                short = true;
            }
        }
        if short {
            tracing::warn!(
                need = prealloc,
                "the disk is too full for the journal's preallocation; the log starts \
                 read-only until space returns"
            );
        }
        Ok(Journal {
            segs,
            cur: 0,
            log_id,
            end: 0,
            groups: 0,
            every: every.max(1),
            last: 0,
            other_last: 0,
            sync: true,
            buf: Vec::with_capacity(64 << 10),
            short_of_space: short,
        })
    }

    /// Try the preallocation again (after it did not fit at start); `Ok` once it is done.
    pub(crate) fn preallocate(&mut self, prealloc: u64) -> Result<(), StorageError> {
        for s in &self.segs {
            if !preallocate(&**s, prealloc / 2)? {
                return Err(StorageError::msg(
                    "the journal's preallocation does not fit yet",
                ));
            }
        }
        self.short_of_space = false;
        Ok(())
    }

    /// Sync each record or not ([`crate::LogConfig::sync`]).
    pub(crate) fn set_sync(&mut self, sync: bool) {
        self.sync = sync;
    }

    /// Whether the disk was too full for the preallocation at start.
    pub(crate) fn short_of_space(&self) -> bool {
        self.short_of_space
    }

    /// Append one group's events (seq, stored bytes) and sync: the group's durable point.
    pub(crate) fn append<'a>(
        &mut self,
        events: impl ExactSizeIterator<Item = (u64, &'a [u8])>,
    ) -> Result<(), AppendFailed> {
        self.buf.clear();
        self.buf.extend_from_slice(&[0u8; HEADER]);
        self.buf.extend_from_slice(&self.log_id.to_le_bytes());
        self.buf
            .extend_from_slice(&(events.len() as u32).to_le_bytes());
        let mut last = self.last;
        for (seq, bytes) in events {
            self.buf.extend_from_slice(&seq.to_le_bytes());
            self.buf
                .extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            self.buf.extend_from_slice(bytes);
            last = seq;
        }
        let body_len = u32::try_from(self.buf.len() - HEADER).map_err(|_| {
            AppendFailed::Write(StorageError::msg(
                "a group too large for one journal record (over 4 GiB)",
            ))
        })?;
        let c = check(&self.buf[HEADER..]);
        self.buf[..4].copy_from_slice(&body_len.to_le_bytes());
        self.buf[4..HEADER].copy_from_slice(&c);
        let seg = &self.segs[self.cur];
        seg.write(self.end, &self.buf)
            .map_err(|e| AppendFailed::Write(StorageError::new("writing the journal", e)))?;
        if self.sync {
            let synced = std::time::Instant::now();
            seg.sync_data()
                .map_err(|e| AppendFailed::Sync(StorageError::new("syncing the journal", e)))?;
            metrics::histogram!("tidemark_log_fsync_duration_seconds")
                .record(synced.elapsed().as_secs_f64());
        }
        self.end += self.buf.len() as u64;
        self.groups += 1;
        self.last = last;
        Ok(())
    }

    /// Whether the current segment is full enough to move to the other one.
    pub(crate) fn rotation_due(&self) -> bool {
        self.end >= CHECKPOINT_BYTES || self.groups >= self.every
    }

    /// The seq a durable checkpoint must cover before the other segment may be written again.
    pub(crate) fn needs_checkpoint(&self) -> u64 {
        self.other_last
    }

    /// Move to the other segment if a durable checkpoint through `checkpointed` covers all it
    /// holds: it is written from offset 0 again. `false`: not yet (the current one goes on).
    pub(crate) fn rotate(&mut self, checkpointed: u64) -> bool {
        if self.other_last > checkpointed {
            return false;
        }
        self.cur ^= 1;
        self.other_last = self.last;
        self.last = 0;
        self.end = 0;
        self.groups = 0;
        true
    }
}

/// The checked records of log `log_id` in one segment, from its start while their seqs follow
/// each other: (seq, stored bytes).
fn read_segment(store: &dyn Store, log_id: u64) -> Result<Vec<(u64, Vec<u8>)>, StorageError> {
    let len = store
        .len()
        .map_err(|e| StorageError::new("reading the journal", e))?;
    let mut data = vec![0u8; len as usize];
    if len > 0 {
        store
            .read(0, &mut data)
            .map_err(|e| StorageError::new("reading the journal", e))?;
    }
    let mut out: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut at = 0usize;
    while at + HEADER <= data.len() {
        let body_len = u32::from_le_bytes(data[at..at + 4].try_into().expect("4")) as usize;
        let start = at + HEADER;
        let Some(body) = data.get(start..start + body_len) else {
            break;
        };
        if body.len() < 12 || check(body) != data[at + 4..at + HEADER] {
            break;
        }
        if u64::from_le_bytes(body[..8].try_into().expect("8")) != log_id {
            break;
        }
        let count = u32::from_le_bytes(body[8..12].try_into().expect("4")) as usize;
        let mut p = 12;
        let mut events = Vec::with_capacity(count);
        for _ in 0..count {
            let seq = u64::from_le_bytes(
                body.get(p..p + 8)
                    .ok_or("a journal record is shorter than it says")?
                    .try_into()
                    .expect("8"),
            );
            let n = u32::from_le_bytes(
                body.get(p + 8..p + 12)
                    .ok_or("a journal record is shorter than it says")?
                    .try_into()
                    .expect("4"),
            ) as usize;
            let bytes = body
                .get(p + 12..p + 12 + n)
                .ok_or("a journal record is shorter than it says")?;
            events.push((seq, bytes.to_vec()));
            p += 12 + n;
        }
        // Records follow each other seq by seq; anything else is a record of an earlier round
        // (behind a shorter later one): the segment ends here.
        if let (Some((last, _)), Some((first, _))) = (out.last(), events.first())
            && *first != last + 1
        {
            break;
        }
        out.extend(events);
        at = start + body_len;
    }
    Ok(out)
}

/// Every event the journal's segments hold for log `log_id`, by seq: (seq, stored bytes).
pub(crate) fn read(
    segs: &[Arc<dyn Store>; 2],
    log_id: u64,
) -> Result<Vec<(u64, Vec<u8>)>, StorageError> {
    let mut all: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    for s in segs {
        all.extend(read_segment(&**s, log_id)?);
    }
    Ok(all.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedded::fault::FaultStore;

    fn segs(f: &FaultStore, g: &FaultStore) -> [Arc<dyn Store>; 2] {
        [Arc::new(f.clone()), Arc::new(g.clone())]
    }

    #[test]
    fn records_read_back_and_a_torn_tail_ends_the_journal() {
        let f = FaultStore::new();
        let g = f.sibling();
        let mut j = Journal::start(segs(&f, &g), 42, 100, 0).unwrap();
        j.append([(1u64, &b"one"[..]), (2, &b"two"[..])].into_iter())
            .unwrap();
        j.append([(3u64, &b"three"[..])].into_iter()).unwrap();
        let got = read(&segs(&f, &g), 42).unwrap();
        assert!(
            read(&segs(&f, &g), 43).unwrap().is_empty(),
            "another log's journal is not replayed"
        );
        assert_eq!(
            got,
            [
                (1, b"one".to_vec()),
                (2, b"two".to_vec()),
                (3, b"three".to_vec())
            ]
        );
        // A third record written but not synced, then torn by a crash.
        f.fail_nth(
            crate::embedded::fault::Op::Sync,
            1,
            std::io::ErrorKind::Other,
        );
        assert!(j.append([(4u64, &b"four"[..])].into_iter()).is_err());
        let crashed = f.crash(|_| true);
        let len = crate::embedded::storage::Store::len(&crashed).unwrap();
        crate::embedded::storage::Store::set_len(&crashed, len - 2).unwrap();
        assert_eq!(read(&segs(&crashed, &g), 42).unwrap().len(), 3);
    }

    /// The writer moves to the other segment only once a checkpoint covers it, and reading
    /// joins the segments by seq, past the older round's leftovers.
    #[test]
    fn segments_turn_only_behind_a_checkpoint() {
        let f = FaultStore::new();
        let g = f.sibling();
        let mut j = Journal::start(segs(&f, &g), 7, 2, 0).unwrap();
        j.append([(1u64, &b"a"[..])].into_iter()).unwrap();
        j.append([(2u64, &b"b"[..])].into_iter()).unwrap();
        assert!(j.rotation_due());
        assert!(j.rotate(0), "the other segment holds nothing yet");
        assert_eq!(j.needs_checkpoint(), 2);
        j.append([(3u64, &b"c"[..])].into_iter()).unwrap();
        j.append([(4u64, &b"d"[..])].into_iter()).unwrap();
        assert!(j.rotation_due());
        assert!(!j.rotate(1), "seq 2 is not checkpointed: segment 0 is kept");
        j.append([(5u64, &b"e"[..])].into_iter()).unwrap();
        let seqs = |f: &FaultStore, g: &FaultStore| {
            read(&segs(f, g), 7)
                .unwrap()
                .into_iter()
                .map(|(s, _)| s)
                .collect::<Vec<_>>()
        };
        assert_eq!(seqs(&f, &g), [1, 2, 3, 4, 5]);
        assert!(j.rotate(2));
        j.append([(6u64, &b"f"[..])].into_iter()).unwrap();
        // Segment 0 now starts with 6, then the leftovers of its first round (1, 2) end it.
        assert_eq!(seqs(&f, &g), [3, 4, 5, 6]);
    }

    #[test]
    fn a_preallocated_journal_reads_as_empty_and_is_only_overwritten() {
        let f = FaultStore::new();
        let g = f.sibling();
        let mut j = Journal::start(segs(&f, &g), 42, 100, 100_000).unwrap();
        assert_eq!(crate::embedded::storage::Store::len(&f).unwrap(), 50_000);
        assert_eq!(crate::embedded::storage::Store::len(&g).unwrap(), 50_000);
        assert!(read(&segs(&f, &g), 42).unwrap().is_empty());
        j.append([(1u64, &b"one"[..])].into_iter()).unwrap();
        assert_eq!(crate::embedded::storage::Store::len(&f).unwrap(), 50_000);
        assert_eq!(read(&segs(&f, &g), 42).unwrap(), [(1, b"one".to_vec())]);
    }
}
