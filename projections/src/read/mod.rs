//! What the models' queries share: the paged index-join the task, notification and delivery
//! lists walk ([`paged`]), and the projections' own metas. Each model's queries live with the
//! model, which owns its keys (`tasks::read`, `notifications::read`, `deliveries::read`,
//! and its view; the cursors and bridges models answer through their views alone).

pub(crate) mod paged;

pub use paged::{ListOrder, Page, Position};

use serde::Serialize;
use tidemark_log::StorageError;

use crate::framework::be_u64;

#[derive(Debug, Clone, Serialize)]
pub struct ProjectionInfo {
    pub name: String,
    pub generation: u32,
    pub checkpoint: u64,
    pub lag: u64,
    pub digest: String,
    pub changes: u64,
}

pub fn projections(
    db: &crate::models::ModelsRead,
    head: u64,
) -> Result<Vec<ProjectionInfo>, StorageError> {
    let r = db.reader()?;
    crate::all()
        .iter()
        .map(|p| {
            let m = r.meta(p.name())?;
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

/// A big-endian u64 a projection keeps under `key` (a checkpoint), 0 when absent.
pub(crate) fn stored_u64(
    db: &crate::models::ModelsRead,
    proj: &str,
    table: &str,
    key: &[u8],
) -> Result<u64, StorageError> {
    let r = db.reader()?;
    let Some(t) = r.table(proj, table)? else {
        return Ok(0);
    };
    Ok(t.get(key)
        .map_err(StorageError::of)?
        .and_then(|v| be_u64(v.value()))
        .unwrap_or(0))
}
