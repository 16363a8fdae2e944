//! Bare-metal node plans held in the database: the parts each environment's steps record
//! per node, the plan of each node built from them (bumped to a new generation whenever it
//! changes), and what the node's agent fetches and reports.
//!
//! A node's plan is derived, never edited: its MIG layout is every environment's slices on
//! the node, its networks are the tenants with a part there (peers: the tenant's other
//! nodes), its workloads are the environments' containers, its accounts the dedicated
//! clusters' local accounts with the SSH keys of the people who may act in them (read when
//! the plan is built, so a key added or a member removed reaches the node with the next
//! plan: see [`refresh_access_plans`]). So a step that runs twice writes the same parts,
//! the plan does not change and nothing on the node moves.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use berth_domain::Refusal;
use berth_domain::fabric::IdentifierKind;
use berth_domain::host_network::{self, TenantAttachment, TenantSegment, tenant_address};
use berth_domain::mig::MigInstance;
use berth_domain::node_access::NodeAccount;
use berth_domain::node_plan::{ContainerNetwork, GpuMig, NodePlan, NodeWorkload, PlanReport, WorkloadStatus};
use berth_domain::policy::{Action, Principal, Role, Target};
use berth_domain::ssh_key::SshPublicKey;
use serde::{Deserialize, Serialize};
use sqlx::SqliteConnection;

use crate::people::USER_IS_ACTIVE;
use crate::{Error, Platform, RequestMeta, now_ms};

/// What a part of a node's plan is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PartKind {
    Mig,
    Network,
    Workload,
    /// A dedicated cluster's local account.
    Access,
}

impl PartKind {
    pub const ALL: [PartKind; 4] = [PartKind::Mig, PartKind::Network, PartKind::Workload, PartKind::Access];

    pub fn as_str(self) -> &'static str {
        match self {
            PartKind::Mig => "mig",
            PartKind::Network => "network",
            PartKind::Workload => "workload",
            PartKind::Access => "access",
        }
    }

    pub fn parse(s: &str) -> Option<PartKind> {
        PartKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// One MIG instance of an environment on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigSlice {
    pub gpu: u32,
    pub instance: MigInstance,
}

/// An environment's tenant attached to a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkPart {
    pub tenant: String,
    pub segment: TenantSegment,
}

/// A dedicated cluster's local account on a node; its keys are read when the plan is built.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessPart {
    pub account: String,
}

/// A change a step makes to its environment's part of one node's plan.
#[derive(Debug, Clone, PartialEq)]
pub enum PartWrite {
    Mig(Vec<MigSlice>),
    Network(NetworkPart),
    /// Written as is, replacing what was there.
    Workload(NodeWorkload),
    /// Written only when the environment has no workload part there yet: the pull step
    /// must not stop a workload a later step already started.
    WorkloadIfAbsent(NodeWorkload),
    /// Written as is, on its tenant's network: it keeps the address it has there, or gets
    /// the next free one (see `host_network::container_address`).
    WorkloadOnNetwork(NodeWorkload, NetworkPart),
    Access(AccessPart),
    Delete(PartKind),
}

/// A node's plan generation a step waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTarget {
    pub node_id: i64,
    pub node: String,
    pub generation: i64,
}

/// What a node's agent last said about its plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeProgress {
    pub node: String,
    pub reported_generation: i64,
    pub error: Option<String>,
    pub workloads: Vec<WorkloadStatus>,
}

impl Platform {
    /// Applies `writes` (node name and change) to `environment_id`'s parts in one
    /// transaction and rebuilds the plans they touch; the generation each named node must
    /// reach. With `delete_all`, every other part of the environment goes too.
    pub async fn write_node_parts(
        &self,
        environment_id: &str,
        writes: &[(String, PartWrite)],
        delete_all: bool,
    ) -> Result<Vec<NodeTarget>, Error> {
        let mut tx = self.begin_write().await?;
        let mut touched: BTreeSet<i64> = BTreeSet::new();
        let mut named: Vec<(i64, String)> = Vec::new();
        // Peers follow a tenant's nodes: a network part anywhere may change every node
        // of that tenant.
        let mut networks_changed = false;
        for (node, write) in writes {
            let node_id: i64 = sqlx::query_scalar("SELECT id FROM nodes WHERE name = ?")
                .bind(node)
                .fetch_optional(&mut *tx)
                .await?
                .ok_or_else(|| Refusal::UnknownNode(node.clone()))?;
            if !named.iter().any(|(id, _)| *id == node_id) {
                named.push((node_id, node.clone()));
            }
            touched.insert(node_id);
            let (kind, body) = match write {
                PartWrite::WorkloadOnNetwork(w, part) => {
                    let address = container_address(&mut tx, node_id, environment_id, part.segment).await?;
                    let network = ContainerNetwork { tenant: part.tenant.clone(), segment: part.segment, address };
                    (PartKind::Workload, Some(json(&NodeWorkload { network: Some(network), ..w.clone() })?))
                }
                PartWrite::Mig(slices) => (PartKind::Mig, Some(json(slices)?)),
                PartWrite::Network(part) => (PartKind::Network, Some(json(part)?)),
                PartWrite::Workload(w) | PartWrite::WorkloadIfAbsent(w) => (PartKind::Workload, Some(json(w)?)),
                PartWrite::Access(part) => (PartKind::Access, Some(json(part)?)),
                PartWrite::Delete(kind) => (*kind, None),
            };
            networks_changed |= kind == PartKind::Network;
            match body {
                Some(body) => {
                    let conflict = if matches!(write, PartWrite::WorkloadIfAbsent(_)) {
                        "DO NOTHING"
                    } else {
                        "DO UPDATE SET body = excluded.body"
                    };
                    sqlx::query(&format!(
                        "INSERT INTO node_plan_parts (node_id, environment_id, kind, body) VALUES (?, ?, ?, ?)
                         ON CONFLICT (node_id, environment_id, kind) {conflict}"
                    ))
                    .bind(node_id)
                    .bind(environment_id)
                    .bind(kind.as_str())
                    .bind(body)
                    .execute(&mut *tx)
                    .await?;
                }
                None => {
                    sqlx::query("DELETE FROM node_plan_parts WHERE node_id = ? AND environment_id = ? AND kind = ?")
                        .bind(node_id)
                        .bind(environment_id)
                        .bind(kind.as_str())
                        .execute(&mut *tx)
                        .await?;
                }
            }
        }
        if delete_all {
            let rest: Vec<(i64, String, String)> = sqlx::query_as(
                "SELECT p.node_id, n.name, p.kind FROM node_plan_parts p JOIN nodes n ON n.id = p.node_id
                 WHERE p.environment_id = ?",
            )
            .bind(environment_id)
            .fetch_all(&mut *tx)
            .await?;
            for (node_id, node, kind) in rest {
                touched.insert(node_id);
                networks_changed |= kind == "network";
                if !named.iter().any(|(id, _)| *id == node_id) {
                    named.push((node_id, node));
                }
            }
            sqlx::query("DELETE FROM node_plan_parts WHERE environment_id = ?")
                .bind(environment_id)
                .execute(&mut *tx)
                .await?;
        }
        if networks_changed {
            touched.extend(network_nodes(&mut tx).await?);
        }
        let now = now_ms();
        let mut generations = BTreeMap::new();
        for node_id in touched {
            generations.insert(node_id, refresh_plan(&mut tx, node_id, now).await?);
        }
        tx.commit().await?;
        Ok(named
            .into_iter()
            .map(|(node_id, node)| NodeTarget { node_id, node, generation: generations[&node_id] })
            .collect())
    }

    /// Every environment's part of every node's plan: (node, environment, kind), for the
    /// orphan sweep.
    pub async fn node_plan_parts(&self) -> Result<Vec<(String, String, PartKind)>, Error> {
        let rows: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT n.name, p.environment_id, p.kind FROM node_plan_parts p JOIN nodes n ON n.id = p.node_id
             ORDER BY n.name, p.environment_id, p.kind",
        )
        .fetch_all(&self.db)
        .await?;
        Ok(rows.into_iter().filter_map(|(node, env, kind)| Some((node, env, PartKind::parse(&kind)?))).collect())
    }

    /// What the agents of `targets`' nodes last reported.
    pub async fn node_progress(&self, targets: &[NodeTarget]) -> Result<Vec<NodeProgress>, Error> {
        let mut conn = self.db.acquire().await?;
        let mut result = Vec::new();
        for target in targets {
            let row: Option<(i64, Option<String>, String)> = sqlx::query_as(
                "SELECT reported_generation, reported_error, workloads FROM node_plans WHERE node_id = ?",
            )
            .bind(target.node_id)
            .fetch_optional(&mut *conn)
            .await?;
            let (reported_generation, error, workloads) = row.unwrap_or((0, None, "[]".into()));
            result.push(NodeProgress {
                node: target.node.clone(),
                reported_generation,
                error,
                workloads: serde_json::from_str(&workloads).map_err(Error::internal)?,
            });
        }
        Ok(result)
    }

    /// `environment_id`'s workloads, by node name.
    pub async fn environment_workloads(&self, environment_id: &str) -> Result<Vec<(String, NodeWorkload)>, Error> {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT n.name, p.body FROM node_plan_parts p JOIN nodes n ON n.id = p.node_id
             WHERE p.environment_id = ? AND p.kind = 'workload' ORDER BY n.name",
        )
        .bind(environment_id)
        .fetch_all(&self.db)
        .await?;
        rows.into_iter().map(|(node, body)| Ok((node, serde_json::from_str(&body).map_err(Error::internal)?))).collect()
    }

    /// Host ports the workloads of `node` use, other than `environment_id`'s.
    pub async fn host_ports_in_use(&self, node: &str, environment_id: &str) -> Result<Vec<u16>, Error> {
        let bodies: Vec<String> = sqlx::query_scalar(
            "SELECT p.body FROM node_plan_parts p JOIN nodes n ON n.id = p.node_id
             WHERE n.name = ? AND p.kind = 'workload' AND p.environment_id <> ?",
        )
        .bind(node)
        .bind(environment_id)
        .fetch_all(&self.db)
        .await?;
        let mut ports = Vec::new();
        for body in bodies {
            let w: NodeWorkload = serde_json::from_str(&body).map_err(Error::internal)?;
            ports.extend(w.host_port);
        }
        Ok(ports)
    }

    /// The network segment tenant `slug` holds, if any (hard and hybrid tenants).
    pub async fn tenant_segment(&self, slug: &str) -> Result<Option<TenantSegment>, Error> {
        let row: Option<(String, i64)> = sqlx::query_as(
            "SELECT l.kind, l.value FROM fabric_leases l JOIN tenants t ON t.id = l.tenant_id
             WHERE t.slug = ? AND l.kind IN ('vlan', 'vni') AND l.released_at IS NULL",
        )
        .bind(slug)
        .fetch_optional(&self.db)
        .await?;
        Ok(row.and_then(|(kind, value)| {
            TenantSegment::from_lease(IdentifierKind::parse(&kind)?, u32::try_from(value).ok()?)
        }))
    }

    /// The plan of the node behind `secret`, for its agent (generation 0 and empty when
    /// nothing was ever planned there).
    pub async fn node_plan(&self, secret: &str, meta: RequestMeta) -> Result<NodePlan, Error> {
        let agent = self.authenticate_node(secret, "agent.plan", &meta).await?;
        let row: Option<(i64, String)> = sqlx::query_as("SELECT generation, plan FROM node_plans WHERE node_id = ?")
            .bind(agent.node_id)
            .fetch_optional(&self.db)
            .await?;
        match row {
            Some((generation, plan)) => {
                let plan: NodePlan = serde_json::from_str(&plan).map_err(Error::internal)?;
                Ok(NodePlan { generation, ..plan })
            }
            None => Ok(NodePlan::default()),
        }
    }

    /// Records what the node's agent says about a plan generation: applied, or the error
    /// that stopped it, with its workloads and underlay address. A report on an older
    /// generation than the last one is stale and changes nothing; one on a generation the
    /// portal never planned is refused.
    pub async fn report_node_plan(&self, secret: &str, report: &PlanReport, meta: RequestMeta) -> Result<(), Error> {
        let agent = self.authenticate_node(secret, "agent.plan", &meta).await?;
        report.validate()?;
        let report = report.trimmed();
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        sqlx::query("UPDATE node_tokens SET last_used_at = ? WHERE id = ?")
            .bind(now)
            .bind(agent.token_id)
            .execute(&mut *tx)
            .await?;
        let planned: i64 = sqlx::query_scalar("SELECT coalesce(max(generation), 0) FROM node_plans WHERE node_id = ?")
            .bind(agent.node_id)
            .fetch_one(&mut *tx)
            .await?;
        if report.generation > planned {
            return Err(Refusal::InvalidReport(format!(
                "generation {} of {}'s plan does not exist (the latest is {planned})",
                report.generation, agent.node
            ))
            .into());
        }
        if planned > 0 {
            sqlx::query(
                "UPDATE node_plans SET reported_generation = ?, reported_error = ?, reported_at = ?, workloads = ?
                 WHERE node_id = ? AND reported_generation <= ?",
            )
            .bind(report.generation)
            .bind(&report.error)
            .bind(now)
            .bind(json(&report.workloads)?)
            .bind(agent.node_id)
            .bind(report.generation)
            .execute(&mut *tx)
            .await?;
        }
        let before: Option<String> = sqlx::query_scalar("SELECT underlay_address FROM nodes WHERE id = ?")
            .bind(agent.node_id)
            .fetch_one(&mut *tx)
            .await?;
        let after = report.underlay_address.map(|a| a.to_string());
        if after.is_some() && after != before {
            sqlx::query("UPDATE nodes SET underlay_address = ? WHERE id = ?")
                .bind(&after)
                .bind(agent.node_id)
                .execute(&mut *tx)
                .await?;
            // The node's peers tunnel to the new address from their next plan on.
            for node_id in network_nodes(&mut tx).await? {
                refresh_plan(&mut tx, node_id, now).await?;
            }
        }
        tx.commit().await?;
        if let Some(error) = &report.error {
            tracing::warn!(node = %agent.node, generation = report.generation, %error, "the node's agent could not apply its plan");
        }
        Ok(())
    }
}

fn json<T: Serialize>(value: &T) -> Result<String, Error> {
    serde_json::to_string(value).map_err(Error::internal)
}

/// Rebuilds the plans of every node that holds a dedicated cluster's account, whose keys
/// follow the people (their keys, roles, membership) rather than the environment's steps.
/// Called in the transaction of every such change, so access ends when it does.
pub(crate) async fn refresh_access_plans(conn: &mut SqliteConnection, now: i64) -> Result<(), Error> {
    let nodes: Vec<i64> = sqlx::query_scalar("SELECT DISTINCT node_id FROM node_plan_parts WHERE kind = 'access'")
        .fetch_all(&mut *conn)
        .await?;
    for node_id in nodes {
        refresh_plan(conn, node_id, now).await?;
    }
    Ok(())
}

/// The `authorized_keys` lines of the people who may act in `environment_id`: its owner
/// and whoever else `environment.connect` lets in (their tenant admins), while active.
async fn environment_keys(conn: &mut SqliteConnection, environment_id: &str) -> Result<Vec<String>, Error> {
    let Some((owner_id, tenant_id)): Option<(i64, Option<i64>)> =
        sqlx::query_as("SELECT owner_id, tenant_id FROM environments WHERE id = ?")
            .bind(environment_id)
            .fetch_optional(&mut *conn)
            .await?
    else {
        return Ok(Vec::new());
    };
    let rows: Vec<(i64, Option<i64>, String, String, String)> = sqlx::query_as(&format!(
        "SELECT u.id, u.tenant_id, u.role, k.public_key, k.name FROM ssh_keys k JOIN users u ON u.id = k.user_id
         WHERE k.removed_at IS NULL AND {USER_IS_ACTIVE} AND (u.id = ? OR u.tenant_id = ?) ORDER BY u.id, k.id"
    ))
    .bind(owner_id)
    .bind(tenant_id)
    .fetch_all(&mut *conn)
    .await?;
    let environment = Target::Owned { tenant_id, owner_id };
    let mut lines = Vec::new();
    for (user_id, user_tenant, role, public_key, name) in rows {
        let Some(role) = Role::parse(&role) else { continue };
        let person = Principal { user_id, tenant_id: user_tenant, role, token_actions: None };
        if person.authorize(Action::EnvironmentConnect, environment).is_err() {
            continue;
        }
        // Stored keys were checked when added; one that no longer reads is left out.
        match SshPublicKey::parse(&public_key) {
            Ok(key) => lines.push(key.authorized_line(&name)),
            Err(e) => tracing::error!(user_id, error = %e, "a stored SSH key does not read"),
        }
    }
    Ok(lines)
}

/// The address of `environment_id`'s container on `node_id` on `segment`: the one its
/// workload part has, or the next free one. The unique index on the parts' addresses
/// holds the rule should two writers ever race.
async fn container_address(
    conn: &mut SqliteConnection,
    node_id: i64,
    environment_id: &str,
    segment: TenantSegment,
) -> Result<Ipv4Addr, Error> {
    let body: Option<String> = sqlx::query_scalar(
        "SELECT body FROM node_plan_parts WHERE node_id = ? AND environment_id = ? AND kind = 'workload'",
    )
    .bind(node_id)
    .bind(environment_id)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(body) = body {
        let held: NodeWorkload = serde_json::from_str(&body).map_err(Error::internal)?;
        if let Some(network) = held.network.filter(|n| n.segment == segment) {
            return Ok(network.address);
        }
    }
    let (kind, id) = segment_key(segment);
    let taken: Vec<String> = sqlx::query_scalar(
        "SELECT json_extract(body, '$.network.address') FROM node_plan_parts
         WHERE kind = 'workload' AND json_extract(body, '$.network.segment.kind') = ?
           AND json_extract(body, '$.network.segment.id') = ?",
    )
    .bind(kind)
    .bind(id)
    .fetch_all(&mut *conn)
    .await?;
    let taken: Vec<Ipv4Addr> = taken.iter().filter_map(|a| a.parse().ok()).collect();
    let highest_node: i64 = sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM nodes").fetch_one(&mut *conn).await?;
    Ok(host_network::container_address(segment, highest_node, &taken)?)
}

/// How a segment is written in a part's JSON (`{"kind": "vlan", "id": 100}`).
fn segment_key(segment: TenantSegment) -> (&'static str, i64) {
    match segment {
        TenantSegment::Vlan(id) => ("vlan", i64::from(id)),
        TenantSegment::Vxlan(vni) => ("vxlan", i64::from(vni)),
    }
}

/// Every node with a network part.
async fn network_nodes(conn: &mut SqliteConnection) -> Result<Vec<i64>, Error> {
    Ok(sqlx::query_scalar("SELECT DISTINCT node_id FROM node_plan_parts WHERE kind = 'network'")
        .fetch_all(&mut *conn)
        .await?)
}

/// Rebuilds `node_id`'s plan from the parts; a new generation when it says something
/// else than before. Its generation (0 for a node never planned).
async fn refresh_plan(conn: &mut SqliteConnection, node_id: i64, now: i64) -> Result<i64, Error> {
    let plan = build_plan(conn, node_id).await?;
    let current: Option<(i64, String)> = sqlx::query_as("SELECT generation, plan FROM node_plans WHERE node_id = ?")
        .bind(node_id)
        .fetch_optional(&mut *conn)
        .await?;
    match current {
        None if plan == NodePlan::default() => Ok(0),
        None => {
            sqlx::query("INSERT INTO node_plans (node_id, generation, plan, changed_at) VALUES (?, 1, ?, ?)")
                .bind(node_id)
                .bind(json(&plan)?)
                .bind(now)
                .execute(&mut *conn)
                .await?;
            Ok(1)
        }
        Some((generation, stored)) => {
            let stored: NodePlan = serde_json::from_str(&stored).map_err(Error::internal)?;
            if stored.content_equals(&plan) {
                return Ok(generation);
            }
            sqlx::query("UPDATE node_plans SET generation = ?, plan = ?, changed_at = ? WHERE node_id = ?")
                .bind(generation + 1)
                .bind(json(&plan)?)
                .bind(now)
                .bind(node_id)
                .execute(&mut *conn)
                .await?;
            Ok(generation + 1)
        }
    }
}

/// The plan `node_id`'s parts add up to (generation 0: the caller numbers it).
async fn build_plan(conn: &mut SqliteConnection, node_id: i64) -> Result<NodePlan, Error> {
    let parts: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT environment_id, kind, body FROM node_plan_parts WHERE node_id = ? ORDER BY environment_id, kind",
    )
    .bind(node_id)
    .fetch_all(&mut *conn)
    .await?;
    let mut gpus: BTreeMap<u32, Vec<MigInstance>> = BTreeMap::new();
    let mut tenants: BTreeMap<String, TenantSegment> = BTreeMap::new();
    let mut workloads = Vec::new();
    let mut accounts = Vec::new();
    for (environment_id, kind, body) in parts {
        match kind.as_str() {
            "access" => {
                let part: AccessPart = serde_json::from_str(&body).map_err(Error::internal)?;
                let authorized_keys = environment_keys(conn, &environment_id).await?;
                accounts.push(NodeAccount { name: part.account, environment_id, authorized_keys });
            }
            "mig" => {
                let slices: Vec<MigSlice> = serde_json::from_str(&body).map_err(Error::internal)?;
                for slice in slices {
                    gpus.entry(slice.gpu).or_default().push(slice.instance);
                }
            }
            "network" => {
                let part: NetworkPart = serde_json::from_str(&body).map_err(Error::internal)?;
                tenants.insert(part.tenant, part.segment);
            }
            _ => {
                let workload: NodeWorkload = serde_json::from_str(&body).map_err(Error::internal)?;
                // A container on its tenant's network needs the network on the node, even
                // should its network part have gone first (the orphan sweep takes parts
                // one at a time).
                if let Some(network) = &workload.network {
                    tenants.entry(network.tenant.clone()).or_insert(network.segment);
                }
                workloads.push(workload);
            }
        }
    }
    let mut networks = Vec::new();
    for (tenant, segment) in tenants {
        let peers: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT n.underlay_address FROM node_plan_parts p JOIN nodes n ON n.id = p.node_id
             WHERE p.kind = 'network' AND json_extract(p.body, '$.tenant') = ? AND p.node_id <> ?
               AND n.underlay_address IS NOT NULL
             ORDER BY n.underlay_address",
        )
        .bind(&tenant)
        .bind(node_id)
        .fetch_all(&mut *conn)
        .await?;
        networks.push(TenantAttachment {
            address: tenant_address(segment, node_id)?,
            peers: peers.iter().filter_map(|p| p.parse::<Ipv4Addr>().ok()).collect(),
            tenant,
            segment,
        });
    }
    let mig = gpus
        .into_iter()
        .map(|(gpu, mut instances)| {
            instances.sort_by_key(|i| i.start);
            instances.dedup();
            GpuMig { gpu, instances }
        })
        .collect();
    let plan = NodePlan { generation: 0, mig, networks, workloads, accounts };
    // Placement never books overlapping slices; a plan that says otherwise is a bug here,
    // and must not reach a node.
    plan.validate().map_err(|e| Error::internal(format!("node {node_id}'s plan: {e}")))?;
    Ok(plan)
}
