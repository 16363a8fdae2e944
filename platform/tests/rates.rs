//! The rate card through the platform: what a new Berth charges, platform admins changing
//! prices and discounts (now or from a coming midnight), bookings priced and budgets
//! checked by the card, and what no one else may do.
#![allow(clippy::expect_used, clippy::unwrap_used)] // helpers of tests stop the test with their message

mod common;

use berth_domain::Refusal;
use berth_domain::booking::{DAY_MS, HOUR_MS};
use berth_domain::launch::LaunchRequest;
use berth_domain::metering::Month;
use berth_domain::policy::Role;
use berth_domain::rates::RateCard;
use berth_platform::capacity::budgets::BudgetChange;
use berth_platform::capacity::metering::UsageBy;
use berth_platform::capacity::rates::CardEdit;
use berth_platform::{Caller, Error, now_ms};
use common::TestBerth;
use sqlx::SqlitePool;

fn price(line: &str, price: &str, effective: &str) -> CardEdit {
    CardEdit::Price { line: line.into(), price: price.into(), effective: effective.into() }
}

fn discount(tenant: &str, percent: &str, effective: &str) -> CardEdit {
    CardEdit::Discount { tenant: tenant.into(), percent: percent.into(), effective: effective.into() }
}

fn date(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).unwrap().format("%Y-%m-%d").to_string()
}

async fn train(berth: &TestBerth, name: &str, project: i64, start: i64, hours: u32) -> Result<String, Error> {
    let request = LaunchRequest {
        offering: "training".into(),
        size: "h100-1".into(),
        name: name.into(),
        hours: hours.to_string(),
        start: chrono::DateTime::from_timestamp_millis(start).unwrap().to_rfc3339(),
        image: "ghcr.io/acme/train:1".into(),
        command: "python train.py".into(),
        project: project.to_string(),
        ..LaunchRequest::default()
    };
    berth.platform.launch(&berth.caller, &request).await.map(|env| env.id)
}

async fn audited(berth: &TestBerth, action: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT detail FROM audit_events WHERE action = ? AND outcome = 'success' ORDER BY id")
        .bind(action)
        .fetch_all(berth.platform.db())
        .await
        .unwrap()
}

fn size_price(prices: &[berth_platform::capacity::rates::SizePrice], offering: &str, size: &str) -> Option<i64> {
    prices.iter().find(|p| p.offering == offering && p.size == size).and_then(|p| p.cents_per_hour)
}

#[sqlx::test(migrations = "../migrations")]
async fn a_new_berth_charges_the_default_card(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    assert_eq!(berth.platform.rate_card().await.unwrap(), RateCard::with_defaults());
    let prices = berth.platform.size_prices().await.unwrap();
    assert_eq!(size_price(&prices, "training", "h100-4"), Some(1280));
    assert_eq!(size_price(&prices, "cluster", "h100-node-1"), Some(2560), "a node costs its GPUs");
    assert_eq!(size_price(&prices, "notebook", "l40s-dev"), Some(30));
}

#[sqlx::test(migrations = "../migrations")]
async fn platform_admins_change_prices_now_or_from_a_coming_day(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let admin = berth.admin().await;

    // From now: the catalog and the next booking say so.
    berth.platform.change_card(&admin, &price("H100-80GB/gpu", "$4.00", "")).await.unwrap();
    let prices = berth.platform.size_prices().await.unwrap();
    assert_eq!(size_price(&prices, "training", "h100-4"), Some(1600));
    assert_eq!(size_price(&prices, "cluster", "h100-node-2"), Some(6400));
    let env = berth.launch("notebook", "h100-1", "nb").await.unwrap();
    assert_eq!(env.cents_per_hour, 400);

    // From a coming midnight: listed as to come, the price in force unchanged.
    let tomorrow = date(now_ms() + DAY_MS);
    berth.platform.change_card(&admin, &price("H100-80GB/gpu", "4.50", &tomorrow)).await.unwrap();
    let list = berth.platform.price_list(&admin).await.unwrap();
    let line = list.lines.iter().find(|l| l.id == "H100-80GB/gpu").unwrap();
    assert_eq!(line.cents_per_hour, Some(400));
    let values: Vec<(i64, bool)> = line.changes.iter().map(|c| (c.value, c.to_come)).collect();
    assert_eq!(values, vec![(320, false), (400, false), (450, true)]);
    assert!(line.sizes.iter().any(|s| s == "Dedicated cluster 1 node, 8 x H100 80GB, NVLink"), "{:?}", line.sizes);

    // Asked again for the same day, it replaces the one to come.
    berth.platform.change_card(&admin, &price("H100-80GB/gpu", "4.40", &tomorrow)).await.unwrap();
    let list = berth.platform.price_list(&admin).await.unwrap();
    let line = list.lines.iter().find(|l| l.id == "H100-80GB/gpu").unwrap();
    assert_eq!(line.changes.iter().map(|c| c.value).collect::<Vec<_>>(), vec![320, 400, 440]);

    // A change to come may be withdrawn; one in force has been charged and stays.
    let to_come = line.changes[2].id;
    berth.platform.withdraw_card_change(&admin, false, to_come).await.unwrap();
    let in_force = line.changes[1].id;
    let kept = berth.platform.withdraw_card_change(&admin, false, in_force).await.unwrap_err();
    assert!(kept.to_string().contains("is in force and has been charged"), "{kept}");
    assert!(matches!(berth.platform.withdraw_card_change(&admin, false, to_come).await, Err(Error::NotFound)));

    // Discounts: spot and a tenant's.
    berth.platform.change_card(&admin, &discount("", "60", "")).await.unwrap();
    berth.platform.change_card(&admin, &discount("acme", "12.5%", &tomorrow)).await.unwrap();
    let list = berth.platform.price_list(&admin).await.unwrap();
    assert_eq!(list.spot.basis_points, 6000);
    let acme = list.tenants.iter().find(|t| t.tenant.as_deref() == Some("acme")).unwrap();
    assert_eq!((acme.basis_points, acme.changes[0].value, acme.changes[0].to_come), (0, 1250, true));

    assert_eq!(
        audited(&berth, "price.set").await,
        vec![
            "$4.00 per GPU-hour from now".to_owned(),
            format!("$4.50 per GPU-hour from {tomorrow} (UTC)"),
            format!("$4.40 per GPU-hour from {tomorrow} (UTC)"),
        ]
    );
    assert_eq!(
        audited(&berth, "discount.set").await,
        vec!["60% off from now".to_owned(), format!("12.5% off from {tomorrow} (UTC)")]
    );
    assert_eq!(audited(&berth, "price.withdraw").await.len(), 1);
}

#[sqlx::test(migrations = "../migrations")]
async fn bad_changes_say_what_is_wrong_and_change_nothing(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let admin = berth.admin().await;
    let before = berth.platform.rate_card().await.unwrap();
    let yesterday = date(now_ms() - DAY_MS);
    let today = date(now_ms());
    let cases = [
        (price("H100-80GB/gpu", "four", ""), "prices: \"four\" is not an hourly price like 3.20"),
        (price("H100-80GB/gpu", "100000.01", ""), "prices: a price may be at most $100,000.00 an hour"),
        (price("H100-80GB/mig:9g", "1", ""), "prices: there is no line \"H100-80GB/mig:9g\" on the rate card"),
        (
            price("H100-80GB/gpu", "4", &yesterday),
            &format!(
                "prices: {yesterday} has begun; a change takes effect now or at the start of a coming day (UTC), so nothing charged is charged again"
            ),
        ),
        (
            price("H100-80GB/gpu", "4", &today),
            &format!(
                "prices: {today} has begun; a change takes effect now or at the start of a coming day (UTC), so nothing charged is charged again"
            ),
        ),
        (
            price("H100-80GB/gpu", "4", "next week"),
            "prices: \"next week\" is not a date like 2026-12-01 (or leave it empty for now)",
        ),
        (discount("", "101", ""), "prices: a discount may be at most 100%"),
        (discount("", "a lot", ""), "prices: \"a lot\" is not a discount like 15 or 12.5 (percent)"),
        (discount("nobody", "10", ""), "prices: there is no tenant \"nobody\""),
    ];
    for (edit, message) in cases {
        let error = berth.platform.change_card(&admin, &edit).await.unwrap_err();
        assert_eq!(error.to_string(), message, "{edit:?}");
        assert!(matches!(error, Error::Refused(Refusal::InvalidPrice(_))));
    }
    assert_eq!(berth.platform.rate_card().await.unwrap(), before);
}

#[sqlx::test(migrations = "../migrations")]
async fn only_platform_admins_change_the_card(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let boss: Caller = berth.user_with("boss@example.com", Role::TenantAdmin).await;
    for caller in [&berth.caller, &boss] {
        let error = berth.platform.change_card(caller, &discount("acme", "50", "")).await.unwrap_err();
        assert!(matches!(error, Error::Forbidden), "{error:?}");
        // Everyone who sees the catalog sees the prices; tenants' discounts are not theirs.
        let list = berth.platform.price_list(caller).await.unwrap();
        assert!(!list.may_manage && list.tenant_choices.is_empty());
    }
    assert_eq!(berth.platform.rate_card().await.unwrap(), RateCard::with_defaults());
    let denied: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE action = 'catalog.manage' AND outcome = 'denied'")
            .fetch_one(berth.platform.db())
            .await
            .unwrap();
    assert_eq!(denied, 2);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_size_without_a_price_is_not_booked(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    sqlx::query("DELETE FROM rates WHERE unit = 'share:4'").execute(berth.platform.db()).await.unwrap();
    let error = berth.launch("notebook", "l40s-dev", "dev").await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "L40S shared by 4 (development) (L40S, 1/4 share) has no price on the rate card yet; a platform admin sets one under Prices"
    );
    let environments: i64 =
        sqlx::query_scalar("SELECT count(*) FROM environments").fetch_one(berth.platform.db()).await.unwrap();
    assert_eq!(environments, 0);
}

/// A budget counts a booking at the rates over its window, a change to come included, and
/// the tenant's discount once it is given.
#[sqlx::test(migrations = "../migrations")]
async fn budgets_count_bookings_by_the_card(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let admin = berth.admin().await;
    let boss = berth.user_with("boss@example.com", Role::TenantAdmin).await;
    let tenant = berth.caller.tenant_id().unwrap();
    berth.platform.create_project(&boss, tenant, "vision").await.unwrap();
    let project =
        berth.platform.projects(&boss, tenant).await.unwrap().into_iter().find(|p| p.name == "vision").unwrap().id;
    berth.platform.add_project_member(&boss, tenant, project, "dana@example.com").await.unwrap();
    let change = BudgetChange { level: "project".into(), who: "vision".into(), amount: "30".into(), warn_only: false };
    berth.platform.set_budget(&boss, &change).await.unwrap();

    // $4.00 an hour from the 3rd of next month.
    let month = Month::of(now_ms()).next();
    let third = month.starts_at() + 2 * DAY_MS;
    berth.platform.change_card(&admin, &price("H100-80GB/gpu", "4", &date(third))).await.unwrap();
    let committed = |report: berth_platform::capacity::metering::UsageReport| {
        report.budgets.iter().find(|b| b.of == "Project acme/vision").unwrap().committed_cents
    };

    // 22:00 on the 2nd for 4 h: two hours at $3.20, two at $4.00.
    train(&berth, "across", project, third - 2 * HOUR_MS, 4).await.unwrap();
    let report = berth.platform.usage_report(&boss, month, UsageBy::Project, None).await.unwrap();
    assert_eq!(committed(report), 1440);

    // 12.5% off for acme from now: what is committed is charged less.
    berth.platform.change_card(&admin, &discount("acme", "12.5", "")).await.unwrap();
    let report = berth.platform.usage_report(&boss, month, UsageBy::Project, None).await.unwrap();
    assert_eq!(committed(report), 1260);

    // The refusal prices the booking by the card: 5 h at $4.00 less 12.5% is $17.50.
    let error = train(&berth, "long", project, third + 4 * HOUR_MS, 5).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "budget: this booking costs $17.50 for 5 h; project vision has $17.40 of $30.00 left in {}",
            month.name()
        )
    );
}
