//! Training jobs that end on their own: the reconciler watches every running job, and when
//! one has succeeded or failed it keeps the job's status and the end of its log and
//! releases the job's capacity at once, instead of holding idle GPUs until the window ends
//! (as Run:ai and Slurm do). The kept log is what the environment page shows afterwards.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::SqliteConnection;
use tokio::task::JoinSet;

use crate::audit::{self, Actor, Event, Outcome};
use crate::capacity::environments::environment_in;
use crate::provisioning::backend::{Backend, JobLogs, JobStatus, Workload};
use berth_domain::node_plan::{KEPT_LOG_LINES, kept_log};

use crate::provisioning::connect::LOG_TAIL;
use crate::{Error, Platform, lock, now_ms};

/// Which jobs are being asked right now, and when each was last asked.
#[derive(Debug, Default)]
pub(crate) struct JobWatch {
    asked_at: Mutex<HashMap<String, i64>>,
    asking: Mutex<std::collections::HashSet<String>>,
}

impl Platform {
    /// For the reconciler: asks the backend how each running training job stands (each
    /// job at most once every `poll`, in a task of `tasks`); a job that has ended is
    /// recorded and its environment released.
    pub(crate) async fn watch_jobs(
        &self,
        backend: &Arc<dyn Backend>,
        poll: Duration,
        timeout: Duration,
        tasks: &mut JoinSet<()>,
    ) -> Result<(), Error> {
        let running: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM environments WHERE offering = 'training' AND state = 'ready' AND desired = 'running'",
        )
        .fetch_all(&self.db)
        .await?;
        let now = now_ms();
        let mut asked_at = lock(&self.jobs.asked_at);
        asked_at.retain(|id, _| running.contains(id));
        for id in running {
            if asked_at.get(&id).is_some_and(|&at| now - at < poll.as_millis() as i64)
                || !lock(&self.jobs.asking).insert(id.clone())
            {
                continue;
            }
            asked_at.insert(id.clone(), now);
            let (this, backend) = (self.clone(), backend.clone());
            tasks.spawn(async move {
                if let Err(e) = this.check_job(&backend, &id, timeout).await {
                    tracing::error!(environment = %id, error = %e, "recording a job's end failed");
                }
                lock(&this.jobs.asking).remove(&id);
            });
        }
        Ok(())
    }

    async fn check_job(&self, backend: &Arc<dyn Backend>, id: &str, timeout: Duration) -> Result<(), Error> {
        let workload = {
            let mut conn = self.db.acquire().await?;
            let env = environment_in(&mut conn, id).await?;
            crate::provisioning::workloads::workload_of(&mut conn, &env, |_| true).await?
        };
        let logs = match tokio::time::timeout(timeout, backend.job_logs(&workload, LOG_TAIL)).await {
            Ok(Ok(logs)) => logs,
            // Asked again at the next poll; the page shows the backend's words meanwhile.
            Ok(Err(e)) => {
                tracing::warn!(environment = %id, error = %e.0, "cannot read the job's status");
                return Ok(());
            }
            Err(_) => return Ok(()),
        };
        if matches!(logs.status, JobStatus::Pending | JobStatus::Running) {
            return Ok(());
        }
        // Ended: what is kept is the longer log, read once more (the poll reads the tail).
        let logs = if logs.lines.len() < LOG_TAIL {
            logs
        } else {
            match tokio::time::timeout(timeout, backend.job_logs(&workload, KEPT_LOG_LINES)).await {
                Ok(Ok(longer)) if longer.status == logs.status => longer,
                _ => logs,
            }
        };
        self.job_ended(id, logs).await
    }

    /// Records a job's end (its status and kept log) and asks for its capacity back.
    async fn job_ended(&self, id: &str, logs: JobLogs) -> Result<(), Error> {
        let logs = JobLogs { lines: kept_log(logs.lines), ..logs };
        let reason = match &logs.status {
            JobStatus::Pending | JobStatus::Running => return Ok(()),
            JobStatus::Succeeded => None,
            JobStatus::Failed { exit_code: Some(code), reason } => {
                Some(format!("the training job failed with exit code {code}: {reason}"))
            }
            JobStatus::Failed { exit_code: None, reason } => Some(format!("the training job failed: {reason}")),
        };
        let mut tx = self.begin_write().await?;
        record_result(&mut tx, id, &logs).await?;
        let ended = sqlx::query(
            "UPDATE environments SET desired = 'released', failure_reason = coalesce(failure_reason, ?)
             WHERE id = ? AND state = 'ready' AND desired = 'running'",
        )
        .bind(reason.as_deref())
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if ended == 1 {
            let (owner_id, tenant_id): (i64, Option<i64>) =
                sqlx::query_as("SELECT owner_id, tenant_id FROM environments WHERE id = ?")
                    .bind(id)
                    .fetch_one(&mut *tx)
                    .await?;
            let (outcome, detail) = match &reason {
                None => (Outcome::Success, "the training job succeeded; its capacity is released"),
                Some(why) => (Outcome::Failure, why.as_str()),
            };
            let event = Event { action: "environment.job_end", target: Some(id), outcome, detail: Some(detail) };
            let actor = Actor { user_id: Some(owner_id), ..Actor::background(tenant_id) };
            audit::record(&mut tx, &actor, event).await?;
        }
        tx.commit().await?;
        if ended == 1 {
            tracing::info!(environment = %id, failed = reason.is_some(), "training job ended; releasing its capacity");
            self.wake_reconciler();
        }
        Ok(())
    }

    /// Before teardown stops a training job: keeps its status and the end of its log, if
    /// nothing is kept yet. Best effort: a backend that cannot answer leaves none.
    pub(crate) async fn keep_job_log(&self, backend: &Arc<dyn Backend>, workload: &Workload, timeout: Duration) {
        // A job that ended on its own was kept then (see `check_job`); what is kept stays.
        let already: Result<Option<i64>, _> = sqlx::query_scalar("SELECT 1 FROM job_results WHERE environment_id = ?")
            .bind(&workload.environment_id)
            .fetch_optional(&self.db)
            .await;
        if matches!(already, Ok(Some(_))) {
            return;
        }
        let Ok(Ok(logs)) = tokio::time::timeout(timeout, backend.job_logs(workload, KEPT_LOG_LINES)).await else {
            return;
        };
        let logs = JobLogs { lines: kept_log(logs.lines), ..logs };
        let kept = async {
            let mut tx = self.begin_write().await?;
            record_result(&mut tx, &workload.environment_id, &logs).await?;
            tx.commit().await
        };
        if let Err(e) = kept.await {
            tracing::warn!(environment = %workload.environment_id, error = %e, "cannot keep the job's log");
        }
    }

    /// What was kept of a training job that is no longer running.
    pub(crate) async fn kept_job_log(&self, id: &str) -> Result<Option<JobLogs>, Error> {
        let row: Option<(String, String)> =
            sqlx::query_as("SELECT status, lines FROM job_results WHERE environment_id = ?")
                .bind(id)
                .fetch_optional(&self.db)
                .await?;
        row.map(|(status, lines)| {
            Ok(JobLogs {
                status: serde_json::from_str(&status).map_err(Error::internal)?,
                lines: serde_json::from_str(&lines).map_err(Error::internal)?,
            })
        })
        .transpose()
    }
}

/// Keeps the first result recorded for a job: the one seen when it ended.
async fn record_result(conn: &mut SqliteConnection, id: &str, logs: &JobLogs) -> Result<(), Error> {
    sqlx::query(
        "INSERT INTO job_results (environment_id, status, lines, recorded_at) VALUES (?, ?, ?, ?)
         ON CONFLICT (environment_id) DO NOTHING",
    )
    .bind(id)
    .bind(serde_json::to_string(&logs.status).map_err(Error::internal)?)
    .bind(serde_json::to_string(&logs.lines).map_err(Error::internal)?)
    .bind(now_ms())
    .execute(&mut *conn)
    .await?;
    Ok(())
}
