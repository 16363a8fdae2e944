//! The fabric page as a platform admin's browser gets it before any WASM: rendered on the
//! server with every identifier and the partitions.conf, and its port GUID form working
//! as a plain form post.

use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use http::StatusCode;

use super::{Berth, encode};

#[tokio::test]
async fn platform_admins_see_each_hard_tenants_identifiers_and_set_its_ports() {
    let berth = Berth::start(None).await;
    let p = &berth.platform;
    let acme = p.ensure_tenant("acme", "Acme", Isolation::Hard).await.expect("hard tenant");
    p.ensure_tenant("globex", "Globex", Isolation::Soft).await.expect("soft tenant");
    let admin = berth.person("root@example.com", Role::PlatformAdmin, None).await;
    let cookie = berth.sign_in(&admin.email, None).await;

    let page = berth.get("/admin/fabric", Some(&cookie)).await;
    assert_eq!(page.status, StatusCode::OK);
    for shown in ["Acme", "VLAN 2", "0x0001 (full member 0x8001)", "berth-v000001 · 1024 GiB", "name=\"guids\""] {
        assert!(page.body.contains(shown), "the page lacks {shown}");
    }
    assert!(!page.body.contains("Globex"), "a soft tenant holds nothing");
    assert!(page.body.contains("acme=0x0001, ipoib, defmember=full : ;"));

    let form = format!("tenant_id={acme}&guids={}", encode("0x0002C9030001E3F1\n0x0002c9030001e3f2"));
    let reply = berth.call("/api/set_port_guids", &form, Some(&cookie)).await;
    assert!(reply.status.is_success() || reply.status.is_redirection(), "{} {}", reply.status, reply.body);
    let page = berth.get("/admin/fabric", Some(&cookie)).await;
    assert!(
        page.body.contains("acme=0x0001, ipoib, defmember=full : 0x0002c9030001e3f1=full, 0x0002c9030001e3f2=full ;"),
        "the partitions.conf on the page follows the ports"
    );

    let bad = berth.call("/api/set_port_guids", &format!("tenant_id={acme}&guids=0x1234"), Some(&cookie)).await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(bad.body.contains("is not an InfiniBand port GUID"), "{}", bad.body);

    // An auditor reads the same page but gets no form.
    let auditor = berth.person("audit@example.com", Role::PlatformAuditor, None).await;
    let cookie = berth.sign_in(&auditor.email, None).await;
    let page = berth.get("/admin/fabric", Some(&cookie)).await;
    assert!(page.body.contains("0x0002c9030001e3f1") && !page.body.contains("name=\"guids\""));
}

#[tokio::test]
async fn a_script_reads_the_fabric_and_sets_a_tenants_ports() {
    let berth = Berth::start(None).await;
    let p = &berth.platform;
    let acme = p.ensure_tenant("acme", "Acme", Isolation::Hard).await.expect("hard tenant");
    let globex = p.ensure_tenant("globex", "Globex", Isolation::Soft).await.expect("soft tenant");
    let admin = berth.person("root@example.com", Role::PlatformAdmin, None).await;
    let (_, token) = berth.token(&admin, &[]).await;
    let fabric = || async {
        let reply = berth.api(http::Method::GET, "/api/v1/fabric", "", Some(&token)).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        serde_json::from_str::<serde_json::Value>(&reply.body).expect("json")
    };
    let before = fabric().await;
    assert_eq!(before["segment"], "vlan");
    let tenants = before["tenants"].as_array().expect("tenants");
    assert_eq!(tenants.len(), 1, "a soft tenant holds nothing: {before}");
    let held: Vec<(&str, &str)> = tenants[0]["identifiers"]
        .as_array()
        .expect("identifiers")
        .iter()
        .map(|i| (i["kind"].as_str().unwrap_or_default(), i["value"].as_str().unwrap_or_default()))
        .collect();
    assert!(held.contains(&("pkey", "0x0001")) && held.contains(&("volume", "berth-v000001")), "{held:?}");
    assert!(
        before["pools"].as_array().is_some_and(|pools| pools.iter().any(|p| p["kind"] == "pkey" && p["held"] == 1))
    );

    let path = format!("/api/v1/tenants/{acme}/port-guids");
    let set =
        berth.api(http::Method::PUT, &path, r#"{"guids": ["0x0002C9030001E3F1", "0x0002c9030001e3f2"]}"#, Some(&token));
    let set = set.await;
    assert_eq!(set.status, StatusCode::OK, "{}", set.body);
    let set: serde_json::Value = serde_json::from_str(&set.body).expect("json");
    assert_eq!(set["port_guids"], serde_json::json!(["0x0002c9030001e3f1", "0x0002c9030001e3f2"]));
    let conf = fabric().await["partitions_conf"].as_str().unwrap_or_default().to_owned();
    assert!(
        conf.contains("acme=0x0001, ipoib, defmember=full : 0x0002c9030001e3f1=full, 0x0002c9030001e3f2=full ;"),
        "{conf}"
    );

    // Refused, and nothing changes: a malformed GUID, a tenant without a P_Key.
    let bad = berth.api(http::Method::PUT, &path, r#"{"guids": ["0x1234"]}"#, Some(&token)).await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", bad.body);
    assert!(bad.body.contains("is not an InfiniBand port GUID"), "{}", bad.body);
    let soft = format!("/api/v1/tenants/{globex}/port-guids");
    let soft = berth.api(http::Method::PUT, &soft, r#"{"guids": ["0x0002c9030001e3f9"]}"#, Some(&token)).await;
    assert_eq!(soft.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", soft.body);
    assert_eq!(fabric().await["tenants"][0]["port_guids"].as_array().map(Vec::len), Some(2));
}
