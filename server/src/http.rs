//! The HTTP router: Leptos pages and server functions, health and metrics endpoints, the
//! session layer, request ids and request logging.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use berth_app::{App, shell};
use berth_platform::{Platform, store};
use http::{HeaderName, HeaderValue, StatusCode, header};
use leptos::prelude::*;
use leptos_axum::{AxumRouteListing, LeptosRoutes, generate_route_list};
use tower::ServiceExt;
use tower_http::compression::CompressionLayer;
use tower_http::compression::predicate::{DefaultPredicate, NotForContentType, Predicate};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::set_header::SetResponseHeaderLayer;
use tower_http::trace::TraceLayer;
use tower_sessions::cookie::SameSite;
use tower_sessions::{Expiry, SessionManagerLayer};
use tower_sessions_sqlx_store::SqliteStore;

use crate::metrics::{self, HttpMetrics, Readings};
use crate::rate_limit::{self, Limiters, RateLimits};
use crate::served::{self, Routes, Served};
use crate::state::AppState;

/// What `berth serve` serves: the portal (with the environments' origins) on the main
/// listener, and `/metrics` alone for `--metrics-listen`.
pub struct Routers {
    pub portal: Router,
    pub metrics: Router,
    /// What the portal serves (an environment's origin included), for the authorization
    /// matrix.
    pub served: Served,
}

/// What the router needs of `berth serve`'s settings (`ServeArgs::site`).
pub struct Site<'a> {
    /// The folder with the compiled CSS, JavaScript and WebAssembly.
    pub root: &'a str,
    pub listen: std::net::SocketAddr,
    /// Served over TLS: `Secure` cookies with the `__Host-` prefix, and HSTS.
    pub tls: bool,
    /// `/metrics` on the portal's listener for this bearer token.
    pub metrics_token: Option<&'a str>,
    /// Limits on the API, the agents' routes and the sign-in paths.
    pub rate_limits: RateLimits,
    /// Reverse proxies whose `X-Forwarded-For` names the client.
    pub trusted_proxies: crate::client_address::TrustedProxies,
}

pub async fn router(platform: Platform, pool: sqlx::SqlitePool, site: &Site<'_>) -> Result<Routers, String> {
    let hash_file = crate::assets::hash_file(site.root);
    let leptos_options = LeptosOptions::builder()
        .output_name("berth")
        .site_root(site.root)
        .site_pkg_dir("pkg")
        .site_addr(site.listen)
        .env(leptos_config::Env::PROD)
        .hash_files(hash_file.is_some())
        .hash_file(hash_file.map_or_else(|| crate::assets::HASH_FILE.into(), |path| path.to_string_lossy().into()))
        .build();
    // `__Host-` binds the cookie to this exact origin (Secure, no Domain, Path=/); plain
    // http on loopback cannot carry it, and gets a plain name.
    let session_cookie = if site.tls { "__Host-berth_session" } else { "berth_session" };
    let origins = platform.environment_origins().clone();
    let limiters = Limiters::new(&site.rate_limits);
    let state = AppState { leptos_options, platform: platform.clone(), metrics: Arc::new(HttpMetrics::default()) };

    let sessions = SqliteStore::new(pool);
    sessions.migrate().await.map_err(|e| format!("cannot prepare the session table: {e}"))?;
    let session_layer = SessionManagerLayer::new(sessions)
        .with_name(session_cookie)
        .with_path("/")
        .with_http_only(true)
        .with_same_site(SameSite::Lax)
        .with_secure(site.tls)
        .with_expiry(Expiry::OnInactivity(tower_sessions::cookie::time::Duration::minutes(IDLE_TIMEOUT_MINUTES)));

    let routes = page_routes();
    // Metrics say how busy Berth is and with what: only where the operator chose.
    let metrics_token = site.metrics_token.map(Arc::<str>::from);
    let exposed_metrics = match metrics_token {
        Some(token) => {
            let (metrics, served) = Routes::new().route("/metrics", served::get(metrics)).into_parts();
            let metrics = metrics.route_layer(middleware::from_fn(move |request: Request, next: Next| {
                let token = token.clone();
                async move {
                    if bearer_is(&request, &token) {
                        next.run(request).await
                    } else {
                        (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], "metrics need their token")
                            .into_response()
                    }
                }
            }));
            Routes::new().with(metrics, served)
        }
        None => Routes::new(),
    };
    let metrics_only = Router::new().route("/metrics", get(metrics)).with_state(state.clone());
    let pages: Vec<(&'static str, String)> = routes
        .iter()
        .flat_map(|page| page.methods().map(move |method| (method_name(method), page.path().to_owned())))
        .collect();
    let pages_router = Router::new().leptos_routes_with_context(&state, routes, page_context(platform.clone()), {
        let options = state.leptos_options.clone();
        move || shell(options.clone())
    });
    let (portal, mut served) = Routes::new()
        .route("/healthz", served::get(healthz))
        .route("/readyz", served::get(readyz))
        .merge(exposed_metrics)
        .merge(crate::api::routes())
        .merge(crate::api_docs::routes())
        .merge(crate::web::routes())
        .with(pages_router, pages)
        .into_parts();
    let portal = portal
        .nest_service("/pkg", crate::assets::pkg(site.root))
        .fallback(leptos_axum::file_and_error_handler_with_context::<AppState, _>(
            page_context(platform.clone()),
            shell,
        ))
        .layer(session_layer)
        // Outside the session layer: a refused request costs no session lookup.
        .layer(middleware::from_fn(crate::api::problems_only))
        .layer(middleware::from_fn_with_state(limiters.clone(), rate_limit::limit))
        .layer(middleware::from_fn(page_policy_follows_nonce))
        // Pages and answers as they are made; the WebAssembly only as `make release`
        // compressed it (a development build's, tens of megabytes, is not worth compressing
        // on every request). Inside the cache policy, so a file's ETag names what is sent.
        .layer(
            CompressionLayer::new()
                .compress_when(DefaultPredicate::new().and(NotForContentType::const_new("application/wasm"))),
        )
        .layer(middleware::from_fn(crate::assets::cache_policy));
    let portal = common_layers(portal.with_state(state.clone()), &state, site.tls);
    // The environments' origins know nothing of Berth's session: no session layer.
    let (environments, on_environments) = crate::proxy::routes().into_parts();
    served.extend(on_environments);
    let environments = environments
        .with_state(crate::proxy::state(platform.clone(), origins.clone()))
        .layer(middleware::from_fn_with_state(limiters, rate_limit::limit));
    let environments = common_layers(environments, &state, origins.secure());

    // By Host: `<id>.<environments domain>` is that environment's origin, anything else the
    // portal's. The portal never serves an environment, nor an environment the portal.
    let proxies = site.trusted_proxies.clone();
    let dispatch = tower::service_fn(move |mut request: Request| {
        // Before anything reads the source address: the rate limits, sign-in, the audit log.
        proxies.apply(&mut request);
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .or_else(|| request.uri().authority().map(|a| a.as_str()))
            .and_then(|host| origins.environment_in_host(host));
        let target = match host {
            Some(id) => {
                request.extensions_mut().insert(crate::proxy::EnvironmentHost(id));
                environments.clone()
            }
            None => portal.clone(),
        };
        target.oneshot(request)
    });
    Ok(Routers { portal: Router::new().fallback_service(dispatch), metrics: metrics_only, served })
}

/// The app's pages, found once per process. Leptos finds them by walking the app with
/// every resource's loading suspended, and the suspension is process-wide (one global flag,
/// `SuppressResourceLoad`): a page whose data was first asked for during a walk would wait
/// forever. Walking once, before any router can serve a page, leaves no page to stall, however
/// many routers are built (the tests build one per Berth, two Berths at a time). Upstream:
/// leptos-rs/leptos#4773, open in Leptos 0.8.23.
fn page_routes() -> Vec<AxumRouteListing> {
    static ROUTES: OnceLock<Vec<AxumRouteListing>> = OnceLock::new();
    ROUTES.get_or_init(|| generate_route_list(App)).clone()
}

/// A page route's method as the matrix names it.
fn method_name(method: leptos_router::Method) -> &'static str {
    match method {
        leptos_router::Method::Get => "GET",
        leptos_router::Method::Post => "POST",
        leptos_router::Method::Put => "PUT",
        leptos_router::Method::Delete => "DELETE",
        leptos_router::Method::Patch => "PATCH",
    }
}

/// Whether the request carries `Authorization: Bearer <token>` (compared in constant time).
fn bearer_is(request: &Request, token: &str) -> bool {
    use subtle::ConstantTimeEq;
    let given = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let given = given.and_then(|v| v.strip_prefix("Bearer ")).unwrap_or_default();
    given.len() == token.len() && bool::from(given.as_bytes().ct_eq(token.as_bytes()))
}

/// What every answer gets, the portal's and the environments' alike: request ids, logs,
/// metrics, security headers and the refusal of cross-origin writes.
fn common_layers(router: Router, state: &AppState, tls: bool) -> Router {
    router
        .layer(middleware::from_fn(same_origin_writes))
        .layer(middleware::from_fn_with_state(state.clone(), record_metrics))
        .layer(security_headers())
        .layer(tower::util::option_layer(tls.then(|| {
            SetResponseHeaderLayer::if_not_present(
                header::STRICT_TRANSPORT_SECURITY,
                HeaderValue::from_static("max-age=31536000; includeSubDomains"),
            )
        })))
        .layer(TraceLayer::new_for_http().make_span_with(|request: &Request| {
            let request_id = request.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("");
            tracing::info_span!("request", method = %request.method(), path = %request.uri().path(), request_id)
        }))
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
}

/// A session unused this long ends (the absolute limit is in the app's session code).
const IDLE_TIMEOUT_MINUTES: i64 = 120;

/// What every rendered page (the 404 page too) gets: the platform, and a policy that lets
/// only this response's inline scripts run, by the nonce Leptos puts on each of them (the
/// hydration bootstrap, resources' data).
fn page_context(platform: Platform) -> impl Fn() + Clone + Send + 'static {
    move || {
        provide_context(platform.clone());
        provide_context(berth_app::session::RequestUser::default());
        let nonce = leptos::nonce::use_nonce();
        if let (Some(nonce), Some(response)) = (nonce, use_context::<leptos_axum::ResponseOptions>())
            && let Ok(policy) = HeaderValue::from_str(&content_security_policy(Some(&nonce)))
        {
            response.insert_header(header::CONTENT_SECURITY_POLICY, policy);
        }
    }
}

/// A page whose policy lacks its nonce would not run its own inline scripts and never
/// hydrate. `page_context` sets it; now and then (under load, cause not found yet) a page
/// came without it, so here a page's policy is made from the nonce its HTML carries. Only
/// such a page is read whole (it was rendered whole: `SsrMode::Async`).
async fn page_policy_follows_nonce(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let is_page = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/html"));
    let has_nonce = response
        .headers()
        .get(header::CONTENT_SECURITY_POLICY)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("'nonce-"));
    if !is_page || has_nonce || response.headers().contains_key(header::CONTENT_ENCODING) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 16 * 1024 * 1024).await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let nonce = std::str::from_utf8(&bytes).ok().and_then(|html| {
        let start = html.find(" nonce=\"")? + 8;
        let len = html[start..].find('"')?;
        Some(html[start..start + len].to_owned())
    });
    if let Some(nonce) = nonce.filter(|n| n.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_+/=".contains(&b)))
        && let Ok(policy) = HeaderValue::from_str(&content_security_policy(Some(&nonce)))
    {
        tracing::warn!("a page came without its nonce in its policy; made from its HTML");
        parts.headers.insert(header::CONTENT_SECURITY_POLICY, policy);
    }
    Response::from_parts(parts, axum::body::Body::from(bytes))
}

/// Scripts only from this origin, and inline ones only with this response's nonce (pages;
/// other answers have none and run no inline script); WebAssembly allowed; styles from this
/// origin and inline (Tailwind's classes need no inline styles, but Leptos' own may); no
/// framing, forms only back to Berth.
fn content_security_policy(nonce: Option<&str>) -> String {
    let inline = nonce.map(|nonce| format!(" 'nonce-{nonce}'")).unwrap_or_default();
    format!(
        "default-src 'self'; script-src 'self'{inline} 'wasm-unsafe-eval'; style-src 'self' 'unsafe-inline'; \
         img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; \
         frame-ancestors 'none'"
    )
}

type Header = SetResponseHeaderLayer<HeaderValue>;
type HeaderLayers = tower::layer::util::Stack<
    Header,
    tower::layer::util::Stack<Header, tower::layer::util::Stack<Header, tower::layer::util::Stack<Header, Header>>>,
>;

fn security_headers() -> HeaderLayers {
    let csp = SetResponseHeaderLayer::if_not_present(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_str(&content_security_policy(None)).unwrap_or(HeaderValue::from_static("default-src 'self'")),
    );
    let nosniff =
        SetResponseHeaderLayer::if_not_present(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    let referrer = SetResponseHeaderLayer::if_not_present(
        header::REFERRER_POLICY,
        HeaderValue::from_static("strict-origin-when-cross-origin"),
    );
    let frames = SetResponseHeaderLayer::if_not_present(
        HeaderName::from_static("x-frame-options"),
        HeaderValue::from_static("DENY"),
    );
    let opener = SetResponseHeaderLayer::if_not_present(
        HeaderName::from_static("cross-origin-opener-policy"),
        HeaderValue::from_static("same-origin"),
    );
    tower::layer::util::Stack::new(
        csp,
        tower::layer::util::Stack::new(
            nosniff,
            tower::layer::util::Stack::new(referrer, tower::layer::util::Stack::new(frames, opener)),
        ),
    )
}

/// CSRF defence: a state-changing request that a browser marks as coming from another
/// origin is refused before any handler runs. Browsers say so with `Sec-Fetch-Site` (only
/// `same-origin`, or `none` for what the user did themselves, may write: `same-site` would
/// let an environment's origin, whose pages its owner writes, post to the portal) and with
/// `Origin`; a write carrying cookies but neither header is refused too, as an old browser's
/// cross-site form could look like that. Clients that are not browsers send a token, not
/// cookies, and are unaffected. Pages change nothing on GET.
async fn same_origin_writes(request: Request, next: Next) -> Response {
    let writes = !matches!(request.method(), &http::Method::GET | &http::Method::HEAD | &http::Method::OPTIONS);
    if writes && let Err(why) = same_origin(request.headers()) {
        let request_id = request.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("");
        tracing::warn!(why, path = %request.uri().path(), request_id, "refused a cross-origin write");
        return (StatusCode::FORBIDDEN, "cross-origin requests may not change anything").into_response();
    }
    next.run(request).await
}

/// Whether a write comes from this origin, as far as its headers tell; why not otherwise.
fn same_origin(headers: &http::HeaderMap) -> Result<(), &'static str> {
    let text = |name| headers.get(name).map(|v: &HeaderValue| v.to_str().unwrap_or("?"));
    let fetch_site = text(HeaderName::from_static("sec-fetch-site"));
    if fetch_site.is_some_and(|site| site != "same-origin" && site != "none") {
        return Err("Sec-Fetch-Site is not same-origin");
    }
    match text(header::ORIGIN) {
        Some(origin) => {
            let same =
                text(header::HOST).is_some_and(|host| origin.split_once("://").is_some_and(|(_, rest)| rest == host));
            if same { Ok(()) } else { Err("Origin is not this host") }
        }
        None if fetch_site.is_none()
            && headers.contains_key(header::COOKIE)
            && !headers.contains_key(header::AUTHORIZATION) =>
        {
            Err("a write with cookies but neither Origin nor Sec-Fetch-Site")
        }
        None => Ok(()),
    }
}

async fn record_metrics(State(metrics): State<Arc<HttpMetrics>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().to_string();
    let matched = request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned());
    let route = if request.extensions().get::<crate::proxy::EnvironmentHost>().is_some() {
        // One series for all environments' traffic, whatever their paths.
        match matched.as_deref() {
            Some(crate::proxy::AUTH_PATH) => "environment:/_berth/auth".to_owned(),
            _ => "environment".to_owned(),
        }
    } else {
        matched.unwrap_or_else(|| {
            if request.uri().path().starts_with("/pkg/") { "/pkg/*".into() } else { "unmatched".into() }
        })
    };
    let response = next.run(request).await;
    metrics.observe(&method, &route, response.status().as_u16(), started.elapsed());
    response
}

/// The process is up.
async fn healthz() -> &'static str {
    "ok"
}

/// The process can do its work: the database answers.
async fn readyz(State(platform): State<Platform>) -> Response {
    match store::ping(platform.db()).await {
        Ok(()) => "ready".into_response(),
        Err(e) => {
            tracing::error!(error = %e, "readiness check failed");
            (StatusCode::SERVICE_UNAVAILABLE, "database unavailable").into_response()
        }
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    let read = async {
        Ok::<_, berth_platform::Error>((
            state.platform.environments_by_state().await?,
            state.platform.usage_totals().await?,
            state.platform.notification_totals().await?,
            state.platform.gpus_now().await?,
            state.platform.idle_stops().await?,
        ))
    };
    let (states, usage, notifications, gpus, idle_stops) = match read.await {
        Ok(read) => read,
        Err(e) => {
            tracing::error!(error = %e, "metrics query failed");
            return (StatusCode::INTERNAL_SERVER_ERROR, "metrics unavailable").into_response();
        }
    };
    let now = Readings {
        environments: &states,
        usage: &usage,
        notifications: &notifications,
        gpus: &gpus,
        idle_stops: &idle_stops,
    };
    match state.metrics.render(state.platform.metrics(), &now) {
        Ok(text) => ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "metrics could not be written");
            (StatusCode::INTERNAL_SERVER_ERROR, "metrics unavailable").into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::routing::post;
    use tower::ServiceExt;

    use super::*;

    fn app() -> Router {
        Router::new().route("/api/launch", post(|| async { "launched" })).layer(middleware::from_fn(same_origin_writes))
    }

    async fn post_with(headers: &[(HeaderName, &str)]) -> StatusCode {
        let mut request = Request::post("/api/launch").header(header::HOST, "berth.example:3000");
        for (name, value) in headers {
            request = request.header(name, *value);
        }
        app().oneshot(request.body(Body::empty()).expect("request")).await.expect("response").status()
    }

    async fn post_from(origin: Option<&str>) -> StatusCode {
        post_with(&origin.map(|o| (header::ORIGIN, o)).into_iter().collect::<Vec<_>>()).await
    }

    #[tokio::test]
    async fn writes_from_another_origin_are_refused() {
        assert_eq!(post_from(Some("https://berth.example:3000")).await, StatusCode::OK);
        assert_eq!(post_from(None).await, StatusCode::OK, "not a browser: nothing ambient to forge");
        assert_eq!(post_from(Some("https://evil.example")).await, StatusCode::FORBIDDEN);
        assert_eq!(post_from(Some("https://berth.example:3000.evil.example")).await, StatusCode::FORBIDDEN);
        assert_eq!(post_from(Some("null")).await, StatusCode::FORBIDDEN);
    }

    #[tokio::test]
    async fn browsers_fetch_metadata_is_followed_and_cookies_need_one_of_the_headers() {
        let site = HeaderName::from_static("sec-fetch-site");
        let cookie = (header::COOKIE, "berth_session=abc");
        assert_eq!(post_with(&[(site.clone(), "same-origin"), cookie.clone()]).await, StatusCode::OK);
        assert_eq!(post_with(&[(site.clone(), "none"), cookie.clone()]).await, StatusCode::OK);
        for elsewhere in ["cross-site", "same-site"] {
            assert_eq!(post_with(&[(site.clone(), elsewhere), cookie.clone()]).await, StatusCode::FORBIDDEN);
            assert_eq!(
                post_with(&[(site.clone(), elsewhere), (header::ORIGIN, "https://berth.example:3000")]).await,
                StatusCode::FORBIDDEN,
                "{elsewhere} wins over a matching Origin"
            );
        }
        assert_eq!(
            post_with(std::slice::from_ref(&cookie)).await,
            StatusCode::FORBIDDEN,
            "cookies, and neither header"
        );
        assert_eq!(
            post_with(&[cookie, (header::AUTHORIZATION, "Bearer berth_x")]).await,
            StatusCode::OK,
            "a token's caller is no browser form"
        );
    }
}
