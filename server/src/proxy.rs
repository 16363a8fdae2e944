//! Berth's authenticating proxy. Every notebook and inference endpoint is served on an origin
//! of its own, `<id>.<environments domain>` (the router sends requests there by `Host`),
//! plain HTTP and WebSockets (JupyterLab's kernels) alike, streamed both ways. A notebook's
//! pages run code its owner controls: on its own origin that code cannot use the Berth
//! session of whoever opens it, nor another notebook's cookies.
//!
//! - A notebook opens with a session of its own origin: the portal's "Open JupyterLab"
//!   (`/environments/<id>/open`, owner or their tenant admin) hands the browser a single-use
//!   ticket, redeemed here at [`AUTH_PATH`] for a host-only cookie. Every request checks that
//!   session and that its user may still open the notebook; anyone else gets the same 404
//!   as for an id that names nothing, and a browser without the cookie is sent through the
//!   portal to get one (signing in on the way if need be). Berth's cookies never reach the
//!   notebook, and the notebook cannot set them.
//! - An inference endpoint answers requests carrying its API key
//!   (`Authorization: Bearer <key>`), 401 otherwise; the key stays with Berth, and no
//!   cookie goes either way.
//!
//! The decisions are the platform's (`berth_platform::provisioning::connect`, `environment_sessions`);
//! this module moves bytes.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Extension, Query, Request, State};
use axum::response::{IntoResponse, Redirect, Response};
use berth_app::error::AppError;
use berth_domain::Refusal;
use berth_platform::origins::EnvironmentOrigins;
use berth_platform::provisioning::backend::Upstream;
use berth_platform::provisioning::environment_sessions::SESSION_TTL_MS;
use berth_platform::{Error, Platform, RequestMeta};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::{Method, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Deserialize;

use crate::served::{Routes, any, get};
use crate::state::{escape_html, request_meta};

/// Where an environment's origin redeems a ticket from the portal; never forwarded.
pub const AUTH_PATH: &str = "/_berth/auth";

/// The environment a request's `Host` names; the router puts it on requests it sends here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvironmentHost(pub String);

/// What the proxy keeps: its HTTP client and where environments are served.
pub struct Proxy {
    client: Client<HttpConnector, Body>,
    origins: EnvironmentOrigins,
    /// The cookie holding a browser's session on an environment's origin.
    cookie: &'static str,
}

impl Proxy {
    pub fn new(origins: EnvironmentOrigins) -> Proxy {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(10)));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(connector);
        // `__Host-`: Secure, Path=/ and no Domain, so no other origin (another environment
        // under the same domain) can plant one; plain http on loopback cannot carry it.
        let cookie = if origins.secure() { "__Host-berth_env" } else { "berth_env" };
        Proxy { client, origins, cookie }
    }
}

/// What the proxy's handlers share: an environment's origin knows the platform and the
/// proxy, nothing of the portal's pages or sessions.
#[derive(Clone)]
pub struct ProxyState {
    pub platform: Platform,
    pub proxy: Arc<Proxy>,
}

pub fn routes() -> Routes<ProxyState> {
    Routes::new().route(AUTH_PATH, get(sign_in)).route("/", any(proxy)).route("/{*rest}", any(proxy))
}

/// How the request is let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// A session of the notebook's origin.
    Session,
    /// An endpoint's API key.
    Key,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Ticket {
    ticket: String,
    next: Option<String>,
}

/// Redeems the portal's ticket for a session of this origin, then goes on to `next` (a path
/// on this origin).
async fn sign_in(
    State(state): State<ProxyState>,
    Extension(EnvironmentHost(id)): Extension<EnvironmentHost>,
    Query(query): Query<Ticket>,
    parts: Parts,
) -> Response {
    let meta = request_meta(&parts);
    let proxy = &state.proxy;
    // Before the ticket is spent: a `next` that would leave this origin is refused.
    let next = match berth_domain::redirect::next_or(query.next.as_deref(), "/") {
        Ok(next) => next,
        Err(refusal) => return (StatusCode::BAD_REQUEST, refusal.to_string()).into_response(),
    };
    let mut response = match state.platform.redeem_ticket(&id, &query.ticket, &meta).await {
        Ok(session) => {
            let max_age = (session.expires_at - berth_platform::now_ms()).clamp(0, SESSION_TTL_MS) / 1000;
            let secure = if proxy.origins.secure() { "; Secure" } else { "" };
            let cookie = format!(
                "{}={}; Path=/; HttpOnly; SameSite=Lax; Max-Age={max_age}{secure}",
                proxy.cookie, session.secret
            );
            let mut response = Redirect::to(&next).into_response();
            if let Ok(value) = HeaderValue::from_str(&cookie) {
                response.headers_mut().insert(header::SET_COOKIE, value);
            }
            response
        }
        Err(Error::Unauthenticated) => {
            let again = open_url(&state, &id, &next);
            let page = format!(
                "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Sign-in link used · Berth</title></head>\
                 <body><p>This sign-in link was used already, has expired, or is not for this environment.</p>\
                 <p><a href=\"{}\">Open it again from Berth</a></p></body></html>",
                escape_html(&again)
            );
            (StatusCode::UNAUTHORIZED, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], page).into_response()
        }
        Err(error) => refused(error, &parts, &meta),
    };
    keep_ticket_private(&mut response);
    response
}

/// A response whose URL carries a ticket: kept out of caches and of the next page's
/// Referer.
pub(crate) fn keep_ticket_private(response: &mut Response) {
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
}

/// The portal's route that opens environment `id` at `next`.
fn open_url(state: &ProxyState, id: &str, next: &str) -> String {
    format!("{}/environments/{id}/open?next={}", state.platform.public_url(), berth_app::url_encode(next))
}

async fn proxy(
    State(state): State<ProxyState>,
    Extension(EnvironmentHost(id)): Extension<EnvironmentHost>,
    request: Request,
) -> Response {
    let (mut parts, body) = request.into_parts();
    let meta = request_meta(&parts);
    let platform = &state.platform;
    let (granted, via) = match bearer(&parts.headers) {
        Some(key) => (platform.endpoint_upstream(&id, key).await, Via::Key),
        None => {
            let secrets = cookie_values(&parts.headers, state.proxy.cookie);
            let user = match platform.environment_session_user(&id, &secrets).await {
                Ok(user) => user,
                Err(Error::Unauthenticated) => return signed_out(&state, &id, &parts),
                Err(e) => return refused(e, &parts, &meta),
            };
            // Cross-site WebSocket hijacking: a page elsewhere (another environment too) may
            // open a socket here with the browser's cookies; only this origin's pages may.
            let origin = state.proxy.origins.origin(&id);
            if is_upgrade(&parts.headers) && !from_origin(&parts.headers, &origin) {
                tracing::warn!(request_id = %meta.request_id, environment = %id, "refused a cross-origin WebSocket");
                return (StatusCode::FORBIDDEN, "cross-origin WebSockets are refused").into_response();
            }
            (platform.notebook_upstream(&user.caller(meta.clone()), &id).await, Via::Session)
        }
    };
    let upstream = match granted {
        Ok(upstream) => upstream,
        Err(error) => return refused(error, &parts, &meta),
    };
    // Someone uses it: the idle watcher counts from here (an open notebook tab's own
    // polling counts too, as JupyterHub's culler counts it).
    platform.note_traffic(&id);
    let on_upgrade = parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
    match forward(&state.proxy, &upstream, via, parts, body, on_upgrade).await {
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
pub(crate) fn is_page_load(parts: &Parts) -> bool {
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

/// No `Origin` (not a browser), or exactly `origin`.
fn from_origin(headers: &HeaderMap, origin: &str) -> bool {
    headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()).is_none_or(|given| given.eq_ignore_ascii_case(origin))
}

/// Without this origin's session: a browser loading a page goes through the portal to get
/// one (signing in there if need be); anything else is told to.
fn signed_out(state: &ProxyState, id: &str, parts: &Parts) -> Response {
    if is_page_load(parts) {
        let here = parts.uri.path_and_query().map_or(parts.uri.path(), |p| p.as_str());
        return Redirect::to(&open_url(state, id, here)).into_response();
    }
    let message = "open this notebook from Berth, or call the endpoint with its API key: Authorization: Bearer <key>";
    (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], message).into_response()
}

/// The answer the same for another's environment and one that does not exist.
const NOT_FOUND: &str = "there is no such environment, or it is not yours to open";

/// A platform refusal as the browser or program sees it (the portal's open route too).
pub(crate) fn refused(error: Error, parts: &Parts, meta: &RequestMeta) -> Response {
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
                AppError::Refused(_) | AppError::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
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

/// Whether a cookie name is one of Berth's (the portal's session, an environment's session,
/// any later `berth_…`): those are Berth's alone, whatever prefix they carry.
fn is_berth_cookie(name: &str) -> bool {
    let name = name.trim().to_ascii_lowercase();
    let bare = name.strip_prefix("__host-").or_else(|| name.strip_prefix("__secure-")).unwrap_or(&name);
    bare.starts_with("berth_")
}

/// Every `Cookie` pair of the request, as `(name, value)`.
fn cookie_pairs(headers: &HeaderMap) -> impl Iterator<Item = (&str, &str)> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(|c| c.split_once('=').unwrap_or((c, "")))
}

/// The values of cookie `name` (a browser may send several of one name).
fn cookie_values<'a>(headers: &'a HeaderMap, name: &str) -> Vec<&'a str> {
    cookie_pairs(headers).filter(|(n, _)| *n == name).map(|(_, v)| v).collect()
}

/// The `Cookie` header without Berth's cookies: the rest (e.g. Jupyter's `_xsrf`) belong
/// to the notebook.
fn workload_cookies(headers: &HeaderMap) -> Option<HeaderValue> {
    let kept: Vec<String> =
        cookie_pairs(headers).filter(|(n, _)| !is_berth_cookie(n)).map(|(n, v)| format!("{n}={v}")).collect();
    if kept.is_empty() { None } else { HeaderValue::from_str(&kept.join("; ")).ok() }
}

/// Whether a `Set-Cookie` from the workload names one of Berth's cookies.
fn sets_berth_cookie(set_cookie: &HeaderValue) -> bool {
    let Ok(text) = set_cookie.to_str() else { return true };
    let pair = text.split(';').next().unwrap_or_default();
    is_berth_cookie(pair.split_once('=').map_or(pair, |(n, _)| n))
}

async fn forward(
    proxy: &Proxy,
    upstream: &Upstream,
    via: Via,
    parts: Parts,
    body: Body,
    on_upgrade: Option<hyper::upgrade::OnUpgrade>,
) -> Result<Response, String> {
    // The environment's origin is its own: paths go on as the browser sent them.
    let path = parts.uri.path();
    let query = parts.uri.query().map(|q| format!("?{q}")).unwrap_or_default();
    let uri: http::Uri =
        format!("{}{path}{query}", upstream.base_url).parse().map_err(|e| format!("upstream address: {e}"))?;

    let upgrade = on_upgrade.is_some() && is_upgrade(&parts.headers);
    let mut headers = parts.headers.clone();
    let upgrade_to = headers.get(header::UPGRADE).cloned();
    strip_hop_by_hop(&mut headers);
    headers.remove(header::AUTHORIZATION);
    let cookie = match via {
        Via::Session => workload_cookies(&parts.headers),
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
    headers
        .insert("x-forwarded-proto", HeaderValue::from_static(if proxy.origins.secure() { "https" } else { "http" }));
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
    let set_cookies: Vec<HeaderValue> = parts.headers.get_all(header::SET_COOKIE).iter().cloned().collect();
    parts.headers.remove(header::SET_COOKIE);
    if via == Via::Session {
        // JupyterLab frames its own pages (file viewers); Berth's default would deny that.
        if !parts.headers.contains_key(header::X_FRAME_OPTIONS) {
            parts.headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("SAMEORIGIN"));
        }
        // The notebook's pages are its owner's code on an origin of their own, which Berth's
        // portal policy (no inline scripts but its own) would break; without a policy of
        // the notebook's, only framing by other origins is refused.
        if !parts.headers.contains_key(header::CONTENT_SECURITY_POLICY) {
            parts.headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static("frame-ancestors 'self'"));
        }
        for cookie in set_cookies {
            // The notebook may set its own cookies, never one of Berth's.
            if !sets_berth_cookie(&cookie) {
                parts.headers.append(header::SET_COOKIE, cookie);
            }
        }
    } else {
        // An API's answers are data: no scripts run from them, whatever they claim to be.
        parts.headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static("sandbox; default-src 'none'"));
    }
    Ok(Response::from_parts(parts, Body::new(incoming)))
}

/// The proxy state for the router.
pub fn state(platform: Platform, origins: EnvironmentOrigins) -> ProxyState {
    ProxyState { platform, proxy: Arc::new(Proxy::new(origins)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn berths_cookies_are_taken_off_and_the_rest_kept() {
        let mut headers = HeaderMap::new();
        headers.append(header::COOKIE, HeaderValue::from_static("_xsrf=abc; berth_session=secret; berth_env=e"));
        headers.append(header::COOKIE, HeaderValue::from_static("theme=dark; __Host-berth_env=x; __Secure-Berth_y=1"));
        assert_eq!(workload_cookies(&headers).unwrap(), "_xsrf=abc; theme=dark");
        assert_eq!(cookie_values(&headers, "berth_env"), ["e"]);
        let mut only = HeaderMap::new();
        only.insert(header::COOKIE, HeaderValue::from_static("__Host-berth_session=secret"));
        assert_eq!(workload_cookies(&only), None);
        assert!(sets_berth_cookie(&HeaderValue::from_static("berth_env=planted; Path=/")));
        assert!(sets_berth_cookie(&HeaderValue::from_static("__Host-berth_session=x; Secure; Path=/")));
        assert!(!sets_berth_cookie(&HeaderValue::from_static("_xsrf=2|abc; Path=/")));
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
