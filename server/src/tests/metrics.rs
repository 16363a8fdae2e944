//! What an operator's Prometheus scrapes from a running Berth: launches booked and refused
//! with their latency, the reconciler's steps with their failures.

use berth_domain::launch::LaunchRequest;
use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use berth_platform::provisioning::backend::simulated::{Simulated, SimulatedConfig};
use http::{Method, StatusCode};

use super::{Berth, FLEET, meta};

const TOKEN: &str = "scrape-token";

/// Berth with the reconciler on an instant simulated fleet whose every `expose_endpoint`
/// fails, and `/metrics` behind [`TOKEN`].
async fn berth_failing_exposure() -> Berth {
    let faults = vec!["expose_endpoint=fail".parse().expect("fault")];
    let fleet = std::sync::Arc::new(Simulated::new(SimulatedConfig { speed: 0.0, faults, volumes_dir: None }));
    Berth::start_with(None, FLEET, Some(fleet), &["--metrics-token", TOKEN], &[]).await
}

async fn scrape(berth: &Berth) -> String {
    let reply = berth.api(Method::GET, "/metrics", "", Some(TOKEN)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.body
}

/// The value of the series written exactly as `series` (name and labels), if present.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn launches_and_reconciler_steps_are_counted_on_the_scrape() {
    let berth = berth_failing_exposure().await;
    let tenant = berth.platform.ensure_tenant("tenant-a", "Tenant A", Isolation::Soft).await.expect("tenant");
    let dana = berth.person("dana@example.com", Role::Member, Some(tenant)).await;
    let id = berth.launch(&dana, "dana-nb").await;
    let too_long = LaunchRequest {
        offering: "notebook".into(),
        size: "h100-1g.10gb".into(),
        name: "too-long".into(),
        hours: "100000".into(),
        ..LaunchRequest::default()
    };
    berth.platform.launch(&dana.caller(meta()), &too_long).await.expect_err("refused");

    // The notebook provisions until its endpoint fails to be exposed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while berth.platform.environment_of(&dana.caller(meta()), &id).await.expect("env").state.as_str() != "failed" {
        assert!(std::time::Instant::now() < deadline, "dana-nb never failed");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let text = scrape(&berth).await;
    let booked = value(&text, r#"berth_bookings_total{offering="notebook",outcome="booked"}"#);
    assert_eq!(booked, Some(1.0), "{text}");
    let refused = value(&text, r#"berth_bookings_total{offering="notebook",outcome="refused"}"#);
    assert_eq!(refused, Some(1.0), "{text}");
    assert_eq!(value(&text, r#"berth_booking_duration_seconds_count{offering="notebook"}"#), Some(2.0), "{text}");
    let started = value(&text, r#"berth_reconciler_step_duration_seconds_count{step="start_workload"}"#);
    assert_eq!(started, Some(1.0), "{text}");
    let failed = value(&text, r#"berth_reconciler_step_failures_total{step="expose_endpoint"}"#);
    assert!(failed.is_some_and(|n| n >= 1.0), "{text}");
    assert_eq!(value(&text, r#"berth_reconciler_step_failures_total{step="start_workload"}"#), None, "{text}");
    assert_eq!(value(&text, r#"berth_environments{state="failed"}"#), Some(1.0), "{text}");
}
