//! The journal: the lean durable commit. Each group commit appends one record holding the
//! group's stored events to a sequential file and syncs it once; the redb commit that makes
//! the group visible (events, indexes, read models) is made without a sync. A periodic
//! checkpoint — one `Immediate` redb commit — makes everything before it durable in redb, and
//! the journal starts over. On open, the events of records past redb's durable head are put
//! back into the events table before anything else looks at it (the read models then fold
//! them as they fold any missing event), so an acknowledged group is never lost.
//!
//! Record: `len: u32 LE` (of the body) ‖ `check: [u8; 8]` (blake3 of the body, first 8 bytes)
//! ‖ body = `log id: u64 LE` (the log the journal belongs to: a journal left by another log,
//! or by the history before a restore, is not replayed) ‖ `count: u32 LE` then per event
//! `seq: u64 LE`, `len: u32 LE`, the stored envelope (the bytes of the events table). A torn or unchecked record ends the journal: it was never
//! synced, so nothing acknowledged is in it.
//!
//! The file is written full of zeros once (`prealloc` bytes) and then only overwritten: a
//! sync of an overwrite need not write the file's size or allocate blocks, which on ext4 halves
//! an `fdatasync`. Starting over after a checkpoint just writes from offset 0 again; the records
//! of the previous round that are still there have lower seqs, so reading stops where the seqs
//! stop rising (and replay skips seqs redb already holds).

use std::sync::Arc;

use super::storage::Store;
use crate::error::StorageError;

/// Checkpoint when the journal holds this many bytes.
pub(crate) const CHECKPOINT_BYTES: u64 = 8 << 20;

const HEADER: usize = 12;

/// Why a record did not become durable. A failed write left no complete record (a torn one
/// fails its check); a failed sync may have left a complete one on disk, so the group's
/// outcome is unknown.
#[derive(Debug)]
pub(crate) enum AppendFailed {
    Write(StorageError),
    Sync(StorageError),
}

/// The journal file and where its next record goes.
pub(crate) struct Journal {
    store: Arc<dyn Store>,
    /// The log's id (in its `log_meta`), written into every record.
    log_id: u64,
    end: u64,
    groups: u64,
    /// Checkpoint after this many group commits.
    every: u64,
    buf: Vec<u8>,
    /// The preallocation did not fit on the disk (see [`Journal::start`]).
    short_of_space: bool,
    /// Sync each record (off only for a log that is a disposable copy of another).
    sync: bool,
}

static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

fn check(body: &[u8]) -> [u8; 8] {
    let h = blake3::hash(body);
    h.as_bytes()[..8].try_into().expect("8 bytes")
}

impl Journal {
    /// A journal on `store`, writing from its start (call once `replay` put its records
    /// back), at least `prealloc` bytes long and written through. A disk too full for the
    /// preallocation is not an error: the journal is left as it was (it grows with each
    /// record instead) and [`Journal::short_of_space`] says so, for the log to start refusing
    /// appends until space returns (I10: a full disk at start starts the log read-only).
    pub(crate) fn start(
        store: Arc<dyn Store>,
        log_id: u64,
        every: u64,
        prealloc: u64,
    ) -> Result<Journal, StorageError> {
        let err = |e| StorageError::new("preparing the journal", e);
        let start = store.len().map_err(err)?;
        let mut short = false;
        if start < prealloc {
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
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull => {
                    tracing::warn!(
                        need = prealloc,
                        "the disk is too full for the journal's preallocation; the log starts \
                         read-only until space returns"
                    );
                    store.set_len(start).map_err(err)?;
                    store.sync_data().map_err(err)?;
                    short = true;
                }
                Err(e) => return Err(err(e)),
            }
        }
        let mut j = Journal {
            store,
            log_id,
            end: 0,
            groups: 0,
            every: every.max(1),
            sync: true,
            buf: Vec::with_capacity(64 << 10),
            short_of_space: short,
        };
        j.reset();
        Ok(j)
    }

    /// Try the preallocation again (after it did not fit at start); `Ok` once it is done.
    pub(crate) fn preallocate(&mut self, prealloc: u64) -> Result<(), StorageError> {
        let mut j = Journal::start(self.store.clone(), self.log_id, self.every, prealloc)?;
        j.sync = self.sync;
        if j.short_of_space {
            return Err(StorageError::msg(
                "the journal's preallocation does not fit yet",
            ));
        }
        *self = j;
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
        for (seq, bytes) in events {
            self.buf.extend_from_slice(&seq.to_le_bytes());
            self.buf
                .extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            self.buf.extend_from_slice(bytes);
        }
        let body_len = u32::try_from(self.buf.len() - HEADER).map_err(|_| {
            AppendFailed::Write(StorageError::msg(
                "a group too large for one journal record (over 4 GiB)",
            ))
        })?;
        let c = check(&self.buf[HEADER..]);
        self.buf[..4].copy_from_slice(&body_len.to_le_bytes());
        self.buf[4..HEADER].copy_from_slice(&c);
        self.store
            .write(self.end, &self.buf)
            .map_err(|e| AppendFailed::Write(StorageError::new("writing the journal", e)))?;
        if self.sync {
            let synced = std::time::Instant::now();
            self.store
                .sync_data()
                .map_err(|e| AppendFailed::Sync(StorageError::new("syncing the journal", e)))?;
            metrics::histogram!("tidemark_log_fsync_duration_seconds")
                .record(synced.elapsed().as_secs_f64());
        }
        self.end += self.buf.len() as u64;
        self.groups += 1;
        Ok(())
    }

    /// Whether a checkpoint is due.
    pub(crate) fn full(&self) -> bool {
        self.end >= CHECKPOINT_BYTES || self.groups >= self.every
    }

    /// Start over from offset 0 (after a checkpoint made every record durable in redb). The
    /// old records stay until overwritten; their seqs are all redb's already.
    pub(crate) fn reset(&mut self) {
        self.end = 0;
        self.groups = 0;
    }
}

/// Every event of the journal's checked records of log `log_id`, in order: (seq, stored bytes).
pub(crate) fn read(store: &dyn Store, log_id: u64) -> Result<Vec<(u64, Vec<u8>)>, StorageError> {
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
        // (behind a shorter later one): the journal ends here.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedded::fault::FaultStore;

    #[test]
    fn records_read_back_and_a_torn_tail_ends_the_journal() {
        let f = FaultStore::new();
        let mut j = Journal::start(Arc::new(f.clone()), 42, 100, 0).unwrap();
        j.append([(1u64, &b"one"[..]), (2, &b"two"[..])].into_iter())
            .unwrap();
        j.append([(3u64, &b"three"[..])].into_iter()).unwrap();
        let got = read(&f, 42).unwrap();
        assert!(
            read(&f, 43).unwrap().is_empty(),
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
        assert_eq!(read(&crashed, 42).unwrap().len(), 3);
        // Starting over overwrites from the start; the older records behind it end the read.
        j.reset();
        j.append([(7u64, &b"seven"[..])].into_iter()).unwrap();
        assert_eq!(read(&f, 42).unwrap(), [(7, b"seven".to_vec())]);
    }

    #[test]
    fn a_preallocated_journal_reads_as_empty_and_is_only_overwritten() {
        let f = FaultStore::new();
        let mut j = Journal::start(Arc::new(f.clone()), 42, 100, 100_000).unwrap();
        assert_eq!(crate::embedded::storage::Store::len(&f).unwrap(), 100_000);
        assert!(read(&f, 42).unwrap().is_empty());
        j.append([(1u64, &b"one"[..])].into_iter()).unwrap();
        assert_eq!(crate::embedded::storage::Store::len(&f).unwrap(), 100_000);
        assert_eq!(read(&f, 42).unwrap(), [(1, b"one".to_vec())]);
    }
}
