//! Personal API tokens: `Authorization: Bearer berth_…` on the JSON API.
//!
//! The secret is shown once at creation and only its SHA-256 is kept (the secret is 256
//! random bits, so a plain hash is as strong as a slow one). A token carries a subset of its
//! owner's permissions and never more than the owner has at the moment of use; revoking
//! it, or removing or suspending its owner, stops it at once.

use berth_domain::policy::{Action, Principal, Reach, Target};
use berth_domain::tenancy;
use sqlx::Row;

use crate::audit::{self, Actor, Event, Outcome};
use crate::people::{USER_COLUMNS, USER_IS_ACTIVE, user_from_row};
use crate::{Caller, Error, Platform, RequestMeta, now_ms, random_secret, sha256_hex};

/// What the token list shows; never the secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    pub id: i64,
    pub owner_email: String,
    pub name: String,
    pub actions: Vec<Action>,
    pub created_at: i64,
    pub expires_at: i64,
    pub revoked_at: Option<i64>,
    pub last_used_at: Option<i64>,
}

/// The prefix that makes a leaked token easy to recognise (and to scan for).
pub const TOKEN_PREFIX: &str = "berth_";

const DAY_MS: i64 = 24 * 60 * 60 * 1000;

const TOKEN_COLUMNS: &str = "t.id, u.email, t.name, t.actions, t.created_at, t.expires_at, t.revoked_at, t.last_used_at, t.user_id, u.tenant_id";

fn token_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<TokenInfo, Error> {
    let actions: String = row.try_get("actions")?;
    Ok(TokenInfo {
        id: row.try_get("id")?,
        owner_email: row.try_get("email")?,
        name: row.try_get("name")?,
        actions: actions.split_whitespace().filter_map(Action::parse).collect(),
        created_at: row.try_get("created_at")?,
        expires_at: row.try_get("expires_at")?,
        revoked_at: row.try_get("revoked_at")?,
        last_used_at: row.try_get("last_used_at")?,
    })
}

impl Platform {
    /// Creates a token for the caller; returns it with its secret, which is not kept.
    /// Tokens cannot make tokens: that needs a signed-in person.
    pub async fn create_token(
        &self,
        caller: &Caller,
        name: &str,
        days: &str,
        actions: &[String],
    ) -> Result<(TokenInfo, String), Error> {
        let own = Target::Owned { tenant_id: caller.tenant_id(), owner_id: caller.user_id() };
        if caller.principal.token_actions.is_some() {
            let mut conn = self.db.acquire().await?;
            let event =
                Event { action: "token.create", target: None, outcome: Outcome::Denied, detail: Some("by a token") };
            audit::record(&mut conn, &caller.actor(), event).await?;
            return Err(Error::Forbidden);
        }
        self.authorize(caller, Action::TokenManage, own).await?;
        let request = tenancy::validate_token_request(caller.principal.role, name, days, actions)?;
        let secret = format!("{TOKEN_PREFIX}{}", random_secret());
        let now = now_ms();
        let actions: Vec<&str> = request.actions.iter().map(|a| a.as_str()).collect();
        let mut tx = self.begin_write().await?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO api_tokens (user_id, name, secret_hash, actions, created_at, expires_at)
             VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
        )
        .bind(caller.user_id())
        .bind(&request.name)
        .bind(sha256_hex(&secret))
        .bind(actions.join(" "))
        .bind(now)
        .bind(now + request.days * DAY_MS)
        .fetch_one(&mut *tx)
        .await?;
        let detail = format!("{} days; {}", request.days, actions.join(" "));
        let event = Event {
            action: "token.create",
            target: Some(&request.name),
            outcome: Outcome::Success,
            detail: Some(&detail),
        };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        let token = self.tokens_where("t.id = ?", &[id]).await?.into_iter().next().ok_or(Error::NotFound)?;
        Ok((token, secret))
    }

    /// The caller's own tokens, newest first.
    pub async fn my_tokens(&self, caller: &Caller) -> Result<Vec<TokenInfo>, Error> {
        let own = Target::Owned { tenant_id: caller.tenant_id(), owner_id: caller.user_id() };
        self.authorize(caller, Action::TokenRead, own).await?;
        self.tokens_where("t.user_id = ?", &[caller.user_id()]).await
    }

    /// Every token of a tenant's members, for its tenant admins (and platform staff). Those
    /// whose reach is their own tokens (members, viewers) get only theirs, as in every listing.
    pub async fn tenant_tokens(&self, caller: &Caller, tenant_id: i64) -> Result<Vec<TokenInfo>, Error> {
        self.authorize_object_in(caller, Action::TokenRead, tenant_id).await?;
        match caller.principal.reach(Action::TokenRead) {
            Some(Reach::Own) => {
                self.tokens_where("u.tenant_id = ? AND t.user_id = ?", &[tenant_id, caller.user_id()]).await
            }
            _ => self.tokens_where("u.tenant_id = ?", &[tenant_id]).await,
        }
    }

    async fn tokens_where(&self, condition: &str, values: &[i64]) -> Result<Vec<TokenInfo>, Error> {
        let sql = format!(
            "SELECT {TOKEN_COLUMNS} FROM api_tokens t JOIN users u ON u.id = t.user_id WHERE {condition}
             ORDER BY t.created_at DESC, t.id DESC LIMIT 500"
        );
        let query = values.iter().fold(sqlx::query(&sql), |query, value| query.bind(value));
        let rows = query.fetch_all(&self.db).await?;
        rows.iter().map(token_from_row).collect()
    }

    /// Revokes a token at once: the owner's own, or any of the tenant's for its admins.
    pub async fn revoke_token(&self, caller: &Caller, id: i64) -> Result<(), Error> {
        let owner: Option<(i64, Option<i64>, String)> = sqlx::query_as(
            "SELECT t.user_id, u.tenant_id, t.name FROM api_tokens t JOIN users u ON u.id = t.user_id WHERE t.id = ?",
        )
        .bind(id)
        .fetch_optional(&self.db)
        .await?;
        let (owner_id, tenant_id, name) = owner.ok_or(Error::NotFound)?;
        self.authorize(caller, Action::TokenManage, Target::Owned { tenant_id, owner_id }).await?;
        let mut tx = self.begin_write().await?;
        sqlx::query("UPDATE api_tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL")
            .bind(now_ms())
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let event = Event { action: "token.revoke", target: Some(&name), outcome: Outcome::Success, detail: None };
        audit::record(&mut tx, &Actor { tenant_id, ..caller.actor() }, event).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The caller a bearer token stands for, if it is valid now: not revoked, not expired,
    /// and its owner still active. Anything else is `Unauthenticated`, and audited.
    pub async fn caller_from_token(&self, secret: &str, meta: RequestMeta) -> Result<Caller, Error> {
        let now = now_ms();
        let row = sqlx::query(&format!(
            "SELECT {USER_COLUMNS}, t.id AS token_id, t.actions, t.last_used_at FROM api_tokens t JOIN users u ON u.id = t.user_id
             WHERE t.secret_hash = ? AND t.revoked_at IS NULL AND t.expires_at > ? AND {USER_IS_ACTIVE}"
        ))
        .bind(sha256_hex(secret.trim()))
        .bind(now)
        .fetch_optional(&self.db)
        .await?;
        let Some(row) = row else {
            let mut conn = self.db.acquire().await?;
            let event = Event {
                action: "token.use",
                target: None,
                outcome: Outcome::Failure,
                detail: Some("unknown, expired or revoked token"),
            };
            audit::record(&mut conn, &Actor { user_id: None, tenant_id: None, meta: &meta }, event).await?;
            return Err(Error::Unauthenticated);
        };
        let user = user_from_row(&row)?;
        let actions: String = row.try_get("actions")?;
        let token_id: i64 = row.try_get("token_id")?;
        let last_used: Option<i64> = row.try_get("last_used_at")?;
        // Once a minute is precise enough, and spares a write per request.
        if last_used.is_none_or(|at| now - at > 60_000) {
            sqlx::query("UPDATE api_tokens SET last_used_at = ? WHERE id = ?")
                .bind(now)
                .bind(token_id)
                .execute(&self.db)
                .await?;
        }
        let principal = Principal {
            token_actions: Some(actions.split_whitespace().filter_map(Action::parse).collect()),
            ..user.principal()
        };
        Ok(Caller { principal, meta })
    }
}
