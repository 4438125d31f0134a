//! The email adapter (spec section 17) on `lettre`: `smtp://` (STARTTLS when the server offers
//! it), `smtps://` (implicit TLS), optional credentials from the environment. One message per
//! delivery to its recipient's address, with a `Message-ID` derived from the delivery id (the
//! same on every retry, so a receiver can drop a repeat) and `X-Mailer: tidemark/<version>`, a plain-text and a minimal HTML
//! part; a digest is one email listing its items.

use std::time::Duration;

use lettre::message::header::{HeaderName, HeaderValue};
use lettre::message::{Mailbox, MultiPart};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use tidemark_projections::deliveries::Delivery;
use tidemark_projections::names::Sink;

use super::{Adapter, Outcome, resolve};

/// `[sinks.email]`.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct EmailConfig {
    /// `smtp://host:port` (STARTTLS when offered) or `smtps://host:port` (implicit TLS).
    pub url: String,
    /// The sender, `Name <address>` or an address.
    pub from: String,
    /// `env:NAME` (or the text); optional.
    pub user: Option<String>,
    /// Shown masked (`tidemark config show`) unless it is an `env:` reference.
    #[serde(serialize_with = "masked")]
    pub password: Option<String>,
    #[serde(default = "default_timeout")]
    pub timeout: String,
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
}

fn masked<S: serde::Serializer>(v: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(p) if !p.starts_with("env:") => s.serialize_some("********"),
        other => serde::Serialize::serialize(other, s),
    }
}

fn default_timeout() -> String {
    "10s".into()
}

fn default_concurrency() -> usize {
    4
}

/// The email sink, ready to send.
pub struct Email {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    concurrency: usize,
    /// The whole attempt's bound (the transport's own timeout covers each read; a server
    /// that trickles or never answers DATA is bounded here).
    timeout: Duration,
    /// The SMTP server by scheme, host and port (the server log's name for it).
    endpoint: String,
}

impl Email {
    /// Check `cfg` and build the transport (no connection is made here); errors name the key.
    pub fn new(cfg: &EmailConfig) -> Result<Email, String> {
        let url = reqwest::Url::parse(&cfg.url).map_err(|_| {
            "sinks.email.url must be smtp://host:port or smtps://host:port".to_owned()
        })?;
        let host = url
            .host_str()
            .ok_or("sinks.email.url has no host")?
            .to_owned();
        let (timeout, concurrency) = super::pool("email", &cfg.timeout, cfg.concurrency)?;
        let tls_params =
            || TlsParameters::new(host.clone()).map_err(|e| format!("sinks.email.url: TLS: {e}"));
        let (port, tls) = match url.scheme() {
            "smtp" => (url.port().unwrap_or(25), Tls::Opportunistic(tls_params()?)),
            "smtps" => (url.port().unwrap_or(465), Tls::Wrapper(tls_params()?)),
            _ => return Err("sinks.email.url must start with smtp:// or smtps://".into()),
        };
        let from: Mailbox = cfg.from.parse().map_err(
            |_| "sinks.email.from is not an address (e.g. \"tidemark <noreply@example.org>\")",
        )?;
        let endpoint = format!("{}://{host}:{port}", url.scheme());
        let mut b = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(host)
            .port(port)
            .tls(tls)
            .timeout(Some(timeout));
        match (&cfg.user, &cfg.password) {
            (Some(u), Some(p)) => {
                b = b.credentials(Credentials::new(
                    resolve(u, "sinks.email.user")?,
                    resolve(p, "sinks.email.password")?,
                ));
            }
            (None, None) => {}
            _ => return Err("sinks.email: user and password go together".into()),
        }
        Ok(Email {
            transport: b.build(),
            from,
            concurrency,
            timeout,
            endpoint,
        })
    }

    /// The message of `d` to `to`.
    fn message(&self, d: &Delivery, to: Mailbox, id: String) -> Result<Message, String> {
        // The plain-text part says what the HTML part says: the title, then the body or the
        // digest's items (a notification without a body is not an empty message).
        let mut text = format!("{}\n", d.title);
        if d.body.is_some() || d.items.len() > 1 || d.item_count() > 1 {
            text.push('\n');
        }
        let mut html = String::new();
        if d.items.len() > 1 || d.item_count() > 1 {
            for it in &d.items {
                text.push_str(&format!("- {}\n", it.title));
                html.push_str(&format!("<li>{}</li>", escape(&it.title)));
            }
            let more = d.item_count() - d.items.len();
            if more > 0 {
                text.push_str(&format!("and {more} more\n"));
                html.push_str(&format!("<li>and {more} more</li>"));
            }
            html = format!("<ul>{html}</ul>");
        } else if let Some(b) = &d.body {
            text.push_str(b);
            text.push('\n');
            html.push_str(&format!("<p>{}</p>", escape(b)));
        }
        Message::builder()
            .from(self.from.clone())
            .to(to)
            .subject(d.title.clone())
            .message_id(Some(id))
            .raw_header(HeaderValue::new(
                HeaderName::new_from_ascii_str("X-Mailer"),
                crate::USER_AGENT.to_owned(),
            ))
            .multipart(MultiPart::alternative_plain_html(
                text,
                format!(
                    "<!doctype html><html><body><h3>{}</h3>{html}</body></html>",
                    escape(&d.title)
                ),
            ))
            .map_err(|e| e.to_string())
    }
}

/// `<` + the delivery id with every byte outside `[A-Za-z0-9._-]` as `=XX` + `@tidemark>`.
pub fn message_id(delivery: &str) -> String {
    let mut s = String::from("<");
    for b in delivery.bytes() {
        if b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_' {
            s.push(b as char);
        } else {
            s.push_str(&format!("={b:02X}"));
        }
    }
    s.push_str("@tidemark>");
    s
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

impl Adapter for Email {
    fn sink(&self) -> Sink {
        Sink::Email
    }

    fn concurrency(&self) -> usize {
        self.concurrency
    }

    fn to_people(&self) -> bool {
        true
    }

    fn endpoint<'a>(
        &'a self,
        _route: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<String>> + Send + 'a>> {
        Box::pin(std::future::ready(Some(self.endpoint.clone())))
    }

    /// One message per target, in turn (each member of a list gets its own, with a
    /// `Message-ID` of its own that is the same on every retry; nobody sees the others'
    /// addresses). Every one sent: sent, to all. A transient failure retries the delivery
    /// (members already reached get the same message again, which their `Message-ID` lets a
    /// mail system drop); a permanent one parks it.
    fn deliver(
        &self,
        _tenant: tidemark_engine::Engine,
        d: Delivery,
        targets: Vec<super::Target>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Outcome> + Send + '_>> {
        Box::pin(async move {
            let mut reached = Vec::with_capacity(targets.len());
            for t in targets {
                let Ok(to) = t.address.parse::<Mailbox>() else {
                    return Outcome::Permanent {
                        code: "invalid_recipient".into(),
                        error: "a target of the delivery is not an email address".into(),
                    };
                };
                let address = to.email.to_string();
                let id = if t.from_list {
                    message_id(&format!("{}/{}", d.id, address))
                } else {
                    message_id(d.id.as_str())
                };
                let msg = match self.message(&d, to, id) {
                    Ok(m) => m,
                    Err(e) => {
                        return Outcome::Permanent {
                            code: "invalid_message".into(),
                            error: e,
                        };
                    }
                };
                match tokio::time::timeout(self.timeout, self.transport.send(msg)).await {
                    Ok(Ok(_)) => reached.push(address),
                    Ok(Err(e)) => return classify(&e),
                    Err(_) => {
                        return Outcome::Transient {
                            code: "smtp_timeout".into(),
                            error: "the SMTP server did not answer in time".into(),
                            retry_after_ms: None,
                        };
                    }
                }
            }
            Outcome::Sent(reached)
        })
    }
}

/// SMTP 5xx → permanent (`smtp_<code>`); 4xx, timeouts and connection errors → transient.
fn classify(e: &lettre::transport::smtp::Error) -> Outcome {
    let code = e.status().map(|c| c.to_string());
    // The server's words, without anything of ours (no credentials are in an SMTP reply).
    let error = e.to_string();
    if e.is_permanent() {
        Outcome::Permanent {
            code: format!("smtp_{}", code.unwrap_or_else(|| "5xx".into())),
            error,
        }
    } else if e.is_transient() {
        Outcome::Transient {
            code: format!("smtp_{}", code.unwrap_or_else(|| "4xx".into())),
            error,
            retry_after_ms: None,
        }
    } else if e.is_timeout() {
        Outcome::Transient {
            code: "smtp_timeout".into(),
            error: "the SMTP server did not answer in time".into(),
            retry_after_ms: None,
        }
    } else {
        Outcome::Transient {
            code: "smtp_connection".into(),
            error,
            retry_after_ms: None,
        }
    }
}
