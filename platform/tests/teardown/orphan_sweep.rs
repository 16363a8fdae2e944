//! The orphan sweep: what lands after teardown is swept and audited, what appears during a sweep is kept.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_domain::launch::LaunchRequest;
use berth_domain::lifecycle::{EnvState, Step};
use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use berth_platform::capacity::environments::Environment;
use berth_platform::provisioning::backend::simulated::{Simulated, SimulatedConfig};
use berth_platform::provisioning::backend::{
    Backend, OwnedFuture, OwnedObject, RemoveFuture, StepFuture, TenantScope, Workload,
};
use berth_platform::provisioning::reconciler::Reconciler;
use berth_platform::{Caller, Platform};
use sqlx::SqlitePool;

use crate::common::{fast_reconciler, production_pool, test_meta};
use crate::support::{Site, World, fault, fleet, notebook};

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
        serving: env.serving.clone(),
        units: Vec::new(),
        vcpus: env.size.vcpus,
        memory_gb: env.size.memory_gb,
        ends_at: env.ends_at,
        tenant: TenantScope { slug: None, isolation: Isolation::Soft, members: Vec::new() },
        mig_neighbours: Vec::new(),
        tenant_neighbours: Vec::new(),
        tenant_holdings: Vec::new(),
        volumes: Vec::new(),
        tenant_volumes: Vec::new(),
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
    let inner = Arc::new(Simulated::new(SimulatedConfig { speed: 0.0, faults: vec![], volumes_dir: None }));
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
