//! Tenants' Kueue ClusterQueues: what they admit, their quota per model, and their life on the cluster.

use std::collections::BTreeMap;

use berth_domain::gpu::GpuModel;
use berth_domain::lifecycle::Step;
use berth_platform::provisioning::backend::kubernetes::manifests::{self, namespace_bundle, tenant_cluster_queue};
use berth_platform::provisioning::backend::{Backend, ModelAllowance, TenantQueue, orphans};
use serde_json::{Value, json};

use crate::kubernetes_api;
use crate::kubernetes_api::FakeCluster;
use crate::support::{ENV_ID, TENANT_QUEUES, backend, cases, fleet_models, live, ns, settings, strings, tenant_queues};

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
