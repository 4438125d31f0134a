//! A log with its models store, for the fold tests: reads fold the models up to the head
//! first (the engine's decider does this in a server).

#![allow(
    dead_code,
    reason = "each test binary uses its part of the shared helpers"
)]

use tidemark_log::{Log, LogConfig, OpenReport};
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
