//! What a webhook receiver is sent (spec section 4, "What a receiver accepts"): tidemark's own
//! body (section 17), the JSON a chat service documents for its incoming webhooks (Slack,
//! Microsoft Teams, Discord), or the route's template, rendered by a sandboxed engine
//! (minijinja: no file or network access, no custom functions, bounded by fuel and size). A
//! template is checked when the route is set, by rendering a sample whose every field is set:
//! a typo, an unknown field or output that is not the JSON its `content_type` says is refused
//! then, never met at delivery.

use minijinja::{AutoEscape, Environment, UndefinedBehavior};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A webhook route's `body`: a preset's name, or a template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum BodyConfig {
    Preset(String),
    Template(BodyTemplate),
}

/// `{ template = "…", content_type = "application/json" }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BodyTemplate {
    pub template: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
}

/// The presets, by name.
pub const PRESETS: [&str; 4] = ["tidemark", "slack", "teams", "discord"];

/// The longest template, and the longest body one renders.
pub const MAX_TEMPLATE_BYTES: usize = 16 * 1024;
pub const MAX_RENDERED_BYTES: usize = 256 * 1024;
/// The work one rendering may do (minijinja's fuel: about one unit per instruction).
const FUEL: u64 = 100_000;

/// A body as sent: its bytes and their `content-type`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub content_type: String,
    pub bytes: Vec<u8>,
}

/// Whether `content_type` is JSON (`application/json`, or a `+json` type).
fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json" || essence.ends_with("+json")
}

impl BodyConfig {
    /// Refused unless it is a preset or a template that renders the sample as its
    /// `content_type` says; the error names `key` (`route.body`).
    pub fn check(&self, key: &str) -> Result<(), String> {
        match self {
            BodyConfig::Preset(p) if PRESETS.contains(&p.as_str()) => Ok(()),
            BodyConfig::Preset(p) => Err(format!(
                "{key} {p:?} is not a preset: one of \"tidemark\", \"slack\", \"teams\", \
                 \"discord\", or {{ template = \"…\", content_type = \"application/json\" }}"
            )),
            BodyConfig::Template(t) => {
                if t.template.trim().is_empty() || t.template.len() > MAX_TEMPLATE_BYTES {
                    return Err(format!(
                        "{key}.template must be 1 to {MAX_TEMPLATE_BYTES} bytes"
                    ));
                }
                if let Some(ct) = &t.content_type {
                    let ok = ct.len() <= 256
                        && ct.contains('/')
                        && ct.chars().all(|c| c.is_ascii_graphic() || c == ' ');
                    if !ok {
                        return Err(format!(
                            "{key}.content_type must be a media type (e.g. \"application/json\")"
                        ));
                    }
                }
                render(Some(self), &sample())
                    .map(|_| ())
                    .map_err(|e| format!("{key}: {e}"))
            }
        }
    }
}

/// The console's page of delivery `id` under `base` (`https://tidemark.example.org`).
pub fn console_link(base: &str, id: &str) -> String {
    let mut enc = String::with_capacity(id.len());
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~:".contains(&b) {
            enc.push(char::from(b));
        } else {
            enc.push_str(&format!("%{b:02X}"));
        }
    }
    format!("{}/console#deliveries/{enc}", base.trim_end_matches('/'))
}

/// A context with every field set: what a template is checked against, and what
/// `POST /v1/routes/{name}/preview` renders when no delivery is named.
pub fn sample() -> Value {
    json!({
        "notification": {
            "id": "n-sample",
            "title": "Build 1042 failed on main",
            "body": "3 tests failed in payments/refunds.",
            "priority": "urgent",
            "recipient": "ops@example.org",
            "group_key": "builds",
        },
        "delivery": {
            "id": "dlv:n-sample:route",
            "route": "route",
            "attempt": 1,
            "items": [{"notification_id": "n-sample", "title": "Build 1042 failed on main",
                       "body": "3 tests failed in payments/refunds."}],
            "more": 0,
        },
        "task": {"id": "t-sample"},
        "console_url": "https://tidemark.example.org/console#deliveries/dlv:n-sample:route",
    })
}

fn text<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_str()
}

/// What the presets write: the title; the body, or a digest's item titles; the priority.
fn parts(ctx: &Value) -> (String, String, String, Option<String>) {
    let title = text(ctx, &["notification", "title"])
        .unwrap_or("")
        .to_owned();
    let mut body = text(ctx, &["notification", "body"])
        .unwrap_or("")
        .to_owned();
    let items = ctx["delivery"]["items"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if body.is_empty() && items.len() > 1 {
        body = items
            .iter()
            .filter_map(|i| i["title"].as_str())
            .map(|t| format!("• {t}"))
            .collect::<Vec<_>>()
            .join("\n");
        if let Some(more) = ctx["delivery"]["more"].as_u64().filter(|m| *m > 0) {
            body.push_str(&format!("\n… and {more} more"));
        }
    }
    let priority = text(ctx, &["notification", "priority"])
        .unwrap_or("")
        .to_owned();
    let link = text(ctx, &["console_url"]).map(str::to_owned);
    (title, body, priority, link)
}

/// At most `n` characters of `s` (an ellipsis marks a cut).
fn cut(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(n.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Render the body `cfg` (tidemark's when `None`) for `ctx` (see [`context`]); for the
/// `tidemark` preset, `tidemark` is the JSON itself.
pub fn render(cfg: Option<&BodyConfig>, ctx: &Value) -> Result<Rendered, String> {
    let json_body = |v: Value| Rendered {
        content_type: "application/json".into(),
        bytes: serde_json::to_vec(&v).unwrap_or_default(),
    };
    let (title, body, priority, link) = parts(ctx);
    let preset = match cfg {
        None => "tidemark",
        Some(BodyConfig::Preset(p)) => p.as_str(),
        Some(BodyConfig::Template(t)) => return template(t, ctx),
    };
    Ok(match preset {
        "tidemark" => json_body(tidemark(ctx)),
        // Slack: `text` (the notification's fallback and push text) and `blocks`.
        "slack" => {
            let mut blocks = vec![json!({"type": "section", "text": {"type": "mrkdwn",
                "text": cut(&format!("*{title}*{}{body}", if body.is_empty() { "" } else { "\n" }), 3000)}})];
            let mut ctx_line = format!("Priority: *{priority}*");
            if let Some(l) = &link {
                ctx_line.push_str(&format!(" · <{l}|Open in tidemark>"));
            }
            blocks.push(
                json!({"type": "context", "elements": [{"type": "mrkdwn", "text": ctx_line}]}),
            );
            json_body(
                json!({"text": cut(&format!("[{priority}] {title}"), 3000), "blocks": blocks}),
            )
        }
        // Microsoft Teams (Workflows and connectors): a message with an Adaptive Card.
        "teams" => {
            let mut card = json!({
                "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
                "type": "AdaptiveCard",
                "version": "1.4",
                "body": [
                    {"type": "TextBlock", "text": title, "weight": "Bolder", "size": "Medium", "wrap": true},
                    {"type": "TextBlock", "text": body, "wrap": true},
                    {"type": "FactSet", "facts": [{"title": "Priority", "value": priority}]},
                ],
            });
            if let Some(l) = &link {
                card["actions"] =
                    json!([{"type": "Action.OpenUrl", "title": "Open in tidemark", "url": l}]);
            }
            json_body(json!({"type": "message", "attachments": [{
                "contentType": "application/vnd.microsoft.card.adaptive",
                "contentUrl": null,
                "content": card,
            }]}))
        }
        // Discord: `content` and one embed.
        "discord" => {
            let color = match priority.as_str() {
                "urgent" => 0x00E0_3E3E,
                "action" | "warning" => 0x00F0_A030,
                _ => 0x0058_65F2,
            };
            let mut embed = json!({
                "title": cut(&title, 256),
                "description": cut(&body, 4096),
                "color": color,
                "fields": [{"name": "Priority", "value": cut(&priority, 1024), "inline": true}],
            });
            if let Some(l) = &link {
                embed["url"] = json!(l);
            }
            json_body(json!({"content": cut(&format!("**{title}**"), 2000), "embeds": [embed]}))
        }
        other => return Err(format!("{other:?} is not a preset")),
    })
}

/// tidemark's own body (section 17), from the context.
fn tidemark(ctx: &Value) -> Value {
    let n = &ctx["notification"];
    let d = &ctx["delivery"];
    json!({
        "type": "delivery",
        "delivery_id": d["id"],
        "notification_id": n["id"],
        "route": d["route"],
        "priority": n["priority"],
        "title": n["title"],
        "body": n["body"],
        "recipient": n["recipient"],
        "task_id": ctx["task"].get("id").cloned().unwrap_or(Value::Null),
        "items": d["items"],
        "more": d["more"],
    })
}

fn template(t: &BodyTemplate, ctx: &Value) -> Result<Rendered, String> {
    let content_type = t
        .content_type
        .clone()
        .unwrap_or_else(|| "application/json".into());
    let json_out = is_json(&content_type);
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_fuel(Some(FUEL));
    // In a JSON body a value is written as JSON (`{"text": {{ notification.title }}}`).
    env.set_auto_escape_callback(move |_| {
        if json_out {
            AutoEscape::Json
        } else {
            AutoEscape::None
        }
    });
    env.add_template("body", &t.template)
        .map_err(|e| format!("the template does not parse: {}", describe(&e)))?;
    let tmpl = env.get_template("body").map_err(|e| describe(&e))?;
    let out = tmpl
        .render(minijinja::Value::from_serialize(ctx))
        .map_err(|e| format!("the template does not render: {}", describe(&e)))?;
    if out.len() > MAX_RENDERED_BYTES {
        return Err(format!(
            "the rendered body is over {MAX_RENDERED_BYTES} bytes"
        ));
    }
    if json_out && let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&out) {
        return Err(format!(
            "the rendered body is not JSON ({e}), as its content_type {content_type:?} says"
        ));
    }
    Ok(Rendered {
        content_type,
        bytes: out.into_bytes(),
    })
}

/// A minijinja error in one line, with its line number.
fn describe(e: &minijinja::Error) -> String {
    let mut s = e
        .detail()
        .map_or_else(|| e.kind().to_string(), str::to_owned);
    if let Some(line) = e.line() {
        s.push_str(&format!(" (line {line})"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tpl(t: &str) -> BodyConfig {
        BodyConfig::Template(BodyTemplate {
            template: t.into(),
            content_type: None,
        })
    }

    #[test]
    fn a_template_writes_values_as_json_and_is_checked_on_the_sample() {
        let t = tpl(r#"{"text": {{ notification.title }}, "p": {{ notification.priority }}}"#);
        t.check("route.body").unwrap();
        let mut ctx = sample();
        ctx["notification"]["title"] = json!("a \"quoted\" title\n");
        let out = render(Some(&t), &ctx).unwrap();
        let v: Value = serde_json::from_slice(&out.bytes).unwrap();
        assert_eq!(v["text"], "a \"quoted\" title\n");
        assert_eq!(out.content_type, "application/json");
    }

    #[test]
    fn a_broken_template_is_refused_naming_why() {
        for (t, why) in [
            ("{{ notification.titel }}", "does not render"),
            ("{% for x in %}", "does not parse"),
            (r#"{"text": "{{ notification.title }}"}"#, "not JSON"),
            (
                "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
                "render",
            ),
        ] {
            let e = tpl(t).check("route.body").unwrap_err();
            assert!(e.contains(why) && e.starts_with("route.body"), "{t}: {e}");
        }
        assert!(
            BodyConfig::Preset("msteams".into())
                .check("route.body")
                .is_err()
        );
        let plain = BodyConfig::Template(BodyTemplate {
            template: "{{ notification.title }} ({{ notification.priority }})".into(),
            content_type: Some("text/plain".into()),
        });
        plain.check("route.body").unwrap();
        let out = render(Some(&plain), &sample()).unwrap();
        assert_eq!(out.bytes, b"Build 1042 failed on main (urgent)");
    }

    #[test]
    fn the_presets_write_each_services_shape() {
        let ctx = sample();
        let get = |p: &str| -> Value {
            serde_json::from_slice(
                &render(Some(&BodyConfig::Preset(p.into())), &ctx)
                    .unwrap()
                    .bytes,
            )
            .unwrap()
        };
        let slack = get("slack");
        assert!(slack["text"].as_str().unwrap().contains("Build 1042"));
        assert_eq!(slack["blocks"][0]["type"], "section");
        let teams = get("teams");
        assert_eq!(teams["type"], "message");
        assert_eq!(
            teams["attachments"][0]["contentType"],
            "application/vnd.microsoft.card.adaptive"
        );
        assert_eq!(teams["attachments"][0]["content"]["type"], "AdaptiveCard");
        let discord = get("discord");
        assert!(discord["content"].as_str().unwrap().len() <= 2000);
        assert_eq!(discord["embeds"][0]["url"], ctx["console_url"]);
        let own = get("tidemark");
        assert_eq!(own["type"], "delivery");
        assert_eq!(own["task_id"], "t-sample");
    }
}
