//! A panic on the models' writer thread poisons the decider (spec I10), as a panic of the
//! decider does: commands are refused with the cause until a restart, where they used to be
//! decided on layers no one would ever write (readers waiting for the models for ever), and a
//! restart recovers every acknowledged decision from the log. The fault knob is read from the
//! environment once per process: the test runs itself again in a child process that has it.

mod common;

use serde_json::json;
use tidemark_engine::commands::cursors::Advance;
use tidemark_engine::{CommandError, Engine};
use tidemark_log::{EventLog, LogConfig, NewEvent};

use common::rt;

fn advance_to(seq: u64) -> Advance {
    Advance {
        consumer_id: "c".into(),
        stream_name: "w".into(),
        subject_id: String::new(),
        last_sequence: seq,
        delivery_id: format!("d{seq}"),
        expected_sequence: None,
    }
}

#[test]
fn a_panicking_models_writer_poisons_the_decider() {
    const KNOB: &str = "TIDEMARK_FAULT_WRITER_PANIC";
    if std::env::var_os(KNOB).is_none() {
        // The knob is read from the environment: run this test again in a process with it.
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "a_panicking_models_writer_poisons_the_decider",
                "--nocapture",
            ])
            .env(KNOB, "1")
            .output()
            .unwrap();
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let rt = rt();
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig::new(dir.path().join("log.redb"));
    let (engine, _) = Engine::open(&cfg).unwrap();
    let ev = NewEvent::new(None, "w", "s", "w.x", &json!({})).unwrap();
    rt.block_on(engine.log().append(vec![ev])).unwrap();
    // Decided from memory: acknowledged although the writer has not written it yet.
    rt.block_on(engine.execute(advance_to(1))).unwrap();
    // The writer meets its first layer (at once, for a reader waiting) and panics; the
    // decider is poisoned with the cause.
    let t0 = std::time::Instant::now();
    let refused = loop {
        let _ = engine.read().folded_to(engine.head());
        match rt.block_on(engine.execute(advance_to(1))) {
            Err(CommandError::Poisoned(why)) => break why,
            r => {
                assert!(
                    t0.elapsed() < std::time::Duration::from_secs(60),
                    "still deciding after the writer panicked: {r:?}"
                );
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    };
    assert!(
        refused.contains("the models writer panicked"),
        "the refusal names the cause: {refused}"
    );
    rt.block_on(engine.close());
    drop(engine);

    // A restart (the knob panics once per process): the acknowledged advance is back,
    // folded from the log.
    let (engine, _) = Engine::open(&cfg).unwrap();
    let cursor = engine.read().cursor("c", "w", "").unwrap();
    assert_eq!(cursor.last_sequence, 1);
    rt.block_on(engine.close());
}
