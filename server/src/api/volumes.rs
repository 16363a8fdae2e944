//! Volumes (list, make, grow, delete).

use axum::Json;
use axum::extract::Path;
use axum::response::{IntoResponse, Response};
use berth_platform::capacity::volumes::{Volume, VolumeRequest};
use http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::{ApiError, Body, TokenCaller, fail, rfc3339, schema, typed};

#[derive(Serialize, ToSchema)]
pub struct VolumeBody {
    id: i64,
    name: String,
    size_gib: u32,
    /// The owner's home volume, made on their first notebook.
    home: bool,
    /// The project it is shared with; `null` for a personal volume.
    project: Option<i64>,
    /// The owner's email.
    owner: String,
    mount_path: String,
    /// Where the backend keeps it, once it was first attached.
    location: Option<String>,
    /// As last measured; `null` where the backend cannot measure it (or has not yet).
    used_bytes: Option<i64>,
    /// When `used_bytes` was measured: on Kubernetes a volume no running pod mounts keeps
    /// an older figure.
    #[schema(format = DateTime)]
    measured_at: Option<String>,
    #[schema(format = DateTime)]
    created_at: String,
    attached: Vec<AttachmentBody>,
}

#[derive(Serialize, ToSchema)]
pub struct AttachmentBody {
    /// The environment's id.
    environment: String,
    environment_name: String,
    mount_path: String,
    #[schema(format = DateTime)]
    attached_at: String,
}

fn volume_body(v: Volume) -> VolumeBody {
    let attached = v
        .attachments
        .into_iter()
        .map(|a| AttachmentBody {
            environment: a.environment_id,
            environment_name: a.environment_name,
            mount_path: a.mount_path,
            attached_at: rfc3339(a.attached_at),
        })
        .collect();
    VolumeBody {
        id: v.id,
        name: v.name,
        size_gib: v.size_gib,
        home: v.is_home,
        project: v.project_id,
        owner: v.owner_email,
        mount_path: v.mount_path,
        location: v.location,
        used_bytes: v.used_bytes,
        measured_at: v.measured_at.map(rfc3339),
        created_at: rfc3339(v.created_at),
        attached,
    }
}

#[derive(Serialize, ToSchema)]
pub struct VolumeList {
    volumes: Vec<VolumeBody>,
}

/// The volumes in the caller's reach.
#[utoipa::path(get, path = "/api/v1/volumes", tag = "volumes", responses((status = 200, body = VolumeList)))]
pub(super) async fn volumes(TokenCaller(platform, caller): TokenCaller) -> Result<Json<VolumeList>, ApiError> {
    let volumes = platform.volumes(&caller).await.map_err(fail(&caller))?;
    Ok(Json(VolumeList { volumes: volumes.into_iter().map(volume_body).collect() }))
}

/// `{"name": "datasets", "size_gib": 50, "project": 3}`: a size and project as numbers or
/// strings; no project for a personal volume.
#[derive(Deserialize, ToSchema)]
pub struct NewVolume {
    /// A DNS label, e.g. `datasets`.
    name: String,
    /// Whole GiB, 1 to 65536.
    #[schema(schema_with = schema::number_or_text)]
    size_gib: Value,
    /// The project's id to share it with; absent, `null` or empty for a personal volume.
    #[serde(default)]
    #[schema(schema_with = schema::optional_number_or_text)]
    project: Value,
}

/// Makes a volume, personal or shared with a project.
#[utoipa::path(post, path = "/api/v1/volumes", tag = "volumes", request_body = NewVolume,
    responses((status = 201, description = "Made", body = VolumeBody)))]
pub(super) async fn create_volume(
    TokenCaller(platform, caller): TokenCaller,
    Body(asked): Body<NewVolume>,
) -> Response {
    let request = VolumeRequest { name: asked.name, size_gib: typed(&asked.size_gib), project: typed(&asked.project) };
    match platform.create_volume(&caller, &request).await {
        Ok(volume) => (StatusCode::CREATED, Json(volume_body(volume))).into_response(),
        Err(e) => fail(&caller)(e).into_response(),
    }
}

/// One volume.
#[utoipa::path(get, path = "/api/v1/volumes/{id}", tag = "volumes",
    params(("id" = i64, Path, description = "The volume's id")),
    responses((status = 200, body = VolumeBody)))]
pub(super) async fn volume(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<i64>,
) -> Result<Json<VolumeBody>, ApiError> {
    let volume = platform.volume(&caller, id).await.map_err(fail(&caller))?;
    Ok(Json(volume_body(volume)))
}

/// `{"size_gib": 100}`: a volume only grows.
#[derive(Deserialize, ToSchema)]
pub struct NewSize {
    /// Whole GiB, more than now.
    #[schema(schema_with = schema::number_or_text)]
    size_gib: Value,
}

/// Grows a volume.
#[utoipa::path(patch, path = "/api/v1/volumes/{id}", tag = "volumes",
    params(("id" = i64, Path, description = "The volume's id")),
    request_body = NewSize,
    responses((status = 200, body = VolumeBody)))]
pub(super) async fn resize_volume(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<i64>,
    Body(asked): Body<NewSize>,
) -> Result<Json<VolumeBody>, ApiError> {
    let volume = platform.resize_volume(&caller, id, &typed(&asked.size_gib)).await.map_err(fail(&caller))?;
    Ok(Json(volume_body(volume)))
}

#[derive(Serialize, ToSchema)]
pub struct Deleted {
    /// The volume's id.
    deleted: i64,
}

/// Deletes a volume that nothing has attached.
#[utoipa::path(delete, path = "/api/v1/volumes/{id}", tag = "volumes",
    params(("id" = i64, Path, description = "The volume's id")),
    responses((status = 200, body = Deleted)))]
pub(super) async fn delete_volume(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<i64>,
) -> Result<Json<Deleted>, ApiError> {
    platform.delete_volume(&caller, id).await.map_err(fail(&caller))?;
    Ok(Json(Deleted { deleted: id }))
}
