//! Closed monthly statements (`platform::capacity::statements`): for platform staff and the
//! tenant's admins and viewers.

use axum::Json;
use axum::extract::Path;
use serde::Serialize;
use utoipa::ToSchema;

use super::{ApiError, TokenCaller, fail, rfc3339};

/// A statement as the list shows it.
#[derive(Serialize, ToSchema)]
pub struct StatementSummaryBody {
    id: i64,
    /// The tenant's name when it closed ("Platform staff" for staff's own bookings).
    tenant: String,
    /// `2026-11`
    #[schema(example = "2026-11")]
    month: String,
    #[schema(format = DateTime)]
    closed_at: String,
    total_cents: i64,
}

#[derive(Serialize, ToSchema)]
pub struct StatementListBody {
    statements: Vec<StatementSummaryBody>,
}

/// The statements the caller may read, newest first.
#[utoipa::path(get, path = "/api/v1/statements", tag = "usage", responses((status = 200, body = StatementListBody)))]
pub(super) async fn statements(
    TokenCaller(platform, caller): TokenCaller,
) -> Result<Json<StatementListBody>, ApiError> {
    let rows = platform.statements(&caller).await.map_err(fail(&caller))?;
    Ok(Json(StatementListBody {
        statements: rows
            .into_iter()
            .map(|s| StatementSummaryBody {
                id: s.id,
                tenant: s.tenant,
                month: s.month,
                closed_at: rfc3339(s.closed_at),
                total_cents: s.total_cents,
            })
            .collect(),
    }))
}

/// One line item.
#[derive(Serialize, ToSchema)]
pub struct StatementLineBody {
    project: Option<String>,
    person: String,
    offering: String,
    /// The rate card's line, e.g. "H100-80GB, MIG 3g.40gb".
    size: String,
    tier: String,
    /// Hours of the size's unit (a GPU, a slice, a share).
    unit_hours: f64,
    gpu_hours: f64,
    /// "$3.20 per GPU-hour", or the prices in force over the month where it changed.
    rate: String,
    list_cents: i64,
    discount_cents: i64,
    total_cents: i64,
}

#[derive(Serialize, ToSchema)]
pub struct StatementBody {
    id: i64,
    tenant: String,
    #[schema(example = "2026-11")]
    month: String,
    /// `use` or `window`: what bookings were charged for.
    basis: String,
    #[schema(format = DateTime)]
    closed_at: String,
    lines: Vec<StatementLineBody>,
    /// The sums of the lines'.
    list_cents: i64,
    discount_cents: i64,
    total_cents: i64,
}

/// One closed statement with its line items.
#[utoipa::path(get, path = "/api/v1/statements/{id}", tag = "usage",
    params(("id" = i64, Path, description = "The statement's id")),
    responses((status = 200, body = StatementBody)))]
pub(super) async fn statement(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<i64>,
) -> Result<Json<StatementBody>, ApiError> {
    let s = platform.statement(&caller, id).await.map_err(fail(&caller))?;
    Ok(Json(StatementBody {
        id: s.id,
        tenant: s.tenant,
        month: s.month.key(),
        basis: s.basis,
        closed_at: rfc3339(s.closed_at),
        lines: s
            .lines
            .into_iter()
            .map(|l| StatementLineBody {
                project: l.project,
                person: l.person,
                offering: l.offering,
                size: l.size,
                tier: l.tier,
                unit_hours: l.unit_hours,
                gpu_hours: l.gpu_hours,
                rate: l.rate,
                list_cents: l.list_cents,
                discount_cents: l.discount_cents,
                total_cents: l.total_cents,
            })
            .collect(),
        list_cents: s.list_cents,
        discount_cents: s.discount_cents,
        total_cents: s.total_cents,
    }))
}
