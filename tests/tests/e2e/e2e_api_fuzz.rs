//! The property-based API fuzz run (issue 16): `tests/api-fuzz/run.sh` runs schemathesis
//! (PyPI, pinned in tests/api-fuzz/requirements.txt, installed by .ci/run) with every check,
//! stateful links included, against the built server: a fresh data directory, an admin token,
//! `wait_ms` at most 1000, a request timeout, the two SSE endpoints excluded (tested by the
//! e2e suite), a fixed seed (so a failure reproduces) and a time budget of 7 minutes. It
//! passes when schemathesis reports no failure and the server neither died nor panicked.
//! More cases: `TIDEMARK_FUZZ_EXAMPLES=100 TIDEMARK_FUZZ_SEED=random tests/api-fuzz/run.sh`.

use std::path::Path;

#[tokio::test]
async fn schemathesis_finds_no_failure() {
    let bin = tidemark_tests::binary();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("api-fuzz/run.sh");
    let mut cmd = tokio::process::Command::new("bash");
    cmd.arg(&script).arg(&bin);
    // The script's own budget is 7 minutes.
    let stdout = crate::common::run_script(cmd, "the API fuzz run").await;
    let summary: String = stdout
        .lines()
        .skip_while(|l| !l.contains("SUMMARY"))
        .collect::<Vec<_>>()
        .join("\n");
    println!("{summary}");
    assert!(
        stdout.contains("generated") && stdout.contains("No issues found"),
        "no summary of a clean run:\n{stdout}"
    );
}
