//! Bounded resources (spec section 8, I8): the number of SSE streams is capped; one more is
//! refused with `429 too_many_streams` and `Retry-After`, and a closed stream frees its place.

use std::time::Duration;

use tidemark_tests::{Server, ServerOpts, assert_problem};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_streams_are_bounded_and_released() {
    let server =
        Server::start(ServerOpts::default().config("[server]\nsse_max_clients = 2\n")).await;
    let api = server.api();
    let first = api
        .sse("after_sequence=0", None)
        .await
        .expect("first stream");
    let second = api
        .task_sse("t-1", "after_sequence=0", None)
        .await
        .expect("second stream");
    let refused = match api.sse("after_sequence=0", None).await {
        Ok(_) => panic!("a third stream must be refused"),
        Err(r) => r,
    };
    assert_problem(&refused, 429, "too_many_streams");
    assert!(
        refused.headers.contains_key(reqwest::header::RETRY_AFTER),
        "429 carries Retry-After: {:?}",
        refused.headers
    );
    // Closing a stream frees its place (the server notices the closed socket on its next
    // write, at the latest with the next keep-alive).
    drop(first);
    let mut reopened = None;
    for _ in 0..200 {
        if let Ok(s) = api.sse("after_sequence=0", None).await {
            reopened = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        reopened.is_some(),
        "a closed stream's place is given to a new one"
    );
    drop(second);
}
