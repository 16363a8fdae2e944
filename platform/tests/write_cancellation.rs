//! Writes whose futures are dropped half-way: a reconciler step past its timeout, an HTTP
//! handler whose client went away, shutdown. Whatever point a write is dropped at, the
//! next write must get SQLite's write lock at once, nothing of the dropped write may stay
//! half-done, and the in-memory booking book must still equal the committed tables.
//!
//! Each test runs on a real database file opened with the production settings (WAL, a
//! 10 s busy timeout, eight connections), as `berth serve` opens it.
#![allow(clippy::expect_used, clippy::unwrap_used)] // helpers of tests stop the test with their message

mod common;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use berth_domain::catalog::Offering;
use berth_domain::fleet::FleetSpec;
use berth_domain::launch::LaunchRequest;
use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use berth_platform::{Caller, Platform, store};
use common::{SMALL_FLEET, overlapping_reservations, test_meta, trigger_abort};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::SqlitePool;
use tokio::sync::Notify;

/// Well under the production busy timeout (10 s): a write lock left behind by a dropped
/// write makes the next writer wait out the whole busy timeout and then fail.
const PROMPT: Duration = Duration::from_secs(3);

/// How often each drop point is tried: whether an await suspends depends on how fast a
/// connection's thread answers, so a point may move by one between runs.
/// The sweep ends when every attempt finished before its drop point.
const ATTEMPTS: usize = 4;

/// A fresh database file with the migrations applied, opened as `berth serve` opens it.
async fn production_database() -> SqlitePool {
    let dir = std::env::temp_dir().join(format!("berth-test-{}", uuid::Uuid::new_v4()));
    let pool = store::connect(&format!("sqlite://{}/berth.db", dir.display())).await.expect("connect");
    store::migrate(&pool).await.expect("migrate");
    pool
}

struct Woken(Notify);

impl Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.0.notify_one();
    }
}

/// Drives `write` through `suspensions` of its awaits, each time until what it awaited is
/// ready, then drops it there: the same points, run after run, that a timeout or a client
/// disconnect could drop it at. Its outcome if it finished before that.
async fn drop_after<F: Future>(write: F, suspensions: usize) -> Option<F::Output> {
    let woken = Arc::new(Woken(Notify::new()));
    let waker = Waker::from(woken.clone());
    let mut write = pin!(write);
    for _ in 0..suspensions {
        if let Poll::Ready(outcome) = write.as_mut().poll(&mut Context::from_waker(&waker)) {
            return Some(outcome);
        }
        if tokio::time::timeout(PROMPT, woken.0.notified()).await.is_err() {
            panic!("after {suspensions} suspensions the write waited past {PROMPT:?} (a write lock left behind?)");
        }
    }
    None
}

/// Drives `write` the same way until `landed` says its effect is committed, and drops it
/// there if it is still running: a write dropped while its COMMIT is in flight. Its
/// outcome if it finished first.
async fn drop_once_landed<F: Future, L: Future<Output = bool>>(
    write: F,
    mut landed: impl FnMut() -> L,
) -> Option<F::Output> {
    let woken = Arc::new(Woken(Notify::new()));
    let waker = Waker::from(woken.clone());
    let mut write = pin!(write);
    loop {
        if let Poll::Ready(outcome) = write.as_mut().poll(&mut Context::from_waker(&waker)) {
            return Some(outcome);
        }
        if tokio::time::timeout(PROMPT, woken.0.notified()).await.is_err() {
            panic!("the write waited past {PROMPT:?} (a write lock left behind?)");
        }
        if landed().await {
            return None;
        }
    }
}

/// A platform on `pool` with the small fleet, a tenant and a member, and no reconciler:
/// what the tests count stays as the writes left it.
async fn platform_with_member(pool: &SqlitePool) -> (Platform, Caller) {
    let platform = Platform::new(pool.clone());
    platform.sync_fleet(&FleetSpec::parse(SMALL_FLEET).expect("fleet")).await.expect("sync fleet");
    let tenant = platform.ensure_tenant("acme", "Acme", Isolation::Soft).await.expect("tenant");
    let user = platform
        .create_user("dana@example.com", "Dana", "a long passphrase", Role::Member, Some(tenant))
        .await
        .expect("user");
    (platform, user.caller(test_meta()))
}

fn training_on_one_h100(name: &str) -> LaunchRequest {
    LaunchRequest {
        offering: "training".into(),
        size: "h100-1".into(),
        name: name.into(),
        hours: "2".into(),
        image: "ghcr.io/acme/app:1".into(),
        command: "python main.py".into(),
        ..LaunchRequest::default()
    }
}

fn notebook_on_a_1g_slice(name: &str) -> LaunchRequest {
    LaunchRequest {
        offering: "notebook".into(),
        size: "h100-1g.10gb".into(),
        name: name.into(),
        hours: "2".into(),
        ..LaunchRequest::default()
    }
}

/// The launch form's free count of `size` for two hours from now, read from the booking
/// book.
async fn shown_free(platform: &Platform, offering: Offering, size: &str) -> u32 {
    let sizes = platform.size_availability(None, offering, 2, None).await.expect("availability");
    sizes.iter().find(|s| s.size.id == size).expect("the size").free_now
}

/// H100s free now for two hours as the launch form shows them, and as the reservations
/// table has them.
async fn free_h100s(platform: &Platform) -> (u32, i64) {
    let shown = shown_free(platform, Offering::TrainingJob, "h100-1").await;
    let held: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT r.gpu_id) FROM reservations r JOIN gpus g ON g.id = r.gpu_id
         WHERE g.model = 'H100-80GB' AND r.released_at IS NULL",
    )
    .fetch_one(platform.db())
    .await
    .expect("count");
    (shown, 4 - held)
}

/// 1g.10gb slices free now for two hours as the launch form shows them, and as the
/// reservations table has them when it holds nothing but such slices (7 on each H100).
async fn free_1g_slices(platform: &Platform) -> (u32, i64) {
    let shown = shown_free(platform, Offering::Notebook, "h100-1g.10gb").await;
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM reservations r JOIN gpus g ON g.id = r.gpu_id
         WHERE g.model = 'H100-80GB' AND r.released_at IS NULL",
    )
    .fetch_one(platform.db())
    .await
    .expect("count");
    (shown, 28 - held)
}

/// A tenant created without anyone asking writes its row, its audit event and its fabric
/// settlement in one transaction; dropped at each of its awaits in turn (its `BEGIN
/// IMMEDIATE` included), the next write still gets the lock at once and every dropped
/// creation is there entirely or not at all.
///
/// (Before `WriteTx` ran its own BEGIN, a drop right after sqlx's `begin_with` had run
/// the BEGIN left a pooled connection holding the write lock: the next write waited out
/// the busy timeout and failed with "database is locked".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_dropped_at_any_await_leaves_the_next_write_prompt() {
    let pool = production_database().await;
    let platform = Platform::new(pool.clone());
    let mut dropped = 0;
    for suspensions in 1.. {
        let mut finished_every_time = true;
        for attempt in 0..ATTEMPTS {
            let at = format!("dropped after {suspensions} suspensions (attempt {attempt})");
            let slug = format!("dropped-{suspensions}-{attempt}");
            let finished = drop_after(platform.ensure_tenant(&slug, "Dropped", Isolation::Soft), suspensions).await;
            if let Some(outcome) = &finished {
                outcome.as_ref().unwrap_or_else(|e| panic!("{at}: it finished with {e:?}"));
            }

            let next_slug = format!("next-{suspensions}-{attempt}");
            let next = tokio::time::timeout(PROMPT, platform.ensure_tenant(&next_slug, "Next", Isolation::Soft))
                .await
                .unwrap_or_else(|_| panic!("{at}: the next write waited past {PROMPT:?}"));
            next.unwrap_or_else(|e| panic!("{at}: the next write failed: {e:?}"));

            let (tenants, audited): (i64, i64) = sqlx::query_as(
                "SELECT (SELECT count(*) FROM tenants WHERE slug = ?1),
                        (SELECT count(*) FROM audit_events WHERE action = 'tenant.create' AND target = ?1)",
            )
            .bind(&slug)
            .fetch_one(&pool)
            .await
            .expect("count");
            assert_eq!(tenants, audited, "{at}: half a tenant creation was kept");
            if finished.is_some() {
                assert_eq!(tenants, 1);
            } else {
                finished_every_time = false;
                dropped += 1;
            }
        }
        if finished_every_time {
            break;
        }
    }
    assert!(dropped > 0, "the write was never dropped");
}

/// A launch dropped at each of its awaits in turn, its COMMIT included: the launch form
/// (read from the in-memory booking book) shows exactly the slices the reservations table
/// leaves free, and nothing overlaps.
///
/// (Before, a launch dropped while its COMMIT was in flight could commit without adding
/// its reservation to the book, and the launch form offered capacity already booked.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_dropped_at_any_await_leaves_the_launch_form_right() {
    let pool = production_database().await;
    let (platform, caller) = platform_with_member(&pool).await;
    // The book is loaded before the first launch, as in a running portal.
    assert_eq!(free_1g_slices(&platform).await, (28, 28));
    for suspensions in 1.. {
        let mut finished_every_time = true;
        for attempt in 0..ATTEMPTS {
            let at = format!("dropped after {suspensions} suspensions (attempt {attempt})");
            let request = notebook_on_a_1g_slice(&format!("nb-{suspensions}-{attempt}"));
            let finished = drop_after(platform.launch(&caller, &request), suspensions).await;
            match &finished {
                Some(outcome) => drop(outcome.as_ref().unwrap_or_else(|e| panic!("{at}: it finished with {e:?}"))),
                None => finished_every_time = false,
            }
            let (shown, in_table) = tokio::time::timeout(PROMPT, free_1g_slices(&platform))
                .await
                .unwrap_or_else(|_| panic!("{at}: reading availability waited past {PROMPT:?}"));
            assert_eq!(shown, in_table as u32, "{at}: the launch form shows {shown} free slices, the table {in_table}");
            // Past the COMMIT every attempt books a slice: stop before the fleet is full.
            finished_every_time |= in_table <= ATTEMPTS as i64;
        }
        if finished_every_time {
            break;
        }
    }
    assert_eq!(overlapping_reservations(&pool).await, 0);
}

/// Launches dropped the moment their rows are committed, before `launch` has seen its
/// COMMIT answer: the launch form still shows exactly what the table leaves free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_dropped_as_its_commit_lands_leaves_the_launch_form_right() {
    let pool = production_database().await;
    let (platform, caller) = platform_with_member(&pool).await;
    assert_eq!(free_1g_slices(&platform).await, (28, 28));
    // A launch whose every await is answered before it is polled again finishes first;
    // launch until three were dropped.
    let (mut launched, mut dropped) = (0, 0);
    while dropped < 3 && launched < 20 {
        let name = format!("nb-{launched}");
        let landed = || async {
            let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM environments WHERE name = ?")
                .bind(&name)
                .fetch_one(&pool)
                .await
                .expect("count");
            rows > 0
        };
        let finished = drop_once_landed(platform.launch(&caller, &notebook_on_a_1g_slice(&name)), landed).await;
        if finished.is_none() {
            dropped += 1;
        }
        launched += 1;
        let (shown, in_table) = tokio::time::timeout(PROMPT, free_1g_slices(&platform))
            .await
            .unwrap_or_else(|_| panic!("launch {launched}: reading availability waited past {PROMPT:?}"));
        assert_eq!(
            shown, in_table as u32,
            "launch {launched}: the launch form shows {shown} free slices, the table {in_table}"
        );
        assert_eq!(in_table, 28 - launched, "launch {launched} was committed");
    }
    assert!(dropped > 0, "no launch was dropped once committed");
}

/// Many writers at once, each dropped by a timeout at a random point (some spawned and
/// aborted instead), on the production pool of eight connections: afterwards a plain
/// write succeeds at once, no reservations overlap and the launch form equals the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writes_cancelled_at_random_leave_the_database_writable() {
    let pool = production_database().await;
    let (platform, caller) = platform_with_member(&pool).await;
    assert_eq!(free_h100s(&platform).await, (4, 4));
    let fleet = Arc::new(FleetSpec::parse(SMALL_FLEET).expect("fleet"));

    let seed: u64 = rand::rng().random();
    println!("seed {seed}");
    let mut writers = Vec::new();
    for i in 0..64 {
        let (platform, caller, fleet) = (platform.clone(), caller.clone(), fleet.clone());
        let mut rng = StdRng::seed_from_u64(seed.wrapping_add(i as u64));
        writers.push(tokio::spawn(async move {
            for round in 0..10 {
                let budget = Duration::from_micros(rng.random_range(0..4_000));
                let (platform, caller, fleet) = (platform.clone(), caller.clone(), fleet.clone());
                let write = async move {
                    match (i + round) % 3 {
                        0 => {
                            platform.launch(&caller, &training_on_one_h100(&format!("job-{i}-{round}"))).await.map(drop)
                        }
                        1 => platform.ensure_tenant(&format!("t-{i}-{round}"), "T", Isolation::Soft).await.map(drop),
                        _ => platform.sync_fleet(&fleet).await,
                    }
                };
                if rng.random_bool(0.2) {
                    // Dropped the way an aborted task is: wherever it happens to be.
                    let task = tokio::spawn(write);
                    tokio::time::sleep(budget).await;
                    task.abort();
                    let _ = task.await;
                } else if let Ok(Err(e)) = tokio::time::timeout(budget, write).await {
                    // Failing is fine (the pool is busy); a write the database's triggers
                    // had to stop is a bug the product let through.
                    assert_eq!(trigger_abort(&e), None, "writer {i}, round {round}: {e}");
                }
            }
        }));
    }
    for writer in writers {
        writer.await.expect("writer task");
    }

    let started = tokio::time::Instant::now();
    tokio::time::timeout(PROMPT, platform.ensure_tenant("after", "After", Isolation::Soft))
        .await
        .expect("the write after the storm waited past the deadline")
        .expect("the write after the storm");
    assert!(started.elapsed() < PROMPT);
    assert_eq!(overlapping_reservations(&pool).await, 0);
    let (shown, in_table) = free_h100s(&platform).await;
    assert_eq!(shown, in_table as u32, "the launch form shows {shown} free H100s, the table {in_table}");
    let half_tenants: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM tenants t WHERE NOT EXISTS
           (SELECT 1 FROM audit_events a WHERE a.action = 'tenant.create' AND a.target = t.slug)",
    )
    .fetch_one(&pool)
    .await
    .expect("count");
    assert_eq!(half_tenants, 0, "a tenant was kept without its audit event");
}
