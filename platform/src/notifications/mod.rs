//! Notifications (root: every wing may use it, it names none): `Platform::notify` writes an
//! event's notifications in the transaction of the event itself (in-app rows, and outbox
//! rows for email and tenant webhooks), so a committed event is never left untold and a
//! rolled-back one tells nothing. Also each person's inbox and channel choices.
//!
//! Owns `notifications`, `notification_preferences` (`0028`). The outbox and its worker are
//! in `outbox`, SMTP in `email`, tenant webhooks in `webhooks`. Texts, kinds, the retry
//! schedule and signatures are `berth_domain::notification`.

pub mod email;
pub mod outbox;
pub mod webhooks;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use berth_domain::Refusal;
use berth_domain::notification::{Channel, Kind, Notice};
use berth_domain::outbound;
use berth_domain::policy::{Action, Target};
use serde::Serialize;
use sqlx::{Row, SqliteConnection};

use crate::audit::{self, Event, Outcome};
use crate::{Caller, Error, Platform, now_ms};

/// How notifications leave Berth: the SMTP relay (none: no email), and where tenants'
/// webhooks may point. Set once at start (`Platform::with_notifications`).
pub struct Delivery {
    pub mailer: Option<email::Mailer>,
    /// `Public` unless the operator allows private addresses (`--webhook-allow-private`).
    pub webhook_reach: outbound::Reach,
    pub counters: Counters,
}

impl Default for Delivery {
    fn default() -> Delivery {
        Delivery { mailer: None, webhook_reach: outbound::Reach::Public, counters: Counters::default() }
    }
}

/// Deliveries since start, per channel, for `/metrics`. In-app notifications are counted
/// in the database (writing one is delivering it).
#[derive(Default)]
pub struct Counters {
    pub email_sent: AtomicU64,
    pub email_failed: AtomicU64,
    pub webhook_sent: AtomicU64,
    pub webhook_failed: AtomicU64,
}

/// One channel's deliveries, for `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelTotals {
    pub channel: Channel,
    pub sent: u64,
    pub failed: u64,
}

/// One notification in a person's inbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InboxItem {
    pub id: i64,
    pub kind: String,
    pub title: String,
    pub body: String,
    pub link: String,
    pub created_at: i64,
    pub read: bool,
}

/// A person's latest notifications and how many are unread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Inbox {
    pub unread: i64,
    pub items: Vec<InboxItem>,
    /// Whether older ones come after the last item.
    pub more: bool,
}

/// What the bell in the navigation bar shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Bell {
    pub unread: i64,
    pub latest: Option<String>,
}

/// A person's channels for one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Preference {
    pub kind: Kind,
    pub in_app: bool,
    pub email: bool,
}

/// The inbox shows this many; older ones stay in the database.
pub const INBOX_LIMIT: i64 = 100;

impl Platform {
    /// The same platform delivering through `delivery` (SMTP, webhook reach).
    pub fn with_notifications(self, delivery: Delivery) -> Platform {
        Platform { delivery: Arc::new(delivery), ..self }
    }

    /// Whether email can be sent at all (an SMTP relay is configured).
    pub fn email_configured(&self) -> bool {
        self.delivery.mailer.is_some()
    }

    /// Writes `notice` for each of `people` (by their channel choices) and for the webhooks
    /// of `tenant_id` that take its kind, on `conn`: the caller's transaction, so the
    /// notifications commit with the event. Inactive people are skipped.
    pub(crate) async fn notify(
        &self,
        conn: &mut SqliteConnection,
        tenant_id: Option<i64>,
        people: &[i64],
        notice: &Notice,
    ) -> Result<(), Error> {
        let now = now_ms();
        let mut seen = Vec::with_capacity(people.len());
        for &user_id in people {
            if seen.contains(&user_id) {
                continue;
            }
            seen.push(user_id);
            let row = sqlx::query(
                "SELECT u.email, coalesce(p.in_app, 1) AS in_app, coalesce(p.email, 1) AS by_email
                 FROM users u LEFT JOIN notification_preferences p ON p.user_id = u.id AND p.kind = ?
                 WHERE u.id = ? AND u.status = 'active'",
            )
            .bind(notice.kind.as_str())
            .bind(user_id)
            .fetch_optional(&mut *conn)
            .await?;
            let Some(row) = row else { continue };
            if row.try_get::<bool, _>("in_app")? {
                sqlx::query(
                    "INSERT INTO notifications (user_id, kind, title, body, link, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                )
                .bind(user_id)
                .bind(notice.kind.as_str())
                .bind(&notice.title)
                .bind(&notice.body)
                .bind(&notice.link)
                .bind(now)
                .execute(&mut *conn)
                .await?;
            }
            // Without a relay, no mail is queued: it would go out late, if ever.
            if row.try_get::<bool, _>("by_email")? && self.email_configured() {
                let address: String = row.try_get("email")?;
                outbox::queue_email(conn, user_id, &address, notice, now).await?;
            }
        }
        if let Some(tenant_id) = tenant_id {
            webhooks::queue_calls(conn, tenant_id, notice, now).await?;
        }
        Ok(())
    }

    /// The caller's latest notifications, newest first, with the unread count.
    pub async fn inbox(&self, caller: &Caller) -> Result<Inbox, Error> {
        self.inbox_page(caller, None, INBOX_LIMIT).await
    }

    /// The caller's notifications before `before` (an id; `None` from the newest), at most
    /// `limit` (1 to [`INBOX_LIMIT`]), newest first.
    pub async fn inbox_page(&self, caller: &Caller, before: Option<i64>, limit: i64) -> Result<Inbox, Error> {
        self.authorize(caller, Action::NotificationRead, own(caller)).await?;
        let limit = limit.clamp(1, INBOX_LIMIT);
        let rows = sqlx::query(
            "SELECT id, kind, title, body, link, created_at, read_at IS NOT NULL AS read
             FROM notifications WHERE user_id = ? AND (? IS NULL OR id < ?) ORDER BY id DESC LIMIT ?",
        )
        .bind(caller.user_id())
        .bind(before)
        .bind(before)
        // One more than asked says whether there are more.
        .bind(limit + 1)
        .fetch_all(&self.db)
        .await?;
        let more = i64::try_from(rows.len()).is_ok_and(|n| n > limit);
        let items = rows
            .iter()
            .map(|r| {
                Ok(InboxItem {
                    id: r.try_get("id")?,
                    kind: r.try_get("kind")?,
                    title: r.try_get("title")?,
                    body: r.try_get("body")?,
                    link: r.try_get("link")?,
                    created_at: r.try_get("created_at")?,
                    read: r.try_get("read")?,
                })
            })
            .take(usize::try_from(limit).unwrap_or(usize::MAX))
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(Inbox { unread: self.unread_notifications(caller.user_id()).await?, items, more })
    }

    /// How many of `user_id`'s notifications are unread: the bell's count, for the person
    /// whose session is being read (no other caller asks for it).
    pub async fn unread_notifications(&self, user_id: i64) -> Result<i64, Error> {
        Ok(sqlx::query_scalar("SELECT count(*) FROM notifications WHERE user_id = ? AND read_at IS NULL")
            .bind(user_id)
            .fetch_one(&self.db)
            .await?)
    }

    /// The bell of `user_id`, whose session is being read: the unread count and the
    /// newest unread title.
    pub async fn bell(&self, user_id: i64) -> Result<Bell, Error> {
        // One read for both: the bell is on every page.
        let (latest, unread): (Option<String>, i64) = sqlx::query_as(
            "SELECT (SELECT title FROM notifications WHERE user_id = ?1 AND read_at IS NULL ORDER BY id DESC LIMIT 1),
                    (SELECT count(*) FROM notifications WHERE user_id = ?1 AND read_at IS NULL)",
        )
        .bind(user_id)
        .fetch_one(&self.db)
        .await?;
        Ok(Bell { unread, latest })
    }

    /// Marks the caller's notifications read: those of `ids`, or all of them. Answers how
    /// many changed. Another person's ids are ignored, like ids that do not exist.
    pub async fn mark_notifications_read(&self, caller: &Caller, ids: Option<&[i64]>) -> Result<u64, Error> {
        self.authorize(caller, Action::NotificationManage, own(caller)).await?;
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        let changed = match ids {
            None => sqlx::query("UPDATE notifications SET read_at = ? WHERE user_id = ? AND read_at IS NULL")
                .bind(now)
                .bind(caller.user_id())
                .execute(&mut *tx)
                .await?
                .rows_affected(),
            Some(ids) => {
                let mut changed = 0;
                for id in ids {
                    changed += sqlx::query(
                        "UPDATE notifications SET read_at = ? WHERE id = ? AND user_id = ? AND read_at IS NULL",
                    )
                    .bind(now)
                    .bind(id)
                    .bind(caller.user_id())
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                }
                changed
            }
        };
        if changed > 0 {
            let detail = format!("{changed} marked read");
            let event = Event {
                action: "notification.read",
                target: Some("notifications"),
                outcome: Outcome::Success,
                detail: Some(&detail),
            };
            audit::record(&mut tx, &caller.actor(), event).await?;
        }
        tx.commit().await?;
        Ok(changed)
    }

    /// The caller's channels for every kind (defaults where they chose nothing).
    pub async fn notification_preferences(&self, caller: &Caller) -> Result<Vec<Preference>, Error> {
        self.authorize(caller, Action::NotificationRead, own(caller)).await?;
        let rows = sqlx::query("SELECT kind, in_app, email FROM notification_preferences WHERE user_id = ?")
            .bind(caller.user_id())
            .fetch_all(&self.db)
            .await?;
        let mut preferences: Vec<Preference> =
            Kind::ALL.into_iter().map(|kind| Preference { kind, in_app: true, email: true }).collect();
        for row in rows {
            let kind: String = row.try_get("kind")?;
            if let Some(p) = preferences.iter_mut().find(|p| p.kind.as_str() == kind) {
                p.in_app = row.try_get("in_app")?;
                p.email = row.try_get("email")?;
            }
        }
        Ok(preferences)
    }

    /// Sets the caller's channels for every kind at once: `in_app` and `email` list the
    /// kinds (by name) that go to each; a kind in neither goes nowhere.
    pub async fn set_notification_preferences(
        &self,
        caller: &Caller,
        in_app: &[String],
        email: &[String],
    ) -> Result<(), Error> {
        self.authorize(caller, Action::NotificationManage, own(caller)).await?;
        let parse = |names: &[String]| -> Result<Vec<Kind>, Error> {
            names
                .iter()
                .map(|n| {
                    Kind::parse(n).ok_or_else(|| {
                        Refusal::InvalidNotificationChoice(format!("there is no notification kind {n:?}")).into()
                    })
                })
                .collect()
        };
        let (in_app, email) = (parse(in_app)?, parse(email)?);
        let mut tx = self.begin_write().await?;
        for kind in Kind::ALL {
            sqlx::query(
                "INSERT INTO notification_preferences (user_id, kind, in_app, email) VALUES (?, ?, ?, ?)
                 ON CONFLICT (user_id, kind) DO UPDATE SET in_app = excluded.in_app, email = excluded.email",
            )
            .bind(caller.user_id())
            .bind(kind.as_str())
            .bind(in_app.contains(&kind))
            .bind(email.contains(&kind))
            .execute(&mut *tx)
            .await?;
        }
        let names = |kinds: &[Kind]| kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(",");
        let detail = format!("in_app={} email={}", names(&in_app), names(&email));
        let event = Event {
            action: "notification.preferences",
            target: Some("notifications"),
            outcome: Outcome::Success,
            detail: Some(&detail),
        };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Notifications sent and failed per channel, for `/metrics`.
    pub async fn notification_totals(&self) -> Result<Vec<ChannelTotals>, Error> {
        let in_app: i64 = sqlx::query_scalar("SELECT count(*) FROM notifications").fetch_one(&self.db).await?;
        let c = &self.delivery.counters;
        Ok(vec![
            ChannelTotals { channel: Channel::InApp, sent: u64::try_from(in_app).unwrap_or(0), failed: 0 },
            ChannelTotals {
                channel: Channel::Email,
                sent: c.email_sent.load(Ordering::Relaxed),
                failed: c.email_failed.load(Ordering::Relaxed),
            },
            ChannelTotals {
                channel: Channel::Webhook,
                sent: c.webhook_sent.load(Ordering::Relaxed),
                failed: c.webhook_failed.load(Ordering::Relaxed),
            },
        ])
    }
}

/// The active platform admins: who hears of node health changes.
pub(crate) async fn platform_admins(conn: &mut SqliteConnection) -> Result<Vec<i64>, Error> {
    Ok(sqlx::query_scalar("SELECT id FROM users WHERE role = 'platform_admin' AND status = 'active' ORDER BY id")
        .fetch_all(conn)
        .await?)
}

/// The active admins of `tenant_id`: who hears of its budgets.
pub(crate) async fn tenant_admins(conn: &mut SqliteConnection, tenant_id: i64) -> Result<Vec<i64>, Error> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM users WHERE tenant_id = ? AND role = 'tenant_admin' AND status = 'active' ORDER BY id",
    )
    .bind(tenant_id)
    .fetch_all(conn)
    .await?)
}

/// One's own notifications: the target of every inbox action.
fn own(caller: &Caller) -> Target {
    Target::Owned { tenant_id: caller.tenant_id(), owner_id: caller.user_id() }
}
