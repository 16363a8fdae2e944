//! Store-level rules the database itself holds.
#![allow(clippy::expect_used, clippy::unwrap_used)] // helpers of tests stop the test with their message

mod common;

use berth_domain::Refusal;
use berth_domain::fleet::FleetSpec;
use berth_domain::policy::Role;
use berth_platform::identity::totp;
use berth_platform::{Error, Platform, RequestMeta, now_ms};
use common::SMALL_FLEET;
use sqlx::SqlitePool;

fn meta() -> RequestMeta {
    RequestMeta { request_id: "req-1".into(), source: Some("127.0.0.1".into()) }
}

#[sqlx::test(migrations = "../migrations")]
async fn fleet_sync_is_idempotent_and_retires_nodes_no_longer_described(pool: SqlitePool) {
    let platform = Platform::new(pool.clone());
    let fleet = FleetSpec::parse(SMALL_FLEET).expect("fleet");
    platform.sync_fleet(&fleet).await.expect("sync");
    platform.sync_fleet(&fleet).await.expect("sync again");
    let gpus: i64 =
        sqlx::query_scalar("SELECT count(*) FROM gpus WHERE in_service = 1").fetch_one(&pool).await.expect("count");
    assert_eq!(gpus, 7);

    let smaller = FleetSpec::parse(&SMALL_FLEET.replace("nodes = 2", "nodes = 1")).expect("fleet");
    platform.sync_fleet(&smaller).await.expect("shrink");
    let in_service: i64 =
        sqlx::query_scalar("SELECT count(*) FROM gpus WHERE in_service = 1").fetch_one(&pool).await.expect("count");
    let all: i64 = sqlx::query_scalar("SELECT count(*) FROM gpus").fetch_one(&pool).await.expect("count");
    assert_eq!((in_service, all), (5, 7));
    let capacity = platform.capacity_by_model().await.expect("capacity");
    assert_eq!(capacity.iter().map(|c| c.gpus).sum::<i64>(), 5);
}

#[sqlx::test(migrations = "../migrations")]
async fn the_first_start_creates_one_admin_whose_password_works_once_shown(pool: SqlitePool) {
    let platform = Platform::new(pool.clone());
    let admin = platform.bootstrap_admin().await.expect("bootstrap").expect("first start creates the admin");
    assert!(platform.bootstrap_admin().await.expect("second start").is_none());
    assert!(admin.password.len() >= 20);

    let stored: String = sqlx::query_scalar("SELECT password_hash FROM users").fetch_one(&pool).await.expect("hash");
    assert!(stored.starts_with("$argon2id$") && !stored.contains(&admin.password));

    let user = platform.sign_in(&admin.email, &admin.password, &meta()).await.expect("sign in");
    assert!(user.is_admin());
    let wrong = platform.sign_in(&admin.email, "guess", &meta()).await.expect_err("wrong password");
    let unknown = platform.sign_in("nobody@example.com", &admin.password, &meta()).await.expect_err("unknown");
    assert!(matches!(wrong, Error::BadCredentials) && matches!(unknown, Error::BadCredentials));
    assert_eq!(wrong.to_string(), unknown.to_string(), "a failure must not tell which part was wrong");

    let outcomes: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT action, outcome, request_id FROM audit_events WHERE action LIKE 'session.%' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .expect("audit");
    let expected = |a: &str, o: &str| (a.to_string(), o.to_string(), Some("req-1".to_string()));
    // An administrator's password is only the first step; the one-time code completes it.
    let failure = expected("session.sign_in", "failure");
    assert_eq!(outcomes, [expected("session.password", "success"), failure.clone(), failure]);
}

#[sqlx::test(migrations = "../migrations")]
async fn the_printed_first_start_password_only_lets_its_holder_choose_another(pool: SqlitePool) {
    let platform = Platform::new(pool.clone());
    let admin = platform.bootstrap_admin().await.expect("bootstrap").expect("admin");
    let user = platform.sign_in(&admin.email, &admin.password, &meta()).await.expect("sign in");
    assert!(platform.must_change_password(&user).await.expect("must change"), "the printed one must go");
    for (new, again, why) in [
        ("short", "short", Refusal::WeakPassword("must be 12 to 256 characters long")),
        ("a long enough one", "a long enough 0ne", Refusal::WeakPassword("and its repetition differ")),
        (admin.password.as_str(), admin.password.as_str(), Refusal::SamePassword),
    ] {
        let refused = platform.replace_first_password(user.id, new, again, &meta()).await;
        assert!(matches!(&refused, Err(Error::Refused(r)) if *r == why), "{refused:?}");
    }
    platform.replace_first_password(user.id, "my own passphrase", "my own passphrase", &meta()).await.expect("chosen");
    assert!(!platform.must_change_password(&user).await.expect("must change"));
    // The step is done once: it cannot be used again to set a password without the old one.
    let again = platform.replace_first_password(user.id, "someone else's", "someone else's", &meta()).await;
    assert!(matches!(again, Err(Error::Unauthenticated)), "{again:?}");
    assert!(matches!(platform.sign_in(&admin.email, &admin.password, &meta()).await, Err(Error::BadCredentials)));
    platform.sign_in(&admin.email, "my own passphrase", &meta()).await.expect("the chosen password works");

    // Changing it later takes the current one.
    let caller = user.caller(meta());
    let wrong = platform.change_password(&caller, "not it", "yet another phrase", "yet another phrase").await;
    assert!(matches!(wrong, Err(Error::Refused(Refusal::WrongPassword))), "{wrong:?}");
    platform
        .change_password(&caller, "my own passphrase", "yet another phrase", "yet another phrase")
        .await
        .expect("changed");
    platform.sign_in(&admin.email, "yet another phrase", &meta()).await.expect("the new password works");
    let audited: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE action = 'user.password'")
        .fetch_one(&pool)
        .await
        .expect("audit");
    assert_eq!(audited, 3, "chosen, refused once, changed");
}

#[sqlx::test(migrations = "../migrations")]
async fn another_platform_admin_resets_a_lost_authenticator_but_nobody_their_own(pool: SqlitePool) {
    let platform = Platform::new(pool.clone());
    let admin = platform.bootstrap_admin().await.expect("bootstrap").expect("admin");
    let first = platform.sign_in(&admin.email, &admin.password, &meta()).await.expect("sign in");
    let secret = totp::new_secret();
    let code = totp::code_at(&secret, now_ms() / 30_000).expect("code");
    platform.complete_second_factor(first.id, &code, Some(&secret), &meta()).await.expect("enrolled");
    assert!(platform.has_totp(first.id).await.expect("has"));
    let second = platform
        .create_user("ops@example.com", "Ops", "a long password", Role::PlatformAdmin, None)
        .await
        .expect("ops");
    let own = platform.reset_second_factor(&first.caller(meta()), &admin.email).await;
    assert!(matches!(own, Err(Error::Refused(Refusal::NotALocalAccount(_)))), "{own:?}");
    platform.reset_second_factor(&second.caller(meta()), &admin.email).await.expect("reset by another admin");
    assert!(!platform.has_totp(first.id).await.expect("has"), "set up again at the next sign-in");
    let member =
        platform.create_user("m@example.com", "M", "a long password", Role::PlatformAuditor, None).await.expect("m");
    let refused = platform.reset_second_factor(&member.caller(meta()), &admin.email).await;
    assert!(matches!(refused, Err(Error::Forbidden)), "{refused:?}");
}

#[sqlx::test(migrations = "../migrations")]
async fn administrators_set_up_a_one_time_code_and_each_code_works_once(pool: SqlitePool) {
    let platform = Platform::new(pool.clone());
    let admin = platform.bootstrap_admin().await.expect("bootstrap").expect("admin");
    let user = platform.sign_in(&admin.email, &admin.password, &meta()).await.expect("password");
    assert!(platform.needs_second_factor(&user));
    assert!(!platform.has_totp(user.id).await.expect("totp"));

    let secret = totp::new_secret();
    let code = |secret: &str| totp::code_at(secret, now_ms() / 30_000).expect("code");
    let wrong = platform.complete_second_factor(user.id, "000000", Some(&secret), &meta()).await;
    let right = code(&secret);
    let wrong = if right == "000000" { Err(Error::Refused(Refusal::WrongCode)) } else { wrong };
    assert!(matches!(wrong, Err(Error::Refused(Refusal::WrongCode))), "{wrong:?}");
    assert!(!platform.has_totp(user.id).await.expect("totp"), "a wrong code stores nothing");
    platform.complete_second_factor(user.id, &right, Some(&secret), &meta()).await.expect("set up");
    assert!(platform.has_totp(user.id).await.expect("totp"));
    let replay = platform.complete_second_factor(user.id, &right, None, &meta()).await;
    assert!(matches!(replay, Err(Error::Refused(Refusal::WrongCode))), "a code works once: {replay:?}");
}

#[sqlx::test(migrations = "../migrations")]
async fn repeated_failures_lock_an_account_from_that_address_but_not_its_owner_elsewhere(pool: SqlitePool) {
    let platform = Platform::new(pool.clone());
    let admin = platform.bootstrap_admin().await.expect("bootstrap").expect("admin");
    for _ in 0..5 {
        let wrong = platform.sign_in(&admin.email, "guess", &meta()).await;
        assert!(matches!(wrong, Err(Error::BadCredentials)));
    }
    let locked = platform.sign_in(&admin.email, &admin.password, &meta()).await;
    assert!(matches!(locked, Err(Error::Refused(Refusal::TooManyAttempts { .. }))), "{locked:?}");
    // The attacker's failures do not lock the owner out from where they are.
    let elsewhere = RequestMeta { request_id: "req-2".into(), source: Some("192.0.2.7".into()) };
    assert!(platform.sign_in(&admin.email, &admin.password, &elsewhere).await.is_ok(), "the owner signs in elsewhere");
    // An unknown email locks the same way, so the lockout tells nothing about accounts.
    for _ in 0..5 {
        let _ = platform.sign_in("nobody@example.com", "guess", &meta()).await;
    }
    let unknown = platform.sign_in("nobody@example.com", "guess", &meta()).await;
    assert_eq!(unknown.expect_err("locked").to_string(), locked.expect_err("locked").to_string());
    let denied: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE action = 'session.sign_in' AND outcome = 'denied'")
            .fetch_one(&pool)
            .await
            .expect("audit");
    assert_eq!(denied, 2, "every locked-out attempt is audited");
}

#[sqlx::test(migrations = "../migrations")]
async fn audit_rows_cannot_be_changed_or_deleted(pool: SqlitePool) {
    let platform = Platform::new(pool.clone());
    platform.bootstrap_admin().await.expect("bootstrap");
    let update = sqlx::query("UPDATE audit_events SET action = 'nothing'").execute(&pool).await;
    let delete = sqlx::query("DELETE FROM audit_events").execute(&pool).await;
    assert!(update.expect_err("append-only").to_string().contains("append-only"));
    assert!(delete.expect_err("append-only").to_string().contains("append-only"));
}

#[sqlx::test(migrations = "../migrations")]
async fn the_database_refuses_overlapping_reservations_and_double_release(pool: SqlitePool) {
    let platform = Platform::new(pool.clone());
    platform.sync_fleet(&FleetSpec::parse(SMALL_FLEET).expect("fleet")).await.expect("sync");
    let owner =
        platform.create_user("o@example.com", "O", "passphrase here", Role::PlatformAdmin, None).await.expect("user");
    sqlx::query(
        "INSERT INTO environments (id, owner_id, name, offering, size_id, cents_per_hour, state, desired, created_at,
            starts_at, ends_at, state_changed_at) VALUES ('e1', ?, 'n', 'notebook', 'h100-3g.40gb', 1, 'requested', 'running', 0, 0, 100, 0)",
    )
    .bind(owner.id)
    .execute(&pool)
    .await
    .expect("environment");
    let reserve = |start: i64, size: i64, from: i64, to: i64| {
        sqlx::query(
            "INSERT INTO reservations (environment_id, gpu_id, slice_start, slice_size, mig_profile, starts_at, ends_at)
             VALUES ('e1', 1, ?, ?, '3g', ?, ?)",
        )
        .bind(start)
        .bind(size)
        .bind(from)
        .bind(to)
        .execute(&pool)
    };
    reserve(0, 4, 0, 100).await.expect("first slice");
    reserve(4, 4, 0, 100).await.expect("the other half");
    let overlap = reserve(2, 2, 50, 150).await.expect_err("overlaps");
    assert!(overlap.to_string().contains("overlaps a held reservation"));
    reserve(0, 4, 100, 200).await.expect("the next window is free");

    sqlx::query("UPDATE reservations SET released_at = 5 WHERE id = 1").execute(&pool).await.expect("release");
    let twice = sqlx::query("UPDATE reservations SET released_at = 6 WHERE id = 1").execute(&pool).await;
    assert!(twice.expect_err("released once").to_string().contains("already released"));
    reserve(0, 2, 0, 100).await.expect("released capacity is free");
}
