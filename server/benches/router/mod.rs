//! Requests through the real router as a browser sends them, and the figures the server
//! benchmarks print; shared by `fleet_page` and `usage_page`.
#![allow(dead_code)]

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use berth_platform::now_ms;
use http::{Request, StatusCode, header};
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
