//! Notifications end to end: written with their events, shown in the inbox, sent by the
//! outbox's worker through a real SMTP server (Debian's aiosmtpd, `make smtp-tools`) and a
//! real webhook receiver on loopback that checks each signature, none lost across a crash
//! between commit and delivery and none sent twice.
#![allow(clippy::expect_used, clippy::unwrap_used)] // helpers of tests stop the test with their message

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use berth_domain::lifecycle::EnvState;
use berth_domain::notification::{self, Kind};
use berth_domain::outbound::Reach;
use berth_domain::policy::Role;
use berth_platform::notifications::Delivery;
use berth_platform::notifications::email::Mailer;
use berth_platform::notifications::outbox::{Notifier, NotifierConfig};
use berth_platform::{Error, Platform, now_ms};
use common::TestBerth;
use sqlx::SqlitePool;

const PUBLIC_URL: &str = "https://berth.example";
const MINUTE: i64 = 60_000;

fn notifier(platform: &Platform) -> Notifier {
    let config = NotifierConfig { tick: Duration::from_millis(20), lease: Duration::from_secs(60), batch: 2 };
    Notifier::new(platform.clone(), config).expect("notifier")
}

/// A TestBerth whose platform knows its public URL and may call webhooks on loopback;
/// its reconciler is started by the test.
async fn berth_with(pool: SqlitePool, mailer: Option<Mailer>) -> TestBerth {
    let mut berth = TestBerth::new(pool).await;
    berth.kill_reconciler().await;
    let delivery = Delivery { mailer, webhook_reach: Reach::Private, ..Delivery::default() };
    berth.platform = berth.platform.clone().with_public_url(PUBLIC_URL).with_notifications(delivery);
    berth
}

/// What the webhook receiver saw: each delivery id with how often it came, and whether
/// every signature verified.
#[derive(Default)]
struct Received {
    by_delivery: HashMap<String, u32>,
    bodies: Vec<serde_json::Value>,
    bad_signatures: u32,
    /// Answers to give before answering 200 (e.g. [500] fails the first call).
    fail_first: Vec<u16>,
}

type Receiver = Arc<Mutex<Received>>;

async fn receive(
    State((secret, seen)): State<(Arc<Mutex<String>>, Receiver)>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let body = String::from_utf8(body.to_vec()).unwrap();
    let secret = secret.lock().unwrap().clone();
    let signature = headers.get(notification::SIGNATURE_HEADER).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let mut seen = seen.lock().unwrap();
    if notification::verify(&secret, signature, &body, now_ms() / 1000, 300).is_err() {
        seen.bad_signatures += 1;
        return StatusCode::UNAUTHORIZED;
    }
    if !seen.fail_first.is_empty() {
        let status = seen.fail_first.remove(0);
        return StatusCode::from_u16(status).unwrap();
    }
    let id = headers.get(notification::DELIVERY_HEADER).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    *seen.by_delivery.entry(id).or_default() += 1;
    seen.bodies.push(serde_json::from_str(&body).unwrap());
    StatusCode::NO_CONTENT
}

/// A webhook receiver on loopback; the secret is set once the webhook exists.
async fn receiver() -> (String, Arc<Mutex<String>>, Receiver) {
    let secret = Arc::new(Mutex::new(String::new()));
    let seen: Receiver = Arc::default();
    let app =
        axum::Router::new().route("/hook", axum::routing::post(receive)).with_state((secret.clone(), seen.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{address}/hook"), secret, seen)
}

/// Debian's aiosmtpd on a free loopback port, storing what it receives in a maildir.
struct SmtpServer {
    child: std::process::Child,
    port: u16,
    maildir: PathBuf,
}

impl SmtpServer {
    async fn start() -> SmtpServer {
        let port = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            probe.local_addr().unwrap().port()
        };
        let maildir = std::env::temp_dir().join(format!("berth-mail-{}", uuid::Uuid::new_v4()));
        let child = std::process::Command::new("/usr/bin/aiosmtpd")
            .args(["-n", "-l", &format!("127.0.0.1:{port}"), "-c", "aiosmtpd.handlers.Mailbox"])
            .arg(&maildir)
            .spawn()
            .expect("aiosmtpd (make smtp-tools installs Debian's python3-aiosmtpd)");
        // Owned at once, so a failed start below still kills it (Drop).
        let server = SmtpServer { child, port, maildir };
        let address: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(address).await.is_ok() {
                return server;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("aiosmtpd did not start on {address}");
    }

    fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }

    /// Every mail received so far, as text (quoted-printable bodies decoded).
    fn mails(&self) -> Vec<String> {
        let new = self.maildir.join("new");
        let mut mails: Vec<String> = std::fs::read_dir(&new)
            .map(|entries| entries.map(|e| unquote(&std::fs::read_to_string(e.unwrap().path()).unwrap())).collect())
            .unwrap_or_default();
        mails.sort();
        mails
    }
}

/// Decodes quoted-printable text (RFC 2045): soft line breaks and `=XX` escapes.
fn unquote(mail: &str) -> String {
    let joined = mail.replace("=\r\n", "").replace("=\n", "");
    let bytes = joined.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match (bytes[i], hex) {
            (b'=', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Drop for SmtpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(Path::new(&self.maildir));
    }
}

async fn count(platform: &Platform, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(platform.db()).await.unwrap()
}

#[sqlx::test(migrations = "../migrations")]
async fn ready_and_failed_reach_the_owners_inbox_and_mark_read_clears_it(pool: SqlitePool) {
    let berth = TestBerth::new(pool).await;
    let env = berth.launch("notebook", "h100-1g.10gb", "my-notebook").await.expect("launch");
    berth.wait_for(&env.id, EnvState::Ready).await;
    let inbox = berth.platform.inbox(&berth.caller).await.expect("inbox");
    assert_eq!(inbox.unread, 1);
    assert_eq!(inbox.items[0].title, "my-notebook is ready");
    assert_eq!(inbox.items[0].link, format!("/environments/{}", env.id));
    assert_eq!(inbox.items[0].kind, "environment.ready");

    // Someone else sees nothing of it and cannot mark it read.
    let other = berth.user_with("eve@example.com", Role::Member).await;
    assert_eq!(berth.platform.inbox(&other).await.expect("inbox").items.len(), 0);
    assert_eq!(berth.platform.mark_notifications_read(&other, Some(&[inbox.items[0].id])).await.expect("mark"), 0);
    assert_eq!(berth.platform.unread_notifications(berth.caller.user_id()).await.unwrap(), 1);

    assert_eq!(berth.platform.mark_notifications_read(&berth.caller, None).await.expect("mark"), 1);
    let inbox = berth.platform.inbox(&berth.caller).await.expect("inbox");
    assert_eq!((inbox.unread, inbox.items[0].read), (0, true));
    // Without SMTP no mail is queued, and no tenant webhook exists: the outbox stays empty.
    assert_eq!(count(&berth.platform, "SELECT count(*) FROM notification_outbox").await, 0);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_failure_tells_its_reason_and_channel_choices_are_kept(pool: SqlitePool) {
    let berth = TestBerth::with_faults(pool, vec!["start_workload=fail".parse().unwrap()]).await;
    // Dana turns in-app notifications of readiness off; failures stay on.
    let all: Vec<String> = Kind::ALL.iter().map(|k| k.as_str().to_owned()).collect();
    let in_app: Vec<String> = all.iter().filter(|k| *k != "environment.ready").cloned().collect();
    berth.platform.set_notification_preferences(&berth.caller, &in_app, &[]).await.expect("preferences");
    let choices = berth.platform.notification_preferences(&berth.caller).await.unwrap();
    let ready = choices.iter().find(|p| p.kind == Kind::EnvironmentReady).unwrap();
    assert!(!ready.in_app && !ready.email);
    let unknown = berth.platform.set_notification_preferences(&berth.caller, &["nope".into()], &[]).await;
    assert!(matches!(unknown, Err(Error::Refused(_))), "{unknown:?}");

    let env = berth.launch("training", "h100-1", "trainer").await.expect("launch");
    berth.wait_for(&env.id, EnvState::Failed).await;
    let inbox = berth.platform.inbox(&berth.caller).await.expect("inbox");
    assert_eq!(inbox.items.len(), 1);
    assert_eq!(inbox.items[0].title, "trainer failed");
    assert!(inbox.items[0].body.contains("failed: "), "{}", inbox.items[0].body);
}

#[sqlx::test(migrations = "../migrations")]
async fn webhooks_are_signed_retried_logged_and_survive_a_crash_between_commit_and_delivery(pool: SqlitePool) {
    let mut berth = berth_with(pool, None).await;
    let (url, secret, seen) = receiver().await;
    let admin = berth.user_with("tess@example.com", Role::TenantAdmin).await;
    let tenant = admin.tenant_id().unwrap();
    // Members cannot add webhooks; private addresses need the operator's setting.
    let member = berth.caller.clone();
    let refused = berth.platform.add_webhook(&member, tenant, &url, "json", &["environment.ready".into()]).await;
    assert!(matches!(refused, Err(Error::Forbidden | Error::NotFound)), "{refused:?}");
    let public_only = berth.platform.clone().with_notifications(Delivery::default());
    let refused = public_only.add_webhook(&admin, tenant, &url, "json", &["environment.ready".into()]).await;
    assert!(
        matches!(&refused, Err(Error::Refused(r)) if r.to_string().contains("not a public address")),
        "{refused:?}"
    );
    let refused = public_only
        .add_webhook(&admin, tenant, "http://hooks.example.com/x", "json", &["environment.ready".into()])
        .await;
    assert!(matches!(&refused, Err(Error::Refused(r)) if r.to_string().contains("https://")), "{refused:?}");
    let refused = berth.platform.add_webhook(&admin, tenant, &url, "xml", &["environment.ready".into()]).await;
    assert!(matches!(&refused, Err(Error::Refused(r)) if r.to_string().contains("slack or json")), "{refused:?}");
    let refused = berth.platform.add_webhook(&admin, tenant, &url, "json", &[]).await;
    assert!(matches!(&refused, Err(Error::Refused(_))), "{refused:?}");
    let refused =
        public_only.add_webhook(&admin, tenant, "https://127.0.0.1/hook", "json", &["environment.ready".into()]).await;
    assert!(
        matches!(&refused, Err(Error::Refused(r)) if r.to_string().contains("not a public address")),
        "{refused:?}"
    );

    let hook = berth
        .platform
        .add_webhook(&admin, tenant, &url, "json", &["environment.ready".into(), "environment.failed".into()])
        .await
        .expect("webhook");
    assert!(hook.secret.starts_with("whsec_"));
    *secret.lock().unwrap() = hook.secret.clone();

    // Three notebooks become ready while no worker runs: their calls are committed.
    berth.start_reconciler();
    let mut ids = Vec::new();
    for name in ["nb-a", "nb-b", "nb-c"] {
        ids.push(berth.launch("notebook", "h100-1g.10gb", name).await.expect("launch").id);
    }
    for id in &ids {
        berth.wait_for(id, EnvState::Ready).await;
    }
    assert_eq!(count(&berth.platform, "SELECT count(*) FROM notification_outbox WHERE channel = 'webhook'").await, 3);

    // A worker claims a batch and dies before sending (the crash): its lease holds the rows.
    let now = now_ms();
    let crashed = notifier(&berth.platform).claim(now).await.expect("claim");
    assert_eq!(crashed.len(), 2);
    drop(crashed);
    // The first answer fails: that row is retried after the backoff.
    seen.lock().unwrap().fail_first = vec![500];
    let worker = notifier(&berth.platform);
    worker.tick(now).await.expect("tick");
    assert_eq!(seen.lock().unwrap().by_delivery.len(), 0, "the leased rows wait, the free one failed once");
    // Two workers after the lease expired and the backoff passed: each call arrives once.
    let later = now + 2 * MINUTE;
    let (a, b) = (notifier(&berth.platform), notifier(&berth.platform));
    let (ra, rb) = tokio::join!(a.tick(later), b.tick(later));
    ra.expect("tick a");
    rb.expect("tick b");
    worker.tick(later + 10 * MINUTE).await.expect("nothing left");
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.bad_signatures, 0);
        assert_eq!(seen.by_delivery.len(), 3, "{:?}", seen.by_delivery);
        assert!(seen.by_delivery.values().all(|n| *n == 1), "{:?}", seen.by_delivery);
        let mut titles: Vec<&str> = seen.bodies.iter().map(|b| b["title"].as_str().unwrap()).collect();
        titles.sort();
        assert_eq!(titles, ["nb-a is ready", "nb-b is ready", "nb-c is ready"]);
        assert!(
            seen.bodies.iter().all(|b| b["link"].as_str().unwrap().starts_with("https://berth.example/environments/"))
        );
    }
    assert_eq!(count(&berth.platform, "SELECT count(*) FROM notification_outbox WHERE delivered_at IS NULL").await, 0);

    // The log shows the failed try and the successes, to the tenant's admins only.
    let log = berth.platform.webhook_deliveries(&admin, tenant).await.expect("log");
    assert_eq!(log.len(), 4);
    assert_eq!(log.iter().filter(|d| d.status_code == Some(500)).count(), 1);
    assert_eq!(log.iter().filter(|d| d.status_code == Some(204)).count(), 3);
    assert!(log.iter().any(|d| d.error.as_deref() == Some("the receiver answered 500")));
    assert!(berth.platform.webhook_deliveries(&member, tenant).await.is_err());

    // A wrong secret on the receiver's side is a failure in the log, not a delivery.
    *secret.lock().unwrap() = "whsec_other".into();
    let env = berth.launch("notebook", "h100-1g.10gb", "nb-d").await.expect("launch");
    berth.wait_for(&env.id, EnvState::Ready).await;
    notifier(&berth.platform).tick(now_ms()).await.expect("tick");
    let log = berth.platform.webhook_deliveries(&admin, tenant).await.expect("log");
    assert_eq!(log[0].status_code, Some(401));
    assert_eq!(seen.lock().unwrap().bad_signatures, 1);

    // Removed: nothing more is queued, and what waits is given up.
    berth.platform.remove_webhook(&admin, tenant, hook.webhook.id).await.expect("remove");
    assert_eq!(
        count(
            &berth.platform,
            "SELECT count(*) FROM notification_outbox WHERE delivered_at IS NULL AND gave_up_at IS NULL"
        )
        .await,
        0
    );
    assert!(berth.platform.tenant_webhooks(&admin, tenant).await.unwrap().is_empty());
}

#[sqlx::test(migrations = "../migrations")]
async fn the_end_of_window_mail_arrives_once_over_real_smtp_with_the_change_end_link(pool: SqlitePool) {
    let smtp = SmtpServer::start().await;
    let mailer = Mailer::new(&smtp.url(), "Berth <berth@berth.example>", PUBLIC_URL).expect("mailer");
    let mut berth = berth_with(pool, Some(mailer)).await;
    berth.start_reconciler();
    let env = berth.launch("notebook", "h100-1g.10gb", "my-notebook").await.expect("launch");
    let ready = berth.wait_for(&env.id, EnvState::Ready).await;
    let worker = notifier(&berth.platform);
    worker.tick(now_ms()).await.expect("tick");

    // 25 minutes before the end: the 30-minute warning, once, however often the worker looks.
    let at = ready.ends_at - 25 * MINUTE;
    for _ in 0..3 {
        worker.tick(at).await.expect("tick");
    }
    // 5 minutes before: the 10-minute one.
    worker.tick(ready.ends_at - 5 * MINUTE).await.expect("tick");
    worker.tick(ready.ends_at - 4 * MINUTE).await.expect("tick");

    let mails = smtp.mails();
    assert_eq!(mails.len(), 3, "ready, 30 and 10 minutes: {mails:#?}");
    let ending: Vec<&String> = mails.iter().filter(|m| m.contains("ends in")).collect();
    assert_eq!(ending.len(), 2);
    let link = format!("{PUBLIC_URL}/environments/{}#change-end", env.id);
    for mail in &ending {
        assert!(mail.contains(&link), "the mail links to the change-end form: {mail}");
        assert!(mail.contains("To: dana@example.com"), "{mail}");
        assert!(mail.contains("From: Berth <berth@berth.example>"), "{mail}");
    }
    assert!(mails.iter().any(|m| m.contains("Subject: [Berth] my-notebook ends in 30 minutes")));
    assert!(mails.iter().any(|m| m.contains("Subject: [Berth] my-notebook ends in 10 minutes")));
    assert_eq!(count(&berth.platform, "SELECT count(*) FROM window_end_warnings").await, 2);
    let inbox = berth.platform.inbox(&berth.caller).await.unwrap();
    assert_eq!(inbox.unread, 3);
    let totals = berth.platform.notification_totals().await.unwrap();
    let email = totals.iter().find(|t| t.channel == notification::Channel::Email).unwrap();
    assert_eq!((email.sent, email.failed), (3, 0));
}

#[sqlx::test(migrations = "../migrations")]
async fn mail_to_a_relay_that_is_down_is_retried_with_backoff_then_delivered(pool: SqlitePool) {
    // Nothing listens on this port yet.
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let mailer = Mailer::new(&format!("smtp://127.0.0.1:{port}"), "berth@berth.example", PUBLIC_URL).expect("mailer");
    let mut berth = berth_with(pool, Some(mailer)).await;
    berth.start_reconciler();
    let env = berth.launch("notebook", "h100-1g.10gb", "nb").await.expect("launch");
    berth.wait_for(&env.id, EnvState::Ready).await;
    let now = now_ms();
    let worker = notifier(&berth.platform);
    worker.tick(now).await.expect("tick");
    let (attempts, next, error): (i64, i64, Option<String>) =
        sqlx::query_as("SELECT attempts, next_attempt_at, last_error FROM notification_outbox")
            .fetch_one(berth.platform.db())
            .await
            .unwrap();
    assert_eq!(attempts, 1);
    assert!(next >= now + 30_000, "retried after the backoff");
    assert!(error.unwrap().starts_with("SMTP"));
    // Not before the backoff.
    worker.tick(now + 1_000).await.expect("tick");
    let attempts: i64 =
        sqlx::query_scalar("SELECT attempts FROM notification_outbox").fetch_one(berth.platform.db()).await.unwrap();
    assert_eq!(attempts, 1);
}

/// The titles in `caller`'s inbox, newest first.
async fn titles(berth: &TestBerth, caller: &berth_platform::Caller) -> Vec<String> {
    berth.platform.inbox(caller).await.expect("inbox").items.into_iter().map(|n| n.title).collect()
}

#[sqlx::test(migrations = "../migrations")]
async fn invitations_maintenance_node_health_and_budget_marks_tell_the_right_people(pool: SqlitePool) {
    let smtp = SmtpServer::start().await;
    let mailer = Mailer::new(&smtp.url(), "berth@berth.example", PUBLIC_URL).expect("mailer");
    let mut berth = berth_with(pool, Some(mailer)).await;
    berth.start_reconciler();
    let admin = berth.admin().await;
    let boss = berth.user_with("boss@example.com", Role::TenantAdmin).await;
    let tenant = berth.caller.tenant_id().unwrap();

    // An invitation: the invitee is told, by mail too (they have no session yet).
    berth.platform.invite_member(&boss, tenant, "newcomer@example.com", "member").await.expect("invite");
    notifier(&berth.platform).tick(now_ms()).await.expect("tick");
    let invited = smtp.mails().into_iter().find(|m| m.contains("To: newcomer@example.com")).expect("invitation mail");
    assert!(invited.contains("Subject: [Berth] You were added to Acme"), "{invited}");
    assert!(invited.contains(&format!("{PUBLIC_URL}/tenants/{tenant}")), "{invited}");

    // Maintenance on the node of Dana's booking: Dana hears of it, naming the booking.
    let env = berth.launch("training", "h100-1", "trainer").await.expect("launch");
    berth.wait_for(&env.id, EnvState::Ready).await;
    let node: String = sqlx::query_scalar(
        "SELECT n.name FROM reservations r JOIN gpus g ON g.id = r.gpu_id JOIN nodes n ON n.id = g.node_id
         WHERE r.environment_id = ?",
    )
    .bind(&env.id)
    .fetch_one(berth.platform.db())
    .await
    .unwrap();
    let end = chrono::DateTime::from_timestamp_millis(now_ms() + 3 * 3_600_000).unwrap().to_rfc3339();
    berth.platform.schedule_maintenance(&admin, &node, None, "", &end, "firmware").await.expect("maintenance");
    let dana = titles(&berth, &berth.caller).await;
    assert!(dana.contains(&format!("Maintenance on {node} affects your bookings")), "{dana:?}");
    let other = berth.user_with("carl@example.com", Role::Member).await;
    assert!(titles(&berth, &other).await.is_empty(), "nobody else hears of Dana's bookings");

    // A node's health change: platform admins hear of it, tenant people do not.
    berth.platform.change_node_state(&admin, &node, "drain", "firmware update").await.expect("drain");
    assert!(titles(&berth, &admin).await.contains(&format!("Node {node} is draining")));
    assert!(!titles(&berth, &boss).await.iter().any(|t| t.starts_with("Node ")));

    // A budget's 50% mark: the tenant's admins hear of it.
    let change = berth_platform::capacity::budgets::BudgetChange {
        level: "tenant".into(),
        who: "acme".into(),
        amount: "10".into(),
        warn_only: true,
    };
    berth.platform.set_budget(&admin, &change).await.expect("budget");
    // Two hours of an H100 at $3.20: $6.40 of $10, past the 50% mark.
    berth.launch("training", "h100-1", "big").await.expect("launch past the mark");
    let boss_titles = titles(&berth, &boss).await;
    assert!(boss_titles.iter().any(|t| t.contains("reached") && t.contains("% of its budget")), "{boss_titles:?}");
    assert!(!titles(&berth, &other).await.iter().any(|t| t.contains("budget")));
}
