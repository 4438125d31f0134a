//! Routes managed at runtime (spec section 4): `PUT /v1/routes/{name}` records `route.updated`
//! with the route object, `DELETE` records `route.deleted`; both need a reason and name who did
//! it. A route the configuration file configures stays the file's.

use tidemark_log::NewEvent;
use tidemark_projections::ModelsTxn;
use tidemark_projections::names::{EventType, Stream};
use tidemark_projections::routes::{self, RouteRow};
use tidemark_projections::routing::ApiRoute;
use tidemark_projections::settings;

use super::sealed::Sealed;
use super::{Command, Decided, Round};
use crate::error::{CommandError, Rejection};

/// The routes tidemark itself defines (section 4): neither is managed through the API.
pub const BUILT_IN: [&str; 2] = ["dashboard", "desktop"];

/// Set a route (`Some`: create or replace it) or delete it (`None`, refused `route_not_found`
/// for a route the API does not hold); answers the route after it (deleted: as it was).
#[derive(Debug, Clone)]
pub struct SetRoute {
    pub name: String,
    pub route: Option<ApiRoute>,
    pub reason: String,
    pub by: Option<String>,
}

impl Sealed for SetRoute {}
impl Command for SetRoute {
    type Answer = RouteRow;

    fn name(&self) -> &'static str {
        "route.set"
    }

    fn decide(
        &self,
        txn: &ModelsTxn,
        round: &mut Round<'_>,
    ) -> Result<Decided<RouteRow>, CommandError> {
        let name = self.name.as_str();
        if BUILT_IN.contains(&name) {
            return Err(CommandError::rejected(
                Rejection::InvalidRoute,
                format!(
                    "{name} is a built-in route: configure it in [notifications.routes.{name}]"
                ),
            ));
        }
        if settings::View::new(txn)?
            .file_routes()?
            .contains(&self.name)
        {
            return Err(CommandError::rejected(
                Rejection::RouteFromConfig,
                format!(
                    "the route {name:?} is configured in the file ([notifications.routes.{name}]): \
                     change it there"
                ),
            ));
        }
        let held = routes::View::new(txn)?.row(name)?;
        let (ty, payload, row) = match &self.route {
            Some(r) => {
                r.check(name)
                    .map_err(|e| CommandError::rejected(Rejection::InvalidRoute, e))?;
                let row = RouteRow {
                    name: self.name.clone(),
                    route: r.recorded().to_string(),
                    reason: self.reason.clone(),
                    by: self.by.clone(),
                    updated_at_us: round.now_us,
                    updated_seq: 0,
                    previous_secret: None,
                    previous_until_us: None,
                };
                (
                    EventType::RouteUpdated,
                    routes::updated_payload(r, &self.reason, self.by.as_deref()),
                    row,
                )
            }
            None => {
                let Some(row) = held else {
                    return Err(CommandError::rejected(
                        Rejection::RouteNotFound,
                        format!("no route {name:?} managed through the API"),
                    ));
                };
                (
                    EventType::RouteDeleted,
                    serde_json::json!({"reason": self.reason, "by": self.by}),
                    row,
                )
            }
        };
        let ev = NewEvent::new(None, Stream::Routes, name, ty.as_str(), &payload)
            .map_err(|e| CommandError::rejected(Rejection::InvalidRoute, e.to_string()))?;
        Ok(Decided::new(row, vec![ev]))
    }
}
