//! Every error of `/api/v1` as a script reads it: an RFC 9457 problem
//! (`application/problem+json`) with `type`, `title`, `status`, `detail` and the request's
//! id, whichever part of Berth refused, and never an internal cause.

use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use http::{Method, StatusCode};

use super::{Berth, Reply};

/// The problem in `reply`, checked for what every problem carries.
fn problem(reply: &Reply, status: StatusCode) -> serde_json::Value {
    assert_eq!(reply.status, status, "{}", reply.body);
    assert_eq!(reply.header("content-type"), Some("application/problem+json"), "{}", reply.body);
    let problem: serde_json::Value = serde_json::from_str(&reply.body).expect("problem json");
    assert_eq!(problem["status"], status.as_u16(), "{problem}");
    for member in ["type", "title", "detail", "request_id"] {
        assert!(problem[member].as_str().is_some_and(|v| !v.is_empty()), "{member} in {problem}");
    }
    assert_eq!(problem["request_id"].as_str(), reply.header("x-request-id"), "the problem names its request");
    problem
}

#[tokio::test]
async fn every_api_error_is_a_problem_with_the_request_id() {
    let berth = Berth::start(None).await;
    let tenant = berth.platform.ensure_tenant("acme", "Acme", Isolation::Soft).await.expect("tenant");
    let dana = berth.person("dana@acme.example", Role::Member, Some(tenant)).await;
    let (_, secret) = berth.token(&dana, &[]).await;
    let token = Some(secret.as_str());

    let anonymous = berth.api(Method::GET, "/api/v1/environments", "", None).await;
    let p = problem(&anonymous, StatusCode::UNAUTHORIZED);
    assert_eq!(p["type"], "about:blank");
    assert_eq!(p["title"], "Unauthorized");
    assert_eq!(anonymous.header("www-authenticate"), Some("Bearer"));
    problem(&berth.api(Method::GET, "/api/v1/agent/plan", "", None).await, StatusCode::UNAUTHORIZED);

    problem(&berth.api(Method::GET, "/api/v1/environments/nope", "", token).await, StatusCode::NOT_FOUND);

    let refused = r#"{"offering": "notebook", "size": "h100-1g.10gb", "name": "nb", "hours": "9999"}"#;
    let p = problem(
        &berth.api(Method::POST, "/api/v1/environments", refused, token).await,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    assert_eq!(p["type"], "urn:berth:problem:refused");
    assert!(p["detail"].as_str().expect("detail").contains("duration"), "{p}");

    // What axum's extractors refuse before any handler runs.
    let p =
        problem(&berth.api(Method::POST, "/api/v1/environments", "{not json", token).await, StatusCode::BAD_REQUEST);
    assert_eq!(p["type"], "urn:berth:problem:invalid-request");
    let p = problem(
        &berth.api(Method::POST, "/api/v1/environments", r#"{"offering": 1}"#, token).await,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    assert!(p["detail"].as_str().expect("detail").contains("offering"), "names the field: {p}");
    // A body is an object: serde alone would read a struct from an array (schemathesis found
    // `[]` marking every notification read).
    for (path, body) in
        [("/api/v1/notifications/read", "[]"), ("/api/v1/environments", r#"["notebook", "s", "n", "1"]"#)]
    {
        let p = problem(&berth.api(Method::POST, path, body, token).await, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(p["type"], "urn:berth:problem:invalid-request", "{path} {body}: {p}");
    }
    let bare = berth.send(
        http::Request::post("/api/v1/environments")
            .header(http::header::AUTHORIZATION, format!("Bearer {secret}"))
            .body(axum::body::Body::from("{}"))
            .expect("request"),
    );
    problem(&bare.await, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    problem(&berth.api(Method::GET, "/api/v1/tenants/abc/members", "", token).await, StatusCode::BAD_REQUEST);

    // Routes and methods the API does not have.
    let p = problem(&berth.api(Method::GET, "/api/v1/no-such-thing", "", token).await, StatusCode::NOT_FOUND);
    assert!(!p["detail"].as_str().expect("detail").contains('<'), "not the portal's page: {p}");
    problem(&berth.api(Method::DELETE, "/api/v1/environments", "", token).await, StatusCode::METHOD_NOT_ALLOWED);

    // Pages keep their own answers.
    let page = berth.get("/no-such-page", None).await;
    assert_eq!(page.status, StatusCode::NOT_FOUND);
    assert_ne!(page.header("content-type"), Some("application/problem+json"));
}

#[tokio::test]
async fn an_internal_error_says_nothing_of_its_cause() {
    let berth = Berth::start(None).await;
    let tenant = berth.platform.ensure_tenant("acme", "Acme", Isolation::Soft).await.expect("tenant");
    let dana = berth.person("dana@acme.example", Role::Member, Some(tenant)).await;
    let (_, token) = berth.token(&dana, &[]).await;
    // A database that lost a table: the query fails inside the platform.
    sqlx::query("ALTER TABLE environments RENAME TO environments_gone")
        .execute(berth.platform.db())
        .await
        .expect("rename");
    let reply = berth.api(Method::GET, "/api/v1/environments", "", Some(&token)).await;
    let p = problem(&reply, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(!reply.body.contains("environments") && !reply.body.to_lowercase().contains("sql"), "{p}");
}
