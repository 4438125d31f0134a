//! `tidemark bench`: runs the benchmark binary `tidemark-bench` (built from `benches/`, where
//! the peers' client crates live, so this binary's dependency tree stays as it is) with the
//! given arguments, pointing it at this very binary as the server to measure over HTTP.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const BENCH_BIN: &str = "tidemark-bench";

/// Replace this process with `tidemark-bench ARGS --tidemark-bin <this binary>`, so Ctrl-C and
/// the exit status reach the benchmark directly. Returns only on failure.
pub fn exec(args: Vec<OsString>) -> Result<(), String> {
    let me = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let bench = find_or_build(&me)?;
    if cfg!(debug_assertions) {
        eprintln!(
            "tidemark bench: this is a debug build; its figures are not representative \
             (use `cargo run --release -- bench …`)"
        );
    }
    let mut cmd = Command::new(&bench);
    cmd.args(&args);
    if !args
        .iter()
        .any(|a| a.to_string_lossy().starts_with("--tidemark-bin"))
    {
        cmd.arg("--tidemark-bin").arg(&me);
    }
    let err = cmd.exec();
    Err(format!("cannot run {}: {err}", bench.display()))
}

/// `tidemark-bench` next to this binary; otherwise, in a source checkout, build it with the
/// same profile into the same target directory.
fn find_or_build(me: &Path) -> Result<PathBuf, String> {
    let dir = me.parent().ok_or("this executable has no directory")?;
    let beside = dir.join(BENCH_BIN);
    if beside.is_file() {
        return Ok(beside);
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent();
    let Some(ws) = workspace.filter(|w| w.join("benches").join("Cargo.toml").is_file()) else {
        return Err(format!(
            "{} is not beside {} and there is no source checkout to build it from \
             (cargo build --release -p tidemark-benches)",
            BENCH_BIN,
            me.display()
        ));
    };
    let release = dir.file_name().is_some_and(|n| n == "release");
    eprintln!(
        "tidemark bench: building {BENCH_BIN} ({} profile) in {}",
        if release { "release" } else { "dev" },
        ws.display()
    );
    let mut build = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    build
        .current_dir(ws)
        .args(["build", "-p", "tidemark-benches", "--bin", BENCH_BIN]);
    if release {
        build.arg("--release");
    }
    // The target directory this binary is in, wherever CARGO_TARGET_DIR pointed the build.
    if let Some(target) = dir.parent() {
        build.env("CARGO_TARGET_DIR", target);
    }
    let status = build
        .status()
        .map_err(|e| format!("cannot run cargo to build {BENCH_BIN}: {e}"))?;
    if !status.success() || !beside.is_file() {
        return Err(format!("building {BENCH_BIN} failed ({status})"));
    }
    Ok(beside)
}
