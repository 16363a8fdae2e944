//! Nodes for platform admins (health, checks, lifecycle) and the node agent's routes
//! (`/api/v1/agent/*`, node token).

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use berth_domain::Refusal;
use berth_domain::agent::NodeReport;
use berth_domain::node_checks::{AgentOrder, CheckAnswer, NodeTask};
use berth_domain::node_plan::PlanReport;
use berth_platform::Error;
use berth_platform::provisioning::telemetry::XidError;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::{ApiError, Body, NodeSecret, TokenCaller, fail, node_unauthenticated, rfc3339, schema};
use crate::state::AppState;

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
    /// The repair tier's command where Berth does not run it (bare metal): a person runs it
    /// on the node, then marks the repair done or failed.
    repair_tier_command_by_hand: Option<String>,
    repair_tiers: u32,
    /// Unreleased bookings on the node now.
    bookings_now: i64,
    takes_new_bookings: bool,
    /// Newest first.
    changes: Vec<NodeStateChangeBody>,
    /// Newest first, the last 20.
    check_runs: Vec<CheckRunBody>,
    /// XID errors the node's agent reported in the last 7 days, newest first (the last 50).
    xid_errors: Vec<XidErrorBody>,
    /// Each GPU's health and MIG mode, by index (`POST …/gpus/{gpu}/reset` resets one).
    gpu_states: Vec<GpuStateBody>,
}

/// One GPU of a node as its agent (or an admin) last left it.
#[derive(Serialize, ToSchema)]
pub struct GpuStateBody {
    index: u32,
    /// `healthy`, `degraded` or `failed`.
    #[schema(example = "degraded")]
    health: String,
    /// Why it is not healthy.
    note: Option<String>,
    /// The MIG mode in effect as the agent last reported it; `null` before a report.
    mig_mode: Option<bool>,
}

/// An XID error a node's agent reported on a GPU.
#[derive(Serialize, ToSchema)]
pub struct XidErrorBody {
    node: String,
    gpu: i64,
    code: u32,
    /// What it means, from NVIDIA's XID catalogue.
    meaning: &'static str,
    /// Whether it is the GPU's or node's trouble (it degrades the node) rather than an
    /// application's.
    fatal: bool,
    /// When the agent's report carrying it arrived.
    #[schema(format = DateTime)]
    seen_at: String,
}

pub(super) fn xid_error_body(error: &XidError) -> XidErrorBody {
    XidErrorBody {
        node: error.node.clone(),
        gpu: error.gpu_index,
        code: error.code,
        meaning: berth_domain::agent::xid_meaning(error.code),
        fatal: berth_domain::node_checks::is_fatal_xid(error.code),
        seen_at: rfc3339(error.seen_at),
    }
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
pub(super) async fn node_health(
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
        repair_tier_command_by_hand: health.tier_command_by_hand,
        repair_tiers: health.tiers,
        bookings_now: health.bookings_now,
        takes_new_bookings: health.status.state.takes_new_bookings(),
        changes,
        check_runs: health.runs.iter().map(check_run_body).collect(),
        xid_errors: health.xid_errors.iter().map(xid_error_body).collect(),
        gpu_states: health
            .gpu_states
            .into_iter()
            .map(|g| GpuStateBody { index: g.index, health: g.health, note: g.note, mig_mode: g.mig_mode })
            .collect(),
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

/// Starts checks on a node: acceptance on a node nobody holds, else a check on demand.
/// Answered 202 with the run as it starts (`passed` null); it goes on in the background
/// (minutes on a real node, an hour at the long level): `GET /api/v1/nodes/{id}/health`
/// lists it with its results once it has finished. A node with a run going on refuses
/// another (422).
#[utoipa::path(post, path = "/api/v1/nodes/{id}/checks", tag = "nodes",
    params(("id" = String, Path, description = "The node's name")),
    request_body = CheckRequest,
    responses((status = 202, body = CheckRunBody)))]
pub(super) async fn run_node_checks(
    TokenCaller(platform, caller): TokenCaller,
    Path(name): Path<String>,
    Body(request): Body<CheckRequest>,
) -> Result<Response, ApiError> {
    let run = platform.start_node_checks(&caller, &name, &request.level).await.map_err(fail(&caller))?;
    Ok((axum::http::StatusCode::ACCEPTED, Json(check_run_body(&run))).into_response())
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
    /// The repair tier's command where Berth does not run it (bare metal): a person runs it
    /// on the node, then marks the repair done or failed.
    repair_tier_command_by_hand: Option<String>,
}

/// A platform admin moves a node through its lifecycle.
#[utoipa::path(post, path = "/api/v1/nodes/{id}/state", tag = "nodes",
    params(("id" = String, Path, description = "The node's name")),
    request_body = StateChange,
    responses((status = 200, body = NodeStateBody)))]
pub(super) async fn change_node_state(
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
        repair_tier_command_by_hand: health.tier_command_by_hand,
    }))
}

/// A GPU reset done.
#[derive(Serialize, ToSchema)]
pub struct GpuResetBody {
    node: String,
    gpu: u32,
    /// What `nvidia-smi -i <gpu> -r` printed.
    output: String,
}

/// A platform admin resets one GPU of a node (`nvidia-smi -i <gpu> -r`): the repair for a
/// MIG mode change waiting for a reset, or a GPU that hangs. Refused (422) for a GPU that
/// holds a booking now or within 10 minutes, and when the reset did not happen (with the
/// tool's words).
#[utoipa::path(post, path = "/api/v1/nodes/{id}/gpus/{gpu}/reset", tag = "nodes",
    params(("id" = String, Path, description = "The node's name"),
           ("gpu" = u32, Path, description = "The GPU's index on the node")),
    responses((status = 200, body = GpuResetBody)))]
pub(super) async fn reset_gpu(
    TokenCaller(platform, caller): TokenCaller,
    Path((name, gpu)): Path<(String, String)>,
) -> Result<Json<GpuResetBody>, ApiError> {
    // An index that is not a number names no GPU.
    let Ok(gpu) = gpu.parse::<u32>() else { return Err(fail(&caller)(Error::NotFound)) };
    let output = platform.reset_gpu(&caller, &name, gpu).await.map_err(fail(&caller))?;
    Ok(Json(GpuResetBody { node: name, gpu, output }))
}

/// A node's agent token: the secret is shown once, when it is made.
#[derive(Serialize, ToSchema)]
pub struct NewNodeTokenBody {
    id: i64,
    node: String,
    created_at: String,
    /// `BERTH_NODE_TOKEN` for `berth agent` on the node; not kept by Berth, not shown again.
    secret: String,
}

/// A platform admin makes a token for a node's agent (`berth agent`), as the fleet page does.
#[utoipa::path(post, path = "/api/v1/nodes/{id}/tokens", tag = "nodes",
    params(("id" = String, Path, description = "The node's name")),
    responses((status = 201, body = NewNodeTokenBody)))]
pub(super) async fn create_node_token(
    TokenCaller(platform, caller): TokenCaller,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let (token, secret) = platform
        .create_node_token(&caller, &name)
        .await
        // The node is the path's: one that does not exist is not found.
        .map_err(|e| match e {
            Error::Refused(Refusal::UnknownNode(_)) => Error::NotFound,
            other => other,
        })
        .map_err(fail(&caller))?;
    let body = NewNodeTokenBody { id: token.id, node: token.node, created_at: rfc3339(token.created_at), secret };
    Ok((axum::http::StatusCode::CREATED, Json(body)).into_response())
}

#[derive(Serialize, ToSchema)]
pub struct NodeTokenRevoked {
    revoked: i64,
}

/// A platform admin revokes a node's agent token: the agent's next call is refused.
#[utoipa::path(delete, path = "/api/v1/node-tokens/{id}", tag = "nodes",
    params(("id" = i64, Path, description = "The token's id")),
    responses((status = 200, body = NodeTokenRevoked)))]
pub(super) async fn revoke_node_token(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<i64>,
) -> Result<Json<NodeTokenRevoked>, ApiError> {
    platform.revoke_node_token(&caller, id).await.map_err(fail(&caller))?;
    Ok(Json(NodeTokenRevoked { revoked: id }))
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
    /// The MIG mode in effect.
    mig_enabled: bool,
    /// The MIG mode at the GPU's next reset; `null` for a GPU without MIG. Different from
    /// `mig_enabled`, the GPU takes no new booking until it is reset.
    mig_pending: Option<bool>,
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
pub(super) async fn agent_report(
    State(state): State<AppState>,
    NodeSecret(secret, meta): NodeSecret,
    Body(report): Body<NodeReport>,
) -> Result<Json<ReportReceiptBody>, Response> {
    let failed = agent_failure(meta.request_id.clone());
    let receipt = state.platform.report_node(&secret, &report, meta).await.map_err(failed)?;
    Ok(Json(ReportReceiptBody {
        node: receipt.node,
        gpus: report.gpus.len(),
        changes: receipt.changes,
        unexpected_gpus: receipt.unexpected,
    }))
}

/// An agent route's failure: without a working node token, a 401 that says which token is
/// wanted; otherwise the problem as every API route answers it.
fn agent_failure(request_id: String) -> impl FnOnce(Error) -> Response {
    move |error| match error {
        Error::Unauthenticated => node_unauthenticated(&request_id),
        error => ApiError { error, request_id }.into_response(),
    }
}

/// A bare-metal node's agent fetches what its node should hold (`--backend baremetal`).
#[utoipa::path(get, path = "/api/v1/agent/plan", tag = "agent",
    responses((status = 200, description = "The node's plan (`berth_domain::node_plan::NodePlan`)", body = Object)))]
pub(super) async fn agent_plan(
    State(state): State<AppState>,
    NodeSecret(secret, meta): NodeSecret,
) -> Result<Json<Value>, Response> {
    let failed = agent_failure(meta.request_id.clone());
    let plan = state.platform.node_plan(&secret, meta).await;
    Ok(Json(plan.and_then(|plan| serde_json::to_value(plan).map_err(Error::internal)).map_err(failed)?))
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
pub(super) async fn agent_plan_report(
    State(state): State<AppState>,
    NodeSecret(secret, meta): NodeSecret,
    Body(report): Body<PlanReport>,
) -> Result<Json<PlanAccepted>, Response> {
    let failed = agent_failure(meta.request_id.clone());
    let generation = report.generation;
    // Its own task: an agent that hangs up must not cut the write transaction short.
    let platform = state.platform.clone();
    let outcome = tokio::spawn(async move { platform.report_node_plan(&secret, &report, meta).await })
        .await
        .unwrap_or_else(|e| Err(Error::internal(e)));
    outcome.map_err(failed)?;
    Ok(Json(PlanAccepted { generation }))
}

/// What a bare-metal node's agent is asked to do (`berth_domain::node_checks::AgentOrder`):
/// a health check or a GPU reset, each with its own command, never a command line from the
/// portal.
#[derive(Serialize, ToSchema)]
pub struct AgentOrderBody {
    /// Answer it at `POST /api/v1/agent/checks/{id}`.
    id: i64,
    /// `check` or `reset_gpu`.
    #[schema(example = "check")]
    task: &'static str,
    /// The check (`check` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "gpu_diagnostics")]
    kind: Option<&'static str>,
    /// Its level (`check` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "quick")]
    level: Option<&'static str>,
    /// The node's GPUs, the NCCL test's `-g` (`check` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    gpus: Option<u32>,
    /// The GPU to reset (`reset_gpu` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu: Option<u32>,
}

impl From<AgentOrder> for AgentOrderBody {
    fn from(order: AgentOrder) -> AgentOrderBody {
        let none = AgentOrderBody { id: order.id, task: "check", kind: None, level: None, gpus: None, gpu: None };
        match order.task {
            NodeTask::Check { kind, level, gpus } => {
                AgentOrderBody { kind: Some(kind.as_str()), level: Some(level.as_str()), gpus: Some(gpus), ..none }
            }
            NodeTask::ResetGpu { gpu } => AgentOrderBody { task: "reset_gpu", gpu: Some(gpu), ..none },
        }
    }
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CheckOrdersQuery {
    /// `true` from an agent that has just started: the checks it took before and never
    /// answered are handed out again.
    resume: Option<bool>,
}

/// A bare-metal node's agent takes the checks and GPU resets ordered on its node (each is
/// handed out once, or again to an agent that has just started).
#[utoipa::path(get, path = "/api/v1/agent/checks", tag = "agent", params(CheckOrdersQuery),
    responses((status = 200, body = Vec<AgentOrderBody>)))]
pub(super) async fn agent_checks(
    State(state): State<AppState>,
    NodeSecret(secret, meta): NodeSecret,
    Query(query): Query<CheckOrdersQuery>,
) -> Result<Json<Vec<AgentOrderBody>>, Response> {
    let failed = agent_failure(meta.request_id.clone());
    let orders =
        state.platform.take_check_orders(&secret, query.resume.unwrap_or(false), meta).await.map_err(failed)?;
    Ok(Json(orders.into_iter().map(AgentOrderBody::from).collect()))
}

/// What a check printed, or why it could not run (`berth_domain::node_checks::CheckAnswer`).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct CheckAnswerBody {
    /// Its output whatever its exit status, at most 256 KiB (its end).
    #[schema(required = false)]
    output: String,
    /// Why it could not run at all; the output is then ignored.
    error: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct CheckAnswered {
    id: i64,
}

/// A bare-metal node's agent answers check order `id`. An answer to an order that was
/// closed already (answered, or out of time) changes nothing.
#[utoipa::path(post, path = "/api/v1/agent/checks/{id}", tag = "agent",
    params(("id" = i64, Path, description = "The check order's id")),
    request_body = CheckAnswerBody,
    responses((status = 200, body = CheckAnswered)))]
pub(super) async fn agent_check_answer(
    State(state): State<AppState>,
    NodeSecret(secret, meta): NodeSecret,
    Path(id): Path<String>,
    Body(answer): Body<CheckAnswer>,
) -> Result<Json<CheckAnswered>, Response> {
    let failed = agent_failure(meta.request_id.clone());
    // An id that is not a number names no order.
    let Ok(id) = id.parse::<i64>() else { return Err(failed(Error::NotFound)) };
    state.platform.answer_check(&secret, id, &answer, meta).await.map_err(failed)?;
    Ok(Json(CheckAnswered { id }))
}
