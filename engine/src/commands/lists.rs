//! Notification lists (spec section 17): `PUT /v1/lists/{name}` records `list.updated` with the
//! members, `DELETE` records `list.deleted`; both need a reason and name who did it.

use serde_json::json;
use tidemark_log::NewEvent;
use tidemark_projections::lists;
use tidemark_projections::lists::ListRow;
use tidemark_projections::names::{EventType, Stream};

use super::{Command, DecideResult, Decided, Round};
use crate::error::{CommandError, Rejection};
use tidemark_projections::ModelsTxn;

/// Set a list's members (`Some`) or delete it (`None`, refused `list_not_found` for a list
/// that does not exist); answers the list after it (deleted: without members).
#[derive(Debug, Clone)]
pub struct SetList {
    pub name: String,
    pub members: Option<Vec<String>>,
    pub reason: String,
    pub by: Option<String>,
}

impl Command for SetList {
    type Answer = ListRow;

    fn decide(&self, txn: &ModelsTxn, round: &mut Round<'_>) -> DecideResult<Self::Answer> {
        if self.members.is_none() && lists::View::new(txn)?.row(&self.name)?.is_none() {
            return Err(CommandError::rejected(
                Rejection::ListNotFound,
                format!("no list {:?}", self.name),
            ));
        }
        let (ty, payload) = match &self.members {
            Some(m) => (
                EventType::ListUpdated,
                json!({"members": m, "reason": self.reason, "by": self.by}),
            ),
            None => (
                EventType::ListDeleted,
                json!({"reason": self.reason, "by": self.by}),
            ),
        };
        let ev = NewEvent::new(None, Stream::Lists, &self.name, ty.as_str(), &payload)
            .map_err(|e| CommandError::rejected(Rejection::InvalidList, e.to_string()))?;
        let row = ListRow {
            name: self.name.clone(),
            members: self.members.clone().unwrap_or_default(),
            reason: self.reason.clone(),
            by: self.by.clone(),
            updated_at_us: round.now_us,
            updated_seq: 0,
        };
        Ok(Decided::new(row, vec![ev]))
    }
}
