//! SSH keys on `/account` as a browser without JavaScript uses them: the page rendered on
//! the server with the form, a key added and removed by plain form posts (each audited),
//! a bad key refused with what to do instead, and no API token adding a key.

use axum::body::Body;
use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use http::{Request, StatusCode, header};

use super::{Berth, Reply, encode, meta};

const KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKzNtyR4cmJGDog7LEjOcX9o3mjUze+WPw53Rf+R08s7 ada@laptop";
const FINGERPRINT: &str = "SHA256:Q9LDPLeW+BGJfnAedLLd6G8cdv5eY+N0OaIbpR8yFwk";
const RSA_1024: &str = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQDVfQrgWypELEnynZ/EQ4w9FAuc5kj+KLKI8qDK3yGYeoG95++8IyseTkUE6aIxUbhd71fBK8RDoTwjultu5FnJN1sYXDYP+bglokf9x3gpwgqra1pCJY+UF/mGuufhxn+AQcu6V7H5qysAU06/9HMzTcmmA0DCqOVAKBvA4YtUWw== old@box";

/// A form posted the way a browser without WASM posts it: it asks for HTML back.
async fn plain_post(berth: &Berth, path: &str, form: &str, cookie: &str) -> Reply {
    let request = Request::post(path)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(header::ACCEPT, "text/html,application/xhtml+xml")
        .header(header::REFERER, "http://127.0.0.1:3000/account")
        .header("sec-fetch-site", "same-origin")
        .header(header::COOKIE, cookie)
        .body(Body::from(form.to_owned()))
        .expect("request");
    berth.send(request).await
}

#[tokio::test]
async fn a_key_is_added_and_removed_on_the_account_page_without_javascript() {
    let berth = Berth::start(None).await;
    let tenant = berth.platform.ensure_tenant("acme", "Acme", Isolation::Hard).await.expect("tenant");
    let ada = berth.person("ada@acme.example", Role::Member, Some(tenant)).await;
    let cookie = berth.sign_in(&ada.email, None).await;

    let page = berth.get("/account", Some(&cookie)).await;
    assert_eq!(page.status, StatusCode::OK);
    for shown in ["SSH keys", "name=\"public_key\"", "No SSH keys yet."] {
        assert!(page.body.contains(shown), "the page lacks {shown}");
    }

    let added = plain_post(&berth, "/api/add_ssh_key", &format!("name=&public_key={}", encode(KEY)), &cookie).await;
    assert!(added.status.is_redirection(), "{} {}", added.status, added.body);
    assert_eq!(added.header("location"), Some("/account"));
    let page = berth.get("/account", Some(&cookie)).await;
    for shown in [FINGERPRINT, "ED25519 256", "ada@laptop", "Remove ada@laptop"] {
        assert!(page.body.contains(shown), "the page lacks {shown}");
    }
    assert!(!page.body.contains("No SSH keys yet."));

    // A weak key, and the same key twice, are refused with what to do instead; nothing is
    // written either time.
    let weak =
        berth.call("/api/add_ssh_key", &format!("name=old&public_key={}", encode(RSA_1024)), Some(&cookie)).await;
    assert_eq!(weak.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(weak.body.contains("this RSA key has 1024 bits; Berth needs at least 2048"), "{}", weak.body);
    let twice = berth.call("/api/add_ssh_key", &format!("name=again&public_key={}", encode(KEY)), Some(&cookie)).await;
    assert_eq!(twice.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(twice.body.contains("you added this SSH key already (as \\\"ada@laptop\\\")"), "{}", twice.body);
    let keys = berth.platform.my_ssh_keys(&ada.caller(meta())).await.expect("keys");
    assert_eq!(keys.len(), 1);

    let removed = plain_post(&berth, "/api/remove_ssh_key", &format!("id={}", keys[0].id), &cookie).await;
    assert!(removed.status.is_redirection(), "{} {}", removed.status, removed.body);
    let page = berth.get("/account", Some(&cookie)).await;
    assert!(!page.body.contains(FINGERPRINT) && page.body.contains("No SSH keys yet."));

    let audited: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT action, outcome, detail FROM audit_events WHERE action LIKE 'ssh_key.%' AND actor_id = ? ORDER BY id",
    )
    .bind(ada.id)
    .fetch_all(berth.platform.db())
    .await
    .expect("audit");
    assert_eq!(
        audited,
        [
            ("ssh_key.add".into(), "success".into(), Some(format!("ssh-ed25519 {FINGERPRINT} (256 bits)"))),
            ("ssh_key.remove".into(), "success".into(), Some(FINGERPRINT.into())),
        ]
    );

    // A key opens a shell: an API token may not add one, whatever its actions.
    let (_, token) = berth.token(&ada, &[]).await;
    let by_token = berth.platform.caller_from_token(&token, meta()).await.expect("token caller");
    let refused = berth.platform.add_ssh_key(&by_token, "", KEY).await;
    assert!(matches!(refused, Err(berth_platform::Error::Forbidden)), "{refused:?}");
    assert!(berth.platform.my_ssh_keys(&ada.caller(meta())).await.expect("keys").is_empty());
}
