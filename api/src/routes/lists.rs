//! Notification lists (spec section 17): `GET /v1/lists`, `GET /v1/lists/{name}` (read), and
//! `PUT` / `DELETE /v1/lists/{name}` (admin), recorded as `list.updated` / `list.deleted` with
//! the reason and who did it. A list is resolved when a delivery is attempted.

use crate::state::Api;
use axum::Json;
use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use tidemark_engine::commands::lists::SetList;
use tidemark_log::time::Micros;
use tidemark_projections::lists::ListRow;
use utoipa::{IntoParams, ToSchema};

use crate::error::{ApiError, Problem};
use crate::request::{Reason, Text, Validate, ValidatedJson, check_text};
use crate::routes::{caller, read_model};

/// At most this many members in a list.
pub const MAX_MEMBERS: usize = 1000;

#[derive(Debug, Serialize, ToSchema)]
pub struct ListOut {
    pub name: String,
    pub members: Vec<String>,
    pub reason: String,
    /// The token that last changed it (absent in open mode).
    pub by: Option<String>,
    #[schema(value_type = String)]
    pub updated_at: Micros,
    pub updated_seq: u64,
}

impl From<ListRow> for ListOut {
    fn from(r: ListRow) -> Self {
        ListOut {
            name: r.name,
            members: r.members,
            reason: r.reason,
            by: r.by,
            updated_at: Micros(r.updated_at_us),
            updated_seq: r.updated_seq,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ListsPage {
    pub lists: Vec<ListOut>,
    /// The answer reflects the log at least up to this seq.
    pub as_of_seq: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ListAnswer {
    #[serde(flatten)]
    pub list: ListOut,
    pub as_of_seq: u64,
}

/// A list's name in a path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ListName {
    /// The list's name: 1 to 128 printable characters.
    #[param(min_length = 1, max_length = 128)]
    pub name: String,
}

/// A member: an address (or any target name), 1 to 254 printable characters.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(pattern = "^[^\\x00-\\x20\\x7F-\\xA0]{1,254}$")]
pub struct Member(pub String);

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ListBody {
    /// The members, at most 1000 (a repeated one counts once).
    #[schema(max_items = 1000)]
    pub members: Vec<Member>,
    /// Why; required, recorded in the event.
    #[schema(inline)]
    pub reason: Reason,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ListDeleteBody {
    /// Why; required, recorded in the event.
    #[schema(inline)]
    pub reason: Reason,
}

/// A list's name read from the path and checked before any body: `422 invalid_list`.
pub struct ListPath(String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for ListPath {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        let Path(ListName { name }) = Path::<ListName>::from_request_parts(parts, state)
            .await
            .map_err(|_| check_name("").unwrap_err())?;
        check_name(&name)?;
        Ok(ListPath(name))
    }
}

fn check_name(name: &str) -> Result<(), ApiError> {
    if !Text::<128>::fits(name) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_list",
            "a list name is 1 to 128 printable characters",
        ));
    }
    Ok(())
}

impl Validate for ListBody {
    fn validate(&self) -> Result<(), ApiError> {
        self.reason.check("a list change")?;
        if self.members.len() > MAX_MEMBERS {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_list",
                format!("a list has at most {MAX_MEMBERS} members"),
            ));
        }
        for Member(m) in &self.members {
            check_text("members", m, 254)?;
        }
        Ok(())
    }
}

impl Validate for ListDeleteBody {
    fn validate(&self) -> Result<(), ApiError> {
        self.reason.check("a list change")
    }
}

fn not_found(name: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "list_not_found",
        format!("no list {name:?}"),
    )
}

/// Every notification list.
#[utoipa::path(get, path = "/v1/lists", tag = "lists", operation_id = "listLists",
    responses((status = 200, body = ListsPage)),
    security(("bearer" = ["read"])))]
pub async fn list(st: Api) -> Result<Json<ListsPage>, ApiError> {
    let (rows, as_of_seq) = read_model(st.engine(), 0, |q| q.lists()).await?;
    Ok(Json(ListsPage {
        lists: rows.into_iter().map(ListOut::from).collect(),
        as_of_seq,
    }))
}

/// One notification list.
#[utoipa::path(get, path = "/v1/lists/{name}", tag = "lists", operation_id = "getList",
    params(ListName),
    responses(
        (status = 200, body = ListAnswer),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["read"])))]
pub async fn show(st: Api, ListPath(name): ListPath) -> Result<Json<ListAnswer>, ApiError> {
    let n = name.clone();
    let (row, as_of_seq) = read_model(st.engine(), 0, move |q| q.list(&n)).await?;
    let row = row.ok_or_else(|| not_found(&name))?;
    Ok(Json(ListAnswer {
        list: row.into(),
        as_of_seq,
    }))
}

/// Admin: set a list's members (creating it), with a reason.
#[utoipa::path(put, path = "/v1/lists/{name}", tag = "lists", operation_id = "putList",
    params(ListName),
    request_body(content = ListBody, content_type = "application/json"),
    responses(
        (status = 200, body = ListAnswer),
        (status = 422, description = "reason_required, invalid_list or a malformed body", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["admin"])))]
#[tracing::instrument(skip_all, fields(list = %name))]
pub async fn put(
    st: Api,
    ListPath(name): ListPath,
    headers: HeaderMap,
    ValidatedJson(b): ValidatedJson<ListBody>,
) -> Result<Json<ListAnswer>, ApiError> {
    let mut seen = std::collections::HashSet::new();
    let mut members = Vec::with_capacity(b.members.len());
    for Member(m) in b.members {
        if seen.insert(m.clone()) {
            members.push(m);
        }
    }
    let (_, receipt) = st
        .engine()
        .execute(SetList {
            name: name.clone(),
            members: Some(members),
            reason: b.reason.into_string(),
            by: caller(&st, &headers),
        })
        .await?;
    let n = name.clone();
    let (row, as_of_seq) = read_model(st.engine(), receipt.last_seq, move |q| q.list(&n)).await?;
    let row = row.ok_or_else(|| not_found(&name))?;
    Ok(Json(ListAnswer {
        list: row.into(),
        as_of_seq,
    }))
}

/// Admin: delete a list, with a reason. Deliveries to it are parked `unknown_list` when
/// attempted.
#[utoipa::path(delete, path = "/v1/lists/{name}", tag = "lists", operation_id = "deleteList",
    params(ListName),
    request_body(content = ListDeleteBody, content_type = "application/json"),
    responses(
        (status = 204, description = "deleted"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["admin"])))]
#[tracing::instrument(skip_all, fields(list = %name))]
pub async fn delete(
    st: Api,
    ListPath(name): ListPath,
    headers: HeaderMap,
    ValidatedJson(b): ValidatedJson<ListDeleteBody>,
) -> Result<StatusCode, ApiError> {
    st.engine()
        .execute(SetList {
            name,
            members: None,
            reason: b.reason.into_string(),
            by: caller(&st, &headers),
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
