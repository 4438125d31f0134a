//! Tasks' bridge subscriptions, a notification's status, the effective configuration and
//! shell completions (spec section 9).

use clap::CommandFactory;
use serde_json::{Value, json};

use super::client::Client;
use super::operator::items;
use super::output::write_out;
use super::{
    CliResult, ConfigAction, ConfigArgs, NotificationsAction, NotificationsArgs, Output,
    SubscriptionAction, TasksAction, TasksArgs,
};
use crate::config::Config;

pub(crate) async fn tasks(a: TasksArgs) -> CliResult {
    let c = Client::new(&a.client)?;
    let out = a.client.output();
    let TasksAction::Notifications { action } = a.action;
    match action {
        SubscriptionAction::Subscribe {
            task,
            subscription_id,
            bridge_id,
            scope,
            workspace,
            thread,
            mode,
            sink,
            webhook_url,
            secret_env,
        } => {
            let mut s = json!({"kind": sink});
            if let Some(u) = webhook_url {
                s["url"] = json!(u);
            }
            if let Some(var) = secret_env {
                let secret = std::env::var(&var)
                    .map_err(|_| format!("the environment variable {var} is not set"))?;
                s["secret"] = json!(secret);
            }
            let mut body = json!({"subscription_id": subscription_id, "bridge_id": bridge_id,
                                  "sink": s});
            for (k, v) in [
                ("scope", scope),
                ("workspace_id", workspace),
                ("thread_id", thread),
                ("mode", mode),
            ] {
                if let Some(v) = v {
                    body[k] = json!(v);
                }
            }
            out.one(
                &c.op(c.ops().create_bridge_subscription(&task, &body))
                    .await?,
            )
        }
        SubscriptionAction::List { task } => {
            let v = c.op(c.ops().list_bridge_subscriptions(&task, &[])).await?;
            out.list(
                &items(&v, "subscriptions"),
                &[
                    "subscription_id",
                    "bridge_id",
                    "active",
                    "sink.kind",
                    "cursor.last_sequence",
                    "cursor.last_error",
                ],
            )
        }
        SubscriptionAction::Show {
            task,
            subscription_id,
        } => out.one(
            &c.op(c
                .ops()
                .get_bridge_subscription(&task, &subscription_id, &[]))
                .await?,
        ),
        SubscriptionAction::Delete {
            task,
            subscription_id,
        } => out.one(
            &c.op(c.ops().delete_bridge_subscription(&task, &subscription_id))
                .await?,
        ),
    }
}

pub(crate) async fn notifications(a: NotificationsArgs) -> CliResult {
    let c = Client::new(&a.client)?;
    let out = a.client.output();
    let NotificationsAction::Status { id } = a.action;
    let v = c.op(c.ops().get_notification_status(&id, &[])).await?;
    match out {
        Output::Table => {
            let mut head = json!({"notification_id": v["notification"]["notification_id"],
                                  "title": v["notification"]["title"], "status": v["status"],
                                  "attempts": v["attempts"], "last_error": v["last_error"],
                                  "enqueued_at": v["enqueued_at"],
                                  "delivered_at": v["delivered_at"]});
            if let Some(site) = v["notification"]["source"]["site_id"].as_str() {
                head["source_site"] = json!(site);
            }
            out.one(&head)?;
            write_out("\n")?;
            out.list(
                &items(&v, "deliveries"),
                &["id", "route", "sink", "status", "attempts"],
            )
        }
        _ => out.one(&v),
    }
}

/// The configuration file the Debian package installs and its unit passes to `serve`.
pub(crate) const PACKAGED_CONFIG: &str = "/etc/tidemark/tidemark.toml";

/// Keys whose values are secrets (or could be): masked in `config show`.
fn secret_key(k: &str) -> bool {
    let k = k.to_ascii_lowercase();
    [
        "secret",
        "token",
        "password",
        "sha256",
        "authorization",
        "hmac_key",
        "api_key",
    ]
    .iter()
    .any(|s| k == *s || k.ends_with(&format!("_{s}")))
}

/// Every scalar under `v` masked.
fn mask_all(v: &mut Value) {
    match v {
        Value::Object(m) => m.values_mut().for_each(mask_all),
        Value::Array(a) => a.iter_mut().for_each(mask_all),
        Value::Null => {}
        x => *x = json!("***"),
    }
}

fn mask(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                if k.eq_ignore_ascii_case("headers") || secret_key(k) {
                    mask_all(x);
                } else {
                    mask(x);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(mask),
        _ => {}
    }
}

/// The effective configuration, secrets masked, as a JSON tree.
pub(crate) fn effective(cfg: &Config) -> Result<Value, String> {
    let mut v = serde_json::to_value(cfg).map_err(|e| e.to_string())?;
    mask(&mut v);
    // A webhook route's URL can itself be a secret (spec section 17).
    if let Some(routes) = v
        .pointer_mut("/notifications/routes")
        .and_then(Value::as_object_mut)
    {
        for r in routes.values_mut() {
            if let Some(url) = r.get_mut("url")
                && !url.as_str().is_some_and(|u| u.starts_with("env:"))
            {
                *url = json!("***");
            }
        }
    }
    Ok(v)
}

pub(crate) fn config_show(a: ConfigArgs) -> CliResult {
    let ConfigAction::Show { config, output } = a.action;
    // The file the server would read: the one given, else the Debian package's, which its unit
    // passes to `serve` (and which a `config show` on that machine is asked about).
    let config = config.or_else(|| {
        let packaged = std::path::Path::new(PACKAGED_CONFIG);
        packaged.exists().then(|| {
            eprintln!("# {PACKAGED_CONFIG} (the packaged service's; --config FILE for another)");
            packaged.to_owned()
        })
    });
    // The service's secrets may be set only in its environment: an unset one is shown masked
    // and named here, not a refusal.
    tidemark_consumers::unset_env::tolerate();
    let cfg = Config::load(config.as_deref()).map_err(|e| e.to_string())?;
    let unset = tidemark_consumers::unset_env::seen();
    if !unset.is_empty() {
        eprintln!(
            "# not set in this environment, so masked here (the server refuses to start without \
             them): {}",
            unset.join(", ")
        );
    }
    let v = effective(&cfg)?;
    match output {
        Some(Output::Json | Output::Jsonl) => write_out(&format!("{v}\n")),
        _ => {
            // TOML has no null: an unset option is left out.
            fn strip(v: &mut Value) {
                match v {
                    Value::Object(m) => {
                        m.retain(|_, x| !x.is_null());
                        m.values_mut().for_each(strip);
                    }
                    Value::Array(a) => a.iter_mut().for_each(strip),
                    _ => {}
                }
            }
            let mut v = v;
            strip(&mut v);
            write_out(
                &toml::to_string_pretty(&v).map_err(|e| format!("cannot print as TOML: {e}"))?,
            )
        }
    }
}

pub(crate) fn completions(shell: clap_complete::Shell) -> CliResult {
    let mut cmd = super::Cli::command();
    // Into memory first: clap_complete panics on a write error, such as a closed pipe.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "tidemark", &mut script);
    write_out(&String::from_utf8_lossy(&script))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_masked_at_any_depth() {
        let mut v = json!({"auth": {"tokens": [{"name": "a", "sha256": "abc", "scopes": ["read"]}]},
                           "sources": [{"name": "s", "headers": {"Authorization": "Bearer x"},
                                        "url": "https://x"}],
                           "privacy": {"hmac_key": "env:K"}, "server": {"listen": "1"}});
        mask(&mut v);
        let text = v.to_string();
        for secret in ["abc", "Bearer x", "env:K"] {
            assert!(!text.contains(secret), "{text}");
        }
        assert!(
            text.contains("https://x") && text.contains("\"scopes\""),
            "{text}"
        );
    }
}
