//! A tenant's settings by script, as its admin and the platform's set them on the team,
//! account and quota pages: single sign-on (the secret written, never read), webhooks,
//! members' tokens, notification channels and storage limits.

use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use http::{Method, StatusCode};
use serde_json::Value;

use super::Berth;

fn json(body: &str) -> Value {
    serde_json::from_str(body).expect("json")
}

#[tokio::test]
async fn a_tenant_admin_sets_single_sign_on_by_script() {
    let berth = Berth::start(None).await;
    let acme = berth.platform.ensure_tenant("acme", "Acme", Isolation::Soft).await.expect("tenant");
    let admin = berth.person("admin@acme.com", Role::TenantAdmin, Some(acme)).await;
    let (_, token) = berth.token(&admin, &[]).await;
    let path = format!("/api/v1/tenants/{acme}/sso");

    let first = json(&berth.api(Method::GET, &path, "", Some(&token)).await.body);
    assert_eq!((first["configured"].as_bool(), first["groups_claim"].as_str()), (Some(false), Some("groups")));

    let settings = r#"{"display_name": "Acme SSO", "issuer": "https://idp.example.com", "client_id": "berth",
        "client_secret": "very-secret-value", "allowed_domains": ["acme.com"],
        "group_roles": {"ml-admins": "tenant_admin", "ml": "member"}}"#;
    let saved = berth.api(Method::PUT, &path, settings, Some(&token)).await;
    assert_eq!(saved.status, StatusCode::OK, "{}", saved.body);
    assert!(!saved.body.contains("very-secret-value"), "the secret is never answered: {}", saved.body);
    let saved = json(&saved.body);
    assert_eq!((saved["configured"].as_bool(), saved["has_secret"].as_bool()), (Some(true), Some(true)));
    assert_eq!(saved["group_roles"], serde_json::json!({"ml": "member", "ml-admins": "tenant_admin"}));
    assert_eq!(saved["allowed_domains"], serde_json::json!(["acme.com"]));
    assert!(saved["sign_in_url"].as_str().is_some_and(|u| u.ends_with("/auth/oidc/acme/start")), "{saved}");

    // Without a secret the stored one stays; the rest is replaced.
    let renamed = settings.replace("Acme SSO", "Acme login").replace(r#""client_secret": "very-secret-value","#, "");
    let renamed = json(&berth.api(Method::PUT, &path, &renamed, Some(&token)).await.body);
    assert_eq!((renamed["display_name"].as_str(), renamed["has_secret"].as_bool()), (Some("Acme login"), Some(true)));

    // Refused, and nothing changes: a role that is not one, a group the text form cannot hold,
    // an issuer that is not https.
    for (bad, says) in [
        (settings.replace(r#""ml": "member""#, r#""ml": "boss""#), "boss"),
        (settings.replace(r#""ml": "member""#, r#""ml=x": "member""#), "a group name may not hold ="),
        (settings.replace("https://idp", "http://idp"), "https"),
    ] {
        let refused = berth.api(Method::PUT, &path, &bad, Some(&token)).await;
        assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", refused.body);
        assert!(refused.body.contains(says), "{says}: {}", refused.body);
    }
    let after = json(&berth.api(Method::GET, &path, "", Some(&token)).await.body);
    assert_eq!(after["display_name"], "Acme login");

    // Another tenant's admin sees nothing of it.
    let globex = berth.platform.ensure_tenant("globex", "Globex", Isolation::Soft).await.expect("tenant");
    let other = berth.person("admin@globex.com", Role::TenantAdmin, Some(globex)).await;
    let (_, other_token) = berth.token(&other, &[]).await;
    let hidden = berth.api(Method::GET, &path, "", Some(&other_token)).await;
    assert_eq!(hidden.status, StatusCode::NOT_FOUND, "{}", hidden.body);
}

#[tokio::test]
async fn a_tenant_admin_lists_and_revokes_members_tokens() {
    let berth = Berth::start(None).await;
    let acme = berth.platform.ensure_tenant("acme", "Acme", Isolation::Soft).await.expect("tenant");
    let admin = berth.person("admin@acme.com", Role::TenantAdmin, Some(acme)).await;
    let member = berth.person("ada@acme.com", Role::Member, Some(acme)).await;
    let (_, token) = berth.token(&admin, &[]).await;
    let (made, member_token) = berth.token(&member, &["environment.read"]).await;

    let listed = json(&berth.api(Method::GET, &format!("/api/v1/tenants/{acme}/tokens"), "", Some(&token)).await.body);
    let theirs = listed["tokens"].as_array().expect("tokens").iter().find(|t| t["id"] == made.id).cloned();
    let theirs = theirs.expect("the member's token is listed");
    assert_eq!((theirs["owner"].as_str(), theirs["revoked"].as_bool()), (Some("ada@acme.com"), Some(false)));
    assert_eq!(theirs["actions"], serde_json::json!(["environment.read"]));

    let revoked = berth.api(Method::POST, &format!("/api/v1/tokens/{}/revoke", made.id), "", Some(&token)).await;
    assert_eq!(revoked.status, StatusCode::OK, "{}", revoked.body);
    let refused = berth.api(Method::GET, "/api/v1/me", "", Some(&member_token)).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED, "a revoked token still works: {}", refused.body);

    // A member's reach is their own tokens: the tenant's list shows them only theirs.
    let bob = berth.person("bob@acme.com", Role::Member, Some(acme)).await;
    let (_, bob_token) = berth.token(&bob, &[]).await;
    let seen = berth.api(Method::GET, &format!("/api/v1/tenants/{acme}/tokens"), "", Some(&bob_token)).await;
    let owners: Vec<Value> =
        json(&seen.body)["tokens"].as_array().expect("tokens").iter().map(|t| t["owner"].clone()).collect();
    assert_eq!(owners, vec![Value::from("bob@acme.com")]);
}

#[tokio::test]
async fn a_tenant_admin_adds_and_removes_a_webhook_by_script() {
    let berth = Berth::start(None).await;
    let acme = berth.platform.ensure_tenant("acme", "Acme", Isolation::Soft).await.expect("tenant");
    let admin = berth.person("admin@acme.com", Role::TenantAdmin, Some(acme)).await;
    let (_, token) = berth.token(&admin, &[]).await;
    let path = format!("/api/v1/tenants/{acme}/webhooks");

    let body = r#"{"url": "https://hooks.example.com/berth", "format": "slack", "kinds": ["environment.failed", "usage.budget_mark"]}"#;
    let added = berth.api(Method::POST, &path, body, Some(&token)).await;
    assert_eq!(added.status, StatusCode::CREATED, "{}", added.body);
    let added = json(&added.body);
    let secret = added["secret"].as_str().expect("the secret, once").to_owned();
    assert!(secret.starts_with("whsec_"), "{secret}");
    assert_eq!(added["kinds"], serde_json::json!(["environment.failed", "usage.budget_mark"]));

    let listed = berth.api(Method::GET, &path, "", Some(&token)).await;
    assert!(!listed.body.contains(&secret), "the secret is shown only when made");
    let listed = json(&listed.body);
    assert_eq!(listed["webhooks"].as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(listed["webhooks"][0]["url"], "https://hooks.example.com/berth");

    for (bad, says) in [
        (body.replace("slack", "xml"), "choose slack or json"),
        (body.replace(r#""environment.failed", "usage.budget_mark""#, ""), "at least one kind"),
        (body.replace("https://hooks", "http://hooks"), "https"),
    ] {
        let refused = berth.api(Method::POST, &path, &bad, Some(&token)).await;
        assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {}", refused.body);
        assert!(refused.body.contains(says), "{says}: {}", refused.body);
    }

    let one = format!("{path}/{}", added["id"]);
    let removed = berth.api(Method::DELETE, &one, "", Some(&token)).await;
    assert_eq!(removed.status, StatusCode::OK, "{}", removed.body);
    assert_eq!(berth.api(Method::DELETE, &one, "", Some(&token)).await.status, StatusCode::NOT_FOUND);
    let listed = json(&berth.api(Method::GET, &path, "", Some(&token)).await.body);
    assert_eq!(listed["webhooks"].as_array().map(Vec::len), Some(0), "{listed}");
}

#[tokio::test]
async fn a_person_chooses_their_notification_channels_by_script() {
    let berth = Berth::start(None).await;
    let acme = berth.platform.ensure_tenant("acme", "Acme", Isolation::Soft).await.expect("tenant");
    let member = berth.person("ada@acme.com", Role::Member, Some(acme)).await;
    let (_, token) = berth.token(&member, &[]).await;
    let path = "/api/v1/notification-settings";

    let first = json(&berth.api(Method::GET, path, "", Some(&token)).await.body);
    let kinds = first["kinds"].as_array().map(Vec::len).unwrap_or_default();
    assert!(kinds >= 12, "{first}");
    assert_eq!(first["in_app"].as_array().map(Vec::len), Some(kinds), "every kind is on by default");

    let chosen = r#"{"in_app": ["environment.ready", "environment.failed"], "email": ["environment.failed"]}"#;
    let saved = berth.api(Method::PUT, path, chosen, Some(&token)).await;
    assert_eq!(saved.status, StatusCode::OK, "{}", saved.body);
    let saved = json(&saved.body);
    assert_eq!(saved["in_app"], serde_json::json!(["environment.ready", "environment.failed"]));
    assert_eq!(saved["email"], serde_json::json!(["environment.failed"]));

    let refused = berth.api(Method::PUT, path, r#"{"in_app": ["environment.exploded"]}"#, Some(&token)).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", refused.body);
    assert!(refused.body.contains("environment.exploded"), "{}", refused.body);
    let after = json(&berth.api(Method::GET, path, "", Some(&token)).await.body);
    assert_eq!(after["email"], serde_json::json!(["environment.failed"]), "the refusal changed nothing");
}

#[tokio::test]
async fn storage_limits_are_set_by_script() {
    let berth = Berth::start(None).await;
    let acme = berth.platform.ensure_tenant("acme", "Acme", Isolation::Soft).await.expect("tenant");
    let root = berth.person("root@example.com", Role::PlatformAdmin, None).await;
    let admin = berth.person("admin@acme.com", Role::TenantAdmin, Some(acme)).await;
    let (_, root_token) = berth.token(&root, &[]).await;
    let (_, admin_token) = berth.token(&admin, &[]).await;
    let path = "/api/v1/storage-quotas";

    let set = r#"{"level": "tenant", "who": "acme", "max_gib": 2048, "home_gib": "20"}"#;
    let saved = berth.api(Method::PUT, path, set, Some(&root_token)).await;
    assert_eq!(saved.status, StatusCode::OK, "{}", saved.body);
    let saved = json(&saved.body);
    let row = &saved["storage_quotas"][0];
    assert_eq!(
        (row["who"].as_str(), row["max_gib"].as_i64(), row["home_gib"].as_i64()),
        (Some("Tenant Acme"), Some(2048), Some(20))
    );

    // The tenant's admin reads it but sets only their projects'.
    let read = json(&berth.api(Method::GET, path, "", Some(&admin_token)).await.body);
    assert_eq!(read["storage_quotas"][0]["max_gib"], 2048);
    let denied = berth.api(Method::PUT, path, set, Some(&admin_token)).await;
    assert_eq!(denied.status, StatusCode::FORBIDDEN, "{}", denied.body);

    for (bad, says) in [
        (set.replace("2048", "-1"), "storage must be a whole number of GiB"),
        (set.replace(r#""who": "acme""#, r#""who": "nobody""#), r#"there is no tenant \"nobody\""#),
    ] {
        let refused = berth.api(Method::PUT, path, &bad, Some(&root_token)).await;
        assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", refused.body);
        assert!(refused.body.contains(says), "{says}: {}", refused.body);
    }
    let after = json(&berth.api(Method::GET, path, "", Some(&root_token)).await.body);
    assert_eq!(after["storage_quotas"][0]["max_gib"], 2048, "the refusals changed nothing");
}
