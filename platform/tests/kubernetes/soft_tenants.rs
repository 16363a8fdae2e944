//! A soft tenant's namespace, shared by its environments: its quota, their ends, the sweep, placements.

use std::collections::HashSet;

use berth_domain::catalog::Offering;
use berth_domain::lifecycle::{Step, provision_plan, teardown_plan};
use berth_platform::provisioning::backend::kubernetes::manifests::{
    self, Manifest, namespace_bundle, tenant_namespace_bundle, workload_manifests,
};
use berth_platform::provisioning::backend::{
    Backend, Holding, JobStatus, Live, TenantQueue, TenantSpace, Workload, orphans,
};
use serde_json::{Value, json};

use crate::kubernetes_api;
use crate::kubernetes_api::FakeCluster;
use crate::support::{
    ENV_ID, OTHER_ENV_ID, TENANT_QUEUES, acme, acme_pair, assert_nothing_left, backend, body_of, bundle_calls, cases,
    live, ns, of_kind, settings, tenant_queues, with,
};

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
    let space = TenantSpace { members: acme().members, holdings, volumes: vec![] };
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
    let empty = tenant_namespace_bundle(
        "acme",
        &TenantSpace { members: acme().members, holdings: vec![], volumes: vec![] },
        &settings(),
    );
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
    let space = TenantSpace {
        members: acme().members,
        holdings: vec![Holding::of(&endpoint), Holding::of(&notebook)],
        volumes: vec![],
    };
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
