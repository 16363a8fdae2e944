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
/// skip the lifecycle. Checks and repairs go on in the background: the script reads the
/// node's health until they have ended, as a script on a real fleet must.
#[tokio::test]
async fn a_script_runs_acceptance_and_repairs_a_node() {
    let berth = Berth::start_running().await;
    let admin = berth.person("root@example.com", Role::PlatformAdmin, None).await;
    let (_, token) = berth.token(&admin, &[]).await;
    let fleet = berth.fleet.clone().expect("a simulated fleet");
    fleet.fail_check("h100-01", berth_domain::node_checks::CheckKind::MemoryErrors);
    let health_until = |done: fn(&serde_json::Value) -> bool| {
        let (berth, token) = (&berth, &token);
        async move {
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
            loop {
                let health = berth.api(Method::GET, "/api/v1/nodes/h100-01/health", "", Some(token)).await;
                assert_eq!(health.status, StatusCode::OK, "{}", health.body);
                let health: serde_json::Value = serde_json::from_str(&health.body).expect("json");
                if done(&health) {
                    return health;
                }
                assert!(tokio::time::Instant::now() < deadline, "never done: {health}");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    };

    let started = berth.api(Method::POST, "/api/v1/nodes/h100-01/checks", r#"{"level": "quick"}"#, Some(&token)).await;
    assert_eq!(started.status, StatusCode::ACCEPTED, "{}", started.body);
    let started: serde_json::Value = serde_json::from_str(&started.body).expect("json");
    assert_eq!((started["purpose"].as_str(), &started["passed"]), (Some("acceptance"), &serde_json::Value::Null));
    let health = health_until(|h| !h["check_runs"][0]["passed"].is_null()).await;
    let run = &health["check_runs"][0];
    assert_eq!((&run["id"], run["passed"].as_bool()), (&started["id"], Some(false)));
    let memory = run["results"].as_array().expect("results").iter().find(|r| r["check"] == "memory_errors").cloned();
    let memory = memory.expect("the memory check ran");
    assert_eq!((memory["measured"].as_f64(), memory["threshold"].as_f64()), (Some(2.0), Some(0.0)), "{memory}");
    assert!(memory["raw_output"].as_str().unwrap_or_default().contains("Remapped Rows"), "{memory}");
    assert_eq!((health["state"].as_str(), health["takes_new_bookings"].as_bool()), (Some("degraded"), Some(false)));
    assert_eq!(health["changes"][0]["by"], serde_json::Value::Null, "the checks' verdict is Berth's");
    assert_eq!(health["changes"][1]["by"], "root@example.com");

    let skip = r#"{"event": "acceptance_passed", "reason": "trust me"}"#;
    let refused = berth.api(Method::POST, "/api/v1/nodes/h100-01/state", skip, Some(&token)).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", refused.body);
    let repair = r#"{"event": "start_repair", "reason": "2 uncorrectable ECC errors"}"#;
    let repaired = berth.api(Method::POST, "/api/v1/nodes/h100-01/state", repair, Some(&token)).await;
    assert_eq!(repaired.status, StatusCode::OK, "{}", repaired.body);
    assert!(repaired.body.contains(r#""state":"in_repair""#), "{}", repaired.body);
    health_until(|h| h["state"] == "available").await;
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
        serde_json::json!([{"tenant": "tenant-a", "tenant_id": tenant, "rule": "registries", "registries": ["ghcr.io"]}])
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

/// A platform admin's script curates the catalog: adds a pinned training image, makes it
/// the default (a member's launch without an image runs it), is refused an unpinned entry
/// with the page's words, narrows a tenant's custom images, and removes the entry. Refusals
/// write nothing; a tenant admin may not touch the platform's catalog.
#[tokio::test]
async fn a_script_curates_the_image_catalog() {
    let berth = Berth::start(None).await;
    let db = berth.platform.db();
    let tenant = berth.platform.ensure_tenant("tenant-a", "Tenant A", Isolation::Soft).await.expect("tenant");
    let root = berth.person("root@example.com", Role::PlatformAdmin, None).await;
    let boss = berth.person("boss@example.com", Role::TenantAdmin, Some(tenant)).await;
    let member = berth.person("dana@example.com", Role::Member, Some(tenant)).await;
    let (_, root) = berth.token(&root, &[]).await;
    let (_, boss) = berth.token(&boss, &[]).await;
    let (_, dana) = berth.token(&member, &[]).await;
    let images = || async { sqlx::query_scalar::<_, i64>("SELECT count(*) FROM images").fetch_one(db).await };
    let before = images().await.expect("count");

    let digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let reference = format!("nvcr.io/nvidia/pytorch:24.05-py3@{digest}");
    let entry = format!(
        r#"{{"name": "NGC PyTorch", "reference": "{reference}", "cuda": "12.4", "framework": "PyTorch 2.4",
             "offerings": ["training", "inference"]}}"#
    );
    let added = berth.api(Method::POST, "/api/v1/images", &entry, Some(&root)).await;
    assert_eq!(added.status, StatusCode::CREATED, "{}", added.body);
    let added = json(&added);
    assert_eq!((added["catalog"].as_str(), added["pinned"].as_bool()), (Some("platform"), Some(true)), "{added}");
    assert_eq!((&added["tenant_id"], &added["default_for"]), (&serde_json::Value::Null, &serde_json::json!([])));
    let id = added["id"].as_i64().expect("the entry's id");
    let theirs = berth.api(Method::POST, "/api/v1/images", &entry.replace("NGC", "Their"), Some(&boss)).await;
    assert_eq!(theirs.status, StatusCode::CREATED, "a tenant admin adds to the tenant's own: {}", theirs.body);
    assert_eq!(json(&theirs)["catalog"], "tenant-a");
    let platforms = entry.replace(r#"{"name""#, r#"{"tenant": null, "name""#).replace("NGC", "Boss's");
    let platforms = platforms.replace("sha256:0", "sha256:1");
    let platforms = berth.api(Method::POST, "/api/v1/images", &platforms, Some(&boss)).await;
    assert_eq!(platforms.status, StatusCode::CREATED, "null is the caller's own catalog: {}", platforms.body);

    let default = format!("/api/v1/images/{id}/defaults/training");
    let refused = berth.api(Method::PUT, &default, "", Some(&boss)).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "the platform's entry is the platform's: {}", refused.body);
    let unsuited = berth.api(Method::PUT, &format!("/api/v1/images/{id}/defaults/notebook"), "", Some(&root)).await;
    assert_eq!(unsuited.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", unsuited.body);
    assert!(unsuited.body.contains("NGC PyTorch does not suit jupyter notebook"), "{}", unsuited.body);
    let made = berth.api(Method::PUT, &default, "", Some(&root)).await;
    assert_eq!(made.status, StatusCode::OK, "{}", made.body);
    assert_eq!(json(&made)["default_for"], serde_json::json!(["training"]));

    let job =
        r#"{"offering": "training", "size": "h100-1", "name": "job", "hours": "1", "command": "python train.py"}"#;
    let booked = berth.api(Method::POST, "/api/v1/environments", job, Some(&dana)).await;
    assert_eq!(booked.status, StatusCode::CREATED, "{}", booked.body);
    let env = json(&booked)["id"].as_str().expect("the environment's id").to_owned();
    let image: Option<String> =
        sqlx::query_scalar("SELECT image FROM environments WHERE id = ?").bind(&env).fetch_one(db).await.expect("env");
    assert_eq!(image.as_deref(), Some(reference.as_str()), "the launch runs the new default");

    let unpinned = entry.replace(&format!("@{digest}"), "").replace("NGC", "Loose");
    let refused = berth.api(Method::POST, "/api/v1/images", &unpinned, Some(&root)).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", refused.body);
    assert!(
        refused.body.contains("nvcr.io/nvidia/pytorch:24.05-py3 is not pinned: add its digest (…@sha256:<64 hex>)"),
        "the page's words: {}",
        refused.body
    );
    assert_eq!(images().await.expect("count"), before + 3, "the refused entry wrote nothing");

    let custom = format!("/api/v1/tenants/{tenant}/custom-images");
    let narrowed = berth.api(Method::PUT, &custom, r#"{"rule": "registries", "registries": ["GHCR.io"]}"#, Some(&root));
    let narrowed = narrowed.await;
    assert_eq!(narrowed.status, StatusCode::OK, "{}", narrowed.body);
    assert_eq!(
        json(&narrowed),
        serde_json::json!({"tenant": "tenant-a", "tenant_id": tenant, "rule": "registries", "registries": ["ghcr.io"]})
    );
    let nonsense = berth.api(Method::PUT, &custom, r#"{"rule": "everything"}"#, Some(&root)).await;
    assert_eq!(nonsense.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", nonsense.body);
    assert!(nonsense.body.contains("choose catalog, any or registries"), "{}", nonsense.body);
    let own = berth.api(Method::PUT, &custom, r#"{"rule": "any"}"#, Some(&boss)).await;
    assert_eq!(own.status, StatusCode::FORBIDDEN, "the rule is the platform's: {}", own.body);
    let rule: String = sqlx::query_scalar("SELECT custom_images FROM tenants WHERE id = ?")
        .bind(tenant)
        .fetch_one(db)
        .await
        .expect("rule");
    assert_eq!(rule, "ghcr.io", "refused rules wrote nothing");

    let removed = berth.api(Method::DELETE, &format!("/api/v1/images/{id}"), "", Some(&root)).await;
    assert_eq!(removed.status, StatusCode::OK, "{}", removed.body);
    assert_eq!(json(&removed), serde_json::json!({"removed": id}));
    let again = berth.api(Method::DELETE, &format!("/api/v1/images/{id}"), "", Some(&root)).await;
    assert_eq!(again.status, StatusCode::NOT_FOUND, "{}", again.body);
    let listed = json(&berth.api(Method::GET, "/api/v1/images", "", Some(&dana)).await);
    let names: Vec<&str> =
        listed["images"].as_array().expect("images").iter().filter_map(|i| i["name"].as_str()).collect();
    assert!(!names.contains(&"NGC PyTorch") && names.contains(&"Their PyTorch"), "{names:?}");
    let image: Option<String> =
        sqlx::query_scalar("SELECT image FROM environments WHERE id = ?").bind(&env).fetch_one(db).await.expect("env");
    assert_eq!(image.as_deref(), Some(reference.as_str()), "the booking keeps its image");
    let audited: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE outcome = 'success'
         AND action IN ('image.add', 'image.default', 'image.remove', 'tenant.custom_images')",
    )
    .fetch_one(db)
    .await
    .expect("audit");
    assert_eq!(audited, 6, "three entries added, a default, a rule, a removal");
}

/// Reads an answer's JSON body.
fn json(reply: &super::Reply) -> serde_json::Value {
    serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("{e}: {}", reply.body))
}

/// A tenant admin's onboarding script: a project, a member invited, added to it and given
/// another role, the project's quota and budget set and removed, the member removed. Bad
/// input is refused in words and writes nothing.
#[tokio::test]
async fn a_script_sets_up_projects_members_quotas_and_budgets() {
    let berth = Berth::start(None).await;
    let db = berth.platform.db();
    let tenant = berth.platform.ensure_tenant("tenant-a", "Tenant A", Isolation::Soft).await.expect("tenant");
    let boss = berth.person("boss@example.com", Role::TenantAdmin, Some(tenant)).await;
    let (_, token) = berth.token(&boss, &[]).await;
    let b = &berth;
    let call = move |method: Method, path: String, body: &'static str| {
        let token = token.clone();
        async move { b.api(method, &path, body, Some(&token)).await }
    };

    let made = call(Method::POST, format!("/api/v1/tenants/{tenant}/projects"), r#"{"name": "vision"}"#).await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let project = json(&made);
    assert_eq!((project["name"].as_str(), project["members"].as_array().map(Vec::len)), (Some("vision"), Some(0)));
    let project = project["id"].as_i64().expect("the project's id");
    let twice = call(Method::POST, format!("/api/v1/tenants/{tenant}/projects"), r#"{"name": "vision"}"#).await;
    assert_eq!(twice.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", twice.body);
    assert!(twice.body.contains(r#"the short name \"vision\" is taken"#), "{}", twice.body);

    let members = format!("/api/v1/tenants/{tenant}/members");
    let invited = call(Method::POST, members.clone(), r#"{"email": "ada@example.com", "role": "member"}"#).await;
    assert_eq!(invited.status, StatusCode::CREATED, "{}", invited.body);
    let ada = json(&invited);
    assert_eq!((ada["email"].as_str(), ada["role"].as_str()), (Some("ada@example.com"), Some("member")));
    let ada = ada["user_id"].as_i64().expect("ada's id");
    let owner = call(Method::POST, members.clone(), r#"{"email": "bob@example.com", "role": "owner"}"#).await;
    assert_eq!(owner.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", owner.body);
    assert!(owner.body.contains(r#"there is no role called \"owner\""#), "{}", owner.body);
    let bobs: i64 = sqlx::query_scalar("SELECT count(*) FROM users WHERE email = 'bob@example.com'")
        .fetch_one(db)
        .await
        .expect("count");
    assert_eq!(bobs, 0, "the refused invitation wrote nothing");

    let joined = call(
        Method::POST,
        format!("/api/v1/tenants/{tenant}/projects/{project}/members"),
        r#"{"email": "ada@example.com"}"#,
    )
    .await;
    assert_eq!(joined.status, StatusCode::OK, "{}", joined.body);
    assert_eq!(json(&joined)["members"], serde_json::json!(["ada@example.com"]));
    let listed = json(&call(Method::GET, format!("/api/v1/tenants/{tenant}/projects"), "").await);
    assert_eq!(listed["projects"][0]["members"], serde_json::json!(["ada@example.com"]), "{listed}");

    let viewer = call(Method::PATCH, format!("{members}/{ada}"), r#"{"role": "viewer"}"#).await;
    assert_eq!(viewer.status, StatusCode::OK, "{}", viewer.body);
    assert_eq!(json(&viewer)["role"], "viewer");
    let own = call(Method::PATCH, format!("{members}/{}", boss.id), r#"{"role": "member"}"#).await;
    assert_eq!(own.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", own.body);
    assert!(own.body.contains("your own membership"), "{}", own.body);

    // The project's quota: by model as an object, numbers as numbers or text.
    let quota = r#"{"level": "project", "who": "vision", "max_gpus": "2", "max_gpus_by_model": {"H100-80GB": 1},
                    "max_booking_hours": 24}"#;
    let set = call(Method::PUT, "/api/v1/quotas".into(), quota).await;
    assert_eq!(set.status, StatusCode::OK, "{}", set.body);
    let set = json(&set);
    assert_eq!((set["level"].as_str(), set["subject_id"].as_i64()), (Some("project"), Some(project)), "{set}");
    assert_eq!((set["max_gpus"].as_f64(), set["max_booking_hours"].as_u64()), (Some(2.0), Some(24)), "{set}");
    assert_eq!(set["max_gpus_by_model"], serde_json::json!({"H100-80GB": 1.0}));
    assert_eq!(set["gpu_hours_per_month"], serde_json::Value::Null, "left out: no limit");
    let bad =
        call(Method::PUT, "/api/v1/quotas".into(), r#"{"level": "project", "who": "vision", "max_gpus": "lots"}"#);
    let bad = bad.await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", bad.body);
    assert!(bad.body.contains("GPUs at once must be a number of GPU-equivalents"), "{}", bad.body);
    let sneaky = r#"{"level": "project", "who": "vision", "max_gpus_by_model": {"H100-80GB = 1, A100-80GB": 9}}"#;
    let sneaky = call(Method::PUT, "/api/v1/quotas".into(), sneaky).await;
    assert_eq!(sneaky.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", sneaky.body);
    let everyone = call(Method::PUT, "/api/v1/quotas".into(), r#"{"level": "everyone", "max_gpus": 1}"#).await;
    assert_eq!(everyone.status, StatusCode::FORBIDDEN, "everyone's default is the platform's: {}", everyone.body);
    let rows: Vec<(i64, Option<f64>)> =
        sqlx::query_as("SELECT id, max_gpus FROM quotas").fetch_all(db).await.expect("quotas");
    assert_eq!(rows, vec![(set["id"].as_i64().expect("id"), Some(2.0))], "refusals changed nothing");
    let quotas = json(&call(Method::GET, "/api/v1/quotas".into(), "").await);
    assert_eq!(quotas["quotas"][0]["who"], "Project tenant-a/vision", "{quotas}");
    let removed = call(Method::DELETE, format!("/api/v1/quotas/{}", rows[0].0), "").await;
    assert_eq!(removed.status, StatusCode::OK, "{}", removed.body);
    assert_eq!(json(&call(Method::GET, "/api/v1/quotas".into(), "").await)["quotas"], serde_json::json!([]));

    // The project's budget.
    let budget =
        call(Method::PUT, "/api/v1/budgets".into(), r#"{"level": "project", "who": "vision", "amount": "2,000"}"#);
    let budget = budget.await;
    assert_eq!(budget.status, StatusCode::OK, "{}", budget.body);
    let budgets = json(&budget);
    let set = &budgets["budgets"][0];
    assert_eq!((set["cents_per_month"].as_i64(), set["project"].as_i64()), (Some(200_000), Some(project)), "{set}");
    assert_eq!((set["amount"].as_str(), set["warn_only"].as_bool()), (Some("$2,000.00"), Some(false)), "{set}");
    let tenants = call(Method::PUT, "/api/v1/budgets".into(), r#"{"level": "tenant", "who": "tenant-a", "amount": 5}"#);
    assert_eq!(tenants.await.status, StatusCode::FORBIDDEN, "a tenant's own budget is the platform's");
    let listed = json(&call(Method::GET, "/api/v1/budgets".into(), "").await);
    assert_eq!(listed["budgets"].as_array().map(Vec::len), Some(1), "{listed}");
    let id = set["id"].as_i64().expect("the budget's id");
    let removed = call(Method::DELETE, format!("/api/v1/budgets/{id}"), "").await;
    assert_eq!(removed.status, StatusCode::OK, "{}", removed.body);
    assert_eq!(json(&call(Method::GET, "/api/v1/budgets".into(), "").await)["budgets"], serde_json::json!([]));

    let gone = call(Method::DELETE, format!("{members}/{ada}"), "").await;
    assert_eq!(gone.status, StatusCode::OK, "{}", gone.body);
    let left = json(&call(Method::GET, members.clone(), "").await);
    assert!(!left.to_string().contains("ada@example.com"), "{left}");
}

/// Idle reclamation through the API: a platform admin sets the notebook policy, a tenant
/// admin only a stricter one; an environment's standing says which applies, and keeping
/// one that is not ready is refused.
#[tokio::test]
async fn a_script_sets_idle_policies_and_reads_an_environments_standing() {
    let berth = Berth::start(None).await;
    let db = berth.platform.db();
    let tenant = berth.platform.ensure_tenant("tenant-a", "Tenant A", Isolation::Soft).await.expect("tenant");
    let root = berth.person("root@example.com", Role::PlatformAdmin, None).await;
    let boss = berth.person("boss@example.com", Role::TenantAdmin, Some(tenant)).await;
    let member = berth.person("dana@example.com", Role::Member, Some(tenant)).await;
    let (_, root) = berth.token(&root, &[]).await;
    let (_, boss) = berth.token(&boss, &[]).await;
    let (_, dana) = berth.token(&member, &[]).await;

    let policy = r#"{"below_pct": 5, "idle_for": "1h", "grace": "15m", "max_keeps": 1}"#;
    let set = berth.api(Method::PUT, "/api/v1/idle-policies/notebook", policy, Some(&root)).await;
    assert_eq!(set.status, StatusCode::OK, "{}", set.body);
    let set = json(&set);
    assert_eq!((set["idle_for_s"].as_i64(), set["grace"].as_str()), (Some(3600), Some("15m")), "{set}");
    assert_eq!((set["tenant"].as_i64(), set["max_keeps"].as_i64()), (None, Some(1)), "{set}");
    let theirs = berth.api(Method::PUT, "/api/v1/idle-policies/notebook", policy, Some(&boss)).await;
    assert_eq!(theirs.status, StatusCode::FORBIDDEN, "the platform's is the platform's: {}", theirs.body);
    let nothing = berth.api(Method::PUT, "/api/v1/idle-policies/spaceship", policy, Some(&root)).await;
    assert_eq!(nothing.status, StatusCode::NOT_FOUND, "{}", nothing.body);

    let tenants = format!("/api/v1/tenants/{tenant}/idle-policies/notebook");
    let looser = r#"{"below_pct": 5, "idle_for": "2h", "grace": "15m", "max_keeps": 1}"#;
    let looser = berth.api(Method::PUT, &tenants, looser, Some(&boss)).await;
    assert_eq!(looser.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", looser.body);
    assert!(looser.body.contains("an idle time over the platform's 1h"), "{}", looser.body);
    let garbled = r#"{"below_pct": 5, "idle_for": "soon", "grace": "15m"}"#;
    let garbled = berth.api(Method::PUT, &tenants, garbled, Some(&boss)).await;
    assert_eq!(garbled.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", garbled.body);
    assert!(garbled.body.contains(r#"\"soon\" is not an idle time"#), "{}", garbled.body);
    let policies: i64 = sqlx::query_scalar("SELECT count(*) FROM idle_policies").fetch_one(db).await.expect("count");
    assert_eq!(policies, 1, "refused policies wrote nothing");
    let stricter = r#"{"below_pct": "10%", "idle_for": "30m", "grace": "5m", "max_keeps": "1"}"#;
    let stricter = berth.api(Method::PUT, &tenants, stricter, Some(&boss)).await;
    assert_eq!(stricter.status, StatusCode::OK, "{}", stricter.body);
    assert_eq!(json(&stricter)["tenant_slug"], "tenant-a");
    let listed = json(&berth.api(Method::GET, "/api/v1/idle-policies", "", Some(&dana)).await);
    assert_eq!(listed["policies"].as_array().map(Vec::len), Some(2), "{listed}");
    assert_eq!(
        (listed["manages_platform"].as_bool(), &listed["manages_tenants"]),
        (Some(false), &serde_json::json!([]))
    );

    // A member's booking, not ready yet: the stricter policy applies; it cannot be kept.
    let env = berth.launch(&member, "idle-nb").await;
    let idle = berth.api(Method::GET, &format!("/api/v1/environments/{env}/idle"), "", Some(&dana)).await;
    assert_eq!(idle.status, StatusCode::OK, "{}", idle.body);
    let idle = json(&idle);
    assert!(idle["policy"].as_str().is_some_and(|p| p.contains("GPUs under 10% for 30m")), "{idle}");
    assert_eq!((idle["keeps_left"].as_i64(), idle["may_keep"].as_bool()), (Some(1), Some(false)), "{idle}");
    let keep = berth.api(Method::POST, &format!("/api/v1/environments/{env}/keep"), "", Some(&dana)).await;
    assert_eq!(keep.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", keep.body);
    let used = json(&berth.api(Method::GET, &format!("/api/v1/environments/{env}/gpu-use"), "", Some(&dana)).await);
    assert_eq!(used, serde_json::json!({"hour": [], "day": [], "xid_errors": []}), "no readings yet");

    let removed = berth.api(Method::DELETE, &tenants, "", Some(&boss)).await;
    assert_eq!(removed.status, StatusCode::OK, "{}", removed.body);
    let removed = berth.api(Method::DELETE, "/api/v1/idle-policies/notebook", "", Some(&root)).await;
    assert_eq!(json(&removed), serde_json::json!({"tenant": null, "offering": "notebook"}));
    let policies: i64 = sqlx::query_scalar("SELECT count(*) FROM idle_policies").fetch_one(db).await.expect("count");
    assert_eq!(policies, 0);
}

/// A platform admin's script lists the fleet's nodes with their state, takes a node out of
/// booking for a window and calls it off; a window that cannot be is refused in words and
/// writes nothing, and only platform staff see the fleet.
#[tokio::test]
async fn a_script_lists_nodes_and_schedules_maintenance() {
    let berth = Berth::start(None).await;
    let db = berth.platform.db();
    let tenant = berth.platform.ensure_tenant("tenant-a", "Tenant A", Isolation::Soft).await.expect("tenant");
    let root = berth.person("root@example.com", Role::PlatformAdmin, None).await;
    let boss = berth.person("boss@example.com", Role::TenantAdmin, Some(tenant)).await;
    let (_, root) = berth.token(&root, &[]).await;
    let (_, boss) = berth.token(&boss, &[]).await;

    let listed = berth.api(Method::GET, "/api/v1/nodes?search=l40s-01", "", Some(&root)).await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    let listed = json(&listed);
    assert_eq!((listed["total_nodes"].as_u64(), listed["page"].as_u64()), (Some(1), Some(1)), "{listed}");
    let node = &listed["nodes"][0];
    assert_eq!((node["node"].as_str(), node["state"].as_str()), (Some("l40s-01"), Some("available")), "{node}");
    assert!(node["gpus"].as_array().is_some_and(|g| !g.is_empty() && g[0]["health"] == "healthy"), "{node}");
    let theirs = berth.api(Method::GET, "/api/v1/nodes", "", Some(&boss)).await;
    assert_eq!(theirs.status, StatusCode::FORBIDDEN, "the fleet is the platform's: {}", theirs.body);

    let backwards = r#"{"node": "l40s-01", "start": "2030-01-02 10:00", "end": "2030-01-01 10:00", "reason": "x"}"#;
    let backwards = berth.api(Method::POST, "/api/v1/maintenance", backwards, Some(&root)).await;
    assert_eq!(backwards.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", backwards.body);
    let unsaid = r#"{"node": "l40s-01", "start": "2030-01-01 10:00", "end": "2030-01-01 12:00", "reason": " "}"#;
    let unsaid = berth.api(Method::POST, "/api/v1/maintenance", unsaid, Some(&root)).await;
    assert_eq!(unsaid.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", unsaid.body);
    assert!(unsaid.body.contains("so users know why"), "{}", unsaid.body);
    let windows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM maintenance_windows").fetch_one(db).await.expect("count");
    assert_eq!(windows, 0, "refused windows wrote nothing");

    let window = r#"{"node": "l40s-01", "gpu": 1, "end": "2099-01-01 00:00", "reason": "firmware"}"#;
    let scheduled = berth.api(Method::POST, "/api/v1/maintenance", window, Some(&root)).await;
    assert_eq!(scheduled.status, StatusCode::CREATED, "{}", scheduled.body);
    let scheduled = json(&scheduled);
    let window = &scheduled["window"];
    assert_eq!((window["node"].as_str(), window["gpu"].as_i64()), (Some("l40s-01"), Some(1)), "{scheduled}");
    assert_eq!(scheduled["affected"], serde_json::json!([]), "nothing was booked there");
    let listed = json(&berth.api(Method::GET, "/api/v1/nodes?search=l40s-01", "", Some(&root)).await);
    assert_eq!(listed["nodes"][0]["maintenance"][0]["reason"], "firmware", "{listed}");
    let id = window["id"].as_i64().expect("the window's id");
    let cancelled = berth.api(Method::DELETE, &format!("/api/v1/maintenance/{id}"), "", Some(&root)).await;
    assert_eq!(cancelled.status, StatusCode::OK, "{}", cancelled.body);
    let again = berth.api(Method::DELETE, &format!("/api/v1/maintenance/{id}"), "", Some(&root)).await;
    assert_eq!(again.status, StatusCode::NOT_FOUND, "{}", again.body);
}

/// A script runs an inference endpoint end to end: launched with its model, arguments and
/// variables (answered by name only), its key shown once and replaced, its replicas set.
#[tokio::test]
async fn a_script_serves_a_model_shows_its_key_once_and_scales_it() {
    let berth = Berth::start_running().await;
    let tenant = berth.platform.ensure_tenant("tenant-a", "Tenant A", Isolation::Soft).await.expect("tenant");
    let member = berth.person("dana@example.com", Role::Member, Some(tenant)).await;
    let viewer = berth.person("vic@example.com", Role::Viewer, Some(tenant)).await;
    let (_, token) = berth.token(&member, &[]).await;
    let (_, watcher) = berth.token(&viewer, &[]).await;
    let launch = r#"{"offering": "inference", "size": "l40s-1", "name": "llm", "hours": "2",
                     "image": "vllm/vllm-openai:v0.6.3", "model": "org/model-7b",
                     "args": "--model {model} --max-model-len 8192", "env": "HF_TOKEN=hf_secret"}"#;
    let launched = berth.api(Method::POST, "/api/v1/environments", launch, Some(&token)).await;
    assert_eq!(launched.status, StatusCode::CREATED, "{}", launched.body);
    assert!(!launched.body.contains("hf_secret"), "a variable's value is never answered");
    let env = json(&launched);
    assert_eq!(
        env["serving"],
        serde_json::json!({"model": "org/model-7b", "args": ["--model", "org/model-7b", "--max-model-len", "8192"],
                           "env_names": ["HF_TOKEN"]})
    );
    let id = env["id"].as_str().expect("id").to_owned();
    let at = |path: &str| format!("/api/v1/environments/{id}{path}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let state = json(&berth.api(Method::GET, &at("/endpoint"), "", Some(&token)).await);
        if state["key"] == "unrevealed" {
            assert_eq!((state["replicas"].as_u64(), state["replicas_applied"].as_u64()), (Some(1), Some(1)));
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the endpoint never became ready: {state}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    // A viewer sees the endpoint's state, not its key.
    let seen = berth.api(Method::GET, &at("/endpoint"), "", Some(&watcher)).await;
    assert_eq!(seen.status, StatusCode::OK, "{}", seen.body);
    let peek = berth.api(Method::POST, &at("/api-key"), "", Some(&watcher)).await;
    assert_eq!(peek.status, StatusCode::FORBIDDEN, "{}", peek.body);
    // Shown once; then only replaced, which stops the old one.
    let shown = json(&berth.api(Method::POST, &at("/api-key"), "", Some(&token)).await);
    let key = shown["key"].as_str().expect("the key").to_owned();
    assert!(key.starts_with("berth_ep_"), "{key}");
    let again = berth.api(Method::POST, &at("/api-key"), "", Some(&token)).await;
    assert_eq!(again.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", again.body);
    let replaced = json(&berth.api(Method::POST, &at("/api-key/replace"), "", Some(&token)).await);
    assert_ne!(replaced["key"].as_str(), Some(key.as_str()));
    assert_eq!(json(&berth.api(Method::GET, &at("/endpoint"), "", Some(&token)).await)["key"], "shown");

    // Two replicas, then a count out of range is refused in words.
    let scaled = berth.api(Method::PUT, &at("/replicas"), r#"{"replicas": 2}"#, Some(&token)).await;
    assert_eq!(scaled.status, StatusCode::OK, "{}", scaled.body);
    assert_eq!(json(&scaled)["replicas"].as_u64(), Some(2));
    let held: i64 =
        sqlx::query_scalar("SELECT count(*) FROM reservations WHERE environment_id = ? AND released_at IS NULL")
            .bind(&id)
            .fetch_one(berth.platform.db())
            .await
            .expect("count");
    assert_eq!(held, 2, "the second replica books its own GPU");
    let nine = berth.api(Method::PUT, &at("/replicas"), r#"{"replicas": 9}"#, Some(&token)).await;
    assert_eq!(nine.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", nine.body);
    assert!(nine.body.contains("replicas must be a whole number between 1 and 8"), "{}", nine.body);
    // A notebook has neither.
    let notebook = berth.launch(&member, "nb").await;
    let none = berth.api(Method::GET, &format!("/api/v1/environments/{notebook}/endpoint"), "", Some(&token)).await;
    assert_eq!(none.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", none.body);
}

/// Onboarding and offboarding by script: a platform admin makes a tenant with its first
/// admin, suspends it (its people's tokens stop at once), resumes it, is told what is wrong
/// with a bad status or isolation (nothing changes), and deletes it.
#[tokio::test]
async fn a_script_onboards_suspends_and_deletes_a_tenant() {
    let berth = Berth::start(None).await;
    let staff = berth.person("ops@example.com", Role::PlatformAdmin, None).await;
    let (_, token) = berth.token(&staff, &[]).await;
    let b = &berth;
    let call = move |method: Method, path: String, body: String| {
        let token = token.clone();
        async move { b.api(method, &path, &body, Some(&token)).await }
    };

    let made = call(
        Method::POST,
        "/api/v1/tenants".into(),
        r#"{"slug": "initech", "name": "Initech", "isolation": "soft", "first_admin": "peter@initech.example"}"#.into(),
    )
    .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let tenant = json(&made);
    assert_eq!((tenant["slug"].as_str(), tenant["status"].as_str()), (Some("initech"), Some("active")));
    assert_eq!(tenant["members"], 1, "its first admin is invited");
    let id = tenant["id"].as_i64().expect("id");
    let again =
        call(Method::POST, "/api/v1/tenants".into(), r#"{"slug": "initech", "name": "I", "isolation": "soft"}"#.into())
            .await;
    assert_eq!(again.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", again.body);
    assert!(again.body.contains(r#"the short name \"initech\" is taken"#), "{}", again.body);

    let mia = berth.person("mia@initech.example", Role::Member, Some(id)).await;
    let (_, mias) = berth.token(&mia, &[]).await;
    assert_eq!(berth.api(Method::GET, "/api/v1/me", "", Some(&mias)).await.status, StatusCode::OK);

    let tenant_path = format!("/api/v1/tenants/{id}");
    let suspended = call(Method::PATCH, tenant_path.clone(), r#"{"status": "suspended"}"#.into()).await;
    assert_eq!(suspended.status, StatusCode::OK, "{}", suspended.body);
    assert_eq!(json(&suspended)["status"], "suspended");
    assert_eq!(berth.api(Method::GET, "/api/v1/me", "", Some(&mias)).await.status, StatusCode::UNAUTHORIZED);

    let bad = call(Method::PATCH, tenant_path.clone(), r#"{"status": "deleted", "isolation": "hard"}"#.into()).await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", bad.body);
    assert!(bad.body.contains(r#"not \"deleted\" (delete a tenant with DELETE)"#), "{}", bad.body);
    let bad = call(Method::PATCH, tenant_path.clone(), r#"{"isolation": "total"}"#.into()).await;
    assert!(bad.body.contains(r#"isolation must be soft, hard or hybrid, not \"total\""#), "{}", bad.body);
    let resumed = call(Method::PATCH, tenant_path.clone(), r#"{"status": "active"}"#.into()).await;
    let resumed = json(&resumed);
    assert_eq!((resumed["status"].as_str(), resumed["isolation"].as_str()), (Some("active"), Some("soft")));

    let deleted = call(Method::DELETE, tenant_path.clone(), String::new()).await;
    assert_eq!(deleted.status, StatusCode::OK, "{}", deleted.body);
    let status: String = sqlx::query_scalar("SELECT status FROM tenants WHERE id = ?")
        .bind(id)
        .fetch_one(berth.platform.db())
        .await
        .expect("status");
    assert_eq!(status, "deleted");
    assert_eq!(call(Method::DELETE, tenant_path, String::new()).await.status, StatusCode::NOT_FOUND);
    // A member may not make tenants.
    let other = berth.platform.ensure_tenant("hooli", "Hooli", Isolation::Soft).await.expect("tenant");
    let (_, members_token) =
        berth.token(&berth.person("gavin@hooli.example", Role::Member, Some(other)).await, &[]).await;
    let refused = berth
        .api(
            Method::POST,
            "/api/v1/tenants",
            r#"{"slug": "x", "name": "X", "isolation": "soft"}"#,
            Some(&members_token),
        )
        .await;
    assert!(refused.status == StatusCode::FORBIDDEN, "{}", refused.body);
}

/// A platform admin's script marks a GPU degraded and back, as the fleet page does; the
/// node's health shows the mark with its note; a mark that is not a health, or a GPU the
/// node lacks, is refused and changes nothing.
#[tokio::test]
async fn a_script_marks_a_gpus_health() {
    let berth = Berth::start(None).await;
    let admin = berth.person("root@example.com", Role::PlatformAdmin, None).await;
    let (_, token) = berth.token(&admin, &[]).await;
    let path = "/api/v1/nodes/h100-01/gpus/1/health";
    let marked = berth.api(Method::PUT, path, r#"{"health": "degraded", "note": "fan noise"}"#, Some(&token)).await;
    assert_eq!(marked.status, StatusCode::OK, "{}", marked.body);
    let marked: serde_json::Value = serde_json::from_str(&marked.body).expect("json");
    assert_eq!((marked["gpu"].as_i64(), marked["health"].as_str()), (Some(1), Some("degraded")));
    let gpu_state = || async {
        let health = berth.api(Method::GET, "/api/v1/nodes/h100-01/health", "", Some(&token)).await;
        let health: serde_json::Value = serde_json::from_str(&health.body).expect("json");
        health["gpu_states"][1].clone()
    };
    let state = gpu_state().await;
    assert_eq!((state["health"].as_str(), state["note"].as_str()), (Some("degraded"), Some("fan noise")), "{state}");

    let bad = berth.api(Method::PUT, path, r#"{"health": "fine"}"#, Some(&token)).await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", bad.body);
    assert!(bad.body.contains("health must be healthy, degraded or failed"), "{}", bad.body);
    let missing =
        berth.api(Method::PUT, "/api/v1/nodes/h100-01/gpus/99/health", r#"{"health": "failed"}"#, Some(&token));
    assert_eq!(missing.await.status, StatusCode::NOT_FOUND);
    assert_eq!(gpu_state().await["health"], "degraded", "the refused marks changed nothing");

    let back = berth.api(Method::PUT, path, r#"{"health": "healthy"}"#, Some(&token)).await;
    assert_eq!(back.status, StatusCode::OK, "{}", back.body);
    assert_eq!(gpu_state().await["note"], serde_json::Value::Null);
}

#[tokio::test]
async fn a_script_reads_the_calendar_the_capacity_and_the_agents() {
    let berth = Berth::start(None).await;
    let acme = berth.platform.ensure_tenant("acme", "Acme", Isolation::Soft).await.expect("tenant");
    let ada = berth.person("ada@acme.com", Role::Member, Some(acme)).await;
    let (_, token) = berth.token(&ada, &[]).await;
    let read = |path: String, token: String| {
        let berth = &berth;
        async move {
            let reply = berth.api(Method::GET, &path, "", Some(&token)).await;
            assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.body);
            serde_json::from_str::<serde_json::Value>(&reply.body).expect("json")
        }
    };
    let slice_row = |calendar: &serde_json::Value| {
        calendar["rows"]
            .as_array()
            .expect("rows")
            .iter()
            .find(|r| r["sizes"].as_array().is_some_and(|s| s.contains(&"h100-1g.10gb".into())))
            .cloned()
            .expect("the 1g.10gb slice's row")
    };

    let before = read("/api/v1/calendar?span=day".into(), token.clone()).await;
    assert_eq!((before["bucket_seconds"].as_i64(), before["buckets"].as_array().map(Vec::len)), (Some(3600), Some(24)));
    let row = slice_row(&before);
    let capacity = row["capacity"].as_u64().expect("capacity");
    let hour = (berth_platform::now_ms() % 86_400_000 / 3_600_000) as usize;
    assert_eq!(row["free"][hour].as_u64(), Some(capacity), "{row}");
    berth.launch(&ada, "nb").await;
    let after = read("/api/v1/calendar?span=day".into(), token.clone()).await;
    // Read again: the hour may have turned meanwhile (the booking covers the next one too).
    let hour = (berth_platform::now_ms() % 86_400_000 / 3_600_000) as usize;
    assert_eq!(slice_row(&after)["free"][hour].as_u64(), Some(capacity - 1), "the booking shows at once");
    let month = read("/api/v1/calendar?span=month&from=2030-01-01".into(), token.clone()).await;
    assert_eq!(
        (month["from"].as_str(), month["buckets"].as_array().map(Vec::len)),
        (Some("2030-01-01T00:00:00.000Z"), Some(30))
    );
    for (query, says) in
        [("span=year", "span must be day, week or month"), ("from=tomorrow", "from must be a day like")]
    {
        let refused = berth.api(Method::GET, &format!("/api/v1/calendar?{query}"), "", Some(&token)).await;
        assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", refused.body);
        assert!(refused.body.contains(says), "{}", refused.body);
    }

    let capacity = read("/api/v1/capacity".into(), token.clone()).await;
    let h100 = capacity["models"].as_array().expect("models").iter().find(|m| m["gpu_model"] == "H100-80GB").cloned();
    let h100 = h100.expect("the fleet's H100s");
    assert!(h100["idle_gpus"].as_i64() < h100["gpus"].as_i64(), "the slice's GPU is not idle: {h100}");

    let root = berth.person("root@example.com", Role::PlatformAdmin, None).await;
    let (_, root_token) = berth.token(&root, &[]).await;
    berth.platform.create_node_token(&root.caller(super::meta()), "h100-01").await.expect("node token");
    let agents = read("/api/v1/node-agents?search=h100-01".into(), root_token.clone()).await;
    let agent = &agents["agents"][0];
    assert_eq!((agent["node"].as_str(), agent["last_seen_at"].as_str()), (Some("h100-01"), None));
    assert_eq!(agent["tokens"].as_array().map(Vec::len), Some(1), "{agents}");
    let efficiency = read("/api/v1/gpu-efficiency".into(), root_token).await;
    assert!(efficiency["days"].is_array(), "{efficiency}");
    let denied = berth.api(Method::GET, "/api/v1/node-agents", "", Some(&token)).await;
    assert_eq!(denied.status, StatusCode::FORBIDDEN);
}
