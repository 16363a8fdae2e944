//! Monthly statements: a month closed once it has ended into line items that add up,
//! priced by the rate card (a price change mid-month, a tenant's discount), frozen against
//! later changes, and read only by those who see the tenant's bill.
#![allow(clippy::expect_used, clippy::unwrap_used)] // helpers of tests stop the test with their message

mod common;

use berth_domain::booking::{DAY_MS, HOUR_MS};
use berth_domain::metering::Month;
use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use berth_platform::{Error, now_ms};
use common::{TestBerth, test_meta};
use sqlx::SqlitePool;

/// A unit of a whole H100 for `owner` in `tenant`, from `starts_at` for `hours`, held from
/// its start and released at `released_at` (or still held).
async fn unit(
    pool: &SqlitePool,
    n: usize,
    (tenant, owner): (Option<i64>, i64),
    starts_at: i64,
    hours: i64,
    released_at: Option<i64>,
) {
    let id = format!("stmt-{n}");
    let ends_at = starts_at + hours * HOUR_MS;
    let state = if released_at.is_some() { "released" } else { "ready" };
    sqlx::query(
        "INSERT INTO environments (id, owner_id, tenant_id, name, offering, size_id, cents_per_hour, state, desired,
             created_at, starts_at, ends_at, state_changed_at, held_at, finished_at)
         VALUES (?1, ?2, ?3, ?1, 'training', 'h100-1', 320, ?4, ?7, ?5, ?5, ?6, ?5, ?5, ?8)",
    )
    .bind(&id)
    .bind(owner)
    .bind(tenant)
    .bind(state)
    .bind(starts_at)
    .bind(ends_at)
    .bind(if released_at.is_some() { "released" } else { "running" })
    .bind(released_at)
    .execute(pool)
    .await
    .unwrap();
    let gpu: i64 = sqlx::query_scalar(
        "SELECT id FROM gpus WHERE model = 'H100-80GB' AND time_slices = 1 ORDER BY id LIMIT 1 OFFSET ?",
    )
    .bind(i64::try_from(n).unwrap())
    .fetch_one(pool)
    .await
    .unwrap();
    let reservation: i64 = sqlx::query_scalar(
        "INSERT INTO reservations (environment_id, gpu_id, slice_start, slice_size, starts_at, ends_at, released_at)
         VALUES (?, ?, 0, 8, ?, ?, ?) RETURNING id",
    )
    .bind(&id)
    .bind(gpu)
    .bind(starts_at)
    .bind(ends_at)
    .bind(released_at)
    .fetch_one(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO usage_ledger (reservation_id, environment_id, tenant_id, owner_id, offering, size_id, gpu_model,
             tier, gpu_parts, gpu_part_of, size_cents_per_hour, units_per_copy, booked_at, held_from)
         VALUES (?, ?, ?, ?, 'training', 'h100-1', 'H100-80GB', 'guaranteed', 8, 8, 320, 1, ?, ?)",
    )
    .bind(reservation)
    .bind(&id)
    .bind(tenant)
    .bind(owner)
    .bind(starts_at)
    .bind(starts_at)
    .execute(pool)
    .await
    .unwrap();
}

#[sqlx::test(migrations = "../migrations")]
async fn an_ended_month_closes_into_lines_that_add_up_and_stay(pool: SqlitePool) {
    let mut berth = TestBerth::new(pool).await;
    berth.kill_reconciler().await;
    let pool = berth.platform.db().clone();
    let tenant = berth.caller.tenant_id();
    let dana = (tenant, berth.caller.user_id());
    let boss = berth.user_with("boss@example.com", Role::TenantAdmin).await;
    let last = Month::of(now_ms()).previous();
    let (start, end) = last.span();

    // The H100 costs $4.00 from the 10th; acme has 25% off from the 20th.
    let tenth = start + 9 * DAY_MS;
    let twentieth = start + 19 * DAY_MS;
    sqlx::query("INSERT INTO rates (gpu_model, unit, cents_per_hour, effective_from, set_at) VALUES ('H100-80GB', 'gpu', 400, ?, 0)")
        .bind(tenth)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO discounts (tenant_id, basis_points, effective_from, set_at) VALUES (?, 2500, ?, 0)")
        .bind(tenant)
        .bind(twentieth)
        .execute(&pool)
        .await
        .unwrap();
    // Released and summed: 10 h on the 2nd ($32.00), 10 h from 20:00 on the 9th (4 h at
    // $3.20, 6 h at $4.00: $36.80).
    unit(&pool, 0, dana, start + DAY_MS, 10, Some(start + DAY_MS + 10 * HOUR_MS)).await;
    unit(&pool, 1, dana, tenth - 4 * HOUR_MS, 10, Some(tenth + 6 * HOUR_MS)).await;
    berth.platform.sum_released_usage().await.unwrap();
    // Still held across the month's end (not summed): its last 2 h of the month, at $4.00
    // less 25%, are $6.00.
    unit(&pool, 2, dana, end - 2 * HOUR_MS, 48, None).await;
    // Platform staff's own booking: a statement of its own.
    let admin = berth.admin().await;
    unit(&pool, 3, (None, admin.user_id()), start + 3 * DAY_MS, 1, Some(start + 3 * DAY_MS + HOUR_MS)).await;

    assert_eq!(berth.platform.close_months().await.unwrap(), 2);
    assert_eq!(berth.platform.close_months().await.unwrap(), 0, "closed once");

    let list = berth.platform.statements(&boss).await.unwrap();
    assert_eq!(list.len(), 1, "a tenant admin sees the tenant's only: {list:?}");
    let statement = berth.platform.statement(&boss, list[0].id).await.unwrap();
    assert_eq!(statement.month, last);
    assert_eq!(statement.lines.len(), 1, "one person, one size, one tier: {:?}", statement.lines);
    let line = &statement.lines[0];
    assert_eq!(line.person, "dana@example.com");
    assert_eq!(line.size, "H100-80GB, whole GPU");
    assert_eq!(line.rate, "$3.20, then $4.00 per GPU-hour");
    assert!((line.unit_hours - 22.0).abs() < 1e-9, "{}", line.unit_hours);
    // List: $32.00 + $36.80 + $8.00; discount: 25% of the last $8.00.
    assert_eq!((line.list_cents, line.discount_cents, line.total_cents), (7680, 200, 7480));
    assert_eq!(statement.total_cents, statement.lines.iter().map(|l| l.total_cents).sum::<i64>());
    assert_eq!(statement.list_cents - statement.discount_cents, statement.total_cents);
    let csv = statement.to_csv();
    assert!(csv.contains("\"dana@example.com\",training,\"H100-80GB, whole GPU\",guaranteed,22.0000,22.0000,\"$3.20, then $4.00 per GPU-hour\",76.80,2.00,74.80"), "{csv}");
    assert!(csv.trim_end().ends_with("total,76.80,2.00,74.80"), "{csv}");

    // The tenant's admin was told once, with a link to it; the member was not.
    let told = berth.platform.inbox(&boss).await.unwrap();
    let ready: Vec<_> = told.items.iter().filter(|i| i.kind == "usage.statement_ready").collect();
    assert_eq!(ready.len(), 1, "{:?}", told.items);
    assert_eq!(ready[0].link, format!("/usage/statements/{}", statement.id));
    assert!(ready[0].body.contains("totals $74.80"), "{}", ready[0].body);
    let member = berth.platform.inbox(&berth.caller).await.unwrap();
    assert!(member.items.iter().all(|i| i.kind != "usage.statement_ready"), "{:?}", member.items);

    // Frozen: later changes to the card or the tenant never rewrite it.
    sqlx::query("INSERT INTO rates (gpu_model, unit, cents_per_hour, effective_from, set_at) VALUES ('H100-80GB', 'gpu', 999, ?, 0)")
        .bind(start)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(berth.platform.statement(&boss, statement.id).await.unwrap(), statement);
    for sql in ["UPDATE statements SET total_cents = 0", "DELETE FROM statement_lines", "DELETE FROM statements"] {
        let error = sqlx::query(sql).execute(&pool).await.unwrap_err();
        assert!(error.to_string().contains("closed statement"), "{sql}: {error}");
    }

    // Platform staff see both; a member sees none; another tenant's admin finds nothing.
    let all = berth.platform.statements(&admin).await.unwrap();
    assert_eq!(all.iter().map(|s| s.tenant.as_str()).collect::<Vec<_>>().len(), 2);
    let staff = all.iter().find(|s| s.tenant == "Platform staff").unwrap();
    assert_eq!(staff.total_cents, 320);
    assert!(matches!(berth.platform.statements(&berth.caller).await, Err(Error::Forbidden)));
    let globex = berth.platform.ensure_tenant("globex", "Globex", Isolation::Soft).await.unwrap();
    let other = berth
        .platform
        .create_user("gil@example.com", "Gil", "a long passphrase", Role::TenantAdmin, Some(globex))
        .await
        .unwrap()
        .caller(test_meta());
    assert!(berth.platform.statements(&other).await.unwrap().is_empty());
    assert!(matches!(berth.platform.statement(&other, statement.id).await, Err(Error::NotFound)));
}
