//! A running dedicated cluster that loses a node: a node it holds leaves `available` (a
//! failed check, a fatal XID, an admin's drain-to-repair), and Berth books a healthy node of
//! the same model and site for the rest of the window, in one write transaction with the
//! placement rules every booking follows (only available nodes, the cleaning gap, the
//! tenant's isolation). The backend then moves the cluster (the new node handed over with the
//! tenant's network and accounts, the failed one left); only after that are the failed
//! node's reservations released, so nothing is ever handed out while the cluster still runs
//! on it. When no node is free, the cluster keeps running on what it has, its owner is told
//! when one will be, and Berth keeps looking.
//!
//! The reservation rows hold the invariants as for every booking; `cluster_node_replacements`
//! (`0039`) keeps what the cluster's page and its owner are told.

use std::sync::Arc;
use std::time::Duration;

use berth_domain::booking::{self as rules, Window, utc_short};
use berth_domain::notification::Notice;
use berth_domain::placement::Shape;
use sqlx::Row;
use tokio::task::JoinSet;

use crate::audit::{self, Actor, Event, Outcome};
use crate::capacity::environments::environment_in;
use crate::provisioning::backend::Backend;
use crate::provisioning::running_changes::{applied_within, kept_and_dropped};
use crate::{Error, Platform, lock, now_ms};

/// A failed move is tried again after this long.
const MOVE_RETRY_MS: i64 = 10_000;
/// With no node free, placement is tried again after this long (not every pass: each try
/// takes the writer turn); where the backend cannot move clusters, after this long.
const LOOK_AGAIN_MS: i64 = 5_000;
const CANNOT_MOVE_AGAIN_MS: i64 = 600_000;

/// One failed node of a cluster, as its page shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeReplacement {
    pub failed_node: String,
    pub reason: String,
    pub decided_at: i64,
    pub replacement: Option<String>,
    pub replaced_at: Option<i64>,
    /// While none is free: the first time one is, within the window.
    pub next_free_at: Option<i64>,
    pub problem: Option<String>,
    pub moved_at: Option<i64>,
}

impl Platform {
    /// For the reconciler: books replacements for the failed nodes of running clusters and
    /// has the backend move each booked one (in a task of `tasks`).
    pub async fn replace_failed_cluster_nodes(
        &self,
        backend: &Arc<dyn Backend>,
        timeout: Duration,
        tasks: &mut JoinSet<()>,
    ) -> Result<(), Error> {
        let now = now_ms();
        // Clusters running on a node that no longer takes bookings, with no replacement
        // booked for it yet.
        let failed: Vec<(String, i64)> = sqlx::query_as(
            "SELECT DISTINCT e.id, n.id FROM environments e
             JOIN reservations r ON r.environment_id = e.id AND r.released_at IS NULL
             JOIN gpus g ON g.id = r.gpu_id JOIN nodes n ON n.id = g.node_id
             WHERE e.offering = 'cluster' AND e.state = 'ready' AND e.desired = 'running' AND e.ends_at > ?
               AND n.state NOT IN ('available', 'draining')
               AND NOT EXISTS (SELECT 1 FROM cluster_node_replacements c WHERE c.environment_id = e.id
                               AND c.failed_node_id = n.id AND c.replacement_node_id IS NOT NULL)",
        )
        .bind(now)
        .fetch_all(&self.db)
        .await?;
        for (environment_id, node_id) in failed {
            let key = format!("{environment_id}/node {node_id}");
            if lock(&self.access.retry_after).get(&key).is_some_and(|&at| at > now) {
                continue;
            }
            match self.book_replacement(backend.as_ref(), &environment_id, node_id).await {
                Ok(true) => {
                    lock(&self.access.retry_after).remove(&key);
                }
                Ok(false) => {
                    let wait = if backend.moves_clusters() { LOOK_AGAIN_MS } else { CANNOT_MOVE_AGAIN_MS };
                    lock(&self.access.retry_after).insert(key, now + wait);
                }
                Err(e) => {
                    tracing::error!(environment = %environment_id, node_id, error = %e, "cannot book a replacement node");
                }
            }
        }
        let unmoved: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT c.environment_id FROM cluster_node_replacements c
             JOIN environments e ON e.id = c.environment_id
             WHERE c.moved_at IS NULL AND c.replacement_node_id IS NOT NULL
               AND e.state = 'ready' AND e.desired = 'running'",
        )
        .fetch_all(&self.db)
        .await?;
        for id in unmoved {
            let backend = backend.clone();
            self.spawn_running_change(id, now, "moving a cluster", tasks, move |this, id| async move {
                this.move_cluster(&backend, &id, timeout).await
            });
        }
        Ok(())
    }

    /// Books a node in place of `node_id` for cluster `environment_id` from now to its end,
    /// or records (once) that none is free and when one will be. The owner is told either
    /// way. Whether a node was booked.
    async fn book_replacement(&self, backend: &dyn Backend, environment_id: &str, node_id: i64) -> Result<bool, Error> {
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        let env = environment_in(&mut tx, environment_id).await?;
        let (failed_name, site_id, reason): (String, i64, Option<String>) = sqlx::query_as(
            "SELECT n.name, n.site_id,
                    (SELECT c.reason FROM node_state_changes c WHERE c.node_id = n.id ORDER BY c.id DESC LIMIT 1)
             FROM nodes n WHERE n.id = ?",
        )
        .bind(node_id)
        .fetch_one(&mut *tx)
        .await?;
        let reason = reason.unwrap_or_else(|| "it no longer takes bookings".to_owned());
        let known: Option<(Option<i64>, Option<String>)> = sqlx::query_as(
            "SELECT next_free_at, problem FROM cluster_node_replacements WHERE environment_id = ? AND failed_node_id = ?",
        )
        .bind(environment_id)
        .bind(node_id)
        .fetch_optional(&mut *tx)
        .await?;
        let model = env.size.gpu_model();
        let one_node = Shape::Nodes { model, count: 1 };
        let window = Window { starts_at: now, ends_at: env.ends_at };
        let occupant = crate::capacity::book::occupant_of(&mut tx, env.tenant_id).await?;
        let timeline = self.timeline_in(&mut tx, model, now, Some(window)).await?;
        // Only a node of the failed one's site: the cluster's network and storage reach it.
        let placed = match timeline.place(one_node, window, occupant) {
            Ok(holds) if backend.moves_clusters() => {
                let (site, name): (i64, String) = sqlx::query_as(
                    "SELECT n.site_id, n.name FROM gpus g JOIN nodes n ON n.id = g.node_id WHERE g.id = ?",
                )
                .bind(holds[0].gpu_id)
                .fetch_one(&mut *tx)
                .await?;
                (site == site_id).then_some((holds, name))
            }
            _ => None,
        };
        let Some((holds, replacement)) = placed else {
            let problem = (!backend.moves_clusters())
                .then(|| format!("Berth cannot move a cluster to another node on the {} backend yet", backend.name()));
            let next_free_at = timeline
                .earliest_start(one_node, rules::HOUR_MS, now, env.ends_at, occupant)
                .filter(|_| problem.is_none());
            if known.as_ref().is_some_and(|(at, said)| *at == next_free_at && *said == problem) {
                return Ok(false); // nothing new to say
            }
            sqlx::query(
                "INSERT INTO cluster_node_replacements (environment_id, failed_node_id, reason, decided_at, next_free_at, problem)
                 VALUES (?, ?, ?, ?, ?, ?)
                 ON CONFLICT (environment_id, failed_node_id) DO UPDATE SET
                     next_free_at = excluded.next_free_at, problem = excluded.problem",
            )
            .bind(environment_id)
            .bind(node_id)
            .bind(&reason)
            .bind(now)
            .bind(next_free_at)
            .bind(&problem)
            .execute(&mut *tx)
            .await?;
            if known.is_none() {
                let when = match (&problem, next_free_at) {
                    (Some(problem), _) => problem.clone(),
                    (None, Some(at)) => format!("none of its kind is free now; the first is from {}", utc_short(at)),
                    (None, None) => "none of its kind is free before the cluster's window ends".to_owned(),
                };
                let notice = Notice::cluster_node_lost(&env.id, &env.name, &failed_name, &reason, None, &when);
                self.notify(&mut tx, env.tenant_id, &[env.owner_id], &notice).await?;
            }
            tx.commit().await?;
            return Ok(false);
        };
        // The same size as before, one node for another: quotas and budgets hold as booked.
        crate::capacity::environments::insert_reservations(&mut tx, environment_id, &holds, window, 0, now).await?;
        sqlx::query(
            "INSERT INTO cluster_node_replacements (environment_id, failed_node_id, reason, decided_at,
                 replacement_node_id, replaced_at)
             VALUES (?1, ?2, ?3, ?4, (SELECT node_id FROM gpus WHERE id = ?5), ?4)
             ON CONFLICT (environment_id, failed_node_id) DO UPDATE SET
                 replacement_node_id = excluded.replacement_node_id, replaced_at = excluded.replaced_at,
                 next_free_at = NULL, problem = NULL",
        )
        .bind(environment_id)
        .bind(node_id)
        .bind(&reason)
        .bind(now)
        .bind(holds[0].gpu_id)
        .execute(&mut *tx)
        .await?;
        let detail = format!("{failed_name} ({reason}) replaced by {replacement} until {}", utc_short(env.ends_at));
        let event = Event {
            action: "cluster.replace_node",
            target: Some(environment_id),
            outcome: Outcome::Success,
            detail: Some(&detail),
        };
        audit::record(&mut tx, &Actor::background(env.tenant_id), event).await?;
        let notice = Notice::cluster_node_lost(&env.id, &env.name, &failed_name, &reason, Some(&replacement), "");
        self.notify(&mut tx, env.tenant_id, &[env.owner_id], &notice).await?;
        let (booker, spot) = (env.booker(), env.tier == rules::Tier::Spot);
        tx.commit_and(|| self.with_book(|book| book.add(environment_id, booker, occupant, &holds, window, spot)))
            .await?;
        tracing::info!(environment = %environment_id, failed = %failed_name, %replacement, "replacement node booked");
        self.wake_reconciler();
        Ok(true)
    }

    /// Has the backend move cluster `id` off its failed nodes whose replacements are booked,
    /// then releases those nodes' reservations. A failure is shown on its page and tried again.
    async fn move_cluster(&self, backend: &Arc<dyn Backend>, id: &str, timeout: Duration) -> Result<(), Error> {
        let mut conn = self.db.acquire().await?;
        let env = environment_in(&mut conn, id).await?;
        let leaving: Vec<String> = sqlx::query_scalar(
            "SELECT n.name FROM cluster_node_replacements c JOIN nodes n ON n.id = c.failed_node_id
             WHERE c.environment_id = ? AND c.moved_at IS NULL AND c.replacement_node_id IS NOT NULL",
        )
        .bind(id)
        .fetch_all(&mut *conn)
        .await?;
        let (workload, dropped) = kept_and_dropped(&mut conn, &env, |u| leaving.contains(&u.node)).await?;
        drop(conn);
        let connection = match applied_within(timeout, backend.move_cluster(&workload, &dropped)).await {
            Ok(connection) => connection,
            Err(message) => {
                tracing::warn!(environment = %id, error = %message, "moving the cluster failed; will retry");
                self.retry_running_change_after(id, now_ms() + MOVE_RETRY_MS);
                sqlx::query(
                    "UPDATE cluster_node_replacements SET problem = ? WHERE environment_id = ? AND moved_at IS NULL
                   AND replacement_node_id IS NOT NULL",
                )
                .bind(format!("moving the cluster failed (tried again): {message}"))
                .bind(id)
                .execute(&self.db)
                .await?;
                return Ok(());
            }
        };
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        // Its page's connection details name the nodes it runs on now.
        let connection = serde_json::to_string(&connection).map_err(Error::internal)?;
        sqlx::query("UPDATE environments SET connection = ? WHERE id = ?")
            .bind(connection)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let names = serde_json::to_string(&leaving).map_err(Error::internal)?;
        let released = sqlx::query(
            "UPDATE reservations SET released_at = ? WHERE environment_id = ? AND released_at IS NULL
               AND gpu_id IN (SELECT g.id FROM gpus g JOIN nodes n ON n.id = g.node_id
                              WHERE n.name IN (SELECT value FROM json_each(?)))",
        )
        .bind(now)
        .bind(id)
        .bind(&names)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        sqlx::query(
            "UPDATE cluster_node_replacements SET moved_at = ?, problem = NULL
             WHERE environment_id = ? AND moved_at IS NULL AND replacement_node_id IS NOT NULL",
        )
        .bind(now)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        // The failed nodes' charges end here.
        self.commit_partial_release(tx, &env, released).await?;
        tracing::info!(environment = %id, ?leaving, released, "cluster moved off its failed nodes");
        Ok(())
    }

    /// The nodes cluster `id` lost and what took their place, oldest first.
    pub(crate) async fn node_replacements(
        &self,
        conn: &mut sqlx::SqliteConnection,
        id: &str,
    ) -> Result<Vec<NodeReplacement>, Error> {
        sqlx::query(
            "SELECT f.name AS failed, c.reason, c.decided_at, r.name AS replacement, c.replaced_at, c.next_free_at,
                    c.problem, c.moved_at
             FROM cluster_node_replacements c JOIN nodes f ON f.id = c.failed_node_id
             LEFT JOIN nodes r ON r.id = c.replacement_node_id
             WHERE c.environment_id = ? ORDER BY c.id",
        )
        .bind(id)
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(|row| {
            Ok(NodeReplacement {
                failed_node: row.try_get("failed")?,
                reason: row.try_get("reason")?,
                decided_at: row.try_get("decided_at")?,
                replacement: row.try_get("replacement")?,
                replaced_at: row.try_get("replaced_at")?,
                next_free_at: row.try_get("next_free_at")?,
                problem: row.try_get("problem")?,
                moved_at: row.try_get("moved_at")?,
            })
        })
        .collect()
    }
}
