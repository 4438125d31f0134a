use super::*;
use crate::names::Priority;
use crate::routing::ApiRoute;
use serde_json::json;

/// A route managed at runtime is read as the file's route is, under `route.`, with its
/// priorities; it joins the routing of each after the file's (or the default) routes; a
/// route the file configures stays the file's; its url and secret are recorded, not
/// composed into the settings.
#[test]
fn a_route_from_the_api_joins_the_settings() {
    let e = ApiRoute::from_json(&json!({"sinc": "app"})).unwrap_err();
    assert!(
        e.starts_with("route.sinc is not a known key (known: priorities, sink, "),
        "{e}"
    );
    let e = ApiRoute::from_json(&json!({"sink": "app", "priorities": ["loud"]})).unwrap_err();
    assert!(e.starts_with("route.priorities must be"), "{e}");
    let e = ApiRoute::from_json(&json!({"sink": "app", "delay": "5m"}))
        .and_then(|r| r.check("x"))
        .unwrap_err();
    assert!(e.starts_with("route.delay must be"), "{e}");
    let e = ApiRoute::from_json(&json!({"types": ["a"]}))
        .and_then(|r| r.check("x"))
        .unwrap_err();
    assert!(e.starts_with("route.sink is required"), "{e}");
    let e = ApiRoute::from_json(&json!({"sink": "app", "secret": "s"}))
        .and_then(|r| r.check("x"))
        .unwrap_err();
    assert!(e.contains("are for sink = \"webhook\""), "{e}");
    let hook = ApiRoute::from_json(&json!({"sink": "webhook", "url": "https://h.example/x",
        "secret": "env:S", "priorities": ["warning", "urgent", "urgent"]}))
    .unwrap();
    hook.check("hook").unwrap();
    assert_eq!(hook.priorities, [Priority::Warning, Priority::Urgent]);
    assert_eq!(hook.recorded()["secret"], "env:S");
    assert!(hook.public().get("secret").is_none() && hook.public().get("url").is_none());
    assert_eq!(ApiRoute::from_json(&hook.recorded()).unwrap(), hook);

    let file = NotificationsConfig::from_json(&json!({
        "routing": {"urgent": ["dashboard"]},
        "routes": {"pager": {"sink": "app"}},
    }))
    .unwrap();
    let pager = ApiRoute::from_json(&json!({"sink": "email", "priorities": ["info"]})).unwrap();
    let api = BTreeMap::from([("hook".to_owned(), hook), ("pager".to_owned(), pager)]);
    let s = file.with_routes(&api).settings().unwrap();
    assert_eq!(s.routing["urgent"], ["dashboard", "hook"]);
    // `warning` was not in the file: the default routes, then the API's.
    assert_eq!(s.routing["warning"], ["dashboard", "hook"]);
    assert_eq!(s.routes["hook"].sink, Some(Sink::Webhook));
    // The file's `pager` stays the file's.
    assert_eq!(s.routes["pager"].sink, Some(Sink::App));
    assert_eq!(s.routing["info"], ["dashboard"]);
    let payload = file.with_routes(&api).event_payload();
    assert!(
        payload["routes"]["hook"].get("secret").is_none(),
        "{payload}"
    );
}

/// A misspelt key anywhere is refused with its full key and the keys its table takes;
/// a value of the wrong shape names its key and what it must be.
#[test]
fn errors_name_the_key_as_the_file_spells_it() {
    let err = |v: Value| NotificationsConfig::from_json(&v).unwrap_err();
    let e = err(json!({"routes": {"hook": {"sinc": "webhook"}}}));
    assert!(
        e.starts_with("notifications.routes.hook.sinc is not a known key (known: sink, "),
        "{e}"
    );
    let e = err(json!({"retry": {"strategy": "sometimes"}}));
    assert_eq!(
        e,
        "notifications.retry.strategy must be one of \"exponential\", \"linear\", \"fixed\""
    );
    let e = err(json!({"routes": {"hook": {"sink": "pager"}}}));
    assert_eq!(
        e,
        "notifications.routes.hook.sink must be one of app, email, webhook"
    );
    let e = err(json!({"dashboard": {"limt": 5}}));
    assert_eq!(
        e,
        "notifications.dashboard.limt is not a known key (known: enabled, limit)"
    );
    let e = err(json!({"enabled": "yes"}));
    assert_eq!(e, "notifications.enabled must be true or false");
    let e = err(json!({"templates": {"de": {"sources": {"s": {"title": "x"}}}}}));
    assert!(
        e.starts_with(
            "notifications.templates.de.sources.s.title is not a known key (known: title_one"
        ),
        "{e}"
    );
    let e = NotificationsConfig::from_json(&json!({"outbox": {"stuck_after": "5 minutes"}}))
        .unwrap()
        .settings()
        .unwrap_err();
    assert!(
        e.starts_with("notifications.outbox.stuck_after must be a duration"),
        "{e}"
    );
}

/// The settings event is written from the same types: what is set, without a webhook's
/// url and secret, and it reads back to the same settings.
#[test]
fn the_event_payload_reads_back_and_keeps_no_secret() {
    let v = json!({
        "enabled": true,
        "routing": {"urgent": ["hook", "desktop"]},
        "routes": {"hook": {"sink": "webhook", "url": "https://x", "secret": "env:S",
                            "retry": {"max_attempts": 3, "jitter": 0.5}}},
    });
    let c = NotificationsConfig::from_json(&v).unwrap();
    assert_eq!(
        c.routes.as_ref().unwrap()["hook"].url.as_deref(),
        Some("https://x")
    );
    let payload = c.event_payload();
    assert_eq!(
        payload,
        json!({
            "enabled": true,
            "routing": {"urgent": ["hook", "desktop"]},
            "routes": {"hook": {"sink": "webhook", "retry": {"max_attempts": 3, "jitter": 0.5}}},
        })
    );
    let again = NotificationsConfig::from_json(&payload).unwrap();
    assert_eq!(again.settings().unwrap(), c.settings().unwrap());
    assert_eq!(
        again.settings().unwrap().routes["hook"].sink,
        Some(Sink::Webhook)
    );
}
