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
        can_launch: can(Action::EnvironmentLaunch),
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
    let fail = |e| AppError::from_platform(e, &meta.request_id);
    // Checked before the password, so a refused `next` spends no attempt.
    let next = after_sign_in(next.as_deref()).map_err(|r| fail(r.into()))?;
    let user = platform.sign_in(&email, &password, &meta).await.map_err(fail)?;
    let session = ssr::session(&meta).await?;
    if platform.must_change_password(&user).await.map_err(fail)? {
        crate::session::await_new_password(&session, &meta, user.id).await?;
        leptos_axum::redirect(&format!("/login/password?next={}", crate::components::url_encode(&next)));
        return Ok(());
    }
    after_password(&platform, &session, &meta, &user, &next).await
}

/// The sign-in after the password: the one-time code step for those who owe one, the
/// session otherwise.
#[cfg(feature = "ssr")]
async fn after_password(
    platform: &berth_platform::Platform,
    session: &tower_sessions::Session,
    meta: &berth_platform::RequestMeta,
    user: &berth_platform::people::User,
    next: &str,
) -> Result<(), AppError> {
    if platform.needs_second_factor(user) {
        crate::session::await_second_factor(session, meta, user.id).await?;
        leptos_axum::redirect(&format!("/login/code?next={}", crate::components::url_encode(next)));
        return Ok(());
    }
    crate::session::start(session, meta, user.id).await?;
    leptos_axum::redirect(next);
    Ok(())
}

/// The first sign-in with a password someone else chose (the first-start administrator's):
/// the person chooses their own, typed twice, and the sign-in goes on.
#[server(endpoint = "choose_password")]
pub async fn choose_password(password: String, again: String, next: Option<String>) -> Result<(), AppError> {
    use super::ssr;
    let meta = ssr::request_meta().await;
    let platform = ssr::platform(&meta)?;
    let fail = |e| AppError::from_platform(e, &meta.request_id);
    let next = after_sign_in(next.as_deref()).map_err(|r| fail(r.into()))?;
    let session = ssr::session(&meta).await?;
    let user_id = crate::session::new_password_user(&session, &meta).await?.ok_or(AppError::Unauthenticated)?;
    let user = platform.replace_first_password(user_id, &password, &again, &meta).await.map_err(fail)?;
    crate::session::new_password_chosen(&session, &meta).await?;
    after_password(&platform, &session, &meta, &user, &next).await
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
        return Ok(SecondFactorView { secret: None, uri: None, qr: None });
    }
    let user = platform.active_user(user_id).await.map_err(fail)?;
    let secret = crate::session::enrolling_secret(&session, &meta).await?;
    let uri = berth_platform::identity::totp::otpauth_uri(&user.email, &secret);
    let qr = qr_data_url(&uri).map_err(|e| AppError::internal(&meta.request_id, "authenticator QR code", e))?;
    Ok(SecondFactorView { secret: Some(secret), uri: Some(uri), qr: Some(qr) })
}

/// `text` as a QR code, an SVG in a `data:` URL (the page's `img-src` allows `data:`).
#[cfg(feature = "ssr")]
pub fn qr_data_url(text: &str) -> Result<String, qrcode::types::QrError> {
    let code = qrcode::QrCode::new(text.as_bytes())?;
    let svg = code.render::<qrcode::render::svg::Color>().min_dimensions(200, 200).build();
    Ok(format!("data:image/svg+xml,{}", crate::url_encode(&svg)))
}

/// The second step of a local administrator's sign-in: the code from their authenticator.
#[server(endpoint = "verify_code")]
pub async fn verify_code(code: String, next: Option<String>) -> Result<(), AppError> {
    use super::ssr;
    let meta = ssr::request_meta().await;
    let platform = ssr::platform(&meta)?;
    let fail = |e| AppError::from_platform(e, &meta.request_id);
    let next = after_sign_in(next.as_deref()).map_err(|r| fail(r.into()))?;
    let session = ssr::session(&meta).await?;
    let user_id = crate::session::second_factor_user(&session, &meta).await?.ok_or(AppError::Unauthenticated)?;
    let enrolling = crate::session::stored_enrolling_secret(&session, &meta).await?;
    let user = platform.complete_second_factor(user_id, &code, enrolling.as_deref(), &meta).await.map_err(fail)?;
    crate::session::start(&session, &meta, user.id).await?;
    leptos_axum::redirect(&next);
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

/// Where a browser goes once signed in: `next` if it is a path on this site, the
/// environments list when none was given; any other `next` is refused (so a crafted link
/// cannot bounce a fresh session elsewhere), before anything is spent.
pub fn after_sign_in(next: Option<&str>) -> Result<String, berth_domain::Refusal> {
    berth_domain::redirect::next_or(next, "/environments")
}

#[cfg(all(test, feature = "ssr"))]
mod tests {
    #[test]
    fn an_authenticator_key_is_offered_as_a_qr_code() {
        let uri = "otpauth://totp/Berth:admin%40berth.local?secret=JBSWY3DPEHPK3PXP&issuer=Berth";
        let url = super::qr_data_url(uri).expect("a QR code");
        let svg = url.strip_prefix("data:image/svg+xml,").expect("an SVG data URL");
        // Nothing in it ends the attribute or the URL early.
        assert!(!svg.contains(['"', '<', '>', '#', ' ']), "percent-encoded: {svg}");
        assert!(svg.contains("%3Csvg"), "an SVG image");
        // A longer key makes a denser code, so the picture depends on what it encodes.
        assert_ne!(url, super::qr_data_url(&format!("{uri}&algorithm=SHA1")).expect("another"));
    }
}
