//! Who the token speaks for, tenants with their members and projects, the caller's API
//! tokens and SSH keys.

use axum::Json;
use axum::extract::Path;
use axum::response::{IntoResponse, Response};
use berth_domain::Refusal;
use berth_platform::tenancy::tenants::{Tenant, TenantChange};
use berth_platform::{Caller, Error, Platform};
use http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{ApiError, Body, TokenCaller, fail, rfc3339, schema};

/// Who the token speaks for, and what it may do.
#[derive(Serialize, ToSchema)]
pub struct Me {
    user_id: i64,
    /// `null` for platform staff.
    tenant_id: Option<i64>,
    #[schema(schema_with = schema::role)]
    role: &'static str,
    /// The actions the token is limited to; empty: all the person's role allows.
    #[schema(schema_with = schema::actions)]
    token_actions: Vec<&'static str>,
}

/// The person and role behind the bearer token.
#[utoipa::path(get, path = "/api/v1/me", tag = "account", responses((status = 200, body = Me)))]
pub(super) async fn me(TokenCaller(_, caller): TokenCaller) -> Result<Json<Me>, ApiError> {
    Ok(Json(Me {
        user_id: caller.user_id(),
        tenant_id: caller.tenant_id(),
        role: caller.principal.role.as_str(),
        token_actions: caller.principal.token_actions.iter().flatten().map(|a| a.as_str()).collect(),
    }))
}

#[derive(Serialize, ToSchema)]
pub struct TenantBody {
    id: i64,
    slug: String,
    name: String,
    #[schema(schema_with = schema::isolation)]
    isolation: &'static str,
    status: String,
    members: i64,
    active_environments: i64,
}

#[derive(Serialize, ToSchema)]
pub struct TenantList {
    tenants: Vec<TenantBody>,
}

fn tenant_body(t: Tenant) -> TenantBody {
    TenantBody {
        id: t.id,
        slug: t.slug,
        name: t.name,
        isolation: t.isolation.as_str(),
        status: t.status,
        members: t.members,
        active_environments: t.active_environments,
    }
}

/// The tenants in the caller's reach.
#[utoipa::path(get, path = "/api/v1/tenants", tag = "tenants", responses((status = 200, body = TenantList)))]
pub(super) async fn tenants(TokenCaller(platform, caller): TokenCaller) -> Result<Json<TenantList>, ApiError> {
    let tenants = platform.tenants(&caller).await.map_err(fail(&caller))?;
    Ok(Json(TenantList { tenants: tenants.into_iter().map(tenant_body).collect() }))
}

/// `{"slug": "acme", "name": "Acme Research", "isolation": "soft", "first_admin": "ada@acme.example"}`.
#[derive(Deserialize, ToSchema)]
pub struct NewTenant {
    /// Lowercase letters, digits and hyphens; its namespaces and networks are named after it.
    slug: String,
    name: String,
    /// `soft`, `hybrid` or `hard`.
    #[schema(schema_with = schema::isolation)]
    isolation: String,
    /// Invited as its tenant admin (by email); absent or empty for none.
    #[serde(default)]
    first_admin: String,
}

/// A platform admin makes a tenant, with its isolation's fabric and, where given, its first
/// admin invited, as the tenants page does.
#[utoipa::path(post, path = "/api/v1/tenants", tag = "tenants", request_body = NewTenant,
    responses((status = 201, body = TenantBody)))]
pub(super) async fn create_tenant(
    TokenCaller(platform, caller): TokenCaller,
    Body(asked): Body<NewTenant>,
) -> Response {
    match platform.create_tenant(&caller, &asked.slug, &asked.name, &asked.isolation, &asked.first_admin).await {
        Ok(tenant) => (StatusCode::CREATED, Json(tenant_body(tenant))).into_response(),
        Err(e) => fail(&caller)(e).into_response(),
    }
}

/// `{"status": "suspended"}` or `{"isolation": "hard"}`, or both.
#[derive(Deserialize, ToSchema)]
pub struct TenantPatch {
    /// `active` or `suspended`: a suspended tenant's people can no longer act (their
    /// sessions and tokens stop at once). Delete a tenant with `DELETE`.
    #[schema(schema_with = schema::optional_tenant_status)]
    status: Option<String>,
    /// `soft`, `hybrid` or `hard`.
    #[schema(schema_with = schema::optional_isolation)]
    isolation: Option<String>,
}

/// A platform admin suspends or resumes a tenant, or changes its isolation; answers the
/// tenant as it is then (with neither, it changes nothing).
#[utoipa::path(patch, path = "/api/v1/tenants/{id}", tag = "tenants",
    params(("id" = i64, Path, description = "The tenant's id")),
    request_body = TenantPatch,
    responses((status = 200, body = TenantBody)))]
pub(super) async fn change_tenant(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<i64>,
    Body(patch): Body<TenantPatch>,
) -> Result<Json<TenantBody>, ApiError> {
    let change = match patch.status.as_deref().map(str::trim) {
        None => None,
        Some("active") => Some(TenantChange::Resume),
        Some("suspended") => Some(TenantChange::Suspend),
        Some(other) => {
            let refusal = Refusal::InvalidTenantStatus(other.chars().take(40).collect());
            return Err(fail(&caller)(Error::Refused(refusal)));
        }
    };
    // The isolation first: a refused one (no nodes of its own free) leaves the status as it was.
    if let Some(isolation) = &patch.isolation {
        platform.set_tenant_isolation(&caller, id, isolation).await.map_err(fail(&caller))?;
    }
    if let Some(change) = change {
        platform.change_tenant(&caller, id, change).await.map_err(fail(&caller))?;
    }
    Ok(Json(tenant_body(platform.tenant(&caller, id).await.map_err(fail(&caller))?)))
}

#[derive(Serialize, ToSchema)]
pub struct TenantDeleted {
    deleted: i64,
}

/// A platform admin deletes a tenant: its environments stop (and are torn down), its
/// sessions and tokens end, its volumes go once nothing runs; its history stays.
#[utoipa::path(delete, path = "/api/v1/tenants/{id}", tag = "tenants",
    params(("id" = i64, Path, description = "The tenant's id")),
    responses((status = 200, body = TenantDeleted)))]
pub(super) async fn delete_tenant(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<i64>,
) -> Result<Json<TenantDeleted>, ApiError> {
    platform.change_tenant(&caller, id, TenantChange::Delete).await.map_err(fail(&caller))?;
    Ok(Json(TenantDeleted { deleted: id }))
}

#[derive(Serialize, ToSchema)]
pub struct MemberBody {
    user_id: i64,
    email: String,
    name: String,
    #[schema(schema_with = schema::role)]
    role: &'static str,
    status: String,
}

#[derive(Serialize, ToSchema)]
pub struct MemberList {
    members: Vec<MemberBody>,
}

/// A tenant's members.
#[utoipa::path(get, path = "/api/v1/tenants/{id}/members", tag = "tenants",
    params(("id" = i64, Path, description = "The tenant's id")),
    responses((status = 200, body = MemberList)))]
pub(super) async fn members(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<i64>,
) -> Result<Json<MemberList>, ApiError> {
    let members = platform.members(&caller, id).await.map_err(fail(&caller))?;
    Ok(Json(MemberList { members: members.into_iter().map(member_body).collect() }))
}

fn member_body(m: berth_platform::tenancy::tenants::Member) -> MemberBody {
    MemberBody { user_id: m.user_id, email: m.email, name: m.display_name, role: m.role.as_str(), status: m.status }
}

/// A personal API token; never its secret.
#[derive(Serialize, ToSchema)]
pub struct TokenBody {
    id: i64,
    name: String,
    /// The owner's email.
    owner: String,
    /// What it is limited to; empty: all its owner's role allows.
    #[schema(schema_with = schema::actions)]
    actions: Vec<&'static str>,
    #[schema(format = DateTime)]
    created_at: String,
    #[schema(format = DateTime)]
    expires_at: String,
    revoked: bool,
    #[schema(format = DateTime)]
    last_used_at: Option<String>,
}

fn token_list(tokens: Vec<berth_platform::identity::tokens::TokenInfo>) -> TokenList {
    let tokens = tokens
        .into_iter()
        .map(|t| TokenBody {
            id: t.id,
            name: t.name,
            owner: t.owner_email,
            actions: t.actions.iter().map(|a| a.as_str()).collect(),
            created_at: rfc3339(t.created_at),
            expires_at: rfc3339(t.expires_at),
            revoked: t.revoked_at.is_some(),
            last_used_at: t.last_used_at.map(rfc3339),
        })
        .collect();
    TokenList { tokens }
}

#[derive(Serialize, ToSchema)]
pub struct TokenList {
    tokens: Vec<TokenBody>,
}

/// The caller's own API tokens.
#[utoipa::path(get, path = "/api/v1/tokens", tag = "tokens", responses((status = 200, body = TokenList)))]
pub(super) async fn tokens(TokenCaller(platform, caller): TokenCaller) -> Result<Json<TokenList>, ApiError> {
    let tokens = platform.my_tokens(&caller).await.map_err(fail(&caller))?;
    Ok(Json(token_list(tokens)))
}

/// Every API token of a tenant's members, newest first (its tenant admins and platform
/// staff); `POST /api/v1/tokens/{id}/revoke` revokes one.
#[utoipa::path(get, path = "/api/v1/tenants/{id}/tokens", tag = "tokens",
    params(("id" = i64, Path, description = "The tenant's id")),
    responses((status = 200, body = TokenList)))]
pub(super) async fn tenant_tokens(
    TokenCaller(platform, caller): TokenCaller,
    Path(tenant): Path<i64>,
) -> Result<Json<TokenList>, ApiError> {
    let tokens = platform.tenant_tokens(&caller, tenant).await.map_err(fail(&caller))?;
    Ok(Json(token_list(tokens)))
}

#[derive(Serialize, ToSchema)]
pub struct Revoked {
    /// The token's id.
    revoked: i64,
}

/// Revokes one of the caller's tokens (this one too) or, for tenant admins, a member's.
#[utoipa::path(post, path = "/api/v1/tokens/{id}/revoke", tag = "tokens",
    params(("id" = i64, Path, description = "The token's id")),
    responses((status = 200, body = Revoked)))]
pub(super) async fn revoke_token(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<i64>,
) -> Result<Json<Revoked>, ApiError> {
    platform.revoke_token(&caller, id).await.map_err(fail(&caller))?;
    Ok(Json(Revoked { revoked: id }))
}

/// An SSH public key on the caller's account (dedicated clusters' nodes take it).
#[derive(Serialize, ToSchema)]
pub struct SshKeyBody {
    id: i64,
    name: String,
    /// `ssh-ed25519`, `ssh-rsa`, ...
    algorithm: String,
    bits: i64,
    /// `SHA256:…`, as `ssh-keygen -l` prints it.
    fingerprint: String,
    #[schema(format = DateTime)]
    created_at: String,
}

#[derive(Serialize, ToSchema)]
pub struct SshKeyList {
    ssh_keys: Vec<SshKeyBody>,
}

/// The caller's SSH keys, oldest first. Keys are added on the account page: a key opens a
/// shell on nodes, so Berth takes one only from a signed-in person, never from a token.
#[utoipa::path(get, path = "/api/v1/ssh-keys", tag = "account", responses((status = 200, body = SshKeyList)))]
pub(super) async fn ssh_keys(TokenCaller(platform, caller): TokenCaller) -> Result<Json<SshKeyList>, ApiError> {
    let keys = platform.my_ssh_keys(&caller).await.map_err(fail(&caller))?;
    let ssh_keys = keys
        .into_iter()
        .map(|k| SshKeyBody {
            id: k.id,
            name: k.name,
            algorithm: k.algorithm,
            bits: k.bits,
            fingerprint: k.fingerprint,
            created_at: rfc3339(k.created_at),
        })
        .collect();
    Ok(Json(SshKeyList { ssh_keys }))
}

#[derive(Serialize, ToSchema)]
pub struct SshKeyRemoved {
    /// The key's id.
    removed: i64,
}

/// Removes an SSH key (a tenant admin may remove their members'); the nodes drop it at
/// their agents' next pass. Removing a removed key changes nothing.
#[utoipa::path(delete, path = "/api/v1/ssh-keys/{id}", tag = "account",
    params(("id" = i64, Path, description = "The key's id")),
    responses((status = 200, body = SshKeyRemoved)))]
pub(super) async fn remove_ssh_key(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<i64>,
) -> Result<Json<SshKeyRemoved>, ApiError> {
    platform.remove_ssh_key(&caller, id).await.map_err(fail(&caller))?;
    Ok(Json(SshKeyRemoved { removed: id }))
}

#[derive(Serialize, ToSchema)]
pub struct ProjectBody {
    id: i64,
    name: String,
    /// Its members' emails.
    members: Vec<String>,
}

#[derive(Serialize, ToSchema)]
pub struct ProjectList {
    /// By name.
    projects: Vec<ProjectBody>,
}

fn project_body(p: berth_platform::tenancy::tenants::Project) -> ProjectBody {
    ProjectBody { id: p.id, name: p.name, members: p.members }
}

/// One project of a tenant, as stored now.
async fn project_of(platform: &Platform, caller: &Caller, tenant: i64, id: i64) -> Result<ProjectBody, Error> {
    let projects = platform.projects(caller, tenant).await?;
    projects.into_iter().find(|p| p.id == id).map(project_body).ok_or(Error::NotFound)
}

/// A tenant's projects and their members.
#[utoipa::path(get, path = "/api/v1/tenants/{id}/projects", tag = "tenants",
    params(("id" = i64, Path, description = "The tenant's id")),
    responses((status = 200, body = ProjectList)))]
pub(super) async fn projects(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<i64>,
) -> Result<Json<ProjectList>, ApiError> {
    let projects = platform.projects(&caller, id).await.map_err(fail(&caller))?;
    Ok(Json(ProjectList { projects: projects.into_iter().map(project_body).collect() }))
}

/// `{"name": "vision"}`
#[derive(Deserialize, ToSchema)]
pub struct NewProject {
    /// Unique in the tenant.
    #[schema(example = "vision")]
    name: String,
}

/// Makes a project in the tenant (its tenant admins, platform admins).
#[utoipa::path(post, path = "/api/v1/tenants/{id}/projects", tag = "tenants",
    params(("id" = i64, Path, description = "The tenant's id")),
    request_body = NewProject,
    responses((status = 201, description = "Made", body = ProjectBody)))]
pub(super) async fn create_project(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<i64>,
    Body(asked): Body<NewProject>,
) -> Response {
    let made = async {
        let project = platform.create_project(&caller, id, &asked.name).await?;
        project_of(&platform, &caller, id, project).await
    };
    match made.await {
        Ok(project) => (StatusCode::CREATED, Json(project)).into_response(),
        Err(e) => fail(&caller)(e).into_response(),
    }
}

/// `{"email": "ada@acme.example"}`: a member of the tenant.
#[derive(Deserialize, ToSchema)]
pub struct NewProjectMember {
    #[schema(example = "ada@acme.example")]
    email: String,
}

/// Adds a member of the tenant (by email) to one of its projects; adding one twice changes
/// nothing.
#[utoipa::path(post, path = "/api/v1/tenants/{id}/projects/{project}/members", tag = "tenants",
    params(("id" = i64, Path, description = "The tenant's id"),
        ("project" = i64, Path, description = "The project's id")),
    request_body = NewProjectMember,
    responses((status = 200, body = ProjectBody)))]
pub(super) async fn add_project_member(
    TokenCaller(platform, caller): TokenCaller,
    Path((id, project)): Path<(i64, i64)>,
    Body(asked): Body<NewProjectMember>,
) -> Result<Json<ProjectBody>, ApiError> {
    platform.add_project_member(&caller, id, project, &asked.email).await.map_err(fail(&caller))?;
    Ok(Json(project_of(&platform, &caller, id, project).await.map_err(fail(&caller))?))
}

/// One member of a tenant, as stored now.
async fn member_of(platform: &Platform, caller: &Caller, tenant: i64, user: i64) -> Result<MemberBody, Error> {
    let members = platform.members(caller, tenant).await?;
    members.into_iter().find(|m| m.user_id == user).map(member_body).ok_or(Error::NotFound)
}

/// `{"email": "ada@acme.example", "role": "member"}`
#[derive(Deserialize, ToSchema)]
pub struct NewMember {
    #[schema(example = "ada@acme.example")]
    email: String,
    /// `tenant_admin`, `member` or `viewer`.
    #[schema(example = "member")]
    role: String,
}

/// Adds someone to the tenant by email with a role (an invitation: they sign in through
/// the tenant's provider and are told so). Someone removed from the tenant may be added
/// back.
#[utoipa::path(post, path = "/api/v1/tenants/{id}/members", tag = "tenants",
    params(("id" = i64, Path, description = "The tenant's id")),
    request_body = NewMember,
    responses((status = 201, description = "Added", body = MemberBody)))]
pub(super) async fn invite_member(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<i64>,
    Body(asked): Body<NewMember>,
) -> Response {
    let added = async {
        let user = platform.invite_member(&caller, id, &asked.email, &asked.role).await?;
        member_of(&platform, &caller, id, user).await
    };
    match added.await {
        Ok(member) => (StatusCode::CREATED, Json(member)).into_response(),
        Err(e) => fail(&caller)(e).into_response(),
    }
}

/// `{"role": "viewer"}`
#[derive(Deserialize, ToSchema)]
pub struct NewRole {
    /// `tenant_admin`, `member` or `viewer`.
    #[schema(example = "viewer")]
    role: String,
}

/// Gives a member another role. Nobody changes their own, and a tenant keeps at least one
/// tenant admin.
#[utoipa::path(patch, path = "/api/v1/tenants/{id}/members/{user}", tag = "tenants",
    params(("id" = i64, Path, description = "The tenant's id"),
        ("user" = i64, Path, description = "The member's user id")),
    request_body = NewRole,
    responses((status = 200, body = MemberBody)))]
pub(super) async fn change_member_role(
    TokenCaller(platform, caller): TokenCaller,
    Path((id, user)): Path<(i64, i64)>,
    Body(asked): Body<NewRole>,
) -> Result<Json<MemberBody>, ApiError> {
    platform.change_member_role(&caller, id, user, &asked.role).await.map_err(fail(&caller))?;
    Ok(Json(member_of(&platform, &caller, id, user).await.map_err(fail(&caller))?))
}

#[derive(Serialize, ToSchema)]
pub struct MemberRemoved {
    /// The member's user id.
    removed: i64,
}

/// Takes a member out of the tenant: they can no longer sign in, their sessions and tokens
/// stop at once and their environments are stopped. Nobody removes themselves, and a
/// tenant keeps at least one tenant admin.
#[utoipa::path(delete, path = "/api/v1/tenants/{id}/members/{user}", tag = "tenants",
    params(("id" = i64, Path, description = "The tenant's id"),
        ("user" = i64, Path, description = "The member's user id")),
    responses((status = 200, body = MemberRemoved)))]
pub(super) async fn remove_member(
    TokenCaller(platform, caller): TokenCaller,
    Path((id, user)): Path<(i64, i64)>,
) -> Result<Json<MemberRemoved>, ApiError> {
    platform.remove_member(&caller, id, user).await.map_err(fail(&caller))?;
    Ok(Json(MemberRemoved { removed: user }))
}
