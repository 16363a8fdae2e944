//! Node health on Kubernetes: each check a Job pinned to its node whose pod's log is the
//! check's output (the exact requests, a pod that never ran, a Job left by a run cut
//! short), acceptance of a new node through the platform on the mock cluster, and a
//! dedicated cluster moved off a failed node.

use std::sync::Arc;
use std::time::Duration;

use berth_domain::catalog::Offering;
use berth_domain::fleet::FleetSpec;
use berth_domain::gpu::GpuModel;
use berth_domain::lifecycle::provision_plan;
use berth_domain::node_checks::{CheckKind, CheckLevel};
use berth_domain::node_health::NodeState;
use berth_domain::policy::Role;
use berth_platform::Platform;
use berth_platform::provisioning::backend::kubernetes::manifests::{self, check_job_name};
use berth_platform::provisioning::backend::kubernetes::{Kubernetes, KubernetesConfig};
use berth_platform::provisioning::backend::{Backend, CheckedNode};
use serde_json::{Value, json};
use sqlx::SqlitePool;

use crate::common::{production_pool, test_meta};
use crate::kubernetes_api::FakeCluster;
use crate::support::{backend, body_of, gpu_unit, ns, run, vault, workload};

const CHECKS: &str = "berth-node-checks";
const DIAG_PASS: &str = include_str!("../../../domain/fixtures/checks/dcgmi-diag-r1-pass.json");
const DIAG_FAIL: &str = include_str!("../../../domain/fixtures/checks/dcgmi-diag-r3-memory-fail.json");
const SMI: &str = include_str!("../../../domain/fixtures/checks/nvidia-smi-q-health.recorded.txt");

fn h100(name: &str) -> CheckedNode {
    CheckedNode {
        name: name.into(),
        model: GpuModel::H100_80GB,
        gpus: 8,
        expected_bus_bandwidth: None,
        infiniband_rate: 400,
    }
}

fn job_path(name: &str) -> String {
    format!("/apis/batch/v1/namespaces/{CHECKS}/jobs/{name}")
}

#[tokio::test]
async fn a_check_is_a_job_pinned_to_its_node_and_its_pods_log_is_the_output() {
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    let job = check_job_name("h100-1", CheckKind::GpuDiagnostics);
    assert_eq!(job, "check-gpu-diagnostics-h100-1");
    cluster.lock().job_outputs.insert(job.clone(), DIAG_PASS.into());

    let output = k8s.run_check(&h100("h100-1"), CheckKind::GpuDiagnostics, CheckLevel::Quick).await.expect("ran");
    assert_eq!(output, DIAG_PASS, "the pod's log, as the tool printed it");
    let calls = cluster.take_calls();
    let lines: Vec<String> = calls.iter().map(|c| c.line()).collect();
    assert_eq!(
        lines,
        [
            format!("PATCH /api/v1/namespaces/{CHECKS}"),
            format!("POST /apis/batch/v1/namespaces/{CHECKS}/jobs"),
            format!("GET {}", job_path(&job)),
            format!("GET /api/v1/namespaces/{CHECKS}/pods"),
            format!("GET /api/v1/namespaces/{CHECKS}/pods/{job}-run/log"),
            format!("DELETE {}", job_path(&job)),
        ]
    );
    let namespace = body_of(&calls, &format!("PATCH /api/v1/namespaces/{CHECKS}"));
    assert_eq!(namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "privileged");
    let created = body_of(&calls, &format!("POST /apis/batch/v1/namespaces/{CHECKS}/jobs"));
    let pod = &created["spec"]["template"]["spec"];
    assert_eq!(pod["nodeName"], "h100-1", "pinned to the node, past the scheduler");
    assert_eq!(pod["tolerations"], json!([{ "operator": "Exists" }]), "a tainted or cordoned node is checked too");
    assert_eq!(pod["restartPolicy"], "Never");
    assert_eq!(pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "8", "every GPU: nothing else runs");
    let argv: Vec<&str> =
        pod["containers"][0]["command"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(argv[argv.len() - 5..], ["dcgmi", "diag", "-r", "1", "-j"], "the agent's own command: {argv:?}");
    assert_eq!(created["spec"]["backoffLimit"], 0);
    assert_eq!(created["spec"]["template"]["metadata"]["labels"]["berth.dev/node-check"], job.as_str());
    // The pod's log is read from the check's container; the Job is deleted with its pods.
    let log = calls.iter().find(|c| c.path.ends_with("/log")).unwrap();
    assert!(log.query.contains("container=check"), "{}", log.query);
    let delete = calls.iter().find(|c| c.method == "DELETE").unwrap();
    assert!(
        delete.body.as_ref().is_some_and(|b| b["propagationPolicy"] == "Background"),
        "a Job deleted without a policy would leave its pods: {:?}",
        delete.body
    );
    assert!(cluster.lock().objects.keys().all(|p| !p.contains("/jobs/") && !p.contains("/pods/")), "nothing left");

    // A counter read asks for no GPU and sees them all through the runtime.
    cluster.lock().job_outputs.insert(check_job_name("h100-1", CheckKind::MemoryErrors), SMI.into());
    let output = k8s.run_check(&h100("h100-1"), CheckKind::MemoryErrors, CheckLevel::Quick).await.expect("ran");
    assert_eq!(output, SMI);
    let calls = cluster.take_calls();
    let container = &body_of(&calls, &format!("POST /apis/batch/v1/namespaces/{CHECKS}/jobs"))["spec"]["template"]["spec"]
        ["containers"][0];
    assert!(container.get("resources").is_none(), "{container}");
    assert_eq!(container["env"], json!([{ "name": "NVIDIA_VISIBLE_DEVICES", "value": "all" }]));
}

#[tokio::test]
async fn a_check_whose_pod_never_ran_says_why_and_leaves_no_job() {
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    let job = check_job_name("h100-2", CheckKind::NcclBandwidth);
    {
        let mut state = cluster.lock();
        state.job_status = Some(json!({
            "failed": 1,
            "conditions": [{ "type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                             "message": "Job has reached the specified backoff limit" }],
        }));
        // The kubelet refused the pod: a tenant's workload holds GPUs of the node.
        state.objects.insert(
            format!("/api/v1/namespaces/{CHECKS}/pods/{job}-x7k2p"),
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": { "name": format!("{job}-x7k2p"), "labels": { "berth.dev/node-check": job } },
                "status": { "phase": "Failed", "reason": "OutOfnvidia.com/gpu",
                            "message": "Pod was rejected: Node didn't have enough resource: nvidia.com/gpu, requested: 8, used: 2, capacity: 8" },
            }),
        );
    }
    let err = k8s.run_check(&h100("h100-2"), CheckKind::NcclBandwidth, CheckLevel::Medium).await.unwrap_err();
    assert_eq!(
        err.0,
        "the check's pod did not run on h100-2: OutOfnvidia.com/gpu: Pod was rejected: Node didn't have enough \
         resource: nvidia.com/gpu, requested: 8, used: 2, capacity: 8"
    );
    let lines: Vec<String> = cluster.take_calls().iter().map(|c| c.line()).collect();
    assert!(!lines.iter().any(|l| l.ends_with("/log")), "no log to read: {lines:?}");
    assert_eq!(lines.last().unwrap(), &format!("DELETE {}", job_path(&job)), "the Job goes all the same");
}

#[tokio::test]
async fn a_job_left_by_a_run_cut_short_goes_before_the_next_run() {
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    let job = check_job_name("a100-1", CheckKind::XidEvents);
    {
        let mut state = cluster.lock();
        state.objects.insert(
            format!("/api/v1/namespaces/{CHECKS}"),
            json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": CHECKS } }),
        );
        state.objects.insert(
            job_path(&job),
            json!({ "apiVersion": "batch/v1", "kind": "Job", "metadata": { "name": job, "namespace": CHECKS } }),
        );
        state.job_outputs.insert(job.clone(), String::new());
    }
    let output = k8s.run_check(&h100("a100-1"), CheckKind::XidEvents, CheckLevel::Quick).await.expect("ran");
    assert_eq!(output, "", "no XID in the kernel log");
    let lines: Vec<String> = cluster.take_calls().iter().map(|c| c.line()).collect();
    assert_eq!(
        lines[1..5],
        [
            format!("POST /apis/batch/v1/namespaces/{CHECKS}/jobs"),
            format!("DELETE {}", job_path(&job)),
            format!("GET {}", job_path(&job)),
            format!("POST /apis/batch/v1/namespaces/{CHECKS}/jobs"),
        ]
    );
}

#[tokio::test]
async fn a_dedicated_cluster_moves_off_a_failed_node_with_its_dedication_and_pods() {
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    let units = ["h100-1", "h100-2"].iter().flat_map(|n| (0..8).map(move |g| gpu_unit(n, g))).collect();
    let w = workload(Offering::DedicatedCluster, "h100-node-2", vault(), units);
    for step in provision_plan(w.offering, w.shape) {
        run(&k8s, &cluster, &w, step).await;
    }
    let ns = ns(&w);
    // The tenant's pods: one on the node that fails, one on the node that stays.
    for (pod, node) in [("trainer-0", "h100-2"), ("trainer-1", "h100-1")] {
        cluster.lock().objects.insert(
            format!("/api/v1/namespaces/{ns}/pods/{pod}"),
            json!({ "apiVersion": "v1", "kind": "Pod", "metadata": { "name": pod, "namespace": ns }, "spec": { "nodeName": node } }),
        );
    }
    cluster.take_calls();

    // h100-2 failed; a100-1 replaces it.
    let dropped: Vec<_> = w.units.iter().filter(|u| u.node == "h100-2").cloned().collect();
    let moved_units =
        w.units.iter().filter(|u| u.node == "h100-1").cloned().chain((0..8).map(|g| gpu_unit("a100-1", g))).collect();
    let moved = berth_platform::provisioning::backend::Workload { units: moved_units, ..w.clone() };
    assert!(k8s.moves_clusters());
    let connection = k8s.move_cluster(&moved, &dropped).await.expect("moved");
    assert_eq!(connection.secret_label.as_deref(), Some("Kubeconfig"));
    assert!(connection.secret.is_some_and(|k| k.contains(&format!("namespace: {ns}"))));

    let lines: Vec<String> = cluster.take_calls().iter().map(|c| c.line()).collect();
    let pods = format!("/api/v1/namespaces/{ns}/pods");
    assert_eq!(
        lines,
        [
            "PATCH /api/v1/nodes/a100-1".to_owned(),
            "PATCH /api/v1/nodes/h100-1".to_owned(),
            "PATCH /api/v1/nodes/h100-2".to_owned(),
            format!("GET {pods}"),
            format!("DELETE {pods}/trainer-0"),
            format!("GET {pods}"),
            format!("GET /api/v1/namespaces/{ns}/secrets/{}", manifests::Names::of(&w).service_account_token),
        ]
    );
    let tenant_of = |node: &str| cluster.node(node)["metadata"]["labels"]["berth.dev/tenant"].clone();
    assert_eq!(tenant_of("a100-1"), json!("vault"), "the replacement is the tenant's");
    assert_eq!(tenant_of("h100-1"), json!("vault"));
    assert_eq!(tenant_of("h100-2"), Value::Null, "the failed node is given back");
    assert!(cluster.node("h100-2").pointer("/spec/taints").is_none_or(|t| t == &json!([])));
    let left: Vec<String> = cluster.lock().objects.keys().filter(|p| p.contains("/pods/")).cloned().collect();
    assert_eq!(left, [format!("{pods}/trainer-1")], "only the pod on the failed node goes");
}

const FLEET: &str = r#"
[[site]]
name = "test-1"
[[site.pool]]
prefix = "h100"
model = "H100-80GB"
nodes = 1
gpus_per_node = 8
nvlink = true
acceptance = true
"#;

async fn node_state(platform: &Platform, name: &str) -> String {
    sqlx::query_scalar("SELECT state FROM nodes WHERE name = ?").bind(name).fetch_one(platform.db()).await.unwrap()
}

#[sqlx::test(migrations = "../migrations")]
async fn a_new_node_passes_acceptance_through_jobs_and_a_failing_diagnostic_degrades_it(pool: SqlitePool) {
    let fleet = FleetSpec::parse(FLEET).expect("fleet");
    let (cluster, client) = FakeCluster::stateful(&["h100-01".to_owned()]);
    let config = KubernetesConfig { poll_interval: Duration::from_millis(1), ..KubernetesConfig::default() };
    let backend = Arc::new(Kubernetes::with_client(client, config, "https://k8s.test:6443"));
    let platform = Platform::new(production_pool(&pool).await);
    platform.sync_fleet(&fleet).await.expect("sync fleet");
    let platform = platform.with_backend(backend);
    let admin = platform
        .create_user("root@example.com", "Root", "a long passphrase", Role::PlatformAdmin, None)
        .await
        .expect("admin")
        .caller(test_meta());
    assert_eq!(node_state(&platform, "h100-01").await, "new");
    for (kind, output) in
        [(CheckKind::GpuDiagnostics, DIAG_PASS), (CheckKind::MemoryErrors, SMI), (CheckKind::XidEvents, "")]
    {
        cluster.lock().job_outputs.insert(check_job_name("h100-01", kind), output.into());
    }

    let run = platform.run_node_checks(&admin, "h100-01", "quick").await.expect("acceptance");
    assert_eq!((run.purpose.as_str(), run.passed), ("acceptance", Some(true)), "{:#?}", run.results);
    let kinds: Vec<&str> = run.results.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(kinds, ["gpu_diagnostics", "memory_errors", "xid_events"]);
    assert_eq!(run.results[0].raw_output, DIAG_PASS, "the pod's log is kept as the raw output");
    assert_eq!(node_state(&platform, "h100-01").await, "available");
    assert_eq!(platform.node_health(&admin, "h100-01").await.expect("health").status.state, NodeState::Available);

    // The next run's diagnostics find a memory fault: the node is taken out of service.
    cluster.lock().job_outputs.insert(check_job_name("h100-01", CheckKind::GpuDiagnostics), DIAG_FAIL.into());
    let run = platform.run_node_checks(&admin, "h100-01", "quick").await.expect("acceptance");
    assert_eq!(run.passed, Some(false));
    assert!(!run.results[0].passed, "{:?}", run.results[0]);
    assert_eq!(node_state(&platform, "h100-01").await, "degraded");
    let left = cluster.lock().objects.keys().filter(|p| p.contains("/jobs/") || p.contains("/pods/")).count();
    assert_eq!(left, 0, "every check's Job is gone");
}
