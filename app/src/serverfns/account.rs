use leptos::prelude::*;

use crate::error::AppError;
use crate::model::{AccountView, NewTokenView};

/// The caller's API tokens, the actions their role can give a token, a secret waiting to
/// be shown after a plain form post created a token, and the caller's SSH keys.
#[server(endpoint = "account")]
pub async fn account() -> Result<AccountView, AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let tokens = platform.my_tokens(&caller).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    let ssh_keys =
        platform.my_ssh_keys(&caller).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    let session = super::ssr::session(&caller.meta).await?;
    let new_token = crate::session::show_new_token(&session, &caller.meta).await?;
    if new_token.is_some()
        && let Some(response) = use_context::<leptos_axum::ResponseOptions>()
    {
        // The page holds a secret: keep it out of the browser's cache and back button.
        response.insert_header(http::header::CACHE_CONTROL, http::HeaderValue::from_static("no-store"));
    }
    let new_token = new_token.map(|t| views::new_token(&t, platform.public_url()));
    let mut view = views::account(&tokens, &ssh_keys, caller.principal.role, new_token, berth_platform::now_ms());
    view.local_account = platform
        .has_password(caller.user_id())
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    Ok(view)
}

/// A local account changes its password, giving the current one.
#[server(endpoint = "change_password")]
pub async fn change_password(current: String, password: String, again: String) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform
        .change_password(&caller, &current, &password, &again)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/account?password=changed");
    Ok(())
}

/// A platform admin clears another local administrator's authenticator; they set up a new
/// one at their next sign-in.
#[server(endpoint = "reset_second_factor")]
pub async fn reset_second_factor(email: String) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform
        .reset_second_factor(&caller, &email)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/account?authenticator=reset");
    Ok(())
}

/// Creates an API token for the caller (no actions chosen: all their role has) and answers
/// its secret, which Berth does not keep. A plain form post cannot carry the answer back,
/// so there the secret waits in the session for the next render of the page.
#[server(endpoint = "create_token")]
pub async fn create_token(
    name: String,
    days: String,
    /// Checkboxes named `actions[]`: sent only when ticked.
    actions: Option<Vec<String>>,
) -> Result<Option<NewTokenView>, AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let (token, secret) = platform
        .create_token(&caller, &name, &days, &actions.unwrap_or_default())
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    let new_token = crate::session::NewToken {
        name: token.name,
        secret,
        created_at: token.created_at,
        expires_at: token.expires_at,
        shown_in: None,
    };
    if crate::error::plain_form_post() {
        let session = super::ssr::session(&caller.meta).await?;
        crate::session::hold_new_token(&session, &caller.meta, &new_token).await?;
        leptos_axum::redirect("/account");
        return Ok(None);
    }
    Ok(Some(views::new_token(&new_token, platform.public_url())))
}

/// Revokes one of the caller's tokens; it stops working at once.
#[server(endpoint = "revoke_token")]
pub async fn revoke_token(id: i64) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform.revoke_token(&caller, id).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/account");
    Ok(())
}

/// Adds an SSH public key (an OpenSSH `.pub` line) to the caller's account; `name` may be
/// empty (the key's comment names it then).
#[server(endpoint = "add_ssh_key")]
pub async fn add_ssh_key(name: String, public_key: String) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform
        .add_ssh_key(&caller, &name, &public_key)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/account");
    Ok(())
}

/// Removes one of the caller's SSH keys; their dedicated clusters' nodes drop it.
#[server(endpoint = "remove_ssh_key")]
pub async fn remove_ssh_key(id: i64) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform.remove_ssh_key(&caller, id).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/account");
    Ok(())
}

#[cfg(feature = "ssr")]
pub(crate) mod views {
    use berth_domain::policy::{Action, Role, reach};
    use berth_domain::tenancy::TOKEN_MAX_DAYS;
    use berth_platform::identity::ssh_keys::SshKeyInfo;
    use berth_platform::identity::tokens::TokenInfo;

    use crate::model::{AccountView, ActionChoice, NewTokenView, SshKeyView, TokenView};
    use crate::session::NewToken;
    use crate::time::utc;

    pub fn account(
        tokens: &[TokenInfo],
        ssh_keys: &[SshKeyInfo],
        role: Role,
        new_token: Option<NewTokenView>,
        now: i64,
    ) -> AccountView {
        let permitted: Vec<Action> = Action::ALL.into_iter().filter(|a| reach(role, *a).is_some()).collect();
        AccountView {
            tokens: tokens.iter().map(|t| token(t, &permitted, now)).collect(),
            actions: permitted
                .iter()
                .map(|a| ActionChoice { name: a.as_str().to_owned(), label: label(*a).to_owned() })
                .collect(),
            new_token,
            max_days: TOKEN_MAX_DAYS,
            ssh_keys: ssh_keys.iter().map(ssh_key).collect(),
            local_account: false,
            resets_authenticators: role == Role::PlatformAdmin,
        }
    }

    pub fn ssh_key(k: &SshKeyInfo) -> SshKeyView {
        let kind = berth_domain::ssh_key::SshKeyAlgorithm::parse(&k.algorithm).map_or("SSH", |a| a.label());
        SshKeyView {
            id: k.id,
            name: k.name.clone(),
            kind: format!("{kind} {}", k.bits),
            fingerprint: k.fingerprint.clone(),
            added: utc(k.created_at),
        }
    }

    pub fn token(t: &TokenInfo, permitted: &[Action], now: i64) -> TokenView {
        let status = match (t.revoked_at, t.expires_at <= now) {
            (Some(_), _) => "revoked",
            (None, true) => "expired",
            (None, false) => "active",
        };
        let everything = !permitted.is_empty() && permitted.iter().all(|a| t.actions.contains(a));
        TokenView {
            id: t.id,
            owner: t.owner_email.clone(),
            name: t.name.clone(),
            actions: if everything {
                "All your role allows".to_owned()
            } else {
                t.actions.iter().map(|a| label(*a)).collect::<Vec<_>>().join(", ")
            },
            action_names: t.actions.iter().map(|a| a.as_str()).collect::<Vec<_>>().join("\n"),
            created: utc(t.created_at),
            expires: utc(t.expires_at),
            last_used: t.last_used_at.map_or_else(|| "never".to_owned(), utc),
            status: status.to_owned(),
        }
    }

    pub fn new_token(t: &NewToken, origin: &str) -> NewTokenView {
        NewTokenView {
            name: t.name.clone(),
            secret: t.secret.clone(),
            expires: utc(t.expires_at),
            example: format!("curl -H \"Authorization: Bearer {}\" {origin}/api/v1/environments", t.secret),
        }
    }

    /// What an action lets a token do, in words. Exhaustive, so a new action needs a label.
    pub fn label(action: Action) -> &'static str {
        match action {
            Action::CatalogRead => "See the catalog",
            Action::CalendarRead => "See availability",
            Action::EnvironmentRead => "See environments",
            Action::EnvironmentLaunch => "Launch environments",
            Action::EnvironmentChange => "Stop environments and change their end",
            Action::EnvironmentConnect => "Open notebooks and see endpoint API keys",
            Action::FleetRead => "See the fleet",
            Action::FleetManage => "Manage the fleet",
            Action::QuotaRead => "See quotas",
            Action::QuotaManage => "Set quotas",
            Action::TenantRead => "See tenants",
            Action::TenantManage => "Manage tenants",
            Action::MemberRead => "See members",
            Action::MemberManage => "Manage members",
            Action::ProjectRead => "See projects",
            Action::ProjectManage => "Manage projects",
            Action::SsoRead => "See single sign-on settings",
            Action::SsoManage => "Manage single sign-on",
            Action::TokenRead => "See API tokens",
            // A token never makes tokens (that needs a signed-in person); it may revoke them.
            Action::TokenManage => "Revoke API tokens",
            Action::AuditRead => "Read the audit log",
            Action::SshKeyRead => "See SSH keys",
            // Adding a key needs a signed-in person, as making a token does.
            Action::SshKeyManage => "Remove SSH keys",
            Action::UsageRead => "See usage, cost and budgets",
            Action::UsageManage => "Set budgets",
            Action::FleetCheck => "Run health checks on nodes",
            Action::VolumeRead => "See volumes",
            Action::VolumeManage => "Create, grow and delete volumes",
            Action::NotificationRead => "Read my notifications",
            Action::NotificationManage => "Mark my notifications read",
            Action::WebhookRead => "See the tenant's webhooks and their delivery log",
            Action::WebhookManage => "Add and remove the tenant's webhooks",
            Action::ImageRead => "See the image catalog",
            Action::ImageManage => "Add and remove catalog images",
            Action::CatalogManage => "Change the rate card",
            Action::StatementRead => "See monthly statements",
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn info(actions: Vec<Action>, revoked_at: Option<i64>, expires_at: i64) -> TokenInfo {
            TokenInfo {
                id: 1,
                owner_email: "ada@acme.example".into(),
                name: "ci".into(),
                actions,
                created_at: 0,
                expires_at,
                revoked_at,
                last_used_at: None,
            }
        }

        #[test]
        fn a_role_offers_only_its_own_actions() {
            let view = account(&[], &[], Role::Viewer, None, 0);
            let names: Vec<&str> = view.actions.iter().map(|a| a.name.as_str()).collect();
            assert!(names.contains(&"environment.read"));
            assert!(!names.contains(&"environment.launch"));
            assert!(!names.contains(&"audit.read"));
            assert_eq!(account(&[], &[], Role::PlatformAdmin, None, 0).actions.len(), Action::ALL.len());
        }

        #[test]
        fn status_and_actions_read_as_words() {
            let member: Vec<Action> = Action::ALL.into_iter().filter(|a| reach(Role::Member, *a).is_some()).collect();
            let all = token(&info(member.clone(), None, 10), &member, 5);
            assert_eq!((all.status.as_str(), all.actions.as_str()), ("active", "All your role allows"));
            assert_eq!(all.last_used, "never");
            let some = token(&info(vec![Action::EnvironmentRead, Action::CatalogRead], None, 10), &member, 10);
            assert_eq!((some.status.as_str(), some.actions.as_str()), ("expired", "See environments, See the catalog"));
            assert_eq!(token(&info(vec![], Some(3), 10), &member, 5).status, "revoked");
        }

        #[test]
        fn the_example_uses_the_secret_and_this_berth() {
            let t = NewToken {
                name: "ci".into(),
                secret: "berth_abc".into(),
                created_at: 0,
                expires_at: 0,
                shown_in: None,
            };
            assert_eq!(
                new_token(&t, "https://berth.example.com").example,
                "curl -H \"Authorization: Bearer berth_abc\" https://berth.example.com/api/v1/environments"
            );
        }
    }
}
