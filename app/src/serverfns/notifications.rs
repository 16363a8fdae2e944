//! Notifications: one's inbox (`/notifications`), one's channels (account page), and a
//! tenant's webhooks (Team page).

use leptos::prelude::*;

use crate::error::AppError;
use crate::model::{BellView, NotificationSettingsView, NotificationsView, WebhooksView};

/// The bell: the signed-in person's unread count and newest unread title; nothing when
/// signed out.
#[server(endpoint = "notification_bell")]
pub async fn notification_bell() -> Result<Option<BellView>, AppError> {
    use super::ssr;
    let meta = ssr::request_meta().await;
    let platform = ssr::platform(&meta)?;
    let Some(user) = ssr::signed_in_user(&platform, &meta).await? else { return Ok(None) };
    let bell = platform.bell(user.id).await.map_err(|e| AppError::from_platform(e, &meta.request_id))?;
    Ok(Some(BellView { unread: bell.unread, latest: bell.latest }))
}

/// The caller's latest notifications, newest first.
#[server(endpoint = "notifications")]
pub async fn notifications() -> Result<NotificationsView, AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let inbox = platform.inbox(&caller).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    Ok(views::inbox(&inbox, berth_platform::now_ms()))
}

/// Marks all the caller's notifications read.
#[server(endpoint = "mark_notifications_read")]
pub async fn mark_notifications_read() -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform
        .mark_notifications_read(&caller, None)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/notifications");
    Ok(())
}

/// The caller's channels per kind, and whether email is set up at all.
#[server(endpoint = "notification_settings")]
pub async fn notification_settings() -> Result<NotificationSettingsView, AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let choices = platform
        .notification_preferences(&caller)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    Ok(views::settings(&choices, platform.email_configured()))
}

/// Saves the caller's channels: checkboxes named `in_app[]` and `email[]` whose values are
/// kinds (sent only when ticked).
#[server(endpoint = "save_notification_settings")]
pub async fn save_notification_settings(
    in_app: Option<Vec<String>>,
    email: Option<Vec<String>>,
) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform
        .set_notification_preferences(&caller, &in_app.unwrap_or_default(), &email.unwrap_or_default())
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/account?saved=notifications#notifications");
    Ok(())
}

/// A tenant's webhooks and their delivery log (its admins and platform staff).
#[server(endpoint = "tenant_webhooks")]
pub async fn tenant_webhooks(tenant_id: i64) -> Result<WebhooksView, AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let overview = platform
        .webhook_overview(&caller, tenant_id)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    let session = super::ssr::session(&caller.meta).await?;
    let new_secret = crate::session::show_webhook_secret(&session, &caller.meta, tenant_id).await?;
    if new_secret.is_some()
        && let Some(response) = use_context::<leptos_axum::ResponseOptions>()
    {
        // The page holds a secret: keep it out of the browser's cache and back button.
        response.insert_header(http::header::CACHE_CONTROL, http::HeaderValue::from_static("no-store"));
    }
    Ok(views::webhooks(tenant_id, &overview, new_secret, berth_platform::now_ms()))
}

/// Adds a webhook: `kinds[]` checkboxes name the events it takes. Its signing secret is
/// answered (or, after a plain form post, shown once by the next render of the page).
#[server(endpoint = "add_webhook")]
pub async fn add_webhook(
    tenant_id: i64,
    url: String,
    format: String,
    kinds: Option<Vec<String>>,
) -> Result<Option<crate::model::NewWebhookView>, AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let new = platform
        .add_webhook(&caller, tenant_id, &url, &format, &kinds.unwrap_or_default())
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    let shown =
        crate::model::NewWebhookView { id: new.webhook.id, url: new.webhook.url.clone(), secret: new.secret.clone() };
    if crate::error::plain_form_post() {
        let session = super::ssr::session(&caller.meta).await?;
        let held = crate::session::NewWebhookSecret {
            tenant_id,
            id: new.webhook.id,
            url: new.webhook.url,
            secret: new.secret,
            created_at: berth_platform::now_ms(),
            shown_in: None,
        };
        crate::session::hold_webhook_secret(&session, &caller.meta, &held).await?;
        leptos_axum::redirect(&format!("/tenants/{tenant_id}/webhooks"));
        return Ok(None);
    }
    Ok(Some(shown))
}

/// Removes a tenant's webhook.
#[server(endpoint = "remove_webhook")]
pub async fn remove_webhook(tenant_id: i64, id: i64) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform
        .remove_webhook(&caller, tenant_id, id)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect(&format!("/tenants/{tenant_id}/webhooks"));
    Ok(())
}

#[cfg(feature = "ssr")]
mod views {
    use berth_domain::notification::Kind;
    use berth_platform::notifications::webhooks::WebhookOverview;
    use berth_platform::notifications::{Inbox, Preference};

    use crate::model::{
        NewWebhookView, NotificationChoiceView, NotificationSettingsView, NotificationView, NotificationsView,
        WebhookDeliveryView, WebhookView, WebhooksView,
    };
    use crate::time::{duration_words, utc};

    fn ago(at: i64, now: i64) -> String {
        format!("{} ago ({})", duration_words(now - at), utc(at))
    }

    pub fn inbox(inbox: &Inbox, now: i64) -> NotificationsView {
        NotificationsView {
            unread: inbox.unread,
            items: inbox
                .items
                .iter()
                .map(|n| NotificationView {
                    id: n.id,
                    kind: n.kind.clone(),
                    title: n.title.clone(),
                    body: n.body.clone(),
                    link: n.link.clone(),
                    when: ago(n.created_at, now),
                    read: n.read,
                })
                .collect(),
        }
    }

    pub fn settings(choices: &[Preference], email_configured: bool) -> NotificationSettingsView {
        NotificationSettingsView {
            email_configured,
            choices: choices
                .iter()
                .map(|p| NotificationChoiceView {
                    kind: p.kind.as_str().to_owned(),
                    label: p.kind.label().to_owned(),
                    in_app: p.in_app,
                    email: p.email,
                })
                .collect(),
        }
    }

    pub fn webhooks(
        tenant_id: i64,
        overview: &WebhookOverview,
        new_secret: Option<crate::session::NewWebhookSecret>,
        now: i64,
    ) -> WebhooksView {
        WebhooksView {
            tenant_id,
            can_manage: overview.can_manage,
            webhooks: overview
                .webhooks
                .iter()
                .map(|w| WebhookView {
                    id: w.id,
                    url: w.url.clone(),
                    format: w.format.as_str().to_owned(),
                    kinds: w.kinds.iter().map(|k| k.as_str().to_owned()).collect(),
                    created: ago(w.created_at, now),
                })
                .collect(),
            deliveries: overview
                .deliveries
                .iter()
                .map(|d| WebhookDeliveryView {
                    webhook_id: d.webhook_id,
                    title: d.title.clone(),
                    attempt: d.attempt,
                    when: ago(d.at, now),
                    status: d.status_code,
                    error: d.error.clone(),
                })
                .collect(),
            kinds: Kind::ALL.iter().map(|k| (k.as_str().to_owned(), k.label().to_owned())).collect(),
            new_secret: new_secret.map(|s| NewWebhookView { id: s.id, url: s.url, secret: s.secret }),
        }
    }
}
