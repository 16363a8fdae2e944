//! What the portal's handlers share: the router's state, and what Berth knows of a request
//! before it knows who sent it.

use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRef};
use berth_platform::{Platform, RequestMeta};
use http::request::Parts;
use leptos::config::LeptosOptions;

use crate::metrics::HttpMetrics;

#[derive(Clone, FromRef)]
pub struct AppState {
    pub leptos_options: LeptosOptions,
    pub platform: Platform,
    pub metrics: Arc<HttpMetrics>,
}

/// The request id the request-id layer set, and the address the request came from.
pub fn request_meta(parts: &Parts) -> RequestMeta {
    let request_id = parts.headers.get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("unknown").to_owned();
    let source = parts.extensions.get::<ConnectInfo<std::net::SocketAddr>>().map(|c| c.0.ip().to_string());
    RequestMeta { request_id, source }
}

/// `text` safe inside HTML text and quoted attributes, for the few answers written by hand.
pub fn escape_html(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&#39;")
}
