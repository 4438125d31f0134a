//! Projection snapshots (spec section 13).

use redb::{ReadableTable, TableDefinition, TableHandle, WriteTransaction};
use tidemark_log::StorageError;

use super::runtime::meta_in;
use super::{Bytes, DIGESTS, Meta, Projection, read_meta, table_name, tenant_table_name};

/// Projection snapshots (spec section 13): before the log drops a prefix, every projection's
/// tables (and its digest chain) are copied as they stand at the head, so a rebuild can start
/// from there instead of from the first event. One snapshot per projection, replaced each time.
const SNAPSHOTS: TableDefinition<&str, &[u8]> = TableDefinition::new("projection_snapshots");

fn snap_table(tenant: Option<&str>, proj: &str, table: &str) -> String {
    match tenant {
        None => format!("s.{proj}.{table}"),
        Some(t) => format!("s.{proj}@{t}.{table}"),
    }
}

/// The tenants other than the default with a table named `<head><tenant>.` (`head`:
/// `p.<proj>@` for the live tables, `s.<proj>@` for the snapshot's).
fn tenants_under(txn: &WriteTransaction, head: &str) -> Result<Vec<String>, StorageError> {
    let mut out: Vec<String> = txn
        .list_tables()
        .map_err(StorageError::of)?
        .filter_map(|h| {
            let rest = h.name().strip_prefix(head)?;
            Some(rest.split_once('.')?.0.to_owned())
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Delete the snapshot tables of tenants other than the default (a snapshot replaces them).
fn drop_tenant_snapshots(txn: &WriteTransaction, p: &dyn Projection) -> Result<(), StorageError> {
    let name = p.name();
    for t in tenants_under(txn, &format!("s.{name}@"))? {
        for table in p.tables() {
            let snap = snap_table(Some(&t), name, table);
            let def: TableDefinition<Bytes, Bytes> = TableDefinition::new(&snap);
            match txn.delete_table(def) {
                Ok(_) | Err(redb::TableError::TableDoesNotExist(_)) => {}
                Err(e) => return Err(StorageError::of(e)),
            }
        }
    }
    Ok(())
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
    drop_tenant_snapshots(txn, p)?;
    let tenants = tenants_under(txn, &format!("p.{name}@"))?;
    for tenant in std::iter::once(None).chain(tenants.iter().map(|t| Some(t.as_str()))) {
        for t in p.tables() {
            copy_table::<Bytes>(
                txn,
                &tenant_table_name(tenant, name, t, live.generation),
                &snap_table(tenant, name, t),
            )?;
        }
    }
    copy_table::<u64>(
        txn,
        &table_name(name, DIGESTS, live.generation),
        &snap_table(None, name, DIGESTS),
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
    let tenants = tenants_under(txn, &format!("s.{name}@"))?;
    for tenant in std::iter::once(None).chain(tenants.iter().map(|t| Some(t.as_str()))) {
        for t in p.tables() {
            copy_table::<Bytes>(
                txn,
                &snap_table(tenant, name, t),
                &tenant_table_name(tenant, name, t, generation),
            )?;
        }
    }
    copy_table::<u64>(
        txn,
        &snap_table(None, name, DIGESTS),
        &table_name(name, DIGESTS, generation),
    )?;
    Ok(Some(Meta { generation, ..snap }))
}
