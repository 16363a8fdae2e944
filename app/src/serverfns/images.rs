//! The image catalog: its page, its changes, and what the launch form offers.

use berth_domain::image::ImageForm;
use leptos::prelude::*;

use crate::error::AppError;
use crate::model::{ImageOffer, ImagesView};

#[cfg(feature = "ssr")]
mod views {
    use berth_domain::catalog::Offering;
    use berth_domain::image::{CatalogImage, CustomImages};
    use berth_platform::capacity::images::{ImageCatalog, TenantImages};

    use crate::model::{ImageOption, ImageView, ImagesView, TenantImagesView};

    fn titles(offerings: &[Offering]) -> String {
        offerings.iter().map(|o| o.title()).collect::<Vec<_>>().join(", ")
    }

    pub fn image(i: CatalogImage, may_manage: bool) -> ImageView {
        let pinned = i.is_pinned();
        let may_default = i
            .offerings
            .iter()
            .filter(|o| !i.default_for.contains(o))
            .map(|o| (o.id().to_owned(), o.title().to_owned()))
            .collect();
        ImageView {
            id: i.id,
            pinned,
            suits: titles(&i.offerings),
            default_for: titles(&i.default_for),
            may_default,
            name: i.name,
            reference: i.reference,
            description: i.description,
            cuda: i.cuda,
            framework: i.framework,
            may_manage,
        }
    }

    fn tenant(t: TenantImages) -> TenantImagesView {
        let (custom_mode, registries) = match &t.custom {
            CustomImages::CatalogOnly => ("catalog", String::new()),
            CustomImages::AnyRegistry => ("any", String::new()),
            CustomImages::Registries(hosts) => ("registries", hosts.join(", ")),
        };
        TenantImagesView {
            tenant_id: t.tenant_id,
            custom: t.custom.describe(),
            custom_mode: custom_mode.to_owned(),
            registries,
            images: t.images.into_iter().map(|i| image(i, t.may_manage)).collect(),
            tenant: t.tenant,
            may_manage: t.may_manage,
        }
    }

    pub fn catalog(c: ImageCatalog) -> ImagesView {
        ImagesView {
            platform: c.platform.into_iter().map(|i| image(i, c.may_manage_platform)).collect(),
            tenants: c.tenants.into_iter().map(tenant).collect(),
            may_manage_platform: c.may_manage_platform,
            may_set_custom_images: c.may_set_custom_images,
        }
    }

    /// "PyTorch 2.4 (CUDA 12.4) - nvcr.io/nvidia/pytorch:24.05-py3", and whose it is.
    pub fn option(i: &CatalogImage) -> ImageOption {
        let mut label = i.name.clone();
        match (i.framework.is_empty(), i.cuda.is_empty()) {
            (_, false) => label.push_str(&format!(" (CUDA {})", i.cuda)),
            (false, true) => label.push_str(&format!(" ({})", i.framework)),
            (true, true) => {}
        }
        if i.tenant_id.is_some() {
            label.push_str(" - your team's");
        }
        ImageOption { reference: i.reference.clone(), label }
    }
}

/// The catalog in the caller's reach.
#[server(endpoint = "images")]
pub async fn images() -> Result<ImagesView, AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let catalog =
        platform.image_catalog(&caller).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    Ok(views::catalog(catalog))
}

/// Adds an entry to a tenant's catalog (`tenant` its id), or with `tenant` empty to the
/// caller's own: their tenant's, or the platform's for platform staff.
#[server(endpoint = "add_image")]
pub async fn add_image(tenant: String, image: ImageForm) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let tenant_id = match tenant.trim() {
        "" => caller.tenant_id(),
        id => Some(id.parse::<i64>().map_err(|_| AppError::Refused(format!("there is no tenant \"{id}\"")))?),
    };
    platform
        .add_image(&caller, tenant_id, &image)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/images");
    Ok(())
}

/// Removes an entry; environments that run it keep running it.
#[server(endpoint = "remove_image")]
pub async fn remove_image(id: i64) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform.remove_image(&caller, id).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/images");
    Ok(())
}

/// Makes an entry its catalog's default for an offering.
#[server(endpoint = "set_default_image")]
pub async fn set_default_image(id: i64, offering: String) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform
        .set_default_image(&caller, id, &offering)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/images?saved=default-image");
    Ok(())
}

/// Sets a tenant's rule for custom images (platform admins).
#[server(endpoint = "set_custom_images")]
pub async fn set_custom_images(tenant_id: i64, mode: String, registries: String) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform
        .set_custom_images(&caller, tenant_id, &mode, &registries)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/images?saved=custom-images");
    Ok(())
}

/// What the launch form offers for `offering`'s image.
#[server(endpoint = "launch_images")]
pub async fn launch_images(offering: String) -> Result<ImageOffer, AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let offering = berth_domain::catalog::Offering::parse(&offering)
        .ok_or_else(|| AppError::Refused(format!("there is no offering called \"{offering}\"")))?;
    let choice =
        platform.launch_images(&caller).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    Ok(ImageOffer {
        options: choice.offered(offering).into_iter().map(views::option).collect(),
        custom: choice.custom_allowed(offering).map(|c| c.describe()),
    })
}
