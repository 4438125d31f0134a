//! The command line's arguments: every command and its options, as clap parses them (spec
//! section 9). What each command does is in the modules beside this one.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use super::Output;

#[derive(Debug, Parser)]
#[command(
    name = "tidemark",
    version,
    about = "Event-sourced notification and delivery engine"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server.
    Serve(ServeArgs),
    /// Append events from JSON lines (one event object per line) read from FILE or stdin, and
    /// print each event's receipt (event_id, seq, duplicate).
    ///
    /// Every line is checked to be a JSON object before anything is sent; the events then go
    /// in batches of up to 1000, each appended whole or not at all. An error names the line of
    /// the input it comes from (1-based, blank lines counted), and says which lines were
    /// appended before it.
    Append(AppendArgs),
    /// Print the log's events after --after, following it live; with --count, exit after that
    /// many.
    ///
    /// Off a terminal, following prints one JSON line per event (jsonl); with --count the
    /// default is json, one array. `-o json` without --count is refused: it needs an end.
    Tail(TailArgs),
    /// Inspect, rebuild and verify the read models of a running server.
    Projections(ProjectionsArgs),
    /// List deliveries, and retry or discard parked ones.
    Deliveries(DeliveriesArgs),
    /// Show consumer cursors, or reset one (admin).
    Cursors(CursorsArgs),
    /// Source pollers: list, show, poll now, pause, resume, reset the watermark (admin).
    Sources(SourcesArgs),
    /// Bridge subscriptions of a task: subscribe, list, show, delete.
    Tasks(TasksArgs),
    /// What became of a notification.
    Notifications(NotificationsArgs),
    /// Notification lists (section 17): list, show, set the members (admin), delete (admin).
    Lists(ListsArgs),
    /// Notification routes (section 4): list, show, set (admin), delete (admin). A route set
    /// here is recorded in the log and used by every node from the next event on.
    Routes(RoutesArgs),
    /// The endpoints of the email and webhook routes (section 17): each one's health and
    /// circuit; disable and enable one (operator).
    Endpoints(EndpointsArgs),
    /// The deployment's tenants and shards (operators): list, show, create, remove, move.
    Tenants(super::tenants::TenantsArgs),
    /// The effective configuration (defaults, the file, TIDEMARK_* variables), secrets masked.
    Config(ConfigArgs),
    /// Back the log up into --to DIR on this machine: a running server streams it (admin
    /// token), or --data reads a stopped server's directory; --on-server NAME has the server
    /// write it on its machine, under its `[server] backup_dir`. Prints what it wrote, with
    /// `through_seq`: the backup is the log as of that seq.
    Backup(BackupArgs),
    /// Make a new data directory from a full backup and its increments, applied in order (a
    /// gap is refused); its read models rebuild from the log at the first start.
    Restore(RestoreArgs),
    /// The log as JSON lines: export from, or import into, a data directory (offline).
    Log(LogArgs),
    /// Shell completions for bash, zsh, fish, elvish or powershell, on stdout.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Benchmark tidemark against Redis Streams, PostgreSQL, SQLite and NATS JetStream
    /// (`tidemark bench --help` lists the options; peers: benches/peers/install.sh).
    #[command(disable_help_flag = true)]
    Bench(BenchArgs),
}

#[derive(Debug, Args)]
pub struct BackupArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// The directory to write here (absent or empty): a running server streams the backup
    /// (`GET /v1/admin/backup/stream`), or with --data it is read from a stopped one's.
    #[arg(
        long,
        required_unless_present = "on_server",
        conflicts_with = "on_server"
    )]
    pub to: Option<PathBuf>,
    /// Have the running server write the backup on its own machine instead, under its
    /// `[server] backup_dir`: a relative name (letters, digits, `.`, `_`, `-`, joined by `/`).
    #[arg(long, value_name = "NAME", conflicts_with = "data")]
    pub on_server: Option<String>,
    /// Write an increment: the events after this seq (the `through_seq` of the backup it
    /// follows). 0, the default: a full backup.
    #[arg(long, default_value_t = 0)]
    pub after: u64,
    /// Back up the data directory of a stopped server instead of asking a running one.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// TOML config file (with --data: its `[log]` settings).
    #[arg(long, env = "TIDEMARK_CONFIG")]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// A full backup's directory, then each increment's, in order (`--from A --from B`).
    #[arg(long = "from", required = true)]
    pub from: Vec<PathBuf>,
    /// The data directory to make (it must not exist, or be empty).
    #[arg(long)]
    pub data: PathBuf,
    /// The user (and group) the restored directory is given to, as the service runs as it:
    /// `--owner tidemark` for the Debian package; needs root. Dirs 0700, files 0600 either way.
    #[arg(long, value_name = "USER")]
    pub owner: Option<String>,
    /// TOML config file (its `[log]` settings).
    #[arg(long, env = "TIDEMARK_CONFIG")]
    pub config: Option<PathBuf>,
    /// How the report is printed: table, json (one document) or jsonl (one record per
    /// line); json off a terminal.
    #[arg(short = 'o', long = "output", value_enum)]
    pub output: Option<Output>,
}

#[derive(Debug, Args)]
pub struct LogArgs {
    #[command(subcommand)]
    pub action: LogAction,
}

#[derive(Debug, Subcommand)]
pub enum LogAction {
    /// Write the events after --after (through --through) as JSON lines on stdout (seq,
    /// event_id, stream, subject, type, time, payload). Offline: --data's server stopped (a
    /// running server's log: `tidemark backup`, whose events.jsonl holds the same lines).
    Export {
        /// The data directory of a stopped server.
        #[arg(long)]
        data: PathBuf,
        /// The shard whose log (spec section 20); required when --data holds several.
        #[arg(long)]
        shard: Option<u32>,
        /// Write the events after this seq (0: from the first).
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// Write the events up to this seq (default: the last).
        #[arg(long)]
        through: Option<u64>,
        /// TOML config file (its `[log]` settings).
        #[arg(long, env = "TIDEMARK_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Read JSON lines of events (FILE, or stdin) into the empty log of --data with the same
    /// seqs, ids and times (offline): from seq 1, no gap, repeat or event_id twice; on any
    /// fault nothing changes. With a `jetstream` configuration, into the cluster's empty
    /// stream (--data is this node's replica directory).
    Import {
        /// The data directory to import into (its server stopped, its log empty).
        #[arg(long)]
        data: PathBuf,
        /// Into this shard's log (below the configuration's `log.shards`; 0 when absent).
        #[arg(long, default_value_t = 0)]
        shard: u32,
        /// JSON lines to read; stdin when absent or `-`.
        file: Option<PathBuf>,
        /// TOML config file (its `[log]` settings: with `backend = "jetstream"`, into the
        /// cluster's stream).
        #[arg(long, env = "TIDEMARK_CONFIG")]
        config: Option<PathBuf>,
        /// How the report is printed: table, json (one document) or jsonl (one record per
        /// line); json off a terminal.
        #[arg(short = 'o', long = "output", value_enum)]
        output: Option<Output>,
    },
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Options of the benchmark (`--quick`, `--systems`, `--clients`, `--batches`, `--events`,
    /// `--json-out`, …), passed on to `tidemark-bench`.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<std::ffi::OsString>,
}

#[derive(Debug, Args)]
pub struct TasksArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub action: TasksAction,
}

#[derive(Debug, Subcommand)]
pub enum TasksAction {
    /// A task's terminal notifications to bridges (spec section 6).
    Notifications {
        #[command(subcommand)]
        action: SubscriptionAction,
    },
}

#[derive(Debug, Subcommand)]
pub enum SubscriptionAction {
    /// Subscribe a bridge to the task's terminal notification.
    Subscribe {
        /// The task whose terminal notification the bridge gets.
        task: String,
        /// The subscription's id, chosen by the bridge (subscribing again with it is
        /// answered the same; after a delete it resumes from the kept cursor).
        #[arg(long)]
        subscription_id: String,
        /// The bridge that pulls or receives the envelopes.
        #[arg(long)]
        bridge_id: String,
        /// Where the bridge posts (e.g. a chat team or channel), carried on each envelope.
        #[arg(long)]
        scope: Option<String>,
        /// The bridge's workspace id, carried on each envelope.
        #[arg(long)]
        workspace: Option<String>,
        /// The thread the bridge replies in, carried on each envelope.
        #[arg(long)]
        thread: Option<String>,
        /// reply (in --thread; the default) or post (a new message).
        #[arg(long, value_parser = ["reply", "post"])]
        mode: Option<String>,
        /// pull (the bridge fetches and acks) or webhook (POSTed to --webhook-url).
        #[arg(long, default_value = "pull")]
        sink: String,
        /// Where a webhook sink POSTs each envelope (https://…; with --sink webhook).
        #[arg(long)]
        webhook_url: Option<String>,
        /// The webhook's HMAC key (read from the environment variable it names, so it stays
        /// out of shell history).
        #[arg(long)]
        secret_env: Option<String>,
    },
    /// The task's subscriptions.
    List {
        /// The task id.
        task: String,
    },
    /// One subscription with its cursor.
    Show {
        /// The task id.
        task: String,
        /// The subscription's id.
        subscription_id: String,
    },
    /// Unsubscribe (the cursor is kept: subscribing again with the same id resumes).
    Delete {
        /// The task id.
        task: String,
        /// The subscription's id.
        subscription_id: String,
    },
}

#[derive(Debug, Args)]
pub struct NotificationsArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub action: NotificationsAction,
}

#[derive(Debug, Subcommand)]
pub enum NotificationsAction {
    /// The status record: pending, delivered, parked, ... with its deliveries.
    Status {
        /// The notification id (a client's `event_id`, or `ntf:<seq>` for a routed one).
        id: String,
    },
}

#[derive(Debug, Args)]
pub struct RoutesArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub action: RoutesAction,
}

#[derive(Debug, Subcommand)]
#[expect(
    clippy::large_enum_variant,
    reason = "a command line's arguments, parsed once per run"
)]
pub enum RoutesAction {
    /// Every route: the configuration file's and those managed through the API.
    List,
    /// One route.
    Show {
        /// The route's name.
        name: String,
    },
    /// Create or change a route (`route.updated` with the reason), used by every node from the
    /// next event on. The flags set the keys they name, the others (the secret too) are kept;
    /// --json gives any key (delay, quiet_hours, templates, …); `null` removes a key.
    Set {
        /// The route's name (a-z, 0-9, _ and -).
        name: String,
        /// app, email or webhook.
        #[arg(long, value_parser = ["app", "email", "webhook"])]
        sink: Option<String>,
        /// A webhook's endpoint (http:// or https://), or env:NAME to read it from each node's
        /// environment.
        #[arg(long = "webhook-url")]
        webhook_url: Option<String>,
        /// A webhook's signing secret: env:NAME (each node reads it from its environment; a
        /// secret on a command line is visible to other users of the machine).
        #[arg(long = "webhook-secret", conflicts_with = "no_signing")]
        webhook_secret: Option<String>,
        /// Stop signing the webhook's requests (removes its secret; a receiver that verifies
        /// signatures will refuse them).
        #[arg(long = "no-signing")]
        no_signing: bool,
        /// The list a notification naming no recipient or list is delivered to.
        #[arg(long)]
        list: Option<String>,
        /// Only notifications of this type take the route (repeatable).
        #[arg(long = "type")]
        types: Vec<String>,
        /// A priority whose routing includes the route (repeatable): urgent, action, warning,
        /// info.
        #[arg(long = "priority", value_parser = ["urgent", "action", "warning", "info"])]
        priorities: Vec<String>,
        /// What a webhook's receiver is sent: tidemark, slack, teams or discord (a template
        /// goes in --json as {"body": {"template": …}}).
        #[arg(long, value_parser = ["tidemark", "slack", "teams", "discord"])]
        body: Option<String>,
        /// At most one delivery per key in flight, in seq order: endpoint, task or recipient.
        #[arg(long = "order-by", value_parser = ["endpoint", "task", "recipient"])]
        order_by: Option<String>,
        /// With --order-by: whether a parked delivery holds its key (hold, the default) or
        /// lets the next go (skip).
        #[arg(long = "on-park", value_parser = ["hold", "skip"], requires = "order_by")]
        on_park: Option<String>,
        /// At most this many attempts per second, minute or hour: <n>/<s|m|h> (10/s).
        #[arg(long)]
        rate: Option<String>,
        /// Other keys of the route, as a JSON object (the flags win over it).
        #[arg(long)]
        json: Option<String>,
        /// Why, recorded on the event.
        #[arg(long)]
        reason: String,
    },
    /// What a webhook route sends (its body and headers) for a sample notification, or for
    /// a delivery, rendered by the server without sending.
    Preview {
        /// The route's name.
        name: String,
        /// Render this delivery (dlv:<notification id>:<route>) instead of the sample.
        #[arg(long)]
        delivery: Option<String>,
    },
    /// Delete a route managed through the API (recorded as `route.deleted` with the reason).
    Delete {
        /// The route's name.
        name: String,
        /// Why, recorded on the event.
        #[arg(long)]
        reason: String,
    },
}

#[derive(Debug, Args)]
pub struct EndpointsArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub action: EndpointsAction,
}

#[derive(Debug, Subcommand)]
pub enum EndpointsAction {
    /// Every delivering route's endpoint: state (ok, failing, open, disabled), attempts,
    /// failures in a row, the last failure's code.
    List,
    /// Disable an endpoint (recorded as `endpoint.disabled` with the reason): its deliveries
    /// wait, spending no attempt, until it is enabled.
    Disable {
        /// The route.
        route: String,
        /// Why, recorded on the event.
        #[arg(long)]
        reason: String,
    },
    /// Enable an endpoint (recorded as `endpoint.enabled` with the reason): its deliveries go
    /// again, and an open circuit closes.
    Enable {
        /// The route.
        route: String,
        /// Why, recorded on the event.
        #[arg(long)]
        reason: String,
    },
}

#[derive(Debug, Args)]
pub struct ListsArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub action: ListsAction,
}

#[derive(Debug, Subcommand)]
pub enum ListsAction {
    /// Every list with its members.
    List,
    /// One list.
    Show {
        /// The list's name.
        name: String,
    },
    /// Create a list or replace its members (recorded as `list.updated` with the reason).
    Set {
        /// The list's name.
        name: String,
        /// The members: email addresses (or other addresses the list's routes deliver to).
        #[arg(required = true)]
        members: Vec<String>,
        /// Why, recorded on the event.
        #[arg(long)]
        reason: String,
    },
    /// Delete a list (recorded as `list.deleted` with the reason); deliveries to it then
    /// park `unknown_list`.
    Delete {
        /// The list's name.
        name: String,
        /// Why, recorded on the event.
        #[arg(long)]
        reason: String,
    },
}

#[derive(Debug, Args)]
pub struct ConfigArgs {
    #[command(subcommand)]
    pub action: ConfigAction,
}

#[derive(Debug, Subcommand)]
pub enum ConfigAction {
    /// Print the effective configuration: TOML (`-o table`, the default), or one JSON object
    /// (`-o json` or `-o jsonl`).
    Show {
        /// TOML config file.
        #[arg(long, env = "TIDEMARK_CONFIG")]
        config: Option<PathBuf>,
        /// table (TOML, the default) or json/jsonl (one JSON object).
        #[arg(short = 'o', long = "output", value_enum)]
        output: Option<Output>,
    },
}

#[derive(Debug, Args)]
pub struct CursorsArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub action: CursorsAction,
}

#[derive(Debug, Subcommand)]
pub enum CursorsAction {
    /// One cursor (with --stream), all of a consumer's cursors, or with --lag every cursor's lag.
    Show {
        /// e.g. `bridge_task_subscription:<subscription_id>`.
        #[arg(long)]
        consumer: Option<String>,
        /// The stream of the one cursor to show.
        #[arg(long)]
        stream: Option<String>,
        /// The subject of that cursor (empty: the whole stream's).
        #[arg(long, default_value = "")]
        subject: String,
        /// Every cursor with its lag in events and seconds, and whether it is stalled or stopped
        /// (with the reason it stopped).
        #[arg(long)]
        lag: bool,
    },
    /// Move a cursor to --to (also down); recorded as a `cursor.reset` event with the reason.
    Reset {
        /// The consumer whose cursor moves.
        #[arg(long)]
        consumer: String,
        /// The cursor's stream.
        #[arg(long)]
        stream: String,
        /// The cursor's subject (empty: the whole stream's).
        #[arg(long, default_value = "")]
        subject: String,
        /// The seq it is to stand at: the next delivery is of the events after it.
        #[arg(long)]
        to: u64,
        /// Why, recorded on the `cursor.reset` event.
        #[arg(long)]
        reason: String,
    },
}

#[derive(Debug, Args)]
pub struct SourcesArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub action: SourcesAction,
}

#[derive(Debug, Subcommand)]
pub enum SourcesAction {
    /// Every source with its state.
    List,
    /// One source with its state.
    Show {
        /// The source's name (`[[sources]] name`).
        name: String,
    },
    /// Poll now.
    Poll {
        /// The source's name.
        name: String,
    },
    /// Stop polling until resumed.
    Pause {
        /// The source's name.
        name: String,
        /// Why, recorded on the `source.paused` event.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Resume a paused or parked source, from the same watermark: a cron source polls at its
    /// schedule's next time, an every source at once; --now polls at once.
    Resume {
        /// The source's name.
        name: String,
        /// Poll at once instead of at the schedule's next time.
        #[arg(long)]
        now: bool,
    },
    /// Set the watermark (also back; omit --watermark to start from the beginning), with a
    /// reason recorded as a `source.reset` event.
    Reset {
        /// The source's name.
        name: String,
        /// The watermark to poll after (the upstream's cursor value, e.g. an item id).
        #[arg(long)]
        watermark: Option<String>,
        /// Why, recorded on the `source.reset` event.
        #[arg(long)]
        reason: String,
    },
}

#[derive(Debug, Args)]
pub struct DeliveriesArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub action: DeliveriesAction,
}

#[derive(Debug, Subcommand)]
#[expect(
    clippy::large_enum_variant,
    reason = "parsed once per process from the command line; boxing the filters buys nothing"
)]
pub enum DeliveriesAction {
    /// Deliveries, newest first (or by id), filtered (all pages unless --limit); `-o jsonl` prints each page as it
    /// comes.
    List {
        /// queued, leased, retry_wait, sent, parked, discarded, skipped, cancelled.
        #[arg(long)]
        status: Option<String>,
        /// Only deliveries to this sink (`none`: the skipped ones no sink takes).
        #[arg(long, value_parser = ["app", "email", "webhook", "none"])]
        sink: Option<String>,
        /// Only deliveries of this route (a `[notifications.routes.<name>]`).
        #[arg(long)]
        route: Option<String>,
        /// Only deliveries to this recipient.
        #[arg(long)]
        recipient: Option<String>,
        /// Only deliveries carrying this notification (a digest it joined too; a redacted
        /// delivery is found by the notification id as well).
        #[arg(long)]
        notification_id: Option<String>,
        /// Only deliveries of notifications from this `source.site_id`.
        #[arg(long)]
        source_site: Option<String>,
        /// Only deliveries created at or after this time (RFC 3339, e.g.
        /// 2026-11-28T09:00:00Z).
        #[arg(long)]
        created_after: Option<String>,
        /// Only deliveries created before this time (RFC 3339).
        #[arg(long)]
        created_before: Option<String>,
        /// Only deliveries whose title (or a digest item's) contains this text, any case.
        #[arg(long)]
        search: Option<String>,
        /// Only deliveries of notifications of this type.
        #[arg(long = "type")]
        ntype: Option<String>,
        /// Only deliveries to this notification list.
        #[arg(long)]
        list: Option<String>,
        /// Only stuck deliveries (`true`: due for longer than `outbox.stuck_after`, nobody
        /// finishing them) or only the others (`false`).
        #[arg(long)]
        stuck: Option<bool>,
        /// newest (the most recently created first) or id.
        #[arg(long, value_enum, default_value = "newest")]
        order: ListOrder,
        /// Stop after this many.
        #[arg(long)]
        limit: Option<u64>,
    },
    /// Put a parked delivery back in the queue (attempts reset).
    Retry {
        /// The delivery id (`dlv:<notification_id>:<route>`).
        id: String,
        /// Why, recorded on the `delivery.retried` event.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Give up on a parked delivery.
    Discard {
        /// The delivery id (`dlv:<notification_id>:<route>`).
        id: String,
        /// Why, recorded on the `delivery.discarded` event.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Send a sent delivery again: a new attempt with the same id (`delivery.resent`).
    Resend {
        /// The delivery id (`dlv:<notification_id>:<route>`).
        id: String,
        /// Why, recorded on the `delivery.resent` event.
        #[arg(long)]
        reason: String,
    },
    /// Retry every parked delivery of a route made since a time (at most 10,000 per call).
    Recover {
        /// The route.
        #[arg(long)]
        route: String,
        /// Deliveries made at or after this time (RFC 3339, e.g. 2026-11-28T09:00:00Z).
        #[arg(long)]
        since: String,
        /// Why, recorded on each `delivery.retried` event.
        #[arg(long)]
        reason: String,
    },
}

/// The order of a listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ListOrder {
    /// The most recently created first.
    Newest,
    /// By id.
    Id,
}

#[derive(Debug, Args)]
pub struct ProjectionsArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// The shard (`log.shards`) whose models: shard 0 when absent.
    #[arg(long, global = true)]
    pub shard: Option<u32>,
    #[command(subcommand)]
    pub action: ProjectionsAction,
}

#[derive(Debug, Subcommand)]
pub enum ProjectionsAction {
    /// Each projection's checkpoint, lag and digest.
    List,
    /// Rebuild one projection from the log and switch to it; prints its report. On a terminal,
    /// one that runs longer than half a second shows its progress on stderr.
    Rebuild {
        /// The projection (`tidemark projections list` names them).
        name: String,
    },
    /// Rebuild into scratch tables and compare with the live model: the report of the one
    /// named, or of every one (`-o json`: one array). Exits non-zero when one differs.
    Verify {
        /// The projection; every projection when absent.
        name: Option<String>,
    },
}

/// `--listen`: an address (`127.0.0.1:7700`, `[::1]:7700`) or a host name and port
/// (`localhost:7700`), resolved now, its IPv4 address first.
fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse() {
        return Ok(a);
    }
    let bad = |why: String| {
        format!("{s:?} is not HOST:PORT ({why}); for example 127.0.0.1:7700 or localhost:7700")
    };
    let addrs: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(s)
        .map_err(|e| bad(e.to_string()))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| bad("the name resolves to no address".into()))
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Data directory (default ./tidemark-data).
    #[arg(long, env = "TIDEMARK_DATA")]
    pub data: Option<PathBuf>,
    /// Listen address, HOST:PORT (default 127.0.0.1:7700; a name such as localhost:7700 is
    /// resolved, IPv4 first).
    #[arg(long, env = "TIDEMARK_LISTEN", value_parser = parse_listen)]
    pub listen: Option<SocketAddr>,
    /// TOML config file.
    #[arg(long, env = "TIDEMARK_CONFIG")]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ClientArgs {
    /// Server base URL; `host:port` alone (127.0.0.1:7700, localhost:7700, [::1]:7700) means
    /// http://host:port.
    #[arg(
        long,
        global = true,
        env = "TIDEMARK_URL",
        default_value = "http://127.0.0.1:7700"
    )]
    pub url: String,
    /// Bearer token.
    #[arg(long, global = true, env = "TIDEMARK_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The tenant to act for (requests go under /tenants/TENANT); none: the token's, or default.
    #[arg(long, global = true, env = "TIDEMARK_TENANT")]
    pub tenant: Option<String>,
    /// How records are printed on stdout: table (aligned columns; the default on a terminal),
    /// json (one JSON document: an array of the records, or the one record; the default
    /// otherwise), jsonl (one JSON record per line). Errors go to stderr in words; under
    /// `-o json|jsonl` a refusal by the server is its problem JSON document instead.
    #[arg(short = 'o', long = "output", global = true, value_enum)]
    pub output: Option<Output>,
}

impl ClientArgs {
    pub fn output(&self) -> Output {
        Output::resolve(self.output)
    }
}

#[derive(Debug, Args)]
pub struct AppendArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// JSON-lines file; stdin when absent.
    pub file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct TailArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Start after this seq.
    #[arg(long, default_value_t = 0)]
    pub after: u64,
    /// Only events of this stream.
    #[arg(long)]
    pub stream: Option<String>,
    /// Only events of this subject.
    #[arg(long)]
    pub subject: Option<String>,
    /// Only events of this type.
    #[arg(long = "type")]
    pub event_type: Option<String>,
    /// Exit after this many events.
    #[arg(long)]
    pub count: Option<u64>,
}

#[cfg(test)]
mod tests;
