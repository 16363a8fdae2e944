//! Fabric isolation identifiers of hard tenants, as platform admins create, switch and
//! delete tenants: leased in the tenant change's own transaction, never shared, released
//! into quarantine exactly once, and reused only after it.
#![allow(clippy::expect_used, clippy::unwrap_used)] // helpers of tests stop the test with their message

mod common;

use std::time::Duration;

use berth_domain::Refusal;
use berth_domain::fabric::{FabricConfig, IdentifierKind, Pool};
use berth_domain::policy::Role;
use berth_platform::tenancy::tenants::TenantChange;
use berth_platform::{Caller, Error, Platform};
use common::{overlapping_leases, production_pool, test_meta};
use sqlx::SqlitePool;

struct Fabric {
    platform: Platform,
    admin: Caller,
}

impl Fabric {
    async fn new(pool: &SqlitePool, config: FabricConfig) -> Fabric {
        let platform = Platform::new(production_pool(pool).await).with_fabric(config);
        let admin = platform
            .create_user("root@example.com", "Root", "a long passphrase", Role::PlatformAdmin, None)
            .await
            .expect("admin")
            .caller(test_meta());
        Fabric { platform, admin }
    }

    async fn create(&self, slug: &str, isolation: &str) -> Result<i64, Error> {
        self.platform.create_tenant(&self.admin, slug, slug, isolation, "").await.map(|t| t.id)
    }

    /// The values a tenant holds now, by kind.
    async fn held(&self, tenant: i64) -> Vec<(String, i64)> {
        sqlx::query_as(
            "SELECT kind, value FROM fabric_leases WHERE tenant_id = ? AND released_at IS NULL ORDER BY kind",
        )
        .bind(tenant)
        .fetch_all(self.platform.db())
        .await
        .expect("held")
    }

    async fn held_value(&self, tenant: i64, kind: &str) -> Option<i64> {
        self.held(tenant).await.into_iter().find(|(k, _)| k == kind).map(|(_, v)| v)
    }

    async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(self.platform.db()).await.expect(sql)
    }
}

/// A small pool of one kind and the defaults for the rest.
fn config_with(kind: IdentifierKind, first: u32, last: u32, quarantine_ms: i64) -> FabricConfig {
    let pool = Pool::new(kind, first, last).expect("pool");
    let mut config = FabricConfig { quarantine_ms, ..FabricConfig::default() };
    match kind {
        IdentifierKind::Vlan => config.vlans = pool,
        IdentifierKind::Vni => config.vnis = pool,
        IdentifierKind::PKey => config.pkeys = pool,
        IdentifierKind::NvlinkPartition => config.nvlink_partitions = pool,
        IdentifierKind::Volume => config.volumes = pool,
    }
    config
}

#[sqlx::test(migrations = "../migrations")]
async fn a_hard_tenant_gets_one_of_each_identifier_and_a_soft_one_none(pool: SqlitePool) {
    let f = Fabric::new(&pool, FabricConfig::default()).await;
    let hard = f.create("acme", "hard").await.expect("hard tenant");
    let soft = f.create("globex", "soft").await.expect("soft tenant");
    assert_eq!(
        f.held(hard).await,
        vec![("nvlink".into(), 1), ("pkey".into(), 1), ("vlan".into(), 2), ("volume".into(), 1)]
    );
    assert!(f.held(soft).await.is_empty());
    let quota = f.count("SELECT quota_bytes FROM storage_volumes").await;
    assert_eq!(quota, FabricConfig::default().volume_quota_bytes);

    let overview = f.platform.fabric_overview(&f.admin).await.expect("overview");
    let acme = overview.tenants.iter().find(|t| t.slug == "acme").expect("acme listed");
    assert_eq!(acme.identifiers.len(), 4);
    assert!(overview.tenants.iter().all(|t| t.slug != "globex"), "a soft tenant has nothing to show");
    let vlans = overview.pools.iter().find(|p| p.kind == IdentifierKind::Vlan).expect("vlan pool");
    assert_eq!((vlans.held, vlans.quarantined, vlans.size), (1, 0, 4093));
    assert!(
        overview.partitions_conf.contains("acme=0x0001, ipoib, defmember=full : ;"),
        "{}",
        overview.partitions_conf
    );

    let detail: String = sqlx::query_scalar("SELECT detail FROM audit_events WHERE action = 'fabric.hold'")
        .fetch_one(&pool)
        .await
        .expect("audited");
    assert!(detail.contains("VLAN id 2") && detail.contains("InfiniBand P_Key 0x0001"), "{detail}");

    // VXLAN instead of VLAN when the operator says so.
    let vxlan = Platform::new(production_pool(&pool).await)
        .with_fabric(FabricConfig { segment: berth_domain::fabric::NetworkSegment::Vxlan, ..FabricConfig::default() });
    let other = vxlan.create_tenant(&f.admin, "initech", "Initech", "hybrid", "").await.expect("hybrid").id;
    assert_eq!(f.held_value(other, "vni").await, Some(1));
    assert_eq!(f.held_value(other, "vlan").await, None);
}

#[sqlx::test(migrations = "../migrations")]
async fn hard_tenants_created_at_once_never_share_an_identifier(pool: SqlitePool) {
    let f = Fabric::new(&pool, FabricConfig::default()).await;
    let creations = (0..12).map(|n| {
        let (platform, admin) = (f.platform.clone(), f.admin.clone());
        let isolation = if n % 3 == 0 { "hybrid" } else { "hard" };
        tokio::spawn(async move { platform.create_tenant(&admin, &format!("t-{n}"), "T", isolation, "").await })
    });
    for creation in creations.collect::<Vec<_>>() {
        creation.await.expect("task").expect("created");
    }
    assert_eq!(f.count("SELECT count(*) FROM fabric_leases WHERE released_at IS NULL").await, 48);
    assert_eq!(f.count("SELECT count(DISTINCT kind || ':' || value) FROM fabric_leases").await, 48);
    assert_eq!(overlapping_leases(&pool).await, 0);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_released_identifier_waits_out_its_quarantine_before_reuse(pool: SqlitePool) {
    let quarantine = Duration::from_millis(1200);
    let f = Fabric::new(&pool, config_with(IdentifierKind::Vlan, 100, 101, quarantine.as_millis() as i64)).await;
    let a = f.create("tenant-a", "hard").await.expect("a");
    assert_eq!(f.held_value(a, "vlan").await, Some(100));
    f.platform.change_tenant(&f.admin, a, TenantChange::Delete).await.expect("delete");
    assert!(f.held(a).await.is_empty(), "a deleted tenant holds nothing");
    let in_quarantine: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM fabric_leases WHERE tenant_id = ? AND released_at IS NOT NULL AND retired_at IS NULL",
    )
    .bind(a)
    .fetch_one(&pool)
    .await
    .expect("count");
    assert_eq!(in_quarantine, 4, "all four identifiers went into quarantine");
    let overview = f.platform.fabric_overview(&f.admin).await.expect("overview");
    let vlan = overview.quarantined.iter().find(|q| q.kind == IdentifierKind::Vlan).expect("listed");
    assert_eq!((vlan.value, vlan.tenant_slug.as_str()), (100, "tenant-a"));
    assert_eq!(vlan.free_at - vlan.released_at, quarantine.as_millis() as i64);

    // While 100 is in quarantine the next tenant gets 101, and a third none at all.
    let b = f.create("tenant-b", "hard").await.expect("b");
    assert_eq!(f.held_value(b, "vlan").await, Some(101));
    let refused = f.create("tenant-c", "hard").await.expect_err("both VLANs taken");
    assert!(matches!(&refused, Error::Refused(Refusal::FabricPoolExhausted { in_quarantine: 1, .. })), "{refused:?}");

    tokio::time::sleep(quarantine + Duration::from_millis(100)).await;
    let c = f.create("tenant-c", "hard").await.expect("after the quarantine");
    assert_eq!(f.held_value(c, "vlan").await, Some(100));
    assert_eq!(f.count("SELECT count(*) FROM fabric_leases WHERE retired_at IS NOT NULL AND kind = 'vlan'").await, 1);
    assert_eq!(overlapping_leases(&pool).await, 0);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_second_release_changes_nothing(pool: SqlitePool) {
    let f = Fabric::new(&pool, FabricConfig::default()).await;
    let a = f.create("acme", "hard").await.expect("hard");
    f.platform.set_tenant_isolation(&f.admin, a, "soft").await.expect("soft");
    let released: Vec<(i64, i64, i64)> =
        sqlx::query_as("SELECT id, released_at, quarantine_until FROM fabric_leases ORDER BY id")
            .fetch_all(&pool)
            .await
            .expect("leases");
    assert_eq!(released.len(), 4);
    tokio::time::sleep(Duration::from_millis(5)).await;
    f.platform.set_tenant_isolation(&f.admin, a, "soft").await.expect("soft again");
    f.platform.change_tenant(&f.admin, a, TenantChange::Delete).await.expect("delete");
    let after: Vec<(i64, i64, i64)> =
        sqlx::query_as("SELECT id, released_at, quarantine_until FROM fabric_leases ORDER BY id")
            .fetch_all(&pool)
            .await
            .expect("leases");
    assert_eq!(after, released, "released once: the times did not move");
    assert_eq!(f.count("SELECT count(*) FROM audit_events WHERE action = 'fabric.release'").await, 1);

    // The database refuses a second release even from outside the platform.
    let twice =
        sqlx::query("UPDATE fabric_leases SET released_at = released_at + 1, quarantine_until = quarantine_until + 1")
            .execute(&pool)
            .await
            .expect_err("released once");
    assert!(twice.to_string().contains("already released"), "{twice}");
    let early = sqlx::query("UPDATE fabric_leases SET retired_at = released_at").execute(&pool).await;
    assert!(early.expect_err("still in quarantine").to_string().contains("CHECK"), "retiring early is refused");
}

#[sqlx::test(migrations = "../migrations")]
async fn switching_isolation_leases_and_releases(pool: SqlitePool) {
    let f = Fabric::new(&pool, FabricConfig::default()).await;
    let a = f.create("acme", "soft").await.expect("soft");
    f.platform.set_tenant_isolation(&f.admin, a, "hybrid").await.expect("hybrid");
    assert_eq!(f.held(a).await.len(), 4);
    f.platform.set_tenant_isolation(&f.admin, a, "hard").await.expect("hard keeps what hybrid held");
    assert_eq!(f.count("SELECT count(*) FROM fabric_leases").await, 4);
    f.platform.set_tenant_isolation(&f.admin, a, "soft").await.expect("soft");
    assert!(f.held(a).await.is_empty());
    f.platform.set_tenant_isolation(&f.admin, a, "hard").await.expect("hard again");
    // Its old values are in quarantine, so it gets the next ones.
    assert_eq!(f.held_value(a, "vlan").await, Some(3));
    assert_eq!(f.held_value(a, "pkey").await, Some(2));
    assert_eq!(overlapping_leases(&pool).await, 0);
}

#[sqlx::test(migrations = "../migrations")]
async fn an_exhausted_pool_refuses_the_whole_tenant_change(pool: SqlitePool) {
    let f = Fabric::new(&pool, config_with(IdentifierKind::PKey, 0x10, 0x10, 60_000)).await;
    f.create("first", "hard").await.expect("takes the only P_Key");
    let leases = f.count("SELECT count(*) FROM fabric_leases").await;
    let audit = f.count("SELECT count(*) FROM audit_events").await;

    let refused = f.create("second", "hard").await.expect_err("no P_Key left");
    assert_eq!(
        refused.to_string(),
        "no free InfiniBand P_Key left in 0x0010-0x0010 (0 waiting out their quarantine); \
         widen the pool or wait for the quarantine to end"
    );
    assert_eq!(f.count("SELECT count(*) FROM tenants WHERE slug = 'second'").await, 0, "no half-made tenant");
    assert_eq!(f.count("SELECT count(*) FROM fabric_leases").await, leases, "no identifier leased");
    assert_eq!(f.count("SELECT count(*) FROM storage_volumes").await, 1);
    assert_eq!(f.count("SELECT count(*) FROM audit_events").await, audit, "nothing recorded as done");

    let soft = f.create("third", "soft").await.expect("soft needs nothing");
    let refused = f.platform.set_tenant_isolation(&f.admin, soft, "hard").await.expect_err("no P_Key left");
    assert!(matches!(refused, Error::Refused(Refusal::FabricPoolExhausted { .. })));
    let isolation: String = sqlx::query_scalar("SELECT isolation FROM tenants WHERE id = ?")
        .bind(soft)
        .fetch_one(&pool)
        .await
        .expect("row");
    assert_eq!(isolation, "soft", "the switch rolled back with the lease");
    assert!(f.held(soft).await.is_empty());
}

#[sqlx::test(migrations = "../migrations")]
async fn port_guids_join_one_hard_tenant_and_render_into_partitions_conf(pool: SqlitePool) {
    let f = Fabric::new(&pool, FabricConfig::default()).await;
    let acme = f.create("acme", "hard").await.expect("acme");
    let globex = f.create("globex", "hard").await.expect("globex");
    let soft = f.create("initech", "soft").await.expect("initech");
    let p = &f.platform;

    p.set_port_guids(&f.admin, acme, "0x0002C9030001E3F1, 0x0002c9030001e3f2").await.expect("set");
    let conf = p.partitions_conf(&f.admin).await.expect("conf");
    assert!(
        conf.contains("acme=0x0001, ipoib, defmember=full : 0x0002c9030001e3f1=full, 0x0002c9030001e3f2=full ;"),
        "{conf}"
    );
    assert!(conf.contains("globex=0x0002, ipoib, defmember=full : ;"), "{conf}");
    assert!(!conf.contains("initech"));

    let taken = p.set_port_guids(&f.admin, globex, "0x0002c9030001e3f2").await.expect_err("acme's port");
    assert_eq!(
        taken.to_string(),
        "port GUID 0x0002c9030001e3f2 is already in tenant acme's partition; remove it there first"
    );
    let bad = p.set_port_guids(&f.admin, globex, "0x2c9030001e3f2").await.expect_err("too short");
    assert!(matches!(bad, Error::Refused(Refusal::InvalidPortGuid(_))));
    let no_pkey = p.set_port_guids(&f.admin, soft, "0x0002c9030001e3f9").await.expect_err("soft");
    assert!(matches!(no_pkey, Error::Refused(Refusal::NoInfinibandPartition)));
    assert!(matches!(p.set_port_guids(&f.admin, 999, "").await, Err(Error::NotFound)));
    let member = p
        .create_user("dana@example.com", "Dana", "a long passphrase", Role::TenantAdmin, Some(acme))
        .await
        .expect("tenant admin")
        .caller(test_meta());
    assert!(matches!(p.set_port_guids(&member, acme, "").await, Err(Error::Forbidden)));
    assert!(matches!(p.fabric_overview(&member).await, Err(Error::Forbidden)));

    // Deleting the tenant takes its ports out, so another tenant may have them.
    p.change_tenant(&f.admin, acme, TenantChange::Delete).await.expect("delete");
    assert_eq!(f.count("SELECT count(*) FROM tenant_port_guids").await, 0);
    p.set_port_guids(&f.admin, globex, "0x0002c9030001e3f2").await.expect("free port");
    let conf = p.partitions_conf(&f.admin).await.expect("conf");
    assert!(
        !conf.contains("acme=") && conf.contains("globex=0x0002, ipoib, defmember=full : 0x0002c9030001e3f2=full ;")
    );

    // The database holds the same rules on its own.
    let orphan =
        sqlx::query("INSERT INTO tenant_port_guids (guid, tenant_id, added_at) VALUES ('0x00000000000000aa', ?, 0)")
            .bind(soft)
            .execute(&pool)
            .await
            .expect_err("no P_Key");
    assert!(orphan.to_string().contains("holds a P_Key"), "{orphan}");
    let release = sqlx::query("UPDATE fabric_leases SET released_at = held_at, quarantine_until = held_at WHERE tenant_id = ? AND kind = 'pkey'")
        .bind(globex)
        .execute(&pool)
        .await
        .expect_err("ports first");
    assert!(release.to_string().contains("port GUIDs before releasing"), "{release}");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_tenant_change_that_fails_after_leasing_leaves_no_lease(pool: SqlitePool) {
    let f = Fabric::new(&pool, FabricConfig::default()).await;
    // The first admin's email is taken, which is found only after the identifiers were
    // leased in the same transaction: as if Berth had stopped half-way.
    let refused =
        f.platform.create_tenant(&f.admin, "acme", "Acme", "hard", "root@example.com").await.expect_err("email taken");
    assert!(matches!(refused, Error::Refused(Refusal::EmailInUse(_))), "{refused:?}");
    assert_eq!(f.count("SELECT count(*) FROM tenants").await, 0);
    assert_eq!(f.count("SELECT count(*) FROM fabric_leases").await, 0);
    assert_eq!(f.count("SELECT count(*) FROM storage_volumes").await, 0);
    let a = f.create("acme", "hard").await.expect("the same tenant, now whole");
    assert_eq!(f.held_value(a, "vlan").await, Some(2), "the rolled-back lease took nothing from the pool");
}
