//! GPU readings from the DCGM exporter: the exporter pods found through the Service's
//! EndpointSlices on the mock API server, each scraped over real HTTP on loopback, and their
//! pods mapped to environments by the label Berth's manifests give them.

use std::time::Duration;

use berth_platform::provisioning::backend::Backend;
use berth_platform::provisioning::backend::kubernetes::manifests::ENVIRONMENT_LABEL;
use berth_platform::provisioning::backend::kubernetes::{DcgmExporter, Kubernetes, KubernetesConfig};
use serde_json::json;

use crate::kubernetes_api::FakeCluster;
use crate::support::{ENV_ID, OTHER_ENV_ID};

const PAGE: &str = include_str!("../../../domain/fixtures/dcgm/mig-kubernetes.txt");
const SLICES: &str = "/apis/discovery.k8s.io/v1/namespaces/gpu-operator/endpointslices";

/// An exporter on loopback serving `page`; its port.
async fn exporter(page: &'static str) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("listen");
    let port = listener.local_addr().expect("address").port();
    let app = axum::Router::new().route("/metrics", axum::routing::get(move || async move { page }));
    tokio::spawn(async move { axum::serve(listener, app).await.expect("exporter") });
    port
}

fn pod(namespace: &str, name: &str, environment: &str) -> (String, serde_json::Value) {
    (
        format!("/api/v1/namespaces/{namespace}/pods/{name}"),
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": name, "namespace": namespace, "labels": { ENVIRONMENT_LABEL: environment } },
        }),
    )
}

#[tokio::test]
async fn every_ready_exporter_pod_is_read_and_berths_pods_name_their_environments() {
    let port = exporter(PAGE).await;
    let (cluster, client) = FakeCluster::start();
    {
        let mut state = cluster.lock();
        state.objects.insert(
            format!("{SLICES}/nvidia-dcgm-exporter-x2v9q"),
            json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": { "name": "nvidia-dcgm-exporter-x2v9q", "namespace": "gpu-operator",
                              "labels": { "kubernetes.io/service-name": "nvidia-dcgm-exporter" } },
                "addressType": "IPv4",
                "endpoints": [
                    { "addresses": ["127.0.0.1"], "conditions": { "ready": true }, "nodeName": "h100-1" },
                    // Nothing listens there: logged and left out, the others still read.
                    { "addresses": ["127.0.0.2"], "conditions": { "ready": true }, "nodeName": "h100-2" },
                    // Not ready: not scraped at all.
                    { "addresses": ["127.0.0.3"], "conditions": { "ready": false }, "nodeName": "l40s-1" },
                ],
                "ports": [{ "name": "gpu-metrics", "port": port, "protocol": "TCP" }],
            }),
        );
        for (path, object) in [
            pod("berth-acme", "nb-0f1e2d3c4b5a-0", ENV_ID),
            pod("berth-vault-999999998888", "training-x7k2p", OTHER_ENV_ID),
        ] {
            state.objects.insert(path, object);
        }
    }
    let exporter = DcgmExporter { port, ..DcgmExporter::default() };
    let config = KubernetesConfig { dcgm_exporter: Some(exporter), ..KubernetesConfig::default() };
    let backend = Kubernetes::with_client(client, config, "https://k8s.test:6443");

    let readings = backend.gpu_readings().await.expect("readings");
    let mut seen: Vec<(String, i64, Option<String>)> =
        readings.iter().map(|r| (r.node.clone(), r.gpu_index, r.environment.clone())).collect();
    seen.sort();
    let h100 = |gpu, env: Option<&str>| ("h100-1".to_owned(), gpu, env.map(str::to_owned));
    assert_eq!(seen, [h100(0, None), h100(0, Some(ENV_ID)), h100(1, Some(OTHER_ENV_ID)), h100(2, None)]);
    assert!(readings.iter().all(|r| r.period_s == 30.0), "a first read stands for the default period");
    // The exporters, then the pods of Berth's namespaces the page names (not another team's).
    assert_eq!(
        cluster.take_lines(),
        [
            format!("GET {SLICES}"),
            "GET /api/v1/namespaces/berth-acme/pods".to_owned(),
            "GET /api/v1/namespaces/berth-vault-999999998888/pods".to_owned(),
        ]
    );

    // The next read stands for the time since this one.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let again = backend.gpu_readings().await.expect("readings");
    assert!(again.iter().all(|r| (1.0..5.0).contains(&r.period_s)), "{:?}", again.first().map(|r| r.period_s));
}

#[tokio::test]
async fn no_exporter_configured_reads_nothing_and_asks_nothing() {
    let (cluster, client) = FakeCluster::start();
    let config = KubernetesConfig { dcgm_exporter: None, ..KubernetesConfig::default() };
    let backend = Kubernetes::with_client(client, config, "https://k8s.test:6443");
    assert!(backend.gpu_readings().await.expect("readings").is_empty());
    assert!(cluster.take_lines().is_empty());
}

#[tokio::test]
async fn an_exporter_service_berth_may_not_list_is_an_error_for_the_caller_to_log() {
    let (cluster, client) = FakeCluster::start();
    cluster.lock().failing.insert(SLICES.into(), 403);
    let backend = Kubernetes::with_client(client, KubernetesConfig::default(), "https://k8s.test:6443");
    let refused = backend.gpu_readings().await.expect_err("refused");
    assert!(refused.0.contains("Berth is not allowed to list the DCGM exporter's endpoints"), "{}", refused.0);
    assert!(!refused.0.contains("secret internal detail"), "{}", refused.0);
}
