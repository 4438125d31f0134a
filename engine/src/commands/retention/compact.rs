//! `Compact`: the log drops its prefix before a cut no one still needs.

use super::*;

/// Drop the log's events older than the window (spec section 13, `compact_log`): every
/// projection first stores a snapshot at the head, and no event a live cursor still needs
/// goes. At most [`tidemark_log::COMPACT_MAX`] events per command: run it again while
/// it reports `more`. Answers what it dropped.
#[derive(Debug, Clone)]
pub struct Compact {
    pub window_ms: u64,
    /// The tenants whose cursors pin this log: `None` for the home shard, whose models hold
    /// the directory; for another shard, the tenants the directory places in it, removed ones
    /// too (spec section 20: its own models know no directory).
    pub tenants: Option<Vec<String>>,
}

impl Command for Compact {
    type Answer = CompactReport;

    const COMPACTION: Option<fn(&mut CompactReport) -> &mut CompactReport> = Some(the_report);

    /// Decide a compaction: the cut, and — when there is something to drop — every projection's
    /// snapshot at the head, written in `txn` (the decider commits it, durably, before it asks
    /// the log to drop the events: [`crate::decider`]). The report's `removed`, `first_seq` and
    /// `more` are filled in from the log's answer.
    fn decide(&self, txn: &ModelsTxn, round: &mut Round<'_>) -> DecideResult<Self::Answer> {
        let before = round
            .now_us
            .saturating_sub((self.window_ms as i64).saturating_mul(1_000));
        let window_cut = round.log.last_before(before).map_err(log_st)?;
        let cut = pinned_cut(txn, self.tenants.as_deref(), round.log, before, window_cut)?;
        let first = round.log.first_seq().map_err(log_st)?;
        let rep = CompactReport {
            window_cut,
            cut,
            first_seq: first,
            ..CompactReport::default()
        };
        if cut < first {
            return Ok(Decided::new(rep, Vec::new()));
        }
        // Every projection is at the head here: their snapshots are at or above any cut.
        tidemark_projections::Models::snapshot_all(txn)?;
        Ok(Decided::new(rep, Vec::new()))
    }
}
