//! Node agents: the node tokens `berth agent` reports with, and what a report changes.
//!
//! A node token is made by a platform admin for one node of the fleet file; its secret is
//! shown once and only its SHA-256 is kept (256 random bits, as for API tokens). A report
//! records the agent's readings per GPU and turns them into GPU health by the rules of
//! `berth_domain::agent`, checked against the fleet file's model and GPU count.

use berth_domain::Refusal;
use berth_domain::agent::{self, GpuHealth, HealthSource, NodeReport, Verdict};
use berth_domain::gpu::GpuModel;
use berth_domain::policy::{Action, Target};
use sqlx::{Row, SqliteConnection};

use crate::audit::{self, Actor, Event, Outcome};
use crate::capacity::maintenance::{FleetSchedule, NodeFilter, nodes_on_page, schedule_of};
use crate::{Caller, Error, Platform, RequestMeta, now_ms, random_secret, sha256_hex};

/// The prefix of node token secrets: told apart at a glance from a person's `berth_…`.
pub const NODE_TOKEN_PREFIX: &str = "berth_node_";

/// A node of the fleet file and what its agent last said; never a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAgent {
    pub node: String,
    pub site: String,
    /// When its agent last reported, if ever.
    pub last_seen_at: Option<i64>,
    pub agent_version: Option<String>,
    /// Its tokens that still work, oldest first.
    pub tokens: Vec<NodeToken>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeToken {
    pub id: i64,
    pub node: String,
    pub created_at: i64,
    pub last_used_at: Option<i64>,
}

/// The node behind a node token.
pub(crate) struct AgentNode {
    pub token_id: i64,
    pub node_id: i64,
    pub node: String,
}

/// What a report changed, for the agent's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportReceipt {
    pub node: String,
    /// `gpu 3: failed: 2 uncorrected ECC errors`, one per GPU whose health changed, and
    /// `node: degraded: …` when a fatal XID degraded the node.
    pub changes: Vec<String>,
    /// Indices the node reports that the fleet file does not name; they are not booked.
    pub unexpected: Vec<i64>,
}

impl Platform {
    /// The node behind a node token; an unknown or revoked one is `Unauthenticated`, and
    /// audited as denied under `action`.
    pub(crate) async fn authenticate_node(
        &self,
        secret: &str,
        action: &str,
        meta: &RequestMeta,
    ) -> Result<AgentNode, Error> {
        let found: Option<(i64, i64, String)> = sqlx::query_as(
            "SELECT t.id, n.id, n.name FROM node_tokens t JOIN nodes n ON n.id = t.node_id
             WHERE t.secret_hash = ? AND t.revoked_at IS NULL AND n.in_service = 1",
        )
        .bind(sha256_hex(secret.trim()))
        .fetch_optional(&self.db)
        .await?;
        match found {
            Some((token_id, node_id, node)) => Ok(AgentNode { token_id, node_id, node }),
            None => {
                let mut conn = self.db.acquire().await?;
                let actor = Actor { user_id: None, tenant_id: None, meta };
                let event = Event {
                    action,
                    target: None,
                    outcome: Outcome::Denied,
                    detail: Some("unknown or revoked node token"),
                };
                audit::record(&mut conn, &actor, event).await?;
                Err(Error::Unauthenticated)
            }
        }
    }

    /// Makes a token for `node`'s agent; returns it with its secret, which is not kept.
    /// Platform admins only.
    pub async fn create_node_token(&self, caller: &Caller, node: &str) -> Result<(NodeToken, String), Error> {
        self.authorize(caller, Action::FleetManage, Target::Platform).await?;
        let secret = format!("{NODE_TOKEN_PREFIX}{}", random_secret());
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        let node_id: i64 = sqlx::query_scalar("SELECT id FROM nodes WHERE name = ? AND in_service = 1")
            .bind(node)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| Refusal::UnknownNode(node.to_owned()))?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO node_tokens (node_id, secret_hash, created_by, created_at) VALUES (?, ?, ?, ?) RETURNING id",
        )
        .bind(node_id)
        .bind(sha256_hex(&secret))
        .bind(caller.user_id())
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        let target = format!("node:{node}");
        let event =
            Event { action: "node_token.create", target: Some(&target), outcome: Outcome::Success, detail: None };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        Ok((NodeToken { id, node: node.to_owned(), created_at: now, last_used_at: None }, secret))
    }

    /// Stops a node token at once. Platform admins only. A token revoked already stays
    /// so, and nothing is written (a retried request, the page and the API both).
    pub async fn revoke_node_token(&self, caller: &Caller, id: i64) -> Result<(), Error> {
        self.authorize(caller, Action::FleetManage, Target::Platform).await?;
        let mut tx = self.begin_write().await?;
        let token: Option<(String, bool)> = sqlx::query_as(
            "SELECT n.name, t.revoked_at IS NOT NULL FROM node_tokens t JOIN nodes n ON n.id = t.node_id WHERE t.id = ?",
        )
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        let node = match token.ok_or(Error::NotFound)? {
            (_, true) => return Ok(()),
            (node, false) => node,
        };
        sqlx::query("UPDATE node_tokens SET revoked_at = ? WHERE id = ?")
            .bind(now_ms())
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let target = format!("node:{node}");
        let detail = format!("token {id}");
        let event = Event {
            action: "node_token.revoke",
            target: Some(&target),
            outcome: Outcome::Success,
            detail: Some(&detail),
        };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The fleet page's two parts in one read: the chart's page of nodes (as
    /// `fleet_schedule`) and those nodes' agents (as `node_agents`), the page looked up once
    /// on one connection. Platform staff only.
    pub async fn fleet_page(
        &self,
        caller: &Caller,
        from: i64,
        to: i64,
        filter: &NodeFilter,
    ) -> Result<(FleetSchedule, Vec<NodeAgent>), Error> {
        self.authorize(caller, Action::FleetRead, Target::Platform).await?;
        let mut conn = self.db.acquire().await?;
        let page = nodes_on_page(&mut conn, filter).await?;
        let node_ids = serde_json::to_string(&page.node_ids).map_err(Error::internal)?;
        let schedule = schedule_of(&mut conn, page, from, to).await?;
        // The chart has read the nodes' agent columns; only their tokens are left to read.
        let tokens = tokens_on(&mut conn, &node_ids).await?;
        let agents = schedule
            .nodes
            .iter()
            .map(|n| NodeAgent {
                node: n.node.clone(),
                site: n.site.clone(),
                last_seen_at: n.agent_seen_at,
                agent_version: n.agent_version.clone(),
                tokens: tokens.iter().filter(|t| t.node == n.node).cloned().collect(),
            })
            .collect();
        Ok((schedule, agents))
    }

    /// The nodes in service that `filter` picks (the fleet chart's page) with their agents'
    /// last reports and working tokens. Platform staff only.
    pub async fn node_agents(&self, caller: &Caller, filter: &NodeFilter) -> Result<Vec<NodeAgent>, Error> {
        self.authorize(caller, Action::FleetRead, Target::Platform).await?;
        let mut conn = self.db.acquire().await?;
        let page = nodes_on_page(&mut conn, filter).await?;
        agents_on(&mut conn, &page.node_ids).await
    }

    /// Records what a node's agent reports, in one transaction: when it was seen, each GPU's
    /// readings, and each GPU's health as `berth_domain::agent` decides it (a GPU the fleet
    /// file names but the report leaves out fails). Health changes are audited, and
    /// placement sees them at once. An unknown or revoked token is `Unauthenticated`, and
    /// audited as denied.
    pub async fn report_node(
        &self,
        secret: &str,
        report: &NodeReport,
        meta: RequestMeta,
    ) -> Result<ReportReceipt, Error> {
        let actor = Actor { user_id: None, tenant_id: None, meta: &meta };
        let AgentNode { token_id, node_id, node } = self.authenticate_node(secret, "agent.report", &meta).await?;
        report.validate()?;
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        sqlx::query("UPDATE node_tokens SET last_used_at = ? WHERE id = ?")
            .bind(now)
            .bind(token_id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("UPDATE nodes SET agent_seen_at = ?, agent_version = ? WHERE id = ?")
            .bind(now)
            .bind(&report.agent_version)
            .bind(node_id)
            .execute(&mut *tx)
            .await?;
        let gpus = sqlx::query(
            "SELECT id, idx, model, health, health_note, health_by FROM gpus WHERE node_id = ? AND in_service = 1
             ORDER BY idx",
        )
        .bind(node_id)
        .fetch_all(&mut *tx)
        .await?;
        let mut changes = Vec::new();
        let mut known = Vec::with_capacity(gpus.len());
        for row in &gpus {
            let (gpu_id, index): (i64, i64) = (row.try_get("id")?, row.try_get("idx")?);
            known.push(index);
            let model: String = row.try_get("model")?;
            let model = GpuModel::parse(&model)
                .ok_or_else(|| Error::internal(format!("GPU {node}/{index} has an unknown model {model}")))?;
            let verdict = match report.gpus.iter().find(|g| g.index == index) {
                Some(gpu) => {
                    for code in &gpu.xid_errors {
                        sqlx::query("INSERT INTO gpu_xid_errors (gpu_id, code, seen_at) VALUES (?, ?, ?)")
                            .bind(gpu_id)
                            .bind(i64::from(*code))
                            .bind(now)
                            .execute(&mut *tx)
                            .await?;
                    }
                    sqlx::query(
                        "UPDATE gpus SET uuid = ?, memory_mib = ?, mig_mode = ?, mig_instances = ?, ecc_uncorrected = ?,
                                temperature_c = ?, power_w = ?, utilization_pct = ? WHERE id = ?",
                    )
                    .bind(&gpu.uuid)
                    .bind(gpu.memory_mib)
                    .bind(gpu.mig_enabled)
                    .bind(gpu.mig_instances)
                    .bind(gpu.ecc_uncorrected)
                    .bind(gpu.temperature_c)
                    .bind(gpu.power_w)
                    .bind(gpu.utilization_pct)
                    .bind(gpu_id)
                    .execute(&mut *tx)
                    .await?;
                    agent::assess(gpu, model)
                }
                None => agent::missing(),
            };
            let health: String = row.try_get("health")?;
            let note: Option<String> = row.try_get("health_note")?;
            let source: String = row.try_get("health_by")?;
            let (Some(health), Some(source)) = (GpuHealth::parse(&health), HealthSource::parse(&source)) else {
                return Err(Error::internal(format!("GPU {node}/{index} has health {health} by {source}")));
            };
            let Some(Verdict { health, note }) =
                agent::next_health(health, note.as_deref().unwrap_or_default(), source, &verdict)
            else {
                continue;
            };
            sqlx::query("UPDATE gpus SET health = ?, health_note = ?, health_by = 'agent' WHERE id = ?")
                .bind(health.as_str())
                .bind((!note.is_empty()).then_some(&note))
                .bind(gpu_id)
                .execute(&mut *tx)
                .await?;
            let change =
                if note.is_empty() { health.as_str().to_owned() } else { format!("{}: {note}", health.as_str()) };
            let target = format!("gpu:{node}/{index}");
            let detail = format!("{change} (reported by the node's agent)");
            let event =
                Event { action: "gpu.health", target: Some(&target), outcome: Outcome::Success, detail: Some(&detail) };
            audit::record(&mut tx, &actor, event).await?;
            changes.push(format!("gpu {index}: {change}"));
        }
        // A fatal XID is the node's trouble, not only the GPU's (a GPU off the bus, an
        // uncontained ECC error): the node takes no new bookings until it is repaired.
        if let Some(reason) = agent::fatal_xid(report)
            && self.agent_fault(&mut tx, actor, &node, &reason).await?
        {
            changes.push(format!("node: degraded: {reason}"));
        }
        let unexpected: Vec<i64> = report.gpus.iter().map(|g| g.index).filter(|index| !known.contains(index)).collect();
        if !unexpected.is_empty() {
            tracing::warn!(request_id = %meta.request_id, %node, ?unexpected, "the node reports GPUs the fleet file does not name");
        }
        // Placement reads the fleet from memory: read it again with the new health.
        if changes.is_empty() {
            tx.commit().await?;
        } else {
            tx.commit_and(|| self.forget_fleet()).await?;
        }
        // The readings go to the telemetry store in a turn of their own: health above must
        // not wait for it, and a reading lost to an error here is only a gap in a chart.
        if let Err(e) = self.record_readings(&report.readings(&node, now)).await {
            tracing::error!(request_id = %meta.request_id, %node, error = %e, "cannot keep the node's GPU readings");
        }
        Ok(ReportReceipt { node, changes, unexpected })
    }
}

/// The agents of the nodes `node_ids` (a page of the fleet chart), by site and name.
pub(crate) async fn agents_on(conn: &mut SqliteConnection, node_ids: &[i64]) -> Result<Vec<NodeAgent>, Error> {
    let node_ids = serde_json::to_string(node_ids).map_err(Error::internal)?;
    let rows = sqlx::query(
        "SELECT n.name, s.name AS site, n.agent_seen_at, n.agent_version FROM nodes n
         JOIN sites s ON s.id = n.site_id WHERE n.id IN (SELECT value FROM json_each(?)) ORDER BY s.name, n.name",
    )
    .bind(&node_ids)
    .fetch_all(&mut *conn)
    .await?;
    let tokens = tokens_on(conn, &node_ids).await?;
    rows.iter()
        .map(|row| {
            let node: String = row.try_get("name")?;
            Ok(NodeAgent {
                tokens: tokens.iter().filter(|t| t.node == node).cloned().collect(),
                node,
                site: row.try_get("site")?,
                last_seen_at: row.try_get("agent_seen_at")?,
                agent_version: row.try_get("agent_version")?,
            })
        })
        .collect()
}

/// The tokens that still work of the nodes in `node_ids` (a JSON array), oldest first.
async fn tokens_on(conn: &mut SqliteConnection, node_ids: &str) -> Result<Vec<NodeToken>, Error> {
    sqlx::query(
        "SELECT t.id, n.name, t.created_at, t.last_used_at FROM node_tokens t
         JOIN nodes n ON n.id = t.node_id
         WHERE t.revoked_at IS NULL AND t.node_id IN (SELECT value FROM json_each(?)) ORDER BY t.created_at, t.id",
    )
    .bind(node_ids)
    .fetch_all(&mut *conn)
    .await?
    .iter()
    .map(|t| {
        Ok(NodeToken {
            id: t.try_get("id")?,
            node: t.try_get("name")?,
            created_at: t.try_get("created_at")?,
            last_used_at: t.try_get("last_used_at")?,
        })
    })
    .collect()
}
