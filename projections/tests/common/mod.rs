//! A log with its models store, for the fold tests: reads fold the models up to the head
//! first (the engine's decider does this in a server).

#![allow(
    dead_code,
    reason = "each test binary uses its part of the shared helpers"
)]

use tidemark_log::{Log, LogConfig, OpenReport};
use tidemark_projections::deliveries::Created;
use tidemark_projections::names::{DeliveryStatus, Priority, Sink};
use tidemark_projections::{Models, ModelsConfig};

pub struct Folded {
    pub log: Log,
    pub models: Models,
}

impl std::ops::Deref for Folded {
    type Target = Log;
    fn deref(&self) -> &Log {
        &self.log
    }
}

impl Folded {
    /// The log of `cfg` and a models store beside it.
    pub fn open(cfg: &LogConfig) -> (Folded, OpenReport) {
        let (log, rep) = Log::open(cfg).unwrap();
        let dir = cfg.path.parent().unwrap();
        let models = Models::open(&ModelsConfig::in_dir(dir)).unwrap();
        models.follow(&log, 4_096).unwrap();
        (Folded { log, models }, rep)
    }

    /// The models store, folded up to the head, for reads.
    pub fn db(&self) -> tidemark_projections::ModelsRead {
        self.models.follow(&self.log, 4_096).unwrap();
        self.models.read()
    }
}

/// Change the closed models store of `dir` in one write transaction, as another build (or a
/// fold that once did something else) would have left it.
pub fn edit_models(dir: &std::path::Path, edit: impl FnOnce(&redb::WriteTransaction)) {
    let db = redb::Database::open(dir.join("models.redb")).unwrap();
    let txn = db.begin_write().unwrap();
    edit(&txn);
    txn.commit().unwrap();
}

/// Rewrite the stored meta of projection `name` in `txn`.
pub fn edit_meta(
    txn: &redb::WriteTransaction,
    name: &str,
    edit: impl FnOnce(&mut tidemark_projections::Meta),
) {
    use redb::ReadableTable;
    let def: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("projections");
    let mut t = txn.open_table(def).unwrap();
    let mut m: tidemark_projections::Meta =
        postcard::from_bytes(t.get(name).unwrap().unwrap().value()).unwrap();
    edit(&mut m);
    t.insert(name, postcard::to_stdvec(&m).unwrap().as_slice())
        .unwrap();
}

/// The payload of a `delivery.created` of `delivery_id` for `notification_id` (the
/// notification and its source at `seq`): an urgent `app` delivery on route `desktop`, titled
/// `t`, queued at `at_us` and due then, with three attempts and nothing else set. Each test
/// sets what it varies.
pub fn created(delivery_id: String, notification_id: String, seq: u64, at_us: i64) -> Created {
    Created {
        delivery_id,
        notification_id,
        notification_seq: seq,
        source_seq: seq,
        route: "desktop".into(),
        sink: Some(Sink::App),
        recipient: None,
        priority: Priority::Urgent,
        title: "t".into(),
        body: None,
        sound: false,
        task_id: None,
        group_key: None,
        status: DeliveryStatus::Queued,
        reason: None,
        max_attempts: 3,
        created_at_us: at_us,
        next_attempt_at_us: at_us,
        delay_ms: None,
        quiet_hours_until_us: None,
        digest_until_us: None,
        digest_max_items: None,
        source_site: None,
        redacted: false,
        list: None,
        ntype: None,
        count: None,
        order_key: None,
        order_skips_parked: false,
    }
}
