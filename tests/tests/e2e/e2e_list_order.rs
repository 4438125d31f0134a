//! Lists newest first (issue 26, item 5): `GET /v1/tasks` and `GET /v1/deliveries` paged in id
//! order sorted ids as text (`bt-0, bt-1, bt-10, …`), so in a large log the tasks created last
//! were pages away, behind every older id that happened to sort before them. `order=newest`
//! pages them by creation (a task's creation seq, a delivery's `created_at`), newest first,
//! with the cursor `next_before` = `<key>:<id>` (the id breaks ties of the key), every filter
//! still applied; `order=id` stays the default. Bad values are `400 invalid_query`.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_tests::{Api, Server, ServerOpts, assert_problem_for, encode_path};

use crate::common::{append_ok, list_tasks, notif_ev, task_ev, wait_for};

const WAIT: Duration = Duration::from_secs(30);

/// Every row of `GET <path>?<query>&order=newest` (key `key`), paging with `limit` via
/// `before` / `next_before`; checks that `next_after` stays null, that each cursor is the
/// position of its page's last row and that a page before the end is full.
async fn newest_pages(api: &Api, path: &str, key: &str, query: &str, limit: u32) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    let mut before: Option<String> = None;
    for _ in 0..1000 {
        let mut q = format!("{query}&order=newest&limit={limit}");
        if let Some(b) = &before {
            q = format!("{q}&before={}", encode_path(b));
        }
        let r = api.get(&format!("{path}?{q}")).await;
        assert_eq!(r.status, StatusCode::OK, "GET {path}?{q}: {}", r.text);
        assert_eq!(r.json["next_after"], Value::Null, "{q}: {}", r.text);
        let page = r.json[key].as_array().expect("rows").clone();
        assert!(page.len() <= limit as usize, "{q}: over limit");
        match r.json.get("next_before") {
            None => {
                out.extend(page);
                return out;
            }
            Some(Value::String(next)) => {
                assert_eq!(
                    page.len(),
                    limit as usize,
                    "{q}: a short page before the end"
                );
                let (k, id) = next.split_once(':').expect("<key>:<id>");
                assert!(k.bytes().all(|b| b.is_ascii_digit()), "{next}");
                let last = page.last().expect("a full page");
                let last_id = &last[if key == "tasks" { "task_id" } else { "id" }];
                assert_eq!(last_id, id, "{q}: the cursor names the page's last row");
                before = Some(next.clone());
                out.extend(page);
            }
            Some(other) => panic!("{q}: next_before is {other}"),
        }
    }
    panic!("GET {path}?{query}: paging did not end");
}

fn ids<'a>(rows: &'a [Value], field: &str) -> Vec<&'a str> {
    rows.iter()
        .map(|r| r[field].as_str().expect("id"))
        .collect()
}

#[tokio::test]
async fn tasks_page_newest_first_and_by_id_by_default() {
    let s = Server::start(ServerOpts::default()).await;
    // bt-0 … bt-11 created in that order, three of them in project `odd`.
    let events: Vec<Value> = (0..12)
        .map(|i| {
            let project = if i % 5 == 1 { "odd" } else { "p" };
            task_ev(
                &format!("bt-{i}"),
                "task.created",
                json!({"project_id": project}),
            )
        })
        .collect();
    append_ok(&s, &json!({ "events": events })).await;

    let newest = newest_pages(&s, "/v1/tasks", "tasks", "", 5).await;
    let want: Vec<String> = (0..12).rev().map(|i| format!("bt-{i}")).collect();
    assert_eq!(ids(&newest, "task_id"), want);
    // The default is still id order, as text.
    let by_id = list_tasks(&s, "", 5).await;
    assert_eq!(
        ids(&by_id, "task_id")[..5],
        ["bt-0", "bt-1", "bt-10", "bt-11", "bt-2"]
    );
    // Filters apply newest first too.
    let odd = newest_pages(&s, "/v1/tasks", "tasks", "project_id=odd", 1).await;
    assert_eq!(ids(&odd, "task_id"), ["bt-11", "bt-6", "bt-1"]);
    // Each cursor is also a filter of the other order: ids after bt-5, newest first; tasks
    // created before bt-3, by id.
    let r = s.get("/v1/tasks?order=newest&after=bt-5").await;
    assert_eq!(
        ids(r.json["tasks"].as_array().unwrap(), "task_id"),
        ["bt-9", "bt-8", "bt-7", "bt-6"]
    );
    let r = s.get("/v1/tasks?order=newest&limit=9").await;
    let cursor = r.json["next_before"].as_str().expect("more").to_owned();
    assert!(cursor.ends_with(":bt-3"), "{cursor}");
    let r = s
        .get(&format!(
            "/v1/tasks?order=id&before={}",
            encode_path(&cursor)
        ))
        .await;
    assert_eq!(
        ids(r.json["tasks"].as_array().unwrap(), "task_id"),
        ["bt-0", "bt-1", "bt-2"]
    );
    assert_eq!(
        r.json.get("next_before"),
        None,
        "no next_before in id order"
    );
}

#[tokio::test]
async fn deliveries_page_newest_first_with_their_filters() {
    let s = Server::start(ServerOpts::default()).await;
    // Ids that do not sort as they are created (n-9 after n-10 by id), one batch at a time so
    // each has its own creation time, and one batch of three that may share one.
    for batch in [vec!["n-9"], vec!["n-10"], vec!["n-8", "n-11", "n-7"]] {
        let events: Vec<Value> = batch
            .iter()
            .map(|id| {
                notif_ev(
                    id,
                    json!({"priority": "urgent", "title": format!("Build {id}"), "recipient": "ops"}),
                )
            })
            .collect();
        append_ok(&s, &json!({ "events": events })).await;
        for id in batch {
            let path = format!(
                "/v1/deliveries/{}",
                encode_path(&format!("dlv:{id}:desktop"))
            );
            wait_for(WAIT, &format!("the delivery of {id}"), || async {
                (s.get(&path).await.status == StatusCode::OK).then_some(())
            })
            .await;
        }
    }
    let r = s.get("/v1/deliveries?limit=100").await;
    let mut rows = r.json["deliveries"].as_array().unwrap().clone();
    assert_eq!(rows.len(), 5, "{}", r.text);
    // Newest first: by created_at (fixed-width RFC 3339), ties by id, both descending.
    rows.sort_by(|a, b| {
        let key = |d: &Value| {
            (
                d["created_at"].as_str().unwrap().to_owned(),
                d["id"].as_str().unwrap().to_owned(),
            )
        };
        key(b).cmp(&key(a))
    });
    let newest = newest_pages(&s, "/v1/deliveries", "deliveries", "", 2).await;
    assert_eq!(ids(&newest, "id"), ids(&rows, "id"));
    // By creation, not by id: the first two created are the last two.
    assert_eq!(
        ids(&newest, "id")[3..],
        ["dlv:n-10:desktop", "dlv:n-9:desktop"]
    );
    // Filters still apply, and the time range bounds the walk.
    let later = rows[2]["created_at"].as_str().unwrap().to_owned();
    let recent = newest_pages(
        &s,
        "/v1/deliveries",
        "deliveries",
        &format!("status=queued&created_after={}", encode_path(&later)),
        1,
    )
    .await;
    let want: Vec<&str> = rows
        .iter()
        .filter(|d| d["created_at"].as_str().unwrap() >= later.as_str())
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids(&recent, "id"), want);
    let none = newest_pages(&s, "/v1/deliveries", "deliveries", "status=parked", 3).await;
    assert!(none.is_empty());
}

#[tokio::test]
async fn bad_order_and_cursor_values_are_problems() {
    let s = Server::start(ServerOpts::default()).await;
    append_ok(
        &s,
        &task_ev("bt-1", "task.created", json!({"project_id": "p"})),
    )
    .await;
    let head = s.get("/healthz").await.json["head"].clone();
    for path in ["/v1/tasks", "/v1/deliveries"] {
        for q in [
            "order=oldest",
            "order=",
            "order=NEWEST",
            "order=newest&before=bt-1",
            "order=newest&before=12",
            "order=newest&before=12:",
            "order=newest&before=:bt-1",
            "order=newest&before=-1:bt-1",
            "order=newest&before=99999999999999999999:bt-1",
            "order=newest&before=1%3Ab%07t",
        ] {
            let r = s.get(&format!("{path}?{q}")).await;
            assert_problem_for(&r, 400, "invalid_query", &format!("{path}?{q}"));
            assert!(
                r.json["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains("order") || d.contains("before")),
                "{path}?{q}: the detail names the parameter: {}",
                r.text
            );
        }
    }
    assert_eq!(
        s.get("/healthz").await.json["head"],
        head,
        "nothing changed"
    );
}

/// A redacted route's deliveries carry the keyed hash of the recipient (section 14); a filter by
/// recipient finds them by the hash and merges them with the clear ones: newest first, the merge
/// keeps the creation order across pages.
#[tokio::test]
async fn redacted_and_clear_deliveries_merge_newest_first() {
    let s = Server::start(
        ServerOpts::default()
            .config(
                "[notifications.routing]\nurgent = [\"dashboard\", \"desktop\", \"pager\"]\n\n\
                 [notifications.routes.desktop]\nredact = true\n\
                 generic_title = \"You have a message\"\n\n\
                 [privacy]\nhmac_key = \"env:TM_TEST_PRIVACY_KEY\"\n",
            )
            .env(
                "TM_TEST_PRIVACY_KEY",
                tidemark_tests::secret("a-key-for-the-order-test"),
            ),
    )
    .await;
    // Each notification: a redacted `desktop` delivery and a clear `pager` one (skipped: no
    // such route), created one after the other.
    for id in ["m-9", "m-10", "m-8"] {
        append_ok(
            &s,
            &notif_ev(
                id,
                json!({"priority": "urgent", "title": "t", "recipient": "alice"}),
            ),
        )
        .await;
        wait_for(WAIT, &format!("the deliveries of {id}"), || async {
            let r = s.get(&format!("/v1/deliveries?notification_id={id}")).await;
            (r.json["deliveries"].as_array().map_or(0, Vec::len) == 2).then_some(())
        })
        .await;
    }
    let all = newest_pages(&s, "/v1/deliveries", "deliveries", "recipient=alice", 100).await;
    assert_eq!(all.len(), 6, "{all:?}");
    assert_eq!(all.iter().filter(|d| d["redacted"] == true).count(), 3);
    let mut want: Vec<(String, String)> = all
        .iter()
        .map(|d| {
            (
                d["created_at"].as_str().unwrap().to_owned(),
                d["id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    want.sort_by(|a, b| b.cmp(a));
    let want: Vec<&str> = want.iter().map(|(_, id)| id.as_str()).collect();
    assert_eq!(ids(&all, "id"), want, "newest first");
    for limit in [1, 2, 4] {
        let paged =
            newest_pages(&s, "/v1/deliveries", "deliveries", "recipient=alice", limit).await;
        assert_eq!(ids(&paged, "id"), want, "pages of {limit}");
    }
}
