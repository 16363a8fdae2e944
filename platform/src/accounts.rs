//! Local accounts: the administrator created at first start, and password sign-in.

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString, rand_core::OsRng};
use rand::Rng;
use rand::distr::Alphanumeric;
use sqlx::FromRow;

use crate::audit::{self, Event, Outcome};
use crate::{Error, Platform, RequestMeta, now_ms};

#[derive(Debug, Clone, PartialEq, Eq, FromRow)]
pub struct User {
    pub id: i64,
    pub email: String,
    pub display_name: String,
    pub role: String,
}

impl User {
    pub fn is_admin(&self) -> bool {
        self.role == "platform_admin"
    }
}

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
            "INSERT INTO users (email, display_name, password_hash, role, created_at)
             VALUES (?, 'Administrator', ?, 'platform_admin', ?) RETURNING id",
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
        audit::record(&mut tx, Some(id), &RequestMeta::background(), event).await?;
        tx.commit().await?;
        Ok(Some(BootstrapAdmin { email: ADMIN_EMAIL.into(), password }))
    }

    /// Creates a user who can sign in with a password (for `berth admin` and tests).
    pub async fn create_user(
        &self,
        email: &str,
        display_name: &str,
        password: &str,
        admin: bool,
    ) -> Result<User, Error> {
        let hash = hash_password(password)?;
        let user = sqlx::query_as::<_, User>(
            "INSERT INTO users (email, display_name, password_hash, role, created_at) VALUES (?, ?, ?, ?, ?)
             RETURNING id, email, display_name, role",
        )
        .bind(email.trim())
        .bind(display_name)
        .bind(hash)
        .bind(if admin { "platform_admin" } else { "member" })
        .bind(now_ms())
        .fetch_one(&self.db)
        .await?;
        Ok(user)
    }

    /// Checks an email and password; both outcomes are audited, and a failure says
    /// nothing about which part was wrong.
    pub async fn sign_in(&self, email: &str, password: &str, meta: &RequestMeta) -> Result<User, Error> {
        let row: Option<(i64, String, String, String, Option<String>)> =
            sqlx::query_as("SELECT id, email, display_name, role, password_hash FROM users WHERE email = ?")
                .bind(email.trim())
                .fetch_optional(&self.db)
                .await?;
        let hash = row.as_ref().and_then(|r| r.4.clone());
        // Hashing is slow on purpose; keep it off the async workers.
        let password = password.to_owned();
        let ok = tokio::task::spawn_blocking(move || verify_password(&password, hash.as_deref().unwrap_or(DUMMY_HASH)))
            .await
            .map_err(Error::internal)?
            && row.as_ref().is_some_and(|r| r.4.is_some());
        let mut conn = self.db.acquire().await?;
        match row.filter(|_| ok) {
            Some((id, email, display_name, role, _)) => {
                let event =
                    Event { action: "session.sign_in", target: Some(&email), outcome: Outcome::Success, detail: None };
                audit::record(&mut conn, Some(id), meta, event).await?;
                Ok(User { id, email, display_name, role })
            }
            None => {
                let event = Event {
                    action: "session.sign_in",
                    target: Some(email.trim()),
                    outcome: Outcome::Failure,
                    detail: Some("wrong email or password"),
                };
                audit::record(&mut conn, None, meta, event).await?;
                Err(Error::BadCredentials)
            }
        }
    }

    pub async fn record_sign_out(&self, user_id: i64, meta: &RequestMeta) -> Result<(), Error> {
        let mut conn = self.db.acquire().await?;
        let event = Event { action: "session.sign_out", target: None, outcome: Outcome::Success, detail: None };
        audit::record(&mut conn, Some(user_id), meta, event).await
    }

    pub async fn user(&self, id: i64) -> Result<User, Error> {
        sqlx::query_as::<_, User>("SELECT id, email, display_name, role FROM users WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.db)
            .await?
            .ok_or(Error::NotFound)
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
