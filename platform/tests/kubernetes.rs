//! The Kubernetes backend against a mock API server: the exact requests of every step of
//! every offering, golden manifests, the tenant-namespace security checklist, full
//! provision/teardown, a second pass over a converged environment, crashes after each
//! step, MIG layouts shared with neighbours (and kept in the mig-parted ConfigMap only
//! while needed), tenants' Kueue ClusterQueues, soft tenants' namespaces shared by their
//! environments, and the orphan sweep.
#![allow(clippy::expect_used, clippy::unwrap_used)] // a failed expectation stops the test with its message

mod kubernetes_api;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use berth_domain::catalog::Offering;
use berth_domain::gpu::GpuModel;
use berth_domain::lifecycle::{Step, provision_plan, teardown_plan};
use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use berth_platform::provisioning::backend::kubernetes::manifests::{
    self, ClusterSettings, Manifest, NodeStage, endpoint_manifest, namespace_bundle, node_manifest,
    tenant_cluster_queue, tenant_namespace_bundle, workload_manifests,
};
use berth_platform::provisioning::backend::kubernetes::{Kubernetes, KubernetesConfig};
use berth_platform::provisioning::backend::{
    Backend, Holding, JobStatus, Live, ModelAllowance, OwnedObject, PlacedUnit, TenantQueue, TenantScope, TenantSpace,
    Workload, orphans,
};
use kubernetes_api::FakeCluster;
use serde_json::{Value, json};

const ENV_ID: &str = "0f1e2d3c-4b5a-4978-8a9b-0c1d2e3f4a5b";
const OTHER_ENV_ID: &str = "99999999-8888-4777-8666-555555555555";

fn acme() -> TenantScope {
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

fn vault() -> TenantScope {
    TenantScope {
        slug: Some("vault".into()),
        isolation: Isolation::Hard,
        members: vec![("dee@vault.test".into(), Role::TenantAdmin)],
    }
}

/// Platform staff's own environments belong to no tenant.
fn staff() -> TenantScope {
    TenantScope { slug: None, isolation: Isolation::Soft, members: Vec::new() }
}

/// What the sweep would read as live: these environments, and the tenants acme and vault.
fn live(environments: &[&str]) -> Live {
    Live {
        environments: environments.iter().map(|e| e.to_string()).collect(),
        tenants: HashSet::from(["acme".to_owned(), "vault".to_owned()]),
    }
}

fn mig_unit(node: &str, gpu: i64, start: i64, profile: &str) -> PlacedUnit {
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

fn gpu_unit(node: &str, gpu: i64) -> PlacedUnit {
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

fn workload(offering: Offering, size: &str, tenant: TenantScope, units: Vec<PlacedUnit>) -> Workload {
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
        units,
        vcpus: size.vcpus,
        memory_gb: size.memory_gb,
        ends_at: 1_800_000_000_000,
        tenant,
        mig_neighbours: Vec::new(),
        tenant_neighbours: Vec::new(),
        tenant_holdings: Vec::new(),
    }
}

/// One case per offering: a MIG notebook of a soft tenant, a 4-GPU training job of a hard
/// tenant, a whole-GPU inference endpoint, and a two-node dedicated cluster; and a
/// training job of platform staff, which has a ClusterQueue of its own.
fn cases() -> Vec<(&'static str, Workload)> {
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
fn fleet_models(h100: f64, a100: f64, l40s: f64) -> Vec<ModelAllowance> {
    vec![
        ModelAllowance { model: GpuModel::A100_80GB, gpus: a100, whole_gpus: 8, mig_gpus: 8, shared_gpus: vec![] },
        ModelAllowance { model: GpuModel::H100_80GB, gpus: h100, whole_gpus: 16, mig_gpus: 16, shared_gpus: vec![] },
        ModelAllowance { model: GpuModel::L40S, gpus: l40s, whole_gpus: 8, mig_gpus: 0, shared_gpus: vec![(4, 2)] },
    ]
}

/// acme limited to 2.5 H100-equivalents and one of every other model; vault without a
/// limit (the fleet's capacity) and allowed spot.
fn tenant_queues() -> Vec<(&'static str, TenantQueue)> {
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

fn settings() -> ClusterSettings {
    ClusterSettings::default()
}

fn backend(client: kube::Client) -> Kubernetes {
    let config = KubernetesConfig { poll_interval: Duration::from_millis(1), ..KubernetesConfig::default() };
    Kubernetes::with_client(client, config, "https://k8s.test:6443")
}

fn ns(w: &Workload) -> String {
    manifests::Names::of(w).namespace
}

fn all_steps(w: &Workload) -> Vec<Step> {
    let mut steps = provision_plan(w.offering, w.shape);
    steps.extend(teardown_plan(w.shape));
    steps
}

// ---------------------------------------------------------------------------------------
// Golden manifests

fn golden_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/kubernetes").join(format!("{name}.json"))
}

fn objects(manifests: &[Manifest]) -> Value {
    json!(manifests.iter().map(|m| m.object.clone()).collect::<Vec<_>>())
}

fn everything(w: &Workload) -> Value {
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

#[test]
fn manifests_match_the_golden_files() {
    let bless = std::env::var_os("BLESS").is_some();
    let mut stale = Vec::new();
    let mut goldens: Vec<(&str, Value)> = cases().into_iter().map(|(name, w)| (name, everything(&w))).collect();
    let queues: serde_json::Map<String, Value> = tenant_queues()
        .into_iter()
        .map(|(case, q)| (case.to_owned(), tenant_cluster_queue(&q, &settings()).object))
        .collect();
    goldens.push(("tenant-queues", Value::Object(queues)));
    // A soft tenant's namespace as its sync applies it: with the MIG notebook and the
    // two-replica endpoint in it, and with nobody.
    let (notebook, endpoint) = acme_pair();
    let both = TenantSpace { members: acme().members, holdings: vec![Holding::of(&notebook), Holding::of(&endpoint)] };
    let nobody = TenantSpace { members: acme().members, holdings: vec![] };
    goldens.push((
        "tenant-namespace",
        json!({
            "two_environments": objects(&tenant_namespace_bundle("acme", &both, &settings())),
            "nobody": objects(&tenant_namespace_bundle("acme", &nobody, &settings())),
        }),
    ));
    for (name, golden) in goldens {
        let path = golden_path(name);
        let actual = serde_json::to_string_pretty(&golden).unwrap() + "\n";
        if bless {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &actual).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&path).unwrap_or_default();
        if expected != actual {
            stale.push(name);
        }
    }
    assert!(
        stale.is_empty(),
        "manifests differ from tests/golden/kubernetes/ for {stale:?}; review and run with BLESS=1"
    );
}

#[test]
fn a_media_extension_slice_is_asked_for_by_the_device_plugins_name() {
    let w = workload(Offering::Notebook, "h100-1g.10gb", acme(), vec![mig_unit("h100-1", 0, 0, "1g.10gb+me")]);
    let resources = manifests::gpu_resources(&w);
    assert_eq!(resources.into_iter().collect::<Vec<_>>(), [("nvidia.com/mig-1g.10gb.me".to_owned(), 1)]);
}

#[test]
fn a_development_share_asks_for_a_time_sliced_gpu_never_a_whole_one() {
    let share = PlacedUnit { slice_start: 2, slice_size: 2, ..gpu_unit("l40s-dev-01", 0) };
    let w = workload(Offering::Notebook, "l40s-dev", acme(), vec![share]);
    let resources = manifests::gpu_resources(&w);
    assert_eq!(resources.into_iter().collect::<Vec<_>>(), [("nvidia.com/gpu.shared".to_owned(), 1)]);
}

/// Every core manifest survives a round trip through k8s-openapi's types unchanged, so
/// no field is misspelt or misplaced (an unknown field would be dropped).
#[test]
fn manifests_are_valid_kubernetes_objects() {
    use k8s_openapi::api::{apps, batch, core, networking, rbac};
    fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(m: &Manifest) {
        let typed: T =
            serde_json::from_value(m.object.clone()).unwrap_or_else(|e| panic!("{} {}: {e}", m.kind.kind, m.name()));
        let back = serde_json::to_value(&typed).unwrap();
        assert_eq!(back, m.object, "{} {} changed in a round trip", m.kind.kind, m.name());
    }
    for (_, w) in cases() {
        let mut all = namespace_bundle(&w, &settings());
        all.extend(workload_manifests(&w));
        all.extend(endpoint_manifest(&w));
        all.extend(manifests::proxy_access_manifest(&w, &settings()));
        all.extend(manifests::credential_manifest(&w, "x"));
        for node in w.nodes() {
            for stage in [NodeStage::Held, NodeStage::Cleared, NodeStage::Released] {
                all.extend(node_manifest(&w, &node, stage).unwrap());
            }
        }
        for m in &all {
            match m.kind.kind {
                "Namespace" => round_trip::<core::v1::Namespace>(m),
                "Node" => round_trip::<core::v1::Node>(m),
                "ResourceQuota" => round_trip::<core::v1::ResourceQuota>(m),
                "LimitRange" => round_trip::<core::v1::LimitRange>(m),
                "Service" => round_trip::<core::v1::Service>(m),
                "Secret" => round_trip::<core::v1::Secret>(m),
                "ServiceAccount" => round_trip::<core::v1::ServiceAccount>(m),
                "NetworkPolicy" => round_trip::<networking::v1::NetworkPolicy>(m),
                "Role" => round_trip::<rbac::v1::Role>(m),
                "RoleBinding" => round_trip::<rbac::v1::RoleBinding>(m),
                "StatefulSet" => round_trip::<apps::v1::StatefulSet>(m),
                "Deployment" => round_trip::<apps::v1::Deployment>(m),
                "Job" => round_trip::<batch::v1::Job>(m),
                "ClusterQueue" | "LocalQueue" => {}
                other => panic!("no check for {other}"),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The security checklist's "Tenant namespaces on Kubernetes", item by item

fn of_kind<'a>(all: &'a [Manifest], kind: &str) -> Vec<&'a Value> {
    all.iter().filter(|m| m.kind.kind == kind).map(|m| &m.object).collect()
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default()
}

#[test]
fn every_tenant_namespace_meets_the_security_checklist() {
    for (name, w) in cases() {
        let mut all = namespace_bundle(&w, &settings());
        all.extend(workload_manifests(&w));
        all.extend(endpoint_manifest(&w));

        // 1. Pod Security `restricted`, and pods that pass it.
        let namespace = of_kind(&all, "Namespace");
        assert_eq!(namespace.len(), 1, "{name}");
        for mode in ["enforce", "audit", "warn"] {
            assert_eq!(
                namespace[0]["metadata"]["labels"][format!("pod-security.kubernetes.io/{mode}")],
                "restricted",
                "{name}: {mode}"
            );
        }
        for m in all.iter().filter(|m| ["StatefulSet", "Deployment", "Job"].contains(&m.kind.kind)) {
            let pod = &m.object["spec"]["template"]["spec"];
            assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{name}");
            assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault", "{name}");
            for key in ["hostNetwork", "hostPID", "hostIPC"] {
                assert!(pod.get(key).is_none_or(|v| v == false), "{name}: {key}");
            }
            assert!(
                pod["volumes"].as_array().is_none_or(|v| v.iter().all(|v| v.get("hostPath").is_none())),
                "{name}: hostPath"
            );
            for c in pod["containers"].as_array().unwrap() {
                let sc = &c["securityContext"];
                assert_eq!(sc["allowPrivilegeEscalation"], false, "{name}");
                assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"], "{name}");
                assert!(sc.get("privileged").is_none_or(|v| v == false), "{name}");
                assert!(
                    c["ports"].as_array().is_none_or(|p| p.iter().all(|p| p.get("hostPort").is_none())),
                    "{name}: hostPort"
                );
            }
        }

        // 2. ResourceQuota: CPU, memory, storage, object counts, no NodePorts or
        // LoadBalancers, and the booked GPU resources.
        let quota = of_kind(&all, "ResourceQuota");
        assert_eq!(quota.len(), 1, "{name}");
        let hard = &quota[0]["spec"]["hard"];
        for key in [
            "requests.cpu",
            "limits.cpu",
            "requests.memory",
            "limits.memory",
            "requests.storage",
            "pods",
            "services",
            "persistentvolumeclaims",
        ] {
            assert!(hard.get(key).is_some(), "{name}: quota lacks {key}");
        }
        assert_eq!(hard["services.nodeports"], "0", "{name}");
        assert_eq!(hard["services.loadbalancers"], "0", "{name}");
        assert_eq!(hard["requests.cpu"], w.vcpus.to_string(), "{name}");
        let gpu_keys: BTreeMap<String, String> = hard
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| k.starts_with("requests.nvidia.com/"))
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
            .collect();
        let mut booked: BTreeMap<String, String> =
            manifests::gpu_resources(&w).into_iter().map(|(k, v)| (format!("requests.{k}"), v.to_string())).collect();
        assert!(!booked.is_empty(), "{name}");
        let shared = manifests::shares_tenant_namespace(&w);
        if shared {
            // A tenant's namespace names whole and time-sliced GPUs even when nobody
            // there holds one: zero of them, not any number.
            for key in ["requests.nvidia.com/gpu", "requests.nvidia.com/gpu.shared"] {
                booked.entry(key.to_owned()).or_insert_with(|| "0".to_owned());
            }
        }
        assert_eq!(gpu_keys, booked, "{name}: GPU quota equals the booking");

        // 3. LimitRange with defaults; default-deny NetworkPolicy allowing the namespace and DNS.
        let limits = of_kind(&all, "LimitRange");
        assert_eq!(limits.len(), 1, "{name}");
        let container =
            limits[0]["spec"]["limits"].as_array().unwrap().iter().find(|l| l["type"] == "Container").unwrap();
        assert!(container.get("default").is_some() && container.get("defaultRequest").is_some(), "{name}");
        let policies = of_kind(&all, "NetworkPolicy");
        assert_eq!(policies.len(), 1, "{name}");
        let spec = &policies[0]["spec"];
        assert_eq!(spec["podSelector"], json!({}), "{name}: applies to every pod");
        assert_eq!(strings(&spec["policyTypes"]), ["Ingress", "Egress"], "{name}");
        assert_eq!(
            spec["ingress"],
            json!([{ "from": [{ "podSelector": {} }] }]),
            "{name}: only the namespace may connect"
        );
        for rule in spec["egress"].as_array().unwrap() {
            let same_namespace = rule["to"] == json!([{ "podSelector": {} }]) && rule.get("ports").is_none();
            let dns = rule["to"][0]["podSelector"]["matchLabels"]["k8s-app"] == "kube-dns"
                && rule["ports"].as_array().unwrap().iter().all(|p| p["port"] == 53);
            assert!(same_namespace || dns, "{name}: egress beyond the namespace and DNS: {rule}");
        }
        // The one way in besides the namespace: Berth's proxy, to the workload's http port.
        if let Some(proxy) = manifests::proxy_access_manifest(&w, &settings()) {
            let spec = &proxy.object["spec"];
            assert_eq!(strings(&spec["policyTypes"]), ["Ingress"], "{name}: the proxy policy adds no egress");
            let component = manifests::Names::of(&w).component;
            assert_eq!(
                spec["podSelector"]["matchLabels"],
                json!({ "berth.dev/environment": ENV_ID, "app.kubernetes.io/component": component }),
                "{name}: only the workload's pods"
            );
            assert_eq!(
                spec["ingress"],
                json!([{
                    "from": [{ "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": "berth" } } }],
                    "ports": [{ "protocol": "TCP", "port": "http" }],
                }]),
                "{name}: only Berth's namespace, only the http port"
            );
        }

        // 4. RoleBindings: no escalate, bind, impersonate; no writes to quotas, limits or
        // network policies; nothing cluster-scoped.
        assert!(of_kind(&all, "ClusterRole").is_empty() && of_kind(&all, "ClusterRoleBinding").is_empty(), "{name}");
        let roles: BTreeMap<&str, &Value> =
            of_kind(&all, "Role").into_iter().map(|r| (r["metadata"]["name"].as_str().unwrap(), r)).collect();
        for binding in of_kind(&all, "RoleBinding") {
            assert_eq!(binding["roleRef"]["kind"], "Role", "{name}: bindings grant namespaced Roles only");
            let role = roles.get(binding["roleRef"]["name"].as_str().unwrap()).expect("bound role in the bundle");
            for rule in role["rules"].as_array().unwrap() {
                let verbs = strings(&rule["verbs"]);
                let resources = strings(&rule["resources"]);
                assert!(!verbs.iter().any(|v| ["escalate", "bind", "impersonate", "*"].contains(v)), "{name}: {rule}");
                assert!(!resources.contains(&"*") && !strings(&rule["apiGroups"]).contains(&"*"), "{name}: {rule}");
                if resources.iter().any(|r| ["resourcequotas", "limitranges", "networkpolicies"].contains(r)) {
                    assert!(verbs.iter().all(|v| ["get", "list", "watch"].contains(v)), "{name}: {rule}");
                }
                assert!(rule.get("nonResourceURLs").is_none(), "{name}");
            }
        }
        // Berth roles map to Berth's Roles.
        let bound: BTreeMap<&str, &str> = of_kind(&all, "RoleBinding")
            .into_iter()
            .map(|b| (b["metadata"]["name"].as_str().unwrap(), b["roleRef"]["name"].as_str().unwrap()))
            .collect();
        assert_eq!(bound.get("berth-tenant-admins"), Some(&"berth-admin"), "{name}");
        assert_eq!(bound.get("berth-members"), Some(&"berth-edit"), "{name}");
        assert_eq!(bound.get("berth-viewers"), Some(&"berth-view"), "{name}");
        // Queues are cluster-scoped: no Role reaches them, nor the namespace's own labels
        // (which pick the tenant's ClusterQueue).
        for role in roles.values() {
            for rule in role["rules"].as_array().unwrap() {
                let resources = strings(&rule["resources"]);
                assert!(
                    !resources
                        .iter()
                        .any(|r| ["clusterqueues", "namespaces", "resourceflavors", "cohorts"].contains(r)),
                    "{name}: {rule}"
                );
            }
        }
        // Kueue: the LocalQueue feeds the tenant's ClusterQueue, which admits the namespace
        // by the labels Berth gives it; staff's environment has a queue of its own.
        let local = of_kind(&all, "LocalQueue");
        assert_eq!(local.len(), 1, "{name}");
        let own = of_kind(&all, "ClusterQueue");
        match &w.tenant.slug {
            Some(slug) => {
                assert_eq!(local[0]["spec"]["clusterQueue"], format!("berth-tenant-{slug}"), "{name}");
                assert!(own.is_empty(), "{name}: no queue of its own");
                let ns_labels = &namespace[0]["metadata"]["labels"];
                assert_eq!(ns_labels["berth.dev/tenant"], json!(slug), "{name}");
                assert_eq!(ns_labels["app.kubernetes.io/managed-by"], "berth", "{name}");
            }
            None => {
                assert_eq!(own.len(), 1, "{name}");
                assert_eq!(local[0]["spec"]["clusterQueue"], own[0]["metadata"]["name"], "{name}");
                assert_eq!(
                    own[0]["spec"]["namespaceSelector"],
                    json!({ "matchLabels": { "kubernetes.io/metadata.name": ns(&w) } }),
                    "{name}: its own namespace only"
                );
                for r in own[0]["spec"]["resourceGroups"][0]["flavors"][0]["resources"].as_array().unwrap() {
                    assert_eq!(r["borrowingLimit"], "0", "{name}: never beyond its booking: {r}");
                }
            }
        }

        // Owner labels on everything: the environment's on what is its own, the tenant's
        // alone on what a tenant's namespace holds for all its environments.
        let bundle = namespace_bundle(&w, &settings()).len();
        for (i, m) in all.iter().enumerate() {
            let labels = &m.object["metadata"]["labels"];
            assert_eq!(labels["app.kubernetes.io/managed-by"], "berth", "{name}: {}", m.name());
            let environment = if shared && i < bundle { Value::Null } else { json!(ENV_ID) };
            assert_eq!(labels["berth.dev/environment"], environment, "{name}: {}", m.name());
            assert!(labels["berth.dev/tenant"].is_string(), "{name}: {}", m.name());
        }
    }
}

/// A tenant's ClusterQueue admits Berth's namespaces of that tenant only: not a namespace
/// of another tenant, nor one anybody else labels (tenants cannot label namespaces).
#[test]
fn a_tenants_cluster_queue_admits_its_own_namespaces_only() {
    for (case, queue) in tenant_queues() {
        let m = tenant_cluster_queue(&queue, &settings());
        let q = &m.object;
        assert_eq!(m.kind.kind, "ClusterQueue");
        assert_eq!(q["metadata"]["name"], format!("berth-tenant-{}", queue.slug), "{case}");
        assert_eq!(
            q["metadata"]["labels"],
            json!({ "app.kubernetes.io/managed-by": "berth", "berth.dev/tenant": queue.slug }),
            "{case}: owned by Berth, for the tenant, for no environment"
        );
        let selector = &q["spec"]["namespaceSelector"]["matchLabels"];
        assert_eq!(
            selector,
            &json!({ "app.kubernetes.io/managed-by": "berth", "berth.dev/tenant": queue.slug }),
            "{case}"
        );
        assert_eq!(q["spec"]["namespaceSelector"].as_object().unwrap().len(), 1, "{case}: matchLabels only");
        for (_, w) in cases() {
            let namespace = namespace_bundle(&w, &settings()).remove(0).object;
            let labels = &namespace["metadata"]["labels"];
            let admitted = selector.as_object().unwrap().iter().all(|(k, v)| &labels[k] == v);
            assert_eq!(admitted, w.tenant.slug.as_deref() == Some(queue.slug.as_str()), "{case}: {}", ns(&w));
        }
        assert_eq!(q["spec"]["cohort"], "berth", "{case}");
        let group = &q["spec"]["resourceGroups"][0];
        assert_eq!(group["flavors"][0]["name"], "default-flavor", "{case}");
        let resources = group["flavors"][0]["resources"].as_array().unwrap();
        let names: Vec<&str> = resources.iter().map(|r| r["name"].as_str().unwrap()).collect();
        assert_eq!(strings(&group["coveredResources"]), names, "{case}");
        for r in resources {
            // Borrowing is spot capacity: only a tenant allowed spot may borrow.
            let limit = if queue.spot { Value::Null } else { json!("0") };
            assert_eq!(r.get("borrowingLimit").cloned().unwrap_or(Value::Null), limit, "{case}: {r}");
            assert!(r.get("lendingLimit").is_none(), "{case}: {r}");
        }
    }
}

/// Each resource's quota is the most of it the tenant's Berth quota lets it hold at once.
#[test]
fn a_tenants_cluster_queue_quota_follows_its_limit_per_model() {
    let quota =
        |q: &TenantQueue| -> BTreeMap<String, String> { manifests::tenant_queue_quota(q).into_iter().collect() };
    let limited = quota(&tenant_queues()[0].1);
    let h100 = |limit: f64, compute: u8, per_gpu: i64| {
        (((limit * 7.0 / f64::from(compute)) + 1e-9).floor() as i64).min(16 * per_gpu)
    };
    let a100 = |compute: u8, per_gpu: i64| (((7.0 / f64::from(compute)) + 1e-9).floor() as i64).min(8 * per_gpu);
    let expected = BTreeMap::from([
        ("cpu".to_owned(), "1152".to_owned()),
        ("memory".to_owned(), "12288Gi".to_owned()),
        ("nvidia.com/gpu".to_owned(), "4".to_owned()),
        ("nvidia.com/gpu.shared".to_owned(), "4".to_owned()),
        ("nvidia.com/mig-1g.10gb".to_owned(), (h100(2.5, 1, 7) + a100(1, 7)).to_string()),
        ("nvidia.com/mig-1g.10gb.me".to_owned(), (h100(2.5, 1, 1) + a100(1, 1)).to_string()),
        ("nvidia.com/mig-1g.20gb".to_owned(), (h100(2.5, 1, 4) + a100(1, 4)).to_string()),
        ("nvidia.com/mig-2g.20gb".to_owned(), (h100(2.5, 2, 3) + a100(2, 3)).to_string()),
        ("nvidia.com/mig-3g.40gb".to_owned(), (h100(2.5, 3, 2) + a100(3, 2)).to_string()),
        ("nvidia.com/mig-4g.40gb".to_owned(), (h100(2.5, 4, 1) + a100(4, 1)).to_string()),
        ("nvidia.com/mig-7g.80gb".to_owned(), (h100(2.5, 7, 1) + a100(7, 1)).to_string()),
    ]);
    assert_eq!(limited, expected);
    assert_eq!(limited["nvidia.com/mig-1g.10gb"], "24", "17 H100 1g in 2.5 GPUs and 7 A100 1g in one");
    assert_eq!(limited["nvidia.com/mig-3g.40gb"], "7", "5 H100 3g in 2.5 GPUs and 2 A100 3g in one");

    // Without a limit: the fleet's capacity, resource by resource.
    let unlimited = quota(&tenant_queues()[1].1);
    assert_eq!(unlimited["nvidia.com/gpu"], "32", "16 H100, 8 A100, 8 L40S not time-sliced");
    assert_eq!(unlimited["nvidia.com/gpu.shared"], "8", "2 L40S in 4 shares each");
    assert_eq!(unlimited["nvidia.com/mig-1g.10gb"], "168", "7 per GPU on 24 GPUs");
    assert_eq!(unlimited["nvidia.com/mig-7g.80gb"], "24");

    // A limit of 6/7 GPU-equivalents, as floating point holds it, still fits six 1g slices.
    let sixth = TenantQueue {
        slug: "acme".into(),
        spot: false,
        nodes: 1,
        models: vec![ModelAllowance {
            model: GpuModel::H100_80GB,
            gpus: 6.0 / 7.0,
            whole_gpus: 8,
            mig_gpus: 8,
            shared_gpus: vec![],
        }],
        space: None,
    };
    let q = quota(&sixth);
    assert_eq!((q["nvidia.com/mig-1g.10gb"].as_str(), q["nvidia.com/gpu"].as_str()), ("6", "0"));
    assert_eq!(q["nvidia.com/mig-3g.40gb"], "2");
    // A limit of zero allows nothing, but still names every resource (asked-for and
    // refused, rather than unknown to the queue).
    let none = TenantQueue { models: vec![ModelAllowance { gpus: 0.0, ..sixth.models[0].clone() }], ..sixth };
    assert!(
        manifests::tenant_queue_quota(&none)
            .iter()
            .filter(|(r, _)| r.starts_with("nvidia.com/"))
            .all(|(_, n)| n == "0")
    );
}

// ---------------------------------------------------------------------------------------
// Named scenarios: the exact requests of each step of each offering

fn bundle_calls(ns: &str, own_queue: bool) -> Vec<String> {
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

fn with(mut calls: Vec<String>, more: &[String]) -> Vec<String> {
    calls.extend_from_slice(more);
    calls
}

const MIG_MAP: &str = "/api/v1/namespaces/gpu-operator/configmaps";

fn proxy_policy(w: &Workload) -> String {
    let names = manifests::Names::of(w);
    format!("/apis/networking.k8s.io/v1/namespaces/{}/networkpolicies/{}", names.namespace, names.proxy_policy)
}

/// A soft tenant's environment at the end: its objects in the tenant's namespace deleted
/// by name (gone already but for its credential, which is waited for), then the tenant's
/// quota applied without it.
fn release_in_tenant_namespace(w: &Workload, workload: &str) -> Vec<String> {
    let names = manifests::Names::of(w);
    let (ns, name) = (&names.namespace, &names.workload);
    let secret = format!("/api/v1/namespaces/{ns}/secrets/{}", names.credential);
    let claims = match w.offering {
        Offering::Notebook => vec![format!("DELETE /api/v1/namespaces/{ns}/persistentvolumeclaims/work-{name}-0")],
        _ => vec![],
    };
    [format!("DELETE {workload}")]
        .into_iter()
        .chain(claims)
        .chain([
            format!("DELETE /api/v1/namespaces/{ns}/services/{name}"),
            format!("DELETE {}", proxy_policy(w)),
            format!("DELETE {secret}"),
            format!("GET {secret}"),
            format!("PATCH /api/v1/namespaces/{ns}/resourcequotas/berth"),
        ])
        .collect()
}

/// What each step of a case sends to the API server, first time round.
fn scenario(case: &str, w: &Workload, step: Step) -> Vec<String> {
    let ns = ns(w);
    let names = manifests::Names::of(w);
    let (workload, credential) = (names.workload.as_str(), names.credential.as_str());
    let secret = |name: &str| format!("/api/v1/namespaces/{ns}/secrets/{name}");
    let release = vec![format!("DELETE /api/v1/namespaces/{ns}")];
    // At the end of an environment that may have written MIG layouts: the ConfigMap read,
    // and when a layout has no writer left, the nodes listed before it is dropped.
    let forget_layouts = format!("GET {MIG_MAP}/berth-mig-parted-config");
    // Where an earlier placement would have put it (see `manifests::other_home`): looked
    // at when stopping and releasing, nothing there.
    let elsewhere = manifests::other_home(w).map(|o| manifests::Names::of(&o));
    let (other_ns, other_workload) =
        elsewhere.as_ref().map(|n| (n.namespace.clone(), n.workload.clone())).unwrap_or_default();
    match (case, step) {
        (_, Step::PullImage) => vec![],
        ("notebook-mig-soft", Step::ConfigurePartition) => with(
            bundle_calls(&ns, false),
            &[
                format!("GET {MIG_MAP}/berth-mig-parted-config"),
                format!("POST {MIG_MAP}"),
                "PATCH /api/v1/nodes/h100-1".into(),
                "GET /api/v1/nodes/h100-1".into(),
            ],
        ),
        ("notebook-mig-soft", Step::StartWorkload) => with(
            bundle_calls(&ns, false),
            &[
                format!("GET {}", secret(credential)),
                format!("POST /api/v1/namespaces/{ns}/secrets"),
                format!("GET {}", secret(credential)),
                format!("PATCH /apis/apps/v1/namespaces/{ns}/statefulsets/{workload}"),
            ],
        ),
        ("notebook-mig-soft", Step::WaitHealthy) => {
            vec![format!("GET /apis/apps/v1/namespaces/{ns}/statefulsets/{workload}")]
        }
        ("notebook-mig-soft", Step::ExposeEndpoint) => {
            vec![
                format!("PATCH /api/v1/namespaces/{ns}/services/{workload}"),
                format!("PATCH {}", proxy_policy(w)),
                format!("GET {}", secret(credential)),
            ]
        }
        ("notebook-mig-soft", Step::RemoveEndpoint) => {
            vec![format!("DELETE /api/v1/namespaces/{ns}/services/{workload}"), format!("DELETE {}", proxy_policy(w))]
        }
        ("notebook-mig-soft", Step::StopWorkload) => vec![
            format!("DELETE /apis/apps/v1/namespaces/{ns}/statefulsets/{workload}"),
            format!("GET /apis/apps/v1/namespaces/{ns}/statefulsets/{workload}"),
            format!("DELETE /apis/apps/v1/namespaces/{other_ns}/statefulsets/{other_workload}"),
        ],
        ("notebook-mig-soft", Step::ClearPartition) => vec!["PATCH /api/v1/nodes/h100-1".into()],
        ("notebook-mig-soft", Step::ReleaseCapacity) => with(
            release_in_tenant_namespace(w, &format!("/apis/apps/v1/namespaces/{ns}/statefulsets/{workload}")),
            &[
                format!("DELETE /api/v1/namespaces/{other_ns}"),
                forget_layouts,
                "GET /api/v1/nodes".into(),
                format!("PUT {MIG_MAP}/berth-mig-parted-config"),
            ],
        ),

        ("training-gpus-hard", Step::StartWorkload) => with(
            bundle_calls(&ns, false),
            &["PATCH /api/v1/nodes/h100-2".into(), format!("PATCH /apis/batch/v1/namespaces/{ns}/jobs/training")],
        ),
        ("training-gpus-hard", Step::WaitHealthy) => vec![format!("GET /apis/batch/v1/namespaces/{ns}/jobs/training")],
        ("training-gpus-hard", Step::ExposeEndpoint | Step::RemoveEndpoint) => vec![],
        ("training-gpus-hard", Step::StopWorkload) => vec![
            format!("DELETE /apis/batch/v1/namespaces/{ns}/jobs/training"),
            format!("GET /apis/batch/v1/namespaces/{ns}/jobs/training"),
            format!("DELETE /apis/batch/v1/namespaces/{other_ns}/jobs/{other_workload}"),
        ],
        ("training-gpus-hard", Step::ReleaseCapacity) => with(
            release,
            &[
                format!("DELETE /apis/batch/v1/namespaces/{other_ns}/jobs/{other_workload}"),
                "PATCH /api/v1/nodes/h100-2".into(),
                forget_layouts,
            ],
        ),

        ("inference-gpu-soft", Step::StartWorkload) => with(
            bundle_calls(&ns, false),
            &[
                format!("GET {}", secret(credential)),
                format!("POST /api/v1/namespaces/{ns}/secrets"),
                format!("GET {}", secret(credential)),
                format!("PATCH /apis/apps/v1/namespaces/{ns}/deployments/{workload}"),
            ],
        ),
        ("inference-gpu-soft", Step::WaitHealthy) => {
            vec![format!("GET /apis/apps/v1/namespaces/{ns}/deployments/{workload}")]
        }
        ("inference-gpu-soft", Step::ExposeEndpoint) => {
            vec![
                format!("PATCH /api/v1/namespaces/{ns}/services/{workload}"),
                format!("PATCH {}", proxy_policy(w)),
                format!("GET {}", secret(credential)),
            ]
        }
        ("inference-gpu-soft", Step::RemoveEndpoint) => {
            vec![format!("DELETE /api/v1/namespaces/{ns}/services/{workload}"), format!("DELETE {}", proxy_policy(w))]
        }
        ("inference-gpu-soft", Step::StopWorkload) => vec![
            format!("DELETE /apis/apps/v1/namespaces/{ns}/deployments/{workload}"),
            format!("GET /apis/apps/v1/namespaces/{ns}/deployments/{workload}"),
            format!("DELETE /apis/apps/v1/namespaces/{other_ns}/deployments/{other_workload}"),
        ],
        ("inference-gpu-soft", Step::ReleaseCapacity) => with(
            release_in_tenant_namespace(w, &format!("/apis/apps/v1/namespaces/{ns}/deployments/{workload}")),
            &[format!("DELETE /api/v1/namespaces/{other_ns}")],
        ),

        ("dedicated-cluster", Step::StartWorkload) => with(
            bundle_calls(&ns, false),
            &[
                "PATCH /api/v1/nodes/h100-1".into(),
                "PATCH /api/v1/nodes/h100-2".into(),
                format!("PATCH /api/v1/namespaces/{ns}/serviceaccounts/tenant"),
                format!("PATCH {}", secret("tenant-token")),
                format!("PATCH /apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings/berth-cluster-user"),
            ],
        ),
        ("dedicated-cluster", Step::WaitHealthy) => {
            vec!["GET /api/v1/nodes/h100-1".into(), "GET /api/v1/nodes/h100-2".into()]
        }
        ("dedicated-cluster", Step::ExposeEndpoint) => vec![format!("GET {}", secret("tenant-token"))],
        ("dedicated-cluster", Step::RemoveEndpoint) => vec![],
        ("dedicated-cluster", Step::StopWorkload) => vec![
            format!("DELETE /api/v1/namespaces/{ns}/serviceaccounts/tenant"),
            format!("GET /api/v1/namespaces/{ns}/serviceaccounts/tenant"),
            format!("DELETE {}", secret("tenant-token")),
            format!("GET {}", secret("tenant-token")),
            format!("DELETE /apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings/berth-cluster-user"),
            format!("GET /apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings/berth-cluster-user"),
        ],
        ("dedicated-cluster", Step::ReleaseCapacity) => {
            with(release, &["PATCH /api/v1/nodes/h100-1".into(), "PATCH /api/v1/nodes/h100-2".into(), forget_layouts])
        }

        ("training-gpu-staff", Step::StartWorkload) => {
            with(bundle_calls(&ns, true), &[format!("PATCH /apis/batch/v1/namespaces/{ns}/jobs/training")])
        }
        ("training-gpu-staff", Step::WaitHealthy) => vec![format!("GET /apis/batch/v1/namespaces/{ns}/jobs/training")],
        ("training-gpu-staff", Step::ExposeEndpoint | Step::RemoveEndpoint) => vec![],
        ("training-gpu-staff", Step::StopWorkload) => vec![
            format!("DELETE /apis/batch/v1/namespaces/{ns}/jobs/training"),
            format!("GET /apis/batch/v1/namespaces/{ns}/jobs/training"),
        ],
        ("training-gpu-staff", Step::ReleaseCapacity) => {
            with(release, &[format!("DELETE /apis/kueue.x-k8s.io/v1beta1/clusterqueues/{ns}")])
        }
        (case, step) => panic!("no scenario for {case} {}", step.as_str()),
    }
}

/// Runs one step and returns its requests.
async fn run(k8s: &Kubernetes, cluster: &FakeCluster, w: &Workload, step: Step) -> Vec<kubernetes_api::Call> {
    k8s.run(w, step).await.unwrap_or_else(|e| panic!("{}: {e}", step.as_str()));
    cluster.take_calls()
}

fn body_of<'a>(calls: &'a [kubernetes_api::Call], line: &str) -> &'a Value {
    calls
        .iter()
        .find(|c| c.line() == line)
        .and_then(|c| c.body.as_ref())
        .unwrap_or_else(|| panic!("no body for {line}"))
}

#[tokio::test]
async fn every_step_of_every_offering_makes_exactly_the_expected_requests() {
    for (case, w) in cases() {
        let (cluster, client) = FakeCluster::start();
        let k8s = backend(client);
        for step in all_steps(&w) {
            let calls = run(&k8s, &cluster, &w, step).await;
            let lines: Vec<String> = calls.iter().map(kubernetes_api::Call::line).collect();
            assert_eq!(lines, scenario(case, &w, step), "scenario {case}/{}", step.as_str());

            // The applied bodies of the important requests are the manifests, exactly.
            let ns = ns(&w);
            match step {
                Step::StartWorkload => {
                    for m in workload_manifests(&w) {
                        let path = match m.kind.group {
                            "" => format!("/api/v1/namespaces/{ns}/{}/{}", m.kind.plural, m.name()),
                            g => format!("/apis/{g}/{}/namespaces/{ns}/{}/{}", m.kind.version, m.kind.plural, m.name()),
                        };
                        assert_eq!(
                            body_of(&calls, &format!("PATCH {path}")),
                            &m.object,
                            "{case}: applied {}",
                            m.name()
                        );
                    }
                    assert_eq!(
                        body_of(&calls, &format!("PATCH /api/v1/namespaces/{ns}")),
                        &namespace_bundle(&w, &settings())[0].object,
                        "{case}"
                    );
                }
                Step::ConfigurePartition => {
                    let node = node_manifest(&w, "h100-1", NodeStage::Held).unwrap().unwrap();
                    assert_eq!(body_of(&calls, "PATCH /api/v1/nodes/h100-1"), &node.object, "{case}");
                    let layout = manifests::node_mig_layout(&w, "h100-1").unwrap();
                    assert_eq!(node.object["metadata"]["labels"]["nvidia.com/mig.config"], json!(layout.name));
                    let map = body_of(&calls, &format!("POST {MIG_MAP}"));
                    assert_eq!(map["data"][&layout.name], json!(layout.entry), "{case}");
                    let document = map["data"]["config.yaml"].as_str().unwrap();
                    assert!(document.contains(&layout.entry) && document.contains("all-disabled"), "{document}");
                    // Its writer is named before any node is set to it.
                    let writers = format!("layouts.berth.dev/{}", layout.name);
                    assert_eq!(map["metadata"]["annotations"][&writers], ENV_ID, "{case}");
                }
                Step::ReleaseCapacity if case == "notebook-mig-soft" => {
                    let map = body_of(&calls, &format!("PUT {MIG_MAP}/berth-mig-parted-config"));
                    assert_eq!(map["data"].as_object().unwrap().keys().collect::<Vec<_>>(), ["config.yaml"], "{case}");
                    assert!(map["metadata"].get("annotations").is_none_or(Value::is_null), "{case}: {map}");
                    let list = calls.iter().find(|c| c.line() == "GET /api/v1/nodes").unwrap();
                    assert!(list.query.contains("nvidia.com"), "{case}: nodes with a MIG config: {}", list.query);
                }
                _ => {}
            }
        }
    }
}

#[tokio::test]
async fn connections_tell_the_owner_how_to_reach_each_offering() {
    for (case, w) in cases() {
        let (cluster, client) = FakeCluster::start();
        let k8s = backend(client);
        let mut connection = None;
        for step in provision_plan(w.offering, w.shape) {
            connection = k8s.run(&w, step).await.unwrap().connection.or(connection);
        }
        let c = connection.unwrap_or_else(|| panic!("{case}: a connection once exposed"));
        let ns = ns(&w);
        match w.offering {
            Offering::Notebook | Offering::InferenceEndpoint => {
                let secret = c.secret.expect("token or API key");
                assert_eq!(secret.len(), 32, "{case}");
                // The token is the one the workload reads from its Secret.
                let name = manifests::Names::of(&w).credential;
                let stored = cluster.lock().objects[&format!("/api/v1/namespaces/{ns}/secrets/{name}")].clone();
                assert_eq!(
                    stored["data"]["value"],
                    json!(base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &secret))
                );
                assert!(c.example.contains(&format!("kubectl port-forward -n {ns}")), "{case}: {}", c.example);
            }
            Offering::TrainingJob => assert!(c.example.contains(&format!("kubectl logs -n {ns}")), "{}", c.example),
            Offering::DedicatedCluster => {
                let kubeconfig = c.secret.expect("kubeconfig");
                assert!(kubeconfig.contains("server: https://k8s.test:6443"), "{kubeconfig}");
                assert!(kubeconfig.contains("token: sa-token"), "{kubeconfig}");
                assert!(kubeconfig.contains(&format!("namespace: {ns}")), "{kubeconfig}");
                assert_eq!(c.secret_label.as_deref(), Some("Kubeconfig"));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Whole lifecycles

fn assert_nothing_left(cluster: &FakeCluster, case: &str) {
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

#[tokio::test]
async fn each_offering_provisions_and_tears_down_leaving_nothing_behind() {
    for (case, w) in cases() {
        let (cluster, client) = FakeCluster::start();
        let k8s = backend(client);
        for step in provision_plan(w.offering, w.shape) {
            k8s.run(&w, step).await.unwrap();
        }
        assert!(!cluster.environment_objects().is_empty(), "{case}");
        if manifests::dedicates_nodes(&w) {
            for node in w.nodes() {
                let n = cluster.node(&node);
                assert_eq!(
                    n["metadata"]["labels"]["berth.dev/tenant"],
                    json!(manifests::Names::of(&w).tenant),
                    "{case}"
                );
                assert_eq!(n["spec"]["taints"][0]["key"], "berth.dev/tenant", "{case}");
            }
        }
        for step in teardown_plan(w.shape) {
            k8s.run(&w, step).await.unwrap();
        }
        assert_nothing_left(&cluster, case);
    }
}

#[tokio::test]
async fn a_second_pass_over_a_converged_environment_creates_and_deletes_nothing() {
    for (case, w) in cases() {
        let (cluster, client) = FakeCluster::start();
        let k8s = backend(client);
        let plan = provision_plan(w.offering, w.shape);
        for &step in &plan {
            k8s.run(&w, step).await.unwrap();
        }
        cluster.take_calls();
        let converged = cluster.snapshot();
        for &step in &plan {
            k8s.run(&w, step).await.unwrap();
        }
        let calls = cluster.take_calls();
        let writes: Vec<String> =
            calls.iter().filter(|c| c.method != "GET" && c.method != "PATCH").map(|c| c.line()).collect();
        assert_eq!(writes, Vec::<String>::new(), "{case}: only applies and reads");
        assert_eq!(cluster.snapshot(), converged, "{case}: a second pass changed the cluster");
    }
}

#[tokio::test]
async fn a_crash_after_any_step_converges_when_the_step_runs_again() {
    for (case, w) in cases() {
        let steps = all_steps(&w);
        // The cluster after a clean run up to each step.
        let mut clean = Vec::new();
        {
            let (cluster, client) = FakeCluster::start();
            let k8s = backend(client);
            for &step in &steps {
                k8s.run(&w, step).await.unwrap();
                clean.push(cluster.snapshot());
            }
        }
        for crash_after in 0..steps.len() {
            let (cluster, client) = FakeCluster::start();
            let k8s = backend(client);
            for &step in &steps[..=crash_after] {
                k8s.run(&w, step).await.unwrap();
            }
            // The journal never heard of the last step: the reconciler runs it again.
            k8s.run(&w, steps[crash_after])
                .await
                .unwrap_or_else(|e| panic!("{case}: repeating {}: {e}", steps[crash_after].as_str()));
            assert_eq!(cluster.snapshot(), clean[crash_after], "{case}: repeat of {}", steps[crash_after].as_str());
            for &step in &steps[crash_after + 1..] {
                k8s.run(&w, step).await.unwrap();
            }
            assert_nothing_left(&cluster, case);
        }
    }
}

// ---------------------------------------------------------------------------------------
// MIG layouts shared by environments on one node

#[tokio::test]
async fn a_mig_layout_keeps_the_neighbours_slices_and_is_cleared_only_by_the_last() {
    let mut mine = workload(Offering::Notebook, "h100-1g.10gb", acme(), vec![mig_unit("h100-1", 0, 0, "1g.10gb")]);
    mine.mig_neighbours = vec![mig_unit("h100-1", 0, 1, "1g.10gb"), mig_unit("h100-1", 1, 0, "3g.40gb")];
    let layout = manifests::node_mig_layout(&mine, "h100-1").unwrap();
    assert!(layout.entry.contains("devices: [0]") && layout.entry.contains("\"1g.10gb\": 2"), "{}", layout.entry);
    assert!(layout.entry.contains("devices: [1]") && layout.entry.contains("\"3g.40gb\": 1"), "{}", layout.entry);

    // The same slices booked the other way round give the same layout name.
    let mut theirs = mine.clone();
    theirs.environment_id = OTHER_ENV_ID.into();
    theirs.units = vec![mig_unit("h100-1", 0, 1, "1g.10gb")];
    theirs.mig_neighbours = vec![mig_unit("h100-1", 0, 0, "1g.10gb"), mig_unit("h100-1", 1, 0, "3g.40gb")];
    assert_eq!(manifests::node_mig_layout(&theirs, "h100-1").unwrap(), layout);

    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    k8s.run(&mine, Step::ConfigurePartition).await.unwrap();
    k8s.run(&theirs, Step::ConfigurePartition).await.unwrap();
    let calls = cluster.take_calls();
    let writes: Vec<&Value> =
        calls.iter().filter(|c| c.method == "POST" || c.method == "PUT").filter_map(|c| c.body.as_ref()).collect();
    assert_eq!(writes.len(), 2, "each writer records itself");
    assert_eq!(writes[0]["data"], writes[1]["data"], "one entry, written once, shared");
    assert_eq!(
        writes[1]["metadata"]["annotations"][format!("layouts.berth.dev/{}", layout.name)],
        format!("{ENV_ID},{OTHER_ENV_ID}")
    );
    // Written again by a writer on record already: nothing to write.
    k8s.run(&theirs, Step::ConfigurePartition).await.unwrap();
    assert!(cluster.take_calls().iter().all(|c| c.method != "POST" && c.method != "PUT"));
    assert_eq!(cluster.node("h100-1")["metadata"]["labels"]["nvidia.com/mig.config"], json!(layout.name));

    // Clearing mine while theirs runs leaves the layout alone...
    k8s.run(&mine, Step::ClearPartition).await.unwrap();
    assert_eq!(cluster.node("h100-1")["metadata"]["labels"]["nvidia.com/mig.config"], json!(layout.name));
    // ...and the last one out disables MIG.
    theirs.mig_neighbours.clear();
    k8s.run(&theirs, Step::ClearPartition).await.unwrap();
    assert_eq!(cluster.node("h100-1")["metadata"]["labels"]["nvidia.com/mig.config"], "all-disabled");

    // A second layout lands next to the first in the shared document.
    let mut other = workload(Offering::Notebook, "h100-3g.40gb", acme(), vec![mig_unit("h100-2", 0, 4, "3g.40gb")]);
    other.environment_id = OTHER_ENV_ID.into();
    k8s.run(&other, Step::ConfigurePartition).await.unwrap();
    let map = cluster.lock().objects[&format!("{MIG_MAP}/berth-mig-parted-config")].clone();
    let document = map["data"]["config.yaml"].as_str().unwrap();
    let second = manifests::node_mig_layout(&other, "h100-2").unwrap();
    assert!(document.contains(&layout.entry) && document.contains(&second.entry), "{document}");
    assert!(document.starts_with("version: v1\nmig-configs:\n  all-disabled:\n"), "{document}");
}

#[tokio::test]
async fn a_failed_mig_layout_fails_the_step_with_a_clear_message() {
    let w = workload(Offering::Notebook, "h100-1g.10gb", acme(), vec![mig_unit("h100-1", 0, 0, "1g.10gb")]);
    let (cluster, client) = FakeCluster::start();
    cluster.lock().mig_state = "failed".into();
    let k8s = backend(client);
    let error = k8s.run(&w, Step::ConfigurePartition).await.unwrap_err();
    assert!(error.0.starts_with("the GPU Operator could not apply MIG layout berth-"), "{error}");
    assert!(error.0.ends_with("on node h100-1"), "{error}");
}

/// An environment provisioned by an earlier Berth fed a ClusterQueue of its own; Kueue
/// will not change the queue a LocalQueue feeds, so a repeated step replaces it.
#[tokio::test]
async fn a_local_queue_of_an_earlier_berth_is_replaced_to_feed_the_tenants_queue() {
    let w = cases()[2].1.clone(); // acme's inference endpoint
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    k8s.run(&w, Step::StartWorkload).await.unwrap();
    let ns = ns(&w);
    let local = format!("/apis/kueue.x-k8s.io/v1beta1/namespaces/{ns}/localqueues/berth");
    cluster.lock().objects.get_mut(&local).unwrap()["spec"]["clusterQueue"] = json!(ns);
    cluster.take_calls();
    k8s.run(&w, Step::StartWorkload).await.unwrap();
    let lines = cluster.take_lines();
    let at = lines.iter().position(|l| *l == format!("PATCH {local}")).unwrap();
    assert_eq!(lines[at..at + 3], [format!("PATCH {local}"), format!("DELETE {local}"), format!("PATCH {local}")]);
    assert_eq!(cluster.lock().objects[&local]["spec"]["clusterQueue"], "berth-tenant-acme");
}

#[tokio::test]
async fn kubernetes_errors_reach_the_owner_as_operational_messages_only() {
    let w = workload(Offering::InferenceEndpoint, "l40s-1", acme(), vec![gpu_unit("l40s-1", 1)]);
    let (cluster, client) = FakeCluster::start();
    let ns = ns(&w);
    cluster.lock().failing.insert(format!("/api/v1/namespaces/{ns}/resourcequotas/berth"), 403);
    let error = backend(client).run(&w, Step::StartWorkload).await.unwrap_err();
    assert_eq!(
        error.0,
        "Berth is not allowed to apply ResourceQuota berth; the platform team has the details in Berth's log"
    );
    assert!(!error.0.contains("secret internal detail"));
}

#[tokio::test]
async fn steps_repeat_safely_after_objects_vanished() {
    // Teardown of an environment whose provisioning never ran: every delete finds nothing.
    for (case, w) in cases() {
        let (cluster, client) = FakeCluster::start();
        let k8s = backend(client);
        for step in teardown_plan(w.shape) {
            k8s.run(&w, step).await.unwrap_or_else(|e| panic!("{case} {}: {e}", step.as_str()));
        }
        assert_nothing_left(&cluster, case);
    }
}

// ---------------------------------------------------------------------------------------
// Orphans

#[tokio::test]
async fn the_orphan_sweep_finds_and_removes_what_no_live_environment_explains() {
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    let cases = cases();
    let kept = &cases[0].1; // the notebook stays
    let mut dead = cases[1].1.clone(); // a hard-isolated training job whose environment is gone
    dead.environment_id = OTHER_ENV_ID.into();
    for w in [kept, &dead] {
        for step in provision_plan(w.offering, w.shape) {
            k8s.run(w, step).await.unwrap();
        }
    }
    cluster.take_calls();
    let live_ids = live(&[ENV_ID]);

    let owned = k8s.owned_objects().await.unwrap();
    assert_eq!(
        owned.len(),
        9,
        "the tenant's namespace and the notebook's StatefulSet, Service, Secret and proxy policy in it, the dead \
         environment's namespace, one dedicated node, one MIG layout on its node and in the ConfigMap: {owned:?}"
    );
    let layout = owned.iter().find(|o| o.kind == "MigLayout").expect("the notebook's MIG layout");
    assert_eq!((layout.name.as_str(), layout.environments.as_slice()), ("h100-1", [ENV_ID.to_owned()].as_slice()));
    let entry = owned.iter().find(|o| o.kind == "MigConfigEntry").expect("the layout in the ConfigMap");
    assert_eq!(entry.name, manifests::node_mig_layout(kept, "h100-1").unwrap().name);
    assert_eq!(entry.environments, [ENV_ID], "written by the notebook, which its node names");
    let reported = orphans(&owned, &live_ids);
    let found: Vec<(&str, String)> = reported.iter().map(|o| (o.kind, o.name.clone())).collect();
    assert_eq!(found, [("Namespace", ns(&dead)), ("Node", "h100-2".to_owned())], "only the dead environment's objects");
    assert!(reported.iter().all(|o| o.environments == [OTHER_ENV_ID]));
    let calls = cluster.take_calls();
    assert!(calls.iter().all(|c| c.method == "GET"), "listing changes nothing");
    let selector = calls.iter().map(|c| c.query.clone()).next().unwrap_or_default();
    assert!(selector.contains("managed-by"), "lists only Berth's objects: {selector}");

    for orphan in &reported {
        assert!(k8s.remove_owned(orphan).await.unwrap(), "{orphan:?} removed");
    }
    let paths = cluster.environment_objects();
    assert!(paths.iter().all(|p| !p.contains(&ns(&dead))), "{paths:?}");
    assert!(paths.iter().any(|p| p.contains(&ns(kept))), "the live environment keeps its objects");
    let node = cluster.node("h100-2");
    assert!(node["metadata"]["labels"].get("berth.dev/tenant").is_none(), "{node}");
    assert!(node.pointer("/spec/taints").is_none(), "{node}");
    let owned = k8s.owned_objects().await.unwrap();
    assert_eq!(orphans(&owned, &live_ids), vec![], "a second sweep finds nothing");
    // Removing again what is already gone does nothing, and says so.
    for orphan in &reported {
        assert!(!k8s.remove_owned(orphan).await.unwrap(), "{orphan:?} was gone already");
    }
}

#[tokio::test]
async fn a_mig_layout_no_live_environment_holds_is_disabled_by_the_sweep() {
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    // Two notebooks share h100-1's layout; the second's MIG step landed after both had
    // gone (an answer lost in a timeout), so the node keeps a layout nobody holds.
    let mut first = cases()[0].1.clone();
    let mut second = first.clone();
    second.environment_id = OTHER_ENV_ID.into();
    second.units = vec![PlacedUnit { environment_id: OTHER_ENV_ID.into(), ..mig_unit("h100-1", 0, 1, "1g.10gb") }];
    second.mig_neighbours = first.units.clone();
    first.mig_neighbours = second.units.clone();
    k8s.run(&second, Step::ConfigurePartition).await.unwrap();
    let labels = cluster.node("h100-1")["metadata"].clone();
    assert_eq!(labels["annotations"]["berth.dev/mig-environments"], format!("{ENV_ID},{OTHER_ENV_ID}"), "{labels}");

    let owned = k8s.owned_objects().await.unwrap();
    let layout = owned.iter().find(|o| o.kind == "MigLayout").expect("listed").clone();
    assert_eq!(layout.environments, [ENV_ID, OTHER_ENV_ID]);
    // Either environment alive explains it; with both gone it is an orphan.
    let layouts = |found: Vec<OwnedObject>| found.into_iter().filter(|o| o.kind == "MigLayout").collect::<Vec<_>>();
    assert!(layouts(orphans(&owned, &live(&[OTHER_ENV_ID]))).is_empty());
    assert_eq!(layouts(orphans(&owned, &live(&[]))), std::slice::from_ref(&layout));
    cluster.take_calls();
    assert!(k8s.remove_owned(&layout).await.unwrap());
    let node = cluster.node("h100-1");
    assert_eq!(node["metadata"]["labels"]["nvidia.com/mig.config"], "all-disabled", "{node}");
    assert!(node["metadata"].get("annotations").is_none(), "{node}");
    let apply = cluster.take_calls().into_iter().find(|c| c.method == "PATCH").expect("one apply");
    assert!(apply.body.unwrap()["metadata"]["resourceVersion"].is_string(), "the apply is conditional");
    assert!(layouts(k8s.owned_objects().await.unwrap()).is_empty(), "no MIG layout of Berth's left");
    assert!(!k8s.remove_owned(&layout).await.unwrap(), "a second removal finds nothing to do");

    // The layout is still in the ConfigMap, written by the second notebook: with it gone and
    // no node set to it, the sweep drops it there too.
    let entry = k8s.owned_objects().await.unwrap().into_iter().find(|o| o.kind == "MigConfigEntry").expect("listed");
    assert_eq!(entry.environments, [OTHER_ENV_ID]);
    cluster.take_calls();
    assert!(k8s.remove_owned(&entry).await.unwrap());
    assert_eq!(
        cluster.take_lines(),
        [
            format!("GET {MIG_MAP}/berth-mig-parted-config"),
            "GET /api/v1/nodes".into(),
            format!("PUT {MIG_MAP}/berth-mig-parted-config")
        ]
    );
    assert_eq!(cluster.mig_layouts(), Vec::<String>::new());
    let document = cluster.lock().objects[&format!("{MIG_MAP}/berth-mig-parted-config")]["data"]["config.yaml"].clone();
    assert_eq!(document, "version: v1\nmig-configs:\n  all-disabled:\n    - devices: all\n      mig-enabled: false\n");
    assert!(!k8s.remove_owned(&entry).await.unwrap(), "a second removal finds nothing to do");
}

/// The mig-parted ConfigMap no longer grows: a layout leaves it once no node is set to it
/// and no live environment wrote it; never while a writer may be about to set a node to
/// it, nor once a node is set to it again.
#[tokio::test]
async fn the_sweep_drops_layouts_from_the_config_map_that_nothing_needs_and_only_those() {
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    let map_path = format!("{MIG_MAP}/berth-mig-parted-config");
    // The notebook's layout, set on h100-1.
    let notebook = cases()[0].1.clone();
    k8s.run(&notebook, Step::ConfigurePartition).await.unwrap();
    let named = manifests::node_mig_layout(&notebook, "h100-1").unwrap().name;
    // Another environment's layout, written but its node not set yet: the step failed
    // between the two (or the sweep looks right then).
    let on_h100_2 = |id: &str| {
        let unit = PlacedUnit { environment_id: id.into(), ..mig_unit("h100-2", 0, 4, "3g.40gb") };
        Workload { environment_id: id.into(), ..workload(Offering::Notebook, "h100-3g.40gb", acme(), vec![unit]) }
    };
    let pending = on_h100_2(OTHER_ENV_ID);
    let write_only = |w: Workload| {
        let (cluster, k8s) = (&cluster, &k8s);
        async move {
            cluster.lock().failing.insert("/api/v1/nodes/h100-2".into(), 403);
            assert!(k8s.run(&w, Step::ConfigurePartition).await.is_err(), "the node is not set");
            cluster.lock().failing.clear();
        }
    };
    write_only(pending.clone()).await;
    let written = manifests::node_mig_layout(&pending, "h100-2").unwrap().name;
    // And one an earlier Berth wrote, with no writer on record: nothing needs it.
    let stray = "berth-000000000000";
    cluster.lock().objects.get_mut(&map_path).unwrap()["data"][stray] = json!(format!(
        "  {stray}:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {{\"7g.80gb\": 1}}\n"
    ));
    let owned = k8s.owned_objects().await.unwrap();
    let entries: BTreeMap<String, Vec<String>> =
        owned.iter().filter(|o| o.kind == "MigConfigEntry").map(|o| (o.name.clone(), o.environments.clone())).collect();
    assert_eq!(
        entries,
        BTreeMap::from([
            (stray.to_owned(), vec![]),
            (named.clone(), vec![ENV_ID.to_owned()]),
            (written.clone(), vec![OTHER_ENV_ID.to_owned()]),
        ])
    );

    // Both environments live: only the stray layout is an orphan.
    let entries_of =
        |found: Vec<OwnedObject>| found.into_iter().filter(|o| o.kind == "MigConfigEntry").collect::<Vec<_>>();
    let orphaned = entries_of(orphans(&owned, &live(&[ENV_ID, OTHER_ENV_ID])));
    assert_eq!(orphaned.iter().map(|o| o.name.as_str()).collect::<Vec<_>>(), [stray]);
    cluster.take_calls();
    assert!(k8s.remove_owned(&orphaned[0]).await.unwrap());
    assert_eq!(
        cluster.take_lines(),
        [format!("GET {map_path}"), "GET /api/v1/nodes".into(), format!("PUT {map_path}")],
        "read, see that no node is set to it, write back naming the version read"
    );
    let mut kept = vec![named.clone(), written.clone()];
    kept.sort();
    assert_eq!(cluster.mig_layouts(), kept);

    // Both gone. The pending layout stays when a writer came since the listing: that one
    // may be about to set its node.
    let orphaned = entries_of(orphans(&owned, &live(&[])));
    let pending_entry = orphaned.iter().find(|o| o.name == written).unwrap();
    write_only(on_h100_2(THIRD_ENV_ID)).await;
    assert!(!k8s.remove_owned(pending_entry).await.unwrap(), "a writer came since the listing");
    let relisted = k8s.owned_objects().await.unwrap().into_iter().find(|o| o.name == written).unwrap();
    assert_eq!(relisted.environments, [THIRD_ENV_ID, OTHER_ENV_ID], "in order");
    assert!(orphans(std::slice::from_ref(&relisted), &live(&[THIRD_ENV_ID])).is_empty(), "its writer is live");
    assert!(k8s.remove_owned(&relisted).await.unwrap(), "listed again with all its writers gone");
    assert_eq!(cluster.mig_layouts(), std::slice::from_ref(&named));

    // The notebook's layout stays while h100-1 is set to it...
    let named_entry = orphaned.iter().find(|o| o.name == named).unwrap();
    assert!(!k8s.remove_owned(named_entry).await.unwrap(), "h100-1 is set to it");
    // ...and when h100-1 is set to it again after the listing.
    k8s.run(&notebook, Step::ClearPartition).await.unwrap();
    let cleared = k8s.owned_objects().await.unwrap().into_iter().find(|o| o.name == named).unwrap();
    assert_eq!(cleared.environments, [ENV_ID], "its writer, until the notebook's capacity is released");
    k8s.run(&notebook, Step::ConfigurePartition).await.unwrap();
    assert!(!k8s.remove_owned(&cleared).await.unwrap(), "a node is set to it again");
    k8s.run(&notebook, Step::ClearPartition).await.unwrap();
    assert!(k8s.remove_owned(&cleared).await.unwrap(), "no node is set to it any more");
    assert_eq!(cluster.mig_layouts(), Vec::<String>::new());
}

// ---------------------------------------------------------------------------------------
// Tenants' ClusterQueues

const TENANT_QUEUES: &str = "/apis/kueue.x-k8s.io/v1beta1/clusterqueues";

#[tokio::test]
async fn a_tenants_cluster_queue_is_applied_updated_with_one_request_each_and_removed_with_its_namespace() {
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    let path = format!("{TENANT_QUEUES}/berth-tenant-acme");
    let (_, mut queue) = tenant_queues().remove(0);
    k8s.apply_tenant_queue(&queue).await.unwrap();
    let calls = cluster.take_calls();
    assert_eq!(calls.iter().map(kubernetes_api::Call::line).collect::<Vec<_>>(), [format!("PATCH {path}")]);
    assert_eq!(calls[0].body.as_ref(), Some(&tenant_cluster_queue(&queue, &settings()).object));

    // Applied again unchanged: the same single apply, and nothing changes.
    let before = cluster.snapshot();
    k8s.apply_tenant_queue(&queue).await.unwrap();
    assert_eq!(cluster.take_lines(), [format!("PATCH {path}")]);
    assert_eq!(cluster.snapshot(), before);

    // The tenant's quota changes (4 H100s, spot allowed): one apply with the new quota.
    queue.models = fleet_models(4.0, 1.0, 1.0);
    queue.spot = true;
    k8s.apply_tenant_queue(&queue).await.unwrap();
    assert_eq!(cluster.take_lines(), [format!("PATCH {path}")]);
    let stored = cluster.lock().objects[&path].clone();
    let resources = stored["spec"]["resourceGroups"][0]["flavors"][0]["resources"].as_array().unwrap().clone();
    let gpus = resources.iter().find(|r| r["name"] == "nvidia.com/gpu").unwrap();
    assert_eq!(gpus, &json!({ "name": "nvidia.com/gpu", "nominalQuota": "6" }), "4 H100, 1 A100, 1 L40S; may borrow");

    // Removed with the tenant, and its namespace (none here: `space` is `None`); a second
    // removal finds nothing and says so.
    let namespace = "DELETE /api/v1/namespaces/berth-acme".to_owned();
    assert!(k8s.remove_tenant_queue("acme").await.unwrap());
    assert_eq!(cluster.take_lines(), [format!("DELETE {path}"), namespace.clone()]);
    assert!(!cluster.lock().objects.contains_key(&path));
    assert!(!k8s.remove_tenant_queue("acme").await.unwrap(), "already gone");
    assert_eq!(cluster.take_lines(), [format!("DELETE {path}"), namespace]);
}

#[tokio::test]
async fn the_sweep_removes_the_queue_of_a_tenant_that_is_gone_and_only_that() {
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    let (_, acme_queue) = tenant_queues().remove(0);
    let ghost = TenantQueue { slug: "ghost".into(), ..acme_queue.clone() };
    k8s.apply_tenant_queue(&acme_queue).await.unwrap();
    k8s.apply_tenant_queue(&ghost).await.unwrap();
    // A staff environment's own queue is listed as the environment's.
    let staff_job = cases().pop().unwrap().1;
    k8s.run(&staff_job, Step::StartWorkload).await.unwrap();
    cluster.take_calls();

    let owned = k8s.owned_objects().await.unwrap();
    let queues: Vec<(&str, Vec<String>, Option<String>)> = owned
        .iter()
        .filter(|o| o.kind == "ClusterQueue")
        .map(|o| (o.name.as_str(), o.environments.clone(), o.tenant.clone()))
        .collect();
    assert_eq!(
        queues,
        [
            (ns(&staff_job).as_str(), vec![ENV_ID.to_owned()], None),
            ("berth-tenant-acme", vec![], Some("acme".to_owned())),
            ("berth-tenant-ghost", vec![], Some("ghost".to_owned())),
        ]
    );
    let list = cluster.take_calls().into_iter().find(|c| c.path == TENANT_QUEUES).expect("queues listed");
    assert_eq!(list.query, "&labelSelector=app.kubernetes.io%2Fmanaged-by%3Dberth", "Berth's queues, of both kinds");
    let reported = orphans(&owned, &live(&[ENV_ID]));
    assert_eq!(reported.iter().map(|o| o.name.as_str()).collect::<Vec<_>>(), ["berth-tenant-ghost"]);
    assert!(k8s.remove_owned(&reported[0]).await.unwrap());
    assert_eq!(cluster.take_lines(), [format!("DELETE {TENANT_QUEUES}/berth-tenant-ghost")]);
    assert!(cluster.lock().objects.contains_key(&format!("{TENANT_QUEUES}/berth-tenant-acme")), "acme keeps its queue");
    assert_eq!(orphans(&k8s.owned_objects().await.unwrap(), &live(&[ENV_ID])), vec![], "a second sweep finds nothing");
}

#[tokio::test]
async fn the_sweep_leaves_a_node_alone_that_another_environment_took_since_the_listing() {
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    let mut dead = cases()[1].1.clone(); // a hard tenant's training job on h100-2
    dead.environment_id = OTHER_ENV_ID.into();
    k8s.run(&dead, Step::StartWorkload).await.unwrap();
    let owned = k8s.owned_objects().await.unwrap();
    let node = owned.iter().find(|o| o.kind == "Node").expect("dedicated node listed").clone();
    // Between the listing and the removal the dead one is torn down and a new
    // environment takes the node.
    for step in teardown_plan(dead.shape) {
        k8s.run(&dead, step).await.unwrap();
    }
    let newcomer = cases()[1].1.clone();
    k8s.run(&newcomer, Step::StartWorkload).await.unwrap();
    assert!(!k8s.remove_owned(&node).await.unwrap(), "not the listed environment's any more");
    assert_eq!(holders(&cluster, "h100-2"), json!(ENV_ID));

    // The same when the node changes between the sweep's read and its write: the
    // conditional apply is refused and nothing is undone.
    let taken = OwnedObject { environments: vec![ENV_ID.into()], ..node };
    cluster.lock().bump_node_on_next_read = Some("h100-2".into());
    assert!(!k8s.remove_owned(&taken).await.unwrap(), "changed between read and write");
    assert_eq!(holders(&cluster, "h100-2"), json!(ENV_ID));
    assert!(k8s.remove_owned(&taken).await.unwrap(), "removed once it holds still");
    let node = cluster.node("h100-2");
    assert!(node["metadata"]["labels"].get("berth.dev/tenant").is_none(), "{node}");
    assert!(node.pointer("/metadata/annotations/berth.dev~1tenant-environments").is_none(), "{node}");
}

/// The environments a node's dedication names.
fn holders(cluster: &FakeCluster, node: &str) -> Value {
    cluster.node(node).pointer("/metadata/annotations/berth.dev~1tenant-environments").cloned().unwrap_or(Value::Null)
}

// ---------------------------------------------------------------------------------------
// Nodes dedicated to a hard tenant, shared by its environments

const THIRD_ENV_ID: &str = "77777777-6666-4555-8444-333333333333";

/// Two environments of the hard tenant vault on h100-2: a 4-GPU training job on GPUs 0-3
/// and a MIG notebook on GPU 4, each told of the other as booking tells them.
fn vault_pair() -> (Workload, Workload) {
    let mut training = cases()[1].1.clone();
    let slice = PlacedUnit { environment_id: OTHER_ENV_ID.into(), ..mig_unit("h100-2", 4, 0, "1g.10gb") };
    let mut notebook = workload(Offering::Notebook, "h100-1g.10gb", vault(), vec![slice]);
    notebook.environment_id = OTHER_ENV_ID.into();
    training.tenant_neighbours = notebook.units.clone();
    training.mig_neighbours = notebook.units.clone();
    notebook.tenant_neighbours = training.units.clone();
    (training, notebook)
}

#[tokio::test]
async fn a_hard_tenants_node_is_marked_once_and_given_back_when_its_last_environment_leaves() {
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    let (mut training, mut notebook) = vault_pair();
    for step in provision_plan(notebook.offering, notebook.shape) {
        k8s.run(&notebook, step).await.unwrap();
    }
    let layout = manifests::node_mig_layout(&notebook, "h100-2").unwrap().name;
    for step in provision_plan(training.offering, training.shape) {
        k8s.run(&training, step).await.unwrap();
    }
    // One label, one taint, one annotation naming both; the notebook's MIG layout kept by
    // the training job's apply, which holds no slice there itself.
    let node = cluster.node("h100-2");
    assert_eq!(node["metadata"]["labels"]["berth.dev/tenant"], "vault", "{node}");
    assert_eq!(
        node["spec"]["taints"],
        json!([{ "key": "berth.dev/tenant", "value": "vault", "effect": "NoSchedule" }])
    );
    assert_eq!(holders(&cluster, "h100-2"), json!(format!("{ENV_ID},{OTHER_ENV_ID}")));
    assert_eq!(node["metadata"]["labels"]["nvidia.com/mig.config"], json!(layout), "{node}");
    assert_eq!(node["metadata"]["annotations"]["berth.dev/mig-environments"], OTHER_ENV_ID, "{node}");
    let owned = k8s.owned_objects().await.unwrap();
    let dedicated = owned.iter().find(|o| o.kind == "Node").expect("listed");
    assert_eq!(dedicated.environments, [ENV_ID, OTHER_ENV_ID]);
    assert!(orphans(std::slice::from_ref(dedicated), &live(&[OTHER_ENV_ID])).is_empty());

    // The training job leaves first: the node stays the tenant's, the notebook's layout stays.
    notebook.tenant_neighbours.clear();
    for step in teardown_plan(training.shape) {
        k8s.run(&training, step).await.unwrap();
    }
    let node = cluster.node("h100-2");
    assert_eq!(node["metadata"]["labels"]["berth.dev/tenant"], "vault", "{node}");
    assert_eq!(node["spec"]["taints"][0]["value"], "vault", "{node}");
    assert_eq!(holders(&cluster, "h100-2"), json!(OTHER_ENV_ID));
    assert_eq!(node["metadata"]["labels"]["nvidia.com/mig.config"], json!(layout), "{node}");

    // The last one out gives the node back.
    training.tenant_neighbours.clear();
    for step in teardown_plan(notebook.shape) {
        k8s.run(&notebook, step).await.unwrap();
    }
    assert_nothing_left(&cluster, "vault pair");
    assert!(
        cluster.node("h100-2")["metadata"]
            .get("annotations")
            .is_none_or(|a| a.get("berth.dev/tenant-environments").is_none())
    );
}

#[tokio::test]
async fn a_dedicated_node_keeps_a_neighbours_layout_the_operator_can_read() {
    // The notebook's slice is booked and started, but its own MIG step has not run yet
    // when the training job marks the node: the layout it names is written first.
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    let (training, notebook) = vault_pair();
    k8s.run(&training, Step::StartWorkload).await.unwrap();
    let layout = manifests::node_mig_layout(&notebook, "h100-2").unwrap();
    let map = cluster.lock().objects[&format!("{MIG_MAP}/berth-mig-parted-config")].clone();
    assert_eq!(map["data"][&layout.name], json!(layout.entry));
    assert_eq!(cluster.node("h100-2")["metadata"]["labels"]["nvidia.com/mig.config"], json!(layout.name));
}

#[tokio::test]
async fn a_node_shared_by_one_tenants_environments_is_an_orphan_only_when_all_are_gone() {
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    let (training, notebook) = vault_pair();
    for w in [&notebook, &training] {
        for step in provision_plan(w.offering, w.shape) {
            k8s.run(w, step).await.unwrap();
        }
    }
    let owned = k8s.owned_objects().await.unwrap();
    let node = owned.iter().find(|o| o.kind == "Node").expect("listed").clone();
    for env in [ENV_ID, OTHER_ENV_ID] {
        assert!(orphans(std::slice::from_ref(&node), &live(&[env])).is_empty(), "{env}");
    }
    assert_eq!(orphans(std::slice::from_ref(&node), &live(&[])), std::slice::from_ref(&node));
    // A third environment of the tenant joins between the listing and the removal: the
    // node is not the listed environments' alone any more, so the sweep leaves it.
    let mut third = training.clone();
    third.environment_id = THIRD_ENV_ID.into();
    third.units = vec![PlacedUnit { environment_id: THIRD_ENV_ID.into(), ..gpu_unit("h100-2", 5) }];
    third.tenant_neighbours = training.units.iter().chain(&notebook.units).cloned().collect();
    k8s.run(&third, Step::StartWorkload).await.unwrap();
    assert_eq!(holders(&cluster, "h100-2"), json!(format!("{ENV_ID},{THIRD_ENV_ID},{OTHER_ENV_ID}")));
    assert!(!k8s.remove_owned(&node).await.unwrap(), "a live environment joined");
    assert_eq!(cluster.node("h100-2")["metadata"]["labels"]["berth.dev/tenant"], "vault");
    // Listed again with all three gone, it is given back, keeping the MIG layout's part.
    let node = k8s.owned_objects().await.unwrap().into_iter().find(|o| o.kind == "Node").expect("listed");
    assert!(k8s.remove_owned(&node).await.unwrap());
    let after = cluster.node("h100-2");
    assert!(after["metadata"]["labels"].get("berth.dev/tenant").is_none(), "{after}");
    assert!(after.pointer("/spec/taints").is_none(), "{after}");
    assert_eq!(after["metadata"]["annotations"]["berth.dev/mig-environments"], OTHER_ENV_ID, "{after}");
}

#[tokio::test]
async fn an_unreachable_cluster_is_refused_at_start_up_with_a_clear_message() {
    // Port 9 (discard) on loopback: nothing listens, the connection is refused at once.
    let client = kube::Config::new("https://127.0.0.1:9".parse().unwrap());
    let error = Kubernetes::connect_with(client, KubernetesConfig::default()).await.err().expect("no cluster");
    assert!(error.starts_with("the Kubernetes API server at https://127.0.0.1:9 does not answer"), "{error}");
}

// ---------------------------------------------------------------------------------------
// Reaching what was booked: the proxy's upstream, training logs, replicas

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

// ---------------------------------------------------------------------------------------
// A soft tenant's namespace, shared by its environments

/// Two environments of acme in its namespace: the MIG notebook, and an L40S endpoint of
/// two replicas, each told of the other as the reconciler tells them.
fn acme_pair() -> (Workload, Workload) {
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

fn quota_of(bundle: &[Manifest]) -> Value {
    bundle.iter().find(|m| m.kind.kind == "ResourceQuota").expect("a quota").object["spec"]["hard"].clone()
}

#[test]
fn a_tenants_namespace_quota_is_what_its_environments_there_hold_together() {
    let (notebook, endpoint) = acme_pair();
    let (a, b) = (manifests::Names::of(&notebook), manifests::Names::of(&endpoint));
    assert_eq!((a.namespace.as_str(), b.namespace.as_str()), ("berth-acme", "berth-acme"));
    assert_eq!((a.workload.as_str(), b.workload.as_str()), ("nb-0f1e2d3c4b5a", "inf-999999998888"));
    assert_ne!(a.credential, b.credential);
    assert_ne!(a.proxy_policy, b.proxy_policy);

    // Both environments apply the same bundle, and the tenant's sync too: nobody undoes
    // another's apply.
    let both = namespace_bundle(&notebook, &settings());
    assert_eq!(both, namespace_bundle(&endpoint, &settings()));
    let mut holdings = vec![Holding::of(&notebook), Holding::of(&endpoint)];
    holdings.sort_by(|x, y| x.environment_id.cmp(&y.environment_id));
    let space = TenantSpace { members: acme().members, holdings };
    assert_eq!(both, tenant_namespace_bundle("acme", &space, &settings()));
    let hard = quota_of(&both);
    // The notebook: 4 vCPUs, 32 GiB, one 1g.10gb slice; the endpoint: two replicas of 16
    // vCPUs, 128 GiB and one L40S each.
    for (key, value) in [
        ("requests.cpu", "36"),
        ("limits.cpu", "36"),
        ("requests.memory", "288Gi"),
        ("requests.storage", "200Gi"),
        ("requests.nvidia.com/gpu", "2"),
        ("requests.nvidia.com/mig-1g.10gb", "1"),
        ("requests.nvidia.com/gpu.shared", "0"),
        ("pods", "32"),
        ("services", "8"),
        ("services.nodeports", "0"),
        ("services.loadbalancers", "0"),
    ] {
        assert_eq!(hard[key], value, "{key}: {hard}");
    }

    // At the notebook's end: what the endpoint holds, and no slice.
    let without = manifests::tenant_quota("acme", &manifests::space_of(&notebook, false), &settings());
    let hard = &without.object["spec"]["hard"];
    assert_eq!((hard["requests.cpu"].as_str(), hard["requests.nvidia.com/gpu"].as_str()), (Some("32"), Some("2")));
    assert!(hard.get("requests.nvidia.com/mig-1g.10gb").is_none(), "{hard}");

    // Nobody left: nothing on a GPU, no CPU, no memory, no storage; and the namespace still
    // meets the checklist.
    let empty =
        tenant_namespace_bundle("acme", &TenantSpace { members: acme().members, holdings: vec![] }, &settings());
    let hard = quota_of(&empty);
    for key in ["requests.cpu", "requests.nvidia.com/gpu", "requests.nvidia.com/gpu.shared"] {
        assert_eq!(hard[key], "0", "{key}");
    }
    assert_eq!((hard["requests.memory"].as_str(), hard["requests.storage"].as_str()), (Some("0Gi"), Some("0Gi")));
    let namespace = of_kind(&empty, "Namespace");
    assert_eq!(namespace[0]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "restricted");
    assert!(namespace[0]["metadata"].get("annotations").is_none(), "no node selector: soft isolation");
    assert_eq!(of_kind(&empty, "NetworkPolicy")[0]["spec"]["podSelector"], json!({}));
    assert_eq!(of_kind(&empty, "LocalQueue")[0]["spec"]["clusterQueue"], "berth-tenant-acme");
    for m in &empty {
        let labels = &m.object["metadata"]["labels"];
        assert_eq!(labels["app.kubernetes.io/managed-by"], "berth", "{}", m.name());
        assert!(labels.get("berth.dev/environment").is_none(), "{}: the tenant's, no environment's", m.name());
        assert_eq!(labels["berth.dev/tenant"], "acme");
    }
}

#[tokio::test]
async fn environments_sharing_a_tenants_namespace_end_one_by_one_and_the_namespace_goes_with_the_tenant() {
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    let (notebook, endpoint) = acme_pair();
    for w in [&notebook, &endpoint] {
        for step in provision_plan(w.offering, w.shape) {
            k8s.run(w, step).await.unwrap_or_else(|e| panic!("{}: {e}", step.as_str()));
        }
    }
    let of = |env: &str| -> Vec<String> {
        cluster
            .environment_objects()
            .into_iter()
            .filter(|p| cluster.lock().objects[p]["metadata"]["labels"]["berth.dev/environment"] == env)
            .collect()
    };
    let endpoint_objects = of(OTHER_ENV_ID);
    assert_eq!(endpoint_objects.len(), 4, "Deployment, Service, Secret, proxy policy: {endpoint_objects:?}");
    assert!(endpoint_objects.iter().all(|p| p.contains("/namespaces/berth-acme/")), "{endpoint_objects:?}");
    assert_eq!(of(ENV_ID).len(), 4, "StatefulSet, Service, Secret, proxy policy");
    // The StatefulSet controller claims the notebook's volume, with the template's labels.
    let claim = manifests::volume_claims(&notebook).remove(0);
    let claim_path = format!("/api/v1/namespaces/berth-acme/persistentvolumeclaims/{}", claim.name());
    assert_eq!(claim.name(), "work-nb-0f1e2d3c4b5a-0");
    cluster.lock().objects.insert(claim_path.clone(), claim.object.clone());
    let owned = k8s.owned_objects().await.unwrap();
    assert!(owned.iter().any(|o| o.kind == "PersistentVolumeClaim" && o.environments == [ENV_ID]), "{owned:?}");

    // The notebook ends: its objects go, the endpoint's stay, the quota holds the endpoint.
    for step in teardown_plan(notebook.shape) {
        k8s.run(&notebook, step).await.unwrap_or_else(|e| panic!("{}: {e}", step.as_str()));
    }
    assert_eq!(of(ENV_ID), Vec::<String>::new());
    assert!(!cluster.lock().objects.contains_key(&claim_path), "its volume went with it");
    assert_eq!(of(OTHER_ENV_ID), endpoint_objects);
    let (_, hard) = cluster.tenant_quotas().remove(0);
    assert_eq!((hard["requests.cpu"].as_str(), hard["requests.nvidia.com/gpu"].as_str()), (Some("32"), Some("2")));
    assert!(hard.get("requests.nvidia.com/mig-1g.10gb").is_none(), "{hard}");
    assert_eq!(cluster.mig_layouts(), Vec::<String>::new());

    // The endpoint ends too (told it is alone now): nothing of either, a quota of nothing,
    // and the namespace stays for the tenant.
    let endpoint = Workload { tenant_holdings: vec![], ..endpoint };
    for step in teardown_plan(endpoint.shape) {
        k8s.run(&endpoint, step).await.unwrap();
    }
    assert_nothing_left(&cluster, "both ended");
    let (namespace, hard) = cluster.tenant_quotas().remove(0);
    assert_eq!(namespace, "berth-acme");
    assert_eq!((hard["requests.cpu"].as_str(), hard["requests.nvidia.com/gpu"].as_str()), (Some("0"), Some("0")));

    // The tenant is deleted: its namespace goes with its queue.
    assert!(k8s.remove_tenant_queue("acme").await.unwrap());
    assert!(!cluster.lock().objects.keys().any(|p| p.contains("berth-acme")), "{:?}", cluster.lock().objects.keys());
}

#[tokio::test]
async fn the_sweep_takes_a_dead_environments_objects_from_its_tenants_namespace_and_only_those() {
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    let (notebook, endpoint) = acme_pair();
    for w in [&notebook, &endpoint] {
        for step in provision_plan(w.offering, w.shape) {
            k8s.run(w, step).await.unwrap();
        }
    }
    cluster.take_calls();
    // The endpoint's environment is gone (its teardown never ran); the notebook lives.
    let owned = k8s.owned_objects().await.unwrap();
    let reported = orphans(&owned, &live(&[ENV_ID]));
    let mut found: Vec<(&str, String)> = reported.iter().map(|o| (o.kind, o.name.clone())).collect();
    found.sort();
    let names = manifests::Names::of(&endpoint);
    let at = |name: &str| format!("berth-acme/{name}");
    assert_eq!(
        found,
        [
            ("Deployment", at(&names.workload)),
            ("NetworkPolicy", at(&names.proxy_policy)),
            ("Secret", at(&names.credential)),
            ("Service", at(&names.workload)),
        ],
        "the dead environment's objects, not the tenant's namespace nor the notebook's"
    );
    for orphan in &reported {
        assert!(k8s.remove_owned(orphan).await.unwrap(), "{orphan:?}");
    }
    let left = cluster.environment_objects();
    assert_eq!(left.len(), 4, "the notebook's: {left:?}");
    assert!(left.iter().all(|p| !p.contains(&names.workload)), "{left:?}");
    assert_eq!(orphans(&k8s.owned_objects().await.unwrap(), &live(&[ENV_ID])), vec![]);

    // Once the tenant is gone too, its namespace is an orphan, with everything in it.
    let gone = Live { environments: HashSet::new(), tenants: HashSet::from(["vault".to_owned()]) };
    let reported = orphans(&k8s.owned_objects().await.unwrap(), &gone);
    let namespace = reported.iter().find(|o| o.kind == "Namespace").expect("the tenant's namespace");
    assert_eq!((namespace.name.as_str(), namespace.tenant.as_deref()), ("berth-acme", Some("acme")));
    assert!(k8s.remove_owned(namespace).await.unwrap());
    assert_eq!(cluster.environment_objects(), Vec::<String>::new());
}

#[tokio::test]
async fn a_soft_tenants_sync_applies_its_queue_and_its_namespace() {
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    let (notebook, endpoint) = acme_pair();
    let (_, queue) = tenant_queues().remove(0);
    let space = TenantSpace { members: acme().members, holdings: vec![Holding::of(&endpoint), Holding::of(&notebook)] };
    let queue = TenantQueue { space: Some(space.clone()), ..queue };
    k8s.apply_tenant_queue(&queue).await.unwrap();
    let calls = cluster.take_calls();
    let expected = with(vec![format!("PATCH {TENANT_QUEUES}/berth-tenant-acme")], &bundle_calls("berth-acme", false));
    assert_eq!(calls.iter().map(kubernetes_api::Call::line).collect::<Vec<_>>(), expected);
    assert_eq!(body_of(&calls, "PATCH /api/v1/namespaces/berth-acme/resourcequotas/berth"), &quota_manifest(&space));
    // Applied again: the same applies, nothing changes.
    let before = cluster.snapshot();
    k8s.apply_tenant_queue(&queue).await.unwrap();
    assert_eq!(cluster.take_lines(), expected);
    assert_eq!(cluster.snapshot(), before);
}

fn quota_manifest(space: &TenantSpace) -> Value {
    manifests::tenant_quota("acme", space, &settings()).object
}

/// An environment provisioned in its own namespace (by an earlier Berth, or before its
/// tenant turned soft) and torn down as it would live now, and the other way round
/// (before its tenant turned hard): its workload is stopped and everything of it goes.
#[tokio::test]
async fn teardown_finds_an_environment_where_an_earlier_placement_put_it() {
    let mut cases = cases();
    let (soft_notebook, hard_job) = (cases.remove(0).1, cases.remove(0).1);
    for (case, now) in [("soft now", soft_notebook), ("hard now", hard_job)] {
        let (cluster, client) = FakeCluster::start();
        let k8s = backend(client);
        let before = manifests::other_home(&now).expect("a tenant's environment may have lived elsewhere");
        assert_ne!(ns(&before), ns(&now), "{case}");
        for step in provision_plan(before.offering, before.shape) {
            k8s.run(&before, step).await.unwrap();
        }
        let workload = workload_manifests(&before).remove(0);
        let path = format!("/namespaces/{}/{}/{}", ns(&before), workload.kind.plural, workload.name());
        assert!(cluster.lock().objects.keys().any(|p| p.ends_with(&path)), "{case}: running at {path}");
        // Its owner still reaches it there: the proxy, or the job's log.
        match now.offering {
            Offering::Notebook => {
                let upstream = k8s.upstream(&now).await.unwrap_or_else(|e| panic!("{case}: {e}"));
                let old = manifests::Names::of(&before);
                assert_eq!(
                    upstream.base_url,
                    format!("http://{}.{}.svc.cluster.local:8888", old.workload, old.namespace),
                    "{case}"
                );
            }
            _ => {
                let logs = k8s.job_logs(&now, 10).await.unwrap_or_else(|e| panic!("{case}: {e}"));
                assert_eq!(logs.status, JobStatus::Pending, "{case}: the Job there, no pod yet");
            }
        }
        for step in teardown_plan(now.shape) {
            k8s.run(&now, step).await.unwrap_or_else(|e| panic!("{case} {}: {e}", step.as_str()));
            if step == Step::StopWorkload {
                assert!(!cluster.lock().objects.keys().any(|p| p.ends_with(&path)), "{case}: stopped before release");
            }
        }
        assert_nothing_left(&cluster, case);
    }
}
