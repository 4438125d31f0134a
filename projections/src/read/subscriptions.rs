//! The cursors' and bridge subscriptions' queries.

use tidemark_log::StorageError;

use redb::ReadableTable;

use super::under;
use crate::framework::Reader;
use crate::ids::{BridgeId, SubscriptionId};

/// One cursor, or its zero state.
pub fn cursor(
    db: &crate::models::ModelsRead,
    consumer_id: &str,
    stream_name: &str,
    subject_id: &str,
) -> Result<crate::cursors::Cursor, StorageError> {
    use crate::cursors;
    Ok(Reader::new(db)?
        .get_val(
            cursors::NAME,
            cursors::ROWS,
            &cursors::key(consumer_id, stream_name, subject_id),
        )?
        .unwrap_or_else(|| cursors::Cursor::zero(consumer_id, stream_name, subject_id)))
}

/// Cursors whose key starts with `consumer_id` (all of that consumer's), or every cursor
/// when `None`; at most `limit`, after the key `after` (paging).
pub fn cursors(
    db: &crate::models::ModelsRead,
    consumer_id: Option<&str>,
    limit: usize,
) -> Result<Vec<crate::cursors::Cursor>, StorageError> {
    use crate::cursors;
    let r = Reader::new(db)?;
    let Some(t) = r.table(cursors::NAME, cursors::ROWS)? else {
        return Ok(Vec::new());
    };
    let (from, to) = match consumer_id {
        Some(c) => {
            let mut from = c.as_bytes().to_vec();
            from.push(0);
            let mut to = c.as_bytes().to_vec();
            to.push(1);
            (from, Some(to))
        }
        None => (Vec::new(), None),
    };
    let mut out = Vec::new();
    let range = match &to {
        Some(to) => t.range(from.as_slice()..to.as_slice()),
        None => t.range(from.as_slice()..),
    }
    .map_err(StorageError::of)?;
    for row in range {
        let (_, v) = row.map_err(StorageError::of)?;
        out.push(postcard::from_bytes(v.value()).map_err(StorageError::of)?);
        if out.len() >= limit {
            break;
        }
    }
    Ok(out)
}

/// A subscription (active or deleted).
pub fn subscription(
    db: &crate::models::ModelsRead,
    id: &SubscriptionId,
) -> Result<Option<crate::bridges::Subscription>, StorageError> {
    use crate::bridges;
    Reader::new(db)?.get_val(bridges::NAME, bridges::ROWS, id.as_str().as_bytes())
}

/// Active subscriptions whose index key starts with `prefix ‖ 0` in `index` (`by_task`,
/// `by_bridge`) for any of `prefixes`, or every active one when `prefixes` is `None`; one read
/// transaction for all of them (the bridge notifier asks for every task of a commit at once).
fn active_subscriptions(
    db: &crate::models::ModelsRead,
    index: &'static str,
    prefixes: Option<&[&str]>,
) -> Result<Vec<crate::bridges::Subscription>, StorageError> {
    use crate::bridges;
    let r = Reader::new(db)?;
    let (Some(idx), Some(rows)) = (
        r.table(bridges::NAME, index)?,
        r.table(bridges::NAME, bridges::ROWS)?,
    ) else {
        return Ok(Vec::new());
    };
    let mut ids = Vec::new();
    match prefixes {
        Some(prefixes) => {
            if redb::ReadableTableMetadata::is_empty(&idx).map_err(StorageError::of)? {
                return Ok(Vec::new());
            }
            for p in prefixes {
                let (from, to) = under(p);
                for row in idx
                    .range(from.as_slice()..to.as_slice())
                    .map_err(StorageError::of)?
                {
                    let (k, _) = row.map_err(StorageError::of)?;
                    ids.push(k.value()[from.len()..].to_vec());
                }
            }
        }
        None => {
            for row in idx.iter().map_err(StorageError::of)? {
                let (k, _) = row.map_err(StorageError::of)?;
                ids.push(k.value().to_vec());
            }
        }
    }
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(v) = rows.get(id.as_slice()).map_err(StorageError::of)? {
            out.push(postcard::from_bytes(v.value()).map_err(StorageError::of)?);
        }
    }
    Ok(out)
}

/// The active subscriptions of these tasks.
pub fn task_subscriptions(
    db: &crate::models::ModelsRead,
    task_ids: &[&str],
) -> Result<Vec<crate::bridges::Subscription>, StorageError> {
    active_subscriptions(db, crate::bridges::BY_TASK, Some(task_ids))
}

pub fn bridge_subscriptions(
    db: &crate::models::ModelsRead,
    bridge_id: &BridgeId,
) -> Result<Vec<crate::bridges::Subscription>, StorageError> {
    active_subscriptions(db, crate::bridges::BY_BRIDGE, Some(&[bridge_id.as_str()]))
}

pub fn all_active_subscriptions(
    db: &crate::models::ModelsRead,
) -> Result<Vec<crate::bridges::Subscription>, StorageError> {
    active_subscriptions(db, crate::bridges::ACTIVE, None)
}
