//! GPU telemetry and idle reclamation end to end on the simulated fleet: readings kept per
//! booked GPU or MIG slice and shown to whoever may see the environment, the idle watcher's
//! warning, "keep it", the stop that frees the capacity, and the policies' rules.
#![allow(clippy::expect_used, clippy::unwrap_used)] // helpers of tests stop the test with their message

mod common;

use berth_domain::Refusal;
use berth_domain::catalog::Offering;
use berth_domain::idle::IdlePolicy;
use berth_domain::lifecycle::EnvState;
use berth_domain::notification::Kind;
use berth_domain::policy::Role;
use berth_domain::telemetry::GpuReading;
use berth_domain::tenancy::Isolation;
use berth_platform::capacity::maintenance::NodeFilter;
use berth_platform::provisioning::backend::simulated::Activity;
use berth_platform::{Error, now_ms};
use common::{TestBerth, test_meta};
use sqlx::SqlitePool;

const SECOND: i64 = 1000;

async fn audited(berth: &TestBerth, action: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE action = ? AND outcome = 'success'")
        .bind(action)
        .fetch_one(berth.platform.db())
        .await
        .expect("count")
}

async fn notified(berth: &TestBerth, kind: Kind) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM notifications WHERE kind = ? AND user_id = ?")
        .bind(kind.as_str())
        .bind(berth.caller.user_id())
        .fetch_one(berth.platform.db())
        .await
        .expect("count")
}

/// Reads the simulated fleet's GPUs once and keeps what it read.
async fn read_once(berth: &TestBerth) -> berth_platform::provisioning::telemetry::Recorded {
    berth.platform.record_readings(&berth.backend.read_gpus()).await.expect("record")
}

#[sqlx::test(migrations = "../migrations")]
async fn readings_are_kept_per_booked_gpu_or_slice_and_shown_to_whom_may_see_them(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let notebook = berth.launch("notebook", "h100-1g.10gb", "lab").await.expect("notebook");
    let training = berth.launch("training", "h100-1", "train").await.expect("training");
    berth.wait_for(&notebook.id, EnvState::Ready).await;
    berth.wait_for(&training.id, EnvState::Ready).await;

    let recorded = read_once(&berth).await;
    assert_eq!((recorded.kept, recorded.dropped), (2, 0), "one MIG slice and one whole GPU");
    // Readings of a GPU nobody holds, or implausible ones, are dropped.
    let stray = GpuReading {
        node: "l40s-01".into(),
        gpu_index: 1,
        slice_start: None,
        environment: None,
        at_ms: now_ms(),
        period_s: 30.0,
        utilization_pct: 50.0,
        memory_used_mib: 1.0,
        memory_total_mib: 46_068.0,
        power_w: None,
        temperature_c: None,
    };
    let wrong = GpuReading { utilization_pct: 140.0, ..stray.clone() };
    let recorded = berth.platform.record_readings(&[stray, wrong]).await.expect("record");
    assert_eq!((recorded.kept, recorded.dropped), (0, 2));

    let lab = berth.platform.environment_gpu_use(&berth.caller, &notebook.id).await.expect("use");
    assert_eq!(lab.hour.len(), 1);
    assert_eq!(lab.day.len(), 1);
    assert!(lab.hour[0].utilization_pct < 3.0, "a notebook sits idle: {:?}", lab.hour[0]);
    assert!(lab.hour[0].memory_total_mib < 81_920.0 / 4.0, "a 1g slice's memory, not the GPU's");
    let train = berth.platform.environment_gpu_use(&berth.caller, &training.id).await.expect("use");
    assert!(train.hour[0].utilization_pct > 85.0, "training keeps its GPU busy: {:?}", train.hour[0]);
    assert!(train.hour[0].power_w.unwrap() > 500.0);

    // The fleet chart shows how busy each held GPU is, beside what is booked on it; a GPU
    // nobody holds shows nothing.
    let admin = berth.admin().await;
    let t = now_ms();
    let fleet = berth
        .platform
        .fleet_schedule(&admin, t - 3_600_000, t + 3_600_000, &NodeFilter::default())
        .await
        .expect("fleet");
    let gpus: Vec<_> = fleet.nodes.iter().flat_map(|n| n.gpus.iter()).collect();
    let held_by = |id: &str| gpus.iter().find(|g| g.bookings.iter().any(|b| b.environment_id == id)).unwrap();
    assert!(
        held_by(&training.id).utilization_pct.unwrap() >= 85,
        "over 85% before rounding: {:?}",
        held_by(&training.id)
    );
    assert!(held_by(&notebook.id).utilization_pct.unwrap() <= 3, "under 3% before rounding");
    assert!(gpus.iter().filter(|g| g.bookings.is_empty()).all(|g| g.utilization_pct.is_none()));

    // Told to idle, the training job's GPU reads idle from then on.
    berth.backend.set_activity(&training.id, Activity::Idle);
    read_once(&berth).await;
    let train = berth.platform.environment_gpu_use(&berth.caller, &training.id).await.expect("use");
    let bucket = train.hour.last().unwrap();
    assert!(bucket.utilization_pct < 60.0, "the minute's average falls: {bucket:?}");

    // `/metrics`' series: one per held GPU or slice, the slice named by its start.
    let now = berth.platform.gpus_now().await.expect("gpus now");
    assert_eq!(now.len(), 2);
    assert!(now.iter().any(|g| g.environment == notebook.id && g.gpu.contains("/mig")), "{now:?}");
    assert!(now.iter().all(|g| g.tenant == "acme"));

    // Someone of another tenant cannot see them; its admin sees the tenant's GPU-hours.
    let other = berth.platform.ensure_tenant("globex", "Globex", Isolation::Soft).await.expect("tenant");
    let stranger = berth
        .platform
        .create_user("eve@globex.example", "Eve", "a long passphrase", Role::TenantAdmin, Some(other))
        .await
        .expect("user")
        .caller(test_meta());
    let refused = berth.platform.environment_gpu_use(&stranger, &notebook.id).await;
    assert!(matches!(refused, Err(Error::NotFound)), "{refused:?}");
    assert!(berth.platform.gpu_use_days(&stranger, "2000-01-01").await.expect("days").is_empty());
    let admin = berth.user_with("tess@example.com", Role::TenantAdmin).await;
    let days = berth.platform.gpu_use_days(&admin, "2000-01-01").await.expect("days");
    assert_eq!(days.len(), 1, "one day, one tenant, one model: {days:?}");
    assert_eq!(days[0].tenant.as_deref(), Some("acme"));
    assert!(days[0].busy_gpu_hours > 0.0 && days[0].busy_gpu_hours < days[0].read_gpu_hours);
    // A member's reach is their own: their GPUs show on their environments' pages.
    assert!(berth.platform.gpu_use_days(&berth.caller, "2000-01-01").await.expect("days").is_empty());

    // Old buckets go: a day and two hours later nothing is left.
    let kept: i64 =
        sqlx::query_scalar("SELECT count(*) FROM gpu_samples").fetch_one(berth.platform.db()).await.expect("count");
    assert!(kept >= 4, "two reservations at two resolutions: {kept}");
    let pruned = berth.platform.prune_samples(now_ms() + 26 * 3_600_000).await.expect("prune");
    assert_eq!(pruned, kept as u64);
    let lab = berth.platform.environment_gpu_use(&berth.caller, &notebook.id).await.expect("use");
    assert!(lab.hour.is_empty() && lab.day.is_empty());
}

#[sqlx::test(migrations = "../migrations")]
async fn an_idle_notebook_is_warned_kept_then_stopped_and_its_capacity_freed(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let admin = berth.admin().await;
    let policy = IdlePolicy::parse("5", "10s", "10s", "1").expect("policy");
    berth.platform.set_idle_policy(&admin, None, Offering::Notebook, Some(policy)).await.expect("policy");
    let notebook = berth.launch("notebook", "h100-1g.10gb", "lab").await.expect("notebook");
    berth.wait_for(&notebook.id, EnvState::Ready).await;
    let t0 = now_ms();
    read_once(&berth).await;

    // Not idle long enough yet: nothing.
    assert_eq!(berth.platform.watch_idle(t0 + 5 * SECOND).await.expect("pass"), 0);
    assert_eq!(berth.platform.idle_status(&berth.caller, &notebook.id).await.unwrap().warning, None);

    // Idle for the policy's time: warned, in the bell and the audit log.
    berth.platform.watch_idle(t0 + 12 * SECOND).await.expect("pass");
    let status = berth.platform.idle_status(&berth.caller, &notebook.id).await.expect("status");
    let (_, stop_at) = status.warning.expect("warned");
    assert!(stop_at >= t0 + 22 * SECOND, "stopped a grace after the warning");
    assert!(status.may_keep);
    let viewer = berth.user_with("vic@example.com", Role::Viewer).await;
    assert!(
        !berth.platform.idle_status(&viewer, &notebook.id).await.expect("status").may_keep,
        "a viewer only watches"
    );
    assert_eq!(notified(&berth, Kind::IdleWarning).await, 1);
    assert_eq!(audited(&berth, "environment.idle_warning").await, 1);
    // A second pass does not warn again.
    berth.platform.watch_idle(t0 + 13 * SECOND).await.expect("pass");
    assert_eq!(notified(&berth, Kind::IdleWarning).await, 1);

    // "Keep it" withdraws the warning and starts the clock again; the policy allows one.
    let kept = berth.platform.keep_environment(&berth.caller, &notebook.id).await.expect("keep");
    assert_eq!((kept.warning, kept.keeps_used, kept.keeps_left, kept.may_keep), (None, 1, Some(0), false));
    assert_eq!(audited(&berth, "environment.keep").await, 1);
    let again = berth.platform.keep_environment(&berth.caller, &notebook.id).await;
    assert!(matches!(again, Err(Error::Refused(Refusal::KeepsUsedUp(_)))), "{again:?}");
    // Kept just now: 5 s later it is not idle yet, even past the old stop time's warning.
    let kept_at = now_ms();
    assert_eq!(berth.platform.watch_idle(kept_at + 5 * SECOND).await.expect("pass"), 0);
    assert_eq!(berth.platform.idle_status(&berth.caller, &notebook.id).await.unwrap().warning, None);

    // Idle again: warned again, and without a keep stopped after the grace.
    berth.platform.watch_idle(kept_at + 11 * SECOND).await.expect("pass");
    let (_, stop_at) = berth.platform.idle_status(&berth.caller, &notebook.id).await.unwrap().warning.expect("warned");
    assert_eq!(berth.platform.watch_idle(stop_at - SECOND).await.expect("pass"), 0);
    assert_eq!(berth.platform.watch_idle(stop_at).await.expect("pass"), 1);
    berth.wait_for(&notebook.id, EnvState::Released).await;
    assert_eq!(berth.held_reservations().await, 0, "its capacity is free");
    let status = berth.platform.idle_status(&berth.caller, &notebook.id).await.expect("status");
    assert!(status.stopped_at.is_some());
    assert_eq!(notified(&berth, Kind::IdleStopped).await, 1);
    assert_eq!(audited(&berth, "environment.idle_stop").await, 1);
    assert_eq!(berth.platform.idle_stops().await.expect("stops"), [("acme".to_owned(), 1)]);
    // A stopped environment is no longer kept.
    let late = berth.platform.keep_environment(&berth.caller, &notebook.id).await;
    assert!(matches!(late, Err(Error::Refused(Refusal::NotKeepable(_)))), "{late:?}");
}

#[sqlx::test(migrations = "../migrations")]
async fn busy_gpus_traffic_or_missing_readings_keep_an_environment_from_being_stopped(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let admin = berth.admin().await;
    let policy = IdlePolicy::parse("5", "10s", "10s", "").expect("policy");
    berth.platform.set_idle_policy(&admin, None, Offering::Notebook, Some(policy)).await.expect("policy");
    let busy = berth.launch("notebook", "h100-1g.10gb", "busy").await.expect("notebook");
    let quiet = berth.launch("notebook", "h100-1g.10gb", "quiet").await.expect("notebook");
    let unread = berth.launch("notebook", "h100-1g.10gb", "unread").await.expect("notebook");
    for env in [&busy, &quiet, &unread] {
        berth.wait_for(&env.id, EnvState::Ready).await;
    }
    berth.backend.set_activity(&busy.id, Activity::Busy);
    // The third notebook's readings never arrive: keep only the others'.
    let readings: Vec<GpuReading> = berth
        .backend
        .read_gpus()
        .into_iter()
        .filter(|r| r.environment.as_deref() != Some(unread.id.as_str()))
        .collect();
    berth.platform.record_readings(&readings).await.expect("record");
    let t0 = now_ms();
    berth.platform.watch_idle(t0 + 15 * SECOND).await.expect("pass");
    let warned = |id: String| {
        let platform = berth.platform.clone();
        let caller = berth.caller.clone();
        async move { platform.idle_status(&caller, &id).await.expect("status").warning.is_some() }
    };
    assert!(!warned(busy.id.clone()).await, "busy GPUs are not idle");
    assert!(warned(quiet.id.clone()).await, "idle GPUs are");
    assert!(!warned(unread.id.clone()).await, "no readings is no evidence of idleness");

    // Someone opens the quiet notebook through the proxy: the warning is withdrawn.
    berth.platform.note_traffic(&quiet.id);
    berth.platform.watch_idle(now_ms() + SECOND).await.expect("pass");
    assert!(!warned(quiet.id.clone()).await, "traffic is use");

    // Readings five minutes old say nothing: no stop, whatever the clock says.
    let stale = now_ms() + 6 * 60 * SECOND;
    berth.platform.watch_idle(stale).await.expect("pass");
    berth.platform.watch_idle(stale + 60 * SECOND).await.expect("pass");
    for env in [&busy, &quiet, &unread] {
        let env = berth.platform.environment_of(&berth.caller, &env.id).await.expect("env");
        assert_eq!(env.state, EnvState::Ready, "{} stays", env.name);
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn a_tenant_may_only_make_the_platforms_policy_stricter(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let admin = berth.admin().await;
    let tenant_admin = berth.user_with("tess@example.com", Role::TenantAdmin).await;
    let acme = berth.caller.tenant_id();
    let platform_policy = IdlePolicy::parse("5", "1h", "15m", "2").unwrap();

    // Only platform admins set the platform's; members set none.
    let refused = berth.platform.set_idle_policy(&tenant_admin, None, Offering::Notebook, Some(platform_policy)).await;
    assert!(matches!(refused, Err(Error::Forbidden)), "{refused:?}");
    let refused = berth.platform.set_idle_policy(&berth.caller, acme, Offering::Notebook, Some(platform_policy)).await;
    assert!(matches!(refused, Err(Error::Forbidden)), "{refused:?}");
    berth.platform.set_idle_policy(&admin, None, Offering::Notebook, Some(platform_policy)).await.expect("set");

    let looser = IdlePolicy::parse("5", "2h", "15m", "2").unwrap();
    let refused = berth.platform.set_idle_policy(&tenant_admin, acme, Offering::Notebook, Some(looser)).await;
    match refused {
        Err(Error::Refused(Refusal::InvalidIdlePolicy(why))) => assert!(why.contains("idle time over"), "{why}"),
        other => panic!("{other:?}"),
    }
    let stricter = IdlePolicy::parse("10", "30m", "5m", "1").unwrap();
    berth.platform.set_idle_policy(&tenant_admin, acme, Offering::Notebook, Some(stricter)).await.expect("stricter");
    assert_eq!(audited(&berth, "idle_policy.set").await, 2);

    // A member reads both, and the stricter applies to their notebook.
    let page = berth.platform.idle_policies(&berth.caller).await.expect("policies");
    assert_eq!(page.policies.len(), 2);
    assert!(!page.manages_platform && page.manages_tenants.is_empty());
    let notebook = berth.launch("notebook", "h100-1g.10gb", "lab").await.expect("notebook");
    let status = berth.platform.idle_status(&berth.caller, &notebook.id).await.expect("status");
    assert!(status.policy.unwrap().contains("under 10% for 30m"));
    assert_eq!(status.keeps_left, Some(1));

    // Removing the platform's leaves the tenant's alone; removing both, nothing applies.
    berth.platform.set_idle_policy(&admin, None, Offering::Notebook, None).await.expect("remove");
    berth.platform.set_idle_policy(&tenant_admin, acme, Offering::Notebook, None).await.expect("remove");
    let status = berth.platform.idle_status(&berth.caller, &notebook.id).await.expect("status");
    assert_eq!(status.policy, None);
}

#[sqlx::test(migrations = "../migrations")]
async fn an_idle_endpoint_gives_back_its_replicas_beyond_one_and_is_never_stopped(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let admin = berth.admin().await;
    let policy = IdlePolicy::parse("5", "10s", "10s", "").expect("policy");
    berth.platform.set_idle_policy(&admin, None, Offering::InferenceEndpoint, Some(policy)).await.expect("policy");
    let endpoint = berth.launch("inference", "l40s-1", "llm").await.expect("endpoint");
    berth.wait_for(&endpoint.id, EnvState::Ready).await;
    berth.backend.set_activity(&endpoint.id, Activity::Idle);

    // At its one replica it has nothing to give back: never warned, never stopped.
    read_once(&berth).await;
    let t0 = now_ms();
    assert_eq!(berth.platform.watch_idle(t0 + 12 * SECOND).await.expect("pass"), 0);
    assert_eq!(berth.platform.watch_idle(t0 + 40 * SECOND).await.expect("pass"), 0);
    let status = berth.platform.idle_status(&berth.caller, &endpoint.id).await.expect("status");
    assert_eq!((status.warning, status.outcome), (None, None));

    // With two replicas, idleness warns that it will scale down, then scales it down.
    berth.platform.set_replicas(&berth.caller, &endpoint.id, "2").await.expect("scale up");
    read_once(&berth).await;
    let t1 = now_ms();
    berth.platform.watch_idle(t1 + 12 * SECOND).await.expect("pass");
    let status = berth.platform.idle_status(&berth.caller, &endpoint.id).await.expect("status");
    let (_, stop_at) = status.warning.expect("warned");
    assert_eq!(status.outcome, Some("scaled down to 1 replica"));
    let title: String = sqlx::query_scalar("SELECT title FROM notifications WHERE kind = 'environment.idle_warning'")
        .fetch_one(berth.platform.db())
        .await
        .unwrap();
    assert_eq!(title, "llm is idle and will be scaled down to 1 replica");

    assert_eq!(berth.platform.watch_idle(stop_at + SECOND).await.expect("pass"), 1);
    let env = berth.platform.environment_of(&berth.caller, &endpoint.id).await.expect("env");
    assert_eq!(env.state, EnvState::Ready, "an endpoint is never stopped for idleness");
    let replicas: i64 = sqlx::query_scalar("SELECT replicas FROM environments WHERE id = ?")
        .bind(&endpoint.id)
        .fetch_one(berth.platform.db())
        .await
        .unwrap();
    assert_eq!(replicas, 1);
    assert_eq!(audited(&berth, "endpoint.idle_scale_down").await, 1);
    assert_eq!(notified(&berth, Kind::IdleStopped).await, 1);
    let status = berth.platform.idle_status(&berth.caller, &endpoint.id).await.expect("status");
    assert_eq!((status.warning, status.stopped_at, status.outcome), (None, None, None));
    // The second replica's GPU goes back to the calendar once the backend stopped it.
    let mut held = i64::MAX;
    for _ in 0..100 {
        held = sqlx::query_scalar(
            "SELECT count(*) FROM reservations WHERE environment_id = ? AND replica = 1 AND released_at IS NULL",
        )
        .bind(&endpoint.id)
        .fetch_one(berth.platform.db())
        .await
        .unwrap();
        if held == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(held, 0, "the surplus replica's GPU is released");
}
