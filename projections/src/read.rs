//! Queries of the read models, for the API. Each takes the log's database and answers from
//! one read transaction.

use serde::Serialize;

use crate::framework::Reader;
use crate::notifications::{self, Notification};
use crate::tasks::{self, Task};

/// Scan budget of list queries: rows examined per call.
const BUDGET: usize = 20_000;

#[derive(Debug, Clone, Serialize)]
pub struct ProjectionInfo {
    pub name: String,
    pub generation: u32,
    pub checkpoint: u64,
    pub lag: u64,
    pub digest: String,
    pub changes: u64,
}

pub fn projections(db: &redb::Database, head: u64) -> Result<Vec<ProjectionInfo>, String> {
    let r = Reader::new(db)?;
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

pub fn task(db: &redb::Database, task_id: &str) -> Result<Option<Task>, String> {
    Reader::new(db)?.get_val(tasks::NAME, tasks::ROWS, task_id.as_bytes())
}

#[derive(Debug, Clone, Default)]
pub struct TaskFilter {
    pub status: Option<String>,
    pub project_id: Option<String>,
    /// Page after this task id (ids are ordered bytewise).
    pub after: Option<String>,
    pub limit: usize,
}

/// Tasks ordered by id, filtered; the second value is the id to continue after, if any.
pub fn tasks(db: &redb::Database, f: &TaskFilter) -> Result<(Vec<Task>, Option<String>), String> {
    let r = Reader::new(db)?;
    let limit = f.limit.max(1);
    let mut out: Vec<Task> = Vec::new();
    let mut examined = 0;
    let full_page = |out: &Vec<Task>| out.len() >= limit;
    // Candidate ids come from the narrowest index available.
    let index = match (&f.project_id, &f.status) {
        (Some(p), _) => Some((tasks::BY_PROJECT, p.clone())),
        (None, Some(s)) => Some((tasks::BY_STATUS, s.clone())),
        (None, None) => None,
    };
    let Some(rows) = r.table(tasks::NAME, tasks::ROWS)? else {
        return Ok((out, None));
    };
    let keep = |t: &Task| {
        f.status.as_deref().is_none_or(|s| s == t.status)
            && f.project_id
                .as_deref()
                .is_none_or(|p| t.project_id.as_deref() == Some(p))
    };
    match index {
        Some((table, value)) => {
            let Some(idx) = r.table(tasks::NAME, table)? else {
                return Ok((out, None));
            };
            let mut start = tasks::index_key(&value, f.after.as_deref().unwrap_or(""));
            if f.after.is_some() {
                start.push(0);
            }
            let mut end = value.as_bytes().to_vec();
            end.push(1);
            for row in idx
                .range(start.as_slice()..end.as_slice())
                .map_err(|e| e.to_string())?
            {
                let (k, _) = row.map_err(|e| e.to_string())?;
                let id = String::from_utf8_lossy(&k.value()[value.len() + 1..]).into_owned();
                examined += 1;
                if let Some(v) = rows.get(id.as_bytes()).map_err(|e| e.to_string())? {
                    let t: Task = postcard::from_bytes(v.value()).map_err(|e| e.to_string())?;
                    if keep(&t) {
                        out.push(t);
                    }
                }
                if full_page(&out) || examined >= BUDGET {
                    return Ok((out, Some(id)));
                }
            }
        }
        None => {
            let after = f.after.clone().unwrap_or_default();
            let mut start = after.as_bytes().to_vec();
            if f.after.is_some() {
                start.push(0);
            }
            for row in rows.range(start.as_slice()..).map_err(|e| e.to_string())? {
                let (k, v) = row.map_err(|e| e.to_string())?;
                let t: Task = postcard::from_bytes(v.value()).map_err(|e| e.to_string())?;
                out.push(t);
                if full_page(&out) {
                    return Ok((out, Some(String::from_utf8_lossy(k.value()).into_owned())));
                }
            }
        }
    }
    Ok((out, None))
}

#[derive(Debug, Clone, Default)]
pub struct NotificationFilter {
    pub priority: Option<String>,
    pub recipient: Option<String>,
    pub before_seq: Option<u64>,
    pub limit: usize,
}

/// Notifications newest first; the second value is the `before_seq` of the next page, if any.
pub fn notifications(
    db: &redb::Database,
    f: &NotificationFilter,
) -> Result<(Vec<Notification>, Option<u64>), String> {
    let r = Reader::new(db)?;
    let mut out = Vec::new();
    let Some(t) = r.table(notifications::NAME, notifications::BY_SEQ)? else {
        return Ok((out, None));
    };
    let end = f.before_seq.unwrap_or(u64::MAX).to_be_bytes();
    let mut examined = 0;
    for row in t.range(..end.as_slice()).map_err(|e| e.to_string())?.rev() {
        let (_, v) = row.map_err(|e| e.to_string())?;
        let n: Notification = postcard::from_bytes(v.value()).map_err(|e| e.to_string())?;
        examined += 1;
        let seq = n.seq;
        if f.priority.as_deref().is_none_or(|p| p == n.priority)
            && f.recipient
                .as_deref()
                .is_none_or(|r| n.recipient.as_deref() == Some(r))
        {
            out.push(n);
        }
        if out.len() >= f.limit.max(1) || examined >= BUDGET {
            return Ok((out, Some(seq)));
        }
    }
    Ok((out, None))
}

/// Highest source seq the router has produced a notification for.
pub fn router_checkpoint(db: &redb::Database) -> Result<u64, String> {
    let r = Reader::new(db)?;
    let Some(t) = r.table(notifications::NAME, notifications::ROUTER)? else {
        return Ok(0);
    };
    Ok(t.get(notifications::ROUTER_KEY)
        .map_err(|e| e.to_string())?
        .and_then(|v| v.value().try_into().ok().map(u64::from_be_bytes))
        .unwrap_or(0))
}

/// The notification settings in force (payload of the last `settings.updated`).
pub fn current_settings(db: &redb::Database) -> Result<Option<serde_json::Value>, String> {
    let r = Reader::new(db)?;
    let Some(t) = r.table(crate::settings::NAME, crate::settings::CURRENT)? else {
        return Ok(None);
    };
    match t.get(crate::settings::KEY).map_err(|e| e.to_string())? {
        Some(v) => serde_json::from_slice(v.value())
            .map(Some)
            .map_err(|e| e.to_string()),
        None => Ok(None),
    }
}
