//! The README runs: every shell example of `README.md`, in order, against fresh servers, each
//! answer compared with the one the README shows under it.
//!
//! The story: operators copied the README line by line and found that it lied. The first
//! append answered `seq: 2`, not 1 (the server records its settings as event 1);
//! `deliveries retry` right after the shown `complete` was `409` (retry is for parked
//! deliveries); `cursors reset --to 130` on a fresh log was `422`; the bridge ack example used
//! an id the pull never returned; and `after_sequence=<latest_event_seq>` typed as written was
//! a `400`. Each example had been written by hand and never run. Now this test runs them.
//!
//! How the examples run:
//! - One bash process runs every command in README order, in a directory of its own, with the
//!   built `tidemark` first on `PATH`, so what one example sets (`seq=$(…)`, a file) is there
//!   for the next, as in a reader's terminal. Every command's exit status is checked, and so is
//!   the HTTP status of every request curl makes: a `4xx`/`5xx` passes only when the answer
//!   shown under the command is that problem document (its `status`).
//! - A `serve` line (`cargo run --release -- serve [--config F] [--listen A] [--data D] &`) is
//!   run by the harness: it starts the built binary on a free port (its config file is the one
//!   the README's commands wrote, its environment the variables the config names from the
//!   shell's), and every `localhost:<port>` / `127.0.0.1:<port>` of the README's address is
//!   rewritten to it. `TIDEMARK_URL` points the CLI at the server the README runs on 7700.
//! - A stream (`curl -N …`, `tidemark tail` without `--count`) is cut after a few seconds
//!   (`curl --max-time`, `timeout`): its answer is what arrived until then.
//! - Before each command the harness waits until the log has been quiet for a moment, as a
//!   reader typing the next line would: the router and the delivery scheduler append after a
//!   commit, and a claim right after a notification must find its delivery.
//! - Blocks and commands the test cannot run say why in a `<!-- readme-test: skip … -->`
//!   directive (see [`readme`]); any other command runs, so an example nobody runs cannot be
//!   added by accident.
//! - Every ```` ```toml ```` block must be a configuration `tidemark config show` accepts, and
//!   every other block says what it is (`json`, `text`): a block of unknown kind fails.

mod pattern;
mod readme;
mod shell;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tidemark_tests::{Server, ServerOpts, secret};

use crate::common::wait_quiet;
use pattern::Pat;
use readme::{Block, Example};
use shell::{Ran, Shell};

/// How long a stream example is read.
const STREAM_SECONDS: u32 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_examples_run() {
    for (tool, version) in [
        ("bash", "--version"),
        ("curl", "--version"),
        ("jq", "--version"),
        ("openssl", "version"),
    ] {
        let ok = std::process::Command::new(tool)
            .arg(version)
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "the README's examples need {tool} (apt-get install {tool}; .ci/run installs it)"
        );
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let text = std::fs::read_to_string(&path).expect("read README.md");
    let blocks = readme::blocks(&text).unwrap_or_else(|e| panic!("README.md: {e}"));
    let dir = tempfile::Builder::new()
        .prefix("tidemark-readme-")
        .tempdir()
        .expect("temp dir");
    let bin = tidemark_tests::binary();
    let mut run = Run {
        shell: Shell::start(dir.path(), bin.parent().expect("target dir")).await,
        servers: BTreeMap::new(),
        failures: Vec::new(),
        log: String::new(),
    };
    for block in &blocks {
        match block.lang.as_str() {
            "toml" => run.check_config(block).await,
            "json" | "text" => {}
            _ if block.is_shell() => run.block(block).await,
            other => run.failures.push(format!(
                "the block at README line {} is {other:?}: name it sh (run), toml (checked), \
                 json or text (neither), so that no example goes unrun unnoticed",
                block.line
            )),
        }
    }
    eprintln!("{}", run.log);
    // Stopped here, so that their logs are checked for secrets and a failure below does not
    // print them.
    run.servers.clear();
    assert!(
        run.failures.is_empty(),
        "{} README example(s) do not do what the README says:\n\n{}",
        run.failures.len(),
        run.failures.join("\n\n")
    );
}

struct Run {
    shell: Shell,
    /// The servers the README started, by the port the README gave them.
    servers: BTreeMap<u16, Server>,
    failures: Vec<String>,
    /// What ran and what was skipped, printed at the end.
    log: String,
}

impl Run {
    async fn block(&mut self, block: &Block) {
        let examples = match readme::examples(block) {
            Ok(e) => e,
            Err(e) => return self.failures.push(e),
        };
        if let Some(reason) = &block.skip {
            let _ = writeln!(
                self.log,
                "line {}: {} command(s) skipped: {reason}",
                block.line,
                examples.len()
            );
            return;
        }
        for (prefix, _) in &block.skip_commands {
            if !examples.iter().any(|e| e.code.starts_with(prefix.as_str())) {
                self.failures.push(format!(
                    "the block at line {}: no command starts with {prefix:?}, which a \
                     directive skips",
                    block.line
                ));
            }
        }
        for ex in &examples {
            if let Some((_, reason)) = block
                .skip_commands
                .iter()
                .find(|(p, _)| ex.code.starts_with(p.as_str()))
            {
                let _ = writeln!(self.log, "line {}: skipped: {reason}", ex.line);
                continue;
            }
            match serve_line(&ex.code) {
                Ok(Some(serve)) => self.serve(ex, serve).await,
                Ok(None) => self.example(ex).await,
                Err(e) => self.failures.push(format!("line {}: {e}", ex.line)),
            }
        }
    }

    /// Start the server a `serve` line starts.
    async fn serve(&mut self, ex: &Example, serve: Serve) {
        let port = serve.port;
        if self.servers.contains_key(&port) {
            return self.failures.push(format!(
                "line {}: the README starts a second server on port {port}",
                ex.line
            ));
        }
        let mut opts = ServerOpts::default();
        if let Some(file) = &serve.config {
            let config = match self.shell.read(file) {
                Ok(c) => c,
                Err(e) => {
                    return self.failures.push(format!(
                        "line {}: the config file {file} (written by the README's commands \
                         before it): {e}",
                        ex.line
                    ));
                }
            };
            let env = self.shell.env().await;
            for name in env_refs(&config) {
                if let Some(v) = env.get(&name) {
                    opts = opts.env(&name, secret(v.clone()));
                }
            }
            opts = opts.config(config);
        }
        let server = match Server::try_start(opts).await {
            Ok(s) => s,
            Err(e) => {
                return self
                    .failures
                    .push(format!("line {}: the server did not start: {e}", ex.line));
            }
        };
        let _ = writeln!(
            self.log,
            "line {}: the harness started the server the README runs on port {port} ({})",
            ex.line,
            server.base()
        );
        if port == 7700 {
            let r = self
                .shell
                .run(&format!("export TIDEMARK_URL={}", server.base()))
                .await;
            assert_eq!(r.status, 0, "export TIDEMARK_URL: {}", r.stderr);
        }
        self.servers.insert(port, server);
    }

    /// Run one command and compare what it did with what the README shows.
    async fn example(&mut self, ex: &Example) {
        for s in self.servers.values() {
            wait_quiet(s).await;
        }
        let mut text = ex.text.clone();
        for (port, s) in &self.servers {
            let addr = s.addr().to_string();
            text = text
                .replace(&format!("localhost:{port}"), &addr)
                .replace(&format!("127.0.0.1:{port}"), &addr);
        }
        let mut ok_status = vec![0];
        let words: Vec<&str> = ex.code.split_whitespace().collect();
        if words.first() == Some(&"curl")
            && words.iter().any(|w| {
                *w == "--no-buffer"
                    || (w.starts_with('-') && !w.starts_with("--") && w.contains('N'))
            })
        {
            text = text.replacen("curl", &format!("curl --max-time {STREAM_SECONDS}"), 1);
            ok_status.push(28);
        } else if words.starts_with(&["tidemark", "tail"]) && !words.contains(&"--count") {
            text = format!("timeout {STREAM_SECONDS} {text}");
            ok_status.push(124);
        }
        let r = self.shell.run(&text).await;
        let _ = writeln!(
            self.log,
            "line {}: ran, exit {}{}",
            ex.line,
            r.status,
            if ex.answer.is_some() {
                ", answer compared"
            } else {
                ""
            }
        );
        if let Err(e) = check(ex, &r, &ok_status) {
            self.failures.push(format!(
                "README line {}:\n{}{e}\n  stdout: {}\n  stderr: {}",
                ex.line,
                ex.text,
                r.stdout.trim_end(),
                r.stderr.trim_end()
            ));
        }
    }

    /// A ```` ```toml ```` block must be a configuration the binary accepts (the variables it
    /// names as `env:NAME` set to a placeholder).
    async fn check_config(&mut self, block: &Block) {
        let mut config = block.body.join("\n");
        config.push('\n');
        let path = self
            .shell
            .dir()
            .join(format!(".readme-config-{}.toml", block.line));
        std::fs::write(&path, &config).expect("write the config block");
        let mut cmd = tokio::process::Command::new(tidemark_tests::binary());
        cmd.args(["config", "show", "--config"])
            .arg(&path)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("TIDEMARK_") {
                cmd.env_remove(&k);
            }
        }
        for name in env_refs(&config) {
            cmd.env(name, "readme-test-placeholder");
        }
        let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
            .await
            .expect("tidemark config show ran for a minute")
            .expect("run tidemark config show");
        if out.status.success() {
            let _ = writeln!(self.log, "line {}: toml block accepted", block.line);
        } else {
            self.failures.push(format!(
                "the toml block at README line {} is not a configuration tidemark accepts: {}",
                block.line,
                String::from_utf8_lossy(&out.stderr).trim_end()
            ));
        }
    }
}

/// A `serve` line: the port it listens on and its config file.
struct Serve {
    port: u16,
    config: Option<String>,
}

/// `cargo run --release -- serve [--config F] [--listen A] [--data D] [&]` or `tidemark serve
/// …`: `None` when `code` is another command.
fn serve_line(code: &str) -> Result<Option<Serve>, String> {
    let words: Vec<&str> = code.split_whitespace().collect();
    let rest = if let Some(r) = words.strip_prefix(&["cargo", "run", "--release", "--", "serve"]) {
        r
    } else if let Some(r) = words.strip_prefix(&["tidemark", "serve"]) {
        r
    } else if words.contains(&"serve") && words.iter().any(|w| w.contains('=')) {
        return Err(format!(
            "{code:?}: set the server's environment with `export` on a line of its own"
        ));
    } else {
        return Ok(None);
    };
    let rest = rest.strip_suffix(&["&"]).unwrap_or(rest);
    let mut serve = Serve {
        port: 7700,
        config: None,
    };
    let mut it = rest.iter();
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("{code:?}: {flag} without a value"))?;
        match *flag {
            "--config" => serve.config = Some((*value).to_owned()),
            "--listen" => {
                serve.port = value
                    .rsplit(':')
                    .next()
                    .and_then(|p| p.parse().ok())
                    .ok_or_else(|| format!("{code:?}: --listen {value}"))?;
            }
            // Each server of the test has a data directory of its own anyway.
            "--data" => {}
            _ => return Err(format!("{code:?}: the harness does not know {flag}")),
        }
    }
    Ok(Some(serve))
}

/// The variables a config names as `"env:NAME"`.
fn env_refs(config: &str) -> Vec<String> {
    config
        .split("\"env:")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .map(str::to_owned)
        .collect()
}

/// The exit status, the HTTP statuses and the answer of one command.
fn check(ex: &Example, r: &Ran, ok_status: &[i32]) -> Result<(), String> {
    if !ok_status.contains(&r.status) {
        return Err(format!("  exit status {}", r.status));
    }
    let shown: Vec<u64> = ex
        .answer
        .iter()
        .flat_map(|a| &a.docs)
        .filter_map(|p| match p {
            Pat::Obj(members, _) => members.iter().find_map(|(k, v)| match (k.as_str(), v) {
                ("status", Pat::Num(n)) => n.as_u64(),
                _ => None,
            }),
            _ => None,
        })
        .collect();
    for code in &r.http {
        if *code >= 400 && !shown.contains(&u64::from(*code)) {
            return Err(format!(
                "  HTTP {code}, and the README shows no problem answer with that status"
            ));
        }
    }
    let Some(answer) = &ex.answer else {
        return Ok(());
    };
    let at = answer.line;
    let docs = if answer.sse {
        sse_frames(&r.stdout)
    } else {
        serde_json::Deserializer::from_str(&r.stdout)
            .into_iter::<Value>()
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                format!("  the output is not JSON ({e}), the README shows one (line {at})")
            })?
    };
    pattern::match_seq(&answer.docs, &docs, "$")
        .map_err(|e| format!("  the answer differs from the one at README line {at}: {e}"))
}

/// An SSE stream's frames as `{"id", "event", "data"}` objects (`data` parsed as JSON), as
/// [`readme`] reads an SSE answer; comments (keep-alives) left out.
fn sse_frames(text: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for frame in text.split("\n\n") {
        let mut obj = serde_json::Map::new();
        for line in frame.lines() {
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            let v = if field == "data" {
                serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_owned()))
            } else {
                Value::String(value.to_owned())
            };
            obj.insert(field.to_owned(), v);
        }
        if !obj.is_empty() {
            out.push(Value::Object(obj));
        }
    }
    out
}
