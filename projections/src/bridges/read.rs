//! The bridge subscriptions model's queries (served from [`crate::read`]).

use tidemark_log::StorageError;

use redb::ReadableTable;

use crate::ids::{BridgeId, SubscriptionId};
use crate::read::under;

/// A subscription (active or deleted).
pub fn subscription(
    db: &crate::models::ModelsRead,
    id: &SubscriptionId,
) -> Result<Option<crate::bridges::Subscription>, StorageError> {
    use crate::bridges;
    db.reader()?
        .get_val(bridges::NAME, bridges::ROWS, id.as_str().as_bytes())
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
    let r = db.reader()?;
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

/// The health and circuit of webhook subscription `id` (`None`: no POST or switch yet).
pub fn bridge_endpoint(
    db: &crate::models::ModelsRead,
    id: &SubscriptionId,
) -> Result<Option<crate::endpoints::Endpoint>, StorageError> {
    use crate::bridges;
    db.reader()?
        .get_val(bridges::NAME, bridges::ENDPOINTS, id.as_str().as_bytes())
}

/// Every active webhook subscription's endpoint (a record with no POST for one without), by
/// subscription id.
pub fn bridge_endpoints(
    db: &crate::models::ModelsRead,
) -> Result<Vec<crate::endpoints::Endpoint>, StorageError> {
    let mut out = Vec::new();
    for s in all_active_subscriptions(db)? {
        if !s.target.sink.is_webhook() {
            continue;
        }
        let e = bridge_endpoint(db, &s.subscription_id)?.unwrap_or_else(|| {
            crate::endpoints::Endpoint::new(
                &crate::names::ids::bridge_endpoint(s.subscription_id.as_str()),
                Some(crate::names::Sink::Webhook),
            )
        });
        out.push(e);
    }
    out.sort_by(|a, b| a.route.cmp(&b.route));
    Ok(out)
}
