//! Tenants through the engine (spec section 20): handles of three tenants over one log append
//! the same event ids and race compare-and-set cursor advances on the same cursor key at once,
//! and nothing crosses: each tenant's appends are its own events, each tenant's cursor moves
//! by its own advances alone (a stale expectation of another tenant's position would refuse),
//! each tenant reads its own events and rows, and a verify of every model reproduces the live
//! digests over all of them.

mod common;

use common::{engine_with_clock, rt};
use serde_json::json;
use tidemark_engine::commands::cursors::Advance;
use tidemark_log::NewEvent;

const TENANTS: [&str; 3] = ["default", "acme", "beta"];
const ADVANCES: u64 = 25;

#[test]
fn tenants_share_one_engine_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let rt = rt();
    let (engine, _clock) = engine_with_clock(dir.path(), 1_800_000_000_000_000);
    let handles: Vec<_> = TENANTS.iter().map(|t| engine.in_tenant(t)).collect();
    assert_eq!(handles[0].tenant(), "default");
    assert_eq!(handles[1].tenant(), "acme");

    // The same client event in every tenant: three events, none a duplicate.
    let order = |n: u64| {
        NewEvent::new(
            Some("order-1".into()),
            "orders",
            "o-1",
            "order.placed",
            &json!({ "n": n }),
        )
        .unwrap()
    };
    let mut seqs = Vec::new();
    for (i, h) in handles.iter().enumerate() {
        let r = rt
            .block_on(h.append_from_client(vec![order(i as u64)], 1000))
            .unwrap();
        assert!(
            !r.events[0].duplicate,
            "{}'s order-1 is its own",
            h.tenant()
        );
        seqs.push(r.events[0].seq);
    }
    // A resend in a tenant is that tenant's duplicate.
    let r = rt
        .block_on(handles[1].append_from_client(vec![order(1)], 1000))
        .unwrap();
    assert_eq!((r.events[0].seq, r.events[0].duplicate), (seqs[1], true));

    // Every tenant advances the same cursor key at once, each advance expecting the position
    // its own previous one left: were the tenants' cursors one, the races would refuse.
    rt.block_on(async {
        let runs = handles.iter().enumerate().map(|(t, h)| async move {
            let mut at = 0;
            for k in 1..=ADVANCES {
                let seq = k * 10 + t as u64;
                let (c, _) = h
                    .execute(Advance {
                        consumer_id: "c1".into(),
                        stream_name: "orders".into(),
                        subject_id: String::new(),
                        last_sequence: seq,
                        delivery_id: format!("d-{t}-{k}"),
                        expected_sequence: Some(at),
                    })
                    .await
                    .unwrap_or_else(|e| panic!("{}'s advance {k}: {e}", h.tenant()));
                assert_eq!(c.last_sequence, seq);
                at = seq;
            }
        });
        futures::future::join_all(runs).await;
    });
    for (t, h) in handles.iter().enumerate() {
        let q = h.read();
        let c = q.cursor("c1", "orders", "").unwrap();
        assert_eq!(c.last_sequence, ADVANCES * 10 + t as u64, "{}", h.tenant());
        assert_eq!(q.cursors(None, 100).unwrap().len(), 1, "{}", h.tenant());
        // The tenant's events alone: its order and its advances, each naming the tenant.
        let page = q
            .events(&tidemark_log::ReadQuery {
                limit: 1000,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(page.events.len() as u64, 1 + ADVANCES, "{}", h.tenant());
        assert!(page.events.iter().all(|e| e.tenant() == h.tenant()));
        assert_eq!(page.events[0].event_id, "order-1");
    }
    // A tenant never used has no cursor, no event.
    let idle = engine.in_tenant("idle");
    assert_eq!(
        idle.read()
            .cursor("c1", "orders", "")
            .unwrap()
            .last_sequence,
        0
    );

    // Verify every model: the live digests, over every tenant's tables, come back.
    for p in tidemark_projections::all() {
        let r = rt
            .block_on(engine.rebuild(p.name(), false, |_, _| {}))
            .unwrap()
            .unwrap();
        assert!(r.identical, "verify of {} diverged", p.name());
    }
    rt.block_on(engine.close());
}
