//! What the replica takes, in stream order, from two sources: the batches this node published
//! (handed over on their publish acknowledgement, already parsed and canonical) and the
//! follower's messages (what other nodes published). A run that arrives before the runs
//! under it waits here; whoever finds the next run ready writes it (and every ready run after
//! it) to the replica on its own task, so an append whose batch is next is written by the
//! appender itself, with no hop to another thread.

use crate::EventLog;
use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::embedded::Log;
use crate::envelope::NewEvent;
use crate::error::StorageError;

/// Consecutive events of the stream, recorded at one time (an atomic batch, or one event).
pub(super) struct Run {
    pub events: Vec<NewEvent>,
    pub at_us: i64,
}

pub(super) struct Feed {
    replica: Log,
    state: Mutex<State>,
}

struct State {
    /// The next seq the replica is to take: every seq under it is in the replica or being
    /// written to it.
    next: u64,
    /// Runs waiting for the ones under them, by first seq.
    waiting: BTreeMap<u64, Run>,
    /// Someone is writing ready runs to the replica (and will look for more when done).
    writing: bool,
    /// A write failed: nothing more is taken until the follower starts again ([`Feed::restart`]).
    broken: bool,
}

impl Feed {
    pub fn new(replica: Log) -> Feed {
        let next = replica.head() + 1;
        Feed {
            replica,
            state: Mutex::new(State {
                next,
                waiting: BTreeMap::new(),
                writing: false,
                broken: false,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `seq` is in the replica, being written or waiting here: the follower skips such
    /// a message without reading its body.
    pub fn holds(&self, seq: u64) -> bool {
        let st = self.state();
        seq < st.next
            || st
                .waiting
                .range(..=seq)
                .next_back()
                .is_some_and(|(first, run)| seq < first + run.events.len() as u64)
    }

    /// Start again from the replica's head (the follower, after a failure), once no write is
    /// under way: what waited is dropped (its appenders time out; their clients retry and
    /// meet their events as duplicates) and the follower brings everything in again.
    pub async fn restart(&self) -> u64 {
        loop {
            {
                let mut st = self.state();
                if !st.writing {
                    st.next = self.replica.head() + 1;
                    st.waiting.clear();
                    st.broken = false;
                    return st.next;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// Take the run at `first` (ignored when the replica already holds it or it waits here
    /// already), then write every run that is ready unless someone else is writing.
    pub async fn offer(&self, first: u64, run: Run) -> Result<(), StorageError> {
        {
            let mut st = self.state();
            if st.broken {
                return Err("the replica's feed stopped after a failed write".into());
            }
            if first < st.next || run.events.is_empty() {
                return Ok(());
            }
            st.waiting.entry(first).or_insert(run);
        }
        self.write_ready().await
    }

    async fn write_ready(&self) -> Result<(), StorageError> {
        loop {
            let ready = {
                let mut st = self.state();
                if st.writing || st.broken {
                    return Ok(());
                }
                let ready = take_ready(&mut st);
                if ready.is_empty() {
                    return Ok(());
                }
                st.writing = true;
                ready
            };
            for (first, run) in ready {
                if let Err(e) = self.replica.replicate(run.events, first, run.at_us).await {
                    let mut st = self.state();
                    st.writing = false;
                    st.broken = true;
                    return Err(StorageError::of(e));
                }
            }
            self.state().writing = false;
        }
    }
}

/// The runs that continue the replica's seqs, in order, out of the waiting ones.
fn take_ready(st: &mut State) -> Vec<(u64, Run)> {
    let mut ready = Vec::new();
    // A run starting under `next` overlaps what was taken (a follower's partial batch after a
    // restart): what it adds is taken from the stream again, so it is dropped.
    while let Some(entry) = st.waiting.first_entry() {
        let first = *entry.key();
        if first > st.next {
            break;
        }
        let run = entry.remove();
        if first < st.next {
            continue;
        }
        st.next = first + run.events.len() as u64;
        ready.push((first, run));
    }
    ready
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(i: u64) -> NewEvent {
        NewEvent::new(
            Some(format!("e{i}")),
            "s",
            "x",
            "t",
            &serde_json::json!({"i": i}),
        )
        .unwrap()
    }

    fn run(seqs: std::ops::Range<u64>) -> Run {
        Run {
            events: seqs.map(ev).collect(),
            at_us: 1,
        }
    }

    fn state(next: u64) -> State {
        State {
            next,
            waiting: BTreeMap::new(),
            writing: false,
            broken: false,
        }
    }

    #[test]
    fn only_runs_that_continue_the_replica_are_ready() {
        let mut st = state(1);
        st.waiting.insert(3, run(3..5));
        assert!(take_ready(&mut st).is_empty());
        st.waiting.insert(1, run(1..3));
        let ready: Vec<u64> = take_ready(&mut st).into_iter().map(|(f, _)| f).collect();
        assert_eq!(ready, vec![1, 3]);
        assert_eq!(st.next, 5);
        st.waiting.insert(6, run(6..7));
        assert!(take_ready(&mut st).is_empty());
        assert_eq!(st.waiting.len(), 1);
    }
}
