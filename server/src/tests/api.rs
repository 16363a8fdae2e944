//! The JSON API as a script uses it.

use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use http::{Method, StatusCode};

use super::Berth;

/// "As soon as possible" through the API: the answer says which start the booking got, and a
/// search that cannot be done is refused with the reason and writes nothing.
#[tokio::test]
async fn a_script_books_as_soon_as_possible_and_learns_the_start() {
    let berth = Berth::start(None).await;
    let tenant = berth.platform.ensure_tenant("tenant-a", "Tenant A", Isolation::Soft).await.expect("tenant");
    let member = berth.person("dana@example.com", Role::Member, Some(tenant)).await;
    let (_, token) = berth.token(&member, &[]).await;
    let asap = r#"{"offering": "notebook", "size": "h100-1g.10gb", "name": "asap", "hours": "2",
                   "earliest_within_days": "3"}"#;
    let booked = berth.api(Method::POST, "/api/v1/environments", asap, Some(&token)).await;
    assert_eq!(booked.status, StatusCode::CREATED, "{}", booked.body);
    let env: serde_json::Value = serde_json::from_str(&booked.body).expect("json");
    let starts = env["starts_at"].as_str().expect("the start it got");
    let starts = chrono::DateTime::parse_from_rfc3339(starts).expect("a time").timestamp_millis();
    assert!((starts - berth_platform::now_ms()).abs() < 60_000, "free now, so it starts now: {starts}");

    let both =
        asap.replace(r#""hours": "2","#, r#""hours": "2", "start": "2030-01-01T10:00","#).replace("asap", "both");
    let refused = berth.api(Method::POST, "/api/v1/environments", &both, Some(&token)).await;
    assert!(refused.status.is_client_error(), "{}: {}", refused.status, refused.body);
    assert!(refused.body.contains("either a start or a number of days"), "{}", refused.body);
    let envs: i64 =
        sqlx::query_scalar("SELECT count(*) FROM environments").fetch_one(berth.platform.db()).await.expect("count");
    assert_eq!(envs, 1, "the refused request wrote nothing");
}
