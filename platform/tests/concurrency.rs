//! Many launches at once on a small fleet: never two on the same GPU or slice.
#![allow(clippy::expect_used, clippy::unwrap_used)] // helpers of tests stop the test with their message

mod common;

use std::collections::HashSet;

use berth_domain::booking::MINUTE_MS;
use berth_platform::store;
use common::{TestBerth, overlapping_reservations, trigger_abort};
use sqlx::SqlitePool;

/// 50 launches race for a fleet of 4 H100s (28 1g slices) and 2 L40S. Run on a real
/// database file with the production pool settings, so the writers really contend.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_launches_never_share_a_gpu_or_slice() {
    let dir = std::env::temp_dir().join(format!("berth-test-{}", uuid::Uuid::new_v4()));
    let pool = store::connect(&format!("sqlite://{}/berth.db", dir.display())).await.expect("connect");
    store::migrate(&pool).await.expect("migrate");
    let berth = TestBerth::new(pool.clone()).await;

    let sizes =
        [("notebook", "h100-1g.10gb"), ("notebook", "h100-3g.40gb"), ("training", "h100-1"), ("inference", "l40s-1")];
    let mut tasks = Vec::new();
    for i in 0..50 {
        let (offering, size) = sizes[i % sizes.len()];
        let platform = berth.platform.clone();
        let caller = berth.caller.clone();
        tasks.push(tokio::spawn(async move {
            let request = berth_domain::launch::LaunchRequest {
                offering: offering.into(),
                size: size.into(),
                name: format!("env-{i}"),
                hours: "1".into(),
                image: if offering == "notebook" { String::new() } else { "ghcr.io/acme/app:1".into() },
                command: "run".into(),
                ..Default::default()
            };
            platform.launch(&caller, &request).await
        }));
    }
    let mut accepted = 0;
    let mut l40s = 0;
    for task in tasks {
        match task.await.expect("task") {
            Ok(env) => {
                accepted += 1;
                l40s += usize::from(env.size.id == "l40s-1");
            }
            Err(berth_platform::Error::Refused(berth_domain::Refusal::NoCapacity { .. })) => {}
            Err(other) => match trigger_abort(&other) {
                Some(abort) => panic!("a launch reached the database double-booked (the trigger said: {abort})"),
                None => panic!("unexpected error under contention: {other}"),
            },
        }
    }
    // Twelve asked for an L40S; exactly the two the fleet has were given out. The H100s
    // hold at least four more launches whatever the order.
    assert_eq!(l40s, 2);
    assert!(accepted >= 6, "only {accepted} launches fit");
    assert_eq!(overlapping_reservations(&pool).await, 0);

    // Independently: no whole GPU is shared with anything, and every GPU's slices are
    // distinct.
    let rows: Vec<(i64, i64, i64)> =
        sqlx::query_as("SELECT gpu_id, slice_start, slice_size FROM reservations WHERE released_at IS NULL")
            .fetch_all(&pool)
            .await
            .expect("reservations");
    let mut taken = HashSet::new();
    for (gpu, start, size) in rows {
        for slice in start..start + size {
            assert!(taken.insert((gpu, slice)), "gpu {gpu} memory slice {slice} given twice");
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The checker is not the trigger over again: it finds two bookings of a GPU closer than the
/// cleaning gap, which the database lets through, and `trigger_abort` tells the trigger's
/// refusal of an overlapping booking from the product's own refusals.
#[sqlx::test(migrations = "../migrations")]
async fn the_checker_holds_the_cleaning_gap_and_names_trigger_aborts(pool: SqlitePool) {
    let berth = TestBerth::new(pool.clone()).await;
    berth.launch("training", "h100-1", "first").await.expect("a launch on an empty fleet");
    assert_eq!(overlapping_reservations(&pool).await, 0);

    // Written past the product: the same GPU again, five minutes after the booking ends.
    // No trigger minds; the cleaning gap is 15 minutes.
    let behind = |from_end: i64| {
        format!(
            "INSERT INTO reservations (environment_id, gpu_id, slice_start, slice_size, starts_at, ends_at)
             SELECT environment_id, gpu_id, slice_start, slice_size, ends_at + {from_end}, ends_at + {from_end} + 3600000
             FROM reservations"
        )
    };
    sqlx::query(&behind(5 * MINUTE_MS)).execute(&pool).await.expect("the database keeps no cleaning gap");
    assert_eq!(overlapping_reservations(&pool).await, 1, "a booking inside the cleaning gap");

    // One that overlaps: the trigger refuses it, and that is told apart from a refusal.
    let refused = sqlx::query(&behind(-MINUTE_MS)).execute(&pool).await.expect_err("the trigger refuses overlaps");
    let refused = berth_platform::Error::from(refused);
    assert_eq!(trigger_abort(&refused).as_deref(), Some("reservation overlaps a held reservation"));
    for n in 0..4 {
        let _ = berth.launch("training", "h100-1", &format!("fill-{n}")).await;
    }
    let full = berth.launch("training", "h100-1", "one-too-many").await.expect_err("the H100s are taken");
    assert!(matches!(full, berth_platform::Error::Refused(_)), "{full}");
    assert_eq!(trigger_abort(&full), None);
}

/// Launches that wait for the writer turn together are decided in one transaction (group
/// commit), yet each is all or nothing on its own: of twenty launches at once, ten share
/// one name. Exactly one of those is booked; the nine others are refused with their own
/// error and leave no row, while the ten launches with names of their own are all booked,
/// whichever batches they landed in. Afterwards the launch form (the booking book) shows
/// exactly what the reservations table leaves free.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_launch_in_a_batch_undoes_only_itself() {
    let dir = std::env::temp_dir().join(format!("berth-test-{}", uuid::Uuid::new_v4()));
    let pool = store::connect(&format!("sqlite://{}/berth.db", dir.display())).await.expect("connect");
    store::migrate(&pool).await.expect("migrate");
    let berth = TestBerth::new(pool.clone()).await;
    let free_before = shown_free_1g(&berth.platform).await;

    let mut tasks = Vec::new();
    for i in 0..20 {
        let (platform, caller) = (berth.platform.clone(), berth.caller.clone());
        let name = if i % 2 == 0 { "shared".to_owned() } else { format!("own-{i}") };
        tasks.push(tokio::spawn(async move {
            let request = berth_domain::launch::LaunchRequest {
                offering: "notebook".into(),
                size: "h100-1g.10gb".into(),
                name: name.clone(),
                hours: "1".into(),
                ..Default::default()
            };
            (name, platform.launch(&caller, &request).await)
        }));
    }
    let (mut shared_booked, mut shared_refused, mut own_booked) = (0, 0, 0);
    for task in tasks {
        match task.await.expect("task") {
            (name, Ok(env)) => {
                assert_eq!(env.name, name);
                if name == "shared" { shared_booked += 1 } else { own_booked += 1 }
            }
            (name, Err(berth_platform::Error::Refused(berth_domain::Refusal::NameInUse(_)))) if name == "shared" => {
                shared_refused += 1;
            }
            (name, Err(other)) => panic!("{name}: unexpected error {other}"),
        }
    }
    assert_eq!((shared_booked, shared_refused, own_booked), (1, 9, 10));
    let environments: i64 = sqlx::query_scalar("SELECT count(*) FROM environments").fetch_one(&pool).await.unwrap();
    let held: i64 = sqlx::query_scalar("SELECT count(*) FROM reservations WHERE released_at IS NULL")
        .fetch_one(&pool)
        .await
        .unwrap();
    let launched: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE action = 'environment.launch'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!((environments, held, launched), (11, 11, 11), "a refused launch left rows behind");
    assert_eq!(shown_free_1g(&berth.platform).await, free_before - 11, "the booking book differs from the table");
    assert_eq!(overlapping_reservations(&pool).await, 0);
    let _ = std::fs::remove_dir_all(dir);
}

/// 1g slices free now for two hours, as the launch form shows them.
async fn shown_free_1g(platform: &berth_platform::Platform) -> u32 {
    let sizes =
        platform.size_availability(None, berth_domain::catalog::Offering::Notebook, 2, None).await.expect("sizes");
    sizes.iter().find(|s| s.size.id == "h100-1g.10gb").expect("the size").free_now
}
