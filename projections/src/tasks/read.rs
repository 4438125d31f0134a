//! The tasks model's list: [`View::page`].

use tidemark_log::StorageError;

use crate::framework::paged::{ListOrder, Order, Page, Position, Walk, paged};
use crate::names::TaskStatus;
use crate::tasks::{self, Task, View};

#[derive(Debug, Clone, Default)]
pub struct TaskFilter {
    pub status: Option<TaskStatus>,
    pub project_id: Option<String>,
    /// Only tasks whose id sorts after this one (bytewise): the cursor of `ListOrder::Id`.
    pub after: Option<String>,
    /// Only tasks created before this position: the cursor of `ListOrder::Newest`.
    pub before: Option<Position>,
    pub order: ListOrder,
    pub limit: usize,
}

impl View<'_> {
    /// Tasks ordered by id or newest first, filtered.
    pub fn page(&self, f: &TaskFilter) -> Result<Page<Task>, StorageError> {
        let limit = f.limit.max(1);
        let keep = |t: &Task| {
            f.status.is_none_or(|s| s == t.status)
                && f.project_id
                    .as_deref()
                    .is_none_or(|p| t.project_id.as_deref() == Some(p))
                && f.after.as_deref().is_none_or(|a| t.task_id.as_str() > a)
                && f.before
                    .as_ref()
                    .is_none_or(|b| b.follows(tasks::created_key(t), &t.task_id))
        };
        let walk = if f.order == ListOrder::Newest {
            Walk::Newest {
                index: tasks::BY_CREATED,
                lower: Vec::new(),
                upper: f.before.as_ref().map(Position::index_key),
            }
        } else {
            Walk::ByKey {
                filters: vec![
                    (tasks::BY_PROJECT, f.project_id.as_deref()),
                    (tasks::BY_STATUS, f.status.map(TaskStatus::as_str)),
                ],
                from: f.after.as_deref().map(str::as_bytes),
                order: Order::Asc,
            }
        };
        paged(&self.t, tasks::ROWS, walk, limit, keep)
    }
}

impl From<&Task> for Position {
    fn from(t: &Task) -> Self {
        Position {
            key: tasks::created_key(t),
            id: t.task_id.clone(),
        }
    }
}
