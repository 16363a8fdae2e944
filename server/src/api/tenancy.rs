//! Who the token speaks for, tenants and their members, the caller's API tokens and SSH
//! keys.

use axum::Json;
use axum::extract::Path;
use serde::Serialize;
use utoipa::ToSchema;

use super::{ApiError, TokenCaller, fail, rfc3339, schema};

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

/// The tenants in the caller's reach.
#[utoipa::path(get, path = "/api/v1/tenants", tag = "tenants", responses((status = 200, body = TenantList)))]
pub(super) async fn tenants(TokenCaller(platform, caller): TokenCaller) -> Result<Json<TenantList>, ApiError> {
    let tenants = platform.tenants(&caller).await.map_err(fail(&caller))?;
    let tenants = tenants
        .into_iter()
        .map(|t| TenantBody {
            id: t.id,
            slug: t.slug,
            name: t.name,
            isolation: t.isolation.as_str(),
            status: t.status,
            members: t.members,
            active_environments: t.active_environments,
        })
        .collect();
    Ok(Json(TenantList { tenants }))
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
    let members = members
        .into_iter()
        .map(|m| MemberBody {
            user_id: m.user_id,
            email: m.email,
            name: m.display_name,
            role: m.role.as_str(),
            status: m.status,
        })
        .collect();
    Ok(Json(MemberList { members }))
}

/// A personal API token; never its secret.
#[derive(Serialize, ToSchema)]
pub struct TokenBody {
    id: i64,
    name: String,
    /// What it is limited to; empty: all its owner's role allows.
    #[schema(schema_with = schema::actions)]
    actions: Vec<&'static str>,
    #[schema(format = DateTime)]
    expires_at: String,
    revoked: bool,
}

#[derive(Serialize, ToSchema)]
pub struct TokenList {
    tokens: Vec<TokenBody>,
}

/// The caller's own API tokens.
#[utoipa::path(get, path = "/api/v1/tokens", tag = "tokens", responses((status = 200, body = TokenList)))]
pub(super) async fn tokens(TokenCaller(platform, caller): TokenCaller) -> Result<Json<TokenList>, ApiError> {
    let tokens = platform.my_tokens(&caller).await.map_err(fail(&caller))?;
    let tokens = tokens
        .into_iter()
        .map(|t| TokenBody {
            id: t.id,
            name: t.name,
            actions: t.actions.iter().map(|a| a.as_str()).collect(),
            expires_at: rfc3339(t.expires_at),
            revoked: t.revoked_at.is_some(),
        })
        .collect();
    Ok(Json(TokenList { tokens }))
}

#[derive(Serialize, ToSchema)]
pub struct Revoked {
    /// The token's id.
    revoked: i64,
}

/// Revokes one of the caller's tokens (this one too).
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
