//! Browser sessions (tower-sessions, stored in Berth's SQLite database): who is signed in,
//! since when, and the single sign-on binding. Used by the server functions and by the
//! server's own routes (SSO callbacks, downloads), so there is one rule for both.

use berth_platform::accounts::User;
use berth_platform::{Platform, RequestMeta};
use tower_sessions::Session;

use crate::error::AppError;

const USER_KEY: &str = "user_id";
/// When the session signed in, for the absolute timeout.
const SIGNED_IN_AT_KEY: &str = "signed_in_at";
/// A random value tying an SSO callback to the browser that started the sign-in.
const SSO_BINDING_KEY: &str = "sso_binding";

/// However active a session is, it ends this long after sign-in.
pub const ABSOLUTE_TIMEOUT_MS: i64 = 12 * 60 * 60 * 1000;

fn store_failed(meta: &RequestMeta) -> impl Fn(tower_sessions::session::Error) -> AppError + '_ {
    move |e| AppError::internal(&meta.request_id, "session store failed", e)
}

/// The session's user, if the session is live and the user may still act. A session past
/// its absolute timeout, or of a user who was removed or suspended (or whose tenant was),
/// is ended here.
pub async fn signed_in_user(
    session: &Session,
    platform: &Platform,
    meta: &RequestMeta,
) -> Result<Option<User>, AppError> {
    let Some(id) = session.get::<i64>(USER_KEY).await.map_err(store_failed(meta))? else { return Ok(None) };
    let signed_in_at = session.get::<i64>(SIGNED_IN_AT_KEY).await.map_err(store_failed(meta))?.unwrap_or(0);
    if berth_platform::now_ms() - signed_in_at > ABSOLUTE_TIMEOUT_MS {
        session.flush().await.map_err(store_failed(meta))?;
        return Ok(None);
    }
    match platform.active_user(id).await {
        Ok(user) => Ok(Some(user)),
        Err(berth_platform::Error::NotFound) => {
            session.flush().await.map_err(store_failed(meta))?;
            Ok(None)
        }
        Err(e) => Err(AppError::from_platform(e, &meta.request_id)),
    }
}

/// Starts a fresh session for `user`: a new id (so a planted or stolen pre-login id is
/// worthless), the user and the time of sign-in.
pub async fn start(session: &Session, meta: &RequestMeta, user_id: i64) -> Result<(), AppError> {
    session.cycle_id().await.map_err(store_failed(meta))?;
    session.remove::<String>(SSO_BINDING_KEY).await.map_err(store_failed(meta))?;
    session.insert(USER_KEY, user_id).await.map_err(store_failed(meta))?;
    session.insert(SIGNED_IN_AT_KEY, berth_platform::now_ms()).await.map_err(store_failed(meta))
}

/// Ends the session on the server: its row is deleted, the id is worthless from now on.
pub async fn end(session: &Session, meta: &RequestMeta) -> Result<(), AppError> {
    session.flush().await.map_err(|e| AppError::internal(&meta.request_id, "could not end the session", e))
}

/// A new random binding for an SSO sign-in, kept in this browser's session.
pub async fn new_sso_binding(session: &Session, meta: &RequestMeta) -> Result<String, AppError> {
    let binding = uuid::Uuid::new_v4().simple().to_string() + &uuid::Uuid::new_v4().simple().to_string();
    session.insert(SSO_BINDING_KEY, &binding).await.map_err(store_failed(meta))?;
    Ok(binding)
}

pub async fn sso_binding(session: &Session, meta: &RequestMeta) -> Result<Option<String>, AppError> {
    session.get::<String>(SSO_BINDING_KEY).await.map_err(store_failed(meta))
}
