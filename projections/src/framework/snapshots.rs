//! Projection snapshots (spec section 13).

use redb::{ReadableTable, TableDefinition, TableHandle, WriteTransaction};
use tidemark_log::StorageError;

use super::runtime::meta_in;
use super::{Bytes, DIGESTS, Meta, Projection, read_meta, table_name};

/// Projection snapshots (spec section 13): before the log drops a prefix, every projection's
/// tables (and its digest chain) are copied as they stand at the head, so a rebuild can start
/// from there instead of from the first event. One snapshot per projection, replaced each time.
const SNAPSHOTS: TableDefinition<&str, &[u8]> = TableDefinition::new("projection_snapshots");

fn snap_table(proj: &str, table: &str) -> String {
    format!("s.{proj}.{table}")
}

/// Replace table `to` with a copy of `from` (both `K → &[u8]`); a missing `from` leaves `to`
/// empty.
fn copy_table<K: redb::Key + 'static>(
    txn: &WriteTransaction,
    from: &str,
    to: &str,
) -> Result<(), StorageError>
where
    for<'a> K::SelfType<'a>: std::borrow::Borrow<K::SelfType<'a>>,
{
    let to_def: TableDefinition<K, &[u8]> = TableDefinition::new(to);
    match txn.delete_table(to_def) {
        Ok(_) | Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(StorageError::of(e)),
    }
    let exists = txn
        .list_tables()
        .map_err(StorageError::of)?
        .any(|h| h.name() == from);
    let mut dst = txn.open_table(to_def).map_err(StorageError::of)?;
    if !exists {
        return Ok(());
    }
    let from_def: TableDefinition<K, &[u8]> = TableDefinition::new(from);
    let src = txn.open_table(from_def).map_err(StorageError::of)?;
    for row in src.iter().map_err(StorageError::of)? {
        let (k, v) = row.map_err(StorageError::of)?;
        dst.insert(k.value(), v.value()).map_err(StorageError::of)?;
    }
    Ok(())
}

/// Copy `p`'s live tables and digest chain as its snapshot; answers the snapshot's meta.
pub(crate) fn snapshot(txn: &WriteTransaction, p: &dyn Projection) -> Result<Meta, StorageError> {
    let name = p.name();
    let live = read_meta(txn, name)?;
    for t in p.tables() {
        copy_table::<Bytes>(
            txn,
            &table_name(name, t, live.generation),
            &snap_table(name, t),
        )?;
    }
    copy_table::<u64>(
        txn,
        &table_name(name, DIGESTS, live.generation),
        &snap_table(name, DIGESTS),
    )?;
    let mut m = txn.open_table(SNAPSHOTS).map_err(StorageError::of)?;
    let b = postcard::to_stdvec(&live).map_err(StorageError::of)?;
    m.insert(name, b.as_slice()).map_err(StorageError::of)?;
    Ok(live)
}

/// The meta of `name`'s snapshot, if it has one.
pub(crate) fn snapshot_meta(
    txn: &WriteTransaction,
    name: &str,
) -> Result<Option<Meta>, StorageError> {
    meta_in(txn, SNAPSHOTS, name)
}

/// Start generation `generation` of `p` as a copy of its snapshot; answers the meta to go on
/// from (its checkpoint is the snapshot's seq), or `None` when it has no snapshot.
pub(crate) fn restore_snapshot(
    txn: &WriteTransaction,
    p: &dyn Projection,
    generation: u32,
) -> Result<Option<Meta>, StorageError> {
    let name = p.name();
    let Some(snap) = snapshot_meta(txn, name)? else {
        return Ok(None);
    };
    for t in p.tables() {
        copy_table::<Bytes>(txn, &snap_table(name, t), &table_name(name, t, generation))?;
    }
    copy_table::<u64>(
        txn,
        &snap_table(name, DIGESTS),
        &table_name(name, DIGESTS, generation),
    )?;
    Ok(Some(Meta { generation, ..snap }))
}
