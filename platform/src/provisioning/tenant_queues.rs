//! Each tenant's queue on the backend (Kubernetes: a Kueue ClusterQueue) mirrors its Berth
//! quota, and a soft tenant's space there (Kubernetes: its namespace) holds what its
//! environments in it hold and lets its members in. Whatever they must follow (the tenant's
//! quota set or removed, the fleet changed, a member's role, an environment of the tenant
//! started, scaled or released, the isolation changed, the tenant deleted) raises the
//! tenant's `queue_version` in the transaction of that change; the reconciler applies the
//! queue and space (or removes a deleted tenant's) and records the version it did that
//! for. So a change is never lost to a crash, and a change that arrives while the backend
//! is being called makes the reconciler go again. One tenant's syncs never overlap (see
//! `QueueSyncs::in_flight`) and each reads the version before what it applies, so the
//! last apply reflects every change committed before it: what makes environments starting
//! and ending at once converge on one quota. Every sweep interval every live tenant's
//! queue is applied again, which repairs drift (someone edited the queue) and follows
//! fleet changes made behind Berth's back.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_domain::gpu::GpuModel;
use sqlx::{Row, SqliteConnection};
use tokio::task::JoinSet;

use crate::capacity::quotas::{follow, tenant_quota};
use crate::provisioning::backend::{Backend, ModelAllowance, TenantQueue, TenantSpace};
use crate::{Error, Platform, lock, now_ms};

/// The reconciler's bookkeeping of queue syncs in this process.
#[derive(Debug, Default)]
pub(crate) struct QueueSyncs {
    /// Tenants whose sync runs now.
    in_flight: Mutex<HashSet<i64>>,
    /// Tenants whose last sync failed, with when to try again (ms since the epoch).
    retry_at: Mutex<HashMap<i64, i64>>,
}

impl Platform {
    /// The queue that mirrors tenant `tenant_id`'s quota over today's fleet.
    pub async fn tenant_queue(&self, tenant_id: i64) -> Result<TenantQueue, Error> {
        let mut conn = self.db.acquire().await?;
        tenant_queue_of(&mut conn, tenant_id).await
    }

    /// Starts a sync for every tenant whose queue is behind, unless one runs for it or
    /// its last failure is too recent. Each runs as a task of `tasks`, within `timeout`;
    /// a failure is logged and tried again after `retry`.
    pub(crate) async fn sync_tenant_queues(
        &self,
        backend: &Arc<dyn Backend>,
        syncs: &Arc<QueueSyncs>,
        timeout: Duration,
        retry: Duration,
        tasks: &mut JoinSet<()>,
    ) -> Result<(), Error> {
        let behind: Vec<i64> =
            sqlx::query_scalar("SELECT id FROM tenants WHERE queue_synced < queue_version").fetch_all(&self.db).await?;
        let now = now_ms();
        for id in behind {
            if lock(&syncs.retry_at).get(&id).is_some_and(|&at| at > now) || !lock(&syncs.in_flight).insert(id) {
                continue;
            }
            let (this, backend, syncs) = (self.clone(), backend.clone(), syncs.clone());
            tasks.spawn(async move {
                match this.sync_tenant_queue(&backend, id, timeout).await {
                    Ok(()) => {
                        lock(&syncs.retry_at).remove(&id);
                    }
                    Err(e) => {
                        tracing::warn!(tenant = id, error = %e, "tenant queue sync failed; will retry");
                        lock(&syncs.retry_at).insert(id, now_ms() + retry.as_millis() as i64);
                    }
                }
                lock(&syncs.in_flight).remove(&id);
            });
        }
        Ok(())
    }

    /// Brings one tenant's queue in line and records the version that was for.
    async fn sync_tenant_queue(&self, backend: &Arc<dyn Backend>, id: i64, timeout: Duration) -> Result<(), Error> {
        let mut conn = self.db.acquire().await?;
        // The version first, the quota after: a change committed in between is then
        // applied with the older version recorded, and the newer one runs again. (The other
        // order could record a version whose quota was never applied.)
        let (version, slug, status): (i64, String, String) =
            sqlx::query_as("SELECT queue_version, slug, status FROM tenants WHERE id = ?")
                .bind(id)
                .fetch_one(&mut *conn)
                .await?;
        let call = if status == "deleted" {
            drop(conn);
            let removal = tokio::time::timeout(timeout, backend.remove_tenant_queue(&slug)).await;
            removal
                .map(|removed| removed.map(|removed| tracing::info!(tenant = %slug, removed, "tenant queue removed")))
        } else {
            let queue = tenant_queue_of(&mut conn, id).await?;
            drop(conn);
            tokio::time::timeout(timeout, backend.apply_tenant_queue(&queue)).await
        };
        let failure = match call {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.0),
            Err(_) => Some(format!("no answer within {} s", timeout.as_secs_f64())),
        };
        let mut tx = self.begin_write().await?;
        if let Some(why) = failure {
            sqlx::query(
                "UPDATE tenants SET queue_error = ?1, queue_failing_since = coalesce(queue_failing_since, ?2) WHERE id = ?3",
            )
            .bind(&why)
            .bind(now_ms())
            .bind(id)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            return Err(Error::internal(format!("tenant {slug}'s queue: {why}")));
        }
        sqlx::query(
            "UPDATE tenants SET queue_synced = max(queue_synced, ?1), queue_error = NULL, queue_failing_since = NULL
             WHERE id = ?2",
        )
        .bind(version)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await
    }

    /// Every live tenant's queue is applied again (see the module's comment).
    pub(crate) async fn reapply_tenant_queues(&self) -> Result<(), Error> {
        let mut tx = self.begin_write().await?;
        follow(&mut tx, None).await?;
        tx.commit().await
    }
}

/// What tenant `tenant_id` may hold of each GPU model of the fleet (its own quota row's
/// limit, or without one the fleet's capacity), and how the fleet offers each model.
async fn tenant_queue_of(conn: &mut SqliteConnection, tenant_id: i64) -> Result<TenantQueue, Error> {
    let slug: String =
        sqlx::query_scalar("SELECT slug FROM tenants WHERE id = ?").bind(tenant_id).fetch_one(&mut *conn).await?;
    let quota = tenant_quota(&mut *conn, tenant_id).await?.unwrap_or_default();
    let nodes: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM nodes n WHERE n.in_service = 1
         AND EXISTS (SELECT 1 FROM gpus g WHERE g.node_id = n.id AND g.in_service = 1)",
    )
    .fetch_one(&mut *conn)
    .await?;
    let rows = sqlx::query(
        "SELECT g.model, g.mig_enabled, g.time_slices, count(*) AS gpus
         FROM gpus g JOIN nodes n ON n.id = g.node_id
         WHERE g.in_service = 1 AND n.in_service = 1
         GROUP BY g.model, g.mig_enabled, g.time_slices ORDER BY g.model, g.time_slices",
    )
    .fetch_all(&mut *conn)
    .await?;
    let mut models: BTreeMap<GpuModel, ModelAllowance> = BTreeMap::new();
    for row in &rows {
        let name: String = row.try_get("model")?;
        let model = GpuModel::parse(&name).ok_or_else(|| Error::internal(format!("unknown GPU model {name}")))?;
        let mig: bool = row.try_get("mig_enabled")?;
        let ways: i64 = row.try_get("time_slices")?;
        let gpus = u32::try_from(row.try_get::<i64, _>("gpus")?).unwrap_or(u32::MAX);
        let allowance = models.entry(model).or_insert_with(|| ModelAllowance {
            model,
            gpus: 0.0,
            whole_gpus: 0,
            mig_gpus: 0,
            shared_gpus: Vec::new(),
        });
        if ways > 1 {
            allowance.shared_gpus.push((u8::try_from(ways).unwrap_or(u8::MAX), gpus));
        } else {
            allowance.whole_gpus += gpus;
            if mig {
                allowance.mig_gpus += gpus;
            }
        }
    }
    for allowance in models.values_mut() {
        // A time-sliced GPU is one GPU-equivalent, however many shares it makes.
        let capacity =
            f64::from(allowance.whole_gpus) + allowance.shared_gpus.iter().map(|&(_, n)| f64::from(n)).sum::<f64>();
        allowance.gpus = quota.max_gpus_of(allowance.model).map_or(capacity, |limit| limit.min(capacity));
    }
    // A soft tenant's space: its members and what its environments there hold, read after
    // the version (see `sync_tenant_queue`).
    let scope = crate::provisioning::workloads::tenant_scope(&mut *conn, Some(tenant_id)).await?;
    let space = if scope.isolation == berth_domain::tenancy::Isolation::Soft {
        let holdings =
            crate::provisioning::workloads::tenant_holdings(&mut *conn, tenant_id, scope.isolation, None).await?;
        let volumes = crate::capacity::volumes::tenant_volume_sizes(&mut *conn, tenant_id).await?;
        Some(TenantSpace { members: scope.members, holdings, volumes })
    } else {
        None
    };
    Ok(TenantQueue {
        space,
        slug,
        spot: quota.allow_spot,
        nodes: u32::try_from(nodes).unwrap_or(u32::MAX),
        models: models.into_values().collect(),
    })
}
