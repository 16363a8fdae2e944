//! The image catalog: a launch runs the catalog's default or an entry it names, a tenant's
//! own entries and default come first, custom images follow the tenant's rule, entries
//! must be pinned, who may change which catalog, and every change audited.
#![allow(clippy::expect_used, clippy::unwrap_used)] // helpers of tests stop the test with their message

mod common;

use berth_domain::image::{CustomImages, ImageForm};
use berth_domain::launch::LaunchRequest;
use berth_domain::policy::Role;
use berth_platform::{Caller, Error};
use common::TestBerth;
use sqlx::SqlitePool;

const DIGEST: &str = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

fn refusal(result: Result<impl std::fmt::Debug, Error>) -> String {
    match result {
        Err(Error::Refused(refusal)) => refusal.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn entry(name: &str, reference: &str, offerings: &[&str], default_for: &[&str]) -> ImageForm {
    ImageForm {
        name: name.into(),
        reference: reference.into(),
        cuda: "12.4".into(),
        framework: "PyTorch 2.4".into(),
        offerings: offerings.iter().map(|o| o.to_string()).collect(),
        default_for: default_for.iter().map(|o| o.to_string()).collect(),
        ..ImageForm::default()
    }
}

fn launch(offering: &str, name: &str, image: &str) -> LaunchRequest {
    LaunchRequest {
        offering: offering.into(),
        size: if offering == "notebook" { "h100-1g.10gb" } else { "h100-1" }.into(),
        name: name.into(),
        hours: "1".into(),
        image: image.into(),
        command: if offering == "training" { "python train.py".into() } else { String::new() },
        ..LaunchRequest::default()
    }
}

async fn image_of(berth: &TestBerth, caller: &Caller, request: &LaunchRequest) -> Option<String> {
    berth.platform.launch(caller, request).await.expect("launched").image
}

async fn count(berth: &TestBerth, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(berth.platform.db()).await.expect("count")
}

#[sqlx::test(migrations = "../migrations")]
async fn a_launch_runs_the_default_or_the_entry_it_names(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let dana = berth.caller.clone();
    // The seeded platform catalog: three notebook images, PyTorch the default.
    let pytorch = "quay.io/jupyter/pytorch-notebook:cuda12-latest";
    assert_eq!(image_of(&berth, &dana, &launch("notebook", "nb-1", "")).await.as_deref(), Some(pytorch));
    let scipy = "quay.io/jupyter/scipy-notebook:latest";
    assert_eq!(image_of(&berth, &dana, &launch("notebook", "nb-2", "SciPy notebook")).await.as_deref(), Some(scipy));
    assert!(
        refusal(berth.platform.launch(&dana, &launch("notebook", "nb-3", "evil/miner:1")).await)
            .contains("not one of the jupyter notebook images in the catalog")
    );

    // A platform admin adds a pinned training image and makes it the default.
    let root = berth.admin().await;
    let trainer = format!("nvcr.io/nvidia/pytorch:24.05-py3@{DIGEST}");
    let added = berth
        .platform
        .add_image(&root, None, &entry("NGC PyTorch", &trainer, &["training", "notebook"], &["training"]))
        .await
        .expect("added");
    assert!(added.image.is_pinned());
    assert_eq!(added.tenant, None, "the platform's catalog");
    assert_eq!(image_of(&berth, &dana, &launch("training", "job-1", "")).await, Some(trainer.clone()));
    assert_eq!(image_of(&berth, &dana, &launch("training", "job-2", "NGC PyTorch")).await, Some(trainer.clone()));

    // Acme's admin adds the team's own notebook image as the team's default: it comes first.
    let ada = berth.user_with("ada@example.com", Role::TenantAdmin).await;
    let acme = ada.tenant_id();
    let lab = format!("ghcr.io/acme/lab:3@{DIGEST}");
    berth.platform.add_image(&ada, acme, &entry("Acme lab", &lab, &["notebook"], &["notebook"])).await.expect("team's");
    assert_eq!(image_of(&berth, &dana, &launch("notebook", "nb-4", "")).await, Some(lab.clone()));
    let choice = berth.platform.launch_images(&dana).await.expect("offered");
    let offered: Vec<&str> =
        choice.offered(berth_domain::catalog::Offering::Notebook).iter().map(|i| i.name.as_str()).collect();
    assert_eq!(offered[0], "Acme lab", "the team's default first: {offered:?}");
    assert!(offered.contains(&"NGC PyTorch"));

    // Globex's people do not see Acme's entry, and cannot name it.
    let globex = berth.platform.create_tenant(&root, "globex", "Globex", "soft", "").await.expect("tenant").id;
    let gus = berth.platform.create_user("gus@example.com", "Gus", "a long passphrase", Role::Member, Some(globex));
    let gus = gus.await.expect("gus").caller(common::test_meta());
    assert_eq!(
        image_of(&berth, &gus, &launch("notebook", "nb-5", "")).await.as_deref(),
        Some(pytorch),
        "the platform's default"
    );
    assert!(refusal(berth.platform.launch(&gus, &launch("notebook", "nb-6", &lab)).await).contains("not one of"));
    let theirs = berth.platform.image_catalog(&gus).await.expect("catalog");
    assert_eq!(theirs.tenants.len(), 1);
    assert!(theirs.tenants[0].images.is_empty());

    // Environments keep the reference they were launched with; removing changes new launches.
    berth.platform.remove_image(&ada, theirs_id(&berth, "Acme lab").await).await.expect("removed");
    assert_eq!(image_of(&berth, &dana, &launch("notebook", "nb-7", "")).await.as_deref(), Some(pytorch));
    assert_eq!(count(&berth, &format!("SELECT count(*) FROM environments WHERE image = '{lab}'")).await, 1);
    for action in ["image.add", "image.remove"] {
        let audited = count(&berth, &format!("SELECT count(*) FROM audit_events WHERE action = '{action}'")).await;
        assert!(audited >= 1, "{action} audited");
    }
}

async fn theirs_id(berth: &TestBerth, name: &str) -> i64 {
    sqlx::query_scalar("SELECT id FROM images WHERE name = ?")
        .bind(name)
        .fetch_one(berth.platform.db())
        .await
        .expect("image id")
}

#[sqlx::test(migrations = "../migrations")]
async fn custom_images_follow_the_tenants_rule(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let dana = berth.caller.clone();
    let acme = dana.tenant_id().expect("tenant");
    let root = berth.admin().await;
    // Any registry until a platform admin narrows it.
    assert!(berth.platform.launch(&dana, &launch("training", "any-1", "docker.io/me/trainer:1")).await.is_ok());

    let rule = berth.platform.set_custom_images(&root, acme, "registries", "ghcr.io, nvcr.io").await.expect("rule");
    assert_eq!(rule.custom, CustomImages::Registries(vec!["ghcr.io".into(), "nvcr.io".into()]));
    assert_eq!((rule.tenant_id, rule.tenant.as_str()), (acme, "acme"));
    let before = count(&berth, "SELECT count(*) FROM environments").await;
    assert_eq!(
        refusal(berth.platform.launch(&dana, &launch("training", "hub-1", "pytorch/pytorch:2.4")).await),
        "container image pytorch/pytorch:2.4 comes from docker.io, which tenant acme does not allow; \
         pick a catalog image or one from ghcr.io, nvcr.io"
    );
    assert_eq!(count(&berth, "SELECT count(*) FROM environments").await, before, "nothing written");
    assert!(berth.platform.launch(&dana, &launch("inference", "ghcr-1", "ghcr.io/acme/serve:2")).await.is_ok());

    // A tenant admin cannot get round the rule through the team's catalog.
    let ada = berth.user_with("ada@example.com", Role::TenantAdmin).await;
    let hub = format!("docker.io/pytorch/pytorch:2.4@{DIGEST}");
    let refused = refusal(berth.platform.add_image(&ada, Some(acme), &entry("Hub", &hub, &["training"], &[])).await);
    assert!(refused.contains("docker.io is not a registry tenant acme allows"), "{refused}");

    berth.platform.set_custom_images(&root, acme, "catalog", "").await.expect("catalog only");
    assert!(
        refusal(berth.platform.launch(&dana, &launch("training", "own-1", "ghcr.io/acme/t:1")).await)
            .contains("tenant acme runs only catalog images")
    );
    // Bad rules are refused and change nothing.
    assert!(refusal(berth.platform.set_custom_images(&root, acme, "registries", "").await).contains("at least one"));
    assert!(refusal(berth.platform.set_custom_images(&root, acme, "everything", "").await).contains("not a choice"));
    let stored: String = sqlx::query_scalar("SELECT custom_images FROM tenants WHERE id = ?")
        .bind(acme)
        .fetch_one(berth.platform.db())
        .await
        .expect("rule");
    assert_eq!(stored, "catalog");
    // Only platform admins set the rule.
    assert!(matches!(berth.platform.set_custom_images(&ada, acme, "any", "").await, Err(Error::Forbidden)));
    assert_eq!(count(&berth, "SELECT count(*) FROM audit_events WHERE action = 'tenant.custom_images'").await, 2);
}

#[sqlx::test(migrations = "../migrations")]
async fn entries_are_checked_and_catalogs_kept_apart(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let root = berth.admin().await;
    let ada = berth.user_with("ada@example.com", Role::TenantAdmin).await;
    let dana = berth.caller.clone();
    let acme = dana.tenant_id();
    let pinned = format!("ghcr.io/acme/lab:3@{DIGEST}");

    let unpinned = entry("Lab", "ghcr.io/acme/lab:3", &["notebook"], &[]);
    assert!(refusal(berth.platform.add_image(&root, None, &unpinned).await).contains("is not pinned"));
    let stray = entry("Lab", &pinned, &["notebook"], &["inference"]);
    assert!(refusal(berth.platform.add_image(&root, None, &stray).await).contains("only for offerings it suits"));
    assert_eq!(count(&berth, "SELECT count(*) FROM images WHERE tenant_id IS NULL").await, 3, "nothing written");

    // Members read; only admins change, each their own catalog.
    assert!(matches!(
        berth.platform.add_image(&dana, acme, &entry("Lab", &pinned, &["notebook"], &[])).await,
        Err(Error::Forbidden)
    ));
    assert!(matches!(
        berth.platform.add_image(&ada, None, &entry("Lab", &pinned, &["notebook"], &[])).await,
        Err(Error::Forbidden)
    ));
    let added = berth.platform.add_image(&ada, acme, &entry("Lab", &pinned, &["notebook"], &[])).await.expect("added");
    let again = refusal(berth.platform.add_image(&ada, acme, &entry("Lab", &pinned, &["notebook"], &[])).await);
    assert!(again.contains("already has an image called \"Lab\""), "{again}");
    // The same name in the platform's catalog is another entry.
    berth.platform.add_image(&root, None, &entry("Lab", &pinned, &["notebook"], &[])).await.expect("platform's");

    assert!(
        refusal(berth.platform.set_default_image(&ada, added.image.id, "training").await).contains("does not suit")
    );
    let made = berth.platform.set_default_image(&ada, added.image.id, "notebook").await.expect("default");
    assert_eq!(made.tenant.as_deref(), Some("acme"));
    assert_eq!(made.image.default_for, [berth_domain::catalog::Offering::Notebook]);
    let catalog = berth.platform.image_catalog(&dana).await.expect("catalog");
    let ours = &catalog.tenants[0].images[0];
    assert_eq!(ours.default_for, [berth_domain::catalog::Offering::Notebook]);
    assert!(!catalog.may_manage_platform && !catalog.tenants[0].may_manage, "a member reads");

    // Another tenant's admin finds no such entry; a platform entry is the platform's.
    let globex = berth.platform.create_tenant(&root, "globex", "Globex", "soft", "").await.expect("tenant").id;
    let gia =
        berth.platform.create_user("gia@example.com", "Gia", "a long passphrase", Role::TenantAdmin, Some(globex));
    let gia = gia.await.expect("gia").caller(common::test_meta());
    assert!(matches!(berth.platform.remove_image(&gia, added.image.id).await, Err(Error::NotFound)));
    let seeded = theirs_id(&berth, "PyTorch notebook").await;
    assert!(matches!(berth.platform.remove_image(&ada, seeded).await, Err(Error::Forbidden)));
}
