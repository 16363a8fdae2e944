//! Booking benchmarks of BENCHMARKS.md, on a real SQLite file with the production pool:
//!
//! 1. Booking under contention: 10,000 GPUs, 64 clients booking random windows through
//!    `Platform::launch` for `BENCH_SECONDS` (60), then an independent overlap check.
//! 2. Calendar speed: 10,000 GPUs with 100,000 bookings over 90 days; p50/p99 of a week
//!    heatmap, a month heatmap and an earliest-fit search.
//!
//! `cargo bench -p berth-platform --bench booking` (`BENCH_SECONDS=10` for a quick run;
//! `BENCH_SMOKE=1`: a few seconds on 160 GPUs, as `make bench-smoke` runs it).
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::print_stdout)] // a benchmark's output is its point

use std::time::{Duration, Instant};

use berth_domain::booking::{DAY_MS, HOUR_MS};
use berth_domain::gpu::GpuModel;
use berth_domain::launch::LaunchRequest;
use berth_domain::mig::MigProfile;
use berth_domain::placement::Shape;
use berth_domain::policy::{Principal, Role};
use berth_domain::tenancy::Isolation;
use berth_platform::{Caller, Error, Platform, RequestMeta, now_ms, store};
use rand::{Rng, SeedableRng};
use sqlx::SqlitePool;

/// The allocator `berth` runs on (`server/src/main.rs`), so the figures are the binary's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "seed/mod.rs"]
mod seed;
// The tests' independent checker, shared rather than written again.
#[allow(dead_code)]
#[path = "../tests/common/overlaps.rs"]
mod overlaps;

use seed::{Scale, seed_bookings};

async fn fresh_platform(name: &str, scale: Scale) -> (Platform, SqlitePool, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("berth-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let pool = store::connect(&format!("sqlite://{}/berth.db", dir.display())).await.expect("connect");
    store::migrate(&pool).await.expect("migrate");
    let platform = Platform::new(pool.clone());
    platform.sync_fleet(&scale.fleet()).await.expect("fleet");
    (platform, pool, dir)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

const SIZES: [(&str, &str); 5] = [
    ("training", "h100-1"),
    ("training", "h100-4"),
    ("training", "h100-8"),
    ("notebook", "h100-1g.10gb"),
    ("notebook", "h100-3g.40gb"),
];

async fn contention(seconds: u64, scale: Scale) {
    let clients = if scale.smoke { 8 } else { 64 };
    let (platform, pool, dir) = fresh_platform("contention", scale).await;
    let tenant = platform.ensure_tenant("bench", "Bench", Isolation::Soft).await.expect("tenant");
    let mut callers = Vec::new();
    for c in 0..clients {
        // Accounts without a password: hashing 64 passwords is not what is measured.
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO users (email, display_name, role, tenant_id, created_at) VALUES (?, ?, 'member', ?, 0) RETURNING id",
        )
        .bind(format!("client{c}@bench"))
        .bind(format!("Client {c}"))
        .bind(tenant)
        .fetch_one(&pool)
        .await
        .expect("user");
        callers.push(Caller {
            principal: Principal { user_id: id, tenant_id: Some(tenant), role: Role::Member, token_actions: None },
            meta: RequestMeta { request_id: format!("bench-{c}"), source: None },
        });
    }
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (c, caller) in callers.into_iter().enumerate() {
        let platform = platform.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(c as u64);
            let (mut ok, mut refused, mut latencies) = (0u64, 0u64, Vec::new());
            let mut n = 0;
            while Instant::now() < deadline {
                let (offering, size) = SIZES[rng.random_range(0..SIZES.len())];
                let max_hours = if offering == "notebook" { 24 } else { 72 };
                let start = now_ms() + rng.random_range(1..(88 * 24)) * HOUR_MS;
                let request = LaunchRequest {
                    offering: offering.into(),
                    size: size.into(),
                    name: format!("b{c}-{n}"),
                    hours: rng.random_range(1..=max_hours).to_string(),
                    start: chrono::DateTime::from_timestamp_millis(start).expect("time").to_rfc3339(),
                    image: if offering == "training" { "ghcr.io/acme/train:1".into() } else { String::new() },
                    command: if offering == "training" { "python train.py".into() } else { String::new() },
                    ..LaunchRequest::default()
                };
                n += 1;
                let t = Instant::now();
                match platform.launch(&caller, &request).await {
                    Ok(_) => ok += 1,
                    Err(Error::Refused(_)) => refused += 1,
                    // Berth's own refusals are `Refused`; the database's trigger refusing
                    // means a double booking got past Berth to the database.
                    Err(e) => match overlaps::trigger_abort(&e) {
                        Some(abort) => panic!("a booking reached the database overlapping: {abort}"),
                        None => panic!("unexpected error under contention: {e}"),
                    },
                }
                latencies.push(t.elapsed());
            }
            (ok, refused, latencies)
        }));
    }
    let (mut ok, mut refused, mut latencies) = (0, 0, Vec::new());
    for task in tasks {
        let (o, r, l) = task.await.expect("client");
        ok += o;
        refused += r;
        latencies.extend(l);
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort();
    let found = overlaps::overlapping_reservations(&pool).await;
    println!("== booking under contention: {} GPUs, {clients} clients, {seconds} s", scale.gpus());
    println!("bookings confirmed: {ok} ({:.1}/s); refused (no capacity): {refused}", ok as f64 / elapsed);
    println!(
        "latency per booking: p50 {}  p99 {}  max {}",
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.99)),
        ms(percentile(&latencies, 1.0))
    );
    println!("reservation pairs closer than the cleaning gap, found by the independent check: {found}");
    assert_eq!(found, 0, "double booking");
    assert!(ok > 0, "no booking was confirmed");
    pool.close().await;
    let _ = std::fs::remove_dir_all(dir);
}

async fn time<F, Fut, T>(runs: usize, mut f: F) -> Vec<Duration>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let mut out = Vec::with_capacity(runs);
    for i in 0..runs {
        let t = Instant::now();
        std::hint::black_box(f(i).await);
        out.push(t.elapsed());
    }
    out.sort();
    out
}

async fn calendar_speed(scale: Scale) {
    let (platform, pool, dir) = fresh_platform("calendar", scale).await;
    let now = now_ms();
    let seeding = Instant::now();
    seed_bookings(&pool, scale.bookings, now).await;
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM reservations").fetch_one(&pool).await.expect("count");
    let last: i64 = sqlx::query_scalar("SELECT max(ends_at) FROM reservations").fetch_one(&pool).await.expect("max");
    println!(
        "== calendar speed: {} GPUs, {count} bookings over {} days (seeded in {:.1} s)",
        scale.gpus(),
        (last - now) / DAY_MS,
        seeding.elapsed().as_secs_f64()
    );
    let runs = scale.runs;
    let day0 = now - now.rem_euclid(DAY_MS);
    // The first query after a start loads every unreleased reservation into memory.
    let first = Instant::now();
    platform.availability(None, day0, 6 * HOUR_MS, 28).await.expect("first week");
    println!("first query after start (loads the booking book): {}", ms(first.elapsed()));
    let week = time(runs, |i| {
        let platform = platform.clone();
        async move { platform.availability(None, day0 + (i as i64 % 80) * DAY_MS, 6 * HOUR_MS, 28).await.expect("week") }
    })
    .await;
    let month = time(runs, |i| {
        let platform = platform.clone();
        async move { platform.availability(None, day0 + (i as i64 % 60) * DAY_MS, DAY_MS, 30).await.expect("month") }
    })
    .await;
    let shapes = [
        Shape::Gpus { model: GpuModel::H100_80GB, count: 1 },
        Shape::Gpus { model: GpuModel::H100_80GB, count: 8 },
        Shape::MigSlice { model: GpuModel::H100_80GB, profile: MigProfile::G3 },
    ];
    let earliest = time(runs, |i| {
        let platform = platform.clone();
        async move {
            platform.earliest_start(None, shapes[i % shapes.len()], 24 + (i as u32 % 48), now).await.expect("earliest")
        }
    })
    .await;
    // The same questions from a hard tenant's user: every node another tenant (here the
    // seeded staff bookings) holds in a window is off limits, which the earliest-fit
    // search must wait out node by node.
    let hard = Some(platform.ensure_tenant("bench-hard", "Hard", Isolation::Hard).await.expect("hard tenant"));
    let hard_week = time(runs, |i| {
        let platform = platform.clone();
        async move { platform.availability(hard, day0 + (i as i64 % 80) * DAY_MS, 6 * HOUR_MS, 28).await.expect("week") }
    })
    .await;
    let hard_earliest = time(runs, |i| {
        let platform = platform.clone();
        async move {
            platform.earliest_start(hard, shapes[i % shapes.len()], 24 + (i as u32 % 48), now).await.expect("earliest")
        }
    })
    .await;
    for (what, d) in [
        ("week heatmap, all 11 sizes (28 x 6 h)", &week),
        ("month heatmap, all 11 sizes (30 x 1 day)", &month),
        ("earliest fit (1 GPU, 8 GPUs, 3g slice; 24-71 h)", &earliest),
        ("week heatmap for a hard tenant", &hard_week),
        ("earliest fit for a hard tenant", &hard_earliest),
    ] {
        println!("{what}: p50 {}  p99 {}  ({} runs)", ms(percentile(d, 0.5)), ms(percentile(d, 0.99)), d.len());
    }
    pool.close().await;
    let _ = std::fs::remove_dir_all(dir);
}

fn main() {
    let scale = Scale::from_env();
    if scale.smoke {
        println!("smoke run (BENCH_SMOKE=1): small sizes, to prove the benchmark works; the figures mean nothing");
    }
    let seconds = std::env::var("BENCH_SECONDS").ok().and_then(|s| s.parse().ok());
    let seconds = seconds.unwrap_or(if scale.smoke { 2 } else { 60 });
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    runtime.block_on(async {
        if only.is_empty() || only == "contention" {
            contention(seconds, scale).await;
        }
        if only.is_empty() || only == "calendar" {
            calendar_speed(scale).await;
        }
    });
}
