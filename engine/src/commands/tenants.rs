//! Tenants (spec section 20): `POST /v1/tenants` records `tenant.created` with the shard it
//! is placed in, `DELETE /v1/tenants/{name}` records `tenant.removed`; both need a reason and
//! name who did it. The directory is the default tenant's (a tenant's handle cannot run them).

use serde_json::json;
use tidemark_log::NewEvent;
use tidemark_projections::ModelsTxn;
use tidemark_projections::names::{EventType, Stream};
use tidemark_projections::tenants::{self, TenantRow};

use super::{Command, DecideResult, Decided, Round};
use crate::error::{CommandError, Rejection};

/// Create tenant `name` (`create`: refused `tenant_exists` for a name ever used, removed or
/// not) or remove it (refused `tenant_not_found` for one that is not a tenant now). Answers
/// the row after it.
#[derive(Debug, Clone)]
pub struct SetTenant {
    pub name: String,
    pub create: bool,
    pub reason: String,
    pub by: Option<String>,
    /// How many shards the deployment has (`[log] shards`, at least 1): a new tenant is
    /// placed in the one with the fewest live tenants (the default tenant counts in shard 0;
    /// the lowest on a tie), and the placement is recorded in its `tenant.created`.
    pub shards: u32,
    /// Shards a move is copying into (spec section 20): no new tenant goes there.
    pub reserved: Vec<u32>,
}

/// The shard a new tenant goes to among `shards`: the one with the fewest live tenants of
/// `directory` (the default tenant counts in shard 0), the lowest on a tie; never one of
/// `reserved` (a move's destination) while another is left.
pub fn place(directory: &[TenantRow], shards: u32, reserved: &[u32]) -> u32 {
    let mut load = vec![0usize; shards.max(1) as usize];
    load[0] = 1;
    for t in directory.iter().filter(|t| t.is_live()) {
        if let Some(n) = load.get_mut(t.shard as usize) {
            *n += 1;
        }
    }
    for &r in reserved.iter().filter(|&&r| r != 0) {
        if let Some(n) = load.get_mut(r as usize) {
            *n = usize::MAX;
        }
    }
    (0..load.len()).min_by_key(|&i| (load[i], i)).unwrap_or(0) as u32
}

impl Command for SetTenant {
    type Answer = TenantRow;

    fn decide(&self, txn: &ModelsTxn, round: &mut Round<'_>) -> DecideResult<Self::Answer> {
        if txn.tenant().is_some() {
            return Err(CommandError::rejected(
                Rejection::InvalidTenant,
                "tenants are created and removed in the default tenant's directory",
            ));
        }
        // A name no tenant can have is refused when created, not found when removed; the
        // default tenant is neither created nor removed.
        if self.create
            && let Err(e) = tidemark_log::check_tenant(&self.name)
        {
            return Err(CommandError::rejected(
                Rejection::InvalidTenant,
                e.to_string(),
            ));
        }
        if self.name == tidemark_log::DEFAULT_TENANT {
            return Err(CommandError::rejected(
                Rejection::InvalidTenant,
                "the default tenant always exists: it is not created or removed",
            ));
        }
        if self.reason.trim().is_empty() {
            return Err(CommandError::rejected(
                Rejection::ReasonRequired,
                "a tenant is created or removed with a reason",
            ));
        }
        let now = tenants::View::new(txn)?.row(&self.name)?;
        let (ty, payload, row) = match (self.create, now) {
            (true, Some(_)) => {
                return Err(CommandError::rejected(
                    Rejection::TenantExists,
                    format!(
                        "tenant {:?} exists (or existed: a name is not reused)",
                        self.name
                    ),
                ));
            }
            (true, None) => {
                let shard = place(
                    &tenants::View::new(txn)?.all()?,
                    self.shards,
                    &self.reserved,
                );
                let row = TenantRow {
                    name: self.name.clone(),
                    shard,
                    reason: self.reason.clone(),
                    by: self.by.clone(),
                    created_at_us: round.now_us,
                    ..TenantRow::default()
                };
                let payload = json!({"shard": shard, "reason": self.reason, "by": self.by});
                (EventType::TenantCreated, payload, row)
            }
            (false, Some(row)) if row.is_live() => {
                let payload = json!({"reason": self.reason, "by": self.by});
                let row = TenantRow {
                    removed: Some(tenants::Removed {
                        reason: self.reason.clone(),
                        by: self.by.clone(),
                        at_us: round.now_us,
                        seq: 0,
                    }),
                    ..row
                };
                (EventType::TenantRemoved, payload, row)
            }
            (false, _) => {
                return Err(CommandError::rejected(
                    Rejection::TenantNotFound,
                    format!("no tenant {:?}", self.name),
                ));
            }
        };
        let ev = NewEvent::new(None, Stream::Tenants, &self.name, ty.as_str(), &payload)
            .map_err(|e| CommandError::rejected(Rejection::InvalidTenant, e.to_string()))?;
        Ok(Decided::new(row, vec![ev]))
    }
}

/// Record that tenant `name` lives in shard `to` from now on, its events copied there
/// through `through_seq` of `from` ([`crate::moves`]): refused unless it is a live tenant
/// of `from`, and while another tenant is placed in `to`. Answers the row after it.
#[derive(Debug, Clone)]
pub struct MoveTenant {
    pub name: String,
    pub from: u32,
    pub to: u32,
    pub through_seq: u64,
    pub reason: String,
    pub by: Option<String>,
}

impl Command for MoveTenant {
    type Answer = TenantRow;

    fn decide(&self, txn: &ModelsTxn, _round: &mut Round<'_>) -> DecideResult<Self::Answer> {
        if txn.tenant().is_some() {
            return Err(CommandError::rejected(
                Rejection::InvalidTenant,
                "tenants are moved in the default tenant's directory",
            ));
        }
        if self.reason.trim().is_empty() {
            return Err(CommandError::rejected(
                Rejection::ReasonRequired,
                "a tenant is moved with a reason",
            ));
        }
        let view = tenants::View::new(txn)?;
        let row = match view.row(&self.name)? {
            Some(r) if r.is_live() => r,
            _ => {
                return Err(CommandError::rejected(
                    Rejection::TenantNotFound,
                    format!("no tenant {:?}", self.name),
                ));
            }
        };
        if row.shard != self.from || self.to == self.from {
            return Err(CommandError::rejected(
                Rejection::NotMovable,
                format!(
                    "tenant {:?} lives in shard {}, not {} (or the move goes nowhere)",
                    self.name, row.shard, self.from
                ),
            ));
        }
        if let Some(other) = view.all()?.into_iter().find(|t| t.shard == self.to) {
            return Err(CommandError::rejected(
                Rejection::ShardNotEmpty,
                format!("tenant {:?} was placed in shard {}", other.name, self.to),
            ));
        }
        let payload = json!({
            "from": self.from, "to": self.to, "through_seq": self.through_seq,
            "reason": self.reason, "by": self.by,
        });
        let ev = NewEvent::new(
            None,
            Stream::Tenants,
            &self.name,
            EventType::TenantMoved.as_str(),
            &payload,
        )
        .map_err(|e| CommandError::rejected(Rejection::InvalidTenant, e.to_string()))?;
        Ok(Decided::new(
            TenantRow {
                shard: self.to,
                ..row
            },
            vec![ev],
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, shard: u32, live: bool) -> TenantRow {
        TenantRow {
            name: name.to_owned(),
            shard,
            removed: (!live).then(tenants::Removed::default),
            ..TenantRow::default()
        }
    }

    #[test]
    fn a_new_tenant_goes_to_the_shard_with_the_fewest() {
        assert_eq!(place(&[], 1, &[]), 0);
        assert_eq!(place(&[], 0, &[]), 0);
        // The default tenant is shard 0's: the first tenant goes to shard 1.
        assert_eq!(place(&[], 3, &[]), 1);
        let d = [row("a", 1, true), row("b", 2, true)];
        assert_eq!(place(&d, 3, &[]), 0, "a tie goes to the lowest");
        // A removed tenant does not count; a placement beyond the shards is ignored.
        let d = [
            row("a", 1, false),
            row("b", 2, true),
            row("c", 0, true),
            row("z", 9, true),
        ];
        assert_eq!(place(&d, 3, &[]), 1);
        assert_eq!(place(&d, 3, &[1]), 2, "a move's destination is passed over");
    }
}
