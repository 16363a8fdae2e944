//! The JSON API under `/api/v1`, for scripts and CI: `Authorization: Bearer berth_…` with a
//! personal API token. Each route is one platform call; the platform authorizes it.
//! `/api/v1/agent/...` is the exception: `berth agent` calls it with a node token.
//!
//! Errors are RFC 9457 problems (`application/problem+json`: `type`, `title`, `status`,
//! `detail`, `request_id`; `problem.rs`) with the status saying whose fault it is, every
//! one of them (`problems_only` catches those no handler wrote); internal causes are logged
//! with the request id and never sent.

use axum::Json;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use berth_platform::{Caller, Error, Platform, RequestMeta};
use http::request::Parts;
use http::{HeaderMap, StatusCode, header};
use serde_json::Value;

use crate::openapi::Described;
use crate::problem::{PROBLEM_JSON, Problem, ProblemKind, request_id_of};
use crate::served::put;
use crate::served::{Routes, delete, get, post};
use crate::state::{AppState, request_meta};

mod catalog;
mod environments;
mod fabric;
mod fleet;
mod idle;
mod images;
mod nodes;
mod notifications;
mod paging;
mod prices;
mod quotas;
mod schema;
mod sso;
mod statements;
mod tenancy;
mod usage;
mod volumes;

pub use usage::{UsageQuery, usage_json, usage_report};

pub fn routes() -> Routes<AppState> {
    Routes::new()
        .route("/api/v1/openapi.json", get(crate::openapi::document_json))
        .route("/api/v1/me", get(tenancy::me))
        .route("/api/v1/environments", get(environments::environments).post(environments::launch))
        .route("/api/v1/environments/{id}", get(environments::environment))
        .route("/api/v1/environments/{id}/stop", post(environments::stop))
        .route("/api/v1/environments/{id}/end", post(environments::change_end))
        .route("/api/v1/environments/{id}/logs", get(environments::logs))
        .route("/api/v1/environments/{id}/endpoint", get(environments::endpoint))
        .route("/api/v1/environments/{id}/node-replacements", get(environments::node_replacements))
        .route("/api/v1/environments/{id}/replicas", put(environments::set_replicas))
        .route("/api/v1/environments/{id}/api-key", post(environments::reveal_api_key))
        .route("/api/v1/environments/{id}/api-key/replace", post(environments::replace_api_key))
        .route("/api/v1/catalog", get(catalog::catalog))
        .route("/api/v1/availability", get(catalog::availability))
        .route("/api/v1/calendar", get(catalog::calendar))
        .route("/api/v1/capacity", get(catalog::capacity))
        .route("/api/v1/prices", get(prices::prices).post(prices::set_price))
        .route("/api/v1/prices/{id}", delete(prices::withdraw_price))
        .route("/api/v1/discounts", post(prices::set_discount))
        .route("/api/v1/discounts/{id}", delete(prices::withdraw_discount))
        .route("/api/v1/tenants", get(tenancy::tenants).post(tenancy::create_tenant))
        .route("/api/v1/tenants/{id}", delete(tenancy::delete_tenant).patch(tenancy::change_tenant))
        .route("/api/v1/tenants/{id}/members", get(tenancy::members))
        .route("/api/v1/tenants/{id}/members", post(tenancy::invite_member))
        .route("/api/v1/tenants/{id}/members/{user}", delete(tenancy::remove_member).patch(tenancy::change_member_role))
        .route("/api/v1/tenants/{id}/projects", get(tenancy::projects).post(tenancy::create_project))
        .route("/api/v1/tenants/{id}/projects/{project}/members", post(tenancy::add_project_member))
        .route("/api/v1/tenants/{id}/sso", get(sso::sso).put(sso::set_sso))
        .route("/api/v1/tenants/{id}/tokens", get(tenancy::tenant_tokens))
        .route("/api/v1/tenants/{id}/webhooks", get(notifications::webhooks).post(notifications::add_webhook))
        .route("/api/v1/tenants/{id}/webhooks/{webhook}", delete(notifications::remove_webhook))
        .route("/api/v1/tenants/{id}/port-guids", put(fabric::set_port_guids))
        .route("/api/v1/fabric", get(fabric::fabric))
        .route("/api/v1/quotas", get(quotas::quotas).put(quotas::set_quota))
        .route("/api/v1/quotas/{id}", delete(quotas::remove_quota))
        .route("/api/v1/storage-quotas", get(quotas::storage_quotas).put(quotas::set_storage_quota))
        .route("/api/v1/budgets", get(quotas::budgets).put(quotas::set_budget))
        .route("/api/v1/budgets/{id}", delete(quotas::remove_budget))
        .route("/api/v1/idle-policies", get(idle::idle_policies))
        .route(
            "/api/v1/idle-policies/{offering}",
            put(idle::set_platform_idle_policy).delete(idle::remove_platform_idle_policy),
        )
        .route(
            "/api/v1/tenants/{id}/idle-policies/{offering}",
            put(idle::set_tenant_idle_policy).delete(idle::remove_tenant_idle_policy),
        )
        .route("/api/v1/environments/{id}/idle", get(idle::idle_status))
        .route("/api/v1/environments/{id}/keep", post(idle::keep_environment))
        .route("/api/v1/environments/{id}/gpu-use", get(idle::gpu_use))
        .route("/api/v1/notifications", get(notifications::notifications))
        .route("/api/v1/notifications/read", post(notifications::mark_notifications_read))
        .route(
            "/api/v1/notification-settings",
            get(notifications::notification_settings).put(notifications::set_notification_settings),
        )
        .route("/api/v1/tokens", get(tenancy::tokens))
        .route("/api/v1/tokens/{id}/revoke", post(tenancy::revoke_token))
        .route("/api/v1/ssh-keys", get(tenancy::ssh_keys))
        .route("/api/v1/ssh-keys/{id}", delete(tenancy::remove_ssh_key))
        .route("/api/v1/volumes", get(volumes::volumes).post(volumes::create_volume))
        .route(
            "/api/v1/volumes/{id}",
            get(volumes::volume).patch(volumes::resize_volume).delete(volumes::delete_volume),
        )
        .route("/api/v1/images", get(images::images).post(images::add_image))
        .route("/api/v1/images/{id}", delete(images::remove_image))
        .route("/api/v1/images/{id}/defaults/{offering}", put(images::set_default_image))
        .route("/api/v1/tenants/{id}/custom-images", put(images::set_custom_images))
        .route("/api/v1/audit", get(usage::audit))
        .route("/api/v1/usage", get(usage::usage))
        .route("/api/v1/gpu-efficiency", get(usage::gpu_efficiency))
        .route("/api/v1/statements", get(statements::statements))
        .route("/api/v1/statements/{id}", get(statements::statement))
        .route("/api/v1/nodes", get(fleet::nodes))
        .route("/api/v1/node-agents", get(fleet::node_agents))
        .route("/api/v1/maintenance", post(fleet::schedule_maintenance))
        .route("/api/v1/maintenance/{id}", delete(fleet::cancel_maintenance))
        .route("/api/v1/nodes/{id}/health", get(nodes::node_health))
        .route("/api/v1/nodes/{id}/checks", post(nodes::run_node_checks))
        .route("/api/v1/nodes/{id}/state", post(nodes::change_node_state))
        .route("/api/v1/nodes/{id}/gpus/{gpu}/reset", post(nodes::reset_gpu))
        .route("/api/v1/nodes/{id}/gpus/{gpu}/health", put(fleet::mark_gpu_health))
        .route("/api/v1/nodes/{id}/tokens", post(nodes::create_node_token))
        .route("/api/v1/node-tokens/{id}", delete(nodes::revoke_node_token))
        .route("/api/v1/agent/report", post(nodes::agent_report))
        .route("/api/v1/agent/plan", get(nodes::agent_plan).post(nodes::agent_plan_report))
        .route("/api/v1/agent/checks", get(nodes::agent_checks))
        .route("/api/v1/agent/checks/{id}", post(nodes::agent_check_answer))
}

/// The API's description (OpenAPI 3.1, `openapi.rs` serves it): every route of [`routes`]
/// and nothing else, which `tests::openapi` checks.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "Berth API",
        description = "Book and manage GPU environments. Authenticate with a personal API token \
                       (`Authorization: Bearer berth_…`, made on the account page); errors are \
                       RFC 9457 problems (`application/problem+json`) with the request id."
    ),
    paths(
        crate::openapi::document_json,
        tenancy::me,
        environments::environments,
        environments::launch,
        environments::environment,
        environments::stop,
        environments::change_end,
        environments::logs,
        environments::endpoint,
        environments::node_replacements,
        environments::set_replicas,
        environments::reveal_api_key,
        environments::replace_api_key,
        catalog::catalog,
        catalog::availability,
        catalog::calendar,
        catalog::capacity,
        prices::prices,
        prices::set_price,
        prices::withdraw_price,
        prices::set_discount,
        prices::withdraw_discount,
        tenancy::tenants,
        tenancy::create_tenant,
        tenancy::change_tenant,
        tenancy::delete_tenant,
        tenancy::members,
        tenancy::invite_member,
        tenancy::change_member_role,
        tenancy::remove_member,
        tenancy::projects,
        tenancy::create_project,
        tenancy::add_project_member,
        sso::sso,
        sso::set_sso,
        tenancy::tenant_tokens,
        notifications::webhooks,
        notifications::add_webhook,
        notifications::remove_webhook,
        fabric::fabric,
        fabric::set_port_guids,
        quotas::quotas,
        quotas::set_quota,
        quotas::remove_quota,
        quotas::storage_quotas,
        quotas::set_storage_quota,
        quotas::budgets,
        quotas::set_budget,
        quotas::remove_budget,
        idle::idle_policies,
        idle::set_platform_idle_policy,
        idle::remove_platform_idle_policy,
        idle::set_tenant_idle_policy,
        idle::remove_tenant_idle_policy,
        idle::idle_status,
        idle::keep_environment,
        idle::gpu_use,
        notifications::notifications,
        notifications::mark_notifications_read,
        notifications::notification_settings,
        notifications::set_notification_settings,
        tenancy::tokens,
        tenancy::revoke_token,
        tenancy::ssh_keys,
        tenancy::remove_ssh_key,
        volumes::volumes,
        volumes::create_volume,
        volumes::volume,
        volumes::resize_volume,
        volumes::delete_volume,
        images::images,
        images::add_image,
        images::remove_image,
        images::set_default_image,
        images::set_custom_images,
        usage::audit,
        usage::usage,
        usage::gpu_efficiency,
        statements::statements,
        statements::statement,
        fleet::nodes,
        fleet::node_agents,
        fleet::schedule_maintenance,
        fleet::cancel_maintenance,
        nodes::node_health,
        nodes::run_node_checks,
        nodes::change_node_state,
        nodes::reset_gpu,
        fleet::mark_gpu_health,
        nodes::create_node_token,
        nodes::revoke_node_token,
        nodes::agent_report,
        nodes::agent_plan,
        nodes::agent_plan_report,
        nodes::agent_checks,
        nodes::agent_check_answer,
    ),
    components(schemas(crate::problem::Problem)),
    modifiers(&Described)
)]
pub struct ApiDoc;

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

/// A JSON body that is an object, read as `T`. axum's `Json` alone would read a struct from
/// an array too (serde's sequence form: `["x"]` as `{"ends_at": "x"}`), which the API's
/// description does not allow. Otherwise its answers are axum's (`problems_only` makes them
/// problems): 415 without a JSON content type, 400 for JSON that does not parse, 422 for
/// JSON that is not what the route reads, naming the field.
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = Unreadable;

    async fn from_request(request: Request, state: &S) -> Result<Body<T>, Unreadable> {
        let headers = request.headers().clone();
        let bytes = axum::body::Bytes::from_request(request, state)
            .await
            .map_err(|r| Unreadable { status: r.status(), text: r.body_text() })?;
        read_object(&headers, &bytes, false).map(Body)
    }
}

/// Why a body could not be read, as axum says it: plain text, made a problem by
/// `problems_only`.
pub struct Unreadable {
    status: StatusCode,
    text: String,
}

impl IntoResponse for Unreadable {
    fn into_response(self) -> Response {
        (self.status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], self.text).into_response()
    }
}

/// `bytes` as `T` when they are a JSON object (or, with `null_allowed`, `null`).
fn read_object<T: serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    bytes: &[u8],
    null_allowed: bool,
) -> Result<T, Unreadable> {
    let plain = |status: StatusCode, text: String| Unreadable { status, text };
    let media = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let media = media.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    let json = media == "application/json" || (media.starts_with("application/") && media.ends_with("+json"));
    if !json {
        return Err(plain(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Expected request with `Content-Type: application/json`".into(),
        ));
    }
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if !(first == Some(&b'{') || (null_allowed && first == Some(&b'n'))) {
        return Err(plain(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Failed to deserialize the JSON body into the target type: the body must be a JSON object".into(),
        ));
    }
    Json::<T>::from_bytes(bytes)
        .map(|Json(value)| value)
        .map_err(|r| Unreadable { status: r.status(), text: r.body_text() })
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

/// UTC, RFC 3339 with milliseconds.
fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_default()
}

/// A JSON number or string as the form would type it.
fn typed(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
