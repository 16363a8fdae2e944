//! Volumes: the volumes page, the launch form's list, an environment's volumes, and the
//! storage limits beside the GPU quotas.

use leptos::prelude::*;

use crate::error::AppError;
use crate::model::{StorageQuotasView, VolumeOption, VolumesView};

/// An attachment as the environment page shows it.
#[cfg(feature = "ssr")]
pub(crate) fn attachment_view(a: berth_platform::capacity::volumes::Attachment) -> crate::model::VolumeAttachmentView {
    views::attachment(a)
}

#[cfg(feature = "ssr")]
mod views {
    use berth_platform::capacity::volumes::{Attachment, Volume};

    use crate::model::{VolumeAttachmentView, VolumeView};
    use crate::time::utc;

    /// "512 B", "1.5 KiB", "3.2 GiB".
    pub fn bytes(n: i64) -> String {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut value = n.max(0) as f64;
        let mut unit = 0;
        while value >= 1024.0 && unit < UNITS.len() - 1 {
            value /= 1024.0;
            unit += 1;
        }
        if unit == 0 { format!("{n} B") } else { format!("{value:.1} {}", UNITS[unit]) }
    }

    /// "3.0 GiB, measured 2026-11-26 13:40 UTC": when matters, since a volume the backend
    /// cannot measure now (on Kubernetes, one no running pod mounts) keeps its last figure.
    pub fn use_text(used_bytes: Option<i64>, measured_at: Option<i64>) -> String {
        match (used_bytes, measured_at) {
            (Some(used), Some(at)) => format!("{}, measured {}", bytes(used), utc(at)),
            (Some(used), None) => bytes(used),
            (None, _) => "not measured".to_owned(),
        }
    }

    pub fn attachment(a: Attachment) -> VolumeAttachmentView {
        VolumeAttachmentView {
            volume: a.volume_name,
            environment_id: a.environment_id,
            environment_name: a.environment_name,
            mount_path: a.mount_path,
            since: utc(a.attached_at),
            until: a.detached_at.map(utc),
        }
    }

    pub fn volume(v: Volume) -> VolumeView {
        let scope = match (&v.project, v.is_home) {
            (_, true) => "Home".to_owned(),
            (Some(project), _) => format!("Project {project}"),
            (None, false) => "Personal".to_owned(),
        };
        VolumeView {
            id: v.id,
            name: v.name,
            scope,
            owner: v.owner_email,
            size_gib: v.size_gib,
            used: use_text(v.used_bytes, v.measured_at),
            mount_path: v.mount_path,
            location: v.location.unwrap_or_else(|| "made at its first attach".to_owned()),
            created: utc(v.created_at),
            attachments: v.attachments.into_iter().map(attachment).collect(),
        }
    }
}

/// The volumes in the caller's reach, and where a new one may go.
#[server(endpoint = "volumes")]
pub async fn volumes() -> Result<VolumesView, AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let fail = |e| AppError::from_platform(e, &caller.meta.request_id);
    let volumes = platform.volumes(&caller).await.map_err(fail)?;
    let can_manage = caller.principal.reach(berth_domain::policy::Action::VolumeManage).is_some();
    // Projects come from the launch's list: a volume is shared where one may book.
    let projects = if can_manage && caller.tenant_id().is_some() {
        platform.projects_to_book_in(&caller).await.map_err(fail)?
    } else {
        Vec::new()
    };
    Ok(VolumesView {
        volumes: volumes.into_iter().map(views::volume).collect(),
        projects: projects.into_iter().map(|(id, name)| crate::model::ProjectOption { id, name }).collect(),
        can_manage,
        size_rule: platform.volume_size_rule().map(str::to_owned),
    })
}

/// Makes a volume: `project` empty for a personal one.
#[server(endpoint = "create_volume")]
pub async fn create_volume(name: String, size_gib: String, project: String) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let request = berth_platform::capacity::volumes::VolumeRequest { name, size_gib, project };
    platform.create_volume(&caller, &request).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/volumes");
    Ok(())
}

/// Grows a volume.
#[server(endpoint = "resize_volume")]
pub async fn resize_volume(id: i64, size_gib: String) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform
        .resize_volume(&caller, id, &size_gib)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/volumes");
    Ok(())
}

/// Deletes a volume nothing has attached.
#[server(endpoint = "delete_volume")]
pub async fn delete_volume(id: i64) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform.delete_volume(&caller, id).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/volumes");
    Ok(())
}

/// The volumes the launch form offers.
#[server(endpoint = "attachable_volumes")]
pub async fn attachable_volumes() -> Result<Vec<VolumeOption>, AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let volumes =
        platform.attachable_volumes(&caller).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    Ok(volumes
        .into_iter()
        .map(|v| VolumeOption {
            id: v.id,
            name: v.name,
            mount_path: v.mount_path,
            size_gib: v.size_gib,
            is_home: v.is_home,
            project_id: v.project_id,
            project: v.project,
        })
        .collect())
}

/// Storage limits in reach, for the quotas page.
#[server(endpoint = "storage_quotas")]
pub async fn storage_quotas() -> Result<StorageQuotasView, AppError> {
    use berth_domain::policy::{Action, Reach};
    let (platform, caller) = super::ssr::caller().await?;
    let rows =
        platform.storage_quotas(&caller).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    let reach = caller.principal.reach(Action::QuotaManage);
    Ok(StorageQuotasView {
        rows: rows
            .into_iter()
            .map(|r| crate::model::StorageQuotaView {
                id: r.id,
                who: r.who,
                max: r.max_gib.map_or_else(|| "no limit".to_owned(), |g| format!("{g} GiB")),
                used_gib: r.used_gib,
                home: r.home_gib.map_or_else(String::new, |g| format!("{g} GiB")),
            })
            .collect(),
        can_set: reach.is_some(),
        can_set_tenants: reach == Some(Reach::All),
    })
}

/// Sets a tenant's (by slug) or a project's storage limit; empty is no limit.
#[server(endpoint = "set_storage_quota")]
pub async fn set_storage_quota(level: String, who: String, max_gib: String, home_gib: String) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform
        .set_storage_quota(&caller, &level, &who, &max_gib, &home_gib)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/admin/quotas?saved=storage");
    Ok(())
}

#[cfg(all(test, feature = "ssr"))]
mod tests {
    #[test]
    fn bytes_in_words() {
        assert_eq!(super::views::bytes(512), "512 B");
        assert_eq!(super::views::bytes(1536), "1.5 KiB");
        assert_eq!(super::views::bytes(3 * 1024 * 1024 * 1024), "3.0 GiB");
    }

    #[test]
    fn use_says_when_it_was_measured() {
        use super::views::use_text;
        // 2026-11-26 13:40 UTC
        let at = 1_795_700_400_000;
        assert_eq!(use_text(Some(3 << 30), Some(at)), "3.0 GiB, measured 2026-11-26 13:40 UTC");
        assert_eq!(use_text(None, None), "not measured");
    }
}
