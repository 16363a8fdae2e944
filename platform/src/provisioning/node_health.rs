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
use berth_domain::node_checks::{self, CheckKind, CheckLevel, CheckVerdict, Interconnect, NodeFacts};
use berth_domain::node_health::{NodeEvent, NodeState, NodeStatus, next_status};
use berth_domain::notification::Notice;
use berth_domain::policy::{Action, Denied, Target};
use sqlx::{Row, SqliteConnection};

use super::backend::CheckedNode;
use super::telemetry::{XidError, xid_errors};
use crate::audit::{self, Actor, Event, Outcome};
use crate::{Caller, Error, Platform, now_ms};

/// The most of a check's output kept (the start of it: where tools print their verdicts
/// last, the summary line of the parsers already holds it).
const MAX_RAW_OUTPUT: usize = 64 * 1024;
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
struct NodeRow {
    id: i64,
    name: String,
    site: String,
    model: GpuModel,
    gpus: u32,
    nvlink: bool,
    infiniband: bool,
    status: NodeStatus,
}

async fn node_row(conn: &mut SqliteConnection, name: &str) -> Result<Option<NodeRow>, Error> {
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
async fn holder(conn: &mut SqliteConnection, node_id: i64, now: i64) -> Result<Option<Option<i64>>, Error> {
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
struct Mover<'a> {
    actor: Actor<'a>,
    person: Option<i64>,
}

impl Mover<'_> {
    fn person(caller: &Caller) -> Mover<'_> {
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
async fn transition(
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

    fn checked_node(&self, node: &NodeRow) -> CheckedNode {
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
                    let (platform, caller) = (self.clone(), caller.clone());
                    tokio::spawn(async move {
                        let outcome = backend.run_repair(&platform.checked_node(&node), &command).await;
                        let (event, why) = match outcome {
                            Ok(_) => {
                                (NodeEvent::RepairDone, format!("tier {} ({}): `{command}` ran", to.tier, tier.name))
                            }
                            Err(e) => (
                                NodeEvent::RepairFailed,
                                format!("tier {} ({}): `{command}` failed: {e}", to.tier, tier.name),
                            ),
                        };
                        let after = async {
                            let mut tx = platform.begin_write().await?;
                            let after =
                                transition(&platform, &mut tx, &Mover::berth_for(&caller), &node, event, &why).await?;
                            tx.commit_and(|| platform.forget_fleet()).await?;
                            if after.state == NodeState::Testing {
                                platform.acceptance(&caller, &node, ACCEPTANCE_AFTER_REPAIR).await?;
                            }
                            Ok::<(), Error>(())
                        };
                        if let Err(e) = after.await {
                            tracing::error!(node = %node.name, error = %e, "a repair tier could not be recorded");
                        }
                    });
                }
            }
            (NodeEvent::RepairDone, NodeState::Testing) => {
                let mut tx = self.begin_write().await?;
                let started =
                    open_run(&mut tx, Some(caller.user_id()), node, ACCEPTANCE_AFTER_REPAIR, RunPurpose::Acceptance)
                        .await?;
                tx.commit().await?;
                self.finish_in_background(caller, started);
            }
            _ => {}
        }
        self.read_node_health(name).await
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

    /// Runs the checks of `level` on a node. Platform admins: any node, and a level that
    /// disturbs work only on a node nobody holds. Tenant admins: nodes only their tenant's
    /// dedicated clusters hold. On a node nobody holds that is new, available or draining,
    /// the run is acceptance (the node is testing meanwhile; it ends available or degraded);
    /// otherwise it is a check on demand, whose failure degrades an available or draining
    /// node and whose pass changes nothing.
    ///
    /// Waits for the whole run: tests and the platform's own flows use it. People start
    /// runs with [`Platform::start_node_checks`], which answers at once.
    pub async fn run_node_checks(&self, caller: &Caller, name: &str, level: &str) -> Result<CheckRun, Error> {
        let started = self.begin_node_checks(caller, name, level).await?;
        self.finish_run(&Mover::person(caller), started).await
    }

    /// [`Platform::run_node_checks`] in the background: the run is recorded as running
    /// (and the node `testing`, for acceptance) before this answers, and finishes on its
    /// own; the node page and `GET /api/v1/nodes/{name}/health` show it when it has. A
    /// real node's quick level takes minutes, the long one an hour: no request waits for it.
    pub async fn start_node_checks(&self, caller: &Caller, name: &str, level: &str) -> Result<CheckRun, Error> {
        let started = self.begin_node_checks(caller, name, level).await?;
        let running = started.running(self).await?;
        self.finish_in_background(caller, started);
        Ok(running)
    }

    /// Runs an open run to its end on a task of its own.
    fn finish_in_background(&self, caller: &Caller, started: StartedRun) {
        let (platform, caller) = (self.clone(), caller.clone());
        tokio::spawn(async move {
            let run = started.run_id;
            if let Err(e) = platform.finish_run(&Mover::person(&caller), started).await {
                tracing::error!(run, error = %e, "a check run could not be finished");
            }
        });
    }

    /// Checks who may run checks of `level` on the node, and opens the run.
    async fn begin_node_checks(&self, caller: &Caller, name: &str, level: &str) -> Result<StartedRun, Error> {
        if caller.principal.reach(Action::FleetCheck).is_none() {
            self.authorize(caller, Action::FleetCheck, Target::Platform).await?;
        }
        let node = {
            let mut conn = self.db.acquire().await?;
            node_row(&mut conn, name).await?.ok_or(Error::NotFound)?
        };
        let held = {
            let mut conn = self.db.acquire().await?;
            holder(&mut conn, node.id, now_ms()).await?
        };
        let target = match held {
            Some(Some(tenant)) => Target::Tenant(tenant),
            _ => Target::Platform,
        };
        if let Err(denied) = caller.principal.authorize(Action::FleetCheck, target) {
            let refused = self.authorize(caller, Action::FleetCheck, target).await;
            // A node out of a tenant admin's reach looks like one that does not exist.
            return Err(match (denied, caller.principal.role.is_platform()) {
                (Denied::OutOfReach, false) => Error::NotFound,
                _ => refused.err().unwrap_or(Error::Forbidden),
            });
        }
        let level = CheckLevel::parse(level)?;
        if held.is_some() && level.disturbs_work() && caller.principal.role.is_platform() {
            return Err(Refusal::NodeHeld(node.name.clone()).into());
        }
        self.backend_for_checks()?;
        let acceptance =
            held.is_none() && matches!(node.status.state, NodeState::New | NodeState::Available | NodeState::Draining);
        if !acceptance && node.status.state == NodeState::Testing {
            return Err(Refusal::NodeTransition { state: NodeState::Testing.label(), event: "run checks" }.into());
        }
        let mut tx = self.begin_write().await?;
        let purpose = if acceptance {
            let why = format!("acceptance checks at level {}", level.as_str());
            transition(self, &mut tx, &Mover::person(caller), &node, NodeEvent::StartAcceptance, &why).await?;
            RunPurpose::Acceptance
        } else {
            RunPurpose::OnDemand
        };
        let started = open_run(&mut tx, Some(caller.user_id()), node, level, purpose).await?;
        tx.commit_and(|| self.forget_fleet()).await?;
        Ok(started)
    }

    /// A dedicated cluster's provisioning step: quick acceptance checks on each node it
    /// holds, one after another. A node that fails becomes degraded (its owner told, see
    /// [`transition`]); one that passes stays as it is: it stays `available` meanwhile, since
    /// the cluster holds it already and a `testing` node would refuse every later booking
    /// of it for that time. The step's detail on success; on a failure, which node failed
    /// and why, and the cluster does not start. Where the backend runs no node checks, the
    /// step says so and passes.
    pub(crate) async fn cluster_acceptance(&self, environment_id: &str) -> Result<Result<String, String>, Error> {
        if self.backend_for_checks().is_err() {
            return Ok(Ok("not run: this backend runs no node checks".to_owned()));
        }
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT n.name FROM reservations r JOIN gpus g ON g.id = r.gpu_id JOIN nodes n ON n.id = g.node_id
             WHERE r.environment_id = ? AND r.released_at IS NULL ORDER BY n.name",
        )
        .bind(environment_id)
        .fetch_all(&self.db)
        .await?;
        let tenant: Option<i64> = sqlx::query_scalar("SELECT tenant_id FROM environments WHERE id = ?")
            .bind(environment_id)
            .fetch_one(&self.db)
            .await?;
        // Berth acts, in the cluster's tenant: the audit log shows it there.
        let mover = || Mover { actor: Actor::background(tenant), person: None };
        let mut passed = Vec::new();
        for name in names {
            let node = {
                let mut conn = self.db.acquire().await?;
                node_row(&mut conn, &name).await?.ok_or(Error::NotFound)?
            };
            // A node that failed since it was booked is not handed over.
            if !matches!(node.status.state, NodeState::New | NodeState::Available | NodeState::Draining) {
                return Ok(Err(format!("{name} is {}: the cluster is not started on it", node.status.state.label())));
            }
            let run = self.check_run(&mover(), &node, CheckLevel::Quick, RunPurpose::BeforeHandover).await?;
            if run.passed != Some(true) {
                let failures: Vec<String> =
                    run.results.iter().filter(|r| !r.passed).map(|r| format!("{}: {}", r.kind, r.summary)).collect();
                return Ok(Err(format!(
                    "{name} failed acceptance (check run {}): {}; the cluster is not started on it",
                    run.id,
                    failures.join("; ")
                )));
            }
            passed.push(format!("{name} (check run {})", run.id));
        }
        Ok(Ok(format!("quick acceptance checks passed on {}", passed.join(", "))))
    }

    /// Acceptance of a node already `testing`: the checks, then passed or failed.
    async fn acceptance(&self, caller: &Caller, node: &NodeRow, level: CheckLevel) -> Result<CheckRun, Error> {
        self.check_run(&Mover::person(caller), node, level, RunPurpose::Acceptance).await
    }

    /// Opens a run and runs it to its end. Berth's own runs (a cluster's acceptance step,
    /// acceptance after a repair) wait for a person's run on the node to end first.
    async fn check_run(
        &self,
        mover: &Mover<'_>,
        node: &NodeRow,
        level: CheckLevel,
        purpose: RunPurpose,
    ) -> Result<CheckRun, Error> {
        self.backend_for_checks()?;
        let started = loop {
            let mut tx = self.begin_write().await?;
            match open_run(&mut tx, mover.person, node.clone(), level, purpose).await {
                Ok(started) => {
                    tx.commit().await?;
                    break started;
                }
                Err(Error::Refused(Refusal::ChecksRunning { .. })) => {
                    drop(tx);
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
                Err(e) => return Err(e),
            }
        };
        self.finish_run(mover, started).await
    }

    /// Runs the checks of an open run and records them, closing the run, with its
    /// verdict's state change in one transaction.
    async fn finish_run(&self, mover: &Mover<'_>, started: StartedRun) -> Result<CheckRun, Error> {
        let StartedRun { run_id, requested_by, node, level, purpose, started_at } = started;
        let node = &node;
        let backend = match self.backend_for_checks() {
            Ok(backend) => backend,
            Err(e) => {
                close_run_cut_short(self, run_id).await?;
                return Err(e);
            }
        };
        let checked = self.checked_node(node);
        let facts = NodeFacts {
            model: node.model,
            gpus: node.gpus,
            interconnect: interconnect(node),
            expected_bus_bandwidth: checked.expected_bus_bandwidth,
            infiniband_rate: checked.infiniband_rate,
        };
        let mut results = Vec::new();
        // Checks that could not run at all (no agent, a Job the kubelet would not start on a
        // node whose GPUs are in use) say nothing against the node.
        let mut not_run = 0;
        for kind in node_checks::checks_for(level, node.gpus, node.infiniband) {
            let command = kind.command(level, node.gpus).to_string();
            let (verdict, raw) = match backend.run_check(&checked, kind, level).await {
                Ok(raw) => match node_checks::evaluate(kind, &raw, &facts) {
                    Ok(verdict) => (verdict, raw),
                    Err(refusal) => (failed(kind, refusal.to_string()), raw),
                },
                Err(e) => {
                    not_run += 1;
                    (failed(kind, format!("could not run: {e}")), String::new())
                }
            };
            results.push(CheckResult {
                kind: kind.as_str().to_owned(),
                passed: verdict.passed,
                measured: verdict.measured,
                threshold: verdict.threshold,
                unit: verdict.unit,
                summary: verdict.summary,
                command,
                raw_output: truncate(raw),
            });
        }
        let passed = results.iter().all(|r| r.passed);
        let finished_at = now_ms();
        let mut tx = self.begin_write().await?;
        sqlx::query("UPDATE node_check_runs SET finished_at = ?, passed = ? WHERE id = ?")
            .bind(finished_at)
            .bind(passed)
            .bind(run_id)
            .execute(&mut *tx)
            .await?;
        for r in &results {
            sqlx::query(
                "INSERT INTO node_check_results (run_id, kind, passed, measured, threshold, unit, summary, command, raw_output)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(run_id)
            .bind(&r.kind)
            .bind(r.passed)
            .bind(r.measured)
            .bind(r.threshold)
            .bind(&r.unit)
            .bind(&r.summary)
            .bind(&r.command)
            .bind(&r.raw_output)
            .execute(&mut *tx)
            .await?;
        }
        let failures: Vec<String> =
            results.iter().filter(|r| !r.passed).map(|r| format!("{}: {}", r.kind, r.summary)).collect();
        let why = if passed {
            format!("check run {run_id} at level {} passed", level.as_str())
        } else {
            format!("check run {run_id} failed: {}", failures.join("; "))
        };
        let why: String = why.chars().take(500).collect();
        let target = format!("node:{}", node.name);
        let event = Event {
            action: "node.check",
            target: Some(&target),
            outcome: if passed { Outcome::Success } else { Outcome::Failure },
            detail: Some(&why),
        };
        audit::record(&mut tx, &mover.actor, event).await?;
        let current: String =
            sqlx::query_scalar("SELECT state FROM nodes WHERE id = ?").bind(node.id).fetch_one(&mut *tx).await?;
        let verdict = match (purpose, passed, current.as_str()) {
            (RunPurpose::Acceptance, true, _) => Some(NodeEvent::AcceptancePassed),
            (RunPurpose::Acceptance, false, _) => Some(NodeEvent::AcceptanceFailed),
            // On demand, only a check that ran and failed degrades the node; acceptance
            // needs every check to pass.
            (_, false, "available" | "draining") if results.iter().filter(|r| !r.passed).count() > not_run => {
                Some(NodeEvent::Fault)
            }
            _ => None,
        };
        if let Some(event) = verdict {
            // The verdict is Berth's, on the requester's behalf.
            let verdict_by = Mover { actor: mover.actor, person: None };
            transition(self, &mut tx, &verdict_by, node, event, &why).await?;
        }
        tx.commit_and(|| self.forget_fleet()).await?;
        let requested_by = email_of(self, requested_by).await?;
        Ok(CheckRun {
            id: run_id,
            level: level.as_str().to_owned(),
            purpose: purpose.as_str().to_owned(),
            requested_by,
            started_at,
            finished_at: Some(finished_at),
            passed: Some(passed),
            results,
        })
    }

    fn backend_for_checks(&self) -> Result<std::sync::Arc<dyn super::backend::Backend>, Error> {
        match self.backend() {
            Ok(backend) if backend.runs_node_checks() => Ok(backend),
            _ => Err(Refusal::NodeChecksUnsupported.into()),
        }
    }
}

/// A check run recorded as running, not yet run.
struct StartedRun {
    run_id: i64,
    /// The person who asked for it; `None` when Berth did.
    requested_by: Option<i64>,
    node: NodeRow,
    level: CheckLevel,
    purpose: RunPurpose,
    started_at: i64,
}

impl StartedRun {
    /// The run as the node page shows it while it goes on.
    async fn running(&self, platform: &Platform) -> Result<CheckRun, Error> {
        Ok(CheckRun {
            id: self.run_id,
            level: self.level.as_str().to_owned(),
            purpose: self.purpose.as_str().to_owned(),
            requested_by: email_of(platform, self.requested_by).await?,
            started_at: self.started_at,
            finished_at: None,
            passed: None,
            results: Vec::new(),
        })
    }
}

/// Records a run on `node` as running, inside `tx`; refused while another run on the node
/// goes on (two runs would fight over its GPUs, and their verdicts over its state).
async fn open_run(
    tx: &mut SqliteConnection,
    requested_by: Option<i64>,
    node: NodeRow,
    level: CheckLevel,
    purpose: RunPurpose,
) -> Result<StartedRun, Error> {
    let running: Option<i64> =
        sqlx::query_scalar("SELECT id FROM node_check_runs WHERE node_id = ? AND finished_at IS NULL")
            .bind(node.id)
            .fetch_optional(&mut *tx)
            .await?;
    if let Some(run) = running {
        return Err(Refusal::ChecksRunning { node: node.name.clone(), run }.into());
    }
    let started_at = now_ms();
    let run_id: i64 = sqlx::query_scalar(
        "INSERT INTO node_check_runs (node_id, level, purpose, requested_by, started_at)
         VALUES (?, ?, ?, ?, ?) RETURNING id",
    )
    .bind(node.id)
    .bind(level.as_str())
    .bind(purpose.as_str())
    .bind(requested_by)
    .bind(started_at)
    .fetch_one(&mut *tx)
    .await?;
    Ok(StartedRun { run_id, requested_by, node, level, purpose, started_at })
}

/// Closes a run that did not run to its end as failed, with no results.
async fn close_run_cut_short(platform: &Platform, run_id: i64) -> Result<(), Error> {
    let mut tx = platform.begin_write().await?;
    sqlx::query("UPDATE node_check_runs SET finished_at = ?, passed = 0 WHERE id = ? AND finished_at IS NULL")
        .bind(now_ms())
        .bind(run_id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

async fn email_of(platform: &Platform, user: Option<i64>) -> Result<Option<String>, Error> {
    Ok(sqlx::query_scalar("SELECT email FROM users WHERE id = ?").bind(user).fetch_optional(&platform.db).await?)
}

/// Why checks run, which says what their verdict does to the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RunPurpose {
    /// The node is `testing`: it ends available or degraded.
    Acceptance,
    /// Asked for on a node in use: a failure degrades it, a pass changes nothing.
    OnDemand,
    /// Before a dedicated cluster starts on the node it holds: kept as acceptance, and
    /// its verdict is an on-demand check's.
    BeforeHandover,
}

impl RunPurpose {
    fn as_str(self) -> &'static str {
        match self {
            RunPurpose::Acceptance | RunPurpose::BeforeHandover => "acceptance",
            RunPurpose::OnDemand => "on_demand",
        }
    }
}

fn interconnect(node: &NodeRow) -> Interconnect {
    if node.nvlink { Interconnect::Nvlink } else { Interconnect::Pcie }
}

fn failed(kind: CheckKind, summary: String) -> CheckVerdict {
    CheckVerdict { kind, passed: false, measured: None, threshold: None, unit: String::new(), summary }
}

fn truncate(mut raw: String) -> String {
    if raw.len() > MAX_RAW_OUTPUT {
        let mut end = MAX_RAW_OUTPUT;
        while !raw.is_char_boundary(end) {
            end -= 1;
        }
        raw.truncate(end);
        raw.push_str("\n[… cut at 64 KiB]");
    }
    raw
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
