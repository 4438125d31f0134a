//! Appends over HTTP: dense seqs from 1 (I1), idempotency by `event_id` and conflicts (I2),
//! atomic batches, paging with filters, and the `time` field.
//!
//! A fresh server's log already holds the `settings.updated` event it recorded at start, so
//! every expected seq is counted from the head seen at start (`base`), and the whole log is
//! still checked to be dense from 1.

use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_tests::{Server, ServerOpts, assert_problem, assert_problem_for};

use crate::common::{assert_dense_unique, check_time, ev, id_of, receipts, seq_of};

#[tokio::test]
async fn single_and_batch_get_dense_seqs_from_one() {
    let s = Server::start(ServerOpts::default()).await;
    let base = s.start_head();
    assert_eq!(
        s.head().await,
        base,
        "nothing but the server's own start events is in a new log"
    );

    let (st, body) = s
        .append(&ev("a-1", "orders", "o-1", "order.placed", json!({"n": 1})))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    assert_eq!(receipts(&body), vec![("a-1".to_owned(), base + 1, false)]);
    assert_eq!(body["last_seq"], base + 1, "{body}");

    // No event_id, no subject, no payload: the server makes the id; subject is "" and the
    // payload an empty object.
    let (st, body) = s
        .append(&json!({"stream": "orders", "type": "order.noted"}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    let r = receipts(&body);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].1, base + 2);
    assert!(!r[0].2);
    let generated = r[0].0.clone();
    assert!(
        !generated.is_empty()
            && generated.len() <= 128
            && generated
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._:-".contains(c)),
        "a server-made event_id must follow the event_id rule, got {generated:?}"
    );

    let batch: Vec<Value> = (0..5)
        .map(|i| {
            ev(
                &format!("b-{i}"),
                "orders",
                "o-2",
                "order.line",
                json!({"i": i}),
            )
        })
        .collect();
    let (st, body) = s.append(&json!({ "events": batch })).await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    let r = receipts(&body);
    assert_eq!(
        r,
        (0..5)
            .map(|i| (format!("b-{i}"), base + 3 + i, false))
            .collect::<Vec<_>>(),
        "a batch gets consecutive seqs in its order"
    );
    assert_eq!(body["last_seq"], base + 7, "{body}");

    let whole = s.read_all("").await;
    assert_dense_unique(&whole, s.head().await);
    let all = s.read_all_after(base, "", 1000).await;
    assert_eq!(all.len(), 7);
    assert_eq!(all[0]["event_id"], "a-1");
    assert_eq!(all[0]["stream"], "orders");
    assert_eq!(all[0]["subject"], "o-1");
    assert_eq!(all[0]["type"], "order.placed");
    assert_eq!(all[0]["payload"], json!({"n": 1}));
    assert_eq!(all[1]["event_id"], generated.as_str());
    assert_eq!(all[1]["subject"], "", "an absent subject is served as \"\"");
    assert_eq!(
        all[1]["payload"],
        json!({}),
        "an absent payload is served as {{}}"
    );
    for (i, e) in all[2..].iter().enumerate() {
        assert_eq!(e["event_id"], format!("b-{i}").as_str());
        assert_eq!(e["payload"], json!({ "i": i }));
    }
    let keys: Vec<&str> = all[0]
        .as_object()
        .expect("envelope object")
        .keys()
        .map(String::as_str)
        .collect();
    for k in [
        "seq", "event_id", "stream", "subject", "type", "time", "payload",
    ] {
        assert!(keys.contains(&k), "the envelope has no `{k}`: {}", all[0]);
    }
}

#[tokio::test]
async fn duplicate_with_same_content_answers_the_original_seq() {
    let s = Server::start(ServerOpts::default()).await;
    let base = s.start_head();
    s.append(&ev("pre", "orders", "o", "order.x", json!({})))
        .await;
    let original = r#"{"event_id":"dup-1","stream":"orders","subject":"o-1","type":"order.placed","payload":{"a":{"x":1,"y":[1,2]},"b":"s","c":null}}"#;
    let r = s.post_raw(original).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(
        receipts(&r.json),
        vec![("dup-1".to_owned(), base + 2, false)]
    );

    // Same content as a JSON value: other key order, other whitespace.
    let same = "{ \"payload\" : {\n  \"c\": null, \"b\" : \"s\" ,\t\"a\" : { \"y\" : [ 1 , 2 ], \"x\" : 1 } },\n \
                \"type\":\"order.placed\", \"subject\":\"o-1\",\"stream\" : \"orders\",\"event_id\":\"dup-1\" }";
    let r = s.post_raw(same).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(
        receipts(&r.json),
        vec![("dup-1".to_owned(), base + 2, true)],
        "a re-sent event is a duplicate with the original seq"
    );
    assert_eq!(s.head().await, base + 2, "a duplicate appends nothing");

    // In a batch with a new event: the duplicate keeps its seq, the new one is appended.
    let (st, body) = s
        .append(&json!({"events": [
            {"event_id": "dup-1", "stream": "orders", "subject": "o-1", "type": "order.placed",
             "payload": {"b": "s", "c": null, "a": {"y": [1, 2], "x": 1}}},
            ev("dup-2", "orders", "o-1", "order.placed", json!({})),
        ]}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    assert_eq!(
        receipts(&body),
        vec![
            ("dup-1".to_owned(), base + 2, true),
            ("dup-2".to_owned(), base + 3, false)
        ]
    );
    assert_eq!(body["last_seq"], base + 3, "{body}");
    let all = s.read_all("").await;
    assert_dense_unique(&all, base + 3);
    assert_eq!(
        all[usize::try_from(base).expect("small") + 1]["payload"],
        json!({"a": {"x": 1, "y": [1, 2]}, "b": "s", "c": null})
    );
}

#[tokio::test]
async fn same_id_with_other_content_is_a_conflict_and_changes_nothing() {
    let s = Server::start(ServerOpts::default()).await;
    let head0 = s.start_head();
    let base = ev("c-1", "orders", "o-1", "order.placed", json!({"n": 1}));
    let (st, _) = s.append(&base).await;
    assert_eq!(st, StatusCode::CREATED);
    let variants = [
        ev("c-1", "other", "o-1", "order.placed", json!({"n": 1})),
        ev("c-1", "orders", "o-2", "order.placed", json!({"n": 1})),
        ev("c-1", "orders", "o-1", "order.changed", json!({"n": 1})),
        ev("c-1", "orders", "o-1", "order.placed", json!({"n": 2})),
        ev(
            "c-1",
            "orders",
            "o-1",
            "order.placed",
            json!({"n": 1, "m": 0}),
        ),
        ev("c-1", "orders", "o-1", "order.placed", json!({})),
    ];
    for v in &variants {
        let r = s
            .send(s.request(reqwest::Method::POST, "/v1/events").json(v))
            .await;
        assert_problem(&r, 409, "event_id_conflict");
        assert_eq!(
            s.head().await,
            head0 + 1,
            "a conflict appends nothing ({v})"
        );
    }
    // In a batch after a new event: the whole batch is refused.
    let r = s
        .send(
            s.request(reqwest::Method::POST, "/v1/events")
                .json(&json!({"events": [
                    ev("c-new", "orders", "o-1", "order.placed", json!({})),
                    ev("c-1", "orders", "o-1", "order.placed", json!({"n": 3})),
                ]})),
        )
        .await;
    assert_problem(&r, 409, "event_id_conflict");
    assert_eq!(s.head().await, head0 + 1);
    let (st, body) = s
        .append(&ev("c-new", "orders", "o-1", "order.placed", json!({})))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    assert_eq!(
        receipts(&body),
        vec![("c-new".to_owned(), head0 + 2, false)],
        "the event of the refused batch was not stored"
    );
    let all = s.read_all_after(head0, "", 1000).await;
    assert_eq!(
        all[0]["payload"],
        json!({"n": 1}),
        "the original is untouched"
    );
}

/// A bad event, the expected status and code, and where the problem points (index, field).
type BatchCase = (Value, u16, &'static str, Option<(u64, &'static str)>);

#[tokio::test]
async fn a_batch_with_one_bad_event_appends_nothing() {
    let s = Server::start(ServerOpts::default()).await;
    let base = s.start_head();
    let good = |i: u32| ev(&format!("g-{i}"), "orders", "o", "order.x", json!({"i": i}));
    let (st, _) = s.append(&good(0)).await;
    assert_eq!(st, StatusCode::CREATED);

    let big = "x".repeat(65 * 1024);
    let cases: Vec<BatchCase> = vec![
        (
            ev("g-bad", "Bad Stream", "o", "order.x", json!({})),
            400,
            "invalid_field",
            Some((2, "stream")),
        ),
        (
            ev(
                "g-bad",
                "notifications",
                "n1",
                "notification.created",
                json!({}),
            ),
            403,
            "server_only_type",
            None,
        ),
        (
            ev("g-bad", "task_events", "t1", "task.run_started", json!({})),
            422,
            "schema_violation",
            None,
        ),
        (
            ev("g-bad", "orders", "o", "order.x", json!({ "big": big })),
            413,
            "payload_too_large",
            None,
        ),
        (
            ev("g-0", "orders", "o", "order.x", json!({"i": "other"})),
            409,
            "event_id_conflict",
            None,
        ),
    ];
    for (bad, status, code, at) in cases {
        let r = s
            .send(
                s.request(reqwest::Method::POST, "/v1/events")
                    .json(&json!({"events": [good(1), good(2), bad, good(3)]})),
            )
            .await;
        assert_problem(&r, status, code);
        if let Some((index, field)) = at {
            assert_eq!(r.json["index"], index, "problem `index`: {}", r.text);
            assert_eq!(r.json["field"], field, "problem `field`: {}", r.text);
        }
        assert_eq!(
            s.head().await,
            base + 1,
            "a refused batch ({code}) appends nothing"
        );
    }
    let (st, body) = s
        .append(&json!({"events": [good(1), good(2), good(3)]}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    assert_eq!(
        receipts(&body),
        vec![
            ("g-1".to_owned(), base + 2, false),
            ("g-2".to_owned(), base + 3, false),
            ("g-3".to_owned(), base + 4, false)
        ],
        "none of the refused batches' events were stored"
    );
}

#[tokio::test]
async fn boundary_values_are_accepted() {
    let s = Server::start(ServerOpts::default()).await;
    let base = s.start_head();
    let id128: String = "Az09._:-".repeat(16);
    let stream64 = "a0_.-b".repeat(11)[..64].to_owned();
    let type64 = "a0_.b".repeat(13)[..64].to_owned();
    let subject128: String = "é ü/#?&=".chars().cycle().take(128).collect();
    let payload = json!({ "p": "y".repeat(60 * 1024) });
    let (st, body) = s
        .append(&json!({"events": [
            ev(&id128, &stream64, &subject128, &type64, payload.clone()),
            ev("x", "s", "", "t", json!({})),
        ]}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    assert_eq!(receipts(&body)[0], (id128.clone(), base + 1, false));
    let all = s.read_all_after(base, "", 1000).await;
    assert_eq!(all[0]["event_id"], id128.as_str());
    assert_eq!(all[0]["stream"], stream64.as_str());
    assert_eq!(all[0]["type"], type64.as_str());
    assert_eq!(all[0]["subject"], subject128.as_str());
    assert_eq!(all[0]["payload"], payload);
    assert_eq!(all[1]["subject"], "");
    // A subject with reserved URL characters can be used as a filter.
    let enc: String = subject128.bytes().map(|b| format!("%{b:02X}")).collect();
    let only = s.read_all(&format!("subject={enc}")).await;
    assert_eq!(only.len(), 1, "filter by an encoded subject");
    assert_eq!(seq_of(&only[0]), base + 1);
}

/// A query string and the (stream, subject, type) filter it means.
type FilterCase = (
    String,
    Option<&'static str>,
    Option<&'static str>,
    Option<&'static str>,
);

/// Expected matches of a filter over the model log.
fn matching<'a>(
    model: &'a [Value],
    stream: Option<&str>,
    subject: Option<&str>,
    ty: Option<&str>,
) -> Vec<&'a Value> {
    model
        .iter()
        .filter(|e| stream.is_none_or(|s| e["stream"] == s))
        .filter(|e| subject.is_none_or(|s| e["subject"] == s))
        .filter(|e| ty.is_none_or(|t| e["type"] == t))
        .collect()
}

#[tokio::test]
async fn paging_with_filters_returns_exactly_the_matches_in_order() {
    let s = Server::start(ServerOpts::default()).await;
    let base = s.start_head();
    let streams = ["s.one", "s-two"];
    let subjects = ["a", "b", "sub ject/é"];
    let types = ["t.x", "t.y"];
    let mut model = Vec::new();
    for chunk in 0..10u64 {
        let batch: Vec<Value> = (0..9u64)
            .map(|k| {
                let i = chunk * 9 + k;
                let e = ev(
                    &format!("p-{i}"),
                    streams[usize::try_from(i % 2).expect("small")],
                    subjects[usize::try_from(i % 3).expect("small")],
                    types[usize::try_from((i / 5) % 2).expect("small")],
                    json!({ "i": i }),
                );
                model.push(e.clone());
                e
            })
            .collect();
        let (st, body) = s.append(&json!({ "events": batch })).await;
        assert_eq!(st, StatusCode::CREATED, "{body}");
    }
    assert_eq!(s.head().await, base + 90);

    let enc = "sub%20ject%2F%C3%A9";
    let cases: Vec<FilterCase> = vec![
        (String::new(), None, None, None),
        ("stream=s.one".into(), Some("s.one"), None, None),
        ("subject=b".into(), None, Some("b"), None),
        (format!("subject={enc}"), None, Some("sub ject/é"), None),
        ("type=t.y".into(), None, None, Some("t.y")),
        (
            "stream=s-two&subject=a".into(),
            Some("s-two"),
            Some("a"),
            None,
        ),
        (
            "stream=s.one&subject=b&type=t.x".into(),
            Some("s.one"),
            Some("b"),
            Some("t.x"),
        ),
        ("subject=nobody".into(), None, Some("nobody"), None),
        ("stream=nothing".into(), Some("nothing"), None, None),
    ];
    for (filters, stream, subject, ty) in cases {
        let want = matching(&model, stream, subject, ty);
        for limit in [7, 1000] {
            let got = s.read_all_after(base, &filters, limit).await;
            let got_ids: Vec<&str> = got.iter().map(id_of).collect();
            let want_ids: Vec<&str> = want
                .iter()
                .map(|e| e["event_id"].as_str().expect("id"))
                .collect();
            assert_eq!(got_ids, want_ids, "filter {filters:?}, limit {limit}");
            for (g, w) in got.iter().zip(&want) {
                for k in ["stream", "subject", "type", "payload"] {
                    assert_eq!(g[k], w[k], "field {k} of {g}");
                }
                let i: u64 = w["payload"]["i"].as_u64().expect("i");
                assert_eq!(seq_of(g), base + i + 1, "seq of {g}");
            }
        }
    }

    // A page never holds more than `limit`, and pages continue where the last one ended.
    let p = s.page(&format!("after_sequence={base}&limit=7")).await;
    assert_eq!(p.events.len(), 7);
    assert_eq!(p.next_after_sequence, base + 7);
    assert_eq!(p.latest_event_seq, base + 90);
    let p = s.page(&format!("after_sequence={}", base + 85)).await;
    assert_eq!(
        p.events.iter().map(seq_of).collect::<Vec<_>>(),
        (base + 86..=base + 90).collect::<Vec<_>>()
    );
    let p = s.page(&format!("after_sequence={}", base + 90)).await;
    assert!(p.events.is_empty(), "nothing after the head");
    let p = s.page("after_sequence=500").await;
    assert!(p.events.is_empty(), "nothing after a seq past the head");
    let p = s.page("").await;
    assert_eq!(
        p.events.len(),
        usize::try_from(base + 90).expect("small"),
        "limit defaults to 100"
    );
    let p = s.page("after_sequence=0").await;
    assert_eq!(
        p.events.iter().map(seq_of).collect::<Vec<_>>(),
        (1..=base + 90).collect::<Vec<_>>(),
        "a page from 0 starts with the server's own events at seq 1"
    );
}

#[tokio::test]
async fn time_is_rfc3339_with_microseconds_and_never_goes_back() {
    let s = Server::start(ServerOpts::default()).await;
    for round in 0..20 {
        let batch: Vec<Value> = (0..(round % 4 + 1))
            .map(|k| ev(&format!("t-{round}-{k}"), "clock", "c", "tick", json!({})))
            .collect();
        let (st, body) = s.append(&json!({ "events": batch })).await;
        assert_eq!(st, StatusCode::CREATED, "{body}");
    }
    let all = s.read_all("").await;
    assert_dense_unique(&all, s.head().await);
    let mut last = String::new();
    for e in &all {
        let t = e["time"]
            .as_str()
            .unwrap_or_else(|| panic!("no string `time` in {e}"));
        let stamp = check_time(t).to_owned();
        assert!(
            stamp >= last,
            "time goes backwards at seq {}: {t} after {last}",
            seq_of(e)
        );
        last = stamp;
    }
}

/// `GET /v1/events?order=desc` (issue 40, the console's stream browser): newest first, below
/// `before_sequence`, paged by `next_before_sequence`, whatever the filters match and however
/// far apart the matches are (the scan goes down window by window, bounded per request); in
/// seq order `before_sequence` ends the range. Bad values of the new parameters are
/// `400 invalid_query` problems, and the stream refuses both as unknown.
#[tokio::test]
async fn events_newest_first_page_down_with_next_before_sequence() {
    let s = Server::start(ServerOpts::default()).await;
    let base = s.start_head();
    // 2,500 events; the rare stream's are at 10, 1,200 and 2,400 (more than a window apart).
    let rare = [10u64, 1200, 2400];
    for chunk in 0..5u64 {
        let events: Vec<Value> = (chunk * 500..(chunk + 1) * 500)
            .map(|i| {
                let stream = if rare.contains(&i) { "rare" } else { "bulk" };
                json!({"event_id": format!("d-{i}"), "stream": stream, "type": "thing.done"})
            })
            .collect();
        let (st, body) = s.append(&json!({ "events": events })).await;
        assert_eq!(st, StatusCode::CREATED, "{body}");
    }
    let head = base + 2500;
    let at = |i: u64| base + i + 1;
    // The seqs of a newest-first page, and the page.
    let desc = |q: String| {
        let s = &s;
        async move {
            let r = s.get(&format!("/v1/events?order=desc&{q}")).await;
            assert_eq!(r.status, StatusCode::OK, "{q}: {}", r.text);
            let seqs: Vec<u64> = r.json["events"]
                .as_array()
                .unwrap()
                .iter()
                .map(seq_of)
                .collect();
            (seqs, r.json)
        }
    };

    // Unfiltered: the newest five, then the five before them.
    let (got, page) = desc("limit=5".into()).await;
    assert_eq!(got, (head - 4..=head).rev().collect::<Vec<_>>());
    assert_eq!(page["next_before_sequence"], head - 4, "{page}");
    assert_eq!(page["latest_event_seq"], head);
    let (got, _) = desc(format!("limit=5&before_sequence={}", head - 4)).await;
    assert_eq!(got, (head - 9..=head - 5).rev().collect::<Vec<_>>());

    // A rare stream: each page holds the matches however far below the top they are.
    let (got, page) = desc("stream=rare&limit=2".into()).await;
    assert_eq!(got, vec![at(2400), at(1200)], "{page}");
    assert_eq!(page["next_before_sequence"], at(1200));
    let (got, page) = desc(format!("stream=rare&limit=2&before_sequence={}", at(1200))).await;
    assert_eq!(got, vec![at(10)], "{page}");
    assert!(
        page.get("next_before_sequence").is_none(),
        "nothing older is left: {page}"
    );
    // The same matches as in seq order, reversed; `after_sequence` bounds the walk below.
    let asc = s.page("stream=rare&limit=1000").await;
    let asc: Vec<u64> = asc.events.iter().map(seq_of).collect();
    assert_eq!(asc, vec![at(10), at(1200), at(2400)]);
    let (got, page) = desc(format!("stream=rare&after_sequence={}", at(10))).await;
    assert_eq!(got, vec![at(2400), at(1200)], "{page}");
    assert!(page.get("next_before_sequence").is_none(), "{page}");
    // In seq order the answer has no next_before_sequence; before_sequence ends the range,
    // and next_after_sequence stops below it.
    let r = s.get("/v1/events?limit=1").await;
    assert!(r.json.get("next_before_sequence").is_none(), "{}", r.text);
    let r = s
        .get(&format!(
            "/v1/events?stream=rare&before_sequence={}",
            at(2400)
        ))
        .await;
    let got: Vec<u64> = r.json["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(seq_of)
        .collect();
    assert_eq!(got, vec![at(10), at(1200)], "{}", r.text);
    assert_eq!(r.json["next_after_sequence"], at(2400) - 1, "{}", r.text);
    let p = s
        .page(&format!(
            "after_sequence={}&before_sequence={}",
            base + 3,
            base + 6
        ))
        .await;
    let got: Vec<u64> = p.events.iter().map(seq_of).collect();
    assert_eq!(got, vec![base + 4, base + 5]);
    assert_eq!(p.next_after_sequence, base + 5);

    for (q, what) in [
        ("order=newest", "an unknown order"),
        ("order=", "an empty order"),
        ("before_sequence=0", "before_sequence 0"),
        (
            "order=desc&before_sequence=0",
            "before_sequence 0, newest first",
        ),
        ("order=desc&before_sequence=-1", "a negative one"),
        ("order=desc&before_sequence=x", "not a number"),
        ("order=desc&limit=0", "limit 0"),
        ("order=desc&limit=1001", "limit past 1000"),
    ] {
        let r = s.get(&format!("/v1/events?{q}")).await;
        assert_problem_for(&r, 400, "invalid_query", what);
    }
    // The stream is in seq order and has no end: it does not take either.
    for q in ["order=desc", "before_sequence=5"] {
        let r = s.get(&format!("/v1/events/stream?{q}")).await;
        assert_problem_for(&r, 400, "unknown_parameter", q);
    }
}
