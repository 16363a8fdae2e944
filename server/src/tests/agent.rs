//! `berth agent` against a real Berth on a loopback port: a fake node behind the same
//! probe trait as NVML reports, and the portal records what it says.

use std::sync::Arc;
use std::time::Duration;

use berth_agent::{Agent, GpuProbe};
use berth_domain::agent::GpuReport;
use berth_domain::policy::Role;
use http::{Method, StatusCode};
use serde_json::json;

use super::{Berth, meta};

/// A node whose GPUs read the same every time.
struct FakeNode(Vec<GpuReport>);

impl GpuProbe for FakeNode {
    fn gpus(&self) -> Result<Vec<GpuReport>, berth_agent::Error> {
        Ok(self.0.clone())
    }
}

fn l40s(index: i64) -> GpuReport {
    GpuReport {
        index,
        uuid: format!("GPU-77aa-{index}"),
        name: "NVIDIA L40S".into(),
        memory_mib: 46_068,
        ecc_uncorrected: Some(0),
        temperature_c: Some(38),
        power_w: Some(80),
        utilization_pct: Some(3),
        ..GpuReport::default()
    }
}

async fn l40s_health(berth: &Berth) -> Vec<(String, Option<String>)> {
    sqlx::query_as(
        "SELECT g.health, g.health_note FROM gpus g JOIN nodes n ON n.id = g.node_id WHERE n.name = 'l40s-01' ORDER BY g.idx",
    )
    .fetch_all(berth.platform.db())
    .await
    .expect("health")
}

async fn last_seen(berth: &Berth) -> Option<i64> {
    sqlx::query_scalar("SELECT agent_seen_at FROM nodes WHERE name = 'l40s-01'")
        .fetch_one(berth.platform.db())
        .await
        .expect("node")
}

#[tokio::test]
async fn the_agent_reports_a_failing_gpu_to_a_running_portal() {
    let berth = Berth::start(None).await;
    let admin = berth.person("admin@example.com", Role::PlatformAdmin, None).await;
    let (_, secret) = berth.platform.create_node_token(&admin.caller(meta()), "l40s-01").await.expect("node token");
    let url = berth.serve_on_loopback().await;
    let node = FakeNode(vec![l40s(0), GpuReport { ecc_uncorrected: Some(4), ..l40s(1) }]);
    let agent = Agent::new(&url, &secret, Duration::from_millis(20), Arc::new(node)).expect("agent");

    let answer = agent.report_once().await.expect("report");
    assert_eq!(answer["node"], "l40s-01");
    assert_eq!(answer["changes"], json!(["gpu 1: failed: 4 uncorrected ECC errors"]));
    assert_eq!(
        l40s_health(&berth).await,
        [("healthy".into(), None), ("failed".into(), Some("4 uncorrected ECC errors".into()))]
    );

    // The loop keeps reporting until told to stop.
    let first = last_seen(&berth).await.expect("seen");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        agent
            .run(async {
                let _ = stopped.await;
            })
            .await;
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while last_seen(&berth).await <= Some(first) {
        assert!(tokio::time::Instant::now() < deadline, "the agent did not report again");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(5), running).await.expect("the agent stops").expect("agent task");
}

#[tokio::test]
async fn the_portal_refuses_personal_tokens_bad_reports_and_is_told_apart_when_down() {
    let berth = Berth::start(None).await;
    let admin = berth.person("admin@example.com", Role::PlatformAdmin, None).await;
    let url = berth.serve_on_loopback().await;
    let (_, personal) = berth.token(&admin, &[]).await;
    let agent = Agent::new(&url, &personal, Duration::from_secs(30), Arc::new(FakeNode(vec![l40s(0)]))).expect("agent");
    let refused = agent.report_once().await.expect_err("a person's token is no node token").to_string();
    assert!(
        refused.starts_with("the portal refused the report (401 Unauthorized): a valid node token is needed"),
        "{refused}"
    );
    assert_eq!(last_seen(&berth).await, None);
    let denied: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE action = 'agent.report' AND outcome = 'denied'")
            .fetch_one(berth.platform.db())
            .await
            .expect("count");
    assert_eq!(denied, 1);

    let (_, secret) = berth.platform.create_node_token(&admin.caller(meta()), "l40s-01").await.expect("node token");
    let twice = r#"{"agent_version": "0.1.0", "gpus": [
        {"index": 0, "uuid": "a", "name": "NVIDIA L40S", "memory_mib": 46068, "mig_enabled": false},
        {"index": 0, "uuid": "b", "name": "NVIDIA L40S", "memory_mib": 46068, "mig_enabled": false}]}"#;
    let reply = berth.api(Method::POST, "/api/v1/agent/report", twice, Some(&secret)).await;
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", reply.body);
    assert!(reply.body.contains("GPU index 0 is negative or repeated"), "{}", reply.body);
    let nothing = berth.api(Method::POST, "/api/v1/agent/report", twice, None).await;
    assert_eq!(nothing.status, StatusCode::UNAUTHORIZED);

    // Nothing listens on port 1: the agent says it cannot reach the portal.
    let down =
        Agent::new("http://127.0.0.1:1", &secret, Duration::from_secs(30), Arc::new(FakeNode(vec![]))).expect("agent");
    let error = down.report_once().await.expect_err("no portal").to_string();
    assert!(error.starts_with("cannot reach the portal at http://127.0.0.1:1/api/v1/agent/report"), "{error}");
}

/// A GPU whose MIG mode change waits for a reset takes no booking: the agent reports both
/// modes, the portal degrades the GPU saying how to reset it (the fleet page shows the
/// note), and once the mode is in effect the next report makes it healthy again.
#[tokio::test]
async fn a_mig_mode_waiting_for_a_reset_keeps_the_gpu_out_of_bookings_until_it_is_reset() {
    let berth = Berth::start(None).await;
    let admin = berth.person("admin@example.com", Role::PlatformAdmin, None).await;
    let (_, secret) = berth.platform.create_node_token(&admin.caller(meta()), "h100-01").await.expect("node token");
    let report = |current: bool, pending: bool| {
        let gpu = |index: i64, current: bool, pending: bool| {
            json!({"index": index, "uuid": format!("GPU-h-{index}"), "name": "NVIDIA H100 80GB HBM3",
                   "memory_mib": 81_559, "ecc_uncorrected": 0, "temperature_c": 40,
                   "mig_enabled": current, "mig_pending": pending})
        };
        json!({"agent_version": "0.1.0", "gpus": [gpu(0, false, false), gpu(1, current, pending)]}).to_string()
    };
    let health = || async {
        sqlx::query_as::<_, (String, Option<String>)>(
            "SELECT g.health, g.health_note FROM gpus g JOIN nodes n ON n.id = g.node_id
             WHERE n.name = 'h100-01' AND g.idx = 1",
        )
        .fetch_one(berth.platform.db())
        .await
        .expect("health")
    };

    let reply = berth.api(Method::POST, "/api/v1/agent/report", &report(false, true), Some(&secret)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let note =
        "MIG mode is off until a GPU reset turns it on: reset it with nothing running on it (nvidia-smi -i 1 -r)";
    assert!(reply.body.contains(&format!("gpu 1: degraded: {note}")), "{}", reply.body);
    assert_eq!(health().await, ("degraded".to_owned(), Some(note.to_owned())));
    let free: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM gpus g JOIN nodes n ON n.id = g.node_id
         WHERE n.name = 'h100-01' AND g.health = 'healthy' AND n.state = 'available'",
    )
    .fetch_one(berth.platform.db())
    .await
    .expect("bookable");
    assert_eq!(free, 1, "only GPU 0 takes bookings");

    let reply = berth.api(Method::POST, "/api/v1/agent/report", &report(true, true), Some(&secret)).await;
    assert!(reply.body.contains("gpu 1: healthy"), "{}", reply.body);
    assert_eq!(health().await, ("healthy".to_owned(), None));
}

/// An agent that stopped while it ran checks takes them again when it starts: its first
/// ask says `resume`, and the checks it took and never answered are handed out again,
/// rather than left to wait out their time limit.
#[tokio::test]
async fn checks_an_agent_took_before_it_restarted_are_handed_to_it_again() {
    use berth_platform::provisioning::backend::baremetal::{BareMetal, BareMetalConfig};

    let berth = Berth::start(None).await;
    let admin = berth.person("admin@example.com", Role::PlatformAdmin, None).await;
    let (_, secret) = berth.platform.create_node_token(&admin.caller(meta()), "h100-02").await.expect("node token");
    let config = BareMetalConfig { poll_interval: Duration::from_millis(10), volumes_path: None };
    let platform = berth.platform.clone().with_backend(Arc::new(BareMetal::new(berth.platform.clone(), config)));
    let run = tokio::spawn(async move { platform.run_node_checks(&admin.caller(meta()), "h100-02", "quick").await });

    let take = |path: &'static str| {
        let secret = secret.clone();
        let berth = &berth;
        async move {
            let reply = berth.api(Method::GET, path, "", Some(&secret)).await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
            serde_json::from_str::<Vec<serde_json::Value>>(&reply.body).expect("orders")
        }
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let taken = loop {
        let orders = take("/api/v1/agent/checks").await;
        if !orders.is_empty() {
            break orders;
        }
        assert!(tokio::time::Instant::now() < deadline, "no check was ordered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(taken[0]["kind"], "gpu_diagnostics");
    assert_eq!(take("/api/v1/agent/checks").await, Vec::<serde_json::Value>::new(), "handed out once");
    // The agent restarts before answering: its first ask takes the same checks again.
    let again = take("/api/v1/agent/checks?resume=true").await;
    assert_eq!(again.first().map(|o| &o["id"]), Some(&taken[0]["id"]));

    let diag = include_str!("../../../domain/fixtures/checks/dcgmi-diag-r1-pass.json");
    let mut ran = Vec::new();
    // Orders come one kind after another: each is answered as the agent would.
    let mut orders = again;
    while let Some(order) = orders.first().cloned() {
        let output = match order["kind"].as_str() {
            Some("gpu_diagnostics") => diag,
            Some("memory_errors") => include_str!("../../../domain/fixtures/checks/nvidia-smi-q-health.recorded.txt"),
            _ => "",
        };
        let path = format!("/api/v1/agent/checks/{}", order["id"]);
        let body = json!({ "output": output }).to_string();
        assert_eq!(berth.api(Method::POST, &path, &body, Some(&secret)).await.status, StatusCode::OK);
        ran.push(order["kind"].as_str().unwrap_or_default().to_owned());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        orders = loop {
            let next = take("/api/v1/agent/checks").await;
            if !next.is_empty() || run.is_finished() || tokio::time::Instant::now() >= deadline {
                break next;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
    }
    assert_eq!(ran, ["gpu_diagnostics", "memory_errors", "xid_events"]);
    let run = run.await.expect("the run").expect("checks");
    assert_eq!(run.results.len(), 3);
    assert_eq!(run.results[0].raw_output, diag, "the answer given after the restart is the run's");
}

/// Onboarding a node by script: a platform admin makes its agent's token through the API,
/// the agent reports with it, and once the token is revoked the agent is refused.
#[tokio::test]
async fn a_node_token_made_and_revoked_through_the_api_lets_its_agent_in_and_out() {
    let berth = Berth::start(None).await;
    let admin = berth.person("admin@example.com", Role::PlatformAdmin, None).await;
    let (_, admin_token) = berth.token(&admin, &[]).await;
    let url = berth.serve_on_loopback().await;

    let made = berth.api(Method::POST, "/api/v1/nodes/l40s-01/tokens", "", Some(&admin_token)).await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let made: serde_json::Value = serde_json::from_str(&made.body).expect("json");
    assert_eq!(made["node"], "l40s-01");
    let secret = made["secret"].as_str().expect("secret").to_owned();
    let agent = Agent::new(&url, &secret, Duration::from_secs(30), Arc::new(FakeNode(vec![l40s(0)]))).expect("agent");
    agent.report_once().await.expect("the new token reports");

    let revoke = format!("/api/v1/node-tokens/{}", made["id"]);
    let revoked = berth.api(Method::DELETE, &revoke, "", Some(&admin_token)).await;
    assert_eq!(
        (revoked.status, revoked.body.as_str()),
        (StatusCode::OK, format!(r#"{{"revoked":{}}}"#, made["id"]).as_str())
    );
    let refused = agent.report_once().await.expect_err("revoked").to_string();
    assert!(refused.starts_with("the portal refused the report (401 Unauthorized)"), "{refused}");
    // Revoking again changes nothing and is not an error; a node that does not exist is not found.
    assert_eq!(berth.api(Method::DELETE, &revoke, "", Some(&admin_token)).await.status, StatusCode::OK);
    let revocations: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE action = 'node_token.revoke'")
        .fetch_one(berth.platform.db())
        .await
        .expect("count");
    assert_eq!(revocations, 1);
    let missing = berth.api(Method::POST, "/api/v1/nodes/no-such-node/tokens", "", Some(&admin_token)).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "{}", missing.body);
}

/// A node's command line tools as the agent meets them on a node with GPUs in MIG mode.
struct MigNode {
    lgi: String,
}

impl berth_agent::node::commands::CommandRunner for MigNode {
    fn run(&self, command: &berth_domain::agent::Command) -> Result<String, berth_agent::node::commands::CommandError> {
        let line = command.to_string();
        Ok(if line == "nvidia-smi mig -lgi" { self.lgi.clone() } else { String::new() })
    }
}

/// A booked MIG slice on a bare-metal node: NVML gives no use per instance, so the agent
/// reads the node's DCGM exporter, places each instance by `nvidia-smi mig -lgi`, and the
/// booking's page shows its slice's use.
#[tokio::test]
async fn the_agent_reads_mig_instances_from_the_nodes_dcgm_exporter() {
    let berth = Berth::start(None).await;
    let admin = berth.person("admin@example.com", Role::PlatformAdmin, None).await;
    let owner = berth.person("ada@example.com", Role::PlatformAdmin, None).await;
    let id = berth.launch(&owner, "notebook").await;
    let (node, gpu, start): (String, i64, i64) = sqlx::query_as(
        "SELECT n.name, g.idx, r.slice_start FROM reservations r JOIN gpus g ON g.id = r.gpu_id
         JOIN nodes n ON n.id = g.node_id WHERE r.environment_id = ?",
    )
    .bind(&id)
    .fetch_one(berth.platform.db())
    .await
    .expect("the slice");
    // Readings go to running environments; no backend runs here to start it.
    sqlx::query("UPDATE environments SET state = 'ready' WHERE id = ?")
        .bind(&id)
        .execute(berth.platform.db())
        .await
        .expect("ready");
    let (_, secret) = berth.platform.create_node_token(&admin.caller(meta()), &node).await.expect("node token");
    let url = berth.serve_on_loopback().await;

    // The node's exporter: GPU instance 7 is the booked slice; 9 is another instance.
    let page = format!(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu=\"{gpu}\",GPU_I_ID=\"7\",GPU_I_PROFILE=\"1g.10gb\",Hostname=\"{node}\"}} 0.62\n\
         DCGM_FI_DEV_FB_USED{{gpu=\"{gpu}\",GPU_I_ID=\"7\",GPU_I_PROFILE=\"1g.10gb\",Hostname=\"{node}\"}} 3000\n\
         DCGM_FI_DEV_FB_FREE{{gpu=\"{gpu}\",GPU_I_ID=\"7\",GPU_I_PROFILE=\"1g.10gb\",Hostname=\"{node}\"}} 6856\n\
         DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu=\"{gpu}\",GPU_I_ID=\"9\",GPU_I_PROFILE=\"1g.10gb\",Hostname=\"{node}\"}} 0.99\n"
    );
    let exporter = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let exporter_url = format!("http://{}/metrics", exporter.local_addr().expect("address"));
    let app = axum::Router::new().route("/metrics", axum::routing::get(move || async move { page }));
    tokio::spawn(async move { axum::serve(exporter, app).await });
    let other = if start == 0 { 1 } else { 0 };
    let lgi = format!(
        "+----------------------------------------------------+\n\
         | GPU instances:                                     |\n\
         | GPU   Name             Profile  Instance   Placement  |\n\
         |                          ID       ID       Start:Size |\n\
         |====================================================|\n\
         |   {gpu}  MIG 1g.10gb         19        7          {start}:1     |\n\
         |   {gpu}  MIG 1g.10gb         19        9          {other}:1     |\n\
         +----------------------------------------------------+\n"
    );
    let h100 = |index| GpuReport {
        index,
        uuid: format!("GPU-3b5c-{index}"),
        name: "NVIDIA H100 80GB HBM3".into(),
        memory_mib: 81_559,
        mig_enabled: true,
        ecc_uncorrected: Some(0),
        temperature_c: Some(44),
        ..GpuReport::default()
    };
    let agent = Agent::new(&url, &secret, Duration::from_secs(30), Arc::new(FakeNode(vec![h100(0), h100(1)])))
        .expect("agent")
        .with_mig_source(berth_agent::MigSource { exporter_url, runner: Arc::new(MigNode { lgi }) });
    agent.report_once().await.expect("report");

    let used = berth.platform.environment_gpu_use(&owner.caller(meta()), &id).await.expect("use");
    assert_eq!(used.hour.len(), 1, "{:?}", used.hour);
    let minute = &used.hour[0];
    assert!((minute.utilization_pct - 62.0).abs() < 1e-9, "{minute:?}");
    assert_eq!((minute.memory_used_mib, minute.memory_total_mib), (3000.0, 9856.0));
    assert_eq!((minute.power_w, minute.temperature_c), (None, Some(44.0)));
}
