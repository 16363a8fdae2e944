//! The authenticating proxy through the real router, in front of the simulated fleet's
//! real servers: each environment on its own origin (`<id>.localhost:3000` beside a Berth
//! at `http://127.0.0.1:3000`), signed in there by a single-use ticket from the portal; who
//! opens a notebook, what reaches it, kernel WebSockets, and endpoints that answer only
//! their API key.

use axum::body::Body;
use berth_domain::launch::LaunchRequest;
use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use berth_platform::people::User;
use futures_util::{SinkExt, StreamExt};
use http::{Method, Request, StatusCode, header};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use super::{Berth, Reply, meta};

fn notebook(name: &str) -> LaunchRequest {
    LaunchRequest {
        offering: "notebook".into(),
        size: "h100-1g.10gb".into(),
        name: name.into(),
        hours: "2".into(),
        ..LaunchRequest::default()
    }
}

fn endpoint(name: &str) -> LaunchRequest {
    LaunchRequest {
        offering: "inference".into(),
        size: "l40s-1".into(),
        name: name.into(),
        hours: "2".into(),
        image: "vllm/vllm-openai:v0.6.3".into(),
        ..LaunchRequest::default()
    }
}

/// Environment `id`'s host and origin beside the test Berth.
fn host(id: &str) -> String {
    format!("{id}.localhost:3000")
}

fn origin(id: &str) -> String {
    format!("http://{id}.localhost:3000")
}

const PORTAL: &str = "http://127.0.0.1:3000";
const MISSING: &str = "00000000-0000-4000-8000-000000000000";

/// A request to `path` on `on` (a host; the portal's when `None`), as a browser loading a
/// page when `page`, with `cookie`.
async fn request(berth: &Berth, on: Option<&str>, path: &str, cookie: Option<&str>, page: bool) -> Reply {
    let mut request = Request::get(path).header(header::HOST, on.unwrap_or("127.0.0.1:3000"));
    if page {
        request = request.header(header::ACCEPT, "text/html").header("sec-fetch-dest", "document");
    }
    if let Some(cookie) = cookie {
        request = request.header(header::COOKIE, cookie);
    }
    berth.send(request.body(Body::empty()).expect("request")).await
}

/// A page load of `path` on environment `id`'s origin.
async fn page_on(berth: &Berth, id: &str, path: &str, cookie: Option<&str>) -> Reply {
    request(berth, Some(&host(id)), path, cookie, true).await
}

/// A script's request to `path` on environment `id`'s origin.
async fn fetch_on(berth: &Berth, id: &str, path: &str, cookie: Option<&str>) -> Reply {
    request(berth, Some(&host(id)), path, cookie, false).await
}

/// "Open JupyterLab" on the portal with the portal's `cookie`.
async fn open(berth: &Berth, id: &str, cookie: Option<&str>) -> Reply {
    request(berth, None, &format!("/environments/{id}/open?next=/lab"), cookie, true).await
}

/// The ticket of an open route's redirect, checking where it leads.
fn ticket_of(reply: &Reply, id: &str) -> String {
    assert_eq!(reply.status, StatusCode::SEE_OTHER, "{}", reply.body);
    let location = reply.header("location").expect("a redirect");
    let rest = location
        .strip_prefix(&format!("{}/_berth/auth?ticket=", origin(id)))
        .unwrap_or_else(|| panic!("not to the environment's origin: {location}"));
    let (ticket, next) = rest.split_once("&next=").expect("next");
    assert_eq!(next, "/lab");
    assert_eq!(reply.header("referrer-policy"), Some("no-referrer"), "the ticket stays out of Referer");
    ticket.to_owned()
}

/// Redeems `ticket` on environment `id`'s origin.
async fn redeem(berth: &Berth, id: &str, ticket: &str) -> Reply {
    page_on(berth, id, &format!("/_berth/auth?ticket={ticket}&next=/lab"), None).await
}

/// Opens notebook `id` with the portal's `cookie` and redeems the ticket on its origin: the
/// cookie of that origin, as the browser sends it back.
async fn sign_in_on(berth: &Berth, id: &str, portal_cookie: &str) -> String {
    let ticket = ticket_of(&open(berth, id, Some(portal_cookie)).await, id);
    let reply = redeem(berth, id, &ticket).await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER, "{}", reply.body);
    assert_eq!(reply.header("location"), Some("/lab"));
    reply.cookie().expect("the environment's origin sets its own cookie")
}

async fn with_key(berth: &Berth, id: &str, path: &str, key: &str) -> Reply {
    let request =
        Request::get(path).header(header::HOST, host(id)).header(header::AUTHORIZATION, format!("Bearer {key}"));
    berth.send(request.body(Body::empty()).expect("request")).await
}

async fn opened(berth: &Berth, id: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE action = 'environment.open' AND target = ?")
        .bind(id)
        .fetch_one(berth.platform.db())
        .await
        .expect("count")
}

/// Tenant A with an owner, a colleague and a tenant admin; tenant B with a member.
async fn people(berth: &Berth) -> (User, User, User, User) {
    let p = &berth.platform;
    let a = p.ensure_tenant("tenant-a", "Tenant A", Isolation::Soft).await.expect("tenant A");
    let b = p.ensure_tenant("tenant-b", "Tenant B", Isolation::Soft).await.expect("tenant B");
    (
        berth.person("owner@a.example", Role::Member, Some(a)).await,
        berth.person("colleague@a.example", Role::Member, Some(a)).await,
        berth.person("admin@a.example", Role::TenantAdmin, Some(a)).await,
        berth.person("member@b.example", Role::Member, Some(b)).await,
    )
}

#[tokio::test]
async fn the_owner_and_their_tenant_admin_open_the_notebook_on_its_origin_everyone_else_gets_the_same_404() {
    let berth = Berth::start_running().await;
    let (owner, colleague, admin, stranger) = people(&berth).await;
    let staff = berth.person("root@berth.example", Role::PlatformAdmin, None).await;
    let id = berth.launch_ready(&owner, notebook("lab")).await;

    let owners = berth.sign_in(&owner.email, None).await;
    let env_cookie = sign_in_on(&berth, &id, &owners).await;
    assert!(env_cookie.starts_with("berth_env="), "{env_cookie}");
    assert_eq!(opened(&berth, &id).await, 1, "opening the notebook is audited");
    let page = page_on(&berth, &id, "/lab", Some(&env_cookie)).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("<h1>JupyterLab</h1>"), "{}", page.body);
    let status = fetch_on(&berth, &id, "/api/status", Some(&env_cookie)).await;
    assert_eq!(status.status, StatusCode::OK, "{}", status.body);
    assert_eq!(opened(&berth, &id).await, 1, "the page's own requests are not");
    let root = fetch_on(&berth, &id, "/", Some(&env_cookie)).await;
    assert_eq!(root.header("location"), Some("/lab"), "Jupyter's own redirect, at its origin's root");

    // Berth's session opens nothing on the environment's origin, and the portal no longer
    // proxies: an old link goes through the open route to the notebook's origin.
    let portal_only = page_on(&berth, &id, "/lab", Some(&owners)).await;
    assert_eq!(portal_only.status, StatusCode::SEE_OTHER);
    assert_eq!(portal_only.header("location"), Some(format!("{PORTAL}/environments/{id}/open?next=/lab").as_str()));
    let old = request(&berth, None, &format!("/env/{id}/lab?reset"), Some(&owners), true).await;
    assert_eq!(old.status, StatusCode::SEE_OTHER);
    assert_eq!(old.header("location"), Some(format!("/environments/{id}/open?next=/lab%3Freset").as_str()));
    assert!(request(&berth, None, "/lab", Some(&owners), true).await.body.contains("Page not found"));

    // The JSON API names the notebook's origin and keeps its own token to itself.
    let (_, token) = berth.token(&owner, &["environment.read"]).await;
    let listed = berth.api(Method::GET, &format!("/api/v1/environments/{id}"), "", Some(&token)).await;
    let listed: Value = serde_json::from_str(&listed.body).expect("JSON");
    assert_eq!(listed["url"], format!("{}/lab", origin(&id)));
    assert_eq!(listed["connection"], Value::Null, "{listed}");

    let admins = berth.sign_in(&admin.email, None).await;
    let admin_cookie = sign_in_on(&berth, &id, &admins).await;
    let admin_page = page_on(&berth, &id, "/lab", Some(&admin_cookie)).await;
    assert_eq!(admin_page.status, StatusCode::OK, "their tenant admin opens it");

    let missing = open(&berth, MISSING, Some(&owners)).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    for (who, user) in [("a colleague", &colleague), ("another tenant's member", &stranger), ("platform staff", &staff)]
    {
        let cookie = berth.sign_in(&user.email, None).await;
        let denials = berth.denials_by(user.id).await;
        let reply = open(&berth, &id, Some(&cookie)).await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{who}: {}", reply.body);
        assert_eq!(reply.body, missing.body, "{who} learns nothing a missing id would not tell");
        assert_eq!(berth.denials_by(user.id).await - denials, 1, "{who}: the denial is audited");
        // Nothing of theirs opens the notebook's origin either.
        let api = fetch_on(&berth, &id, "/api/status", Some(&cookie)).await;
        assert_eq!(api.status, StatusCode::UNAUTHORIZED, "{who}");
    }
    assert_eq!(opened(&berth, &id).await, 2);

    // Signed out: a browser goes through the portal (to sign in) and back; anything else
    // is told to sign in.
    let away = page_on(&berth, &id, "/lab?reset", None).await;
    assert_eq!(away.status, StatusCode::SEE_OTHER);
    let to_portal = format!("{PORTAL}/environments/{id}/open?next=/lab%3Freset");
    assert_eq!(away.header("location"), Some(to_portal.as_str()));
    let signed_out = request(&berth, None, &format!("/environments/{id}/open?next=/lab%3Freset"), None, true).await;
    assert_eq!(signed_out.status, StatusCode::SEE_OTHER);
    let to_login = format!("/login?next=/environments/{id}/open%3Fnext%3D/lab%253Freset");
    assert_eq!(signed_out.header("location"), Some(to_login.as_str()));
    assert_eq!(fetch_on(&berth, &id, "/api/status", None).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        request(&berth, None, &format!("/environments/{id}/open"), None, false).await.status,
        StatusCode::UNAUTHORIZED
    );

    // Before it is ready (booked for later), the owner is told so, and the page tries again.
    let later = LaunchRequest { start: super::in_hours(3), ..notebook("later") };
    let early = berth.platform.launch(&owner.caller(meta()), &later).await.expect("launch").id;
    let early_cookie = sign_in_on(&berth, &early, &owners).await;
    let soon = page_on(&berth, &early, "/lab", Some(&early_cookie)).await;
    assert_eq!(soon.status, StatusCode::SERVICE_UNAVAILABLE, "{}", soon.body);
    assert!(soon.body.contains("this environment is requested; it can be opened once it is ready"), "{}", soon.body);
    assert!(soon.body.contains("http-equiv=\"refresh\""), "{}", soon.body);
    assert_eq!(soon.header("retry-after"), Some("5"));
}

#[tokio::test]
async fn a_ticket_opens_once_soon_and_only_its_own_environment_for_whoever_still_may() {
    let berth = Berth::start_running().await;
    let (owner, _, admin, _) = people(&berth).await;
    let a = berth.launch_ready(&owner, notebook("lab-a")).await;
    let b = berth.launch_ready(&owner, notebook("lab-b")).await;
    let owners = berth.sign_in(&owner.email, None).await;

    // Single use.
    let ticket = ticket_of(&open(&berth, &a, Some(&owners)).await, &a);
    assert_eq!(redeem(&berth, &a, &ticket).await.status, StatusCode::SEE_OTHER);
    let again = redeem(&berth, &a, &ticket).await;
    assert_eq!(again.status, StatusCode::UNAUTHORIZED, "{}", again.body);
    assert_eq!(again.set_cookie(), None);
    assert!(again.body.contains("Open it again from Berth"), "{}", again.body);
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM environment_tickets")
        .fetch_one(berth.platform.db())
        .await
        .expect("count");
    assert_eq!(stored, 0, "a redeemed ticket is gone");

    // Short-lived.
    let ticket = ticket_of(&open(&berth, &a, Some(&owners)).await, &a);
    sqlx::query("UPDATE environment_tickets SET created_at = created_at - 61000, expires_at = expires_at - 61000")
        .execute(berth.platform.db())
        .await
        .expect("age the ticket");
    let expired = redeem(&berth, &a, &ticket).await;
    assert_eq!((expired.status, expired.set_cookie()), (StatusCode::UNAUTHORIZED, None));

    // For its own environment only, and gone once tried on another.
    let ticket = ticket_of(&open(&berth, &a, Some(&owners)).await, &a);
    let elsewhere = redeem(&berth, &b, &ticket).await;
    assert_eq!((elsewhere.status, elsewhere.set_cookie()), (StatusCode::UNAUTHORIZED, None));
    assert_eq!(redeem(&berth, &a, &ticket).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(redeem(&berth, &a, "not-a-ticket").await.status, StatusCode::UNAUTHORIZED);

    // A session of A's origin is refused on B's: a browser is sent for one of B's own.
    let cookie_a = sign_in_on(&berth, &a, &owners).await;
    assert_eq!(fetch_on(&berth, &a, "/api/status", Some(&cookie_a)).await.status, StatusCode::OK);
    assert_eq!(fetch_on(&berth, &b, "/api/status", Some(&cookie_a)).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(page_on(&berth, &b, "/lab", Some(&cookie_a)).await.status, StatusCode::SEE_OTHER);
    // A forged cookie beside the real one does not get in the way.
    let both = format!("berth_env=forged; {cookie_a}");
    assert_eq!(fetch_on(&berth, &a, "/api/status", Some(&both)).await.status, StatusCode::OK);

    // Bound to its user: the tenant admin's ticket and session end with their access.
    let admins = berth.sign_in(&admin.email, None).await;
    let admin_ticket = ticket_of(&open(&berth, &a, Some(&admins)).await, &a);
    let admin_cookie = sign_in_on(&berth, &a, &admins).await;
    assert_eq!(fetch_on(&berth, &a, "/api/status", Some(&admin_cookie)).await.status, StatusCode::OK);
    sqlx::query("UPDATE users SET role = 'member' WHERE id = ?")
        .bind(admin.id)
        .execute(berth.platform.db())
        .await
        .expect("demote");
    assert_eq!(fetch_on(&berth, &a, "/api/status", Some(&admin_cookie)).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(redeem(&berth, &a, &admin_ticket).await.status, StatusCode::UNAUTHORIZED, "their ticket ended too");
    assert_eq!(open(&berth, &a, Some(&admins)).await.status, StatusCode::NOT_FOUND, "and no new one");

    // Signing out of Berth ends the owner's sessions on environments' origins.
    let cookie_b = sign_in_on(&berth, &b, &owners).await;
    let signed_out = berth.call("/api/sign_out", "", Some(&owners)).await;
    assert!(signed_out.status.is_success() || signed_out.status.is_redirection(), "{}", signed_out.status);
    assert_eq!(fetch_on(&berth, &a, "/api/status", Some(&cookie_a)).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(fetch_on(&berth, &b, "/api/status", Some(&cookie_b)).await.status, StatusCode::UNAUTHORIZED);

    // Sessions end when the environment stops, and when their user is suspended.
    let owners = berth.sign_in(&owner.email, None).await;
    let cookie_b = sign_in_on(&berth, &b, &owners).await;
    berth.platform.stop(&owner.caller(meta()), &b).await.expect("stop");
    assert_eq!(fetch_on(&berth, &b, "/api/status", Some(&cookie_b)).await.status, StatusCode::UNAUTHORIZED);
    let cookie_a = sign_in_on(&berth, &a, &owners).await;
    sqlx::query("UPDATE users SET status = 'suspended' WHERE id = ?")
        .bind(owner.id)
        .execute(berth.platform.db())
        .await
        .expect("suspend");
    assert_eq!(fetch_on(&berth, &a, "/api/status", Some(&cookie_a)).await.status, StatusCode::UNAUTHORIZED);
    let sessions: i64 = sqlx::query_scalar("SELECT count(*) FROM environment_sessions")
        .fetch_one(berth.platform.db())
        .await
        .expect("count");
    assert_eq!(sessions, 0, "every session ended");
}

#[tokio::test]
async fn the_notebook_sees_none_of_berths_cookies_nor_can_it_set_them() {
    let berth = Berth::start_running().await;
    let (owner, ..) = people(&berth).await;
    let id = berth.launch_ready(&owner, notebook("lab")).await;
    let other = berth.launch_ready(&owner, notebook("other")).await;
    let session = berth.sign_in(&owner.email, None).await;
    let env_cookie = sign_in_on(&berth, &id, &session).await;
    let post = |from: String| {
        Request::post("/api/berth/echo?x=1")
            .header(header::HOST, host(&id))
            .header(header::ORIGIN, from)
            .header(header::COOKIE, format!("_xsrf=abc; {session}; {env_cookie}; theme=dark"))
            .header(header::AUTHORIZATION, "token guessed-by-the-browser")
            .header(header::CONNECTION, "keep-alive, x-hop")
            .header("x-hop", "1")
            .body(Body::from("{}"))
            .expect("request")
    };
    let reply = berth.send(post(origin(&id))).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    // The notebook's own scripts run (not the portal's policy), framed only by itself.
    assert_eq!(reply.header("content-security-policy"), Some("frame-ancestors 'self'"));
    let seen: Value = serde_json::from_str(&reply.body).expect("echo");
    let headers = &seen["headers"];
    assert_eq!(seen["path"], "/api/berth/echo", "a notebook serves at its origin's root");
    assert_eq!(seen["query"], "x=1");
    assert_eq!(headers["cookie"], "_xsrf=abc; theme=dark", "Berth's cookies are taken off");
    let token = headers["authorization"].as_str().expect("authorization");
    assert!(token.starts_with("token ") && !token.contains("guessed"), "the notebook's own token: {token}");
    assert_eq!(headers["host"], host(&id), "Jupyter compares a WebSocket's Origin with the Host");
    assert_eq!(headers["x-forwarded-proto"], "http");
    assert!(headers.get("x-hop").is_none(), "connection-scoped headers stay");
    let set: Vec<&str> = reply.headers.get_all(header::SET_COOKIE).iter().filter_map(|v| v.to_str().ok()).collect();
    assert_eq!(set, ["workload_cookie=kept; Path=/"], "the workload sets its own cookies, never Berth's");

    // Another environment's page (same site, other origin) cannot write here.
    let forged = berth.send(post(origin(&other))).await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN, "{}", forged.body);
    assert_eq!(berth.send(post(PORTAL.to_owned())).await.status, StatusCode::FORBIDDEN);

    // The portal's routes are not on an environment's origin, nor the reverse.
    let health = fetch_on(&berth, &id, "/healthz", Some(&env_cookie)).await;
    assert_ne!(health.body, "ok", "proxied to the notebook, not answered by Berth");
    assert_eq!(request(&berth, None, "/healthz", None, false).await.body, "ok");

    // The simulated notebook refuses requests without its token: only the proxy gets in.
    let fleet = berth.fleet.as_ref().expect("fleet");
    let port = fleet.world().serving[&id];
    let direct = reqwest::get(format!("http://127.0.0.1:{port}/api/status")).await.expect("direct");
    assert_eq!(direct.status(), 403);
}

#[tokio::test]
async fn kernel_websockets_work_on_the_notebooks_origin_for_its_own_pages_only() {
    let berth = Berth::start_running().await;
    let (owner, ..) = people(&berth).await;
    let id = berth.launch_ready(&owner, notebook("lab")).await;
    let other = berth.launch_ready(&owner, notebook("other")).await;
    let url = berth.serve_on_loopback().await;
    let address = url.trim_start_matches("http://").to_owned();
    let connect = |id: String, cookie: String, from: String| {
        let address = address.clone();
        async move {
            // The browser's view: the notebook's origin; the socket goes to where Berth listens.
            let mut request = format!("ws://{}/api/kernels/k1/channels", host(&id)).into_client_request().expect("ws");
            request.headers_mut().insert(header::COOKIE, cookie.parse().expect("cookie"));
            request.headers_mut().insert(header::ORIGIN, from.parse().expect("origin"));
            let stream = tokio::net::TcpStream::connect(&address).await.expect("connect");
            tokio_tungstenite::client_async(request, stream).await
        }
    };

    let owners = berth.sign_in(&owner.email, None).await;
    let cookie = sign_in_on(&berth, &id, &owners).await;
    let (mut socket, response) = connect(id.clone(), cookie.clone(), origin(&id)).await.expect("the kernel connects");
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    for text in ["print(1)", "ünïcode ✓"] {
        socket.send(Message::text(text)).await.expect("send");
        let echo = socket.next().await.expect("an answer").expect("a frame");
        assert_eq!(echo, Message::text(text), "the kernel answers through the proxy");
    }
    socket.close(None).await.expect("close");

    let other_cookie = sign_in_on(&berth, &other, &owners).await;
    let wrong = connect(id.clone(), other_cookie, origin(&id)).await.expect_err("another environment's session");
    assert!(wrong.to_string().contains("401"), "{wrong}");
    for from in [origin(&other), PORTAL.to_owned(), "https://evil.example".to_owned()] {
        let refused = connect(id.clone(), cookie.clone(), from.clone()).await.expect_err("not from elsewhere");
        assert!(refused.to_string().contains("403"), "{from}: {refused}");
    }
}

#[tokio::test]
async fn an_endpoint_answers_its_api_key_only_on_its_own_origin() {
    let berth = Berth::start_running().await;
    let (owner, ..) = people(&berth).await;
    let id = berth.launch_ready(&owner, endpoint("serve")).await;

    let none = fetch_on(&berth, &id, "/v1/models", None).await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED);
    assert_eq!(none.header("www-authenticate"), Some("Bearer"));
    assert_eq!(with_key(&berth, &id, "/v1/models", "berth_ep_not-the-key").await.status, StatusCode::UNAUTHORIZED);
    let session = berth.sign_in(&owner.email, None).await;
    let owner_without_key = fetch_on(&berth, &id, "/v1/models", Some(&session)).await;
    assert_eq!(owner_without_key.status, StatusCode::UNAUTHORIZED, "a session is no API key");
    assert!(owner_without_key.body.contains("Authorization: Bearer"), "{}", owner_without_key.body);
    let opened = open(&berth, &id, Some(&session)).await;
    assert_eq!(opened.status, StatusCode::UNAUTHORIZED, "no ticket for an endpoint: {}", opened.body);
    assert!(opened.body.contains("Authorization: Bearer"), "{}", opened.body);

    let key = berth.platform.reveal_endpoint_key(&owner.caller(meta()), &id).await.expect("key");
    let answer = with_key(&berth, &id, "/v1/models", &key).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let listed: Value = serde_json::from_str(&answer.body).expect("JSON");
    assert_eq!(listed["data"][0]["id"], "vllm/vllm-openai:v0.6.3");
    assert_eq!(answer.header("content-security-policy"), Some("sandbox; default-src 'none'"));
    // A key of one endpoint opens no other; an id that names nothing answers the same 401.
    let other = berth.launch_ready(&owner, endpoint("other")).await;
    assert_eq!(with_key(&berth, &other, "/v1/models", &key).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(with_key(&berth, MISSING, "/v1/models", &key).await.status, StatusCode::UNAUTHORIZED);
    // The API names the endpoint's origin.
    let (_, token) = berth.token(&owner, &["environment.read"]).await;
    let listed = berth.api(Method::GET, &format!("/api/v1/environments/{id}"), "", Some(&token)).await;
    let listed: Value = serde_json::from_str(&listed.body).expect("JSON");
    assert_eq!(listed["url"], format!("{}/v1", origin(&id)));

    // What reaches the model server: the path as sent, its own key, no cookies either way.
    let request = Request::post("/berth/echo")
        .header(header::HOST, host(&id))
        .header(header::AUTHORIZATION, format!("Bearer {key}"))
        .header(header::COOKIE, format!("{session}; theme=dark"))
        .body(Body::empty())
        .expect("request");
    let reply = berth.send(request).await;
    assert_eq!(reply.set_cookie(), None, "an endpoint's origin sets no cookies");
    let seen: Value = serde_json::from_str(&reply.body).expect("echo");
    assert_eq!(seen["path"], "/berth/echo");
    assert!(seen["headers"].get("cookie").is_none(), "{seen}");
    let forwarded = seen["headers"]["authorization"].as_str().expect("authorization");
    assert!(forwarded.starts_with("Bearer ") && !forwarded.contains(&key), "the user's key stays with Berth");

    let completion = Request::post("/v1/completions")
        .header(header::HOST, host(&id))
        .header(header::AUTHORIZATION, format!("Bearer {key}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(r#"{"prompt": "hello"}"#))
        .expect("request");
    let reply = berth.send(completion).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(reply.body.contains("you said: hello"), "{}", reply.body);
}

/// Where a ticket leads must stay on the environment's origin, and a refused `next` leaves
/// the ticket unspent; no `next` reaches a header unchecked.
#[tokio::test]
async fn a_next_that_leaves_the_environments_origin_is_refused_before_anything_is_spent() {
    let berth = Berth::start_running().await;
    let (owner, ..) = people(&berth).await;
    let id = berth.launch_ready(&owner, notebook("lab")).await;
    let session = berth.sign_in(&owner.email, None).await;
    for hostile in
        ["/%09/evil.example/x", "/%0D%0ASet-Cookie:%20a=b", "//evil.example", "/%5Cevil.example", "/.//evil.example"]
    {
        // On the portal, before a ticket is made.
        let opened =
            request(&berth, None, &format!("/environments/{id}/open?next={hostile}"), Some(&session), true).await;
        assert_eq!(opened.status, StatusCode::BAD_REQUEST, "{hostile}: {}", opened.body);
        assert_eq!(opened.header("location"), None);
        // On the environment's origin, before the ticket is redeemed.
        let ticket = ticket_of(&open(&berth, &id, Some(&session)).await, &id);
        let refused = page_on(&berth, &id, &format!("/_berth/auth?ticket={ticket}&next={hostile}"), None).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{hostile}: {}", refused.body);
        assert_eq!(refused.header("location"), None);
        assert_eq!(refused.cookie(), None);
        let redeemed = redeem(&berth, &id, &ticket).await;
        assert_eq!(
            redeemed.status,
            StatusCode::SEE_OTHER,
            "{hostile}: the refusal spent the ticket: {}",
            redeemed.body
        );
    }
}
