//! A tenant's Kueue queue and namespace on Kubernetes follow its quota, environments and members.

use std::time::Duration;

use berth_domain::booking::Quota;
use berth_domain::lifecycle::EnvState;
use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use berth_platform::capacity::quotas::QuotaSubject;
use berth_platform::provisioning::backend::{Live, orphans};
use berth_platform::provisioning::reconciler::ReconcilerConfig;
use berth_platform::tenancy::tenants::TenantChange;
use serde_json::Value;
use sqlx::SqlitePool;

use crate::common::fast_reconciler;
use crate::kubernetes_api::{FakeCluster, Faults};
use crate::support::{Site, World};

const TENANT_QUEUES: &str = "/apis/kueue.x-k8s.io/v1beta1/clusterqueues";

/// What tenant `slug`'s ClusterQueue allows of each resource (`None` while it has none):
/// (nominal quota, borrowing limit).
fn queue_quota(
    cluster: &FakeCluster,
    slug: &str,
) -> Option<std::collections::BTreeMap<String, (String, Option<String>)>> {
    let queue = cluster.lock().objects.get(&format!("{TENANT_QUEUES}/berth-tenant-{slug}"))?.clone();
    let resources = queue.pointer("/spec/resourceGroups/0/flavors/0/resources")?.as_array()?.clone();
    Some(
        resources
            .iter()
            .map(|r| {
                let text = |key: &str| r.get(key).and_then(|v| v.as_str()).map(str::to_owned);
                (text("name").unwrap_or_default(), (text("nominalQuota").unwrap_or_default(), text("borrowingLimit")))
            })
            .collect(),
    )
}

/// Waits until tenant `slug`'s queue allows `gpus` whole GPUs (`None`: until it is gone).
async fn queue_reaches(cluster: &FakeCluster, slug: &str, gpus: Option<&str>) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let now = queue_quota(cluster, slug).map(|q| q.get("nvidia.com/gpu").map(|g| g.0.clone()).unwrap_or_default());
        if now.as_deref() == gpus {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The fast reconciler with a 300 ms step timeout, sweeping only when a test asks for it.
fn sweeping_on_request() -> ReconcilerConfig {
    ReconcilerConfig {
        step_timeout: Duration::from_millis(300),
        sweep_interval: Duration::from_secs(3600),
        ..fast_reconciler()
    }
}

/// A tenant's ClusterQueue exists from its creation, follows every change of its quota,
/// is what its environments' LocalQueues feed, goes when the tenant is deleted, and a
/// late apply of it after that is swept and audited.
#[sqlx::test(migrations = "../migrations")]
async fn a_tenants_queue_follows_its_quota_and_goes_with_the_tenant_on_kubernetes(pool: SqlitePool) {
    let site = Site::with_config(pool, World::kubernetes(), sweeping_on_request()).await;
    let World::Kubernetes(cluster) = &site.world else { unreachable!() };
    let (acme, members) = site.tenant("acme", Isolation::Soft, 1).await;

    // No quota: the fleet's capacity. 32 H100s, 8 A100s and 8 L40S bookable whole; 2 L40S
    // time-sliced 4 ways; 8 nodes of 192 vCPUs.
    assert!(queue_reaches(cluster, "acme", Some("48")).await, "{:?}", queue_quota(cluster, "acme"));
    let quota = queue_quota(cluster, "acme").unwrap();
    assert_eq!(quota["nvidia.com/gpu.shared"].0, "8");
    assert_eq!(quota["cpu"].0, "1536");
    assert_eq!(quota["nvidia.com/mig-1g.10gb"].0, "280", "7 per GPU on 40 MIG GPUs");

    // The platform admin limits acme to 2 H100-equivalents and 1 of every other model.
    let limited = Quota::parse("1", "H100-80GB = 2", "", "", "", false).expect("quota");
    site.platform().set_quota_for(&site.admin, "tenant", "acme", &limited).await.expect("set quota");
    assert!(
        queue_reaches(cluster, "acme", Some("4")).await,
        "2 H100 + 1 A100 + 1 L40S: {:?}",
        queue_quota(cluster, "acme")
    );
    let quota = queue_quota(cluster, "acme").unwrap();
    assert_eq!(
        quota["nvidia.com/mig-3g.40gb"],
        ("6".to_owned(), Some("0".to_owned())),
        "4 on H100, 2 on A100; no borrowing"
    );
    assert_eq!(quota["nvidia.com/gpu.shared"].0, "4");

    // Spot allowed: the queue may borrow from the cohort.
    let spot = Quota { allow_spot: true, ..limited };
    site.platform().set_quota_for(&site.admin, "tenant", "acme", &spot).await.expect("set quota");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while queue_quota(cluster, "acme").unwrap()["nvidia.com/gpu"].1.is_some() {
        assert!(tokio::time::Instant::now() < deadline, "never allowed to borrow");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // The quota removed: the capacity again.
    let rows = site.platform().quotas(&site.admin).await.expect("quotas");
    let row = rows.iter().find(|r| r.subject == QuotaSubject::Tenant(acme)).expect("acme's row");
    site.platform().remove_quota(&site.admin, row.id).await.expect("remove quota");
    assert!(queue_reaches(cluster, "acme", Some("48")).await, "{:?}", queue_quota(cluster, "acme"));

    // A member's environment feeds it through its LocalQueue, and has no queue of its own.
    let env = site.launch(&members[0], "training", "h100-1", "job").await.expect("launch");
    assert_eq!(site.wait_for(&env.id, &[EnvState::Ready], Duration::from_secs(10)).await, Some(EnvState::Ready));
    {
        let state = cluster.lock();
        let local: Vec<_> = state.objects.iter().filter(|(p, _)| p.ends_with("/localqueues/berth")).collect();
        assert_eq!(local.len(), 1);
        assert_eq!(local[0].1["spec"]["clusterQueue"], "berth-tenant-acme");
        let queues: Vec<&String> = state.objects.keys().filter(|p| p.starts_with(TENANT_QUEUES)).collect();
        assert_eq!(queues, [&format!("{TENANT_QUEUES}/berth-tenant-acme")], "no queue of the environment's own");
    }

    // Deleted: the queue goes with the tenant, and its environment is torn down.
    site.platform().change_tenant(&site.admin, acme, TenantChange::Delete).await.expect("delete");
    assert!(queue_reaches(cluster, "acme", None).await, "the queue went with the tenant");
    assert_eq!(site.wait_for(&env.id, &[EnvState::Released], Duration::from_secs(10)).await, Some(EnvState::Released));

    // An apply that lands after that (its answer lost in a timeout) is swept and audited.
    let late = site.platform().tenant_queue(acme).await.expect("queue");
    site.backend.apply_tenant_queue(&late).await.expect("late apply");
    assert!(queue_quota(cluster, "acme").is_some());
    let report = site.reconciler().sweep().await.expect("sweep");
    let removed: Vec<(&str, &str)> = report.removed.iter().map(|o| (o.kind, o.name.as_str())).collect();
    assert_eq!(removed, [("Namespace", "berth-acme"), ("ClusterQueue", "berth-tenant-acme")]);
    assert!(queue_quota(cluster, "acme").is_none());
    assert!(!cluster.lock().objects.contains_key("/api/v1/namespaces/berth-acme"));
    let audited: Vec<(String, Option<i64>, String)> = sqlx::query_as(
        "SELECT target, tenant_id, detail FROM audit_events WHERE action = 'orphan.remove' AND outcome = 'success'
         ORDER BY target",
    )
    .fetch_all(&site.pool)
    .await
    .expect("audited");
    let targets: Vec<(&str, Option<i64>)> = audited.iter().map(|a| (a.0.as_str(), a.1)).collect();
    assert_eq!(targets, [("ClusterQueue berth-tenant-acme", Some(acme)), ("Namespace berth-acme", Some(acme))]);
    for (_, _, detail) in &audited {
        assert!(detail.starts_with("made for tenant acme, which is deleted"), "{detail}");
    }
    let again = site.reconciler().sweep().await.expect("sweep");
    assert_eq!(again.removed, vec![]);
    // What is left of the environments' is nothing, the ConfigMap's layouts included.
    assert_eq!(site.world.leftovers(), Vec::<String>::new());
    let live = Live { environments: Default::default(), tenants: Default::default() };
    assert_eq!(orphans(&site.backend.owned_objects().await.expect("owned"), &live), vec![]);
}

/// While the cluster refuses a tenant's queue, platform admins see why and since when on
/// the tenant's row; the first sync that succeeds clears it.
#[sqlx::test(migrations = "../migrations")]
async fn a_tenants_queue_that_cannot_follow_its_quota_shows_why_until_it_does(pool: SqlitePool) {
    let config = ReconcilerConfig { sweep_interval: Duration::from_secs(3600), ..fast_reconciler() };
    let site = Site::with_config(pool, World::kubernetes(), config).await;
    let World::Kubernetes(cluster) = &site.world else { unreachable!() };
    let (acme, _) = site.tenant("acme", Isolation::Soft, 1).await;
    assert!(queue_reaches(cluster, "acme", Some("48")).await);
    let failure = || async {
        let tenants = site.platform().tenants(&site.admin).await.expect("tenants");
        tenants.into_iter().find(|t| t.id == acme).expect("acme").queue_failure
    };
    assert_eq!(failure().await, None);

    cluster.set_faults(Faults { error: 1.0, ..Faults::default() });
    let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as i64;
    let limited = Quota::parse("1", "H100-80GB = 2", "", "", "", false).expect("quota");
    site.platform().set_quota_for(&site.admin, "tenant", "acme", &limited).await.expect("set quota");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let first = loop {
        if let Some(f) = failure().await {
            break f;
        }
        assert!(tokio::time::Instant::now() < deadline, "the failure never showed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(first.error.contains("failed to apply ClusterQueue berth-tenant-acme"), "{}", first.error);
    assert!(first.since >= before);
    // Failing again and again keeps the first time it failed.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(failure().await.map(|f| f.since), Some(first.since));
    assert!(queue_reaches(cluster, "acme", Some("48")).await, "the queue still has the old quota");

    cluster.set_faults(Faults::default());
    assert!(queue_reaches(cluster, "acme", Some("4")).await, "{:?}", queue_quota(cluster, "acme"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while failure().await.is_some() {
        assert!(tokio::time::Instant::now() < deadline, "the failure never cleared");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until `namespace`'s quota allows `value` of `key` (5 s at most).
async fn tenant_quota_reaches(cluster: &FakeCluster, namespace: &str, key: &str, value: &str) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let now =
            cluster.tenant_quotas().into_iter().find(|(ns, _)| ns == namespace).map(|(_, hard)| hard[key].clone());
        if now.as_ref().and_then(Value::as_str) == Some(value) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The users a RoleBinding of acme's namespace binds.
fn bound(cluster: &FakeCluster, binding: &str) -> Vec<String> {
    let path = format!("/apis/rbac.authorization.k8s.io/v1/namespaces/berth-acme/rolebindings/{binding}");
    let subjects = cluster.lock().objects.get(&path).map(|b| b["subjects"].clone()).unwrap_or_default();
    subjects.as_array().into_iter().flatten().filter_map(|s| s["name"].as_str().map(str::to_owned)).collect()
}

/// A soft tenant's notebooks share its namespace, whose quota the database decides: what
/// its live environments hold, followed as two start at once and end one by one; its
/// RoleBindings follow its members.
#[sqlx::test(migrations = "../migrations")]
async fn a_soft_tenants_namespace_follows_its_environments_and_members_on_kubernetes(pool: SqlitePool) {
    let site = Site::with_config(pool, World::kubernetes(), sweeping_on_request()).await;
    let World::Kubernetes(cluster) = &site.world else { unreachable!() };
    let (acme, members) = site.tenant("acme", Isolation::Soft, 2).await;
    // The namespace exists with the tenant, holding nothing.
    assert!(tenant_quota_reaches(cluster, "berth-acme", "requests.nvidia.com/gpu", "0").await);

    let (a, b) = tokio::join!(
        site.launch(&members[0], "notebook", "l40s-1", "a"),
        site.launch(&members[1], "notebook", "l40s-1", "b")
    );
    let (a, b) = (a.expect("launch a").id, b.expect("launch b").id);
    for id in [&a, &b] {
        assert_eq!(site.wait_for(id, &[EnvState::Ready], Duration::from_secs(10)).await, Some(EnvState::Ready));
        let short: String = id.chars().filter(char::is_ascii_alphanumeric).take(12).collect();
        let statefulset = format!("/apis/apps/v1/namespaces/berth-acme/statefulsets/nb-{short}");
        assert!(cluster.lock().objects.contains_key(&statefulset), "{statefulset}");
    }
    assert!(
        tenant_quota_reaches(cluster, "berth-acme", "requests.nvidia.com/gpu", "2").await,
        "{:?}",
        cluster.tenant_quotas()
    );
    // Each booking's 100 GiB, and the two members' home volumes (10 GiB each), kept in the
    // namespace between bookings.
    assert!(
        tenant_quota_reaches(cluster, "berth-acme", "requests.storage", "220Gi").await,
        "{:?}",
        cluster.tenant_quotas()
    );
    // Their members are bound by their Berth role (re-applied at each start).
    assert_eq!(bound(cluster, "berth-members"), ["m0@acme.test", "m1@acme.test"]);

    // One ends: the quota holds the other.
    site.platform().stop(&members[0], &a).await.expect("stop a");
    assert_eq!(site.wait_for(&a, &[EnvState::Released], Duration::from_secs(10)).await, Some(EnvState::Released));
    assert!(
        tenant_quota_reaches(cluster, "berth-acme", "requests.nvidia.com/gpu", "1").await,
        "{:?}",
        cluster.tenant_quotas()
    );
    // The home volume of the one that ended stays.
    assert!(
        tenant_quota_reaches(cluster, "berth-acme", "requests.storage", "120Gi").await,
        "{:?}",
        cluster.tenant_quotas()
    );

    // A member becomes a viewer: the bindings follow, without any environment starting.
    let viewer = members[1].user_id();
    site.platform().change_member_role(&site.admin, acme, viewer, "viewer").await.expect("role");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while bound(cluster, "berth-viewers") != ["m1@acme.test"] {
        assert!(tokio::time::Instant::now() < deadline, "viewers: {:?}", bound(cluster, "berth-viewers"));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(bound(cluster, "berth-members"), ["m0@acme.test"]);
    // A member added by `berth admin` (no invitation) is bound too.
    site.platform()
        .create_user("m2@acme.test", "m2", "a long passphrase", Role::Member, Some(acme))
        .await
        .expect("user");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while bound(cluster, "berth-members") != ["m0@acme.test", "m2@acme.test"] {
        assert!(tokio::time::Instant::now() < deadline, "members: {:?}", bound(cluster, "berth-members"));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // The other ends: nothing held, nothing of either left, the namespace stays.
    site.platform().stop(&members[1], &b).await.expect("stop b");
    assert_eq!(site.wait_for(&b, &[EnvState::Released], Duration::from_secs(10)).await, Some(EnvState::Released));
    for key in ["requests.nvidia.com/gpu", "requests.cpu"] {
        assert!(tenant_quota_reaches(cluster, "berth-acme", key, "0").await, "{key}: {:?}", cluster.tenant_quotas());
    }
    assert_eq!(site.world.leftovers(), Vec::<String>::new());
    assert!(cluster.lock().objects.contains_key("/api/v1/namespaces/berth-acme"));
}

/// Three MIG notebooks on one GPU stopped together: each clears the node's layout with the
/// others left out once their workloads are gone, so the last layout written is MIG
/// disabled, without waiting for a sweep (sweeps are off here).
#[sqlx::test(migrations = "../migrations")]
async fn neighbours_stopping_together_leave_no_mig_layout_without_a_sweep(pool: SqlitePool) {
    let site = Site::with_config(pool, World::kubernetes(), sweeping_on_request()).await;
    let (_, members) = site.tenant("acme", Isolation::Soft, 1).await;
    for round in 0..5 {
        let mut ids = Vec::new();
        for n in 0..3 {
            let name = format!("r{round}-{n}");
            ids.push(site.launch(&members[0], "notebook", "h100-1g.10gb", &name).await.expect("launch").id);
        }
        for id in &ids {
            assert_eq!(site.wait_for(id, &[EnvState::Ready], Duration::from_secs(10)).await, Some(EnvState::Ready));
        }
        let gpus = site.count("SELECT count(DISTINCT gpu_id) FROM reservations WHERE released_at IS NULL").await;
        assert_eq!(gpus, 1, "the slices share one GPU, so its layout is shared");
        let stops: Vec<_> = ids
            .iter()
            .map(|id| {
                let (platform, owner, id) = (site.platform(), members[0].clone(), id.clone());
                tokio::spawn(async move { platform.stop(&owner, &id).await.map(|_| ()) })
            })
            .collect();
        for stop in stops {
            stop.await.expect("task").expect("stop");
        }
        for id in &ids {
            let state = site.wait_for(id, &[EnvState::Released], Duration::from_secs(10)).await;
            assert_eq!(state, Some(EnvState::Released));
        }
        assert_eq!(site.world.leftovers(), Vec::<String>::new(), "round {round}");
    }
}

/// A notebook whose clearing write lands after its two MIG neighbours have ended (read
/// while they still held their slices, it keeps their layout) is cleared again with what
/// holds the node now, so no layout is left without a sweep (sweeps are off here).
#[sqlx::test(migrations = "../migrations")]
async fn a_clearing_that_lands_after_its_neighbours_ended_is_done_again(pool: SqlitePool) {
    // Steps never time out here: the held write must end the step, not a timeout and retry.
    let config = ReconcilerConfig { step_timeout: Duration::from_secs(30), ..sweeping_on_request() };
    let site = Site::with_config(pool, World::kubernetes(), config).await;
    let World::Kubernetes(cluster) = &site.world else { unreachable!() };
    let (_, members) = site.tenant("acme", Isolation::Soft, 1).await;
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(site.launch(&members[0], "notebook", "h100-1g.10gb", &format!("nb-{n}")).await.expect("launch").id);
    }
    for id in &ids {
        assert_eq!(site.wait_for(id, &[EnvState::Ready], Duration::from_secs(10)).await, Some(EnvState::Ready));
    }
    let node: String = sqlx::query_scalar(
        "SELECT DISTINCT n.name FROM reservations r JOIN gpus g ON g.id = r.gpu_id JOIN nodes n ON n.id = g.node_id
         WHERE r.released_at IS NULL",
    )
    .fetch_one(&site.pool)
    .await
    .expect("one node");

    // The first notebook's clearing (its neighbours' layout, both still holding) is held.
    cluster.lock().hold_next = Some(format!("PATCH /api/v1/nodes/{node}"));
    site.platform().stop(&members[0], &ids[0]).await.expect("stop");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while cluster.held() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the clearing never came");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for id in &ids[1..] {
        site.platform().stop(&members[0], id).await.expect("stop");
        assert_eq!(site.wait_for(id, &[EnvState::Released], Duration::from_secs(10)).await, Some(EnvState::Released));
    }
    assert_eq!(cluster.node(&node)["metadata"]["labels"]["nvidia.com/mig.config"], "all-disabled");

    // It lands now, naming the two that are gone.
    cluster.release_held();
    assert_eq!(site.wait_for(&ids[0], &[EnvState::Released], Duration::from_secs(10)).await, Some(EnvState::Released));
    assert_eq!(site.world.leftovers(), Vec::<String>::new());
}
