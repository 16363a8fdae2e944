//! The JSON API under `/api/v1`, for scripts and CI: `Authorization: Bearer berth_…` with a
//! personal API token. Each route is one platform call; the platform authorizes it.
//! `/api/v1/agent/...` is the exception: `berth agent` calls it with a node token.
//!
//! Errors are RFC 9457 problems (`application/problem+json`: `type`, `title`, `status`,
//! `detail`, `request_id`; `problem.rs`) with the status saying whose fault it is, every
//! one of them (`problems_only` catches those no handler wrote); internal causes are logged
//! with the request id and never sent.

use axum::Json;
use axum::extract::{FromRequestParts, Path, Query, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use berth_domain::Refusal;
use berth_domain::agent::NodeReport;
use berth_domain::catalog::Offering;
use berth_domain::launch::LaunchRequest;
use berth_domain::node_plan::PlanReport;
use berth_platform::audit::AuditFilter;
use berth_platform::capacity::environments::{Environment, EnvironmentFilter};
use berth_platform::capacity::volumes::{Volume, VolumeRequest};
use berth_platform::{Caller, Error, Platform, RequestMeta};
use http::request::Parts;
use http::{HeaderMap, StatusCode, header};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::problem::{PROBLEM_JSON, Problem, ProblemKind, request_id_of};
use crate::served::{Routes, get, post};
use crate::state::{AppState, request_meta};

pub fn routes() -> Routes<AppState> {
    Routes::new()
        .route("/api/v1/me", get(me))
        .route("/api/v1/environments", get(environments).post(launch))
        .route("/api/v1/environments/{id}", get(environment))
        .route("/api/v1/environments/{id}/stop", post(stop))
        .route("/api/v1/environments/{id}/end", post(change_end))
        .route("/api/v1/tenants", get(tenants))
        .route("/api/v1/tenants/{id}/members", get(members))
        .route("/api/v1/notifications", get(notifications))
        .route("/api/v1/notifications/read", post(mark_notifications_read))
        .route("/api/v1/tokens", get(tokens))
        .route("/api/v1/tokens/{id}/revoke", post(revoke_token))
        .route("/api/v1/volumes", get(volumes).post(create_volume))
        .route("/api/v1/volumes/{id}", get(volume).patch(resize_volume).delete(delete_volume))
        .route("/api/v1/audit", get(audit))
        .route("/api/v1/usage", get(usage))
        .route("/api/v1/nodes/{id}/health", get(node_health))
        .route("/api/v1/nodes/{id}/checks", post(run_node_checks))
        .route("/api/v1/nodes/{id}/state", post(change_node_state))
        .route("/api/v1/agent/report", post(agent_report))
        .route("/api/v1/agent/plan", get(agent_plan).post(agent_plan_report))
}

/// A failed API call, answered as a problem (RFC 9457, `problem.rs`).
pub struct ApiError {
    error: Error,
    request_id: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let request_id = self.request_id.as_str();
        let problem = match &self.error {
            Error::Refused(refusal) => Problem::of(ProblemKind::Refused, refusal.to_string(), request_id),
            Error::NotFound => Problem::status(StatusCode::NOT_FOUND, "not found", request_id),
            Error::Forbidden => Problem::status(StatusCode::FORBIDDEN, self.error.to_string(), request_id),
            Error::Unauthenticated | Error::BadCredentials => {
                return unauthenticated("a valid API token is needed: Authorization: Bearer berth_…", request_id);
            }
            Error::Internal(cause) => {
                tracing::error!(request_id, error = %cause, "API call failed");
                Problem::status(StatusCode::INTERNAL_SERVER_ERROR, INTERNAL, request_id)
            }
        };
        problem.into_response()
    }
}

/// What an internal error says: its cause is logged with the request id, never sent.
const INTERNAL: &str = "something went wrong on our side; quote the request id if you report it";

/// A 401 that says which token is wanted.
fn unauthenticated(detail: &str, request_id: &str) -> Response {
    let mut response = Problem::status(StatusCode::UNAUTHORIZED, detail, request_id).into_response();
    response.headers_mut().insert(header::WWW_AUTHENTICATE, http::HeaderValue::from_static("Bearer"));
    response
}

/// Every error answer under `/api/v1` as a problem, whoever made it: a handler's
/// [`ApiError`] already is one; axum's extractors answer a body, path or query they cannot
/// read in plain text (kept as the detail: it names the field, never an internal cause),
/// and a path or method the API does not have gets the portal's page or an empty 405.
pub async fn problems_only(request: Request, next: Next) -> Response {
    let api = {
        let path = request.uri().path();
        path == "/api/v1" || path.starts_with("/api/v1/")
    };
    let request_id = request_id_of(request.headers()).to_owned();
    let response = next.run(request).await;
    let status = response.status();
    let is_problem =
        response.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes() == PROBLEM_JSON.as_bytes());
    if !api || !(status.is_client_error() || status.is_server_error()) || is_problem {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let plain = parts.headers.get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/plain"));
    let problem = if status.is_server_error() {
        tracing::error!(request_id, %status, "an API call failed outside its handler");
        Problem::status(status, INTERNAL, &request_id)
    } else if status == StatusCode::NOT_FOUND {
        Problem::status(status, "the API has no such route", &request_id)
    } else if status == StatusCode::METHOD_NOT_ALLOWED {
        Problem::status(status, "this route does not take that method", &request_id)
    } else if plain {
        let text = axum::body::to_bytes(body, 4096).await.unwrap_or_default();
        let detail: String = String::from_utf8_lossy(&text).chars().take(500).collect();
        Problem { status, ..Problem::of(ProblemKind::InvalidRequest, detail, &request_id) }
    } else {
        Problem::status(status, status.canonical_reason().unwrap_or("error"), &request_id)
    };
    parts.headers.remove(header::CONTENT_TYPE);
    parts.headers.remove(header::CONTENT_LENGTH);
    let mut answer = problem.into_response();
    for (name, value) in parts.headers.iter() {
        answer.headers_mut().entry(name).or_insert(value.clone());
    }
    answer
}

/// The secret of a node token (`berth agent`), not a person's: the platform checks it.
pub struct NodeSecret(String, RequestMeta);

impl FromRequestParts<AppState> for NodeSecret {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _: &AppState) -> Result<NodeSecret, Response> {
        let meta = request_meta(parts);
        let secret = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::to_owned);
        match secret {
            Some(secret) => Ok(NodeSecret(secret, meta)),
            None => Err(node_unauthenticated(&meta.request_id)),
        }
    }
}

/// A 401 that tells an agent's operator which token is wanted.
fn node_unauthenticated(request_id: &str) -> Response {
    unauthenticated(
        "a valid node token is needed: Authorization: Bearer berth_node_… (made on the fleet page)",
        request_id,
    )
}

/// The caller behind the request's bearer token.
pub struct TokenCaller(pub Platform, pub Caller);

impl FromRequestParts<AppState> for TokenCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<TokenCaller, ApiError> {
        let meta = request_meta(parts);
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::to_owned);
        let Some(token) = token else {
            return Err(ApiError { error: Error::Unauthenticated, request_id: meta.request_id });
        };
        let request_id = meta.request_id.clone();
        let caller =
            state.platform.caller_from_token(&token, meta).await.map_err(|error| ApiError { error, request_id })?;
        Ok(TokenCaller(state.platform.clone(), caller))
    }
}

type ApiResult = Result<Json<Value>, ApiError>;

fn fail(caller: &Caller) -> impl Fn(Error) -> ApiError + '_ {
    move |error| ApiError { error, request_id: caller.meta.request_id.clone() }
}

/// An environment as the API shows it. Notebooks and endpoints are reached on their own
/// origins; a dedicated cluster's kubeconfig only by those who may act in it.
fn environment_json(platform: &Platform, caller: &Caller, env: &Environment) -> Value {
    let origin = platform.environment_origin(&env.id);
    let url = match env.offering {
        Offering::Notebook => Some(format!("{origin}/lab")),
        Offering::InferenceEndpoint => Some(format!("{origin}/v1")),
        Offering::TrainingJob | Offering::DedicatedCluster => None,
    };
    let connection = env
        .connection
        .as_ref()
        .filter(|_| env.offering == Offering::DedicatedCluster && platform.may_connect(caller, env));
    json!({
        "id": env.id,
        "name": env.name,
        "offering": env.offering.id(),
        "size": env.size.id,
        "state": env.state.as_str(),
        "tier": env.tier.as_str(),
        "starts_at": rfc3339(env.starts_at),
        "ends_at": rfc3339(env.ends_at),
        "created_at": rfc3339(env.created_at),
        "failure_reason": env.failure_reason,
        "url": url,
        "connection": connection,
    })
}

/// UTC, RFC 3339 with milliseconds.
fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_default()
}

async fn me(TokenCaller(_, caller): TokenCaller) -> ApiResult {
    let actions: Vec<&str> = caller.principal.token_actions.iter().flatten().map(|a| a.as_str()).collect();
    Ok(Json(json!({
        "user_id": caller.user_id(),
        "tenant_id": caller.tenant_id(),
        "role": caller.principal.role.as_str(),
        "token_actions": actions,
    })))
}

/// Which environments a listing shows: by owner, project and tenant (their ids) and state
/// (`active`, `finished` or `any`).
#[derive(Debug, Default, Deserialize)]
pub struct EnvironmentQuery {
    #[serde(default)]
    pub owner: String,
    #[serde(default)]
    pub project: String,
    #[serde(default)]
    pub tenant: String,
    #[serde(default)]
    pub state: String,
}

async fn environments(TokenCaller(platform, caller): TokenCaller, Query(query): Query<EnvironmentQuery>) -> ApiResult {
    let filter =
        EnvironmentFilter::parse(&query.owner, &query.project, &query.tenant, &query.state).map_err(fail(&caller))?;
    let listing = platform.environments_in_reach(&caller, &filter).await.map_err(fail(&caller))?;
    let environments: Vec<Value> = listing
        .environments
        .iter()
        .map(|listed| {
            let mut json = environment_json(&platform, &caller, &listed.environment);
            json["owner"] = json!({ "id": listed.environment.owner_id, "name": listed.owner });
            json["project"] = json!(listed.project);
            json["tenant"] = json!(listed.tenant);
            json
        })
        .collect();
    Ok(Json(json!({ "environments": environments })))
}

/// A launch. With an `Idempotency-Key` header, a retry of the same request gets the same
/// answer (201 and the environment the first one booked, as it is now) and books nothing.
async fn launch(
    TokenCaller(platform, caller): TokenCaller,
    headers: HeaderMap,
    Json(request): Json<LaunchRequest>,
) -> Result<Response, ApiError> {
    let env = match headers.get(IDEMPOTENCY_KEY) {
        None => platform.launch(&caller, &request).await.map_err(fail(&caller))?,
        Some(key) => {
            let key = key.to_str().map_err(|_| Error::from(Refusal::InvalidIdempotencyKey("must be visible ASCII")));
            let key = key.map_err(fail(&caller))?;
            platform.launch_once(&caller, &request, key).await.map_err(fail(&caller))?.environment
        }
    };
    Ok((StatusCode::CREATED, Json(environment_json(&platform, &caller, &env))).into_response())
}

/// The header a client repeats on a retry (the IETF draft "The Idempotency-Key HTTP Header
/// Field").
const IDEMPOTENCY_KEY: &str = "idempotency-key";

async fn environment(TokenCaller(platform, caller): TokenCaller, Path(id): Path<String>) -> ApiResult {
    let env = platform.environment_of(&caller, &id).await.map_err(fail(&caller))?;
    Ok(Json(environment_json(&platform, &caller, &env)))
}

async fn stop(TokenCaller(platform, caller): TokenCaller, Path(id): Path<String>) -> ApiResult {
    let env = platform.stop(&caller, &id).await.map_err(fail(&caller))?;
    Ok(Json(environment_json(&platform, &caller, &env)))
}

#[derive(Deserialize)]
struct NewEnd {
    ends_at: String,
}

async fn change_end(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<String>,
    Json(end): Json<NewEnd>,
) -> ApiResult {
    let env = platform.change_end(&caller, &id, &end.ends_at).await.map_err(fail(&caller))?;
    Ok(Json(environment_json(&platform, &caller, &env)))
}

async fn tenants(TokenCaller(platform, caller): TokenCaller) -> ApiResult {
    let tenants = platform.tenants(&caller).await.map_err(fail(&caller))?;
    let tenants: Vec<Value> = tenants
        .iter()
        .map(|t| {
            json!({ "id": t.id, "slug": t.slug, "name": t.name, "isolation": t.isolation.as_str(), "status": t.status,
                    "members": t.members, "active_environments": t.active_environments })
        })
        .collect();
    Ok(Json(json!({ "tenants": tenants })))
}

async fn members(TokenCaller(platform, caller): TokenCaller, Path(id): Path<i64>) -> ApiResult {
    let members = platform.members(&caller, id).await.map_err(fail(&caller))?;
    let members: Vec<Value> = members
        .iter()
        .map(|m| json!({ "user_id": m.user_id, "email": m.email, "name": m.display_name, "role": m.role.as_str(), "status": m.status }))
        .collect();
    Ok(Json(json!({ "members": members })))
}

/// The caller's latest notifications, newest first, and how many are unread.
async fn notifications(TokenCaller(platform, caller): TokenCaller) -> ApiResult {
    let inbox = platform.inbox(&caller).await.map_err(fail(&caller))?;
    let items: Vec<Value> = inbox
        .items
        .iter()
        .map(|n| {
            json!({ "id": n.id, "kind": n.kind, "title": n.title, "body": n.body,
                    "link": berth_domain::notification::absolute_link(platform.public_url(), &n.link),
                    "created_at": rfc3339(n.created_at), "read": n.read })
        })
        .collect();
    Ok(Json(json!({ "unread": inbox.unread, "notifications": items })))
}

/// Which notifications to mark read: `{"ids": [..]}`, or all of them (`{}` or no body).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarkRead {
    #[serde(default)]
    pub ids: Option<Vec<i64>>,
}

async fn mark_notifications_read(
    TokenCaller(platform, caller): TokenCaller,
    body: Option<Json<MarkRead>>,
) -> ApiResult {
    let ids = body.and_then(|Json(b)| b.ids);
    let marked = platform.mark_notifications_read(&caller, ids.as_deref()).await.map_err(fail(&caller))?;
    let unread = platform.unread_notifications(caller.user_id()).await.map_err(fail(&caller))?;
    Ok(Json(json!({ "marked": marked, "unread": unread })))
}

async fn tokens(TokenCaller(platform, caller): TokenCaller) -> ApiResult {
    let tokens = platform.my_tokens(&caller).await.map_err(fail(&caller))?;
    let tokens: Vec<Value> = tokens
        .iter()
        .map(|t| {
            json!({ "id": t.id, "name": t.name, "actions": t.actions.iter().map(|a| a.as_str()).collect::<Vec<_>>(),
                    "expires_at": rfc3339(t.expires_at), "revoked": t.revoked_at.is_some() })
        })
        .collect();
    Ok(Json(json!({ "tokens": tokens })))
}

async fn revoke_token(TokenCaller(platform, caller): TokenCaller, Path(id): Path<i64>) -> ApiResult {
    platform.revoke_token(&caller, id).await.map_err(fail(&caller))?;
    Ok(Json(json!({ "revoked": id })))
}

fn volume_json(v: &Volume) -> Value {
    let attached: Vec<Value> = v
        .attachments
        .iter()
        .map(|a| {
            json!({ "environment": a.environment_id, "environment_name": a.environment_name,
                         "mount_path": a.mount_path, "attached_at": rfc3339(a.attached_at) })
        })
        .collect();
    json!({
        "id": v.id, "name": v.name, "size_gib": v.size_gib, "home": v.is_home, "project": v.project_id,
        "owner": v.owner_email, "mount_path": v.mount_path, "location": v.location, "used_bytes": v.used_bytes,
        "created_at": rfc3339(v.created_at), "attached": attached,
    })
}

async fn volumes(TokenCaller(platform, caller): TokenCaller) -> ApiResult {
    let volumes = platform.volumes(&caller).await.map_err(fail(&caller))?;
    Ok(Json(json!({ "volumes": volumes.iter().map(volume_json).collect::<Vec<_>>() })))
}

/// `{"name": "datasets", "size_gib": 50, "project": 3}`: a size and project as numbers or
/// strings; no project for a personal volume.
#[derive(Deserialize)]
struct NewVolume {
    name: String,
    size_gib: Value,
    #[serde(default)]
    project: Value,
}

/// A JSON number or string as the form would type it.
fn typed(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

async fn create_volume(TokenCaller(platform, caller): TokenCaller, Json(asked): Json<NewVolume>) -> Response {
    let request = VolumeRequest { name: asked.name, size_gib: typed(&asked.size_gib), project: typed(&asked.project) };
    match platform.create_volume(&caller, &request).await {
        Ok(volume) => (StatusCode::CREATED, Json(volume_json(&volume))).into_response(),
        Err(e) => fail(&caller)(e).into_response(),
    }
}

async fn volume(TokenCaller(platform, caller): TokenCaller, Path(id): Path<i64>) -> ApiResult {
    let volume = platform.volume(&caller, id).await.map_err(fail(&caller))?;
    Ok(Json(volume_json(&volume)))
}

/// `{"size_gib": 100}`: a volume only grows.
#[derive(Deserialize)]
struct NewSize {
    size_gib: Value,
}

async fn resize_volume(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<i64>,
    Json(asked): Json<NewSize>,
) -> ApiResult {
    let volume = platform.resize_volume(&caller, id, &typed(&asked.size_gib)).await.map_err(fail(&caller))?;
    Ok(Json(volume_json(&volume)))
}

async fn delete_volume(TokenCaller(platform, caller): TokenCaller, Path(id): Path<i64>) -> ApiResult {
    platform.delete_volume(&caller, id).await.map_err(fail(&caller))?;
    Ok(Json(json!({ "deleted": id })))
}

async fn audit(TokenCaller(platform, caller): TokenCaller, Query(filter): Query<AuditFilter>) -> ApiResult {
    let rows = platform.audit_log(&caller, &filter, berth_platform::audit::AUDIT_PAGE).await.map_err(fail(&caller))?;
    let rows: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({ "id": r.id, "at": rfc3339(r.at), "actor": r.actor, "tenant": r.tenant, "action": r.action,
                    "target": r.target, "outcome": r.outcome, "source": r.source, "request_id": r.request_id, "detail": r.detail })
        })
        .collect();
    Ok(Json(json!({ "events": rows })))
}

/// Which month of usage, grouped how, and (platform staff) of which tenant.
#[derive(Debug, Default, Deserialize)]
pub struct UsageQuery {
    #[serde(default)]
    pub month: String,
    #[serde(default)]
    pub by: String,
    #[serde(default)]
    pub tenant: String,
}

/// A month of GPU-hours and cost in the caller's reach, with the budgets that apply.
async fn usage(TokenCaller(platform, caller): TokenCaller, Query(query): Query<UsageQuery>) -> ApiResult {
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

/// A usage report as the API and the page's JSON download give it: amounts in cents and as
/// dollars, GPU-hours as numbers.
pub fn usage_json(report: &berth_platform::capacity::metering::UsageReport) -> Value {
    let lines: Vec<Value> = report
        .lines
        .iter()
        .map(|l| {
            json!({ "key": l.key, "name": l.label, "gpu_hours": l.gpu_hours, "environments": l.environments,
                    "cents": l.cents, "amount": berth_domain::metering::format_money(l.cents) })
        })
        .collect();
    let budgets: Vec<Value> = report
        .budgets
        .iter()
        .map(|b| {
            json!({ "id": b.id, "of": b.of, "cents_per_month": b.cents_per_month, "warn_only": b.warn_only,
                    "spent_cents": b.spent_cents, "committed_cents": b.committed_cents, "reached_percent": b.reached })
        })
        .collect();
    json!({
        "month": report.month.key(),
        "charged_for": report.basis.as_str(),
        "by": report.by.as_str(),
        "counted_to": rfc3339(report.counted_to),
        "lines": lines,
        "total_cents": report.total_cents,
        "total": berth_domain::metering::format_money(report.total_cents),
        "total_gpu_hours": report.total_gpu_hours,
        "daily_cents": report.daily_cents,
        "budgets": budgets,
        "fleet": report.fleet.iter().map(|m| json!({ "model": m.model, "gpus": m.gpus,
            "allocated_gpu_hours": m.allocated_gpu_hours, "capacity_gpu_hours": m.capacity_gpu_hours })).collect::<Vec<_>>(),
    })
}

/// A node's lifecycle state, its changes (who, why, when) and its check runs.
async fn node_health(TokenCaller(platform, caller): TokenCaller, Path(name): Path<String>) -> ApiResult {
    let health = platform.node_health(&caller, &name).await.map_err(fail(&caller))?;
    let changes: Vec<Value> = health
        .changes
        .iter()
        .map(|c| {
            json!({ "from": c.from.as_str(), "to": c.to.as_str(), "repair_tier": c.tier, "event": c.event,
                    "reason": c.reason, "by": c.by, "at": rfc3339(c.at) })
        })
        .collect();
    let runs: Vec<Value> = health.runs.iter().map(check_run_json).collect();
    Ok(Json(json!({
        "node": health.node, "site": health.site, "model": health.model.name(), "gpus": health.gpus,
        "state": health.status.state.as_str(), "repair_tier": health.status.tier, "repair_tier_name": health.tier_name,
        "repair_tiers": health.tiers, "bookings_now": health.bookings_now,
        "takes_new_bookings": health.status.state.takes_new_bookings(),
        "changes": changes, "check_runs": runs,
    })))
}

fn check_run_json(run: &berth_platform::provisioning::node_health::CheckRun) -> Value {
    let results: Vec<Value> = run
        .results
        .iter()
        .map(|r| {
            json!({ "check": r.kind, "passed": r.passed, "measured": r.measured, "threshold": r.threshold,
                    "unit": r.unit, "summary": r.summary, "command": r.command, "raw_output": r.raw_output })
        })
        .collect();
    json!({ "id": run.id, "level": run.level, "purpose": run.purpose, "requested_by": run.requested_by,
            "started_at": rfc3339(run.started_at), "finished_at": run.finished_at.map(rfc3339),
            "passed": run.passed, "results": results })
}

#[derive(Deserialize)]
struct CheckRequest {
    level: String,
}

/// Runs checks on a node: acceptance on a node nobody holds, else a check on demand.
async fn run_node_checks(
    TokenCaller(platform, caller): TokenCaller,
    Path(name): Path<String>,
    Json(request): Json<CheckRequest>,
) -> ApiResult {
    let run = platform.run_node_checks(&caller, &name, &request.level).await.map_err(fail(&caller))?;
    Ok(Json(check_run_json(&run)))
}

#[derive(Deserialize)]
struct StateChange {
    event: String,
    reason: String,
}

/// A platform admin moves a node: drain, return_to_service, start_repair, repair_done,
/// repair_failed, retire, reinstate.
async fn change_node_state(
    TokenCaller(platform, caller): TokenCaller,
    Path(name): Path<String>,
    Json(change): Json<StateChange>,
) -> ApiResult {
    let health =
        platform.change_node_state(&caller, &name, &change.event, &change.reason).await.map_err(fail(&caller))?;
    Ok(Json(json!({ "node": health.node, "state": health.status.state.as_str(), "repair_tier": health.status.tier,
                    "repair_tier_name": health.tier_name })))
}

/// A node's agent reports its GPUs; the answer says which GPUs changed health.
async fn agent_report(
    State(state): State<AppState>,
    NodeSecret(secret, meta): NodeSecret,
    Json(report): Json<NodeReport>,
) -> Result<Json<Value>, Response> {
    let request_id = meta.request_id.clone();
    match state.platform.report_node(&secret, &report, meta).await {
        Ok(receipt) => Ok(Json(json!({
            "node": receipt.node,
            "gpus": report.gpus.len(),
            "changes": receipt.changes,
            "unexpected_gpus": receipt.unexpected,
        }))),
        Err(Error::Unauthenticated) => Err(node_unauthenticated(&request_id)),
        Err(error) => Err(ApiError { error, request_id }.into_response()),
    }
}

/// A bare-metal node's agent fetches what its node should hold (`--backend baremetal`).
async fn agent_plan(
    State(state): State<AppState>,
    NodeSecret(secret, meta): NodeSecret,
) -> Result<Json<Value>, Response> {
    let request_id = meta.request_id.clone();
    match state.platform.node_plan(&secret, meta).await {
        Ok(plan) => Ok(Json(
            serde_json::to_value(plan)
                .map_err(|e| ApiError { error: Error::internal(e), request_id: request_id.clone() }.into_response())?,
        )),
        Err(Error::Unauthenticated) => Err(node_unauthenticated(&request_id)),
        Err(error) => Err(ApiError { error, request_id }.into_response()),
    }
}

/// A bare-metal node's agent says which plan generation it applied, or why it could not.
async fn agent_plan_report(
    State(state): State<AppState>,
    NodeSecret(secret, meta): NodeSecret,
    Json(report): Json<PlanReport>,
) -> Result<Json<Value>, Response> {
    let request_id = meta.request_id.clone();
    let generation = report.generation;
    // Its own task: an agent that hangs up must not cut the write transaction short.
    let platform = state.platform.clone();
    let outcome = tokio::spawn(async move { platform.report_node_plan(&secret, &report, meta).await })
        .await
        .unwrap_or_else(|e| Err(Error::internal(e)));
    match outcome {
        Ok(()) => Ok(Json(json!({ "generation": generation }))),
        Err(Error::Unauthenticated) => Err(node_unauthenticated(&request_id)),
        Err(error) => Err(ApiError { error, request_id }.into_response()),
    }
}
