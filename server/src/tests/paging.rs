//! Cursor pagination as a script walks it: every item once, in the listing's order, however
//! the pages are cut; a cursor or limit that is not one is refused by name.

use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use http::{Method, StatusCode};
use serde_json::Value;

use super::Berth;

/// Every page of `path` at `limit` a page: each page's items (by `key`) in order.
async fn walk(berth: &Berth, token: &str, path: &str, items: &str, key: &str, limit: usize) -> Vec<Vec<String>> {
    let mut pages = Vec::new();
    let mut cursor = String::new();
    loop {
        let joiner = if path.contains('?') { '&' } else { '?' };
        let url = format!("{path}{joiner}limit={limit}&cursor={cursor}");
        let reply = berth.api(Method::GET, &url, "", Some(token)).await;
        assert_eq!(reply.status, StatusCode::OK, "{url}: {}", reply.body);
        let page: Value = serde_json::from_str(&reply.body).expect("json");
        let keys: Vec<String> = page[items].as_array().expect("items").iter().map(|i| i[key].to_string()).collect();
        assert!(keys.len() <= limit, "{url} answered {} items", keys.len());
        pages.push(keys);
        match page["next_cursor"].as_str() {
            Some(next) => cursor = next.to_owned(),
            None => return pages,
        }
        assert!(pages.len() < 50, "the cursor never ends");
    }
}

#[tokio::test]
async fn environments_notifications_and_the_audit_log_page_by_cursor() {
    let berth = Berth::start(None).await;
    let acme = berth.platform.ensure_tenant("acme", "Acme", Isolation::Soft).await.expect("tenant");
    let ada = berth.person("ada@acme.com", Role::Member, Some(acme)).await;
    let (_, token) = berth.token(&ada, &[]).await;
    for n in 0..7 {
        berth.launch(&ada, &format!("nb-{n}")).await;
    }
    // Three made in the same millisecond: the order (and the cursor) still tells them apart.
    let db = berth.platform.db();
    sqlx::query("UPDATE environments SET created_at = 1000 WHERE name IN ('nb-2', 'nb-3', 'nb-4')")
        .execute(db)
        .await
        .expect("same millisecond");
    for n in 0..5 {
        sqlx::query(
            "INSERT INTO notifications (user_id, kind, title, body, link, created_at)
             VALUES (?, 'environment.ready', ?, '', '/environments', ?)",
        )
        .bind(ada.id)
        .bind(format!("note {n}"))
        .bind(n)
        .execute(db)
        .await
        .expect("a notification");
    }

    let whole = walk(&berth, &token, "/api/v1/environments", "environments", "id", 500).await;
    assert_eq!((whole.len(), whole[0].len()), (1, 7), "{whole:?}");
    for (path, items, key, total) in [
        ("/api/v1/environments", "environments", "id", 7),
        ("/api/v1/environments?state=active", "environments", "id", 7),
        ("/api/v1/notifications", "notifications", "id", 5),
    ] {
        let everything = walk(&berth, &token, path, items, key, 100).await.concat();
        assert_eq!(everything.len(), total, "{path}");
        for limit in [1, 2, 3] {
            let pages = walk(&berth, &token, path, items, key, limit).await;
            assert_eq!(pages.len(), total.div_ceil(limit), "{path} by {limit}: {pages:?}");
            assert_eq!(pages.concat(), everything, "{path} by {limit}: every item once, in order");
        }
    }

    // The audit log (a tenant admin's: the launches above and more).
    let admin = berth.person("admin@acme.com", Role::TenantAdmin, Some(acme)).await;
    let (_, admin_token) = berth.token(&admin, &[]).await;
    let everything = walk(&berth, &admin_token, "/api/v1/audit", "events", "id", 1000).await.concat();
    assert!(everything.len() >= 7, "{everything:?}");
    let pages = walk(&berth, &admin_token, "/api/v1/audit?action=environment.", "events", "id", 2).await;
    assert!(pages.concat().len() >= 7 && pages.len() >= 4, "{pages:?}");

    // Refused by name: a limit past the most, a cursor made up or another listing's.
    let audit_cursor = walk(&berth, &admin_token, "/api/v1/audit", "events", "id", 1).await;
    assert!(audit_cursor.len() > 1);
    let first = berth.api(Method::GET, "/api/v1/audit?limit=1", "", Some(&admin_token)).await;
    let foreign: Value = serde_json::from_str(&first.body).expect("json");
    let foreign = foreign["next_cursor"].as_str().expect("a cursor").to_owned();
    for (url, says) in [
        ("/api/v1/environments?limit=501".to_owned(), "limit must be a whole number from 1 to 500"),
        ("/api/v1/environments?limit=0".to_owned(), "limit must be a whole number from 1 to 500"),
        ("/api/v1/notifications?limit=101".to_owned(), "limit must be a whole number from 1 to 100"),
        ("/api/v1/environments?cursor=bm9wZQ".to_owned(), "cursor is not one this listing gave"),
        (format!("/api/v1/environments?cursor={foreign}"), "cursor is not one this listing gave"),
        (format!("/api/v1/notifications?cursor={foreign}"), "cursor is not one this listing gave"),
    ] {
        let refused = berth.api(Method::GET, &url, "", Some(&token)).await;
        assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY, "{url}: {}", refused.body);
        assert!(refused.body.contains(says), "{url}: {}", refused.body);
    }
}
