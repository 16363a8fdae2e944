//! Reaching what was booked, on the simulated fleet: who may open a notebook, endpoint API
//! keys (shown once, kept hashed), replicas booked and released within quota, and training
//! logs with their exit status.
#![allow(clippy::expect_used, clippy::unwrap_used)] // helpers of tests stop the test with their message

mod common;

use std::time::Duration;

use berth_domain::Refusal;
use berth_domain::booking::Quota;
use berth_domain::launch::LaunchRequest;
use berth_domain::lifecycle::EnvState;
use berth_domain::policy::Role;
use berth_platform::capacity::quotas::QuotaSubject;
use berth_platform::provisioning::backend::JobStatus;
use berth_platform::provisioning::connect::{ENDPOINT_KEY_PREFIX, KeyState, LOG_TAIL};
use berth_platform::{Caller, Error};
use common::TestBerth;
use sqlx::SqlitePool;

fn refusal(result: Result<impl std::fmt::Debug, Error>) -> Refusal {
    match result {
        Err(Error::Refused(refusal)) => refusal,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

async fn audited(berth: &TestBerth, action: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE action = ? AND outcome = 'success'")
        .bind(action)
        .fetch_one(berth.platform.db())
        .await
        .unwrap()
}

async fn get(url: &str, authorization: Option<&str>) -> (u16, String) {
    let mut request = reqwest::Client::new().get(url);
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    let response = request.send().await.expect("request");
    (response.status().as_u16(), response.text().await.unwrap_or_default())
}

#[sqlx::test(migrations = "../migrations")]
async fn only_the_owner_and_their_tenant_admin_open_a_ready_notebook(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let env = berth.launch("notebook", "h100-1g.10gb", "lab").await.expect("launch");
    let early = berth.platform.notebook_upstream(&berth.caller, &env.id).await;
    assert!(matches!(refusal(early), Refusal::NotReady(_)), "not before it is ready");
    berth.wait_for(&env.id, EnvState::Ready).await;

    let upstream = berth.platform.notebook_upstream(&berth.caller, &env.id).await.expect("the owner opens it");
    // The upstream is real: it answers at its root (its origin is its own) with the
    // notebook's token, and refuses without it.
    let (_, token) = upstream.headers.iter().find(|(k, _)| k == "authorization").expect("credential header");
    let status = format!("{}/api/status", upstream.base_url);
    assert_eq!(get(&status, Some(token)).await.0, 200);
    assert_eq!(get(&status, None).await.0, 403);

    let admin = berth.user_with("ada@example.com", Role::TenantAdmin).await;
    berth.platform.notebook_upstream(&admin, &env.id).await.expect("their tenant admin opens it");
    let colleague = berth.user_with("cy@example.com", Role::Member).await;
    let viewer = berth.user_with("vi@example.com", Role::Viewer).await;
    let staff = berth.admin().await;
    for (who, caller) in [("a colleague", &colleague), ("a viewer", &viewer), ("platform staff", &staff)] {
        let denied = berth.platform.notebook_upstream(caller, &env.id).await;
        assert!(matches!(denied, Err(Error::NotFound | Error::Forbidden)), "{who}: {denied:?}");
        let ticket = berth.platform.open_notebook(caller, &env.id).await;
        assert!(matches!(ticket, Err(Error::NotFound | Error::Forbidden)), "{who}: {ticket:?}");
    }
    assert_eq!(audited(&berth, "environment.open").await, 0, "nothing was opened yet");

    // Opening: a ticket from the portal, redeemed once on the notebook's origin for a session.
    let ticket = berth.platform.open_notebook(&berth.caller, &env.id).await.expect("a ticket");
    assert_eq!(audited(&berth, "environment.open").await, 1, "opening is audited");
    let session = berth.platform.redeem_ticket(&env.id, &ticket, &berth.caller.meta).await.expect("redeemed");
    let again = berth.platform.redeem_ticket(&env.id, &ticket, &berth.caller.meta).await;
    assert!(matches!(again, Err(Error::Unauthenticated)), "single use: {again:?}");
    let user = berth.platform.environment_session_user(&env.id, &["forged", &session.secret]).await.expect("session");
    assert_eq!(user.id, berth.caller.user_id());
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM environment_sessions WHERE secret_hash = ?")
        .bind(&session.secret)
        .fetch_one(berth.platform.db())
        .await
        .unwrap();
    assert_eq!(stored, 0, "only a hash is kept");

    // Stopping the notebook ends its sessions and stops its server.
    berth.platform.stop(&berth.caller, &env.id).await.expect("stop");
    let ended = berth.platform.environment_session_user(&env.id, &[&session.secret]).await;
    assert!(matches!(ended, Err(Error::Unauthenticated)), "{ended:?}");
    berth.wait_for(&env.id, EnvState::Released).await;
    assert!(reqwest::get(&status).await.is_err(), "the simulated server is gone");
    assert_eq!(berth.backend.world().objects_of(&env.id), 0);
}

async fn ready_endpoint(berth: &TestBerth, name: &str) -> String {
    let env = berth.launch("inference", "l40s-1", name).await.expect("launch");
    berth.wait_for(&env.id, EnvState::Ready).await;
    env.id
}

async fn endpoint_state(
    berth: &TestBerth,
    caller: &Caller,
    id: &str,
) -> berth_platform::provisioning::connect::EndpointState {
    berth.platform.environment_detail(caller, id).await.expect("detail").endpoint.expect("an endpoint")
}

#[sqlx::test(migrations = "../migrations")]
async fn an_endpoint_key_is_shown_once_kept_hashed_and_replaceable(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let id = ready_endpoint(&berth, "serve").await;
    assert_eq!(endpoint_state(&berth, &berth.caller, &id).await.key, KeyState::Unrevealed);

    let colleague = berth.user_with("cy@example.com", Role::Member).await;
    assert!(matches!(berth.platform.reveal_endpoint_key(&colleague, &id).await, Err(Error::NotFound)));
    let key = berth.platform.reveal_endpoint_key(&berth.caller, &id).await.expect("shown once");
    assert!(key.starts_with(ENDPOINT_KEY_PREFIX) && key.len() > 60, "{key}");
    assert_eq!(refusal(berth.platform.reveal_endpoint_key(&berth.caller, &id).await), Refusal::ApiKeyAlreadyShown);
    assert!(matches!(endpoint_state(&berth, &berth.caller, &id).await.key, KeyState::Shown { .. }));
    let (stored, unrevealed): (String, Option<String>) =
        sqlx::query_as("SELECT key_hash, unrevealed FROM endpoint_keys WHERE environment_id = ?")
            .bind(&id)
            .fetch_one(berth.platform.db())
            .await
            .unwrap();
    assert_eq!(unrevealed, None, "the key itself is gone once shown");
    assert!(!stored.contains(&key) && stored.len() == 64, "only a hash is kept");

    let upstream = berth.platform.endpoint_upstream(&id, &key).await.expect("the key opens it");
    assert!(upstream.base_url.starts_with("http://127.0.0.1:"), "{}", upstream.base_url);
    assert!(matches!(berth.platform.endpoint_upstream(&id, "berth_ep_wrong").await, Err(Error::Unauthenticated)));
    let other = ready_endpoint(&berth, "other").await;
    assert!(
        matches!(berth.platform.endpoint_upstream(&other, &key).await, Err(Error::Unauthenticated)),
        "a key opens its own endpoint only"
    );
    assert!(matches!(berth.platform.endpoint_upstream("no-such-id", &key).await, Err(Error::Unauthenticated)));

    let new = berth.platform.replace_endpoint_key(&berth.caller, &id).await.expect("replace");
    assert_ne!(new, key);
    assert!(matches!(berth.platform.endpoint_upstream(&id, &key).await, Err(Error::Unauthenticated)), "old key dead");
    berth.platform.endpoint_upstream(&id, &new).await.expect("new key works");
    assert_eq!(audited(&berth, "endpoint.key_reveal").await, 1);
    assert_eq!(audited(&berth, "endpoint.key_replace").await, 1);

    let notebook = berth.launch("notebook", "h100-1g.10gb", "nb").await.expect("launch");
    assert_eq!(
        refusal(berth.platform.reveal_endpoint_key(&berth.caller, &notebook.id).await),
        Refusal::NoApiKey("Jupyter notebook")
    );
}

/// Waits until the endpoint runs the replicas its owner asked for.
async fn wait_applied(berth: &TestBerth, id: &str, replicas: u32) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let state = endpoint_state(berth, &berth.caller, id).await;
        if state.replicas_applied == replicas && state.replicas == replicas {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "replicas stuck at {state:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn held_by(berth: &TestBerth, id: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM reservations WHERE environment_id = ? AND released_at IS NULL")
        .bind(id)
        .fetch_one(berth.platform.db())
        .await
        .unwrap()
}

#[sqlx::test(migrations = "../migrations")]
async fn replicas_book_capacity_within_quota_and_give_it_back(pool: SqlitePool) {
    let berth = TestBerth::new(pool.clone()).await;
    let id = ready_endpoint(&berth, "serve").await;
    let key = berth.platform.reveal_endpoint_key(&berth.caller, &id).await.expect("key");
    assert_eq!(held_by(&berth, &id).await, 1);

    // A personal quota of one L40S: a second replica does not fit, and nothing is written.
    let admin = berth.admin().await;
    let one = Quota { max_gpus: Some(1.0), ..Quota::default() };
    let dana = QuotaSubject::User(berth.caller.user_id());
    berth.platform.set_quota(&admin, dana, &one).await.expect("quota");
    let refused = refusal(berth.platform.set_replicas(&berth.caller, &id, "2").await);
    assert!(matches!(refused, Refusal::QuotaExceeded(_)), "{refused:?}");
    assert_eq!(held_by(&berth, &id).await, 1);
    assert_eq!(endpoint_state(&berth, &berth.caller, &id).await.replicas, 1);

    berth.platform.set_quota(&admin, dana, &Quota::default()).await.expect("no quota");
    assert!(matches!(
        refusal(berth.platform.set_replicas(&berth.caller, &id, "9").await),
        Refusal::InvalidReplicas { .. }
    ));
    // The small fleet has two whole L40S GPUs: a third replica finds no capacity.
    let none = refusal(berth.platform.set_replicas(&berth.caller, &id, "3").await);
    assert!(matches!(none, Refusal::NoCapacity { .. }), "{none:?}");
    assert_eq!(held_by(&berth, &id).await, 1, "all or nothing");

    berth.platform.set_replicas(&berth.caller, &id, "2").await.expect("scale up");
    assert_eq!(held_by(&berth, &id).await, 2, "the new replica books its GPU at once");
    wait_applied(&berth, &id, 2).await;
    assert_eq!(berth.backend.world().replicas.get(&id), Some(&2));
    let upstream = berth.platform.endpoint_upstream(&id, &key).await.expect("upstream");
    let (_, credential) = upstream.headers[0].clone();
    let (status, body) = get(&format!("{}/v1/models", upstream.base_url), Some(&credential)).await;
    assert_eq!(status, 200);
    assert!(body.contains("\"replicas\":2"), "the endpoint serves two replicas: {body}");

    berth.platform.set_replicas(&berth.caller, &id, "1").await.expect("scale down");
    wait_applied(&berth, &id, 1).await;
    assert_eq!(held_by(&berth, &id).await, 1, "the surplus replica's GPU is released once it stopped");
    assert_eq!(common::overlapping_reservations(&pool).await, 0);
    // Up and straight down again, before the way up was applied: the count matches what
    // runs, and the replica booked on the way up still gives its GPU back.
    berth.platform.set_replicas(&berth.caller, &id, "2").await.expect("scale up");
    berth.platform.set_replicas(&berth.caller, &id, "1").await.expect("and down");
    for _ in 0..100 {
        if held_by(&berth, &id).await == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(held_by(&berth, &id).await, 1, "nothing is left booked by the replica asked away");
    let (_, body) = get(&format!("{}/v1/models", upstream.base_url), Some(&credential)).await;
    assert!(body.contains("\"replicas\":1"), "{body}");
    // The released GPU can be booked again right away.
    let again = berth.launch("inference", "l40s-1", "second").await.expect("the freed GPU books again");
    berth.wait_for(&again.id, EnvState::Ready).await;

    let notebook = berth.launch("notebook", "h100-1g.10gb", "nb").await.expect("launch");
    assert_eq!(
        refusal(berth.platform.set_replicas(&berth.caller, &notebook.id, "2").await),
        Refusal::NoReplicas("Jupyter notebook")
    );
    berth.platform.stop(&berth.caller, &id).await.expect("stop");
    berth.wait_for(&id, EnvState::Released).await;
    assert_eq!(held_by(&berth, &id).await, 0);
    assert_eq!(berth.backend.world().objects_of(&id), 0);
}

async fn train(berth: &TestBerth, name: &str, command: &str) -> String {
    let request = LaunchRequest {
        offering: "training".into(),
        size: "h100-1".into(),
        name: name.into(),
        hours: "2".into(),
        image: "ghcr.io/acme/train:1".into(),
        command: command.into(),
        ..LaunchRequest::default()
    };
    berth.platform.launch(&berth.caller, &request).await.expect("launch").id
}

/// A job that ends on its own releases its capacity; its log and status are kept.
async fn finished_logs(berth: &TestBerth, id: &str, end: EnvState) -> berth_platform::provisioning::backend::JobLogs {
    let env = berth.wait_for(id, end).await;
    let held: i64 =
        sqlx::query_scalar("SELECT count(*) FROM reservations WHERE environment_id = ? AND released_at IS NULL")
            .bind(id)
            .fetch_one(berth.platform.db())
            .await
            .expect("held");
    assert_eq!(held, 0, "{env:?}");
    berth.platform.job_logs(&berth.caller, id, LOG_TAIL).await.expect("kept logs")
}

#[sqlx::test(migrations = "../migrations")]
async fn a_training_job_shows_its_log_and_exit_status(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let ok = train(&berth, "good", "python train.py --epochs 5").await;
    let logs = finished_logs(&berth, &ok, EnvState::Released).await;
    assert_eq!(logs.status, JobStatus::Succeeded);
    assert_eq!(logs.lines.first().map(String::as_str), Some("$ python train.py --epochs 5"));
    assert!(logs.lines.iter().any(|l| l.starts_with("epoch 5/5")), "{:?}", logs.lines);
    assert_eq!(logs.lines.last().map(String::as_str), Some("training finished"));

    let bad = train(&berth, "bad", "python train.py; exit 3").await;
    let logs = finished_logs(&berth, &bad, EnvState::Failed).await;
    assert_eq!(logs.status, JobStatus::Failed { exit_code: Some(3), reason: "exited with code 3".into() });
    let failed = berth.platform.environment_of(&berth.caller, &bad).await.expect("bad");
    assert_eq!(failed.failure_reason.as_deref(), Some("the training job failed with exit code 3: exited with code 3"));
    assert_eq!(logs.lines.last().map(String::as_str), Some("process exited with code 3"));

    // A long log: its end as far as asked, up to all Berth keeps of it.
    let long: Vec<String> = (1..=1500).map(|n| format!("step {n}")).collect();
    sqlx::query("UPDATE job_results SET lines = ? WHERE environment_id = ?")
        .bind(serde_json::to_string(&long).expect("json"))
        .bind(&ok)
        .execute(berth.platform.db())
        .await
        .expect("a long kept log");
    for (tail, first) in [(200, "step 1301"), (1000, "step 501"), (50_000, "step 1")] {
        let lines = berth.platform.job_logs(&berth.caller, &ok, tail).await.expect("logs").lines;
        assert_eq!((lines.len(), lines[0].as_str()), (tail.min(1500), first));
    }
    assert!(berth.platform.job_logs(&berth.caller, &ok, 0).await.expect("status only").lines.is_empty());

    // Whoever may see the job may read its log; others get nothing.
    let viewer = berth.user_with("vi@example.com", Role::Viewer).await;
    berth.platform.job_logs(&viewer, &ok, LOG_TAIL).await.expect("a viewer of the tenant reads it");
    let colleague = berth.user_with("cy@example.com", Role::Member).await;
    assert!(matches!(berth.platform.job_logs(&colleague, &ok, LOG_TAIL).await, Err(Error::NotFound)));
    let notebook = berth.launch("notebook", "h100-1g.10gb", "nb").await.expect("launch");
    assert_eq!(
        refusal(berth.platform.job_logs(&berth.caller, &notebook.id, LOG_TAIL).await),
        Refusal::NoJobLogs("Jupyter notebook")
    );
    assert_eq!(berth.backend.world().objects_of(&ok), 0, "the job's record goes with it");
    let ended: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE action = 'environment.job_end'")
        .fetch_one(berth.platform.db())
        .await
        .expect("audit");
    assert_eq!(ended, 2);
}

/// The audit log names what an id stands for: an environment's actions show its name
/// beside its id, on the page and in the CSV.
#[sqlx::test(migrations = "../migrations")]
async fn audit_rows_name_the_environment_they_are_about(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let admin = berth.admin().await;
    let request = LaunchRequest {
        offering: "notebook".into(),
        size: "h100-1g.10gb".into(),
        name: "named-in-audit".into(),
        hours: "1".into(),
        ..LaunchRequest::default()
    };
    let env = berth.platform.launch(&berth.caller, &request).await.expect("launch");
    let filter = berth_platform::audit::AuditFilter { action: "environment.launch".into(), ..Default::default() };
    let rows = berth.platform.audit_log(&admin, &filter, 10).await.expect("audit");
    let row = rows.iter().find(|r| r.target.as_deref() == Some(env.id.as_str())).expect("the launch row");
    assert_eq!(row.target_name.as_deref(), Some("named-in-audit"));
    let csv = berth_platform::audit::to_csv(&rows);
    assert!(csv.contains(&format!("{},named-in-audit,success", env.id)), "{csv}");
}

/// A job's whole kept log (more than the page's last 200 lines) is there to download, for
/// whoever may see the job; the page shows its end.
#[sqlx::test(migrations = "../migrations")]
async fn a_long_job_log_is_kept_whole_and_the_page_shows_its_end(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let id = train(&berth, "long", "python train.py --epochs 600").await;
    let page = finished_logs(&berth, &id, EnvState::Released).await;
    assert_eq!(page.lines.len(), 200, "the page shows the end");
    assert_eq!(page.lines.last().map(String::as_str), Some("training finished"));
    let text = berth.platform.job_log_text(&berth.caller, &id).await.expect("the whole log");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.first(), Some(&"$ python train.py --epochs 600"), "from its first line");
    assert!(lines.iter().any(|l| l.starts_with("epoch 1/600:")), "the first epoch, which the page no longer shows");
    assert!(lines.len() > 600, "{}", lines.len());
    let colleague = berth.user_with("gus@example.com", Role::Member).await;
    assert!(matches!(berth.platform.job_log_text(&colleague, &id).await, Err(Error::NotFound)));
}
