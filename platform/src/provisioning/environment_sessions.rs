//! Signing in on a notebook's own origin without Berth's session cookie, which stays on the
//! portal's origin.
//!
//! "Open JupyterLab" asks the portal, where the user is signed in, for a **ticket**: random,
//! single-use, about a minute long, bound to that user and that notebook. The browser carries
//! it to the notebook's origin, which redeems it once for an **environment session**: a
//! random id in a cookie of that origin only, bound to the same user and notebook. Only
//! SHA-256 hashes of both are stored. Every proxied request checks the session and that its
//! user may still open the notebook; the database ends sessions when the environment ends,
//! the user is suspended, removed or changes role, or their tenant stops being active
//! (migration 0017), and signing out of Berth ends the user's too.

use berth_domain::Refusal;
use berth_domain::catalog::Offering;
use berth_domain::lifecycle::{Desired, EnvState};
use berth_domain::policy::Action;

use crate::audit::{self, Event, Outcome};
use crate::capacity::environments::Environment;
use crate::people::User;
use crate::{Caller, Error, Platform, now_ms, random_secret, sha256_hex};

/// How long a ticket may take from the portal to the notebook's origin.
pub const TICKET_TTL_MS: i64 = 60_000;
/// How long an environment session lasts: as long as a Berth session at most.
pub const SESSION_TTL_MS: i64 = 12 * 60 * 60 * 1000;

/// A new environment session: the cookie's value (shown to the browser only) and its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEnvironmentSession {
    pub secret: String,
    pub expires_at: i64,
}

impl Platform {
    /// A ticket for the caller to sign in on notebook `id`'s own origin, if they may open it
    /// (its owner or their tenant admin). Audited as opening the notebook; a denial is
    /// audited too and answers `NotFound`, as for an id that names nothing.
    pub async fn open_notebook(&self, caller: &Caller, id: &str) -> Result<String, Error> {
        let env = self.environment_for(caller, id, Action::EnvironmentConnect).await?;
        openable(&env)?;
        let ticket = random_secret();
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        sqlx::query("DELETE FROM environment_tickets WHERE expires_at <= ?").bind(now).execute(&mut *tx).await?;
        sqlx::query(
            "INSERT INTO environment_tickets (ticket_hash, user_id, environment_id, created_at, expires_at)
             VALUES (?, ?, ?, ?, ?)",
        )
        .bind(sha256_hex(&ticket))
        .bind(caller.user_id())
        .bind(id)
        .bind(now)
        .bind(now + TICKET_TTL_MS)
        .execute(&mut *tx)
        .await?;
        let event = Event { action: "environment.open", target: Some(id), outcome: Outcome::Success, detail: None };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        Ok(ticket)
    }

    /// Redeems `ticket` on notebook `id`'s origin for an environment session. The ticket is
    /// gone once tried, whatever the answer. A used, expired or unknown ticket, or one made
    /// for another environment, is `Unauthenticated`; a user who meanwhile lost access gets
    /// `NotFound`, as the portal would answer.
    pub async fn redeem_ticket(
        &self,
        id: &str,
        ticket: &str,
        meta: &crate::RequestMeta,
    ) -> Result<NewEnvironmentSession, Error> {
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        let found: Option<(i64, String, i64)> = sqlx::query_as(
            "DELETE FROM environment_tickets WHERE ticket_hash = ? RETURNING user_id, environment_id, expires_at",
        )
        .bind(sha256_hex(ticket))
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        let Some((user_id, environment_id, expires_at)) = found else { return Err(Error::Unauthenticated) };
        if environment_id != id || expires_at <= now {
            return Err(Error::Unauthenticated);
        }
        let user = self.active_user(user_id).await.map_err(|e| match e {
            Error::NotFound => Error::Unauthenticated,
            other => other,
        })?;
        let env = self.environment_for(&user.caller(meta.clone()), id, Action::EnvironmentConnect).await?;
        openable(&env)?;

        let secret = random_secret();
        let expires_at = now + SESSION_TTL_MS;
        let mut tx = self.begin_write().await?;
        sqlx::query("DELETE FROM environment_sessions WHERE expires_at <= ?").bind(now).execute(&mut *tx).await?;
        sqlx::query(
            "INSERT INTO environment_sessions (secret_hash, user_id, environment_id, created_at, expires_at)
             VALUES (?, ?, ?, ?, ?)",
        )
        .bind(sha256_hex(&secret))
        .bind(user_id)
        .bind(id)
        .bind(now)
        .bind(expires_at)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(NewEnvironmentSession { secret, expires_at })
    }

    /// The user whose session on environment `id`'s origin is one of `secrets` (a browser
    /// may carry several cookies of one name), if it is live and the user may still act.
    /// `Unauthenticated` otherwise, also for a session of another environment. Whether the
    /// user may still open the environment is the proxy's next question.
    pub async fn environment_session_user(&self, id: &str, secrets: &[&str]) -> Result<User, Error> {
        let now = now_ms();
        for secret in secrets {
            let user_id: Option<i64> = sqlx::query_scalar(
                "SELECT user_id FROM environment_sessions WHERE secret_hash = ? AND environment_id = ? AND expires_at > ?",
            )
            .bind(sha256_hex(secret))
            .bind(id)
            .bind(now)
            .fetch_optional(&self.db)
            .await?;
            if let Some(user_id) = user_id {
                return self.active_user(user_id).await.map_err(|e| match e {
                    Error::NotFound => Error::Unauthenticated,
                    other => other,
                });
            }
        }
        Err(Error::Unauthenticated)
    }
}

/// Ends every environment session and ticket of `user_id` (signing out of Berth).
pub(crate) async fn end_for_user(conn: &mut sqlx::SqliteConnection, user_id: i64) -> Result<(), Error> {
    sqlx::query("DELETE FROM environment_sessions WHERE user_id = ?").bind(user_id).execute(&mut *conn).await?;
    sqlx::query("DELETE FROM environment_tickets WHERE user_id = ?").bind(user_id).execute(&mut *conn).await?;
    Ok(())
}

/// A notebook that is or will be running: one that is still starting opens on a page that
/// says so and tries again.
fn openable(env: &Environment) -> Result<(), Error> {
    match env.offering {
        Offering::Notebook => {}
        // An endpoint is called with its API key, never a session.
        Offering::InferenceEndpoint => return Err(Refusal::ApiKeyRequired.into()),
        Offering::TrainingJob | Offering::DedicatedCluster => return Err(Error::NotFound),
    }
    match env.state {
        _ if env.desired == Desired::Released && !env.state.is_final() => Err(Refusal::NotReady("stopping").into()),
        EnvState::Requested | EnvState::Provisioning | EnvState::Ready => Ok(()),
        state => Err(Refusal::NotReady(state.as_str()).into()),
    }
}
