//! The image catalog: reading it, adding and removing entries, choosing defaults, and a
//! tenant's rule for custom images. Each change is the `/images` page's, through the same
//! platform call.

use axum::Json;
use axum::extract::Path;
use axum::response::{IntoResponse, Response};
use berth_domain::catalog::Offering;
use berth_domain::image::{CatalogImage, CustomImages, ImageForm};
use berth_platform::capacity::images::{CatalogEntry, TenantRule};
use http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::idle::{OfferingPath, offering_named};
use super::{ApiError, Body, TokenCaller, fail, schema};

/// One entry of the image catalog.
#[derive(Serialize, ToSchema)]
pub struct ImageBody {
    id: i64,
    /// `platform`, or the slug of the tenant whose own entry it is.
    catalog: String,
    /// The id of the tenant whose own entry it is; `null` for the platform's.
    tenant_id: Option<i64>,
    name: String,
    /// What a launch names to run it (`image` in the launch body), or its `name`.
    reference: String,
    /// Named by digest, not by a tag that may move.
    pinned: bool,
    description: String,
    cuda: String,
    framework: String,
    /// Offering ids it suits.
    #[schema(value_type = Vec<String>, example = json!(["notebook", "training"]))]
    offerings: Vec<&'static str>,
    /// Offering ids it is its catalog's default for.
    #[schema(value_type = Vec<String>)]
    default_for: Vec<&'static str>,
}

/// A tenant's rule for images besides the catalog's (training jobs and endpoints).
#[derive(Serialize, ToSchema)]
pub struct CustomImagesBody {
    /// The tenant's slug.
    tenant: String,
    tenant_id: i64,
    /// `catalog` (catalog images only), `any` (any registry) or `registries`.
    #[schema(example = "registries")]
    rule: &'static str,
    /// The registry hosts allowed, for `registries`.
    registries: Vec<String>,
}

#[derive(Serialize, ToSchema)]
pub struct ImageCatalogBody {
    /// The platform's entries, then each tenant's in reach.
    images: Vec<ImageBody>,
    custom_images: Vec<CustomImagesBody>,
}

fn image_body(catalog: Option<&str>, i: CatalogImage) -> ImageBody {
    let ids = |offerings: &[Offering]| offerings.iter().map(|o| o.id()).collect();
    ImageBody {
        id: i.id,
        catalog: catalog.unwrap_or("platform").to_owned(),
        tenant_id: i.tenant_id,
        pinned: i.is_pinned(),
        offerings: ids(&i.offerings),
        default_for: ids(&i.default_for),
        name: i.name,
        reference: i.reference,
        description: i.description,
        cuda: i.cuda,
        framework: i.framework,
    }
}

fn entry_body(entry: CatalogEntry) -> ImageBody {
    image_body(entry.tenant.as_deref(), entry.image)
}

fn custom_body(tenant_id: i64, tenant: String, custom: CustomImages) -> CustomImagesBody {
    let (rule, registries) = match custom {
        CustomImages::CatalogOnly => ("catalog", Vec::new()),
        CustomImages::AnyRegistry => ("any", Vec::new()),
        CustomImages::Registries(hosts) => ("registries", hosts),
    };
    CustomImagesBody { tenant, tenant_id, rule, registries }
}

/// The image catalog in the caller's reach: the platform's entries, their tenant's own (a
/// platform admin's: every tenant's), and each tenant's rule for custom images.
#[utoipa::path(get, path = "/api/v1/images", tag = "images", responses((status = 200, body = ImageCatalogBody)))]
pub(super) async fn images(TokenCaller(platform, caller): TokenCaller) -> Result<Json<ImageCatalogBody>, ApiError> {
    let catalog = platform.image_catalog(&caller).await.map_err(fail(&caller))?;
    let mut images: Vec<ImageBody> = catalog.platform.into_iter().map(|i| image_body(None, i)).collect();
    let mut custom_images = Vec::with_capacity(catalog.tenants.len());
    for tenant in catalog.tenants {
        images.extend(tenant.images.into_iter().map(|i| image_body(Some(&tenant.tenant), i)));
        custom_images.push(custom_body(tenant.tenant_id, tenant.tenant, tenant.custom));
    }
    Ok(Json(ImageCatalogBody { images, custom_images }))
}

/// `{"name": "NGC PyTorch", "reference": "nvcr.io/nvidia/pytorch:24.05-py3@sha256:…",
/// "offerings": ["training"], "default_for": ["training"]}`: the images page's add form.
#[derive(Deserialize, ToSchema)]
pub struct NewImage {
    /// The id of the tenant whose catalog gets it; absent or `null` for the caller's own:
    /// their tenant's, or the platform's for platform staff.
    #[serde(default)]
    tenant: Option<i64>,
    /// 1 to 60 characters on one line.
    name: String,
    /// Pinned by digest: `registry/repository[:tag]@sha256:<64 hex>`. A tenant admin's must
    /// come from a registry the tenant's rule allows.
    reference: String,
    #[serde(default)]
    description: String,
    /// The CUDA version, e.g. `12.4`.
    #[serde(default)]
    cuda: String,
    /// The framework and its version, e.g. `PyTorch 2.4`.
    #[serde(default)]
    framework: String,
    /// The offerings it suits: at least one that runs an image.
    #[schema(schema_with = schema::offerings)]
    offerings: Vec<String>,
    /// The offerings it becomes its catalog's default for, among those it suits.
    #[serde(default)]
    #[schema(schema_with = schema::offerings)]
    default_for: Vec<String>,
}

/// Adds an entry to the platform's catalog (platform admins) or a tenant's (its tenant
/// admins, platform admins).
#[utoipa::path(post, path = "/api/v1/images", tag = "images", request_body = NewImage,
    responses((status = 201, description = "Added", body = ImageBody)))]
pub(super) async fn add_image(TokenCaller(platform, caller): TokenCaller, Body(asked): Body<NewImage>) -> Response {
    let tenant_id = asked.tenant.or(caller.tenant_id());
    let form = ImageForm {
        name: asked.name,
        reference: asked.reference,
        description: asked.description,
        cuda: asked.cuda,
        framework: asked.framework,
        offerings: asked.offerings,
        default_for: asked.default_for,
    };
    match platform.add_image(&caller, tenant_id, &form).await {
        Ok(entry) => (StatusCode::CREATED, Json(entry_body(entry))).into_response(),
        Err(e) => fail(&caller)(e).into_response(),
    }
}

#[derive(Serialize, ToSchema)]
pub struct ImageRemoved {
    /// The entry's id.
    removed: i64,
}

/// Removes an entry from its catalog. Environments that run it keep running it; it is no
/// longer offered, nor a default.
#[utoipa::path(delete, path = "/api/v1/images/{id}", tag = "images",
    params(("id" = i64, Path, description = "The entry's id")),
    responses((status = 200, body = ImageRemoved)))]
pub(super) async fn remove_image(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<i64>,
) -> Result<Json<ImageRemoved>, ApiError> {
    platform.remove_image(&caller, id).await.map_err(fail(&caller))?;
    Ok(Json(ImageRemoved { removed: id }))
}

/// Makes an entry its catalog's default for an offering it suits, in place of the one
/// before; answers the entry.
#[utoipa::path(put, path = "/api/v1/images/{id}/defaults/{offering}", tag = "images",
    params(("id" = i64, Path, description = "The entry's id"), OfferingPath),
    responses((status = 200, body = ImageBody)))]
pub(super) async fn set_default_image(
    TokenCaller(platform, caller): TokenCaller,
    Path((id, offering)): Path<(i64, String)>,
) -> Result<Json<ImageBody>, ApiError> {
    let offering = offering_named(&caller, &offering)?;
    let entry = platform.set_default_image(&caller, id, offering.id()).await.map_err(fail(&caller))?;
    Ok(Json(entry_body(entry)))
}

/// `{"rule": "registries", "registries": ["ghcr.io", "nvcr.io"]}`: the images page's form.
#[derive(Deserialize, ToSchema)]
pub struct NewCustomImages {
    /// `catalog` (catalog images only), `any` (any registry) or `registries`.
    #[schema(example = "registries")]
    rule: String,
    /// The registry hosts allowed, for `registries`: at least one.
    #[serde(default)]
    registries: Vec<String>,
}

/// Sets which images besides the catalog's a tenant's people may run for training jobs
/// and endpoints (platform admins). Environments that run an image keep it.
#[utoipa::path(put, path = "/api/v1/tenants/{id}/custom-images", tag = "images",
    params(("id" = i64, Path, description = "The tenant's id")),
    request_body = NewCustomImages,
    responses((status = 200, body = CustomImagesBody)))]
pub(super) async fn set_custom_images(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<i64>,
    Body(asked): Body<NewCustomImages>,
) -> Result<Json<CustomImagesBody>, ApiError> {
    let TenantRule { tenant_id, tenant, custom } = platform
        .set_custom_images(&caller, id, &asked.rule, &asked.registries.join(" "))
        .await
        .map_err(fail(&caller))?;
    Ok(Json(custom_body(tenant_id, tenant, custom)))
}
