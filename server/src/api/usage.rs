//! The audit log and the usage report (also the usage page's JSON download, `web.rs`).

use axum::Json;
use axum::extract::Query;
use berth_platform::audit::{AUDIT_PAGE, AuditFilter};
use berth_platform::{Caller, Error, Platform};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::paging::{PageQuery, cursor};
use super::{ApiError, ApiResult, TokenCaller, fail, rfc3339, schema};

/// The audit log's filters (`berth_platform::audit::AuditFilter` reads them); empty ones
/// do not filter.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)] // The parameters `AuditFilter` reads; never built.
pub struct AuditQuery {
    /// A tenant's slug (platform staff).
    tenant: Option<String>,
    /// Part of the actor's email.
    actor: Option<String>,
    /// The start of an action's name, e.g. `environment.launch`.
    action: Option<String>,
    /// `success`, `failure` or `denied`.
    outcome: Option<String>,
    /// Only events before this id (the audit page's form of `cursor`).
    before: Option<i64>,
}

#[derive(Serialize, ToSchema)]
pub struct AuditEvent {
    id: i64,
    #[schema(format = DateTime)]
    at: String,
    /// The actor's email.
    actor: Option<String>,
    tenant: Option<String>,
    action: String,
    target: Option<String>,
    /// `success`, `failure` or `denied`.
    outcome: String,
    /// The source address.
    source: Option<String>,
    request_id: Option<String>,
    detail: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct AuditLog {
    /// Newest first.
    events: Vec<AuditEvent>,
    /// The next page's `cursor`; `null` on the last page.
    next_cursor: Option<String>,
}

/// What an audit cursor is a place in.
const LISTING: &str = "audit";

/// The audit log in the caller's reach, newest first: 100 events a page unless `limit`
/// says otherwise, 1,000 at most.
#[utoipa::path(get, path = "/api/v1/audit", tag = "audit", params(AuditQuery, PageQuery),
    responses((status = 200, body = AuditLog)))]
pub(super) async fn audit(
    TokenCaller(platform, caller): TokenCaller,
    Query(mut filter): Query<AuditFilter>,
    Query(page): Query<PageQuery>,
) -> Result<Json<AuditLog>, ApiError> {
    let limit = page.limit(AUDIT_PAGE, 1000).map_err(fail(&caller))?;
    if let Some(before) = page.id_place(LISTING).map_err(fail(&caller))? {
        filter.before_id = Some(before);
    }
    // One more than asked says whether there are more.
    let mut rows = platform.audit_log(&caller, &filter, limit + 1).await.map_err(fail(&caller))?;
    let more = i64::try_from(rows.len()).is_ok_and(|n| n > limit);
    rows.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    let next_cursor = rows.last().filter(|_| more).map(|last| cursor(LISTING, &last.id.to_string()));
    let events = rows
        .into_iter()
        .map(|r| AuditEvent {
            id: r.id,
            at: rfc3339(r.at),
            actor: r.actor,
            tenant: r.tenant,
            action: r.action,
            target: r.target,
            outcome: r.outcome,
            source: r.source,
            request_id: r.request_id,
            detail: r.detail,
        })
        .collect();
    Ok(Json(AuditLog { events, next_cursor }))
}

/// Which month of usage, grouped how, and (platform staff) of which tenant.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UsageQuery {
    /// `2026-11`; empty for this month.
    #[serde(default)]
    #[param(pattern = "^([0-9]{4}-(0[1-9]|1[0-2]))?$")]
    pub month: String,
    /// What the lines are; empty for projects.
    #[serde(default)]
    #[param(schema_with = schema::usage_by)]
    pub by: String,
    /// A tenant's slug (platform staff).
    #[serde(default)]
    pub tenant: String,
}

/// A month of GPU-hours and cost in the caller's reach, with the budgets that apply.
#[utoipa::path(get, path = "/api/v1/usage", tag = "usage", params(UsageQuery),
    responses((status = 200, body = UsageBody)))]
pub(super) async fn usage(TokenCaller(platform, caller): TokenCaller, Query(query): Query<UsageQuery>) -> ApiResult {
    let report = usage_report(&platform, &caller, &query).await.map_err(fail(&caller))?;
    Ok(Json(usage_json(&report)))
}

pub async fn usage_report(
    platform: &Platform,
    caller: &Caller,
    query: &UsageQuery,
) -> Result<berth_platform::capacity::metering::UsageReport, Error> {
    let (month, by) = berth_platform::capacity::metering::parse_report(&query.month, &query.by)?;
    let tenant = Some(query.tenant.as_str()).filter(|t| !t.trim().is_empty());
    platform.usage_report(caller, month, by, tenant).await
}

/// A usage report as the API and the usage page's JSON download give it: amounts in cents
/// and as dollars, GPU-hours as numbers.
#[derive(Serialize, ToSchema)]
pub struct UsageBody {
    /// `2026-11`.
    month: String,
    /// `use` or `reservation`: what a booking is charged for.
    charged_for: &'static str,
    by: &'static str,
    /// Up to when time is counted.
    #[schema(format = DateTime)]
    counted_to: String,
    /// Costliest first.
    lines: Vec<UsageLineBody>,
    total_cents: i64,
    /// `$12.34`.
    total: String,
    total_gpu_hours: f64,
    /// For each day of the month, each line's cents (in `lines` order).
    daily_cents: Vec<Vec<i64>>,
    /// Each day of the month with each line's cents and GPU-hours (in `lines` order).
    days: Vec<UsagePeriodBody>,
    /// Each week, Monday to Sunday (UTC), cut at the month's edges: its days in the month,
    /// with each line's cents and GPU-hours (in `lines` order). A period's cents are rounded
    /// once per line, so weeks may differ from the month's lines by under a cent a line.
    weeks: Vec<UsagePeriodBody>,
    budgets: Vec<BudgetBody>,
    /// Platform staff: each GPU model's GPU-hours held against the fleet's, per day.
    fleet: Vec<ModelUseBody>,
}

#[derive(Serialize, ToSchema)]
pub struct UsageLineBody {
    key: String,
    name: String,
    gpu_hours: f64,
    environments: usize,
    cents: i64,
    amount: String,
}

#[derive(Serialize, ToSchema)]
pub struct BudgetBody {
    id: i64,
    /// "Tenant Acme", "Project acme/vision".
    of: String,
    cents_per_month: i64,
    warn_only: bool,
    spent_cents: i64,
    /// Spent, plus what running and booked environments will cost by the month's end.
    committed_cents: i64,
    /// The marks (50, 80, 100) reached this month.
    reached_percent: Vec<u32>,
}

#[derive(Serialize, ToSchema)]
pub struct ModelUseBody {
    model: String,
    gpus: i64,
    allocated_gpu_hours: Vec<f64>,
    capacity_gpu_hours: Vec<f64>,
}

/// A day or a week of a usage report.
#[derive(Serialize, ToSchema)]
pub struct UsagePeriodBody {
    /// Its first and last day in the month (the same for a day).
    #[schema(format = Date)]
    from: String,
    #[schema(format = Date)]
    to: String,
    cents: Vec<i64>,
    gpu_hours: Vec<f64>,
    total_cents: i64,
}

fn period_body(period: &berth_platform::capacity::metering::UsagePeriod) -> UsagePeriodBody {
    UsagePeriodBody {
        from: period.first_day.to_string(),
        to: period.last_day.to_string(),
        cents: period.cents.clone(),
        gpu_hours: period.gpu_hours.clone(),
        total_cents: period.total_cents(),
    }
}

/// A usage report as JSON (the API's answer and the page's download).
pub fn usage_json(report: &berth_platform::capacity::metering::UsageReport) -> Value {
    let body = UsageBody {
        month: report.month.key(),
        charged_for: report.basis.as_str(),
        by: report.by.as_str(),
        counted_to: rfc3339(report.counted_to),
        lines: report
            .lines
            .iter()
            .map(|l| UsageLineBody {
                key: l.key.clone(),
                name: l.label.clone(),
                gpu_hours: l.gpu_hours,
                environments: l.environments,
                cents: l.cents,
                amount: berth_domain::metering::format_money(l.cents),
            })
            .collect(),
        total_cents: report.total_cents,
        total: berth_domain::metering::format_money(report.total_cents),
        total_gpu_hours: report.total_gpu_hours,
        daily_cents: report.daily.iter().map(|d| d.cents.clone()).collect(),
        days: report.daily.iter().map(period_body).collect(),
        weeks: report.weekly.iter().map(period_body).collect(),
        budgets: report
            .budgets
            .iter()
            .map(|b| BudgetBody {
                id: b.id,
                of: b.of.clone(),
                cents_per_month: b.cents_per_month,
                warn_only: b.warn_only,
                spent_cents: b.spent_cents,
                committed_cents: b.committed_cents,
                reached_percent: b.reached.clone(),
            })
            .collect(),
        fleet: report
            .fleet
            .iter()
            .map(|m| ModelUseBody {
                model: m.model.clone(),
                gpus: m.gpus,
                allocated_gpu_hours: m.allocated_gpu_hours.clone(),
                capacity_gpu_hours: m.capacity_gpu_hours.clone(),
            })
            .collect(),
    };
    serde_json::to_value(body).unwrap_or(Value::Null)
}

/// A day's GPU-hours of one model (and tenant): read by the telemetry, and busy.
#[derive(Serialize, ToSchema)]
pub struct GpuEfficiencyDay {
    /// `2026-11-27` (UTC).
    day: String,
    /// The tenant's name; `null` for platform staff's own environments.
    tenant: Option<String>,
    gpu_model: String,
    read_gpu_hours: f64,
    busy_gpu_hours: f64,
}

#[derive(Serialize, ToSchema)]
pub struct GpuEfficiency {
    /// The last 14 days, oldest first.
    days: Vec<GpuEfficiencyDay>,
}

/// Busy against read GPU-hours per day, model and tenant over the last 14 days: every
/// tenant for platform staff, their own for tenant admins and viewers, none for members.
#[utoipa::path(get, path = "/api/v1/gpu-efficiency", tag = "usage",
    responses((status = 200, body = GpuEfficiency)))]
pub(super) async fn gpu_efficiency(
    TokenCaller(platform, caller): TokenCaller,
) -> Result<Json<GpuEfficiency>, ApiError> {
    let since = berth_platform::now_ms() - 13 * berth_domain::booking::DAY_MS;
    let since = chrono::DateTime::from_timestamp_millis(since).map(|t| t.format("%Y-%m-%d").to_string());
    let days = platform.gpu_use_days(&caller, &since.unwrap_or_default()).await.map_err(fail(&caller))?;
    let days = days
        .into_iter()
        .map(|d| GpuEfficiencyDay {
            day: d.day,
            tenant: d.tenant,
            gpu_model: d.model,
            read_gpu_hours: d.read_gpu_hours,
            busy_gpu_hours: d.busy_gpu_hours,
        })
        .collect();
    Ok(Json(GpuEfficiency { days }))
}
