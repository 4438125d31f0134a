//! PostgreSQL as the transactional outbox its users build: an events table with a `seq`
//! identity, `UNIQUE(event_id)` and an index on (stream, subject, seq); `INSERT … ON CONFLICT
//! DO NOTHING`, one transaction per request; `synchronous_commit = on` (the default: the commit
//! waits for the WAL fsync). The server runs as the `postgres` user when the benchmark is root.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio_postgres::{Client, NoTls, Statement};

use super::tidemark::temp_dir_in;
use super::{Page, StartOpts, Target};
use crate::events::{BenchEvent, EVENT_TYPE, STREAM};
use crate::measure::Proc;
use crate::peers::{ChildServer, free_port, postgres_bin_dir, wait_until};

const SCHEMA: &str = "CREATE TABLE events (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id text NOT NULL UNIQUE,
    stream text NOT NULL,
    subject text NOT NULL,
    type text NOT NULL,
    payload json NOT NULL,
    time timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX events_stream_subject_seq ON events (stream, subject, seq);";

const INSERT: &str = "INSERT INTO events (event_id, stream, subject, type, payload)
    SELECT e, s, sub, t, p::json
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])
        WITH ORDINALITY AS u(e, s, sub, t, p, ordinality)
    ORDER BY ordinality
    ON CONFLICT (event_id) DO NOTHING";

const READ: &str = "SELECT seq, event_id, stream, subject, type, payload::text
    FROM events WHERE seq > $1 ORDER BY seq LIMIT $2";

pub struct Postgres {
    server: ChildServer,
    conninfo: String,
    /// For the WAL position.
    admin: Client,
}

pub struct PgConn {
    client: Client,
    insert: Statement,
    read: Statement,
}

/// (uid, gid) of the `postgres` user, when this process is root (PostgreSQL refuses root).
fn run_as() -> Result<Option<(u32, u32)>, String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Ok(None);
    }
    let user = nix::unistd::User::from_name("postgres")
        .map_err(|e| e.to_string())?
        .ok_or("no `postgres` user to run PostgreSQL as (run benches/peers/install.sh)")?;
    Ok(Some((user.uid.as_raw(), user.gid.as_raw())))
}

fn chown_tree(dir: &Path, ids: Option<(u32, u32)>) -> Result<(), String> {
    if let Some((uid, gid)) = ids {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid))
            .map_err(|e| format!("chown {}: {e}", dir.display()))?;
    }
    Ok(())
}

/// Every directory from `dir` up is searchable by other users.
fn searchable_by_others(dir: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    dir.ancestors()
        .all(|d| std::fs::metadata(d).is_ok_and(|m| m.permissions().mode() & 0o001 != 0))
}

impl Postgres {
    /// The server's connection string (the queue workload opens its own connections).
    pub fn conninfo(&self) -> &str {
        &self.conninfo
    }

    /// A new connection to the server.
    pub async fn client(&self) -> Result<Client, String> {
        connect(&self.conninfo).await
    }

    pub async fn start(o: &StartOpts) -> Result<Self, String> {
        let bin = postgres_bin_dir().ok_or("PostgreSQL is not installed")?;
        let ids = run_as()?;
        // The postgres user must be able to reach its directory; if the work directory is
        // under one it cannot search (a home directory), use /var/tmp (not tmpfs) instead.
        let parent = if ids.is_none() || searchable_by_others(&o.work) {
            o.work.clone()
        } else {
            let alt = std::path::PathBuf::from("/var/tmp");
            eprintln!(
                "  postgres: {} is not searchable by the postgres user; its data goes in {}",
                o.work.display(),
                alt.display()
            );
            alt
        };
        let dir = temp_dir_in(&parent, "tidemark-bench-postgres-")?;
        let data = dir.path().join("data");
        std::fs::create_dir(&data).map_err(|e| e.to_string())?;
        chown_tree(dir.path(), ids)?;
        chown_tree(&data, ids)?;
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "bench",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-instructions",
            ])
            .env("LC_ALL", "C");
        if let Some((uid, gid)) = ids {
            initdb.uid(uid).gid(gid);
        }
        let out = initdb
            .output()
            .map_err(|e| format!("cannot run initdb: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let port = free_port()?;
        let mut cmd = Command::new(bin.join("postgres"));
        cmd.arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-k"])
            .arg(dir.path())
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "fsync=on", "-c", "synchronous_commit=on"])
            .args(["-c", "full_page_writes=on"])
            .args(["-c", &format!("max_connections={}", o.max_clients + 20)])
            .args(["-c", "shared_buffers=512MB", "-c", "max_wal_size=4GB"])
            .env("LC_ALL", "C");
        if let Some((uid, gid)) = ids {
            cmd.uid(uid).gid(gid);
        }
        // SIGINT: "fast" shutdown (SIGTERM would wait for clients to leave).
        let mut server = ChildServer::spawn("postgres", cmd, dir, Signal::SIGINT)?;
        let conninfo = format!("host=127.0.0.1 port={port} user=bench dbname=postgres");
        let admin = wait_until(&mut server, Duration::from_secs(60), || {
            let ci = conninfo.clone();
            async move { connect(&ci).await }
        })
        .await?;
        admin
            .batch_execute(SCHEMA)
            .await
            .map_err(|e| format!("schema: {e}"))?;
        Ok(Postgres {
            server,
            conninfo,
            admin,
        })
    }
}

async fn connect(conninfo: &str) -> Result<Client, String> {
    let (client, conn) = tokio_postgres::connect(conninfo, NoTls)
        .await
        .map_err(|e| format!("postgres connect: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// Columns of a batch, as the arrays `unnest` takes.
pub struct PgBatch {
    ids: Vec<String>,
    streams: Vec<&'static str>,
    subjects: Vec<String>,
    types: Vec<&'static str>,
    payloads: Vec<String>,
}

impl Target for Postgres {
    type Conn = PgConn;
    type Batch = PgBatch;
    type Pos = i64;

    fn name(&self) -> &'static str {
        "postgres"
    }

    fn proc(&self) -> Proc {
        Proc::Tree(self.server.pid)
    }

    fn data_dir(&self) -> Option<&Path> {
        self.server.data_dir()
    }

    async fn connect(&self) -> Result<PgConn, String> {
        let client = connect(&self.conninfo).await?;
        let insert = client.prepare(INSERT).await.map_err(|e| e.to_string())?;
        let read = client.prepare(READ).await.map_err(|e| e.to_string())?;
        Ok(PgConn {
            client,
            insert,
            read,
        })
    }

    fn prepare(&self, events: &[BenchEvent]) -> PgBatch {
        PgBatch {
            ids: events.iter().map(|e| e.event_id.clone()).collect(),
            streams: vec![STREAM; events.len()],
            subjects: events.iter().map(|e| e.subject.clone()).collect(),
            types: vec![EVENT_TYPE; events.len()],
            payloads: events.iter().map(|e| e.payload.clone()).collect(),
        }
    }

    async fn append(&self, c: &mut PgConn, b: PgBatch) -> Result<(), String> {
        let n = c
            .client
            .execute(
                &c.insert,
                &[&b.ids, &b.streams, &b.subjects, &b.types, &b.payloads],
            )
            .await
            .map_err(|e| format!("INSERT: {e}"))?;
        if n as usize != b.ids.len() {
            return Err(format!(
                "INSERT took {n} of {} rows: a duplicate event_id",
                b.ids.len()
            ));
        }
        Ok(())
    }

    async fn read_from(
        &self,
        c: &mut PgConn,
        pos: &i64,
        limit: usize,
    ) -> Result<Page<i64>, String> {
        let rows = c
            .client
            .query(&c.read, &[pos, &(limit as i64)])
            .await
            .map_err(|e| format!("SELECT: {e}"))?;
        let bytes = rows.iter().map(|r| r.get::<_, &str>(5).len()).sum();
        Ok(Page {
            events: rows.len(),
            bytes,
            next: rows.last().map(|r| r.get::<_, i64>(0)).unwrap_or(*pos),
        })
    }

    async fn extra_written(&self) -> Option<u64> {
        let row = self
            .admin
            .query_one("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint", &[])
            .await
            .ok()?;
        u64::try_from(row.get::<_, i64>(0)).ok()
    }

    async fn stop(mut self) {
        drop(self.admin);
        self.server.stop();
    }
}
