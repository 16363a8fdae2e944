// A form's fields are a server function's arguments; the SSO form has many.
#![allow(clippy::too_many_arguments)]

use leptos::prelude::*;

use crate::error::AppError;
use crate::model::{SignInOptionView, TenantPageView, TenantView};

/// The single sign-on providers a visitor may use. No sign-in needed.
#[server(endpoint = "sign_in_options")]
pub async fn sign_in_options() -> Result<Vec<SignInOptionView>, AppError> {
    let meta = super::ssr::request_meta().await;
    let platform = super::ssr::platform(&meta)?;
    let options = platform.sign_in_options().await.map_err(|e| AppError::from_platform(e, &meta.request_id))?;
    Ok(options.into_iter().map(|o| SignInOptionView { slug: o.slug, name: o.display_name }).collect())
}

/// Every tenant the caller can see.
#[server(endpoint = "tenants_overview")]
pub async fn tenants_overview() -> Result<Vec<TenantView>, AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let tenants = platform.tenants(&caller).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    Ok(tenants.iter().map(view::tenant).collect())
}

/// A new tenant, optionally with the email of its first tenant admin. Platform admins only.
#[server(endpoint = "create_tenant")]
pub async fn create_tenant(slug: String, name: String, isolation: String, first_admin: String) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform
        .create_tenant(&caller, &slug, &name, &isolation, &first_admin)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/admin/tenants");
    Ok(())
}

/// `suspend`, `resume` or `delete` a tenant. Platform admins only.
#[server(endpoint = "change_tenant")]
pub async fn change_tenant(id: i64, change: String) -> Result<(), AppError> {
    use berth_platform::tenancy::tenants::TenantChange;
    let (platform, caller) = super::ssr::caller().await?;
    let change = match change.as_str() {
        "suspend" => TenantChange::Suspend,
        "resume" => TenantChange::Resume,
        "delete" => TenantChange::Delete,
        _ => return Err(AppError::Refused(format!("there is no tenant change called \"{change}\""))),
    };
    platform
        .change_tenant(&caller, id, change)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/admin/tenants");
    Ok(())
}

#[server(endpoint = "set_tenant_isolation")]
pub async fn set_tenant_isolation(id: i64, isolation: String) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform
        .set_tenant_isolation(&caller, id, &isolation)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/admin/tenants?saved=isolation");
    Ok(())
}

/// A tenant's members, projects and SSO connection, as far as the caller may see them.
#[server(endpoint = "tenant_detail")]
pub async fn tenant_detail(id: i64) -> Result<TenantPageView, AppError> {
    use berth_domain::policy::{Action, Target};
    let (platform, caller) = super::ssr::caller().await?;
    let fail = |e| AppError::from_platform(e, &caller.meta.request_id);
    let members = platform.members(&caller, id).await.map_err(fail)?;
    let tenant = platform.tenant_for_members(&caller, id).await.map_err(fail)?;
    let projects = platform.projects(&caller, id).await.map_err(fail)?;
    let may = |action| caller.principal.authorize(action, Target::Tenant(id)).is_ok();
    let sso = if may(Action::SsoRead) { Some(platform.sso_settings(&caller, id).await.map_err(fail)?) } else { None };
    // Everyone may read their own tokens; the tenant's list is for those who reach the tenant.
    let tenant_reach = caller.principal.reach(Action::TokenRead) > Some(berth_domain::policy::Reach::Own);
    let tokens = if tenant_reach && may(Action::TokenRead) {
        let now = berth_platform::now_ms();
        let tokens = platform.tenant_tokens(&caller, id).await.map_err(fail)?;
        Some(tokens.iter().map(|t| super::account::views::token(t, &[], now)).collect())
    } else {
        None
    };
    Ok(TenantPageView {
        tenant: view::tenant(&tenant),
        members: members.iter().map(view::member).collect(),
        projects: projects
            .into_iter()
            .map(|p| crate::model::ProjectView { id: p.id, name: p.name, members: p.members })
            .collect(),
        sso: sso.map(|s| view::sso(s, &platform.sso_callback_url(), platform.public_url())),
        can_manage_members: may(Action::MemberManage),
        can_manage_projects: may(Action::ProjectManage),
        can_manage_sso: may(Action::SsoManage),
        tokens,
        can_manage_tokens: tenant_reach && may(Action::TokenManage),
        can_read_webhooks: may(Action::WebhookRead),
        me: caller.user_id(),
    })
}

#[server(endpoint = "invite_member")]
pub async fn invite_member(tenant_id: i64, email: String, role: String) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform
        .invite_member(&caller, tenant_id, &email, &role)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect(&format!("/tenants/{tenant_id}"));
    Ok(())
}

#[server(endpoint = "change_member_role")]
pub async fn change_member_role(tenant_id: i64, user_id: i64, role: String) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform
        .change_member_role(&caller, tenant_id, user_id, &role)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect(&format!("/tenants/{tenant_id}"));
    Ok(())
}

#[server(endpoint = "remove_member")]
pub async fn remove_member(tenant_id: i64, user_id: i64) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform
        .remove_member(&caller, tenant_id, user_id)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect(&format!("/tenants/{tenant_id}"));
    Ok(())
}

/// Revokes a member's API token from the tenant's page. Tenant admins and platform admins.
#[server(endpoint = "revoke_tenant_token")]
pub async fn revoke_tenant_token(tenant_id: i64, id: i64) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform.revoke_token(&caller, id).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect(&format!("/tenants/{tenant_id}"));
    Ok(())
}

#[server(endpoint = "create_project")]
pub async fn create_project(tenant_id: i64, name: String) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform
        .create_project(&caller, tenant_id, &name)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect(&format!("/tenants/{tenant_id}"));
    Ok(())
}

#[server(endpoint = "add_project_member")]
pub async fn add_project_member(tenant_id: i64, project_id: i64, email: String) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform
        .add_project_member(&caller, tenant_id, project_id, &email)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect(&format!("/tenants/{tenant_id}"));
    Ok(())
}

/// Creates or replaces the tenant's SSO connection. An empty secret keeps the stored one.
#[server(endpoint = "save_sso")]
pub async fn save_sso(
    tenant_id: i64,
    display_name: String,
    issuer: String,
    client_id: String,
    client_secret: String,
    groups_claim: String,
    allowed_domains: String,
    group_roles: String,
    enabled: Option<String>,
) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let settings = berth_platform::identity::sso::SsoSettings {
        display_name,
        issuer,
        client_id,
        client_secret,
        groups_claim,
        allowed_domains,
        group_roles,
        enabled: enabled.is_some(),
        ..Default::default()
    };
    platform
        .set_sso(&caller, tenant_id, &settings)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect(&format!("/tenants/{tenant_id}?saved=sso"));
    Ok(())
}

#[cfg(feature = "ssr")]
mod view {
    use berth_platform::identity::sso::SsoSettings;
    use berth_platform::tenancy::tenants::{Member, Tenant};

    use crate::model::{MemberView, SsoView, TenantView};
    use crate::time::utc;

    pub fn tenant(t: &Tenant) -> TenantView {
        TenantView {
            id: t.id,
            slug: t.slug.clone(),
            name: t.name.clone(),
            isolation: t.isolation.as_str().to_owned(),
            status: t.status.clone(),
            members: t.members,
            active_environments: t.active_environments,
            queue_failure: t.queue_failure.as_ref().map(|f| {
                format!("Its queue and namespace on the cluster are out of date since {}: {}", utc(f.since), f.error)
            }),
        }
    }

    pub fn member(m: &Member) -> MemberView {
        MemberView {
            user_id: m.user_id,
            email: m.email.clone(),
            name: m.display_name.clone(),
            role: m.role.as_str().to_owned(),
            role_label: m.role.label().to_owned(),
            status: m.status.clone(),
            linked: m.linked,
        }
    }

    pub fn sso(s: SsoSettings, redirect_uri: &str, public_url: &str) -> SsoView {
        SsoView {
            sign_in_link: s.slug.as_ref().map(|slug| format!("{public_url}/auth/oidc/{slug}/start")),
            organization: s.slug,
            display_name: s.display_name,
            issuer: s.issuer,
            client_id: s.client_id,
            has_secret: s.has_secret,
            groups_claim: s.groups_claim,
            allowed_domains: s.allowed_domains,
            group_roles: s.group_roles,
            enabled: s.enabled,
            redirect_uri: redirect_uri.to_owned(),
        }
    }
}
