//! Node agents reporting inventory and health: what the database, placement and the audit
//! log show afterwards, and who may report at all.
#![allow(clippy::expect_used, clippy::unwrap_used)] // helpers of tests stop the test with their message

mod common;

use berth_domain::Refusal;
use berth_domain::agent::{GpuReport, MISSING_NOTE, NodeReport};
use berth_domain::fleet::FleetSpec;
use berth_domain::policy::Role;
use berth_platform::Error;
use common::{TestBerth, test_meta};
use sqlx::SqlitePool;

/// One DGX-style node of 8 H100s, and nothing else to place on.
const DGX_FLEET: &str = r#"
[[site]]
name = "test-1"
[[site.pool]]
prefix = "dgx"
model = "H100-80GB"
nodes = 1
gpus_per_node = 8
nvlink = true
"#;

async fn dgx_berth(pool: SqlitePool) -> TestBerth {
    let berth = TestBerth::new(pool).await;
    berth.platform.sync_fleet(&FleetSpec::parse(DGX_FLEET).expect("fleet")).await.expect("sync");
    berth
}

fn h100(index: i64) -> GpuReport {
    GpuReport {
        index,
        uuid: format!("GPU-8f2c-{index}"),
        name: "NVIDIA H100 80GB HBM3".into(),
        memory_mib: 81_559,
        mig_enabled: false,
        mig_pending: Some(false),
        mig_instances: Some(0),
        ecc_uncorrected: Some(0),
        temperature_c: Some(41),
        power_w: Some(118),
        utilization_pct: Some(0),
        memory_used_mib: Some(512),
        xid_errors: Vec::new(),
        mig_readings: Vec::new(),
    }
}

fn report(gpus: Vec<GpuReport>) -> NodeReport {
    NodeReport { agent_version: "0.1.0".into(), gpus, period_s: None }
}

/// Health and note of each GPU of dgx-01, by index.
async fn health(berth: &TestBerth) -> Vec<(String, Option<String>)> {
    sqlx::query_as(
        "SELECT g.health, g.health_note FROM gpus g JOIN nodes n ON n.id = g.node_id WHERE n.name = 'dgx-01' ORDER BY g.idx",
    )
    .fetch_all(berth.platform.db())
    .await
    .expect("health")
}

async fn audited(berth: &TestBerth, action: &str, outcome: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE action = ? AND outcome = ?")
        .bind(action)
        .bind(outcome)
        .fetch_one(berth.platform.db())
        .await
        .expect("count")
}

#[sqlx::test(migrations = "../migrations")]
async fn uncorrected_ecc_errors_fail_a_gpu_and_placement_stops_using_it(pool: SqlitePool) {
    let berth = dgx_berth(pool).await;
    let admin = berth.admin().await;
    let (token, secret) = berth.platform.create_node_token(&admin, "dgx-01").await.expect("node token");
    assert!(secret.starts_with("berth_node_"));
    let stored: String = sqlx::query_scalar("SELECT secret_hash FROM node_tokens WHERE id = ?")
        .bind(token.id)
        .fetch_one(berth.platform.db())
        .await
        .expect("token row");
    assert!(!stored.contains(&secret[11..]), "only a hash of the secret is kept");

    let mut gpus: Vec<GpuReport> = (0..8).map(h100).collect();
    gpus[5].ecc_uncorrected = Some(2);
    let receipt = berth.platform.report_node(&secret, &report(gpus.clone()), test_meta()).await.expect("report");
    assert_eq!(receipt.node, "dgx-01");
    assert_eq!(receipt.changes, ["gpu 5: failed: 2 uncorrected ECC errors"]);

    let mut expected = vec![("healthy".to_owned(), None); 8];
    expected[5] = ("failed".into(), Some("2 uncorrected ECC errors".into()));
    assert_eq!(health(&berth).await, expected);
    let (uuid, temperature, seen): (String, i64, Option<i64>) = sqlx::query_as(
        "SELECT g.uuid, g.temperature_c, n.agent_seen_at FROM gpus g JOIN nodes n ON n.id = g.node_id WHERE g.idx = 3",
    )
    .fetch_one(berth.platform.db())
    .await
    .expect("readings");
    assert_eq!((uuid.as_str(), temperature), ("GPU-8f2c-3", 41));
    assert!(seen.is_some());
    assert_eq!(audited(&berth, "gpu.health", "success").await, 1);

    // The whole node no longer fits; single GPUs go everywhere but GPU 5.
    let whole = berth.launch("training", "h100-8", "whole-node").await;
    assert!(matches!(whole, Err(Error::Refused(Refusal::NoCapacity { .. }))), "{whole:?}");
    let mut used = Vec::new();
    for n in 0..7 {
        let env = berth.launch("training", "h100-1", &format!("single-{n}")).await.expect("a healthy GPU is free");
        let detail = berth.platform.environment_detail(&berth.caller, &env.id).await.expect("detail");
        used.push(detail.units[0].gpu_index);
    }
    used.sort_unstable();
    assert_eq!(used, [0, 1, 2, 3, 4, 6, 7]);
    let eighth = berth.launch("training", "h100-1", "single-7").await;
    assert!(matches!(eighth, Err(Error::Refused(Refusal::NoCapacity { .. }))), "{eighth:?}");

    // Nothing new: no change, no audit row. The counter reset: the agent clears its own verdict.
    let again = berth.platform.report_node(&secret, &report(gpus.clone()), test_meta()).await.expect("report");
    assert!(again.changes.is_empty());
    assert_eq!(audited(&berth, "gpu.health", "success").await, 1);
    gpus[5].ecc_uncorrected = Some(0);
    let cleared = berth.platform.report_node(&secret, &report(gpus), test_meta()).await.expect("report");
    assert_eq!(cleared.changes, ["gpu 5: healthy"]);
    assert_eq!(health(&berth).await, vec![("healthy".to_owned(), None); 8]);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_gpu_left_out_or_of_another_model_fails_and_an_admins_verdict_stays(pool: SqlitePool) {
    let berth = dgx_berth(pool).await;
    let admin = berth.admin().await;
    let (_, secret) = berth.platform.create_node_token(&admin, "dgx-01").await.expect("node token");
    berth.platform.set_gpu_health(&admin, "dgx-01", 3, "failed", "XID 79, RMA open").await.expect("admin health");

    let mut gpus: Vec<GpuReport> = (0..7).map(h100).collect();
    gpus[0].name = "NVIDIA A100-SXM4-80GB".into();
    gpus.push(GpuReport { index: 9, ..h100(9) });
    let receipt = berth.platform.report_node(&secret, &report(gpus), test_meta()).await.expect("report");
    assert_eq!(receipt.unexpected, [9]);

    let health = health(&berth).await;
    assert_eq!(health[0], ("failed".into(), Some("the agent reports A100-80GB, the fleet file says H100-80GB".into())));
    assert_eq!(health[7], ("failed".into(), Some(MISSING_NOTE.into())));
    // The agent finds GPU 3 fine; the admin's failed and note stay.
    assert_eq!(health[3], ("failed".into(), Some("XID 79, RMA open".into())));
    assert!(health[1..3].iter().chain(&health[4..7]).all(|(h, _)| h == "healthy"));
}

#[sqlx::test(migrations = "../migrations")]
async fn unknown_revoked_and_personal_tokens_are_refused_and_audited(pool: SqlitePool) {
    let berth = dgx_berth(pool).await;
    let admin = berth.admin().await;
    let full = report((0..8).map(h100).collect());

    let unknown = berth.platform.report_node("berth_node_0000", &full, test_meta()).await;
    assert!(matches!(unknown, Err(Error::Unauthenticated)), "{unknown:?}");
    assert_eq!(audited(&berth, "agent.report", "denied").await, 1);

    let (token, secret) = berth.platform.create_node_token(&admin, "dgx-01").await.expect("node token");
    berth.platform.report_node(&secret, &full, test_meta()).await.expect("a fresh token reports");
    berth.platform.revoke_node_token(&admin, token.id).await.expect("revoke");
    let revoked = berth.platform.report_node(&secret, &full, test_meta()).await;
    assert!(matches!(revoked, Err(Error::Unauthenticated)), "{revoked:?}");
    assert_eq!(audited(&berth, "agent.report", "denied").await, 2);
    assert_eq!(audited(&berth, "node_token.create", "success").await, 1);
    assert_eq!(audited(&berth, "node_token.revoke", "success").await, 1);

    // A person's API token is no node token.
    let (_, personal) = berth.platform.create_token(&admin, "mine", "30", &[]).await.expect("api token");
    let personal = berth.platform.report_node(&personal, &full, test_meta()).await;
    assert!(matches!(personal, Err(Error::Unauthenticated)), "{personal:?}");

    // Only platform admins make node tokens, for nodes that exist.
    let auditor = berth.user_with("auditor@example.com", Role::PlatformAuditor).await;
    assert!(berth.platform.create_node_token(&auditor, "dgx-01").await.is_err());
    assert!(berth.platform.create_node_token(&berth.caller, "dgx-01").await.is_err());
    let missing = berth.platform.create_node_token(&admin, "dgx-99").await;
    assert!(matches!(missing, Err(Error::Refused(Refusal::UnknownNode(_)))), "{missing:?}");
    let agents = berth
        .platform
        .node_agents(&admin, &berth_platform::capacity::maintenance::NodeFilter::default())
        .await
        .expect("node agents");
    assert_eq!(agents.len(), 1);
    assert_eq!(agents[0].agent_version.as_deref(), Some("0.1.0"));
    assert!(agents[0].tokens.is_empty(), "the revoked token is not listed");
}

#[sqlx::test(migrations = "../migrations")]
async fn an_agents_readings_go_to_the_booking_that_holds_each_gpu(pool: SqlitePool) {
    let berth = dgx_berth(pool).await;
    let admin = berth.admin().await;
    let (_, secret) = berth.platform.create_node_token(&admin, "dgx-01").await.expect("node token");
    let env = berth.launch("training", "h100-1", "train").await.expect("launch");
    berth.wait_for(&env.id, berth_domain::lifecycle::EnvState::Ready).await;
    let detail = berth.platform.environment_detail(&berth.caller, &env.id).await.expect("detail");
    let held = detail.units[0].gpu_index;

    let mut gpus: Vec<GpuReport> = (0..8).map(h100).collect();
    gpus[held as usize].utilization_pct = Some(97);
    gpus[held as usize].memory_used_mib = Some(70_000);
    let sent = NodeReport { period_s: Some(15.0), ..report(gpus) };
    berth.platform.report_node(&secret, &sent, test_meta()).await.expect("report");

    let used = berth.platform.environment_gpu_use(&berth.caller, &env.id).await.expect("use");
    assert_eq!(used.hour.len(), 1, "the held GPU's reading, not the seven idle ones'");
    let minute = &used.hour[0];
    assert_eq!((minute.utilization_pct, minute.memory_used_mib, minute.memory_total_mib), (97.0, 70_000.0, 81_559.0));
    assert_eq!(minute.power_w, Some(118.0));
    // Its 15 s count in the day's GPU-hours, 97% of them busy.
    let days = berth.platform.gpu_use_days(&admin, "2000-01-01").await.expect("days");
    assert_eq!(days.len(), 1);
    assert!((days[0].read_gpu_hours - 15.0 / 3600.0).abs() < 1e-9, "{days:?}");
    assert!((days[0].busy_gpu_hours - 0.97 * 15.0 / 3600.0).abs() < 1e-9, "{days:?}");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_fatal_xid_degrades_the_node_and_its_bookings_owners_are_told(pool: SqlitePool) {
    use berth_domain::node_health::NodeState;
    let berth = dgx_berth(pool).await;
    let admin = berth.admin().await;
    let (_, secret) = berth.platform.create_node_token(&admin, "dgx-01").await.expect("node token");
    let env = berth.launch("training", "h100-1", "train").await.expect("launch");
    berth.wait_for(&env.id, berth_domain::lifecycle::EnvState::Ready).await;
    let detail = berth.platform.environment_detail(&berth.caller, &env.id).await.expect("detail");
    let held = detail.units[0].gpu_index as usize;
    let other = (held + 1) % 8;

    // XID 13 is the program's fault: recorded, shown to the owner, and the node stays.
    let mut gpus: Vec<GpuReport> = (0..8).map(h100).collect();
    gpus[held].xid_errors = vec![13];
    let receipt = berth.platform.report_node(&secret, &report(gpus), test_meta()).await.expect("report");
    assert!(receipt.changes.is_empty(), "{:?}", receipt.changes);
    assert_eq!(berth.platform.node_health(&admin, "dgx-01").await.unwrap().status.state, NodeState::Available);

    // XID 79 on another GPU: the node is degraded in the report's transaction.
    let mut gpus: Vec<GpuReport> = (0..8).map(h100).collect();
    gpus[other].xid_errors = vec![13, 79];
    let receipt = berth.platform.report_node(&secret, &report(gpus.clone()), test_meta()).await.expect("report");
    let why = format!("the node's agent reports XID 79 on GPU {other} (GPU has fallen off the bus)");
    assert_eq!(receipt.changes, [format!("node: degraded: {why}")]);
    let health = berth.platform.node_health(&admin, "dgx-01").await.unwrap();
    assert_eq!(health.status.state, NodeState::Degraded);
    assert_eq!((health.changes[0].reason.as_str(), health.changes[0].by.as_deref()), (why.as_str(), None));
    let codes: Vec<(i64, u32)> = health.xid_errors.iter().map(|x| (x.gpu_index, x.code)).collect();
    assert_eq!(codes.len(), 3, "{codes:?}");
    assert!(codes.contains(&(held as i64, 13)) && codes.contains(&(other as i64, 79)), "{codes:?}");
    assert_eq!(audited(&berth, "node.state", "success").await, 1);

    // What the node holds keeps running; it takes nothing new.
    let again = berth.launch("training", "h100-1", "another").await;
    assert!(matches!(again, Err(Error::Refused(Refusal::NoCapacity { .. }))), "{again:?}");
    let detail = berth.platform.environment_detail(&berth.caller, &env.id).await.unwrap();
    assert_eq!(detail.environment.state, berth_domain::lifecycle::EnvState::Ready);

    // The owner hears of it, with a link to the environment; platform admins of the change.
    let told = berth.platform.inbox(&berth.caller).await.unwrap();
    let degraded: Vec<_> = told.items.iter().filter(|i| i.kind == "environment.node_degraded").collect();
    assert_eq!(degraded.len(), 1, "{:?}", told.items);
    assert_eq!(degraded[0].link, format!("/environments/{}", env.id));
    assert!(degraded[0].body.contains(&why), "{}", degraded[0].body);
    let admins = berth.platform.inbox(&admin).await.unwrap();
    assert!(admins.items.iter().any(|i| i.kind == "fleet.node_health" && i.title == "Node dgx-01 is degraded"));

    // The owner's page lists the errors on its own GPU only, while it held it.
    let used = berth.platform.environment_gpu_use(&berth.caller, &env.id).await.unwrap();
    let own: Vec<String> = used.xid_errors.iter().map(|x| x.describe()).collect();
    assert_eq!(own, [format!("XID 13 on dgx-01 GPU {held} (graphics engine exception)")]);

    // A second fatal XID on a degraded node moves nothing and tells no one again.
    let receipt = berth.platform.report_node(&secret, &report(gpus), test_meta()).await.expect("report");
    assert!(receipt.changes.is_empty(), "{:?}", receipt.changes);
    assert_eq!(audited(&berth, "node.state", "success").await, 1);
    let told = berth.platform.inbox(&berth.caller).await.unwrap();
    assert_eq!(told.items.iter().filter(|i| i.kind == "environment.node_degraded").count(), 1);
}
