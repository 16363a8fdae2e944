//! The caller's notifications: the inbox and marking them read.

use axum::Json;
use axum::response::{IntoResponse, Response};
use http::HeaderMap;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{ApiError, TokenCaller, fail, read_object, rfc3339};

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
}

/// The caller's latest notifications, newest first, and how many are unread.
#[utoipa::path(get, path = "/api/v1/notifications", tag = "notifications",
    responses((status = 200, body = NotificationList)))]
pub(super) async fn notifications(
    TokenCaller(platform, caller): TokenCaller,
) -> Result<Json<NotificationList>, ApiError> {
    let inbox = platform.inbox(&caller).await.map_err(fail(&caller))?;
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
    Ok(Json(NotificationList { unread: inbox.unread, notifications }))
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
