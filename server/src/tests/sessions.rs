//! Browser sessions end to end: a new id at sign-in, nothing left after sign-out, the
//! cookie's attributes, cross-origin writes refused, suspended tenants cut off at once,
//! and the security headers.

use axum::body::Body;
use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use berth_platform::tenancy::tenants::TenantChange;
use http::{Method, Request, StatusCode, header};

use super::{Berth, Reply, encode, meta};

/// What a page needing a signed-in user shows anyone else.
const SIGN_IN_PROMPT: &str = "Sign in to continue";

/// Whoever `current_user` says the cookie belongs to (`null` for nobody).
async fn whoami(berth: &Berth, cookie: &str) -> String {
    let reply = berth.call("/api/current_user", "", Some(cookie)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.body
}

/// Asserts that a call needing a signed-in user was turned away as not signed in.
fn says_sign_in(reply: &Reply) {
    assert!(!reply.status.is_success(), "answered {} {}", reply.status, reply.body);
    assert!(reply.body.contains("Unauthenticated"), "{} {}", reply.status, reply.body);
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{}", reply.body);
}

#[tokio::test]
async fn sign_in_renews_the_session_id_and_sign_out_ends_it() {
    let berth = Berth::start(None).await;
    let tenant = berth.platform.ensure_tenant("tenant-a", "Tenant A", Isolation::Soft).await.expect("tenant");
    berth.person("dana@example.com", Role::Member, Some(tenant)).await;

    // Starting a single sign-on puts a binding in an anonymous session: a pre-login id.
    let anonymous = berth.get("/auth/oidc/nobody/start", None).await.cookie().expect("an anonymous session");
    let signed_in = berth.sign_in("dana@example.com", Some(&anonymous)).await;
    let value = |cookie: &str| cookie.split_once('=').map(|(_, v)| v.to_owned()).unwrap_or_default();
    assert_ne!(value(&anonymous), value(&signed_in), "sign-in must give the session a new id");
    assert!(whoami(&berth, &signed_in).await.contains("dana@example.com"));
    assert_eq!(whoami(&berth, &anonymous).await, "null", "the pre-login id is worthless");
    let page = berth.get("/environments", Some(&signed_in)).await;
    assert!(page.body.contains("Nothing running yet") && !page.body.contains(SIGN_IN_PROMPT), "{}", page.body);

    let out = berth.call("/api/sign_out", "", Some(&signed_in)).await;
    assert!(out.status.is_success(), "{} {}", out.status, out.body);
    assert_eq!(whoami(&berth, &signed_in).await, "null", "the old id is dead after sign-out");
    let page = berth.get("/environments", Some(&signed_in)).await;
    assert!(page.body.contains(SIGN_IN_PROMPT), "the page does not ask to sign in: {}", page.body);
    says_sign_in(&berth.call("/api/environments_listing", "", Some(&signed_in)).await);
    let csv = berth.get("/audit.csv", Some(&signed_in)).await;
    assert_eq!(csv.status, StatusCode::UNAUTHORIZED, "{}", csv.body);
}

#[tokio::test]
async fn the_session_cookie_follows_the_public_url() {
    for (public_url, name, secure) in
        [(None, "berth_session", false), (Some("https://berth.example.com"), "__Host-berth_session", true)]
    {
        let berth = Berth::start(public_url).await;
        berth.person("root@example.com", Role::PlatformAdmin, None).await;
        let form = format!("email={}&password={}", encode("root@example.com"), encode(super::PASSWORD));
        let reply = berth.call("/api/sign_in", &form, None).await;
        let cookie = reply.set_cookie().expect("sign-in sets the session cookie");
        let attributes: Vec<String> = cookie.split(';').map(|a| a.trim().to_ascii_lowercase()).collect();
        let has = |a: &str| attributes.iter().any(|x| x == a);
        assert!(cookie.starts_with(&format!("{name}=")), "{cookie}");
        assert!(has("httponly"), "{cookie}");
        assert!(has("samesite=lax"), "{cookie}");
        assert!(has("path=/"), "{cookie}");
        assert!(!attributes.iter().any(|a| a.starts_with("domain")), "{cookie}");
        assert_eq!(has("secure"), secure, "{cookie}");
    }
}

#[tokio::test]
async fn writes_from_another_origin_are_refused_before_any_handler() {
    let berth = Berth::start(None).await;
    let tenant = berth.platform.ensure_tenant("tenant-a", "Tenant A", Isolation::Soft).await.expect("tenant");
    let member = berth.person("dana@example.com", Role::Member, Some(tenant)).await;
    let (_, token) = berth.token(&member, &[]).await;
    let audit_rows = berth.audit_rows().await;

    let form = format!("email={}&password={}", encode("dana@example.com"), encode(super::PASSWORD));
    let forged = Request::post("/api/sign_in")
        .header(header::HOST, "127.0.0.1:3000")
        .header(header::ORIGIN, "https://evil.example")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(form.clone()))
        .expect("request");
    let reply = berth.send(forged).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.body);
    assert_eq!(reply.set_cookie(), None, "no session was started");

    let launch = r#"{"offering": "notebook", "size": "h100-1g.10gb", "name": "forged", "hours": "2"}"#;
    let forged = Request::builder()
        .method(Method::POST)
        .uri("/api/v1/environments")
        .header(header::HOST, "127.0.0.1:3000")
        .header(header::ORIGIN, "http://127.0.0.1:3000.evil.example")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(launch))
        .expect("request");
    assert_eq!(berth.send(forged).await.status, StatusCode::FORBIDDEN);
    assert_eq!(berth.audit_rows().await, audit_rows, "no handler ran: neither a sign-in nor a launch was audited");

    // The same sign-in from the page's own origin goes through.
    let same = Request::post("/api/sign_in")
        .header(header::HOST, "127.0.0.1:3000")
        .header(header::ORIGIN, "http://127.0.0.1:3000")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(form))
        .expect("request");
    let reply = berth.send(same).await;
    assert!(reply.status.is_success(), "{} {}", reply.status, reply.body);
}

#[tokio::test]
async fn suspending_a_tenant_ends_its_sessions_and_tokens_at_once() {
    let berth = Berth::start(None).await;
    let tenant = berth.platform.ensure_tenant("tenant-a", "Tenant A", Isolation::Soft).await.expect("tenant");
    let member = berth.person("dana@example.com", Role::Member, Some(tenant)).await;
    let admin = berth.person("root@example.com", Role::PlatformAdmin, None).await;
    let cookie = berth.sign_in("dana@example.com", None).await;
    let (_, token) = berth.token(&member, &[]).await;
    assert!(whoami(&berth, &cookie).await.contains("dana@example.com"));
    assert_eq!(berth.api(Method::GET, "/api/v1/me", "", Some(&token)).await.status, StatusCode::OK);

    berth.platform.change_tenant(&admin.caller(meta()), tenant, TenantChange::Suspend).await.expect("suspend");
    assert_eq!(whoami(&berth, &cookie).await, "null", "a suspended tenant's session still works");
    says_sign_in(&berth.call("/api/environments_listing", "", Some(&cookie)).await);
    assert_eq!(berth.api(Method::GET, "/api/v1/me", "", Some(&token)).await.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn responses_carry_the_security_headers() {
    for (public_url, tls) in [(None, false), (Some("https://berth.example.com"), true)] {
        let berth = Berth::start(public_url).await;
        let page = berth.get("/login", None).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        let api = berth.api(Method::GET, "/api/v1/me", "", Some("berth_nonsense")).await;
        assert_eq!(api.status, StatusCode::UNAUTHORIZED);
        for reply in [&page, &api] {
            let csp = reply.header("content-security-policy").expect("CSP");
            assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
            assert_eq!(reply.header("x-content-type-options"), Some("nosniff"));
            assert!(reply.header("referrer-policy").is_some());
            assert_eq!(reply.header("cross-origin-opener-policy"), Some("same-origin"));
            let hsts = reply.header("strict-transport-security");
            assert_eq!(hsts.is_some(), tls, "HSTS only behind TLS: {hsts:?}");
        }
    }
}
