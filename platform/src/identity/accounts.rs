//! Local accounts: the administrator created at first start, and password sign-in.

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString, rand_core::OsRng};
use berth_domain::Refusal;
use berth_domain::policy::Role;
use rand::Rng;
use rand::distr::Alphanumeric;
use sqlx::Row;

use crate::audit::{self, Actor, Event, Outcome};
use crate::people::{USER_COLUMNS, USER_IS_ACTIVE, User, user_from_row};
use crate::{Caller, Error, Platform, RequestMeta, now_ms};

/// The administrator account made at first start; the password is shown once and kept
/// only as a hash.
pub struct BootstrapAdmin {
    pub email: String,
    pub password: String,
}

pub const ADMIN_EMAIL: &str = "admin@berth.local";

/// Checked even for unknown emails, so a wrong email takes as long as a wrong password.
const DUMMY_HASH: &str =
    "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHRzb21lc2FsdA$2tHjCUVgGA1PIlXJIVbV8Vtf6q7Ht+jd5Z2b6L9rjBs";

fn hash_password(password: &str) -> Result<String, Error> {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| Error::internal(e.to_string()))
}

fn verify_password(password: &str, hash: &str) -> bool {
    PasswordHash::new(hash).is_ok_and(|parsed| Argon2::default().verify_password(password.as_bytes(), &parsed).is_ok())
}

impl Platform {
    /// Creates the administrator when the database has no users yet; returns its one-time
    /// password then, and `None` on every later start.
    pub async fn bootstrap_admin(&self) -> Result<Option<BootstrapAdmin>, Error> {
        let mut tx = self.begin_write().await?;
        let users: i64 = sqlx::query_scalar("SELECT count(*) FROM users WHERE password_hash IS NOT NULL")
            .fetch_one(&mut *tx)
            .await?;
        if users > 0 {
            return Ok(None);
        }
        let password: String = rand::rng().sample_iter(&Alphanumeric).take(20).map(char::from).collect();
        let hash = hash_password(&password)?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO users (email, display_name, password_hash, role, created_at, password_must_change)
             VALUES (?, 'Administrator', ?, 'platform_admin', ?, 1) RETURNING id",
        )
        .bind(ADMIN_EMAIL)
        .bind(hash)
        .bind(now_ms())
        .fetch_one(&mut *tx)
        .await?;
        let event = Event {
            action: "user.create",
            target: Some(ADMIN_EMAIL),
            outcome: Outcome::Success,
            detail: Some("first-start administrator"),
        };
        let actor = Actor { user_id: Some(id), tenant_id: None, meta: &RequestMeta::background() };
        audit::record(&mut tx, &actor, event).await?;
        tx.commit().await?;
        Ok(Some(BootstrapAdmin { email: ADMIN_EMAIL.into(), password }))
    }

    /// Creates a user who can sign in with a password (for `berth admin` and tests).
    /// Platform roles take no tenant; tenant roles need one, whose namespace bindings then
    /// follow (see `tenant_queues`).
    pub async fn create_user(
        &self,
        email: &str,
        display_name: &str,
        password: &str,
        role: Role,
        tenant_id: Option<i64>,
    ) -> Result<User, Error> {
        let hash = hash_password(password)?;
        let mut tx = self.begin_write().await?;
        let row = sqlx::query(
            "INSERT INTO users AS u (email, display_name, password_hash, role, tenant_id, created_at)
             VALUES (?, ?, ?, ?, ?, ?)
             RETURNING id, email, display_name, role, tenant_id, (SELECT name FROM tenants WHERE id = tenant_id) AS tenant_name",
        )
        .bind(email.trim())
        .bind(display_name)
        .bind(hash)
        .bind(role.as_str())
        .bind(tenant_id)
        .bind(now_ms())
        .fetch_one(&mut *tx)
        .await?;
        let user = user_from_row(&row)?;
        if let Some(tenant_id) = tenant_id {
            crate::tenancy::tenants::members_changed(&mut tx, &[tenant_id]).await?;
        }
        tx.commit().await?;
        Ok(user)
    }

    /// Checks an email and password; both outcomes are audited, and a failure says
    /// nothing about which part was wrong (nor whether the account is suspended).
    pub async fn sign_in(&self, email: &str, password: &str, meta: &RequestMeta) -> Result<User, Error> {
        let source = meta.source.as_deref();
        if !self.throttle.allows(email, source, now_ms()) {
            let mut conn = self.db.acquire().await?;
            let event = Event {
                action: "session.sign_in",
                target: Some(email.trim()),
                outcome: Outcome::Denied,
                detail: Some("too many failed attempts: locked for a while"),
            };
            audit::record(&mut conn, &Actor { user_id: None, tenant_id: None, meta }, event).await?;
            return Err(Refusal::TooManyAttempts { minutes: crate::identity::throttle::WINDOW_MS / 60_000 }.into());
        }
        let row = sqlx::query(&format!(
            "SELECT {USER_COLUMNS}, u.password_hash, {USER_IS_ACTIVE} AS active FROM users u WHERE u.email = ?"
        ))
        .bind(email.trim())
        .fetch_optional(&self.db)
        .await?;
        let hash: Option<String> = row.as_ref().map(|r| r.try_get("password_hash")).transpose()?.flatten();
        let active = row.as_ref().map(|r| r.try_get::<bool, _>("active")).transpose()?.unwrap_or(false);
        // Hashing is slow on purpose; keep it off the async workers.
        let password = password.to_owned();
        let known_hash = hash.is_some();
        let ok = tokio::task::spawn_blocking(move || verify_password(&password, hash.as_deref().unwrap_or(DUMMY_HASH)))
            .await
            .map_err(Error::internal)?
            && known_hash
            && active;
        let user = row.as_ref().map(user_from_row).transpose()?;
        let mut conn = self.db.acquire().await?;
        match user.filter(|_| ok) {
            Some(user) => {
                // With a second factor to come, the sign-in is not done yet.
                let (action, detail) = if self.needs_second_factor(&user) {
                    ("session.password", Some("one-time code next"))
                } else {
                    self.throttle.succeeded(email, source);
                    ("session.sign_in", None)
                };
                let event = Event { action, target: Some(&user.email), outcome: Outcome::Success, detail };
                audit::record(&mut conn, &user.caller(meta.clone()).actor(), event).await?;
                Ok(user)
            }
            None => {
                self.throttle.failed(email, source, now_ms());
                let event = Event {
                    action: "session.sign_in",
                    target: Some(email.trim()),
                    outcome: Outcome::Failure,
                    detail: Some("wrong email or password, or account not active"),
                };
                audit::record(&mut conn, &Actor { user_id: None, tenant_id: None, meta }, event).await?;
                Err(Error::BadCredentials)
            }
        }
    }

    /// Records a sign-out and ends the user's sessions on environments' origins, which the
    /// portal's session cookie does not reach.
    pub async fn record_sign_out(&self, caller: &Caller) -> Result<(), Error> {
        let mut tx = self.begin_write().await?;
        crate::provisioning::environment_sessions::end_for_user(&mut tx, caller.user_id()).await?;
        let event = Event { action: "session.sign_out", target: None, outcome: Outcome::Success, detail: None };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Whether `user_id` is a local account (signs in with a password here).
    pub async fn has_password(&self, user_id: i64) -> Result<bool, Error> {
        let has: Option<bool> = sqlx::query_scalar("SELECT password_hash IS NOT NULL FROM users WHERE id = ?")
            .bind(user_id)
            .fetch_optional(&self.db)
            .await?;
        Ok(has.unwrap_or(false))
    }

    /// Whether `user` signed in with a password that is not theirs to keep (the first-start
    /// administrator's, printed in the log) and must choose another before anything else.
    pub async fn must_change_password(&self, user: &User) -> Result<bool, Error> {
        let must: Option<bool> = sqlx::query_scalar("SELECT password_must_change FROM users WHERE id = ?")
            .bind(user.id)
            .fetch_optional(&self.db)
            .await?;
        Ok(must.unwrap_or(false))
    }

    /// The password step of a first sign-in: `user_id` gave the password they must replace
    /// (the caller's session says so), and chooses their own.
    pub async fn replace_first_password(
        &self,
        user_id: i64,
        password: &str,
        again: &str,
        meta: &RequestMeta,
    ) -> Result<User, Error> {
        berth_domain::tenancy::validate_new_password(password, again)?;
        let row = sqlx::query(&format!(
            "SELECT {USER_COLUMNS}, u.password_hash FROM users u
             WHERE u.id = ? AND u.password_must_change = 1 AND {USER_IS_ACTIVE}"
        ))
        .bind(user_id)
        .fetch_optional(&self.db)
        .await?
        .ok_or(Error::Unauthenticated)?;
        let user = user_from_row(&row)?;
        let old: Option<String> = row.try_get("password_hash")?;
        self.store_password(&user, old, password, "first password chosen", meta).await?;
        Ok(user)
    }

    /// A signed-in local account changes its password, giving the current one.
    pub async fn change_password(
        &self,
        caller: &Caller,
        current: &str,
        password: &str,
        again: &str,
    ) -> Result<(), Error> {
        let row = sqlx::query(&format!("SELECT {USER_COLUMNS}, u.password_hash FROM users u WHERE u.id = ?"))
            .bind(caller.user_id())
            .fetch_optional(&self.db)
            .await?
            .ok_or(Error::Unauthenticated)?;
        let user = user_from_row(&row)?;
        let Some(old) = row.try_get::<Option<String>, _>("password_hash")? else {
            return Err(Refusal::NotALocalAccount("you sign in with single sign-on; change your password there").into());
        };
        let source = caller.meta.source.as_deref();
        if !self.throttle.allows(&user.email, source, now_ms()) {
            return Err(Refusal::TooManyAttempts { minutes: crate::identity::throttle::WINDOW_MS / 60_000 }.into());
        }
        berth_domain::tenancy::validate_new_password(password, again)?;
        let (given, hash) = (current.to_owned(), old.clone());
        let right =
            tokio::task::spawn_blocking(move || verify_password(&given, &hash)).await.map_err(Error::internal)?;
        if !right {
            self.throttle.failed(&user.email, source, now_ms());
            let mut conn = self.db.acquire().await?;
            let event = Event {
                action: "user.password",
                target: Some(&user.email),
                outcome: Outcome::Failure,
                detail: Some("wrong current password"),
            };
            audit::record(&mut conn, &caller.actor(), event).await?;
            return Err(Refusal::WrongPassword.into());
        }
        self.store_password(&user, Some(old), password, "password changed", &caller.meta).await
    }

    async fn store_password(
        &self,
        user: &User,
        old: Option<String>,
        password: &str,
        detail: &str,
        meta: &RequestMeta,
    ) -> Result<(), Error> {
        let (new, old_hash) = (password.to_owned(), old);
        let (same, hash) = tokio::task::spawn_blocking(move || {
            let same = old_hash.as_deref().is_some_and(|old| verify_password(&new, old));
            (same, hash_password(&new))
        })
        .await
        .map_err(Error::internal)?;
        if same {
            return Err(Refusal::SamePassword.into());
        }
        let mut tx = self.begin_write().await?;
        sqlx::query("UPDATE users SET password_hash = ?, password_must_change = 0 WHERE id = ?")
            .bind(hash?)
            .bind(user.id)
            .execute(&mut *tx)
            .await?;
        let event = Event {
            action: "user.password",
            target: Some(&user.email),
            outcome: Outcome::Success,
            detail: Some(detail),
        };
        audit::record(&mut tx, &user.caller(meta.clone()).actor(), event).await?;
        tx.commit().await?;
        Ok(())
    }

    /// A platform admin clears another local administrator's authenticator (lost phone):
    /// their next sign-in sets up a new one. Never one's own: that would let a stolen
    /// session drop the second factor.
    pub async fn reset_second_factor(&self, caller: &Caller, email: &str) -> Result<(), Error> {
        if caller.principal.role != Role::PlatformAdmin || caller.principal.token_actions.is_some() {
            return Err(Error::Forbidden);
        }
        let mut tx = self.begin_write().await?;
        let target: Option<(i64, Option<String>)> =
            sqlx::query_as("SELECT id, password_hash FROM users WHERE email = ? AND status = 'active'")
                .bind(email.trim())
                .fetch_optional(&mut *tx)
                .await?;
        let Some((id, hash)) = target else { return Err(Refusal::UnknownUser(email.trim().to_owned()).into()) };
        if id == caller.user_id() {
            return Err(Refusal::NotALocalAccount("ask another platform admin to reset your own authenticator").into());
        }
        if hash.is_none() {
            return Err(Refusal::NotALocalAccount(
                "this person signs in with single sign-on and has no authenticator here",
            )
            .into());
        }
        sqlx::query("UPDATE users SET totp_secret = NULL, totp_last_step = NULL WHERE id = ?")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let event = Event {
            action: "user.second_factor_reset",
            target: Some(email.trim()),
            outcome: Outcome::Success,
            detail: Some("authenticator cleared; set up again at the next sign-in"),
        };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dummy_hash_is_a_valid_argon2id_hash() {
        let parsed = PasswordHash::new(DUMMY_HASH).expect("parses");
        assert_eq!(parsed.algorithm.as_str(), "argon2id");
        assert!(!verify_password("anything", DUMMY_HASH));
    }

    #[test]
    fn hashes_verify_only_their_password() {
        let hash = hash_password("correct horse").expect("hash");
        assert!(hash.starts_with("$argon2id$"));
        assert!(verify_password("correct horse", &hash));
        assert!(!verify_password("correct horsE", &hash));
    }
}
