//! Environments: list, launch (with `Idempotency-Key`), show, stop, change the end.

use axum::Json;
use axum::extract::{Path, Query};
use axum::response::{IntoResponse, Response};
use berth_domain::Refusal;
use berth_domain::catalog::Offering;
use berth_domain::launch::LaunchRequest;
use berth_platform::capacity::environments::{Environment, EnvironmentFilter, LISTING_LIMIT};
use berth_platform::provisioning::connect::{KeyState, LOG_TAIL};
use berth_platform::{Caller, Error, Platform};
use http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::paging::{PageQuery, cursor};
use super::{ApiError, Body, TokenCaller, fail, rfc3339, schema};

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
    /// What an inference endpoint serves, as launched (`null`: nothing given).
    serving: Option<ServingBody>,
}

/// An inference endpoint's model, arguments and variables; the variables by name only
/// (values may be secrets).
#[derive(Serialize, ToSchema)]
pub struct ServingBody {
    model: Option<String>,
    /// The arguments the model server gets (`{model}` replaced).
    args: Vec<String>,
    env_names: Vec<String>,
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
        serving: (env.serving != Default::default()).then(|| ServingBody {
            model: env.serving.model.clone(),
            args: env.serving.container_args(),
            env_names: env.serving.env_names(),
        }),
    }
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
    /// Newest first.
    environments: Vec<ListedEnvironmentBody>,
    /// The next page's `cursor`; `null` on the last page.
    next_cursor: Option<String>,
}

/// A page of environments: 100 unless `limit` says otherwise, 500 at most.
const PAGE: i64 = 100;
/// What an environments cursor is a place in.
const LISTING: &str = "environments";

/// The environments in the caller's reach, newest first: their own, their tenant's for
/// tenant admins and viewers, every one for platform staff. Paged by `next_cursor`.
#[utoipa::path(get, path = "/api/v1/environments", tag = "environments", params(EnvironmentQuery, PageQuery),
    responses((status = 200, body = EnvironmentList)))]
pub(super) async fn environments(
    TokenCaller(platform, caller): TokenCaller,
    Query(query): Query<EnvironmentQuery>,
    Query(page): Query<PageQuery>,
) -> Result<Json<EnvironmentList>, ApiError> {
    let mut filter =
        EnvironmentFilter::parse(&query.owner, &query.project, &query.tenant, &query.state).map_err(fail(&caller))?;
    filter.limit = Some(page.limit(PAGE, LISTING_LIMIT).map_err(fail(&caller))?);
    filter.after = match page.place(LISTING).map_err(fail(&caller))? {
        None => None,
        Some(place) => {
            let (created_at, id) = place.split_once('.').ok_or_else(|| fail(&caller)(page.foreign()))?;
            Some((created_at.parse().map_err(|_| fail(&caller)(page.foreign()))?, id.to_owned()))
        }
    };
    let listing = platform.environments_in_reach(&caller, &filter).await.map_err(fail(&caller))?;
    let next_cursor = match (listing.more, listing.environments.last()) {
        (true, Some(last)) => {
            Some(cursor(LISTING, &format!("{}.{}", last.environment.created_at, last.environment.id)))
        }
        _ => None,
    };
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
    Ok(Json(EnvironmentList { environments, next_cursor }))
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
    /// An inference endpoint's model (a Hugging Face id or a path in the image); also
    /// `BERTH_MODEL` in its environment.
    #[schema(required = false, default = "")]
    model: String,
    /// The model server's arguments, split as a shell would (quotes group words), after
    /// the image's entrypoint; `{model}` stands for the model. Empty with a model:
    /// `--model {model}`.
    #[schema(required = false, default = "")]
    args: String,
    /// The model server's environment variables, `NAME=value` lines. Never answered back
    /// (only their names).
    #[schema(required = false, default = "")]
    env: String,
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
pub(super) async fn launch(
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
pub(super) async fn environment(
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
pub(super) async fn stop(
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
pub(super) async fn change_end(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<String>,
    Body(end): Body<NewEnd>,
) -> Result<Json<EnvironmentBody>, ApiError> {
    let env = platform.change_end(&caller, &id, &end.ends_at).await.map_err(fail(&caller))?;
    Ok(Json(environment_body(&platform, &caller, &env)))
}

/// An inference endpoint's replicas and key, as its page shows them.
#[derive(Serialize, ToSchema)]
pub struct EndpointBody {
    /// What the owner asked for, and what the backend last confirmed running.
    replicas: u32,
    replicas_applied: u32,
    /// Why applying `replicas` failed last time; `null` once it worked.
    scale_error: Option<String>,
    /// `pending` (not made yet: the endpoint is not ready), `unrevealed` (made, to be shown
    /// once) or `shown` (only its hash is kept).
    #[schema(pattern = "^(pending|unrevealed|shown)$")]
    key: &'static str,
    /// When it was shown (or last replaced).
    #[schema(format = DateTime)]
    key_shown_at: Option<String>,
}

async fn endpoint_body(platform: &Platform, caller: &Caller, id: &str) -> Result<EndpointBody, Error> {
    let detail = platform.environment_detail(caller, id).await?;
    let state = detail.endpoint.ok_or(Refusal::NoReplicas(detail.environment.offering.title()))?;
    let (key, key_shown_at) = match state.key {
        KeyState::NotYetMade => ("pending", None),
        KeyState::Unrevealed => ("unrevealed", None),
        KeyState::Shown { at } => ("shown", Some(rfc3339(at))),
    };
    Ok(EndpointBody {
        replicas: state.replicas,
        replicas_applied: state.replicas_applied,
        scale_error: state.scale_error,
        key,
        key_shown_at,
    })
}

/// A failed node of a dedicated cluster and what took its place.
#[derive(Serialize, ToSchema)]
pub struct NodeReplacementBody {
    failed_node: String,
    /// Why it failed (its state change's reason).
    reason: String,
    #[schema(format = DateTime)]
    failed_at: String,
    /// The node booked in its place; `null` while none is free.
    replacement: Option<String>,
    /// While none is free: the first time one is, within the cluster's window.
    #[schema(format = DateTime)]
    next_free_at: Option<String>,
    /// Why it cannot be moved (the backend cannot yet, or its last try failed).
    problem: Option<String>,
    /// When the cluster was moved and the failed node's GPUs released.
    #[schema(format = DateTime)]
    moved_at: Option<String>,
}

/// A dedicated cluster's failed nodes and what replaced them, oldest first (empty for
/// anything else), as its page lists them.
#[utoipa::path(get, path = "/api/v1/environments/{id}/node-replacements", tag = "environments",
    params(("id" = String, Path, description = "The environment's id")),
    responses((status = 200, body = [NodeReplacementBody])))]
pub(super) async fn node_replacements(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<String>,
) -> Result<Json<Vec<NodeReplacementBody>>, ApiError> {
    let detail = platform.environment_detail(&caller, &id).await.map_err(fail(&caller))?;
    Ok(Json(
        detail
            .node_replacements
            .into_iter()
            .map(|r| NodeReplacementBody {
                failed_node: r.failed_node,
                reason: r.reason,
                failed_at: rfc3339(r.decided_at),
                replacement: r.replacement,
                next_free_at: r.next_free_at.map(rfc3339),
                problem: r.problem,
                moved_at: r.moved_at.map(rfc3339),
            })
            .collect(),
    ))
}

/// An inference endpoint's replicas and the state of its API key.
#[utoipa::path(get, path = "/api/v1/environments/{id}/endpoint", tag = "environments",
    params(("id" = String, Path, description = "The environment's id")),
    responses((status = 200, body = EndpointBody)))]
pub(super) async fn endpoint(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<String>,
) -> Result<Json<EndpointBody>, ApiError> {
    Ok(Json(endpoint_body(&platform, &caller, &id).await.map_err(fail(&caller))?))
}

/// How many replicas an endpoint should run.
#[derive(Deserialize, ToSchema)]
pub struct NewReplicas {
    #[schema(minimum = 1, maximum = 8)]
    replicas: u32,
}

/// Sets how many replicas a ready endpoint runs: each more books its size again until the
/// endpoint's end, within quota and budget (all or nothing); fewer give theirs back once
/// stopped.
#[utoipa::path(put, path = "/api/v1/environments/{id}/replicas", tag = "environments",
    params(("id" = String, Path, description = "The environment's id")),
    request_body = NewReplicas,
    responses((status = 200, body = EndpointBody)))]
pub(super) async fn set_replicas(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<String>,
    Body(asked): Body<NewReplicas>,
) -> Result<Json<EndpointBody>, ApiError> {
    let replicas = asked.replicas.to_string();
    platform.set_replicas(&caller, &id, &replicas).await.map_err(fail(&caller))?;
    Ok(Json(endpoint_body(&platform, &caller, &id).await.map_err(fail(&caller))?))
}

/// An endpoint's API key, shown this once.
#[derive(Serialize, ToSchema)]
pub struct ApiKeyBody {
    /// `Authorization: Bearer <key>` on the endpoint's URL. Berth keeps only its hash.
    key: String,
}

/// Shows an endpoint's API key, once (after that, 422: replace it instead). Audited.
#[utoipa::path(post, path = "/api/v1/environments/{id}/api-key", tag = "environments",
    params(("id" = String, Path, description = "The environment's id")),
    responses((status = 200, body = ApiKeyBody)))]
pub(super) async fn reveal_api_key(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<String>,
) -> Result<Json<ApiKeyBody>, ApiError> {
    let key = platform.reveal_endpoint_key(&caller, &id).await.map_err(fail(&caller))?;
    Ok(Json(ApiKeyBody { key }))
}

/// Gives an endpoint a new API key, shown this once; the old one stops working at once.
/// Audited.
#[utoipa::path(post, path = "/api/v1/environments/{id}/api-key/replace", tag = "environments",
    params(("id" = String, Path, description = "The environment's id")),
    responses((status = 200, body = ApiKeyBody)))]
pub(super) async fn replace_api_key(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<String>,
) -> Result<Json<ApiKeyBody>, ApiError> {
    let key = platform.replace_endpoint_key(&caller, &id).await.map_err(fail(&caller))?;
    Ok(Json(ApiKeyBody { key }))
}

/// How much of a training job's log.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LogsQuery {
    /// The last this many lines; absent: 200. At most what Berth keeps of a log (10,000
    /// lines and 1 MiB): more is taken as all of it.
    #[param(minimum = 0)]
    pub tail: Option<u32>,
}

/// A training job's status and the end of its log.
#[derive(Serialize, ToSchema)]
pub struct JobLogsBody {
    /// `pending`, `running`, `succeeded` or `failed`.
    #[schema(example = "running")]
    status: &'static str,
    /// A failed job's exit code, where it has one.
    exit_code: Option<i32>,
    /// Why a job failed.
    reason: Option<String>,
    /// The last lines, oldest first.
    lines: Vec<String>,
}

/// A training job's status and the last lines of its log (kept when it ended).
#[utoipa::path(get, path = "/api/v1/environments/{id}/logs", tag = "environments",
    params(("id" = String, Path, description = "The environment's id"), LogsQuery),
    responses((status = 200, body = JobLogsBody)))]
pub(super) async fn logs(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<String>,
    Query(query): Query<LogsQuery>,
) -> Result<Json<JobLogsBody>, ApiError> {
    use berth_platform::provisioning::backend::JobStatus;
    let tail = query.tail.map_or(LOG_TAIL, |t| usize::try_from(t).unwrap_or(usize::MAX));
    let logs = platform.job_logs(&caller, &id, tail).await.map_err(fail(&caller))?;
    let (status, exit_code, reason) = match logs.status {
        JobStatus::Pending => ("pending", None, None),
        JobStatus::Running => ("running", None, None),
        JobStatus::Succeeded => ("succeeded", Some(0), None),
        JobStatus::Failed { exit_code, reason } => ("failed", exit_code, Some(reason)),
    };
    Ok(Json(JobLogsBody { status, exit_code, reason, lines: logs.lines }))
}
