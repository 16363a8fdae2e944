//! The portal's heaviest pages of BENCHMARKS.md on 10,000 GPUs with 100,000 bookings,
//! through the real router `berth serve` builds (session, authorization, server function,
//! chart or heatmap, HTML), signed in as a platform admin:
//! - the month Gantt, `GET /admin/fleet?days=30&page=N`, one request at a time;
//! - the availability calendar, `GET /calendar?view=week|month&from=...`, one request at a
//!   time, then 50 clients at once for a few seconds (as `bench/load.sh` asks the small demo
//!   fleet over HTTP).
//!
//! `cargo bench -p berth-server --bench fleet_page` (`BENCH_SMOKE=1`: 160 GPUs, 1,000
//! bookings, 5 runs, 4 clients for a second, as `make bench-smoke` runs it to prove the
//! benchmark still works).
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::print_stdout)] // a benchmark's output is its point

/// The allocator `berth` runs on (`server/src/main.rs`), so the figures are the binary's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod router;
#[path = "../../platform/benches/seed/mod.rs"]
mod seed;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use berth_domain::booking::DAY_MS;
use berth_platform::now_ms;
use http::{Request, StatusCode, header};
use rand::{Rng, SeedableRng};
use router::{Fresh, percentiles, send};

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let scale = seed::Scale::from_env();
    if scale.smoke {
        println!("smoke run (BENCH_SMOKE=1): small sizes, to prove the benchmark works; the figures mean nothing");
    }
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let fresh = Fresh::open(dir.path(), &scale.fleet()).await;
        let pool = fresh.pool.clone();
        let seeding = Instant::now();
        seed::seed_bookings(&pool, scale.bookings, now_ms()).await;
        println!(
            "== month Gantt page: {} GPUs, {} bookings (seeded in {:.1} s)",
            scale.gpus(),
            scale.bookings,
            seeding.elapsed().as_secs_f64()
        );
        let (router, cookie) = fresh.portal_signed_in("fleet").await;

        let pages = scale.nodes().div_ceil(berth_platform::capacity::maintenance::NODES_PER_PAGE);
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let (mut times, mut bytes, mut bars) = (Vec::new(), 0, 0);
        let runs = scale.runs;
        for run in 0..=runs {
            let page = rng.random_range(1..=pages);
            let request = Request::get(format!("/admin/fleet?days=30&page={page}"))
                .header(header::COOKIE, &cookie)
                .body(Body::empty())
                .expect("request");
            let t = Instant::now();
            let (status, _, body) = send(&router, request).await;
            let took = t.elapsed();
            assert!(status.is_success(), "page {page}: {status}");
            assert!(body.contains(&format!("Page {page} of {pages}")), "page {page} is not the chart page asked for");
            if run > 0 {
                // The first request warms the booking book and the fleet cache.
                times.push(took);
                bytes += body.len();
                bars += body.matches("data-bar=").count();
            }
        }
        println!(
            "GET /admin/fleet?days=30&page=N (16 nodes, 128 GPU rows; {} KB and {} bars a page): {}",
            bytes / runs / 1024,
            bars / runs,
            percentiles(&mut times),
        );

        let router = Arc::new(router);
        for view in ["week", "month"] {
            calendar_one_at_a_time(&router, &cookie, view, runs).await;
        }
        let (clients, seconds) = if scale.smoke { (4, 1) } else { (50, 10) };
        calendar_under_load(&router, &cookie, clients, Duration::from_secs(seconds)).await;
    });
}

/// The calendar of a random start within the seeded 85 days.
fn calendar_request(rng: &mut impl Rng, view: &str, cookie: &str) -> Request<Body> {
    let from = now_ms() + rng.random_range(0..80) * DAY_MS;
    let from = chrono::DateTime::from_timestamp_millis(from).expect("date").format("%Y-%m-%d");
    Request::get(format!("/calendar?view={view}&from={from}"))
        .header(header::COOKIE, cookie)
        .body(Body::empty())
        .expect("request")
}

/// A calendar page drawn: 200 with its heatmap, not an error box or the sign-in prompt.
fn assert_calendar(status: StatusCode, body: &str) {
    assert!(status.is_success(), "calendar: {status}");
    assert!(body.contains("Free capacity per size over time") && !body.contains("role=\"alert\""), "no heatmap");
}

async fn calendar_one_at_a_time(router: &Router, cookie: &str, view: &str, runs: usize) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    let (mut times, mut bytes, mut cells) = (Vec::new(), 0, 0);
    for run in 0..=runs {
        let request = calendar_request(&mut rng, view, cookie);
        let t = Instant::now();
        let (status, _, body) = send(router, request).await;
        let took = t.elapsed();
        assert_calendar(status, &body);
        if run > 0 {
            times.push(took);
            bytes += body.len();
            cells += body.matches("data-tone=").count();
        }
    }
    println!(
        "GET /calendar?view={view}&from=... ({} KB and {} cells a page): {}",
        bytes / runs / 1024,
        cells / runs,
        percentiles(&mut times),
    );
}

/// `clients` tasks, each asking for a week or a month (alternately) as soon as its last
/// answer came, for `length`: what 50 browsers on the calendar do to the server.
async fn calendar_under_load(router: &Arc<Router>, cookie: &str, clients: u64, length: Duration) {
    let start = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|client| {
            let (router, cookie) = (Arc::clone(router), cookie.to_owned());
            tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(100 + client);
                let mut times = Vec::new();
                while start.elapsed() < length {
                    let view = if times.len() % 2 == 0 { "week" } else { "month" };
                    let request = calendar_request(&mut rng, view, &cookie);
                    let t = Instant::now();
                    let (status, _, body) = send(&router, request).await;
                    times.push(t.elapsed());
                    assert_calendar(status, &body);
                }
                times
            })
        })
        .collect();
    let mut times = Vec::new();
    for task in tasks {
        times.extend(task.await.expect("client"));
    }
    let rate = times.len() as f64 / start.elapsed().as_secs_f64();
    println!(
        "GET /calendar, week and month, {clients} clients at once for {} s: {rate:.0} pages/s, {}",
        length.as_secs(),
        percentiles(&mut times),
    );
}
