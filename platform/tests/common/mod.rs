//! A Berth platform on a fresh database with a small simulated fleet and a running
//! reconciler, for integration tests.
#![allow(dead_code)]
// A test harness: a failed setup step should stop the test with its message.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use berth_domain::fleet::FleetSpec;
use berth_domain::launch::LaunchRequest;
use berth_domain::lifecycle::EnvState;
use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use berth_platform::capacity::environments::Environment;
use berth_platform::provisioning::backend::simulated::{FaultRule, Simulated, SimulatedConfig};
use berth_platform::provisioning::reconciler::{Reconciler, ReconcilerConfig};
use berth_platform::{Caller, Platform, RequestMeta, store};
use sqlx::SqlitePool;
use sqlx::sqlite::SqliteConnectOptions;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

mod overlaps;
// Each test file uses some of them.
#[allow(unused_imports)]
pub use overlaps::{HeldSlices, double_bookings, overlapping_leases, overlapping_reservations, trigger_abort};

/// Two H100 nodes of 2 GPUs each and one L40S node of 2 GPUs.
pub const SMALL_FLEET: &str = r#"
[[site]]
name = "test-1"
[[site.pool]]
prefix = "h100"
model = "H100-80GB"
nodes = 2
gpus_per_node = 2
nvlink = true
[[site.pool]]
prefix = "l40s"
model = "L40S"
nodes = 1
gpus_per_node = 2
[[site.pool]]
prefix = "dev"
model = "L40S"
nodes = 1
gpus_per_node = 1
time_slices = 4
"#;

pub fn fast_reconciler() -> ReconcilerConfig {
    ReconcilerConfig {
        tick: Duration::from_millis(20),
        step_timeout: Duration::from_millis(400),
        retry_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
        // Sweeping often in every test shows it never takes what a live environment holds.
        sweep_interval: Duration::from_millis(100),
        job_poll: Duration::from_millis(50),
    }
}

pub struct TestBerth {
    pub platform: Platform,
    pub backend: Arc<Simulated>,
    pub caller: Caller,
    reconciler: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
}

impl TestBerth {
    pub async fn new(pool: SqlitePool) -> TestBerth {
        TestBerth::with_faults(pool, vec![]).await
    }

    /// `pool` names the test's database; Berth opens its own pool on it with the production
    /// settings (WAL, busy timeout, foreign keys), which `#[sqlx::test]` pools lack.
    pub async fn with_faults(pool: SqlitePool, faults: Vec<FaultRule>) -> TestBerth {
        // Logs go to the test's captured output, shown when it fails.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("berth_platform=debug,sqlx=warn"))
            .with_test_writer()
            .try_init();
        let platform = Platform::new(production_pool(&pool).await);
        platform.sync_fleet(&FleetSpec::parse(SMALL_FLEET).expect("test fleet")).await.expect("sync fleet");
        let tenant = platform.ensure_tenant("acme", "Acme", Isolation::Soft).await.expect("tenant");
        let user = platform
            .create_user("dana@example.com", "Dana", "a long passphrase", Role::Member, Some(tenant))
            .await
            .expect("user");
        let backend = Arc::new(Simulated::new(SimulatedConfig { speed: 0.0, faults, volumes_dir: None }));
        let platform = platform.with_backend(backend.clone());
        let caller = user.caller(test_meta());
        let mut berth = TestBerth { platform, backend, caller, reconciler: None };
        berth.start_reconciler();
        berth
    }

    /// A user with `role` (in Dana's tenant for tenant roles), acting from the tests.
    pub async fn user_with(&self, email: &str, role: Role) -> Caller {
        let tenant = (!role.is_platform()).then_some(self.caller.tenant_id()).flatten();
        let user = self.platform.create_user(email, email, "a long passphrase", role, tenant).await.expect("user");
        user.caller(test_meta())
    }

    /// A platform admin.
    pub async fn admin(&self) -> Caller {
        self.user_with("root@example.com", Role::PlatformAdmin).await
    }

    pub fn start_reconciler(&mut self) {
        let (stop, stopped) = oneshot::channel::<()>();
        let reconciler = Reconciler::new(self.platform.clone(), self.backend.clone(), fast_reconciler());
        let task = tokio::spawn(reconciler.run(async {
            let _ = stopped.await;
        }));
        self.reconciler = Some((stop, task));
    }

    /// Kills the reconciler as a crash would: the task is aborted wherever it is, and the
    /// process's database connections go with it (an open transaction is rolled back by
    /// SQLite, as after a real crash). Berth comes back on fresh connections.
    pub async fn kill_reconciler(&mut self) {
        if let Some((_stop, task)) = self.reconciler.take() {
            task.abort();
            let _ = task.await;
        }
        let fresh = Platform::new(production_pool(self.platform.db()).await).with_backend(self.backend.clone());
        let crashed = std::mem::replace(&mut self.platform, fresh);
        crashed.db().close().await;
    }

    pub async fn launch(&self, offering: &str, size: &str, name: &str) -> Result<Environment, berth_platform::Error> {
        let request = LaunchRequest {
            offering: offering.into(),
            size: size.into(),
            name: name.into(),
            hours: "2".into(),
            image: "ghcr.io/acme/app:1".into(),
            command: "python main.py; sleep infinity".into(),
            ..LaunchRequest::default()
        };
        let request = if offering == "notebook" || offering == "cluster" {
            LaunchRequest { image: String::new(), ..request }
        } else {
            request
        };
        self.platform.launch(&self.caller, &request).await
    }

    /// Waits until the environment reaches `state`, failing the test after 10 s.
    pub async fn wait_for(&self, id: &str, state: EnvState) -> Environment {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let env = self.platform.environment_of(&self.caller, id).await.expect("environment");
            if env.state == state {
                return env;
            }
            if tokio::time::Instant::now() >= deadline {
                let detail = self.platform.environment_detail(&self.caller, id).await.expect("detail");
                panic!("environment stuck in {} waiting for {state}; steps: {:#?}", env.state, detail.steps);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Reservations not yet released, counted straight from the table.
    pub async fn held_reservations(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM reservations WHERE released_at IS NULL")
            .fetch_one(self.platform.db())
            .await
            .expect("count")
    }
}

/// A pool on the same database file as `pool`, opened as `berth serve` opens it.
pub async fn production_pool(pool: &SqlitePool) -> SqlitePool {
    let options = SqliteConnectOptions::clone(&pool.connect_options());
    store::open(options).await.expect("open the test database")
}

/// Pairs of unreleased reservations on one node in overlapping windows whose tenants
/// differ (platform staff counting as one more) while either tenant is hard or hybrid,
/// written independently of the booking code and of the database's triggers.
pub async fn tenants_sharing_nodes(pool: &SqlitePool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM reservations a
           JOIN gpus ga ON ga.id = a.gpu_id
           JOIN environments ea ON ea.id = a.environment_id
           LEFT JOIN tenants ta ON ta.id = ea.tenant_id
           JOIN reservations b ON a.id < b.id
           JOIN gpus gb ON gb.id = b.gpu_id AND gb.node_id = ga.node_id
           JOIN environments eb ON eb.id = b.environment_id
           LEFT JOIN tenants tb ON tb.id = eb.tenant_id
         WHERE a.released_at IS NULL AND b.released_at IS NULL
           AND a.starts_at < b.ends_at AND b.starts_at < a.ends_at
           AND coalesce(ea.tenant_id, -1) <> coalesce(eb.tenant_id, -1)
           AND (ta.isolation IN ('hard', 'hybrid') OR tb.isolation IN ('hard', 'hybrid'))",
    )
    .fetch_one(pool)
    .await
    .expect("tenant checker query")
}

pub fn test_meta() -> RequestMeta {
    RequestMeta { request_id: "test".into(), source: Some("127.0.0.1".into()) }
}
