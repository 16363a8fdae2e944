//! What the parts share: tenants, one workload per offering, the backend on a fake cluster, steps run and their requests read.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use berth_domain::catalog::Offering;
use berth_domain::gpu::GpuModel;
use berth_domain::lifecycle::{Step, provision_plan, teardown_plan};
use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use berth_platform::provisioning::backend::kubernetes::manifests::{
    self, ClusterSettings, Manifest, NodeStage, endpoint_manifest, namespace_bundle, node_manifest, workload_manifests,
};
use berth_platform::provisioning::backend::kubernetes::{Kubernetes, KubernetesConfig};
use berth_platform::provisioning::backend::{
    Backend, Holding, Live, ModelAllowance, PlacedUnit, TenantQueue, TenantScope, Workload,
};
use serde_json::{Value, json};

use crate::kubernetes_api;
use crate::kubernetes_api::FakeCluster;

pub const ENV_ID: &str = "0f1e2d3c-4b5a-4978-8a9b-0c1d2e3f4a5b";
pub const OTHER_ENV_ID: &str = "99999999-8888-4777-8666-555555555555";
pub const MIG_MAP: &str = "/api/v1/namespaces/gpu-operator/configmaps";
pub const TENANT_QUEUES: &str = "/apis/kueue.x-k8s.io/v1beta1/clusterqueues";
pub const THIRD_ENV_ID: &str = "77777777-6666-4555-8444-333333333333";

pub fn acme() -> TenantScope {
    TenantScope {
        slug: Some("acme".into()),
        isolation: Isolation::Soft,
        members: vec![
            ("ada@acme.test".into(), Role::TenantAdmin),
            ("bob@acme.test".into(), Role::Member),
            ("cy@acme.test".into(), Role::Viewer),
        ],
    }
}

pub fn vault() -> TenantScope {
    TenantScope {
        slug: Some("vault".into()),
        isolation: Isolation::Hard,
        members: vec![("dee@vault.test".into(), Role::TenantAdmin)],
    }
}

/// Platform staff's own environments belong to no tenant.
pub fn staff() -> TenantScope {
    TenantScope { slug: None, isolation: Isolation::Soft, members: Vec::new() }
}

/// What the sweep would read as live: these environments, and the tenants acme and vault.
pub fn live(environments: &[&str]) -> Live {
    Live {
        environments: environments.iter().map(|e| e.to_string()).collect(),
        tenants: HashSet::from(["acme".to_owned(), "vault".to_owned()]),
    }
}

pub fn mig_unit(node: &str, gpu: i64, start: i64, profile: &str) -> PlacedUnit {
    PlacedUnit {
        environment_id: ENV_ID.into(),
        site: "test-1".into(),
        node: node.into(),
        gpu_index: gpu,
        slice_start: start,
        slice_size: 1,
        mig_profile: Some(profile.into()),
    }
}

pub fn gpu_unit(node: &str, gpu: i64) -> PlacedUnit {
    PlacedUnit {
        environment_id: ENV_ID.into(),
        site: "test-1".into(),
        node: node.into(),
        gpu_index: gpu,
        slice_start: 0,
        slice_size: 8,
        mig_profile: None,
    }
}

pub fn workload(offering: Offering, size: &str, tenant: TenantScope, units: Vec<PlacedUnit>) -> Workload {
    let size = offering.size(size).expect("size in the catalog");
    Workload {
        environment_id: ENV_ID.into(),
        name: format!("my-{}", offering.id()),
        offering,
        shape: size.shape,
        image: match offering {
            Offering::Notebook => Some("quay.io/jupyter/pytorch-notebook:cuda12-latest".into()),
            Offering::TrainingJob => Some("ghcr.io/acme/train:1.4".into()),
            Offering::InferenceEndpoint => Some("vllm/vllm-openai:v0.6.3".into()),
            Offering::DedicatedCluster => None,
        },
        command: match offering {
            Offering::TrainingJob => Some("python train.py --epochs 3".into()),
            _ => None,
        },
        serving: Default::default(),
        units,
        vcpus: size.vcpus,
        memory_gb: size.memory_gb,
        ends_at: 1_800_000_000_000,
        tenant,
        mig_neighbours: Vec::new(),
        tenant_neighbours: Vec::new(),
        tenant_holdings: Vec::new(),
        volumes: Vec::new(),
        tenant_volumes: Vec::new(),
    }
}

/// One case per offering: a MIG notebook of a soft tenant, a 4-GPU training job of a hard
/// tenant, a whole-GPU inference endpoint, and a two-node dedicated cluster; and a
/// training job of platform staff, which has a ClusterQueue of its own.
pub fn cases() -> Vec<(&'static str, Workload)> {
    vec![
        (
            "notebook-mig-soft",
            workload(Offering::Notebook, "h100-1g.10gb", acme(), vec![mig_unit("h100-1", 0, 0, "1g.10gb")]),
        ),
        (
            "training-gpus-hard",
            workload(Offering::TrainingJob, "h100-4", vault(), (0..4).map(|g| gpu_unit("h100-2", g)).collect()),
        ),
        ("inference-gpu-soft", workload(Offering::InferenceEndpoint, "l40s-1", acme(), vec![gpu_unit("l40s-1", 1)])),
        (
            "dedicated-cluster",
            workload(
                Offering::DedicatedCluster,
                "h100-node-2",
                acme(),
                ["h100-1", "h100-2"].iter().flat_map(|n| (0..8).map(move |g| gpu_unit(n, g))).collect(),
            ),
        ),
        ("training-gpu-staff", workload(Offering::TrainingJob, "h100-1", staff(), vec![gpu_unit("h100-1", 0)])),
    ]
}

/// The fleet tenants' queues are sized over: two H100 nodes and one A100 node with MIG,
/// two L40S nodes and one L40S node time-sliced four ways.
pub fn fleet_models(h100: f64, a100: f64, l40s: f64) -> Vec<ModelAllowance> {
    vec![
        ModelAllowance { model: GpuModel::A100_80GB, gpus: a100, whole_gpus: 8, mig_gpus: 8, shared_gpus: vec![] },
        ModelAllowance { model: GpuModel::H100_80GB, gpus: h100, whole_gpus: 16, mig_gpus: 16, shared_gpus: vec![] },
        ModelAllowance { model: GpuModel::L40S, gpus: l40s, whole_gpus: 8, mig_gpus: 0, shared_gpus: vec![(4, 2)] },
    ]
}

/// acme limited to 2.5 H100-equivalents and one of every other model; vault without a
/// limit (the fleet's capacity) and allowed spot.
pub fn tenant_queues() -> Vec<(&'static str, TenantQueue)> {
    vec![
        (
            "limited",
            TenantQueue {
                slug: "acme".into(),
                spot: false,
                nodes: 6,
                models: fleet_models(2.5, 1.0, 1.0),
                space: None,
            },
        ),
        (
            "unlimited-spot",
            TenantQueue {
                slug: "vault".into(),
                spot: true,
                nodes: 6,
                models: fleet_models(16.0, 8.0, 10.0),
                space: None,
            },
        ),
    ]
}

pub fn settings() -> ClusterSettings {
    ClusterSettings::default()
}

pub fn backend(client: kube::Client) -> Kubernetes {
    let config = KubernetesConfig { poll_interval: Duration::from_millis(1), ..KubernetesConfig::default() };
    Kubernetes::with_client(client, config, "https://k8s.test:6443")
}

pub fn ns(w: &Workload) -> String {
    manifests::Names::of(w).namespace
}

pub fn all_steps(w: &Workload) -> Vec<Step> {
    let mut steps = provision_plan(w.offering, w.shape);
    steps.extend(teardown_plan(w.shape));
    steps
}

pub fn objects(manifests: &[Manifest]) -> Value {
    json!(manifests.iter().map(|m| m.object.clone()).collect::<Vec<_>>())
}

pub fn everything(w: &Workload) -> Value {
    let nodes = w.nodes();
    let at = |stage| {
        json!(nodes.iter().filter_map(|n| node_manifest(w, n, stage).unwrap().map(|m| m.object)).collect::<Vec<_>>())
    };
    let mig: Vec<Value> = nodes
        .iter()
        .filter(|n| w.units.iter().any(|u| &u.node == *n && u.mig_profile.is_some()))
        .map(|n| {
            let layout = manifests::node_mig_layout(w, n).unwrap();
            json!({ "node": n, "name": layout.name, "document": manifests::mig_parted_document(&BTreeMap::from([(layout.name.clone(), layout.entry)])) })
        })
        .collect();
    json!({
        "namespace_bundle": objects(&namespace_bundle(w, &settings())),
        "workload": objects(&workload_manifests(w)),
        "credential": manifests::credential_manifest(w, "<random>").map(|m| m.object),
        "endpoint": endpoint_manifest(w).map(|m| m.object),
        "proxy_access": manifests::proxy_access_manifest(w, &settings()).map(|m| m.object),
        "nodes": { "held": at(NodeStage::Held), "cleared": at(NodeStage::Cleared), "released": at(NodeStage::Released) },
        "mig_layouts": mig,
    })
}

pub fn of_kind<'a>(all: &'a [Manifest], kind: &str) -> Vec<&'a Value> {
    all.iter().filter(|m| m.kind.kind == kind).map(|m| &m.object).collect()
}

pub fn strings(v: &Value) -> Vec<&str> {
    v.as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default()
}

pub fn bundle_calls(ns: &str, own_queue: bool) -> Vec<String> {
    let rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces";
    vec![
        format!("PATCH /api/v1/namespaces/{ns}"),
        format!("PATCH /api/v1/namespaces/{ns}/resourcequotas/berth"),
        format!("PATCH /api/v1/namespaces/{ns}/limitranges/berth"),
        format!("PATCH /apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/berth-default-deny"),
        format!("PATCH {rbac}/{ns}/roles/berth-admin"),
        format!("PATCH {rbac}/{ns}/roles/berth-edit"),
        format!("PATCH {rbac}/{ns}/roles/berth-view"),
        format!("PATCH {rbac}/{ns}/rolebindings/berth-tenant-admins"),
        format!("PATCH {rbac}/{ns}/rolebindings/berth-members"),
        format!("PATCH {rbac}/{ns}/rolebindings/berth-viewers"),
    ]
    .into_iter()
    .chain(own_queue.then(|| format!("PATCH /apis/kueue.x-k8s.io/v1beta1/clusterqueues/{ns}")))
    .chain([format!("PATCH /apis/kueue.x-k8s.io/v1beta1/namespaces/{ns}/localqueues/berth")])
    .collect()
}

pub fn with(mut calls: Vec<String>, more: &[String]) -> Vec<String> {
    calls.extend_from_slice(more);
    calls
}

/// Runs one step and returns its requests.
pub async fn run(k8s: &Kubernetes, cluster: &FakeCluster, w: &Workload, step: Step) -> Vec<kubernetes_api::Call> {
    k8s.run(w, step).await.unwrap_or_else(|e| panic!("{}: {e}", step.as_str()));
    cluster.take_calls()
}

pub fn body_of<'a>(calls: &'a [kubernetes_api::Call], line: &str) -> &'a Value {
    calls
        .iter()
        .find(|c| c.line() == line)
        .and_then(|c| c.body.as_ref())
        .unwrap_or_else(|| panic!("no body for {line}"))
}

pub fn assert_nothing_left(cluster: &FakeCluster, case: &str) {
    assert_eq!(cluster.environment_objects(), Vec::<String>::new(), "{case}: objects left behind");
    assert_eq!(cluster.mig_layouts(), Vec::<String>::new(), "{case}: MIG layouts left in the ConfigMap");
    for node in kubernetes_api::NODES {
        let n = cluster.node(node);
        let labels = &n["metadata"]["labels"];
        assert!(
            labels.get("berth.dev/tenant").is_none() && labels.get("berth.dev/environment").is_none(),
            "{case}: {n}"
        );
        assert!(n.pointer("/spec/taints").is_none_or(|t| t == &json!([])), "{case}: taint left on {node}");
        assert!(
            labels.get("nvidia.com/mig.config").is_none_or(|v| v == "all-disabled"),
            "{case}: MIG layout left on {node}"
        );
    }
}

/// Two environments of acme in its namespace: the MIG notebook, and an L40S endpoint of
/// two replicas, each told of the other as the reconciler tells them.
pub fn acme_pair() -> (Workload, Workload) {
    let notebook = cases().remove(0).1;
    let mut endpoint =
        workload(Offering::InferenceEndpoint, "l40s-1", acme(), vec![gpu_unit("l40s-1", 1), gpu_unit("l40s-1", 2)]);
    endpoint.environment_id = OTHER_ENV_ID.into();
    for u in &mut endpoint.units {
        u.environment_id = OTHER_ENV_ID.into();
    }
    let notebook_told = Workload { tenant_holdings: vec![Holding::of(&endpoint)], ..notebook.clone() };
    let endpoint_told = Workload { tenant_holdings: vec![Holding::of(&notebook)], ..endpoint };
    (notebook_told, endpoint_told)
}
