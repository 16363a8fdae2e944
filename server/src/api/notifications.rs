//! The caller's notifications (the inbox, marking them read, which channels each kind goes
//! to) and a tenant's webhooks.

use axum::Json;
use axum::extract::{Path, Query};
use axum::response::{IntoResponse, Response};
use berth_domain::notification::Kind;
use berth_platform::notifications::INBOX_LIMIT;
use berth_platform::notifications::webhooks::{Delivery, Webhook};
use http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::paging::{PageQuery, cursor};
use super::{ApiError, Body, TokenCaller, fail, read_object, rfc3339, schema};

#[derive(Serialize, ToSchema)]
pub struct NotificationBody {
    id: i64,
    kind: String,
    title: String,
    body: String,
    /// An absolute link to what it is about.
    link: String,
    #[schema(format = DateTime)]
    created_at: String,
    read: bool,
}

#[derive(Serialize, ToSchema)]
pub struct NotificationList {
    unread: i64,
    /// Newest first.
    notifications: Vec<NotificationBody>,
    /// The next page's `cursor`; `null` on the last page.
    next_cursor: Option<String>,
}

/// What a notifications cursor is a place in.
const LISTING: &str = "notifications";

/// The caller's notifications, newest first (50 a page unless `limit` says otherwise, 100
/// at most), and how many are unread.
#[utoipa::path(get, path = "/api/v1/notifications", tag = "notifications", params(PageQuery),
    responses((status = 200, body = NotificationList)))]
pub(super) async fn notifications(
    TokenCaller(platform, caller): TokenCaller,
    Query(page): Query<PageQuery>,
) -> Result<Json<NotificationList>, ApiError> {
    let limit = page.limit(50, INBOX_LIMIT).map_err(fail(&caller))?;
    let before = page.id_place(LISTING).map_err(fail(&caller))?;
    let inbox = platform.inbox_page(&caller, before, limit).await.map_err(fail(&caller))?;
    let next_cursor = inbox.items.last().filter(|_| inbox.more).map(|last| cursor(LISTING, &last.id.to_string()));
    let notifications = inbox
        .items
        .into_iter()
        .map(|n| NotificationBody {
            link: berth_domain::notification::absolute_link(platform.public_url(), &n.link),
            id: n.id,
            kind: n.kind,
            title: n.title,
            body: n.body,
            created_at: rfc3339(n.created_at),
            read: n.read,
        })
        .collect();
    Ok(Json(NotificationList { unread: inbox.unread, notifications, next_cursor }))
}

/// Which notifications to mark read: `{"ids": [..]}`, or all of them (`{}`, `null` or no
/// body).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MarkRead {
    /// The notifications' ids; absent or `null`: all of them.
    #[serde(default)]
    pub ids: Option<Vec<i64>>,
}

#[derive(Serialize, ToSchema)]
pub struct Marked {
    /// How many were unread and are read now.
    marked: u64,
    unread: i64,
}

/// Marks the caller's notifications read.
#[utoipa::path(post, path = "/api/v1/notifications/read", tag = "notifications",
    request_body(content = Option<MarkRead>, description = "Optional: no body marks all of them"),
    responses((status = 200, body = Marked)))]
pub(super) async fn mark_notifications_read(
    TokenCaller(platform, caller): TokenCaller,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Json<Marked>, Response> {
    let asked = match body.iter().all(u8::is_ascii_whitespace) {
        true => MarkRead::default(),
        false => read_object::<Option<MarkRead>>(&headers, &body, true)
            .map_err(IntoResponse::into_response)?
            .unwrap_or_default(),
    };
    let fail = |e| fail(&caller)(e).into_response();
    let marked = platform.mark_notifications_read(&caller, asked.ids.as_deref()).await.map_err(fail)?;
    let unread = platform.unread_notifications(caller.user_id()).await.map_err(fail)?;
    Ok(Json(Marked { marked, unread }))
}

/// Where each kind of notification goes for the caller: the kinds sent in the app and by
/// email (a kind in neither goes nowhere).
#[derive(Serialize, ToSchema)]
pub struct NotificationSettings {
    /// Every kind there is.
    #[schema(schema_with = schema::notification_kinds)]
    kinds: Vec<&'static str>,
    #[schema(schema_with = schema::notification_kinds)]
    in_app: Vec<&'static str>,
    #[schema(schema_with = schema::notification_kinds)]
    email: Vec<&'static str>,
    /// Whether this Berth sends email at all (an operator's setting).
    email_configured: bool,
}

async fn settings_of(
    platform: &berth_platform::Platform,
    caller: &berth_platform::Caller,
) -> Result<NotificationSettings, ApiError> {
    let choices = platform.notification_preferences(caller).await.map_err(fail(caller))?;
    let chosen = |on: fn(&berth_platform::notifications::Preference) -> bool| {
        choices.iter().filter(|p| on(p)).map(|p| p.kind.as_str()).collect()
    };
    Ok(NotificationSettings {
        kinds: Kind::ALL.map(Kind::as_str).to_vec(),
        in_app: chosen(|p| p.in_app),
        email: chosen(|p| p.email),
        email_configured: platform.email_configured(),
    })
}

/// Which kinds of notification reach the caller in the app and by email.
#[utoipa::path(get, path = "/api/v1/notification-settings", tag = "notifications",
    responses((status = 200, body = NotificationSettings)))]
pub(super) async fn notification_settings(
    TokenCaller(platform, caller): TokenCaller,
) -> Result<Json<NotificationSettings>, ApiError> {
    Ok(Json(settings_of(&platform, &caller).await?))
}

/// `{"in_app": [...], "email": [...]}`: every kind at once, as the account page saves them.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewNotificationSettings {
    /// The kinds shown in the app; absent: none.
    #[serde(default)]
    #[schema(schema_with = schema::notification_kinds)]
    in_app: Vec<String>,
    /// The kinds sent by email; absent: none.
    #[serde(default)]
    #[schema(schema_with = schema::notification_kinds)]
    email: Vec<String>,
}

/// Sets where each kind of notification goes for the caller; an unknown kind is refused
/// (422) and nothing changes.
#[utoipa::path(put, path = "/api/v1/notification-settings", tag = "notifications",
    request_body = NewNotificationSettings,
    responses((status = 200, body = NotificationSettings)))]
pub(super) async fn set_notification_settings(
    TokenCaller(platform, caller): TokenCaller,
    Body(asked): Body<NewNotificationSettings>,
) -> Result<Json<NotificationSettings>, ApiError> {
    platform.set_notification_preferences(&caller, &asked.in_app, &asked.email).await.map_err(fail(&caller))?;
    Ok(Json(settings_of(&platform, &caller).await?))
}

/// A tenant's webhook (its signing secret is shown only when it is made).
#[derive(Serialize, ToSchema)]
pub struct WebhookBody {
    id: i64,
    url: String,
    /// `slack` or `json`.
    #[schema(schema_with = schema::webhook_format)]
    format: &'static str,
    #[schema(schema_with = schema::notification_kinds)]
    kinds: Vec<&'static str>,
    #[schema(format = DateTime)]
    created_at: String,
}

fn webhook_body(w: &Webhook) -> WebhookBody {
    WebhookBody {
        id: w.id,
        url: w.url.clone(),
        format: w.format.as_str(),
        kinds: w.kinds.iter().map(|k| k.as_str()).collect(),
        created_at: rfc3339(w.created_at),
    }
}

/// One try to call a webhook.
#[derive(Serialize, ToSchema)]
pub struct DeliveryBody {
    id: i64,
    webhook: i64,
    kind: String,
    title: String,
    /// 1 for the first try.
    attempt: i64,
    #[schema(format = DateTime)]
    at: String,
    /// The receiver's HTTP status; `null` when none came.
    status_code: Option<i64>,
    error: Option<String>,
}

fn delivery_body(d: Delivery) -> DeliveryBody {
    DeliveryBody {
        id: d.id,
        webhook: d.webhook_id,
        kind: d.kind,
        title: d.title,
        attempt: d.attempt,
        at: rfc3339(d.at),
        status_code: d.status_code,
        error: d.error,
    }
}

#[derive(Serialize, ToSchema)]
pub struct WebhookList {
    webhooks: Vec<WebhookBody>,
    /// The latest 100 tries, newest first (removed webhooks' too).
    deliveries: Vec<DeliveryBody>,
}

/// A tenant's webhooks and their latest tries.
#[utoipa::path(get, path = "/api/v1/tenants/{id}/webhooks", tag = "notifications",
    params(("id" = i64, Path, description = "The tenant's id")),
    responses((status = 200, body = WebhookList)))]
pub(super) async fn webhooks(
    TokenCaller(platform, caller): TokenCaller,
    Path(tenant): Path<i64>,
) -> Result<Json<WebhookList>, ApiError> {
    let overview = platform.webhook_overview(&caller, tenant).await.map_err(fail(&caller))?;
    Ok(Json(WebhookList {
        webhooks: overview.webhooks.iter().map(webhook_body).collect(),
        deliveries: overview.deliveries.into_iter().map(delivery_body).collect(),
    }))
}

/// `{"url": "https://hooks.example.com/berth", "format": "json", "kinds": ["environment.failed"]}`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewWebhookBody {
    /// https on a public address (unless the operator allows private ones).
    url: String,
    /// `slack` or `json`.
    #[schema(schema_with = schema::webhook_format)]
    format: String,
    /// The kinds of event it receives; at least one.
    #[schema(schema_with = schema::notification_kinds)]
    kinds: Vec<String>,
}

/// A new webhook with its signing secret, shown this once.
#[derive(Serialize, ToSchema)]
pub struct MadeWebhook {
    #[serde(flatten)]
    webhook: WebhookBody,
    /// Signs every call (`Berth-Signature`); not shown again.
    secret: String,
}

/// Adds a webhook to a tenant; answered with its signing secret, once.
#[utoipa::path(post, path = "/api/v1/tenants/{id}/webhooks", tag = "notifications",
    params(("id" = i64, Path, description = "The tenant's id")),
    request_body = NewWebhookBody,
    responses((status = 201, description = "Added", body = MadeWebhook)))]
pub(super) async fn add_webhook(
    TokenCaller(platform, caller): TokenCaller,
    Path(tenant): Path<i64>,
    Body(asked): Body<NewWebhookBody>,
) -> Result<Response, ApiError> {
    let made =
        platform.add_webhook(&caller, tenant, &asked.url, &asked.format, &asked.kinds).await.map_err(fail(&caller))?;
    let body = MadeWebhook { webhook: webhook_body(&made.webhook), secret: made.secret };
    Ok((StatusCode::CREATED, [(http::header::CACHE_CONTROL, "no-store")], Json(body)).into_response())
}

#[derive(Serialize, ToSchema)]
pub struct RemovedWebhook {
    /// The webhook's id.
    removed: i64,
}

/// Removes a tenant's webhook: nothing more is sent to it, and calls not yet made are given
/// up.
#[utoipa::path(delete, path = "/api/v1/tenants/{id}/webhooks/{webhook}", tag = "notifications",
    params(("id" = i64, Path, description = "The tenant's id"), ("webhook" = i64, Path, description = "The webhook's id")),
    responses((status = 200, body = RemovedWebhook)))]
pub(super) async fn remove_webhook(
    TokenCaller(platform, caller): TokenCaller,
    Path((tenant, webhook)): Path<(i64, i64)>,
) -> Result<Json<RemovedWebhook>, ApiError> {
    platform.remove_webhook(&caller, tenant, webhook).await.map_err(fail(&caller))?;
    Ok(Json(RemovedWebhook { removed: webhook }))
}
