//! Metering through the platform: the usage ledger against the reservations, usage reports
//! within each role's reach, and monthly budgets refusing (or warning about) bookings.
#![allow(clippy::expect_used, clippy::unwrap_used)] // helpers of tests stop the test with their message

mod common;

use std::time::Duration;

use berth_domain::Refusal;
use berth_domain::booking::{DAY_MS, HOUR_MS};
use berth_domain::catalog::Offering;
use berth_domain::launch::LaunchRequest;
use berth_domain::lifecycle::EnvState;
use berth_domain::metering::{Month, to_cents, unit_charge};
use berth_domain::policy::Role;
use berth_platform::capacity::budgets::BudgetChange;
use berth_platform::capacity::metering::UsageBy;
use berth_platform::{Caller, Error, now_ms};
use common::TestBerth;
use sqlx::SqlitePool;

/// 10:00 UTC on the 3rd of next month: a window wholly inside one month, whatever today is.
fn next_month_morning() -> (Month, i64) {
    let month = Month::of(now_ms()).next();
    (month, month.starts_at() + 2 * DAY_MS + 10 * HOUR_MS)
}

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).expect("time").to_rfc3339()
}

/// A training job of one H100 ($3.20 an hour) in `project`.
async fn train(
    berth: &TestBerth,
    caller: &Caller,
    name: &str,
    project: i64,
    start: i64,
    hours: u32,
) -> Result<String, Error> {
    let request = LaunchRequest {
        offering: "training".into(),
        size: "h100-1".into(),
        name: name.into(),
        hours: hours.to_string(),
        start: rfc3339(start),
        image: "ghcr.io/acme/train:1".into(),
        command: "python train.py".into(),
        project: project.to_string(),
        ..LaunchRequest::default()
    };
    berth.platform.launch(caller, &request).await.map(|env| env.id)
}

/// A tenant admin, and project "vision" of Dana's tenant with Dana in it.
async fn vision(berth: &TestBerth) -> (Caller, i64) {
    let boss = berth.user_with("boss@example.com", Role::TenantAdmin).await;
    let tenant = berth.caller.tenant_id().unwrap();
    berth.platform.create_project(&boss, tenant, "vision").await.unwrap();
    let project =
        berth.platform.projects(&boss, tenant).await.unwrap().into_iter().find(|p| p.name == "vision").unwrap();
    berth.platform.add_project_member(&boss, tenant, project.id, "dana@example.com").await.unwrap();
    (boss, project.id)
}

fn budget(level: &str, who: &str, amount: &str, warn_only: bool) -> BudgetChange {
    BudgetChange { level: level.into(), who: who.into(), amount: amount.into(), warn_only }
}

async fn count(berth: &TestBerth, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(berth.platform.db()).await.unwrap()
}

#[sqlx::test(migrations = "../migrations")]
async fn a_booking_past_the_project_budget_is_refused_saying_what_is_left(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let (boss, project) = vision(&berth).await;
    berth.platform.set_budget(&boss, &budget("project", "vision", "20", false)).await.unwrap();
    let (month, start) = next_month_morning();

    // $12.80 of $20: fits, and passes the 50% mark.
    train(&berth, &berth.caller, "first", project, start, 4).await.unwrap();
    let environments = count(&berth, "SELECT count(*) FROM environments").await;
    let reservations = count(&berth, "SELECT count(*) FROM reservations").await;
    let error = train(&berth, &berth.caller, "second", project, start + 5 * HOUR_MS, 4).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "budget: this booking costs $12.80 for 4 h; project vision has $7.20 of $20.00 left in {}",
            month.name()
        )
    );
    assert!(matches!(error, Error::Refused(Refusal::OverBudget(_))));
    // Nothing of the refused booking was written.
    assert_eq!(count(&berth, "SELECT count(*) FROM environments").await, environments);
    assert_eq!(count(&berth, "SELECT count(*) FROM reservations").await, reservations);
    assert_eq!(count(&berth, "SELECT count(*) FROM usage_ledger").await, reservations);

    // Two hours fit ($6.40), and reach the 80% mark.
    train(&berth, &berth.caller, "second", project, start + 5 * HOUR_MS, 2).await.unwrap();
    let marks: Vec<String> = sqlx::query_scalar(
        "SELECT detail FROM audit_events WHERE action = 'budget.threshold' AND target = 'project vision' ORDER BY id",
    )
    .fetch_all(berth.platform.db())
    .await
    .unwrap();
    let title = month.title();
    assert_eq!(marks, vec![format!("50% of $20.00 in {title} reached"), format!("80% of $20.00 in {title} reached")]);

    // The tenant admin's report shows the month committed, nothing spent yet.
    let report = berth.platform.usage_report(&boss, month, UsageBy::Project, None).await.unwrap();
    let status = report.budgets.iter().find(|b| b.of == "Project acme/vision").expect("the project's budget");
    assert_eq!((status.spent_cents, status.committed_cents, status.reached.clone()), (0, 1920, vec![50, 80]));
    assert_eq!(report.total_cents, 0, "nothing has run yet");

    // Warn only: the booking goes through, and the 100% mark is recorded.
    berth.platform.set_budget(&boss, &budget("project", "vision", "$20.00", true)).await.unwrap();
    train(&berth, &berth.caller, "third", project, start + 8 * HOUR_MS, 2).await.unwrap();
    let report = berth.platform.usage_report(&boss, month, UsageBy::Project, None).await.unwrap();
    assert_eq!(report.budgets[0].reached, vec![50, 80, 100]);
    assert_eq!(report.budgets[0].committed_cents, 2560);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_booking_across_months_counts_in_each_by_its_hours_there(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let (boss, project) = vision(&berth).await;
    let (month, _) = next_month_morning();
    // 20:00 on the last day of next month, for 8 hours: 4 in it, 4 in the one after.
    let start = month.next().starts_at() - 4 * HOUR_MS;
    berth.platform.set_budget(&boss, &budget("project", "vision", "15", false)).await.unwrap();
    train(&berth, &berth.caller, "early", project, month.starts_at() + 2 * DAY_MS, 1).await.unwrap();
    let error = train(&berth, &berth.caller, "late", project, start, 8).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "budget: this booking costs $25.60 for 8 h, $12.80 of it in {}; project vision has $11.80 of $15.00 left in {}",
            month.name(),
            month.name()
        )
    );
    berth.platform.set_budget(&boss, &budget("project", "vision", "16", false)).await.unwrap();
    train(&berth, &berth.caller, "late", project, start, 8).await.unwrap();
    for (m, committed) in [(month, 320 + 1280), (month.next(), 1280)] {
        let report = berth.platform.usage_report(&boss, m, UsageBy::Project, None).await.unwrap();
        assert_eq!(report.budgets[0].committed_cents, committed, "{}", m.key());
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn budgets_are_set_within_reach(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let (boss, _) = vision(&berth).await;
    // A tenant's own budget is the platform's to set; a member sets none.
    let refused = berth.platform.set_budget(&boss, &budget("tenant", "acme", "100", false)).await;
    assert!(matches!(refused, Err(Error::Forbidden)), "{refused:?}");
    let refused = berth.platform.set_budget(&berth.caller, &budget("project", "vision", "100", false)).await;
    assert!(matches!(refused, Err(Error::Forbidden)), "{refused:?}");
    let admin = berth.admin().await;
    berth.platform.set_budget(&admin, &budget("tenant", "acme", "100", false)).await.unwrap();
    // Bad input: a plain message, nothing written.
    for (change, message) in [
        (budget("project", "vision", "lots", false), "budget: \"lots\" is not an amount like 2000 or 2,000.50"),
        (budget("project", "nope", "5", false), "budget: there is no project \"nope\""),
        (
            budget("team", "vision", "5", false),
            "budget: \"team\" is not something a budget applies to; choose tenant or project",
        ),
    ] {
        assert_eq!(berth.platform.set_budget(&boss, &change).await.unwrap_err().to_string(), message);
    }
    assert_eq!(count(&berth, "SELECT count(*) FROM budgets").await, 1);
    // The tenant admin sees the tenant's budget and cannot remove it; the platform admin can.
    let report = berth.platform.usage_report(&boss, Month::of(now_ms()), UsageBy::Project, None).await.unwrap();
    let id = report.budgets[0].id;
    assert!(matches!(berth.platform.remove_budget(&boss, id).await, Err(Error::NotFound)));
    berth.platform.remove_budget(&admin, id).await.unwrap();
    assert_eq!(count(&berth, "SELECT count(*) FROM budgets").await, 0);
}

#[sqlx::test(migrations = "../migrations")]
async fn used_time_is_charged_from_provisioning_to_release(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let (boss, project) = vision(&berth).await;
    let request = LaunchRequest {
        offering: "notebook".into(),
        size: "h100-3g.40gb".into(),
        name: "nb".into(),
        hours: "2".into(),
        project: project.to_string(),
        ..LaunchRequest::default()
    };
    let env = berth.platform.launch(&berth.caller, &request).await.unwrap();
    berth.wait_for(&env.id, EnvState::Ready).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    berth.platform.stop(&berth.caller, &env.id).await.unwrap();
    berth.wait_for(&env.id, EnvState::Released).await;

    let (held_at, released_at): (i64, i64) = sqlx::query_as(
        "SELECT e.held_at, r.released_at FROM environments e JOIN reservations r ON r.environment_id = e.id WHERE e.id = ?",
    )
    .bind(&env.id)
    .fetch_one(berth.platform.db())
    .await
    .unwrap();
    let held = released_at - held_at;
    assert!(held >= 300, "held {held} ms");
    let month = Month::of(held_at);
    let report = berth.platform.usage_report(&boss, month, UsageBy::Environment, None).await.unwrap();
    let line = report.lines.iter().find(|l| l.key == env.id).expect("the notebook's line");
    assert_eq!(line.label, "nb");
    // A 3g slice of an H100 at $1.55 an hour; 3/7 of a GPU.
    assert_eq!(line.cents, to_cents(unit_charge(held, 155, 1)));
    assert!((line.gpu_hours - held as f64 / HOUR_MS as f64 * 3.0 / 7.0).abs() < 1e-12);
    // The operator's counters (`/metrics`) say the same.
    let totals = berth.platform.usage_totals().await.unwrap();
    let vision = totals.iter().find(|t| (t.tenant.as_str(), t.project.as_str()) == ("acme", "vision")).unwrap();
    assert_eq!(vision.cents, line.cents);
    assert!((vision.gpu_hours - line.gpu_hours).abs() < 1e-12);
    // Dana sees it as her own; another member of the tenant does not.
    let own = berth.platform.usage_report(&berth.caller, month, UsageBy::Person, None).await.unwrap();
    assert_eq!(own.lines.iter().map(|l| l.key.as_str()).collect::<Vec<_>>(), vec!["dana@example.com"]);
    let other = berth.user_with("olga@example.com", Role::Member).await;
    let theirs = berth.platform.usage_report(&other, month, UsageBy::Person, None).await.unwrap();
    assert!(theirs.lines.is_empty(), "{:?}", theirs.lines);
}

/// Units written as SQL (as the usage benchmark writes them): `released` first, then the
/// units still held or booked, which must not overlap on a GPU. Answers the number of
/// released units.
struct Seeder {
    tenant: i64,
    projects: Vec<Option<i64>>,
    owners: Vec<(Option<i64>, i64)>,
    /// (id, model) of GPUs not time-sliced.
    gpus: Vec<(i64, String)>,
    next: usize,
}

/// One unit to seed: its window, holding and release, and what it is.
#[derive(Clone, Copy)]
struct Seed {
    starts_at: i64,
    ends_at: i64,
    held_from: Option<i64>,
    released_at: Option<i64>,
    mig: bool,
    spot: bool,
}

impl Seeder {
    /// An environment of `units` (its copies' units share a window) with `seeds`' times, on
    /// GPUs picked by `gpu` (an index into the fleet's).
    async fn environment(&mut self, pool: &SqlitePool, seeds: &[Seed], gpu: impl Fn(usize) -> usize) {
        use rand::{Rng, SeedableRng};
        let n = self.next;
        self.next += 1;
        let mut rng = rand::rngs::StdRng::seed_from_u64(n as u64);
        let (tenant, owner) = self.owners[n % self.owners.len()];
        let project = if tenant.is_some() { self.projects[rng.random_range(0..self.projects.len())] } else { None };
        let first = seeds[0];
        let id = format!("seeded-{n}");
        let offering = if rng.random_bool(0.5) { "training" } else { "notebook" };
        sqlx::query(
            "INSERT INTO environments (id, owner_id, tenant_id, project_id, name, offering, size_id, cents_per_hour,
                 state, desired, created_at, starts_at, ends_at, state_changed_at, finished_at, held_at)
             VALUES (?1, ?2, ?3, ?4, ?1, ?5, 'seeded', 0, ?10, ?11, ?6, ?6, ?7, ?6, ?8, ?9)",
        )
        .bind(&id)
        .bind(owner)
        .bind(tenant)
        .bind(project)
        .bind(offering)
        .bind(first.starts_at)
        .bind(first.ends_at)
        .bind(first.released_at)
        .bind(first.held_from)
        .bind(if first.released_at.is_some() { "released" } else { "ready" })
        .bind(if first.released_at.is_some() { "released" } else { "running" })
        .execute(pool)
        .await
        .unwrap();
        let copies = seeds.len() as i64;
        for (i, seed) in seeds.iter().enumerate() {
            // An environment's units are of one size: one model.
            let model_of_first = &self.gpus[gpu(0) % self.gpus.len()].1;
            let same: Vec<&(i64, String)> = self.gpus.iter().filter(|g| &g.1 == model_of_first).collect();
            let (gpu, model) = same[(gpu(i) + i) % same.len()].clone();
            let mig = seed.mig && model.starts_with("H100");
            let (slice, profile, parts, part_of, cents) = match (mig, model.as_str()) {
                (true, _) => (4, Some("3g"), 3, 7, 155),
                (false, "L40S") => (8, None, 8, 8, 185 * copies),
                _ => (8, None, 8, 8, 320 * copies),
            };
            let reservation: i64 = sqlx::query_scalar(
                "INSERT INTO reservations (environment_id, gpu_id, slice_start, slice_size, mig_profile, starts_at,
                     ends_at, released_at)
                 VALUES (?, ?, 0, ?, ?, ?, ?, ?) RETURNING id",
            )
            .bind(&id)
            .bind(gpu)
            .bind(slice)
            .bind(profile)
            .bind(seed.starts_at)
            .bind(seed.ends_at)
            .bind(seed.released_at)
            .fetch_one(pool)
            .await
            .unwrap();
            sqlx::query(
                "INSERT INTO usage_ledger (reservation_id, environment_id, tenant_id, project_id, owner_id, offering,
                     size_id, gpu_model, mig_profile, tier, gpu_parts, gpu_part_of, size_cents_per_hour,
                     units_per_copy, booked_at, held_from)
                 VALUES (?, ?, ?, ?, ?, ?, 'seeded', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(reservation)
            .bind(&id)
            .bind(tenant)
            .bind(project)
            .bind(owner)
            .bind(offering)
            .bind(&model)
            .bind(profile)
            .bind(if seed.spot { "spot" } else { "guaranteed" })
            .bind(parts)
            .bind(part_of)
            .bind(cents)
            .bind(if mig { 1 } else { copies })
            .bind(seed.starts_at)
            .bind(seed.held_from)
            .execute(pool)
            .await
            .unwrap();
        }
        let _ = self.tenant;
    }
}

/// Every report a person could ask for, on both charge bases, of the three months around
/// now: (what, report).
async fn every_report(
    platforms: &[berth_platform::Platform],
    callers: &[(&str, &Caller, Option<&str>)],
) -> Vec<(String, berth_platform::capacity::metering::UsageReport)> {
    let this = Month::of(now_ms());
    let mut reports = Vec::new();
    for platform in platforms {
        for (who, caller, tenant) in callers {
            for month in [this.previous(), this, this.next()] {
                for by in UsageBy::ALL {
                    let report = platform.usage_report(caller, month, by, *tenant).await.unwrap();
                    let what = format!("{:?} {who} {} by {}", platform.charging(), month.key(), by.as_str());
                    reports.push((what, report));
                }
            }
        }
    }
    reports
}

/// Reports and budgets count released units from their sums and the others row by row:
/// the figures are those of counting every unit row by row, to the cent and the
/// environment, on either charge basis, for every reach, line and month, whether an
/// environment's units are all summed, some, or none.
#[sqlx::test(migrations = "../migrations")]
async fn sums_give_the_figures_of_the_rows(pool: SqlitePool) {
    use berth_domain::metering::ChargeBasis;
    use rand::{Rng, SeedableRng};

    let mut berth = TestBerth::new(pool).await;
    let (boss, vision_id) = vision(&berth).await;
    let admin = berth.admin().await;
    let olga = berth.user_with("olga@example.com", Role::Member).await;
    let tenant = berth.caller.tenant_id().unwrap();
    berth.platform.create_project(&boss, tenant, "other").await.unwrap();
    let other_id: i64 = sqlx::query_scalar("SELECT id FROM projects WHERE name = 'other'")
        .fetch_one(berth.platform.db())
        .await
        .unwrap();
    berth.platform.set_budget(&admin, &budget("tenant", "acme", "5000", false)).await.unwrap();
    berth.platform.set_budget(&boss, &budget("project", "vision", "900", true)).await.unwrap();
    // Seeded rows stay as written: nothing provisions or releases them.
    berth.kill_reconciler().await;
    let pool = berth.platform.db().clone();

    let gpus: Vec<(i64, String)> =
        sqlx::query_as("SELECT id, model FROM gpus WHERE time_slices = 1 ORDER BY id").fetch_all(&pool).await.unwrap();
    let mut seeder = Seeder {
        tenant,
        projects: vec![Some(vision_id), Some(other_id), None],
        owners: vec![
            (Some(tenant), berth.caller.user_id()),
            (Some(tenant), boss.user_id()),
            (Some(tenant), olga.user_id()),
            (None, admin.user_id()),
        ],
        gpus: gpus.clone(),
        next: 0,
    };
    let now = now_ms();
    let from = Month::of(now).previous().starts_at();
    let past = now - 2 * HOUR_MS;
    let mut rng = rand::rngs::StdRng::seed_from_u64(29);
    let mut released = 0;
    // A rate card that changes under the units (a price mid-day, the spot discount, the
    // tenant's discount), so that sums and rows alike cut units where the card changes.
    let changes = [
        (
            "INSERT INTO rates (gpu_model, unit, cents_per_hour, effective_from, set_at) VALUES ('H100-80GB', 'gpu', 410, ?1, 0)",
            20 * DAY_MS + 7 * HOUR_MS + 12_345,
        ),
        (
            "INSERT INTO rates (gpu_model, unit, cents_per_hour, effective_from, set_at) VALUES ('H100-80GB', 'mig:3g', 199, ?1, 0)",
            9 * DAY_MS + 1,
        ),
        (
            "INSERT INTO discounts (tenant_id, basis_points, effective_from, set_at) VALUES (NULL, 6000, ?1, 0)",
            3 * DAY_MS + 300_000,
        ),
        (
            "INSERT INTO discounts (tenant_id, basis_points, effective_from, set_at) VALUES (?2, 1250, ?1, 0)",
            35 * DAY_MS,
        ),
    ];
    for (sql, after) in changes {
        sqlx::query(sql).bind(from + after).bind(tenant).execute(&pool).await.unwrap();
    }
    // Released units, all in the past (a report of now must not change while it is read
    // twice): run to their end or stopped early, started late or never, across midnights
    // and the month's turn; and bookings cancelled before they began.
    for n in 0..240 {
        let starts_at = rng.random_range(from..past - HOUR_MS);
        let ends_at = (starts_at + rng.random_range(HOUR_MS / 4..72 * HOUR_MS)).min(past);
        let held_from = match rng.random_range(0..10) {
            0 => None,
            1 | 2 => Some(starts_at),
            _ => Some(starts_at + rng.random_range(0..30 * 60_000)),
        };
        let released_at = match (held_from, rng.random_range(0..10)) {
            (None, 0..5) => starts_at - 1,
            (_, 0..3) => rng.random_range(starts_at..ends_at),
            _ => ends_at + rng.random_range(0..10 * 60_000),
        };
        let seed = Seed {
            starts_at,
            ends_at,
            held_from,
            released_at: Some(released_at),
            mig: rng.random_bool(0.3),
            spot: rng.random_bool(0.2),
        };
        let copies = if n % 7 == 0 { 2 } else { 1 };
        seeder.environment(&pool, &vec![seed; copies], |i| n + i).await;
        released += copies;
    }
    // Cancelled future bookings.
    for _ in 0..10 {
        let starts_at = rng.random_range(now + DAY_MS..Month::of(now).next().next().starts_at() - DAY_MS);
        let ends_at = starts_at + rng.random_range(HOUR_MS..48 * HOUR_MS);
        let seed =
            Seed { starts_at, ends_at, held_from: None, released_at: Some(now - HOUR_MS), mig: false, spot: false };
        seeder.environment(&pool, &[seed], |_| 0).await;
        released += 1;
    }
    // Units not released, each on a GPU of its own: booked for later (into next month),
    // held past their window's end, and one environment with a released unit beside a unit
    // still held.
    let open_gpu = |k: usize| move |_| k;
    for (k, gpu) in (0..gpus.len()).enumerate().take(4) {
        let seed = if k % 2 == 0 {
            let starts_at = now + rng.random_range(HOUR_MS..20 * DAY_MS);
            Seed {
                starts_at,
                ends_at: starts_at + 30 * HOUR_MS,
                held_from: None,
                released_at: None,
                mig: false,
                spot: k == 2,
            }
        } else {
            let starts_at = past - 40 * HOUR_MS;
            Seed {
                starts_at,
                ends_at: past - HOUR_MS,
                held_from: Some(starts_at + 60_000),
                released_at: None,
                mig: false,
                spot: false,
            }
        };
        seeder.environment(&pool, &[seed], open_gpu(gpu)).await;
    }
    let starts_at = past - 30 * HOUR_MS;
    let mixed = [
        Seed {
            starts_at,
            ends_at: past,
            held_from: Some(starts_at),
            released_at: Some(past - 10 * HOUR_MS),
            mig: false,
            spot: false,
        },
        Seed { starts_at, ends_at: past, held_from: Some(starts_at), released_at: None, mig: false, spot: false },
    ];
    // The released one first: a released unit may not be written over a held one.
    seeder.environment(&pool, &mixed, |_| 4).await;
    released += 1;

    let window = berth.platform.clone().with_charging(ChargeBasis::ReservedWindow);
    let platforms = [berth.platform.clone(), window];
    let callers: [(&str, &Caller, Option<&str>); 5] = [
        ("platform admin", &admin, None),
        ("platform admin in acme", &admin, Some("acme")),
        ("tenant admin", &boss, None),
        ("member of vision", &berth.caller, None),
        ("member", &olga, None),
    ];
    // Nothing is summed yet: every unit is counted row by row.
    let rows = every_report(&platforms, &callers).await;
    assert!(rows.iter().any(|(_, r)| r.total_cents > 0 && r.lines.len() > 2), "the seed shows up");
    assert_eq!(berth.platform.sum_released_usage().await.unwrap(), released);
    assert_eq!(count(&berth, "SELECT count(*) FROM usage_ledger WHERE summed = 0").await, 5);
    let sums = every_report(&platforms, &callers).await;

    for ((what, rows), (_, sums)) in rows.iter().zip(&sums) {
        let lines = |r: &berth_platform::capacity::metering::UsageReport| {
            r.lines.iter().map(|l| (l.key.clone(), l.label.clone(), l.cents, l.environments)).collect::<Vec<_>>()
        };
        assert_eq!(lines(sums), lines(rows), "{what}: lines");
        for (s, r) in sums.lines.iter().zip(&rows.lines) {
            assert!((s.gpu_hours - r.gpu_hours).abs() < 1e-9, "{what}: {} GPU-hours", s.key);
        }
        // Days and weeks: the same cents, and GPU-hours within rounding.
        for (cut, s, r) in [("days", &sums.daily, &rows.daily), ("weeks", &sums.weekly, &rows.weekly)] {
            assert_eq!(s.len(), r.len(), "{what}: {cut}");
            for (s, r) in s.iter().zip(r) {
                assert_eq!((s.first_day, s.last_day, &s.cents), (r.first_day, r.last_day, &r.cents), "{what}: {cut}");
                for (a, b) in s.gpu_hours.iter().zip(&r.gpu_hours) {
                    assert!((a - b).abs() < 1e-9, "{what}: {cut} from {}: {a} GPU-hours against {b}", s.first_day);
                }
            }
        }
        // A week's lines are its days' GPU-hours, and its cents within a cent a line of them.
        for week in &rows.weekly {
            let days: Vec<_> =
                rows.daily.iter().filter(|d| (week.first_day..=week.last_day).contains(&d.first_day)).collect();
            assert_eq!(days.len(), (week.last_day - week.first_day).num_days() as usize + 1, "{what}");
            for line in 0..rows.lines.len() {
                let cents: i64 = days.iter().map(|d| d.cents[line]).sum();
                assert!((week.cents[line] - cents).abs() <= days.len() as i64, "{what}: week from {}", week.first_day);
                let hours: f64 = days.iter().map(|d| d.gpu_hours[line]).sum();
                assert!((week.gpu_hours[line] - hours).abs() < 1e-9, "{what}: week from {}", week.first_day);
            }
        }
        assert_eq!(sums.total_cents, rows.total_cents, "{what}: total");
        assert_eq!(sums.budgets, rows.budgets, "{what}: budgets");
        assert_eq!(sums.fleet.len(), rows.fleet.len(), "{what}: fleet");
        for (s, r) in sums.fleet.iter().zip(&rows.fleet) {
            for (a, b) in s.allocated_gpu_hours.iter().zip(&r.allocated_gpu_hours) {
                assert!((a - b).abs() < 1e-9, "{what}: {} allocated {a} against {b}", s.model);
            }
        }
    }
}

/// Releasing a unit sums it in the same transaction: the report reads it from its sums.
#[sqlx::test(migrations = "../migrations")]
async fn a_release_sums_its_units(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let (boss, project) = vision(&berth).await;
    let (month, start) = next_month_morning();
    let id = train(&berth, &berth.caller, "later", project, start, 3).await.unwrap();
    assert_eq!(count(&berth, "SELECT count(*) FROM usage_ledger WHERE summed = 0").await, 1);
    let env = berth
        .platform
        .launch(
            &berth.caller,
            &LaunchRequest {
                offering: "notebook".into(),
                size: "h100-1".into(),
                name: "nb".into(),
                hours: "2".into(),
                project: project.to_string(),
                ..LaunchRequest::default()
            },
        )
        .await
        .unwrap();
    berth.wait_for(&env.id, EnvState::Ready).await;
    berth.platform.stop(&berth.caller, &env.id).await.unwrap();
    berth.wait_for(&env.id, EnvState::Released).await;
    // The notebook's unit is summed; the booking for next month is not released, not summed.
    let summed: Vec<String> = sqlx::query_scalar("SELECT environment_id FROM usage_ledger WHERE summed = 1")
        .fetch_all(berth.platform.db())
        .await
        .unwrap();
    assert_eq!(summed, vec![env.id.clone()]);
    assert!(count(&berth, "SELECT count(*) FROM usage_sums WHERE basis = 'use'").await >= 1);
    let this = Month::of(now_ms());
    let by_environment = berth.platform.usage_report(&boss, this, UsageBy::Environment, None).await.unwrap();
    let by_project = berth.platform.usage_report(&boss, this, UsageBy::Project, None).await.unwrap();
    assert_eq!(by_project.total_cents, by_environment.total_cents);
    assert_eq!(by_project.lines[0].environments, 1);
    // Summed once: a summed unit's reservation and its mark cannot change.
    let changed = sqlx::query("UPDATE reservations SET ends_at = ends_at + 1 WHERE environment_id = ?")
        .bind(&env.id)
        .execute(berth.platform.db())
        .await;
    assert!(changed.is_err(), "a summed unit's window moved");
    let unsummed = sqlx::query("UPDATE usage_ledger SET summed = 0 WHERE environment_id = ?")
        .bind(&env.id)
        .execute(berth.platform.db())
        .await;
    assert!(unsummed.is_err(), "a summed unit was unmarked");
    let early = sqlx::query("UPDATE usage_ledger SET summed = 1 WHERE environment_id = ?")
        .bind(&id)
        .execute(berth.platform.db())
        .await;
    assert!(early.is_err(), "a unit was summed before its release");
    let _ = month;
}

/// "As soon as possible" looks past a month whose budget the booking would exceed: it gets
/// the earliest start from the next month on, or the budget's refusal when its search ends
/// first.
#[sqlx::test(migrations = "../migrations")]
async fn as_soon_as_possible_waits_for_a_month_the_budget_allows(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let (boss, project) = vision(&berth).await;
    berth.platform.set_budget(&boss, &budget("project", "vision", "20", false)).await.unwrap();
    // $12.80 of this month's $20 (a part of it in next month's when this month ends within
    // 4 h: next month keeps at least $7.20 then).
    train(&berth, &berth.caller, "first", project, now_ms(), 4).await.unwrap();
    let asap = |days: &str| LaunchRequest {
        offering: "training".into(),
        size: "h100-1".into(),
        name: format!("asap-{days}"),
        hours: "4".into(),
        earliest_within_days: days.into(),
        image: "ghcr.io/acme/train:1".into(),
        command: "python train.py".into(),
        project: project.to_string(),
        ..LaunchRequest::default()
    };
    let next_month = Month::of(now_ms()).next().starts_at();
    if next_month - now_ms() > DAY_MS {
        // A search of one day ends before next month: the budget's refusal, nothing written.
        let error = berth.platform.launch(&berth.caller, &asap("1")).await.unwrap_err();
        assert!(matches!(error, Error::Refused(Refusal::OverBudget(_))), "{error}");
    }
    // The launch form's hints (and the API's availability) say so before anyone launches:
    // for the project, the first fit within its budget; without it, now.
    let hints = berth
        .platform
        .size_availability_within_budget(&berth.caller, &project.to_string(), Offering::TrainingJob, 4, None)
        .await
        .unwrap();
    let h100 = hints.iter().find(|s| s.size.id == "h100-1").unwrap();
    assert!(h100.free_now > 0, "the capacity is free: the budget is what stops it");
    let why = h100.over_budget.as_deref().expect("over budget");
    assert!(why.starts_with("this booking costs $12.80 for 4 h"), "{why}");
    assert!(why.contains("project vision has"), "{why}");
    assert_eq!(h100.earliest_start, Some(next_month));
    let hints = berth
        .platform
        .size_availability_within_budget(&berth.caller, "", Offering::TrainingJob, 4, None)
        .await
        .unwrap();
    let h100 = hints.iter().find(|s| s.size.id == "h100-1").unwrap();
    assert_eq!(h100.over_budget, None);
    assert!(h100.earliest_start.unwrap() < next_month);
    // A project one may not book in is refused, as the launch refuses it.
    let error = berth
        .platform
        .size_availability_within_budget(&berth.caller, "999", Offering::TrainingJob, 4, None)
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Refused(Refusal::UnknownProject(_))), "{error}");

    let env = berth.platform.launch(&berth.caller, &asap("45")).await.unwrap();
    assert_eq!(env.starts_at, next_month, "the first hour of next month, UTC");
}
