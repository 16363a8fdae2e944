//! Deleting a tenant leaves nothing behind, on the simulated backend and on Kubernetes.

use std::time::Duration;

use berth_domain::Refusal;
use berth_domain::lifecycle::EnvState;
use berth_domain::tenancy::Isolation;
use berth_platform::Error;
use berth_platform::provisioning::backend::OwnedObject;
use berth_platform::tenancy::tenants::TenantChange;
use sqlx::SqlitePool;

use crate::support::{Site, World};

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
