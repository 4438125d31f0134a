//! The tasks model's queries (served from [`crate::read`]).

use tidemark_log::StorageError;

use crate::framework::paged::{ListOrder, Order, Page, Position, Walk, paged};
use crate::ids::TaskId;
use crate::names::TaskStatus;
use crate::tasks::{self, Task};

pub fn task(
    db: &crate::framework::ModelsRead,
    task_id: &TaskId,
) -> Result<Option<Task>, StorageError> {
    db.reader()?
        .get_val(tasks::NAME, tasks::ROWS, task_id.as_str().as_bytes())
}

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

/// Tasks ordered by id or newest first, filtered.
pub fn tasks(
    db: &crate::framework::ModelsRead,
    f: &TaskFilter,
) -> Result<Page<Task>, StorageError> {
    let r = db.reader()?;
    let limit = f.limit.max(1);
    let Some(rows) = r.table(tasks::NAME, tasks::ROWS)? else {
        return Ok((Vec::new(), None));
    };
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
    paged(&r, tasks::NAME, &rows, walk, limit, keep)
}

impl From<&Task> for Position {
    fn from(t: &Task) -> Self {
        Position {
            key: tasks::created_key(t),
            id: t.task_id.clone(),
        }
    }
}
