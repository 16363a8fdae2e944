//! Metering through the platform: the usage ledger against the reservations, usage reports
//! within each role's reach, and monthly budgets refusing (or warning about) bookings.
#![allow(clippy::expect_used, clippy::unwrap_used)] // helpers of tests stop the test with their message

mod common;

use std::time::Duration;

use berth_domain::Refusal;
use berth_domain::booking::{DAY_MS, HOUR_MS};
use berth_domain::launch::LaunchRequest;
use berth_domain::lifecycle::EnvState;
use berth_domain::metering::{Month, to_cents, unit_charge};
use berth_domain::policy::Role;
use berth_platform::capacity::metering::{BudgetChange, UsageBy};
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
