//! Who sees whose environments: a member their own, a tenant's admins and viewers the
//! tenant's (filtered by person, project and state), platform staff every tenant's; and a
//! viewer, who may not book, meets no launch controls and leaves no denial behind.

use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use http::{Method, StatusCode};
use serde_json::Value;

use super::{Berth, meta};

fn names(reply: &super::Reply) -> Vec<String> {
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let json: Value = serde_json::from_str(&reply.body).expect("json");
    let mut names: Vec<String> = json["environments"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|e| e["name"].as_str().expect("a name").to_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn each_role_lists_what_it_may_see_and_filters_it() {
    let berth = Berth::start_running().await;
    let a = berth.platform.ensure_tenant("tenant-a", "Tenant A", Isolation::Soft).await.expect("tenant");
    let b = berth.platform.ensure_tenant("tenant-b", "Tenant B", Isolation::Soft).await.expect("tenant");
    let dana = berth.person("dana@example.com", Role::Member, Some(a)).await;
    let eli = berth.person("eli@example.com", Role::Member, Some(a)).await;
    let vic = berth.person("vic@example.com", Role::Viewer, Some(a)).await;
    let fay = berth.person("fay@example.com", Role::Member, Some(b)).await;
    let root = berth.person("root@example.com", Role::PlatformAdmin, None).await;
    berth.launch(&dana, "dana-nb").await;
    let ended = berth.launch(&eli, "eli-nb").await;
    berth.launch(&fay, "fay-nb").await;
    berth.platform.stop(&eli.caller(meta()), &ended).await.expect("stop");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while berth.platform.environment_of(&eli.caller(meta()), &ended).await.expect("env").state.as_str() != "released" {
        assert!(std::time::Instant::now() < deadline, "eli-nb never released");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    let (_, viewer) = berth.token(&vic, &[]).await;
    let list = async |query: &str, token: &str| {
        berth.api(Method::GET, &format!("/api/v1/environments{query}"), "", Some(token)).await
    };
    assert_eq!(names(&list("", &viewer).await), ["dana-nb", "eli-nb"], "the tenant's, not another's");
    assert_eq!(names(&list(&format!("?owner={}", dana.id), &viewer).await), ["dana-nb"]);
    assert_eq!(names(&list("?state=finished", &viewer).await), ["eli-nb"]);
    assert_eq!(names(&list("?state=active", &viewer).await), ["dana-nb"]);
    let listed: Value = serde_json::from_str(&list("?state=active", &viewer).await.body).expect("json");
    assert_eq!(listed["environments"][0]["owner"]["name"], "dana@example.com");
    assert_eq!(listed["environments"][0]["tenant"], "Tenant A");

    let refused = list("?state=sleeping", &viewer).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", refused.body);
    assert!(refused.body.contains(r#"state \"sleeping\" is not one of active, finished or any"#), "{}", refused.body);

    let (_, member) = berth.token(&dana, &[]).await;
    assert_eq!(names(&list("", &member).await), ["dana-nb"], "a member sees their own");
    assert!(names(&list(&format!("?owner={}", eli.id), &member).await).is_empty());

    let (_, staff) = berth.token(&root, &[]).await;
    assert_eq!(names(&list("", &staff).await), ["dana-nb", "eli-nb", "fay-nb"]);
    assert_eq!(names(&list(&format!("?tenant={b}"), &staff).await), ["fay-nb"]);

    // The page: the viewer's filter shows others' environments with whose they are.
    let cookie = berth.sign_in("vic@example.com", None).await;
    let mine = berth.get("/environments", Some(&cookie)).await;
    assert!(!mine.body.contains("dana-nb"), "by default one's own");
    assert!(mine.body.contains(r#"aria-label="Filter the environments""#));
    let everyone = berth.get("/environments?person=any&state=any", Some(&cookie)).await;
    assert!(everyone.body.contains("dana-nb") && everyone.body.contains("eli-nb"), "{}", everyone.body);
    assert!(everyone.body.contains("dana@example.com"), "the owner's name");
    assert!(!everyone.body.contains("Launch new"), "a viewer may not launch");

    let dana_cookie = berth.sign_in("dana@example.com", None).await;
    let hers = berth.get("/environments?person=any", Some(&dana_cookie)).await;
    assert!(hers.body.contains("dana-nb") && !hers.body.contains("eli-nb"), "a member's filter stays on their own");
    assert!(!hers.body.contains("Filter the environments"), "and offers no filter");
    assert!(hers.body.contains("Launch new"));
}

#[tokio::test]
async fn a_viewer_meets_no_launch_form_and_leaves_no_denial() {
    let berth = Berth::start(None).await;
    let a = berth.platform.ensure_tenant("tenant-a", "Tenant A", Isolation::Soft).await.expect("tenant");
    let vic = berth.person("vic@example.com", Role::Viewer, Some(a)).await;
    let cookie = berth.sign_in("vic@example.com", None).await;

    let catalog = berth.get("/catalog", Some(&cookie)).await;
    assert_eq!(catalog.status, StatusCode::OK);
    assert!(!catalog.body.contains("href=\"/launch/"), "no launch links for a viewer");
    let form = berth.get("/launch/notebook", Some(&cookie)).await;
    assert_eq!(form.status, StatusCode::OK);
    assert!(form.body.contains("may-not-launch"), "says why instead of the form");
    assert!(!form.body.contains("request[offering]"), "no form");
    assert_eq!(berth.denials_by(vic.id).await, 0, "looking is not trying");

    let anonymous = berth.get("/catalog", None).await;
    assert!(anonymous.body.contains("href=\"/launch/notebook"), "signing in may allow it");
}
