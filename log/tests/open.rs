//! Opening the log file: one process at a time.

use tidemark_log::EventLog;
use tidemark_log::{Log, LogConfig, OpenError};

/// The log locks its file: a second open (another server on the same data directory) is
/// refused with a clear error while the first is open, and succeeds once it is closed.
#[tokio::test]
async fn a_second_open_of_the_same_file_is_refused_while_the_first_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig::in_dir(dir.path());
    let (log, _) = Log::open(&cfg).unwrap();
    match Log::open(&cfg) {
        Err(e @ OpenError::Locked { .. }) => {
            assert!(e.to_string().contains("another tidemark process"), "{e}");
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a second open of a locked file succeeded"),
    }
    log.close().await;
    drop(log);
    let (again, _) = Log::open(&cfg).unwrap();
    again.close().await;
}
