//! The outbox's worker (`Notifier`, started by `berth serve` beside the reconciler): it
//! claims due rows of `notification_outbox` with a lease, sends each (SMTP or a webhook
//! call), then marks it delivered, or due again after `retry_after_ms`, or given up, in
//! one transaction. It also writes the 30- and 10-minute warnings before windows end.
//!
//! None is lost: the rows commit with their events, and a worker that dies after its claim
//! leaves a lease that expires, so the next worker sends. None is sent twice by Berth's
//! bookkeeping: a claim takes the writer turn, so two workers never hold the same row, and
//! a delivered row stays delivered (`notification_outbox_delivered_once`). What no outbox
//! can rule out is a crash after the receiver got the message and before the mark
//! commits; the resend then carries the same `Berth-Delivery` id (webhooks) or
//! Message-ID (mail), so receivers can fold it.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Duration;

use berth_domain::notification::{self, Kind, Notice, WebhookFormat, due_window_marks, retry_after_ms};
use sqlx::{Row, SqliteConnection};

use crate::audit::{self, Actor, Event, Outcome};
use crate::notifications::webhooks;
use crate::{Error, Platform, now_ms};

#[derive(Debug, Clone)]
pub struct NotifierConfig {
    /// How often to look for due rows and window ends.
    pub tick: Duration,
    /// How long a claim holds a row; a worker that dies holds it no longer than this.
    pub lease: Duration,
    /// Rows claimed at once.
    pub batch: i64,
}

impl Default for NotifierConfig {
    fn default() -> NotifierConfig {
        NotifierConfig { tick: Duration::from_secs(2), lease: Duration::from_secs(120), batch: 50 }
    }
}

/// A row claimed for delivery.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub id: i64,
    pub attempts: u32,
    pub created_at: i64,
    pub lease_until: i64,
    pub notice: Notice,
    pub to: Destination,
}

#[derive(Debug, Clone)]
pub enum Destination {
    Email {
        address: String,
    },
    Webhook {
        id: i64,
        url: String,
        format: WebhookFormat,
        secret: String,
    },
    /// The webhook was removed, or the row names what this build does not know.
    Gone(String),
}

/// The outbox's worker.
pub struct Notifier {
    platform: Platform,
    config: NotifierConfig,
    client: reqwest::Client,
}

/// Queues an email to `user_id` at `address` on the event's transaction.
pub(crate) async fn queue_email(
    conn: &mut SqliteConnection,
    user_id: i64,
    address: &str,
    notice: &Notice,
    now: i64,
) -> Result<(), Error> {
    sqlx::query(
        "INSERT INTO notification_outbox (channel, user_id, recipient, kind, title, body, link, created_at, next_attempt_at)
         VALUES ('email', ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(user_id)
    .bind(address)
    .bind(notice.kind.as_str())
    .bind(&notice.title)
    .bind(&notice.body)
    .bind(&notice.link)
    .bind(now)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(())
}

impl Notifier {
    pub fn new(platform: Platform, config: NotifierConfig) -> Result<Notifier, Error> {
        let client = webhooks::client(platform.delivery.webhook_reach)?;
        Ok(Notifier { platform, config, client })
    }

    /// Works until `stop` completes. Errors are logged and the next tick tries again.
    pub async fn run(self, stop: impl Future<Output = ()>) {
        tokio::pin!(stop);
        loop {
            if let Err(e) = self.tick(now_ms()).await {
                tracing::error!(error = %e, "notifications: a pass failed");
            }
            tokio::select! {
                () = &mut stop => return,
                () = tokio::time::sleep(self.config.tick) => {}
            }
        }
    }

    /// One pass: the window warnings due at `now`, then every outbox row due.
    pub async fn tick(&self, now: i64) -> Result<(), Error> {
        self.warn_window_ends(now).await?;
        loop {
            let claimed = self.claim(now).await?;
            if claimed.is_empty() {
                return Ok(());
            }
            for row in claimed {
                self.deliver(row).await?;
            }
        }
    }

    /// Claims up to a batch of due rows under the writer turn: each gets a lease and one
    /// more attempt counted.
    pub async fn claim(&self, now: i64) -> Result<Vec<Claimed>, Error> {
        let lease_until = now + i64::try_from(self.config.lease.as_millis()).unwrap_or(i64::MAX / 2);
        let mut tx = self.platform.begin_write().await?;
        let rows = sqlx::query(
            "UPDATE notification_outbox SET lease_until = ?1, attempts = attempts + 1
             WHERE id IN (SELECT id FROM notification_outbox
                          WHERE delivered_at IS NULL AND gave_up_at IS NULL AND next_attempt_at <= ?2
                            AND (lease_until IS NULL OR lease_until <= ?2)
                          ORDER BY id LIMIT ?3)
             RETURNING id, channel, recipient, webhook_id, kind, title, body, link, created_at, attempts,
                (SELECT url FROM tenant_webhooks w WHERE w.id = webhook_id AND w.removed_at IS NULL) AS url,
                (SELECT format FROM tenant_webhooks w WHERE w.id = webhook_id) AS format,
                (SELECT secret FROM tenant_webhooks w WHERE w.id = webhook_id) AS secret",
        )
        .bind(lease_until)
        .bind(now)
        .bind(self.config.batch)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        let mut claimed = Vec::with_capacity(rows.len());
        for row in rows {
            let kind: String = row.try_get("kind")?;
            let channel: String = row.try_get("channel")?;
            let to = match channel.as_str() {
                "email" => {
                    Destination::Email { address: row.try_get::<Option<String>, _>("recipient")?.unwrap_or_default() }
                }
                _ => match (
                    row.try_get::<Option<i64>, _>("webhook_id")?,
                    row.try_get::<Option<String>, _>("url")?,
                    row.try_get::<Option<String>, _>("format")?.as_deref().and_then(WebhookFormat::parse),
                    row.try_get::<Option<String>, _>("secret")?,
                ) {
                    (Some(id), Some(url), Some(format), Some(secret)) => {
                        Destination::Webhook { id, url, format, secret }
                    }
                    _ => Destination::Gone("the webhook was removed".into()),
                },
            };
            let Some(kind) = Kind::parse(&kind) else {
                claimed.push(Claimed {
                    id: row.try_get("id")?,
                    attempts: 1,
                    created_at: row.try_get("created_at")?,
                    lease_until,
                    notice: Notice {
                        kind: Kind::EnvironmentReady,
                        title: String::new(),
                        body: String::new(),
                        link: String::new(),
                    },
                    to: Destination::Gone(format!("unknown kind {kind}")),
                });
                continue;
            };
            claimed.push(Claimed {
                id: row.try_get("id")?,
                attempts: u32::try_from(row.try_get::<i64, _>("attempts")?).unwrap_or(u32::MAX),
                created_at: row.try_get("created_at")?,
                lease_until,
                notice: Notice {
                    kind,
                    title: row.try_get("title")?,
                    body: row.try_get("body")?,
                    link: row.try_get("link")?,
                },
                to,
            });
        }
        Ok(claimed)
    }

    /// Sends one claimed row and records how it went.
    pub async fn deliver(&self, row: Claimed) -> Result<(), Error> {
        let platform = &self.platform;
        let public_url = platform.public_url();
        let counters = &platform.delivery.counters;
        let (ok, status, error) = match &row.to {
            Destination::Email { address } => match &platform.delivery.mailer {
                None => (false, None, Some("email is not configured (--smtp-url)".to_owned())),
                Some(mailer) => {
                    let (subject, body) = notification::email(&row.notice, public_url);
                    let key = format!("berth-notification-{}.{}", row.id, row.created_at);
                    match mailer.send(&key, address, &subject, &body).await {
                        Ok(()) => (true, None, None),
                        Err(e) => (false, None, Some(e)),
                    }
                }
            },
            Destination::Webhook { url, format, secret, .. } => {
                let result = webhooks::call(
                    &self.client,
                    platform.delivery.webhook_reach,
                    url,
                    *format,
                    secret,
                    row.id,
                    &row.notice,
                    row.created_at,
                    public_url,
                )
                .await;
                (result.succeeded(), result.status, result.error)
            }
            Destination::Gone(why) => (false, None, Some(why.clone())),
        };
        let (sent, failed) = match row.to {
            Destination::Email { .. } => (&counters.email_sent, &counters.email_failed),
            _ => (&counters.webhook_sent, &counters.webhook_failed),
        };
        if ok { sent } else { failed }.fetch_add(1, Ordering::Relaxed);
        let now = now_ms();
        let mut tx = platform.begin_write().await?;
        if let Destination::Webhook { id, .. } = &row.to {
            sqlx::query(
                "INSERT INTO webhook_deliveries (webhook_id, outbox_id, attempt, at, status_code, error)
                 VALUES (?, ?, ?, ?, ?, ?)",
            )
            .bind(id)
            .bind(row.id)
            .bind(i64::from(row.attempts))
            .bind(now)
            .bind(status.map(i64::from))
            .bind(&error)
            .execute(&mut *tx)
            .await?;
        }
        // Only while the lease is still ours: after it expired another worker may own
        // the row (and may have sent it already).
        let mine = "id = ? AND lease_until = ? AND delivered_at IS NULL AND gave_up_at IS NULL";
        if ok {
            sqlx::query(&format!(
                "UPDATE notification_outbox SET delivered_at = ?, lease_until = NULL, last_error = NULL WHERE {mine}"
            ))
            .bind(now)
            .bind(row.id)
            .bind(row.lease_until)
            .execute(&mut *tx)
            .await?;
        } else {
            let retry = match row.to {
                Destination::Gone(_) => None,
                _ => retry_after_ms(row.attempts),
            };
            // Due again after the backoff, or given up after the last try.
            let (next_attempt_at, gave_up_at) = match retry {
                Some(wait) => (now + wait, None),
                None => (now, Some(now)),
            };
            sqlx::query(&format!(
                "UPDATE notification_outbox SET next_attempt_at = ?, gave_up_at = ?, lease_until = NULL, last_error = ?
                 WHERE {mine}"
            ))
            .bind(next_attempt_at)
            .bind(gave_up_at)
            .bind(&error)
            .bind(row.id)
            .bind(row.lease_until)
            .execute(&mut *tx)
            .await?;
            tracing::warn!(outbox = row.id, attempt = row.attempts, error = error.as_deref().unwrap_or(""), retry_in_ms = ?retry,
                "notifications: a delivery failed");
        }
        tx.commit().await
    }

    /// Writes the window-end warnings due at `now` (`due_window_marks`), each with its
    /// marks in one transaction; answers how many were written.
    pub async fn warn_window_ends(&self, now: i64) -> Result<usize, Error> {
        let horizon = now + i64::from(notification::WINDOW_MARKS[0]) * 60_000;
        let ending: Vec<(String, String, i64, Option<i64>, i64)> = sqlx::query_as(
            "SELECT id, name, owner_id, tenant_id, ends_at FROM environments
             WHERE state = 'ready' AND desired = 'running' AND ends_at > ? AND ends_at <= ?",
        )
        .bind(now)
        .bind(horizon)
        .fetch_all(&self.platform.db)
        .await?;
        let mut written = 0;
        for (id, name, owner_id, tenant_id, ends_at) in ending {
            let mut tx = self.platform.begin_write().await?;
            let sent: Vec<i64> = sqlx::query_scalar(
                "SELECT minutes_before FROM window_end_warnings WHERE environment_id = ? AND ends_at = ?",
            )
            .bind(&id)
            .bind(ends_at)
            .fetch_all(&mut *tx)
            .await?;
            let sent: Vec<u32> = sent.into_iter().filter_map(|m| u32::try_from(m).ok()).collect();
            let Some((minutes, marks)) = due_window_marks(ends_at, now, &sent) else { continue };
            for mark in marks {
                sqlx::query(
                    "INSERT INTO window_end_warnings (environment_id, minutes_before, ends_at, sent_at) VALUES (?, ?, ?, ?)",
                )
                .bind(&id)
                .bind(i64::from(mark))
                .bind(ends_at)
                .bind(now)
                .execute(&mut *tx)
                .await?;
            }
            let notice = Notice::window_ending(&id, &name, minutes, ends_at);
            self.platform.notify(&mut tx, tenant_id, &[owner_id], &notice).await?;
            let detail = format!("{minutes} minutes before the end");
            let event = Event {
                action: "environment.window_warning",
                target: Some(&id),
                outcome: Outcome::Success,
                detail: Some(&detail),
            };
            audit::record(&mut tx, &Actor::background(tenant_id), event).await?;
            tx.commit().await?;
            written += 1;
        }
        Ok(written)
    }
}
