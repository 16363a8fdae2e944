//! Fabric isolation for platform staff: every hard or hybrid tenant's network segment,
//! P_Key, NVLink partition and storage volume, identifiers in quarantine, the pools, the
//! OpenSM partitions, and a tenant's InfiniBand port GUIDs.

use axum::Json;
use axum::extract::Path;
use berth_domain::fabric::NetworkSegment;
use berth_platform::tenancy::fabric::{FabricOverview, HeldIdentifier, TenantFabric};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{ApiError, Body, TokenCaller, fail, rfc3339, schema};

/// An identifier a tenant holds.
#[derive(Serialize, ToSchema)]
pub struct IdentifierBody {
    /// `vlan`, `vni`, `pkey`, `nvlink` or `volume`.
    kind: &'static str,
    /// As operators write it: `0x0002`, `berth-v000001`, `100`.
    value: String,
    #[schema(format = DateTime)]
    held_at: String,
    /// A storage volume's quota.
    quota_bytes: Option<i64>,
}

fn identifier_body(i: &HeldIdentifier) -> IdentifierBody {
    IdentifierBody { kind: i.kind.as_str(), value: i.shown(), held_at: rfc3339(i.held_at), quota_bytes: i.quota_bytes }
}

/// A tenant with fabric identifiers, or whose isolation should give it some.
#[derive(Serialize, ToSchema)]
pub struct TenantFabricBody {
    /// The tenant's id.
    id: i64,
    slug: String,
    name: String,
    #[schema(schema_with = schema::isolation)]
    isolation: &'static str,
    identifiers: Vec<IdentifierBody>,
    /// The InfiniBand ports in its partition.
    port_guids: Vec<String>,
}

fn tenant_body(t: &TenantFabric) -> TenantFabricBody {
    TenantFabricBody {
        id: t.tenant_id,
        slug: t.slug.clone(),
        name: t.name.clone(),
        isolation: t.isolation.as_str(),
        identifiers: t.identifiers.iter().map(identifier_body).collect(),
        port_guids: t.port_guids.clone(),
    }
}

/// A released identifier, free again once its quarantine ends.
#[derive(Serialize, ToSchema)]
pub struct QuarantinedBody {
    kind: &'static str,
    value: String,
    /// The slug of the tenant that held it last.
    tenant: String,
    #[schema(format = DateTime)]
    released_at: String,
    #[schema(format = DateTime)]
    free_at: String,
}

/// How much of one identifier pool is taken.
#[derive(Serialize, ToSchema)]
pub struct PoolBody {
    kind: &'static str,
    /// e.g. `100-3999`.
    range: String,
    size: u64,
    held: i64,
    quarantined: i64,
}

#[derive(Serialize, ToSchema)]
pub struct FabricBody {
    /// Which network segment hard tenants get: `vlan` or `vxlan`.
    segment: &'static str,
    /// How long a released identifier waits before another tenant may hold it.
    quarantine_seconds: i64,
    tenants: Vec<TenantFabricBody>,
    quarantined: Vec<QuarantinedBody>,
    pools: Vec<PoolBody>,
    /// The OpenSM `partitions.conf` fragment of every tenant holding a P_Key.
    partitions_conf: String,
}

fn fabric_body(o: FabricOverview) -> FabricBody {
    FabricBody {
        segment: match o.segment {
            NetworkSegment::Vlan => "vlan",
            NetworkSegment::Vxlan => "vxlan",
        },
        quarantine_seconds: o.quarantine_ms / 1000,
        tenants: o.tenants.iter().map(tenant_body).collect(),
        quarantined: o
            .quarantined
            .iter()
            .map(|q| QuarantinedBody {
                kind: q.kind.as_str(),
                value: q.kind.show(q.value),
                tenant: q.tenant_slug.clone(),
                released_at: rfc3339(q.released_at),
                free_at: rfc3339(q.free_at),
            })
            .collect(),
        pools: o
            .pools
            .iter()
            .map(|p| PoolBody {
                kind: p.kind.as_str(),
                range: p.range.clone(),
                size: p.size,
                held: p.held,
                quarantined: p.quarantined,
            })
            .collect(),
        partitions_conf: o.partitions_conf,
    }
}

/// The fabric page: every tenant's identifiers, those in quarantine, the pools and the
/// OpenSM partitions (platform staff).
#[utoipa::path(get, path = "/api/v1/fabric", tag = "fleet", responses((status = 200, body = FabricBody)))]
pub(super) async fn fabric(TokenCaller(platform, caller): TokenCaller) -> Result<Json<FabricBody>, ApiError> {
    let overview = platform.fabric_overview(&caller).await.map_err(fail(&caller))?;
    Ok(Json(fabric_body(overview)))
}

/// `{"guids": ["0x0002c9030001e3f1"]}`: every port of the tenant's partition at once.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewPortGuids {
    /// 64-bit port GUIDs (`0x` and 16 hex digits); empty removes every port.
    guids: Vec<String>,
}

/// Replaces the InfiniBand port GUIDs in a tenant's partition (platform admins). Refused
/// (422, nothing changed) for a tenant without a P_Key, a malformed GUID, or a port in
/// another tenant's partition.
#[utoipa::path(put, path = "/api/v1/tenants/{id}/port-guids", tag = "fleet",
    params(("id" = i64, Path, description = "The tenant's id")),
    request_body = NewPortGuids,
    responses((status = 200, body = TenantFabricBody)))]
pub(super) async fn set_port_guids(
    TokenCaller(platform, caller): TokenCaller,
    Path(tenant): Path<i64>,
    Body(asked): Body<NewPortGuids>,
) -> Result<Json<TenantFabricBody>, ApiError> {
    platform.set_port_guids(&caller, tenant, &asked.guids.join("\n")).await.map_err(fail(&caller))?;
    let overview = platform.fabric_overview(&caller).await.map_err(fail(&caller))?;
    let held = overview.tenants.iter().find(|t| t.tenant_id == tenant);
    let held =
        held.ok_or_else(|| fail(&caller)(berth_platform::Error::internal("the tenant just changed is not listed")))?;
    Ok(Json(tenant_body(held)))
}
