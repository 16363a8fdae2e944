//! The usage page of a tenant with 100,000 usage ledger rows in one month, through the real
//! router `berth serve` builds (session, authorization, the `usage_page` server function,
//! the report, its SVG charts, HTML), signed in as a platform admin narrowed to the tenant:
//! `GET /usage?month=...&by=project|person|model`, one request at a time; then the CSV
//! download, `GET /usage.csv?...`; then, on a Berth of its own with 1,000,000 rows in the
//! month, closing the month into the tenant's statement (`Platform::close_month`).
//!
//! `cargo bench -p berth-server --bench usage_page` (`BENCH_SMOKE=1`: 2,000 rows, 5 runs,
//! as `make bench-smoke` runs it to prove the benchmark still works).
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::print_stdout)] // a benchmark's output is its point

/// The allocator `berth` runs on (`server/src/main.rs`), so the figures are the binary's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod router;
// The fleet's description from the shared seed; its bookings are another benchmark's.
#[allow(dead_code)]
#[path = "../../platform/benches/seed/mod.rs"]
mod seed;

use std::time::Instant;

use axum::body::Body;
use berth_domain::booking::HOUR_MS;
use berth_domain::launch::LaunchRequest;
use berth_domain::metering::{Month, this_month};
use berth_domain::policy::{Principal, Role};
use berth_platform::{Caller, RequestMeta};
use http::{Request, header};
use rand::{Rng, SeedableRng};
use router::{Fresh, percentiles, send};
use sqlx::SqlitePool;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let scale = seed::Scale::from_env();
    let (rows, runs) = if scale.smoke { (2_000, 5) } else { (100_000, 50) };
    let close_rows = if scale.smoke { 2_000 } else { 1_000_000 };
    if scale.smoke {
        println!("smoke run (BENCH_SMOKE=1): small sizes, to prove the benchmark works; the figures mean nothing");
    }
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let fresh = Fresh::open(dir.path(), &scale.fleet()).await;
        let pool = fresh.pool.clone();
        // Last month: every unit ran and was released in it, so the page counts all of them.
        let month: Month = this_month().previous();
        let seeding = Instant::now();
        let tenant = seed_usage(&pool, rows, month).await;
        println!(
            "== usage page: tenant {tenant} with {rows} ledger rows in {} (seeded in {:.1} s)",
            month.title(),
            seeding.elapsed().as_secs_f64()
        );
        // The seed writes released units as SQL; releases sum their units as they happen,
        // and `berth serve` sums those released before sums existed: that, timed.
        let summing = Instant::now();
        let summed = fresh.platform.sum_released_usage().await.expect("sum released usage");
        assert_eq!(summed, rows);
        println!("summed {summed} released units in {:.1} s", summing.elapsed().as_secs_f64());
        let (router, cookie) = fresh.portal_signed_in("usage").await;

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

        // Budgets: the tenant's and each project's. The page shows their months.
        let tenant_id: i64 =
            sqlx::query_scalar("SELECT id FROM tenants WHERE slug = 'bench'").fetch_one(&pool).await.expect("tenant");
        sqlx::query(
            "INSERT INTO budgets (tenant_id, project_id, cents_per_month, warn_only, updated_at)
             SELECT ?1, NULL, 10000000000, 0, 0 UNION ALL
             SELECT ?1, id, 1000000000, 0, 0 FROM projects WHERE tenant_id = ?1",
        )
        .bind(tenant_id)
        .execute(&pool)
        .await
        .expect("budgets");
        let path = format!("/usage?month={}&by=project&tenant={tenant}", month.key());
        let mut times = Vec::new();
        for _ in 0..runs.min(20) {
            let request = Request::get(&path).header(header::COOKIE, &cookie).body(Body::empty()).expect("request");
            let t = Instant::now();
            let (status, _, body) = send(&router, request).await;
            times.push(t.elapsed());
            assert!(status.is_success() && body.contains("data-usage-line="), "{path}: {status}");
        }
        println!("GET /usage?by=project with 11 budgets: {}", percentiles(&mut times));

        // A booking checked against the tenant's budget and its project's, in its writer
        // turn, beside the tenant's 100,000 ledger rows: one at a time.
        let (member, project): (i64, i64) = sqlx::query_as(
            "SELECT u.id, p.id FROM users u JOIN projects p ON p.tenant_id = u.tenant_id
             WHERE u.email = 'member-0@bench' AND p.name = 'project-0'",
        )
        .fetch_one(&pool)
        .await
        .expect("member");
        sqlx::query("INSERT INTO project_members (project_id, user_id) VALUES (?, ?)")
            .bind(project)
            .bind(member)
            .execute(&pool)
            .await
            .expect("project member");
        let caller = Caller {
            principal: Principal {
                user_id: member,
                tenant_id: Some(tenant_id),
                role: Role::Member,
                token_actions: None,
            },
            meta: RequestMeta { request_id: "bench-budget".into(), source: None },
        };
        let mut times = Vec::new();
        let start = berth_platform::now_ms() + HOUR_MS;
        // The first booking loads the booking book (10,000 GPUs' bookings): not timed.
        for n in 0..=runs.min(30) {
            let request = LaunchRequest {
                offering: "training".into(),
                size: "h100-1".into(),
                name: format!("budgeted-{n}"),
                hours: "1".to_string(),
                start: chrono::DateTime::from_timestamp_millis(start + n as i64 * HOUR_MS).expect("time").to_rfc3339(),
                image: "ghcr.io/acme/train:1".into(),
                command: "python train.py".into(),
                project: project.to_string(),
                ..LaunchRequest::default()
            };
            let t = Instant::now();
            fresh.platform.launch(&caller, &request).await.expect("a booking within budget");
            if n > 0 {
                times.push(t.elapsed());
            }
        }
        println!("Platform::launch checked against 2 budgets: {}", percentiles(&mut times));

        // Closing the month into the tenant's statement, on a Berth of its own whose tenant
        // ran `close_rows` units in it, released and summed as releases sum them.
        let dir = tempfile::tempdir().expect("temp dir");
        let fresh = Fresh::open(dir.path(), &scale.fleet()).await;
        let seeding = Instant::now();
        seed_usage(&fresh.pool, close_rows, month).await;
        let summed = fresh.platform.sum_released_usage().await.expect("sum released usage");
        assert_eq!(summed, close_rows);
        println!(
            "== statements: {close_rows} ledger rows in {} (seeded and summed in {:.1} s)",
            month.title(),
            seeding.elapsed().as_secs_f64()
        );
        let tenant_id: i64 = sqlx::query_scalar("SELECT id FROM tenants WHERE slug = 'bench'")
            .fetch_one(&fresh.pool)
            .await
            .expect("tenant");
        let t = Instant::now();
        assert!(fresh.platform.close_month(Some(tenant_id), month).await.expect("close the month"));
        let took = t.elapsed();
        let (lines, total): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM statement_lines), (SELECT total_cents FROM statements WHERE tenant_id = ?)",
        )
        .bind(tenant_id)
        .fetch_one(&fresh.pool)
        .await
        .expect("statement");
        println!(
            "Platform::close_month of {close_rows} rows: {:.0} ms ({lines} lines, {})",
            took.as_secs_f64() * 1000.0,
            berth_domain::metering::format_money(total)
        );
    });
}

/// `units` capacity units of one tenant ("bench", 10 projects, 50 members) that ran and were
/// released within `month` (whole GPUs and 3g slices), with their usage ledger rows as
/// booking and provisioning write them: what a busy tenant's usage page reads. Answers the
/// tenant's slug.
async fn seed_usage(pool: &SqlitePool, units: usize, month: Month) -> &'static str {
    let now = berth_platform::now_ms();
    let tenant: i64 = sqlx::query_scalar(
        "INSERT INTO tenants (slug, name, isolation, status, created_at) VALUES ('bench', 'Bench', 'soft', 'active', 0)
         RETURNING id",
    )
    .fetch_one(pool)
    .await
    .expect("tenant");
    let mut tx = pool.begin().await.expect("tx");
    let mut projects = Vec::new();
    for p in 0..10 {
        let id: i64 =
            sqlx::query_scalar("INSERT INTO projects (tenant_id, name, created_at) VALUES (?, ?, 0) RETURNING id")
                .bind(tenant)
                .bind(format!("project-{p}"))
                .fetch_one(&mut *tx)
                .await
                .expect("project");
        projects.push(id);
    }
    let mut people = Vec::new();
    for m in 0..50 {
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO users (email, display_name, role, tenant_id, created_at)
             VALUES (?, ?, 'member', ?, 0) RETURNING id",
        )
        .bind(format!("member-{m}@bench"))
        .bind(format!("Member {m}"))
        .bind(tenant)
        .fetch_one(&mut *tx)
        .await
        .expect("member");
        people.push(id);
    }
    let gpus: Vec<(i64, String)> =
        sqlx::query_as("SELECT id, model FROM gpus ORDER BY id").fetch_all(&mut *tx).await.expect("gpus");
    let (month_start, month_end) = month.span();
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    for unit in 0..units {
        let hours = rng.random_range(1..48);
        let start = month_start + rng.random_range(0..(month_end - month_start - hours * HOUR_MS) / HOUR_MS) * HOUR_MS;
        let end = start + hours * HOUR_MS;
        // Some stop early, as people do.
        let released = if rng.random_bool(0.3) { start + (end - start) / 2 } else { end };
        let (gpu, model) = &gpus[unit % gpus.len()];
        let mig = rng.random_bool(0.3);
        let (size, cents, slice_size, profile, parts, part_of) =
            if mig { ("h100-3g.40gb", 155, 4, Some("3g"), 3, 7) } else { ("h100-1", 320, 8, None, 8, 8) };
        let (project, owner) = (projects[unit % projects.len()], people[unit % people.len()]);
        let id = format!("usage-{unit}");
        sqlx::query(
            "INSERT INTO environments (id, owner_id, tenant_id, project_id, name, offering, size_id, cents_per_hour, state,
                 desired, created_at, starts_at, ends_at, state_changed_at, finished_at, held_at)
             VALUES (?1, ?2, ?3, ?4, ?1, 'training', ?5, ?6, 'released', 'released', ?7, ?7, ?8, ?9, ?9, ?7)",
        )
        .bind(&id)
        .bind(owner)
        .bind(tenant)
        .bind(project)
        .bind(size)
        .bind(cents)
        .bind(start)
        .bind(end)
        .bind(released)
        .execute(&mut *tx)
        .await
        .expect("environment");
        let reservation: i64 = sqlx::query_scalar(
            "INSERT INTO reservations (environment_id, gpu_id, slice_start, slice_size, mig_profile, starts_at, ends_at,
                 released_at)
             VALUES (?, ?, 0, ?, ?, ?, ?, ?) RETURNING id",
        )
        .bind(&id)
        .bind(gpu)
        .bind(slice_size)
        .bind(profile)
        .bind(start)
        .bind(end)
        .bind(released)
        .fetch_one(&mut *tx)
        .await
        .expect("reservation");
        sqlx::query(
            "INSERT INTO usage_ledger (reservation_id, environment_id, tenant_id, project_id, owner_id, offering, size_id,
                 gpu_model, mig_profile, tier, gpu_parts, gpu_part_of, size_cents_per_hour, units_per_copy, booked_at,
                 held_from)
             VALUES (?, ?, ?, ?, ?, 'training', ?, ?, ?, 'guaranteed', ?, ?, ?, 1, ?, ?)",
        )
        .bind(reservation)
        .bind(&id)
        .bind(tenant)
        .bind(project)
        .bind(owner)
        .bind(size)
        .bind(model)
        .bind(profile)
        .bind(parts)
        .bind(part_of)
        .bind(cents)
        .bind(start.min(now))
        .bind(start)
        .execute(&mut *tx)
        .await
        .expect("ledger");
    }
    tx.commit().await.expect("commit");
    "bench"
}
