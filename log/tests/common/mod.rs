//! Helpers shared by the log's test binaries.

/// The runtime the tests drive the log from: two workers, as on the project's machines.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}
