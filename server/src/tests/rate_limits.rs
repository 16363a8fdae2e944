//! Rate limits as a script, an agent and a guesser meet them: a burst over the limit gets
//! 429 with `Retry-After` and a problem body, another token or address is unaffected, and
//! the limit lets requests through again after the time it said.

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::ConnectInfo;
use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use http::{Request, StatusCode, header};

use super::{Berth, Reply};

/// A request from `address`, as `berth serve` sees its peer.
fn from(address: &str, mut request: Request<Body>) -> Request<Body> {
    let peer: SocketAddr = format!("{address}:40000").parse().expect("address");
    request.extensions_mut().insert(ConnectInfo(peer));
    request
}

fn api_get(path: &str, token: &str) -> Request<Body> {
    Request::get(path).header(header::AUTHORIZATION, format!("Bearer {token}")).body(Body::empty()).expect("request")
}

fn assert_limited(reply: &Reply) -> u64 {
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{}", reply.body);
    let retry: u64 = reply.header("retry-after").expect("Retry-After").parse().expect("seconds");
    assert!(retry >= 1, "{retry}");
    assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    let problem: serde_json::Value = serde_json::from_str(&reply.body).expect("problem json");
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["type"], "urn:berth:problem:rate-limited");
    assert!(problem["detail"].as_str().expect("detail").contains("try again in"), "{problem}");
    assert_eq!(problem["request_id"].as_str(), reply.header("x-request-id"), "the problem names its request");
    retry
}

#[tokio::test]
async fn a_token_over_its_limit_waits_and_other_tokens_do_not() {
    let berth = Berth::start_with_flags(&["--api-rate-limit", "3/s"]).await;
    let tenant = berth.platform.ensure_tenant("acme", "Acme", Isolation::Soft).await.expect("tenant");
    let dana = berth.person("dana@acme.example", Role::Member, Some(tenant)).await;
    let (_, busy) = berth.token(&dana, &[]).await;
    let (_, other) = berth.token(&dana, &[]).await;

    for _ in 0..3 {
        let reply = berth.send(api_get("/api/v1/me", &busy)).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    }
    let refused = berth.send(api_get("/api/v1/me", &busy)).await;
    let retry = assert_limited(&refused);
    assert_eq!(berth.send(api_get("/api/v1/me", &other)).await.status, StatusCode::OK, "another token has its own");

    tokio::time::sleep(std::time::Duration::from_secs(retry)).await;
    assert_eq!(berth.send(api_get("/api/v1/me", &busy)).await.status, StatusCode::OK, "after Retry-After");
}

#[tokio::test]
async fn an_address_over_its_limit_waits_whatever_its_tokens_and_other_addresses_do_not() {
    let berth = Berth::start_with_flags(&["--api-rate-limit-per-address", "2/s"]).await;
    // Made-up tokens count against the address too: guessing costs the guesser.
    for guess in ["berth_a", "berth_b"] {
        let reply = berth.send(from("192.0.2.7", api_get("/api/v1/me", guess))).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{}", reply.body);
    }
    let refused = berth.send(from("192.0.2.7", api_get("/api/v1/me", "berth_c"))).await;
    let retry = assert_limited(&refused);
    let elsewhere = berth.send(from("192.0.2.8", api_get("/api/v1/me", "berth_c"))).await;
    assert_eq!(elsewhere.status, StatusCode::UNAUTHORIZED, "another address has its own");
    // Pages are not the API's business.
    let page = berth.send(from("192.0.2.7", Request::get("/healthz").body(Body::empty()).expect("request"))).await;
    assert_eq!(page.status, StatusCode::OK);

    tokio::time::sleep(std::time::Duration::from_secs(retry)).await;
    let again = berth.send(from("192.0.2.7", api_get("/api/v1/me", "berth_c"))).await;
    assert_eq!(again.status, StatusCode::UNAUTHORIZED, "after Retry-After");
}

#[tokio::test]
async fn agents_are_limited_per_node_token_and_per_address() {
    let berth =
        Berth::start_with_flags(&["--agent-rate-limit", "1/min", "--agent-rate-limit-per-address", "3/min"]).await;
    let plan = |token: &str| api_get("/api/v1/agent/plan", token);
    assert_eq!(berth.send(from("192.0.2.7", plan("berth_node_a"))).await.status, StatusCode::UNAUTHORIZED);
    assert_limited(&berth.send(from("192.0.2.7", plan("berth_node_a"))).await);
    assert_eq!(berth.send(from("192.0.2.7", plan("berth_node_b"))).await.status, StatusCode::UNAUTHORIZED);
    assert_limited(&berth.send(from("192.0.2.7", plan("berth_node_c"))).await);
    assert_eq!(berth.send(from("192.0.2.8", plan("berth_node_c"))).await.status, StatusCode::UNAUTHORIZED);
    // The agents' limits are not the API's.
    assert_eq!(berth.send(from("192.0.2.7", api_get("/api/v1/me", "berth_x"))).await.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn sign_in_paths_are_limited_per_address() {
    let berth = Berth::start_with_flags(&["--sign-in-rate-limit", "2/min"]).await;
    let sign_in = || {
        Request::post("/api/sign_in")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header("sec-fetch-site", "same-origin")
            .body(Body::from("email=nobody%40example.com&password=wrong"))
            .expect("request")
    };
    for _ in 0..2 {
        let reply = berth.send(from("192.0.2.7", sign_in())).await;
        assert_ne!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{}", reply.body);
    }
    assert_limited(&berth.send(from("192.0.2.7", sign_in())).await);
    let start = Request::get("/auth/oidc/acme/start").body(Body::empty()).expect("request");
    assert_limited(&berth.send(from("192.0.2.7", start)).await);
    let reply = berth.send(from("192.0.2.8", sign_in())).await;
    assert_ne!(reply.status, StatusCode::TOO_MANY_REQUESTS, "another address has its own");
    let page = Request::get("/login").body(Body::empty()).expect("request");
    assert_eq!(
        berth.send(from("192.0.2.7", page)).await.status,
        StatusCode::OK,
        "the sign-in page itself is not limited"
    );
}

#[tokio::test]
async fn an_environment_origins_sign_in_path_is_limited_per_address() {
    let berth = Berth::start_with_flags(&["--environment-sign-in-rate-limit", "1/min"]).await;
    let auth = |host: &str| {
        Request::get(format!("{}?ticket=made-up", crate::proxy::AUTH_PATH))
            .header(header::HOST, host)
            .body(Body::empty())
            .expect("request")
    };
    let first = berth.send(from("192.0.2.7", auth("e1.localhost:3000"))).await;
    assert_ne!(first.status, StatusCode::TOO_MANY_REQUESTS, "{}", first.body);
    assert_limited(&berth.send(from("192.0.2.7", auth("e2.localhost:3000"))).await);
    let other = berth.send(from("192.0.2.8", auth("e1.localhost:3000"))).await;
    assert_ne!(other.status, StatusCode::TOO_MANY_REQUESTS);
    let proxied = Request::get("/lab").header(header::HOST, "e1.localhost:3000").body(Body::empty()).expect("request");
    assert_ne!(
        berth.send(from("192.0.2.7", proxied)).await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "only the sign-in path"
    );
}

/// The defaults hold a script's burst: the crash benchmark's clients book as fast as the
/// turn allows, one token each, all from loopback.
#[tokio::test]
async fn the_default_limits_let_a_burst_of_a_thousand_calls_through() {
    let berth = Berth::start(None).await;
    let tenant = berth.platform.ensure_tenant("acme", "Acme", Isolation::Soft).await.expect("tenant");
    let dana = berth.person("dana@acme.example", Role::Member, Some(tenant)).await;
    let (_, token) = berth.token(&dana, &[]).await;
    for _ in 0..1000 {
        let reply = berth.send(from("127.0.0.1", api_get("/api/v1/me", &token))).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    }
}

#[tokio::test]
async fn behind_a_trusted_proxy_each_client_has_its_own_address() {
    let flags = ["--api-rate-limit-per-address", "2/s", "--trusted-proxies", "10.0.0.0/8"];
    let berth = Berth::start_with_flags(&flags).await;
    let via = |proxy: &str, client: &str, token: &str| {
        let mut request = from(proxy, api_get("/api/v1/me", token));
        request.headers_mut().insert("x-forwarded-for", client.parse().expect("header"));
        request
    };
    for guess in ["berth_a", "berth_b"] {
        assert_eq!(berth.send(via("10.0.0.5", "203.0.113.5", guess)).await.status, StatusCode::UNAUTHORIZED);
    }
    assert_limited(&berth.send(via("10.0.0.5", "203.0.113.5", "berth_c")).await);
    // Another client through the same proxy has its own bucket.
    let other = berth.send(via("10.0.0.5", "203.0.113.6", "berth_c")).await;
    assert_eq!(other.status, StatusCode::UNAUTHORIZED, "{}", other.body);
    // A peer that is no trusted proxy cannot choose its address: it is counted as itself.
    for guess in ["berth_a", "berth_b"] {
        assert_eq!(berth.send(via("192.0.2.7", "203.0.113.7", guess)).await.status, StatusCode::UNAUTHORIZED);
    }
    assert_limited(&berth.send(via("192.0.2.7", "203.0.113.8", "berth_c")).await);

    // The audit log names the client, not the proxy.
    let tenant = berth.platform.ensure_tenant("acme", "Acme", Isolation::Soft).await.expect("tenant");
    let dana = berth.person("dana@acme.example", Role::Member, Some(tenant)).await;
    let (_, token) = berth.token(&dana, &[]).await;
    let mut denied = from("10.0.0.5", api_get("/api/v1/audit", &token));
    denied.headers_mut().insert("x-forwarded-for", "198.51.100.23".parse().expect("header"));
    assert_eq!(berth.send(denied).await.status, StatusCode::FORBIDDEN);
    let source: Option<String> =
        sqlx::query_scalar("SELECT source FROM audit_events WHERE outcome = 'denied' ORDER BY id DESC LIMIT 1")
            .fetch_one(berth.platform.db())
            .await
            .expect("the denial's row");
    assert_eq!(source.as_deref(), Some("198.51.100.23"));
}
