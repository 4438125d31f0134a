//! What a sink's loop reports of its attempts: the sent ones through one completion command,
//! each failure through the fail command, each in its delivery's tenant.

use std::time::Duration;

use tidemark_engine::Engine;
use tidemark_engine::commands::Completed;
use tidemark_engine::commands::outbox::{Complete, Fail, Failure};
use tidemark_projections::ids::DeliveryId;
use tidemark_projections::names::Sink;

use super::Outcome;

/// One attempt that ended.
pub(super) struct Attempt {
    pub(super) id: DeliveryId,
    pub(super) route: String,
    pub(super) outcome: Outcome,
    pub(super) took: Duration,
    /// The engine acting for the delivery's tenant: its report is that tenant's command.
    pub(super) tenant: Engine,
}

/// Record one tenant's attempts' outcomes: the sent ones through one completion command, each
/// failure through the fail command.
pub(super) async fn report(engine: &Engine, sink: Sink, owner: &str, attempts: Vec<Attempt>) {
    let mut sent: Vec<(DeliveryId, Option<String>)> = Vec::new();
    let mut reached: Vec<Vec<String>> = Vec::new();
    let tenant = tidemark_engine::labels::tenant_label(engine.tenant());
    for a in attempts {
        let kind = match &a.outcome {
            Outcome::Sent(_) => "sent",
            Outcome::Transient { .. } => "transient",
            Outcome::Permanent { .. } => "permanent",
        };
        metrics::counter!("tidemark_sink_attempts_total", "sink" => sink.as_str(), "outcome" => kind, "tenant" => tenant)
            .increment(1);
        metrics::histogram!("tidemark_sink_attempt_seconds", "sink" => sink.as_str(), "tenant" => tenant)
            .record(a.took.as_secs_f64());
        let id = a.id;
        let r = match a.outcome {
            Outcome::Sent(targets) => {
                sent.push((id, None));
                reached.push(targets);
                continue;
            }
            Outcome::Transient {
                code,
                error,
                retry_after_ms,
            } => fail(engine, &id, owner, code, error, true, retry_after_ms).await,
            Outcome::Permanent { code, error } => {
                fail(engine, &id, owner, code, error, false, None).await
            }
        };
        if let Err(e) = r {
            tracing::warn!(%sink, delivery = %id, error = %e, "dispatcher: report failed; the lease will expire");
        }
    }
    if sent.is_empty() {
        return;
    }
    let ids: Vec<DeliveryId> = sent.iter().map(|(id, _)| id.clone()).collect();
    match engine
        .execute(Complete {
            owner: owner.to_owned(),
            items: sent,
            resolved_targets: reached,
        })
        .await
    {
        Ok((results, _)) => {
            for (id, r) in ids.iter().zip(results) {
                if let Completed::Refused { code, .. } = r {
                    let code = code.code();
                    tracing::info!(%sink, delivery = %id, %code, "dispatcher: report refused");
                }
            }
        }
        Err(e) => {
            tracing::warn!(%sink, error = %e, deliveries = ids.len(),
                "dispatcher: reporting sent deliveries failed; their leases will expire");
        }
    }
}

async fn fail(
    engine: &Engine,
    id: &DeliveryId,
    owner: &str,
    code: String,
    error: String,
    retryable: bool,
    retry_after_ms: Option<u64>,
) -> Result<Option<String>, tidemark_engine::CommandError> {
    engine
        .execute(Fail {
            id: id.clone(),
            owner: owner.to_owned(),
            failure: Failure {
                error_code: code,
                error,
                retryable,
                retry_after_ms,
            },
        })
        .await
        .map(|_| None)
}
