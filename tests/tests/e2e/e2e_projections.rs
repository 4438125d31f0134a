//! Projection administration (I3): `GET /v1/admin/projections`, rebuild and verify over HTTP
//! and through the CLI, `409 rebuild_in_progress`, and rebuilds while appends keep coming:
//! no append fails, the rebuilt models are identical to the live ones, and the read models
//! answer the same as before for everything that did not change.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_tests::{Api, Server, ServerOpts, assert_problem_for};

use crate::common::{
    PROJECTIONS, TaskOracle, append_ok, assert_projections_sound, assert_routed_exactly_once,
    cli_at, cli_ok, cli_records, get_task, list_notifications, list_tasks, notif_ev, post_empty,
    projections, rebuild_or_verify, receipts, seq_of, settled, task_ev, wait_for, wait_quiet,
    wait_routed,
};

const WAIT: Duration = Duration::from_secs(60);

/// [`seed_tasks`], then the head and the projections once the models have folded it.
async fn seeded(api: &Api, prefix: &str, project: &str, n: u32) -> (u64, HashMap<String, Value>) {
    seed_tasks(api, prefix, project, n).await;
    let head = api.head().await;
    settled(api).await;
    (head, projections(api).await)
}

/// Tasks `{prefix}-NN` of project `project` in every status, client notifications, and their
/// routed notifications (waited for).
async fn seed_tasks(api: &Api, prefix: &str, project: &str, n: u32) {
    let mut events = Vec::new();
    for i in 0..n {
        let t = format!("{prefix}-{i:02}");
        events.push(task_ev(
            &t,
            "task.created",
            json!({"project_id": project, "title": format!("Task {i}"), "review_required": i % 4 == 0}),
        ));
        if i % 7 != 0 {
            events.push(task_ev(&t, "task.run_started", json!({"run_id": "r1"})));
        }
        match i % 7 {
            1 => events.push(task_ev(&t, "task.run_completed", json!({"run_id": "r1"}))),
            2 => events.push(task_ev(
                &t,
                "task.run_failed",
                json!({"run_id": "r1", "error": "oops"}),
            )),
            3 => {
                events.push(task_ev(
                    &t,
                    "task.run_review_requested",
                    json!({"run_id": "r1"}),
                ));
                events.push(task_ev(
                    &t,
                    "task.run_review_rejected",
                    json!({"run_id": "r1", "reviewer": "rv", "reason": "no", "continuation": i % 2 == 0}),
                ));
            }
            4 => {
                events.push(task_ev(&t, "task.run_completed", json!({"run_id": "r1"})));
                events.push(task_ev(
                    &t,
                    "task.run_review_approved",
                    json!({"run_id": "r1", "reviewer": "rv"}),
                ));
            }
            5 => events.push(task_ev(&t, "task.canceled", json!({"reason": "stop"}))),
            6 => events.push(task_ev(&t, "task.run_canceled", json!({"run_id": "r1"}))),
            _ => {}
        }
        events.push(json!({"stream": "comments", "subject": t, "type": "comment.added"}));
        let priority =
            ["urgent", "action", "warning", "info"][usize::try_from(i % 4).expect("small")];
        events.push(notif_ev(
            &format!("{prefix}-n-{i:02}"),
            json!({"priority": priority,
                   "title": format!("About {t}"), "task_id": t, "project_id": project,
                   "recipient": format!("user-{}", i % 3)}),
        ));
    }
    for chunk in events.chunks(200) {
        append_ok(api, &json!({ "events": chunk })).await;
    }
    let (sources, created) = wait_routed(api, WAIT).await;
    assert_routed_exactly_once(&sources, &created);
    // Urgent and action notifications get their deliveries a moment later.
    wait_quiet(api).await;
}

#[track_caller]
fn check_report(r: &Value, name: &str, swapped: bool, at_least: u64) {
    assert_eq!(r["name"], name, "{r}");
    assert_eq!(r["identical"], true, "{name}: not identical: {r}");
    assert_eq!(r["first_divergent_seq"], Value::Null, "{name}: {r}");
    assert_eq!(r["swapped"], swapped, "{name}: {r}");
    assert!(
        r["events_replayed"].as_u64().is_some_and(|n| n >= at_least),
        "{name}: events_replayed below the head {at_least} when it was asked: {r}"
    );
    assert!(r["duration_ms"].is_u64(), "{name}: {r}");
    let digest = r["digest"].as_str().unwrap_or_default();
    assert!(
        digest.len() == 64 && digest.chars().all(|c| c.is_ascii_hexdigit()),
        "{name}: digest is not 32 bytes of hex: {r}"
    );
}

#[tokio::test]
async fn list_verify_and_rebuild_each_projection() {
    let s = Server::start(ServerOpts::default()).await;
    let (head, before) = seeded(&s, "adm", "admin-proj", 14).await;
    for name in PROJECTIONS {
        let p = &before[name];
        assert_eq!(p["checkpoint"], head, "{p}");
        assert_eq!(p["lag"], 0, "{p}");
        assert_eq!(p["rebuild"], Value::Null, "no rebuild runs: {p}");
        assert!(p["generation"].is_u64(), "{p}");
        let d = p["digest"].as_str().unwrap_or_default();
        assert!(
            d.len() == 64 && d.chars().all(|c| c.is_ascii_hexdigit()),
            "{p}"
        );
    }
    let tasks_before = list_tasks(&s, "", 500).await;
    let notes_before = list_notifications(&s, "", 500).await;
    assert_eq!(tasks_before.len(), 14);
    assert!(notes_before.len() >= 14);

    // Verify (then rebuild) each: the replayed digest is the live digest.
    let replay_all = |action: &'static str| {
        let (s, before) = (&s, &before);
        async move {
            for name in PROJECTIONS {
                let r = rebuild_or_verify(s, name, action).await;
                check_report(&r, name, action == "rebuild", head);
                if action == "verify" {
                    assert_eq!(r["events_replayed"], head, "{r}");
                }
                let same = "the replayed digest is the live digest";
                assert_eq!(
                    r["digest"], before[name]["digest"],
                    "{action} of {name}: {same}"
                );
            }
            settled(s).await;
            projections(s).await
        }
    };
    let after_verify = replay_all("verify").await;
    for name in PROJECTIONS {
        assert_eq!(
            after_verify[name]["generation"], before[name]["generation"],
            "a verify does not switch {name}"
        );
        assert_eq!(after_verify[name]["digest"], before[name]["digest"]);
    }
    let after = replay_all("rebuild").await;
    for name in PROJECTIONS {
        let (a, b) = (&after[name], &before[name]);
        assert_eq!(a["digest"], b["digest"], "{name}: {a} vs {b}");
        assert_eq!(a["checkpoint"], head, "{a}");
        assert_eq!(a["lag"], 0, "{a}");
        assert!(
            a["generation"].as_u64() > b["generation"].as_u64(),
            "a rebuild switches {name} to a new generation: {a} vs {b}"
        );
    }
    assert_eq!(
        list_tasks(&s, "", 500).await,
        tasks_before,
        "tasks after rebuilds"
    );
    assert_eq!(
        list_notifications(&s, "", 500).await,
        notes_before,
        "notifications after rebuilds"
    );
    // The rebuilt models keep folding new events.
    append_ok(
        &s,
        &task_ev("adm-01", "task.run_started", json!({"run_id": "r9"})),
    )
    .await;
    assert_eq!(get_task(&s, "adm-01").await["status"], "running");
    assert_projections_sound(&s, "after rebuilds and a new event").await;

    for action in ["rebuild", "verify"] {
        for name in ["nope", "task", "Tasks"] {
            let r = post_empty(&s, &format!("/v1/admin/projections/{name}/{action}")).await;
            assert_problem_for(&r, 404, "not_found", &format!("{action} {name}"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_rebuild_of_the_same_projection_is_409() {
    let s = Server::start(ServerOpts::default()).await;
    // Enough log for a replay to take a moment.
    for b in 0..20u32 {
        let events: Vec<Value> = (0..1000u32)
            .map(|i| {
                task_ev(
                    &format!("big-{}", (b * 1000 + i) % 3000),
                    "task.created",
                    json!({"project_id": format!("p{}", i % 10)}),
                )
            })
            .collect();
        append_ok(&s, &json!({ "events": events })).await;
    }
    let head = s.head().await;
    let mut conflicts = 0;
    let mut oks = 0;
    let mut saw_progress = false;
    for round in 0..20 {
        let action = if round % 2 == 0 { "verify" } else { "rebuild" };
        let calls: Vec<_> = (0..4)
            .map(|_| {
                let api = s.api();
                let path = format!("/v1/admin/projections/tasks/{action}");
                tokio::spawn(async move { post_empty(&api, &path).await })
            })
            .collect();
        // Meanwhile the list may show the progress of the one that runs.
        for _ in 0..5 {
            let p = projections(&s).await;
            let r = &p["tasks"]["rebuild"];
            if !r.is_null() {
                saw_progress = true;
                let done = r["done"].as_u64().expect("done");
                let of = r["head"].as_u64().expect("head");
                assert!(done <= of, "rebuild progress {r}");
            }
        }
        for c in calls {
            let r = c.await.expect("request task");
            if r.status == StatusCode::OK {
                oks += 1;
                check_report(&r.json, "tasks", action == "rebuild", head);
            } else {
                assert_problem_for(&r, 409, "rebuild_in_progress", action);
                conflicts += 1;
            }
        }
        if conflicts > 0 && round >= 3 {
            break;
        }
    }
    eprintln!("rebuild 409: {oks} ran, {conflicts} refused, progress seen: {saw_progress}");
    assert!(oks > 0, "no rebuild ran at all");
    assert!(
        conflicts > 0,
        "4 simultaneous rebuilds of the same projection never overlapped in 20 rounds"
    );
    // Nothing is left marked as running.
    settled(&s).await;
    let p = projections(&s).await;
    assert_eq!(p["tasks"]["rebuild"], Value::Null, "{}", p["tasks"]);
    let v = rebuild_or_verify(&s, "tasks", "verify").await;
    check_report(&v, "tasks", false, head);
    // A rebuild of one projection does not block another's.
    let (a, b) = tokio::join!(
        rebuild_or_verify(&s, "notifications", "rebuild"),
        rebuild_or_verify(&s, "settings", "verify")
    );
    check_report(&a, "notifications", true, head);
    check_report(&b, "settings", false, head);
}

#[derive(Default)]
struct Load {
    failures: Vec<String>,
    overloaded: u64,
    batches: u64,
    /// Acknowledged client notification ids.
    notifications: Vec<String>,
    /// Acknowledged creations of fresh tasks: (task id, seq).
    fresh: Vec<(String, u64)>,
    /// Highest acknowledged seq of an event about each task (a subject with an acknowledged
    /// lifecycle event).
    latest: HashMap<String, u64>,
}

async fn load_appender(
    api: Api,
    k: u64,
    seed: u64,
    stop: Arc<AtomicBool>,
    load: Arc<Mutex<Load>>,
    acks: Arc<AtomicU64>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let task = format!("busy-{k}-{}", rng.random_range(0..3));
        let run = format!("r{}", n / 5);
        let batch: Vec<Value> = match n % 5 {
            0 => vec![
                task_ev(&task, "task.created", json!({"project_id": "busy"})),
                task_ev(&task, "task.run_started", json!({"run_id": run})),
            ],
            1 => vec![
                json!({"stream": "comments", "subject": task, "type": "comment.added"}),
                notif_ev(
                    &format!("busy-n-{k}-{n}"),
                    json!({"priority": "info", "title": "busy", "task_id": task}),
                ),
            ],
            2 => vec![task_ev(
                &task,
                [
                    "task.run_completed",
                    "task.run_failed",
                    "task.run_review_requested",
                ][rng.random_range(0..3)],
                json!({"run_id": run}),
            )],
            3 => vec![task_ev(
                &format!("fresh-{k}-{n}"),
                "task.created",
                json!({"project_id": "fresh"}),
            )],
            _ => vec![json!({"stream": "noise", "subject": "", "type": "noise.x"}); 20],
        };
        n += 1;
        match api.try_append(&json!({ "events": batch })).await {
            Ok((StatusCode::CREATED, body)) => {
                let mut l = load.lock().expect("lock");
                l.batches += 1;
                for ((id, seq, _), e) in receipts(&body).into_iter().zip(&batch) {
                    let subject = e["subject"].as_str().unwrap_or_default();
                    if e["stream"] == "task_events" || l.latest.contains_key(subject) {
                        let m = l.latest.entry(subject.to_owned()).or_default();
                        *m = (*m).max(seq);
                    }
                    if e["type"] == "notification.requested" {
                        l.notifications.push(id);
                    } else if e["payload"]["project_id"] == "fresh" {
                        let task = e["subject"].as_str().expect("subject").to_owned();
                        l.fresh.push((task, seq));
                    }
                }
                acks.fetch_add(1, Ordering::Relaxed);
            }
            Ok((StatusCode::TOO_MANY_REQUESTS, _)) => {
                load.lock().expect("lock").overloaded += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok((status, body)) => load
                .lock()
                .expect("lock")
                .failures
                .push(format!("{status}: {body}")),
            Err(e) => load
                .lock()
                .expect("lock")
                .failures
                .push(format!("transport: {e}")),
        }
    }
}

/// Rebuilds (and verifies) run while six clients keep appending: every report must say
/// `identical: true`, no append may fail, no acknowledged event may be missing from the
/// switched models, and the read models answer as before for what did not change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebuilds_under_load_are_identical_and_change_no_answer() {
    const ROUNDS: u32 = 16;
    let seed: u64 = rand::random();
    eprintln!("rebuild under load seed: {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let s = Server::start(ServerOpts::default()).await;
    seed_tasks(&s, "stable", "stable", 21).await;
    // Some volume, so that a replay is more than a blink.
    for b in 0..4u32 {
        let events: Vec<Value> = (0..1000u32)
            .map(|i| {
                json!({"stream": "bulk", "subject": format!("b{}", i % 100), "type": "bulk.x",
                       "payload": {"b": b}})
            })
            .collect();
        append_ok(&s, &json!({ "events": events })).await;
    }
    let stable_tasks = list_tasks(&s, "project_id=stable", 7).await;
    assert_eq!(stable_tasks.len(), 21);
    let snap_head = s.head().await;
    let old_notes = list_notifications(&s, &format!("before_seq={}", snap_head + 1), 500).await;

    let stop = Arc::new(AtomicBool::new(false));
    let load = Arc::new(Mutex::new(Load::default()));
    let acks = Arc::new(AtomicU64::new(0));
    let appenders: Vec<_> = (0..6)
        .map(|k| {
            tokio::spawn(load_appender(
                s.api(),
                k,
                rng.random(),
                stop.clone(),
                load.clone(),
                acks.clone(),
            ))
        })
        .collect();
    wait_for(WAIT, "the appenders to get going", || {
        let n = acks.load(Ordering::Relaxed);
        async move { (n >= 10).then_some(()) }
    })
    .await;
    let mut reports: Vec<(u32, u64, Value)> = Vec::new();
    let mut lost = Vec::new();
    let mut during = 0;
    for round in 0..ROUNDS {
        let asked_at = s.head().await;
        let acks_before = acks.load(Ordering::Relaxed);
        let settings_action = if round % 4 == 1 { "rebuild" } else { "verify" };
        let (t, n, v) = tokio::join!(
            rebuild_or_verify(&s, "tasks", "rebuild"),
            rebuild_or_verify(&s, "notifications", "rebuild"),
            rebuild_or_verify(&s, "settings", settings_action),
        );
        during += acks.load(Ordering::Relaxed) - acks_before;
        for r in [t, n, v] {
            reports.push((round, asked_at, r));
        }
        // Everything acknowledged so far must be in the models the rebuilds switched to:
        // each task's latest_event_seq covers its acknowledged events, and each acknowledged
        // notification is on the dashboard.
        let (acked_latest, acked_notes) = {
            let l = load.lock().expect("lock");
            (l.latest.clone(), l.notifications.clone())
        };
        let model: HashMap<String, u64> = list_tasks(&s, "", 500)
            .await
            .iter()
            .map(|t| {
                (
                    t["task_id"].as_str().expect("task_id").to_owned(),
                    t["latest_event_seq"].as_u64().expect("latest_event_seq"),
                )
            })
            .collect();
        for (task, seq) in acked_latest {
            match model.get(&task) {
                Some(m) if *m >= seq => {}
                other => lost.push(format!(
                    "after round {round}: task {task}: acknowledged up to seq {seq}, \
                     the model has latest_event_seq {other:?}"
                )),
            }
        }
        let dash: HashSet<String> = list_notifications(&s, "", 500)
            .await
            .iter()
            .map(|n| n["notification_id"].as_str().expect("id").to_owned())
            .collect();
        for id in acked_notes {
            if !dash.contains(&id) {
                lost.push(format!(
                    "after round {round}: notification {id} not on the dashboard"
                ));
            }
        }
    }
    let final_acks = acks.load(Ordering::Relaxed);
    wait_for(WAIT, "more appends after the rebuilds", || {
        let n = acks.load(Ordering::Relaxed);
        async move { (n >= final_acks + 5).then_some(()) }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for a in appenders {
        tokio::time::timeout(WAIT, a)
            .await
            .expect("an appender hung")
            .expect("appender panicked");
    }
    // The appenders are done: take what they recorded.
    let l = std::mem::take(&mut *load.lock().expect("lock"));
    eprintln!(
        "rebuild under load: {} batches acknowledged ({during} while rebuilds ran), {} x 429",
        l.batches, l.overloaded
    );
    assert!(
        l.failures.is_empty(),
        "appends failed while projections were rebuilt: {:?}",
        l.failures
    );

    let bad: Vec<String> = reports
        .iter()
        .filter(|(_, _, r)| r["identical"] != true || r["first_divergent_seq"] != Value::Null)
        .map(|(round, asked_at, r)| format!("round {round} (head {asked_at} when asked): {r}"))
        .collect();
    assert!(
        bad.is_empty() && lost.is_empty(),
        "{} of {} rebuild/verify reports under load are not identical:\n{}\n\
         acknowledged events missing from the rebuilt models: {:?}",
        bad.len(),
        reports.len(),
        bad.join("\n"),
        &lost[..lost.len().min(10)]
    );
    for (round, asked_at, r) in &reports {
        let name = r["name"].as_str().unwrap_or_default();
        let swapped = name != "settings" || round % 4 == 1;
        check_report(r, name, swapped, *asked_at);
    }

    let (sources, created) = wait_routed(&s, WAIT).await;
    assert_routed_exactly_once(&sources, &created);
    assert_projections_sound(&s, "after rebuilds under load").await;

    assert_eq!(
        list_tasks(&s, "project_id=stable", 7).await,
        stable_tasks,
        "GET /v1/tasks changed for tasks that got no event"
    );
    assert_eq!(
        list_notifications(&s, &format!("before_seq={}", snap_head + 1), 500).await,
        old_notes,
        "the notifications from before the load changed"
    );
    // The busy tasks are the fold of their events.
    let busy = list_tasks(&s, "project_id=busy", 500).await;
    assert!(!busy.is_empty());
    for t in &busy {
        let id = t["task_id"].as_str().expect("task_id");
        let events = s.read_all(&format!("subject={id}")).await;
        assert_eq!(t["status"], TaskOracle::of(&events).status.as_str(), "{t}");
        assert_eq!(
            t["latest_event_seq"],
            events.last().map(seq_of).unwrap_or(0),
            "{t}"
        );
    }
    // Every acknowledged client notification is on the dashboard once.
    let dash: HashMap<String, usize> =
        list_notifications(&s, "", 500)
            .await
            .iter()
            .fold(HashMap::new(), |mut m, n| {
                *m.entry(n["notification_id"].as_str().expect("id").to_owned())
                    .or_default() += 1;
                m
            });
    for id in &l.notifications {
        assert_eq!(dash.get(id), Some(&1), "notification {id} on the dashboard");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_projections_list_verify_and_rebuild() {
    let s = Server::start(ServerOpts::default()).await;
    let (head, live) = seeded(&s, "cli", "cli-proj", 7).await;
    let url = s.base().to_owned();
    // The reports printed: one JSON document off a terminal (an array of reports when several).
    let reports_of =
        |out: &std::process::Output, what: &str| cli_records(cli_ok(out, what).as_bytes());

    let out = cli_at(&url, "projections list -o table").await;
    let stdout = cli_ok(&out, "`tidemark projections list --url URL`");
    for name in PROJECTIONS {
        let line = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("`projections list` has no line for {name}:\n{stdout}"));
        let digest = live[name]["digest"].as_str().expect("digest");
        assert!(
            line.contains(digest) && line.contains(&head.to_string()),
            "the {name} line shows its checkpoint and digest: {line:?}"
        );
    }

    let out = cli_at(&url, "projections verify").await;
    let reports = reports_of(&out, "`tidemark projections verify --url URL`");
    assert_eq!(
        reports
            .iter()
            .map(|r| r["name"].as_str().unwrap_or_default())
            .collect::<Vec<_>>(),
        PROJECTIONS,
        "one JSON report per projection on stdout: {reports:?}"
    );
    for r in &reports {
        let name = r["name"].as_str().expect("name");
        check_report(r, name, false, head);
        assert_eq!(r["digest"], live[name]["digest"], "{r}");
    }

    for (cmd, name, rebuilt) in [
        ("projections verify tasks", "tasks", false),
        ("projections rebuild notifications", "notifications", true),
    ] {
        let reports = reports_of(&cli_at(&url, cmd).await, cmd);
        assert_eq!(reports.len(), 1, "{reports:?}");
        check_report(&reports[0], name, rebuilt, head);
        if rebuilt {
            assert_eq!(reports[0]["digest"], live[name]["digest"]);
        }
    }

    let out = cli_at(&url, "projections verify nope").await;
    assert!(
        !out.status.success(),
        "verify of an unknown projection must exit non-zero; stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = cli_at(&url, "projections rebuild nope").await;
    assert!(
        !out.status.success(),
        "rebuild of an unknown projection must exit non-zero"
    );
    assert_projections_sound(&s, "after the CLI").await;
}

/// The models store is disposable (spec section 3): deleted while the server is stopped, or
/// found unreadable at start (set aside, not lost), it is rebuilt from the log — every model at
/// the head with the digest it had — and every read answers as before. Only the models' file
/// goes; the log is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_models_store_is_rebuilt_from_the_log_identical() {
    let mut s = Server::start(ServerOpts::default()).await;
    seed_tasks(&s, "gone", "p-gone", 12).await;
    wait_quiet(&s).await;
    settled(&s).await;
    let head = s.head().await;
    let before = projections(&s).await;
    let tasks_before = list_tasks(&s, "project_id=p-gone", 100).await;
    // Deleted, then (a second time) overwritten with what redb cannot read: both are rebuilt;
    // the unreadable file is set aside, not lost.
    for damage in ["deleted", "unreadable"] {
        s.sigterm();
        s.wait_exit(WAIT).await;
        let models = s.data_dir().join("models.redb");
        assert!(models.exists(), "the models store is its own file");
        match damage {
            "deleted" => std::fs::remove_file(&models).unwrap(),
            _ => std::fs::write(&models, vec![0xAB; 64 * 1024]).unwrap(),
        }
        s.restart().await;
        wait_quiet(&s).await;
        settled(&s).await;
        assert_eq!(
            s.head().await,
            head,
            "{damage}: nothing was appended on its own"
        );
        let after = projections(&s).await;
        for (name, b) in &before {
            let a = &after[name];
            assert_eq!(
                a["digest"], b["digest"],
                "{damage}: digest of {name} after the rebuild"
            );
            assert_eq!(
                a["checkpoint"], b["checkpoint"],
                "{damage}: checkpoint of {name}"
            );
        }
        assert_eq!(list_tasks(&s, "project_id=p-gone", 100).await, tasks_before);
        assert_projections_sound(&s, "a models store rebuilt from the log").await;
    }
    let aside = s.data_dir().join("models.redb.unreadable");
    assert_eq!(
        std::fs::read(&aside).expect("the unreadable store is kept aside"),
        vec![0xAB; 64 * 1024]
    );
    assert!(
        s.all_stderr()
            .contains("set aside, and rebuilt from the log")
    );
}
