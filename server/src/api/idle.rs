//! Idle reclamation: the policies (the platform's, and tenants' stricter ones), an
//! environment's standing with the idle watcher, "keep it", and its GPUs' use.

use axum::Json;
use axum::extract::Path;
use berth_domain::catalog::Offering;
use berth_domain::idle::{IdlePolicy, duration_text};
use berth_platform::provisioning::idle::{IdleStatus, SetIdlePolicy};
use berth_platform::provisioning::telemetry::GpuUsePoint;
use berth_platform::{Caller, Error, Platform};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::{ApiError, Body, TokenCaller, fail, rfc3339, schema, typed};

/// One idle policy: when a GPU counts as idle, how long before its owner is warned, and
/// how long after that it is stopped.
#[derive(Serialize, ToSchema)]
pub struct IdlePolicyBody {
    /// The tenant's id; `null` for the platform's policy.
    tenant: Option<i64>,
    /// The tenant's slug; `null` for the platform's policy.
    tenant_slug: Option<String>,
    #[schema(schema_with = schema::offering)]
    offering: &'static str,
    /// A GPU is idle while its utilization stays under this (percent).
    below_pct: f64,
    /// How long every GPU must stay idle before the owner is warned: `1h`, `15m`, `90s`.
    idle_for: String,
    idle_for_s: i64,
    /// How long after the warning it is stopped unless kept: `15m`, `0s`.
    grace: String,
    grace_s: i64,
    /// How often an owner may keep one booking; `null` is no limit.
    max_keeps: Option<i64>,
    /// The policy in words.
    description: String,
    #[schema(format = DateTime)]
    updated_at: String,
}

fn policy_body(set: SetIdlePolicy) -> IdlePolicyBody {
    let p = set.policy;
    let (tenant, tenant_slug) = set.tenant.unzip();
    IdlePolicyBody {
        tenant,
        tenant_slug,
        offering: set.offering.id(),
        below_pct: p.below_pct,
        idle_for: duration_text(p.idle_for_s),
        idle_for_s: p.idle_for_s,
        grace: duration_text(p.grace_s),
        grace_s: p.grace_s,
        max_keeps: p.max_keeps,
        description: p.describe(),
        updated_at: rfc3339(set.updated_at),
    }
}

#[derive(Serialize, ToSchema)]
pub struct TenantRef {
    id: i64,
    slug: String,
}

#[derive(Serialize, ToSchema)]
pub struct IdlePolicyList {
    /// The platform's policies, then the tenants' in reach.
    policies: Vec<IdlePolicyBody>,
    /// Whether the caller sets the platform's policies.
    manages_platform: bool,
    /// The tenants whose policies the caller sets.
    manages_tenants: Vec<TenantRef>,
}

/// The idle policies the caller may read: the platform's, and the tenants' in reach. The
/// strictest of the platform's and the tenant's applies to an environment.
#[utoipa::path(get, path = "/api/v1/idle-policies", tag = "idle",
    responses((status = 200, body = IdlePolicyList)))]
pub(super) async fn idle_policies(
    TokenCaller(platform, caller): TokenCaller,
) -> Result<Json<IdlePolicyList>, ApiError> {
    let all = platform.idle_policies(&caller).await.map_err(fail(&caller))?;
    Ok(Json(IdlePolicyList {
        policies: all.policies.into_iter().map(policy_body).collect(),
        manages_platform: all.manages_platform,
        manages_tenants: all.manages_tenants.into_iter().map(|(id, slug)| TenantRef { id, slug }).collect(),
    }))
}

/// `{"below_pct": 5, "idle_for": "1h", "grace": "15m", "max_keeps": 2}`: numbers as numbers
/// or text, durations as `90s`, `15m`, `1h` or `1h30m` (a bare number is minutes).
#[derive(Deserialize, ToSchema)]
pub struct NewIdlePolicy {
    /// Percent, above 0 and at most 100.
    #[schema(schema_with = schema::decimal_or_text)]
    below_pct: Value,
    /// From 10s to 24h.
    #[schema(example = "1h")]
    idle_for: String,
    /// From 0 to 7 days.
    #[schema(example = "15m")]
    grace: String,
    /// How often an owner may keep one booking; absent, `null` or empty for no limit.
    #[serde(default)]
    #[schema(schema_with = schema::optional_number_or_text)]
    max_keeps: Value,
}

/// The offering a policy or a default is for.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // The parameter's description; read as a `String`.
pub struct OfferingPath {
    /// The offering's id.
    #[param(schema_with = schema::offering)]
    offering: String,
}

/// An offering named in a path: one that does not exist is not found.
pub(super) fn offering_named(caller: &Caller, id: &str) -> Result<Offering, ApiError> {
    Offering::parse(id).ok_or_else(|| fail(caller)(Error::NotFound))
}

/// Sets the policy, then answers it as stored.
async fn set_policy(
    platform: &Platform,
    caller: &Caller,
    tenant: Option<i64>,
    offering: &str,
    asked: NewIdlePolicy,
) -> Result<Json<IdlePolicyBody>, ApiError> {
    let offering = offering_named(caller, offering)?;
    let policy = IdlePolicy::parse(&typed(&asked.below_pct), &asked.idle_for, &asked.grace, &typed(&asked.max_keeps))
        .map_err(|r| fail(caller)(r.into()))?;
    platform.set_idle_policy(caller, tenant, offering, Some(policy)).await.map_err(fail(caller))?;
    let stored = platform
        .idle_policies(caller)
        .await
        .map_err(fail(caller))?
        .policies
        .into_iter()
        .find(|p| p.offering == offering && p.tenant.as_ref().map(|(id, _)| *id) == tenant)
        .ok_or_else(|| fail(caller)(Error::internal("the idle policy just set was not found")))?;
    Ok(Json(policy_body(stored)))
}

#[derive(Serialize, ToSchema)]
pub struct IdlePolicyRemoved {
    /// The tenant's id; `null` for the platform's policy.
    tenant: Option<i64>,
    #[schema(schema_with = schema::offering)]
    offering: &'static str,
}

async fn remove_policy(
    platform: &Platform,
    caller: &Caller,
    tenant: Option<i64>,
    offering: &str,
) -> Result<Json<IdlePolicyRemoved>, ApiError> {
    let offering = offering_named(caller, offering)?;
    platform.set_idle_policy(caller, tenant, offering, None).await.map_err(fail(caller))?;
    Ok(Json(IdlePolicyRemoved { tenant, offering: offering.id() }))
}

/// Sets the platform's idle policy for an offering (platform admins), replacing it.
#[utoipa::path(put, path = "/api/v1/idle-policies/{offering}", tag = "idle",
    params(OfferingPath),
    request_body = NewIdlePolicy,
    responses((status = 200, body = IdlePolicyBody)))]
pub(super) async fn set_platform_idle_policy(
    TokenCaller(platform, caller): TokenCaller,
    Path(offering): Path<String>,
    Body(asked): Body<NewIdlePolicy>,
) -> Result<Json<IdlePolicyBody>, ApiError> {
    set_policy(&platform, &caller, None, &offering, asked).await
}

/// Removes the platform's idle policy for an offering: its environments are no longer
/// stopped for idleness, except under a tenant's own policy. Removing none changes nothing.
#[utoipa::path(delete, path = "/api/v1/idle-policies/{offering}", tag = "idle",
    params(OfferingPath),
    responses((status = 200, body = IdlePolicyRemoved)))]
pub(super) async fn remove_platform_idle_policy(
    TokenCaller(platform, caller): TokenCaller,
    Path(offering): Path<String>,
) -> Result<Json<IdlePolicyRemoved>, ApiError> {
    remove_policy(&platform, &caller, None, &offering).await
}

/// Sets a tenant's own idle policy for an offering (its tenant admins, platform admins): it
/// may only be stricter than the platform's.
#[utoipa::path(put, path = "/api/v1/tenants/{id}/idle-policies/{offering}", tag = "idle",
    params(("id" = i64, Path, description = "The tenant's id"), OfferingPath),
    request_body = NewIdlePolicy,
    responses((status = 200, body = IdlePolicyBody)))]
pub(super) async fn set_tenant_idle_policy(
    TokenCaller(platform, caller): TokenCaller,
    Path((id, offering)): Path<(i64, String)>,
    Body(asked): Body<NewIdlePolicy>,
) -> Result<Json<IdlePolicyBody>, ApiError> {
    set_policy(&platform, &caller, Some(id), &offering, asked).await
}

/// Removes a tenant's own idle policy for an offering; the platform's still applies.
#[utoipa::path(delete, path = "/api/v1/tenants/{id}/idle-policies/{offering}", tag = "idle",
    params(("id" = i64, Path, description = "The tenant's id"), OfferingPath),
    responses((status = 200, body = IdlePolicyRemoved)))]
pub(super) async fn remove_tenant_idle_policy(
    TokenCaller(platform, caller): TokenCaller,
    Path((id, offering)): Path<(i64, String)>,
) -> Result<Json<IdlePolicyRemoved>, ApiError> {
    remove_policy(&platform, &caller, Some(id), &offering).await
}

/// Where an environment stands with the idle watcher.
#[derive(Serialize, ToSchema)]
pub struct IdleStatusBody {
    /// The policy that applies, in words; `null` when none does.
    policy: Option<String>,
    /// Since when its GPUs are idle, once its owner was warned; `null` without a warning.
    #[schema(format = DateTime)]
    idle_since: Option<String>,
    /// When the watcher stops it (an endpoint: scales it down to one replica) unless it is
    /// kept; `null` without a warning.
    #[schema(format = DateTime)]
    stops_at: Option<String>,
    /// What idleness would do: `stopped`, `scaled down to 1 replica`; `null` for an
    /// endpoint at one replica, which idleness leaves alone.
    outcome: Option<&'static str>,
    keeps_used: i64,
    /// Keeps left in this booking; `null` is no limit.
    keeps_left: Option<i64>,
    /// When the watcher stopped it for idleness.
    #[schema(format = DateTime)]
    stopped_at: Option<String>,
    /// Whether the caller may keep it now: a policy applies, keeps are left, it is ready and
    /// the caller may change it.
    may_keep: bool,
}

fn idle_body(status: IdleStatus) -> IdleStatusBody {
    let (idle_since, stops_at) = status.warning.unzip();
    IdleStatusBody {
        policy: status.policy,
        idle_since: idle_since.map(rfc3339),
        stops_at: stops_at.map(rfc3339),
        outcome: status.outcome,
        keeps_used: status.keeps_used,
        keeps_left: status.keeps_left,
        stopped_at: status.stopped_at.map(rfc3339),
        may_keep: status.may_keep,
    }
}

/// The environment's standing with the idle watcher: the policy that applies, a standing
/// warning, keeps used and left, whether the caller may keep it now.
#[utoipa::path(get, path = "/api/v1/environments/{id}/idle", tag = "idle",
    params(("id" = String, Path, description = "The environment's id")),
    responses((status = 200, body = IdleStatusBody)))]
pub(super) async fn idle_status(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<String>,
) -> Result<Json<IdleStatusBody>, ApiError> {
    let status = platform.idle_status(&caller, &id).await.map_err(fail(&caller))?;
    Ok(Json(idle_body(status)))
}

/// "Keep it": says a ready environment is in use. Its idle clock starts again and a
/// standing warning is withdrawn; the policy may limit how often (422 past it).
#[utoipa::path(post, path = "/api/v1/environments/{id}/keep", tag = "idle",
    params(("id" = String, Path, description = "The environment's id")),
    responses((status = 200, body = IdleStatusBody)))]
pub(super) async fn keep_environment(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<String>,
) -> Result<Json<IdleStatusBody>, ApiError> {
    let status = platform.keep_environment(&caller, &id).await.map_err(fail(&caller))?;
    Ok(Json(idle_body(status)))
}

/// One bucket of an environment's GPUs: averages over its GPUs or slices, except memory
/// and power, which are their sums.
#[derive(Serialize, ToSchema)]
pub struct GpuUsePointBody {
    /// The bucket's start.
    #[schema(format = DateTime)]
    at: String,
    utilization_pct: f64,
    memory_used_mib: f64,
    memory_total_mib: f64,
    /// `null` where no reading had power (MIG slices).
    power_w: Option<f64>,
    temperature_c: Option<f64>,
}

#[derive(Serialize, ToSchema)]
pub struct GpuUseBody {
    /// The last hour, one-minute buckets, oldest first.
    hour: Vec<GpuUsePointBody>,
    /// The last day, five-minute buckets, oldest first.
    day: Vec<GpuUsePointBody>,
    /// XID errors raised on its GPUs while it held them, newest first (the last 50).
    xid_errors: Vec<super::nodes::XidErrorBody>,
}

fn point_body(p: GpuUsePoint) -> GpuUsePointBody {
    GpuUsePointBody {
        at: rfc3339(p.at),
        utilization_pct: p.utilization_pct,
        memory_used_mib: p.memory_used_mib,
        memory_total_mib: p.memory_total_mib,
        power_w: p.power_w,
        temperature_c: p.temperature_c,
    }
}

/// What the environment's GPUs did: utilization, memory and power over the last hour and
/// the last day (the environment page's charts).
#[utoipa::path(get, path = "/api/v1/environments/{id}/gpu-use", tag = "idle",
    params(("id" = String, Path, description = "The environment's id")),
    responses((status = 200, body = GpuUseBody)))]
pub(super) async fn gpu_use(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<String>,
) -> Result<Json<GpuUseBody>, ApiError> {
    let used = platform.environment_gpu_use(&caller, &id).await.map_err(fail(&caller))?;
    Ok(Json(GpuUseBody {
        hour: used.hour.into_iter().map(point_body).collect(),
        day: used.day.into_iter().map(point_body).collect(),
        xid_errors: used.xid_errors.iter().map(super::nodes::xid_error_body).collect(),
    }))
}
