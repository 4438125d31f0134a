//! The models in memory ahead of their redb file (spec section 3: the models store follows the
//! reply). The decider folds committed events into layers of rows kept in memory and decides
//! its commands on them; a thread of its own writes each frozen layer into redb after the
//! replies, batched, as the log's indexer writes the log's. A read goes through the layers,
//! newest first, and then to a read transaction of the file ([`Overlay`]); a layer is dropped
//! once the file has it and a newer read transaction is taken.
//!
//! Everything in a layer is derived from the log: a layer lost (a crash, a failed write) is
//! folded again from the log, from the file's checkpoint. A layer folded on a state the file
//! no longer has (a rebuild swapped a generation, or folded the live models further in a
//! transaction of its own) is refused as stale ([`Layer::apply`]) rather than written over it;
//! the decider then folds again from the file.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;

use redb::{
    AccessGuard, ReadOnlyTable, ReadTransaction, ReadableTable, TableDefinition, TableHandle,
};
use tidemark_log::StorageError;

use super::{Bytes, META, Meta};

/// One table's rows in a layer: `None` deletes.
pub(crate) type Rows = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

/// The key and value types of a table of the models store, by its name: the overlay keeps
/// every key and value as bytes (a `&str` as its UTF-8, a u64 big-endian: both sort as redb
/// sorts them) and writes each table as its type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bytes,
    StrBytes,
    StrU64,
    BytesU64,
    U64Bytes,
}

/// The name of the table of the subjects' last seqs ([`crate::framework::subjects`]; named here, where
/// every table's types are).
pub(crate) const SUBJECT_LAST_TABLE: &str = "subject_last";
/// The name of the models store's own bookkeeping table ([`crate::framework::subjects`]).
pub(crate) const MODELS_META_TABLE: &str = "models_meta";

fn kind(name: &str) -> Kind {
    match name {
        "projections" | "projection_snapshots" => Kind::StrBytes,
        MODELS_META_TABLE => Kind::StrU64,
        SUBJECT_LAST_TABLE => Kind::BytesU64,
        n if n.starts_with("p.") && n.contains(".digests.g") => Kind::U64Bytes,
        _ => Kind::Bytes,
    }
}

pub(super) fn u64_of(b: &[u8]) -> Result<u64, StorageError> {
    super::be_u64(b).ok_or_else(|| StorageError::msg("a u64 of the overlay is not 8 bytes"))
}

/// Writes of the models not yet in the file, per table (by its full name).
#[derive(Default)]
pub struct Layer {
    tables: HashMap<String, Rows>,
    /// The seq the models reflect with this layer written.
    upto: u64,
    /// Events folded into it.
    events: u64,
}

/// What writing a layer into the file came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    Written,
    /// Folded on a state the file no longer has: nothing was written.
    Stale,
}

impl Layer {
    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }

    /// The seq the models reflect with this layer written.
    pub fn upto(&self) -> u64 {
        self.upto
    }

    /// Events folded into it.
    pub fn events(&self) -> u64 {
        self.events
    }

    pub(crate) fn put(&mut self, name: &str, key: &[u8], value: Option<&[u8]>) {
        let t = match self.tables.get_mut(name) {
            Some(t) => t,
            None => self.tables.entry(name.to_owned()).or_default(),
        };
        match t.get_mut(key) {
            Some(Some(v)) if value.is_some() => {
                v.clear();
                v.extend_from_slice(value.expect("matched"));
            }
            Some(slot) => *slot = value.map(<[u8]>::to_vec),
            None => {
                t.insert(key.to_vec(), value.map(<[u8]>::to_vec));
            }
        }
    }

    /// Every row of `rows` into table `name` (a fold's staged writes).
    pub(crate) fn put_all(
        &mut self,
        name: &str,
        rows: impl IntoIterator<Item = (Vec<u8>, Option<Vec<u8>>)>,
    ) {
        let t = match self.tables.get_mut(name) {
            Some(t) => t,
            None => self.tables.entry(name.to_owned()).or_default(),
        };
        t.extend(rows);
    }

    fn rows(&self, name: &str) -> Option<&Rows> {
        self.tables.get(name)
    }

    /// Write the layer into `txn` (the writer's half), unless it was folded on a state the
    /// file no longer has: a projection's generation there is not the one the layer wrote
    /// rows of, or the file reflects the log further than the layer (another transaction
    /// folded the live models meanwhile, a rebuild's).
    pub(crate) fn apply(&self, txn: &redb::WriteTransaction) -> Result<Applied, StorageError> {
        if let Some(metas) = self.tables.get(META.name()) {
            let t = txn.open_table(META).map_err(StorageError::of)?;
            for (name, new) in metas {
                let (Ok(name), Some(new)) = (std::str::from_utf8(name), new) else {
                    continue;
                };
                let new: Meta = postcard::from_bytes(new).map_err(StorageError::of)?;
                if let Some(old) = t.get(name).map_err(StorageError::of)? {
                    let old: Meta = postcard::from_bytes(old.value()).map_err(StorageError::of)?;
                    if old.generation != new.generation || old.checkpoint > new.checkpoint {
                        return Ok(Applied::Stale);
                    }
                }
            }
        }
        let mut names: Vec<&String> = self.tables.keys().collect();
        names.sort_unstable();
        for name in names {
            let rows = &self.tables[name];
            match kind(name) {
                Kind::Bytes => {
                    let mut t = txn
                        .open_table(TableDefinition::<Bytes, Bytes>::new(name))
                        .map_err(StorageError::of)?;
                    for (k, v) in rows {
                        match v {
                            Some(v) => t.insert(k.as_slice(), v.as_slice()).map(drop),
                            None => t.remove(k.as_slice()).map(drop),
                        }
                        .map_err(StorageError::of)?;
                    }
                }
                Kind::StrBytes => {
                    let mut t = txn
                        .open_table(TableDefinition::<&str, Bytes>::new(name))
                        .map_err(StorageError::of)?;
                    for (k, v) in rows {
                        let k = std::str::from_utf8(k).map_err(StorageError::of)?;
                        match v {
                            Some(v) => t.insert(k, v.as_slice()).map(drop),
                            None => t.remove(k).map(drop),
                        }
                        .map_err(StorageError::of)?;
                    }
                }
                Kind::StrU64 => {
                    let mut t = txn
                        .open_table(TableDefinition::<&str, u64>::new(name))
                        .map_err(StorageError::of)?;
                    for (k, v) in rows {
                        let k = std::str::from_utf8(k).map_err(StorageError::of)?;
                        match v {
                            Some(v) => t.insert(k, u64_of(v)?).map(drop),
                            None => t.remove(k).map(drop),
                        }
                        .map_err(StorageError::of)?;
                    }
                }
                Kind::BytesU64 => {
                    let mut t = txn
                        .open_table(TableDefinition::<Bytes, u64>::new(name))
                        .map_err(StorageError::of)?;
                    for (k, v) in rows {
                        match v {
                            Some(v) => t.insert(k.as_slice(), u64_of(v)?).map(drop),
                            None => t.remove(k.as_slice()).map(drop),
                        }
                        .map_err(StorageError::of)?;
                    }
                }
                Kind::U64Bytes => {
                    let mut t = txn
                        .open_table(TableDefinition::<u64, Bytes>::new(name))
                        .map_err(StorageError::of)?;
                    for (k, v) in rows {
                        let k = u64_of(k)?;
                        match v {
                            Some(v) => t.insert(k, v.as_slice()).map(drop),
                            None => t.remove(k).map(drop),
                        }
                        .map_err(StorageError::of)?;
                    }
                }
            }
        }
        Ok(Applied::Written)
    }
}

/// A value read through the overlay: a row of a layer, or of the file.
pub enum Val<'a> {
    Ref(&'a [u8]),
    Guard(AccessGuard<'a, Bytes>),
}

impl Val<'_> {
    pub fn value(&self) -> &[u8] {
        match self {
            Val::Ref(b) => b,
            Val::Guard(g) => g.value(),
        }
    }
}

/// A table of the file as a read transaction has it, opened once per transaction.
type FileTable = Arc<ReadOnlyTable<Bytes, Bytes>>;

/// The models as the decider sees them: the file as of a read transaction, under the layers
/// handed to the writer and not yet known written (`frozen`, oldest first), under the layer
/// being folded (`active`).
pub struct Overlay {
    /// The seq the overlay reflects (what is folded).
    at: u64,
    snap: ReadTransaction,
    tables: std::cell::RefCell<HashMap<String, Option<FileTable>>>,
    frozen: VecDeque<Arc<Layer>>,
    active: Layer,
}

impl Overlay {
    pub(crate) fn new(snap: ReadTransaction) -> Overlay {
        Overlay {
            at: 0,
            snap,
            tables: Default::default(),
            frozen: VecDeque::new(),
            active: Layer::default(),
        }
    }

    /// The layers, newest first.
    fn layers(&self) -> impl Iterator<Item = &Layer> {
        std::iter::once(&self.active).chain(self.frozen.iter().rev().map(|l| &**l))
    }

    /// The layer being folded into.
    pub(crate) fn active(&mut self) -> &mut Layer {
        &mut self.active
    }

    /// Events folded into the active layer.
    pub fn events(&self) -> u64 {
        self.active.events
    }

    /// The seq the file reflects as this overlay is begun over it.
    pub(crate) fn start_at(&mut self, at: u64) {
        self.at = at;
    }

    /// The seq the overlay reflects (what is folded).
    pub fn at(&self) -> u64 {
        self.at
    }

    /// Folded up to `upto`.
    pub(crate) fn folded(&mut self, upto: u64) {
        self.active.events += upto.saturating_sub(self.at);
        self.at = self.at.max(upto);
        self.active.upto = self.at;
    }

    /// Freeze the active layer for the writer (it is read through until
    /// [`Overlay::written`]); `None` when it holds nothing.
    pub fn freeze(&mut self) -> Option<Arc<Layer>> {
        if self.active.is_empty() {
            return None;
        }
        let l = Arc::new(std::mem::take(&mut self.active));
        self.frozen.push_back(l.clone());
        Some(l)
    }

    /// The writer wrote the oldest `n` frozen layers: they are read from the file from now
    /// on, through `snap`, a read transaction begun after they were committed.
    pub fn written(&mut self, n: usize, snap: ReadTransaction) {
        for _ in 0..n.min(self.frozen.len()) {
            self.frozen.pop_front();
        }
        self.snap = snap;
        self.tables.borrow_mut().clear();
    }

    fn file_table(
        &self,
        name: &str,
    ) -> Result<Option<Arc<ReadOnlyTable<Bytes, Bytes>>>, StorageError> {
        if let Some(t) = self.tables.borrow().get(name) {
            return Ok(t.clone());
        }
        let def: TableDefinition<Bytes, Bytes> = TableDefinition::new(name);
        let t = match self.snap.open_table(def) {
            Ok(t) => Some(Arc::new(t)),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(StorageError::of(e)),
        };
        self.tables.borrow_mut().insert(name.to_owned(), t.clone());
        Ok(t)
    }

    /// The row `key` of table `name` (a bytes-keyed, bytes-valued table).
    pub(crate) fn get(&self, name: &str, key: &[u8]) -> Result<Option<Val<'_>>, StorageError> {
        for l in self.layers() {
            if let Some(v) = l.rows(name).and_then(|t| t.get(key)) {
                return Ok(v.as_deref().map(Val::Ref));
            }
        }
        let Some(t) = self.file_table(name)? else {
            return Ok(None);
        };
        Ok(t.get(key).map_err(StorageError::of)?.map(Val::Guard))
    }

    /// The row `key` of table `name`, of any key and value type (encoded as the layers keep
    /// them): the metas and the subjects' seqs.
    pub(crate) fn get_typed(
        &self,
        name: &str,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, StorageError> {
        for l in self.layers() {
            if let Some(v) = l.rows(name).and_then(|t| t.get(key)) {
                return Ok(v.clone());
            }
        }
        let open = |e: redb::TableError| match e {
            redb::TableError::TableDoesNotExist(_) => Ok(None),
            e => Err(StorageError::of(e)),
        };
        match kind(name) {
            Kind::Bytes => Ok(self.get(name, key)?.map(|v| v.value().to_vec())),
            Kind::StrBytes => {
                let k = std::str::from_utf8(key).map_err(StorageError::of)?;
                match self
                    .snap
                    .open_table(TableDefinition::<&str, Bytes>::new(name))
                {
                    Ok(t) => Ok(t
                        .get(k)
                        .map_err(StorageError::of)?
                        .map(|v| v.value().to_vec())),
                    Err(e) => open(e),
                }
            }
            Kind::StrU64 => {
                let k = std::str::from_utf8(key).map_err(StorageError::of)?;
                match self
                    .snap
                    .open_table(TableDefinition::<&str, u64>::new(name))
                {
                    Ok(t) => Ok(t
                        .get(k)
                        .map_err(StorageError::of)?
                        .map(|v| v.value().to_be_bytes().to_vec())),
                    Err(e) => open(e),
                }
            }
            Kind::BytesU64 => match self
                .snap
                .open_table(TableDefinition::<Bytes, u64>::new(name))
            {
                Ok(t) => Ok(t
                    .get(key)
                    .map_err(StorageError::of)?
                    .map(|v| v.value().to_be_bytes().to_vec())),
                Err(e) => open(e),
            },
            Kind::U64Bytes => {
                match self
                    .snap
                    .open_table(TableDefinition::<u64, Bytes>::new(name))
                {
                    Ok(t) => Ok(t
                        .get(u64_of(key)?)
                        .map_err(StorageError::of)?
                        .map(|v| v.value().to_vec())),
                    Err(e) => open(e),
                }
            }
        }
    }

    /// The rows of table `name` within `range`, in key order, every layer over the file.
    pub(crate) fn range(
        &self,
        name: &str,
        range: (Bound<&[u8]>, Bound<&[u8]>),
    ) -> Result<Merge<'_>, StorageError> {
        let file = match self.file_table(name)? {
            Some(t) => Some(t.range::<&[u8]>(range).map_err(StorageError::of)?),
            None => None,
        };
        // Oldest first: the file, the frozen layers, the active one.
        let layers: Vec<_> = self
            .frozen
            .iter()
            .map(|l| &**l)
            .chain(std::iter::once(&self.active))
            .filter_map(|l| l.rows(name))
            .map(|t| t.range::<[u8], _>(range))
            .collect();
        let n = layers.len();
        Ok(Merge {
            file,
            layers,
            front: Heads::new(n),
            back: Heads::new(n),
        })
    }
}

type FileRow = (AccessGuard<'static, Bytes>, AccessGuard<'static, Bytes>);
type LayerRow<'a> = (&'a Vec<u8>, &'a Option<Vec<u8>>);

/// The next row of each source at one end of a [`Merge`].
struct Heads<'a> {
    file: Option<FileRow>,
    layers: Vec<Option<LayerRow<'a>>>,
}

impl Heads<'_> {
    fn new(n: usize) -> Self {
        Heads {
            file: None,
            layers: (0..n).map(|_| None).collect(),
        }
    }
}

/// The rows of one range through the overlay: the file's and every layer's, merged in key
/// order, the newest layer's row for a key winning and a deletion hiding it. Read from one
/// end only (forwards, or backwards): the two ends do not see each other's rows.
pub struct Merge<'a> {
    file: Option<redb::Range<'static, Bytes, Bytes>>,
    layers: Vec<std::collections::btree_map::Range<'a, Vec<u8>, Option<Vec<u8>>>>,
    front: Heads<'a>,
    back: Heads<'a>,
}

impl<'a> Merge<'a> {
    fn step(&mut self, forward: bool) -> Option<Result<(Val<'a>, Val<'a>), redb::StorageError>> {
        loop {
            let heads = if forward {
                &mut self.front
            } else {
                &mut self.back
            };
            if heads.file.is_none()
                && let Some(file) = &mut self.file
            {
                let next = if forward {
                    file.next()
                } else {
                    file.next_back()
                };
                match next {
                    Some(Ok(row)) => heads.file = Some(row),
                    Some(Err(e)) => return Some(Err(e)),
                    None => self.file = None,
                }
            }
            for (i, h) in heads.layers.iter_mut().enumerate() {
                if h.is_none() {
                    *h = if forward {
                        self.layers[i].next()
                    } else {
                        self.layers[i].next_back()
                    };
                }
            }
            // The first key at this end among the sources.
            let better = |a: &[u8], b: &[u8]| if forward { a < b } else { a > b };
            let mut key: Option<&[u8]> = heads.file.as_ref().map(|(k, _)| k.value());
            for (k, _) in heads.layers.iter().flatten() {
                if key.is_none_or(|best| better(k, best)) {
                    key = Some(k.as_slice());
                }
            }
            let key = key?.to_vec();
            // The newest layer holding it wins; every source's row of it is consumed.
            let mut won: Option<LayerRow<'a>> = None;
            for h in &mut heads.layers {
                if h.is_some_and(|(k, _)| *k == key) {
                    won = h.take();
                }
            }
            let file = if heads
                .file
                .as_ref()
                .is_some_and(|(k, _)| k.value() == key.as_slice())
            {
                heads.file.take()
            } else {
                None
            };
            match (won, file) {
                (Some((k, Some(v))), _) => {
                    return Some(Ok((Val::Ref(k.as_slice()), Val::Ref(v.as_slice()))));
                }
                (Some((_, None)), _) => continue,
                (None, Some((k, v))) => return Some(Ok((Val::Guard(k), Val::Guard(v)))),
                (None, None) => return None,
            }
        }
    }
}

impl<'a> Iterator for Merge<'a> {
    type Item = Result<(Val<'a>, Val<'a>), redb::StorageError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.step(true)
    }
}

impl DoubleEndedIterator for Merge<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.step(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use redb::{Database, ReadableDatabase};

    const T: &str = "p.x.rows.g0";

    #[derive(Debug, Clone)]
    enum Op {
        Put(u8, u8),
        Delete(u8),
        /// Freeze the active layer and hand it to the writer.
        Freeze,
        /// The writer writes the oldest frozen layer; the overlay is told.
        Write,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..24, any::<u8>()).prop_map(|(k, v)| Op::Put(k, v)),
            2 => (0u8..24).prop_map(Op::Delete),
            1 => Just(Op::Freeze),
            1 => Just(Op::Write),
        ]
    }

    fn rows(it: Merge<'_>) -> Vec<(Vec<u8>, Vec<u8>)> {
        it.map(|r| {
            let (k, v) = r.unwrap();
            (k.value().to_vec(), v.value().to_vec())
        })
        .collect()
    }

    proptest! {
        /// Whatever is frozen, written or still in memory, the overlay reads as the plain map
        /// of every write: each row, every range forwards, and backwards from any end.
        #[test]
        fn the_overlay_reads_as_every_write_in_order(ops in prop::collection::vec(op(), 1..120)) {
            let dir = tempfile::tempdir().unwrap();
            let db = Database::create(dir.path().join("o.redb")).unwrap();
            let mut o = Overlay::new(db.begin_read().unwrap());
            let mut want: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
            let mut handed: VecDeque<Arc<Layer>> = VecDeque::new();
            for op in ops {
                match op {
                    Op::Put(k, v) => {
                        o.active().put(T, &[k], Some(&[v]));
                        want.insert(vec![k], vec![v]);
                    }
                    Op::Delete(k) => {
                        o.active().put(T, &[k], None);
                        want.remove(&vec![k]);
                    }
                    Op::Freeze => handed.extend(o.freeze()),
                    Op::Write => {
                        if let Some(l) = handed.pop_front() {
                            let w = db.begin_write().unwrap();
                            prop_assert_eq!(l.apply(&w).unwrap(), Applied::Written);
                            w.commit().unwrap();
                            o.written(1, db.begin_read().unwrap());
                        }
                    }
                }
                for k in 0u8..24 {
                    let got = o.get(T, &[k]).unwrap().map(|v| v.value().to_vec());
                    prop_assert_eq!(got, want.get(&vec![k]).cloned());
                }
                let all: Vec<_> = want.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                prop_assert_eq!(rows(o.range(T, (Bound::Unbounded, Bound::Unbounded)).unwrap()), all.clone());
                for lo in [0u8, 5, 12] {
                    let hi = lo + 7;
                    let got = rows(o.range(T, (Bound::Included(&[lo][..]), Bound::Excluded(&[hi][..]))).unwrap());
                    let exp: Vec<_> = all.iter().filter(|(k, _)| k[0] >= lo && k[0] < hi).cloned().collect();
                    prop_assert_eq!(got, exp.clone());
                    let mut back: Vec<_> = o
                        .range(T, (Bound::Included(&[lo][..]), Bound::Excluded(&[hi][..])))
                        .unwrap()
                        .rev()
                        .map(|r| { let (k, v) = r.unwrap(); (k.value().to_vec(), v.value().to_vec()) })
                        .collect();
                    back.reverse();
                    prop_assert_eq!(back, exp);
                }
            }
        }
    }

    /// A layer folded on a generation the file no longer has, or behind what the file has,
    /// writes nothing.
    #[test]
    fn a_stale_layer_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::create(dir.path().join("o.redb")).unwrap();
        let meta = |generation, checkpoint| {
            postcard::to_stdvec(&Meta {
                generation,
                checkpoint,
                ..Meta::default()
            })
            .unwrap()
        };
        let w = db.begin_write().unwrap();
        w.open_table(META)
            .unwrap()
            .insert("x", meta(1, 10).as_slice())
            .unwrap();
        w.commit().unwrap();
        for (generation, checkpoint, applied) in [
            (0, 20, Applied::Stale),
            (1, 5, Applied::Stale),
            (1, 20, Applied::Written),
        ] {
            let mut l = Layer::default();
            l.put("projections", b"x", Some(&meta(generation, checkpoint)));
            l.put(T, b"k", Some(b"v"));
            let w = db.begin_write().unwrap();
            assert_eq!(l.apply(&w).unwrap(), applied);
            let wrote = w
                .open_table(TableDefinition::<Bytes, Bytes>::new(T))
                .unwrap()
                .get(&b"k"[..])
                .unwrap()
                .is_some();
            assert_eq!(wrote, applied == Applied::Written);
        }
    }
}
