//! Single sign-on: the OpenID providers Berth trusts, the sign-ins in progress, and who a
//! provider's [`Identity`] is in Berth.
//!
//! A tenant's provider signs people into that tenant only; the optional platform-wide one
//! (`tenant_id` NULL) maps groups to platform roles or to a tenant and role. A person is
//! the pair (issuer, subject); an email links them to an invitation only when the provider
//! says it is verified and the tenant allows its domain.

use std::collections::HashMap;

use berth_domain::policy::{Action, Role};
use berth_domain::tenancy::{self, email_in_domains};
use berth_domain::{Refusal, SignInProblem};
use sqlx::{Row, SqliteConnection};

use crate::audit::{self, Actor, Event, Outcome};
use crate::identity::oidc::{Callback, Client, Identity, PendingLogin, ProviderConfig, Reach};
use crate::identity::provider_http::Resolved;
use crate::identity::throttle::Rate;
use crate::people::{USER_COLUMNS, User, user_from_row};
use crate::{Caller, Error, Platform, RequestMeta, now_ms, sha256_hex};

/// A sign-in must come back within this long.
const LOGIN_TTL_MS: i64 = 10 * 60 * 1000;

/// Where providers send the browser back to, under the public URL.
pub const CALLBACK_PATH: &str = "/auth/oidc/callback";

/// A provider as the sign-in page lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignInOption {
    pub slug: String,
    pub display_name: String,
}

/// A tenant's SSO connection as its admin edits it. The client secret is never read back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SsoSettings {
    pub display_name: String,
    pub issuer: String,
    pub client_id: String,
    /// Empty keeps the stored one.
    pub client_secret: String,
    pub groups_claim: String,
    pub allowed_domains: String,
    /// One `group = role` per line.
    pub group_roles: String,
    pub enabled: bool,
    /// Whether a secret is stored (for the form to say so).
    pub has_secret: bool,
    /// `/auth/oidc/<slug>/start`, once configured.
    pub slug: Option<String>,
}

/// The discovered clients, by provider id, with the settings they were made from (an
/// edited provider is discovered again).
pub(crate) type ClientCache = tokio::sync::Mutex<HashMap<i64, (ProviderConfigKey, Client)>>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProviderConfigKey(String);

/// Lookups of a person's provider (by email or organization) allowed per source address
/// per minute: each says whether a domain or name is a customer's.
pub const FINDS_PER_MINUTE: u32 = 30;

/// Single sign-on starts allowed per source address per minute: a person needs a few, and
/// each costs a pending login and may cost a fetch from the provider.
pub const STARTS_PER_MINUTE: u32 = 30;

/// Counts one anonymous request (single sign-on `what`) from the caller's address against
/// `rate`; refused once the address has spent this minute's.
fn take_anonymous(rate: &Rate, meta: &RequestMeta, what: &str) -> Result<(), Error> {
    if rate.take(meta.source.as_deref(), now_ms()) {
        return Ok(());
    }
    tracing::warn!(request_id = %meta.request_id, source = ?meta.source, "too many single sign-on {what}");
    Err(Refusal::TooManyAttempts { minutes: 1 }.into())
}

struct ProviderRow {
    id: i64,
    tenant_id: Option<i64>,
    slug: String,
    issuer: String,
    client_id: String,
    client_secret: Option<String>,
    groups_claim: String,
    allowed_domains: String,
    /// Chosen by the operator, not in the UI: may be on a private address.
    set_by_operator: bool,
}

impl Platform {
    /// The operator's providers, offered to every visitor. A tenant's provider is not
    /// listed: the sign-in page would tell anyone who Berth's customers are. People find
    /// theirs with [`Platform::find_sign_in`].
    pub async fn sign_in_options(&self) -> Result<Vec<SignInOption>, Error> {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT slug, display_name FROM oidc_providers WHERE enabled = 1 AND tenant_id IS NULL ORDER BY display_name",
        )
        .fetch_all(&self.db)
        .await?;
        Ok(rows.into_iter().map(|(slug, display_name)| SignInOption { slug, display_name }).collect())
    }

    /// The provider a person signs in with, found by their work email (the domains its
    /// tenant allows) or by their organization's short name (its slug, as in the link a
    /// tenant admin shares: `/auth/oidc/<slug>/start`). Anyone may ask, so each address may
    /// ask only so many times a minute, and an unknown hint says no more than that.
    pub async fn find_sign_in(&self, hint: &str, meta: &RequestMeta) -> Result<SignInOption, Error> {
        take_anonymous(&self.sign_in_finds, meta, "lookups")?;
        let hint = hint.trim().to_ascii_lowercase();
        let unknown = || Error::Refused(Refusal::SignInFailed(SignInProblem::UnknownOrganization));
        if hint.is_empty() || hint.len() > 254 {
            return Err(unknown());
        }
        let rows: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT p.slug, p.display_name, p.allowed_domains FROM oidc_providers p JOIN tenants t ON t.id = p.tenant_id
             WHERE p.enabled = 1 AND t.status = 'active' ORDER BY p.id",
        )
        .fetch_all(&self.db)
        .await?;
        let found = rows.into_iter().find(|(slug, _, domains)| match hint.rsplit_once('@') {
            // Only a tenant that names its domains is found by email: one that allows any
            // email would be everyone's.
            Some(_) => {
                let domains = tenancy::parse_domains(domains).unwrap_or_default();
                !domains.is_empty() && email_in_domains(&hint, &domains)
            }
            None => *slug == hint,
        });
        found.map(|(slug, display_name, _)| SignInOption { slug, display_name }).ok_or_else(unknown)
    }

    /// Starts a sign-in with provider `slug`: the authorization URL to send the browser to.
    /// `binding` is a random value kept in the browser's session; the callback must bring
    /// the same session back.
    /// Anyone may ask, so each address may start only so many a minute.
    pub async fn begin_sign_in(
        &self,
        slug: &str,
        next: &str,
        binding: &str,
        meta: &RequestMeta,
    ) -> Result<String, Error> {
        take_anonymous(&self.sign_in_starts, meta, "starts")?;
        let provider = self.provider_by("p.slug = ?", slug).await?.ok_or(Error::NotFound)?;
        let client = self.oidc_client(&provider).await?;
        let (url, pending) = client.begin();
        let now = now_ms();
        let mut conn = self.db.acquire().await?;
        sqlx::query("DELETE FROM oidc_logins WHERE created_at < ?")
            .bind(now - LOGIN_TTL_MS)
            .execute(&mut *conn)
            .await?;
        sqlx::query(
            "INSERT INTO oidc_logins (state, provider_id, nonce, pkce_verifier, binding, next, created_at)
             VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&pending.state)
        .bind(provider.id)
        .bind(&pending.nonce)
        .bind(&pending.pkce_verifier)
        .bind(sha256_hex(binding))
        .bind(next)
        .bind(now)
        .execute(&mut *conn)
        .await?;
        Ok(url)
    }

    /// Completes a sign-in from the provider's callback: the user, and where to go next.
    /// The pending login is used up whatever happens, so neither the state nor the code
    /// can be replayed. Every outcome is audited; a failure tells the user only what they
    /// can act on.
    pub async fn finish_sign_in(
        &self,
        callback: &Callback,
        binding: Option<&str>,
        meta: &RequestMeta,
    ) -> Result<(User, String), Error> {
        let result = self.finish_sign_in_inner(callback, binding).await;
        let mut conn = self.db.acquire().await?;
        match &result {
            Ok((user, _, slug)) => {
                let detail = format!("single sign-on with {slug}");
                let event = Event {
                    action: "session.sign_in",
                    target: Some(&user.email),
                    outcome: Outcome::Success,
                    detail: Some(&detail),
                };
                audit::record(&mut conn, &user.caller(meta.clone()).actor(), event).await?;
            }
            Err((why, tenant_id)) => {
                tracing::warn!(request_id = %meta.request_id, reason = %why, "single sign-on refused");
                let detail = format!("single sign-on refused: {why}");
                let event =
                    Event { action: "session.sign_in", target: None, outcome: Outcome::Failure, detail: Some(&detail) };
                audit::record(&mut conn, &Actor { user_id: None, tenant_id: *tenant_id, meta }, event).await?;
            }
        }
        match result {
            Ok((user, next, _)) => Ok((user, next)),
            Err((why, _)) => Err(why.into_error()),
        }
    }

    async fn finish_sign_in_inner(
        &self,
        callback: &Callback,
        binding: Option<&str>,
    ) -> Result<(User, String, String), (SignInFailure, Option<i64>)> {
        let fail = |why: SignInFailure| (why, None);
        let internal = |e: Error| (SignInFailure::Internal(e), None);
        // Single use: whoever deletes the row owns the sign-in.
        let pending: Option<(i64, String, String, String, String, i64)> = sqlx::query_as(
            "DELETE FROM oidc_logins WHERE state = ? RETURNING provider_id, nonce, pkce_verifier, binding, next, created_at",
        )
        .bind(&callback.state)
        .fetch_optional(&self.db)
        .await
        .map_err(|e| internal(e.into()))?;
        let (provider_id, nonce, pkce_verifier, bound_to, next, created_at) =
            pending.ok_or_else(|| fail(SignInFailure::UnknownState))?;
        if now_ms() - created_at > LOGIN_TTL_MS {
            return Err(fail(SignInFailure::UnknownState));
        }
        if binding.map(sha256_hex).as_deref() != Some(bound_to.as_str()) {
            return Err(fail(SignInFailure::OtherBrowser));
        }
        let provider = self
            .provider_by("p.id = ?", &provider_id.to_string())
            .await
            .map_err(internal)?
            .ok_or_else(|| fail(SignInFailure::ProviderGone))?;
        let tenant = provider.tenant_id;
        let client = self.oidc_client(&provider).await.map_err(|e| (SignInFailure::Internal(e), tenant))?;
        let pending = PendingLogin { state: callback.state.clone(), nonce, pkce_verifier };
        let identity =
            client.finish(&pending, callback).await.map_err(|e| (SignInFailure::Protocol(e.to_string()), tenant))?;
        let user = self.user_for_identity(&provider, &identity).await.map_err(|why| (why, tenant))?;
        Ok((user, next, provider.slug))
    }

    /// Who `identity` is in Berth: a known (issuer, subject); else an invitation to the
    /// provider's tenant for the same verified email; else a new account when the groups
    /// give a role. Groups that map to a role update it at every sign-in.
    async fn user_for_identity(&self, provider: &ProviderRow, identity: &Identity) -> Result<User, SignInFailure> {
        let internal = |e: sqlx::Error| SignInFailure::Internal(e.into());
        let domains = tenancy::parse_domains(&provider.allowed_domains).unwrap_or_default();
        if !domains.is_empty() && !identity.email.as_deref().is_some_and(|e| email_in_domains(e, &domains)) {
            return Err(SignInFailure::DomainNotAllowed);
        }
        let mappings: Vec<(String, String, Option<i64>)> =
            sqlx::query_as("SELECT group_name, role, tenant_id FROM oidc_group_roles WHERE provider_id = ?")
                .bind(provider.id)
                .fetch_all(&self.db)
                .await
                .map_err(internal)?;
        // The strongest role any of the person's groups gives (platform roles first).
        let granted = mappings
            .iter()
            .filter(|(group, _, _)| identity.groups.iter().any(|g| g == group))
            .filter_map(|(_, role, tenant)| Some((Role::parse(role)?, *tenant)))
            .min_by_key(|(role, _)| *role);

        let mut tx = self.begin_write().await.map_err(SignInFailure::Internal)?;
        let linked: Option<i64> =
            sqlx::query_scalar("SELECT user_id FROM user_identities WHERE issuer = ? AND subject = ?")
                .bind(&identity.issuer)
                .bind(&identity.subject)
                .fetch_optional(&mut *tx)
                .await
                .map_err(internal)?;
        let user_id = match linked {
            Some(id) => id,
            None => {
                let invited: Option<(i64, Option<i64>)> = match &identity.email {
                    Some(email) => sqlx::query_as(
                        "SELECT u.id, u.tenant_id FROM users u
                         WHERE u.email = ? AND u.status = 'active'
                           AND NOT EXISTS (SELECT 1 FROM user_identities i WHERE i.user_id = u.id)",
                    )
                    .bind(email)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(internal)?,
                    None => None,
                };
                let id = match invited {
                    // An invitation counts only inside the provider's own tenant.
                    Some((id, tenant)) if provider.tenant_id.is_none() || tenant == provider.tenant_id => id,
                    Some(_) => return Err(SignInFailure::WrongTenant),
                    None => {
                        let (role, tenant) = granted.ok_or(SignInFailure::NoRole)?;
                        let tenant = provider.tenant_id.or(tenant);
                        let email = identity.email.clone().ok_or(SignInFailure::NoVerifiedEmail)?;
                        let name = identity.name.clone().unwrap_or_else(|| email.clone());
                        sqlx::query_scalar(
                            "INSERT INTO users (email, display_name, password_hash, role, tenant_id, created_at)
                             VALUES (?, ?, NULL, ?, ?, ?) RETURNING id",
                        )
                        .bind(&email)
                        .bind(&name)
                        .bind(role.as_str())
                        .bind(tenant)
                        .bind(now_ms())
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(|e| match e {
                            sqlx::Error::Database(d) if d.is_unique_violation() => SignInFailure::EmailTaken,
                            e => SignInFailure::Internal(e.into()),
                        })?
                    }
                };
                sqlx::query("INSERT INTO user_identities (issuer, subject, user_id, created_at) VALUES (?, ?, ?, ?)")
                    .bind(&identity.issuer)
                    .bind(&identity.subject)
                    .bind(id)
                    .bind(now_ms())
                    .execute(&mut *tx)
                    .await
                    .map_err(internal)?;
                id
            }
        };
        let row = sqlx::query(&format!("SELECT {USER_COLUMNS}, u.status FROM users u WHERE u.id = ?"))
            .bind(user_id)
            .fetch_one(&mut *tx)
            .await
            .map_err(internal)?;
        let mut user = user_from_row(&row).map_err(SignInFailure::Internal)?;
        let status: String = row.try_get("status").map_err(internal)?;
        if status != "active" {
            return Err(SignInFailure::NotActive);
        }
        // One tenant's provider never signs anyone into another tenant.
        if provider.tenant_id.is_some() && user.tenant_id != provider.tenant_id {
            return Err(SignInFailure::WrongTenant);
        }
        if let Some((role, tenant)) = granted
            && role != user.role
            && (role.is_platform() || provider.tenant_id.is_some() || tenant == user.tenant_id)
        {
            let tenant = if role.is_platform() { None } else { user.tenant_id.or(tenant) };
            sqlx::query("UPDATE users SET role = ?, tenant_id = ? WHERE id = ?")
                .bind(role.as_str())
                .bind(tenant)
                .bind(user.id)
                .execute(&mut *tx)
                .await
                .map_err(internal)?;
            let affected: Vec<i64> = [user.tenant_id, tenant].into_iter().flatten().collect();
            crate::tenancy::tenants::members_changed(&mut tx, &affected).await.map_err(SignInFailure::Internal)?;
            let detail = format!("{} -> {} from the provider's groups", user.role.as_str(), role.as_str());
            let event = Event {
                action: "member.role",
                target: Some(&user.email),
                outcome: Outcome::Success,
                detail: Some(&detail),
            };
            let actor = Actor { user_id: Some(user.id), tenant_id: tenant, meta: &RequestMeta::background() };
            audit::record(&mut tx, &actor, event).await.map_err(SignInFailure::Internal)?;
            user.role = role;
            user.tenant_id = tenant;
        }
        if let Some(tenant) = user.tenant_id {
            let active: bool = sqlx::query_scalar("SELECT status = 'active' FROM tenants WHERE id = ?")
                .bind(tenant)
                .fetch_one(&mut *tx)
                .await
                .map_err(internal)?;
            if !active {
                return Err(SignInFailure::NotActive);
            }
        }
        tx.commit().await.map_err(SignInFailure::Internal)?;
        Ok(user)
    }

    async fn provider_by(&self, condition: &str, value: &str) -> Result<Option<ProviderRow>, Error> {
        let row = sqlx::query(&format!(
            "SELECT p.id, p.tenant_id, p.slug, p.issuer, p.client_id, p.client_secret, p.groups_claim, p.allowed_domains,
                 p.set_by_operator
             FROM oidc_providers p LEFT JOIN tenants t ON t.id = p.tenant_id
             WHERE {condition} AND p.enabled = 1 AND (p.tenant_id IS NULL OR t.status = 'active')"
        ))
        .bind(value)
        .fetch_optional(&self.db)
        .await?;
        row.map(|row| {
            Ok(ProviderRow {
                id: row.try_get("id")?,
                tenant_id: row.try_get("tenant_id")?,
                slug: row.try_get("slug")?,
                issuer: row.try_get("issuer")?,
                client_id: row.try_get("client_id")?,
                client_secret: row.try_get("client_secret")?,
                groups_claim: row.try_get("groups_claim")?,
                allowed_domains: row.try_get("allowed_domains")?,
                set_by_operator: row.try_get("set_by_operator")?,
            })
        })
        .transpose()
    }

    /// The redirect URI to register at a provider.
    pub fn sso_callback_url(&self) -> String {
        format!("{}{CALLBACK_PATH}", self.public_url)
    }

    /// The provider's discovered client, discovering it on first use or after an edit.
    async fn oidc_client(&self, provider: &ProviderRow) -> Result<Client, Error> {
        let config = ProviderConfig {
            issuer: provider.issuer.clone(),
            client_id: provider.client_id.clone(),
            client_secret: provider.client_secret.clone(),
            redirect_url: self.sso_callback_url(),
            groups_claim: provider.groups_claim.clone(),
            // Checked again at every call, not only at save: DNS can change.
            reach: if provider.set_by_operator { Reach::Private } else { self.issuer_reach },
        };
        let key = ProviderConfigKey(format!(
            "{}\n{}\n{}\n{}\n{}\n{:?}",
            config.issuer,
            config.client_id,
            sha256_hex(config.client_secret.as_deref().unwrap_or_default()),
            config.redirect_url,
            config.groups_claim,
            config.reach
        ));
        let mut clients = self.oidc_clients.lock().await;
        if let Some((cached, client)) = clients.get(&provider.id)
            && *cached == key
        {
            return Ok(client.clone());
        }
        let client = Client::discover(config).await.map_err(Error::internal)?;
        clients.insert(provider.id, (key, client.clone()));
        Ok(client)
    }

    /// The tenant's SSO connection, for its admin's form.
    pub async fn sso_settings(&self, caller: &Caller, tenant_id: i64) -> Result<SsoSettings, Error> {
        self.authorize_object_in(caller, Action::SsoRead, tenant_id).await?;
        let row = sqlx::query(
            "SELECT id, slug, display_name, issuer, client_id, client_secret IS NOT NULL AS has_secret, groups_claim,
                    allowed_domains, enabled
             FROM oidc_providers WHERE tenant_id = ?",
        )
        .bind(tenant_id)
        .fetch_optional(&self.db)
        .await?;
        let Some(row) = row else {
            return Ok(SsoSettings { groups_claim: "groups".into(), enabled: true, ..SsoSettings::default() });
        };
        let id: i64 = row.try_get("id")?;
        let mappings: Vec<(String, String)> =
            sqlx::query_as("SELECT group_name, role FROM oidc_group_roles WHERE provider_id = ? ORDER BY group_name")
                .bind(id)
                .fetch_all(&self.db)
                .await?;
        Ok(SsoSettings {
            display_name: row.try_get("display_name")?,
            issuer: row.try_get("issuer")?,
            client_id: row.try_get("client_id")?,
            client_secret: String::new(),
            groups_claim: row.try_get("groups_claim")?,
            allowed_domains: row.try_get("allowed_domains")?,
            group_roles: mappings.iter().map(|(g, r)| format!("{g} = {r}\n")).collect(),
            enabled: row.try_get("enabled")?,
            has_secret: row.try_get("has_secret")?,
            slug: Some(row.try_get("slug")?),
        })
    }

    /// An issuer someone typed in the UI: https, and (unless the operator started Berth with
    /// `--allow-private-issuers`) on a public address, its host's addresses included as
    /// they resolve now. The same rule holds at every later call to the provider.
    async fn tenant_issuer(&self, issuer: &str) -> Result<String, Error> {
        let issuer = tenancy::validate_issuer(issuer, self.issuer_reach)?;
        if self.issuer_reach == Reach::Public {
            let host = url::Url::parse(&issuer).ok().and_then(|u| u.host_str().map(str::to_owned)).unwrap_or_default();
            // A name that does not resolve yet is no danger: it is checked again at each call.
            if let Resolved::Private(address) = crate::identity::provider_http::resolve(&host).await {
                return Err(Refusal::PrivateIssuer(format!("{host} ({address})")).into());
            }
        }
        Ok(issuer)
    }

    /// Creates or replaces the tenant's SSO connection and its group mappings, all at once.
    pub async fn set_sso(&self, caller: &Caller, tenant_id: i64, settings: &SsoSettings) -> Result<(), Error> {
        self.authorize_object_in(caller, Action::SsoManage, tenant_id).await?;
        let display_name = tenancy::validate_display_name(&settings.display_name)?;
        let issuer = self.tenant_issuer(&settings.issuer).await?;
        let client_id = settings.client_id.trim();
        if client_id.is_empty() {
            return Err(Refusal::InvalidSso("the client id is required").into());
        }
        let groups_claim = match settings.groups_claim.trim() {
            "" => "groups",
            claim => claim,
        };
        let domains = tenancy::parse_domains(&settings.allowed_domains)?;
        let mappings = tenancy::parse_group_roles(&settings.group_roles)?;
        let secret = settings.client_secret.trim();
        let mut tx = self.begin_write().await?;
        let slug: String = sqlx::query_scalar("SELECT slug FROM tenants WHERE id = ? AND status <> 'deleted'")
            .bind(tenant_id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(Error::NotFound)?;
        let existing: Option<i64> = sqlx::query_scalar("SELECT id FROM oidc_providers WHERE tenant_id = ?")
            .bind(tenant_id)
            .fetch_optional(&mut *tx)
            .await?;
        let provider_id = match existing {
            Some(id) => {
                sqlx::query(
                    "UPDATE oidc_providers SET display_name = ?, issuer = ?, client_id = ?, set_by_operator = 0,
                         client_secret = CASE WHEN ? = '' THEN client_secret ELSE ? END,
                         groups_claim = ?, allowed_domains = ?, enabled = ? WHERE id = ?",
                )
                .bind(&display_name)
                .bind(&issuer)
                .bind(client_id)
                .bind(secret)
                .bind(secret)
                .bind(groups_claim)
                .bind(domains.join(" "))
                .bind(settings.enabled)
                .bind(id)
                .execute(&mut *tx)
                .await?;
                sqlx::query("DELETE FROM oidc_group_roles WHERE provider_id = ?").bind(id).execute(&mut *tx).await?;
                id
            }
            None => {
                sqlx::query_scalar(
                    "INSERT INTO oidc_providers (tenant_id, slug, display_name, issuer, client_id, client_secret, groups_claim,
                         allowed_domains, enabled, created_at)
                     VALUES (?, ?, ?, ?, ?, NULLIF(?, ''), ?, ?, ?, ?) RETURNING id",
                )
                .bind(tenant_id)
                .bind(&slug)
                .bind(&display_name)
                .bind(&issuer)
                .bind(client_id)
                .bind(secret)
                .bind(groups_claim)
                .bind(domains.join(" "))
                .bind(settings.enabled)
                .bind(now_ms())
                .fetch_one(&mut *tx)
                .await?
            }
        };
        for (group, role) in &mappings {
            insert_mapping(&mut tx, provider_id, group, *role, Some(tenant_id)).await?;
        }
        let detail = format!("issuer {issuer}, client {client_id}, {} group mappings", mappings.len());
        let event =
            Event { action: "sso.configure", target: Some(&slug), outcome: Outcome::Success, detail: Some(&detail) };
        audit::record(&mut tx, &Actor { tenant_id: Some(tenant_id), ..caller.actor() }, event).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The platform-wide provider from the operator's configuration (not the UI): created
    /// or updated at start. `groups` maps a group to a platform role, or to `tenant:role`.
    pub async fn configure_platform_sso(
        &self,
        display_name: &str,
        issuer: &str,
        client_id: &str,
        client_secret: Option<&str>,
        groups: &[(String, String)],
    ) -> Result<(), Error> {
        // The operator's own choice: a provider on the private network is theirs to name.
        let issuer = tenancy::validate_issuer(issuer, Reach::Private)?;
        let mut tx = self.begin_write().await?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO oidc_providers (tenant_id, slug, display_name, issuer, client_id, client_secret, created_at,
                 set_by_operator)
             VALUES (NULL, 'sso', ?, ?, ?, ?, ?, 1)
             ON CONFLICT (slug) DO UPDATE SET display_name = excluded.display_name, issuer = excluded.issuer,
                 client_id = excluded.client_id, client_secret = excluded.client_secret, enabled = 1,
                 set_by_operator = 1
             RETURNING id",
        )
        .bind(display_name)
        .bind(&issuer)
        .bind(client_id)
        .bind(client_secret)
        .bind(now_ms())
        .fetch_one(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM oidc_group_roles WHERE provider_id = ?").bind(id).execute(&mut *tx).await?;
        for (group, target) in groups {
            let (tenant, role) = match target.split_once(':') {
                Some((slug, role)) => {
                    let tenant: i64 = sqlx::query_scalar("SELECT id FROM tenants WHERE slug = ?")
                        .bind(slug.trim())
                        .fetch_optional(&mut *tx)
                        .await?
                        .ok_or(Refusal::InvalidSso("a group maps to a tenant that does not exist"))?;
                    (Some(tenant), tenancy::parse_tenant_role(role)?)
                }
                None => {
                    let role = Role::parse(target.trim()).ok_or_else(|| Refusal::InvalidRole(target.clone()))?;
                    if !role.is_platform() {
                        return Err(Refusal::InvalidSso("tenant roles are written tenant:role").into());
                    }
                    (None, role)
                }
            };
            insert_mapping(&mut tx, id, group, role, tenant).await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

async fn insert_mapping(
    conn: &mut SqliteConnection,
    provider: i64,
    group: &str,
    role: Role,
    tenant: Option<i64>,
) -> Result<(), Error> {
    sqlx::query("INSERT INTO oidc_group_roles (provider_id, group_name, role, tenant_id) VALUES (?, ?, ?, ?)")
        .bind(provider)
        .bind(group)
        .bind(role.as_str())
        .bind(tenant)
        .execute(conn)
        .await?;
    Ok(())
}

/// Why a sign-in was refused: the log gets the detail, the user a sentence to act on.
#[derive(Debug)]
enum SignInFailure {
    UnknownState,
    OtherBrowser,
    ProviderGone,
    Protocol(String),
    DomainNotAllowed,
    NoRole,
    NoVerifiedEmail,
    EmailTaken,
    WrongTenant,
    NotActive,
    Internal(Error),
}

impl std::fmt::Display for SignInFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SignInFailure::UnknownState => f.write_str("unknown, used or expired state"),
            SignInFailure::OtherBrowser => f.write_str("callback from another browser session"),
            SignInFailure::ProviderGone => f.write_str("provider disabled or removed"),
            SignInFailure::Protocol(e) => write!(f, "{e}"),
            SignInFailure::DomainNotAllowed => f.write_str("email domain not allowed"),
            SignInFailure::NoRole => f.write_str("no group mapping and no invitation"),
            SignInFailure::NoVerifiedEmail => f.write_str("no verified email"),
            SignInFailure::EmailTaken => f.write_str("email belongs to another account"),
            SignInFailure::WrongTenant => f.write_str("account belongs to another tenant"),
            SignInFailure::NotActive => f.write_str("account or tenant not active"),
            SignInFailure::Internal(e) => write!(f, "{e}"),
        }
    }
}

impl SignInFailure {
    fn into_error(self) -> Error {
        let say = |problem| Error::Refused(Refusal::SignInFailed(problem));
        match self {
            SignInFailure::UnknownState | SignInFailure::OtherBrowser | SignInFailure::ProviderGone => {
                say(SignInProblem::Expired)
            }
            SignInFailure::Protocol(_) => say(SignInProblem::Unverified),
            SignInFailure::DomainNotAllowed | SignInFailure::NoRole | SignInFailure::NoVerifiedEmail => {
                say(SignInProblem::NoAccess)
            }
            SignInFailure::EmailTaken | SignInFailure::WrongTenant | SignInFailure::NotActive => {
                say(SignInProblem::NotHere)
            }
            SignInFailure::Internal(e) => e,
        }
    }
}
