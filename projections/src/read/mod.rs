//! The projections' own metas, as operators read them ([`projections`]). Each model's queries
//! live with the model, which owns its keys (`tasks::read`, `notifications::read`,
//! `deliveries::read`, and its view; the cursors and bridges models answer through their
//! views alone); the lists' paging is the framework's (`framework::paged`).

pub use crate::framework::paged::{ListOrder, Page, Position};

use serde::Serialize;
use tidemark_log::StorageError;

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
    db: &crate::framework::ModelsRead,
    head: u64,
) -> Result<Vec<ProjectionInfo>, StorageError> {
    let snap = db.snapshot()?;
    crate::models::all()
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
