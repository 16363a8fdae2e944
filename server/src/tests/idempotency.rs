//! `Idempotency-Key` on `POST /api/v1/environments` as a script that retries sees it: the
//! same key and request give the same answer and one booking, at once or one after the
//! other; the same key with another request is refused; another person's same key is
//! theirs.

use std::sync::Arc;

use axum::body::Body;
use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use http::{Method, Request, StatusCode, header};

use super::{Berth, Reply};

const NOTEBOOK: &str = r#"{"offering": "notebook", "size": "h100-1g.10gb", "name": "retried", "hours": "2"}"#;

async fn launch_with_key(berth: &Berth, token: &str, key: &str, body: &str) -> Reply {
    let request = Request::builder()
        .method(Method::POST)
        .uri("/api/v1/environments")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .header("idempotency-key", key)
        .body(Body::from(body.to_owned()))
        .expect("request");
    berth.send(request).await
}

async fn environments(berth: &Berth) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM environments").fetch_one(berth.platform.db()).await.expect("count")
}

async fn reservations(berth: &Berth) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM reservations").fetch_one(berth.platform.db()).await.expect("count")
}

/// Berth with one tenant member and their token.
async fn start() -> (Berth, berth_platform::people::User, String) {
    let berth = Berth::start(None).await;
    let tenant = berth.platform.ensure_tenant("acme", "Acme", Isolation::Soft).await.expect("tenant");
    let dana = berth.person("dana@acme.example", Role::Member, Some(tenant)).await;
    let (_, token) = berth.token(&dana, &[]).await;
    (berth, dana, token)
}

#[tokio::test]
async fn a_retry_with_the_same_key_gets_the_same_booking_and_books_nothing_more() {
    let (berth, _, token) = start().await;
    let first = launch_with_key(&berth, &token, "job-42-attempt", NOTEBOOK).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    // The same request written differently (spacing, order of fields) is the same request.
    let reordered = r#"{"hours":"2","name":"retried","size":"h100-1g.10gb","offering":"notebook"}"#;
    let retry = launch_with_key(&berth, &token, "job-42-attempt", reordered).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.body);
    assert_eq!(retry.body, first.body, "the same answer");
    assert_eq!((environments(&berth).await, reservations(&berth).await), (1, 1), "booked once");

    // Without the key the same request is a second launch (refused here only for its name).
    let unkeyed = berth.api(Method::POST, "/api/v1/environments", NOTEBOOK, Some(&token)).await;
    assert_eq!(unkeyed.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", unkeyed.body);
    assert!(unkeyed.body.contains("already have an active environment"), "{}", unkeyed.body);
}

#[tokio::test]
async fn the_same_key_with_another_request_is_refused_and_writes_nothing() {
    let (berth, _, token) = start().await;
    let first = launch_with_key(&berth, &token, "k1", NOTEBOOK).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    let other = NOTEBOOK.replace(r#""hours": "2""#, r#""hours": "3""#);
    let refused = launch_with_key(&berth, &token, "k1", &other).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", refused.body);
    assert!(refused.body.contains("already used for a different request"), "{}", refused.body);
    assert_eq!((environments(&berth).await, reservations(&berth).await), (1, 1));

    for bad in ["", "two words", &"k".repeat(256)] {
        let reply = launch_with_key(&berth, &token, bad, &other.replace("retried", "other")).await;
        assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{bad:?}: {}", reply.body);
        assert!(reply.body.contains("Idempotency-Key"), "{}", reply.body);
    }
    assert_eq!(environments(&berth).await, 1, "bad keys book nothing");

    // A day later the key is forgotten, and may name a new request.
    sqlx::query(
        "UPDATE launch_idempotency_keys SET created_at = created_at - 86400001, expires_at = expires_at - 86400001",
    )
    .execute(berth.platform.db())
    .await
    .expect("age the key");
    let later = launch_with_key(&berth, &token, "k1", &other.replace("retried", "later")).await;
    assert_eq!(later.status, StatusCode::CREATED, "{}", later.body);
    assert_eq!(environments(&berth).await, 2);
}

#[tokio::test]
async fn a_refused_launch_keeps_no_key_and_another_persons_key_is_their_own() {
    let (berth, _, token) = start().await;
    let tenant = berth.platform.ensure_tenant("globex", "Globex", Isolation::Soft).await.expect("tenant");
    let gil = berth.person("gil@globex.example", Role::Member, Some(tenant)).await;
    let (_, gils) = berth.token(&gil, &[]).await;

    let too_long = NOTEBOOK.replace(r#""hours": "2""#, r#""hours": "9999""#);
    let refused = launch_with_key(&berth, &token, "k1", &too_long).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", refused.body);
    let fixed = launch_with_key(&berth, &token, "k1", NOTEBOOK).await;
    assert_eq!(fixed.status, StatusCode::CREATED, "the key of a refused request is free: {}", fixed.body);

    let theirs = launch_with_key(&berth, &gils, "k1", NOTEBOOK).await;
    assert_eq!(theirs.status, StatusCode::CREATED, "{}", theirs.body);
    let id = |reply: &Reply| serde_json::from_str::<serde_json::Value>(&reply.body).expect("json")["id"].clone();
    assert_ne!(id(&theirs), id(&fixed), "two people, two bookings");
}

/// Many copies of one request with one key at the same moment (as a client that retries on
/// a short timeout sends them): one booking, and every answer names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_retries_with_one_key_book_once() {
    let (berth, _, token) = start().await;
    let berth = Arc::new(berth);
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (berth, token) = (berth.clone(), token.clone());
            tokio::spawn(async move { launch_with_key(&berth, &token, "burst", NOTEBOOK).await })
        })
        .collect();
    let mut ids = std::collections::BTreeSet::new();
    for task in tasks {
        let reply = task.await.expect("task");
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
        let body: serde_json::Value = serde_json::from_str(&reply.body).expect("json");
        ids.insert(body["id"].as_str().expect("id").to_owned());
    }
    assert_eq!(ids.len(), 1, "every answer names the one booking: {ids:?}");
    assert_eq!((environments(&berth).await, reservations(&berth).await), (1, 1));

    // Different keys at the same moment are different launches (names differ so each fits).
    let tasks: Vec<_> = (0..4)
        .map(|i| {
            let (berth, token) = (berth.clone(), token.clone());
            let body = NOTEBOOK.replace("retried", &format!("nb{i}"));
            tokio::spawn(async move { launch_with_key(&berth, &token, &format!("key-{i}"), &body).await })
        })
        .collect();
    for task in tasks {
        let reply = task.await.expect("task");
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
    }
    assert_eq!(environments(&berth).await, 5);
}
