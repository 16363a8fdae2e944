//! Reaching what was booked: the proxy's upstream, training logs and exit status, endpoint replicas.

use std::time::Duration;

use berth_domain::catalog::Offering;
use berth_domain::lifecycle::provision_plan;
use berth_platform::provisioning::backend::kubernetes::Kubernetes;
use berth_platform::provisioning::backend::kubernetes::manifests::{self};
use berth_platform::provisioning::backend::{Backend, JobStatus, Workload};
use serde_json::{Value, json};

use crate::kubernetes_api;
use crate::kubernetes_api::FakeCluster;
use crate::support::{ENV_ID, MIG_MAP, acme, backend, body_of, cases, gpu_unit, mig_unit, ns, staff, workload};

async fn provisioned(w: &Workload) -> (FakeCluster, Kubernetes) {
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    for step in provision_plan(w.offering, w.shape) {
        k8s.run(w, step).await.unwrap();
    }
    cluster.take_calls();
    (cluster, k8s)
}

fn stored_secret(cluster: &FakeCluster, w: &Workload) -> String {
    let name = manifests::Names::of(w).credential;
    let stored = cluster.lock().objects[&format!("/api/v1/namespaces/{}/secrets/{name}", ns(w))].clone();
    let encoded = stored["data"]["value"].as_str().unwrap().to_owned();
    String::from_utf8(base64::Engine::decode(&base64::engine::general_purpose::STANDARD, encoded).unwrap()).unwrap()
}

#[tokio::test]
async fn the_proxy_reaches_notebooks_and_endpoints_by_their_service_names() {
    for (case, w) in cases() {
        let (cluster, k8s) = provisioned(&w).await;
        let ns = ns(&w);
        let upstream = k8s.upstream(&w).await;
        let calls = cluster.take_lines();
        match w.offering {
            Offering::Notebook | Offering::InferenceEndpoint => {
                let upstream = upstream.unwrap_or_else(|e| panic!("{case}: {e}"));
                let name = manifests::Names::of(&w);
                assert_eq!(calls, [format!("GET /api/v1/namespaces/{ns}/secrets/{}", name.credential)], "{case}");
                let (port, scheme) = if w.offering == Offering::Notebook { (8888, "token") } else { (8000, "Bearer") };
                assert_eq!(
                    upstream.base_url,
                    format!("http://{}.{ns}.svc.cluster.local:{port}", name.workload),
                    "{case}"
                );
                let secret = stored_secret(&cluster, &w);
                assert_eq!(upstream.headers, [("authorization".to_owned(), format!("{scheme} {secret}"))], "{case}");
            }
            _ => {
                assert!(upstream.is_err(), "{case}: nothing to proxy");
                assert_eq!(calls, Vec::<String>::new(), "{case}: and nothing asked");
            }
        }
    }
    // A notebook whose credential vanished says so instead of proxying without it.
    let w = cases().remove(0).1;
    let (cluster, k8s) = provisioned(&w).await;
    let credential = manifests::Names::of(&w).credential;
    assert_eq!(credential, "nb-0f1e2d3c4b5a-token", "named after the environment in its tenant's namespace");
    cluster.lock().objects.retain(|path, _| !path.ends_with(&format!("/secrets/{credential}")));
    let error = k8s.upstream(&w).await.unwrap_err();
    assert_eq!(error.0, format!("the workload's credential (Secret {credential}) is missing"));
}

fn training_pod(w: &Workload, state: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "training-x7k2p", "namespace": ns(w), "creationTimestamp": "2026-05-01T10:00:00Z",
            "labels": { "berth.dev/environment": ENV_ID, "app.kubernetes.io/component": "training" },
        },
        "status": { "containerStatuses": [{ "name": "training", "image": "ghcr.io/acme/train:1.4", "imageID": "",
            "ready": false, "restartCount": 0, "state": state }] },
    })
}

#[tokio::test]
async fn training_logs_and_exit_status_come_from_the_job_and_its_pod() {
    let w = cases().into_iter().find(|(c, _)| *c == "training-gpus-hard").unwrap().1;
    let (cluster, k8s) = provisioned(&w).await;
    let ns = ns(&w);
    let job = format!("GET /apis/batch/v1/namespaces/{ns}/jobs/training");
    let pods = format!("GET /api/v1/namespaces/{ns}/pods");
    let log = format!("GET /api/v1/namespaces/{ns}/pods/training-x7k2p/log");

    // Queued: no pod yet.
    let logs = k8s.job_logs(&w, 200).await.unwrap();
    assert_eq!((logs.status, logs.lines.len()), (JobStatus::Pending, 0));
    let calls = cluster.take_calls();
    assert_eq!(calls.iter().map(kubernetes_api::Call::line).collect::<Vec<_>>(), [job.clone(), pods.clone()]);
    assert!(calls[1].query.contains("labelSelector=berth.dev%2Fenvironment%3D"), "{}", calls[1].query);

    // Running: the pod's log, its last lines.
    let pod = training_pod(&w, json!({ "running": { "startedAt": "2026-05-01T10:00:05Z" } }));
    cluster.lock().objects.insert(format!("/api/v1/namespaces/{ns}/pods/training-x7k2p"), pod);
    cluster.lock().pod_logs.insert("training-x7k2p".into(), "epoch 1/3 loss 0.9\nepoch 2/3 loss 0.5\n".into());
    let logs = k8s.job_logs(&w, 200).await.unwrap();
    assert_eq!(logs.status, JobStatus::Running);
    assert_eq!(logs.lines, ["epoch 1/3 loss 0.9", "epoch 2/3 loss 0.5"]);
    let calls = cluster.take_calls();
    assert_eq!(
        calls.iter().map(kubernetes_api::Call::line).collect::<Vec<_>>(),
        [job.clone(), pods.clone(), log.clone()]
    );
    assert!(
        calls[2].query.contains("container=training") && calls[2].query.contains("tailLines=200"),
        "{}",
        calls[2].query
    );

    // Failed: the container's exit code and reason.
    let ended = json!({ "terminated": { "exitCode": 3, "reason": "Error", "finishedAt": "2026-05-01T10:09:00Z" } });
    cluster.lock().objects.insert(format!("/api/v1/namespaces/{ns}/pods/training-x7k2p"), training_pod(&w, ended));
    cluster.lock().job_status = Some(json!({ "failed": 1 }));
    let logs = k8s.job_logs(&w, 200).await.unwrap();
    assert_eq!(logs.status, JobStatus::Failed { exit_code: Some(3), reason: "Error".into() });
    assert_eq!(logs.lines.len(), 2, "a finished pod's log stays readable");
    cluster.take_calls();

    cluster.lock().job_status = Some(json!({ "succeeded": 1 }));
    assert_eq!(k8s.job_logs(&w, 200).await.unwrap().status, JobStatus::Succeeded);

    // A notebook has no log here, and asks the cluster nothing for it.
    let notebook = cases().remove(0).1;
    cluster.take_calls();
    assert!(k8s.job_logs(&notebook, 200).await.is_err());
    assert_eq!(cluster.take_calls().len(), 0);
}

#[tokio::test]
async fn scaling_an_endpoint_sizes_quota_and_queue_for_every_replica() {
    // Platform staff's endpoint, whose own queue follows its booking (a tenant's queue
    // follows the tenant's quota, not a booking: see the next test).
    let soft = cases().into_iter().find(|(c, _)| *c == "inference-gpu-soft").unwrap().1;
    let one = Workload { tenant: staff(), ..soft };
    let (cluster, k8s) = provisioned(&one).await;
    let ns = ns(&one);
    let quota = format!("PATCH /api/v1/namespaces/{ns}/resourcequotas/berth");
    let queue = format!("PATCH /apis/kueue.x-k8s.io/v1beta1/clusterqueues/{ns}");
    let deployment = format!("PATCH /apis/apps/v1/namespaces/{ns}/deployments/inference");

    let two = Workload { units: vec![gpu_unit("l40s-1", 1), gpu_unit("l40s-1", 0)], ..one.clone() };
    assert_eq!(two.replicas(), 2);
    k8s.scale(&two, &[]).await.unwrap();
    let calls = cluster.take_calls();
    assert_eq!(
        calls.iter().map(kubernetes_api::Call::line).collect::<Vec<_>>(),
        [quota.clone(), queue.clone(), deployment.clone()]
    );
    let hard = &body_of(&calls, &quota)["spec"]["hard"];
    assert_eq!((hard["requests.nvidia.com/gpu"].as_str(), hard["requests.cpu"].as_str()), (Some("2"), Some("32")));
    assert_eq!(hard["requests.memory"], "256Gi");
    let spec = &body_of(&calls, &deployment)["spec"];
    assert_eq!(spec["replicas"], 2);
    let limits = &spec["template"]["spec"]["containers"][0]["resources"]["limits"];
    assert_eq!(
        (limits["nvidia.com/gpu"].as_str(), limits["cpu"].as_str()),
        (Some("1"), Some("16")),
        "each replica its size"
    );
    let queued = &body_of(&calls, &queue)["spec"]["resourceGroups"][0]["flavors"][0]["resources"];
    assert!(
        queued
            .as_array()
            .unwrap()
            .contains(&json!({ "name": "nvidia.com/gpu", "nominalQuota": "2", "borrowingLimit": "0" })),
        "{queued}"
    );

    // Down again: the surplus pod must be gone before the GPU is given back.
    let pod = |name: &str| {
        json!({ "apiVersion": "v1", "kind": "Pod", "metadata": { "name": name, "namespace": ns,
            "labels": { "berth.dev/environment": ENV_ID, "app.kubernetes.io/component": "inference" } } })
    };
    let pods = format!("/api/v1/namespaces/{ns}/pods");
    cluster.lock().objects.insert(format!("{pods}/inference-a"), pod("inference-a"));
    cluster.lock().objects.insert(format!("{pods}/inference-b"), pod("inference-b"));
    let state = cluster.state.clone();
    let terminating = format!("{pods}/inference-b");
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        state.lock().unwrap().objects.remove(&terminating);
    });
    k8s.scale(&one, &[gpu_unit("l40s-1", 0)]).await.unwrap();
    let lines = cluster.take_lines();
    assert_eq!(lines[..3], [quota.clone(), queue.clone(), deployment.clone()]);
    assert!(lines.len() > 4 && lines[3..].iter().all(|l| *l == format!("GET {pods}")), "waits for the pods: {lines:?}");
    assert!(!cluster.lock().objects.contains_key(&format!("{pods}/inference-b")));

    // A second scale to the same count changes nothing but applies.
    let converged = cluster.snapshot();
    k8s.scale(&one, &[]).await.unwrap();
    assert!(cluster.take_calls().iter().all(|c| c.method == "PATCH"));
    assert_eq!(cluster.snapshot(), converged);

    // Only endpoints scale.
    assert!(k8s.scale(&cases().remove(0).1, &[]).await.is_err());
}

#[tokio::test]
async fn a_mig_endpoint_scaled_onto_another_node_partitions_it_and_clears_it_when_it_leaves() {
    let one = workload(Offering::InferenceEndpoint, "h100-1g.10gb", acme(), vec![mig_unit("h100-1", 0, 0, "1g.10gb")]);
    let (cluster, k8s) = provisioned(&one).await;
    let ns = ns(&one);
    let second = mig_unit("h100-2", 1, 0, "1g.10gb");
    let two = Workload { units: vec![one.units[0].clone(), second.clone()], ..one.clone() };
    k8s.scale(&two, &[]).await.unwrap();
    let layout = manifests::node_mig_layout(&two, "h100-2").unwrap();
    assert_eq!(
        cluster.take_lines(),
        [
            format!("GET {MIG_MAP}/berth-mig-parted-config"),
            "PATCH /api/v1/nodes/h100-1".into(),
            "GET /api/v1/nodes/h100-1".into(),
            format!("GET {MIG_MAP}/berth-mig-parted-config"),
            format!("PUT {MIG_MAP}/berth-mig-parted-config"),
            "PATCH /api/v1/nodes/h100-2".into(),
            "GET /api/v1/nodes/h100-2".into(),
            format!("PATCH /api/v1/namespaces/{ns}/resourcequotas/berth"),
            format!("PATCH /apis/apps/v1/namespaces/{ns}/deployments/{}", manifests::Names::of(&two).workload),
        ],
        "the new node gets its layout, confirmed, before the replica is asked for; the tenant's queue is not the booking's"
    );
    assert_eq!(cluster.node("h100-2")["metadata"]["labels"]["nvidia.com/mig.config"], json!(layout.name));

    k8s.scale(&one, std::slice::from_ref(&second)).await.unwrap();
    let lines = cluster.take_lines();
    assert_eq!(lines.last().map(String::as_str), Some("PATCH /api/v1/nodes/h100-2"), "{lines:?}");
    assert_eq!(cluster.node("h100-2")["metadata"]["labels"]["nvidia.com/mig.config"], "all-disabled");
    assert_eq!(
        cluster.node("h100-1")["metadata"]["labels"]["nvidia.com/mig.config"],
        json!(manifests::node_mig_layout(&one, "h100-1").unwrap().name)
    );
}
