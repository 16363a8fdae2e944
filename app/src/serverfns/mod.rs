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

    /// The signed-in caller, or `Unauthenticated`.
    pub async fn caller() -> Result<(Platform, Caller), AppError> {
        let meta = request_meta().await;
        let platform = platform(&meta)?;
        let unauthenticated = || AppError::from_platform(berth_platform::Error::Unauthenticated, &meta.request_id);
        let user_id = signed_in_user_id(&meta).await?.ok_or_else(unauthenticated)?;
        let user = match platform.user(user_id).await {
            Ok(user) => user,
            Err(berth_platform::Error::NotFound) => return Err(unauthenticated()),
            Err(e) => return Err(AppError::from_platform(e, &meta.request_id)),
        };
        Ok((platform, Caller { user_id: user.id, is_admin: user.is_admin(), meta }))
    }

    pub async fn signed_in_user_id(meta: &RequestMeta) -> Result<Option<i64>, AppError> {
        let session = session(meta).await?;
        session.get::<i64>(USER_KEY).await.map_err(|e| AppError::internal(&meta.request_id, "session store failed", e))
    }
}
