//! The usage page of a tenant with 100,000 usage ledger rows in one month, through the real
//! router `berth serve` builds (session, authorization, the `usage_page` server function,
//! the report, its SVG charts, HTML), signed in as a platform admin narrowed to the tenant:
//! `GET /usage?month=...&by=project|person|model`, one request at a time; then the CSV
//! download, `GET /usage.csv?...`.
//!
//! `cargo bench -p berth-server --bench usage_page` (`BENCH_SMOKE=1`: 2,000 rows, 5 runs,
//! as `make bench-smoke` runs it to prove the benchmark still works).
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::print_stdout)] // a benchmark's output is its point

mod router;
// The fleet's description from the shared seed; its bookings are another benchmark's.
#[allow(dead_code)]
#[path = "../../platform/benches/seed/mod.rs"]
mod seed;

use std::time::Instant;

use axum::body::Body;
use berth_domain::metering::{Month, this_month};
use berth_domain::policy::Role;
use berth_platform::{Platform, store};
use berth_server::cli::{Cli, Command};
use clap::Parser;
use http::{Request, header};
use router::{PASSWORD, percentiles, send, sign_in};

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let scale = seed::Scale::from_env();
    let (rows, runs) = if scale.smoke { (2_000, 5) } else { (100_000, 50) };
    if scale.smoke {
        println!("smoke run (BENCH_SMOKE=1): small sizes, to prove the benchmark works; the figures mean nothing");
    }
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let database = format!("sqlite://{}", dir.path().join("berth.db").display());
        let site_root = dir.path().join("site");
        std::fs::create_dir_all(&site_root).expect("site root");
        let site_root = site_root.display().to_string();
        let argv = ["berth", "serve", "--database", &database, "--site-root", &site_root];
        let Command::Serve(args) = Cli::try_parse_from(argv).expect("serve arguments").command else {
            panic!("not the serve command")
        };
        let public = args.public().expect("public url");
        let pool = store::connect(&database).await.expect("database");
        store::migrate(&pool).await.expect("migrations");
        let platform = Platform::new(pool.clone()).with_public_url(&public.url);
        platform.sync_fleet(&scale.fleet()).await.expect("fleet");
        // Last month: every unit ran and was released in it, so the page counts all of them.
        let month: Month = this_month().previous();
        let seeding = Instant::now();
        let tenant = seed::seed_usage(&pool, rows, month).await;
        println!(
            "== usage page: tenant {tenant} with {rows} ledger rows in {} (seeded in {:.1} s)",
            month.title(),
            seeding.elapsed().as_secs_f64()
        );
        let router =
            berth_server::http::router(platform.clone(), pool, &args.site(&public)).await.expect("router").portal;
        platform
            .create_user("usage@bench", "Usage admin", PASSWORD, Role::PlatformAdmin, None)
            .await
            .expect("platform admin");
        let cookie = sign_in(&router, &public.url, "usage%40bench").await;

        for by in ["project", "person", "model"] {
            let path = format!("/usage?month={}&by={by}&tenant={tenant}", month.key());
            let (mut times, mut bytes) = (Vec::new(), 0);
            for run in 0..=runs {
                let request = Request::get(&path).header(header::COOKIE, &cookie).body(Body::empty()).expect("request");
                let t = Instant::now();
                let (status, _, body) = send(&router, request).await;
                let took = t.elapsed();
                assert!(status.is_success(), "{path}: {status}");
                assert!(body.contains("data-usage-line=") && !body.contains("role=\"alert\""), "{path}: no report");
                if run > 0 {
                    times.push(took);
                    bytes += body.len();
                }
            }
            println!("GET /usage?by={by} ({} KB a page): {}", bytes / runs / 1024, percentiles(&mut times));
        }
        let path = format!("/usage.csv?month={}&by=environment&tenant={tenant}", month.key());
        let mut times = Vec::new();
        let mut lines = 0;
        for _ in 0..runs.min(10) {
            let request = Request::get(&path).header(header::COOKIE, &cookie).body(Body::empty()).expect("request");
            let t = Instant::now();
            let (status, _, body) = send(&router, request).await;
            times.push(t.elapsed());
            assert!(status.is_success(), "{path}: {status}");
            lines = body.lines().count();
        }
        println!("GET /usage.csv?by=environment ({lines} lines): {}", percentiles(&mut times));
    });
}
