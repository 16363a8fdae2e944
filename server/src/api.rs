//! The JSON API under `/api/v1`, for scripts and CI: `Authorization: Bearer berth_…` with a
//! personal API token. Each route is one platform call; the platform authorizes it.
//! `/api/v1/agent/...` is the exception: `berth agent` calls it with a node token.
//!
//! Errors are RFC 9457 problems (`application/problem+json`: `type`, `title`, `status`,
//! `detail`, `request_id`; `problem.rs`) with the status saying whose fault it is, every
//! one of them (`problems_only` catches those no handler wrote); internal causes are logged
//! with the request id and never sent.

use axum::Json;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request, State};
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
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use crate::openapi::Described;
use crate::problem::{PROBLEM_JSON, Problem, ProblemKind, request_id_of};
use crate::served::{Routes, get, post};
use crate::state::{AppState, request_meta};

pub fn routes() -> Routes<AppState> {
    Routes::new()
        .route("/api/v1/openapi.json", get(crate::openapi::document_json))
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
        .route("/api/v1/images", get(images))
        .route("/api/v1/audit", get(audit))
        .route("/api/v1/usage", get(usage))
        .route("/api/v1/nodes/{id}/health", get(node_health))
        .route("/api/v1/nodes/{id}/checks", post(run_node_checks))
        .route("/api/v1/nodes/{id}/state", post(change_node_state))
        .route("/api/v1/agent/report", post(agent_report))
        .route("/api/v1/agent/plan", get(agent_plan).post(agent_plan_report))
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
        me,
        environments,
        launch,
        environment,
        stop,
        change_end,
        tenants,
        members,
        notifications,
        mark_notifications_read,
        tokens,
        revoke_token,
        volumes,
        create_volume,
        volume,
        resize_volume,
        delete_volume,
        images,
        audit,
        usage,
        node_health,
        run_node_checks,
        change_node_state,
        agent_report,
        agent_plan,
        agent_plan_report,
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

/// An environment as the API shows it. Notebooks and endpoints are reached on their own
/// origins; a dedicated cluster's kubeconfig only by those who may act in it.
#[derive(Serialize, ToSchema)]
pub struct EnvironmentBody {
    id: String,
    name: String,
    /// `notebook`, `training`, `inference` or `cluster`.
    #[schema(schema_with = schema::offering)]
    offering: &'static str,
    /// The size's id in the catalog, e.g. `h100-1g.10gb`.
    size: &'static str,
    #[schema(schema_with = schema::environment_state)]
    state: &'static str,
    #[schema(schema_with = schema::tier)]
    tier: &'static str,
    #[schema(format = DateTime)]
    starts_at: String,
    #[schema(format = DateTime)]
    ends_at: String,
    #[schema(format = DateTime)]
    created_at: String,
    failure_reason: Option<String>,
    /// A notebook's JupyterLab or an endpoint's OpenAI-compatible API, on the
    /// environment's own origin.
    url: Option<String>,
    /// A dedicated cluster's connection, for those who may act in it.
    connection: Option<ConnectionBody>,
}

/// How a dedicated cluster is reached.
#[derive(Serialize, ToSchema)]
pub struct ConnectionBody {
    url: String,
    /// e.g. "Token"; shown with `secret`.
    secret_label: Option<String>,
    secret: Option<String>,
    /// A command that uses the connection.
    example: String,
}

fn environment_body(platform: &Platform, caller: &Caller, env: &Environment) -> EnvironmentBody {
    let origin = platform.environment_origin(&env.id);
    let url = match env.offering {
        Offering::Notebook => Some(format!("{origin}/lab")),
        Offering::InferenceEndpoint => Some(format!("{origin}/v1")),
        Offering::TrainingJob | Offering::DedicatedCluster => None,
    };
    let connection = env
        .connection
        .as_ref()
        .filter(|_| env.offering == Offering::DedicatedCluster && platform.may_connect(caller, env))
        .map(|c| ConnectionBody {
            url: c.url.clone(),
            secret_label: c.secret_label.clone(),
            secret: c.secret.clone(),
            example: c.example.clone(),
        });
    EnvironmentBody {
        id: env.id.clone(),
        name: env.name.clone(),
        offering: env.offering.id(),
        size: env.size.id,
        state: env.state.as_str(),
        tier: env.tier.as_str(),
        starts_at: rfc3339(env.starts_at),
        ends_at: rfc3339(env.ends_at),
        created_at: rfc3339(env.created_at),
        failure_reason: env.failure_reason.clone(),
        url,
        connection,
    }
}

/// UTC, RFC 3339 with milliseconds.
fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_default()
}

/// Who the token speaks for, and what it may do.
#[derive(Serialize, ToSchema)]
pub struct Me {
    user_id: i64,
    /// `null` for platform staff.
    tenant_id: Option<i64>,
    #[schema(schema_with = schema::role)]
    role: &'static str,
    /// The actions the token is limited to; empty: all the person's role allows.
    #[schema(schema_with = schema::actions)]
    token_actions: Vec<&'static str>,
}

/// The person and role behind the bearer token.
#[utoipa::path(get, path = "/api/v1/me", tag = "account", responses((status = 200, body = Me)))]
async fn me(TokenCaller(_, caller): TokenCaller) -> Result<Json<Me>, ApiError> {
    Ok(Json(Me {
        user_id: caller.user_id(),
        tenant_id: caller.tenant_id(),
        role: caller.principal.role.as_str(),
        token_actions: caller.principal.token_actions.iter().flatten().map(|a| a.as_str()).collect(),
    }))
}

/// Which environments a listing shows: by owner, project and tenant (their ids) and state
/// (`active`, `finished` or `any`).
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EnvironmentQuery {
    /// The owner's user id.
    #[serde(default)]
    #[param(pattern = "^[0-9]*$")]
    pub owner: String,
    /// The project's id.
    #[serde(default)]
    #[param(pattern = "^[0-9]*$")]
    pub project: String,
    /// The tenant's id (platform staff).
    #[serde(default)]
    #[param(pattern = "^[0-9]*$")]
    pub tenant: String,
    /// `active`, `finished` or `any` (empty: any).
    #[serde(default)]
    #[param(schema_with = schema::state_filter)]
    pub state: String,
}

/// An environment in a listing, with whose it is.
#[derive(Serialize, ToSchema)]
pub struct ListedEnvironmentBody {
    #[serde(flatten)]
    environment: EnvironmentBody,
    owner: Owner,
    project: Option<String>,
    /// `null` for platform staff's own environments.
    tenant: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct Owner {
    id: i64,
    name: String,
}

#[derive(Serialize, ToSchema)]
pub struct EnvironmentList {
    environments: Vec<ListedEnvironmentBody>,
}

/// The environments in the caller's reach: their own, their tenant's for tenant admins and
/// viewers, every one for platform staff.
#[utoipa::path(get, path = "/api/v1/environments", tag = "environments", params(EnvironmentQuery),
    responses((status = 200, body = EnvironmentList)))]
async fn environments(
    TokenCaller(platform, caller): TokenCaller,
    Query(query): Query<EnvironmentQuery>,
) -> Result<Json<EnvironmentList>, ApiError> {
    let filter =
        EnvironmentFilter::parse(&query.owner, &query.project, &query.tenant, &query.state).map_err(fail(&caller))?;
    let listing = platform.environments_in_reach(&caller, &filter).await.map_err(fail(&caller))?;
    let environments = listing
        .environments
        .iter()
        .map(|listed| ListedEnvironmentBody {
            environment: environment_body(&platform, &caller, &listed.environment),
            owner: Owner { id: listed.environment.owner_id, name: listed.owner.clone() },
            project: listed.project.clone(),
            tenant: listed.tenant.clone(),
        })
        .collect();
    Ok(Json(EnvironmentList { environments }))
}

/// What a launch sends (`berth_domain::launch::LaunchRequest`, which reads it: a test keeps
/// the two field for field). Values as the launch form types them.
#[derive(ToSchema)]
#[allow(dead_code)] // The schema of what `LaunchRequest` reads; never built.
pub struct LaunchBody {
    /// `notebook`, `training`, `inference` or `cluster`.
    #[schema(schema_with = schema::offering)]
    offering: String,
    /// A size's id in the catalog, e.g. `h100-1g.10gb`.
    #[schema(schema_with = schema::size)]
    size: String,
    name: String,
    /// Whole hours, e.g. `"4"`.
    #[schema(pattern = "^[0-9]{1,4}$")]
    hours: String,
    /// Empty for now, else a UTC date and time (`2026-11-26 14:00`).
    #[schema(required = false, default = "")]
    start: String,
    /// "As soon as possible": the earliest start within this many days, instead of `start`.
    #[schema(required = false, default = "", pattern = "^[0-9]{0,3}$")]
    earliest_within_days: String,
    /// Other GPU models the booking may take, separated by commas, or `any`.
    #[schema(required = false, default = "")]
    models: String,
    /// Any model whose GPUs have at least this many GB.
    #[schema(required = false, default = "")]
    min_gpu_memory_gb: String,
    /// Empty or `guaranteed`, or `spot`.
    #[schema(schema_with = schema::tier_asked, required = false, default = "")]
    tier: String,
    /// The id of the project whose quota the booking counts against; empty for none.
    #[schema(required = false, default = "")]
    project: String,
    #[schema(required = false, default = "")]
    image: String,
    #[schema(required = false, default = "")]
    command: String,
    /// Ids of volumes to attach besides the home volume (notebooks and training jobs).
    #[schema(schema_with = schema::ids, required = false)]
    volumes: Vec<i64>,
}

/// Books an environment. With an `Idempotency-Key` header, a retry of the same request gets
/// the same answer (201 and the environment the first one booked, as it is now) and books
/// nothing; the same key with another request is refused (422).
#[utoipa::path(post, path = "/api/v1/environments", tag = "environments",
    params(("Idempotency-Key" = Option<String>, Header,
        description = "Makes a retry safe: the same person's key with the same request books once (kept 24 hours)")),
    request_body = LaunchBody,
    responses((status = 201, description = "Booked", body = EnvironmentBody)))]
async fn launch(
    TokenCaller(platform, caller): TokenCaller,
    headers: HeaderMap,
    Body(request): Body<LaunchRequest>,
) -> Result<Response, ApiError> {
    let env = match headers.get(IDEMPOTENCY_KEY) {
        None => platform.launch(&caller, &request).await.map_err(fail(&caller))?,
        Some(key) => {
            let key = key.to_str().map_err(|_| Error::from(Refusal::InvalidIdempotencyKey("must be visible ASCII")));
            let key = key.map_err(fail(&caller))?;
            platform.launch_once(&caller, &request, key).await.map_err(fail(&caller))?.environment
        }
    };
    Ok((StatusCode::CREATED, Json(environment_body(&platform, &caller, &env))).into_response())
}

/// The header a client repeats on a retry (the IETF draft "The Idempotency-Key HTTP Header
/// Field").
const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// One environment.
#[utoipa::path(get, path = "/api/v1/environments/{id}", tag = "environments",
    params(("id" = String, Path, description = "The environment's id")),
    responses((status = 200, body = EnvironmentBody)))]
async fn environment(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<String>,
) -> Result<Json<EnvironmentBody>, ApiError> {
    let env = platform.environment_of(&caller, &id).await.map_err(fail(&caller))?;
    Ok(Json(environment_body(&platform, &caller, &env)))
}

/// Stops an environment (or cancels a booking that has not started).
#[utoipa::path(post, path = "/api/v1/environments/{id}/stop", tag = "environments",
    params(("id" = String, Path, description = "The environment's id")),
    responses((status = 200, body = EnvironmentBody)))]
async fn stop(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<String>,
) -> Result<Json<EnvironmentBody>, ApiError> {
    let env = platform.stop(&caller, &id).await.map_err(fail(&caller))?;
    Ok(Json(environment_body(&platform, &caller, &env)))
}

/// A booking's new end.
#[derive(Deserialize, ToSchema)]
pub struct NewEnd {
    /// A UTC date and time, `2026-11-26 18:00`.
    ends_at: String,
}

/// Moves an environment's end: earlier, or later while the calendar has room.
#[utoipa::path(post, path = "/api/v1/environments/{id}/end", tag = "environments",
    params(("id" = String, Path, description = "The environment's id")),
    request_body = NewEnd,
    responses((status = 200, body = EnvironmentBody)))]
async fn change_end(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<String>,
    Body(end): Body<NewEnd>,
) -> Result<Json<EnvironmentBody>, ApiError> {
    let env = platform.change_end(&caller, &id, &end.ends_at).await.map_err(fail(&caller))?;
    Ok(Json(environment_body(&platform, &caller, &env)))
}

#[derive(Serialize, ToSchema)]
pub struct TenantBody {
    id: i64,
    slug: String,
    name: String,
    #[schema(schema_with = schema::isolation)]
    isolation: &'static str,
    status: String,
    members: i64,
    active_environments: i64,
}

#[derive(Serialize, ToSchema)]
pub struct TenantList {
    tenants: Vec<TenantBody>,
}

/// The tenants in the caller's reach.
#[utoipa::path(get, path = "/api/v1/tenants", tag = "tenants", responses((status = 200, body = TenantList)))]
async fn tenants(TokenCaller(platform, caller): TokenCaller) -> Result<Json<TenantList>, ApiError> {
    let tenants = platform.tenants(&caller).await.map_err(fail(&caller))?;
    let tenants = tenants
        .into_iter()
        .map(|t| TenantBody {
            id: t.id,
            slug: t.slug,
            name: t.name,
            isolation: t.isolation.as_str(),
            status: t.status,
            members: t.members,
            active_environments: t.active_environments,
        })
        .collect();
    Ok(Json(TenantList { tenants }))
}

#[derive(Serialize, ToSchema)]
pub struct MemberBody {
    user_id: i64,
    email: String,
    name: String,
    #[schema(schema_with = schema::role)]
    role: &'static str,
    status: String,
}

#[derive(Serialize, ToSchema)]
pub struct MemberList {
    members: Vec<MemberBody>,
}

/// A tenant's members.
#[utoipa::path(get, path = "/api/v1/tenants/{id}/members", tag = "tenants",
    params(("id" = i64, Path, description = "The tenant's id")),
    responses((status = 200, body = MemberList)))]
async fn members(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<i64>,
) -> Result<Json<MemberList>, ApiError> {
    let members = platform.members(&caller, id).await.map_err(fail(&caller))?;
    let members = members
        .into_iter()
        .map(|m| MemberBody {
            user_id: m.user_id,
            email: m.email,
            name: m.display_name,
            role: m.role.as_str(),
            status: m.status,
        })
        .collect();
    Ok(Json(MemberList { members }))
}

#[derive(Serialize, ToSchema)]
pub struct NotificationBody {
    id: i64,
    kind: String,
    title: String,
    body: String,
    /// An absolute link to what it is about.
    link: String,
    #[schema(format = DateTime)]
    created_at: String,
    read: bool,
}

#[derive(Serialize, ToSchema)]
pub struct NotificationList {
    unread: i64,
    /// Newest first.
    notifications: Vec<NotificationBody>,
}

/// The caller's latest notifications, newest first, and how many are unread.
#[utoipa::path(get, path = "/api/v1/notifications", tag = "notifications",
    responses((status = 200, body = NotificationList)))]
async fn notifications(TokenCaller(platform, caller): TokenCaller) -> Result<Json<NotificationList>, ApiError> {
    let inbox = platform.inbox(&caller).await.map_err(fail(&caller))?;
    let notifications = inbox
        .items
        .into_iter()
        .map(|n| NotificationBody {
            link: berth_domain::notification::absolute_link(platform.public_url(), &n.link),
            id: n.id,
            kind: n.kind,
            title: n.title,
            body: n.body,
            created_at: rfc3339(n.created_at),
            read: n.read,
        })
        .collect();
    Ok(Json(NotificationList { unread: inbox.unread, notifications }))
}

/// Which notifications to mark read: `{"ids": [..]}`, or all of them (`{}`, `null` or no
/// body).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MarkRead {
    /// The notifications' ids; absent or `null`: all of them.
    #[serde(default)]
    pub ids: Option<Vec<i64>>,
}

#[derive(Serialize, ToSchema)]
pub struct Marked {
    /// How many were unread and are read now.
    marked: u64,
    unread: i64,
}

/// Marks the caller's notifications read.
#[utoipa::path(post, path = "/api/v1/notifications/read", tag = "notifications",
    request_body(content = Option<MarkRead>, description = "Optional: no body marks all of them"),
    responses((status = 200, body = Marked)))]
async fn mark_notifications_read(
    TokenCaller(platform, caller): TokenCaller,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Json<Marked>, Response> {
    let asked = match body.iter().all(u8::is_ascii_whitespace) {
        true => MarkRead::default(),
        false => read_object::<Option<MarkRead>>(&headers, &body, true)
            .map_err(IntoResponse::into_response)?
            .unwrap_or_default(),
    };
    let fail = |e| fail(&caller)(e).into_response();
    let marked = platform.mark_notifications_read(&caller, asked.ids.as_deref()).await.map_err(fail)?;
    let unread = platform.unread_notifications(caller.user_id()).await.map_err(fail)?;
    Ok(Json(Marked { marked, unread }))
}

/// A personal API token; never its secret.
#[derive(Serialize, ToSchema)]
pub struct TokenBody {
    id: i64,
    name: String,
    /// What it is limited to; empty: all its owner's role allows.
    #[schema(schema_with = schema::actions)]
    actions: Vec<&'static str>,
    #[schema(format = DateTime)]
    expires_at: String,
    revoked: bool,
}

#[derive(Serialize, ToSchema)]
pub struct TokenList {
    tokens: Vec<TokenBody>,
}

/// The caller's own API tokens.
#[utoipa::path(get, path = "/api/v1/tokens", tag = "tokens", responses((status = 200, body = TokenList)))]
async fn tokens(TokenCaller(platform, caller): TokenCaller) -> Result<Json<TokenList>, ApiError> {
    let tokens = platform.my_tokens(&caller).await.map_err(fail(&caller))?;
    let tokens = tokens
        .into_iter()
        .map(|t| TokenBody {
            id: t.id,
            name: t.name,
            actions: t.actions.iter().map(|a| a.as_str()).collect(),
            expires_at: rfc3339(t.expires_at),
            revoked: t.revoked_at.is_some(),
        })
        .collect();
    Ok(Json(TokenList { tokens }))
}

#[derive(Serialize, ToSchema)]
pub struct Revoked {
    /// The token's id.
    revoked: i64,
}

/// Revokes one of the caller's tokens (this one too).
#[utoipa::path(post, path = "/api/v1/tokens/{id}/revoke", tag = "tokens",
    params(("id" = i64, Path, description = "The token's id")),
    responses((status = 200, body = Revoked)))]
async fn revoke_token(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<i64>,
) -> Result<Json<Revoked>, ApiError> {
    platform.revoke_token(&caller, id).await.map_err(fail(&caller))?;
    Ok(Json(Revoked { revoked: id }))
}

#[derive(Serialize, ToSchema)]
pub struct VolumeBody {
    id: i64,
    name: String,
    size_gib: u32,
    /// The owner's home volume, made on their first notebook.
    home: bool,
    /// The project it is shared with; `null` for a personal volume.
    project: Option<i64>,
    /// The owner's email.
    owner: String,
    mount_path: String,
    /// Where the backend keeps it, once it was first attached.
    location: Option<String>,
    /// As last measured; `null` where the backend cannot measure it.
    used_bytes: Option<i64>,
    #[schema(format = DateTime)]
    created_at: String,
    attached: Vec<AttachmentBody>,
}

#[derive(Serialize, ToSchema)]
pub struct AttachmentBody {
    /// The environment's id.
    environment: String,
    environment_name: String,
    mount_path: String,
    #[schema(format = DateTime)]
    attached_at: String,
}

fn volume_body(v: Volume) -> VolumeBody {
    let attached = v
        .attachments
        .into_iter()
        .map(|a| AttachmentBody {
            environment: a.environment_id,
            environment_name: a.environment_name,
            mount_path: a.mount_path,
            attached_at: rfc3339(a.attached_at),
        })
        .collect();
    VolumeBody {
        id: v.id,
        name: v.name,
        size_gib: v.size_gib,
        home: v.is_home,
        project: v.project_id,
        owner: v.owner_email,
        mount_path: v.mount_path,
        location: v.location,
        used_bytes: v.used_bytes,
        created_at: rfc3339(v.created_at),
        attached,
    }
}

#[derive(Serialize, ToSchema)]
pub struct VolumeList {
    volumes: Vec<VolumeBody>,
}

/// The volumes in the caller's reach.
#[utoipa::path(get, path = "/api/v1/volumes", tag = "volumes", responses((status = 200, body = VolumeList)))]
async fn volumes(TokenCaller(platform, caller): TokenCaller) -> Result<Json<VolumeList>, ApiError> {
    let volumes = platform.volumes(&caller).await.map_err(fail(&caller))?;
    Ok(Json(VolumeList { volumes: volumes.into_iter().map(volume_body).collect() }))
}

/// `{"name": "datasets", "size_gib": 50, "project": 3}`: a size and project as numbers or
/// strings; no project for a personal volume.
#[derive(Deserialize, ToSchema)]
pub struct NewVolume {
    /// A DNS label, e.g. `datasets`.
    name: String,
    /// Whole GiB, 1 to 65536.
    #[schema(schema_with = schema::number_or_text)]
    size_gib: Value,
    /// The project's id to share it with; absent, `null` or empty for a personal volume.
    #[serde(default)]
    #[schema(schema_with = schema::optional_number_or_text)]
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

/// Makes a volume, personal or shared with a project.
#[utoipa::path(post, path = "/api/v1/volumes", tag = "volumes", request_body = NewVolume,
    responses((status = 201, description = "Made", body = VolumeBody)))]
async fn create_volume(TokenCaller(platform, caller): TokenCaller, Body(asked): Body<NewVolume>) -> Response {
    let request = VolumeRequest { name: asked.name, size_gib: typed(&asked.size_gib), project: typed(&asked.project) };
    match platform.create_volume(&caller, &request).await {
        Ok(volume) => (StatusCode::CREATED, Json(volume_body(volume))).into_response(),
        Err(e) => fail(&caller)(e).into_response(),
    }
}

/// One volume.
#[utoipa::path(get, path = "/api/v1/volumes/{id}", tag = "volumes",
    params(("id" = i64, Path, description = "The volume's id")),
    responses((status = 200, body = VolumeBody)))]
async fn volume(TokenCaller(platform, caller): TokenCaller, Path(id): Path<i64>) -> Result<Json<VolumeBody>, ApiError> {
    let volume = platform.volume(&caller, id).await.map_err(fail(&caller))?;
    Ok(Json(volume_body(volume)))
}

/// `{"size_gib": 100}`: a volume only grows.
#[derive(Deserialize, ToSchema)]
pub struct NewSize {
    /// Whole GiB, more than now.
    #[schema(schema_with = schema::number_or_text)]
    size_gib: Value,
}

/// Grows a volume.
#[utoipa::path(patch, path = "/api/v1/volumes/{id}", tag = "volumes",
    params(("id" = i64, Path, description = "The volume's id")),
    request_body = NewSize,
    responses((status = 200, body = VolumeBody)))]
async fn resize_volume(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<i64>,
    Body(asked): Body<NewSize>,
) -> Result<Json<VolumeBody>, ApiError> {
    let volume = platform.resize_volume(&caller, id, &typed(&asked.size_gib)).await.map_err(fail(&caller))?;
    Ok(Json(volume_body(volume)))
}

#[derive(Serialize, ToSchema)]
pub struct Deleted {
    /// The volume's id.
    deleted: i64,
}

/// Deletes a volume that nothing has attached.
#[utoipa::path(delete, path = "/api/v1/volumes/{id}", tag = "volumes",
    params(("id" = i64, Path, description = "The volume's id")),
    responses((status = 200, body = Deleted)))]
async fn delete_volume(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<i64>,
) -> Result<Json<Deleted>, ApiError> {
    platform.delete_volume(&caller, id).await.map_err(fail(&caller))?;
    Ok(Json(Deleted { deleted: id }))
}

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
    /// Only events before this id: the next page.
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
    /// Newest first, at most 100: the next page is `before` the last one's id.
    events: Vec<AuditEvent>,
}

/// The audit log in the caller's reach, newest first.
#[utoipa::path(get, path = "/api/v1/audit", tag = "audit", params(AuditQuery),
    responses((status = 200, body = AuditLog)))]
async fn audit(
    TokenCaller(platform, caller): TokenCaller,
    Query(filter): Query<AuditFilter>,
) -> Result<Json<AuditLog>, ApiError> {
    let rows = platform.audit_log(&caller, &filter, berth_platform::audit::AUDIT_PAGE).await.map_err(fail(&caller))?;
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
    Ok(Json(AuditLog { events }))
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

/// One entry of the image catalog.
#[derive(Serialize, ToSchema)]
pub struct ImageBody {
    id: i64,
    /// `platform`, or the slug of the tenant whose own entry it is.
    catalog: String,
    name: String,
    /// What a launch names to run it (`image` in the launch body), or its `name`.
    reference: String,
    /// Named by digest, not by a tag that may move.
    pinned: bool,
    description: String,
    cuda: String,
    framework: String,
    /// Offering ids it suits.
    #[schema(value_type = Vec<String>, example = json!(["notebook", "training"]))]
    offerings: Vec<&'static str>,
    /// Offering ids it is its catalog's default for.
    #[schema(value_type = Vec<String>)]
    default_for: Vec<&'static str>,
}

/// A tenant's rule for images besides the catalog's (training jobs and endpoints).
#[derive(Serialize, ToSchema)]
pub struct CustomImagesBody {
    tenant: String,
    /// `catalog` (catalog images only), `any` (any registry) or `registries`.
    #[schema(example = "registries")]
    rule: &'static str,
    /// The registry hosts allowed, for `registries`.
    registries: Vec<String>,
}

#[derive(Serialize, ToSchema)]
pub struct ImageCatalogBody {
    /// The platform's entries, then each tenant's in reach.
    images: Vec<ImageBody>,
    custom_images: Vec<CustomImagesBody>,
}

fn image_body(catalog: &str, i: berth_domain::image::CatalogImage) -> ImageBody {
    let ids = |offerings: &[berth_domain::catalog::Offering]| offerings.iter().map(|o| o.id()).collect();
    ImageBody {
        id: i.id,
        catalog: catalog.to_owned(),
        pinned: i.is_pinned(),
        offerings: ids(&i.offerings),
        default_for: ids(&i.default_for),
        name: i.name,
        reference: i.reference,
        description: i.description,
        cuda: i.cuda,
        framework: i.framework,
    }
}

/// The image catalog in the caller's reach: the platform's entries, their tenant's own (a
/// platform admin's: every tenant's), and each tenant's rule for custom images.
#[utoipa::path(get, path = "/api/v1/images", tag = "images", responses((status = 200, body = ImageCatalogBody)))]
async fn images(TokenCaller(platform, caller): TokenCaller) -> Result<Json<ImageCatalogBody>, ApiError> {
    use berth_domain::image::CustomImages;
    let catalog = platform.image_catalog(&caller).await.map_err(fail(&caller))?;
    let mut images: Vec<ImageBody> = catalog.platform.into_iter().map(|i| image_body("platform", i)).collect();
    let mut custom_images = Vec::with_capacity(catalog.tenants.len());
    for tenant in catalog.tenants {
        images.extend(tenant.images.into_iter().map(|i| image_body(&tenant.tenant, i)));
        let (rule, registries) = match tenant.custom {
            CustomImages::CatalogOnly => ("catalog", Vec::new()),
            CustomImages::AnyRegistry => ("any", Vec::new()),
            CustomImages::Registries(hosts) => ("registries", hosts),
        };
        custom_images.push(CustomImagesBody { tenant: tenant.tenant, rule, registries });
    }
    Ok(Json(ImageCatalogBody { images, custom_images }))
}

/// A month of GPU-hours and cost in the caller's reach, with the budgets that apply.
#[utoipa::path(get, path = "/api/v1/usage", tag = "usage", params(UsageQuery),
    responses((status = 200, body = UsageBody)))]
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
        daily_cents: report.daily_cents.clone(),
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

/// A node's lifecycle state, its changes and its check runs.
#[derive(Serialize, ToSchema)]
pub struct NodeHealthBody {
    node: String,
    site: String,
    model: &'static str,
    gpus: u32,
    #[schema(schema_with = schema::node_state)]
    state: &'static str,
    repair_tier: u32,
    /// The repair tier in progress (in repair) or last tried.
    repair_tier_name: Option<String>,
    repair_tiers: u32,
    /// Unreleased bookings on the node now.
    bookings_now: i64,
    takes_new_bookings: bool,
    /// Newest first.
    changes: Vec<NodeStateChangeBody>,
    /// Newest first, the last 20.
    check_runs: Vec<CheckRunBody>,
}

#[derive(Serialize, ToSchema)]
pub struct NodeStateChangeBody {
    #[schema(schema_with = schema::node_state)]
    from: &'static str,
    #[schema(schema_with = schema::node_state)]
    to: &'static str,
    repair_tier: u32,
    event: String,
    reason: String,
    /// The person's email; `null` when Berth moved the node.
    by: Option<String>,
    #[schema(format = DateTime)]
    at: String,
}

/// The node's health: state, changes (who, why, when) and check runs.
#[utoipa::path(get, path = "/api/v1/nodes/{id}/health", tag = "nodes",
    params(("id" = String, Path, description = "The node's name")),
    responses((status = 200, body = NodeHealthBody)))]
async fn node_health(
    TokenCaller(platform, caller): TokenCaller,
    Path(name): Path<String>,
) -> Result<Json<NodeHealthBody>, ApiError> {
    let health = platform.node_health(&caller, &name).await.map_err(fail(&caller))?;
    let changes = health
        .changes
        .iter()
        .map(|c| NodeStateChangeBody {
            from: c.from.as_str(),
            to: c.to.as_str(),
            repair_tier: c.tier,
            event: c.event.clone(),
            reason: c.reason.clone(),
            by: c.by.clone(),
            at: rfc3339(c.at),
        })
        .collect();
    Ok(Json(NodeHealthBody {
        node: health.node,
        site: health.site,
        model: health.model.name(),
        gpus: health.gpus,
        state: health.status.state.as_str(),
        repair_tier: health.status.tier,
        repair_tier_name: health.tier_name,
        repair_tiers: health.tiers,
        bookings_now: health.bookings_now,
        takes_new_bookings: health.status.state.takes_new_bookings(),
        changes,
        check_runs: health.runs.iter().map(check_run_body).collect(),
    }))
}

#[derive(Serialize, ToSchema)]
pub struct CheckRunBody {
    id: i64,
    /// `quick`, `medium` or `long`.
    level: String,
    /// `acceptance` or `on_demand`.
    purpose: String,
    requested_by: Option<String>,
    #[schema(format = DateTime)]
    started_at: String,
    #[schema(format = DateTime)]
    finished_at: Option<String>,
    /// `null` while it runs.
    passed: Option<bool>,
    results: Vec<CheckResultBody>,
}

#[derive(Serialize, ToSchema)]
pub struct CheckResultBody {
    check: String,
    passed: bool,
    measured: Option<f64>,
    threshold: Option<f64>,
    unit: String,
    summary: String,
    command: String,
    raw_output: String,
}

fn check_run_body(run: &berth_platform::provisioning::node_health::CheckRun) -> CheckRunBody {
    CheckRunBody {
        id: run.id,
        level: run.level.clone(),
        purpose: run.purpose.clone(),
        requested_by: run.requested_by.clone(),
        started_at: rfc3339(run.started_at),
        finished_at: run.finished_at.map(rfc3339),
        passed: run.passed,
        results: run
            .results
            .iter()
            .map(|r| CheckResultBody {
                check: r.kind.clone(),
                passed: r.passed,
                measured: r.measured,
                threshold: r.threshold,
                unit: r.unit.clone(),
                summary: r.summary.clone(),
                command: r.command.clone(),
                raw_output: r.raw_output.clone(),
            })
            .collect(),
    }
}

#[derive(Deserialize, ToSchema)]
pub struct CheckRequest {
    /// `quick`, `medium` or `long` (`dcgmi diag -r 1/2/3`).
    level: String,
}

/// Runs checks on a node: acceptance on a node nobody holds, else a check on demand.
#[utoipa::path(post, path = "/api/v1/nodes/{id}/checks", tag = "nodes",
    params(("id" = String, Path, description = "The node's name")),
    request_body = CheckRequest,
    responses((status = 200, body = CheckRunBody)))]
async fn run_node_checks(
    TokenCaller(platform, caller): TokenCaller,
    Path(name): Path<String>,
    Body(request): Body<CheckRequest>,
) -> Result<Json<CheckRunBody>, ApiError> {
    let run = platform.run_node_checks(&caller, &name, &request.level).await.map_err(fail(&caller))?;
    Ok(Json(check_run_body(&run)))
}

#[derive(Deserialize, ToSchema)]
pub struct StateChange {
    /// `drain`, `return_to_service`, `start_repair`, `repair_done`, `repair_failed`,
    /// `retire` or `reinstate`.
    event: String,
    /// Why, for the node's history.
    reason: String,
}

#[derive(Serialize, ToSchema)]
pub struct NodeStateBody {
    node: String,
    #[schema(schema_with = schema::node_state)]
    state: &'static str,
    repair_tier: u32,
    repair_tier_name: Option<String>,
}

/// A platform admin moves a node through its lifecycle.
#[utoipa::path(post, path = "/api/v1/nodes/{id}/state", tag = "nodes",
    params(("id" = String, Path, description = "The node's name")),
    request_body = StateChange,
    responses((status = 200, body = NodeStateBody)))]
async fn change_node_state(
    TokenCaller(platform, caller): TokenCaller,
    Path(name): Path<String>,
    Body(change): Body<StateChange>,
) -> Result<Json<NodeStateBody>, ApiError> {
    let health =
        platform.change_node_state(&caller, &name, &change.event, &change.reason).await.map_err(fail(&caller))?;
    Ok(Json(NodeStateBody {
        node: health.node,
        state: health.status.state.as_str(),
        repair_tier: health.status.tier,
        repair_tier_name: health.tier_name,
    }))
}

/// What a node's agent reports (`berth_domain::agent::NodeReport`, which reads it: a test
/// keeps the two field for field).
#[derive(ToSchema)]
#[allow(dead_code)] // The schema of what `NodeReport` reads; never built.
pub struct NodeReportBody {
    /// The `berth` version the agent runs.
    agent_version: String,
    /// Every GPU NVML sees; empty when NVML is not available on the node.
    gpus: Vec<GpuReportBody>,
}

/// One GPU as NVML sees it (`berth_domain::agent::GpuReport`); readings a GPU does not
/// support are `null`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct GpuReportBody {
    /// NVML's device index, the fleet file's numbering.
    index: i64,
    /// `GPU-…`.
    uuid: String,
    /// e.g. `NVIDIA H100 80GB HBM3`.
    name: String,
    memory_mib: i64,
    mig_enabled: bool,
    mig_instances: Option<i64>,
    /// Uncorrected ECC errors since the driver loaded.
    ecc_uncorrected: Option<i64>,
    temperature_c: Option<i64>,
    power_w: Option<i64>,
    /// 0 to 100.
    utilization_pct: Option<i64>,
}

/// What an agent says after applying its node's plan (`berth_domain::node_plan::PlanReport`).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct PlanReportBody {
    /// The plan generation the agent worked on.
    generation: i64,
    /// `null`: the whole plan is applied; otherwise what stopped it.
    error: Option<String>,
    /// The node's underlay address, which the tenants' other nodes tunnel to.
    #[schema(format = Ipv4, pattern = r"^((25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])$")]
    underlay_address: Option<String>,
    #[schema(required = false)]
    workloads: Vec<WorkloadStatusBody>,
}

/// How one workload is doing on the node (`berth_domain::node_plan::WorkloadStatus`).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct WorkloadStatusBody {
    environment_id: String,
    /// `null` until the image is on the node.
    #[schema(schema_with = schema::workload_state, required = false)]
    state: Option<String>,
    exit_code: Option<i64>,
    /// Why the agent could not pull or start it.
    error: Option<String>,
    /// A training job's last log lines, oldest first.
    #[schema(required = false)]
    log_tail: Vec<String>,
}

#[derive(Serialize, ToSchema)]
pub struct ReportReceiptBody {
    node: String,
    /// GPUs in the report.
    gpus: usize,
    /// One line per GPU whose health changed, e.g. `gpu 3: failed (2 uncorrected ECC errors)`.
    changes: Vec<String>,
    /// Indices the node reports that the fleet file does not name; they are not booked.
    unexpected_gpus: Vec<i64>,
}

/// A node's agent reports its GPUs as NVML reads them (`berth_domain::agent::NodeReport`);
/// the answer says which GPUs changed health.
#[utoipa::path(post, path = "/api/v1/agent/report", tag = "agent",
    request_body = NodeReportBody,
    responses((status = 200, body = ReportReceiptBody)))]
async fn agent_report(
    State(state): State<AppState>,
    NodeSecret(secret, meta): NodeSecret,
    Body(report): Body<NodeReport>,
) -> Result<Json<ReportReceiptBody>, Response> {
    let request_id = meta.request_id.clone();
    match state.platform.report_node(&secret, &report, meta).await {
        Ok(receipt) => Ok(Json(ReportReceiptBody {
            node: receipt.node,
            gpus: report.gpus.len(),
            changes: receipt.changes,
            unexpected_gpus: receipt.unexpected,
        })),
        Err(Error::Unauthenticated) => Err(node_unauthenticated(&request_id)),
        Err(error) => Err(ApiError { error, request_id }.into_response()),
    }
}

/// A bare-metal node's agent fetches what its node should hold (`--backend baremetal`).
#[utoipa::path(get, path = "/api/v1/agent/plan", tag = "agent",
    responses((status = 200, description = "The node's plan (`berth_domain::node_plan::NodePlan`)", body = Object)))]
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

#[derive(Serialize, ToSchema)]
pub struct PlanAccepted {
    /// The generation reported.
    generation: i64,
}

/// A bare-metal node's agent says which plan generation it applied, or why it could not
/// (`berth_domain::node_plan::PlanReport`).
#[utoipa::path(post, path = "/api/v1/agent/plan", tag = "agent",
    request_body = PlanReportBody,
    responses((status = 200, body = PlanAccepted)))]
async fn agent_plan_report(
    State(state): State<AppState>,
    NodeSecret(secret, meta): NodeSecret,
    Body(report): Body<PlanReport>,
) -> Result<Json<PlanAccepted>, Response> {
    let request_id = meta.request_id.clone();
    let generation = report.generation;
    // Its own task: an agent that hangs up must not cut the write transaction short.
    let platform = state.platform.clone();
    let outcome = tokio::spawn(async move { platform.report_node_plan(&secret, &report, meta).await })
        .await
        .unwrap_or_else(|e| Err(Error::internal(e)));
    match outcome {
        Ok(()) => Ok(Json(PlanAccepted { generation })),
        Err(Error::Unauthenticated) => Err(node_unauthenticated(&request_id)),
        Err(error) => Err(ApiError { error, request_id }.into_response()),
    }
}

/// Schemas the derives cannot see: the domain's names for roles, states and the rest,
/// taken from the domain's own lists so that they cannot drift.
mod schema {
    use berth_domain::catalog::Offering;
    use berth_domain::lifecycle::EnvState;
    use berth_domain::node_health::NodeState;
    use berth_domain::policy::{Action, Role};
    use berth_domain::tenancy::Isolation;
    use berth_platform::capacity::metering::UsageBy;
    use utoipa::openapi::schema::{ArrayBuilder, KnownFormat, ObjectBuilder, OneOfBuilder, Schema, SchemaFormat, Type};
    use utoipa::openapi::{RefOr, schema::SchemaType};

    fn one_of(values: impl IntoIterator<Item = &'static str>) -> ObjectBuilder {
        ObjectBuilder::new().schema_type(Type::String).enum_values(Some(values))
    }

    pub fn offering() -> ObjectBuilder {
        one_of(Offering::ALL.map(Offering::id))
    }

    /// A listing's `state`: empty is any.
    pub fn state_filter() -> ObjectBuilder {
        one_of(["", "active", "finished", "any"])
    }

    pub fn usage_by() -> ObjectBuilder {
        let mut choices = vec![""];
        choices.extend(UsageBy::ALL.map(UsageBy::as_str));
        one_of(choices)
    }

    pub fn environment_state() -> ObjectBuilder {
        one_of(EnvState::ALL.map(EnvState::as_str))
    }

    /// Every size of the catalog, of every offering.
    pub fn size() -> ObjectBuilder {
        let mut sizes: Vec<&'static str> = Offering::ALL.iter().flat_map(|o| o.sizes()).map(|s| s.id).collect();
        sizes.sort_unstable();
        sizes.dedup();
        one_of(sizes)
    }

    /// A launch's tier: empty is guaranteed.
    pub fn tier_asked() -> ObjectBuilder {
        one_of(["", "guaranteed", "spot"])
    }

    pub fn tier() -> ObjectBuilder {
        one_of(["guaranteed", "spot"])
    }

    pub fn role() -> ObjectBuilder {
        one_of(Role::ALL.map(Role::as_str))
    }

    pub fn isolation() -> ObjectBuilder {
        one_of(Isolation::ALL.map(Isolation::as_str))
    }

    pub fn node_state() -> ObjectBuilder {
        one_of(NodeState::ALL.map(NodeState::as_str))
    }

    pub fn actions() -> ArrayBuilder {
        ArrayBuilder::new().items(one_of(Action::ALL.map(Action::as_str)))
    }

    /// Ids as numbers (or as a form's text).
    pub fn ids() -> ArrayBuilder {
        let id =
            ObjectBuilder::new().schema_type(Type::Integer).format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)));
        ArrayBuilder::new().items(OneOfBuilder::new().item(id).item(ObjectBuilder::new().schema_type(Type::String)))
    }

    pub fn workload_state() -> RefOr<Schema> {
        OneOfBuilder::new()
            .item(one_of(["pulled", "running", "exited"]))
            .item(ObjectBuilder::new().schema_type(SchemaType::Type(Type::Null)))
            .into()
    }

    /// A whole number, as a number or as text.
    pub fn number_or_text() -> RefOr<Schema> {
        OneOfBuilder::new()
            .item(ObjectBuilder::new().schema_type(Type::Integer).format(None))
            .item(ObjectBuilder::new().schema_type(Type::String))
            .into()
    }

    pub fn optional_number_or_text() -> RefOr<Schema> {
        OneOfBuilder::new()
            .item(ObjectBuilder::new().schema_type(Type::Integer))
            .item(ObjectBuilder::new().schema_type(Type::String))
            .item(ObjectBuilder::new().schema_type(SchemaType::Type(Type::Null)))
            .into()
    }
}
