//! Following the log from a checkpoint: the loop every reactor runs.

use std::future::Future;

use tidemark_engine::Engine;
use tidemark_log::{Event, EventLog, ReadQuery};
use tokio_util::sync::CancellationToken;

/// Read pages of `query` after `after`, hand each page's events to `handle` (with the page's
/// redb read done off the async workers by `prepare`), and wait for the next commit when caught
/// up. A commit is only a nudge: the log is read again every time. Returns when `shutdown` is
/// cancelled or `handle` answers `false`.
pub(crate) async fn follow<P, T, H, Fut>(
    engine: &Engine,
    mut after: u64,
    query: ReadQuery,
    shutdown: &CancellationToken,
    prepare: P,
    mut handle: H,
) -> Result<(), String>
where
    P: Fn(&Engine, Vec<Event>) -> Result<T, String> + Clone + Send + 'static,
    T: Send + 'static,
    H: FnMut(T) -> Fut,
    Fut: Future<Output = bool>,
{
    let mut head_rx = engine.log().subscribe();
    loop {
        head_rx.borrow_and_update();
        let e = engine.clone();
        let q = ReadQuery {
            after,
            ..query.clone()
        };
        let prep = prepare.clone();
        let (prepared, next_after, head) = tokio::task::spawn_blocking(move || {
            let page = e.log().read(&q).map_err(|e| e.to_string())?;
            let prepared = prep(&e, page.events)?;
            Ok::<_, String>((prepared, page.next_after, page.head))
        })
        .await
        .map_err(|e| e.to_string())??;
        if !handle(prepared).await {
            return Ok(());
        }
        after = next_after;
        if after < head {
            continue;
        }
        tokio::select! {
            changed = head_rx.changed() => if changed.is_err() { return Ok(()) },
            _ = shutdown.cancelled() => return Ok(()),
        }
    }
}
