//! The benchmarks' fleet and bookings: 10,000 H100s and 100,000 bookings over 90 days (a
//! small fleet in a smoke run), shared by the booking benchmark (platform) and the fleet
//! page benchmark (server).

use berth_domain::booking::{DAY_MS, HOUR_MS};
use berth_domain::fleet::FleetSpec;
use rand::{Rng, SeedableRng};
use sqlx::SqlitePool;

pub const SITES: usize = 5;
pub const GPUS_PER_NODE: usize = 8;

/// How big a run is: the measurement of BENCHMARKS.md, or, with `BENCH_SMOKE=1`, a run of a
/// few seconds on a small fleet that only proves the benchmark still works (`make test`
/// runs it; its figures mean nothing).
#[derive(Debug, Clone, Copy)]
pub struct Scale {
    pub smoke: bool,
    pub nodes_per_site: usize,
    /// Bookings seeded for the calendar and the fleet page.
    pub bookings: usize,
    /// Timed runs of each query.
    pub runs: usize,
}

impl Scale {
    pub fn from_env() -> Scale {
        if std::env::var("BENCH_SMOKE").is_ok_and(|v| v == "1") {
            Scale { smoke: true, nodes_per_site: 4, bookings: 1_000, runs: 5 }
        } else {
            Scale { smoke: false, nodes_per_site: 250, bookings: 100_000, runs: 50 }
        }
    }

    pub fn nodes(&self) -> usize {
        SITES * self.nodes_per_site
    }

    pub fn gpus(&self) -> usize {
        self.nodes() * GPUS_PER_NODE
    }

    /// 5 sites x `nodes_per_site` x 8 H100-80GB (10,000 GPUs in the full run).
    pub fn fleet(&self) -> FleetSpec {
        let mut toml = String::new();
        for s in 0..SITES {
            toml += &format!(
                "[[site]]\nname = \"site-{s}\"\n[[site.pool]]\nprefix = \"s{s}-h100\"\nmodel = \"H100-80GB\"\nnodes = {}\ngpus_per_node = {GPUS_PER_NODE}\nnvlink = true\n",
                self.nodes_per_site
            );
        }
        FleetSpec::parse(&toml).expect("fleet")
    }
}

/// 100,000 bookings over 90 days written straight into the tables (through `launch` it
/// would take far longer): ten per GPU with random gaps between them, a fifth of them
/// 3g MIG slices.
pub async fn seed_bookings(pool: &SqlitePool, total: usize, now: i64) {
    let user: i64 = sqlx::query_scalar(
        // A platform account: it needs no tenant (members must have one).
        "INSERT INTO users (email, display_name, role, created_at)
         VALUES ('seed@bench', 'Seed', 'platform_admin', 0) RETURNING id",
    )
    .fetch_one(pool)
    .await
    .expect("user");
    let gpus: Vec<i64> = sqlx::query_scalar("SELECT id FROM gpus ORDER BY id").fetch_all(pool).await.expect("gpus");
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let horizon = now + 90 * DAY_MS;
    // Round robin over the GPUs, each with its own next free time, so every GPU gets about
    // ten bookings and all of them end within 90 days.
    let mut next_free: Vec<i64> = gpus.iter().map(|_| now + rng.random_range(0..48) * HOUR_MS).collect();
    let mut tx = pool.begin().await.expect("tx");
    let mut written = 0;
    let mut turn = 0;
    while written < total {
        let slot = turn % gpus.len();
        turn += 1;
        let gpu = gpus[slot];
        {
            // About 66 h booked, then about 4 days free.
            let hours = rng.random_range(12..120);
            let (start, end) = (next_free[slot], next_free[slot] + hours * HOUR_MS);
            if end > horizon {
                assert!(turn < 100 * total, "the seed cannot fit {total} bookings in 90 days");
                continue;
            }
            next_free[slot] = end + rng.random_range(24..160) * HOUR_MS;
            let id = format!("seed-{written}");
            let mig = rng.random_bool(0.2);
            sqlx::query(
                "INSERT INTO environments (id, owner_id, name, offering, size_id, cents_per_hour, state, desired,
                     created_at, starts_at, ends_at, state_changed_at)
                 VALUES (?, ?, ?, 'training', 'h100-1', 320, 'requested', 'running', ?, ?, ?, ?)",
            )
            .bind(&id)
            .bind(user)
            .bind(&id)
            .bind(now)
            .bind(start)
            .bind(end)
            .bind(now)
            .execute(&mut *tx)
            .await
            .expect("environment");
            let (slice_start, slice_size, profile) = if mig { (0, 4, Some("3g")) } else { (0, 8, None) };
            sqlx::query(
                "INSERT INTO reservations (environment_id, gpu_id, slice_start, slice_size, mig_profile, starts_at, ends_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&id)
            .bind(gpu)
            .bind(slice_start)
            .bind(slice_size)
            .bind(profile)
            .bind(start)
            .bind(end)
            .execute(&mut *tx)
            .await
            .expect("reservation");
            written += 1;
        }
    }
    tx.commit().await.expect("commit");
}
