//! Advance booking through the platform: windows in the future, the cleaning gap, changing
//! a booking's end, quotas, availability, and refusals that write nothing.
#![allow(clippy::expect_used, clippy::unwrap_used)] // helpers of tests stop the test with their message

mod common;

use std::time::Duration;

use berth_domain::Refusal;
use berth_domain::booking::{DAY_MS, HOUR_MS, MINUTE_MS, Quota};
use berth_domain::fleet::FleetSpec;
use berth_domain::gpu::GpuModel;
use berth_domain::launch::LaunchRequest;
use berth_domain::lifecycle::EnvState;
use berth_domain::placement::Shape;
use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use berth_platform::capacity::environments::Environment;
use berth_platform::capacity::maintenance::NodeFilter;
use berth_platform::capacity::quotas::{QuotaRow, QuotaSubject};
use berth_platform::{Caller, Error, now_ms};
use common::TestBerth;
use sqlx::SqlitePool;

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).expect("time").to_rfc3339()
}

/// Books `size` for `hours` from `start_ms`: a dedicated cluster for whole nodes (the
/// test fleet's nodes have 2 GPUs), else a training job.
async fn book(
    berth: &TestBerth,
    size: &str,
    name: &str,
    start_ms: Option<i64>,
    hours: u32,
) -> Result<Environment, Error> {
    book_as(berth, &berth.caller, size, name, start_ms, hours).await
}

/// `book` for another user.
async fn book_as(
    berth: &TestBerth,
    caller: &Caller,
    size: &str,
    name: &str,
    start_ms: Option<i64>,
    hours: u32,
) -> Result<Environment, Error> {
    let cluster = size.contains("-node-");
    let request = LaunchRequest {
        offering: if cluster { "cluster" } else { "training" }.into(),
        size: size.into(),
        name: name.into(),
        hours: hours.to_string(),
        start: start_ms.map(rfc3339).unwrap_or_default(),
        image: if cluster { "" } else { "ghcr.io/acme/train:1" }.into(),
        command: if cluster { "" } else { "python train.py; sleep infinity" }.into(),
        ..LaunchRequest::default()
    };
    berth.platform.launch(caller, &request).await
}

/// The node and index of the GPU `env` holds (its only one).
async fn gpu_of(berth: &TestBerth, env: &Environment) -> (String, i64) {
    sqlx::query_as(
        "SELECT n.name, g.idx FROM reservations r JOIN gpus g ON g.id = r.gpu_id JOIN nodes n ON n.id = g.node_id
         WHERE r.environment_id = ?",
    )
    .bind(&env.id)
    .fetch_one(berth.platform.db())
    .await
    .expect("its GPU")
}

async fn environments(berth: &TestBerth) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM environments").fetch_one(berth.platform.db()).await.expect("count")
}

#[sqlx::test(migrations = "../migrations")]
async fn an_advance_booking_waits_for_its_start_then_provisions(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let start = now_ms() + 3000;
    let env = book(&berth, "h100-1", "later", Some(start), 1).await.expect("book");
    assert_eq!((env.starts_at, env.ends_at), (start, start + HOUR_MS));
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let waiting = berth.platform.environment_of(&berth.caller, &env.id).await.expect("env");
    assert_eq!(waiting.state, EnvState::Requested, "nothing is provisioned before the window");
    let ready = berth.wait_for(&env.id, EnvState::Ready).await;
    assert!(ready.ready_at.expect("ready at") >= start);
}

#[sqlx::test(migrations = "../migrations")]
async fn bookings_share_a_gpu_over_time_but_never_at_once_and_keep_the_cleaning_gap(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let t0 = now_ms() + DAY_MS;
    // Both H100 nodes (2 GPUs each) booked whole for four hours tomorrow.
    book(&berth, "h100-node-1", "first", Some(t0), 4).await.expect("first node");
    book(&berth, "h100-node-1", "second", Some(t0), 4).await.expect("second node");
    let before = environments(&berth).await;

    let err = book(&berth, "h100-1", "overlap", Some(t0 + HOUR_MS), 2).await.expect_err("all taken");
    let text = err.to_string();
    assert!(text.starts_with("no capacity for 1 x H100-80GB from "), "{text}");
    // The gap after the 4-hour bookings is 15 minutes.
    let expected = berth_domain::booking::utc_short(t0 + 4 * HOUR_MS + 15 * MINUTE_MS);
    assert!(text.contains(&format!("the earliest start for 2 h is {expected}")), "{text}");

    let err = book(&berth, "h100-1", "too-soon", Some(t0 + 4 * HOUR_MS + 5 * MINUTE_MS), 2).await;
    assert!(matches!(err, Err(Error::Refused(Refusal::NoCapacity { .. }))), "inside the cleaning gap: {err:?}");
    assert_eq!(environments(&berth).await, before, "refusals write nothing");

    book(&berth, "h100-1", "after", Some(t0 + 4 * HOUR_MS + 15 * MINUTE_MS), 2).await.expect("after the gap");
    book(&berth, "h100-1", "before", Some(t0 - 3 * HOUR_MS), 2).await.expect("ends before the gap");
    assert_eq!(common::overlapping_reservations(berth.platform.db()).await, 0);
}

#[sqlx::test(migrations = "../migrations")]
async fn bad_windows_are_refused_with_a_reason_and_write_nothing(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let now = now_ms();
    let past = book(&berth, "h100-1", "past", Some(now - 2 * HOUR_MS), 1).await.expect_err("past");
    assert_eq!(past.to_string(), "the start is in the past; leave it empty to start now");
    let far = book(&berth, "h100-1", "far", Some(now + 100 * DAY_MS), 1).await.expect_err("too far");
    assert_eq!(far.to_string(), "bookings may end at most 90 days from now");
    let long = book(&berth, "h100-1", "long", None, 500).await.expect_err("too long");
    assert_eq!(long.to_string(), "duration must be a whole number of hours between 1 and 72");
    let request = LaunchRequest {
        offering: "training".into(),
        size: "h100-1".into(),
        name: "garbled".into(),
        hours: "1".into(),
        start: "next tuesday".into(),
        image: "ghcr.io/acme/train:1".into(),
        command: "python train.py; sleep infinity".into(),
        ..LaunchRequest::default()
    };
    let garbled = berth.platform.launch(&berth.caller, &request).await.expect_err("garbled");
    assert!(garbled.to_string().starts_with("start \"next tuesday\" is not a date and time"), "{garbled}");
    assert_eq!(environments(&berth).await, 0);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_booking_can_be_extended_into_free_time_and_shortened(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let t0 = now_ms() + DAY_MS;
    let env = book(&berth, "h100-node-1", "mine", Some(t0), 2).await.expect("book");
    // Someone fills the rest of the H100s from two hours after this booking ends.
    let later = t0 + 4 * HOUR_MS;
    book(&berth, "h100-node-1", "theirs", Some(later), 4).await.expect("other node");
    book(&berth, "h100-node-1", "theirs-too", Some(later), 4).await.expect("this node later");

    let longer = berth.platform.change_end(&berth.caller, &env.id, &rfc3339(t0 + 3 * HOUR_MS)).await.expect("extend");
    assert_eq!(longer.ends_at, t0 + 3 * HOUR_MS);
    let blocked = berth.platform.change_end(&berth.caller, &env.id, &rfc3339(t0 + 5 * HOUR_MS)).await;
    let text = blocked.expect_err("runs into the later booking").to_string();
    let latest = berth_domain::booking::utc_short(later - 15 * MINUTE_MS);
    assert!(text.contains(&format!("it can run until {latest} at the latest")), "{text}");

    let shorter = berth.platform.change_end(&berth.caller, &env.id, &rfc3339(t0 + HOUR_MS)).await.expect("shorten");
    assert_eq!(shorter.ends_at, t0 + HOUR_MS);
    let held: Vec<i64> = sqlx::query_scalar("SELECT ends_at FROM reservations WHERE environment_id = ?")
        .bind(&env.id)
        .fetch_all(berth.platform.db())
        .await
        .expect("reservations");
    assert!(held.iter().all(|&e| e == t0 + HOUR_MS), "reservations move with the booking");
    let inverted = berth.platform.change_end(&berth.caller, &env.id, &rfc3339(t0 - HOUR_MS)).await;
    assert!(matches!(inverted, Err(Error::Refused(Refusal::EndNotAfterStart))), "{inverted:?}");
}

#[sqlx::test(migrations = "../migrations")]
async fn cancelling_a_future_booking_frees_it_without_provisioning(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let t0 = now_ms() + DAY_MS;
    let env = book(&berth, "h100-node-1", "cancel-me", Some(t0), 4).await.expect("book");
    berth.platform.stop(&berth.caller, &env.id).await.expect("cancel");
    berth.wait_for(&env.id, EnvState::Released).await;
    assert_eq!(berth.held_reservations().await, 0);
    assert_eq!(berth.backend.world().workloads.len(), 0, "nothing ever ran");
    let again = berth.platform.change_end(&berth.caller, &env.id, &rfc3339(t0 + HOUR_MS)).await;
    assert!(matches!(again, Err(Error::Refused(Refusal::NotResizable("released")))), "{again:?}");
}

#[sqlx::test(migrations = "../migrations")]
async fn quotas_count_gpu_equivalents_and_explain_themselves(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let admin = berth.admin().await;
    let quota = Quota { max_gpus: Some(1.0), ..Quota::default() };
    let denied = berth.platform.set_quota(&berth.caller, QuotaSubject::Everyone, &quota).await;
    assert!(matches!(denied, Err(Error::Forbidden)), "members cannot set quotas");
    berth.platform.set_quota(&admin, QuotaSubject::Everyone, &quota).await.expect("default quota");

    let notebook = |size: &str, name: &str| LaunchRequest {
        offering: "notebook".into(),
        size: size.into(),
        name: name.into(),
        hours: "2".into(),
        ..LaunchRequest::default()
    };
    // Two 3g slices are 6/7 of a GPU: within 1.
    berth.platform.launch(&berth.caller, &notebook("h100-3g.40gb", "a")).await.expect("3/7");
    berth.platform.launch(&berth.caller, &notebook("h100-3g.40gb", "b")).await.expect("6/7");
    let err = berth.platform.launch(&berth.caller, &notebook("h100-3g.40gb", "c")).await.expect_err("9/7");
    assert_eq!(
        err.to_string(),
        "quota: your limit is 1 H100-80GB GPU-equivalent at once; you hold up to 0.86 during this window and this booking asks for 0.43, so 0.14 more would fit: up to a H100-80GB 1g.10gb slice"
    );
    // Tomorrow the first two are over, so the same size fits again.
    let tomorrow = rfc3339(now_ms() + DAY_MS);
    let later = LaunchRequest { start: tomorrow, ..notebook("h100-3g.40gb", "c") };
    berth.platform.launch(&berth.caller, &later).await.expect("fits tomorrow");

    let personal = Quota { max_gpus: Some(4.0), max_booking_hours: Some(1), ..Quota::default() };
    let dana = QuotaSubject::User(berth.caller.user_id());
    berth.platform.set_quota(&admin, dana, &personal).await.expect("personal quota");
    let err = berth.platform.launch(&berth.caller, &notebook("h100-1g.10gb", "d")).await.expect_err("too long");
    assert_eq!(err.to_string(), "quota: bookings are limited to 1 hours; this one is 2 hours");
    assert_eq!(berth.platform.quota_of(berth.caller.user_id()).await.expect("quota"), personal);
    let listed: Vec<(String, Quota)> =
        berth.platform.quotas(&admin).await.expect("list").into_iter().map(|r| (r.who, r.quota)).collect();
    assert_eq!(
        listed,
        vec![("Everyone (default per user)".to_owned(), quota.clone()), ("dana@example.com".to_owned(), personal)]
    );
    let unknown = berth.platform.set_quota_for(&admin, "user", "nobody@example.com", &quota).await;
    assert_eq!(unknown.expect_err("unknown").to_string(), "there is no user with the email \"nobody@example.com\"");
    let own = berth.platform.quotas(&berth.caller).await.expect("members read the quotas that apply to them");
    assert_eq!(own.len(), 2);
}

#[sqlx::test(migrations = "../migrations")]
async fn availability_shows_bookings_and_the_earliest_start(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let t0 = (now_ms() / HOUR_MS + 24) * HOUR_MS;
    book(&berth, "h100-node-1", "busy", Some(t0), 2).await.expect("book");
    let availability = berth
        .platform
        .availability(berth.caller.tenant_id(), t0 - 2 * HOUR_MS, HOUR_MS, 6)
        .await
        .expect("availability");
    let whole = availability
        .rows
        .iter()
        .find(|r| r.shape == Shape::Gpus { model: GpuModel::H100_80GB, count: 1 })
        .expect("a row for one H100");
    assert_eq!(whole.capacity, 4);
    // Free, then the gap before, two busy hours, the gap after, free.
    assert_eq!(whole.free, vec![4, 2, 2, 2, 2, 4]);
    let l40s = availability.rows.iter().find(|r| r.shape == Shape::Gpus { model: GpuModel::L40S, count: 1 });
    assert_eq!(l40s.expect("L40S row").free, vec![2; 6]);
    let shares = availability.rows.iter().find(|r| r.shape == Shape::Share { model: GpuModel::L40S, ways: 4 });
    assert_eq!(shares.map(|r| (r.capacity, r.free.clone())), Some((4, vec![4; 6])), "one GPU shared 4 ways");

    let node = Shape::Gpus { model: GpuModel::H100_80GB, count: 2 };
    book(&berth, "h100-node-1", "busy-too", Some(t0), 2).await.expect("second node");
    let earliest = berth.platform.earliest_start(berth.caller.tenant_id(), node, 1, t0).await.expect("earliest");
    assert_eq!(earliest, Some(t0 + 2 * HOUR_MS + 15 * MINUTE_MS));
}

#[sqlx::test(migrations = "../migrations")]
async fn maintenance_blocks_new_bookings_and_lists_the_ones_in_the_way(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let admin = berth.admin().await;
    let t0 = now_ms() + DAY_MS;
    let mine = book(&berth, "h100-node-1", "in-the-way", Some(t0), 2).await.expect("book");
    let node: String = sqlx::query_scalar(
        "SELECT DISTINCT n.name FROM reservations r JOIN gpus g ON g.id = r.gpu_id JOIN nodes n ON n.id = g.node_id
         WHERE r.environment_id = ?",
    )
    .bind(&mine.id)
    .fetch_one(berth.platform.db())
    .await
    .expect("node");

    let denied = berth.platform.schedule_maintenance(&berth.caller, &node, None, "", &rfc3339(t0), "firmware").await;
    assert!(matches!(denied, Err(Error::Forbidden)), "members cannot schedule maintenance");
    let unknown = berth.platform.schedule_maintenance(&admin, "no-such-node", None, "", &rfc3339(t0), "x").await;
    assert_eq!(unknown.expect_err("unknown").to_string(), "there is no node called \"no-such-node\"");
    let no_reason = berth.platform.schedule_maintenance(&admin, &node, None, "", &rfc3339(t0), " ").await;
    assert!(no_reason.expect_err("reason").to_string().starts_with("reason is required"));

    let (window, affected) = berth
        .platform
        .schedule_maintenance(
            &admin,
            &node,
            None,
            &rfc3339(t0 - HOUR_MS),
            &rfc3339(t0 + 6 * HOUR_MS),
            "firmware update",
        )
        .await
        .expect("schedule");
    assert_eq!(affected.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["in-the-way"]);

    // The other H100 node takes one booking in the window; the one in maintenance none.
    book(&berth, "h100-node-1", "other-node", Some(t0), 10).await.expect("other node is free");
    let refused = book(&berth, "h100-1", "blocked", Some(t0 + 3 * HOUR_MS), 1).await;
    assert!(matches!(refused, Err(Error::Refused(Refusal::NoCapacity { .. }))), "{refused:?}");
    // After the window (and its cleaning gap) the node books again.
    book(&berth, "h100-1", "after", Some(t0 + 6 * HOUR_MS + 15 * MINUTE_MS), 1).await.expect("after maintenance");

    // A restart reloads the window from the database.
    let restarted = berth_platform::Platform::new(common::production_pool(berth.platform.db()).await);
    let schedule = restarted
        .fleet_schedule(&admin, t0 - DAY_MS, t0 + DAY_MS, &NodeFilter::default())
        .await
        .expect("schedule")
        .nodes;
    let in_maintenance = schedule.iter().find(|n| n.node == node).expect("node");
    assert_eq!(in_maintenance.maintenance.len(), 1);
    assert!(in_maintenance.gpus.iter().any(|g| g.bookings.iter().any(|b| b.name == "in-the-way")));
    let request = LaunchRequest {
        offering: "training".into(),
        size: "h100-1".into(),
        name: "blocked-too".into(),
        hours: "1".into(),
        start: rfc3339(t0 + 4 * HOUR_MS),
        image: "ghcr.io/acme/train:1".into(),
        command: "python train.py; sleep infinity".into(),
        ..LaunchRequest::default()
    };
    assert!(restarted.launch(&berth.caller, &request).await.is_err(), "still blocked after a restart");

    berth.platform.cancel_maintenance(&admin, window.id).await.expect("cancel");
    book(&berth, "h100-1", "unblocked", Some(t0 + 3 * HOUR_MS), 1).await.expect("free again");
}

#[sqlx::test(migrations = "../migrations")]
async fn the_launch_form_learns_what_is_free_now_and_when_it_will_be(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let first = book(&berth, "h100-node-1", "all-now", None, 2).await.expect("first node");
    book(&berth, "h100-node-1", "all-now-too", None, 3).await.expect("second node");
    let sizes = berth
        .platform
        .size_availability(berth.caller.tenant_id(), berth_domain::catalog::Offering::TrainingJob, 4, None)
        .await
        .expect("sizes");
    let h100 = sizes.iter().find(|s| s.size.id == "h100-1").expect("h100-1");
    assert_eq!(h100.free_now, 0);
    assert_eq!(h100.earliest_start, Some(first.ends_at + 15 * MINUTE_MS), "the first node frees first");
    // Asked from that start instead of now, the size is free then.
    let then = first.ends_at + 15 * MINUTE_MS;
    let later = berth
        .platform
        .size_availability(berth.caller.tenant_id(), berth_domain::catalog::Offering::TrainingJob, 4, Some(then))
        .await
        .expect("sizes");
    let h100 = later.iter().find(|s| s.size.id == "h100-1").expect("h100-1");
    assert!(h100.free_now > 0, "free from the asked start");
    assert_eq!(h100.earliest_start, Some(then));
    let l40s = sizes.iter().find(|s| s.size.gpu_model() == GpuModel::L40S);
    assert!(l40s.is_none_or(|s| s.free_now > 0));
}

#[sqlx::test(migrations = "../migrations")]
async fn development_notebooks_share_a_time_sliced_gpu_four_ways(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let mut envs = Vec::new();
    for n in 0..4 {
        envs.push(berth.launch("notebook", "l40s-dev", &format!("dev-{n}")).await.expect("a share"));
    }
    let units: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT r.gpu_id, r.slice_start FROM reservations r WHERE r.mig_profile IS NULL AND r.slice_size = 2 ORDER BY 2",
    )
    .fetch_all(berth.platform.db())
    .await
    .expect("shares");
    assert_eq!(units.iter().map(|u| u.1).collect::<Vec<_>>(), [0, 2, 4, 6], "four shares of one GPU");
    assert!(units.iter().all(|u| u.0 == units[0].0));
    let fifth = berth.launch("notebook", "l40s-dev", "dev-4").await.expect_err("all four taken");
    assert!(fifth.to_string().contains("every share of the L40S GPUs time-sliced 4 ways is taken"), "{fifth}");
    // A share counts a quarter of a GPU against quotas.
    berth.platform.stop(&berth.caller, &envs[0].id).await.expect("stop");
    berth.wait_for(&envs[0].id, EnvState::Released).await;
    let admin = berth.admin().await;
    let dana = QuotaSubject::User(berth.caller.user_id());
    let three_quarters = Quota { max_gpus: Some(0.75), ..Quota::default() };
    berth.platform.set_quota(&admin, dana, &three_quarters).await.expect("quota");
    let over = berth.launch("notebook", "l40s-dev", "dev-5").await.expect_err("0.75 + 0.25 > 0.75");
    assert_eq!(
        over.to_string(),
        "quota: your limit is 0.75 L40S GPU-equivalents at once; you hold up to 0.75 during this window and this booking asks for 0.25, so nothing more fits"
    );
    berth.platform.set_quota(&admin, dana, &Quota { max_gpus: Some(1.0), ..Quota::default() }).await.expect("quota");
    berth.launch("notebook", "l40s-dev", "dev-5").await.expect("0.75 + 0.25 = 1");
    berth.platform.set_quota(&admin, dana, &Quota::default()).await.expect("no limits");
    // Whole-GPU sizes never land on the shared GPU.
    berth.launch("inference", "l40s-1", "whole-a").await.expect("exclusive L40S");
    berth.launch("inference", "l40s-1", "whole-b").await.expect("exclusive L40S");
    let third = berth.launch("inference", "l40s-1", "whole-c").await.expect_err("the shared GPU is not whole");
    assert!(third.to_string().starts_with("no capacity for 1 x L40S"), "{third}");
    // The database itself refuses a share on a GPU that is not time-sliced.
    let exclusive: i64 = sqlx::query_scalar("SELECT id FROM gpus WHERE time_slices = 1 LIMIT 1")
        .fetch_one(berth.platform.db())
        .await
        .expect("gpu");
    let forged = sqlx::query(
        "INSERT INTO reservations (environment_id, gpu_id, slice_start, slice_size, starts_at, ends_at)
         VALUES (?, ?, 0, 2, 1, 2)",
    )
    .bind(&envs[1].id)
    .bind(exclusive)
    .execute(berth.platform.db())
    .await;
    assert!(forged.is_err_and(|e| e.to_string().contains("does not fit how its GPU is shared")));
}

#[sqlx::test(migrations = "../migrations")]
async fn a_two_node_cluster_stays_inside_one_nvlink_domain(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    // Four H100 nodes of two GPUs in two multi-node NVLink domains, rail-optimized InfiniBand.
    let racks = common::SMALL_FLEET.replace(
        "nodes = 2\ngpus_per_node = 2\nnvlink = true",
        "nodes = 4\ngpus_per_node = 2\nnvlink = true\nnvlink_domain_nodes = 2\nib_rails = 2",
    );
    berth.platform.sync_fleet(&berth_domain::fleet::FleetSpec::parse(&racks).expect("fleet")).await.expect("sync");
    let one = book(&berth, "h100-node-1", "one", None, 2).await.expect("one node");
    let two = book(&berth, "h100-node-2", "two", None, 2).await.expect("two nodes in the other domain");
    let mut domains = Vec::new();
    for env in [one.id, two.id] {
        let of_env: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT n.nvlink_domain FROM reservations r JOIN gpus g ON g.id = r.gpu_id
             JOIN nodes n ON n.id = g.node_id WHERE r.environment_id = ?",
        )
        .bind(env)
        .fetch_all(berth.platform.db())
        .await
        .expect("domains");
        domains.push(of_env);
    }
    let (one, two) = (&domains[0], &domains[1]);
    assert_eq!(two.len(), 1, "both nodes in one NVLink domain: {two:?}");
    assert_ne!(one, two);
    // The first domain has one free node left, the second none.
    let err = book(&berth, "h100-node-2", "three", None, 2).await.expect_err("one free node");
    assert!(err.to_string().contains("1 of the 4 H100-80GB nodes are entirely free"), "{err}");
    let rails: Vec<Option<i64>> = sqlx::query_scalar(
        "SELECT ib_rail FROM gpus g JOIN nodes n ON n.id = g.node_id WHERE n.name = 'h100-01' ORDER BY g.idx",
    )
    .fetch_all(berth.platform.db())
    .await
    .expect("rails");
    assert_eq!(rails, [Some(0), Some(1)]);
}

/// Dana books in project "vision" of tenant Acme; Bob, another member, books outside it.
#[sqlx::test(migrations = "../migrations")]
async fn tenant_and_project_quotas_add_up_their_members_bookings(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let admin = berth.admin().await;
    let acme = berth.caller.tenant_id().expect("tenant");
    let tenant_admin = berth.user_with("ada@example.com", Role::TenantAdmin).await;
    let bob = berth.user_with("bob@example.com", Role::Member).await;
    berth.platform.create_project(&tenant_admin, acme, "vision").await.expect("project");
    let vision = berth.platform.projects(&tenant_admin, acme).await.expect("projects")[0].id;
    berth.platform.add_project_member(&tenant_admin, acme, vision, "dana@example.com").await.expect("member");

    // The platform sets the tenant's limits; its tenant admin cannot, but sets the project's.
    let tenant_quota = Quota::parse("", "H100-80GB = 3", "", "", "", true).expect("quota");
    let denied = berth.platform.set_quota_for(&tenant_admin, "tenant", "acme", &tenant_quota).await;
    assert_eq!(denied.expect_err("not theirs").to_string(), "there is no tenant \"acme\"");
    berth.platform.set_quota_for(&admin, "tenant", "acme", &tenant_quota).await.expect("tenant quota");
    let elsewhere = berth.platform.set_quota_for(&tenant_admin, "project", "globex/x", &tenant_quota).await;
    assert_eq!(elsewhere.expect_err("missing").to_string(), "there is no project \"globex/x\"");
    let project_quota = Quota { max_gpus: Some(1.0), ..Quota::default() };
    berth.platform.set_quota_for(&tenant_admin, "project", "vision", &project_quota).await.expect("project quota");

    let in_vision = |size: &str, name: &str, project: &str| LaunchRequest {
        offering: "training".into(),
        size: size.into(),
        name: name.into(),
        hours: "2".into(),
        image: "ghcr.io/acme/train:1".into(),
        command: "python train.py; sleep infinity".into(),
        project: project.into(),
        ..LaunchRequest::default()
    };
    let vision_id = vision.to_string();
    let nowhere = berth.platform.launch(&bob, &in_vision("h100-1", "x", &vision_id)).await;
    assert_eq!(
        nowhere.expect_err("bob is not in vision").to_string(),
        format!("there is no project \"{vision_id}\" you can book in")
    );
    let first = berth.platform.launch(&berth.caller, &in_vision("h100-1", "a", &vision_id)).await.expect("1 of 1");
    assert_eq!(first.project_id, Some(vision));
    let err = berth.platform.launch(&berth.caller, &in_vision("h100-1", "b", &vision_id)).await.expect_err("2 > 1");
    assert_eq!(
        err.to_string(),
        "quota: project vision's limit is 1 H100-80GB GPU-equivalent at once; it holds up to 1 during this window and this booking asks for 1, so nothing more fits"
    );
    // Outside the project only the tenant's limit counts: Dana's 1 + Bob's 2 = 3 H100s.
    berth.platform.launch(&bob, &in_vision("h100-1", "c1", "")).await.expect("2 of 3");
    berth.platform.launch(&bob, &in_vision("h100-1", "c2", "")).await.expect("3 of 3");
    let err = berth.platform.launch(&berth.caller, &in_vision("h100-1", "d", "")).await.expect_err("4 > 3");
    assert_eq!(
        err.to_string(),
        "quota: tenant Acme's limit is 3 H100-80GB GPU-equivalents at once; it holds up to 3 during this window and this booking asks for 1, so nothing more fits"
    );
    // Other models are not limited by the tenant's H100 line.
    let l40s = LaunchRequest { offering: "inference".into(), ..in_vision("l40s-1", "e", "") };
    berth.platform.launch(&berth.caller, &l40s).await.expect("L40S");
    // The tenant may burst as spot beyond its quota, with no quota of Dana's own.
    let spot = LaunchRequest { tier: "spot".into(), ..in_vision("h100-1", "f", "") };
    let burst = berth.platform.launch(&berth.caller, &spot).await.expect("spot beyond the tenant's quota");
    assert_eq!(burst.tier, berth_domain::booking::Tier::Spot);

    // Each sees the rows of their reach: Dana her tenant's and everyone's, the admin all.
    let rows = |rows: Vec<QuotaRow>| rows.into_iter().map(|r| r.who).collect::<Vec<_>>();
    assert_eq!(rows(berth.platform.quotas(&berth.caller).await.expect("list")), ["Tenant Acme", "Project acme/vision"]);
    let other =
        berth.platform.ensure_tenant("globex", "Globex", berth_domain::tenancy::Isolation::Soft).await.expect("t");
    berth.platform.set_quota(&admin, QuotaSubject::Tenant(other), &project_quota).await.expect("globex");
    assert_eq!(rows(berth.platform.quotas(&admin).await.expect("list")).len(), 3);
    assert_eq!(rows(berth.platform.quotas(&tenant_admin).await.expect("list")).len(), 2, "not Globex's");
    let globex_row = berth.platform.quotas(&admin).await.expect("list").into_iter().find(|r| r.who == "Tenant Globex");
    let removed = berth.platform.remove_quota(&tenant_admin, globex_row.expect("row").id).await;
    assert!(matches!(removed, Err(Error::NotFound)), "{removed:?}");
    let vision_row =
        berth.platform.quotas(&tenant_admin).await.expect("list").into_iter().find(|r| r.who.starts_with("Project"));
    berth.platform.remove_quota(&tenant_admin, vision_row.expect("row").id).await.expect("removed");
    let err = berth.platform.launch(&berth.caller, &in_vision("h100-1", "g", &vision_id)).await.expect_err("3 + 1");
    assert!(err.to_string().starts_with("quota: tenant Acme's limit"), "the tenant's limit still holds: {err}");
}

#[sqlx::test(migrations = "../migrations")]
async fn spot_bookings_go_beyond_the_quota_and_are_reclaimed_by_guaranteed_ones(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let admin = berth.admin().await;
    let bursty = Quota { max_gpus: Some(0.0), allow_spot: true, ..Quota::default() };
    berth.platform.set_quota(&admin, QuotaSubject::User(berth.caller.user_id()), &bursty).await.expect("quota");
    let spot = |name: &str, start: String| LaunchRequest {
        offering: "cluster".into(),
        size: "h100-node-1".into(),
        name: name.into(),
        hours: "4".into(),
        start,
        tier: "spot".into(),
        ..LaunchRequest::default()
    };
    let guaranteed = book(&berth, "h100-node-1", "within-quota", None, 4).await.expect_err("quota is 0");
    assert!(guaranteed.to_string().starts_with("quota: your limit is 0 H100-80GB"), "{guaranteed}");
    let later = berth.platform.launch(&berth.caller, &spot("later", rfc3339(now_ms() + DAY_MS))).await;
    assert!(matches!(later, Err(Error::Refused(Refusal::SpotStartsNow))), "{later:?}");
    let first = berth.platform.launch(&berth.caller, &spot("burst-a", String::new())).await.expect("spot");
    let second = berth.platform.launch(&berth.caller, &spot("burst-b", String::new())).await.expect("spot");
    assert_eq!(first.tier, berth_domain::booking::Tier::Spot);
    berth.wait_for(&first.id, EnvState::Ready).await;

    // Someone without a quota needs one H100 now: a spot booking gives way.
    let eve = berth.user_with("eve@example.com", Role::Member).await;
    let request = LaunchRequest {
        offering: "training".into(),
        size: "h100-1".into(),
        name: "urgent".into(),
        hours: "2".into(),
        image: "ghcr.io/acme/train:1".into(),
        command: "python train.py; sleep infinity".into(),
        ..LaunchRequest::default()
    };
    let urgent = berth.platform.launch(&eve, &request).await.expect("reclaims a spot node");
    assert_eq!(common::overlapping_reservations(berth.platform.db()).await, 0);
    let states: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT name, failure_reason FROM environments WHERE tier = 'spot' ORDER BY name")
            .fetch_all(berth.platform.db())
            .await
            .expect("spot");
    let reclaimed: Vec<&str> = states.iter().filter(|(_, r)| r.is_some()).map(|(n, _)| n.as_str()).collect();
    assert_eq!(reclaimed.len(), 1, "exactly one spot node is reclaimed: {states:?}");
    let victim = if reclaimed[0] == "burst-a" { &first } else { &second };
    let failed = berth.wait_for(&victim.id, EnvState::Failed).await;
    assert!(failed.failure_reason.expect("reason").contains("a guaranteed booking needed this spot capacity"));
    // Its owner was told, in the reclaim's transaction, and then of the failure.
    let told: Vec<String> =
        berth.platform.inbox(&berth.caller).await.expect("inbox").items.into_iter().map(|n| n.title).collect();
    assert!(told.contains(&format!("{} was reclaimed", reclaimed[0])), "{told:?}");
    for _ in 0..1000 {
        if berth.platform.environment_of(&eve, &urgent.id).await.expect("urgent").state == EnvState::Ready {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(berth.platform.environment_of(&eve, &urgent.id).await.expect("urgent").state, EnvState::Ready);
    // The reclaimed node's other GPU is free again; after that a spot booking finds
    // nothing, as spot never reclaims spot.
    let one_gpu = |name: &str| LaunchRequest { tier: "spot".into(), name: name.into(), ..request.clone() };
    berth.platform.launch(&berth.caller, &one_gpu("burst-c")).await.expect("the freed GPU");
    let none_left = berth.platform.launch(&berth.caller, &one_gpu("burst-d")).await;
    assert!(matches!(none_left, Err(Error::Refused(Refusal::NoCapacity { .. }))), "{none_left:?}");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_refusal_suggests_another_gpu_model_that_is_free(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    book(&berth, "h100-node-1", "all-h100-a", None, 2).await.expect("first node");
    book(&berth, "h100-node-1", "all-h100-b", None, 2).await.expect("second node");
    let request = LaunchRequest {
        offering: "notebook".into(),
        size: "h100-1g.10gb".into(),
        name: "tiny".into(),
        hours: "1".into(),
        ..LaunchRequest::default()
    };
    let refused = berth.platform.launch(&berth.caller, &request).await.expect_err("no H100 left");
    let text = refused.to_string();
    assert!(text.contains("free for that window: 1 x L40S 48GB"), "{text}");
    assert!(text.contains("the earliest start for 1 h is "), "{text}");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_gpu_marked_failed_takes_no_new_bookings(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let admin = berth.admin().await;
    let running = book(&berth, "h100-1", "on-gpu", None, 2).await.expect("book");
    let (node, index) = gpu_of(&berth, &running).await;
    let denied = berth.platform.set_gpu_health(&berth.caller, &node, index, "failed", "").await;
    assert!(matches!(denied, Err(Error::Forbidden)));
    let bad = berth.platform.set_gpu_health(&admin, &node, index, "broken", "").await;
    assert_eq!(bad.expect_err("bad").to_string(), "health must be healthy, degraded or failed, not \"broken\"");
    let missing = berth.platform.set_gpu_health(&admin, &node, 9, "failed", "").await;
    assert_eq!(missing.expect_err("no gpu 9").to_string(), format!("node {node} has no GPU 9"));

    let affected = berth.platform.set_gpu_health(&admin, &node, index, "failed", "ECC errors").await.expect("mark");
    assert_eq!(affected.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["on-gpu"]);
    // The other three H100s take bookings after this one ends; the failed one never does.
    let later = now_ms() + DAY_MS;
    for i in 0..3 {
        book(&berth, "h100-1", &format!("later-{i}"), Some(later), 1).await.expect("a healthy GPU");
    }
    let refused = book(&berth, "h100-1", "later-3", Some(later), 1).await;
    assert!(matches!(refused, Err(Error::Refused(Refusal::NoCapacity { .. }))), "{refused:?}");
    let schedule = berth
        .platform
        .fleet_schedule(&admin, later - DAY_MS, later + DAY_MS, &NodeFilter::default())
        .await
        .expect("schedule")
        .nodes;
    let gpu = schedule.iter().find(|n| n.node == node).and_then(|n| n.gpus.iter().find(|g| g.index == index));
    assert_eq!(gpu.map(|g| (g.health.as_str(), g.health_note.as_deref())), Some(("failed", Some("ECC errors"))));

    berth.platform.set_gpu_health(&admin, &node, index, "healthy", "").await.expect("repaired");
    book(&berth, "h100-1", "later-3", Some(later), 1).await.expect("back in service");
}

#[sqlx::test(migrations = "../migrations")]
async fn maintenance_on_one_gpu_leaves_the_rest_of_its_node_bookable(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let admin = berth.admin().await;
    let t0 = now_ms() + DAY_MS;
    let (start, end) = (rfc3339(t0), rfc3339(t0 + 4 * HOUR_MS));
    let missing = berth.platform.schedule_maintenance(&admin, "h100-01", Some(7), &start, &end, "reseat").await;
    assert_eq!(missing.expect_err("no GPU 7").to_string(), "node h100-01 has no GPU 7");
    let (window, _) =
        berth.platform.schedule_maintenance(&admin, "h100-01", Some(0), &start, &end, "reseat").await.expect("gpu 0");
    assert_eq!(window.gpu_index, Some(0));
    // Three of the four H100s remain for the window, and no whole node of h100-01.
    for i in 0..3 {
        book(&berth, "h100-1", &format!("one-{i}"), Some(t0), 2).await.expect("a GPU outside maintenance");
    }
    assert!(book(&berth, "h100-1", "one-3", Some(t0), 2).await.is_err());
    let schedule = berth
        .platform
        .fleet_schedule(&admin, t0 - DAY_MS, t0 + DAY_MS, &NodeFilter::default())
        .await
        .expect("schedule")
        .nodes;
    let node = schedule.iter().find(|n| n.node == "h100-01").expect("node");
    assert_eq!(node.maintenance.iter().map(|m| m.gpu_index).collect::<Vec<_>>(), [Some(0)]);
    assert!(node.gpus.iter().find(|g| g.index == 0).is_some_and(|g| g.bookings.is_empty()));
}

#[sqlx::test(migrations = "../migrations")]
async fn the_fleet_chart_is_read_a_page_of_nodes_at_a_time(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let admin = berth.admin().await;
    // 40 nodes besides the small fleet's: three pages of sixteen.
    let big = format!(
        "{}\n[[site]]\nname = \"zrh-1\"\n[[site.pool]]\nprefix = \"zrh1-h100\"\nmodel = \"H100-80GB\"\nnodes = 40\ngpus_per_node = 8\n",
        common::SMALL_FLEET
    );
    berth.platform.sync_fleet(&FleetSpec::parse(&big).expect("fleet")).await.expect("sync");
    let t0 = now_ms();
    let schedule = |filter: NodeFilter| {
        let (platform, admin) = (berth.platform.clone(), admin.clone());
        async move { platform.fleet_schedule(&admin, t0, t0 + DAY_MS, &filter).await.expect("schedule") }
    };
    let zrh = |page| NodeFilter { site: Some("zrh-1".into()), search: String::new(), page };
    let first = schedule(zrh(1)).await;
    assert_eq!((first.page, first.pages, first.total_nodes, first.nodes.len()), (1, 3, 40, 16));
    assert_eq!(first.nodes[0].node, "zrh1-h100-01");
    assert!(first.nodes.iter().all(|n| n.gpus.len() == 8));
    let last = schedule(zrh(99)).await;
    assert_eq!((last.page, last.nodes.len()), (3, 8), "a page past the last shows the last");
    assert_eq!(last.nodes.last().map(|n| n.node.as_str()), Some("zrh1-h100-40"));
    let found = schedule(NodeFilter { site: None, search: "h100-3".into(), page: 1 }).await;
    let names: Vec<&str> = found.nodes.iter().map(|n| n.node.as_str()).collect();
    assert_eq!(names.len(), 10, "zrh1-h100-30 to -39: {names:?}");
    assert!(names.iter().all(|n| n.starts_with("zrh1-h100-3")), "{names:?}");
    assert!(found.sites.contains(&"zrh-1".to_owned()) && found.node_names.len() > 40);
    let none = schedule(NodeFilter { site: Some("nowhere".into()), search: String::new(), page: 1 }).await;
    assert_eq!((none.total_nodes, none.nodes.len(), none.pages), (0, 0, 1));

    // A booking shows on its node's page only, and the agents list follows the same page.
    let env = book(&berth, "h100-node-1", "whole-node", None, 2).await.expect("a node");
    let node = sqlx::query_scalar::<_, String>(
        "SELECT n.name FROM reservations r JOIN gpus g ON g.id = r.gpu_id JOIN nodes n ON n.id = g.node_id
         WHERE r.environment_id = ? LIMIT 1",
    )
    .bind(&env.id)
    .fetch_one(berth.platform.db())
    .await
    .expect("node");
    let page = schedule(NodeFilter { site: None, search: node.clone(), page: 1 }).await;
    let shown = page.nodes.iter().find(|n| n.node == node).expect("the node");
    assert!(shown.gpus.iter().all(|g| g.bookings.iter().any(|b| b.name == "whole-node" && b.mig_profile.is_none())));
    // A MIG slice shows with its profile's name, on its GPU, over its window.
    let slice = berth.launch("notebook", "h100-1g.10gb", "a-slice").await.expect("a slice");
    let (node, index) = gpu_of(&berth, &slice).await;
    let page = schedule(NodeFilter { site: None, search: node.clone(), page: 1 }).await;
    let gpu = page.nodes.iter().find(|n| n.node == node).and_then(|n| n.gpus.iter().find(|g| g.index == index));
    let shown = gpu.and_then(|g| g.bookings.iter().find(|b| b.environment_id == slice.id)).expect("the slice");
    assert_eq!((shown.name.as_str(), shown.mig_profile.as_deref()), ("a-slice", Some("1g.10gb")));
    assert_eq!((shown.starts_at, shown.ends_at), (slice.starts_at, slice.ends_at));
    let agents = berth.platform.node_agents(&admin, &zrh(2)).await.expect("agents");
    assert_eq!(agents.iter().map(|a| a.node.as_str()).next(), Some("zrh1-h100-17"));
    assert_eq!(agents.len(), 16);

    // The fleet page's one read is the same page of the chart and of the agents.
    for filter in [zrh(2), NodeFilter { site: None, search: node.clone(), page: 1 }] {
        let (chart, agents) =
            berth.platform.fleet_page(&admin, t0, t0 + DAY_MS, &filter).await.expect("the fleet page");
        assert_eq!(chart, schedule(filter.clone()).await);
        assert_eq!(agents, berth.platform.node_agents(&admin, &filter).await.expect("agents"));
    }
}

// ---------------------------------------------------------------------------------------
// Hard tenants keep their nodes to themselves

/// A member of a new tenant `slug` with `isolation`.
async fn member_of(berth: &TestBerth, slug: &str, isolation: Isolation) -> Caller {
    let tenant = berth.platform.ensure_tenant(slug, slug, isolation).await.expect("tenant");
    let email = format!("member@{slug}.test");
    let user =
        berth.platform.create_user(&email, slug, "a long passphrase", Role::Member, Some(tenant)).await.expect("user");
    user.caller(common::test_meta())
}

/// The node and GPU index of each unit an environment holds.
async fn held_on(berth: &TestBerth, id: &str) -> Vec<(String, i64)> {
    sqlx::query_as(
        "SELECT n.name, g.idx FROM reservations r JOIN gpus g ON g.id = r.gpu_id JOIN nodes n ON n.id = g.node_id
         WHERE r.environment_id = ? ORDER BY 1, 2",
    )
    .bind(id)
    .fetch_all(berth.platform.db())
    .await
    .expect("units")
}

/// Unreleased reservations of an environment.
async fn held_by(berth: &TestBerth, id: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM reservations WHERE environment_id = ? AND released_at IS NULL")
        .bind(id)
        .fetch_one(berth.platform.db())
        .await
        .expect("count")
}

async fn node_of(berth: &TestBerth, id: &str) -> String {
    held_on(berth, id).await.first().expect("holds a unit").0.clone()
}

/// How many of `shape` the calendar shows free now for a user of `tenant`.
async fn free_now(berth: &TestBerth, tenant: Option<i64>, shape: Shape) -> u32 {
    let from = now_ms();
    let availability = berth.platform.availability(tenant, from, HOUR_MS, 1).await.expect("availability");
    availability.rows.iter().find(|r| r.shape == shape).map_or(0, |r| r.free[0])
}

#[sqlx::test(migrations = "../migrations")]
async fn a_hard_tenants_booking_avoids_a_node_with_a_soft_tenants_notebook(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let vault = member_of(&berth, "vault", Isolation::Hard).await;
    let notebook = berth.launch("notebook", "h100-1g.10gb", "notebook").await.expect("soft notebook");
    let shared = node_of(&berth, &notebook.id).await;

    // Best fit alone would pick the notebook's node (its other GPU is free).
    let first = book_as(&berth, &vault, "h100-1", "first", None, 2).await.expect("hard booking");
    let own = node_of(&berth, &first.id).await;
    assert_ne!(own, shared, "a hard tenant never lands next to another tenant");
    // Its second booking goes to the node it already holds.
    let second = book_as(&berth, &vault, "h100-1", "second", None, 2).await.expect("same tenant");
    assert_eq!(node_of(&berth, &second.id).await, own, "two bookings of one hard tenant share its node");
    assert_eq!(common::tenants_sharing_nodes(berth.platform.db()).await, 0);

    // Its node is full; the one free GPU is next to the notebook.
    let one = Shape::Gpus { model: GpuModel::H100_80GB, count: 1 };
    assert_eq!(free_now(&berth, vault.tenant_id(), one).await, 0, "the calendar counts as placement does");
    assert_eq!(free_now(&berth, berth.caller.tenant_id(), one).await, 1, "the soft tenant still has it");
    let before = environments(&berth).await;
    let refused = book_as(&berth, &vault, "h100-1", "third", None, 2).await.expect_err("kept apart");
    let text = refused.to_string();
    assert!(
        text.starts_with(
            "no capacity for 1 x H100-80GB right now: no node is free of other tenants for it: \
             1 of the 2 H100-80GB nodes holds other tenants' bookings at that time, \
             and your tenant's isolation keeps it off them. Instead: "
        ),
        "{text}"
    );
    // Once the notebook (and the cleaning gap after it) is over, its node is free.
    let earliest = berth_domain::booking::utc_short(notebook.ends_at + 15 * MINUTE_MS);
    assert!(text.contains(&format!("the earliest start for 2 h is {earliest}")), "{text}");
    assert_eq!(
        berth.platform.earliest_start(vault.tenant_id(), one, 2, now_ms()).await.expect("earliest"),
        Some(notebook.ends_at + 15 * MINUTE_MS)
    );
    assert_eq!(environments(&berth).await, before, "a refusal writes nothing");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_soft_tenants_booking_avoids_a_node_a_hard_tenant_holds(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let admin = berth.admin().await;
    let vault = member_of(&berth, "vault", Isolation::Hard).await;
    let hard = book_as(&berth, &vault, "h100-1", "hard", None, 2).await.expect("hard booking");
    let dedicated = node_of(&berth, &hard.id).await;

    // Best fit alone would fill the started node; the soft tenant goes to the other.
    let soft = book(&berth, "h100-1", "soft", None, 2).await.expect("soft booking");
    let shared = node_of(&berth, &soft.id).await;
    assert_ne!(shared, dedicated);
    let one = Shape::Gpus { model: GpuModel::H100_80GB, count: 1 };
    for (who, tenant) in [("soft", berth.caller.tenant_id()), ("hard", vault.tenant_id()), ("staff", None)] {
        assert_eq!(free_now(&berth, tenant, one).await, 1, "{who}: one GPU on its side");
    }
    // Platform staff's own bookings share like a soft tenant's: never on the hard node.
    let staff = book_as(&berth, &admin, "h100-1", "staff", None, 2).await.expect("staff booking");
    assert_eq!(node_of(&berth, &staff.id).await, shared);
    let refused = book(&berth, "h100-1", "more", None, 2).await.expect_err("only the hard node has room");
    assert!(
        refused.to_string().contains(
            "no node is free of other tenants for it: 1 of the 2 H100-80GB nodes is dedicated to hard-isolated tenants at that time"
        ),
        "{refused}"
    );
    assert_eq!(common::tenants_sharing_nodes(berth.platform.db()).await, 0);

    // The database holds the rule on its own: a soft reservation on the hard node's free GPU.
    let free_gpu = free_gpu_on(&berth, &dedicated).await;
    let sneaked =
        sneak(&berth, &soft.id, free_gpu, soft.starts_at, soft.ends_at).await.expect_err("the trigger refuses it");
    assert!(sneaked.to_string().contains("shares a node with another tenant"), "{sneaked}");

    // A soft tenant sharing a node with others cannot turn hard while it does.
    let acme = berth.caller.tenant_id().expect("tenant");
    let blocked = berth.platform.set_tenant_isolation(&admin, acme, "hard").await.expect_err("shares a node");
    assert!(
        blocked.to_string().starts_with(
            "the tenant cannot become hard yet: 1 of its environments share a node with another tenant's until "
        ),
        "{blocked}"
    );
    let isolation: String = sqlx::query_scalar("SELECT isolation FROM tenants WHERE id = ?")
        .bind(acme)
        .fetch_one(berth.platform.db())
        .await
        .expect("isolation");
    assert_eq!(isolation, "soft", "nothing changed");
    // Once the staff booking is gone it may: then its node is its own.
    berth.platform.stop(&admin, &staff.id).await.expect("stop");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while held_by(&berth, &staff.id).await > 0 {
        assert!(tokio::time::Instant::now() < deadline, "the staff booking was never released");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    berth.platform.set_tenant_isolation(&admin, acme, "hybrid").await.expect("nodes of its own now");
    let refused = book_as(&berth, &admin, "h100-1", "staff-again", None, 2).await.expect_err("both nodes dedicated");
    assert!(refused.to_string().contains("2 of the 2 H100-80GB nodes are dedicated"), "{refused}");
    assert_eq!(common::tenants_sharing_nodes(berth.platform.db()).await, 0);
}

/// A reservation written straight to the database, as a path that skipped placement would.
async fn sneak(berth: &TestBerth, environment: &str, gpu: i64, starts_at: i64, ends_at: i64) -> Result<i64, String> {
    sqlx::query_scalar(
        "INSERT INTO reservations (environment_id, gpu_id, slice_start, slice_size, starts_at, ends_at)
         VALUES (?, ?, 0, 8, ?, ?) RETURNING id",
    )
    .bind(environment)
    .bind(gpu)
    .bind(starts_at)
    .bind(ends_at)
    .fetch_one(berth.platform.db())
    .await
    .map_err(|e| e.to_string())
}

/// The GPU of `node` that nothing holds.
async fn free_gpu_on(berth: &TestBerth, node: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT g.id FROM gpus g JOIN nodes n ON n.id = g.node_id
         WHERE n.name = ? AND g.id NOT IN (SELECT gpu_id FROM reservations WHERE released_at IS NULL)",
    )
    .bind(node)
    .fetch_one(berth.platform.db())
    .await
    .expect("a free GPU on the node")
}

#[sqlx::test(migrations = "../migrations")]
async fn the_database_keeps_hard_tenants_apart_whoever_writes_and_after_isolation_changes(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let admin = berth.admin().await;
    let acme = berth.caller.tenant_id().expect("tenant");
    let vault = member_of(&berth, "vault", Isolation::Hard).await;
    let vault_id = vault.tenant_id().expect("tenant");
    let hard = book_as(&berth, &vault, "h100-1", "hard", None, 2).await.expect("hard booking");
    let soft = book(&berth, "h100-1", "soft", None, 2).await.expect("soft booking");
    let (hard_node, soft_node) = (node_of(&berth, &hard.id).await, node_of(&berth, &soft.id).await);
    assert_ne!(hard_node, soft_node);
    let refused = |result: Result<i64, String>| {
        let e = result.expect_err("the trigger refuses it");
        assert!(e.contains("shares a node with another tenant"), "{e}");
    };

    // A hard tenant's reservation on a node where a soft one holds a GPU at the same time.
    refused(sneak(&berth, &hard.id, free_gpu_on(&berth, &soft_node).await, soft.starts_at, soft.ends_at).await);

    // A soft reservation on the hard node after the hard one is fine; moved onto it, not.
    let later = hard.ends_at + HOUR_MS;
    let beside = sneak(&berth, &soft.id, free_gpu_on(&berth, &hard_node).await, later, later + HOUR_MS)
        .await
        .expect("no overlap in time");
    let moved = sqlx::query("UPDATE reservations SET starts_at = ? WHERE id = ?")
        .bind(hard.starts_at)
        .bind(beside)
        .execute(berth.platform.db())
        .await
        .map(|_| 0)
        .map_err(|e| e.to_string());
    refused(moved);

    // Whether a reservation is hard follows its tenant's isolation, both ways: acme turns
    // hybrid (its nodes are its own), and then not even a soft vault may join it.
    berth.platform.set_tenant_isolation(&admin, acme, "hybrid").await.expect("acme has nodes of its own");
    berth.platform.set_tenant_isolation(&admin, vault_id, "soft").await.expect("vault turns soft");
    let acme_free = free_gpu_on(&berth, &soft_node).await;
    refused(sneak(&berth, &hard.id, acme_free, soft.starts_at, soft.ends_at).await);
    berth.platform.set_tenant_isolation(&admin, acme, "soft").await.expect("acme turns soft");
    sneak(&berth, &hard.id, acme_free, soft.starts_at, soft.ends_at).await.expect("two soft tenants share");
    assert_eq!(common::tenants_sharing_nodes(berth.platform.db()).await, 0);
}

#[sqlx::test(migrations = "../migrations")]
async fn extending_a_hard_tenants_booking_stops_at_another_tenant_on_its_node(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let admin = berth.admin().await;
    let vault = member_of(&berth, "vault", Isolation::Hard).await;
    let t0 = now_ms() + DAY_MS;
    let hard = book_as(&berth, &vault, "h100-1", "hard", Some(t0), 2).await.expect("hard booking");
    let units = held_on(&berth, &hard.id).await;
    let (node, gpu) = units[0].clone();
    // Later, the other node and the hard tenant's own GPU are in maintenance: a soft
    // booking right after the hard one (and its cleaning gap) lands on that node's other GPU.
    let other = if node == "h100-01" { "h100-02" } else { "h100-01" };
    let (from, to) = (rfc3339(t0 + 3 * HOUR_MS), rfc3339(t0 + 8 * HOUR_MS));
    berth.platform.schedule_maintenance(&admin, other, None, &from, &to, "firmware").await.expect("node");
    berth.platform.schedule_maintenance(&admin, &node, Some(gpu), &from, &to, "reseat").await.expect("gpu");
    let soft_start = t0 + 2 * HOUR_MS + 30 * MINUTE_MS;
    let soft = book(&berth, "h100-1", "soft", Some(soft_start), 2).await.expect("soft booking");
    assert_eq!(held_on(&berth, &soft.id).await, [(node.clone(), 1 - gpu)]);

    let blocked = berth.platform.change_end(&vault, &hard.id, &rfc3339(t0 + 4 * HOUR_MS)).await;
    let text = blocked.expect_err("runs into the soft booking's node").to_string();
    let starts = berth_domain::booking::utc_short(soft_start);
    let latest = berth_domain::booking::utc_short(soft_start - 15 * MINUTE_MS);
    assert!(text.contains(&format!("its node is held by another tenant from {starts}")), "{text}");
    assert!(text.contains(&format!("it can run until {latest} at the latest")), "{text}");
    let longer = berth.platform.change_end(&vault, &hard.id, &rfc3339(soft_start - 15 * MINUTE_MS)).await;
    assert_eq!(longer.expect("up to the gap").ends_at, soft_start - 15 * MINUTE_MS);
    assert_eq!(common::tenants_sharing_nodes(berth.platform.db()).await, 0);
}

/// "As soon as possible": the earliest start within the days asked, found and booked in one
/// writer turn, so two such bookings racing for the same free time never get the same GPUs.
#[sqlx::test(migrations = "../migrations")]
async fn as_soon_as_possible_books_the_earliest_start_and_says_which(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let asap = |name: &str, size: &str, hours: u32, days: &str| LaunchRequest {
        offering: "cluster".into(),
        size: size.into(),
        name: name.into(),
        hours: hours.to_string(),
        earliest_within_days: days.into(),
        ..LaunchRequest::default()
    };
    let now = now_ms();
    // Both H100 nodes busy for the next three hours.
    let first = book(&berth, "h100-node-1", "busy-1", None, 3).await.expect("node 1");
    book(&berth, "h100-node-1", "busy-2", None, 3).await.expect("node 2");
    let free_again = first.ends_at + 15 * MINUTE_MS;

    // Two at once: both wait for the same moment, on different nodes.
    let (soon_a, soon_b) = (asap("soon-a", "h100-node-1", 2, "2"), asap("soon-b", "h100-node-1", 2, "2"));
    let (a, b) =
        tokio::join!(berth.platform.launch(&berth.caller, &soon_a), berth.platform.launch(&berth.caller, &soon_b));
    let (a, b) = (a.expect("first asap"), b.expect("second asap"));
    // Both nodes come free within milliseconds of each other: each gets one.
    for env in [&a, &b] {
        assert!(
            env.starts_at >= free_again && env.starts_at < free_again + MINUTE_MS,
            "{} vs {free_again}",
            env.starts_at
        );
    }
    assert_ne!(node_of(&berth, &a.id).await, node_of(&berth, &b.id).await);
    // The third finds the next free time, after those two.
    let c = berth.platform.launch(&berth.caller, &asap("soon-c", "h100-node-1", 2, "2")).await.expect("third");
    assert_eq!(c.starts_at, a.ends_at.min(b.ends_at) + 15 * MINUTE_MS);
    assert_eq!(common::overlapping_reservations(berth.platform.db()).await, 0);

    // A start the search cannot reach is refused, naming the days, and writes nothing.
    book(&berth, "h100-node-1", "long-1", Some(c.ends_at + HOUR_MS), 72).await.expect("long 1");
    book(&berth, "h100-node-1", "long-2", Some(c.ends_at + HOUR_MS), 72).await.expect("long 2");
    let before = environments(&berth).await;
    let err = berth.platform.launch(&berth.caller, &asap("never", "h100-node-1", 8, "1")).await.expect_err("none");
    let text = err.to_string();
    assert!(text.contains("within the next 1 days"), "{text}");
    assert!(text.contains("free for all of 8 h"), "{text}");
    assert_eq!(environments(&berth).await, before);
    assert!(now < a.starts_at);
}

/// "Any of these models": a booking that allows another model takes the same size there
/// when its own is full, at that size's price, counted against that model's quota; the
/// refusal names every size it tried.
#[sqlx::test(migrations = "../migrations")]
async fn a_booking_allowing_other_models_takes_the_same_size_on_one_that_is_free(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let admin = berth.admin().await;
    let notebook = |name: &str, models: &str, gb: &str| LaunchRequest {
        offering: "notebook".into(),
        size: "h100-1".into(),
        name: name.into(),
        hours: "2".into(),
        models: models.into(),
        min_gpu_memory_gb: gb.into(),
        ..LaunchRequest::default()
    };
    // Every H100 taken.
    book(&berth, "h100-node-1", "all-1", None, 3).await.expect("node 1");
    book(&berth, "h100-node-1", "all-2", None, 3).await.expect("node 2");

    let only_h100 = berth.platform.launch(&berth.caller, &notebook("only", "", "")).await.expect_err("full");
    assert!(only_h100.to_string().starts_with("no capacity for 1 x H100-80GB right now"), "{only_h100}");
    let big = berth.platform.launch(&berth.caller, &notebook("big", "any", "80")).await.expect_err("L40S has 48 GB");
    assert!(big.to_string().starts_with("no capacity for 1 x H100-80GB right now"), "{big}");

    // A quota of 0 L40S GPUs stops it there, on the model actually placed.
    let no_l40s = Quota { max_gpus_by_model: [(GpuModel::L40S, 0.0)].into(), ..Quota::default() };
    berth.platform.set_quota(&admin, QuotaSubject::Everyone, &no_l40s).await.expect("quota");
    let err = berth.platform.launch(&berth.caller, &notebook("quota", "L40S", "")).await.expect_err("quota");
    assert!(err.to_string().contains("L40S"), "{err}");
    berth.platform.set_quota(&admin, QuotaSubject::Everyone, &Quota::default()).await.expect("no quota");

    let env = berth.platform.launch(&berth.caller, &notebook("either", "L40S", "")).await.expect("on an L40S");
    assert_eq!((env.size.id, env.cents_per_hour), ("l40s-1", 110), "the L40S size, at its price");
    assert_eq!(held_by(&berth, &env.id).await, 1);
    let second = berth.platform.launch(&berth.caller, &notebook("either-2", "any", "")).await.expect("the other L40S");
    assert_eq!(second.size.id, "l40s-1");
    let none = berth.platform.launch(&berth.caller, &notebook("none", "any", "")).await.expect_err("all full");
    assert!(none.to_string().starts_with("no capacity for 1 x H100-80GB or 1 x L40S right now"), "{none}");
    assert_eq!(common::overlapping_reservations(berth.platform.db()).await, 0);
}

/// The catalog's "free now": a GPU a booking holds now is not free, one booked only ahead
/// still is, and a released one is free again.
#[sqlx::test(migrations = "../migrations")]
async fn a_gpu_is_free_now_unless_a_booking_holds_it_now(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let free_h100 = || async {
        let capacity = berth.platform.capacity_by_model().await.expect("capacity");
        capacity.iter().find(|c| c.model == GpuModel::H100_80GB).expect("h100").idle_gpus
    };
    let all = free_h100().await;
    let ahead = book(&berth, "h100-1", "tomorrow", Some(now_ms() + DAY_MS), 2).await.expect("ahead");
    assert_eq!(free_h100().await, all, "a booking ahead holds nothing now");
    let now = book(&berth, "h100-1", "now", None, 2).await.expect("now");
    assert_eq!(free_h100().await, all - 1);
    for env in [&ahead, &now] {
        berth.platform.stop(&berth.caller, &env.id).await.expect("stop");
    }
    berth.wait_for(&now.id, EnvState::Released).await;
    assert_eq!(free_h100().await, all, "released, free again");
}

#[sqlx::test(migrations = "../migrations")]
async fn an_endpoint_keeps_its_model_arguments_and_variables_and_other_offerings_take_none(pool: SqlitePool) {
    let berth = TestBerth::new(pool.clone()).await;
    let endpoint = LaunchRequest {
        offering: "inference".into(),
        size: "l40s-1".into(),
        name: "llm".into(),
        hours: "2".into(),
        image: "vllm/vllm-openai:v0.6.3".into(),
        model: "org/model-7b".into(),
        args: "--max-model-len 8192".into(),
        env: "HF_TOKEN=hf_secret".into(),
        ..LaunchRequest::default()
    };
    let env = berth.platform.launch(&berth.caller, &endpoint).await.unwrap();
    let read = berth.platform.environment_of(&berth.caller, &env.id).await.unwrap();
    assert_eq!(read.serving.model.as_deref(), Some("org/model-7b"));
    assert_eq!(read.serving.container_args(), ["--max-model-len", "8192"]);
    assert_eq!(read.serving.env_names(), ["HF_TOKEN"]);

    // A notebook given a model is refused whole: nothing typed is dropped unsaid.
    let before: i64 = sqlx::query_scalar("SELECT count(*) FROM environments").fetch_one(&pool).await.unwrap();
    let notebook = LaunchRequest {
        offering: "notebook".into(),
        size: "h100-1g.10gb".into(),
        name: "nb".into(),
        hours: "2".into(),
        model: "org/model-7b".into(),
        ..LaunchRequest::default()
    };
    let error = berth.platform.launch(&berth.caller, &notebook).await.unwrap_err();
    assert!(matches!(error, Error::Refused(Refusal::ServingNotAllowed("Jupyter notebook"))), "{error}");
    let after: i64 = sqlx::query_scalar("SELECT count(*) FROM environments").fetch_one(&pool).await.unwrap();
    assert_eq!(before, after);
    // A bad variable names itself, and nothing is written either.
    let error = berth
        .platform
        .launch(&berth.caller, &LaunchRequest { name: "llm2".into(), env: "NOT A LINE".into(), ..endpoint })
        .await
        .unwrap_err();
    assert_eq!(error.to_string(), "environment variables: \"NOT A LINE\" is not NAME=value");
}
