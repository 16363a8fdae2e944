//! GPU telemetry benchmark of BENCHMARKS.md, on a real SQLite file with the production pool:
//! 10,000 H100s, every one booked (an environment per node of 8 GPUs).
//!
//! 1. Keeping readings: `Platform::record_readings` with one reading of every GPU (a
//!    collector's or all agents' round), timed over several rounds.
//! 2. The store's size in its steady state: what a GPU read every 30 s leaves after the
//!    pruning (two hours of one-minute buckets, 25 hours of five-minute ones), written
//!    straight into `gpu_samples`, then `VACUUM`ed and measured; the time of
//!    `prune_samples` over it, and of what reads it: an environment's page
//!    (`environment_gpu_use`), `/metrics` (`gpus_now`) and an idle watcher's pass
//!    (`watch_idle`, a policy on every environment).
//!
//! `cargo bench -p berth-platform --bench telemetry` (`BENCH_SMOKE=1`: 160 GPUs, as
//! `make bench-smoke` runs it).
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::print_stdout)] // a benchmark's output is its point

use std::time::{Duration, Instant};

use berth_domain::idle::IdlePolicy;
use berth_domain::policy::{Principal, Role};
use berth_domain::telemetry::{COARSE, COARSE_KEPT_MS, FINE, FINE_KEPT_MS, GpuReading};
use berth_platform::{Caller, Platform, RequestMeta, now_ms, store};
use sqlx::SqlitePool;

#[path = "seed/mod.rs"]
#[allow(dead_code)]
mod seed;

use seed::Scale;

const HOUR: i64 = 3_600_000;
/// How often each GPU is read in the steady state the size is measured for.
const READ_EVERY_S: i64 = 30;

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// One ready environment per node holding its 8 GPUs, booked from 30 hours ago.
async fn book_every_gpu(pool: &SqlitePool, now: i64) -> Vec<String> {
    let user: i64 = sqlx::query_scalar(
        "INSERT INTO users (email, display_name, role, created_at)
         VALUES ('seed@bench', 'Seed', 'platform_admin', 0) RETURNING id",
    )
    .fetch_one(pool)
    .await
    .expect("user");
    let nodes: Vec<(i64, String)> =
        sqlx::query_as("SELECT id, name FROM nodes ORDER BY id").fetch_all(pool).await.expect("nodes");
    let mut tx = pool.begin().await.expect("tx");
    let mut ids = Vec::new();
    for (node, name) in &nodes {
        let id = format!("env-{name}");
        sqlx::query(
            "INSERT INTO environments (id, owner_id, name, offering, size_id, cents_per_hour, state, desired,
                 created_at, starts_at, ends_at, state_changed_at, ready_at)
             VALUES (?1, ?2, ?1, 'training', 'h100-8', 2560, 'ready', 'running', ?3, ?3, ?4, ?3, ?3)",
        )
        .bind(&id)
        .bind(user)
        .bind(now - 30 * HOUR)
        .bind(now + 24 * HOUR)
        .execute(&mut *tx)
        .await
        .expect("environment");
        sqlx::query(
            "INSERT INTO reservations (environment_id, gpu_id, slice_start, slice_size, starts_at, ends_at)
             SELECT ?1, id, 0, 8, ?2, ?3 FROM gpus WHERE node_id = ?4",
        )
        .bind(&id)
        .bind(now - 30 * HOUR)
        .bind(now + 24 * HOUR)
        .bind(node)
        .execute(&mut *tx)
        .await
        .expect("reservations");
        ids.push(id);
    }
    tx.commit().await.expect("commit");
    ids
}

/// One reading of every GPU at `at`.
async fn round(pool: &SqlitePool, at: i64) -> Vec<GpuReading> {
    let gpus: Vec<(String, i64)> =
        sqlx::query_as("SELECT n.name, g.idx FROM gpus g JOIN nodes n ON n.id = g.node_id ORDER BY g.id")
            .fetch_all(pool)
            .await
            .expect("gpus");
    gpus.into_iter()
        .enumerate()
        .map(|(i, (node, gpu_index))| GpuReading {
            node,
            gpu_index,
            slice_start: None,
            environment: None,
            at_ms: at,
            period_s: READ_EVERY_S as f64,
            utilization_pct: (i % 100) as f64,
            memory_used_mib: 40_000.0,
            memory_total_mib: 81_559.0,
            power_w: Some(400.0),
            temperature_c: Some(55.0),
        })
        .collect()
}

/// Fills `gpu_samples` to its steady state for every reservation: every bucket of the kept
/// spans, each holding the readings a GPU read every 30 s leaves in it.
async fn fill_steady_state(pool: &SqlitePool, now: i64) -> i64 {
    sqlx::query("DELETE FROM gpu_samples").execute(pool).await.expect("clear");
    for (resolution, kept) in [(FINE, FINE_KEPT_MS), (COARSE, COARSE_KEPT_MS)] {
        let width = resolution.seconds * 1000;
        let readings = resolution.seconds / READ_EVERY_S;
        sqlx::query(
            "WITH RECURSIVE buckets(b) AS (SELECT ?1 UNION ALL SELECT b + ?2 FROM buckets WHERE b + ?2 <= ?3)
             INSERT INTO gpu_samples (reservation_id, resolution_s, bucket, readings, first_at, last_at,
                 utilization_sum, utilization_max, memory_used_sum, memory_total_mib, power_sum, power_readings,
                 temperature_max)
             SELECT r.id, ?4, b, ?5, b, b + ?2 - 1, 37.5 * ?5, 80, 40000.0 * ?5, 81559, 400.0 * ?5, ?5, 55
             FROM reservations r, buckets",
        )
        .bind(resolution.bucket_of(now - kept))
        .bind(width)
        .bind(resolution.bucket_of(now))
        .bind(resolution.seconds)
        .bind(readings)
        .execute(pool)
        .await
        .expect("fill");
    }
    sqlx::query_scalar("SELECT count(*) FROM gpu_samples").fetch_one(pool).await.expect("count")
}

async fn database_bytes(pool: &SqlitePool) -> i64 {
    sqlx::query("VACUUM").execute(pool).await.expect("vacuum");
    let pages: i64 = sqlx::query_scalar("PRAGMA page_count").fetch_one(pool).await.expect("pages");
    let size: i64 = sqlx::query_scalar("PRAGMA page_size").fetch_one(pool).await.expect("page size");
    pages * size
}

#[tokio::main]
async fn main() {
    let scale = Scale::from_env();
    let dir = std::env::temp_dir().join(format!("berth-bench-telemetry-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let pool = store::connect(&format!("sqlite://{}/berth.db", dir.display())).await.expect("connect");
    store::migrate(&pool).await.expect("migrate");
    let platform = Platform::new(pool.clone());
    platform.sync_fleet(&scale.fleet()).await.expect("fleet");
    let now = now_ms();
    let environments = book_every_gpu(&pool, now).await;
    let empty = database_bytes(&pool).await;
    println!("telemetry: {} GPUs booked by {} environments", scale.gpus(), environments.len());

    // 1. Keeping a round of readings.
    let rounds = if scale.smoke { 2 } else { 6 };
    let mut times = Vec::new();
    for r in 0..rounds {
        let readings = round(&pool, now - (rounds - r) as i64 * READ_EVERY_S * 1000).await;
        let started = Instant::now();
        let recorded = platform.record_readings(&readings).await.expect("record");
        times.push(started.elapsed());
        assert_eq!(recorded.kept, scale.gpus(), "every reading finds its booking");
    }
    times.sort();
    let median = times[times.len() / 2];
    println!(
        "record_readings: one reading of each of {} GPUs in {} (median of {rounds}), {:.0} readings/s",
        scale.gpus(),
        ms(median),
        scale.gpus() as f64 / median.as_secs_f64()
    );

    // 2. The steady state's size, and what reads it.
    let rows = fill_steady_state(&pool, now).await;
    let full = database_bytes(&pool).await;
    println!(
        "steady state: {rows} sample rows ({} per GPU), database {:.1} MiB, of which samples {:.1} MiB ({:.0} bytes per row, indexes included)",
        rows / scale.gpus() as i64,
        full as f64 / 1_048_576.0,
        (full - empty) as f64 / 1_048_576.0,
        (full - empty) as f64 / rows as f64
    );
    let caller = Caller {
        principal: Principal { user_id: 1, tenant_id: None, role: Role::PlatformAdmin, token_actions: None },
        meta: RequestMeta { request_id: "bench".into(), source: None },
    };
    let mut page = Vec::new();
    for id in environments.iter().take(20) {
        let started = Instant::now();
        let used = platform.environment_gpu_use(&caller, id).await.expect("use");
        page.push(started.elapsed());
        assert!(!used.hour.is_empty() && !used.day.is_empty());
    }
    page.sort();
    println!(
        "environment_gpu_use (8 GPUs, an hour and a day): median {}, max {}",
        ms(page[page.len() / 2]),
        ms(page[page.len() - 1])
    );
    let started = Instant::now();
    let series = platform.gpus_now().await.expect("gpus now");
    println!("gpus_now (/metrics): {} series in {}", series.len(), ms(started.elapsed()));

    let policy = IdlePolicy::parse("5", "1h", "15m", "").expect("policy");
    sqlx::query(
        "INSERT INTO idle_policies (offering, below_pct, idle_for_s, grace_s, updated_at) VALUES ('training', ?, ?, ?, 0)",
    )
    .bind(policy.below_pct)
    .bind(policy.idle_for_s)
    .bind(policy.grace_s)
    .execute(&pool)
    .await
    .expect("policy");
    let started = Instant::now();
    platform.watch_idle(now).await.expect("watch");
    println!("watch_idle: a pass over {} environments in {}", environments.len(), ms(started.elapsed()));

    // An hour later, the first hour of fine buckets and an hour of coarse ones go.
    let started = Instant::now();
    let pruned = platform.prune_samples(now + HOUR).await.expect("prune");
    println!("prune_samples: {pruned} rows an hour later in {}", ms(started.elapsed()));
    let started = Instant::now();
    platform.prune_samples(now + HOUR).await.expect("prune");
    println!("prune_samples: nothing to prune in {}", ms(started.elapsed()));
    let _ = std::fs::remove_dir_all(&dir);
}
