//! The one follower on a real log: every reactor gets every page after the lowest checkpoint,
//! in order and exactly once, as the same shared page (the log was read once for all of
//! them), and pages keep coming as new events commit.

use std::sync::Arc;

use serde_json::json;
use tidemark_consumers::follow::{Feed, Follower, Page};
use tidemark_engine::Engine;
use tidemark_log::{EventLog, LogConfig, NewEvent};
use tokio_util::sync::CancellationToken;

async fn append(engine: &Engine, n: usize, tag: &str) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let batch = chunk
            .iter()
            .map(|i| {
                NewEvent::new(
                    None,
                    "comments",
                    format!("{tag}-{i}"),
                    "comment.added",
                    &json!({}),
                )
                .unwrap()
            })
            .collect();
        engine.log().append(batch).await.unwrap();
    }
}

/// Pages of `feed` until one reaches `upto`.
async fn take_until(feed: &mut Feed, upto: u64) -> Vec<Arc<Page>> {
    let mut out = Vec::new();
    while out.last().is_none_or(|p: &Arc<Page>| p.upto < upto) {
        let p = tokio::time::timeout(std::time::Duration::from_secs(30), feed.recv())
            .await
            .expect("a page within 30 s")
            .expect("the follower is running");
        out.push(p);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reactor_gets_each_page_once_from_one_read() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, _) = Engine::open(&LogConfig::new(dir.path().join("log.redb"))).unwrap();
    append(&engine, 2_500, "a").await;
    let head = engine.head();
    assert_eq!(head, 2_500);

    let mut f = Follower::new(engine.clone());
    let mut feeds = [f.subscribe(1_000), f.subscribe(0), f.subscribe(2_000)];
    let stop = CancellationToken::new();
    let follower = tokio::spawn(f.run(stop.clone()));

    let mut got: Vec<Vec<Arc<Page>>> = Vec::new();
    for feed in &mut feeds {
        got.push(take_until(feed, head).await);
    }
    // From the lowest checkpoint (0), every seq once and in order, for every reactor.
    for pages in &got {
        let seqs: Vec<u64> = pages
            .iter()
            .flat_map(|p| p.events.iter().map(|e| e.seq))
            .collect();
        assert_eq!(seqs, (1..=head).collect::<Vec<_>>());
    }
    // The same pages, shared: the log was read once for all three.
    for (a, b) in got[0].iter().zip(&got[1]) {
        assert!(
            Arc::ptr_eq(a, b),
            "reactors got different reads of the same page"
        );
    }
    assert_eq!(got[0].len(), got[2].len());

    // Live: new commits reach every reactor.
    append(&engine, 10, "b").await;
    for feed in &mut feeds {
        let pages = take_until(feed, head + 10).await;
        let seqs: Vec<u64> = pages
            .iter()
            .flat_map(|p| p.events.iter().map(|e| e.seq))
            .collect();
        assert_eq!(seqs, (head + 1..=head + 10).collect::<Vec<_>>());
    }
    stop.cancel();
    follower.await.unwrap();
    engine.close().await;
}

/// A compaction that overtook the follower (a retention run at start compacts a prefix the
/// follower has not read yet) does not stop it: it goes on from the first event the log keeps,
/// where it used to retry the read of a compacted seq for ever and every reactor stood still.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_past_the_follower_does_not_stop_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = LogConfig::new(dir.path().join("log.redb"));
    cfg.merge_threshold = 100;
    let (engine, _) = Engine::open(&cfg).unwrap();
    append(&engine, 2_500, "a").await;
    // The cut never passes what redb's index tables cover: wait for the merges.
    let mut first = 1;
    for _ in 0..100 {
        let c = engine.log().compact(2_000).await.unwrap();
        first = c.first_seq;
        if first > 1_000 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(first > 1_000, "compacted only to {first}");
    let mut f = Follower::new(engine.clone());
    let mut feed = f.subscribe(0);
    let stop = CancellationToken::new();
    let follower = tokio::spawn(f.run(stop.clone()));
    let pages = take_until(&mut feed, 2_500).await;
    let seqs: Vec<u64> = pages
        .iter()
        .flat_map(|p| p.events.iter().map(|e| e.seq))
        .collect();
    assert_eq!(seqs, (first..=2_500).collect::<Vec<_>>());
    append(&engine, 10, "b").await;
    let pages = take_until(&mut feed, 2_510).await;
    assert_eq!(pages.last().unwrap().upto, 2_510);
    stop.cancel();
    follower.await.unwrap();
    engine.close().await;
}

/// A reactor that stopped (its feed dropped) does not stop the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_reactor_does_not_stop_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, _) = Engine::open(&LogConfig::new(dir.path().join("log.redb"))).unwrap();
    append(&engine, 5, "a").await;
    let mut f = Follower::new(engine.clone());
    let gone = f.subscribe(0);
    let mut live = f.subscribe(0);
    drop(gone);
    let stop = CancellationToken::new();
    let follower = tokio::spawn(f.run(stop.clone()));
    take_until(&mut live, 5).await;
    append(&engine, 5, "b").await;
    take_until(&mut live, 10).await;
    stop.cancel();
    follower.await.unwrap();
    engine.close().await;
}
