//! The whole of Berth, the real router on a fresh SQLite database, driven one request at a
//! time: the authorization matrix and the session tests.

mod agent;
mod api;
mod assets;
mod baremetal;
mod cli;
mod environments;
mod fabric;
mod hardening;
mod idempotency;
mod matrix;
mod metrics;
mod openapi;
mod pages;
mod paging;
mod problems;
mod proxy;
mod rate_limits;
mod schemathesis;
mod sessions;
mod ssh_keys;
mod tenant_settings;

use axum::Router;
use axum::body::Body;
use berth_domain::fleet::FleetSpec;
use berth_domain::launch::LaunchRequest;
use berth_domain::policy::Role;
use berth_platform::people::User;
use berth_platform::provisioning::backend::simulated::{Simulated, SimulatedConfig};
use berth_platform::provisioning::reconciler::{Reconciler, ReconcilerConfig};
use berth_platform::{Platform, RequestMeta, store};
use clap::Parser;
use http::{HeaderMap, Method, Request, StatusCode, header};
use tower::ServiceExt;

use crate::cli::{Cli, Command};

/// Two H100 nodes of two GPUs (where the tests launch MIG slices) and one L40S node (for
/// maintenance and health changes).
const FLEET: &str = r#"
[[site]]
name = "test-1"
[[site.pool]]
prefix = "h100"
model = "H100-80GB"
nodes = 2
gpus_per_node = 2
nvlink = true
[[site.pool]]
prefix = "l40s"
model = "L40S"
nodes = 1
gpus_per_node = 2
"#;

/// Everyone's password; hashed once per user, checked once per sign-in.
const PASSWORD: &str = "correct horse battery staple";

pub struct Berth {
    pub platform: Platform,
    router: Router,
    /// What the router serves.
    pub served: crate::served::Served,
    /// The simulated fleet, when the reconciler runs (`start_running`).
    pub fleet: Option<std::sync::Arc<Simulated>>,
    _dir: tempfile::TempDir,
}

/// An answer, read whole.
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    /// The body with this answer's request id blanked, so two answers can be compared.
    pub fn body_without_request_id(&self) -> String {
        match self.headers.get("x-request-id").and_then(|v| v.to_str().ok()) {
            Some(id) if !id.is_empty() => self.body.replace(id, "<request id>"),
            _ => self.body.clone(),
        }
    }

    /// The `Set-Cookie` header, if the answer sets a cookie.
    pub fn set_cookie(&self) -> Option<&str> {
        self.headers.get(header::SET_COOKIE).and_then(|v| v.to_str().ok())
    }

    /// `name=value` of the cookie this answer sets, as a browser sends it back.
    pub fn cookie(&self) -> Option<String> {
        self.set_cookie().and_then(|c| c.split(';').next()).map(|c| c.trim().to_owned())
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl Berth {
    /// Berth as `berth serve [--public-url URL]` builds it, on a database of its own with
    /// the test fleet and no users.
    pub async fn start(public_url: Option<&str>) -> Berth {
        Berth::start_with(public_url, FLEET, None, &[], &[]).await
    }

    /// As [`Berth::start`], with these files (path in the site folder, content) in the site
    /// folder before the router is built.
    pub async fn start_with_site(files: &[(&str, &[u8])]) -> Berth {
        Berth::start_with(None, FLEET, None, &[], files).await
    }

    /// As [`Berth::start`], with more of `berth serve`'s flags.
    pub async fn start_with_flags(flags: &[&str]) -> Berth {
        Berth::start_with(None, FLEET, None, flags, &[]).await
    }

    /// As [`Berth::start`], on the fleet described by `fleet`.
    pub async fn start_with_fleet(public_url: Option<&str>, fleet: &str) -> Berth {
        Berth::start_with(public_url, fleet, None, &[], &[]).await
    }

    /// Berth with its reconciler driving an instant simulated fleet, so environments
    /// become ready and serve.
    pub async fn start_running() -> Berth {
        let fleet =
            std::sync::Arc::new(Simulated::new(SimulatedConfig { speed: 0.0, faults: Vec::new(), volumes_dir: None }));
        Berth::start_with(None, FLEET, Some(fleet), &[], &[]).await
    }

    async fn start_with(
        public_url: Option<&str>,
        fleet_spec: &str,
        fleet: Option<std::sync::Arc<Simulated>>,
        flags: &[&str],
        site_files: &[(&str, &[u8])],
    ) -> Berth {
        let dir = tempfile::tempdir().expect("temp dir");
        let database = format!("sqlite://{}", dir.path().join("berth.db").display());
        let site_root = dir.path().join("site");
        std::fs::create_dir_all(site_root.join("pkg")).expect("site root");
        for (path, content) in site_files {
            std::fs::write(site_root.join(path), content).expect("site file");
        }
        let site_root = site_root.display().to_string();
        let mut argv = vec!["berth", "serve", "--database", &database, "--site-root", &site_root];
        if let Some(url) = public_url {
            argv.extend(["--public-url", url]);
            if url.starts_with("https://") {
                argv.extend(["--environments-url", "https://env.berth.example"]);
            }
        }
        argv.extend(flags);
        let Command::Serve(args) = Cli::try_parse_from(argv).expect("serve arguments").command else {
            panic!("not the serve command")
        };
        let public = args.public().expect("public url");
        let pool = store::connect(&database).await.expect("database");
        store::migrate(&pool).await.expect("migrations");
        let fabric = args.fabric().expect("fabric flags");
        let origins = args.environment_origins(&public).expect("environments url");
        let mut platform = Platform::new(pool.clone())
            .with_public_url(&public.url)
            .with_environment_origins(origins)
            .with_fabric(fabric)
            .with_private_issuers(args.allow_private_issuers);
        platform.sync_fleet(&FleetSpec::parse(fleet_spec).expect("test fleet")).await.expect("fleet");
        if let Some(fleet) = &fleet {
            platform = platform.with_backend(fleet.clone());
            let config = ReconcilerConfig { tick: std::time::Duration::from_millis(20), ..ReconcilerConfig::default() };
            let reconciler = Reconciler::new(platform.clone(), fleet.clone(), config);
            tokio::spawn(reconciler.run(std::future::pending()));
        }
        let routers = crate::http::router(platform.clone(), pool, &args.site(&public)).await.expect("router");
        Berth { platform, router: routers.portal, served: routers.served, fleet, _dir: dir }
    }

    /// Serves this Berth on a free loopback port, as `berth serve` does; its URL.
    pub async fn serve_on_loopback(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("listen");
        let address = listener.local_addr().expect("address");
        let service = self.router.clone().into_make_service_with_connect_info::<std::net::SocketAddr>();
        tokio::spawn(async move { axum::serve(listener, service).await });
        format!("http://{address}")
    }

    /// Sends `request` through the router. A request without a whole answer in two minutes
    /// fails its test, naming the request, rather than holding the suite.
    pub async fn send(&self, request: Request<Body>) -> Reply {
        self.send_within(request, std::time::Duration::from_secs(120)).await
    }

    /// As [`Berth::send`], failing after `limit` rather than two minutes.
    pub async fn send_within(&self, request: Request<Body>, limit: std::time::Duration) -> Reply {
        let asked = format!("{} {}", request.method(), request.uri());
        let answer = async {
            let response = self.router.clone().oneshot(request).await.expect("the router always answers");
            let (parts, body) = response.into_parts();
            let bytes = axum::body::to_bytes(body, usize::MAX).await.expect("body");
            Reply { status: parts.status, headers: parts.headers, body: String::from_utf8_lossy(&bytes).into_owned() }
        };
        match tokio::time::timeout(limit, answer).await {
            Ok(reply) => reply,
            Err(_) => panic!("no whole answer to {asked} in {limit:?}"),
        }
    }

    /// Calls a server function the way the browser does: a form-encoded POST carrying the
    /// session cookie.
    pub async fn call(&self, path: &str, form: &str, cookie: Option<&str>) -> Reply {
        let mut request = Request::post(path)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header("sec-fetch-site", "same-origin");
        if let Some(cookie) = cookie {
            request = request.header(header::COOKIE, cookie);
        }
        self.send(request.body(Body::from(form.to_owned())).expect("request")).await
    }

    /// Calls the JSON API, with a bearer token when there is one.
    pub async fn api(&self, method: Method, path: &str, json: &str, token: Option<&str>) -> Reply {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        if !json.is_empty() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        self.send(request.body(Body::from(json.to_owned())).expect("request")).await
    }

    pub async fn get(&self, path: &str, cookie: Option<&str>) -> Reply {
        self.get_within(path, cookie, std::time::Duration::from_secs(120)).await
    }

    /// As [`Berth::get`], failing after `limit`.
    pub async fn get_within(&self, path: &str, cookie: Option<&str>, limit: std::time::Duration) -> Reply {
        let mut request = Request::get(path);
        if let Some(cookie) = cookie {
            request = request.header(header::COOKIE, cookie);
        }
        self.send_within(request.body(Body::empty()).expect("request"), limit).await
    }

    /// A GET to `path` on host `on` (an environment's origin, say).
    pub async fn get_on(&self, on: &str, path: &str, cookie: Option<&str>) -> Reply {
        let mut request = Request::get(path).header(header::HOST, on);
        if let Some(cookie) = cookie {
            request = request.header(header::COOKIE, cookie);
        }
        self.send(request.body(Body::empty()).expect("request")).await
    }

    /// A user who signs in with `PASSWORD`.
    pub async fn person(&self, email: &str, role: Role, tenant: Option<i64>) -> User {
        self.platform.create_user(email, email, PASSWORD, role, tenant).await.expect("user")
    }

    /// Signs in through the `sign_in` server function (and, for a platform admin, the
    /// one-time code step, setting up the authenticator); the session cookie to send back.
    pub async fn sign_in(&self, email: &str, cookie: Option<&str>) -> String {
        let form = format!("email={}&password={}", encode(email), encode(PASSWORD));
        let reply = self.call("/api/sign_in", &form, cookie).await;
        assert!(reply.status.is_success(), "sign-in of {email} failed: {} {}", reply.status, reply.body);
        let cookie = reply.cookie().expect("a signed-in session sets its cookie");
        let step = self.call("/api/second_factor", "", Some(&cookie)).await;
        if !step.status.is_success() {
            return cookie;
        }
        let view: serde_json::Value = serde_json::from_str(&step.body).expect("second factor view");
        let secret = view["secret"].as_str().expect("a first sign-in sets up the authenticator").to_owned();
        let code = berth_platform::identity::totp::code_at(&secret, berth_platform::now_ms() / 30_000).expect("code");
        let reply = self.call("/api/verify_code", &format!("code={code}"), Some(&cookie)).await;
        assert!(reply.status.is_success(), "one-time code of {email} refused: {} {}", reply.status, reply.body);
        reply.cookie().unwrap_or(cookie)
    }

    /// A bearer token of `user` for `actions` (all of the role's when empty): its id and secret.
    pub async fn token(&self, user: &User, actions: &[&str]) -> (berth_platform::identity::tokens::TokenInfo, String) {
        let actions: Vec<String> = actions.iter().map(|a| (*a).to_owned()).collect();
        self.platform.create_token(&user.caller(meta()), "tests", "30", &actions).await.expect("token")
    }

    /// A notebook on one MIG slice for two hours from now, launched by `user`.
    pub async fn launch(&self, user: &User, name: &str) -> String {
        let request = LaunchRequest {
            offering: "notebook".into(),
            size: "h100-1g.10gb".into(),
            name: name.into(),
            hours: "2".into(),
            ..LaunchRequest::default()
        };
        self.platform.launch(&user.caller(meta()), &request).await.expect("launch").id
    }

    /// Launches `request` as `user` and waits until it is ready (with `start_running`).
    pub async fn launch_ready(&self, user: &User, request: LaunchRequest) -> String {
        let id = self.platform.launch(&user.caller(meta()), &request).await.expect("launch").id;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let state: String = sqlx::query_scalar("SELECT state FROM environments WHERE id = ?")
                .bind(&id)
                .fetch_one(self.platform.db())
                .await
                .expect("state");
            if state == "ready" {
                return id;
            }
            assert!(std::time::Instant::now() < deadline, "{} stuck in {state}", request.name);
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// Audit rows with outcome `denied` that name `user_id` as the actor.
    pub async fn denials_by(&self, user_id: i64) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE outcome = 'denied' AND actor_id = ?")
            .bind(user_id)
            .fetch_one(self.platform.db())
            .await
            .expect("count denials")
    }

    pub async fn audit_rows(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM audit_events").fetch_one(self.platform.db()).await.expect("count")
    }
}

pub fn meta() -> RequestMeta {
    RequestMeta { request_id: "test-setup".into(), source: None }
}

/// Percent-encodes a form value.
pub fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A UTC time `hours` from now as the forms take it (`2026-11-23T14:00`).
pub fn in_hours(hours: i64) -> String {
    (chrono::Utc::now() + chrono::TimeDelta::hours(hours)).format("%Y-%m-%dT%H:%M").to_string()
}
