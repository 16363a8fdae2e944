//! The authenticating proxy through the real router, in front of the simulated fleet's
//! real servers: who opens a notebook, what reaches it, kernel WebSockets, and endpoints
//! that answer only their API key.

use axum::body::Body;
use berth_domain::launch::LaunchRequest;
use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use berth_platform::accounts::User;
use futures_util::{SinkExt, StreamExt};
use http::{Request, StatusCode, header};
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

/// A browser loading `path` as a page, with `cookie`.
async fn open(berth: &Berth, path: &str, cookie: Option<&str>) -> Reply {
    let mut request = Request::get(path).header(header::ACCEPT, "text/html").header("sec-fetch-dest", "document");
    if let Some(cookie) = cookie {
        request = request.header(header::COOKIE, cookie);
    }
    berth.send(request.body(Body::empty()).expect("request")).await
}

async fn with_key(berth: &Berth, path: &str, key: &str) -> Reply {
    let request = Request::get(path).header(header::AUTHORIZATION, format!("Bearer {key}"));
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
async fn the_owner_and_their_tenant_admin_open_the_notebook_everyone_else_gets_the_same_404() {
    let berth = Berth::start_running().await;
    let (owner, colleague, admin, stranger) = people(&berth).await;
    let staff = berth.person("root@berth.example", Role::PlatformAdmin, None).await;
    let id = berth.launch_ready(&owner, notebook("lab")).await;
    let lab = format!("/env/{id}/lab");

    let owners = berth.sign_in(&owner.email, None).await;
    let page = open(&berth, &lab, Some(&owners)).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("<h1>JupyterLab</h1>") && page.body.contains("lab"), "{}", page.body);
    assert_eq!(opened(&berth, &id).await, 1, "opening the notebook is audited");
    let status = berth.get(&format!("/env/{id}/api/status"), Some(&owners)).await;
    assert_eq!(status.status, StatusCode::OK, "{}", status.body);
    assert_eq!(opened(&berth, &id).await, 1, "the page's own requests are not");
    let root = berth.get(&format!("/env/{id}"), Some(&owners)).await;
    assert_eq!(root.header("location"), Some(format!("/env/{id}/lab").as_str()), "Jupyter's own redirect");

    // The JSON API names the Berth URL and keeps the notebook's own token to itself.
    let (_, token) = berth.token(&owner, &["environment.read"]).await;
    let listed = berth.api(http::Method::GET, &format!("/api/v1/environments/{id}"), "", Some(&token)).await;
    let listed: Value = serde_json::from_str(&listed.body).expect("JSON");
    assert_eq!(listed["url"], format!("http://127.0.0.1:3000/env/{id}/lab"));
    assert_eq!(listed["connection"], Value::Null, "{listed}");

    let admins = berth.sign_in(&admin.email, None).await;
    assert_eq!(open(&berth, &lab, Some(&admins)).await.status, StatusCode::OK, "their tenant admin opens it");

    let missing = open(&berth, "/env/00000000-0000-4000-8000-000000000000/lab", Some(&owners)).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    for (who, user) in [("a colleague", &colleague), ("another tenant's member", &stranger), ("platform staff", &staff)]
    {
        let cookie = berth.sign_in(&user.email, None).await;
        let denials = berth.denials_by(user.id).await;
        let reply = open(&berth, &lab, Some(&cookie)).await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{who}: {}", reply.body);
        assert_eq!(reply.body, missing.body, "{who} learns nothing a missing id would not tell");
        assert_eq!(berth.denials_by(user.id).await - denials, 1, "{who}: the denial is audited");
        // Not through a WebSocket or an API path either.
        let api = berth.get(&format!("/env/{id}/api/status"), Some(&cookie)).await;
        assert_eq!(api.status, StatusCode::NOT_FOUND, "{who}");
    }
    assert_eq!(opened(&berth, &id).await, 2);

    // Signed out: a browser is sent to sign in and back; anything else is told to sign in.
    let away = open(&berth, &format!("{lab}?reset"), None).await;
    assert_eq!(away.status, StatusCode::SEE_OTHER);
    let next = format!("/login?next=/env/{id}/lab%3Freset");
    assert_eq!(away.header("location"), Some(next.as_str()));
    assert_eq!(berth_app::serverfns::safe_next(Some(&format!("{lab}?reset"))), format!("{lab}?reset"));
    let script = berth.get(&format!("/env/{id}/api/status"), None).await;
    assert_eq!(script.status, StatusCode::UNAUTHORIZED);

    // Before it is ready (booked for later), the owner is told so, and the page tries again.
    let later = LaunchRequest { start: super::in_hours(3), ..notebook("later") };
    let early = berth.platform.launch(&owner.caller(meta()), &later).await.expect("launch").id;
    let soon = open(&berth, &format!("/env/{early}/lab"), Some(&owners)).await;
    assert_eq!(soon.status, StatusCode::SERVICE_UNAVAILABLE, "{}", soon.body);
    assert!(soon.body.contains("this environment is requested; it can be opened once it is ready"), "{}", soon.body);
    assert!(soon.body.contains("http-equiv=\"refresh\""), "{}", soon.body);
    assert_eq!(soon.header("retry-after"), Some("5"));
}

#[tokio::test]
async fn the_notebook_sees_neither_berths_session_nor_can_it_set_it() {
    let berth = Berth::start_running().await;
    let (owner, ..) = people(&berth).await;
    let id = berth.launch_ready(&owner, notebook("lab")).await;
    let session = berth.sign_in(&owner.email, None).await;
    let request = Request::post(format!("/env/{id}/api/berth/echo?x=1"))
        .header(header::COOKIE, format!("_xsrf=abc; {session}; theme=dark"))
        .header(header::AUTHORIZATION, "token guessed-by-the-browser")
        .header(header::HOST, "berth.example:3000")
        .header(header::CONNECTION, "keep-alive, x-hop")
        .header("x-hop", "1")
        .body(Body::from("{}"))
        .expect("request");
    let reply = berth.send(request).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let seen: Value = serde_json::from_str(&reply.body).expect("echo");
    let headers = &seen["headers"];
    assert_eq!(seen["path"], format!("/env/{id}/api/berth/echo"), "a notebook gets its whole path");
    assert_eq!(seen["query"], "x=1");
    assert_eq!(headers["cookie"], "_xsrf=abc; theme=dark", "Berth's session cookie is taken off");
    let token = headers["authorization"].as_str().expect("authorization");
    assert!(token.starts_with("token ") && !token.contains("guessed"), "the notebook's own token: {token}");
    assert_eq!(headers["host"], "berth.example:3000", "Jupyter compares a WebSocket's Origin with the Host");
    assert_eq!(headers["x-forwarded-proto"], "http");
    assert!(headers.get("x-hop").is_none(), "connection-scoped headers stay");

    // The simulated notebook refuses requests without its token: only the proxy gets in.
    let fleet = berth.fleet.as_ref().expect("fleet");
    let port = fleet.world().serving[&id];
    let direct = reqwest::get(format!("http://127.0.0.1:{port}/env/{id}/api/status")).await.expect("direct");
    assert_eq!(direct.status(), 403);
}

#[tokio::test]
async fn kernel_websockets_pass_through_the_proxy_for_the_owner_only() {
    let berth = Berth::start_running().await;
    let (owner, colleague, ..) = people(&berth).await;
    let id = berth.launch_ready(&owner, notebook("lab")).await;
    let url = berth.serve_on_loopback().await;
    let host = url.trim_start_matches("http://").to_owned();
    let connect = |cookie: String, origin: String| {
        let (host, id) = (host.clone(), id.clone());
        async move {
            let mut request =
                format!("ws://{host}/env/{id}/api/kernels/k1/channels").into_client_request().expect("ws");
            request.headers_mut().insert(header::COOKIE, cookie.parse().expect("cookie"));
            request.headers_mut().insert(header::ORIGIN, origin.parse().expect("origin"));
            let stream = tokio::net::TcpStream::connect(&host).await.expect("connect");
            tokio_tungstenite::client_async(request, stream).await
        }
    };

    let owners = berth.sign_in(&owner.email, None).await;
    let (mut socket, response) = connect(owners.clone(), url.clone()).await.expect("the owner's kernel connects");
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    for text in ["print(1)", "ünïcode ✓"] {
        socket.send(Message::text(text)).await.expect("send");
        let echo = socket.next().await.expect("an answer").expect("a frame");
        assert_eq!(echo, Message::text(text), "the kernel answers through the proxy");
    }
    socket.close(None).await.expect("close");

    let colleagues = berth.sign_in(&colleague.email, None).await;
    let refused = connect(colleagues, url.clone()).await.expect_err("not the colleague's");
    assert!(refused.to_string().contains("404"), "{refused}");
    let elsewhere = connect(owners, "https://evil.example".into()).await.expect_err("not from another site");
    assert!(elsewhere.to_string().contains("403"), "{elsewhere}");
}

#[tokio::test]
async fn an_endpoint_answers_its_api_key_only() {
    let berth = Berth::start_running().await;
    let (owner, ..) = people(&berth).await;
    let id = berth.launch_ready(&owner, endpoint("serve")).await;
    let models = format!("/env/{id}/v1/models");

    let none = berth.get(&models, None).await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED);
    assert_eq!(none.header("www-authenticate"), Some("Bearer"));
    assert_eq!(with_key(&berth, &models, "berth_ep_not-the-key").await.status, StatusCode::UNAUTHORIZED);
    let session = berth.sign_in(&owner.email, None).await;
    let owner_without_key = berth.get(&models, Some(&session)).await;
    assert_eq!(owner_without_key.status, StatusCode::UNAUTHORIZED, "a session is no API key");
    assert!(owner_without_key.body.contains("Authorization: Bearer"), "{}", owner_without_key.body);

    let key = berth.platform.reveal_endpoint_key(&owner.caller(meta()), &id).await.expect("key");
    let answer = with_key(&berth, &models, &key).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let listed: Value = serde_json::from_str(&answer.body).expect("JSON");
    assert_eq!(listed["data"][0]["id"], "vllm/vllm-openai:v0.6.3");
    assert_eq!(answer.header("content-security-policy"), Some("sandbox; default-src 'none'"));
    // A key of one endpoint opens no other; an id that names nothing answers the same 401.
    let other = berth.launch_ready(&owner, endpoint("other")).await;
    assert_eq!(with_key(&berth, &format!("/env/{other}/v1/models"), &key).await.status, StatusCode::UNAUTHORIZED);
    let nothing = "/env/00000000-0000-4000-8000-000000000000/v1/models";
    assert_eq!(with_key(&berth, nothing, &key).await.status, StatusCode::UNAUTHORIZED);

    // What reaches the model server: the path without Berth's prefix, its own key, no cookies.
    let request = Request::post(format!("/env/{id}/berth/echo"))
        .header(header::AUTHORIZATION, format!("Bearer {key}"))
        .header(header::COOKIE, session.clone())
        .body(Body::empty())
        .expect("request");
    let seen: Value = serde_json::from_str(&berth.send(request).await.body).expect("echo");
    assert_eq!(seen["path"], "/berth/echo");
    assert!(seen["headers"].get("cookie").is_none(), "{seen}");
    let forwarded = seen["headers"]["authorization"].as_str().expect("authorization");
    assert!(forwarded.starts_with("Bearer ") && !forwarded.contains(&key), "the user's key stays with Berth");

    let completion = Request::post(format!("/env/{id}/v1/completions"))
        .header(header::AUTHORIZATION, format!("Bearer {key}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(r#"{"prompt": "hello"}"#))
        .expect("request");
    let reply = berth.send(completion).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(reply.body.contains("you said: hello"), "{}", reply.body);
}
