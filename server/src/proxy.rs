//! Berth's authenticating proxy: `/env/<id>/...` on the portal's own origin reaches the
//! environment's notebook or inference endpoint, plain HTTP and WebSockets (JupyterLab's
//! kernels) alike, streamed both ways.
//!
//! - A notebook opens with the Berth session of its owner or their tenant admin. Anyone
//!   else gets the same 404 as for an id that names nothing; a signed-out browser is sent
//!   to sign in and brought back. Berth's session cookie never reaches the notebook, and
//!   the notebook cannot set it.
//! - An inference endpoint answers requests carrying its API key
//!   (`Authorization: Bearer <key>`), 401 otherwise; the key stays with Berth too.
//!
//! The decisions are the platform's (`berth_platform::connect`); this module moves bytes.
//! One caveat of serving on the portal's origin: a notebook's page runs with the Berth
//! session of whoever opened it. A deployment that lets tenant admins open members'
//! notebooks should give environments an origin of their own (as JupyterHub's
//! `subdomain_host` does); see the README.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::any;
use berth_app::error::AppError;
use berth_domain::Refusal;
use berth_platform::backend::{Upstream, proxy_prefix};
use berth_platform::{Error, RequestMeta};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::{Method, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tower_sessions::Session;

use crate::api::request_meta;
use crate::http::AppState;

/// The proxy's routes, for the authorization matrix (which fails on a route it does not list).
pub const ROUTES: &[&str] = &["/env/{id}", "/env/{id}/", "/env/{id}/{*rest}"];

/// What the proxy keeps: its HTTP client and what it must not let through.
pub struct Proxy {
    client: Client<HttpConnector, Body>,
    /// Berth's session cookie: taken off forwarded requests, refused from responses.
    session_cookie: String,
    /// Users reach Berth over TLS (for `X-Forwarded-Proto`).
    tls: bool,
}

impl Proxy {
    pub fn new(session_cookie: &str, tls: bool) -> Proxy {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(10)));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(connector);
        Proxy { client, session_cookie: session_cookie.to_owned(), tls }
    }
}

pub fn routes() -> Router<AppState> {
    Router::new()
        .route(
            ROUTES[0],
            any(|State(state): State<AppState>, Path(id): Path<String>, session: Session, request: Request| {
                proxy(state, id, session, request)
            }),
        )
        .route(
            ROUTES[1],
            any(|State(state): State<AppState>, Path(id): Path<String>, session: Session, request: Request| {
                proxy(state, id, session, request)
            }),
        )
        .route(
            ROUTES[2],
            any(
                |State(state): State<AppState>,
                 Path((id, _)): Path<(String, String)>,
                 session: Session,
                 request: Request| { proxy(state, id, session, request) },
            ),
        )
}

/// How the request is let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// A Berth session: a notebook.
    Session,
    /// An endpoint's API key.
    Key,
}

async fn proxy(state: AppState, id: String, session: Session, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    let meta = request_meta(&parts);
    let platform = &state.platform;
    let (granted, via) = match bearer(&parts.headers) {
        Some(key) => (platform.endpoint_upstream(&id, key).await, Via::Key),
        None => {
            let user = match berth_app::session::signed_in_user(&session, platform, &meta).await {
                Ok(Some(user)) => user,
                Ok(None) => return signed_out(&parts),
                Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
            };
            // Cross-site WebSocket hijacking: a page elsewhere may open a socket here with
            // the browser's cookies; only Berth's own pages (and the notebook's) may.
            if is_upgrade(&parts.headers) && !same_origin(&parts.headers) {
                tracing::warn!(request_id = %meta.request_id, environment = %id, "refused a cross-origin WebSocket");
                return (StatusCode::FORBIDDEN, "cross-origin WebSockets are refused").into_response();
            }
            let opening = is_page_load(&parts);
            (platform.notebook_upstream(&user.caller(meta.clone()), &id, opening).await, Via::Session)
        }
    };
    let upstream = match granted {
        Ok(upstream) => upstream,
        Err(error) => return refused(error, &parts, &meta),
    };
    let on_upgrade = parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
    match forward(&state.proxy, &upstream, via, &id, parts, body, on_upgrade).await {
        Ok(response) => response,
        Err(why) => {
            tracing::warn!(request_id = %meta.request_id, environment = %id, error = %why, "the upstream did not answer");
            state.platform.forget_upstream(&id);
            let what = if via == Via::Key { "endpoint" } else { "notebook" };
            (StatusCode::BAD_GATEWAY, format!("the {what} did not answer; try again in a moment")).into_response()
        }
    }
}

/// The API key of `Authorization: Bearer <key>`, if the request carries one.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, key) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
}

/// A browser loading a page (not a script's request): these are sent to sign in, and
/// opening a notebook this way is audited.
fn is_page_load(parts: &Parts) -> bool {
    if parts.method != Method::GET {
        return false;
    }
    match parts.headers.get("sec-fetch-dest").and_then(|v| v.to_str().ok()) {
        Some(dest) => dest == "document",
        None => {
            parts.headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("text/html"))
        }
    }
}

fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("upgrade")))
}

/// No `Origin` (not a browser), or one naming this very host.
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else { return true };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    host.is_some_and(|host| origin.split_once("://").is_some_and(|(_, rest)| rest == host))
}

fn signed_out(parts: &Parts) -> Response {
    if is_page_load(parts) {
        let here = parts.uri.path_and_query().map_or(parts.uri.path(), |p| p.as_str());
        return Redirect::to(&format!("/login?next={}", berth_app::url_encode(here))).into_response();
    }
    (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], "sign in to continue").into_response()
}

/// The answer the same for another's environment and one that does not exist.
const NOT_FOUND: &str = "there is no such environment, or it is not yours to open";

fn refused(error: Error, parts: &Parts, meta: &RequestMeta) -> Response {
    match error {
        Error::NotFound | Error::Forbidden => (StatusCode::NOT_FOUND, NOT_FOUND).into_response(),
        Error::Unauthenticated | Error::Refused(Refusal::ApiKeyRequired) => {
            let message = "this endpoint answers requests with its API key: Authorization: Bearer <key>";
            (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], message).into_response()
        }
        Error::Refused(refusal @ Refusal::NotReady(_)) if is_page_load(parts) => {
            let page = format!(
                "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"5\">\
                 <title>Starting · Berth</title></head><body><p>{refusal}. This page tries again every few seconds.</p></body></html>"
            );
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, "5"), (header::CONTENT_TYPE, "text/html; charset=utf-8")],
                page,
            )
                .into_response()
        }
        Error::Refused(refusal @ Refusal::NotReady(_)) => {
            (StatusCode::SERVICE_UNAVAILABLE, [(header::RETRY_AFTER, "5")], refusal.to_string()).into_response()
        }
        Error::Refused(refusal @ Refusal::WorkloadUnreachable(_)) => {
            (StatusCode::BAD_GATEWAY, refusal.to_string()).into_response()
        }
        other => {
            let error = AppError::from_platform_quiet(other, &meta.request_id);
            let status = match error {
                AppError::Refused(_) => StatusCode::UNPROCESSABLE_ENTITY,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            (status, error.to_string()).into_response()
        }
    }
}

/// Headers that describe one connection, never forwarded (RFC 9110 section 7.6.1).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|t| t.trim().to_ascii_lowercase()).collect::<Vec<_>>())
        .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// The `Cookie` header without Berth's session cookie (other cookies, e.g. Jupyter's
/// `_xsrf`, belong to the notebook).
fn without_cookie(headers: &HeaderMap, name: &str) -> Option<HeaderValue> {
    let kept: Vec<&str> = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|c| !c.is_empty() && c.split_once('=').map_or(*c, |(n, _)| n) != name)
        .collect();
    if kept.is_empty() { None } else { HeaderValue::from_str(&kept.join("; ")).ok() }
}

async fn forward(
    proxy: &Proxy,
    upstream: &Upstream,
    via: Via,
    id: &str,
    parts: Parts,
    body: Body,
    on_upgrade: Option<hyper::upgrade::OnUpgrade>,
) -> Result<Response, String> {
    let path = parts.uri.path();
    let path = if upstream.keeps_prefix {
        path.to_owned()
    } else {
        let rest = path.strip_prefix(&proxy_prefix(id)).unwrap_or_default();
        if rest.is_empty() { "/".to_owned() } else { rest.to_owned() }
    };
    let query = parts.uri.query().map(|q| format!("?{q}")).unwrap_or_default();
    let uri: http::Uri =
        format!("{}{path}{query}", upstream.base_url).parse().map_err(|e| format!("upstream address: {e}"))?;

    let upgrade = on_upgrade.is_some() && is_upgrade(&parts.headers);
    let mut headers = parts.headers.clone();
    let upgrade_to = headers.get(header::UPGRADE).cloned();
    strip_hop_by_hop(&mut headers);
    headers.remove(header::AUTHORIZATION);
    let cookie = match via {
        Via::Session => without_cookie(&parts.headers, &proxy.session_cookie),
        // An endpoint's callers are programs; nothing of theirs but the request goes on.
        Via::Key => None,
    };
    headers.remove(header::COOKIE);
    if let Some(cookie) = cookie {
        headers.insert(header::COOKIE, cookie);
    }
    for (name, value) in &upstream.headers {
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(value)) {
            headers.insert(name, value);
        }
    }
    // The browser's Host stays (Jupyter checks a WebSocket's Origin against it); where the
    // request came from is added for the upstream's logs.
    if let Some(host) = parts.headers.get(header::HOST) {
        headers.insert("x-forwarded-host", host.clone());
    }
    headers.insert("x-forwarded-proto", HeaderValue::from_static(if proxy.tls { "https" } else { "http" }));
    if let Some(peer) = parts.extensions.get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        && let Ok(value) = HeaderValue::from_str(&peer.0.ip().to_string())
    {
        headers.insert("x-forwarded-for", value);
    }
    if upgrade && let Some(to) = upgrade_to {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, to);
    }

    let mut outbound = http::Request::builder().method(parts.method.clone()).uri(uri).version(http::Version::HTTP_11);
    if let Some(h) = outbound.headers_mut() {
        *h = headers;
    }
    let outbound = outbound.body(body).map_err(|e| format!("request: {e}"))?;
    let mut response = proxy.client.request(outbound).await.map_err(|e| e.to_string())?;

    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        let (Some(client_side), true) = (on_upgrade, upgrade) else {
            return Err("the upstream switched protocols unasked".into());
        };
        let upstream_side = hyper::upgrade::on(&mut response);
        tokio::spawn(async move {
            match tokio::try_join!(client_side, upstream_side) {
                Ok((client, upstream)) => {
                    let (mut client, mut upstream) = (TokioIo::new(client), TokioIo::new(upstream));
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                }
                Err(e) => tracing::debug!(error = %e, "a WebSocket upgrade did not complete"),
            }
        });
        let (parts, _) = response.into_parts();
        return Ok(Response::from_parts(parts, Body::empty()));
    }

    let (mut parts, incoming) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let session_cookie = format!("{}=", proxy.session_cookie);
    let set_cookies: Vec<HeaderValue> = parts.headers.get_all(header::SET_COOKIE).iter().cloned().collect();
    parts.headers.remove(header::SET_COOKIE);
    if via == Via::Session {
        // JupyterLab frames its own pages (file viewers); Berth's default would deny that.
        if !parts.headers.contains_key(header::X_FRAME_OPTIONS) {
            parts.headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("SAMEORIGIN"));
        }
        for cookie in set_cookies {
            // The notebook may set its own cookies, never Berth's session.
            if !cookie.to_str().is_ok_and(|c| c.trim_start().starts_with(&session_cookie)) {
                parts.headers.append(header::SET_COOKIE, cookie);
            }
        }
    } else {
        // An API's answers are data: no scripts on Berth's origin, whatever they claim to be.
        parts.headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static("sandbox; default-src 'none'"));
    }
    Ok(Response::from_parts(parts, Body::new(incoming)))
}

/// The proxy state for the router.
pub fn state(session_cookie: &str, tls: bool) -> Arc<Proxy> {
    Arc::new(Proxy::new(session_cookie, tls))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_cookie_is_taken_off_and_the_rest_kept() {
        let mut headers = HeaderMap::new();
        headers.append(header::COOKIE, HeaderValue::from_static("_xsrf=abc; berth_session=secret"));
        headers.append(header::COOKIE, HeaderValue::from_static("theme=dark"));
        assert_eq!(without_cookie(&headers, "berth_session").unwrap(), "_xsrf=abc; theme=dark");
        let mut only = HeaderMap::new();
        only.insert(header::COOKIE, HeaderValue::from_static("berth_session=secret"));
        assert_eq!(without_cookie(&only, "berth_session"), None);
    }

    #[test]
    fn connection_scoped_headers_are_not_forwarded() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, x-secret-hop"));
        headers.insert("x-secret-hop", HeaderValue::from_static("1"));
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
        headers.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 1, "{headers:?}");
    }

    #[test]
    fn only_a_bearer_key_counts_as_one() {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer berth_ep_x"));
        assert_eq!(bearer(&headers), Some("berth_ep_x"));
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("token abc"));
        assert_eq!(bearer(&headers), None);
    }
}
