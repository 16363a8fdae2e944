//! The environment lifecycle end to end on the simulated backend: happy path, failures,
//! hangs, stops at awkward moments, and a reconciler killed between steps.
#![allow(clippy::expect_used, clippy::unwrap_used)] // helpers of tests stop the test with their message

mod common;

use std::time::Duration;

use berth_domain::Refusal;
use berth_domain::lifecycle::{EnvState, Phase, Step};
use berth_domain::policy::Role;
use berth_platform::Error;
use berth_platform::provisioning::backend::simulated::FaultRule;
use common::TestBerth;
use sqlx::SqlitePool;

fn fault(rule: &str) -> FaultRule {
    rule.parse().expect("fault rule")
}

#[sqlx::test(migrations = "../migrations")]
async fn a_notebook_becomes_ready_with_connection_details_and_stops_cleanly(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let env = berth.launch("notebook", "h100-1g.10gb", "my-notebook").await.expect("launch");
    // The reconciler, woken by the launch, may already have picked it up.
    assert!(matches!(env.state, EnvState::Requested | EnvState::Provisioning), "{:?}", env.state);
    assert_eq!(berth.held_reservations().await, 1);

    let ready = berth.wait_for(&env.id, EnvState::Ready).await;
    let connection = ready.connection.expect("connection details when ready");
    // The notebook's own address on its node; owners go through Berth's proxy instead.
    assert!(connection.url.starts_with("http://127.0.0.1:"), "{}", connection.url);
    assert!(connection.url.ends_with("/lab"), "Jupyter serves at its root: {}", connection.url);
    assert!(connection.secret.is_some_and(|s| s.len() == 32));
    assert!(ready.ready_at.is_some());

    berth.platform.stop(&berth.caller, &env.id).await.expect("stop");
    let released = berth.wait_for(&env.id, EnvState::Released).await;
    assert!(released.finished_at.is_some());
    assert_eq!(released.connection, None, "secrets go with the endpoint");
    assert_eq!(berth.held_reservations().await, 0);
    assert_eq!(berth.backend.world().objects_of(&env.id), 0);

    let detail = berth.platform.environment_detail(&berth.caller, &env.id).await.expect("detail");
    let provision: Vec<Step> = detail.steps.iter().filter(|s| s.phase == Phase::Provision).map(|s| s.step).collect();
    assert_eq!(
        provision,
        [Step::ConfigurePartition, Step::PullImage, Step::StartWorkload, Step::WaitHealthy, Step::ExposeEndpoint]
    );
    assert!(detail.steps.iter().all(|s| s.status == "succeeded" && s.attempts == 1 && s.finished_at.is_some()));
    assert_eq!(detail.steps.last().map(|s| s.step), Some(Step::ReleaseCapacity));
    assert!(detail.units.iter().all(|u| u.released_at.is_some()));
    assert_eq!(detail.units[0].mig_profile.as_deref(), Some("1g.10gb"));
}

#[sqlx::test(migrations = "../migrations")]
async fn a_failing_step_ends_failed_with_its_reason_and_releases_capacity(pool: SqlitePool) {
    let berth = TestBerth::with_faults(pool, vec![fault("start_workload=fail")]).await;
    let env = berth.launch("training", "h100-1", "trainer").await.expect("launch");
    let failed = berth.wait_for(&env.id, EnvState::Failed).await;
    assert_eq!(failed.failure_reason.as_deref(), Some("Start workload failed: simulated fault in start_workload"));
    assert_eq!(berth.held_reservations().await, 0);
    assert_eq!(berth.backend.world().objects_of(&env.id), 0);
    // The capacity really is free again: the same size fits on the same fleet 4 times.
    berth.backend.set_faults(vec![]);
    for i in 0..4 {
        berth.launch("training", "h100-1", &format!("again-{i}")).await.expect("capacity is free again");
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn a_hanging_step_times_out_and_is_torn_down(pool: SqlitePool) {
    let berth = TestBerth::with_faults(pool, vec![fault("pull_image=hang")]).await;
    let env = berth.launch("inference", "l40s-1", "server").await.expect("launch");
    let failed = berth.wait_for(&env.id, EnvState::Failed).await;
    assert_eq!(failed.failure_reason.as_deref(), Some("Pull container image failed: did not finish within 0 s"));
    assert_eq!(berth.held_reservations().await, 0);
}

#[sqlx::test(migrations = "../migrations")]
async fn stopping_during_a_hung_step_cancels_it_at_once(pool: SqlitePool) {
    let berth = TestBerth::with_faults(pool, vec![fault("wait_healthy=hang")]).await;
    let env = berth.launch("notebook", "l40s-1", "slow").await.expect("launch");
    wait_until_running(&berth, &env.id, Step::WaitHealthy).await;
    berth.platform.stop(&berth.caller, &env.id).await.expect("stop");
    let released = berth.wait_for(&env.id, EnvState::Released).await;
    assert_eq!(released.failure_reason, None, "a stop is not a failure");
    let detail = berth.platform.environment_detail(&berth.caller, &env.id).await.expect("detail");
    assert!(detail.steps.iter().any(|s| s.detail.as_deref() == Some("cancelled: the owner stopped the environment")));
    assert_eq!(berth.held_reservations().await, 0);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_failing_teardown_step_is_retried_until_it_succeeds(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let env = berth.launch("notebook", "l40s-1", "sticky").await.expect("launch");
    berth.wait_for(&env.id, EnvState::Ready).await;
    berth.backend.set_faults(vec![fault("stop_workload=fail")]);
    berth.platform.stop(&berth.caller, &env.id).await.expect("stop");
    berth.wait_for(&env.id, EnvState::TearingDown).await;
    // Until the stop step has failed at least once (no fixed sleep: a loaded machine is slow).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let detail = berth.platform.environment_detail(&berth.caller, &env.id).await.expect("detail");
        if detail.steps.iter().any(|s| s.step == Step::StopWorkload && s.status == "failed") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the stop step never failed: {:?}", detail.steps);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(berth.platform.environment_of(&berth.caller, &env.id).await.expect("env").state, EnvState::TearingDown);
    assert_eq!(berth.held_reservations().await, 1, "capacity stays held while the workload may still run");
    berth.backend.set_faults(vec![]);
    berth.wait_for(&env.id, EnvState::Released).await;
    let detail = berth.platform.environment_detail(&berth.caller, &env.id).await.expect("detail");
    let stop = detail.steps.iter().find(|s| s.step == Step::StopWorkload).expect("stop step");
    assert!(stop.attempts > 1 && stop.status == "succeeded", "{stop:?}");
}

#[sqlx::test(migrations = "../migrations")]
async fn the_end_of_the_window_tears_down(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let env = berth.launch("notebook", "l40s-1", "short").await.expect("launch");
    berth.wait_for(&env.id, EnvState::Ready).await;
    sqlx::query("UPDATE environments SET ends_at = ? WHERE id = ?")
        .bind(berth_platform::now_ms() - 1)
        .bind(&env.id)
        .execute(berth.platform.db())
        .await
        .expect("shorten window");
    berth.wait_for(&env.id, EnvState::Released).await;
}

#[sqlx::test(migrations = "../migrations")]
async fn stopping_twice_is_refused_with_a_reason(pool: SqlitePool) {
    // Teardown hangs until the second stop has been tried, so the first is still under way.
    let berth = TestBerth::with_faults(pool, vec![fault("stop_workload=hang")]).await;
    let env = berth.launch("notebook", "l40s-1", "once").await.expect("launch");
    berth.platform.stop(&berth.caller, &env.id).await.expect("first stop");
    let again = berth.platform.stop(&berth.caller, &env.id).await;
    assert!(matches!(again, Err(Error::Refused(Refusal::NotStoppable("stopping")))), "{again:?}");
    berth.backend.set_faults(vec![]);
    berth.wait_for(&env.id, EnvState::Released).await;
    let after = berth.platform.stop(&berth.caller, &env.id).await.expect_err("released");
    assert_eq!(after.to_string(), "this environment is already released; there is nothing to stop");
}

#[sqlx::test(migrations = "../migrations")]
async fn refusals_write_nothing(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let bad_name = berth.launch("notebook", "l40s-1", "Bad Name").await.expect_err("bad name");
    assert!(bad_name.to_string().contains("lowercase"));
    let too_big = berth.launch("cluster", "h100-node-2", "big").await.expect("two nodes fit");
    let none_left = berth.launch("training", "h100-1", "more").await.expect_err("fleet is full");
    assert!(
        none_left.to_string().starts_with(
            "no capacity for 1 x H100-80GB right now: no node has 1 free H100-80GB GPUs together (the most free on one node is 0). Instead: the earliest start for 2 h is "
        ),
        "{none_left}"
    );
    let envs: i64 =
        sqlx::query_scalar("SELECT count(*) FROM environments").fetch_one(berth.platform.db()).await.expect("count");
    assert_eq!(envs, 1, "only {} was written", too_big.name);
    let dup = berth.launch("notebook", "l40s-1", "big").await.expect_err("name in use");
    assert!(dup.to_string().contains("already have an active environment called \"big\""));
}

#[sqlx::test(migrations = "../migrations")]
async fn someone_elses_environment_is_not_found(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let env = berth.launch("notebook", "l40s-1", "mine").await.expect("launch");
    let eve = berth.user_with("eve@example.com", Role::Member).await;
    assert!(matches!(berth.platform.environment_of(&eve, &env.id).await, Err(Error::NotFound)));
    assert!(matches!(berth.platform.stop(&eve, &env.id).await, Err(Error::NotFound)));
    assert!(matches!(berth.platform.environment_of(&eve, "no-such-id").await, Err(Error::NotFound)));
    assert!(berth.platform.environments_of_owner_between(&eve, 0, i64::MAX).await.expect("list").is_empty());
    let owner = &berth.caller;
    let mine = berth.platform.environments_of_owner_between(owner, 0, i64::MAX).await.expect("list");
    assert_eq!(mine.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), [env.id.as_str()]);
    let (starts, ends) = (env.starts_at, env.ends_at);
    assert!(berth.platform.environments_of_owner_between(owner, ends, ends + 1).await.expect("after").is_empty());
    assert!(berth.platform.environments_of_owner_between(owner, 0, starts).await.expect("before").is_empty());
}

/// The reconciler is killed after each step in turn; a fresh one always converges, and
/// the simulated world ends with exactly one workload and nothing leaked.
#[sqlx::test(migrations = "../migrations")]
async fn a_reconciler_killed_between_steps_converges_after_restart(pool: SqlitePool) {
    let mut berth = TestBerth::new(pool).await;
    let env = berth.launch("inference", "h100-3g.40gb", "resilient").await.expect("launch");
    for steps_before_kill in 1..=5 {
        wait_for_steps(&berth, &env.id, steps_before_kill).await;
        berth.kill_reconciler().await;
        berth.start_reconciler();
    }
    let ready = berth.wait_for(&env.id, EnvState::Ready).await;
    assert!(ready.connection.is_some());
    let world = berth.backend.world();
    assert_eq!(world.workloads.len(), 1);
    assert_eq!(world.partitions.len(), 1);

    berth.platform.stop(&berth.caller, &env.id).await.expect("stop");
    for steps_before_kill in 1..=3 {
        wait_for_teardown_steps(&berth, &env.id, steps_before_kill).await;
        berth.kill_reconciler().await;
        berth.start_reconciler();
    }
    berth.wait_for(&env.id, EnvState::Released).await;
    assert_eq!(berth.backend.world().objects_of(&env.id), 0);
    assert_eq!(berth.held_reservations().await, 0);
}

async fn wait_until_running(berth: &TestBerth, id: &str, step: Step) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let detail = berth.platform.environment_detail(&berth.caller, id).await.expect("detail");
        if detail.steps.iter().any(|s| s.step == step && s.status == "running") {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{step:?} never started; steps: {:#?}", detail.steps);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn wait_for_steps(berth: &TestBerth, id: &str, n: usize) {
    wait_for_phase_steps(berth, id, Phase::Provision, n).await
}

async fn wait_for_teardown_steps(berth: &TestBerth, id: &str, n: usize) {
    wait_for_phase_steps(berth, id, Phase::Teardown, n).await
}

async fn wait_for_phase_steps(berth: &TestBerth, id: &str, phase: Phase, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let detail = berth.platform.environment_detail(&berth.caller, id).await.expect("detail");
        let done = detail.steps.iter().filter(|s| s.phase == phase && s.status == "succeeded").count();
        if done >= n {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!(
                "{n} {phase:?} steps never finished; state {}, steps: {:#?}",
                detail.environment.state, detail.steps
            );
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
