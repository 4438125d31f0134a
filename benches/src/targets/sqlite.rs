//! SQLite in this process (bundled), WAL with `synchronous = FULL` (each commit fsyncs the WAL):
//! the same table and inserts as PostgreSQL. One connection per client, each commit in
//! `BEGIN IMMEDIATE` so writers queue on the write lock (`busy_timeout` bounds the wait; at
//! hundreds of clients a cell can time out, and is reported as failed).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, params};

use super::tidemark::temp_dir_in;
use super::{Page, StartOpts, Target};
use crate::events::{BenchEvent, EVENT_TYPE, STREAM};
use crate::measure::Proc;

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id TEXT NOT NULL UNIQUE,
    stream TEXT NOT NULL,
    subject TEXT NOT NULL,
    type TEXT NOT NULL,
    payload TEXT NOT NULL CHECK (json_valid(payload)),
    time TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX IF NOT EXISTS events_stream_subject_seq ON events (stream, subject, seq);";

const INSERT: &str = "INSERT INTO events (event_id, stream, subject, type, payload)
    VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (event_id) DO NOTHING";

const READ: &str = "SELECT seq, event_id, stream, subject, type, payload
    FROM events WHERE seq > ?1 ORDER BY seq LIMIT ?2";

pub struct Sqlite {
    path: PathBuf,
    dir: Arc<tempfile::TempDir>,
}

fn open(path: &PathBuf) -> Result<Connection, String> {
    let c = Connection::open(path).map_err(|e| format!("sqlite open: {e}"))?;
    c.pragma_update(None, "journal_mode", "WAL")
        .map_err(|e| e.to_string())?;
    c.pragma_update(None, "synchronous", "FULL")
        .map_err(|e| e.to_string())?;
    c.busy_timeout(std::time::Duration::from_secs(30))
        .map_err(|e| e.to_string())?;
    Ok(c)
}

impl Sqlite {
    pub async fn start(o: &StartOpts) -> Result<Self, String> {
        let dir = temp_dir_in(&o.work, "sqlite-")?;
        let path = dir.path().join("events.db");
        let c = open(&path)?;
        c.execute_batch(SCHEMA)
            .map_err(|e| format!("schema: {e}"))?;
        Ok(Sqlite {
            path,
            dir: Arc::new(dir),
        })
    }
}

/// Runs `f` on the connection on the blocking pool.
async fn with_conn<R: Send + 'static>(
    conn: &Arc<Mutex<Connection>>,
    f: impl FnOnce(&mut Connection) -> Result<R, String> + Send + 'static,
) -> Result<R, String> {
    let conn = conn.clone();
    tokio::task::spawn_blocking(move || {
        let mut c = conn
            .lock()
            .map_err(|_| "connection lock poisoned".to_owned())?;
        f(&mut c)
    })
    .await
    .map_err(|e| e.to_string())?
}

impl Target for Sqlite {
    type Conn = Arc<Mutex<Connection>>;
    type Batch = Vec<BenchEvent>;
    type Pos = i64;

    fn name(&self) -> &'static str {
        "sqlite"
    }

    fn proc(&self) -> Proc {
        Proc::This
    }

    fn data_dir(&self) -> Option<&std::path::Path> {
        Some(self.dir.path())
    }

    async fn connect(&self) -> Result<Self::Conn, String> {
        let path = self.path.clone();
        let c = tokio::task::spawn_blocking(move || open(&path))
            .await
            .map_err(|e| e.to_string())??;
        Ok(Arc::new(Mutex::new(c)))
    }

    fn prepare(&self, events: &[BenchEvent]) -> Vec<BenchEvent> {
        events.to_vec()
    }

    async fn append(&self, conn: &mut Self::Conn, batch: Vec<BenchEvent>) -> Result<(), String> {
        with_conn(conn, move |c| {
            let tx = c
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(|e| format!("BEGIN IMMEDIATE: {e}"))?;
            {
                let mut st = tx.prepare_cached(INSERT).map_err(|e| e.to_string())?;
                for e in &batch {
                    let n = st
                        .execute(params![
                            e.event_id, STREAM, e.subject, EVENT_TYPE, e.payload
                        ])
                        .map_err(|e| format!("INSERT: {e}"))?;
                    if n != 1 {
                        return Err("a duplicate event_id".into());
                    }
                }
            }
            tx.commit().map_err(|e| format!("COMMIT: {e}"))
        })
        .await
    }

    async fn read_from(
        &self,
        conn: &mut Self::Conn,
        pos: &i64,
        limit: usize,
    ) -> Result<Page<i64>, String> {
        let after = *pos;
        with_conn(conn, move |c| {
            let mut st = c.prepare_cached(READ).map_err(|e| e.to_string())?;
            let mut rows = st
                .query(params![after, limit as i64])
                .map_err(|e| e.to_string())?;
            let (mut events, mut bytes, mut next) = (0, 0, after);
            while let Some(r) = rows.next().map_err(|e| e.to_string())? {
                next = r.get::<_, i64>(0).map_err(|e| e.to_string())?;
                bytes += r
                    .get_ref(5)
                    .map_err(|e| e.to_string())?
                    .as_str()
                    .map_or(0, str::len);
                events += 1;
            }
            Ok(Page {
                events,
                bytes,
                next,
            })
        })
        .await
    }

    async fn stop(self) {}
}
