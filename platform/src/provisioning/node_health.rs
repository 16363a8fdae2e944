//! Nodes' health lifecycle (`domain::node_health`): acceptance and on-demand checks run
//! through the backend, repairs up the operator's tiers, and every state change with who
//! and why, audited.
//!
//! Each change of state is one write transaction: the node's row, a `node_state_changes`
//! row (a trigger holds it to the node's new state) and an audit row. Checks run between
//! two transactions, with no write turn held: the node is `testing` meanwhile, so placement
//! (which offers only `available` nodes, `capacity::fleet`) gives it nothing new.
//!
//! Lives in provisioning because checks and repairs run on the backend; capacity reads
//! the state this module writes.

use berth_domain::Refusal;
use berth_domain::gpu::GpuModel;
use berth_domain::node_checks::{self, CheckLevel, Interconnect};
use berth_domain::node_health::{NodeEvent, NodeState, NodeStatus, next_status};
use berth_domain::notification::Notice;
use berth_domain::policy::{Action, Target};
use sqlx::{Row, SqliteConnection};

use super::backend::CheckedNode;
use super::telemetry::{XidError, xid_errors};
use crate::audit::{self, Actor, Event, Outcome};
use crate::{Caller, Error, Platform, now_ms};

/// The level acceptance runs at after a repair.
pub const ACCEPTANCE_AFTER_REPAIR: CheckLevel = CheckLevel::Medium;
/// InfiniBand rate every port must reach (NDR), Gb/s.
const INFINIBAND_RATE: u32 = 400;

/// A node's health as the fleet page and the API show it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeHealth {
    pub node: String,
    pub site: String,
    pub model: GpuModel,
    pub gpus: u32,
    pub status: NodeStatus,
    /// The name of the repair tier in progress (in repair) or last tried.
    pub tier_name: Option<String>,
    /// The command of the tier in progress where the backend does not run it: a person
    /// runs it on the node and marks the repair done or failed.
    pub tier_command_by_hand: Option<String>,
    pub tiers: u32,
    /// Unreleased bookings on the node now.
    pub bookings_now: i64,
    /// Newest first.
    pub changes: Vec<NodeStateChange>,
    /// Newest first, the last 20.
    pub runs: Vec<CheckRun>,
    /// XID errors its agent reported in the last 7 days, newest first (the last 50).
    pub xid_errors: Vec<XidError>,
    /// Each GPU's health and MIG mode, by index.
    pub gpu_states: Vec<GpuState>,
}

/// One GPU of a node as its agent (or an admin) last left it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuState {
    pub index: u32,
    /// `healthy`, `degraded` or `failed`.
    pub health: String,
    /// Why it is not healthy ("MIG mode is off until a GPU reset turns it on: …").
    pub note: Option<String>,
    /// The MIG mode in effect as the agent last reported it (`None` before a report).
    pub mig_mode: Option<bool>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct NodeStateChange {
    pub from: NodeState,
    pub to: NodeState,
    pub tier: u32,
    pub event: String,
    pub reason: String,
    /// The person's email; `None` when Berth itself moved the node.
    pub by: Option<String>,
    pub at: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CheckRun {
    pub id: i64,
    pub level: String,
    /// `acceptance` or `on_demand`.
    pub purpose: String,
    pub requested_by: Option<String>,
    pub started_at: i64,
    pub finished_at: Option<i64>,
    pub passed: Option<bool>,
    pub results: Vec<CheckResult>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CheckResult {
    pub kind: String,
    pub passed: bool,
    pub measured: Option<f64>,
    pub threshold: Option<f64>,
    pub unit: String,
    pub summary: String,
    pub command: String,
    pub raw_output: String,
}

/// A node's row, as the lifecycle needs it.
#[derive(Clone)]
pub(super) struct NodeRow {
    pub(super) id: i64,
    pub(super) name: String,
    pub(super) site: String,
    pub(super) model: GpuModel,
    pub(super) gpus: u32,
    pub(super) nvlink: bool,
    pub(super) infiniband: bool,
    pub(super) status: NodeStatus,
}

pub(super) async fn node_row(conn: &mut SqliteConnection, name: &str) -> Result<Option<NodeRow>, Error> {
    let Some(row) = sqlx::query(
        "SELECT n.id, n.name, s.name AS site, n.gpu_model, n.nvlink_domain IS NOT NULL AS nvlink,
                n.ib_unit IS NOT NULL AS infiniband, n.state, n.repair_tier,
                (SELECT count(*) FROM gpus g WHERE g.node_id = n.id AND g.in_service = 1) AS gpus
         FROM nodes n JOIN sites s ON s.id = n.site_id WHERE n.name = ? AND n.in_service = 1",
    )
    .bind(name)
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(None);
    };
    let model: String = row.try_get("gpu_model")?;
    let state: String = row.try_get("state")?;
    Ok(Some(NodeRow {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        site: row.try_get("site")?,
        model: GpuModel::parse(&model).ok_or_else(|| Error::internal(format!("unknown model {model}")))?,
        gpus: u32::try_from(row.try_get::<i64, _>("gpus")?).unwrap_or(0),
        nvlink: row.try_get("nvlink")?,
        infiniband: row.try_get("infiniband")?,
        status: NodeStatus {
            state: NodeState::parse(&state).ok_or_else(|| Error::internal(format!("unknown node state {state}")))?,
            tier: u32::try_from(row.try_get::<i64, _>("repair_tier")?).unwrap_or(0),
        },
    }))
}

/// Who holds the node now: `None` when nobody; `Some(Some(tenant))` when only that
/// tenant's dedicated clusters do; `Some(None)` when anything else does.
pub(super) async fn holder(conn: &mut SqliteConnection, node_id: i64, now: i64) -> Result<Option<Option<i64>>, Error> {
    let rows = sqlx::query(
        "SELECT DISTINCT e.tenant_id, e.offering FROM reservations r
         JOIN gpus g ON g.id = r.gpu_id JOIN environments e ON e.id = r.environment_id
         WHERE g.node_id = ? AND r.released_at IS NULL AND r.starts_at <= ? AND r.ends_at > ?",
    )
    .bind(node_id)
    .bind(now)
    .bind(now)
    .fetch_all(&mut *conn)
    .await?;
    if rows.is_empty() {
        return Ok(None);
    }
    let mut tenants = Vec::new();
    for row in rows {
        let offering: String = row.try_get("offering")?;
        let tenant: Option<i64> = row.try_get("tenant_id")?;
        match tenant {
            Some(t) if offering == "cluster" => tenants.push(t),
            _ => return Ok(Some(None)),
        }
    }
    tenants.dedup();
    Ok(Some((tenants.len() == 1).then(|| tenants[0])))
}

/// How long a GPU must stay free of bookings for a reset: an agent takes the order within
/// its plan interval and the reset takes seconds, so a booking starting meanwhile is not
/// hit.
pub const RESET_CLEAR_MS: i64 = 10 * 60 * 1000;

/// Who moves a node: the audit row's actor, and the person the change row names (`None`
/// when Berth itself moves it: a check's verdict, a repair command's end, an agent's XID).
pub(super) struct Mover<'a> {
    pub(super) actor: Actor<'a>,
    pub(super) person: Option<i64>,
}

impl Mover<'_> {
    pub(super) fn person(caller: &Caller) -> Mover<'_> {
        Mover { actor: caller.actor(), person: Some(caller.user_id()) }
    }

    /// Berth, on a person's behalf (audited as them, as the change they started).
    fn berth_for(caller: &Caller) -> Mover<'_> {
        Mover { actor: caller.actor(), person: None }
    }
}

/// Moves node `node_id` by `event` inside `tx`, writing the node, its change row and an
/// audit row; refuses a move the lifecycle does not allow (reading the state in `tx`, so
/// two writers cannot both move from the same state). Platform admins are told; so are the
/// owners of what the node holds when it becomes degraded.
pub(super) async fn transition(
    platform: &Platform,
    tx: &mut SqliteConnection,
    mover: &Mover<'_>,
    node: &NodeRow,
    event: NodeEvent,
    reason: &str,
) -> Result<NodeStatus, Error> {
    let tiers = platform.tiers();
    let state: String =
        sqlx::query_scalar("SELECT state FROM nodes WHERE id = ?").bind(node.id).fetch_one(&mut *tx).await?;
    let tier: i64 =
        sqlx::query_scalar("SELECT repair_tier FROM nodes WHERE id = ?").bind(node.id).fetch_one(&mut *tx).await?;
    let from = NodeStatus {
        state: NodeState::parse(&state).ok_or_else(|| Error::internal(format!("unknown node state {state}")))?,
        tier: u32::try_from(tier).unwrap_or(0),
    };
    let to = next_status(from, event, tiers)?;
    let now = now_ms();
    sqlx::query("UPDATE nodes SET state = ?, repair_tier = ? WHERE id = ?")
        .bind(to.state.as_str())
        .bind(i64::from(to.tier))
        .bind(node.id)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO node_state_changes (node_id, from_state, to_state, repair_tier, event, reason, changed_by, changed_at)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(node.id)
    .bind(from.state.as_str())
    .bind(to.state.as_str())
    .bind(i64::from(to.tier))
    .bind(event.as_str())
    .bind(reason)
    .bind(mover.person)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    let target = format!("node:{}", node.name);
    let detail = format!("{} -> {}{}: {reason}", from.state.as_str(), to.state.as_str(), tier_note(to));
    let event = Event { action: "node.state", target: Some(&target), outcome: Outcome::Success, detail: Some(&detail) };
    audit::record(&mut *tx, &mover.actor, event).await?;
    // Platform admins hear of it in the same transaction.
    let admins = crate::notifications::platform_admins(&mut *tx).await?;
    let notice = Notice::node_health(&node.name, from.state.as_str(), to.state.as_str(), reason);
    platform.notify(tx, None, &admins, &notice).await?;
    if to.state == NodeState::Degraded && from.state != NodeState::Degraded {
        tell_owners_of_degraded(platform, tx, node, reason, now).await?;
    }
    Ok(to)
}

/// Tells each owner of an environment the node holds now (or has booked later) that it
/// became degraded, once, naming all their environments there.
async fn tell_owners_of_degraded(
    platform: &Platform,
    tx: &mut SqliteConnection,
    node: &NodeRow,
    reason: &str,
    now: i64,
) -> Result<(), Error> {
    let held: Vec<(i64, Option<i64>, String, String)> = sqlx::query_as(
        "SELECT DISTINCT e.owner_id, e.tenant_id, e.id, e.name FROM reservations r
         JOIN gpus g ON g.id = r.gpu_id JOIN environments e ON e.id = r.environment_id
         WHERE g.node_id = ? AND r.released_at IS NULL AND r.ends_at > ?
           AND e.state NOT IN ('released', 'failed')
         ORDER BY e.owner_id, e.name",
    )
    .bind(node.id)
    .bind(now)
    .fetch_all(&mut *tx)
    .await?;
    // Each owner (with the tenant the notice is in) and their environments: (id, name).
    type Owner = (i64, Option<i64>);
    let mut owners: std::collections::BTreeMap<Owner, Vec<(String, String)>> = Default::default();
    for (owner, tenant, id, name) in held {
        owners.entry((owner, tenant)).or_default().push((id, name));
    }
    for ((owner, tenant), environments) in owners {
        let notice = Notice::node_degraded(&node.name, reason, &environments);
        platform.notify(tx, tenant, &[owner], &notice).await?;
    }
    Ok(())
}

fn tier_note(status: NodeStatus) -> String {
    if status.state == NodeState::InRepair { format!(" (tier {})", status.tier) } else { String::new() }
}

/// A reason as people give it: trimmed, 1 to 500 characters.
fn reason_of(text: &str) -> Result<&str, Error> {
    let text = text.trim();
    if text.is_empty() {
        return Err(Refusal::InvalidReason("say why the node changes state").into());
    }
    if text.chars().count() > 500 {
        return Err(Refusal::InvalidReason("must be at most 500 characters").into());
    }
    Ok(text)
}

impl Platform {
    fn tiers(&self) -> u32 {
        u32::try_from(self.repair_tiers.len()).unwrap_or(u32::MAX)
    }

    pub(super) fn checked_node(&self, node: &NodeRow) -> CheckedNode {
        CheckedNode {
            name: node.name.clone(),
            model: node.model,
            gpus: node.gpus,
            expected_bus_bandwidth: self.bandwidth.expected(&node.site, node.model, interconnect(node)),
            infiniband_rate: INFINIBAND_RATE,
        }
    }

    /// One node's state, its changes and its check runs. Platform staff only.
    pub async fn node_health(&self, caller: &Caller, name: &str) -> Result<NodeHealth, Error> {
        self.authorize(caller, Action::FleetRead, Target::Platform).await?;
        self.read_node_health(name).await
    }

    /// A fatal fault the node's agent reported (a fatal XID), inside the report's
    /// transaction: an available or draining node becomes degraded. A node in any other state
    /// takes no new bookings already and stays as it is. Whether the node moved.
    pub(crate) async fn agent_fault(
        &self,
        tx: &mut SqliteConnection,
        actor: Actor<'_>,
        node: &str,
        reason: &str,
    ) -> Result<bool, Error> {
        let Some(row) = node_row(tx, node).await? else { return Ok(false) };
        if !matches!(row.status.state, NodeState::Available | NodeState::Draining) {
            return Ok(false);
        }
        transition(self, tx, &Mover { actor, person: None }, &row, NodeEvent::Fault, reason).await?;
        Ok(true)
    }

    /// At start, before anyone can run checks: a node left `testing` had its checks cut
    /// short when Berth stopped (checks run in the process; nothing of them survives it).
    /// It fails its acceptance, so it is degraded and a person repairs or retires it, and
    /// its history says why. Runs left open (on demand too) are closed as failed, with no
    /// results. The nodes moved.
    pub async fn end_interrupted_checks(&self) -> Result<Vec<String>, Error> {
        let mut tx = self.begin_write().await?;
        sqlx::query("UPDATE node_check_runs SET finished_at = ?, passed = 0 WHERE finished_at IS NULL")
            .bind(now_ms())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        let names: Vec<String> =
            sqlx::query_scalar("SELECT name FROM nodes WHERE state = 'testing' AND in_service = 1 ORDER BY name")
                .fetch_all(&self.db)
                .await?;
        let mover = Mover { actor: Actor::background(None), person: None };
        let why = "its acceptance checks were cut short: Berth stopped while they ran; repair it to run them again";
        for name in &names {
            let mut tx = self.begin_write().await?;
            let Some(node) = node_row(&mut tx, name).await? else { continue };
            if node.status.state == NodeState::Testing {
                transition(self, &mut tx, &mover, &node, NodeEvent::AcceptanceFailed, why).await?;
            }
            tx.commit_and(|| self.forget_fleet()).await?;
            tracing::warn!(node = %name, "acceptance was cut short when Berth stopped: the node is degraded");
        }
        Ok(names)
    }

    async fn read_node_health(&self, name: &str) -> Result<NodeHealth, Error> {
        let mut conn = self.db.acquire().await?;
        let node = node_row(&mut conn, name).await?.ok_or(Error::NotFound)?;
        let bookings_now: i64 = sqlx::query_scalar(
            "SELECT count(DISTINCT r.environment_id) FROM reservations r JOIN gpus g ON g.id = r.gpu_id
             WHERE g.node_id = ? AND r.released_at IS NULL AND r.starts_at <= ?2 AND r.ends_at > ?2",
        )
        .bind(node.id)
        .bind(now_ms())
        .fetch_one(&mut *conn)
        .await?;
        let changes = sqlx::query(
            "SELECT c.from_state, c.to_state, c.repair_tier, c.event, c.reason, u.email, c.changed_at
             FROM node_state_changes c LEFT JOIN users u ON u.id = c.changed_by
             WHERE c.node_id = ? ORDER BY c.id DESC LIMIT 50",
        )
        .bind(node.id)
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .map(|row| {
            let state = |column: &str| -> Result<NodeState, Error> {
                let text: String = row.try_get(column)?;
                NodeState::parse(&text).ok_or_else(|| Error::internal(format!("unknown node state {text}")))
            };
            Ok(NodeStateChange {
                from: state("from_state")?,
                to: state("to_state")?,
                tier: u32::try_from(row.try_get::<i64, _>("repair_tier")?).unwrap_or(0),
                event: row.try_get("event")?,
                reason: row.try_get("reason")?,
                by: row.try_get("email")?,
                at: row.try_get("changed_at")?,
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
        let mut runs = Vec::new();
        let run_rows = sqlx::query(
            "SELECT r.id, r.level, r.purpose, u.email, r.started_at, r.finished_at, r.passed
             FROM node_check_runs r LEFT JOIN users u ON u.id = r.requested_by
             WHERE r.node_id = ? ORDER BY r.id DESC LIMIT 20",
        )
        .bind(node.id)
        .fetch_all(&mut *conn)
        .await?;
        for row in run_rows {
            let id: i64 = row.try_get("id")?;
            runs.push(CheckRun {
                id,
                level: row.try_get("level")?,
                purpose: row.try_get("purpose")?,
                requested_by: row.try_get("email")?,
                started_at: row.try_get("started_at")?,
                finished_at: row.try_get("finished_at")?,
                passed: row.try_get("passed")?,
                results: check_results(&mut conn, id).await?,
            });
        }
        let raised = sqlx::query(
            "SELECT n.name, g.idx, x.code, x.seen_at FROM gpu_xid_errors x
             JOIN gpus g ON g.id = x.gpu_id JOIN nodes n ON n.id = g.node_id
             WHERE g.node_id = ? AND x.seen_at >= ? ORDER BY x.seen_at DESC, x.id DESC LIMIT 50",
        )
        .bind(node.id)
        .bind(now_ms() - 7 * 86_400_000);
        let xid_errors = xid_errors(&mut conn, raised).await?;
        let gpu_states = sqlx::query_as::<_, (u32, String, Option<String>, Option<bool>)>(
            "SELECT idx, health, health_note, mig_mode FROM gpus WHERE node_id = ? ORDER BY idx",
        )
        .bind(node.id)
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .map(|(index, health, note, mig_mode)| GpuState {
            index,
            health,
            note: note.filter(|n| !n.is_empty()),
            mig_mode,
        })
        .collect();
        let tier = (node.status.tier > 0).then(|| self.repair_tiers.get(node.status.tier as usize - 1)).flatten();
        let tier_name = tier.map(|t| t.name.clone());
        let runs_repairs = self.backend().is_ok_and(|b| b.runs_repair_commands());
        let tier_command_by_hand =
            tier.and_then(|t| t.command.clone()).filter(|_| node.status.state == NodeState::InRepair && !runs_repairs);
        Ok(NodeHealth {
            node: node.name,
            site: node.site,
            model: node.model,
            gpus: node.gpus,
            status: node.status,
            tier_name,
            tier_command_by_hand,
            tiers: self.tiers(),
            bookings_now,
            changes,
            runs,
            xid_errors,
            gpu_states,
        })
    }

    /// Moves a node by a platform admin's `event` (`drain`, `return_to_service`,
    /// `start_repair`, `repair_done`, `repair_failed`, `retire`, `reinstate`) for `reason`.
    /// A repair tier with a command runs it; a repair that is done is followed by acceptance
    /// at once. Both go on in the background (a reboot or a medium acceptance takes
    /// minutes): the answer is the node's health once it has moved, with the acceptance run
    /// open where one starts.
    pub async fn change_node_state(
        &self,
        caller: &Caller,
        name: &str,
        event: &str,
        reason: &str,
    ) -> Result<NodeHealth, Error> {
        self.authorize(caller, Action::FleetManage, Target::Platform).await?;
        let event = match NodeEvent::parse(event.trim()) {
            Some(
                e @ (NodeEvent::Drain
                | NodeEvent::ReturnToService
                | NodeEvent::StartRepair
                | NodeEvent::RepairDone
                | NodeEvent::RepairFailed
                | NodeEvent::Retire
                | NodeEvent::Reinstate),
            ) => e,
            // Acceptance starts by running checks; passes, failures and faults are the
            // checks' to record.
            _ => return Err(Refusal::InvalidReason("not an action on a node").into()),
        };
        let reason = reason_of(reason)?;
        let node = {
            let mut conn = self.db.acquire().await?;
            node_row(&mut conn, name).await?.ok_or(Error::NotFound)?
        };
        // A repair ends in acceptance (and a tier may run a command): without a backend that
        // runs them, refuse before the node moves rather than leave it testing.
        if matches!(event, NodeEvent::StartRepair | NodeEvent::RepairDone) {
            self.backend_for_checks()?;
        }
        let mut tx = self.begin_write().await?;
        let to = transition(self, &mut tx, &Mover::person(caller), &node, event, reason).await?;
        tx.commit_and(|| self.forget_fleet()).await?;

        match (event, to.state) {
            (NodeEvent::StartRepair, NodeState::InRepair) => {
                let tier = self.repair_tiers[to.tier as usize - 1].clone();
                let backend = self.backend_for_checks()?;
                // Where the backend runs no repair commands (bare metal: the agent runs no
                // command line the portal sends), the tier waits for a person as a manual
                // one does; the node page says which command the tier names.
                if let Some(command) = tier.command.clone().filter(|_| backend.runs_repair_commands()) {
                    // The answer is the node as this change left it, in repair: read before the
                    // tier starts, which may move it on to testing at any moment.
                    let health = self.read_node_health(name).await?;
                    let (platform, caller) = (self.clone(), caller.clone());
                    tokio::spawn(async move {
                        let tier = format!("tier {} ({})", to.tier, tier.name);
                        if let Err(e) = platform.run_repair_tier(&caller, &node, backend, &tier, &command).await {
                            tracing::error!(node = %node.name, error = %e, "a repair tier could not be recorded");
                        }
                    });
                    return Ok(health);
                }
            }
            (NodeEvent::RepairDone, NodeState::Testing) => self.accept_after_repair(caller, node).await?,
            _ => {}
        }
        self.read_node_health(name).await
    }

    /// A repair tier's `command` on the node, then its outcome as a state change by Berth,
    /// and acceptance where the repair is done.
    async fn run_repair_tier(
        &self,
        caller: &Caller,
        node: &NodeRow,
        backend: std::sync::Arc<dyn super::backend::Backend>,
        tier: &str,
        command: &str,
    ) -> Result<(), Error> {
        let (event, why) = match backend.run_repair(&self.checked_node(node), command).await {
            Ok(_) => (NodeEvent::RepairDone, format!("{tier}: `{command}` ran")),
            Err(e) => (NodeEvent::RepairFailed, format!("{tier}: `{command}` failed: {e}")),
        };
        let mut tx = self.begin_write().await?;
        let after = transition(self, &mut tx, &Mover::berth_for(caller), node, event, &why).await?;
        tx.commit_and(|| self.forget_fleet()).await?;
        if after.state == NodeState::Testing {
            self.acceptance(caller, node, ACCEPTANCE_AFTER_REPAIR).await?;
        }
        Ok(())
    }

    /// Resets one GPU of a node (`nvidia-smi -i <gpu> -r`), the repair for a MIG mode change
    /// that waits for a reset and for a GPU that hangs. Platform admins; only a GPU that
    /// holds no booking now or within [`RESET_CLEAR_MS`] (the reset would kill what runs on
    /// it). The answer is what the reset printed; a reset that did not happen is refused
    /// with the tool's words. The node's agent reports the GPU's new mode on its next
    /// report, which makes a GPU degraded for a pending mode healthy again.
    pub async fn reset_gpu(&self, caller: &Caller, name: &str, gpu: u32) -> Result<String, Error> {
        self.authorize(caller, Action::FleetManage, Target::Platform).await?;
        let node = {
            let mut conn = self.db.acquire().await?;
            node_row(&mut conn, name).await?.ok_or(Error::NotFound)?
        };
        if gpu >= node.gpus {
            return Err(Refusal::NoSuchGpu { node: node.name.clone(), gpu, gpus: node.gpus }.into());
        }
        let now = now_ms();
        let held: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM reservations r JOIN gpus g ON g.id = r.gpu_id
                            WHERE g.node_id = ? AND g.idx = ? AND r.released_at IS NULL
                              AND r.starts_at < ? AND r.ends_at > ?)",
        )
        .bind(node.id)
        .bind(gpu)
        .bind(now + RESET_CLEAR_MS)
        .bind(now)
        .fetch_one(&self.db)
        .await?;
        if held {
            return Err(Refusal::GpuInUse { node: node.name.clone(), gpu }.into());
        }
        let backend = self.backend().map_err(|_| Refusal::NodeChecksUnsupported)?;
        if !backend.resets_gpus() {
            return Err(Refusal::GpuResetUnsupported(backend.name()).into());
        }
        let outcome = match backend.reset_gpu(&self.checked_node(&node), gpu).await {
            Ok(printed) => node_checks::reset_outcome(&printed).map(|()| printed),
            Err(e) => Err(e.to_string()),
        };
        let target = format!("node:{}", node.name);
        let detail = match &outcome {
            Ok(_) => format!("GPU {gpu} reset"),
            Err(why) => format!("GPU {gpu} not reset: {}", why.chars().take(400).collect::<String>()),
        };
        let event = Event {
            action: "node.gpu_reset",
            target: Some(&target),
            outcome: if outcome.is_ok() { Outcome::Success } else { Outcome::Failure },
            detail: Some(&detail),
        };
        let mut tx = self.begin_write().await?;
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        outcome.map_err(|why| Refusal::GpuResetFailed { node: node.name.clone(), gpu, why }.into())
    }
}

pub(super) fn interconnect(node: &NodeRow) -> Interconnect {
    if node.nvlink { Interconnect::Nvlink } else { Interconnect::Pcie }
}

async fn check_results(conn: &mut SqliteConnection, run_id: i64) -> Result<Vec<CheckResult>, Error> {
    sqlx::query(
        "SELECT kind, passed, measured, threshold, unit, summary, command, raw_output
         FROM node_check_results WHERE run_id = ? ORDER BY id",
    )
    .bind(run_id)
    .fetch_all(&mut *conn)
    .await?
    .into_iter()
    .map(|row| {
        Ok(CheckResult {
            kind: row.try_get("kind")?,
            passed: row.try_get("passed")?,
            measured: row.try_get("measured")?,
            threshold: row.try_get("threshold")?,
            unit: row.try_get("unit")?,
            summary: row.try_get("summary")?,
            command: row.try_get("command")?,
            raw_output: row.try_get("raw_output")?,
        })
    })
    .collect()
}
