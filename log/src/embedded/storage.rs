//! Where the log's bytes go. The log reaches its file only through redb's storage-backend
//! trait, built from the [`Storage`] of its config: the real file (production), or any
//! [`Store`] — the fault-injecting [`super::fault::FaultStore`] in tests. [`Store`] is also the
//! one file interface any side file of the log goes through.

use std::fmt;
use std::io;
use std::sync::Arc;

/// A byte store with the operations a log file needs. `write` and `set_len` may be lost until
/// `sync_data` returns; what `sync_data` covered survives a power loss.
pub trait Store: Send + Sync + fmt::Debug + 'static {
    fn len(&self) -> io::Result<u64>;
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Read exactly `out.len()` bytes at `offset` (an error past the end).
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()>;
    /// Grow (with zeros) or shrink.
    fn set_len(&self, len: u64) -> io::Result<()>;
    fn sync_data(&self) -> io::Result<()>;
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Bytes still free where the store keeps its data, if it knows.
    fn available(&self) -> Option<u64> {
        None
    }
    /// Whether the store can grow by `bytes` now (`StorageFull` if not), leaving it as it was:
    /// the probe before the log is reopened after a full disk.
    fn can_grow(&self, bytes: u64) -> io::Result<()> {
        let len = self.len()?;
        self.set_len(len + bytes)?;
        self.set_len(len)
    }
}

/// What the log keeps its bytes in.
#[derive(Clone, Default)]
pub enum Storage {
    /// The file at the config's path (locked against a second process) and the journal
    /// beside it.
    #[default]
    File,
    /// Other stores (tests: fault-injecting ones) for the redb file and the journal's two
    /// segments.
    Stores {
        db: Arc<dyn Store>,
        journal: [Arc<dyn Store>; 2],
    },
}

/// A [`Store`] on a real file.
#[derive(Debug)]
pub struct FileStore(std::fs::File);

impl FileStore {
    /// Open (or create) the file at `path` for reading and writing.
    pub fn open(path: &std::path::Path) -> io::Result<FileStore> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map(FileStore)
    }
}

impl Store for FileStore {
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.0, out, offset)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.0, data, offset)
    }
    /// Allocates the blocks (a sparse resize would succeed on a full disk), then gives them back.
    fn can_grow(&self, bytes: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let len = self.len()?;
        nix::fcntl::fallocate(
            self.0.as_raw_fd(),
            nix::fcntl::FallocateFlags::empty(),
            len as i64,
            bytes as i64,
        )
        .map_err(io::Error::from)?;
        self.0.set_len(len)
    }
}

/// The stores a log is opened on, kept for the log's life: an in-process reopen (I10) opens
/// redb again on the same ones, so the process keeps its lock on the file.
pub(crate) struct Opened {
    pub db: Arc<dyn Store>,
    pub journal: [Arc<dyn Store>; 2],
    pub cause: Arc<Cause>,
}

impl Storage {
    /// Open the stores of a log at `path`. For [`Storage::File`]: create its directory, open
    /// the redb file and take an exclusive lock on it (a second process is refused), and open
    /// the journal beside it.
    pub(crate) fn open(&self, path: &std::path::Path) -> Result<Opened, crate::OpenError> {
        match self {
            Storage::File => {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(|source| crate::OpenError::CreateDir {
                        path: dir.to_owned(),
                        source,
                    })?;
                }
                let file_err = |path: &std::path::Path| {
                    let path = path.to_owned();
                    move |source| crate::OpenError::File { path, source }
                };
                let db = FileStore::open(path).map_err(file_err(path))?;
                match db.0.try_lock() {
                    Ok(()) => {}
                    Err(std::fs::TryLockError::WouldBlock) => {
                        return Err(crate::OpenError::Locked {
                            path: path.to_owned(),
                        });
                    }
                    Err(std::fs::TryLockError::Error(e)) => return Err(file_err(path)(e)),
                }
                let [a, b] = journal_paths(path);
                Ok(Opened {
                    db: Arc::new(db),
                    journal: [
                        Arc::new(FileStore::open(&a).map_err(file_err(&a))?),
                        Arc::new(FileStore::open(&b).map_err(file_err(&b))?),
                    ],
                    cause: Arc::default(),
                })
            }
            Storage::Stores { db, journal } => Ok(Opened {
                db: db.clone(),
                journal: journal.clone(),
                cause: Arc::default(),
            }),
        }
    }

    /// Bytes free for a log at `path` kept in this storage, if known.
    pub fn available(&self, path: &std::path::Path) -> Option<u64> {
        match self {
            Storage::File => {
                let dir = path.parent().filter(|d| !d.as_os_str().is_empty())?;
                let s = nix::sys::statvfs::statvfs(dir).ok()?;
                Some(s.blocks_available().saturating_mul(s.fragment_size()))
            }
            Storage::Stores { db, .. } => db.available(),
        }
    }
}

/// The journal's segments of the log at `path`: `<path>.journal` and `<path>.journal.1`,
/// beside the file.
pub(crate) fn journal_paths(path: &std::path::Path) -> [std::path::PathBuf; 2] {
    let mut a = path.as_os_str().to_owned();
    a.push(".journal");
    let mut b = a.clone();
    b.push(".1");
    [a.into(), b.into()]
}

impl fmt::Debug for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Storage::File => f.write_str("File"),
            Storage::Stores { db, journal } => write!(f, "Stores({db:?}, {journal:?})"),
        }
    }
}

/// What the last failed call on the redb file met (redb then refuses every call until it is
/// reopened, answering `PreviousIo` whoever makes it): nothing, a full disk, or another
/// failure. Shared by every `Backend` of one log, so whoever meets a `PreviousIo` — the writer
/// or the projection follower — knows whether a full disk caused it.
#[derive(Debug, Default)]
pub(crate) struct Cause(std::sync::atomic::AtomicU8);

impl Cause {
    const FULL: u8 = 1;
    const OTHER: u8 = 2;

    fn record<T>(&self, r: io::Result<T>) -> io::Result<T> {
        if let Err(e) = &r {
            let c = if e.kind() == io::ErrorKind::StorageFull {
                Self::FULL
            } else {
                Self::OTHER
            };
            self.0.store(c, std::sync::atomic::Ordering::SeqCst);
        }
        r
    }

    /// A full disk failed the last failed call on the redb file.
    pub(crate) fn full(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst) == Self::FULL
    }

    pub(crate) fn clear(&self) {
        self.0.store(0, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A [`Store`] as redb's backend, recording what a failed call met.
#[derive(Debug)]
pub(crate) struct Backend {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) cause: Arc<Cause>,
}

impl redb::StorageBackend for Backend {
    fn len(&self) -> Result<u64, io::Error> {
        self.cause.record(self.store.len())
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.cause.record(self.store.read(offset, out))
    }
    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.cause.record(self.store.set_len(len))
    }
    fn sync_data(&self) -> Result<(), io::Error> {
        self.cause.record(self.store.sync_data())
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.cause.record(self.store.write(offset, data))
    }
}

/// A redb storage backend on `store`: what another redb file kept beside the log (the
/// models store) uses to run on the same stores as the log, fault-injecting ones in tests.
pub fn redb_backend(store: Arc<dyn Store>) -> impl redb::StorageBackend {
    Backend {
        store,
        cause: Arc::new(Cause::default()),
    }
}
