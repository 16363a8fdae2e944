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

/// A platform admin's script puts a node through acceptance, reads why it failed (figure,
/// threshold, raw output), repairs it and sees it available again; the same token cannot
/// skip the lifecycle.
#[tokio::test]
async fn a_script_runs_acceptance_and_repairs_a_node() {
    let berth = Berth::start_running().await;
    let admin = berth.person("root@example.com", Role::PlatformAdmin, None).await;
    let (_, token) = berth.token(&admin, &[]).await;
    let fleet = berth.fleet.clone().expect("a simulated fleet");
    fleet.fail_check("h100-01", berth_domain::node_checks::CheckKind::MemoryErrors);

    let run = berth.api(Method::POST, "/api/v1/nodes/h100-01/checks", r#"{"level": "quick"}"#, Some(&token)).await;
    assert_eq!(run.status, StatusCode::OK, "{}", run.body);
    let run: serde_json::Value = serde_json::from_str(&run.body).expect("json");
    assert_eq!((run["purpose"].as_str(), run["passed"].as_bool()), (Some("acceptance"), Some(false)));
    let memory = run["results"].as_array().expect("results").iter().find(|r| r["check"] == "memory_errors").cloned();
    let memory = memory.expect("the memory check ran");
    assert_eq!((memory["measured"].as_f64(), memory["threshold"].as_f64()), (Some(2.0), Some(0.0)), "{memory}");
    assert!(memory["raw_output"].as_str().unwrap_or_default().contains("Remapped Rows"), "{memory}");

    let health = berth.api(Method::GET, "/api/v1/nodes/h100-01/health", "", Some(&token)).await;
    let health: serde_json::Value = serde_json::from_str(&health.body).expect("json");
    assert_eq!((health["state"].as_str(), health["takes_new_bookings"].as_bool()), (Some("degraded"), Some(false)));
    assert_eq!(health["changes"][0]["by"], serde_json::Value::Null, "the checks' verdict is Berth's");
    assert_eq!(health["changes"][1]["by"], "root@example.com");

    let skip = r#"{"event": "acceptance_passed", "reason": "trust me"}"#;
    let refused = berth.api(Method::POST, "/api/v1/nodes/h100-01/state", skip, Some(&token)).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", refused.body);
    let repair = r#"{"event": "start_repair", "reason": "2 uncorrectable ECC errors"}"#;
    let repaired = berth.api(Method::POST, "/api/v1/nodes/h100-01/state", repair, Some(&token)).await;
    assert_eq!(repaired.status, StatusCode::OK, "{}", repaired.body);
    assert!(repaired.body.contains(r#""state":"available""#), "{}", repaired.body);
}

/// A script reads the image catalog and its tenant's rule, and a launch naming an image from
/// a registry the rule leaves out is refused with the reason, writing nothing.
#[tokio::test]
async fn a_script_reads_the_image_catalog_and_is_held_to_its_tenants_rule() {
    let berth = Berth::start(None).await;
    let tenant = berth.platform.ensure_tenant("tenant-a", "Tenant A", Isolation::Soft).await.expect("tenant");
    let root = berth.person("root@example.com", Role::PlatformAdmin, None).await;
    let root = root.caller(super::meta());
    berth.platform.set_custom_images(&root, tenant, "registries", "ghcr.io").await.expect("rule");
    let member = berth.person("dana@example.com", Role::Member, Some(tenant)).await;
    let (_, token) = berth.token(&member, &[]).await;

    let catalog = berth.api(Method::GET, "/api/v1/images", "", Some(&token)).await;
    assert_eq!(catalog.status, StatusCode::OK, "{}", catalog.body);
    let catalog: serde_json::Value = serde_json::from_str(&catalog.body).expect("json");
    let pytorch = &catalog["images"][0];
    assert_eq!(pytorch["name"], "PyTorch notebook");
    assert_eq!((pytorch["catalog"].as_str(), pytorch["pinned"].as_bool()), (Some("platform"), Some(false)));
    assert_eq!(pytorch["default_for"], serde_json::json!(["notebook"]));
    assert_eq!(
        catalog["custom_images"],
        serde_json::json!([{"tenant": "tenant-a", "rule": "registries", "registries": ["ghcr.io"]}])
    );

    let hub = r#"{"offering": "training", "size": "h100-1", "name": "hub", "hours": "1",
                  "image": "pytorch/pytorch:2.4", "command": "python train.py"}"#;
    let refused = berth.api(Method::POST, "/api/v1/environments", hub, Some(&token)).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", refused.body);
    assert!(refused.body.contains("comes from docker.io, which tenant tenant-a does not allow"), "{}", refused.body);
    let ghcr = hub.replace("pytorch/pytorch:2.4", "ghcr.io/acme/train:1").replace("hub", "ghcr");
    let booked = berth.api(Method::POST, "/api/v1/environments", &ghcr, Some(&token)).await;
    assert_eq!(booked.status, StatusCode::CREATED, "{}", booked.body);
    let envs: i64 =
        sqlx::query_scalar("SELECT count(*) FROM environments").fetch_one(berth.platform.db()).await.expect("count");
    assert_eq!(envs, 1, "the refused request wrote nothing");
}
