//! What volumes hold on Kubernetes, from each Ready node's kubelet stats summary read
//! through the API server's node proxy: a soft tenant's claim by its namespace and name, a
//! kept PersistentVolume's by its `claimRef`; a node that answers 500 or not at all is
//! skipped and the others still count; a volume no running pod mounts keeps its last figure.
//! First the backend's requests one by one, then the sweep of a Berth whose notebooks run
//! on the mock cluster, as the volumes page reads it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_domain::fleet::FleetSpec;
use berth_domain::launch::LaunchRequest;
use berth_domain::lifecycle::EnvState;
use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use berth_platform::provisioning::backend::kubernetes::{Kubernetes, KubernetesConfig};
use berth_platform::provisioning::backend::{Backend, StoredVolume, VolumeUse};
use berth_platform::provisioning::reconciler::{Reconciler, ReconcilerConfig};
use berth_platform::{Caller, Platform};
use serde_json::{Value, json};
use sqlx::SqlitePool;

use crate::common::{fast_reconciler, production_pool, test_meta};
use crate::kubernetes_api::FakeCluster;

const GIB: u64 = 1 << 30;
// Reconstructed from the kubelet's `stats/v1alpha1` Summary type, not recorded from a
// cluster (see `fixtures/kubelet/README.md`).
const SUMMARY: &str = include_str!("../../fixtures/kubelet/stats-summary.json");

fn summary_path(node: &str) -> String {
    format!("/api/v1/nodes/{node}/proxy/stats/summary")
}

fn backend_with(client: kube::Client, node_stats_timeout: Duration) -> Arc<Kubernetes> {
    let config = KubernetesConfig { poll_interval: Duration::from_millis(1), node_stats_timeout, ..Default::default() };
    Arc::new(Kubernetes::with_client(client, config, "https://k8s.test:6443"))
}

/// A kubelet's summary with one pod mounting `volumes` (volume id, bytes used) of
/// `namespace`, each claim on a 10 GiB filesystem of its own.
fn summary(node: &str, namespace: &str, pod: &str, volumes: &[(i64, u64)]) -> Value {
    let volume: Vec<Value> = volumes
        .iter()
        .map(|(id, used)| {
            json!({
                "time": "2026-11-26T13:39:12Z", "name": format!("vol-{id}"),
                "availableBytes": 10 * GIB - used, "capacityBytes": 10 * GIB, "usedBytes": used,
                "pvcRef": { "name": format!("berth-vol-{id}"), "namespace": namespace },
            })
        })
        .collect();
    json!({
        "node": { "nodeName": node, "startTime": "2026-11-20T08:01:40Z" },
        "pods": [{ "podRef": { "name": pod, "namespace": namespace, "uid": "0" }, "startTime": "2026-11-26T12:58:31Z", "containers": [], "volume": volume }],
    })
}

#[tokio::test]
async fn every_ready_nodes_kubelet_is_read_and_one_that_fails_or_hangs_is_skipped() {
    let (cluster, client) = FakeCluster::start();
    {
        let mut state = cluster.lock();
        state.stats_summaries.insert("h100-1".into(), serde_json::from_str(SUMMARY).expect("fixture"));
        // The hard tenant's volume 12 is kept as a PersistentVolume, bound now to the claim
        // of its job's namespace.
        state.objects.insert(
            "/api/v1/persistentvolumes/pvc-5d0b7e1a".into(),
            json!({
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": { "name": "pvc-5d0b7e1a", "labels": { "berth.dev/volume": "12" } },
                "spec": { "capacity": { "storage": "20Gi" }, "accessModes": ["ReadWriteMany"],
                          "claimRef": { "kind": "PersistentVolumeClaim", "namespace": "berth-vault-999999998888", "name": "berth-vol-12" } },
            }),
        );
        // One kubelet answers 500, one never answers, one node is not Ready (not asked).
        state.failing.insert(summary_path("l40s-1"), 500);
        state.hanging.insert(summary_path("h100-2"));
        state.nodes.get_mut("a100-1").expect("node")["status"]["conditions"] =
            json!([{ "type": "Ready", "status": "False" }]);
    }
    let backend = backend_with(client, Duration::from_millis(300));
    let stored = |volume_id, location: &str| StoredVolume { volume_id, location: location.into() };
    let volumes = [
        stored(7, "claim berth-acme/berth-vol-7"),
        stored(8, "claim berth-acme/berth-vol-8"),
        // Mounted by no running pod: in no summary.
        stored(9, "claim berth-acme/berth-vol-9"),
        stored(12, "persistentvolume berth.dev/volume=12"),
        // Mounted, but the kubelet has no figure for it yet.
        stored(13, "persistentvolume berth.dev/volume=13"),
    ];

    let began = Instant::now();
    let measured = backend.volumes_use(&volumes).await;
    assert!(began.elapsed() < Duration::from_secs(3), "the hanging kubelet was given up: {:?}", began.elapsed());
    assert_eq!(
        measured,
        [
            VolumeUse { volume_id: 7, used_bytes: 3 * GIB, capacity_bytes: Some(10 * GIB) },
            VolumeUse { volume_id: 8, used_bytes: 12 * GIB, capacity_bytes: Some(50 * GIB) },
            VolumeUse { volume_id: 12, used_bytes: 524_288_000, capacity_bytes: Some(20 * GIB) },
        ]
    );
    let mut lines = cluster.take_lines();
    lines[2..].sort();
    assert_eq!(
        lines,
        [
            "GET /api/v1/persistentvolumes".to_owned(),
            "GET /api/v1/nodes".to_owned(),
            format!("GET {}", summary_path("h100-1")),
            format!("GET {}", summary_path("h100-2")),
            format!("GET {}", summary_path("l40s-1")),
        ]
    );

    // Only soft tenants' claims: no PersistentVolume to look up. No volume: nothing asked.
    let measured = backend.volumes_use(&volumes[..2]).await;
    assert_eq!(measured.len(), 2);
    assert_eq!(cluster.take_lines()[0], "GET /api/v1/nodes");
    assert!(backend.volumes_use(&[]).await.is_empty());
    assert!(cluster.take_lines().is_empty());
}

#[tokio::test]
async fn nodes_berth_may_not_list_measure_nothing_and_fail_nothing() {
    let (cluster, client) = FakeCluster::start();
    cluster.lock().failing.insert("/api/v1/nodes".into(), 403);
    let backend = backend_with(client, Duration::from_secs(1));
    let volumes = [StoredVolume { volume_id: 7, location: "claim berth-acme/berth-vol-7".into() }];
    assert!(backend.volumes_use(&volumes).await.is_empty());
    assert_eq!(cluster.take_lines(), ["GET /api/v1/nodes"]);
}

/// One H100 node with MIG and one L40S node: the mock cluster's nodes.
const FLEET: &str = r#"
[[site]]
name = "test-1"
[[site.pool]]
prefix = "h100"
model = "H100-80GB"
nodes = 1
gpus_per_node = 2
[[site.pool]]
prefix = "l40s"
model = "L40S"
nodes = 1
gpus_per_node = 2
"#;

async fn launch_notebook(platform: &Platform, caller: &Caller, size: &str, name: &str) -> String {
    let request = LaunchRequest {
        offering: "notebook".into(),
        size: size.into(),
        name: name.into(),
        hours: "2".into(),
        ..LaunchRequest::default()
    };
    platform.launch(caller, &request).await.expect("launch").id
}

async fn wait_for(platform: &Platform, caller: &Caller, id: &str, state: EnvState) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let env = platform.environment_of(caller, id).await.expect("environment");
        if env.state == state {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{id} stuck in {} waiting for {state}", env.state);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The caller's home volume as the volumes page lists it: (id, location, used, measured at).
async fn home(platform: &Platform, caller: &Caller) -> (i64, String, Option<i64>, Option<i64>) {
    let volumes = platform.volumes(caller).await.expect("volumes");
    let home = volumes.iter().find(|v| v.is_home && v.owner_id == caller.user_id()).expect("a home volume");
    (home.id, home.location.clone().unwrap_or_default(), home.used_bytes, home.measured_at)
}

#[sqlx::test(migrations = "../migrations")]
async fn a_running_notebooks_volume_shows_its_use_from_the_kubelet_and_keeps_it_once_unmounted(pool: SqlitePool) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("berth_platform=info,sqlx=warn"))
        .with_test_writer()
        .try_init();
    let fleet = FleetSpec::parse(FLEET).expect("fleet");
    let nodes: Vec<String> = fleet.nodes.iter().map(|n| n.name.clone()).collect();
    assert_eq!(nodes, ["h100-01", "l40s-01"]);
    let (cluster, client) = FakeCluster::stateful(&nodes);
    cluster.lock().record = true;
    let backend = backend_with(client, Duration::from_secs(2));
    let platform = Platform::new(production_pool(&pool).await);
    platform.sync_fleet(&fleet).await.expect("sync fleet");
    let platform = platform.with_backend(backend.clone());
    let tenant = platform.ensure_tenant("acme", "Acme", Isolation::Soft).await.expect("tenant");
    let mut members = Vec::new();
    for email in ["ada@acme.test", "bob@acme.test"] {
        let user =
            platform.create_user(email, email, "a long passphrase", Role::Member, Some(tenant)).await.expect("member");
        members.push(user.caller(test_meta()));
    }
    // Sweeps only when the test asks (and the one at start, before anything is mounted).
    let config = ReconcilerConfig {
        step_timeout: Duration::from_secs(5),
        sweep_interval: Duration::from_secs(3600),
        ..fast_reconciler()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(Reconciler::new(platform.clone(), backend.clone(), config.clone()).run(async {
        let _ = stopped.await;
    }));
    let sweep =
        || async { Reconciler::new(platform.clone(), backend.clone(), config.clone()).sweep().await.expect("sweep") };

    // Ada's notebook on an H100 slice (h100-01), Bob's on an L40S (l40s-01), each with its
    // home volume: a claim in acme's namespace.
    let ada_nb = launch_notebook(&platform, &members[0], "h100-1g.10gb", "ada-lab").await;
    let bob_nb = launch_notebook(&platform, &members[1], "l40s-1", "bob-lab").await;
    wait_for(&platform, &members[0], &ada_nb, EnvState::Ready).await;
    wait_for(&platform, &members[1], &bob_nb, EnvState::Ready).await;
    let (ada_vol, ada_location, used, _) = home(&platform, &members[0]).await;
    let (bob_vol, bob_location, _, _) = home(&platform, &members[1]).await;
    assert_eq!(ada_location, format!("claim berth-acme/berth-vol-{ada_vol}"));
    assert_eq!(bob_location, format!("claim berth-acme/berth-vol-{bob_vol}"));
    assert_eq!(used, None, "nothing measured before a kubelet reports it");

    // The kubelets of their nodes report the claims their pods mount.
    let set = |node: &str, pod: &str, volume: i64, used: u64| {
        let value = summary(node, "berth-acme", pod, &[(volume, used)]);
        cluster.lock().stats_summaries.insert(node.into(), value);
    };
    set("h100-01", "nb-ada-0", ada_vol, 3 * GIB);
    set("l40s-01", "nb-bob-0", bob_vol, GIB);
    cluster.take_calls();
    sweep().await;
    let (_, _, ada_used, ada_at) = home(&platform, &members[0]).await;
    let (_, _, bob_used, bob_at) = home(&platform, &members[1]).await;
    assert_eq!((ada_used, bob_used), (Some(3 << 30), Some(1 << 30)));
    assert!(ada_at.is_some() && bob_at.is_some());
    let mut asked: Vec<String> = cluster.take_lines().into_iter().filter(|l| l.ends_with("/stats/summary")).collect();
    asked.sort();
    assert_eq!(asked, [format!("GET {}", summary_path("h100-01")), format!("GET {}", summary_path("l40s-01"))]);

    // Bob's node answers 500: skipped, Ada's still measured; Bob's keeps its last figure.
    tokio::time::sleep(Duration::from_millis(5)).await;
    set("h100-01", "nb-ada-0", ada_vol, 4 * GIB);
    set("l40s-01", "nb-bob-0", bob_vol, 2 * GIB);
    cluster.lock().failing.insert(summary_path("l40s-01"), 500);
    sweep().await;
    let (_, _, ada_used, ada_later) = home(&platform, &members[0]).await;
    let (_, _, bob_used, bob_later) = home(&platform, &members[1]).await;
    assert_eq!(ada_used, Some(4 << 30));
    assert!(ada_later > ada_at, "measured again");
    assert_eq!((bob_used, bob_later), (Some(1 << 30), bob_at), "as last measured");

    // Ada's notebook stops: no pod mounts her claim any more, so it keeps its last figure.
    platform.stop(&members[0], &ada_nb).await.expect("stop");
    wait_for(&platform, &members[0], &ada_nb, EnvState::Released).await;
    cluster.lock().stats_summaries.remove("h100-01");
    cluster.lock().failing.clear();
    tokio::time::sleep(Duration::from_millis(5)).await;
    sweep().await;
    let (_, _, ada_used, ada_last) = home(&platform, &members[0]).await;
    let (_, _, bob_used, _) = home(&platform, &members[1]).await;
    assert_eq!((ada_used, ada_last), (Some(4 << 30), ada_later), "as last measured");
    assert_eq!(bob_used, Some(2 << 30), "Bob's node answers again");

    let rule = platform.volume_size_rule().expect("a backend");
    assert!(rule.contains("shared export") && rule.contains("not measured"), "{rule}");
    let _ = stop.send(());
    let _ = running.await;
}
