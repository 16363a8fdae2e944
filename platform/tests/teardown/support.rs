//! The fleet, faults, and a Berth whose process can crash (`World`, `Site`), which every part uses.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_domain::fleet::FleetSpec;
use berth_domain::launch::LaunchRequest;
use berth_domain::lifecycle::EnvState;
use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use berth_platform::capacity::environments::Environment;
use berth_platform::provisioning::backend::kubernetes::{Kubernetes, KubernetesConfig};
use berth_platform::provisioning::backend::simulated::{FaultRule, LATE_BY, Simulated, SimulatedConfig};
use berth_platform::provisioning::backend::{Backend, OwnedObject};
use berth_platform::provisioning::reconciler::{Reconciler, ReconcilerConfig};
use berth_platform::{Caller, Error, Platform};
use serde_json::Value;
use sqlx::SqlitePool;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::common::{fast_reconciler, overlapping_leases, overlapping_reservations, production_pool, test_meta};
use crate::kubernetes_api::{FakeCluster, Faults};

/// Four H100 nodes, one A100 node, two L40S nodes and a time-sliced development node:
/// room for every size of every offering.
pub const FLEET: &str = r#"
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

pub fn fleet() -> FleetSpec {
    FleetSpec::parse(FLEET).expect("test fleet")
}

pub fn fault(rule: &str) -> FaultRule {
    rule.parse().expect("fault rule")
}

// ---------------------------------------------------------------------------------------
// A Berth whose process can crash: the platform and its reconciler are replaced together,
// the database and the backend (the outside world) stay.

/// The backend under test and how to break it.
#[derive(Clone)]
pub enum World {
    Simulated(Arc<Simulated>),
    Kubernetes(Arc<FakeCluster>),
}

impl World {
    pub fn simulated(faults: Vec<FaultRule>) -> (World, Arc<dyn Backend>) {
        let simulated = Arc::new(Simulated::new(SimulatedConfig { speed: 0.0, faults, volumes_dir: None }));
        (World::Simulated(simulated.clone()), simulated)
    }

    pub fn kubernetes() -> (World, Arc<dyn Backend>) {
        let nodes: Vec<String> = fleet().nodes.iter().map(|n| n.name.clone()).collect();
        let (cluster, client) = FakeCluster::stateful(&nodes);
        let config = KubernetesConfig { poll_interval: Duration::from_millis(1), ..KubernetesConfig::default() };
        let backend = Kubernetes::with_client(client, config, "https://k8s.test:6443");
        (World::Kubernetes(Arc::new(cluster)), Arc::new(backend))
    }

    pub fn name(&self) -> &'static str {
        match self {
            World::Simulated(_) => "simulated",
            World::Kubernetes(_) => "kubernetes",
        }
    }

    pub fn faults_on(&self) {
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

    pub fn faults_off(&self) {
        match self {
            World::Simulated(s) => s.set_faults(vec![]),
            World::Kubernetes(c) => c.set_faults(Faults::default()),
        }
    }

    /// Waits until everything a lost answer set in motion has landed.
    pub async fn quiesce(&self) {
        match self {
            World::Simulated(_) => tokio::time::sleep(LATE_BY + Duration::from_millis(100)).await,
            World::Kubernetes(c) => c.quiesce().await,
        }
    }

    /// What Berth left in the backend, described for a failure message.
    pub fn leftovers(&self) -> Vec<String> {
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
    pub fn tenant_queues(&self) -> Vec<String> {
        match self {
            World::Simulated(_) => Vec::new(),
            World::Kubernetes(c) => c.tenant_queues(),
        }
    }
}

pub struct Site {
    /// The test's own connection, for checker queries.
    pub pool: SqlitePool,
    pub platform: Mutex<Platform>,
    pub world: World,
    pub backend: Arc<dyn Backend>,
    pub config: ReconcilerConfig,
    pub reconciler: Mutex<Option<(oneshot::Sender<()>, JoinHandle<()>)>>,
    pub admin: Caller,
}

impl Site {
    pub async fn new(pool: SqlitePool, world: (World, Arc<dyn Backend>)) -> Site {
        let config = ReconcilerConfig { step_timeout: Duration::from_millis(300), ..fast_reconciler() };
        Site::with_config(pool, world, config).await
    }

    pub async fn with_config(
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

    pub fn platform(&self) -> Platform {
        self.platform.lock().unwrap().clone()
    }

    /// A reconciler of this process that is not running: for sweeps on demand.
    pub fn reconciler(&self) -> Reconciler {
        Reconciler::new(self.platform(), self.backend.clone(), self.config.clone())
    }

    pub fn start_reconciler(&self) {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(self.reconciler().run(async {
            let _ = stopped.await;
        }));
        *self.reconciler.lock().unwrap() = Some((stop, task));
    }

    /// The process dies wherever it is: the reconciler and its steps stop mid-await, open
    /// transactions roll back, requests in flight fail. A new process starts on fresh
    /// connections once the old ones are gone.
    pub async fn crash(&self) {
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
    pub async fn tenant(&self, slug: &str, isolation: Isolation, members: usize) -> (i64, Vec<Caller>) {
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

    pub async fn launch(&self, caller: &Caller, offering: &str, size: &str, name: &str) -> Result<Environment, Error> {
        self.launch_with(caller, offering, size, name, Vec::new()).await
    }

    /// [`Site::launch`] attaching `volumes` (ids) too.
    pub async fn launch_with(
        &self,
        caller: &Caller,
        offering: &str,
        size: &str,
        name: &str,
        volumes: Vec<String>,
    ) -> Result<Environment, Error> {
        let needs_image = offering == "training" || offering == "inference";
        let request = LaunchRequest {
            offering: offering.into(),
            size: size.into(),
            name: name.into(),
            hours: "1".into(),
            image: if needs_image { "ghcr.io/acme/app:1".into() } else { String::new() },
            command: if offering == "training" { "python main.py; sleep infinity".into() } else { String::new() },
            volumes,
            ..LaunchRequest::default()
        };
        self.platform().launch(caller, &request).await
    }

    pub async fn state_of(&self, id: &str) -> EnvState {
        let state: String = sqlx::query_scalar("SELECT state FROM environments WHERE id = ?")
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .expect("environment");
        EnvState::parse(&state).expect("state")
    }

    pub async fn wait_for(&self, id: &str, wanted: &[EnvState], within: Duration) -> Option<EnvState> {
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

    pub async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(&self.pool).await.unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Whether `sql` counts `wanted` within `within`.
    pub async fn eventually(&self, sql: &str, wanted: i64, within: Duration) -> bool {
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
    pub async fn converge(&self, within: Duration) {
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
    pub async fn assert_clean(&self) {
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
                // The tenant's live volumes stay in its namespace between bookings: their
                // claims, and so the quota's storage, are what is left.
                let kept: i64 = sqlx::query_scalar(
                    "SELECT coalesce(sum(v.size_gib), 0) FROM volumes v JOIN tenants t ON t.id = v.tenant_id
                     WHERE 'berth-' || t.slug = ? AND v.deleted_at IS NULL",
                )
                .bind(&namespace)
                .fetch_one(&self.pool)
                .await
                .expect("the tenant's volumes");
                let volumes = format!("{kept}Gi");
                let held: Vec<(&String, &Value)> = hard
                    .as_object()
                    .expect("hard")
                    .iter()
                    .filter(|(k, v)| k.starts_with("requests.") && !["0", "0Gi"].contains(&v.as_str().unwrap_or("")))
                    .filter(|(k, v)| !(k.as_str() == "requests.storage" && v.as_str() == Some(volumes.as_str())))
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
    pub async fn assert_sweeps_took_only_orphans(&self) {
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

pub fn notebook(name: &str) -> LaunchRequest {
    LaunchRequest {
        offering: "notebook".into(),
        size: "l40s-1".into(),
        name: name.into(),
        hours: "1".into(),
        ..LaunchRequest::default()
    }
}
