//! A pace per route (spec section 4, `rate = "<n>/<s|m|h>"`): the claims of this node's decider
//! lease at most its share of `n` deliveries of a route in any period (a sliding window of the
//! lease times); the others wait, due, spending no attempt, until a lease leaves the window.
//! On a cluster each node's decider keeps its share (`n` split over the nodes by their index,
//! [`tidemark_log::Share`]), so the shares sum to the rate. The pace is of attempts, not a fact
//! of the models: it lives in the decider's memory and starts empty after a restart.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use tidemark_projections::names::Sink;
use tidemark_projections::routing::Rate;

/// The lease times of each paced route within its window.
#[derive(Default)]
pub struct Pacer {
    routes: Mutex<HashMap<String, Window>>,
    /// The leases admitted by the command being decided, until the decider knows whether
    /// they were appended ([`Pacer::admitted`], [`Pacer::release`]).
    tentative: Mutex<Vec<(String, i64)>>,
}

struct Window {
    sink: Option<Sink>,
    rate: Rate,
    /// This node's part of `rate.n`.
    mine: u32,
    /// Lease times within the last period, oldest first.
    leased: VecDeque<i64>,
}

impl Window {
    fn slide(&mut self, now_us: i64) {
        let from = now_us - self.rate.per_ms as i64 * 1_000;
        while self.leased.front().is_some_and(|t| *t <= from) {
            self.leased.pop_front();
        }
    }

    /// When the next lease may be taken (`None`: now).
    fn free_at(&self) -> Option<i64> {
        if (self.leased.len() as u64) < u64::from(self.mine) {
            return None;
        }
        let oldest = self
            .leased
            .get(self.leased.len() - self.mine as usize)
            .copied();
        Some(oldest.map_or(i64::MAX, |t| t + self.rate.per_ms as i64 * 1_000))
    }
}

/// This node's part of `n` with `share`: `n ÷ of`, one more for the first `n mod of` nodes.
fn part(n: u32, share: tidemark_log::Share) -> u32 {
    let (n, of) = (n as usize, share.of.max(1));
    (n / of + usize::from(share.index < n % of)) as u32
}

impl Pacer {
    /// Whether a delivery of `route` (of `sink`, paced by `rate`) may be leased at `now_us`;
    /// counted as leased when it may.
    pub fn admit(
        &self,
        route: &str,
        sink: Option<Sink>,
        rate: Rate,
        share: tidemark_log::Share,
        now_us: i64,
    ) -> bool {
        let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        let mine = part(rate.n, share);
        let w = routes.entry(route.to_owned()).or_insert_with(|| Window {
            sink,
            rate,
            mine,
            leased: VecDeque::new(),
        });
        // A changed route paces by its new rate from now on.
        (w.sink, w.rate, w.mine) = (sink, rate, mine);
        w.slide(now_us);
        if w.free_at().is_some() {
            return false;
        }
        w.leased.push_back(now_us);
        self.tentative
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((route.to_owned(), now_us));
        true
    }

    /// The leases admitted since the last call: those of the command just decided.
    pub(crate) fn admitted(&self) -> Vec<(String, i64)> {
        std::mem::take(&mut *self.tentative.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Give back `leases` (admitted for a decision that was not appended: refused by the log,
    /// left to the next round, or failed): they never went out.
    pub(crate) fn release(&self, leases: &[(String, i64)]) {
        if leases.is_empty() {
            return;
        }
        let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        for (route, at) in leases {
            if let Some(w) = routes.get_mut(route)
                && let Some(i) = w.leased.iter().rposition(|t| t == at)
            {
                w.leased.remove(i);
            }
        }
    }

    /// When route `route` may lease again, if its window is full at `now_us`.
    pub fn paced_until(&self, route: &str, now_us: i64) -> Option<i64> {
        let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        let w = routes.get_mut(route)?;
        w.slide(now_us);
        w.free_at()
    }

    /// The earliest time a full route of `sink` may lease again (what a dispatcher that
    /// found due deliveries it could not take waits for).
    pub fn sink_paced_until(&self, sink: Sink, now_us: i64) -> Option<i64> {
        let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        routes
            .values_mut()
            .filter(|w| w.sink == Some(sink))
            .filter_map(|w| {
                w.slide(now_us);
                // A route this node has no share of is another node's to send.
                w.free_at().filter(|at| *at != i64::MAX)
            })
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

    #[test]
    fn at_most_n_in_any_period_and_the_shares_sum_to_n() {
        let p = Pacer::default();
        let rate = Rate {
            n: 3,
            per_ms: 1_000,
        };
        let all = tidemark_log::Share::ALL;
        let at = |t| p.admit("r", Some(Sink::Webhook), rate, all, t);
        assert!(at(0) && at(S / 10) && at(S / 5));
        assert!(!at(S / 2), "a fourth within the second");
        assert_eq!(p.paced_until("r", S / 2), Some(S));
        assert!(!at(S - 1), "the first is still within the second before");
        assert!(at(S), "a second after the first");
        assert_eq!(p.sink_paced_until(Sink::Webhook, S + 2), Some(S + S / 10));
        assert_eq!(p.sink_paced_until(Sink::Email, S + 2), None);
        // A decision that was not appended gives its leases back.
        let _ = p.admitted();
        assert!(!at(S + 3));
        assert!(p.admitted().is_empty(), "a refusal admits nothing");
        p.release(&[("r".to_owned(), S)]);
        assert!(at(S + 4), "the slot given back is taken again");
        assert_eq!(p.admitted(), [("r".to_owned(), S + 4)]);
        for n in [1, 2, 7, 10, 100] {
            for of in 1..5 {
                let sum: u32 = (0..of)
                    .map(|index| part(n, tidemark_log::Share { index, of }))
                    .sum();
                assert_eq!(sum, n, "{n} over {of} nodes");
            }
        }
    }
}
