//! A tenant's single sign-on connection (OpenID Connect), as the team page sets it; its
//! client secret is written, never read back.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::Path;
use berth_domain::Refusal;
use berth_domain::tenancy;
use berth_platform::identity::sso::SsoSettings;
use berth_platform::{Caller, Error, Platform};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{ApiError, Body, TokenCaller, fail};

/// A tenant's SSO connection. `configured` is false until one is saved (the other fields
/// then show the defaults a first save takes).
#[derive(Serialize, ToSchema)]
pub struct SsoBody {
    configured: bool,
    /// What the sign-in button says.
    display_name: String,
    issuer: String,
    client_id: String,
    /// Whether a client secret is stored (it is never shown).
    has_secret: bool,
    /// The ID token's claim that lists the person's groups.
    groups_claim: String,
    /// Only people with an email in these domains may sign in; empty: anyone the provider
    /// vouches for.
    allowed_domains: Vec<String>,
    /// The role each group gives, by group name.
    group_roles: BTreeMap<String, String>,
    enabled: bool,
    /// Where people start signing in, once configured.
    sign_in_url: Option<String>,
}

async fn sso_of(platform: &Platform, caller: &Caller, tenant: i64) -> Result<SsoBody, ApiError> {
    let s = platform.sso_settings(caller, tenant).await.map_err(fail(caller))?;
    // The stored forms, read as `set_sso` read them before storing them.
    let group_roles = tenancy::parse_group_roles(&s.group_roles).map_err(|r| fail(caller)(Error::internal(r)))?;
    let allowed_domains = tenancy::parse_domains(&s.allowed_domains).map_err(|r| fail(caller)(Error::internal(r)))?;
    Ok(SsoBody {
        configured: s.slug.is_some(),
        display_name: s.display_name,
        issuer: s.issuer,
        client_id: s.client_id,
        has_secret: s.has_secret,
        groups_claim: s.groups_claim,
        allowed_domains,
        group_roles: group_roles.into_iter().map(|(group, role)| (group, role.as_str().to_owned())).collect(),
        enabled: s.enabled,
        sign_in_url: s.slug.map(|slug| format!("{}/auth/oidc/{slug}/start", platform.public_url())),
    })
}

/// A tenant's SSO connection (tenant admins and platform staff).
#[utoipa::path(get, path = "/api/v1/tenants/{id}/sso", tag = "tenants",
    params(("id" = i64, Path, description = "The tenant's id")),
    responses((status = 200, body = SsoBody)))]
pub(super) async fn sso(
    TokenCaller(platform, caller): TokenCaller,
    Path(tenant): Path<i64>,
) -> Result<Json<SsoBody>, ApiError> {
    Ok(Json(sso_of(&platform, &caller, tenant).await?))
}

/// `{"display_name": "Acme", "issuer": "https://idp.acme.com", "client_id": "berth",
/// "client_secret": "…", "allowed_domains": ["acme.com"], "group_roles": {"ml-admins":
/// "tenant_admin"}}`: the whole connection at once.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewSso {
    display_name: String,
    /// https, on a public address unless the operator allows private issuers; its discovery
    /// document is read when people sign in.
    issuer: String,
    client_id: String,
    /// Write-only: absent or empty keeps the stored one.
    #[serde(default)]
    client_secret: String,
    /// Absent or empty: `groups`.
    #[serde(default)]
    groups_claim: String,
    /// Absent or empty: any domain.
    #[serde(default)]
    allowed_domains: Vec<String>,
    /// The role (`tenant_admin`, `member` or `viewer`) each group gives.
    #[serde(default)]
    group_roles: BTreeMap<String, String>,
    /// Absent: true. A disabled connection keeps its settings and signs nobody in.
    #[serde(default = "enabled")]
    enabled: bool,
}

fn enabled() -> bool {
    true
}

/// Creates or replaces a tenant's SSO connection; a bad field is refused (422) and nothing
/// changes.
#[utoipa::path(put, path = "/api/v1/tenants/{id}/sso", tag = "tenants",
    params(("id" = i64, Path, description = "The tenant's id")),
    request_body = NewSso,
    responses((status = 200, body = SsoBody)))]
pub(super) async fn set_sso(
    TokenCaller(platform, caller): TokenCaller,
    Path(tenant): Path<i64>,
    Body(asked): Body<NewSso>,
) -> Result<Json<SsoBody>, ApiError> {
    // The platform reads the page's text forms: a name that would break them is refused here.
    let bad_group = |g: &String| g.contains(['=', '\n', '\r']) || g.trim_start().starts_with('#');
    let bad_domain = |d: &String| d.contains([' ', ',', '\n', '\r']);
    if asked.group_roles.keys().any(bad_group) || asked.allowed_domains.iter().any(bad_domain) {
        let refusal = Refusal::InvalidSso(
            "a group name may not hold = or a line break, or start with #; an email domain is one word, like example.com",
        );
        return Err(fail(&caller)(Error::from(refusal)));
    }
    let settings = SsoSettings {
        display_name: asked.display_name,
        issuer: asked.issuer,
        client_id: asked.client_id,
        client_secret: asked.client_secret,
        groups_claim: asked.groups_claim,
        allowed_domains: asked.allowed_domains.join(" "),
        group_roles: asked.group_roles.iter().map(|(group, role)| format!("{group} = {role}\n")).collect(),
        enabled: asked.enabled,
        has_secret: false,
        slug: None,
    };
    platform.set_sso(&caller, tenant, &settings).await.map_err(fail(&caller))?;
    Ok(Json(sso_of(&platform, &caller, tenant).await?))
}
