//! `Claim`: lease the due deliveries of a sink to an owner.

use super::*;

/// Lease up to `limit` due deliveries of `sink` to `owner` for `lease_ms`; answers the rows
/// now leased.
#[derive(Debug, Clone)]
pub struct Claim {
    pub sink: Sink,
    pub owner: String,
    pub limit: usize,
    pub lease_ms: u64,
    /// This node's share of the due deliveries, taken first ([`tidemark_log::Share::ALL`] on a
    /// single node).
    pub share: tidemark_log::Share,
}

impl Command for Claim {
    type Answer = Vec<Delivery>;

    /// Claim due deliveries of `sink`, the most pressing priority first (urgent, action, warning,
    /// info), oldest due first within one: queued, retry_wait past its next attempt, leased past
    /// its lease (released first). Suppression is re-checked: a delivery to a recipient
    /// suppressed now is skipped instead. Answers the leased rows.
    fn decide(&self, txn: &ModelsTxn, round: &mut Round<'_>) -> DecideResult<Self::Answer> {
        let (sink, limit, share, now_us) = (self.sink, self.limit, self.share, round.now_us);
        let mut st = d::View::new(txn)?;
        let mut l = Lease {
            now_us,
            settings: st.settings_at(u64::MAX)?,
            privacy: round.privacy,
            owner: &self.owner,
            lease_ms: self.lease_ms,
            share,
            leased: Vec::new(),
            events: Vec::new(),
        };
        // An open circuit's probe first: one delivery of the route, once its cool-down (or
        // the previous probe's lease) has passed; the route's others keep waiting.
        for (route, id) in circuit::probes(&mut st, sink, now_us)? {
            if l.leased.len() >= limit || round.touches(Stream::Endpoints.as_str(), &route) {
                continue;
            }
            if let Some(row) = l.take(&mut st, round, &id)? {
                let until = row.lease_expires_at_us.unwrap_or(now_us);
                l.events.push(circuit::probed(&row, now_us, until)?);
                l.leased.push(row);
            }
        }
        for rank in 0..d::PRIORITY_RANKS {
            let mut after = None;
            while l.leased.len() < limit {
                // Among the next due deliveries, this node's share first (spec section 16):
                // claimers on several nodes of a cluster take different deliveries in a storm
                // instead of racing for the same ones; another share's are taken when this
                // one's run short.
                let want = (limit - l.leased.len()) * share.of.max(1);
                let (ids, end) = st.due(sink, rank, now_us, after.as_ref(), want)?;
                if ids.is_empty() {
                    break;
                }
                let (own, others): (Vec<&String>, Vec<&String>) =
                    ids.iter().partition(|id| share.owns(id));
                for id in own.into_iter().chain(others) {
                    if l.leased.len() >= limit {
                        break;
                    }
                    if let Some(row) = l.take(&mut st, round, id)? {
                        l.leased.push(row);
                    }
                }
                after = end;
            }
        }
        // A delivering sink's lease rests on its route's endpoint not holding it: appended on
        // the condition that no endpoint event of those routes came in since (a circuit that
        // opened on another decider refuses this claim, which is decided again).
        let mut d = Decided::new(l.leased, l.events);
        if delivering(Some(sink)) {
            let mut routes: Vec<&str> = d.answer.iter().map(|r| r.route.as_str()).collect();
            routes.sort_unstable();
            routes.dedup();
            d.reads = routes
                .into_iter()
                .map(|r| (Stream::Endpoints.as_str().to_owned(), r.to_owned()))
                .collect();
        }
        Ok(d)
    }
}
