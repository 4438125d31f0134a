//! The models store (spec section 3): every read model's tables, their metas, digest chains
//! and snapshots, and the subjects' last seqs ([`crate::framework::subjects`]), in a redb file of their
//! own beside the log (`models.redb`), written by one thread of the engine (its decider),
//! never by the log's writer. It follows the log: [`Models::follow`] folds committed events,
//! read through the log's interface, in bounded transactions that commit without a sync; a
//! sync ([`Models::persist`]) is made every few seconds and at close. After a crash the store
//! is at its last synced commit and folds forward from there; deleted, it is rebuilt from the
//! log at the next start. A failure of its file never touches the log: the store is reopened
//! ([`Models::reopen`]) and folds again.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use redb::{Database, Durability, ReadableDatabase, WriteTransaction};
use serde::Serialize;
use tidemark_log::storage::{FileStore, Store, redb_backend};
use tidemark_log::{EventChunk, EventLog, StorageError};

use crate::framework::{
    self, Applied, Inner, Layer, ModelsRead, ModelsTxn, Overlay, Projection, Src, TxMut,
};
use crate::{
    bridges, cursors, deliveries, lists, notifications, routes, settings, sources, tasks, tenants,
};

/// How to open the models store.
#[derive(Clone)]
pub struct ModelsConfig {
    pub path: PathBuf,
    pub cache_bytes: usize,
    /// Another byte store instead of the file at `path` (tests: a fault-injecting one).
    pub store: Option<Arc<dyn Store>>,
}

impl ModelsConfig {
    /// The models store of the data directory `dir`.
    pub fn in_dir(dir: &Path) -> ModelsConfig {
        ModelsConfig {
            path: dir.join(FILE),
            cache_bytes: 256 * 1024 * 1024,
            store: None,
        }
    }
}

/// The models store's file name in a data directory.
pub const FILE: &str = "models.redb";

/// An open models store. Cheap to clone; the last handle dropped syncs it.
#[derive(Clone)]
pub struct Models {
    db: Arc<Handle>,
    cfg: ModelsConfig,
}

struct Handle(RwLock<Arc<Database>>);

impl Drop for Handle {
    fn drop(&mut self) {
        let db = self.0.read().unwrap_or_else(|p| p.into_inner()).clone();
        if let Ok(txn) = db.begin_write() {
            let _ = txn.commit();
        }
    }
}

fn open_db(cfg: &ModelsConfig) -> Result<Database, StorageError> {
    let store: Arc<dyn Store> = match &cfg.store {
        Some(s) => s.clone(),
        None => {
            let cannot = |e| StorageError::new(format!("cannot open {}", cfg.path.display()), e);
            if let Some(dir) = cfg.path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(cannot)?;
            }
            Arc::new(FileStore::open(&cfg.path).map_err(cannot)?)
        }
    };
    let mut b = Database::builder();
    b.set_cache_size(cfg.cache_bytes);
    b.create_with_backend(redb_backend(store))
        .map_err(|e| StorageError::new(format!("cannot open {}", cfg.path.display()), e))
}

impl Models {
    /// Open (or create) the store and put its tables in order ([`framework::prepare`]). The
    /// store is derived from the log: a file redb cannot read is set aside as
    /// `models.redb.unreadable` (one, the newest) and an empty store opened in its place, which
    /// the decider then folds from the log; any other failure is the caller's.
    pub fn open(cfg: &ModelsConfig) -> Result<Models, StorageError> {
        match Self::open_as_is(cfg) {
            // Only a file redb finds corrupt (not an I/O error: permissions, a full disk).
            Err(e) if cfg.store.is_none() && e.is_corrupt() && cfg.path.exists() => {
                let aside = cfg.path.with_extension("redb.unreadable");
                tracing::warn!(
                    error = %e,
                    path = %cfg.path.display(),
                    aside = %aside.display(),
                    "the models store is unreadable: set aside, and rebuilt from the log"
                );
                std::fs::rename(&cfg.path, &aside).map_err(|io| {
                    StorageError::new(format!("cannot set {} aside", cfg.path.display()), io)
                })?;
                Self::open_as_is(cfg)
            }
            r => r,
        }
    }

    fn open_as_is(cfg: &ModelsConfig) -> Result<Models, StorageError> {
        let m = Models {
            db: Arc::new(Handle(RwLock::new(Arc::new(open_db(cfg)?)))),
            cfg: cfg.clone(),
        };
        m.prepare()?;
        Ok(m)
    }

    fn prepare(&self) -> Result<(), StorageError> {
        let txn = self.begin()?;
        framework::prepare(txn.raw()?, &all())?;
        txn.commit()
    }

    fn db(&self) -> Arc<Database> {
        self.db.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The store for one request's reads (held only that long: [`Models::reopen`] replaces
    /// the file under it). The models' views read it through [`ModelsRead::snapshot`].
    pub fn read(&self) -> ModelsRead {
        ModelsRead(self.db())
    }

    /// A transaction that commits without a sync.
    pub fn begin(&self) -> Result<ModelsTxn, StorageError> {
        let mut txn = self.db().begin_write().map_err(StorageError::of)?;
        txn.set_durability(Durability::None)
            .map_err(StorageError::of)?;
        Ok(ModelsTxn::of(Inner::Redb(txn)))
    }

    /// A write transaction whose commit is synced: a rebuild's (its chunks are few and large,
    /// and a generation half built before a crash is then found and dropped at the next
    /// start rather than silently lost with the unsynced commits).
    pub(crate) fn begin_synced(&self) -> Result<WriteTransaction, StorageError> {
        self.db().begin_write().map_err(StorageError::of)
    }

    /// Make every commit so far durable.
    pub fn persist(&self) -> Result<(), StorageError> {
        let txn = self.db().begin_write().map_err(StorageError::of)?;
        txn.commit().map_err(StorageError::of)
    }

    /// Open the file again after a failure of it (redb refuses every call after an I/O
    /// error): the store goes back to its last synced commit and folds forward from there.
    pub fn reopen(&self) -> Result<(), StorageError> {
        let mut g = self.db.0.write().unwrap_or_else(|p| p.into_inner());
        // Readers still holding the old handle finish with errors; it wrote nothing since
        // its failure, so dropping it later writes nothing either.
        *g = Arc::new(open_db(&self.cfg)?);
        drop(g);
        self.prepare()
    }

    /// The lowest checkpoint of the read models.
    pub fn checkpoint(&self) -> Result<u64, StorageError> {
        framework::checkpoint(&self.read(), &all())
    }

    /// Fold the committed events of `log` past the models' checkpoint up to `upto`, at most
    /// `max` of them, into `txn` (a redb transaction committed by the caller, or the
    /// decider's overlay); the lowest checkpoint after. `chunk` is read only where it does not
    /// already hold those events.
    pub fn fold(
        txn: &mut ModelsTxn,
        log: &impl EventLog,
        upto: u64,
        max: u64,
        chunk: &mut EventChunk,
    ) -> Result<u64, framework::FoldError> {
        match &mut txn.inner {
            Inner::Redb(t) => framework::catch_up(TxMut::Redb(t), &all(), log, upto, max, chunk),
            Inner::Mem(m) => {
                let at = framework::catch_up(TxMut::Mem(m), &all(), log, upto, max, chunk)?;
                m.folded(at);
                Ok(at)
            }
        }
    }

    /// The models as the decider folds and decides on them: in memory over the file as it
    /// stands now ([`Overlay`]), written into it by [`Models::write`].
    pub fn overlay(&self) -> Result<ModelsTxn, StorageError> {
        let mut o = Overlay::new(self.db().begin_read().map_err(StorageError::of)?);
        let mut at = u64::MAX;
        for p in all() {
            at = at.min(Src::Mem(&o).meta(p.name())?.unwrap_or_default().checkpoint);
        }
        o.start_at(if at == u64::MAX { 0 } else { at });
        Ok(ModelsTxn::of(Inner::Mem(o)))
    }

    /// Write a frozen layer of the overlay into the file, in a transaction that commits
    /// without a sync (the decider's writer thread); nothing when it is stale.
    pub fn write(&self, layer: &Layer) -> Result<Applied, StorageError> {
        let txn = self.begin()?;
        let Inner::Redb(t) = &txn.inner else {
            unreachable!("begin answers a redb transaction")
        };
        match layer.apply(t)? {
            Applied::Written => {
                txn.commit()?;
                Ok(Applied::Written)
            }
            // Dropped uncommitted: nothing of it is written.
            Applied::Stale => Ok(Applied::Stale),
        }
    }

    /// The overlay `txn` learns that the writer wrote its oldest `n` frozen layers: it reads
    /// them from the file from now on.
    pub fn written(&self, txn: &mut ModelsTxn, n: usize) -> Result<(), StorageError> {
        if let Inner::Mem(m) = &mut txn.inner {
            m.written(n, self.db().begin_read().map_err(StorageError::of)?);
        }
        Ok(())
    }

    /// Every projection's snapshot at what it has folded, written in `txn` (a compaction's
    /// first half: [`crate::framework::snapshot`]).
    pub fn snapshot_all(txn: &ModelsTxn) -> Result<(), StorageError> {
        let txn = txn.raw()?;
        for p in all() {
            framework::snapshot(txn, p)?;
        }
        Ok(())
    }

    /// Fold up to the head of `log`, in transactions of at most `batch` events (tests, tools
    /// and the start); the checkpoint reached.
    pub fn follow(&self, log: &impl EventLog, batch: u64) -> Result<u64, StorageError> {
        let mut chunk = EventChunk::default();
        loop {
            let mut txn = self.begin()?;
            let at = Models::fold(&mut txn, log, log.head(), batch, &mut chunk)?;
            txn.commit()?;
            if at >= log.head() {
                return Ok(at);
            }
        }
    }
}

static TASKS: tasks::Tasks = tasks::Tasks;
static NOTIFICATIONS: notifications::Notifications = notifications::Notifications;
static SETTINGS: settings::Settings = settings::Settings;
static DELIVERIES: deliveries::Deliveries = deliveries::Deliveries;
static CURSORS: cursors::Cursors = cursors::Cursors;
static BRIDGES: bridges::Bridges = bridges::Bridges;
static SOURCES: sources::Sources = sources::Sources;
static LISTS: lists::Lists = lists::Lists;
static ROUTES: routes::Routes = routes::Routes;
static TENANTS: tenants::Tenants = tenants::Tenants;

/// Every projection, in the order they are applied.
pub fn all() -> Vec<&'static dyn Projection> {
    vec![
        &TASKS,
        &NOTIFICATIONS,
        &SETTINGS,
        &DELIVERIES,
        &CURSORS,
        &BRIDGES,
        &SOURCES,
        &LISTS,
        &ROUTES,
        &TENANTS,
    ]
}

/// A projection by name.
pub fn by_name(name: &str) -> Option<&'static dyn Projection> {
    all().into_iter().find(|p| p.name() == name)
}

#[derive(Debug, Clone, Serialize)]
/// A projection as operators see it: its generation, checkpoint, lag behind the head,
/// digest and count of changes.
pub struct ProjectionInfo {
    pub name: String,
    pub generation: u32,
    pub checkpoint: u64,
    pub lag: u64,
    pub digest: String,
    pub changes: u64,
}

/// Every projection's [`ProjectionInfo`], read in one transaction, with its lag behind `head`.
pub fn projections(db: &ModelsRead, head: u64) -> Result<Vec<ProjectionInfo>, StorageError> {
    let snap = db.snapshot()?;
    all()
        .iter()
        .map(|p| {
            let m = snap.src().meta(p.name())?.unwrap_or_default();
            Ok(ProjectionInfo {
                name: p.name().to_owned(),
                generation: m.generation,
                checkpoint: m.checkpoint,
                lag: head.saturating_sub(m.checkpoint),
                digest: hex::encode(m.digest),
                changes: m.changes,
            })
        })
        .collect()
}

/// Whether table `name` of a log file is a read model's (the layout before the models store
/// had a file of its own): what [`migrate`] moves out.
pub fn is_model_table(name: &str) -> bool {
    model_table(name).is_some()
}

/// Whether `name` is a table of the read models (in the layout where they lived in the log's
/// file), and whether it is keyed by u64 (the digest chains).
fn model_table(name: &str) -> Option<bool> {
    if name == "projections" || name == "projection_snapshots" {
        return Some(false);
    }
    let digests = name.starts_with("p.") && name.contains(".digests.g")
        || name.starts_with("s.") && name.ends_with(".digests");
    (name.starts_with("p.") || name.starts_with("s.")).then_some(digests)
}

fn copy<K: redb::Key + 'static>(
    from: &redb::ReadTransaction,
    to: &WriteTransaction,
    name: &str,
) -> Result<u64, StorageError>
where
    for<'a> K::SelfType<'a>: std::borrow::Borrow<K::SelfType<'a>>,
{
    use redb::{ReadableTable, TableDefinition};
    let def: TableDefinition<K, &[u8]> = TableDefinition::new(name);
    let src = from.open_table(def).map_err(StorageError::of)?;
    let mut dst = to.open_table(def).map_err(StorageError::of)?;
    let mut n = 0;
    for row in src.iter().map_err(StorageError::of)? {
        let (k, v) = row.map_err(StorageError::of)?;
        dst.insert(k.value(), v.value()).map_err(StorageError::of)?;
        n += 1;
    }
    Ok(n)
}

/// Move the read models out of the log's file (`log_path`, the layout before the models store)
/// into the models store of `cfg`, once, before the log is opened: their tables are copied
/// as they are — digests, checkpoints and snapshots included, so a compacted log keeps its
/// models — into a new file that is renamed into place only once complete, and then dropped
/// from the log's file. A data directory without them, or already moved, is left alone; an
/// interrupted move is finished at the next open.
///
/// The log's file held by another process, or one this process may not read, is said as such
/// (`OpenError::Locked`, `OpenError::File`): neither is damage, and neither may be answered
/// with advice to restore a backup (I10).
pub fn migrate(log_path: &Path, cfg: &ModelsConfig) -> Result<(), tidemark_log::OpenError> {
    use tidemark_log::OpenError;
    if !log_path.exists() {
        return Ok(());
    }
    let path = log_path.to_owned();
    let log_db = match Database::open(log_path) {
        Ok(db) => db,
        Err(redb::DatabaseError::DatabaseAlreadyOpen) => return Err(OpenError::Locked { path }),
        Err(redb::DatabaseError::Storage(redb::StorageError::Io(source))) => {
            return Err(OpenError::File { path, source });
        }
        Err(e) => {
            return Err(OpenError::Storage(StorageError::new(
                format!("moving the read models out of {}: open", log_path.display()),
                e,
            )));
        }
    };
    migrate_from(log_db, log_path, cfg).map_err(OpenError::Storage)
}

fn migrate_from(log_db: Database, log_path: &Path, cfg: &ModelsConfig) -> Result<(), StorageError> {
    use redb::{ReadableDatabase, TableDefinition, TableHandle};
    let ctx = |what: &str| {
        format!(
            "moving the read models out of {}: {what}",
            log_path.display()
        )
    };
    let names: Vec<(String, bool)> = {
        let r = log_db.begin_read().map_err(StorageError::of)?;
        r.list_tables()
            .map_err(StorageError::of)?
            .filter_map(|h| model_table(h.name()).map(|d| (h.name().to_owned(), d)))
            .collect()
    };
    if names.is_empty() {
        return Ok(());
    }
    if !cfg.path.exists() {
        let tmp = cfg.path.with_extension("redb.migrating");
        let _ = std::fs::remove_file(&tmp);
        let models = Database::create(&tmp).map_err(|e| StorageError::new(ctx("create"), e))?;
        let r = log_db.begin_read().map_err(StorageError::of)?;
        let w = models.begin_write().map_err(StorageError::of)?;
        let mut rows = 0;
        for (name, digests) in &names {
            rows += if *digests {
                copy::<u64>(&r, &w, name)?
            } else if name.starts_with("p.") || name.starts_with("s.") {
                copy::<&[u8]>(&r, &w, name)?
            } else {
                copy::<&str>(&r, &w, name)?
            };
        }
        w.commit().map_err(StorageError::of)?;
        drop(models);
        std::fs::rename(&tmp, &cfg.path).map_err(|e| StorageError::new(ctx("rename"), e))?;
        tracing::warn!(
            tables = names.len(),
            rows,
            to = %cfg.path.display(),
            "moved the read models out of the log's file into their own store"
        );
    }
    let w = log_db.begin_write().map_err(StorageError::of)?;
    for (name, digests) in &names {
        let done = if *digests {
            w.delete_table(TableDefinition::<u64, &[u8]>::new(name))
        } else if name.starts_with("p.") || name.starts_with("s.") {
            w.delete_table(TableDefinition::<&[u8], &[u8]>::new(name))
        } else {
            w.delete_table(TableDefinition::<&str, &[u8]>::new(name))
        };
        done.map_err(StorageError::of)?;
    }
    w.commit().map_err(StorageError::of)?;
    Ok(())
}
