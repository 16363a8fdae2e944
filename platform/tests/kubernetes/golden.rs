//! Golden manifests, and manifests that survive a round trip through k8s-openapi's types.

use std::path::PathBuf;

use berth_domain::catalog::Offering;
use berth_platform::provisioning::backend::kubernetes::manifests::{
    self, Manifest, NodeStage, endpoint_manifest, namespace_bundle, node_manifest, tenant_cluster_queue,
    tenant_namespace_bundle, workload_manifests,
};
use berth_platform::provisioning::backend::{Holding, PlacedUnit, TenantSpace};
use serde_json::{Value, json};

use crate::support::{
    acme, acme_pair, cases, everything, gpu_unit, mig_unit, objects, settings, tenant_queues, workload,
};

fn golden_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/kubernetes").join(format!("{name}.json"))
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
    let both = TenantSpace {
        members: acme().members,
        holdings: vec![Holding::of(&notebook), Holding::of(&endpoint)],
        volumes: vec![],
    };
    let nobody = TenantSpace { members: acme().members, holdings: vec![], volumes: vec![] };
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
