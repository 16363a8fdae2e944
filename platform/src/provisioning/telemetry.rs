//! GPU telemetry: readings kept per booked GPU or MIG slice, the environment page's
//! charts, the fleet's and tenants' busy GPU-hours, and the worker that collects them.
//!
//! A reading (`berth_domain::telemetry::GpuReading`) is attributed to the reservation
//! that holds its GPU or slice when it is recorded, and summed into a one-minute and a
//! five-minute bucket (`gpu_samples`, `0034`): one upsert per resolution, so the store
//! is downsampled as it is written. [`Platform::prune_samples`] deletes buckets past their
//! age (two hours, a day and an hour), so the table's size follows the number of GPUs
//! held, not the time Berth has run. Each reading also adds its GPU-seconds, and its busy
//! share of them, to its day, tenant and model (`gpu_use_days`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use berth_domain::policy::Action;
use berth_domain::telemetry::{COARSE, COARSE_KEPT_MS, FINE, FINE_KEPT_MS, GpuReading, Resolution};
use sqlx::{Row, SqliteConnection};

use super::backend::Backend;
use crate::access::Scope;
use crate::{Caller, Error, Platform, lock, now_ms};

/// One bucket of an environment's GPUs: averages over its GPUs or slices, except memory
/// and power, which are their sums.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuUsePoint {
    /// The bucket's start, ms since the epoch.
    pub at: i64,
    pub utilization_pct: f64,
    pub memory_used_mib: f64,
    pub memory_total_mib: f64,
    /// `None` where no reading had power.
    pub power_w: Option<f64>,
    pub temperature_c: Option<f64>,
}

/// What an environment's GPUs did: the last hour at one-minute buckets and the last day at
/// five-minute buckets.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EnvironmentGpuUse {
    pub hour: Vec<GpuUsePoint>,
    pub day: Vec<GpuUsePoint>,
    /// XID errors raised on its GPUs while it held them, newest first (the last 50).
    pub xid_errors: Vec<XidError>,
}

/// An XID error a node's agent reported on a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidError {
    pub node: String,
    pub gpu_index: i64,
    pub code: u32,
    /// When the report carrying it arrived.
    pub seen_at: i64,
}

impl XidError {
    /// "XID 79 on GPU 3 (GPU has fallen off the bus)".
    pub fn describe(&self) -> String {
        let fatal = if berth_domain::node_checks::is_fatal_xid(self.code) { ", fatal" } else { "" };
        format!(
            "XID {} on {} GPU {} ({}{fatal})",
            self.code,
            self.node,
            self.gpu_index,
            berth_domain::agent::xid_meaning(self.code)
        )
    }
}

/// How long XID errors are kept.
const XID_KEPT_MS: i64 = 30 * 86_400_000;

/// XID errors, newest first, from rows of (node, GPU index, code, seen at).
pub(crate) async fn xid_errors<'q>(
    conn: &mut sqlx::SqliteConnection,
    query: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
) -> Result<Vec<XidError>, Error> {
    query
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(|row| {
            Ok(XidError {
                node: row.try_get(0)?,
                gpu_index: row.try_get(1)?,
                code: u32::try_from(row.try_get::<i64, _>(2)?).unwrap_or(u32::MAX),
                seen_at: row.try_get(3)?,
            })
        })
        .collect()
}

/// A reading's GPU-seconds and busy GPU-seconds per day, tenant and model.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuUseDay {
    pub day: String,
    /// `None` for platform staff's own environments.
    pub tenant: Option<String>,
    pub model: String,
    pub read_gpu_hours: f64,
    pub busy_gpu_hours: f64,
}

/// The latest one-minute bucket of each GPU or slice a live environment holds (`/metrics`).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuNow {
    pub tenant: String,
    pub project: String,
    pub environment: String,
    pub node: String,
    /// `3` for a whole GPU or a share, `3/mig4` for the MIG slice starting at memory slice 4.
    pub gpu: String,
    pub utilization_pct: f64,
    pub memory_used_mib: f64,
    pub power_w: Option<f64>,
    pub temperature_c: Option<f64>,
}

/// Readings kept per write transaction (about 30 ms of writing each).
pub const READINGS_PER_TURN: usize = 500;

/// What one batch of readings came to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recorded {
    /// Readings kept (a reading on a GPU two bookings share counts once).
    pub kept: usize,
    /// Readings of GPUs no live booking holds, or implausible ones: dropped.
    pub dropped: usize,
}

/// The reservations a reading belongs to: live ones on its node and GPU that had started,
/// narrowed to its environment when the source knows it, to the MIG slice at its start
/// when it names one, and otherwise to whole GPUs and time-sliced shares (a whole GPU's
/// reading says nothing about one MIG slice of it). With each, its weight in
/// GPU-equivalents (a MIG profile's compute slices of 7, a share's memory slices of 8),
/// its tenant (0 for staff's own) and its GPU's model.
const HOLDERS: &str = "SELECT r.id, coalesce(e.tenant_id, 0) AS tenant_id, g.model,
        CASE WHEN r.mig_profile IS NULL THEN r.slice_size / 8.0
             ELSE CAST(substr(r.mig_profile, 1, 1) AS INTEGER) / 7.0 END AS weight
    FROM reservations r JOIN gpus g ON g.id = r.gpu_id JOIN nodes n ON n.id = g.node_id
    JOIN environments e ON e.id = r.environment_id
    WHERE n.name = ?1 AND g.idx = ?2 AND r.released_at IS NULL AND r.starts_at <= ?3
      AND e.state IN ('provisioning', 'ready')
      AND CASE WHEN ?4 IS NOT NULL THEN r.environment_id = ?4 AND (?5 IS NULL OR r.slice_start = ?5)
               WHEN ?5 IS NOT NULL THEN r.mig_profile IS NOT NULL AND r.slice_start = ?5
               ELSE r.mig_profile IS NULL END";

const ADD_TO_BUCKET: &str = "INSERT INTO gpu_samples (reservation_id, resolution_s, bucket, readings, first_at,
        last_at, utilization_sum, utilization_max, memory_used_sum, memory_total_mib, power_sum, power_readings,
        temperature_max)
    VALUES (?1, ?2, ?3, 1, ?9, ?9, ?4, ?4, ?5, ?6, coalesce(?7, 0), ?7 IS NOT NULL, ?8)
    ON CONFLICT (reservation_id, resolution_s, bucket) DO UPDATE SET
        readings = readings + 1,
        first_at = min(first_at, excluded.first_at),
        last_at = max(last_at, excluded.last_at),
        utilization_sum = utilization_sum + excluded.utilization_sum,
        utilization_max = max(utilization_max, excluded.utilization_max),
        memory_used_sum = memory_used_sum + excluded.memory_used_sum,
        memory_total_mib = excluded.memory_total_mib,
        power_sum = power_sum + excluded.power_sum,
        power_readings = power_readings + excluded.power_readings,
        temperature_max = max(coalesce(temperature_max, excluded.temperature_max),
                              coalesce(excluded.temperature_max, temperature_max))";

const ADD_TO_DAY: &str = "INSERT INTO gpu_use_days (day, tenant_id, model, sampled_gpu_seconds, busy_gpu_seconds)
    VALUES (?1, ?2, ?3, ?4, ?5)
    ON CONFLICT (day, tenant_id, model) DO UPDATE SET
        sampled_gpu_seconds = sampled_gpu_seconds + excluded.sampled_gpu_seconds,
        busy_gpu_seconds = busy_gpu_seconds + excluded.busy_gpu_seconds";

impl Platform {
    /// Keeps a batch of readings: each is added to the buckets of the reservations that
    /// hold its GPU or slice, and to its day's GPU-seconds. Readings nobody's booking holds,
    /// and implausible ones, are dropped and counted. A source that sends a reading twice
    /// counts it twice (the agent and the collector send each once).
    ///
    /// [`READINGS_PER_TURN`] readings per write transaction: a 10,000-GPU fleet's round
    /// takes about half a second of writing, and bookings must not wait behind all of it.
    pub async fn record_readings(&self, readings: &[GpuReading]) -> Result<Recorded, Error> {
        let now = now_ms();
        let mut recorded = Recorded::default();
        for turn in readings.chunks(READINGS_PER_TURN) {
            let mut tx = self.begin_write().await?;
            for reading in turn {
                if !reading.is_plausible(now) {
                    recorded.dropped += 1;
                    continue;
                }
                let holders = sqlx::query(HOLDERS)
                    .bind(&reading.node)
                    .bind(reading.gpu_index)
                    .bind(reading.at_ms)
                    .bind(&reading.environment)
                    .bind(reading.slice_start)
                    .fetch_all(&mut *tx)
                    .await?;
                if holders.is_empty() {
                    recorded.dropped += 1;
                    continue;
                }
                recorded.kept += 1;
                for holder in &holders {
                    let reservation: i64 = holder.try_get("id")?;
                    for resolution in [FINE, COARSE] {
                        add_to_bucket(&mut tx, reservation, resolution, reading).await?;
                    }
                    let weight: f64 = holder.try_get("weight")?;
                    let seconds = weight * reading.counted_seconds();
                    sqlx::query(ADD_TO_DAY)
                        .bind(utc_day(reading.at_ms))
                        .bind(holder.try_get::<i64, _>("tenant_id")?)
                        .bind(holder.try_get::<String, _>("model")?)
                        .bind(seconds)
                        .bind(seconds * reading.utilization_pct / 100.0)
                        .execute(&mut *tx)
                        .await?;
                }
            }
            tx.commit().await?;
        }
        Ok(recorded)
    }

    /// Deletes buckets past their age: one-minute ones after two hours, five-minute ones
    /// after a day and an hour; XID errors after 30 days. One bucket (a row per booked GPU)
    /// per write transaction, so bookings never wait behind a long delete. Answers how many
    /// rows went.
    pub async fn prune_samples(&self, now: i64) -> Result<u64, Error> {
        let mut pruned = 0;
        for (resolution, kept) in [(FINE, FINE_KEPT_MS), (COARSE, COARSE_KEPT_MS)] {
            let old: Vec<i64> = sqlx::query_scalar(
                "SELECT DISTINCT bucket FROM gpu_samples WHERE resolution_s = ? AND bucket < ? ORDER BY bucket",
            )
            .bind(resolution.seconds)
            .bind(now - kept)
            .fetch_all(&self.db)
            .await?;
            for bucket in old {
                let mut tx = self.begin_write().await?;
                pruned += sqlx::query("DELETE FROM gpu_samples WHERE resolution_s = ? AND bucket = ?")
                    .bind(resolution.seconds)
                    .bind(bucket)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                tx.commit().await?;
            }
        }
        let mut tx = self.begin_write().await?;
        pruned += sqlx::query("DELETE FROM gpu_xid_errors WHERE seen_at < ?")
            .bind(now - XID_KEPT_MS)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(pruned)
    }

    /// What environment `id`'s GPUs did in the last hour and day, for whoever may see it.
    pub async fn environment_gpu_use(&self, caller: &Caller, id: &str) -> Result<EnvironmentGpuUse, Error> {
        self.environment_for(caller, id, Action::EnvironmentRead).await?;
        let now = now_ms();
        let mut conn = self.db.acquire().await?;
        let raised = sqlx::query(
            // Errors on a GPU it held, while it held it: a whole GPU's XID touches each of
            // its slices' holders.
            "SELECT DISTINCT n.name, g.idx, x.code, x.seen_at, x.id FROM reservations r
             JOIN gpu_xid_errors x ON x.gpu_id = r.gpu_id AND x.seen_at >= r.starts_at
                  AND x.seen_at < coalesce(r.released_at, r.ends_at)
             JOIN gpus g ON g.id = r.gpu_id JOIN nodes n ON n.id = g.node_id
             WHERE r.environment_id = ? ORDER BY x.seen_at DESC, x.id DESC LIMIT 50",
        )
        .bind(id);
        Ok(EnvironmentGpuUse {
            hour: use_points(&mut conn, id, FINE, now - 3_600_000).await?,
            day: use_points(&mut conn, id, COARSE, now - 24 * 3_600_000).await?,
            xid_errors: xid_errors(&mut conn, raised).await?,
        })
    }

    /// The latest one-minute bucket of every GPU or slice a live environment holds, for
    /// `/metrics`: one series per held GPU or slice, so their number follows what is booked.
    pub async fn gpus_now(&self) -> Result<Vec<GpuNow>, Error> {
        let since = FINE.bucket_of(now_ms()) - 2 * FINE.seconds * 1000;
        let rows = sqlx::query(
            // The last two minutes' buckets (by age), the latest of each reservation, then
            // that bucket by the primary key (`CROSS JOIN` keeps that order: the planner
            // would otherwise look the bucket up by age, every GPU's at once).
            "WITH latest AS (SELECT reservation_id, max(bucket) AS bucket FROM gpu_samples
                             WHERE resolution_s = ?1 AND bucket >= ?2 GROUP BY reservation_id)
             SELECT coalesce(t.slug, '') AS tenant, coalesce(p.name, '') AS project, e.id AS environment,
                    n.name AS node, g.idx, r.mig_profile, r.slice_start,
                    s.utilization_sum / s.readings AS utilization, s.memory_used_sum / s.readings AS memory,
                    CASE WHEN s.power_readings > 0 THEN s.power_sum / s.power_readings END AS power, s.temperature_max
             FROM latest CROSS JOIN gpu_samples s
                 ON s.reservation_id = latest.reservation_id AND s.resolution_s = ?1 AND s.bucket = latest.bucket
             JOIN reservations r ON r.id = latest.reservation_id JOIN environments e ON e.id = r.environment_id
             JOIN gpus g ON g.id = r.gpu_id JOIN nodes n ON n.id = g.node_id
             LEFT JOIN tenants t ON t.id = e.tenant_id LEFT JOIN projects p ON p.id = e.project_id
             WHERE r.released_at IS NULL AND e.state IN ('provisioning', 'ready')
             ORDER BY e.id, n.name, g.idx, r.slice_start",
        )
        .bind(FINE.seconds)
        .bind(since)
        .fetch_all(&self.db)
        .await?;
        rows.iter()
            .map(|row| {
                let index: i64 = row.try_get("idx")?;
                let mig: Option<String> = row.try_get("mig_profile")?;
                let start: i64 = row.try_get("slice_start")?;
                Ok(GpuNow {
                    tenant: row.try_get("tenant")?,
                    project: row.try_get("project")?,
                    environment: row.try_get("environment")?,
                    node: row.try_get("node")?,
                    gpu: if mig.is_some() { format!("{index}/mig{start}") } else { index.to_string() },
                    utilization_pct: row.try_get("utilization")?,
                    memory_used_mib: row.try_get("memory")?,
                    power_w: row.try_get("power")?,
                    temperature_c: row.try_get("temperature_max")?,
                })
            })
            .collect()
    }

    /// GPU-hours read and busy per day, tenant and GPU model since `since_day`
    /// (`YYYY-MM-DD`): every tenant for platform staff, one's own tenant for its admins and
    /// viewers. Members, whose usage reach is their own, get none: a person's GPUs show on
    /// their environments' pages. Newest day first.
    pub async fn gpu_use_days(&self, caller: &Caller, since_day: &str) -> Result<Vec<GpuUseDay>, Error> {
        self.authorize_in_tenant(caller, Action::UsageRead).await?;
        let scope = Scope::of(caller, Action::UsageRead).ok_or(Error::Forbidden)?;
        let tenant = match (scope.all, scope.tenant_id) {
            (true, _) => None,
            (false, Some(tenant)) => Some(tenant),
            _ => return Ok(Vec::new()),
        };
        let rows = sqlx::query(
            "SELECT d.day, t.slug, d.model, d.sampled_gpu_seconds / 3600.0 AS read, d.busy_gpu_seconds / 3600.0 AS busy
             FROM gpu_use_days d LEFT JOIN tenants t ON t.id = d.tenant_id
             WHERE d.day >= ?1 AND (?2 IS NULL OR d.tenant_id = ?2)
             ORDER BY d.day DESC, t.slug, d.model",
        )
        .bind(since_day)
        .bind(tenant)
        .fetch_all(&self.db)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(GpuUseDay {
                    day: row.try_get("day")?,
                    tenant: row.try_get("slug")?,
                    model: row.try_get("model")?,
                    read_gpu_hours: row.try_get("read")?,
                    busy_gpu_hours: row.try_get("busy")?,
                })
            })
            .collect()
    }
}

async fn add_to_bucket(
    conn: &mut SqliteConnection,
    reservation: i64,
    resolution: Resolution,
    reading: &GpuReading,
) -> Result<(), Error> {
    sqlx::query(ADD_TO_BUCKET)
        .bind(reservation)
        .bind(resolution.seconds)
        .bind(resolution.bucket_of(reading.at_ms))
        .bind(reading.utilization_pct)
        .bind(reading.memory_used_mib)
        .bind(reading.memory_total_mib)
        .bind(reading.power_w)
        .bind(reading.temperature_c)
        .bind(reading.at_ms)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// An environment's buckets of one resolution since `since`, its GPUs taken together.
/// (`CROSS JOIN` keeps SQLite's order: its reservations first, then each one's buckets by
/// the primary key; left to itself the planner scans every reservation's buckets of the
/// span through `gpu_samples_by_age`.)
async fn use_points(
    conn: &mut SqliteConnection,
    environment_id: &str,
    resolution: Resolution,
    since: i64,
) -> Result<Vec<GpuUsePoint>, Error> {
    let rows = sqlx::query(
        "SELECT s.bucket, avg(s.utilization_sum / s.readings) AS utilization,
                sum(s.memory_used_sum / s.readings) AS memory, sum(s.memory_total_mib) AS total,
                sum(CASE WHEN s.power_readings > 0 THEN s.power_sum / s.power_readings END) AS power,
                max(s.temperature_max) AS temperature
         FROM reservations r CROSS JOIN gpu_samples s ON s.reservation_id = r.id
         WHERE r.environment_id = ?1 AND s.resolution_s = ?2 AND s.bucket >= ?3
         GROUP BY s.bucket ORDER BY s.bucket",
    )
    .bind(environment_id)
    .bind(resolution.seconds)
    .bind(resolution.bucket_of(since))
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|row| {
            Ok(GpuUsePoint {
                at: row.try_get("bucket")?,
                utilization_pct: row.try_get("utilization")?,
                memory_used_mib: row.try_get("memory")?,
                memory_total_mib: row.try_get("total")?,
                power_w: row.try_get("power")?,
                temperature_c: row.try_get("temperature")?,
            })
        })
        .collect()
}

/// `YYYY-MM-DD` (UTC) of a time in ms since the epoch.
fn utc_day(at_ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(at_ms).map(|t| t.format("%Y-%m-%d").to_string()).unwrap_or_default()
}

/// How often the collector asks the backend, and how often it prunes.
#[derive(Debug, Clone, Copy)]
pub struct TelemetryConfig {
    /// Between two reads of the backend's GPUs (and two idle passes).
    pub interval: Duration,
    /// Between two prunes of old buckets.
    pub prune_every: Duration,
}

impl Default for TelemetryConfig {
    fn default() -> TelemetryConfig {
        TelemetryConfig { interval: Duration::from_secs(30), prune_every: Duration::from_secs(600) }
    }
}

/// The worker `berth serve` starts: every interval it reads the backend's GPUs (agents'
/// readings arrive with their reports instead), keeps them, and runs the idle watcher.
pub struct TelemetryWorker {
    platform: Platform,
    backend: Arc<dyn Backend>,
    config: TelemetryConfig,
}

impl TelemetryWorker {
    pub fn new(platform: Platform, backend: Arc<dyn Backend>, config: TelemetryConfig) -> TelemetryWorker {
        TelemetryWorker { platform, backend, config }
    }

    /// One round: read, keep, judge idleness. Errors are logged; the next round tries again.
    pub async fn round(&self) {
        match self.backend.gpu_readings().await {
            Ok(readings) => match self.platform.record_readings(&readings).await {
                Ok(Recorded { dropped, .. }) if dropped > 0 => {
                    tracing::debug!(dropped, "GPU readings of nothing booked (or implausible) dropped")
                }
                Ok(_) => {}
                Err(e) => tracing::error!(error = %e, "cannot keep GPU readings"),
            },
            Err(e) => tracing::warn!(backend = self.backend.name(), error = %e, "cannot read the GPUs' telemetry"),
        }
        if let Err(e) = self.platform.watch_idle(now_ms()).await {
            tracing::error!(error = %e, "the idle watcher's pass failed");
        }
    }

    pub async fn run(self, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        let mut tick = tokio::time::interval(self.config.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_prune = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = &mut stop => return,
                _ = tick.tick() => {}
            }
            self.round().await;
            if last_prune.elapsed() >= self.config.prune_every {
                last_prune = tokio::time::Instant::now();
                match self.platform.prune_samples(now_ms()).await {
                    Ok(0) => {}
                    Ok(pruned) => tracing::debug!(pruned, "old GPU sample buckets pruned"),
                    Err(e) => tracing::error!(error = %e, "cannot prune GPU samples"),
                }
            }
        }
    }
}

/// Requests through the proxy, per environment, since the idle watcher last wrote them
/// down: the proxy must not wait for a write turn per request.
#[derive(Default)]
pub struct Traffic {
    seen: std::sync::Mutex<HashMap<String, i64>>,
}

impl Traffic {
    pub(crate) fn note(&self, environment_id: &str, at: i64) {
        lock(&self.seen).insert(environment_id.to_owned(), at);
    }

    pub(crate) fn take(&self) -> HashMap<String, i64> {
        std::mem::take(&mut *lock(&self.seen))
    }
}
