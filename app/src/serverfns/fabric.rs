use leptos::prelude::*;

use crate::error::AppError;
use crate::model::FabricView;

/// Every hard and hybrid tenant's fabric identifiers, those in quarantine, pool usage and
/// the OpenSM partitions.conf. Platform staff only.
#[server(endpoint = "fabric_overview")]
pub async fn fabric_overview() -> Result<FabricView, AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let overview =
        platform.fabric_overview(&caller).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    let can_manage = caller.principal.reach(berth_domain::policy::Action::FleetManage).is_some();
    Ok(view::fabric(&overview, berth_platform::now_ms(), can_manage))
}

/// Replaces the InfiniBand port GUIDs in a tenant's partition. Platform admins only.
#[server(endpoint = "set_port_guids")]
pub async fn set_port_guids(tenant_id: i64, guids: String) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform
        .set_port_guids(&caller, tenant_id, &guids)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/admin/fabric?saved=port-guids");
    Ok(())
}

#[cfg(feature = "ssr")]
mod view {
    use berth_domain::fabric::{IdentifierKind, NetworkSegment, PKey};
    use berth_platform::tenancy::fabric::{FabricOverview, TenantFabric};

    use crate::model::{FabricTenantView, FabricView, PoolView, QuarantinedView};
    use crate::time::{duration_words, utc};

    pub fn fabric(overview: &FabricOverview, now: i64, can_manage: bool) -> FabricView {
        FabricView {
            segment: match overview.segment {
                NetworkSegment::Vlan => "VLAN",
                NetworkSegment::Vxlan => "VXLAN",
            }
            .into(),
            quarantine: duration_words(overview.quarantine_ms),
            tenants: overview.tenants.iter().map(tenant).collect(),
            quarantined: overview
                .quarantined
                .iter()
                .map(|q| QuarantinedView {
                    identifier: format!("{} {}", q.kind.label(), q.kind.show(q.value)),
                    tenant: q.tenant_slug.clone(),
                    released: utc(q.released_at),
                    free_at: utc(q.free_at),
                    free_in: format!("in {}", duration_words(q.free_at - now)),
                })
                .collect(),
            pools: overview
                .pools
                .iter()
                .map(|p| PoolView {
                    what: p.kind.label().into(),
                    range: p.range.clone(),
                    size: p.size.to_string(),
                    held: p.held,
                    quarantined: p.quarantined,
                    free: p.size.saturating_sub((p.held + p.quarantined).max(0) as u64).to_string(),
                })
                .collect(),
            partitions_conf: overview.partitions_conf.clone(),
            can_manage,
        }
    }

    fn tenant(t: &TenantFabric) -> FabricTenantView {
        let held = |kind: IdentifierKind| t.identifiers.iter().find(|i| i.kind == kind);
        let segment = held(IdentifierKind::Vlan)
            .map(|v| format!("VLAN {}", v.value))
            .or_else(|| held(IdentifierKind::Vni).map(|v| format!("VNI {}", v.value)))
            .unwrap_or_default();
        let pkey = held(IdentifierKind::PKey)
            .and_then(|p| PKey::new(p.value).ok())
            .map(|p| format!("{p} (full member 0x{:04x})", p.full_member()))
            .unwrap_or_default();
        let volume = held(IdentifierKind::Volume)
            .map(|v| match v.quota_bytes {
                Some(bytes) => format!("{} · {} GiB", v.shown(), bytes / berth_domain::fabric::GIB),
                None => v.shown(),
            })
            .unwrap_or_default();
        FabricTenantView {
            id: t.tenant_id,
            slug: t.slug.clone(),
            name: t.name.clone(),
            isolation: t.isolation.as_str().into(),
            segment,
            has_pkey: !pkey.is_empty(),
            pkey,
            nvlink: held(IdentifierKind::NvlinkPartition).map(|n| n.shown()).unwrap_or_default(),
            volume,
            port_guids: t.port_guids.clone(),
        }
    }
}
