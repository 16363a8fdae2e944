//! Quotas (GPU limits of everyone, a tenant, a project or a user) and monthly budgets.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::Path;
use berth_domain::Refusal;
use berth_domain::booking::Quota;
use berth_platform::capacity::budgets::BudgetChange;
use berth_platform::capacity::quotas::{QuotaRow, QuotaSubject};
use berth_platform::{Caller, Error, Platform};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::{ApiError, Body, TokenCaller, fail, schema, typed};

/// One quota row: whose limits, and the limits (`null`: no limit).
#[derive(Serialize, ToSchema)]
pub struct QuotaBody {
    id: i64,
    /// `everyone` (the default per user), `tenant`, `project` or `user`.
    #[schema(example = "project")]
    level: &'static str,
    /// The tenant's, project's or user's id; `null` for everyone.
    subject_id: Option<i64>,
    /// "Everyone (default per user)", "Tenant Acme", "Project acme/vision", an email.
    who: String,
    /// GPU-equivalents held at any one moment, per GPU model.
    max_gpus: Option<f64>,
    /// Limits for particular models, in place of `max_gpus` for them.
    #[schema(example = json!({"H100-80GB": 8}))]
    max_gpus_by_model: BTreeMap<String, f64>,
    /// GPU-equivalent hours booked in one calendar month (UTC).
    gpu_hours_per_month: Option<f64>,
    /// The longest single booking, in hours.
    max_booking_hours: Option<u32>,
    /// Bookings whose windows overlap one another.
    max_overlapping: Option<u32>,
    /// May book beyond the GPU limits in the spot tier.
    allow_spot: bool,
}

fn quota_body(row: QuotaRow) -> QuotaBody {
    let (level, subject_id) = match row.subject {
        QuotaSubject::Everyone => ("everyone", None),
        QuotaSubject::Tenant(id) => ("tenant", Some(id)),
        QuotaSubject::Project(id) => ("project", Some(id)),
        QuotaSubject::User(id) => ("user", Some(id)),
    };
    let q = row.quota;
    QuotaBody {
        id: row.id,
        level,
        subject_id,
        who: row.who,
        max_gpus: q.max_gpus,
        max_gpus_by_model: q.max_gpus_by_model.into_iter().map(|(m, v)| (m.name().to_owned(), v)).collect(),
        gpu_hours_per_month: q.gpu_hours_per_month,
        max_booking_hours: q.max_booking_hours,
        max_overlapping: q.max_overlapping,
        allow_spot: q.allow_spot,
    }
}

#[derive(Serialize, ToSchema)]
pub struct QuotaList {
    /// Everyone's default first, then tenants, projects and users.
    quotas: Vec<QuotaBody>,
}

/// The quota rows in the caller's reach: all of them for platform staff; everyone's
/// default and their tenant's, its projects' and its members' rows for the others.
#[utoipa::path(get, path = "/api/v1/quotas", tag = "quotas", responses((status = 200, body = QuotaList)))]
pub(super) async fn quotas(TokenCaller(platform, caller): TokenCaller) -> Result<Json<QuotaList>, ApiError> {
    let rows = platform.quotas(&caller).await.map_err(fail(&caller))?;
    Ok(Json(QuotaList { quotas: rows.into_iter().map(quota_body).collect() }))
}

/// `{"level": "project", "who": "acme/vision", "max_gpus": 8}`: whose limits and the
/// limits; a limit left out, `null` or empty is no limit. Numbers as numbers or text.
#[derive(Deserialize, ToSchema)]
pub struct NewQuota {
    /// `everyone` (the default per user; platform admins), `tenant` (by slug; platform
    /// admins), `project` (`tenant-slug/name`, or the name in the caller's tenant) or `user`
    /// (by email).
    #[schema(example = "project")]
    level: String,
    /// The tenant's slug, the project or the user's email; empty for everyone.
    #[serde(default)]
    who: String,
    /// GPU-equivalents, 0 or more.
    #[serde(default)]
    #[schema(schema_with = schema::optional_decimal_or_text)]
    max_gpus: Value,
    /// GPU model (`H100-80GB`, ...) to GPU-equivalents, in place of `max_gpus` for it.
    #[serde(default)]
    #[schema(value_type = Option<BTreeMap<String, f64>>, example = json!({"H100-80GB": 8}))]
    max_gpus_by_model: Option<BTreeMap<String, Value>>,
    /// 0 or more.
    #[serde(default)]
    #[schema(schema_with = schema::optional_decimal_or_text)]
    gpu_hours_per_month: Value,
    /// Whole hours, at least 1.
    #[serde(default)]
    #[schema(schema_with = schema::optional_number_or_text)]
    max_booking_hours: Value,
    /// At least 1.
    #[serde(default)]
    #[schema(schema_with = schema::optional_number_or_text)]
    max_overlapping: Value,
    #[serde(default)]
    allow_spot: bool,
}

impl NewQuota {
    /// The limits as the domain reads a form's, models as `MODEL = GPUs` lines.
    fn quota(&self) -> Result<Quota, Refusal> {
        let mut by_model = Vec::new();
        for (model, limit) in self.max_gpus_by_model.iter().flatten() {
            let limit = typed(limit);
            // A separator inside would read as another line of the form's text.
            if [model, &limit].iter().any(|t| t.contains([',', '\n', '='])) {
                return Err(Refusal::InvalidQuota(format!(
                    "\"{model} = {limit}\" should name a GPU model and a number of GPU-equivalents"
                )));
            }
            by_model.push(format!("{model} = {limit}"));
        }
        Quota::parse(
            &typed(&self.max_gpus),
            &by_model.join("\n"),
            &typed(&self.gpu_hours_per_month),
            &typed(&self.max_booking_hours),
            &typed(&self.max_overlapping),
            self.allow_spot,
        )
    }
}

/// Sets the limits of everyone (the default per user), a tenant, a project or a user,
/// replacing the row it had. Tenant admins set their projects' and members'.
#[utoipa::path(put, path = "/api/v1/quotas", tag = "quotas", request_body = NewQuota,
    responses((status = 200, body = QuotaBody)))]
pub(super) async fn set_quota(
    TokenCaller(platform, caller): TokenCaller,
    Body(asked): Body<NewQuota>,
) -> Result<Json<QuotaBody>, ApiError> {
    let quota = asked.quota().map_err(|r| fail(&caller)(r.into()))?;
    let id = platform.set_quota_for(&caller, &asked.level, &asked.who, &quota).await.map_err(fail(&caller))?;
    let rows = platform.quotas(&caller).await.map_err(fail(&caller))?;
    let row = rows
        .into_iter()
        .find(|r| r.id == id)
        .ok_or_else(|| fail(&caller)(Error::internal("the quota just set was not found")))?;
    Ok(Json(quota_body(row)))
}

#[derive(Serialize, ToSchema)]
pub struct QuotaRemoved {
    /// The quota row's id.
    removed: i64,
}

/// Removes a quota row: a user falls back to everyone's default, a project or tenant is
/// no longer limited as a whole.
#[utoipa::path(delete, path = "/api/v1/quotas/{id}", tag = "quotas",
    params(("id" = i64, Path, description = "The quota row's id")),
    responses((status = 200, body = QuotaRemoved)))]
pub(super) async fn remove_quota(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<i64>,
) -> Result<Json<QuotaRemoved>, ApiError> {
    platform.remove_quota(&caller, id).await.map_err(fail(&caller))?;
    Ok(Json(QuotaRemoved { removed: id }))
}

/// A monthly budget and how far this month has gone into it.
#[derive(Serialize, ToSchema)]
pub struct BudgetStatusBody {
    id: i64,
    /// The tenant's id.
    tenant: i64,
    /// The project's id; `null` for the tenant's own budget.
    project: Option<i64>,
    /// "Tenant Acme", "Project acme/vision".
    of: String,
    cents_per_month: i64,
    /// `$2,000.00`.
    amount: String,
    /// Warns at 50, 80 and 100% but refuses no booking.
    warn_only: bool,
    /// Charged so far this month.
    spent_cents: i64,
    /// Spent, plus what running and booked environments will cost by the month's end: what
    /// bookings are checked against.
    committed_cents: i64,
    /// The marks (50, 80, 100) reached this month.
    reached_percent: Vec<u32>,
}

#[derive(Serialize, ToSchema)]
pub struct BudgetList {
    /// `2026-11`: the month spent and committed are of.
    month: String,
    budgets: Vec<BudgetStatusBody>,
}

/// The budgets in the caller's reach, this month.
async fn budget_list(platform: &Platform, caller: &Caller) -> Result<BudgetList, Error> {
    let (month, by) = berth_platform::capacity::metering::parse_report("", "")?;
    let report = platform.usage_report(caller, month, by, None).await?;
    let budgets = report
        .budgets
        .into_iter()
        .map(|b| BudgetStatusBody {
            id: b.id,
            tenant: b.tenant_id,
            project: b.project_id,
            of: b.of,
            cents_per_month: b.cents_per_month,
            amount: berth_domain::metering::format_money(b.cents_per_month),
            warn_only: b.warn_only,
            spent_cents: b.spent_cents,
            committed_cents: b.committed_cents,
            reached_percent: b.reached,
        })
        .collect();
    Ok(BudgetList { month: report.month.key(), budgets })
}

/// The monthly budgets in the caller's reach (a member's: their projects'), with what this
/// month spent and committed.
#[utoipa::path(get, path = "/api/v1/budgets", tag = "usage", responses((status = 200, body = BudgetList)))]
pub(super) async fn budgets(TokenCaller(platform, caller): TokenCaller) -> Result<Json<BudgetList>, ApiError> {
    Ok(Json(budget_list(&platform, &caller).await.map_err(fail(&caller))?))
}

/// `{"level": "project", "who": "acme/vision", "amount": "2000"}`: a budget a month.
#[derive(Deserialize, ToSchema)]
pub struct NewBudget {
    /// `tenant` (by slug; platform admins) or `project` (`tenant-slug/name`, or the name in
    /// the caller's tenant).
    #[schema(example = "project")]
    level: String,
    #[schema(example = "acme/vision")]
    who: String,
    /// Dollars a month, as a number or as text (`2,000`, `$150.50`).
    #[schema(schema_with = schema::decimal_or_text)]
    amount: Value,
    /// Warn at 50, 80 and 100% but refuse no booking.
    #[serde(default)]
    warn_only: bool,
}

/// Sets a tenant's (platform admins) or a project's monthly budget, replacing the one it
/// had; answers the budgets in reach, this one among them.
#[utoipa::path(put, path = "/api/v1/budgets", tag = "usage", request_body = NewBudget,
    responses((status = 200, body = BudgetList)))]
pub(super) async fn set_budget(
    TokenCaller(platform, caller): TokenCaller,
    Body(asked): Body<NewBudget>,
) -> Result<Json<BudgetList>, ApiError> {
    let change =
        BudgetChange { level: asked.level, who: asked.who, amount: typed(&asked.amount), warn_only: asked.warn_only };
    platform.set_budget(&caller, &change).await.map_err(fail(&caller))?;
    Ok(Json(budget_list(&platform, &caller).await.map_err(fail(&caller))?))
}

#[derive(Serialize, ToSchema)]
pub struct BudgetRemoved {
    /// The budget's id.
    removed: i64,
}

/// Removes a budget: its tenant or project is no longer limited by cost.
#[utoipa::path(delete, path = "/api/v1/budgets/{id}", tag = "usage",
    params(("id" = i64, Path, description = "The budget's id")),
    responses((status = 200, body = BudgetRemoved)))]
pub(super) async fn remove_budget(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<i64>,
) -> Result<Json<BudgetRemoved>, ApiError> {
    platform.remove_budget(&caller, id).await.map_err(fail(&caller))?;
    Ok(Json(BudgetRemoved { removed: id }))
}

/// A storage limit and what its volumes use.
#[derive(Serialize, ToSchema)]
pub struct StorageQuotaBody {
    id: i64,
    /// "Tenant Acme", "Project acme/vision".
    who: String,
    /// GiB of volumes at most; `null`: no limit.
    max_gib: Option<i64>,
    /// GiB its live volumes take (their sizes).
    used_gib: i64,
    /// Tenants only: the size of their people's home volumes; `null`: the default.
    home_gib: Option<i64>,
}

#[derive(Serialize, ToSchema)]
pub struct StorageQuotaList {
    /// Tenants first, then projects.
    storage_quotas: Vec<StorageQuotaBody>,
}

async fn storage_quota_list(platform: &Platform, caller: &Caller) -> Result<StorageQuotaList, ApiError> {
    let rows = platform.storage_quotas(caller).await.map_err(fail(caller))?;
    let storage_quotas = rows
        .into_iter()
        .map(|r| StorageQuotaBody {
            id: r.id,
            who: r.who,
            max_gib: r.max_gib,
            used_gib: r.used_gib,
            home_gib: r.home_gib,
        })
        .collect();
    Ok(StorageQuotaList { storage_quotas })
}

/// The storage limits in the caller's reach (as for GPU quotas), with what is in use.
#[utoipa::path(get, path = "/api/v1/storage-quotas", tag = "quotas",
    responses((status = 200, body = StorageQuotaList)))]
pub(super) async fn storage_quotas(
    TokenCaller(platform, caller): TokenCaller,
) -> Result<Json<StorageQuotaList>, ApiError> {
    Ok(Json(storage_quota_list(&platform, &caller).await?))
}

/// `{"level": "tenant", "who": "acme", "max_gib": 2048, "home_gib": 20}`: numbers as numbers
/// or text; `max_gib` left out, `null` or empty is no limit.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewStorageQuota {
    /// `tenant` (by slug; platform admins) or `project` (`tenant-slug/name`, or the name in
    /// the caller's tenant).
    #[schema(example = "tenant")]
    level: String,
    who: String,
    /// Whole GiB, 0 or more.
    #[serde(default)]
    #[schema(schema_with = schema::optional_number_or_text)]
    max_gib: Value,
    /// Tenants only: their people's home volumes, in whole GiB; empty: the default.
    #[serde(default)]
    #[schema(schema_with = schema::optional_number_or_text)]
    home_gib: Value,
}

/// Sets a tenant's or a project's storage limit (a tenant's is the platform's to set);
/// answered with the limits in the caller's reach.
#[utoipa::path(put, path = "/api/v1/storage-quotas", tag = "quotas", request_body = NewStorageQuota,
    responses((status = 200, body = StorageQuotaList)))]
pub(super) async fn set_storage_quota(
    TokenCaller(platform, caller): TokenCaller,
    Body(asked): Body<NewStorageQuota>,
) -> Result<Json<StorageQuotaList>, ApiError> {
    platform
        .set_storage_quota(&caller, &asked.level, &asked.who, &typed(&asked.max_gib), &typed(&asked.home_gib))
        .await
        .map_err(fail(&caller))?;
    Ok(Json(storage_quota_list(&platform, &caller).await?))
}
