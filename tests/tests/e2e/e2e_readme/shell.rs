//! One bash process that runs the README's commands in order, as a reader's terminal would:
//! variables and files one command makes are there for the next.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// How long one command may run before the test gives up on it (a bound against a hang, not
/// a speed check).
const COMMAND_LIMIT: Duration = Duration::from_secs(120);

/// Marks the line curl writes on stderr after each transfer (see [`Shell::start`]).
pub const HTTP_MARK: &str = "readme-test: HTTP ";

pub struct Shell {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    dir: PathBuf,
    n: u64,
}

/// What one command did.
pub struct Ran {
    pub status: i32,
    pub stdout: String,
    /// Without the lines the harness's curl adds.
    pub stderr: String,
    /// The HTTP status of every transfer curl made, in order.
    pub http: Vec<u16>,
}

impl Shell {
    /// A bash in `dir` whose PATH starts with `bin_dir` (the built `tidemark`), with no
    /// `TIDEMARK_*` or `RUST_LOG` of the test's own environment. `curl` is a function that
    /// adds `--write-out` for the HTTP status on stderr, so an example whose request failed
    /// cannot pass unnoticed (curl exits 0 on a 4xx).
    pub async fn start(dir: &Path, bin_dir: &Path) -> Shell {
        let mut cmd = Command::new("bash");
        cmd.args(["--noprofile", "--norc"])
            .current_dir(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        for (k, _) in std::env::vars_os() {
            let k_str = k.to_string_lossy();
            if k_str.starts_with("TIDEMARK_") || k_str == "RUST_LOG" {
                cmd.env_remove(&k);
            }
        }
        let path = std::env::var("PATH").unwrap_or_default();
        cmd.env("PATH", format!("{}:{path}", bin_dir.display()));
        cmd.env("HOME", dir);
        let mut child = cmd.spawn().expect("start bash");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut shell = Shell {
            child,
            stdin,
            stdout,
            dir: dir.to_owned(),
            n: 0,
        };
        let setup = format!(
            "set -o pipefail\n\
             curl() {{ command curl --write-out '%{{stderr}}{HTTP_MARK}%{{http_code}}\\n' \"$@\"; }}\n"
        );
        let r = shell.run(&setup).await;
        assert_eq!(r.status, 0, "the shell set-up failed: {}", r.stderr);
        shell
    }

    /// Run `text` (one command, possibly of several lines) and wait for it to end.
    pub async fn run(&mut self, text: &str) -> Ran {
        self.n += 1;
        let n = self.n;
        let out = self.dir.join(format!(".readme-test-{n}.out"));
        let err = self.dir.join(format!(".readme-test-{n}.err"));
        let mark = format!("readme-test-done-{n} ");
        // Braces, not a subshell: what the command sets stays for the next one.
        let script = format!(
            "{{\n{text}\n}} >'{}' 2>'{}' </dev/null\necho \"{mark}$?\"\n",
            out.display(),
            err.display()
        );
        self.stdin
            .write_all(script.as_bytes())
            .await
            .expect("write to bash");
        self.stdin.flush().await.expect("flush to bash");
        let status = tokio::time::timeout(COMMAND_LIMIT, async {
            let mut line = String::new();
            loop {
                line.clear();
                let n = self.stdout.read_line(&mut line).await.expect("read bash");
                assert!(n > 0, "bash exited while running:\n{text}");
                if let Some(s) = line.trim_end().strip_prefix(&mark) {
                    return s.parse::<i32>().expect("exit status");
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("this README command ran for {COMMAND_LIMIT:?}:\n{text}"));
        let stdout = std::fs::read_to_string(&out).unwrap_or_default();
        let raw_err = std::fs::read_to_string(&err).unwrap_or_default();
        let _ = std::fs::remove_file(&out);
        let _ = std::fs::remove_file(&err);
        let mut http = Vec::new();
        let mut stderr = String::new();
        for l in raw_err.lines() {
            match l.strip_prefix(HTTP_MARK) {
                Some(code) => http.push(code.trim().parse().unwrap_or(0)),
                None => {
                    stderr.push_str(l);
                    stderr.push('\n');
                }
            }
        }
        Ran {
            status,
            stdout,
            stderr,
            http,
        }
    }

    /// The shell's exported environment.
    pub async fn env(&mut self) -> BTreeMap<String, String> {
        let r = self.run("env -0").await;
        assert_eq!(r.status, 0, "env -0: {}", r.stderr);
        r.stdout
            .split('\0')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    /// The directory the commands run in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A file the commands wrote, relative to the shell's directory.
    pub fn read(&self, rel: &str) -> std::io::Result<String> {
        std::fs::read_to_string(self.dir.join(rel))
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}
