//! Pages as a browser gets them from the server: what answers 404.

use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use http::StatusCode;

use super::Berth;

#[tokio::test]
async fn the_launch_page_of_an_offering_that_does_not_exist_is_not_found() {
    let berth = Berth::start(None).await;
    let tenant = berth.platform.ensure_tenant("tenant-a", "Tenant A", Isolation::Soft).await.expect("tenant");
    berth.person("dana@example.com", Role::Member, Some(tenant)).await;
    let cookie = berth.sign_in("dana@example.com", None).await;
    let known = berth.get("/launch/notebook", Some(&cookie)).await;
    assert_eq!(known.status, StatusCode::OK);
    assert!(known.body.contains("Launch a Jupyter notebook"), "the form");
    let unknown = berth.get("/launch/quantum-annealer", Some(&cookie)).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert!(unknown.body.contains("Page not found"), "the not-found page");
}
