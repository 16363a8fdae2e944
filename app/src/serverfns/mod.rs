//! Server functions, one file per area. Each one authenticates, makes one call into the
//! platform and maps the answer to a view type.

mod account;
mod admin;
mod audit;
mod calendar;
mod catalog;
mod environments;
mod fabric;
mod images;
mod notifications;
mod prices;
mod session;
mod telemetry;
mod tenants;
mod usage;
mod volumes;

pub use account::*;
pub use admin::*;
pub use audit::*;
pub use calendar::*;
pub use catalog::*;
pub use environments::*;
pub use fabric::*;
pub use images::*;
pub use notifications::*;
pub use prices::*;
pub use session::*;
pub use telemetry::*;
pub use tenants::*;
pub use usage::*;
pub use volumes::*;

#[cfg(feature = "ssr")]
pub(crate) mod ssr {
    use berth_platform::people::User;
    use berth_platform::{Caller, Platform, RequestMeta};
    use tower_sessions::Session;

    use crate::error::AppError;

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

    /// The signed-in caller, or `Unauthenticated` (answered 401, not the server functions'
    /// default 500).
    pub async fn caller() -> Result<(Platform, Caller), AppError> {
        let meta = request_meta().await;
        let platform = platform(&meta)?;
        let Some(user) = signed_in_user(&platform, &meta).await? else {
            return Err(AppError::from_platform(berth_platform::Error::Unauthenticated, &meta.request_id));
        };
        Ok((platform, user.caller(meta)))
    }

    /// The session's user, if the session is live and the user may still act.
    pub async fn signed_in_user(platform: &Platform, meta: &RequestMeta) -> Result<Option<User>, AppError> {
        crate::session::signed_in_user(&session(meta).await?, platform, meta).await
    }
}
