//! The fleet for platform staff: nodes with their lifecycle state, GPUs and maintenance
//! windows; scheduling and cancelling maintenance.

use axum::Json;
use axum::extract::{Path, Query};
use axum::response::{IntoResponse, Response};
use berth_domain::Refusal;
use berth_platform::Error;
use berth_platform::capacity::maintenance::{AffectedBooking, MaintenanceWindow, NodeFilter, NodeSchedule};
use http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::{ApiError, Body, TokenCaller, fail, rfc3339, schema};

/// How far ahead a node's bookings and maintenance windows are listed: the fleet page's
/// longest view.
const AHEAD_MS: i64 = 31 * berth_domain::booking::DAY_MS;

/// Which nodes: those of a site, whose name has a part, a page of them.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct NodeQuery {
    /// A site's name; empty for every site.
    #[serde(default)]
    site: String,
    /// Part of a node's name; empty for every node.
    #[serde(default)]
    search: String,
    /// 16 nodes a page, from 1; below 1 is the first, past the last the last.
    page: Option<i64>,
}

impl NodeQuery {
    fn filter(&self) -> NodeFilter {
        let site = Some(self.site.trim().to_owned()).filter(|s| !s.is_empty());
        let page = usize::try_from(self.page.unwrap_or(1)).unwrap_or(0).max(1);
        NodeFilter { site, search: self.search.trim().to_owned(), page }
    }
}

#[derive(Serialize, ToSchema)]
pub struct NodeList {
    /// By site and name.
    nodes: Vec<NodeBody>,
    /// The page shown.
    page: usize,
    pages: usize,
    /// Nodes the filter matches, on every page.
    total_nodes: usize,
    /// Every site with nodes in service.
    sites: Vec<String>,
}

/// A node in service: its lifecycle state, GPUs, and what is booked and scheduled on it in
/// the next 31 days.
#[derive(Serialize, ToSchema)]
pub struct NodeBody {
    /// The node's name (the `{id}` of `/api/v1/nodes/{id}/…`).
    node: String,
    site: String,
    model: String,
    #[schema(schema_with = schema::node_state)]
    state: String,
    repair_tier: i64,
    /// The last state change: why, by whom (`null`: Berth or the fleet file), when.
    state_reason: Option<String>,
    state_by: Option<String>,
    #[schema(format = DateTime)]
    state_at: Option<String>,
    /// Its NVLink domain when it spans several nodes.
    nvlink_domain: Option<String>,
    /// Its InfiniBand scalable unit.
    ib_unit: Option<String>,
    gpus: Vec<NodeGpuBody>,
    maintenance: Vec<MaintenanceBody>,
}

#[derive(Serialize, ToSchema)]
pub struct NodeGpuBody {
    index: i64,
    mig_capable: bool,
    /// 1, or how many ways it is time-sliced.
    time_slices: i64,
    /// `healthy`, `degraded` or `failed`.
    health: String,
    health_note: Option<String>,
    ib_rail: Option<i64>,
    bookings: Vec<NodeBookingBody>,
}

#[derive(Serialize, ToSchema)]
pub struct NodeBookingBody {
    /// The environment's id.
    environment: String,
    name: String,
    /// The owner's email.
    owner: String,
    #[schema(schema_with = schema::environment_state)]
    state: String,
    /// The MIG profile (`3g.40gb`); `null` for the whole GPU or a share of it.
    mig_profile: Option<String>,
    #[schema(format = DateTime)]
    starts_at: String,
    #[schema(format = DateTime)]
    ends_at: String,
}

/// A maintenance window: a node (or one GPU of it) out of booking.
#[derive(Serialize, ToSchema)]
pub struct MaintenanceBody {
    id: i64,
    site: String,
    node: String,
    /// One GPU of the node; `null` for all of it.
    gpu: Option<i64>,
    #[schema(format = DateTime)]
    starts_at: String,
    #[schema(format = DateTime)]
    ends_at: String,
    reason: String,
}

fn maintenance_body(w: MaintenanceWindow) -> MaintenanceBody {
    MaintenanceBody {
        id: w.id,
        site: w.site,
        node: w.node,
        gpu: w.gpu_index,
        starts_at: rfc3339(w.starts_at),
        ends_at: rfc3339(w.ends_at),
        reason: w.reason,
    }
}

fn node_body(n: NodeSchedule) -> NodeBody {
    let gpus = n
        .gpus
        .into_iter()
        .map(|g| NodeGpuBody {
            index: g.index,
            mig_capable: g.mig_capable,
            time_slices: g.time_slices,
            health: g.health,
            health_note: g.health_note,
            ib_rail: g.ib_rail,
            bookings: g
                .bookings
                .into_iter()
                .map(|b| NodeBookingBody {
                    environment: b.environment_id,
                    name: b.name,
                    owner: b.owner_email,
                    state: b.state,
                    mig_profile: b.mig_profile,
                    starts_at: rfc3339(b.starts_at),
                    ends_at: rfc3339(b.ends_at),
                })
                .collect(),
        })
        .collect();
    NodeBody {
        node: n.node,
        site: n.site,
        model: n.model,
        state: n.state,
        repair_tier: n.repair_tier,
        state_reason: n.state_reason,
        state_by: n.state_by,
        state_at: n.state_at.map(rfc3339),
        nvlink_domain: n.nvlink_domain,
        ib_unit: n.ib_unit,
        gpus,
        maintenance: n.maintenance.into_iter().map(maintenance_body).collect(),
    }
}

/// The nodes in service (platform staff), a page at a time: each one's lifecycle state,
/// GPUs with their health and bookings, and maintenance windows, over the next 31 days.
#[utoipa::path(get, path = "/api/v1/nodes", tag = "nodes", params(NodeQuery),
    responses((status = 200, body = NodeList)))]
pub(super) async fn nodes(
    TokenCaller(platform, caller): TokenCaller,
    Query(query): Query<NodeQuery>,
) -> Result<Json<NodeList>, ApiError> {
    let now = berth_platform::now_ms();
    let schedule =
        platform.fleet_schedule(&caller, now, now + AHEAD_MS, &query.filter()).await.map_err(fail(&caller))?;
    Ok(Json(NodeList {
        nodes: schedule.nodes.into_iter().map(node_body).collect(),
        page: schedule.page,
        pages: schedule.pages,
        total_nodes: schedule.total_nodes,
        sites: schedule.sites,
    }))
}

/// `{"node": "fra1-h100-01", "gpu": 3, "start": "2026-12-01 08:00", "end": "2026-12-01 12:00",
/// "reason": "firmware"}`: UTC times as the launch reads them.
#[derive(Deserialize, ToSchema)]
pub struct NewMaintenance {
    /// The node's name.
    node: String,
    /// One GPU of the node; absent or `null` for all of it.
    #[serde(default)]
    gpu: Option<i64>,
    /// Empty or absent: now.
    #[serde(default)]
    start: String,
    end: String,
    /// Why, in a line (at most 200 characters): the owners of bookings it overlaps are told.
    reason: String,
}

/// A new maintenance window and the bookings it overlaps (their owners are notified).
#[derive(Serialize, ToSchema)]
pub struct ScheduledMaintenance {
    window: MaintenanceBody,
    affected: Vec<AffectedBody>,
}

#[derive(Serialize, ToSchema)]
pub struct AffectedBody {
    /// The environment's id.
    environment: String,
    name: String,
    /// The owner's email.
    owner: String,
    #[schema(format = DateTime)]
    starts_at: String,
    #[schema(format = DateTime)]
    ends_at: String,
}

impl From<AffectedBooking> for AffectedBody {
    fn from(b: AffectedBooking) -> AffectedBody {
        AffectedBody {
            environment: b.environment_id,
            name: b.name,
            owner: b.owner_email,
            starts_at: rfc3339(b.starts_at),
            ends_at: rfc3339(b.ends_at),
        }
    }
}

/// Takes a node (or one GPU of it) out of booking for a window (platform admins): new
/// bookings there are refused; the owners of bookings it overlaps are told to rebook.
#[utoipa::path(post, path = "/api/v1/maintenance", tag = "nodes", request_body = NewMaintenance,
    responses((status = 201, description = "Scheduled", body = ScheduledMaintenance)))]
pub(super) async fn schedule_maintenance(
    TokenCaller(platform, caller): TokenCaller,
    Body(asked): Body<NewMaintenance>,
) -> Response {
    let scheduled =
        platform.schedule_maintenance(&caller, &asked.node, asked.gpu, &asked.start, &asked.end, &asked.reason).await;
    match scheduled {
        Ok((window, affected)) => {
            let affected = affected.into_iter().map(AffectedBody::from).collect();
            let body = ScheduledMaintenance { window: maintenance_body(window), affected };
            (StatusCode::CREATED, Json(body)).into_response()
        }
        Err(e) => fail(&caller)(e).into_response(),
    }
}

/// `{"health": "degraded", "note": "fan noise"}`.
#[derive(Deserialize, ToSchema)]
pub struct GpuHealthMark {
    /// `healthy`, `degraded` (takes no new bookings) or `failed`.
    #[schema(example = "degraded")]
    health: String,
    /// Why, in a line (at most 200 characters); empty or absent for none.
    #[serde(default)]
    note: String,
}

/// A GPU's health as a platform admin marked it, and the bookings on it from now on
/// (their owners are told when it is degraded or failed).
#[derive(Serialize, ToSchema)]
pub struct GpuHealthMarked {
    node: String,
    gpu: i64,
    health: String,
    affected: Vec<AffectedBody>,
}

/// A platform admin marks one GPU's health, as the fleet page does: a degraded or failed
/// mark takes it out of new bookings and stays until an admin changes it (the node's agent
/// does not overrule it).
#[utoipa::path(put, path = "/api/v1/nodes/{id}/gpus/{gpu}/health", tag = "nodes",
    params(("id" = String, Path, description = "The node's name"),
           ("gpu" = i64, Path, description = "The GPU's index on the node")),
    request_body = GpuHealthMark,
    responses((status = 200, body = GpuHealthMarked)))]
pub(super) async fn mark_gpu_health(
    TokenCaller(platform, caller): TokenCaller,
    Path((node, gpu)): Path<(String, String)>,
    Body(mark): Body<GpuHealthMark>,
) -> Result<Json<GpuHealthMarked>, ApiError> {
    // An index that is not a number names no GPU; the path's node or GPU missing is not found.
    let Ok(gpu) = gpu.parse::<i64>() else { return Err(fail(&caller)(Error::NotFound)) };
    let affected = platform
        .set_gpu_health(&caller, &node, gpu, mark.health.trim(), &mark.note)
        .await
        .map_err(|e| match e {
            Error::Refused(Refusal::UnknownGpu { .. } | Refusal::UnknownNode(_)) => Error::NotFound,
            other => other,
        })
        .map_err(fail(&caller))?;
    let affected = affected.into_iter().map(AffectedBody::from).collect();
    Ok(Json(GpuHealthMarked { node, gpu, health: mark.health.trim().to_owned(), affected }))
}

#[derive(Serialize, ToSchema)]
pub struct MaintenanceCancelled {
    /// The window's id.
    cancelled: i64,
}

/// Ends a maintenance window early, or calls it off (platform admins). One cancelled
/// already is not found.
#[utoipa::path(delete, path = "/api/v1/maintenance/{id}", tag = "nodes",
    params(("id" = i64, Path, description = "The maintenance window's id")),
    responses((status = 200, body = MaintenanceCancelled)))]
pub(super) async fn cancel_maintenance(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<i64>,
) -> Result<Json<MaintenanceCancelled>, ApiError> {
    platform.cancel_maintenance(&caller, id).await.map_err(fail(&caller))?;
    Ok(Json(MaintenanceCancelled { cancelled: id }))
}

/// A node's agent: when it last reported, and the node tokens that still work.
#[derive(Serialize, ToSchema)]
pub struct NodeAgentBody {
    node: String,
    site: String,
    /// `null`: it never reported.
    #[schema(format = DateTime)]
    last_seen_at: Option<String>,
    agent_version: Option<String>,
    /// Oldest first; `DELETE /api/v1/node-tokens/{id}` revokes one.
    tokens: Vec<NodeTokenBody>,
}

#[derive(Serialize, ToSchema)]
pub struct NodeTokenBody {
    id: i64,
    #[schema(format = DateTime)]
    created_at: String,
    #[schema(format = DateTime)]
    last_used_at: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct NodeAgentList {
    /// The nodes of the page `GET /api/v1/nodes` shows for the same query.
    agents: Vec<NodeAgentBody>,
}

/// The node agents of a page of the fleet (as `GET /api/v1/nodes` pages it): their last
/// reports and working tokens. Platform staff.
#[utoipa::path(get, path = "/api/v1/node-agents", tag = "fleet", params(NodeQuery),
    responses((status = 200, body = NodeAgentList)))]
pub(super) async fn node_agents(
    TokenCaller(platform, caller): TokenCaller,
    Query(query): Query<NodeQuery>,
) -> Result<Json<NodeAgentList>, ApiError> {
    let agents = platform.node_agents(&caller, &query.filter()).await.map_err(fail(&caller))?;
    let agents = agents
        .into_iter()
        .map(|a| NodeAgentBody {
            node: a.node,
            site: a.site,
            last_seen_at: a.last_seen_at.map(rfc3339),
            agent_version: a.agent_version,
            tokens: a
                .tokens
                .into_iter()
                .map(|t| NodeTokenBody {
                    id: t.id,
                    created_at: rfc3339(t.created_at),
                    last_used_at: t.last_used_at.map(rfc3339),
                })
                .collect(),
        })
        .collect();
    Ok(Json(NodeAgentList { agents }))
}
