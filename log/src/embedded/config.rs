//! How to open the embedded log.

use std::path::PathBuf;

use super::{ids, storage};

/// How to open a log.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// The redb file.
    pub path: PathBuf,
    /// redb page cache size.
    pub cache_bytes: usize,
    /// Largest number of events one group commit takes.
    pub max_group_events: usize,
    /// Appends waiting for a group beyond this are refused with `Overloaded` (I8).
    pub queue_capacity: usize,
    /// Events kept in the in-memory index tail before it is merged into redb.
    pub merge_threshold: usize,
    /// Bytes of events one ordinary commit of the indexer writes at most (about: it stops
    /// after the event that reaches it, inside a group if need be; the next commit follows at
    /// once). An appender that waits for the indexer waits for one such commit.
    pub index_commit_bytes: usize,
    /// Record the allocator state in every commit, for fast reopen after a crash.
    pub quick_repair: bool,
    /// Where the bytes go: the file at `path`, or another store (tests).
    pub storage: storage::Storage,
    /// Appends and commands are refused (`InsufficientStorage`) while less than this is free
    /// where the log is kept (I10), so the disk never fills inside a commit.
    pub min_free: u64,
    /// Group commits a journal segment takes before the journal moves to the other one (as
    /// it does at 8 MiB), which needs a checkpoint (a durable redb commit) covering that one.
    /// By size by default; tests set it low to turn segments often. Bounds the replay at open.
    pub checkpoint_groups: u64,
    /// The journal is written full of zeros to this size once (half of it in each segment), so
    /// group commits only overwrite it (a cheaper sync than growing a file).
    pub journal_prealloc: u64,
    /// Memory for the `event_id` index's filter pages (the filters themselves are on disk).
    pub id_filter_cache: usize,
    /// Sync each group's journal record before answering (true). Off only for a log that is a
    /// disposable copy of another — the JetStream backend's replica, whose source is the
    /// stream: after a crash it is back at its last checkpoint and follows the stream again.
    pub sync: bool,
}

impl LogConfig {
    /// The log of the data directory `dir` (its file is the backend's business).
    pub fn in_dir(dir: &std::path::Path) -> Self {
        LogConfig::new(dir.join("log.redb"))
    }

    pub fn new(path: impl Into<PathBuf>) -> Self {
        LogConfig {
            path: path.into(),
            cache_bytes: 256 * 1024 * 1024,
            max_group_events: 20_000,
            queue_capacity: 65_536,
            merge_threshold: 100_000,
            index_commit_bytes: 8 << 20,
            quick_repair: true,
            storage: storage::Storage::File,
            min_free: 64 << 20,
            checkpoint_groups: u64::MAX,
            journal_prealloc: 16 << 20,
            id_filter_cache: ids::DEFAULT_CACHE_BYTES,
            sync: true,
        }
    }
}
