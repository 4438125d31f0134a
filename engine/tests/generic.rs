//! The engine is generic over the log (spec section 3): here it runs on a log backend that is
//! not the redb `Log` as the engine knows it — a wrapper that implements `EventLog` by
//! delegating, with the trait's own page-by-page `read_chunk` instead of redb's stored-record
//! copy. The same commands, decider, conditions, read models and rebuilds work on it.

mod common;

use tidemark_engine::Engine;
use tidemark_engine::commands::outbox::{Complete, Route};
use tidemark_log::{
    AppendError, AppendReceipt, Compacted, Condition, Event, EventLog, Log, LogConfig, NewEvent,
    ReadError, ReadPage, ReadQuery, StorageError,
};
use tidemark_projections::ModelsConfig;
use tokio::sync::watch;

use common::{app_claim, requested, rt};

/// Another backend, as far as the engine can tell; its `head()` may be slow to answer (a
/// pause, then the value read), which widens every window between reading the head and acting
/// on it; its reads fail while the flag is set (a log whose storage fails under a read).
#[derive(Clone)]
struct Other(
    Log,
    std::time::Duration,
    std::sync::Arc<std::sync::atomic::AtomicBool>,
);

tidemark_log::lookups_through!(Other, |o| &o.0);

impl EventLog for Other {
    async fn append(&self, events: Vec<NewEvent>) -> Result<AppendReceipt, AppendError> {
        self.0.append(events).await
    }
    async fn append_if(
        &self,
        events: Vec<NewEvent>,
        condition: Condition,
    ) -> Result<AppendReceipt, AppendError> {
        self.0.append_if(events, condition).await
    }
    fn read(&self, q: &ReadQuery) -> Result<ReadPage, ReadError> {
        if self.2.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(ReadError::Storage(StorageError::msg(
                "an injected read failure",
            )));
        }
        self.0.read(q)
    }
    fn get_by_id(&self, tenant: Option<&str>, event_id: &str) -> Result<Option<Event>, ReadError> {
        self.0.get_by_id(tenant, event_id)
    }
    fn head(&self) -> u64 {
        if !self.1.is_zero() {
            std::thread::sleep(self.1);
        }
        self.0.head()
    }
    fn subscribe(&self) -> watch::Receiver<u64> {
        self.0.subscribe()
    }
    async fn close(&self) {
        self.0.close().await;
    }
    async fn compact(&self, through: u64) -> Result<Compacted, AppendError> {
        self.0.compact(through).await
    }
}

/// An engine on [`Other`] (slow by `slow`, failing while `fail` is set) over a fresh log in
/// `dir`.
fn engine_on_other(
    dir: &std::path::Path,
    slow: std::time::Duration,
    fail: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Engine<Other> {
    let (log, _) = Log::open(&LogConfig::in_dir(dir)).unwrap();
    Engine::on_log(Other(log, slow, fail), &ModelsConfig::in_dir(dir)).unwrap()
}

/// What the notifications here ask for: an urgent one to recipient `r`.
fn urgent() -> serde_json::Value {
    serde_json::json!({"priority": "urgent", "title": "t", "recipient": "r"})
}

#[test]
fn the_engine_runs_on_another_event_log() {
    let dir = tempfile::tempdir().unwrap();
    let rt = rt();
    let engine = engine_on_other(dir.path(), Default::default(), Default::default());
    rt.block_on(async {
        let notes: Vec<NewEvent> = (0..30)
            .map(|i| requested(&format!("g-{i}"), &urgent()))
            .collect();
        engine.log().append(notes).await.unwrap();
        let source = common::events_after_on(engine.log(), 0);
        engine.execute(Route { source }).await.unwrap();
        let (leased, _) = engine
            .execute(app_claim("o", 100, 60_000, tidemark_log::Share::ALL))
            .await
            .unwrap();
        assert_eq!(leased.len(), 30, "every app delivery is claimed");
        let items = leased.iter().map(|d| (d.id.clone(), None)).collect();
        let (done, _) = engine
            .execute(Complete {
                owner: "o".into(),
                items,
                resolved_targets: Vec::new(),
            })
            .await
            .unwrap();
        assert_eq!(done.len(), 30);
        for d in &leased {
            let (row, _) = engine.read().delivery(&d.id).unwrap().unwrap();
            assert_eq!(row.status.as_str(), "sent", "{}", d.id);
        }
        for p in tidemark_projections::all() {
            let v = engine
                .rebuild(p.name(), false, |_, _| {})
                .await
                .unwrap()
                .unwrap();
            assert!(v.identical, "{}: {:?}", p.name(), v.first_divergent_seq);
        }
        engine.close().await;
    });
}

/// The decider folds to the head, then sleeps until the head moves: an event committed between
/// the two (here by the log alone, with no command to wake the decider and nothing folded yet
/// to sync later) is folded without waiting for a later commit. A slow `head()` widens that
/// window, and each fresh engine appends at another moment; its read waits for the models to reach the event just appended.
#[test]
fn a_commit_between_the_fold_and_the_wait_is_folded() {
    let rt = rt();
    let slow = std::time::Duration::from_millis(2);
    rt.block_on(async {
        // The append lands at a different moment of the decider's start in each engine.
        for i in 0..40u64 {
            let dir = tempfile::tempdir().unwrap();
            let engine = engine_on_other(dir.path(), slow, Default::default());
            let ev = requested(&format!("w-{i}"), &urgent());
            std::thread::sleep(std::time::Duration::from_micros(i * 250));
            let seq = engine.log().append(vec![ev]).await.unwrap().last_seq;
            let q = engine.read().clone();
            let at = tokio::task::spawn_blocking(move || q.floor(seq))
                .await
                .unwrap();
            match at {
                Ok(at) => assert!(at >= seq, "engine {i}: models at {at}, want {seq}"),
                Err(e) => panic!("engine {i}: seq {seq} never reached the models: {e}"),
            }
            engine.close().await;
        }
    });
}

/// A log read that fails under the decider is the log's failure, not the models': commands
/// are refused with it (`CommandError::Storage`, "storage failure", never "the models store
/// failed"), and once the log reads again they are decided as before, on the same models.
#[test]
fn a_failing_log_read_is_the_logs_failure_not_the_models() {
    use tidemark_engine::CommandError;
    let dir = tempfile::tempdir().unwrap();
    let rt = rt();
    let fail = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let engine = engine_on_other(dir.path(), Default::default(), fail.clone());
    let note = |id: &str| requested(id, &urgent());
    rt.block_on(async {
        engine.log().append(vec![note("a")]).await.unwrap();
        let source = common::events_after_on(engine.log(), 0);
        engine.execute(Route { source }).await.unwrap();
        fail.store(true, std::sync::atomic::Ordering::SeqCst);
        engine.log().append(vec![note("b")]).await.unwrap();
        let claim = || app_claim("o", 100, 60_000, tidemark_log::Share::ALL);
        let e = engine.execute(claim()).await.unwrap_err();
        assert!(matches!(e, CommandError::Storage(_)), "{e:?}");
        assert!(!e.to_string().contains("models"), "{e}");
        assert!(engine.models_poisoned().is_none());
        fail.store(false, std::sync::atomic::Ordering::SeqCst);
        let t0 = std::time::Instant::now();
        let leased = loop {
            match engine.execute(claim()).await {
                Ok((rows, _)) => break rows,
                Err(CommandError::Storage(_)) if t0.elapsed().as_secs() < 30 => {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                Err(e) => panic!("after the log reads again: {e:?}"),
            }
        };
        assert_eq!(
            leased.len(),
            1,
            "the delivery routed before the failure is claimed"
        );
        engine.close().await;
    });
}

/// A fold that reads the log itself (its chunk does not hold the events yet) and fails there
/// names the log, not the models store (`FoldError::Log`); the same fold goes on once the log
/// reads again.
#[test]
fn a_folds_own_log_read_is_the_logs_failure() {
    use tidemark_log::EventChunk;
    use tidemark_projections::Models;
    use tidemark_projections::framework::FoldError;
    let dir = tempfile::tempdir().unwrap();
    let rt = rt();
    let (log, _) = Log::open(&LogConfig::in_dir(dir.path())).unwrap();
    let ev = requested("n", &urgent());
    rt.block_on(log.append(vec![ev])).unwrap();
    let fail = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let other = Other(log, Default::default(), fail.clone());
    let models = Models::open(&ModelsConfig::in_dir(dir.path())).unwrap();
    let mut txn = models.begin().unwrap();
    let mut chunk = EventChunk::default();
    let e = Models::fold(&mut txn, &other, other.head(), 100, &mut chunk).unwrap_err();
    assert!(matches!(e, FoldError::Log(_)), "{e:?}");
    assert!(e.to_string().contains("reading the log"), "{e}");
    fail.store(false, std::sync::atomic::Ordering::SeqCst);
    let at = Models::fold(&mut txn, &other, other.head(), 100, &mut chunk).unwrap();
    assert_eq!(at, other.head());
    txn.commit().unwrap();
    rt.block_on(other.close());
}
