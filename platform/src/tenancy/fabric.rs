//! Fabric isolation identifiers held in the database: leasing a hard or hybrid tenant's
//! network segment, P_Key, NVLink partition and storage volume, releasing them into
//! quarantine exactly once, the tenants' InfiniBand port GUIDs, and what platform admins see
//! of it (including the OpenSM partitions.conf of every hard tenant).
//!
//! Leases change only inside the tenant changes' own write transactions (see `tenants`), so
//! a tenant is never created, switched or deleted with half of its identifiers.

use berth_domain::Refusal;
use berth_domain::booking::utc_short;
use berth_domain::fabric::{
    self, FabricConfig, FabricLease, IdentifierKind, NetworkSegment, PKey, TenantPartition, parse_port_guids,
};
use berth_domain::policy::{Action, Target};
use berth_domain::tenancy::Isolation;
use sqlx::{Row, SqliteConnection};

use crate::audit::{self, Actor, Event, Outcome};
use crate::{Caller, Error, Platform, now_ms};

/// One identifier a tenant holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldIdentifier {
    pub kind: IdentifierKind,
    pub value: u32,
    pub held_at: i64,
    /// Set for storage volumes.
    pub quota_bytes: Option<i64>,
}

impl HeldIdentifier {
    /// The value as operators write it (`0x0002`, `berth-v000001`, `100`).
    pub fn shown(&self) -> String {
        self.kind.show(self.value)
    }
}

/// A tenant with fabric identifiers, or one whose isolation should give it some.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantFabric {
    pub tenant_id: i64,
    pub slug: String,
    pub name: String,
    pub isolation: Isolation,
    pub identifiers: Vec<HeldIdentifier>,
    pub port_guids: Vec<String>,
}

/// A released identifier still in quarantine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuarantinedIdentifier {
    pub kind: IdentifierKind,
    pub value: u32,
    /// The tenant that held it last.
    pub tenant_slug: String,
    pub released_at: i64,
    pub free_at: i64,
}

/// How much of one pool is taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolUsage {
    pub kind: IdentifierKind,
    pub range: String,
    pub size: u64,
    pub held: i64,
    pub quarantined: i64,
}

/// Everything the fabric page shows platform admins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricOverview {
    pub segment: NetworkSegment,
    pub quarantine_ms: i64,
    pub tenants: Vec<TenantFabric>,
    pub quarantined: Vec<QuarantinedIdentifier>,
    pub pools: Vec<PoolUsage>,
    pub partitions_conf: String,
}

impl Platform {
    /// The operator's fabric settings.
    pub fn fabric_config(&self) -> &FabricConfig {
        &self.fabric
    }

    /// Every tenant's identifiers, those in quarantine with when they become free, pool
    /// usage and the rendered partitions.conf. Platform staff only.
    pub async fn fabric_overview(&self, caller: &Caller) -> Result<FabricOverview, Error> {
        self.authorize(caller, Action::FleetRead, Target::Platform).await?;
        let now = now_ms();
        let mut conn = self.db.acquire().await?;
        let tenants = tenant_fabrics(&mut conn).await?;
        let rows = sqlx::query(
            "SELECT l.kind, l.value, t.slug, l.released_at, l.quarantine_until
             FROM fabric_leases l JOIN tenants t ON t.id = l.tenant_id
             WHERE l.released_at IS NOT NULL AND l.retired_at IS NULL AND l.quarantine_until > ?
             ORDER BY l.quarantine_until, l.kind, l.value",
        )
        .bind(now)
        .fetch_all(&mut *conn)
        .await?;
        let quarantined = rows
            .iter()
            .map(|row| {
                Ok(QuarantinedIdentifier {
                    kind: kind_of(row.try_get("kind")?)?,
                    value: value_of(row.try_get("value")?)?,
                    tenant_slug: row.try_get("slug")?,
                    released_at: row.try_get("released_at")?,
                    free_at: row.try_get("quarantine_until")?,
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let mut pools = Vec::new();
        for kind in IdentifierKind::ALL {
            let pool = self.fabric.pool(kind);
            let (held, quarantined): (i64, i64) = sqlx::query_as(
                "SELECT coalesce(sum(released_at IS NULL), 0), coalesce(sum(released_at IS NOT NULL AND quarantine_until > ?), 0)
                 FROM fabric_leases WHERE kind = ? AND retired_at IS NULL AND value BETWEEN ? AND ?",
            )
            .bind(now)
            .bind(kind.as_str())
            .bind(pool.first)
            .bind(pool.last)
            .fetch_one(&mut *conn)
            .await?;
            pools.push(PoolUsage { kind, range: pool.range(), size: pool.size(), held, quarantined });
        }
        let partitions_conf = fabric::partitions_conf(&partitions(&tenants)?);
        Ok(FabricOverview {
            segment: self.fabric.segment,
            quarantine_ms: self.fabric.quarantine_ms,
            tenants,
            quarantined,
            pools,
            partitions_conf,
        })
    }

    /// The OpenSM partitions.conf fragment for every tenant holding a P_Key. Platform
    /// staff only.
    pub async fn partitions_conf(&self, caller: &Caller) -> Result<String, Error> {
        self.authorize(caller, Action::FleetRead, Target::Platform).await?;
        let mut conn = self.db.acquire().await?;
        Ok(fabric::partitions_conf(&partitions(&tenant_fabrics(&mut conn).await?)?))
    }

    /// Replaces the InfiniBand port GUIDs in a tenant's partition with those in `text`
    /// (spaces, commas or new lines between them; empty removes every port). Platform
    /// admins only; the tenant must hold a P_Key, and a port already in another tenant's
    /// partition is refused.
    pub async fn set_port_guids(&self, caller: &Caller, tenant_id: i64, text: &str) -> Result<(), Error> {
        self.authorize(caller, Action::FleetManage, Target::Platform).await?;
        let guids = parse_port_guids(text)?;
        let mut tx = self.begin_write().await?;
        let slug: String = sqlx::query_scalar("SELECT slug FROM tenants WHERE id = ? AND status <> 'deleted'")
            .bind(tenant_id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(Error::NotFound)?;
        let has_pkey: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM fabric_leases WHERE tenant_id = ? AND kind = 'pkey' AND released_at IS NULL)",
        )
        .bind(tenant_id)
        .fetch_one(&mut *tx)
        .await?;
        if !has_pkey {
            return Err(Refusal::NoInfinibandPartition.into());
        }
        for guid in &guids {
            let other: Option<String> = sqlx::query_scalar(
                "SELECT t.slug FROM tenant_port_guids g JOIN tenants t ON t.id = g.tenant_id
                 WHERE g.guid = ? AND g.tenant_id <> ?",
            )
            .bind(guid.to_string())
            .bind(tenant_id)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(tenant) = other {
                return Err(Refusal::PortGuidInUse { guid: guid.to_string(), tenant }.into());
            }
        }
        sqlx::query("DELETE FROM tenant_port_guids WHERE tenant_id = ?").bind(tenant_id).execute(&mut *tx).await?;
        let now = now_ms();
        for guid in &guids {
            sqlx::query("INSERT INTO tenant_port_guids (guid, tenant_id, added_at) VALUES (?, ?, ?)")
                .bind(guid.to_string())
                .bind(tenant_id)
                .bind(now)
                .execute(&mut *tx)
                .await?;
        }
        let target = format!("tenant:{tenant_id}");
        let detail = format!("{} port GUIDs in {slug}'s partition", guids.len());
        let event =
            Event { action: "fabric.ports", target: Some(&target), outcome: Outcome::Success, detail: Some(&detail) };
        audit::record(&mut tx, &Actor { tenant_id: Some(tenant_id), ..caller.actor() }, event).await?;
        tx.commit().await?;
        Ok(())
    }
}

/// Makes the tenant hold what its isolation needs: leases what is missing (hard, hybrid)
/// or releases everything into quarantine (soft). Runs inside the caller's write
/// transaction; an exhausted pool refuses and the caller's whole change rolls back.
pub(crate) async fn settle(
    conn: &mut SqliteConnection,
    config: &FabricConfig,
    tenant_id: i64,
    isolation: Isolation,
    actor: &Actor<'_>,
) -> Result<(), Error> {
    if config.needed(isolation).is_empty() {
        return release(conn, config, tenant_id, actor).await;
    }
    let held: Vec<String> =
        sqlx::query_scalar("SELECT kind FROM fabric_leases WHERE tenant_id = ? AND released_at IS NULL")
            .bind(tenant_id)
            .fetch_all(&mut *conn)
            .await?;
    let held = held.iter().map(|k| kind_of(k.clone())).collect::<Result<Vec<_>, Error>>()?;
    let now = now_ms();
    let mut leased = Vec::new();
    for kind in config.missing(isolation, &held) {
        let value = lease(conn, config, tenant_id, kind, now).await?;
        let mut shown = format!("{} {}", kind.label(), kind.show(value));
        if kind == IdentifierKind::Volume {
            shown.push_str(&format!(" ({} GiB)", config.volume_quota_bytes / fabric::GIB));
        }
        leased.push(shown);
    }
    if leased.is_empty() {
        return Ok(());
    }
    let target = format!("tenant:{tenant_id}");
    let detail = leased.join(", ");
    let event =
        Event { action: "fabric.hold", target: Some(&target), outcome: Outcome::Success, detail: Some(&detail) };
    audit::record(conn, actor, event).await
}

/// Releases every identifier the tenant holds into quarantine and takes its ports out of
/// its partition. Releasing what is already released changes nothing: the `WHERE` finds
/// no held lease, and the database refuses a second release outright.
pub(crate) async fn release(
    conn: &mut SqliteConnection,
    config: &FabricConfig,
    tenant_id: i64,
    actor: &Actor<'_>,
) -> Result<(), Error> {
    let now = now_ms();
    let until = fabric::quarantine_end(now, config.quarantine_ms);
    let ports = sqlx::query("DELETE FROM tenant_port_guids WHERE tenant_id = ?")
        .bind(tenant_id)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    let released: Vec<(String, i64)> = sqlx::query_as(
        "UPDATE fabric_leases SET released_at = ?, quarantine_until = ?
         WHERE tenant_id = ? AND released_at IS NULL RETURNING kind, value",
    )
    .bind(now)
    .bind(until)
    .bind(tenant_id)
    .fetch_all(&mut *conn)
    .await?;
    if released.is_empty() && ports == 0 {
        return Ok(());
    }
    let mut shown = Vec::new();
    for (kind, value) in released {
        let kind = kind_of(kind)?;
        shown.push(format!("{} {}", kind.label(), kind.show(value_of(value)?)));
    }
    let target = format!("tenant:{tenant_id}");
    let detail = format!("{}; in quarantine until {}; {ports} port GUIDs removed", shown.join(", "), utc_short(until));
    let event =
        Event { action: "fabric.release", target: Some(&target), outcome: Outcome::Success, detail: Some(&detail) };
    audit::record(conn, actor, event).await
}

/// Leases the lowest free value of `kind` to the tenant.
async fn lease(
    conn: &mut SqliteConnection,
    config: &FabricConfig,
    tenant_id: i64,
    kind: IdentifierKind,
    now: i64,
) -> Result<u32, Error> {
    // Values whose quarantine is over become free; retiring them here (rather than on a
    // timer) keeps the partial unique index exactly "held or in quarantine".
    sqlx::query(
        "UPDATE fabric_leases SET retired_at = ?
         WHERE kind = ? AND retired_at IS NULL AND released_at IS NOT NULL AND quarantine_until <= ?",
    )
    .bind(now)
    .bind(kind.as_str())
    .bind(now)
    .execute(&mut *conn)
    .await?;
    let rows = sqlx::query(
        "SELECT value, tenant_id, held_at, released_at, quarantine_until FROM fabric_leases
         WHERE kind = ? AND retired_at IS NULL",
    )
    .bind(kind.as_str())
    .fetch_all(&mut *conn)
    .await?;
    let leases = rows
        .iter()
        .map(|row| {
            Ok(FabricLease {
                kind,
                value: value_of(row.try_get("value")?)?,
                tenant_id: row.try_get("tenant_id")?,
                held_at: row.try_get("held_at")?,
                released_at: row.try_get("released_at")?,
                quarantine_until: row.try_get("quarantine_until")?,
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let value = config.pool(kind).allocate(&leases, now)?;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO fabric_leases (kind, value, tenant_id, held_at) VALUES (?, ?, ?, ?) RETURNING id",
    )
    .bind(kind.as_str())
    .bind(value)
    .bind(tenant_id)
    .bind(now)
    .fetch_one(&mut *conn)
    .await?;
    if kind == IdentifierKind::Volume {
        sqlx::query("INSERT INTO storage_volumes (lease_id, quota_bytes) VALUES (?, ?)")
            .bind(id)
            .bind(config.volume_quota_bytes)
            .execute(&mut *conn)
            .await?;
    }
    Ok(value)
}

/// Tenants that hold identifiers or whose isolation asks for them, with what they hold.
async fn tenant_fabrics(conn: &mut SqliteConnection) -> Result<Vec<TenantFabric>, Error> {
    let tenants = sqlx::query(
        "SELECT t.id, t.slug, t.name, t.isolation FROM tenants t
         WHERE t.status <> 'deleted'
           AND (t.isolation <> 'soft' OR EXISTS (SELECT 1 FROM fabric_leases l WHERE l.tenant_id = t.id AND l.released_at IS NULL))
         ORDER BY t.slug",
    )
    .fetch_all(&mut *conn)
    .await?;
    let mut out = Vec::new();
    for row in tenants {
        let tenant_id: i64 = row.try_get("id")?;
        let isolation: String = row.try_get("isolation")?;
        let leases = sqlx::query(
            "SELECT l.kind, l.value, l.held_at, v.quota_bytes FROM fabric_leases l
             LEFT JOIN storage_volumes v ON v.lease_id = l.id
             WHERE l.tenant_id = ? AND l.released_at IS NULL",
        )
        .bind(tenant_id)
        .fetch_all(&mut *conn)
        .await?;
        let mut identifiers = leases
            .iter()
            .map(|l| {
                Ok(HeldIdentifier {
                    kind: kind_of(l.try_get("kind")?)?,
                    value: value_of(l.try_get("value")?)?,
                    held_at: l.try_get("held_at")?,
                    quota_bytes: l.try_get("quota_bytes")?,
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        identifiers.sort_by_key(|i| i.kind);
        let port_guids: Vec<String> =
            sqlx::query_scalar("SELECT guid FROM tenant_port_guids WHERE tenant_id = ? ORDER BY guid")
                .bind(tenant_id)
                .fetch_all(&mut *conn)
                .await?;
        out.push(TenantFabric {
            tenant_id,
            slug: row.try_get("slug")?,
            name: row.try_get("name")?,
            isolation: Isolation::parse(&isolation).map_err(|_| Error::internal("unknown isolation"))?,
            identifiers,
            port_guids,
        });
    }
    Ok(out)
}

/// The partitions of tenants holding a P_Key.
fn partitions(tenants: &[TenantFabric]) -> Result<Vec<TenantPartition>, Error> {
    let mut out = Vec::new();
    for tenant in tenants {
        let Some(pkey) = tenant.identifiers.iter().find(|i| i.kind == IdentifierKind::PKey) else { continue };
        let ports = tenant
            .port_guids
            .iter()
            .map(|g| fabric::PortGuid::parse(g))
            .collect::<Result<Vec<_>, Refusal>>()
            .map_err(|_| Error::internal("a stored port GUID does not parse"))?;
        let pkey = PKey::new(pkey.value).map_err(|_| Error::internal("a stored P_Key is out of range"))?;
        out.push(TenantPartition { name: tenant.slug.clone(), pkey, ports });
    }
    Ok(out)
}

fn kind_of(kind: String) -> Result<IdentifierKind, Error> {
    IdentifierKind::parse(&kind).ok_or_else(|| Error::internal(format!("unknown fabric identifier kind {kind}")))
}

fn value_of(value: i64) -> Result<u32, Error> {
    u32::try_from(value).map_err(|_| Error::internal(format!("fabric identifier {value} out of range")))
}
