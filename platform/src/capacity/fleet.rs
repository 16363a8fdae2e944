//! The GPU inventory in the database, kept in step with the fleet description.

use berth_domain::booking::GpuSet;
use berth_domain::fleet::FleetSpec;
use berth_domain::gpu::GpuModel;
use berth_domain::placement::GpuUnit;
use std::collections::HashMap;
use std::sync::Arc;

use sqlx::{Row, SqliteConnection};

use crate::{Error, Platform, read, write};

/// How much of one GPU model the fleet has, and how much is free now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelCapacity {
    pub model: GpuModel,
    pub gpus: i64,
    /// GPUs with nothing on them, on nodes that take bookings.
    pub idle_gpus: i64,
}

impl Platform {
    /// Adds nodes and GPUs the description names and takes out of service those it no
    /// longer names (their history stays). Safe to run at every start.
    pub async fn sync_fleet(&self, fleet: &FleetSpec) -> Result<(), Error> {
        let mut tx = self.begin_write().await?;
        sqlx::query("UPDATE nodes SET in_service = 0").execute(&mut *tx).await?;
        sqlx::query("UPDATE gpus SET in_service = 0").execute(&mut *tx).await?;
        for node in &fleet.nodes {
            sqlx::query("INSERT INTO sites (name) VALUES (?) ON CONFLICT (name) DO NOTHING")
                .bind(&node.site)
                .execute(&mut *tx)
                .await?;
            // A node first seen starts available, or new when its pool asks for acceptance;
            // a node Berth knows keeps its lifecycle state (`provisioning::node_health`).
            let node_id: i64 = sqlx::query_scalar(
                "INSERT INTO nodes (site_id, name, gpu_model, nvlink_domain, ib_unit, in_service, state)
                 VALUES ((SELECT id FROM sites WHERE name = ?), ?, ?, ?, ?, 1, ?)
                 ON CONFLICT (name) DO UPDATE SET
                    site_id = excluded.site_id, gpu_model = excluded.gpu_model,
                    nvlink_domain = excluded.nvlink_domain, ib_unit = excluded.ib_unit, in_service = 1
                 RETURNING id",
            )
            .bind(&node.site)
            .bind(&node.name)
            .bind(node.model.name())
            .bind(&node.nvlink_domain)
            .bind(&node.ib_unit)
            .bind(if node.needs_acceptance { "new" } else { "available" })
            .fetch_one(&mut *tx)
            .await?;
            for idx in 0..node.gpus {
                sqlx::query(
                    "INSERT INTO gpus (node_id, idx, model, mig_enabled, time_slices, ib_rail, in_service)
                     VALUES (?, ?, ?, ?, ?, ?, 1)
                     ON CONFLICT (node_id, idx) DO UPDATE SET
                        model = excluded.model, mig_enabled = excluded.mig_enabled,
                        time_slices = excluded.time_slices, ib_rail = excluded.ib_rail, in_service = 1",
                )
                .bind(node_id)
                .bind(idx)
                .bind(node.model.name())
                .bind(node.mig_enabled)
                .bind(node.time_slices)
                .bind((node.ib_rails > 0).then(|| idx % node.ib_rails))
                .execute(&mut *tx)
                .await?;
            }
        }
        // Tenants without a limit of a model may hold the fleet's capacity of it.
        crate::capacity::quotas::follow(&mut tx, None).await?;
        tx.commit_and(|| self.forget_fleet()).await?;
        Ok(())
    }

    /// Drops the in-memory fleet, to be read again at the next use.
    pub(crate) fn forget_fleet(&self) {
        write(&self.fleet).clear();
        self.calendars.changed();
    }

    /// GPUs per model and how many are free now, for the catalog: healthy, on an available
    /// node, and no part of it held by a booking now (a booking ahead does not hold it yet;
    /// one past its end holds it until its teardown releases it). The launch form counts
    /// sizes that fit for a duration from a start, from the same reservations.
    pub async fn capacity_by_model(&self) -> Result<Vec<ModelCapacity>, Error> {
        let rows = sqlx::query(
            "SELECT g.model AS model, count(*) AS gpus,
                    sum(n.state = 'available' AND g.health = 'healthy' AND NOT EXISTS (
                        SELECT 1 FROM reservations r
                        WHERE r.gpu_id = g.id AND r.released_at IS NULL AND r.starts_at <= ?)) AS idle
             FROM gpus g JOIN nodes n ON n.id = g.node_id
             WHERE g.in_service = 1 GROUP BY g.model ORDER BY g.model",
        )
        .bind(crate::now_ms())
        .fetch_all(&self.db)
        .await?;
        let mut out = Vec::new();
        for row in rows {
            let name: String = row.try_get("model")?;
            if let Some(model) = GpuModel::parse(&name) {
                out.push(ModelCapacity { model, gpus: row.try_get("gpus")?, idle_gpus: row.try_get("idle")? });
            }
        }
        Ok(out)
    }
}

impl Platform {
    /// The in-service GPUs of `model` that take new bookings (healthy, on an available
    /// node), as placement and the calendar see them. Bookings already on other GPUs keep
    /// running: the reconciler and the book do not read this set.
    pub(crate) async fn gpus_of_model(
        &self,
        conn: &mut SqliteConnection,
        model: GpuModel,
    ) -> Result<Arc<GpuSet>, Error> {
        let cached = read(&self.fleet).get(&model).cloned();
        if let Some(gpus) = cached {
            return Ok(gpus);
        }
        let gpus = Arc::new(GpuSet::new(read_gpus_of_model(conn, model).await?));
        write(&self.fleet).insert(model, gpus.clone());
        Ok(gpus)
    }
}

async fn read_gpus_of_model(conn: &mut SqliteConnection, model: GpuModel) -> Result<Vec<GpuUnit>, Error> {
    // A domain name shared by several nodes is a multi-node NVLink domain.
    let rows = sqlx::query(
        "SELECT g.id, g.node_id, g.mig_enabled, g.time_slices, n.site_id, n.ib_unit,
                CASE WHEN (SELECT count(*) FROM nodes m WHERE m.nvlink_domain = n.nvlink_domain AND m.in_service = 1) > 1
                     THEN n.nvlink_domain END AS shared_domain
         FROM gpus g JOIN nodes n ON n.id = g.node_id
         WHERE g.in_service = 1 AND g.health = 'healthy' AND n.state = 'available' AND g.model = ?
         ORDER BY g.id",
    )
    .bind(model.name())
    .fetch_all(&mut *conn)
    .await?;
    // Placement compares domains and units by number; names become numbers here.
    let mut numbers: HashMap<String, i64> = HashMap::new();
    let mut number = |name: Option<String>| {
        name.map(|n| {
            let next = i64::try_from(numbers.len()).unwrap_or(i64::MAX);
            *numbers.entry(n).or_insert(next)
        })
    };
    rows.into_iter()
        .map(|row| {
            let nvlink_domain = number(row.try_get("shared_domain")?);
            let ib_unit = number(row.try_get::<Option<String>, _>("ib_unit")?.map(|u| format!("ib:{u}"))).unwrap_or(-1);
            Ok(GpuUnit {
                nvlink_domain,
                ib_unit,
                id: row.try_get("id")?,
                node_id: row.try_get("node_id")?,
                model,
                mig_capable: row.try_get("mig_enabled")?,
                fabric: row.try_get("site_id")?,
                time_slices: row.try_get("time_slices")?,
            })
        })
        .collect()
}
