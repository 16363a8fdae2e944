use leptos::prelude::*;

use crate::error::AppError;
use crate::model::{SecondFactorView, SessionUser};

/// Who is signed in, if anyone.
#[server(endpoint = "current_user")]
pub async fn current_user() -> Result<Option<SessionUser>, AppError> {
    use super::ssr;
    use berth_domain::policy::{Action, Reach};
    let meta = ssr::request_meta().await;
    let platform = ssr::platform(&meta)?;
    let Some(user) = ssr::signed_in_user(&platform, &meta).await? else { return Ok(None) };
    let principal = user.principal();
    let can = |action| principal.reach(action).is_some();
    Ok(Some(SessionUser {
        role: user.role.label().to_owned(),
        tenant_id: user.tenant_id,
        tenant_name: user.tenant_name,
        can_manage_fleet: can(Action::FleetManage),
        can_read_fleet: can(Action::FleetRead),
        can_read_tenants: principal.reach(Action::TenantRead) == Some(Reach::All),
        can_read_audit: can(Action::AuditRead),
        can_set_quotas: can(Action::QuotaManage),
        email: user.email,
        display_name: user.display_name,
    }))
}

/// Password sign-in for local accounts. On success the session id is renewed and the
/// browser goes to `next` (only paths on this site are followed).
#[server(endpoint = "sign_in")]
pub async fn sign_in(email: String, password: String, next: Option<String>) -> Result<(), AppError> {
    use super::ssr;
    let meta = ssr::request_meta().await;
    let platform = ssr::platform(&meta)?;
    let user =
        platform.sign_in(&email, &password, &meta).await.map_err(|e| AppError::from_platform(e, &meta.request_id))?;
    let session = ssr::session(&meta).await?;
    if platform.needs_second_factor(&user) {
        crate::session::await_second_factor(&session, &meta, user.id).await?;
        let next = crate::components::url_encode(&safe_next(next.as_deref()));
        leptos_axum::redirect(&format!("/login/code?next={next}"));
        return Ok(());
    }
    crate::session::start(&session, &meta, user.id).await?;
    leptos_axum::redirect(&safe_next(next.as_deref()));
    Ok(())
}

/// What the one-time code step shows: just the field once an authenticator is set up;
/// the secret to set one up (at the first sign-in) otherwise.
#[server(endpoint = "second_factor")]
pub async fn second_factor() -> Result<SecondFactorView, AppError> {
    use super::ssr;
    let meta = ssr::request_meta().await;
    let platform = ssr::platform(&meta)?;
    let session = ssr::session(&meta).await?;
    let user_id = crate::session::second_factor_user(&session, &meta).await?.ok_or(AppError::Unauthenticated)?;
    let fail = |e| AppError::from_platform(e, &meta.request_id);
    if platform.has_totp(user_id).await.map_err(fail)? {
        return Ok(SecondFactorView { secret: None, uri: None });
    }
    let user = platform.active_user(user_id).await.map_err(fail)?;
    let secret = crate::session::enrolling_secret(&session, &meta).await?;
    let uri = berth_platform::totp::otpauth_uri(&user.email, &secret);
    Ok(SecondFactorView { secret: Some(secret), uri: Some(uri) })
}

/// The second step of a local administrator's sign-in: the code from their authenticator.
#[server(endpoint = "verify_code")]
pub async fn verify_code(code: String, next: Option<String>) -> Result<(), AppError> {
    use super::ssr;
    let meta = ssr::request_meta().await;
    let platform = ssr::platform(&meta)?;
    let session = ssr::session(&meta).await?;
    let user_id = crate::session::second_factor_user(&session, &meta).await?.ok_or(AppError::Unauthenticated)?;
    let enrolling = crate::session::stored_enrolling_secret(&session, &meta).await?;
    let user = platform
        .complete_second_factor(user_id, &code, enrolling.as_deref(), &meta)
        .await
        .map_err(|e| AppError::from_platform(e, &meta.request_id))?;
    crate::session::start(&session, &meta, user.id).await?;
    leptos_axum::redirect(&safe_next(next.as_deref()));
    Ok(())
}

/// Ends the session on the server, then goes to the catalog.
#[server(endpoint = "sign_out")]
pub async fn sign_out() -> Result<(), AppError> {
    use super::ssr;
    let meta = ssr::request_meta().await;
    let platform = ssr::platform(&meta)?;
    if let Some(user) = ssr::signed_in_user(&platform, &meta).await? {
        platform
            .record_sign_out(&user.caller(meta.clone()))
            .await
            .map_err(|e| AppError::from_platform(e, &meta.request_id))?;
    }
    crate::session::end(&ssr::session(&meta).await?, &meta).await?;
    leptos_axum::redirect("/catalog");
    Ok(())
}

/// Only same-site paths, so a crafted link cannot bounce a fresh session elsewhere.
pub fn safe_next(next: Option<&str>) -> String {
    safe_next_or(next, "/environments")
}

/// `next` if it is a path on this site, `fallback` otherwise.
pub fn safe_next_or(next: Option<&str>, fallback: &str) -> String {
    match next {
        Some(path) if path.starts_with('/') && !path.starts_with("//") && !path.contains('\\') => path.to_owned(),
        _ => fallback.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::safe_next;

    #[test]
    fn next_stays_on_this_site() {
        assert_eq!(safe_next(Some("/launch/notebook")), "/launch/notebook");
        assert_eq!(safe_next(Some("//evil.example")), "/environments");
        assert_eq!(safe_next(Some("https://evil.example")), "/environments");
        assert_eq!(safe_next(Some("/\\evil.example")), "/environments");
        assert_eq!(safe_next(None), "/environments");
        assert_eq!(super::safe_next_or(Some("/lab?reset"), "/"), "/lab?reset");
        assert_eq!(super::safe_next_or(Some("https://evil.example"), "/"), "/");
    }
}
