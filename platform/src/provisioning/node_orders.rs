//! Health checks and GPU resets on bare-metal nodes, run by each node's own agent (issue 16).
//!
//! The bare-metal backend orders a task ([`Platform::order_task`]): a row in
//! `node_orders`. The node's agent takes its open orders with its node token
//! ([`Platform::take_check_orders`]), runs the task's own command
//! (`berth_domain::node_checks::NodeTask::command`: the portal never sends a command line)
//! and answers with what it printed ([`Platform::answer_check`]). The order waits for that
//! answer for the task's time limit; after it, the order is closed with an error, so a
//! late answer changes nothing and the task counts as failed.

use std::time::Duration;

use berth_domain::Refusal;
use berth_domain::node_checks::{AgentOrder, CheckAnswer, CheckKind, CheckLevel, NodeTask};

use crate::{Error, Platform, RequestMeta, now_ms};

/// How long an agent has to take an order on top of the check's own time limit: it asks
/// for orders every few seconds, and a node whose agent is down should not be waited on
/// for the whole of a long check's limit before that shows.
const TAKE_WITHIN: Duration = Duration::from_secs(60);

/// An order as `node_orders` keeps it: a check's kind and level, or `gpu_reset` and its GPU.
#[derive(sqlx::FromRow)]
struct OrderRow {
    id: i64,
    kind: String,
    level: Option<String>,
    gpus: u32,
    gpu: Option<u32>,
}

/// `node_orders.kind` of a GPU reset.
const GPU_RESET: &str = "gpu_reset";

/// The longest error an agent may send (its output is bounded by [`CheckAnswer::MAX_OUTPUT`]).
const MAX_ERROR: usize = 2_000;

impl Platform {
    /// Orders `task` on `node` and waits, looking every `poll`, for the agent's answer:
    /// what the task printed, or why there is none (the agent could not run it, or did not
    /// answer in time).
    pub(crate) async fn order_task(&self, node: &str, task: NodeTask, poll: Duration) -> Result<String, String> {
        // The answer is shown on the node page: Berth's own failures go to its log, not there.
        let internal = |e: Error| {
            tracing::error!(node, command = %task.command(), error = %e, "a node order could not be written or read");
            "Berth could not order it or read the agent's answer (its log says why)".to_owned()
        };
        let ordered = self.write_order(node, task).await.map_err(internal)?;
        let taken_by = tokio::time::Instant::now() + TAKE_WITHIN;
        let answered_by = taken_by + task.time_limit();
        loop {
            tokio::time::sleep(poll).await;
            let (taken, answered, output, error) = self.check_order(ordered).await.map_err(internal)?;
            if answered {
                return match error {
                    Some(error) => Err(error),
                    None => Ok(output.unwrap_or_default()),
                };
            }
            let now = tokio::time::Instant::now();
            let late = if !taken && now >= taken_by {
                Some(format!("{node}'s agent did not take the order in {} s: is it running?", TAKE_WITHIN.as_secs()))
            } else if now >= answered_by {
                Some(format!("{node}'s agent gave no answer in {} min", task.time_limit().as_secs() / 60))
            } else {
                None
            };
            if let Some(why) = late {
                // Closed now: an answer in the meantime wins, and a later one changes nothing.
                if self.close_check_order(ordered, &why).await.map_err(internal)? {
                    return Err(why);
                }
            }
        }
    }

    async fn write_order(&self, node: &str, task: NodeTask) -> Result<i64, Error> {
        let (kind, level, gpus, gpu) = match task {
            NodeTask::Check { kind, level, gpus } => (kind.as_str(), Some(level.as_str()), gpus, None),
            NodeTask::ResetGpu { gpu } => (GPU_RESET, None, 0, Some(gpu)),
        };
        let mut tx = self.begin_write().await?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO node_orders (node_id, kind, level, gpus, gpu, ordered_at)
             SELECT id, ?, ?, ?, ?, ? FROM nodes WHERE name = ? RETURNING id",
        )
        .bind(kind)
        .bind(level)
        .bind(gpus)
        .bind(gpu)
        .bind(now_ms())
        .bind(node)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(Error::NotFound)?;
        tx.commit().await?;
        Ok(id)
    }

    /// Taken, answered, output, error.
    async fn check_order(&self, id: i64) -> Result<(bool, bool, Option<String>, Option<String>), Error> {
        Ok(sqlx::query_as(
            "SELECT taken_at IS NOT NULL, answered_at IS NOT NULL, output, error FROM node_orders WHERE id = ?",
        )
        .bind(id)
        .fetch_one(&self.db)
        .await?)
    }

    /// Closes an unanswered order with `why`; false when the answer came first.
    async fn close_check_order(&self, id: i64, why: &str) -> Result<bool, Error> {
        let mut tx = self.begin_write().await?;
        let closed =
            sqlx::query("UPDATE node_orders SET answered_at = ?, error = ? WHERE id = ? AND answered_at IS NULL")
                .bind(now_ms())
                .bind(why)
                .bind(id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        tx.commit().await?;
        Ok(closed == 1)
    }

    /// The checks ordered on the node behind `secret` that its agent has not taken yet,
    /// oldest first; they count as taken from now on. With `resume` (an agent that has just
    /// started), also those taken and never answered: an agent that stopped while they ran
    /// runs them again rather than leave them waiting out their time limit.
    pub async fn take_check_orders(
        &self,
        secret: &str,
        resume: bool,
        meta: RequestMeta,
    ) -> Result<Vec<AgentOrder>, Error> {
        let agent = self.authenticate_node(secret, "agent.checks", &meta).await?;
        // Every agent asks every few seconds: a read first, and the writer turn only when
        // there is something to take.
        let open: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM node_orders
                            WHERE node_id = ? AND (taken_at IS NULL OR ?) AND answered_at IS NULL)",
        )
        .bind(agent.node_id)
        .bind(resume)
        .fetch_one(&self.db)
        .await?;
        if !open {
            return Ok(Vec::new());
        }
        let mut tx = self.begin_write().await?;
        // Taken once, under the turn: a second agent with the node's token (or a retried
        // request) gets none it was handed already.
        let rows: Vec<OrderRow> = sqlx::query_as(
            "UPDATE node_orders SET taken_at = ?
             WHERE node_id = ? AND (taken_at IS NULL OR ?) AND answered_at IS NULL
             RETURNING id, kind, level, gpus, gpu",
        )
        .bind(now_ms())
        .bind(agent.node_id)
        .bind(resume)
        .fetch_all(&mut *tx)
        .await?;
        let mut taken = Vec::with_capacity(rows.len());
        for OrderRow { id, kind, level, gpus, gpu } in rows {
            let task = match (CheckKind::parse(&kind), level.as_deref().map(CheckLevel::parse), gpu) {
                (Some(kind), Some(Ok(level)), None) => NodeTask::Check { kind, level, gpus },
                (None, None, Some(gpu)) if kind == GPU_RESET => NodeTask::ResetGpu { gpu },
                _ => return Err(Error::internal(format!("node order {id} has kind {kind:?} and level {level:?}"))),
            };
            taken.push(AgentOrder { id, task });
        }
        tx.commit().await?;
        // Oldest first (RETURNING keeps no order).
        taken.sort_by_key(|o| o.id);
        Ok(taken)
    }

    /// The answer of the agent behind `secret` to its check order `id`. An order another
    /// node's or never made is not found; an answer to an order already closed (answered,
    /// or out of time) changes nothing.
    pub async fn answer_check(
        &self,
        secret: &str,
        id: i64,
        answer: &CheckAnswer,
        meta: RequestMeta,
    ) -> Result<(), Error> {
        let agent = self.authenticate_node(secret, "agent.checks", &meta).await?;
        if answer.output.len() > CheckAnswer::MAX_OUTPUT {
            return Err(Refusal::InvalidReport(format!(
                "a check's output is at most {} KiB; send its end",
                CheckAnswer::MAX_OUTPUT / 1024
            ))
            .into());
        }
        if answer.error.as_ref().is_some_and(|e| e.len() > MAX_ERROR) {
            return Err(Refusal::InvalidReport(format!("a check's error is at most {MAX_ERROR} bytes")).into());
        }
        let mut tx = self.begin_write().await?;
        let theirs: Option<bool> =
            sqlx::query_scalar("SELECT answered_at IS NULL FROM node_orders WHERE id = ? AND node_id = ?")
                .bind(id)
                .bind(agent.node_id)
                .fetch_optional(&mut *tx)
                .await?;
        match theirs {
            None => return Err(Error::NotFound),
            Some(false) => return Ok(()),
            Some(true) => {}
        }
        // An answer with an error keeps no output; one without keeps its output, empty or not.
        let (output, error) = match &answer.error {
            Some(error) => (None, Some(error.as_str())),
            None => (Some(answer.output.as_str()), None),
        };
        let now = now_ms();
        sqlx::query(
            "UPDATE node_orders SET answered_at = ?, output = ?, error = ?, taken_at = coalesce(taken_at, ?)
             WHERE id = ?",
        )
        .bind(now)
        .bind(output)
        .bind(error)
        .bind(now)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }
}
