//! What a reviewer tries with curl: redirects that leave Berth, text that a link puts on
//! Berth's pages, cached signed-in answers, inline scripts, metrics for anyone, and a
//! tenant's identity provider pointed at Berth's own network.

use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use http::{Method, StatusCode};

use super::{Berth, encode, meta};

/// `next` values a browser would follow off Berth, or that cannot go into a header.
const HOSTILE_NEXTS: [&str; 7] = [
    "/%09/evil.example/x",
    "/%0A/evil.example",
    "/%0D%0ASet-Cookie:%20a=b",
    "//evil.example",
    "/%5Cevil.example",
    "https://evil.example",
    "/.//evil.example",
];

fn leaves_berth(location: Option<&str>) -> bool {
    location.is_some_and(|l| l.contains("evil.example") || !l.starts_with('/') || l.starts_with("//"))
}

#[tokio::test]
async fn sign_in_refuses_a_next_that_leaves_berth_before_it_spends_anything() {
    let berth = Berth::start(None).await;
    let tenant = berth.platform.ensure_tenant("tenant-a", "Tenant A", Isolation::Soft).await.expect("tenant");
    berth.person("dana@example.com", Role::Member, Some(tenant)).await;
    for next in HOSTILE_NEXTS {
        let form = format!("email=dana%40example.com&password={}&next={next}", encode(super::PASSWORD));
        let reply = berth.call("/api/sign_in", &form, None).await;
        assert!(reply.status.is_client_error(), "{next}: {} {}", reply.status, reply.body);
        assert!(!leaves_berth(reply.header("location")), "{next}: {:?}", reply.header("location"));
        assert!(reply.body.contains("path on this site"), "{next}: {}", reply.body);
        // The one-time code step too: refused, not a dropped connection.
        let reply = berth.call("/api/verify_code", &format!("code=123456&next={next}"), None).await;
        assert!(reply.status.is_client_error(), "{next}: {} {}", reply.status, reply.body);
        // And the single sign-on start: back to the sign-in page with a fixed message.
        let reply = berth.get(&format!("/auth/oidc/tenant-a/start?next={next}"), None).await;
        assert_eq!(reply.header("location"), Some("/login?sso_error=not-local-path"), "{next}");
    }
    // None of it counted as a failed sign-in: the right password still works at once.
    let form = format!("email=dana%40example.com&password={}&next=%2Fcatalog", encode(super::PASSWORD));
    let reply = berth.call("/api/sign_in", &form, None).await;
    assert!(reply.status.is_success() || reply.status.is_redirection(), "{} {}", reply.status, reply.body);
}

#[tokio::test]
async fn the_sign_in_page_shows_only_berths_own_words_for_a_single_sign_on_problem() {
    let berth = Berth::start(None).await;
    let crafted = berth.get("/login?sso_error=Your%20account%20is%20suspended.%20Call%20%2B1%20555%200100", None).await;
    assert_eq!(crafted.status, StatusCode::OK);
    assert!(!crafted.body.contains("Call +1 555"), "attacker's words on the page");
    assert!(crafted.body.contains("Single sign-on failed on our side"), "a generic message instead");
    let known = berth.get("/login?sso_error=expired", None).await;
    assert!(known.body.contains("This sign-in link has expired or was already used"));
    let id = berth.get("/login?sso_error=internal&request_id=%3Cb%3Ehi%3C%2Fb%3E", None).await;
    assert!(!id.body.contains("hi</b>") && !id.body.contains("request id"), "only an id-shaped request id is shown");
}

#[tokio::test]
async fn answers_that_depend_on_the_session_are_never_cached() {
    let berth = Berth::start(None).await;
    let admin = berth.person("root@example.com", Role::PlatformAdmin, None).await;
    let cookie = berth.sign_in("root@example.com", None).await;
    let (_, token) = berth.token(&admin, &[]).await;
    let answers = [
        ("page", berth.get("/environments", Some(&cookie)).await),
        ("sign-in page", berth.get("/login", None).await),
        ("missing page", berth.get("/no-such-page", Some(&cookie)).await),
        ("server function", berth.call("/api/current_user", "", Some(&cookie)).await),
        ("API", berth.api(Method::GET, "/api/v1/me", "", Some(&token)).await),
        ("download", berth.get("/audit.csv", Some(&cookie)).await),
        ("redirect", berth.get("/env/x/lab", Some(&cookie)).await),
    ];
    for (what, reply) in answers {
        assert_eq!(reply.header("cache-control"), Some("no-store"), "{what}: {}", reply.status);
    }
}

#[tokio::test]
async fn pages_run_only_their_own_inline_scripts() {
    let berth = Berth::start(None).await;
    let nonce_of = |csp: &str| {
        let script_src = csp.split(';').find(|d| d.trim().starts_with("script-src")).expect("script-src").to_owned();
        assert!(!script_src.contains("unsafe-inline"), "{script_src}");
        script_src.split("'nonce-").nth(1).and_then(|rest| rest.split('\'').next()).map(str::to_owned)
    };
    let mut seen = Vec::new();
    for path in ["/login", "/catalog", "/no-such-page"] {
        let page = berth.get(path, None).await;
        let nonce = nonce_of(page.header("content-security-policy").expect("CSP")).expect("a page has a nonce");
        let scripts = page.body.matches("<script").count();
        assert!(scripts > 0, "{path}: the hydration bootstrap is inline");
        assert_eq!(page.body.matches(&format!("nonce=\"{nonce}\"")).count(), scripts, "{path}: every inline script");
        seen.push(nonce);
    }
    seen.dedup();
    assert_eq!(seen.len(), 3, "a nonce per response");
    let api = berth.api(Method::GET, "/api/v1/me", "", None).await;
    assert_eq!(nonce_of(api.header("content-security-policy").expect("CSP")), None, "no inline script elsewhere");
}

#[tokio::test]
async fn metrics_are_served_only_where_the_operator_chose() {
    let hidden = Berth::start(None).await;
    assert_eq!(hidden.get("/metrics", None).await.status, StatusCode::NOT_FOUND, "not without a choice");
    let berth = Berth::start_with_flags(&["--metrics-token", "s3cret-metrics"]).await;
    assert_eq!(berth.get("/metrics", None).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(berth.api(Method::GET, "/metrics", "", Some("wrong")).await.status, StatusCode::UNAUTHORIZED);
    let scraped = berth.api(Method::GET, "/metrics", "", Some("s3cret-metrics")).await;
    assert_eq!(scraped.status, StatusCode::OK);
    assert!(scraped.body.contains("berth_environments"), "{}", scraped.body);
}

/// A tenant admin's identity provider on Berth's own network: refused at save, and, if one
/// is there already (saved before DNS changed, or by an older Berth), never fetched.
#[tokio::test]
async fn a_tenant_admins_identity_provider_may_not_point_at_berths_own_network() {
    // Something listens on loopback, as an internal service would.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    let reached = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = reached.clone();
    tokio::spawn(async move {
        while let Ok((_socket, _)) = listener.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });

    let berth = Berth::start(None).await;
    let tenant = berth.platform.ensure_tenant("tenant-a", "Tenant A", Isolation::Soft).await.expect("tenant");
    let admin = berth.person("admin@a.example", Role::TenantAdmin, Some(tenant)).await;
    let cookie = berth.sign_in("admin@a.example", None).await;
    let save = |issuer: String| {
        format!(
            "tenant_id={tenant}&display_name=Corp&issuer={}&client_id=berth&client_secret=s&groups_claim=groups\
             &allowed_domains=&group_roles=&enabled=yes",
            encode(&issuer)
        )
    };
    for issuer in [
        format!("http://127.0.0.1:{port}"),
        format!("https://127.0.0.1:{port}"),
        format!("http://localhost:{port}"),
        format!("https://localhost:{port}/realms/x"),
        "https://169.254.169.254/latest".to_owned(),
        "https://[::1]:8443".to_owned(),
        "https://10.0.0.7".to_owned(),
    ] {
        let reply = berth.call("/api/save_sso", &save(issuer.clone()), Some(&cookie)).await;
        assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{issuer}: {}", reply.body);
        assert!(reply.body.contains("https") || reply.body.contains("private address"), "{issuer}: {}", reply.body);
    }
    assert!(berth.platform.sso_settings(&admin.caller(meta()), tenant).await.expect("settings").slug.is_none());

    // One that got in anyway: an anonymous start must not make Berth fetch it.
    sqlx::query(
        "INSERT INTO oidc_providers (tenant_id, slug, display_name, issuer, client_id, created_at) VALUES (?, 'internal', 'A', ?, 'c', 0)",
    )
    .bind(tenant)
    .bind(format!("https://localhost:{port}"))
    .execute(berth.platform.db())
    .await
    .expect("provider");
    let start = berth.get("/auth/oidc/internal/start", None).await;
    assert_eq!(start.status, StatusCode::SEE_OTHER);
    assert!(
        start.header("location").is_some_and(|l| l.starts_with("/login?sso_error=")),
        "{:?}",
        start.header("location")
    );
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(reached.load(std::sync::atomic::Ordering::SeqCst), 0, "Berth connected to the internal address");

    // The operator may allow it (providers on the private network), and then it is saved.
    let allowed = Berth::start_with_flags(&["--allow-private-issuers"]).await;
    let tenant = allowed.platform.ensure_tenant("tenant-a", "Tenant A", Isolation::Soft).await.expect("tenant");
    allowed.person("admin@a.example", Role::TenantAdmin, Some(tenant)).await;
    let cookie = allowed.sign_in("admin@a.example", None).await;
    let reply = allowed.call("/api/save_sso", &save(format!("http://127.0.0.1:{port}")), Some(&cookie)).await;
    assert!(reply.status.is_success(), "{} {}", reply.status, reply.body);
}

#[tokio::test]
async fn anonymous_single_sign_on_starts_are_limited_per_address() {
    let berth = Berth::start(None).await;
    let mut limited = 0;
    for _ in 0..berth_platform::identity::sso::STARTS_PER_MINUTE + 5 {
        let reply = berth.get("/auth/oidc/nobody/start", None).await;
        if reply.header("location") == Some("/login?sso_error=too-many") {
            limited += 1;
        }
    }
    assert_eq!(limited, 5);
}

#[tokio::test]
async fn the_sign_in_page_lists_no_tenants_and_finds_a_persons_provider_by_email_or_organization() {
    let berth = Berth::start(None).await;
    let provider = |tenant: i64, slug: &str, name: &str, domains: &str| {
        sqlx::query(
            "INSERT INTO oidc_providers (tenant_id, slug, display_name, issuer, client_id, allowed_domains, created_at)
             VALUES (?, ?, ?, 'https://idp.example', 'c', ?, 0)",
        )
        .bind(tenant)
        .bind(slug.to_owned())
        .bind(name.to_owned())
        .bind(domains.to_owned())
        .execute(berth.platform.db())
    };
    let acme = berth.platform.ensure_tenant("acme", "Acme Research", Isolation::Soft).await.expect("tenant");
    let globex = berth.platform.ensure_tenant("globex", "Globex AI", Isolation::Soft).await.expect("tenant");
    provider(acme, "acme", "Acme SSO", "acme.example labs.acme.example").await.expect("provider");
    provider(globex, "globex", "Globex <b>SSO</b>", "").await.expect("provider");

    // Anyone may open the sign-in page: it must not say who Berth's customers are.
    let page = berth.get("/login", None).await;
    assert_eq!(page.status, StatusCode::OK);
    for name in ["Acme", "acme", "Globex", "globex"] {
        assert!(!page.body.contains(name), "the sign-in page names {name}");
    }
    assert!(page.body.contains("Continue with single sign-on"));

    /// Where the lookup sends the browser: back to sign-in (a redirect), or on to the
    /// provider's start (a page that goes there: the form may not be redirected off Berth).
    async fn find_on(berth: &Berth, hint: &str) -> Option<String> {
        let reply = berth.get(&format!("/auth/oidc/find?hint={}&next=%2Fcalendar", encode(hint)), None).await;
        if reply.status == StatusCode::OK {
            let (_, after) = reply.body.split_once("content=\"0;url=")?;
            return after.split_once('"').map(|(url, _)| url.replace("&amp;", "&"));
        }
        reply.header("location").map(str::to_owned)
    }
    let find = |hint: &'static str| find_on(&berth, hint);
    let to_acme = Some("/auth/oidc/acme/start?next=/calendar".to_owned());
    assert_eq!(find("ada@acme.example").await, to_acme);
    assert_eq!(find("  Ada@LABS.Acme.Example ").await, to_acme, "any allowed domain, any case");
    assert_eq!(find("acme").await, to_acme, "by organization");
    // A tenant that allows any email is found only by its name, not by everyone's email.
    let unknown = Some("/login?sso_error=unknown-organization".to_owned());
    assert_eq!(find("bob@globex.example").await, unknown);
    assert_eq!(find("globex").await.as_deref(), Some("/auth/oidc/globex/start?next=/calendar"));
    let page = berth.get("/auth/oidc/find?hint=globex", None).await;
    assert!(page.body.contains("Globex &lt;b&gt;SSO") && !page.body.contains("<b>"), "{}", page.body);
    for hint in ["eve@evil.example", "evil", "", "@acme.example.evil", "ada@notacme.example"] {
        assert_eq!(find(hint).await, unknown, "{hint:?}");
    }
    // A suspended tenant's provider is not found.
    sqlx::query("UPDATE tenants SET status = 'suspended' WHERE id = ?")
        .bind(acme)
        .execute(berth.platform.db())
        .await
        .expect("suspend");
    assert_eq!(find("ada@acme.example").await, unknown);
    // A hostile `next` is refused before anything is looked up.
    let reply = berth.get("/auth/oidc/find?hint=globex&next=%2F%2Fevil.example", None).await;
    assert_eq!(reply.header("location"), Some("/login?sso_error=not-local-path"));
    // Each address may look up only so many a minute: it says whether a name is a customer.
    let mut limited = 0;
    for _ in 0..berth_platform::identity::sso::FINDS_PER_MINUTE {
        if find("globex").await.as_deref() == Some("/login?sso_error=too-many") {
            limited += 1;
        }
    }
    assert!(limited > 0, "lookups are limited");
}
