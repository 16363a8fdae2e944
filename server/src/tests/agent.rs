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
