//! The tasks read model, with the review gate of every run.
//!
//! Status follows the task's current run: `running` when a run starts, its outcome when it
//! ends (`completed`, `failed`, `canceled`), `awaiting_review` while a completed run waits for
//! an approval (the task requires review or a review was requested for the run). A rejected
//! review reopens the task (`open`), or keeps it `running` when the rejection continues the
//! run. `task.canceled` makes the task `canceled` for good. Events about other runs update
//! those runs only; events that arrive out of order (a completion for a run never started) are
//! recorded, never refused: the log is the truth. A run that ends (or is approved) without
//! having started is a mismatch (spec section 6): its end is recorded on the run, and the
//! task's status does not follow it.

pub mod read;

use crate::names::{EventType, LIFECYCLE_PREFIX, ReviewState, Stream, TaskStatus};
use std::borrow::Cow;
use tidemark_log::StorageError;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidemark_log::EventRef;

use crate::framework::{Fold, Store};

pub const NAME: &str = "tasks";
pub const ROWS: &str = "rows";
pub const BY_STATUS: &str = "by_status";
pub(crate) const BY_PROJECT: &str = "by_project";
/// `created_key ‖ task_id` (the key big-endian, see [`created_key`]): the newest-first list of
/// `GET /v1/tasks?order=newest`. Added after the golden release, so it is written outside the
/// digest (`Store::put_index`).
pub const BY_CREATED: &str = "by_created";

/// Review state of one run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReviewGate {
    /// The task required review when the run started.
    pub required: bool,
    /// A `task.run_review_requested` was seen for the run.
    pub requested: bool,
    pub state: ReviewState,
    pub reviewer: Option<String>,
    pub reason: Option<String>,
    /// A rejection that continues the run is in force.
    pub continuation: bool,
    /// Seq of the event that last changed the review state.
    pub decided_seq: u64,
}

impl ReviewGate {
    /// The run's final event is its approval, not its completion.
    pub fn gated(&self, task_requires_review: bool) -> bool {
        task_requires_review || self.required || self.requested
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    pub run_id: String,
    /// running, completed, failed, canceled.
    pub outcome: String,
    pub error: Option<String>,
    pub review: ReviewGate,
    pub started_seq: u64,
    pub ended_seq: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    pub task_id: String,
    pub project_id: Option<String>,
    pub title: Option<String>,
    /// open, running, awaiting_review, completed, failed, canceled.
    pub status: TaskStatus,
    pub current_run_id: Option<String>,
    pub review_required: bool,
    /// Set by `task.canceled` only.
    pub canceled: bool,
    pub cancel_reason: Option<String>,
    pub runs: Vec<Run>,
    /// Highest seq of any event whose subject is this task.
    pub latest_event_seq: u64,
    pub created_seq: u64,
    /// Time of the last event, microseconds since the epoch (from the event, never the clock).
    pub updated_at_us: i64,
    /// What later releases added, at its default for a row that does not use it (so such a
    /// row keeps the bytes, and the digest, it had before: [`crate::trailing`]).
    #[serde(default, with = "crate::trailing")]
    pub ext: TaskExt,
}

crate::framework::postcard_row!(Task);

/// The fields a task row gained after the golden release (see [`Task::ext`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskExt {
    /// Runs first named by an event other than their `task.run_started` (a completion, a
    /// review request, ...), each with the seq of its first `task.run_started` once one comes
    /// (0: none yet). A run not listed here started at its `started_seq`.
    pub late_starts: Vec<(String, u64)>,
}

impl Task {
    pub(crate) fn new(task_id: &str) -> Task {
        Task {
            task_id: task_id.to_owned(),
            project_id: None,
            title: None,
            status: TaskStatus::Open,
            current_run_id: None,
            review_required: false,
            canceled: false,
            cancel_reason: None,
            runs: Vec::new(),
            latest_event_seq: 0,
            created_seq: 0,
            updated_at_us: 0,
            ext: TaskExt::default(),
        }
    }

    pub fn run(&self, run_id: &str) -> Option<&Run> {
        self.runs.iter().find(|r| r.run_id == run_id)
    }

    /// The seq of run `run_id`'s first `task.run_started`, if it has one.
    pub fn run_started_seq(&self, run_id: &str) -> Option<u64> {
        let run = self.run(run_id)?;
        match self.ext.late_starts.iter().find(|(r, _)| r == run_id) {
            Some((_, 0)) => None,
            Some((_, s)) => Some(*s),
            None => Some(run.started_seq),
        }
    }

    /// Run `run_id`, made on its first mention; `starts`: the event at `seq` is its
    /// `task.run_started`.
    fn run_mut(&mut self, run_id: &str, seq: u64, starts: bool) -> &mut Run {
        if let Some(i) = self.runs.iter().position(|r| r.run_id == run_id) {
            if starts
                && let Some(late) = self
                    .ext
                    .late_starts
                    .iter_mut()
                    .find(|(r, s)| r == run_id && *s == 0)
            {
                late.1 = seq;
            }
            return &mut self.runs[i];
        }
        if !starts {
            self.ext.late_starts.push((run_id.to_owned(), 0));
        }
        let required = self.review_required;
        self.runs.push(Run {
            run_id: run_id.to_owned(),
            outcome: "running".into(),
            error: None,
            review: ReviewGate {
                required,
                state: ReviewState::None,
                ..ReviewGate::default()
            },
            started_seq: seq,
            ended_seq: 0,
        });
        if self.current_run_id.is_none() {
            self.current_run_id = Some(run_id.to_owned());
        }
        self.runs.last_mut().expect("pushed above")
    }

    fn is_current(&self, run_id: &str) -> bool {
        self.current_run_id.as_deref() == Some(run_id)
    }

    fn set_status(&mut self, s: TaskStatus) {
        if !self.canceled {
            self.status = s;
        }
    }
}

/// The payload fields the tasks model reads, borrowed from the event where possible (a
/// `Value` tree per event was a large share of a rebuild's allocations).
#[derive(Debug, Default, Deserialize)]
struct Payload<'a> {
    #[serde(borrow)]
    run_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    project_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    title: Option<Cow<'a, str>>,
    review_required: Option<Value>,
    #[serde(borrow)]
    error: Option<Cow<'a, str>>,
    #[serde(borrow)]
    reviewer: Option<Cow<'a, str>>,
    #[serde(borrow)]
    reason: Option<Cow<'a, str>>,
    continuation: Option<Value>,
}

fn owned(v: &Option<Cow<'_, str>>) -> Option<String> {
    v.as_deref().map(str::to_owned)
}

/// Fold one lifecycle event into a task (the pure core, also used by tests).
pub fn fold_task(task: &mut Task, ev: &EventRef<'_>) {
    // Fields of another JSON type than the schema's are read as absent, as before.
    let p: Payload<'_> = serde_json::from_str(ev.payload).unwrap_or_default();
    let seq = ev.seq;
    task.latest_event_seq = task.latest_event_seq.max(seq);
    task.updated_at_us = ev.time_us;
    // Borrowed from the payload: a run id is copied only into a run or `current_run_id`
    // that changes.
    let run_id: &str = p.run_id.as_deref().unwrap_or("");
    let Some(ty) = EventType::parse(ev.event_type) else {
        return;
    };
    use EventType as T;
    match ty {
        T::TaskCreated => {
            if task.created_seq == 0 {
                task.created_seq = seq;
            }
            task.project_id = owned(&p.project_id).or(task.project_id.take());
            if let Some(t) = owned(&p.title) {
                task.title = Some(t);
            }
            task.review_required = p
                .review_required
                .as_ref()
                .and_then(Value::as_bool)
                .unwrap_or(false);
        }
        T::TaskRunStarted if !run_id.is_empty() => {
            task.run_mut(run_id, seq, true);
            if !task.is_current(run_id) {
                task.current_run_id = Some(run_id.to_owned());
            }
            task.set_status(TaskStatus::Running);
        }
        T::TaskRunCompleted | T::TaskRunFailed | T::TaskRunCanceled if !run_id.is_empty() => {
            let outcome = match ty {
                T::TaskRunCompleted => TaskStatus::Completed,
                T::TaskRunFailed => TaskStatus::Failed,
                _ => TaskStatus::Canceled,
            };
            let requires = task.review_required;
            // A run that never started did not end either (spec section 6: a mismatch, with
            // no outcome): its end is recorded on the run, the task's status stays.
            let started = task.run_started_seq(run_id).is_some();
            let run = task.run_mut(run_id, seq, false);
            run.outcome = outcome.into();
            run.ended_seq = seq;
            run.review.continuation = false;
            if outcome == TaskStatus::Failed {
                run.error = owned(&p.error);
            }
            let awaiting = outcome == TaskStatus::Completed
                && run.review.gated(requires)
                && run.review.state != ReviewState::Approved;
            if started && task.is_current(run_id) {
                task.set_status(if awaiting {
                    TaskStatus::AwaitingReview
                } else {
                    outcome
                });
            }
        }
        T::TaskRunReviewRequested if !run_id.is_empty() => {
            let run = task.run_mut(run_id, seq, false);
            run.review.requested = true;
            run.review.state = ReviewState::Pending;
            run.review.decided_seq = seq;
            if task.is_current(run_id) {
                task.set_status(TaskStatus::AwaitingReview);
            }
        }
        T::TaskRunReviewApproved if !run_id.is_empty() => {
            let started = task.run_started_seq(run_id).is_some();
            let run = task.run_mut(run_id, seq, false);
            run.review.state = ReviewState::Approved;
            run.review.reviewer = owned(&p.reviewer);
            run.review.continuation = false;
            run.review.decided_seq = seq;
            if started && task.is_current(run_id) {
                task.set_status(TaskStatus::Completed);
            }
        }
        T::TaskRunReviewRejected if !run_id.is_empty() => {
            let continuation = p
                .continuation
                .as_ref()
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let run = task.run_mut(run_id, seq, false);
            run.review.state = ReviewState::Rejected;
            run.review.reviewer = owned(&p.reviewer);
            run.review.reason = owned(&p.reason);
            run.review.continuation = continuation;
            run.review.decided_seq = seq;
            if continuation {
                run.outcome = "running".into();
            }
            if task.is_current(run_id) {
                task.set_status(if continuation {
                    TaskStatus::Running
                } else {
                    TaskStatus::Open
                });
            }
        }
        T::TaskCanceled => {
            task.set_status(TaskStatus::Canceled);
            task.canceled = true;
            task.cancel_reason = owned(&p.reason);
        }
        _ => {}
    }
}

/// The seq a task is ordered by in newest-first lists: its `task.created`, or, for a task whose
/// lifecycle began without one, the first event of its first run (0 when it has neither).
pub fn created_key(t: &Task) -> u64 {
    match t.created_seq {
        0 => t.runs.first().map_or(0, |r| r.started_seq),
        seq => seq,
    }
}

/// The `by_created` row of a task.
fn created_row(t: &Task) -> Vec<u8> {
    crate::framework::created_row(created_key(t), &t.task_id)
}

pub(crate) fn index_key(a: &str, task_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(a.len() + task_id.len() + 1);
    k.extend_from_slice(a.as_bytes());
    k.push(0);
    k.extend_from_slice(task_id.as_bytes());
    k
}

crate::framework::txn_view! {
    /// The tasks model inside a models transaction (commands decide on it at the head).
    NAME
}

impl View<'_> {
    /// Task `id`.
    pub fn row(&self, id: &str) -> Result<Option<Task>, StorageError> {
        self.t.get_val(ROWS, id.as_bytes())
    }

    /// The ids of the tasks in `status`, in id order.
    pub fn with_status(&self, status: TaskStatus) -> Result<Vec<String>, StorageError> {
        self.t.suffixes(BY_STATUS, status.as_str())
    }
}

pub struct Tasks;

impl Fold for Tasks {
    const NAME: &'static str = NAME;
    const TABLES: &'static [&'static str] = &[ROWS, BY_STATUS, BY_PROJECT, BY_CREATED];
    /// 2: [`TaskExt::late_starts`] (the bridge decision's `run_not_started`); 3: the
    /// `by_created` index (outside the digest); 4: a run that ended without having started
    /// leaves the task's status as it was. An older model is rebuilt from the log at the next
    /// open, which fills them.
    const VERSION: u32 = 4;

    fn apply(&self, st: &mut Store<'_>, ev: &EventRef<'_>) -> Result<(), StorageError> {
        if Stream::parse(ev.stream) == Some(Stream::Retention)
            && EventType::parse(ev.event_type) == Some(EventType::RetentionPurged)
        {
            let p = crate::retention::Purged::parse(ev.payload);
            for id in &p.tasks {
                let Some(task) = st.take_row::<Task>(ROWS, id.as_bytes())? else {
                    continue;
                };
                if task.latest_event_seq > p.through_seq {
                    st.put_row(ROWS, id.as_bytes(), task)?;
                    continue;
                }
                st.delete(ROWS, id.as_bytes())?;
                st.delete_index(BY_CREATED, &created_row(&task));
                st.delete(BY_STATUS, &index_key(task.status.as_str(), id))?;
                if let Some(project) = &task.project_id {
                    st.delete(BY_PROJECT, &index_key(project, id))?;
                }
            }
            return Ok(());
        }
        // The delivery runtime's own streams name deliveries and consumers, never tasks: no
        // lookup for them (they are most of the writes of a busy outbox).
        if ev.subject.is_empty()
            || Stream::parse(ev.stream) == Some(Stream::Deliveries)
            || Stream::parse(ev.stream) == Some(Stream::Cursors)
        {
            return Ok(());
        }
        let lifecycle = Stream::parse(ev.stream) == Some(Stream::TaskEvents)
            && ev.event_type.starts_with(LIFECYCLE_PREFIX);
        let existing: Option<Task> = st.take_row(ROWS, ev.subject.as_bytes())?;
        let is_new = existing.is_none();
        let mut task = match (existing, lifecycle) {
            (Some(t), _) => t,
            (None, true) => Task::new(ev.subject),
            // Not a task (yet): nothing to record.
            (None, false) => return Ok(()),
        };
        // Only `task.created` moves a task to another project: the project is copied for the
        // index update then only.
        let before_status = task.status;
        let before_created = (!is_new).then(|| created_key(&task));
        let before_project = (EventType::parse(ev.event_type) == Some(EventType::TaskCreated)
            || is_new)
            .then(|| task.project_id.clone());
        if lifecycle {
            fold_task(&mut task, ev);
        } else {
            task.latest_event_seq = task.latest_event_seq.max(ev.seq);
        }
        if is_new || before_status != task.status {
            if !is_new {
                st.delete(BY_STATUS, &index_key(before_status.as_str(), &task.task_id))?;
            }
            st.put(
                BY_STATUS,
                &index_key(task.status.as_str(), &task.task_id),
                &[],
            )?;
        }
        if let Some(before_project) = before_project
            && before_project != task.project_id
        {
            if let Some(old) = &before_project {
                st.delete(BY_PROJECT, &index_key(old, &task.task_id))?;
            }
            if let Some(new) = &task.project_id {
                st.put(BY_PROJECT, &index_key(new, &task.task_id), &[])?;
            }
        }
        if before_created != Some(created_key(&task)) {
            if let Some(old) = before_created {
                let mut k = created_row(&task);
                k[..8].copy_from_slice(&old.to_be_bytes());
                st.delete_index(BY_CREATED, &k);
            }
            st.put_index(BY_CREATED, &created_row(&task));
        }
        st.put_row(ROWS, ev.subject.as_bytes(), task)
    }
}
