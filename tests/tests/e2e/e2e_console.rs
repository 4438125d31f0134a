//! The operator console in a real browser (spec section 15): Debian's headless Chromium, driven
//! by playwright-core (npm, no browser download of its own) from `tests/browser/console.test.mjs`,
//! against the built binary with real data. The script starts and kill -9s its own servers (one
//! open, one with tokens) and checks: the KPI tiles show the numbers the API gives; the stuck
//! badge and toggle and the title search; Retry on a parked delivery makes it queued (with its
//! timeline); a subscription's zero state, then last_sequence after an ack, then last_error
//! after a mismatch, and explain; consumers and projection verify; the live tail shows an event
//! appended after the page opened and resumes after the server restarts (no repeats, no gaps);
//! with tokens it asks for one, keeps it for the tab, never puts it in a URL, and a read-only
//! token sees Retry disabled. Issue 26: Discard, Rebuild and Delete ask for a confirmation
//! (cancelling sends no request and changes nothing, as the API shows; confirming acts); the
//! consumers view flags a subscription stopped at a mismatch with its reason; the Notifications
//! view lists info and warning notifications newest first, filters them and opens a status
//! record (and from it a delivery's timeline); tasks (`bt-0` … `bt-11`) and deliveries are
//! listed newest first by default, by id on request. Issue 40, "fix from the console" (a server
//! with an admin and an operator token): a stopped subscription's cursor is reset from the
//! consumers view (offered to admin only; the lag the reset would leave is shown first and is
//! the lag it leaves; a reason; cancel sends nothing); Resume on a parked source (Poll now waits
//! for it); deep links and clicks bring their panel into view below a 50-row list, focused, and
//! `#lists/<name>` opens the list's own panel; a delivery sent after a failed attempt shows no
//! error as its state; "1 of 2 delivered · 1 parked"; the due time of a retrying and of a
//! scheduled delivery; the event browser newest first over pages, by seq range both ways, a
//! payload on click with the webhook secret redacted; payloads in the live tail (a password
//! masked); the icon is served and nothing the page loads is a 404. Screenshots of each state go
//! to `target/console-screenshots/`.
//!
//! `.ci/run` installs Chromium (`apt-get install chromium`) and the script's one dependency
//! (`npm ci --prefix tests/browser`); without them this test fails and says what is missing.

use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

#[tokio::test]
async fn the_console_in_headless_chromium() {
    let bin = tidemark_tests::binary();
    let ws = workspace();
    let browser_dir = ws.join("tests/browser");
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        Path::new(&chromium).exists(),
        "{chromium} is missing: install Debian's chromium (`apt-get install chromium`, as .ci/run does)"
    );
    assert!(
        browser_dir.join("node_modules/playwright-core").is_dir(),
        "playwright-core is missing: run `npm ci --prefix tests/browser` (as .ci/run does)"
    );
    let work = tempfile::tempdir().expect("tempdir");
    let shots = ws.join("target/console-screenshots");
    let _ = std::fs::remove_dir_all(&shots);
    let mut cmd = tokio::process::Command::new("node");
    cmd.arg(browser_dir.join("console.test.mjs"))
        .current_dir(&browser_dir)
        .env("TIDEMARK_BIN", &bin)
        .env("CONSOLE_WORK", work.path())
        .env("CONSOLE_SHOTS", &shots)
        .env("CHROMIUM", &chromium);
    // node is Debian's nodejs; the script takes well under a minute.
    let stdout = crate::common::run_script(cmd, "the browser test").await;
    println!("{stdout}");
    assert!(stdout.contains("all console checks passed"), "{stdout}");
    let n = std::fs::read_dir(&shots).map(|d| d.count()).unwrap_or(0);
    assert!(n >= 22, "expected the screenshots of each state, found {n}");
}
