//! The `tidemark` command line (spec section 9).

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser;

use crate::config::Config;

mod args;
mod backup;
mod client;
mod error;
mod events;
mod more;
mod operator;
pub mod output;
mod tenants;

pub use args::*;
use error::CliError;
use events::{append, tail};
use more::{completions, config_show, notifications, tasks};
use operator::{cursors, deliveries, endpoints, lists, projections, routes, sources};
pub use output::Output;

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(&cli);
    // `serve` reads its configuration once, here: the runtime's size depends on it.
    let mut served = match &cli.command {
        Command::Serve(a) => Some(Config::load(a.config.as_deref())),
        _ => None,
    };
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(Ok(cfg)) = &served
        && cfg.log.shards > 1
    {
        // A shard's group commit is led on the task of one of its appenders, which syncs on
        // its worker thread (`log/src/embedded/commit.rs`): a worker per shard beyond the first
        // keeps the others serving while every shard syncs at once.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        rt.worker_threads(cores + cfg.log.shards as usize - 1);
    }
    let rt = match rt.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tidemark: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let raw_errors = matches!(
        cli.command.output_flag(),
        Some(Output::Json | Output::Jsonl)
    );
    let result = rt.block_on(async {
        match cli.command {
            Command::Serve(a) => {
                let cfg = served
                    .take()
                    .unwrap_or_else(|| Config::load(a.config.as_deref()));
                serve(a, cfg).await
            }
            Command::Append(a) => append(a).await,
            Command::Tail(a) => tail(a).await,
            Command::Projections(a) => projections(a).await,
            Command::Deliveries(a) => deliveries(a).await,
            Command::Cursors(a) => cursors(a).await,
            Command::Sources(a) => sources(a).await,
            Command::Tasks(a) => tasks(a).await,
            Command::Notifications(a) => notifications(a).await,
            Command::Lists(a) => lists(a).await,
            Command::Routes(a) => routes(a).await,
            Command::Endpoints(a) => endpoints(a).await,
            Command::Tenants(a) => tenants::tenants(a).await,
            Command::Config(a) => config_show(a),
            Command::Backup(a) => backup::backup(a).await,
            Command::Restore(a) => backup::restore(a).await,
            Command::Log(a) => backup::log(a).await,
            Command::Completions { shell } => completions(shell),
            // Replaces this process; returns only when the benchmark could not be started.
            Command::Bench(b) => crate::bench::exec(b.args).map_err(CliError::Other),
        }
    });
    match result {
        // Nobody reads stdout any more (`| head -1`): nothing is left to say, and no one to
        // say it to.
        Ok(()) | Err(CliError::ClosedPipe) => ExitCode::SUCCESS,
        Err(e) => {
            let text = match e.problem() {
                Some(p) if raw_errors => p.to_string(),
                _ => e.human(),
            };
            // A closed stderr is not worth a panic.
            let _ = writeln!(std::io::stderr(), "{text}");
            ExitCode::FAILURE
        }
    }
}

impl Command {
    /// The `-o` given on the command line, if any.
    fn output_flag(&self) -> Option<Output> {
        match self {
            Command::Append(a) => a.client.output,
            Command::Tail(a) => a.client.output,
            Command::Projections(a) => a.client.output,
            Command::Deliveries(a) => a.client.output,
            Command::Cursors(a) => a.client.output,
            Command::Sources(a) => a.client.output,
            Command::Tasks(a) => a.client.output,
            Command::Notifications(a) => a.client.output,
            Command::Lists(a) => a.client.output,
            Command::Routes(a) => a.client.output,
            Command::Endpoints(a) => a.client.output,
            Command::Tenants(a) => a.client.output,
            Command::Config(ConfigArgs {
                action: ConfigAction::Show { output, .. },
            }) => *output,
            Command::Backup(a) => a.client.output,
            Command::Restore(a) => a.output,
            Command::Log(LogArgs {
                action: LogAction::Import { output, .. },
            }) => *output,
            Command::Serve(_)
            | Command::Completions { .. }
            | Command::Bench(_)
            | Command::Log(_) => None,
        }
    }
}

/// Log lines on stderr, filtered by `RUST_LOG` (default `info`), as text or as JSON objects
/// (`TIDEMARK_LOG_FORMAT`, else `[server] log_format` of the configuration `serve` reads).
fn init_tracing(cli: &Cli) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,tower_http=warn"));
    let json = match std::env::var("TIDEMARK_LOG_FORMAT") {
        Ok(f) => f == "json",
        Err(_) => match &cli.command {
            Command::Serve(a) => {
                Config::load(a.config.as_deref()).is_ok_and(|c| c.server.log_format == "json")
            }
            _ => false,
        },
    };
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        fmt.json().flatten_event(true).try_init()
    } else {
        fmt.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init()
    };
}

pub(crate) type CliResult = Result<(), CliError>;

async fn serve(a: ServeArgs, cfg: Result<Config, crate::config::ConfigError>) -> CliResult {
    let mut cfg = cfg.map_err(|e| e.to_string())?;
    if let Some(d) = a.data {
        cfg.server.data = d;
    }
    if let Some(l) = a.listen {
        cfg.server.listen = l;
    }
    let listener = tokio::net::TcpListener::bind(cfg.server.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", cfg.server.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    if cfg.auth.tokens.is_empty() && !addr.ip().is_loopback() {
        return Err(crate::RunError::OpenOnNonLoopback(addr).to_string().into());
    }
    // `run` prints `listening on http://<addr>` once the log is open.
    crate::run(cfg, listener, shutdown_signal())
        .await
        .map_err(|e| CliError::Other(e.to_string()))
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        else {
            let _ = ctrl_c.await;
            return;
        };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
