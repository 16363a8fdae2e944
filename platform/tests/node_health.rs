//! Nodes' health lifecycle as operators and bookers see it: acceptance before bookings,
//! a failed check degrading a node, repairs up the tiers, draining, retirement, and who
//! may run checks.
#![allow(clippy::expect_used, clippy::unwrap_used)] // helpers of tests stop the test with their message

mod common;

use berth_domain::Refusal;
use berth_domain::fleet::FleetSpec;
use berth_domain::lifecycle::EnvState;
use berth_domain::node_checks::CheckKind;
use berth_domain::node_health::NodeState;
use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use berth_platform::{Caller, Error};
use common::{TestBerth, test_meta};
use sqlx::SqlitePool;

/// One A100 node that arrives needing acceptance, and two 8-GPU H100 nodes with
/// InfiniBand for dedicated clusters (the small fleet's 2-GPU H100 nodes leave service, so
/// a cluster lands on a node with InfiniBand).
fn fleet_with_arrivals() -> FleetSpec {
    let fleet = r#"
[[site]]
name = "test-1"
[[site.pool]]
prefix = "a100"
model = "A100-80GB"
nodes = 1
gpus_per_node = 8
nvlink = true
acceptance = true
[[site.pool]]
prefix = "big"
model = "H100-80GB"
nodes = 2
gpus_per_node = 8
nvlink = true
ib_rails = 8
"#;
    FleetSpec::parse(fleet).expect("fleet")
}

async fn berth_with_arrivals(pool: SqlitePool) -> TestBerth {
    let berth = TestBerth::new(pool).await;
    berth.platform.sync_fleet(&fleet_with_arrivals()).await.expect("sync");
    berth
}

async fn state_of(berth: &TestBerth, node: &str) -> (String, i64) {
    sqlx::query_as("SELECT state, repair_tier FROM nodes WHERE name = ?")
        .bind(node)
        .fetch_one(berth.platform.db())
        .await
        .expect("node")
}

/// Unreleased reservations on `node`.
async fn reservations_on(berth: &TestBerth, node: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM reservations r JOIN gpus g ON g.id = r.gpu_id JOIN nodes n ON n.id = g.node_id
         WHERE n.name = ? AND r.released_at IS NULL",
    )
    .bind(node)
    .fetch_one(berth.platform.db())
    .await
    .expect("count")
}

/// The node's health once what a repair started in the background (its command, then
/// acceptance) has ended: out of repair and testing, no check run open.
async fn settled(
    berth: &TestBerth,
    admin: &Caller,
    node: &str,
) -> berth_platform::provisioning::node_health::NodeHealth {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let health = berth.platform.node_health(admin, node).await.expect("health");
        let open = health.runs.iter().any(|r| r.finished_at.is_none());
        if !open && !matches!(health.status.state, NodeState::InRepair | NodeState::Testing) {
            return health;
        }
        assert!(tokio::time::Instant::now() < deadline, "{node} never settled: {:?}", health.status);
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

fn no_capacity(result: Result<berth_platform::capacity::environments::Environment, Error>) -> bool {
    matches!(result, Err(Error::Refused(Refusal::NoCapacity { .. })))
}

#[sqlx::test(migrations = "../migrations")]
async fn a_node_failing_acceptance_never_takes_a_booking_and_does_after_repair(pool: SqlitePool) {
    let berth = berth_with_arrivals(pool).await;
    let admin = berth.admin().await;
    assert_eq!(state_of(&berth, "a100-01").await, ("new".into(), 0), "a pool with acceptance starts new");
    assert_eq!(state_of(&berth, "big-01").await.0, "available", "other fleet nodes start in service");
    assert!(no_capacity(berth.launch("training", "a100-8", "too-early").await), "a new node takes no booking");

    berth.backend.fail_check("a100-01", CheckKind::NcclBandwidth);
    let run = berth.platform.run_node_checks(&admin, "a100-01", "medium").await.expect("acceptance");
    assert_eq!((run.purpose.as_str(), run.passed), ("acceptance", Some(false)));
    let nccl = run.results.iter().find(|r| r.kind == "nccl_bandwidth").expect("the NCCL check ran");
    assert!(!nccl.passed);
    assert_eq!(nccl.threshold, Some(230.0 * 0.9), "A100 over NVLink: 90% of 230 GB/s");
    assert!(nccl.measured.unwrap() < 207.0, "{nccl:?}");
    assert!(nccl.raw_output.contains("# Avg bus bandwidth"), "the raw output is kept");
    assert!(run.results.iter().filter(|r| r.kind != "nccl_bandwidth").all(|r| r.passed), "{:?}", run.results);
    assert_eq!(state_of(&berth, "a100-01").await, ("degraded".into(), 0));
    assert!(no_capacity(berth.launch("training", "a100-8", "on-degraded").await), "a degraded node takes nothing");
    assert_eq!(reservations_on(&berth, "a100-01").await, 0);

    // Tier 1 is a command (a GPU reset), which fixes the simulated node; acceptance follows,
    // both in the background: the answer comes once the node is in repair.
    let health = berth
        .platform
        .change_node_state(&admin, "a100-01", "start_repair", "NCCL bandwidth low")
        .await
        .expect("repair");
    assert_eq!(health.status.state, NodeState::InRepair);
    let health = settled(&berth, &admin, "a100-01").await;
    assert_eq!(berth.backend.repairs_of("a100-01"), vec!["nvidia-smi --gpu-reset".to_owned()]);
    assert_eq!(health.status.state, NodeState::Available, "{:#?}", health.changes);
    assert_eq!(health.runs.len(), 2);
    assert_eq!(health.runs[0].passed, Some(true));
    // Newest first: passed, repair done (Berth), repair started (the admin), failed, testing.
    let moves: Vec<(NodeState, Option<String>)> = health.changes.iter().map(|c| (c.to, c.by.clone())).collect();
    let admin_email = Some("root@example.com".to_owned());
    assert_eq!(
        moves,
        vec![
            (NodeState::Available, None),
            (NodeState::Testing, None),
            (NodeState::InRepair, admin_email.clone()),
            (NodeState::Degraded, None),
            (NodeState::Testing, admin_email),
        ]
    );
    assert!(health.changes[3].reason.contains("nccl_bandwidth"), "{}", health.changes[3].reason);

    let env = berth.launch("training", "a100-8", "after-repair").await.expect("the repaired node takes bookings");
    berth.wait_for(&env.id, EnvState::Ready).await;
    assert_eq!(reservations_on(&berth, "a100-01").await, 8);
    let audited: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE action IN ('node.state', 'node.check') AND target = 'node:a100-01'",
    )
    .fetch_one(berth.platform.db())
    .await
    .unwrap();
    assert_eq!(audited, 5 + 2, "every change and every check run is audited");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_node_that_no_repair_fixes_climbs_every_tier_and_is_retired(pool: SqlitePool) {
    let berth = berth_with_arrivals(pool).await;
    let admin = berth.admin().await;
    berth.backend.fail_check("a100-01", CheckKind::MemoryErrors);
    berth.backend.make_stubborn("a100-01");
    berth.platform.run_node_checks(&admin, "a100-01", "quick").await.expect("acceptance");
    assert_eq!(state_of(&berth, "a100-01").await, ("degraded".into(), 0));
    let change = |event: &'static str| {
        let (platform, admin) = (berth.platform.clone(), admin.clone());
        async move { platform.change_node_state(&admin, "a100-01", event, "still failing").await }
    };
    // Tiers 1 and 2 are commands: each runs, acceptance fails again, degraded at that tier.
    for tier in 1..=2 {
        change("start_repair").await.expect("repair");
        settled(&berth, &admin, "a100-01").await;
        assert_eq!(state_of(&berth, "a100-01").await, ("degraded".into(), tier));
    }
    // Tier 3 (reimage) is manual: the node waits in repair until a person says how it went.
    let health = change("start_repair").await.expect("manual tier");
    assert_eq!((health.status.state, health.status.tier), (NodeState::InRepair, 3));
    assert_eq!(health.tier_name.as_deref(), Some("reimage"));
    let health = change("repair_done").await.expect("done, then acceptance");
    assert_eq!(health.status.state, NodeState::Testing, "acceptance runs in the background");
    assert_eq!(health.runs[0].passed, None, "the run is open while it goes on");
    settled(&berth, &admin, "a100-01").await;
    assert_eq!(state_of(&berth, "a100-01").await, ("degraded".into(), 3));
    change("start_repair").await.expect("tier 4");
    change("repair_failed").await.expect("the vendor gave up");
    assert_eq!(state_of(&berth, "a100-01").await, ("degraded".into(), 4));
    let health = change("start_repair").await.expect("no tier left");
    assert_eq!(health.status.state, NodeState::Retired);
    assert_eq!(berth.backend.repairs_of("a100-01").len(), 2, "manual tiers run no command");
    assert!(matches!(change("drain").await, Err(Error::Refused(Refusal::NodeTransition { .. }))));
    // A person brings it back: new again, so acceptance comes first.
    assert_eq!(change("reinstate").await.expect("reinstate").status.state, NodeState::New);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_draining_node_keeps_its_bookings_and_takes_nothing_new(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let admin = berth.admin().await;
    let first = berth.launch("training", "h100-1", "first").await.expect("launch");
    let node: String = sqlx::query_scalar(
        "SELECT n.name FROM reservations r JOIN gpus g ON g.id = r.gpu_id JOIN nodes n ON n.id = g.node_id
         WHERE r.environment_id = ?",
    )
    .bind(&first.id)
    .fetch_one(berth.platform.db())
    .await
    .unwrap();
    let health = berth.platform.change_node_state(&admin, &node, "drain", "firmware update").await.expect("drain");
    assert_eq!(health.status.state, NodeState::Draining);
    assert_eq!(health.bookings_now, 1);
    assert_eq!(health.changes[0].reason, "firmware update");
    // The other H100 node has two GPUs; nothing goes to the draining one.
    for name in ["second", "third"] {
        berth.launch("training", "h100-1", name).await.expect("the other node");
    }
    assert!(no_capacity(berth.launch("training", "h100-1", "fourth").await));
    assert_eq!(reservations_on(&berth, &node).await, 1);
    berth.wait_for(&first.id, EnvState::Ready).await;

    // Checks that take every GPU wait until nobody holds the node.
    let held = berth.platform.run_node_checks(&admin, &node, "medium").await;
    assert!(matches!(held, Err(Error::Refused(Refusal::NodeHeld(_)))), "{held:?}");
    assert!(berth.platform.change_node_state(&admin, &node, "drain", "again").await.is_err());
    berth.platform.change_node_state(&admin, &node, "return_to_service", "update postponed").await.expect("back");
    berth.launch("training", "h100-1", "fourth").await.expect("back in service");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_failed_check_on_demand_degrades_a_held_node_and_its_booking_keeps_running(pool: SqlitePool) {
    let berth = berth_with_arrivals(pool).await;
    let admin = berth.admin().await;
    let env = berth.launch("cluster", "h100-node-1", "cluster").await.expect("launch");
    berth.wait_for(&env.id, EnvState::Ready).await;
    let node = node_of(&berth, &env.id).await;
    berth.backend.fail_check(&node, CheckKind::Infiniband);
    let run = berth.platform.run_node_checks(&admin, &node, "quick").await.expect("quick on a held node");
    assert_eq!((run.purpose.as_str(), run.passed), ("on_demand", Some(false)));
    let ib = run.results.iter().find(|r| r.kind == "infiniband").expect("a node with InfiniBand gets ibstat");
    assert_eq!(ib.summary, "mlx5_2 port 1: Down/Polling at 10");
    assert_eq!(state_of(&berth, &node).await.0, "degraded");
    assert_eq!(berth.platform.environment_of(&berth.caller, &env.id).await.unwrap().state, EnvState::Ready);
    assert_eq!(reservations_on(&berth, &node).await, 8, "what the node holds stays");
    // Its owner is told why, with a link to the cluster.
    let told = berth.platform.inbox(&berth.caller).await.unwrap();
    let degraded: Vec<_> = told.items.iter().filter(|i| i.kind == "environment.node_degraded").collect();
    assert_eq!(degraded.len(), 1, "{:?}", told.items);
    assert_eq!(degraded[0].link, format!("/environments/{}", env.id));
    assert!(degraded[0].body.contains("mlx5_2 port 1: Down/Polling at 10"), "{}", degraded[0].body);
}

#[sqlx::test(migrations = "../migrations")]
async fn tenant_admins_check_only_nodes_their_dedicated_cluster_holds(pool: SqlitePool) {
    let berth = berth_with_arrivals(pool).await;
    let env = berth.launch("cluster", "h100-node-1", "cluster").await.expect("launch");
    // Its own acceptance step runs checks on the node first (one run at a time).
    berth.wait_for(&env.id, EnvState::Ready).await;
    let held = node_of(&berth, &env.id).await;
    let free = if held == "big-01" { "big-02" } else { "big-01" };
    let admin_a = berth.user_with("lead@example.com", Role::TenantAdmin).await;
    let member_a = berth.caller.clone();
    let tenant_b = berth.platform.ensure_tenant("globex", "Globex", Isolation::Soft).await.unwrap();
    let admin_b: Caller = berth
        .platform
        .create_user("boss@globex.example", "Boss", "a long passphrase", Role::TenantAdmin, Some(tenant_b))
        .await
        .unwrap()
        .caller(test_meta());

    let run = berth.platform.run_node_checks(&admin_a, &held, "quick").await.expect("their own node");
    assert_eq!((run.purpose.as_str(), run.passed), ("on_demand", Some(true)));
    for (who, node) in [(&admin_b, held.as_str()), (&admin_a, free), (&admin_a, "no-such-node")] {
        let refused = berth.platform.run_node_checks(who, node, "quick").await;
        assert!(matches!(refused, Err(Error::NotFound)), "{node}: {refused:?}");
    }
    let member = berth.platform.run_node_checks(&member_a, &held, "quick").await;
    assert!(matches!(member, Err(Error::Forbidden)), "{member:?}");
    let denials: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE action = 'fleet.check' AND outcome = 'denied'")
            .fetch_one(berth.platform.db())
            .await
            .unwrap();
    assert_eq!(denials, 3, "every denial on a node that exists is audited");
    assert!(matches!(berth.platform.change_node_state(&admin_a, &held, "drain", "mine").await, Err(Error::Forbidden)));
    assert!(matches!(berth.platform.node_health(&admin_a, &held).await, Err(Error::Forbidden)));
}

#[sqlx::test(migrations = "../migrations")]
async fn bad_input_is_refused_and_writes_nothing(pool: SqlitePool) {
    let berth = berth_with_arrivals(pool).await;
    let admin = berth.admin().await;
    let level = berth.platform.run_node_checks(&admin, "big-01", "extreme").await;
    assert!(matches!(level, Err(Error::Refused(Refusal::InvalidCheckLevel(_)))), "{level:?}");
    let reason = berth.platform.change_node_state(&admin, "big-01", "drain", "  ").await;
    assert!(matches!(reason, Err(Error::Refused(Refusal::InvalidReason(_)))), "{reason:?}");
    let event = berth.platform.change_node_state(&admin, "big-01", "acceptance_passed", "trust me").await;
    assert!(matches!(event, Err(Error::Refused(_))), "{event:?}");
    let missing = berth.platform.change_node_state(&admin, "nope", "drain", "why").await;
    assert!(matches!(missing, Err(Error::NotFound)));
    let writes: i64 =
        sqlx::query_scalar("SELECT (SELECT count(*) FROM node_state_changes) + (SELECT count(*) FROM node_check_runs)")
            .fetch_one(berth.platform.db())
            .await
            .unwrap();
    assert_eq!(writes, 0);
    assert_eq!(state_of(&berth, "big-01").await.0, "available");
}

#[sqlx::test(migrations = "../migrations")]
async fn the_database_keeps_state_changes_true_and_append_only(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let admin = berth.admin().await;
    let db = berth.platform.db();
    let untrue = sqlx::query(
        "INSERT INTO node_state_changes (node_id, from_state, to_state, repair_tier, event, reason, changed_at)
         SELECT id, 'available', 'retired', 0, 'retire', 'sneaky', 0 FROM nodes WHERE name = 'h100-01'",
    )
    .execute(db)
    .await;
    assert!(untrue.is_err(), "a change row must describe the node's state");
    berth.platform.change_node_state(&admin, "h100-01", "drain", "cabling").await.expect("drain");
    for statement in ["UPDATE node_state_changes SET reason = 'nothing'", "DELETE FROM node_state_changes"] {
        assert!(sqlx::query(statement).execute(db).await.is_err(), "{statement}");
    }
    let tiered = sqlx::query("UPDATE nodes SET repair_tier = 2 WHERE name = 'h100-02'").execute(db).await;
    assert!(tiered.is_err(), "an available node has no repair tier");
}

/// Random lifecycle moves, checks with injected failures, launches and stops on the two
/// H100 nodes: every booking that was placed sits on a node that was available when it
/// was placed (launches run one at a time here, so "now" is "when it was placed").
#[sqlx::test(migrations = "../migrations")]
async fn random_moves_never_place_a_booking_on_a_node_that_is_not_available(pool: SqlitePool) {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    let berth = TestBerth::new(pool).await;
    let admin = berth.admin().await;
    let mut rng = StdRng::seed_from_u64(16);
    let nodes = ["h100-01", "h100-02"];
    // Recovery is likelier than harm, so nodes come back and bookings keep being placed.
    let events = [
        "drain",
        "return_to_service",
        "return_to_service",
        "start_repair",
        "start_repair",
        "repair_done",
        "repair_done",
        "repair_failed",
        "retire",
        "reinstate",
        "reinstate",
    ];
    let mut live = Vec::new();
    let mut placed = 0;
    for i in 0..300 {
        let node = nodes[rng.random_range(0..nodes.len())];
        match rng.random_range(0..6) {
            0 => {
                let event = events[rng.random_range(0..events.len())];
                let _ = berth.platform.change_node_state(&admin, node, event, "random walk").await;
            }
            1 => {
                if rng.random_bool(0.2) {
                    berth.backend.fail_check(node, CheckKind::MemoryErrors);
                }
                let _ = berth.platform.run_node_checks(&admin, node, "quick").await;
            }
            2 if !live.is_empty() => {
                let id: String = live.swap_remove(rng.random_range(0..live.len()));
                if berth.platform.stop(&berth.caller, &id).await.is_ok() {
                    berth.wait_for(&id, EnvState::Released).await;
                }
            }
            _ => {
                let Ok(env) = berth.launch("training", "h100-1", &format!("walk-{i}")).await else { continue };
                placed += 1;
                let states: Vec<String> = sqlx::query_scalar(
                    "SELECT n.state FROM reservations r JOIN gpus g ON g.id = r.gpu_id JOIN nodes n ON n.id = g.node_id
                     WHERE r.environment_id = ?",
                )
                .bind(&env.id)
                .fetch_all(berth.platform.db())
                .await
                .unwrap();
                assert_eq!(states, ["available"], "step {i}: {} placed on a node that is not available", env.name);
                live.push(env.id);
            }
        }
    }
    assert!(placed >= 10, "the walk placed bookings ({placed})");
}

/// The one node a whole-node booking holds.
async fn node_of(berth: &TestBerth, environment_id: &str) -> String {
    sqlx::query_scalar(
        "SELECT DISTINCT n.name FROM reservations r JOIN gpus g ON g.id = r.gpu_id JOIN nodes n ON n.id = g.node_id
         WHERE r.environment_id = ?",
    )
    .bind(environment_id)
    .fetch_one(berth.platform.db())
    .await
    .unwrap()
}

#[sqlx::test(migrations = "../migrations")]
async fn a_dedicated_cluster_starts_only_after_its_nodes_pass_acceptance(pool: SqlitePool) {
    use berth_domain::lifecycle::Step;
    let berth = berth_with_arrivals(pool).await;
    let admin = berth.admin().await;
    let env = berth.launch("cluster", "h100-node-1", "cluster").await.expect("launch");
    berth.wait_for(&env.id, EnvState::Ready).await;
    let node = node_of(&berth, &env.id).await;

    // Its page shows the step first, with the run that passed.
    let detail = berth.platform.environment_detail(&berth.caller, &env.id).await.unwrap();
    let first = &detail.steps[0];
    assert_eq!((first.step, first.status.as_str()), (Step::AcceptanceChecks, "succeeded"));
    let said = first.detail.clone().unwrap_or_default();
    assert!(said.starts_with(&format!("quick acceptance checks passed on {node} (check run ")), "{said}");

    // The node stayed available (the cluster holds it), its run kept as acceptance by Berth.
    let health = berth.platform.node_health(&admin, &node).await.unwrap();
    assert_eq!(health.status.state, NodeState::Available);
    assert_eq!((health.runs[0].purpose.as_str(), health.runs[0].passed), ("acceptance", Some(true)));
    assert_eq!(health.runs[0].requested_by, None);
    // (A later booking of the node is taken meanwhile: `booking.rs`, as soon as possible.)
    assert!(health.changes.is_empty(), "{:?}", health.changes);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_node_failing_acceptance_is_not_handed_to_the_cluster(pool: SqlitePool) {
    let berth = berth_with_arrivals(pool).await;
    let admin = berth.admin().await;
    for node in ["big-01", "big-02"] {
        berth.backend.fail_check(node, CheckKind::GpuDiagnostics);
    }
    let env = berth.launch("cluster", "h100-node-1", "cluster").await.expect("launch");
    let node = node_of(&berth, &env.id).await;
    let failed = berth.wait_for(&env.id, EnvState::Failed).await;
    let reason = failed.failure_reason.unwrap_or_default();
    assert!(
        reason.starts_with(&format!("Run acceptance checks on its nodes failed: {node} failed acceptance (check run ")),
        "{reason}"
    );
    assert!(reason.ends_with("the cluster is not started on it"), "{reason}");
    assert_eq!(berth.held_reservations().await, 0, "its capacity went back");

    // The node is degraded and takes nothing new; the owner was told why.
    assert_eq!(state_of(&berth, &node).await.0, "degraded");
    assert_eq!(berth.platform.node_health(&admin, &node).await.unwrap().runs[0].passed, Some(false));
    let told = berth.platform.inbox(&berth.caller).await.unwrap();
    let kinds: Vec<&str> = told.items.iter().map(|i| i.kind.as_str()).collect();
    assert!(kinds.contains(&"environment.node_degraded") && kinds.contains(&"environment.failed"), "{kinds:?}");
}

/// Waits until `check` holds of the cluster's page, failing the test after 20 s (a
/// placement with no node free is tried again every 5 s).
async fn wait_until(
    berth: &TestBerth,
    id: &str,
    check: impl Fn(&berth_platform::provisioning::journal::EnvironmentDetail) -> bool,
) -> berth_platform::provisioning::journal::EnvironmentDetail {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let detail = berth.platform.environment_detail(&berth.caller, id).await.expect("detail");
        if check(&detail) {
            return detail;
        }
        assert!(tokio::time::Instant::now() < deadline, "never came: {:#?}", detail.node_replacements);
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn a_cluster_losing_a_node_gets_a_healthy_one_for_the_rest_of_its_window(pool: SqlitePool) {
    let berth = berth_with_arrivals(pool).await;
    let admin = berth.admin().await;
    // A hard tenant's cluster: its nodes are its own, before and after.
    let tenant = berth.caller.tenant_id().unwrap();
    berth.platform.set_tenant_isolation(&admin, tenant, "hard").await.expect("hard");
    let env = berth.launch("cluster", "h100-node-1", "cluster").await.expect("launch");
    berth.wait_for(&env.id, EnvState::Ready).await;
    let failed = node_of(&berth, &env.id).await;
    let other = if failed == "big-01" { "big-02" } else { "big-01" };

    // A check on demand fails: the node is degraded, and Berth moves the cluster.
    berth.backend.fail_check(&failed, CheckKind::GpuDiagnostics);
    berth.platform.run_node_checks(&admin, &failed, "quick").await.expect("check");
    let detail = wait_until(&berth, &env.id, |d| d.node_replacements.iter().any(|r| r.moved_at.is_some())).await;
    let replaced = &detail.node_replacements[0];
    assert_eq!((replaced.failed_node.as_str(), replaced.replacement.as_deref()), (failed.as_str(), Some(other)));
    assert!(replaced.reason.contains("gpu_diagnostics"), "{}", replaced.reason);
    assert_eq!(replaced.problem, None);

    // It runs on the new node only, until its own end; the failed node's GPUs are released.
    let held: Vec<&str> = detail.units.iter().filter(|u| u.released_at.is_none()).map(|u| u.node.as_str()).collect();
    assert_eq!(held, [other; 8]);
    assert_eq!(reservations_on(&berth, &failed).await, 0);
    let ends: Vec<i64> = sqlx::query_scalar("SELECT ends_at FROM reservations WHERE released_at IS NULL")
        .fetch_all(berth.platform.db())
        .await
        .unwrap();
    assert!(ends.iter().all(|&end| end == env.ends_at), "{ends:?} vs {}", env.ends_at);
    assert_eq!(detail.environment.state, EnvState::Ready);
    assert_eq!(common::overlapping_reservations(berth.platform.db()).await, 0);
    assert_eq!(common::tenants_sharing_nodes(berth.platform.db()).await, 0);

    // Its owner was told which node took over; it is audited.
    let told = berth.platform.inbox(&berth.caller).await.unwrap();
    let title = format!("cluster: {other} replaces {failed}");
    assert!(
        told.items.iter().any(|i| i.title == title && i.link == format!("/environments/{}", env.id)),
        "{:?}",
        told.items
    );
    let audited: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE action = 'cluster.replace_node'")
        .fetch_one(berth.platform.db())
        .await
        .unwrap();
    assert_eq!(audited, 1);

    // Stopping it releases the rest exactly once.
    berth.platform.stop(&berth.caller, &env.id).await.expect("stop");
    berth.wait_for(&env.id, EnvState::Released).await;
    assert_eq!(berth.held_reservations().await, 0);
}

#[sqlx::test(migrations = "../migrations")]
async fn with_no_node_free_the_cluster_keeps_running_and_is_moved_once_one_is(pool: SqlitePool) {
    let berth = berth_with_arrivals(pool).await;
    let admin = berth.admin().await;
    let env = berth.launch("cluster", "h100-node-1", "cluster").await.expect("launch");
    let busy = berth.launch("cluster", "h100-node-1", "busy").await.expect("the other node");
    berth.wait_for(&env.id, EnvState::Ready).await;
    berth.wait_for(&busy.id, EnvState::Ready).await;
    let failed = node_of(&berth, &env.id).await;
    let other = node_of(&berth, &busy.id).await;

    berth.backend.fail_check(&failed, CheckKind::GpuDiagnostics);
    berth.platform.run_node_checks(&admin, &failed, "quick").await.expect("check");
    let detail = wait_until(&berth, &env.id, |d| !d.node_replacements.is_empty()).await;
    let waiting = &detail.node_replacements[0];
    assert_eq!((waiting.replacement.as_deref(), waiting.moved_at), (None, None));
    // "busy" ends with it: no node is free before the cluster's end.
    assert_eq!(waiting.next_free_at, None, "{waiting:?}");
    assert_eq!(reservations_on(&berth, &failed).await, 8, "it keeps running where it is");
    let told = berth.platform.inbox(&berth.caller).await.unwrap();
    let lost = told.items.iter().find(|i| i.title == format!("cluster lost {failed}")).expect("told");
    assert!(lost.body.contains("none of its kind is free before the cluster's window ends"), "{}", lost.body);

    // The other booking ends early: its node is free, and the cluster moves there.
    berth.platform.stop(&berth.caller, &busy.id).await.expect("stop");
    berth.wait_for(&busy.id, EnvState::Released).await;
    let detail = wait_until(&berth, &env.id, |d| d.node_replacements[0].moved_at.is_some()).await;
    assert_eq!(detail.node_replacements[0].replacement.as_deref(), Some(other.as_str()));
    assert_eq!(reservations_on(&berth, &failed).await, 0);
    assert_eq!(reservations_on(&berth, &other).await, 8);
}

#[sqlx::test(migrations = "../migrations")]
async fn checks_cut_short_by_a_stop_fail_acceptance_at_the_next_start(pool: SqlitePool) {
    let berth = berth_with_arrivals(pool).await;
    let admin = berth.admin().await;
    // Slow checks, so the acceptance is caught midway.
    berth.backend.set_speed(100.0);
    let platform = berth.platform.clone();
    let caller = admin.clone();
    let running = tokio::spawn(async move { platform.run_node_checks(&caller, "a100-01", "quick").await });
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while state_of(&berth, "a100-01").await.0 != "testing" {
        assert!(tokio::time::Instant::now() < deadline, "acceptance never started");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // Berth stops with the checks running: nothing of them is left but the node's state.
    running.abort();
    let _ = running.await;
    berth.backend.set_speed(0.0);

    // At the next start the node fails its acceptance, says why, and takes nothing.
    assert_eq!(berth.platform.end_interrupted_checks().await.unwrap(), ["a100-01"]);
    let health = berth.platform.node_health(&admin, "a100-01").await.unwrap();
    assert_eq!(health.status.state, NodeState::Degraded);
    assert!(health.changes[0].reason.contains("cut short"), "{}", health.changes[0].reason);
    assert_eq!(health.changes[0].by, None);
    assert!(berth.platform.end_interrupted_checks().await.unwrap().is_empty(), "once");

    // A repair runs acceptance again, and the node is taken into service.
    berth.platform.change_node_state(&admin, "a100-01", "start_repair", "after the restart").await.unwrap();
    settled(&berth, &admin, "a100-01").await;
    assert_eq!(state_of(&berth, "a100-01").await.0, "available");
}

/// A GPU reset is a platform admin's repair: only on a GPU that holds no booking now or
/// soon, only a GPU the node has; done by the backend (recorded on the simulated fleet) and
/// audited.
#[sqlx::test(migrations = "../migrations")]
async fn a_gpu_is_reset_only_by_a_platform_admin_and_only_when_nothing_runs_on_it(pool: SqlitePool) {
    let berth = berth_with_arrivals(pool).await;
    let admin = berth.admin().await;
    let printed = berth.platform.reset_gpu(&admin, "big-01", 3).await.expect("reset");
    assert!(printed.contains("was successfully reset"), "{printed}");
    assert_eq!(berth.backend.repairs_of("big-01"), vec!["nvidia-smi -i 3 -r".to_owned()]);

    let missing = berth.platform.reset_gpu(&admin, "big-01", 8).await;
    assert!(
        matches!(&missing, Err(Error::Refused(r @ Refusal::NoSuchGpu { .. })) if r.to_string() == "big-01 has GPUs 0 to 7; there is no GPU 8"),
        "{missing:?}"
    );
    assert!(matches!(berth.platform.reset_gpu(&admin, "no-such-node", 0).await, Err(Error::NotFound)));
    let tenant_admin = berth.user_with("ta@example.com", Role::TenantAdmin).await;
    assert!(matches!(berth.platform.reset_gpu(&tenant_admin, "big-01", 3).await, Err(Error::Forbidden)));
    assert!(matches!(berth.platform.reset_gpu(&berth.caller, "big-01", 3).await, Err(Error::Forbidden)));

    // A whole node booked now: none of its GPUs is reset, and the backend is not asked.
    let env = berth.launch("cluster", "h100-node-1", "holds-a-node").await.expect("booked");
    let node = node_of(&berth, &env.id).await;
    let busy = berth.platform.reset_gpu(&admin, &node, 0).await;
    assert!(matches!(&busy, Err(Error::Refused(Refusal::GpuInUse { .. }))), "{busy:?}");
    assert_eq!(berth.backend.repairs_of(&node).len(), usize::from(node == "big-01"), "nothing more was reset");
    let audited: Vec<(String, String)> =
        sqlx::query_as("SELECT outcome, detail FROM audit_events WHERE action = 'node.gpu_reset' ORDER BY id")
            .fetch_all(berth.platform.db())
            .await
            .expect("audit");
    assert_eq!(audited, [("success".to_owned(), "GPU 3 reset".to_owned())]);
}

/// People start checks and get the run back at once, open; a second run on the node waits
/// for the first; the run's results and verdict show on the node once it has ended.
#[sqlx::test(migrations = "../migrations")]
async fn checks_started_by_a_person_run_in_the_background_one_run_at_a_time(pool: SqlitePool) {
    let berth = berth_with_arrivals(pool).await;
    let admin = berth.admin().await;
    berth.backend.set_speed(1.0);
    let run = berth.platform.start_node_checks(&admin, "a100-01", "quick").await.expect("started");
    assert_eq!((run.purpose.as_str(), run.passed, run.finished_at), ("acceptance", None, None));
    assert!(run.results.is_empty());
    assert_eq!(run.requested_by.as_deref(), Some("root@example.com"));
    assert_eq!(state_of(&berth, "a100-01").await.0, "testing", "the node tests while the run goes on");

    let again = berth.platform.start_node_checks(&admin, "a100-01", "quick").await;
    assert!(matches!(&again, Err(Error::Refused(Refusal::NodeTransition { .. }))), "{again:?}");
    // On a node a cluster holds, checks are on demand: a second run is refused while the
    // first goes on.
    berth.backend.set_speed(0.0);
    let env = berth.launch("cluster", "h100-node-1", "held").await.expect("launch");
    berth.wait_for(&env.id, EnvState::Ready).await;
    berth.backend.set_speed(1.0);
    let held = node_of(&berth, &env.id).await;
    let first = berth.platform.start_node_checks(&admin, &held, "quick").await.expect("on demand");
    assert_eq!(first.purpose, "on_demand");
    let second = berth.platform.start_node_checks(&admin, &held, "quick").await;
    let running = format!("checks are running on {held} already (check run {}); wait for them to finish", first.id);
    assert!(
        matches!(&second, Err(Error::Refused(r @ Refusal::ChecksRunning { .. })) if r.to_string() == running),
        "{second:?}"
    );

    let health = settled(&berth, &admin, "a100-01").await;
    assert_eq!(health.status.state, NodeState::Available);
    assert_eq!((health.runs[0].id, health.runs[0].passed), (run.id, Some(true)));
    assert_eq!(health.runs[0].results.len(), 3, "{:?}", health.runs[0].results);
    let health = settled(&berth, &admin, &held).await;
    assert_eq!(health.runs[0].passed, Some(true));
    berth.platform.start_node_checks(&admin, &held, "quick").await.expect("once the first has ended");
}

/// On a node a cluster holds, a check that cannot run at all (its GPUs are the tenant's)
/// is recorded as failed with why, and leaves the node in service; one that runs and finds
/// a fault degrades it.
#[sqlx::test(migrations = "../migrations")]
async fn a_check_that_cannot_run_on_a_held_node_does_not_degrade_it(pool: SqlitePool) {
    let berth = berth_with_arrivals(pool).await;
    let admin = berth.admin().await;
    let env = berth.launch("cluster", "h100-node-1", "held").await.expect("launch");
    berth.wait_for(&env.id, EnvState::Ready).await;
    let held = node_of(&berth, &env.id).await;
    berth.backend.make_check_unrunnable(&held, CheckKind::GpuDiagnostics);
    let run = berth.platform.run_node_checks(&admin, &held, "quick").await.expect("on demand");
    assert_eq!((run.purpose.as_str(), run.passed), ("on_demand", Some(false)));
    assert!(run.results[0].summary.contains("could not run: the check's pod did not run"), "{:?}", run.results[0]);
    assert_eq!(state_of(&berth, &held).await.0, "available", "a check that did not run says nothing of the node");

    berth.backend.fail_check(&held, CheckKind::MemoryErrors);
    berth.platform.run_node_checks(&admin, &held, "quick").await.expect("on demand");
    assert_eq!(state_of(&berth, &held).await.0, "degraded", "a check that ran and failed does");
}
