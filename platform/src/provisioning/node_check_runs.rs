//! Check runs on a node: who may start one, the run opened before its checks (one open run
//! per node), its checks run through the backend and judged by `domain::node_checks`, and
//! the run closed with its results and its verdict's state change in one transaction.
//! People's runs go on in the background (`start_node_checks`); Berth's own (a cluster's
//! acceptance step, acceptance after a repair) and tests wait for theirs.

use berth_domain::Refusal;
use berth_domain::node_checks::{self, CheckKind, CheckLevel, CheckVerdict, NodeFacts};
use berth_domain::node_health::{NodeEvent, NodeState};
use berth_domain::policy::{Action, Denied, Target};
use sqlx::SqliteConnection;

use super::node_health::{
    ACCEPTANCE_AFTER_REPAIR, CheckResult, CheckRun, Mover, NodeRow, holder, interconnect, node_row, transition,
};
use crate::audit::{self, Actor, Event, Outcome};
use crate::{Caller, Error, Platform, now_ms};

/// The most of a check's output kept (the start of it: where tools print their verdicts
/// last, the summary line of the parsers already holds it).
const MAX_RAW_OUTPUT: usize = 64 * 1024;

impl Platform {
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

    /// Acceptance after a repair, in the background: the run is open when this returns.
    pub(super) async fn accept_after_repair(&self, caller: &Caller, node: NodeRow) -> Result<(), Error> {
        let mut tx = self.begin_write().await?;
        let started =
            open_run(&mut tx, Some(caller.user_id()), node, ACCEPTANCE_AFTER_REPAIR, RunPurpose::Acceptance).await?;
        tx.commit().await?;
        self.finish_in_background(caller, started);
        Ok(())
    }

    /// Acceptance of a node already `testing`: the checks, then passed or failed.
    pub(super) async fn acceptance(
        &self,
        caller: &Caller,
        node: &NodeRow,
        level: CheckLevel,
    ) -> Result<CheckRun, Error> {
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

    pub(super) fn backend_for_checks(&self) -> Result<std::sync::Arc<dyn super::backend::Backend>, Error> {
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
