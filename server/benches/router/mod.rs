//! Requests through the real router as a browser sends them, and the figures the server
//! benchmarks print; shared by `fleet_page` and `usage_page`.
#![allow(dead_code)]

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use berth_domain::fleet::FleetSpec;
use berth_domain::policy::Role;
use berth_platform::{Platform, now_ms, store};
use berth_server::cli::{Cli, Command, PublicUrl, ServeArgs};
use clap::Parser;
use http::{Request, StatusCode, header};
use sqlx::SqlitePool;
use tower::ServiceExt;

pub const PASSWORD: &str = "bench password, not a secret";

/// Status, the cookie the answer sets (`name=value`) and the body.
pub async fn send(router: &Router, request: Request<Body>) -> (StatusCode, Option<String>, String) {
    let response = router.clone().oneshot(request).await.expect("the router always answers");
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX).await.expect("body");
    let cookie = parts
        .headers
        .get(header::SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(|c| c.split(';').next())
        .map(str::to_owned);
    (parts.status, cookie, String::from_utf8_lossy(&bytes).into_owned())
}

/// A form POST as a browser on Berth's own page sends it: its `Origin` is the `Host` asked.
pub async fn post(
    router: &Router,
    origin: &str,
    path: &str,
    form: String,
    cookie: Option<&str>,
) -> (StatusCode, Option<String>, String) {
    let mut request = Request::post(path)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(header::ORIGIN, origin)
        .header(header::HOST, origin.split_once("://").map_or(origin, |(_, host)| host));
    if let Some(cookie) = cookie {
        request = request.header(header::COOKIE, cookie);
    }
    send(router, request.body(Body::from(form)).expect("request")).await
}

/// Password, then the authenticator a platform admin sets up at the first sign-in.
pub async fn sign_in(router: &Router, origin: &str, email: &str) -> String {
    let form = format!("email={email}&password={PASSWORD}");
    let (status, cookie, body) = post(router, origin, "/api/sign_in", form, None).await;
    assert!(status.is_success(), "sign-in: {status} {body}");
    let cookie = cookie.expect("session cookie");
    let (_, _, step) = post(router, origin, "/api/second_factor", String::new(), Some(&cookie)).await;
    let view: serde_json::Value = serde_json::from_str(&step).expect("second factor view");
    let secret = view["secret"].as_str().expect("authenticator secret");
    let code = berth_platform::identity::totp::code_at(secret, now_ms() / 30_000).expect("code");
    let (status, renewed, body) = post(router, origin, "/api/verify_code", format!("code={code}"), Some(&cookie)).await;
    assert!(status.is_success(), "one-time code: {status} {body}");
    renewed.unwrap_or(cookie)
}

/// `p50 ...  p99 ...  (n runs)` of `times`, sorted in place.
pub fn percentiles(times: &mut [Duration]) -> String {
    times.sort();
    let at = |p: f64| times[((times.len() - 1) as f64 * p).round() as usize];
    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1000.0);
    format!("p50 {}  p99 {}  ({} runs)", ms(at(0.5)), ms(at(0.99)), times.len())
}

/// What `berth serve` opens on a fresh database in a folder, its fleet synced: the platform
/// and its pool (to seed), and the real portal router once the seed is in.
pub struct Fresh {
    pub platform: Platform,
    pub pool: SqlitePool,
    args: Box<ServeArgs>,
    public: PublicUrl,
}

impl Fresh {
    pub async fn open(dir: &std::path::Path, fleet: &FleetSpec) -> Fresh {
        let database = format!("sqlite://{}", dir.join("berth.db").display());
        let site_root = dir.join("site");
        std::fs::create_dir_all(&site_root).expect("site root");
        let site_root = site_root.display().to_string();
        let argv = ["berth", "serve", "--database", &database, "--site-root", &site_root];
        let Command::Serve(args) = Cli::try_parse_from(argv).expect("serve arguments").command else {
            panic!("not the serve command")
        };
        let public = args.public().expect("public url");
        let pool = store::connect(&database).await.expect("database");
        store::migrate(&pool).await.expect("migrations");
        let platform = Platform::new(pool.clone()).with_public_url(&public.url);
        platform.sync_fleet(fleet).await.expect("fleet");
        Fresh { platform, pool, args, public }
    }

    /// The portal's router, and the session cookie of a new platform admin `<name>@bench`.
    pub async fn portal_signed_in(&self, name: &str) -> (Router, String) {
        let router =
            berth_server::http::router(self.platform.clone(), self.pool.clone(), &self.args.site(&self.public))
                .await
                .expect("router")
                .portal;
        self.platform
            .create_user(&format!("{name}@bench"), name, PASSWORD, Role::PlatformAdmin, None)
            .await
            .expect("platform admin");
        let cookie = sign_in(&router, &self.public.url, &format!("{name}%40bench")).await;
        (router, cookie)
    }
}
