//! Tenant webhooks: tenant admins add them (a URL `domain::outbound::check_url` accepts,
//! a format, the kinds they take), see each try in a delivery log, and remove them. Each
//! call is signed (`domain::notification::sign`) with the webhook's secret, shown once.
//!
//! Owns `tenant_webhooks` and `webhook_deliveries` (`0028`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use berth_domain::Refusal;
use berth_domain::notification::{self, Kind, Notice, WebhookFormat};
use berth_domain::outbound::{self, Reach, Unreachable};
use berth_domain::policy::{Action, Target};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use serde::Serialize;
use sqlx::{Row, SqliteConnection};

use crate::audit::{self, Event, Outcome};
use crate::{Caller, Error, Platform, now_ms, random_secret};

/// A tenant's webhook as its admins see it (never its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Webhook {
    pub id: i64,
    pub tenant_id: i64,
    pub url: String,
    pub format: WebhookFormat,
    pub kinds: Vec<Kind>,
    pub created_at: i64,
}

/// A new webhook and its signing secret: the only time the secret is shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NewWebhook {
    pub webhook: Webhook,
    pub secret: String,
}

/// A tenant's webhooks with their latest tries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WebhookOverview {
    pub webhooks: Vec<Webhook>,
    pub deliveries: Vec<Delivery>,
    pub can_manage: bool,
}

/// One try of one call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Delivery {
    pub id: i64,
    pub webhook_id: i64,
    pub outbox_id: i64,
    pub kind: String,
    pub title: String,
    pub attempt: i64,
    pub at: i64,
    pub status_code: Option<i64>,
    pub error: Option<String>,
}

/// What a receiver gets to answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

impl Platform {
    /// The live webhooks of `tenant_id`.
    pub async fn tenant_webhooks(&self, caller: &Caller, tenant_id: i64) -> Result<Vec<Webhook>, Error> {
        self.authorize(caller, Action::WebhookRead, Target::Tenant(tenant_id)).await?;
        let exists: Option<i64> =
            sqlx::query_scalar("SELECT id FROM tenants WHERE id = ?").bind(tenant_id).fetch_optional(&self.db).await?;
        if exists.is_none() {
            return Err(Error::NotFound);
        }
        let rows = sqlx::query(
            "SELECT id, tenant_id, url, format, kinds, created_at FROM tenant_webhooks
             WHERE tenant_id = ? AND removed_at IS NULL ORDER BY id",
        )
        .bind(tenant_id)
        .fetch_all(&self.db)
        .await?;
        rows.iter().map(webhook_from_row).collect()
    }

    /// The Team page's section: the tenant's webhooks, their latest tries, and whether the
    /// caller may change them.
    pub async fn webhook_overview(&self, caller: &Caller, tenant_id: i64) -> Result<WebhookOverview, Error> {
        let webhooks = self.tenant_webhooks(caller, tenant_id).await?;
        let deliveries = self.webhook_deliveries(caller, tenant_id).await?;
        let can_manage = caller.principal.authorize(Action::WebhookManage, Target::Tenant(tenant_id)).is_ok();
        Ok(WebhookOverview { webhooks, deliveries, can_manage })
    }

    /// Adds a webhook to `tenant_id`. The URL must be one Berth may call (https on a public
    /// address, unless the operator allows private ones); `kinds` name the events it takes.
    pub async fn add_webhook(
        &self,
        caller: &Caller,
        tenant_id: i64,
        url: &str,
        format: &str,
        kinds: &[String],
    ) -> Result<NewWebhook, Error> {
        self.authorize(caller, Action::WebhookManage, Target::Tenant(tenant_id)).await?;
        let url = url.trim();
        check_webhook_url(url, self.delivery.webhook_reach)?;
        let format = WebhookFormat::parse(format)
            .ok_or_else(|| Refusal::InvalidWebhook(format!("there is no format {format:?}; choose slack or json")))?;
        let kinds = Kind::parse_list(&kinds.join(",")).map_err(Refusal::InvalidWebhook)?;
        if kinds.is_empty() {
            return Err(Refusal::InvalidWebhook("choose at least one kind of event".into()).into());
        }
        let secret = format!("whsec_{}", random_secret());
        let kind_names = kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(",");
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        let live: i64 = sqlx::query_scalar("SELECT count(*) FROM tenants WHERE id = ? AND status = 'active'")
            .bind(tenant_id)
            .fetch_one(&mut *tx)
            .await?;
        if live == 0 {
            return Err(Error::NotFound);
        }
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO tenant_webhooks (tenant_id, url, format, kinds, secret, created_by, created_at)
             VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
        )
        .bind(tenant_id)
        .bind(url)
        .bind(format.as_str())
        .bind(&kind_names)
        .bind(&secret)
        .bind(caller.user_id())
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        let target = format!("webhook {id}");
        let detail = format!("{url} ({}) for {kind_names}", format.as_str());
        let event =
            Event { action: "webhook.add", target: Some(&target), outcome: Outcome::Success, detail: Some(&detail) };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        Ok(NewWebhook {
            webhook: Webhook { id, tenant_id, url: url.to_owned(), format, kinds, created_at: now },
            secret,
        })
    }

    /// Removes webhook `id` of `tenant_id`: nothing more is queued for it, and calls not
    /// yet made are given up.
    pub async fn remove_webhook(&self, caller: &Caller, tenant_id: i64, id: i64) -> Result<(), Error> {
        self.authorize(caller, Action::WebhookManage, Target::Tenant(tenant_id)).await?;
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        let removed = sqlx::query(
            "UPDATE tenant_webhooks SET removed_at = ? WHERE id = ? AND tenant_id = ? AND removed_at IS NULL",
        )
        .bind(now)
        .bind(id)
        .bind(tenant_id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if removed == 0 {
            return Err(Error::NotFound);
        }
        sqlx::query(
            "UPDATE notification_outbox SET gave_up_at = ?, lease_until = NULL, last_error = 'the webhook was removed'
             WHERE webhook_id = ? AND delivered_at IS NULL AND gave_up_at IS NULL",
        )
        .bind(now)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        let target = format!("webhook {id}");
        let event = Event { action: "webhook.remove", target: Some(&target), outcome: Outcome::Success, detail: None };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The latest tries of the webhooks of `tenant_id` (removed ones too), newest first.
    pub async fn webhook_deliveries(&self, caller: &Caller, tenant_id: i64) -> Result<Vec<Delivery>, Error> {
        self.authorize(caller, Action::WebhookRead, Target::Tenant(tenant_id)).await?;
        let rows = sqlx::query(
            "SELECT d.id, d.webhook_id, d.outbox_id, o.kind, o.title, d.attempt, d.at, d.status_code, d.error
             FROM webhook_deliveries d JOIN notification_outbox o ON o.id = d.outbox_id
             JOIN tenant_webhooks w ON w.id = d.webhook_id
             WHERE w.tenant_id = ? ORDER BY d.id DESC LIMIT 100",
        )
        .bind(tenant_id)
        .fetch_all(&self.db)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(Delivery {
                    id: r.try_get("id")?,
                    webhook_id: r.try_get("webhook_id")?,
                    outbox_id: r.try_get("outbox_id")?,
                    kind: r.try_get("kind")?,
                    title: r.try_get("title")?,
                    attempt: r.try_get("attempt")?,
                    at: r.try_get("at")?,
                    status_code: r.try_get("status_code")?,
                    error: r.try_get("error")?,
                })
            })
            .collect()
    }
}

fn check_webhook_url(url: &str, reach: Reach) -> Result<(), Error> {
    match outbound::check_url(url, reach) {
        Ok(()) => Ok(()),
        Err(Unreachable::Scheme) => Err(Refusal::InvalidWebhook(match reach {
            Reach::Public => "the URL must start with https://".to_owned(),
            Reach::Private => "the URL must start with https:// (or http:// on loopback)".to_owned(),
        })
        .into()),
        Err(Unreachable::PrivateAddress(host)) => Err(Refusal::InvalidWebhook(format!(
            "{host} is not a public address; Berth calls webhooks on the internet only"
        ))
        .into()),
    }
}

fn webhook_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<Webhook, Error> {
    let format: String = row.try_get("format")?;
    let kinds: String = row.try_get("kinds")?;
    Ok(Webhook {
        id: row.try_get("id")?,
        tenant_id: row.try_get("tenant_id")?,
        url: row.try_get("url")?,
        format: WebhookFormat::parse(&format).ok_or_else(|| Error::internal(format!("webhook format {format}")))?,
        kinds: Kind::parse_list(&kinds).map_err(Error::internal)?,
        created_at: row.try_get("created_at")?,
    })
}

/// Queues a call of each live webhook of `tenant_id` that takes `notice`'s kind, on the
/// event's transaction.
pub(crate) async fn queue_calls(
    conn: &mut SqliteConnection,
    tenant_id: i64,
    notice: &Notice,
    now: i64,
) -> Result<(), Error> {
    let hooks: Vec<(i64, String)> =
        sqlx::query_as("SELECT id, kinds FROM tenant_webhooks WHERE tenant_id = ? AND removed_at IS NULL")
            .bind(tenant_id)
            .fetch_all(&mut *conn)
            .await?;
    for (id, kinds) in hooks {
        if !kinds.split(',').any(|k| k == notice.kind.as_str()) {
            continue;
        }
        sqlx::query(
            "INSERT INTO notification_outbox (channel, webhook_id, kind, title, body, link, created_at, next_attempt_at)
             VALUES ('webhook', ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(id)
        .bind(notice.kind.as_str())
        .bind(&notice.title)
        .bind(&notice.body)
        .bind(&notice.link)
        .bind(now)
        .bind(now)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Makes HTTP calls to webhooks: no redirects followed, and (unless private addresses are
/// allowed) names resolving to private addresses refused at connect time, so a DNS answer
/// that changed since the URL was checked cannot point Berth inward.
pub(crate) fn client(reach: Reach) -> Result<reqwest::Client, Error> {
    let mut builder = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(CALL_TIMEOUT)
        .user_agent("Berth-Webhooks/1");
    if reach == Reach::Public {
        builder = builder.dns_resolver(Arc::new(PublicOnly));
    }
    builder.build().map_err(Error::internal)
}

/// What a call came to: the receiver's status, or why there was none.
pub(crate) struct CallResult {
    pub status: Option<u16>,
    pub error: Option<String>,
}

impl CallResult {
    pub fn succeeded(&self) -> bool {
        self.status.is_some_and(|s| (200..300).contains(&s))
    }
}

/// Calls webhook `url` with delivery `outbox_id` of `notice`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn call(
    client: &reqwest::Client,
    reach: Reach,
    url: &str,
    format: WebhookFormat,
    secret: &str,
    outbox_id: i64,
    notice: &Notice,
    created_at: i64,
    public_url: &str,
) -> CallResult {
    // Checked again at each call: the operator may have tightened the reach since.
    if let Err(e) = check_webhook_url(url, reach) {
        return CallResult { status: None, error: Some(e.to_string()) };
    }
    let body = notification::webhook_payload(format, outbox_id, notice, created_at, public_url);
    let timestamp = now_ms() / 1000;
    let response = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(notification::SIGNATURE_HEADER, notification::sign(secret, timestamp, &body))
        .header(notification::DELIVERY_HEADER, outbox_id.to_string())
        .body(body)
        .send()
        .await;
    match response {
        Ok(response) => {
            let status = response.status().as_u16();
            let error = (!response.status().is_success()).then(|| format!("the receiver answered {status}"));
            CallResult { status: Some(status), error }
        }
        Err(e) => CallResult { status: None, error: Some(describe(e)) },
    }
}

/// A reqwest error with its causes, without the URL's query (it may hold a token).
fn describe(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Refuses names that resolve to addresses that are not public.
struct PublicOnly;

impl Resolve for PublicOnly {
    fn resolve(&self, name: Name) -> Resolving {
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if let Some(private) = addresses.iter().find(|a| !outbound::is_public(a.ip())) {
                return Err(format!("{host} resolves to {}, which is not a public address", private.ip()).into());
            }
            let addresses: Addrs = Box::new(addresses.into_iter());
            Ok(addresses)
        })
    }
}
