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

/// A commit with nothing for any reactor wakes no one (spec section 3: a round wakes only who
/// has work): the decider passes it over as it hands it on, and the follower, woken later by
/// a commit some reactor wants, passes over the quiet range as one empty page without reading
/// the log. A hold (a pull long-poll waiting for the notifier's look) wakes it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_no_one_wants_wakes_no_one() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, _) = Engine::open(&LogConfig::new(dir.path().join("log.redb"))).unwrap();
    let flagged = |e: &tidemark_log::EventRef<'_>| e.event_type == "comment.flagged";
    engine
        .pages()
        .set_interest(Box::new(move |evs| evs.iter().any(flagged)));
    let mut f = Follower::new(engine.clone());
    let mut feed = f.subscribe_if(0, Box::new(move |p| p.any(flagged)));
    let seen = Arc::new(std::sync::Mutex::new(Vec::<(u64, u64, usize)>::new()));
    let s = seen.clone();
    f.observe(Box::new(move |p| {
        s.lock().unwrap().push((p.after, p.upto, p.events.len()));
    }));
    let stop = CancellationToken::new();
    let follower = tokio::spawn(f.run(stop.clone()));
    // The steady state: until the decider's first look at the head (a moment after the
    // engine opens, longer on a loaded machine) the follower waits on the log itself.
    let t0 = std::time::Instant::now();
    while !engine.pages().keeping_up() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(30),
            "the decider never kept up"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;

    for i in 0..5 {
        append(&engine, 1, &format!("quiet{i}")).await;
    }
    // Nothing to wait for: give a wrong wake-up every chance to happen.
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    assert_eq!(
        *seen.lock().unwrap(),
        vec![],
        "the follower was woken for commits no reactor wants"
    );

    let flag = NewEvent::new(None, "comments", "x", "comment.flagged", &json!({})).unwrap();
    engine.log().append(vec![flag]).await.unwrap();
    let pages = take_until(&mut feed, 6).await;
    assert_eq!(pages.len(), 1);
    assert_eq!((pages[0].after, pages[0].events.len()), (5, 1));
    // The five quiet commits were passed over as one empty page, from the decider's record.
    assert_eq!(*seen.lock().unwrap(), vec![(0, 5, 0), (5, 6, 1)]);

    // Held, the follower looks at what was quiet at once.
    append(&engine, 1, "quiet-again").await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(seen.lock().unwrap().len(), 2);
    let held = engine.pages().hold();
    let t0 = std::time::Instant::now();
    while seen.lock().unwrap().len() < 3 {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(30),
            "a hold did not wake the follower"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(seen.lock().unwrap()[2], (6, 7, 0));
    drop(held);
    stop.cancel();
    follower.await.unwrap();
    engine.close().await;
}
