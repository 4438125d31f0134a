//! Workloads over a filled log, generic over [`Target`]: read it back from the start, and the
//! append rate as it grows.

use std::time::Instant;

use serde::Serialize;

use crate::measure::{Percentiles, micros, new_histogram, round1, round3};
use crate::targets::Target;
use crate::workloads::Rig;

#[derive(Serialize, Clone, serde::Deserialize)]
pub struct ReadbackResult {
    pub system: String,
    pub events: u64,
    pub pages: u64,
    pub seconds: f64,
    pub events_per_sec: f64,
    pub mb_per_sec: f64,
    /// Per page.
    pub latency_us: Percentiles,
    pub error: Option<String>,
}

/// Make sure the target holds at least `events` events (batches of 1000, 4 clients).
pub async fn fill<T: Target>(rig: &mut Rig<T>, events: u64) -> Result<(), String> {
    let have = rig.appended;
    if have >= events {
        return Ok(());
    }
    let d = rig.run(4, 1000, events - have, None).await;
    d.error.map_or(Ok(()), Err)
}

/// Read `events` events from the start in pages of 1000.
pub async fn readback<T: Target>(rig: &mut Rig<T>, events: u64) -> ReadbackResult {
    let mut r = ReadbackResult {
        system: rig.target.name().to_owned(),
        events: 0,
        pages: 0,
        seconds: 0.0,
        events_per_sec: 0.0,
        mb_per_sec: 0.0,
        latency_us: Percentiles::default(),
        error: None,
    };
    if let Err(e) = rig.ensure_conns(1).await {
        r.error = Some(e);
        return r;
    }
    let mut pos = T::Pos::default();
    let mut h = new_histogram();
    let mut bytes = 0usize;
    let t0 = Instant::now();
    while r.events < events {
        let t = Instant::now();
        let limit = (events - r.events).min(1000) as usize;
        match rig.target.read_from(&mut rig.conns[0], &pos, limit).await {
            Ok(page) => {
                h.saturating_record(micros(t.elapsed()));
                if page.events == 0 {
                    r.error = Some(format!("the log ended after {} events", r.events));
                    break;
                }
                r.events += page.events as u64;
                r.pages += 1;
                bytes += page.bytes;
                pos = page.next;
            }
            Err(e) => {
                r.error = Some(e);
                break;
            }
        }
    }
    let s = t0.elapsed().as_secs_f64().max(1e-9);
    r.seconds = round3(s);
    r.events_per_sec = (r.events as f64 / s).round();
    r.mb_per_sec = round1(bytes as f64 / s / 1e6);
    r.latency_us = Percentiles::from(&h);
    r
}

#[derive(Serialize, Clone, serde::Deserialize)]
pub struct GrowthStep {
    /// Events in the log at the end of this step.
    pub upto: u64,
    pub events_per_sec: f64,
    pub p99_us: u64,
    /// The longest time in this step with a request in flight and no append completing.
    #[serde(default)]
    pub longest_pause_us: u64,
}

#[derive(Serialize, Clone, serde::Deserialize)]
pub struct GrowthResult {
    pub system: String,
    pub clients: usize,
    pub batch: usize,
    pub steps: Vec<GrowthStep>,
    /// Rate of the last step ÷ rate of the first.
    pub last_over_first: f64,
    pub error: Option<String>,
}

/// Append batches of 1000 from 4 clients until the target holds `total` events, one rate per
/// `step` events.
pub async fn growth<T: Target>(rig: &mut Rig<T>, total: u64, step: u64) -> GrowthResult {
    let mut g = GrowthResult {
        system: rig.target.name().to_owned(),
        clients: 4,
        batch: 1000,
        steps: Vec::new(),
        last_over_first: 0.0,
        error: None,
    };
    let step = step.max(1000);
    while rig.appended < total {
        let n = step.min(total - rig.appended);
        let d = rig.run(g.clients, g.batch, n, None).await;
        if let Some(e) = d.error {
            g.error = Some(e);
            break;
        }
        let s = GrowthStep {
            upto: rig.appended,
            events_per_sec: (d.events as f64 / d.seconds.max(1e-9)).round(),
            p99_us: d.hist.value_at_quantile(0.99),
            longest_pause_us: u64::try_from(d.longest_pause.as_micros()).unwrap_or(u64::MAX),
        };
        eprintln!(
            "  growth {:<16} {:>10} events  {:>9} events/s  p99 {} µs  pause {} µs",
            g.system, s.upto, s.events_per_sec, s.p99_us, s.longest_pause_us
        );
        g.steps.push(s);
    }
    if let (Some(a), Some(b)) = (g.steps.first(), g.steps.last()) {
        g.last_over_first = round3(b.events_per_sec / a.events_per_sec.max(1e-9));
    }
    g
}
