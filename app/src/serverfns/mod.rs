//! Server functions, one file per area. Each one authenticates, makes one call into the
//! platform and maps the answer to a view type.

mod admin;
mod calendar;
mod catalog;
mod environments;
mod session;

pub use admin::*;
pub use calendar::*;
pub use catalog::*;
pub use environments::*;
pub use session::*;

#[cfg(feature = "ssr")]
pub(crate) mod ssr {
    use berth_platform::accounts::User;
    use berth_platform::{Caller, Platform, RequestMeta};
    use tower_sessions::Session;

    use crate::error::AppError;

    pub const USER_KEY: &str = "user_id";

    /// Where the request came from: the id the server gave it, and the peer address.
    pub async fn request_meta() -> RequestMeta {
        let headers: http::HeaderMap = leptos_axum::extract().await.unwrap_or_default();
        let request_id = headers.get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("unknown").to_owned();
        let peer: Option<axum::extract::ConnectInfo<std::net::SocketAddr>> = leptos_axum::extract().await.ok();
        RequestMeta { request_id, source: peer.map(|p| p.0.ip().to_string()) }
    }

    pub fn platform(meta: &RequestMeta) -> Result<Platform, AppError> {
        leptos::prelude::use_context::<Platform>()
            .ok_or_else(|| AppError::internal(&meta.request_id, "server function context", "no platform in context"))
    }

    pub async fn session(meta: &RequestMeta) -> Result<Session, AppError> {
        leptos_axum::extract::<Session>().await.map_err(|e| AppError::internal(&meta.request_id, "no session layer", e))
    }

    /// When the session signed in, for the absolute timeout.
    pub const SIGNED_IN_AT_KEY: &str = "signed_in_at";

    /// However active a session is, it ends this long after sign-in.
    pub const ABSOLUTE_TIMEOUT_MS: i64 = 12 * 60 * 60 * 1000;

    /// The signed-in caller, or `Unauthenticated`. A session past its absolute timeout is
    /// ended here; a removed or suspended user (or one of a suspended tenant) is no longer
    /// anyone, so their sessions stop at once.
    pub async fn caller() -> Result<(Platform, Caller), AppError> {
        let meta = request_meta().await;
        let platform = platform(&meta)?;
        let user = signed_in_user(&platform, &meta).await?.ok_or(AppError::Unauthenticated)?;
        Ok((platform, user.caller(meta)))
    }

    /// The session's user, if the session is live and the user may still act.
    pub async fn signed_in_user(platform: &Platform, meta: &RequestMeta) -> Result<Option<User>, AppError> {
        let session = session(meta).await?;
        let failed = |e| AppError::internal(&meta.request_id, "session store failed", e);
        let Some(id) = session.get::<i64>(USER_KEY).await.map_err(failed)? else { return Ok(None) };
        let signed_in_at = session.get::<i64>(SIGNED_IN_AT_KEY).await.map_err(failed)?.unwrap_or(0);
        if berth_platform::now_ms() - signed_in_at > ABSOLUTE_TIMEOUT_MS {
            session.flush().await.map_err(failed)?;
            return Ok(None);
        }
        match platform.active_user(id).await {
            Ok(user) => Ok(Some(user)),
            Err(berth_platform::Error::NotFound) => {
                session.flush().await.map_err(failed)?;
                Ok(None)
            }
            Err(e) => Err(AppError::from_platform(e, &meta.request_id)),
        }
    }

    /// Starts a fresh session for `user`: a new id (so a planted id is worthless), the
    /// user and the time of sign-in.
    pub async fn start_session(meta: &RequestMeta, user_id: i64) -> Result<(), AppError> {
        let session = session(meta).await?;
        let stored = async {
            session.cycle_id().await?;
            session.insert(USER_KEY, user_id).await?;
            session.insert(SIGNED_IN_AT_KEY, berth_platform::now_ms()).await
        };
        stored.await.map_err(|e| AppError::internal(&meta.request_id, "could not store the session", e))
    }
}
