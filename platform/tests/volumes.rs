//! Volumes: made, attached at launch, detached at release, deleted only when detached,
//! within storage quotas; files written in one booking read in the next (the simulated
//! backend's volumes are real directories); a deleted tenant's volumes go after
//! everything of it stopped.
#![allow(clippy::expect_used, clippy::unwrap_used)] // helpers of tests stop the test with their message

mod common;

use berth_domain::Refusal;
use berth_domain::launch::LaunchRequest;
use berth_domain::lifecycle::EnvState;
use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use berth_platform::capacity::volumes::VolumeRequest;
use berth_platform::tenancy::tenants::TenantChange;
use berth_platform::{Caller, Error};
use common::{TestBerth, test_meta};
use sqlx::SqlitePool;

fn refusal(result: Result<impl std::fmt::Debug, Error>) -> Refusal {
    match result {
        Err(Error::Refused(refusal)) => refusal,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn ask(name: &str, size: &str, project: &str) -> VolumeRequest {
    VolumeRequest { name: name.into(), size_gib: size.into(), project: project.into() }
}

fn notebook(name: &str, project: &str, volumes: &[i64]) -> LaunchRequest {
    LaunchRequest {
        offering: "notebook".into(),
        size: "h100-1g.10gb".into(),
        name: name.into(),
        hours: "2".into(),
        project: project.into(),
        volumes: volumes.iter().map(i64::to_string).collect(),
        ..LaunchRequest::default()
    }
}

/// Acme with project "vision" (Dana in it) and its admin Ada.
async fn vision(berth: &TestBerth) -> (Caller, i64) {
    let acme = berth.caller.tenant_id().expect("tenant");
    let ada = berth.user_with("ada@example.com", Role::TenantAdmin).await;
    berth.platform.create_project(&ada, acme, "vision").await.expect("project");
    let vision = berth.platform.projects(&ada, acme).await.expect("projects")[0].id;
    berth.platform.add_project_member(&ada, acme, vision, "dana@example.com").await.expect("member");
    (ada, vision)
}

async fn count(berth: &TestBerth, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(berth.platform.db()).await.expect("count")
}

#[sqlx::test(migrations = "../migrations")]
async fn a_file_written_in_one_booking_is_read_in_the_next(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let (_ada, vision) = vision(&berth).await;
    let shared =
        berth.platform.create_volume(&berth.caller, &ask("datasets", "50", &vision.to_string())).await.unwrap();
    assert_eq!(shared.mount_path, "/data/datasets");

    let first =
        berth.platform.launch(&berth.caller, &notebook("one", &vision.to_string(), &[shared.id])).await.unwrap();
    berth.wait_for(&first.id, EnvState::Ready).await;
    // The home volume was made on this first launch, and both are attached.
    let mounted = berth.platform.environment_volumes(&berth.caller, &first.id).await.unwrap();
    let paths: Vec<&str> = mounted.iter().map(|a| a.mount_path.as_str()).collect();
    assert_eq!(paths, ["/data/datasets", "/home/jovyan/work"]);
    // Attached: it cannot be deleted.
    assert_eq!(
        refusal(berth.platform.delete_volume(&berth.caller, shared.id).await),
        Refusal::VolumeAttached { name: "datasets".into(), environment: "one".into() }
    );

    // Written through Jupyter's contents API, as a notebook's browser does.
    let upstream = berth.platform.notebook_upstream(&berth.caller, &first.id).await.unwrap();
    let (_, token) = upstream.headers.iter().find(|(k, _)| k == "authorization").unwrap();
    let client = reqwest::Client::new();
    let url = format!("{}/api/contents/data/datasets/notes.txt", upstream.base_url);
    let body = serde_json::json!({"type": "file", "format": "text", "content": "kept across bookings"});
    let put = client.put(&url).header("authorization", token).body(body.to_string()).send().await.unwrap();
    assert_eq!(put.status().as_u16(), 201);
    let outside = format!("{}/api/contents/etc/notes.txt", upstream.base_url);
    let put = client.put(&outside).header("authorization", token).body(body.to_string()).send().await.unwrap();
    assert_eq!(put.status().as_u16(), 404, "nothing outside a volume");

    berth.platform.stop(&berth.caller, &first.id).await.unwrap();
    berth.wait_for(&first.id, EnvState::Released).await;
    assert_eq!(count(&berth, "SELECT count(*) FROM volume_attachments WHERE detached_at IS NULL").await, 0);

    let second =
        berth.platform.launch(&berth.caller, &notebook("two", &vision.to_string(), &[shared.id])).await.unwrap();
    berth.wait_for(&second.id, EnvState::Ready).await;
    let upstream = berth.platform.notebook_upstream(&berth.caller, &second.id).await.unwrap();
    let (_, token) = upstream.headers.iter().find(|(k, _)| k == "authorization").unwrap();
    let url = format!("{}/api/contents/data/datasets/notes.txt", upstream.base_url);
    let read = client.get(&url).header("authorization", token).send().await.unwrap().text().await.unwrap();
    let read: serde_json::Value = serde_json::from_str(&read).unwrap();
    assert_eq!(read["content"], "kept across bookings");
    assert_eq!(read["type"], "file");
    // One home volume only, however many launches.
    assert_eq!(count(&berth, "SELECT count(*) FROM volumes WHERE is_home = 1").await, 1);
    let location = berth.platform.volume(&berth.caller, shared.id).await.unwrap().location.expect("a place");
    assert!(location.ends_with(&format!("berth-vol-{}", shared.id)), "{location}");

    // Once detached it can be deleted, audited, and its directory goes.
    berth.platform.stop(&berth.caller, &second.id).await.unwrap();
    berth.wait_for(&second.id, EnvState::Released).await;
    berth.platform.delete_volume(&berth.caller, shared.id).await.unwrap();
    assert_eq!(count(&berth, "SELECT count(*) FROM audit_events WHERE action = 'volume.delete'").await, 1);
    let dir = berth.backend.volume_dir(shared.id);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while dir.exists() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(!dir.exists(), "the deleted volume's directory is removed");
}

#[sqlx::test(migrations = "../migrations")]
async fn bad_names_sizes_and_quotas_are_refused_and_write_nothing(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let admin = berth.admin().await;
    let (ada, vision) = vision(&berth).await;
    let v = vision.to_string();
    assert!(matches!(
        refusal(berth.platform.create_volume(&berth.caller, &ask("Big_Data", "10", "")).await),
        Refusal::InvalidVolumeName(_)
    ));
    assert!(matches!(
        refusal(berth.platform.create_volume(&berth.caller, &ask("data", "0", "")).await),
        Refusal::InvalidVolumeSize(_)
    ));
    berth.platform.set_storage_quota(&admin, "tenant", "acme", "1000", "20").await.unwrap();
    // Storage limits are the platform's for tenants, the tenant admin's for projects.
    assert!(berth.platform.set_storage_quota(&ada, "tenant", "acme", "5000", "").await.is_err());
    berth.platform.set_storage_quota(&ada, "project", "vision", "500", "").await.unwrap();
    berth.platform.create_volume(&berth.caller, &ask("raw", "460", &v)).await.unwrap();
    assert_eq!(
        refusal(berth.platform.create_volume(&berth.caller, &ask("more", "100", &v)).await).to_string(),
        "storage quota: project vision has 40 GiB of 500 GiB left; 100 GiB asked"
    );
    let mine = berth.platform.create_volume(&berth.caller, &ask("scratch", "500", "")).await.unwrap();
    assert_eq!(
        refusal(berth.platform.resize_volume(&berth.caller, mine.id, "600").await).to_string(),
        "storage quota: tenant acme has 40 GiB of 1000 GiB left; 100 GiB asked"
    );
    assert!(matches!(
        refusal(berth.platform.resize_volume(&berth.caller, mine.id, "400").await),
        Refusal::InvalidVolumeSize(_)
    ));
    assert_eq!(berth.platform.resize_volume(&berth.caller, mine.id, "530").await.unwrap().size_gib, 530);
    assert_eq!(
        refusal(berth.platform.create_volume(&berth.caller, &ask("scratch", "1", "")).await),
        Refusal::VolumeNameInUse("scratch".into())
    );
    // The home volume (20 GiB, the tenant's setting) no longer fits: the launch is refused
    // whole, and nothing of it is written.
    let refused = refusal(berth.platform.launch(&berth.caller, &notebook("lab", "", &[])).await);
    assert_eq!(refused.to_string(), "storage quota: tenant acme has 10 GiB of 1000 GiB left; 20 GiB asked");
    assert_eq!(count(&berth, "SELECT count(*) FROM environments").await, 0);
    assert_eq!(count(&berth, "SELECT count(*) FROM volumes WHERE is_home = 1").await, 0);
    assert_eq!(count(&berth, "SELECT count(*) FROM volumes").await, 2);
}

#[sqlx::test(migrations = "../migrations")]
async fn nobody_attaches_or_sees_what_is_not_theirs(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let admin = berth.admin().await;
    let (ada, vision) = vision(&berth).await;
    let bob = berth.user_with("bob@example.com", Role::Member).await;
    let viewer = berth.user_with("vic@example.com", Role::Viewer).await;
    let danas = berth.platform.create_volume(&berth.caller, &ask("mine", "5", "")).await.unwrap();
    let shared = berth.platform.create_volume(&berth.caller, &ask("shared", "5", &vision.to_string())).await.unwrap();

    // Another tenant's member: not even visible.
    let globex = berth.platform.ensure_tenant("globex", "Globex", Isolation::Soft).await.unwrap();
    let gil = berth
        .platform
        .create_user("gil@example.com", "Gil", "a long passphrase", Role::Member, Some(globex))
        .await
        .unwrap()
        .caller(test_meta());
    assert!(berth.platform.volumes(&gil).await.unwrap().is_empty());
    assert!(matches!(berth.platform.volume(&gil, danas.id).await, Err(Error::NotFound)));
    let theirs = refusal(berth.platform.launch(&gil, &notebook("x", "", &[danas.id])).await);
    assert_eq!(theirs, Refusal::UnknownVolume("mine".into()));
    // Bob (same tenant, not in vision) neither attaches Dana's nor the project's.
    assert!(matches!(
        refusal(berth.platform.launch(&bob, &notebook("b", "", &[danas.id])).await),
        Refusal::UnknownVolume(_)
    ));
    assert!(matches!(
        refusal(berth.platform.launch(&bob, &notebook("b", "", &[shared.id])).await),
        Refusal::VolumeNotInProject(_)
    ));
    let bobs = berth.platform.delete_volume(&bob, shared.id).await;
    assert!(matches!(bobs, Err(Error::NotFound)), "{bobs:?}");
    // Dana attaches the project's only when booking in the project.
    assert!(matches!(
        refusal(berth.platform.launch(&berth.caller, &notebook("d", "", &[shared.id])).await),
        Refusal::VolumeNotInProject(_)
    ));
    // A viewer sees the tenant's volumes and changes none.
    assert_eq!(berth.platform.volumes(&viewer).await.unwrap().len(), 2);
    assert!(matches!(berth.platform.delete_volume(&viewer, danas.id).await, Err(Error::Forbidden | Error::NotFound)));
    assert!(berth.platform.create_volume(&viewer, &ask("v", "1", "")).await.is_err());
    // The tenant admin sees and manages them; the platform admin sees all.
    assert_eq!(berth.platform.volumes(&ada).await.unwrap().len(), 2);
    assert_eq!(berth.platform.resize_volume(&ada, shared.id, "6").await.unwrap().size_gib, 6);
    assert_eq!(berth.platform.volumes(&admin).await.unwrap().len(), 2);
    // Bob's list holds neither; the table refuses an attachment across tenants anyway.
    assert!(berth.platform.volumes(&bob).await.unwrap().is_empty());
}

#[sqlx::test(migrations = "../migrations")]
async fn the_database_holds_the_volume_rules(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let danas = berth.platform.create_volume(&berth.caller, &ask("mine", "5", "")).await.unwrap();
    let env = berth.launch("notebook", "h100-1g.10gb", "lab").await.unwrap();
    let globex = berth.platform.ensure_tenant("globex", "Globex", Isolation::Soft).await.unwrap();
    let gil = berth
        .platform
        .create_user("gil@example.com", "Gil", "a long passphrase", Role::Member, Some(globex))
        .await
        .unwrap();
    let db = berth.platform.db();
    let attach = |volume: i64, env: &str, path: &str| {
        sqlx::query(
            "INSERT INTO volume_attachments (volume_id, environment_id, mount_path, attached_at) VALUES (?, ?, ?, 1)",
        )
        .bind(volume)
        .bind(env.to_owned())
        .bind(path.to_owned())
    };
    // Another tenant's volume never attaches to this environment.
    sqlx::query("INSERT INTO volumes (tenant_id, owner_id, name, size_gib, created_at) VALUES (?, ?, 'theirs', 1, 1)")
        .bind(globex)
        .bind(gil.id)
        .execute(db)
        .await
        .unwrap();
    let theirs: i64 = sqlx::query_scalar("SELECT id FROM volumes WHERE name = 'theirs'").fetch_one(db).await.unwrap();
    assert!(attach(theirs, &env.id, "/data/theirs").execute(db).await.is_err());
    attach(danas.id, &env.id, "/data/mine").execute(db).await.unwrap();
    // Not deleted while attached; not shrunk; never removed; names are DNS labels.
    assert!(sqlx::query("UPDATE volumes SET deleted_at = 2 WHERE id = ?").bind(danas.id).execute(db).await.is_err());
    assert!(sqlx::query("UPDATE volumes SET size_gib = 1 WHERE id = ?").bind(danas.id).execute(db).await.is_err());
    assert!(sqlx::query("DELETE FROM volumes WHERE id = ?").bind(danas.id).execute(db).await.is_err());
    assert!(
        sqlx::query(
            "INSERT INTO volumes (tenant_id, owner_id, name, size_gib, created_at) VALUES (?, ?, 'Bad_Name', 1, 1)"
        )
        .bind(globex)
        .bind(gil.id)
        .execute(db)
        .await
        .is_err()
    );
    // One name per owner among live volumes.
    assert!(
        sqlx::query(
            "INSERT INTO volumes (tenant_id, owner_id, name, size_gib, created_at) VALUES (?, ?, 'theirs', 1, 1)"
        )
        .bind(globex)
        .bind(gil.id)
        .execute(db)
        .await
        .is_err()
    );
    // An environment never ends holding a volume.
    assert!(
        sqlx::query("UPDATE environments SET state = 'released' WHERE id = ?").bind(&env.id).execute(db).await.is_err()
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn deleting_a_tenant_deletes_its_volumes_after_everything_stopped(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let admin = berth.admin().await;
    let acme = berth.caller.tenant_id().unwrap();
    let kept = berth.platform.create_volume(&berth.caller, &ask("kept", "5", "")).await.unwrap();
    let env = berth.platform.launch(&berth.caller, &notebook("lab", "", &[kept.id])).await.unwrap();
    berth.wait_for(&env.id, EnvState::Ready).await;
    berth.platform.change_tenant(&admin, acme, TenantChange::Delete).await.unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let left =
            count(&berth, "SELECT count(*) FROM volumes WHERE deleted_at IS NULL OR storage_removed_at IS NULL").await;
        if left == 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{left} volumes left after the tenant was deleted");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Deleted only after its environment released them.
    let released_at: i64 = sqlx::query_scalar("SELECT finished_at FROM environments WHERE id = ?")
        .bind(&env.id)
        .fetch_one(berth.platform.db())
        .await
        .unwrap();
    let deleted_at: i64 =
        sqlx::query_scalar("SELECT max(deleted_at) FROM volumes").fetch_one(berth.platform.db()).await.unwrap();
    assert!(deleted_at >= released_at);
    let audited = count(
        &berth,
        "SELECT count(*) FROM audit_events WHERE action = 'volume.delete' AND detail LIKE '%its tenant was deleted%'",
    )
    .await;
    assert_eq!(audited, 2, "the home volume and kept");
    assert!(!berth.backend.volume_dir(kept.id).exists());
}

/// Where the storage enforces no size (the simulated backend's directories, like bare
/// metal's), a volume measured over its size is refused at the next attach, with what to
/// do, until it is grown.
#[sqlx::test(migrations = "../migrations")]
async fn a_volume_written_past_its_size_is_not_attached_again_until_grown(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let scratch = berth.platform.create_volume(&berth.caller, &ask("scratch", "1", "")).await.unwrap();
    let first = berth.platform.launch(&berth.caller, &notebook("one", "", &[scratch.id])).await.unwrap();
    berth.wait_for(&first.id, EnvState::Ready).await;
    // 1.5 GiB written into a 1 GiB volume (a sparse file: its length is what counts).
    let file = std::fs::File::create(berth.backend.volume_dir(scratch.id).join("big.bin")).unwrap();
    file.set_len(3 << 29).unwrap();
    berth.platform.stop(&berth.caller, &first.id).await.unwrap();
    berth.wait_for(&first.id, EnvState::Released).await;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let used = berth.platform.volume(&berth.caller, scratch.id).await.unwrap().used_bytes;
        if used == Some(3 << 29) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the sweep measures the volume: {used:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    let before = count(&berth, "SELECT count(*) FROM environments").await;
    let refused = refusal(berth.platform.launch(&berth.caller, &notebook("two", "", &[scratch.id])).await);
    assert_eq!(
        refused.to_string(),
        "volume \"scratch\" holds 1.5 GiB, more than its 1 GiB; grow it to 2 GiB or more on the volumes page to attach it again"
    );
    assert_eq!(count(&berth, "SELECT count(*) FROM environments").await, before, "nothing written");
    // Other bookings are not held up by it.
    let other = berth.platform.launch(&berth.caller, &notebook("three", "", &[])).await.unwrap();
    berth.platform.stop(&berth.caller, &other.id).await.unwrap();

    berth.platform.resize_volume(&berth.caller, scratch.id, "2").await.unwrap();
    berth.platform.launch(&berth.caller, &notebook("two", "", &[scratch.id])).await.unwrap();
}
