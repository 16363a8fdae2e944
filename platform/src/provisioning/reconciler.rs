//! The reconciler: a background task that moves every unfinished environment toward what
//! its owner wants, one idempotent step at a time, journaling each step.
//!
//! All state lives in the database; the reconciler keeps only which environments it is
//! working on right now. Killing it at any point is safe: on the next start it finds each
//! environment where the journal left it and repeats the interrupted step. The journal
//! only moves forward: a step that succeeded is never run again.
//!
//! Every `sweep_interval` it also sweeps the backend for orphans, objects Berth made that
//! nothing live explains (an answer lost in a timeout whose effect landed after the
//! teardown, say; a deleted tenant's queue), and removes them, each logged and written to
//! the audit log.
//!
//! It also keeps each tenant's queue on the backend in line with the tenant's quota (see
//! `tenant_queues`), and applies every live tenant's again at each sweep.
//!
//! Step tasks are interrupted, never aborted: a backend call can be abandoned at any
//! await, but the bookkeeping after it runs to the end, so no database transaction is
//! ever cut in half inside a running process.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_domain::lifecycle::{Action, EnvState, Phase, Progress, Step, next_action};
use berth_domain::notification::Notice;
use sqlx::Row;
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use crate::audit::{self, Actor, Event, Outcome};
use crate::capacity::environments::{ENVIRONMENT_COLUMNS, Environment, environment_from_row};
use crate::provisioning::backend::{Backend, BackendError, Live, OwnedObject, StepOutput, Workload, orphans};
use crate::provisioning::tenant_queues::QueueSyncs;
use crate::{Error, Platform, RequestMeta, lock, now_ms};

#[derive(Debug, Clone)]
pub struct ReconcilerConfig {
    /// How often to look for work when nothing wakes it.
    pub tick: Duration,
    /// A step that takes longer has failed (a hung backend must not hold capacity forever).
    pub step_timeout: Duration,
    /// First wait before retrying a failed teardown step; doubles up to `max_backoff`.
    pub retry_backoff: Duration,
    pub max_backoff: Duration,
    /// How often to sweep the backend for objects no live environment explains (orphans);
    /// the first sweep runs at start.
    pub sweep_interval: Duration,
    /// How often each running training job is asked whether it has ended.
    pub job_poll: Duration,
}

impl Default for ReconcilerConfig {
    fn default() -> ReconcilerConfig {
        ReconcilerConfig {
            tick: Duration::from_secs(1),
            step_timeout: Duration::from_secs(120),
            retry_backoff: Duration::from_secs(2),
            max_backoff: Duration::from_secs(60),
            sweep_interval: Duration::from_secs(5 * 60),
            job_poll: Duration::from_secs(10),
        }
    }
}

/// A step running for one environment.
struct InFlight {
    phase: Phase,
    /// Taken when the step is interrupted; the entry stays until the task has finished
    /// its bookkeeping, so no other step of the environment starts before that.
    interrupt: Option<oneshot::Sender<Interrupt>>,
}

/// Why a running step's backend call is abandoned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Interrupt {
    /// The owner stopped the environment while it was provisioning (JupyterHub's "stop
    /// during start"): the step is journaled as cancelled and teardown begins at once.
    OwnerStopped,
    /// The reconciler is shutting down: the step stays `running` in the journal and runs
    /// again at the next start.
    Shutdown,
}

/// How a step's backend call ended.
enum StepEnd {
    Finished(Result<StepOutput, String>),
    Interrupted(Interrupt),
}

#[derive(Clone)]
pub struct Reconciler {
    platform: Platform,
    backend: Arc<dyn Backend>,
    config: ReconcilerConfig,
    in_flight: Arc<Mutex<HashMap<String, InFlight>>>,
    /// Environment id -> (failed teardown attempts, not before this time).
    backoff: Arc<Mutex<HashMap<String, (u32, i64)>>>,
    /// Stops the running orphan sweep, if one runs.
    sweeping: Arc<Mutex<Option<oneshot::Sender<()>>>>,
    /// Tenant queue syncs running or waiting to retry.
    queues: Arc<QueueSyncs>,
}

/// What one orphan sweep found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Objects the backend holds for environments.
    pub owned: usize,
    pub removed: Vec<OwnedObject>,
    /// Orphans whose removal failed, with the backend's message; the next sweep tries again.
    pub failed: Vec<(OwnedObject, String)>,
}

impl Reconciler {
    pub fn new(platform: Platform, backend: Arc<dyn Backend>, config: ReconcilerConfig) -> Reconciler {
        Reconciler {
            platform,
            backend,
            config,
            in_flight: Default::default(),
            backoff: Default::default(),
            sweeping: Default::default(),
            queues: Default::default(),
        }
    }

    /// Runs until `shutdown` completes. Backend calls still running then are abandoned
    /// (each step is idempotent and runs again at the next start); the bookkeeping of
    /// steps that already finished is awaited.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        tracing::info!(backend = self.backend.name(), "reconciler started");
        let mut tasks = JoinSet::new();
        tokio::pin!(shutdown);
        let mut next_sweep = tokio::time::Instant::now();
        loop {
            if let Err(e) = self.pass(&mut tasks).await {
                tracing::error!(error = %e, "reconciler pass failed; retrying");
            }
            if tokio::time::Instant::now() >= next_sweep && lock(&self.sweeping).is_none() {
                next_sweep = tokio::time::Instant::now() + self.config.sweep_interval;
                if self.backend.has_tenant_queues()
                    && let Err(e) = self.platform.reapply_tenant_queues().await
                {
                    tracing::error!(error = %e, "could not mark tenant queues for their periodic apply");
                }
                self.start_sweep(&mut tasks);
            }
            tokio::select! {
                _ = &mut shutdown => break,
                _ = self.platform.wake.notified() => {}
                Some(_) = tasks.join_next() => {}
                _ = tokio::time::sleep(self.config.tick) => {}
            }
        }
        for in_flight in lock(&self.in_flight).values_mut() {
            if let Some(interrupt) = in_flight.interrupt.take() {
                let _ = interrupt.send(Interrupt::Shutdown);
            }
        }
        if let Some(stop) = lock(&self.sweeping).take() {
            let _ = stop.send(());
        }
        while tasks.join_next().await.is_some() {}
        tracing::info!("reconciler stopped");
    }

    /// Looks at every unfinished environment once and starts what is due.
    pub async fn pass(&self, tasks: &mut JoinSet<()>) -> Result<(), Error> {
        let now = now_ms();
        // Taken before the journal is read: a step that ends after this may have been read
        // as not done yet, and must not run a second time from that stale read (after
        // `release capacity` it would act on GPUs that are someone else's by then). Its
        // environment waits for the next pass, which the step's end wakes.
        let busy: HashSet<String> = lock(&self.in_flight).keys().cloned().collect();
        for (env, steps_done) in self.unfinished().await? {
            self.interrupt_if_stopped(&env);
            if busy.contains(&env.id) || lock(&self.in_flight).contains_key(&env.id) {
                continue;
            }
            if lock(&self.backoff).get(&env.id).is_some_and(|&(_, until)| until > now) {
                continue;
            }
            let progress = Progress {
                state: env.state,
                desired: env.desired,
                not_started: env.starts_at > now,
                window_over: env.ends_at <= now,
                failed: env.failure_reason.is_some(),
                steps_done,
            };
            match next_action(env.offering, env.size.shape, &progress) {
                Action::Wait => {}
                Action::Become(next) => self.transition(&env, next).await?,
                Action::Run { phase, index, step } => {
                    let this = self.clone();
                    let (interrupt, interrupted) = oneshot::channel();
                    // Registered before the task exists so the task's own removal comes after.
                    lock(&self.in_flight).insert(env.id.clone(), InFlight { phase, interrupt: Some(interrupt) });
                    tasks.spawn(async move {
                        if let Err(e) = this.run_step(&env, phase, index, step, interrupted).await {
                            tracing::error!(environment = %env.id, step = step.as_str(), error = %e, "step bookkeeping failed");
                        }
                        lock(&this.in_flight).remove(&env.id);
                        this.platform.wake_reconciler();
                    });
                }
            }
        }
        // Endpoints whose owner changed their replica count (see `replicas`).
        self.platform.scale_endpoints(&self.backend, self.config.step_timeout, tasks).await?;
        // Running clusters on nodes that failed (see `cluster_nodes`).
        self.platform.replace_failed_cluster_nodes(&self.backend, self.config.step_timeout, tasks).await?;
        // Training jobs that ended on their own (see `jobs`).
        self.platform.watch_jobs(&self.backend, self.config.job_poll, self.config.step_timeout, tasks).await?;
        // Tenants' queues behind their quota (see `tenant_queues`).
        if self.backend.has_tenant_queues() {
            let (timeout, retry) = (self.config.step_timeout, self.config.max_backoff);
            self.platform.sync_tenant_queues(&self.backend, &self.queues, timeout, retry, tasks).await?;
        }
        // Deleted volumes' storage, and deleted tenants' volumes (see `volume_storage`).
        crate::provisioning::volume_storage::follow_deletions(&self.platform, self.backend.as_ref()).await?;
        // Grown volumes' limits, where the storage holds sizes (see `volume_storage`).
        crate::provisioning::volume_storage::hold_sizes(&self.platform, self.backend.as_ref(), None).await?;
        Ok(())
    }

    fn start_sweep(&self, tasks: &mut JoinSet<()>) {
        let (stop, stopped) = oneshot::channel();
        *lock(&self.sweeping) = Some(stop);
        let this = self.clone();
        tasks.spawn(async move {
            match this.sweep_until(stopped).await {
                Ok(report) if report.removed.is_empty() && report.failed.is_empty() => {
                    tracing::debug!(owned = report.owned, "orphan sweep found nothing to remove");
                }
                Ok(report) => tracing::info!(
                    owned = report.owned,
                    removed = report.removed.len(),
                    failed = report.failed.len(),
                    "orphan sweep done"
                ),
                Err(e) => tracing::error!(error = %e, "orphan sweep failed; trying again at the next one"),
            }
            *lock(&this.sweeping) = None;
        });
    }

    /// One orphan sweep now: removes what the backend holds for environments that are not
    /// live. Each removal is logged and audited.
    pub async fn sweep(&self) -> Result<SweepReport, Error> {
        let (_running, stopped) = oneshot::channel();
        self.sweep_until(stopped).await
    }

    /// The sweep in two phases: list what the backend holds FIRST, then read which
    /// environments and tenants are live. An environment created in between counts as
    /// live, so what it has just made is never swept; an environment that was live at the
    /// listing and is over by the read has had its teardown, so what is left of it is an
    /// orphan. A tenant's slug is never reused, so a deleted tenant's queue is one for good.
    async fn sweep_until(&self, mut stop: oneshot::Receiver<()>) -> Result<SweepReport, Error> {
        let timeout = self.config.step_timeout;
        let owned = tokio::select! {
            listed = tokio::time::timeout(timeout, self.backend.owned_objects()) => match listed {
                Ok(Ok(owned)) => owned,
                Ok(Err(e)) => return Err(Error::internal(format!("listing the backend's objects failed: {e}"))),
                Err(_) => return Err(Error::internal(format!("listing the backend's objects took over {} s", timeout.as_secs()))),
            },
            _ = &mut stop => return Ok(SweepReport::default()),
        };
        let environments: HashSet<String> =
            sqlx::query_scalar("SELECT id FROM environments WHERE state NOT IN ('released', 'failed')")
                .fetch_all(&self.platform.db)
                .await?
                .into_iter()
                .collect();
        let tenants: HashSet<String> = sqlx::query_scalar("SELECT slug FROM tenants WHERE status <> 'deleted'")
            .fetch_all(&self.platform.db)
            .await?
            .into_iter()
            .collect();
        let live = Live { environments, tenants };
        let mut report = SweepReport { owned: owned.len(), ..SweepReport::default() };
        for orphan in orphans(&owned, &live) {
            let removed = tokio::select! {
                removed = tokio::time::timeout(timeout, self.backend.remove_owned(&orphan)) => match removed {
                    Ok(result) => result.map_err(|e| e.0),
                    Err(_) => Err(format!("did not finish within {} s", timeout.as_secs())),
                },
                // Interrupted between two objects: each removal is whole, and audited.
                _ = &mut stop => break,
            };
            match removed {
                Ok(false) => {}
                Ok(true) => {
                    tracing::warn!(kind = orphan.kind, name = %orphan.name, environments = ?orphan.environments, "removed an orphan");
                    self.audit_orphan(&orphan, Outcome::Success, None).await?;
                    report.removed.push(orphan);
                }
                Err(message) => {
                    tracing::warn!(kind = orphan.kind, name = %orphan.name, error = %message, "could not remove an orphan");
                    self.audit_orphan(&orphan, Outcome::Failure, Some(&message)).await?;
                    report.failed.push((orphan, message));
                }
            }
        }
        // What volumes hold, for their page (see `volume_storage`).
        crate::provisioning::volume_storage::measure(&self.platform, self.backend.as_ref(), timeout).await?;
        Ok(report)
    }

    /// An orphan's removal in the audit log, in the tenant it (or its environment) was for.
    async fn audit_orphan(&self, orphan: &OwnedObject, outcome: Outcome, error: Option<&str>) -> Result<(), Error> {
        let mut tx = self.platform.begin_write().await?;
        let mut tenant_id: Option<i64> = match &orphan.tenant {
            Some(slug) => {
                sqlx::query_scalar("SELECT id FROM tenants WHERE slug = ?").bind(slug).fetch_optional(&mut *tx).await?
            }
            None => None,
        };
        for environment in &orphan.environments {
            let tenant: Option<Option<i64>> = sqlx::query_scalar("SELECT tenant_id FROM environments WHERE id = ?")
                .bind(environment)
                .fetch_optional(&mut *tx)
                .await?;
            tenant_id = tenant_id.or(tenant.flatten());
        }
        let target = format!("{} {}", orphan.kind, orphan.name);
        let environments =
            if orphan.environments.is_empty() { "no environment".to_owned() } else { orphan.environments.join(", ") };
        let detail = match (error, &orphan.tenant) {
            (None, Some(slug)) => format!(
                "made for tenant {slug}, which is deleted or unknown; removed by the orphan sweep ({} backend)",
                self.backend.name()
            ),
            (None, None) => format!(
                "made for {environments}, none of them live; removed by the orphan sweep ({} backend)",
                self.backend.name()
            ),
            (Some(error), _) => format!("could not remove it ({error}); the next sweep tries again"),
        };
        let event = Event { action: "orphan.remove", target: Some(&target), outcome, detail: Some(&detail) };
        audit::record(&mut tx, &Actor::background(tenant_id), event).await?;
        tx.commit().await
    }

    /// Unfinished environments with how many steps of their current phase succeeded.
    async fn unfinished(&self) -> Result<Vec<(Environment, usize)>, Error> {
        let rows = sqlx::query(&format!(
            "SELECT {ENVIRONMENT_COLUMNS},
                (SELECT count(*) FROM environment_steps s
                 WHERE s.environment_id = e.id AND s.status = 'succeeded'
                   AND s.phase = CASE e.state WHEN 'tearing_down' THEN 'teardown' ELSE 'provision' END) AS steps_done
             FROM environments e WHERE e.state NOT IN ('released', 'failed') ORDER BY e.created_at"
        ))
        .fetch_all(&self.platform.db)
        .await?;
        rows.iter()
            .map(|row| {
                let done: i64 = row.try_get("steps_done")?;
                Ok((environment_from_row(row)?, usize::try_from(done).unwrap_or(0)))
            })
            .collect()
    }

    /// A stop while a provisioning step runs interrupts that step, so teardown need not
    /// wait for a slow or hung backend.
    fn interrupt_if_stopped(&self, env: &Environment) {
        if env.desired != berth_domain::lifecycle::Desired::Released {
            return;
        }
        if let Some(f) = lock(&self.in_flight).get_mut(&env.id).filter(|f| f.phase == Phase::Provision)
            && let Some(interrupt) = f.interrupt.take()
        {
            let _ = interrupt.send(Interrupt::OwnerStopped);
        }
    }

    async fn transition(&self, env: &Environment, next: EnvState) -> Result<(), Error> {
        if !env.state.can_become(next) {
            return Err(Error::internal(format!("lifecycle forbids {} -> {next}", env.state)));
        }
        let now = now_ms();
        let mut tx = self.platform.begin_write().await?;
        if next.is_final() {
            // Nothing is ever half-released: the final state needs every reservation back.
            let held: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM reservations WHERE environment_id = ? AND released_at IS NULL",
            )
            .bind(&env.id)
            .fetch_one(&mut *tx)
            .await?;
            if held > 0 {
                return Err(Error::internal(format!("environment {} would end with {held} reservations held", env.id)));
            }
        }
        let changed = sqlx::query(
            "UPDATE environments SET state = ?1, state_changed_at = ?2,
                ready_at = CASE WHEN ?1 = 'ready' THEN ?2 ELSE ready_at END,
                finished_at = CASE WHEN ?1 IN ('released', 'failed') THEN ?2 ELSE finished_at END
             WHERE id = ?3 AND state = ?4",
        )
        .bind(next.as_str())
        .bind(now)
        .bind(&env.id)
        .bind(env.state.as_str())
        .execute(&mut *tx)
        .await?
        .rows_affected();
        // Its GPUs are held for it from now: the usage ledger starts counting.
        if changed == 1 && next == EnvState::Provisioning {
            crate::capacity::metering::hold_units(&mut tx, &env.id, now).await?;
        }
        if changed == 1 && matches!(next, EnvState::Ready | EnvState::Released | EnvState::Failed) {
            let action = format!("environment.{}", next.as_str());
            let outcome = if next == EnvState::Failed { Outcome::Failure } else { Outcome::Success };
            let event =
                Event { action: &action, target: Some(&env.id), outcome, detail: env.failure_reason.as_deref() };
            audit::record(
                &mut tx,
                &Actor { user_id: Some(env.owner_id), tenant_id: env.tenant_id, meta: &RequestMeta::background() },
                event,
            )
            .await?;
            // The owner hears of it in the same transaction: told exactly when it happened.
            let notice = match next {
                EnvState::Ready => Some(Notice::environment_ready(&env.id, &env.name)),
                EnvState::Failed => Some(Notice::environment_failed(&env.id, &env.name, env.failure_reason.as_deref())),
                _ => None,
            };
            if let Some(notice) = notice {
                self.platform.notify(&mut tx, env.tenant_id, &[env.owner_id], &notice).await?;
            }
        }
        tx.commit().await?;
        tracing::info!(environment = %env.id, from = %env.state, to = %next, "environment state changed");
        self.platform.wake_reconciler();
        Ok(())
    }

    async fn run_step(
        &self,
        env: &Environment,
        phase: Phase,
        index: usize,
        step: Step,
        interrupted: oneshot::Receiver<Interrupt>,
    ) -> Result<(), Error> {
        let started = now_ms();
        // A step that succeeded stays succeeded: the journal only moves forward, also
        // against a write that arrives late (from a reconciler that died mid-request) or a
        // pass that read the journal just before the step's end. Such a step is not run again.
        let started_now = sqlx::query(
            "INSERT INTO environment_steps (environment_id, phase, idx, step, status, attempts, started_at)
             VALUES (?, ?, ?, ?, 'running', 1, ?)
             ON CONFLICT (environment_id, phase, idx) DO UPDATE SET
                status = 'running', attempts = attempts + 1, started_at = excluded.started_at, finished_at = NULL
             WHERE environment_steps.status <> 'succeeded'",
        )
        .bind(&env.id)
        .bind(phase.as_str())
        .bind(index as i64)
        .bind(step.as_str())
        .bind(started)
        .execute(&self.platform.db)
        .await?
        .rows_affected();
        if started_now == 0 {
            tracing::debug!(environment = %env.id, step = step.as_str(), "step already succeeded; not run again");
            return Ok(());
        }

        let workload = self.platform.workload(env).await?;
        if step == Step::StartWorkload {
            // Where its volumes will be, written before the step makes them.
            crate::provisioning::volume_storage::record_locations(&self.platform, self.backend.as_ref(), &workload)
                .await?;
        }
        if step == Step::StopWorkload && env.offering == berth_domain::catalog::Offering::TrainingJob {
            // Its log and status outlive it; the page shows them after the job is gone.
            self.platform.keep_job_log(&self.backend, &workload, self.config.step_timeout).await;
        }
        let call = tokio::time::timeout(self.config.step_timeout, async {
            if step == Step::AcceptanceChecks {
                // Checks of the nodes, through the node health lifecycle, not a backend step.
                return match self.platform.cluster_acceptance(&env.id).await {
                    Ok(Ok(detail)) => Ok(StepOutput { detail: Some(detail), ..StepOutput::default() }),
                    Ok(Err(failed)) => Err(BackendError(failed)),
                    Err(e) => Err(BackendError(format!("cannot run the acceptance checks: {e}"))),
                };
            }
            let mut workload = workload;
            loop {
                let output = self.backend.run(&workload, step).await?;
                if !self.backend.writes_neighbours_state(&workload, step) {
                    return Ok(output);
                }
                // The neighbours it wrote were read when the step began; one that ended (or
                // came) since may have written its own view before this write landed, and
                // the last write stands. So the step is done again until the neighbours it
                // wrote are the neighbours now: whichever write is last then names what
                // holds the node.
                let now = self.platform.workload(env).await.map_err(|e| {
                    tracing::warn!(environment = %env.id, step = step.as_str(), error = %e, "cannot read the node's neighbours");
                    BackendError("could not read what else holds its nodes; the step is retried".into())
                })?;
                if (&now.mig_neighbours, &now.tenant_neighbours)
                    == (&workload.mig_neighbours, &workload.tenant_neighbours)
                {
                    return Ok(output);
                }
                workload = now;
            }
        });
        let called = std::time::Instant::now();
        let end = tokio::select! {
            result = call => StepEnd::Finished(match result {
                Ok(result) => result.map_err(|e| e.0),
                Err(_) => Err(format!("did not finish within {} s", self.config.step_timeout.as_secs())),
            }),
            // A dropped sender means the reconciler itself is gone.
            why = interrupted => StepEnd::Interrupted(why.unwrap_or(Interrupt::Shutdown)),
        };
        // Only a call the backend finished says how long the step takes; an interrupted
        // one says when its owner stopped it.
        if let StepEnd::Finished(result) = &end {
            self.platform.metrics().step_ended(step, called.elapsed(), result.is_err());
        }
        match end {
            StepEnd::Finished(Ok(output)) => self.step_succeeded(env, phase, index, step, output).await,
            StepEnd::Finished(Err(message)) => self.step_failed(env, phase, index, step, &message).await,
            StepEnd::Interrupted(Interrupt::OwnerStopped) => self.step_cancelled(env, phase, index).await,
            StepEnd::Interrupted(Interrupt::Shutdown) => Ok(()),
        }
    }

    /// Journals a provisioning step the owner's stop cut short. The environment is not
    /// marked failed: stopping was what its owner asked for.
    async fn step_cancelled(&self, env: &Environment, phase: Phase, index: usize) -> Result<(), Error> {
        sqlx::query(
            "UPDATE environment_steps SET status = 'failed', finished_at = ?, detail = 'cancelled: the owner stopped the environment'
             WHERE environment_id = ? AND phase = ? AND idx = ? AND status = 'running'",
        )
        .bind(now_ms())
        .bind(&env.id)
        .bind(phase.as_str())
        .bind(index as i64)
        .execute(&self.platform.db)
        .await?;
        tracing::info!(environment = %env.id, "provisioning step cancelled by a stop");
        Ok(())
    }

    /// What the backend is told about environment `environment_id` now (tests drive a
    /// backend's steps one by one with it).
    pub async fn workload_of(&self, environment_id: &str) -> Result<Workload, Error> {
        let env = {
            let mut conn = self.platform.db.acquire().await?;
            crate::capacity::environments::environment_in(&mut conn, environment_id).await?
        };
        self.platform.workload(&env).await
    }

    async fn step_succeeded(
        &self,
        env: &Environment,
        phase: Phase,
        index: usize,
        step: Step,
        output: StepOutput,
    ) -> Result<(), Error> {
        let now = now_ms();
        let mut tx = self.platform.begin_write().await?;
        sqlx::query(
            "UPDATE environment_steps SET status = 'succeeded', finished_at = ?, detail = ?
             WHERE environment_id = ? AND phase = ? AND idx = ?",
        )
        .bind(now)
        .bind(&output.detail)
        .bind(&env.id)
        .bind(phase.as_str())
        .bind(index as i64)
        .execute(&mut *tx)
        .await?;
        if let Some(connection) = &output.connection {
            let json = serde_json::to_string(connection).map_err(Error::internal)?;
            sqlx::query("UPDATE environments SET connection = ? WHERE id = ?")
                .bind(json)
                .bind(&env.id)
                .execute(&mut *tx)
                .await?;
        }
        // An endpoint's API key is made once, when it is first exposed (see `connect`).
        if step == Step::ExposeEndpoint && env.offering == berth_domain::catalog::Offering::InferenceEndpoint {
            crate::provisioning::connect::issue_endpoint_key(&mut tx, &env.id).await?;
        }
        match step {
            // Connection secrets are of no use once the endpoint is gone.
            Step::RemoveEndpoint => {
                sqlx::query("UPDATE environments SET connection = NULL WHERE id = ?")
                    .bind(&env.id)
                    .execute(&mut *tx)
                    .await?;
            }
            // Released exactly once: only rows not yet released are touched, and the
            // table refuses to release a row twice.
            Step::ReleaseCapacity => {
                sqlx::query("UPDATE reservations SET released_at = ? WHERE environment_id = ? AND released_at IS NULL")
                    .bind(now)
                    .bind(&env.id)
                    .execute(&mut *tx)
                    .await?;
                // Its charges are final: summed for reports and budgets, with the release.
                crate::capacity::usage_sums::sum_released_units(&mut tx, &env.id).await?;
                // The tenant's space no longer holds it (see `tenant_queues`).
                crate::capacity::quotas::follow_holdings(&mut tx, &env.id).await?;
                // Its volumes are free again, for the next booking or to be deleted.
                crate::capacity::volumes::detach_all(&mut tx, &env.id, now).await?;
            }
            // These steps applied the tenant space's quota as read when they began; the
            // tenant's sync applies it again after them, with whatever changed since.
            Step::ConfigurePartition | Step::StartWorkload => {
                crate::capacity::quotas::follow_holdings(&mut tx, &env.id).await?;
            }
            _ => {}
        }
        tx.commit_and(|| {
            if step == Step::ReleaseCapacity {
                self.platform.with_book(|book| book.release(&env.id));
            }
        })
        .await?;
        lock(&self.backoff).remove(&env.id);
        tracing::info!(environment = %env.id, step = step.as_str(), "step succeeded");
        Ok(())
    }

    async fn step_failed(
        &self,
        env: &Environment,
        phase: Phase,
        index: usize,
        step: Step,
        message: &str,
    ) -> Result<(), Error> {
        let now = now_ms();
        let mut tx = self.platform.begin_write().await?;
        let failed = sqlx::query(
            "UPDATE environment_steps SET status = 'failed', finished_at = ?, detail = ?
             WHERE environment_id = ? AND phase = ? AND idx = ? AND status <> 'succeeded'",
        )
        .bind(now)
        .bind(message)
        .bind(&env.id)
        .bind(phase.as_str())
        .bind(index as i64)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if failed == 0 {
            // Another run of the same step succeeded meanwhile; that is the one that counts.
            return Ok(());
        }
        match phase {
            // A provisioning failure ends the environment: it is torn down and ends `failed`.
            Phase::Provision => {
                sqlx::query("UPDATE environments SET failure_reason = ? WHERE id = ? AND failure_reason IS NULL")
                    .bind(format!("{} failed: {message}", step.label()))
                    .bind(&env.id)
                    .execute(&mut *tx)
                    .await?;
            }
            // Teardown must finish: retry with growing pauses.
            Phase::Teardown => {
                let mut backoff = lock(&self.backoff);
                let attempts = backoff.get(&env.id).map_or(0, |&(n, _)| n) + 1;
                let wait = self.config.retry_backoff.saturating_mul(1 << attempts.min(10)).min(self.config.max_backoff);
                backoff.insert(env.id.clone(), (attempts, now + wait.as_millis() as i64));
            }
        }
        tx.commit().await?;
        tracing::warn!(environment = %env.id, step = step.as_str(), error = message, "step failed");
        Ok(())
    }
}
