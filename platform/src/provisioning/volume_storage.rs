//! Volumes on the backend: where each is kept (`record_locations`, before the start step
//! of a workload that mounts it), its size held by the storage where the backend can
//! (`hold_sizes`, before that step and every reconciler pass, so a grown volume's limit
//! follows), what it holds (`measure`, in the periodic sweep), and the
//! storage of deleted volumes removed (`follow_deletions`, every reconciler pass). A
//! deleted tenant's volumes are deleted here too, once none of its environments is live
//! any more: they are attached until their environments release, and a volume is never
//! deleted while attached.

use std::collections::HashMap;

use berth_domain::volume;

use crate::audit::{self, Actor, Event, Outcome};
use crate::provisioning::backend::{Backend, StoredVolume, Workload};
use crate::{Error, Platform, now_ms};

impl Platform {
    /// How a volume's size holds on this Berth's backend, for the volumes page; `None`
    /// without a backend.
    pub fn volume_size_rule(&self) -> Option<&'static str> {
        self.backend().ok().map(|backend| backend.volume_size_rule())
    }
}

/// Keeps where the backend is about to put the volumes of `workload` that have no place
/// yet: written before the start step makes anything, so a volume whose storage exists
/// always has a place to remove it from (a step cut by a crash or a stop after it made the
/// storage leaves nothing unaccounted).
pub(crate) async fn record_locations(
    platform: &Platform,
    backend: &dyn Backend,
    workload: &Workload,
) -> Result<(), Error> {
    if workload.volumes.is_empty() {
        return Ok(());
    }
    let mut tx = platform.begin_write().await?;
    for volume in &workload.volumes {
        sqlx::query("UPDATE volumes SET location = ? WHERE id = ? AND location IS NULL")
            .bind(backend.volume_location(workload, volume))
            .bind(volume.volume_id)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    let ids: Vec<i64> = workload.volumes.iter().map(|v| v.volume_id).collect();
    hold_sizes(platform, backend, Some(&ids)).await
}

/// Tells the backend each live volume's size, where its storage holds sizes itself (XFS
/// project quotas on bare metal): only `volumes`, or every live volume with a place. The
/// backend skips what it already holds and logs what it cannot.
pub(crate) async fn hold_sizes(
    platform: &Platform,
    backend: &dyn Backend,
    volumes: Option<&[i64]>,
) -> Result<(), Error> {
    if !backend.holds_volume_sizes() {
        return Ok(());
    }
    let live: Vec<(i64, String, i64)> = sqlx::query_as(
        "SELECT id, location, size_gib FROM volumes WHERE deleted_at IS NULL AND location IS NOT NULL ORDER BY id",
    )
    .fetch_all(&platform.db)
    .await?;
    for (volume_id, location, size_gib) in live {
        if volumes.is_some_and(|only| !only.contains(&volume_id)) {
            continue;
        }
        let size_gib = u32::try_from(size_gib).unwrap_or(u32::MAX);
        backend.hold_volume_size(&StoredVolume { volume_id, location }, size_gib).await;
    }
    Ok(())
}

/// Deletes the volumes of deleted tenants once nothing of theirs is live (audited, as
/// Berth), then removes the storage of every deleted volume the backend still holds.
pub(crate) async fn follow_deletions(platform: &Platform, backend: &dyn Backend) -> Result<(), Error> {
    let pending: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM volumes v WHERE (v.deleted_at IS NOT NULL AND v.storage_removed_at IS NULL)
            OR (v.deleted_at IS NULL AND v.tenant_id IN (SELECT id FROM tenants WHERE status = 'deleted'))",
    )
    .fetch_one(&platform.db)
    .await?;
    if pending == 0 {
        return Ok(());
    }
    let now = now_ms();
    let mut tx = platform.begin_write().await?;
    let gone: Vec<(i64, Option<i64>, String)> = sqlx::query_as(
        "UPDATE volumes SET deleted_at = ?1
         WHERE deleted_at IS NULL AND tenant_id IN (SELECT id FROM tenants WHERE status = 'deleted')
           AND NOT EXISTS (SELECT 1 FROM environments e WHERE e.tenant_id = volumes.tenant_id
                           AND e.state NOT IN ('released', 'failed'))
           AND NOT EXISTS (SELECT 1 FROM volume_attachments a WHERE a.volume_id = volumes.id AND a.detached_at IS NULL)
         RETURNING id, tenant_id, name",
    )
    .bind(now)
    .fetch_all(&mut *tx)
    .await?;
    for (id, tenant_id, name) in &gone {
        let target = format!("volume:{id}");
        let detail = format!("{name}: its tenant was deleted and everything of it has stopped");
        let event =
            Event { action: "volume.delete", target: Some(&target), outcome: Outcome::Success, detail: Some(&detail) };
        audit::record(&mut tx, &Actor::background(*tenant_id), event).await?;
    }
    tx.commit().await?;
    let deleted: Vec<(i64, Option<String>, Option<i64>)> = sqlx::query_as(
        "SELECT id, location, tenant_id FROM volumes WHERE deleted_at IS NOT NULL AND storage_removed_at IS NULL",
    )
    .fetch_all(&platform.db)
    .await?;
    for (volume_id, location, tenant_id) in deleted {
        // Never made on the backend: there is nothing to remove.
        let removed = match location {
            None => Ok(false),
            Some(location) => backend.remove_volume(&StoredVolume { volume_id, location }).await,
        };
        match removed {
            Ok(_) => {
                let mut tx = platform.begin_write().await?;
                sqlx::query("UPDATE volumes SET storage_removed_at = ? WHERE id = ? AND storage_removed_at IS NULL")
                    .bind(now_ms())
                    .bind(volume_id)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
            }
            Err(e) => {
                tracing::warn!(volume = volume_id, tenant = ?tenant_id, error = %e, "could not remove a deleted volume's storage; will retry");
            }
        }
    }
    Ok(())
}

/// Measures what each live volume the backend holds takes, where it can, all in one call to
/// the backend bounded by `within`. A figure that is not the volume's own (a shared
/// export's, `domain::volume::own_use`) is not recorded; a volume the backend did not
/// measure this time (Kubernetes: no running pod mounts its claim, or its node did not
/// answer) keeps its last figure and the time it was taken, as its page shows.
pub(crate) async fn measure(
    platform: &Platform,
    backend: &dyn Backend,
    within: std::time::Duration,
) -> Result<(), Error> {
    let live: Vec<(i64, String, i64)> = sqlx::query_as(
        "SELECT id, location, size_gib FROM volumes WHERE deleted_at IS NULL AND location IS NOT NULL ORDER BY id",
    )
    .fetch_all(&platform.db)
    .await?;
    if live.is_empty() {
        return Ok(());
    }
    let sizes: HashMap<i64, u32> =
        live.iter().map(|(id, _, size)| (*id, u32::try_from(*size).unwrap_or(u32::MAX))).collect();
    let stored: Vec<StoredVolume> =
        live.into_iter().map(|(volume_id, location, _)| StoredVolume { volume_id, location }).collect();
    let Ok(measured) = tokio::time::timeout(within, backend.volumes_use(&stored)).await else {
        tracing::warn!(
            volumes = stored.len(),
            "measuring volumes took over {} s; they keep their last figures",
            within.as_secs()
        );
        return Ok(());
    };
    if measured.is_empty() {
        return Ok(());
    }
    let now = now_ms();
    let mut tx = platform.begin_write().await?;
    for found in measured {
        let Some(&size_gib) = sizes.get(&found.volume_id) else { continue };
        let Some(bytes) = volume::own_use(size_gib, found.used_bytes, found.capacity_bytes) else {
            tracing::debug!(
                volume = found.volume_id,
                capacity = ?found.capacity_bytes,
                "a volume's figure is of a filesystem larger than the volume (a shared export); not its use"
            );
            continue;
        };
        sqlx::query("UPDATE volumes SET used_bytes = ?, measured_at = ? WHERE id = ? AND deleted_at IS NULL")
            .bind(i64::try_from(bytes).unwrap_or(i64::MAX))
            .bind(now)
            .bind(found.volume_id)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}
