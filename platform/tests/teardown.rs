//! Teardown you can trust, on the simulated backend and on Kubernetes (a stateful fake API
//! server): the orphan sweep, a deleted tenant leaving nothing behind (its Kueue queue
//! included), a tenant's queue following its quota, and 1,000 random create/stop cycles
//! with injected faults and reconciler crashes, checked afterwards with SQL written
//! independently of the booking code.
#![allow(clippy::expect_used, clippy::unwrap_used)] // helpers of tests stop the test with their message

mod common;
mod kubernetes_api;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_domain::Refusal;
use berth_domain::booking::Quota;
use berth_domain::fleet::FleetSpec;
use berth_domain::launch::LaunchRequest;
use berth_domain::lifecycle::{EnvState, Step};
use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use berth_platform::capacity::environments::Environment;
use berth_platform::capacity::quotas::QuotaSubject;
use berth_platform::provisioning::backend::kubernetes::{Kubernetes, KubernetesConfig};
use berth_platform::provisioning::backend::simulated::{FaultRule, LATE_BY, Simulated, SimulatedConfig};
use berth_platform::provisioning::backend::{
    Backend, Live, OwnedFuture, OwnedObject, RemoveFuture, StepFuture, TenantScope, Workload, orphans,
};
use berth_platform::provisioning::reconciler::{Reconciler, ReconcilerConfig};
use berth_platform::tenancy::tenants::TenantChange;
use berth_platform::{Caller, Error, Platform};
use common::{
    fast_reconciler, overlapping_leases, overlapping_reservations, production_pool, tenants_sharing_nodes, test_meta,
    trigger_abort,
};
use kubernetes_api::{FakeCluster, Faults};
use rand::Rng;
use rand::seq::IndexedRandom;
use serde_json::Value;
use sqlx::SqlitePool;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Four H100 nodes, one A100 node, two L40S nodes and a time-sliced development node:
/// room for every size of every offering.
const FLEET: &str = r#"
[[site]]
name = "test-1"
[[site.pool]]
prefix = "h100"
model = "H100-80GB"
nodes = 4
gpus_per_node = 8
nvlink = true
[[site.pool]]
prefix = "a100"
model = "A100-80GB"
nodes = 1
gpus_per_node = 8
[[site.pool]]
prefix = "l40s"
model = "L40S"
nodes = 2
gpus_per_node = 4
[[site.pool]]
prefix = "dev"
model = "L40S"
nodes = 1
gpus_per_node = 2
time_slices = 4
"#;

fn fleet() -> FleetSpec {
    FleetSpec::parse(FLEET).expect("test fleet")
}

fn fault(rule: &str) -> FaultRule {
    rule.parse().expect("fault rule")
}

// ---------------------------------------------------------------------------------------
// A Berth whose process can crash: the platform and its reconciler are replaced together,
// the database and the backend (the outside world) stay.

/// The backend under test and how to break it.
#[derive(Clone)]
enum World {
    Simulated(Arc<Simulated>),
    Kubernetes(Arc<FakeCluster>),
}

impl World {
    fn simulated(faults: Vec<FaultRule>) -> (World, Arc<dyn Backend>) {
        let simulated = Arc::new(Simulated::new(SimulatedConfig { speed: 0.0, faults }));
        (World::Simulated(simulated.clone()), simulated)
    }

    fn kubernetes() -> (World, Arc<dyn Backend>) {
        let nodes: Vec<String> = fleet().nodes.iter().map(|n| n.name.clone()).collect();
        let (cluster, client) = FakeCluster::stateful(&nodes);
        let config = KubernetesConfig { poll_interval: Duration::from_millis(1), ..KubernetesConfig::default() };
        let backend = Kubernetes::with_client(client, config, "https://k8s.test:6443");
        (World::Kubernetes(Arc::new(cluster)), Arc::new(backend))
    }

    fn name(&self) -> &'static str {
        match self {
            World::Simulated(_) => "simulated",
            World::Kubernetes(_) => "kubernetes",
        }
    }

    fn faults_on(&self) {
        match self {
            World::Simulated(s) => s.set_faults(
                [
                    "configure_partition=fail@0.03",
                    "pull_image=hang@0.01",
                    "start_workload=late@0.03",
                    "start_workload=fail@0.02",
                    "wait_healthy=hang@0.01",
                    "expose_endpoint=late@0.03",
                    "remove_endpoint=fail@0.05",
                    "stop_workload=fail@0.05",
                    "stop_workload=hang@0.01",
                    "clear_partition=fail@0.05",
                    "release_capacity=fail@0.03",
                ]
                .map(fault)
                .to_vec(),
            ),
            World::Kubernetes(c) => c.set_faults(Faults { error: 0.006, hang: 0.0008, late: 0.004 }),
        }
    }

    fn faults_off(&self) {
        match self {
            World::Simulated(s) => s.set_faults(vec![]),
            World::Kubernetes(c) => c.set_faults(Faults::default()),
        }
    }

    /// Waits until everything a lost answer set in motion has landed.
    async fn quiesce(&self) {
        match self {
            World::Simulated(_) => tokio::time::sleep(LATE_BY + Duration::from_millis(100)).await,
            World::Kubernetes(c) => c.quiesce().await,
        }
    }

    /// What Berth left in the backend, described for a failure message.
    fn leftovers(&self) -> Vec<String> {
        match self {
            World::Simulated(s) => {
                let world = s.world();
                let mut left: Vec<String> = world.owned().iter().map(|o| format!("{} {}", o.kind, o.name)).collect();
                left.extend(world.partitions.iter().map(|p| format!("partition {p}")));
                left.sort();
                left.dedup();
                left
            }
            World::Kubernetes(c) => c.berth_leftovers(),
        }
    }

    /// The tenants whose queue the backend holds, by slug, in order (the simulated backend
    /// has no queueing system of its own, so none).
    fn tenant_queues(&self) -> Vec<String> {
        match self {
            World::Simulated(_) => Vec::new(),
            World::Kubernetes(c) => c.tenant_queues(),
        }
    }
}

struct Site {
    /// The test's own connection, for checker queries.
    pool: SqlitePool,
    platform: Mutex<Platform>,
    world: World,
    backend: Arc<dyn Backend>,
    config: ReconcilerConfig,
    reconciler: Mutex<Option<(oneshot::Sender<()>, JoinHandle<()>)>>,
    admin: Caller,
}

impl Site {
    async fn new(pool: SqlitePool, world: (World, Arc<dyn Backend>)) -> Site {
        let config = ReconcilerConfig { step_timeout: Duration::from_millis(300), ..fast_reconciler() };
        Site::with_config(pool, world, config).await
    }

    async fn with_config(
        pool: SqlitePool,
        (world, backend): (World, Arc<dyn Backend>),
        config: ReconcilerConfig,
    ) -> Site {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("berth_platform=info,sqlx=warn"))
            .with_test_writer()
            .try_init();
        let platform = Platform::new(production_pool(&pool).await);
        platform.sync_fleet(&fleet()).await.expect("sync fleet");
        let admin = platform
            .create_user("root@example.com", "Root", "a long passphrase", Role::PlatformAdmin, None)
            .await
            .expect("admin")
            .caller(test_meta());
        let site =
            Site { pool, platform: Mutex::new(platform), world, backend, config, reconciler: Mutex::new(None), admin };
        site.start_reconciler();
        site
    }

    fn platform(&self) -> Platform {
        self.platform.lock().unwrap().clone()
    }

    /// A reconciler of this process that is not running: for sweeps on demand.
    fn reconciler(&self) -> Reconciler {
        Reconciler::new(self.platform(), self.backend.clone(), self.config.clone())
    }

    fn start_reconciler(&self) {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(self.reconciler().run(async {
            let _ = stopped.await;
        }));
        *self.reconciler.lock().unwrap() = Some((stop, task));
    }

    /// The process dies wherever it is: the reconciler and its steps stop mid-await, open
    /// transactions roll back, requests in flight fail. A new process starts on fresh
    /// connections once the old ones are gone.
    async fn crash(&self) {
        let running = self.reconciler.lock().unwrap().take();
        if let Some((_stop, task)) = running {
            task.abort();
            let _ = task.await;
        }
        let old = self.platform();
        old.db().close().await;
        *self.platform.lock().unwrap() = Platform::new(production_pool(&self.pool).await);
        self.start_reconciler();
    }

    /// A tenant created by the platform admin, with `members` members.
    async fn tenant(&self, slug: &str, isolation: Isolation, members: usize) -> (i64, Vec<Caller>) {
        let platform = self.platform();
        let tenant = platform.create_tenant(&self.admin, slug, slug, isolation.as_str(), "").await.expect("tenant").id;
        let mut callers = Vec::new();
        for n in 0..members {
            let email = format!("m{n}@{slug}.test");
            let user = platform
                .create_user(&email, &email, "a long passphrase", Role::Member, Some(tenant))
                .await
                .expect("member");
            callers.push(user.caller(test_meta()));
        }
        (tenant, callers)
    }

    async fn launch(&self, caller: &Caller, offering: &str, size: &str, name: &str) -> Result<Environment, Error> {
        let needs_image = offering == "training" || offering == "inference";
        let request = LaunchRequest {
            offering: offering.into(),
            size: size.into(),
            name: name.into(),
            hours: "1".into(),
            image: if needs_image { "ghcr.io/acme/app:1".into() } else { String::new() },
            command: if offering == "training" { "python main.py; sleep infinity".into() } else { String::new() },
            ..LaunchRequest::default()
        };
        self.platform().launch(caller, &request).await
    }

    async fn state_of(&self, id: &str) -> EnvState {
        let state: String = sqlx::query_scalar("SELECT state FROM environments WHERE id = ?")
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .expect("environment");
        EnvState::parse(&state).expect("state")
    }

    async fn wait_for(&self, id: &str, wanted: &[EnvState], within: Duration) -> Option<EnvState> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let state = self.state_of(id).await;
            if wanted.contains(&state) {
                return Some(state);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(&self.pool).await.unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Whether `sql` counts `wanted` within `within`.
    async fn eventually(&self, sql: &str, wanted: i64, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while self.count(sql).await != wanted {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    /// Waits until no environment is live, stopping (as the platform admin) those still
    /// meant to run; fails the test after `within`.
    async fn converge(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let running: Vec<String> = sqlx::query_scalar(
                "SELECT id FROM environments WHERE state NOT IN ('released', 'failed') AND desired = 'running'",
            )
            .fetch_all(&self.pool)
            .await
            .expect("live");
            for id in running {
                let _ = self.platform().stop(&self.admin, &id).await;
            }
            let live = self.count("SELECT count(*) FROM environments WHERE state NOT IN ('released', 'failed')").await;
            // On Kubernetes, tenants' queues are in line too (re-applied at every sweep, so
            // this holds between two sweeps).
            let queues_behind = match self.world {
                World::Simulated(_) => 0,
                World::Kubernetes(_) => {
                    self.count("SELECT count(*) FROM tenants WHERE queue_synced < queue_version").await
                }
            };
            if live == 0 && queues_behind == 0 {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                let stuck: Vec<(String, String, String)> = sqlx::query_as(
                    "SELECT id, state, desired FROM environments WHERE state NOT IN ('released', 'failed')",
                )
                .fetch_all(&self.pool)
                .await
                .expect("stuck");
                panic!("{}: environments never converged: {stuck:?}", self.world.name());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The checker: everything a finished run must hold, in SQL that does not use the
    /// booking code, and the backend's own view.
    async fn assert_clean(&self) {
        let name = self.world.name();
        assert_eq!(self.count("SELECT count(*) FROM environments WHERE state NOT IN ('released', 'failed')").await, 0);
        assert_eq!(
            self.count(
                "SELECT count(*) FROM reservations r JOIN environments e ON e.id = r.environment_id
                 WHERE r.released_at IS NULL AND e.state IN ('released', 'failed')"
            )
            .await,
            0,
            "{name}: a final environment holds a reservation"
        );
        assert_eq!(self.count("SELECT count(*) FROM reservations WHERE released_at IS NULL").await, 0, "{name}");
        assert_eq!(overlapping_reservations(&self.pool).await, 0, "{name}: overlapping reservations");
        // Once its capacity is back in the pool, nothing more runs for an environment: a
        // step would act on GPUs that may be someone else's by then.
        let late_steps: Vec<(String, String)> = sqlx::query_as(
            "SELECT DISTINCT s.environment_id, s.step FROM environment_steps s
             JOIN reservations r ON r.environment_id = s.environment_id
             WHERE s.started_at > r.released_at LIMIT 10",
        )
        .fetch_all(&self.pool)
        .await
        .expect("checker");
        assert_eq!(late_steps, vec![], "{name}: steps ran after the environment's capacity was released");
        assert_eq!(
            self.count("SELECT count(*) FROM reservations WHERE mig_profile IS NOT NULL AND released_at IS NULL").await,
            0,
            "{name}: a MIG slice still held"
        );
        assert_eq!(
            self.count(
                "SELECT count(*) FROM fabric_leases l JOIN tenants t ON t.id = l.tenant_id
                 WHERE t.status = 'deleted' AND l.released_at IS NULL"
            )
            .await,
            0,
            "{name}: a deleted tenant holds a fabric identifier"
        );
        assert_eq!(overlapping_leases(&self.pool).await, 0, "{name}: a fabric identifier leased twice");
        assert_eq!(
            self.count(
                "SELECT count(*) FROM tenants t WHERE t.status <> 'deleted' AND t.isolation <> 'soft'
                   AND (SELECT count(*) FROM fabric_leases l WHERE l.tenant_id = t.id AND l.released_at IS NULL) <> 4"
            )
            .await,
            0,
            "{name}: a live hard tenant lost one of its identifiers"
        );
        let owned = self.backend.owned_objects().await.expect("list the backend's objects");
        let (tenants, owned): (Vec<OwnedObject>, Vec<OwnedObject>) =
            owned.into_iter().partition(|o| o.tenant.is_some());
        assert_eq!(owned, Vec::<OwnedObject>::new(), "{name}: the backend still holds objects");
        assert_eq!(self.world.leftovers(), Vec::<String>::new(), "{name}: objects left in the backend");
        // Tenants' queues: exactly one for each tenant not deleted, none for the others.
        let live_tenants: Vec<String> =
            sqlx::query_scalar("SELECT slug FROM tenants WHERE status <> 'deleted' ORDER BY slug")
                .fetch_all(&self.pool)
                .await
                .expect("tenants");
        let of_kind = |kind: &str| {
            let mut slugs: Vec<String> =
                tenants.iter().filter(|o| o.kind == kind).filter_map(|q| q.tenant.clone()).collect();
            slugs.sort();
            slugs
        };
        let expected = if matches!(self.world, World::Kubernetes(_)) { live_tenants.clone() } else { Vec::new() };
        assert_eq!(
            of_kind("ClusterQueue"),
            expected,
            "{name}: the backend lists a queue for each live tenant and no other"
        );
        assert_eq!(self.world.tenant_queues(), expected, "{name}: a queue for each live tenant and no other");
        // Tenants' namespaces: one for each live soft tenant (and none of a deleted one),
        // holding no environment's object any more and a quota of nothing.
        if let World::Kubernetes(cluster) = &self.world {
            let soft: Vec<String> = sqlx::query_scalar(
                "SELECT slug FROM tenants WHERE status <> 'deleted' AND isolation = 'soft' ORDER BY slug",
            )
            .fetch_all(&self.pool)
            .await
            .expect("tenants");
            let namespaces = of_kind("Namespace");
            assert!(soft.iter().all(|s| namespaces.contains(s)), "{name}: {namespaces:?} lacks one of {soft:?}");
            assert!(namespaces.iter().all(|s| live_tenants.contains(s)), "{name}: {namespaces:?} of a deleted tenant");
            for (namespace, hard) in cluster.tenant_quotas() {
                let held: Vec<(&String, &Value)> = hard
                    .as_object()
                    .expect("hard")
                    .iter()
                    .filter(|(k, v)| k.starts_with("requests.") && !["0", "0Gi"].contains(&v.as_str().unwrap_or("")))
                    .collect();
                assert_eq!(
                    held,
                    Vec::<(&String, &Value)>::new(),
                    "{name}: {namespace}'s quota holds what nobody holds"
                );
            }
        }
        self.assert_sweeps_took_only_orphans().await;
    }

    /// Every object the sweep removed belonged to environments that had ended before.
    async fn assert_sweeps_took_only_orphans(&self) {
        let removals: Vec<(i64, String, String)> = sqlx::query_as(
            "SELECT at, target, detail FROM audit_events WHERE action = 'orphan.remove' AND outcome = 'success'",
        )
        .fetch_all(&self.pool)
        .await
        .expect("audit");
        for (at, target, detail) in removals {
            // A tenant's queue: the tenant was deleted before.
            if let Some(slug) = detail.strip_prefix("made for tenant ").and_then(|d| d.split_once(", which is deleted"))
            {
                let deleted_at: Option<i64> = sqlx::query_scalar(
                    "SELECT a.at FROM audit_events a JOIN tenants t ON a.target = 'tenant:' || t.id
                     WHERE a.action = 'tenant.delete' AND t.slug = ? AND t.status = 'deleted'",
                )
                .bind(slug.0)
                .fetch_optional(&self.pool)
                .await
                .expect("tenant");
                assert!(deleted_at.is_some_and(|d| d <= at), "{target} was swept while tenant {} was live", slug.0);
                continue;
            }
            let ids = detail.strip_prefix("made for ").and_then(|d| d.split_once(", none of them live")).map(|d| d.0);
            let ids = ids.unwrap_or_else(|| panic!("unexpected detail {detail}"));
            for id in ids.split(", ") {
                let finished: Option<Option<i64>> =
                    sqlx::query_scalar("SELECT finished_at FROM environments WHERE id = ?")
                        .bind(id)
                        .fetch_optional(&self.pool)
                        .await
                        .expect("environment");
                if let Some(finished) = finished {
                    assert!(
                        finished.is_some_and(|f| f <= at),
                        "{target} was swept while {id} was live (finished {finished:?}, swept {at})"
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The orphan sweep

/// A step's answer is lost and its effect lands after the environment has ended: the
/// periodic sweep removes it, logs it and writes it to the audit log in the tenant.
#[sqlx::test(migrations = "../migrations")]
async fn what_lands_after_teardown_is_swept_and_audited(pool: SqlitePool) {
    let site = Site::new(pool, World::simulated(vec![fault("start_workload=late")])).await;
    let (tenant, members) = site.tenant("acme", Isolation::Soft, 1).await;
    let env = site.launch(&members[0], "training", "h100-1", "lost").await.expect("launch");
    assert_eq!(site.wait_for(&env.id, &[EnvState::Failed], Duration::from_secs(10)).await, Some(EnvState::Failed));
    let World::Simulated(simulated) = &site.world else { unreachable!() };
    // The workload lands a moment later, with its environment over.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut seen = false;
    loop {
        let world = simulated.world();
        seen |= world.workloads.contains(&env.id);
        if seen && world.owned().is_empty() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "seen: {seen}, world: {world:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The audit row follows the removal a moment later.
    let removals = "SELECT count(*) FROM audit_events WHERE action = 'orphan.remove' AND outcome = 'success'";
    assert!(site.eventually(removals, 1, Duration::from_secs(5)).await, "the removal is audited");
    let audited: Vec<(String, Option<i64>, String)> = sqlx::query_as(
        "SELECT target, tenant_id, detail FROM audit_events WHERE action = 'orphan.remove' AND outcome = 'success'",
    )
    .fetch_all(&site.pool)
    .await
    .expect("audit");
    assert_eq!(audited.len(), 1, "{audited:?}");
    assert_eq!(audited[0].0, format!("workload {}", env.id));
    assert_eq!(audited[0].1, Some(tenant), "the tenant's admins see it too");
    assert!(audited[0].2.starts_with(&format!("made for {}, none of them live", env.id)), "{}", audited[0].2);
    let rows = site
        .platform()
        .audit_log(
            &site.admin,
            &berth_platform::audit::AuditFilter { action: "orphan.".into(), ..Default::default() },
            10,
        )
        .await
        .expect("audit log");
    assert_eq!(rows.len(), 1, "platform admins see the removal on the audit page");
}

/// A backend whose listing races with a launch: while the sweep lists, a new environment
/// is booked and gets its workload. Listing first and reading the live environments
/// after means the newcomer is live by then, so the sweep leaves it alone.
struct RacingBackend {
    inner: Arc<Simulated>,
    platform: Platform,
    owner: Caller,
    newcomer: Mutex<Option<String>>,
}

impl Backend for RacingBackend {
    fn name(&self) -> &'static str {
        "racing"
    }

    fn run<'a>(&'a self, workload: &'a Workload, step: Step) -> StepFuture<'a> {
        self.inner.run(workload, step)
    }

    fn owned_objects(&self) -> OwnedFuture<'_> {
        Box::pin(async move {
            let request = LaunchRequest {
                offering: "notebook".into(),
                size: "l40s-1".into(),
                name: "newcomer".into(),
                hours: "1".into(),
                ..LaunchRequest::default()
            };
            let env = self.platform.launch(&self.owner, &request).await.expect("launch during the listing");
            self.inner.run(&workload_of(&env), Step::StartWorkload).await.expect("its workload");
            *self.newcomer.lock().unwrap() = Some(env.id);
            self.inner.owned_objects().await
        })
    }

    fn remove_owned<'a>(&'a self, object: &'a OwnedObject) -> RemoveFuture<'a> {
        self.inner.remove_owned(object)
    }
}

fn workload_of(env: &Environment) -> Workload {
    Workload {
        environment_id: env.id.clone(),
        name: env.name.clone(),
        offering: env.offering,
        shape: env.size.shape,
        image: env.image.clone(),
        command: env.command.clone(),
        units: Vec::new(),
        vcpus: env.size.vcpus,
        memory_gb: env.size.memory_gb,
        ends_at: env.ends_at,
        tenant: TenantScope { slug: None, isolation: Isolation::Soft, members: Vec::new() },
        mig_neighbours: Vec::new(),
        tenant_neighbours: Vec::new(),
        tenant_holdings: Vec::new(),
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn the_sweep_never_takes_what_an_environment_created_during_it_holds(pool: SqlitePool) {
    let platform = Platform::new(production_pool(&pool).await);
    platform.sync_fleet(&fleet()).await.expect("fleet");
    let tenant = platform.ensure_tenant("acme", "Acme", Isolation::Soft).await.expect("tenant");
    let owner = platform
        .create_user("dana@acme.test", "Dana", "a long passphrase", Role::Member, Some(tenant))
        .await
        .expect("user")
        .caller(test_meta());
    let inner = Arc::new(Simulated::new(SimulatedConfig { speed: 0.0, faults: vec![] }));
    // A workload whose environment the database never heard of: a true orphan.
    let mut stray = workload_of(&platform.launch(&owner, &notebook("gone")).await.expect("launch"));
    stray.environment_id = "00000000-0000-4000-8000-000000000000".into();
    inner.run(&stray, Step::StartWorkload).await.expect("stray workload");

    let racing =
        Arc::new(RacingBackend { inner: inner.clone(), platform: platform.clone(), owner, newcomer: Mutex::new(None) });
    let reconciler = Reconciler::new(platform.clone(), racing.clone(), fast_reconciler());
    let report = reconciler.sweep().await.expect("sweep");
    let newcomer = racing.newcomer.lock().unwrap().clone().expect("launched during the listing");
    assert_eq!(report.owned, 2);
    let removed: Vec<&str> = report.removed.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(removed, [stray.environment_id.as_str()], "only the stray one");
    assert!(inner.world().workloads.contains(&newcomer), "the newcomer keeps its workload");
    let audited: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE action = 'orphan.remove'")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(audited, 1);
}

fn notebook(name: &str) -> LaunchRequest {
    LaunchRequest {
        offering: "notebook".into(),
        size: "l40s-1".into(),
        name: name.into(),
        hours: "1".into(),
        ..LaunchRequest::default()
    }
}

// ---------------------------------------------------------------------------------------
// Deleting a tenant

/// A fabric lease's id, release, end of quarantine and retirement.
type Lease = (i64, Option<i64>, Option<i64>, Option<i64>);

/// A hard tenant with one environment of each offering and a neighbour tenant's
/// environment; the platform admin deletes the tenant.
async fn a_deleted_tenant_leaves_nothing_behind(site: Site) {
    let name = site.world.name();
    let (vault, members) = site.tenant("vault", Isolation::Hard, 1).await;
    let (_, neighbours) = site.tenant("acme", Isolation::Soft, 1).await;
    let mut ids = Vec::new();
    for (offering, size) in
        [("notebook", "h100-1g.10gb"), ("training", "h100-4"), ("inference", "l40s-1"), ("cluster", "h100-node-1")]
    {
        let env = site.launch(&members[0], offering, size, &format!("my-{offering}")).await.expect("launch");
        ids.push(env.id);
    }
    let neighbour = site.launch(&neighbours[0], "inference", "l40s-1", "next-door").await.expect("neighbour").id;
    for id in ids.iter().chain([&neighbour]) {
        let state = site.wait_for(id, &[EnvState::Ready], Duration::from_secs(10)).await;
        assert_eq!(state, Some(EnvState::Ready), "{name}: {id}");
    }
    let held_fabric: Vec<(i64, i64)> =
        sqlx::query_as("SELECT id, held_at FROM fabric_leases WHERE tenant_id = ? AND released_at IS NULL")
            .bind(vault)
            .fetch_all(&site.pool)
            .await
            .expect("leases");
    assert_eq!(held_fabric.len(), 4, "{name}: a hard tenant holds its identifiers");

    site.platform().change_tenant(&site.admin, vault, TenantChange::Delete).await.expect("delete");
    for id in &ids {
        let state = site.wait_for(id, &[EnvState::Released], Duration::from_secs(10)).await;
        assert_eq!(state, Some(EnvState::Released), "{name}: {id} torn down");
    }

    // Zero unreleased reservations of the tenant; the neighbour keeps its own.
    let held = |tenant_only: bool| {
        let sql = format!(
            "SELECT count(*) FROM reservations r JOIN environments e ON e.id = r.environment_id
             WHERE r.released_at IS NULL AND {}",
            if tenant_only { "e.tenant_id = ?" } else { "e.tenant_id <> ?" }
        );
        let pool = site.pool.clone();
        async move { sqlx::query_scalar::<_, i64>(&sql).bind(vault).fetch_one(&pool).await.expect("count") }
    };
    assert_eq!(held(true).await, 0, "{name}: the deleted tenant holds capacity");
    assert_eq!(held(false).await, 1, "{name}: the neighbour keeps its GPU");

    // Zero backend objects of the tenant: all that is left is the neighbour's, and on
    // Kubernetes its tenant's queue (the deleted tenant's goes in a reconciler pass).
    if name == "kubernetes" {
        let behind = format!("SELECT count(*) FROM tenants WHERE id = {vault} AND queue_synced < queue_version");
        assert!(site.eventually(&behind, 0, Duration::from_secs(5)).await, "{name}: the tenant's queue never went");
    }
    let owned = site.backend.owned_objects().await.expect("owned");
    let (tenants, owned): (Vec<OwnedObject>, Vec<OwnedObject>) = owned.into_iter().partition(|o| o.tenant.is_some());
    assert!(!owned.is_empty(), "{name}: the neighbour's objects stay");
    assert!(owned.iter().all(|o| o.environments == [neighbour.clone()]), "{name}: {owned:?}");
    let tenants: Vec<(&str, Option<String>)> = tenants.into_iter().map(|q| (q.kind, q.tenant)).collect();
    // acme's queue, and its namespace where its neighbour's endpoint runs; none of vault's.
    let acme_only = if name == "kubernetes" {
        vec![("Namespace", Some("acme".to_owned())), ("ClusterQueue", Some("acme".to_owned()))]
    } else {
        vec![]
    };
    assert_eq!(tenants, acme_only, "{name}: the deleted tenant's queue went with it");
    if let World::Kubernetes(cluster) = &site.world {
        let left = cluster.berth_leftovers();
        assert!(left.iter().all(|p| p.starts_with("/api")), "{name}: nodes keep nothing of the tenant: {left:?}");
        let vault_objects: Vec<&String> = left.iter().filter(|p| p.contains("berth-vault-")).collect();
        assert!(vault_objects.is_empty(), "{name}: {vault_objects:?}");
    }
    if let World::Simulated(simulated) = &site.world {
        let world = simulated.world();
        assert!(ids.iter().all(|id| world.objects_of(id) == 0), "{name}: {world:?}");
    }

    // The fabric identifiers went into quarantine, once.
    let released: Vec<Lease> = sqlx::query_as(
        "SELECT id, released_at, quarantine_until, retired_at FROM fabric_leases WHERE tenant_id = ? ORDER BY id",
    )
    .bind(vault)
    .fetch_all(&site.pool)
    .await
    .expect("leases");
    assert_eq!(released.len(), 4, "{name}");
    let now = berth_platform::now_ms();
    assert!(
        released
            .iter()
            .all(|(_, at, until, retired)| at.is_some() && until.is_some_and(|u| u > now) && retired.is_none()),
        "{name}: in quarantine: {released:?}"
    );
    let audit = |sql: &'static str| {
        let pool = site.pool.clone();
        async move { sqlx::query_scalar::<_, i64>(sql).bind(vault).fetch_one(&pool).await.expect(sql) }
    };
    assert_eq!(audit("SELECT count(*) FROM audit_events WHERE action = 'fabric.release' AND tenant_id = ?").await, 1);
    assert_eq!(
        audit(
            "SELECT count(*) FROM audit_events WHERE action = 'environment.stop' AND tenant_id = ?
             AND detail = 'its tenant was deleted'"
        )
        .await,
        4,
        "{name}: each environment's stop is audited"
    );
    let detail: String =
        sqlx::query_scalar("SELECT detail FROM audit_events WHERE action = 'tenant.delete' AND tenant_id = ?")
            .bind(vault)
            .fetch_one(&site.pool)
            .await
            .expect("tenant.delete");
    assert_eq!(detail, "4 environments stopped");

    // Deleting again finds nothing and releases nothing twice; the members cannot book.
    let again = site.platform().change_tenant(&site.admin, vault, TenantChange::Delete).await;
    assert!(matches!(again, Err(Error::NotFound)), "{again:?}");
    let after: Vec<Lease> = sqlx::query_as(
        "SELECT id, released_at, quarantine_until, retired_at FROM fabric_leases WHERE tenant_id = ? ORDER BY id",
    )
    .bind(vault)
    .fetch_all(&site.pool)
    .await
    .expect("leases");
    assert_eq!(after, released, "{name}: released exactly once");
    let refused = site.launch(&members[0], "notebook", "l40s-1", "after").await.expect_err("deleted tenant");
    assert!(matches!(refused, Error::Refused(Refusal::TenantNotActive("deleted"))), "{refused:?}");

    // Nothing leaked for the sweep to find.
    let report = site.reconciler().sweep().await.expect("sweep");
    assert_eq!(report.removed, vec![], "{name}");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_deleted_tenant_leaves_nothing_behind_on_the_simulated_backend(pool: SqlitePool) {
    a_deleted_tenant_leaves_nothing_behind(Site::new(pool, World::simulated(vec![])).await).await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_deleted_tenant_leaves_nothing_behind_on_kubernetes(pool: SqlitePool) {
    a_deleted_tenant_leaves_nothing_behind(Site::new(pool, World::kubernetes()).await).await;
}

// ---------------------------------------------------------------------------------------
// A tenant's Kueue queue on Kubernetes

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
    assert!(tenant_quota_reaches(cluster, "berth-acme", "requests.storage", "200Gi").await);
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
    assert!(tenant_quota_reaches(cluster, "berth-acme", "requests.storage", "100Gi").await);

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

// ---------------------------------------------------------------------------------------
// 1,000 random create/stop cycles with faults and crashes

const CYCLES: usize = 1000;

/// Sizes of each offering the fleet can hold, the small ones more often.
const CHOICES: &[(&str, &str, u32)] = &[
    ("notebook", "h100-1g.10gb", 6),
    ("notebook", "h100-3g.40gb", 3),
    ("notebook", "l40s-1", 3),
    ("notebook", "l40s-dev", 3),
    ("notebook", "h100-1", 2),
    ("training", "h100-1", 3),
    ("training", "h100-4", 2),
    ("training", "h100-8", 1),
    ("training", "a100-8", 1),
    ("inference", "h100-1g.10gb", 4),
    ("inference", "h100-3g.40gb", 2),
    ("inference", "a100-3g.40gb", 2),
    ("inference", "l40s-1", 3),
    ("cluster", "h100-node-1", 1),
    ("cluster", "a100-node-1", 1),
];

#[derive(Default)]
struct Tally {
    launched: AtomicUsize,
    refused: AtomicUsize,
    crashed_requests: AtomicUsize,
    crashes: AtomicUsize,
    tenants_deleted: AtomicUsize,
}

/// The tenants members book in; deleted ones leave the list (their members try anyway
/// now and then, and must be refused).
struct Tenants {
    active: Vec<(i64, Vec<Caller>)>,
    deleted: Vec<(i64, Vec<Caller>)>,
    created: usize,
}

async fn random_cycles(site: Site, workers: usize) {
    let name = site.world.name();
    let started = std::time::Instant::now();
    let site = Arc::new(site);
    let mut tenants = Tenants { active: Vec::new(), deleted: Vec::new(), created: 0 };
    for (slug, isolation) in [("t0", Isolation::Soft), ("t1", Isolation::Hard), ("t2", Isolation::Soft)] {
        tenants.active.push(site.tenant(slug, isolation, 2).await);
        tenants.created += 1;
    }
    let tenants = Arc::new(Mutex::new(tenants));
    let tally = Arc::new(Tally::default());
    let done = Arc::new(AtomicBool::new(false));
    site.world.faults_on();

    let mut cycles = Vec::new();
    for worker in 0..workers {
        let (site, tenants, tally) = (site.clone(), tenants.clone(), tally.clone());
        cycles.push(tokio::spawn(async move {
            let mut n = 0;
            while tally.launched.load(Ordering::SeqCst) < CYCLES {
                n += 1;
                let (caller, offering, size, moment, pause) = {
                    let tenants = tenants.lock().unwrap();
                    let mut rng = rand::rng();
                    let pool = if rng.random_bool(0.03) && !tenants.deleted.is_empty() {
                        &tenants.deleted
                    } else {
                        &tenants.active
                    };
                    let caller = pool.choose(&mut rng).unwrap().1.choose(&mut rng).unwrap().clone();
                    let &(offering, size, _) = CHOICES.choose_weighted(&mut rng, |c| c.2).unwrap();
                    let pause = Duration::from_millis(rng.random_range(1..30));
                    (caller, offering, size, rng.random_range(0..4u8), pause)
                };
                let env = match site.launch(&caller, offering, size, &format!("w{worker}-{n}")).await {
                    Ok(env) => env,
                    Err(Error::Refused(_)) => {
                        tally.refused.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                    Err(e) => {
                        // The process crashed under the request; the client tries again. A
                        // booking the database's trigger refused is no crash but a bug.
                        assert_eq!(trigger_abort(&e), None, "{name}: a launch reached the database: {e}");
                        tally.crashed_requests.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                tally.launched.fetch_add(1, Ordering::SeqCst);
                // Stopped at a random moment: at once, a little later, once ready, or
                // not at all (the window's end would; the convergence below does).
                match moment {
                    0 => {}
                    1 => tokio::time::sleep(pause).await,
                    2 => {
                        let _ = site.wait_for(&env.id, &[EnvState::Ready], Duration::from_millis(500)).await;
                    }
                    _ => {
                        let _ = site.wait_for(&env.id, &[EnvState::Ready], Duration::from_millis(100)).await;
                        tokio::time::sleep(pause / 2).await;
                    }
                }
                if let Err(e) = site.platform().stop(&caller, &env.id).await {
                    assert_eq!(trigger_abort(&e), None, "{name}: a stop reached the database: {e}");
                }
                let _ = site.wait_for(&env.id, &[EnvState::Released, EnvState::Failed], Duration::from_secs(3)).await;
            }
        }));
    }

    // The reconciler's process crashes now and then, wherever it is.
    let crasher = {
        let (site, tally, done) = (site.clone(), tally.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                let pause = Duration::from_millis(rand::rng().random_range(150..600));
                tokio::time::sleep(pause).await;
                site.crash().await;
                tally.crashes.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    // Tenants come and go; a hard tenant's identifiers must follow.
    let churn = {
        let (site, tenants, tally, done) = (site.clone(), tenants.clone(), tally.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                let pause = Duration::from_millis(rand::rng().random_range(300..900));
                tokio::time::sleep(pause).await;
                let victim = {
                    let tenants = tenants.lock().unwrap();
                    tenants.active.choose(&mut rand::rng()).map(|t| t.0)
                };
                let Some(victim) = victim else { continue };
                if let Err(e) = site.platform().change_tenant(&site.admin, victim, TenantChange::Delete).await {
                    assert_eq!(trigger_abort(&e), None, "{name}: a tenant deletion reached the database: {e}");
                    continue; // the process crashed under it; try another later
                }
                tally.tenants_deleted.fetch_add(1, Ordering::SeqCst);
                let number = {
                    let mut tenants = tenants.lock().unwrap();
                    let index = tenants.active.iter().position(|t| t.0 == victim).unwrap();
                    let gone = tenants.active.remove(index);
                    tenants.deleted.push(gone);
                    tenants.created += 1;
                    tenants.created
                };
                let isolation = if number % 2 == 0 { Isolation::Hard } else { Isolation::Soft };
                // A crash may cut a request whose change committed: the next try takes a
                // new name, and the half-answered one stays as it is.
                let mut attempt = 0;
                let fresh = loop {
                    attempt += 1;
                    let slug = format!("t{number}-{attempt}");
                    let platform = site.platform();
                    match platform.create_tenant(&site.admin, &slug, "T", isolation.as_str(), "").await {
                        Ok(t) => break t.id,
                        Err(Error::Refused(Refusal::SlugInUse(_))) => {}
                        Err(Error::Refused(r)) => panic!("tenant {slug}: {r}"),
                        Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                };
                let mut members = Vec::new();
                while members.len() < 2 {
                    attempt += 1;
                    let email = format!("m{attempt}@t{number}.test");
                    let platform = site.platform();
                    match platform.create_user(&email, &email, "a long passphrase", Role::Member, Some(fresh)).await {
                        Ok(user) => members.push(user.caller(test_meta())),
                        Err(Error::Refused(Refusal::EmailInUse(_))) => {}
                        Err(Error::Refused(r)) => panic!("{email}: {r}"),
                        Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
                tenants.lock().unwrap().active.push((fresh, members));
            }
        })
    };
    // Checked all along, not only at the end: unreleased reservations never overlap, hard
    // tenants never share a node, and no environment of a deleted tenant is meant to run.
    let monitor = {
        let (pool, done) = (site.pool.clone(), done.clone());
        tokio::spawn(async move {
            let mut checks = 0;
            while !done.load(Ordering::SeqCst) {
                assert_eq!(overlapping_reservations(&pool).await, 0, "overlapping reservations during the run");
                assert_eq!(tenants_sharing_nodes(&pool).await, 0, "a hard tenant shared a node during the run");
                let running: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM environments e JOIN tenants t ON t.id = e.tenant_id
                     WHERE t.status = 'deleted' AND e.desired = 'running' AND e.state NOT IN ('released', 'failed')",
                )
                .fetch_one(&pool)
                .await
                .expect("checker");
                assert_eq!(running, 0, "an environment of a deleted tenant is meant to run");
                checks += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            checks
        })
    };

    for cycle in cycles {
        cycle.await.expect("worker");
    }
    done.store(true, Ordering::SeqCst);
    crasher.await.expect("crasher");
    churn.await.expect("churn");
    let checks = monitor.await.expect("monitor");

    // Faults off: everything converges, late effects land, the sweep cleans up.
    site.world.faults_off();
    site.converge(Duration::from_secs(30)).await;
    site.world.quiesce().await;
    let report = site.reconciler().sweep().await.expect("final sweep");
    site.assert_clean().await;

    let stat = |sql: &str| {
        let pool = site.pool.clone();
        let sql = sql.to_owned();
        async move { sqlx::query_scalar::<_, i64>(&sql).fetch_one(&pool).await.expect("stat") }
    };
    let failed = stat("SELECT count(*) FROM environments WHERE state = 'failed'").await;
    let retried = stat("SELECT count(*) FROM environment_steps WHERE attempts > 1").await;
    let swept = stat("SELECT count(*) FROM audit_events WHERE action = 'orphan.remove' AND outcome = 'success'").await;
    let environments = stat("SELECT count(*) FROM environments").await;
    let kinds: Vec<(String, i64)> = sqlx::query_as(
        "SELECT substr(target, 1, instr(target, ' ') - 1), count(*) FROM audit_events
         WHERE action = 'orphan.remove' AND outcome = 'success' GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(&site.pool)
    .await
    .expect("kinds");
    eprintln!(
        "{name}: {} cycles ({environments} environments, {failed} failed, {retried} steps retried), {} refused, \
         {} requests cut by {} crashes, {} tenants deleted, {swept} orphans swept {kinds:?} ({} in the final sweep), \
         {checks} checks during the run, {:.1} s",
        tally.launched.load(Ordering::SeqCst),
        tally.refused.load(Ordering::SeqCst),
        tally.crashed_requests.load(Ordering::SeqCst),
        tally.crashes.load(Ordering::SeqCst),
        tally.tenants_deleted.load(Ordering::SeqCst),
        report.removed.len(),
        started.elapsed().as_secs_f64(),
    );
    // The faults really happened.
    assert!(tally.launched.load(Ordering::SeqCst) >= CYCLES);
    assert!(failed > 0 && retried > 0, "{name}: no step failed or was retried");
    assert!(tally.crashes.load(Ordering::SeqCst) > 0 && tally.tenants_deleted.load(Ordering::SeqCst) > 0);
    assert!(swept > 0, "{name}: no orphan was ever made and swept");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_thousand_random_cycles_leak_nothing_on_the_simulated_backend(pool: SqlitePool) {
    random_cycles(Site::new(pool, World::simulated(vec![])).await, 12).await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_thousand_random_cycles_leak_nothing_on_kubernetes(pool: SqlitePool) {
    random_cycles(Site::new(pool, World::kubernetes()).await, 12).await;
}
