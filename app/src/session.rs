//! Browser sessions (tower-sessions, stored in Berth's SQLite database): who is signed in,
//! since when, the single sign-on binding, and a new API token's secret between a plain
//! form post and the render that shows it. Used by the server functions and by the
//! server's own routes (SSO callbacks, downloads), so there is one rule for both.

use berth_platform::people::User;
use berth_platform::{Platform, RequestMeta};
use tower_sessions::Session;

use crate::error::AppError;

const USER_KEY: &str = "user_id";
/// When the session signed in, for the absolute timeout.
const SIGNED_IN_AT_KEY: &str = "signed_in_at";
/// A random value tying an SSO callback to the browser that started the sign-in.
const SSO_BINDING_KEY: &str = "sso_binding";

/// A sign-in waiting for its second factor: the user whose password was right, and when.
const SECOND_FACTOR_USER_KEY: &str = "second_factor_user";
const SECOND_FACTOR_AT_KEY: &str = "second_factor_at";
/// A sign-in whose password must be replaced first (the first-start administrator's): the
/// user whose password was right, and when. Same time limit as the second factor.
const NEW_PASSWORD_USER_KEY: &str = "new_password_user";
const NEW_PASSWORD_AT_KEY: &str = "new_password_at";
/// The secret shown to an administrator setting up their authenticator.
const ENROLLING_SECRET_KEY: &str = "enrolling_totp";
/// How long the second step may take.
const SECOND_FACTOR_TTL_MS: i64 = 5 * 60 * 1000;

/// However active a session is, it ends this long after sign-in.
pub const ABSOLUTE_TIMEOUT_MS: i64 = 12 * 60 * 60 * 1000;

fn store_failed(meta: &RequestMeta) -> impl Fn(tower_sessions::session::Error) -> AppError + '_ {
    move |e| AppError::internal(&meta.request_id, "session store failed", e)
}

/// The session's user, if the session is live and the user may still act. A session past
/// its absolute timeout, or of a user who was removed or suspended (or whose tenant was),
/// is ended here.
pub async fn signed_in_user(
    session: &Session,
    platform: &Platform,
    meta: &RequestMeta,
) -> Result<Option<User>, AppError> {
    let Some(id) = session.get::<i64>(USER_KEY).await.map_err(store_failed(meta))? else { return Ok(None) };
    forget_shown_token(session, meta).await?;
    let signed_in_at = session.get::<i64>(SIGNED_IN_AT_KEY).await.map_err(store_failed(meta))?.unwrap_or(0);
    if berth_platform::now_ms() - signed_in_at > ABSOLUTE_TIMEOUT_MS {
        session.flush().await.map_err(store_failed(meta))?;
        return Ok(None);
    }
    // Held while the user is read, so the request's other server functions, which ask at
    // the same moment, wait for this answer instead of each reading it again.
    let known = leptos::prelude::use_context::<RequestUser>();
    let mut kept = match &known {
        Some(known) => Some(known.0.lock().await),
        None => None,
    };
    if let Some(user) = kept.as_ref().and_then(|k| k.as_ref()).filter(|u| u.id == id) {
        return Ok(Some(user.clone()));
    }
    match platform.active_user(id).await {
        Ok(user) => {
            if let Some(kept) = kept.as_mut() {
                **kept = Some(user.clone());
            }
            Ok(Some(user))
        }
        Err(berth_platform::Error::NotFound) => {
            session.flush().await.map_err(store_failed(meta))?;
            Ok(None)
        }
        Err(e) => Err(AppError::from_platform(e, &meta.request_id)),
    }
}

/// The signed-in user as the first of a request's server functions read them: a page
/// renders several (the user area, the bell, the page's own), all asking at once who is
/// signed in, and the answer cannot change within one request. The first reads while the
/// others wait for its answer. The server puts a fresh one in every request's context
/// (`http.rs`, `page_context`); without one, every call reads.
#[derive(Clone, Default)]
pub struct RequestUser(std::sync::Arc<tokio::sync::Mutex<Option<User>>>);

/// Starts a fresh session for `user`: a new id (so a planted or stolen pre-login id is
/// worthless), the user and the time of sign-in.
pub async fn start(session: &Session, meta: &RequestMeta, user_id: i64) -> Result<(), AppError> {
    session.cycle_id().await.map_err(store_failed(meta))?;
    session.remove::<String>(SSO_BINDING_KEY).await.map_err(store_failed(meta))?;
    session.remove::<i64>(SECOND_FACTOR_USER_KEY).await.map_err(store_failed(meta))?;
    session.remove::<String>(ENROLLING_SECRET_KEY).await.map_err(store_failed(meta))?;
    session.remove::<i64>(NEW_PASSWORD_USER_KEY).await.map_err(store_failed(meta))?;
    session.insert(USER_KEY, user_id).await.map_err(store_failed(meta))?;
    session.insert(SIGNED_IN_AT_KEY, berth_platform::now_ms()).await.map_err(store_failed(meta))
}

/// Ends the session on the server: its row is deleted, the id is worthless from now on.
pub async fn end(session: &Session, meta: &RequestMeta) -> Result<(), AppError> {
    session.flush().await.map_err(|e| AppError::internal(&meta.request_id, "could not end the session", e))
}

/// A new random binding for an SSO sign-in, kept in this browser's session.
pub async fn new_sso_binding(session: &Session, meta: &RequestMeta) -> Result<String, AppError> {
    let binding = uuid::Uuid::new_v4().simple().to_string() + &uuid::Uuid::new_v4().simple().to_string();
    session.insert(SSO_BINDING_KEY, &binding).await.map_err(store_failed(meta))?;
    Ok(binding)
}

pub async fn sso_binding(session: &Session, meta: &RequestMeta) -> Result<Option<String>, AppError> {
    session.get::<String>(SSO_BINDING_KEY).await.map_err(store_failed(meta))
}

/// A step of a sign-in still owed after the right password: the session keeps who owes
/// it and since when, and is not signed in until every step is done.
#[derive(Clone, Copy)]
struct Owed {
    user_key: &'static str,
    at_key: &'static str,
}

const SECOND_FACTOR: Owed = Owed { user_key: SECOND_FACTOR_USER_KEY, at_key: SECOND_FACTOR_AT_KEY };
const NEW_PASSWORD: Owed = Owed { user_key: NEW_PASSWORD_USER_KEY, at_key: NEW_PASSWORD_AT_KEY };

async fn owe(session: &Session, meta: &RequestMeta, step: Owed, user_id: i64) -> Result<(), AppError> {
    session.cycle_id().await.map_err(store_failed(meta))?;
    session.insert(step.user_key, user_id).await.map_err(store_failed(meta))?;
    session.insert(step.at_key, berth_platform::now_ms()).await.map_err(store_failed(meta))
}

/// The user owing `step`, if their password step was recent.
async fn owed_by(session: &Session, meta: &RequestMeta, step: Owed) -> Result<Option<i64>, AppError> {
    let at = session.get::<i64>(step.at_key).await.map_err(store_failed(meta))?.unwrap_or(0);
    if berth_platform::now_ms() - at > SECOND_FACTOR_TTL_MS {
        return Ok(None);
    }
    session.get::<i64>(step.user_key).await.map_err(store_failed(meta))
}

/// Remembers that `user_id` gave the right password and owes a one-time code.
pub async fn await_second_factor(session: &Session, meta: &RequestMeta, user_id: i64) -> Result<(), AppError> {
    owe(session, meta, SECOND_FACTOR, user_id).await
}

/// The user owing a one-time code, if the password step was recent.
pub async fn second_factor_user(session: &Session, meta: &RequestMeta) -> Result<Option<i64>, AppError> {
    owed_by(session, meta, SECOND_FACTOR).await
}

/// Remembers that `user_id` gave the right password but must choose a new one before the
/// sign-in goes on.
pub async fn await_new_password(session: &Session, meta: &RequestMeta, user_id: i64) -> Result<(), AppError> {
    owe(session, meta, NEW_PASSWORD, user_id).await
}

/// The user owing a new password, if their password step was recent.
pub async fn new_password_user(session: &Session, meta: &RequestMeta) -> Result<Option<i64>, AppError> {
    owed_by(session, meta, NEW_PASSWORD).await
}

/// The new password was chosen: that step is over.
pub async fn new_password_chosen(session: &Session, meta: &RequestMeta) -> Result<(), AppError> {
    session.remove::<i64>(NEW_PASSWORD_USER_KEY).await.map_err(store_failed(meta))?;
    Ok(())
}

/// The secret being set up in this session, made on first ask.
pub async fn enrolling_secret(session: &Session, meta: &RequestMeta) -> Result<String, AppError> {
    if let Some(secret) = stored_enrolling_secret(session, meta).await? {
        return Ok(secret);
    }
    let secret = berth_platform::identity::totp::new_secret();
    session.insert(ENROLLING_SECRET_KEY, &secret).await.map_err(store_failed(meta))?;
    Ok(secret)
}

pub async fn stored_enrolling_secret(session: &Session, meta: &RequestMeta) -> Result<Option<String>, AppError> {
    session.get::<String>(ENROLLING_SECRET_KEY).await.map_err(store_failed(meta))
}

/// A token secret waiting to be shown once, after a plain (pre-WASM) form post.
const NEW_TOKEN_KEY: &str = "new_token";
/// A waiting secret older than this is dropped unseen rather than shown late.
const NEW_TOKEN_TTL_MS: i64 = 5 * 60 * 1000;

/// A new API token's secret, as it travels from the create form to the page that shows it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct NewToken {
    pub name: String,
    pub secret: String,
    pub expires_at: i64,
    pub created_at: i64,
    /// The request whose render showed it. The server render may ask more than once (Leptos
    /// walks a page's suspended parts again before it renders them), so "once" means "in
    /// one request", and any later request forgets it.
    #[serde(default)]
    pub shown_in: Option<String>,
}

/// Keeps `token` in this browser's session until the next render of the token page. Only
/// for plain form posts: their answer is a redirect, which cannot carry the secret.
pub async fn hold_new_token(session: &Session, meta: &RequestMeta, token: &NewToken) -> Result<(), AppError> {
    session.insert(NEW_TOKEN_KEY, token).await.map_err(store_failed(meta))
}

/// The waiting secret, for this request's render only: a later request finds nothing.
pub async fn show_new_token(session: &Session, meta: &RequestMeta) -> Result<Option<NewToken>, AppError> {
    show_once(session, meta, NEW_TOKEN_KEY).await
}

/// Drops a secret that an earlier request already showed (or that waited too long), so it
/// leaves the session store at the browser's next request, whatever page that is.
async fn forget_shown_token(session: &Session, meta: &RequestMeta) -> Result<(), AppError> {
    forget_shown::<NewToken>(session, meta, NEW_TOKEN_KEY).await?;
    forget_shown::<NewEndpointKey>(session, meta, NEW_ENDPOINT_KEY).await?;
    forget_shown::<NewWebhookSecret>(session, meta, NEW_WEBHOOK_SECRET).await?;
    forget_shown::<LaunchDraft>(session, meta, LAUNCH_DRAFT_KEY).await
}

/// A launch refused after a plain (pre-WASM) form post: what was typed, for the form that
/// shows the refusal. The redirect back to the form carries the refusal but not the fields.
const LAUNCH_DRAFT_KEY: &str = "launch_draft";

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct LaunchDraft {
    request: berth_domain::launch::LaunchRequest,
    created_at: i64,
    #[serde(default)]
    shown_in: Option<String>,
}

impl ShownOnce for LaunchDraft {
    fn created_at(&self) -> i64 {
        self.created_at
    }
    fn shown_in(&mut self) -> &mut Option<String> {
        &mut self.shown_in
    }
}

/// Keeps what a refused plain-form launch typed until the form's next render, but not the
/// values of its environment variables (tokens, keys): Berth never shows those back, so
/// each line keeps only its name and `=`, to be filled in again.
pub async fn hold_launch_draft(
    session: &Session,
    meta: &RequestMeta,
    request: &berth_domain::launch::LaunchRequest,
) -> Result<(), AppError> {
    let env = request.env.lines().filter_map(|line| line.split_once('=')).map(|(name, _)| format!("{name}="));
    let request = berth_domain::launch::LaunchRequest { env: env.collect::<Vec<_>>().join("\n"), ..request.clone() };
    let draft = LaunchDraft { request, created_at: berth_platform::now_ms(), shown_in: None };
    session.insert(LAUNCH_DRAFT_KEY, &draft).await.map_err(store_failed(meta))
}

/// What the refused launch typed, for this request's render only.
pub async fn show_launch_draft(
    session: &Session,
    meta: &RequestMeta,
) -> Result<Option<berth_domain::launch::LaunchRequest>, AppError> {
    Ok(show_once::<LaunchDraft>(session, meta, LAUNCH_DRAFT_KEY).await?.map(|draft| draft.request))
}

/// An endpoint's API key waiting to be shown once, after a plain (pre-WASM) form post.
const NEW_ENDPOINT_KEY: &str = "new_endpoint_key";

/// An endpoint's API key, as it travels from the reveal or replace form to the page.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct NewEndpointKey {
    pub environment_id: String,
    pub key: String,
    pub created_at: i64,
    #[serde(default)]
    pub shown_in: Option<String>,
}

/// Keeps an endpoint's key in this browser's session until the next render of its page.
pub async fn hold_endpoint_key(session: &Session, meta: &RequestMeta, key: &NewEndpointKey) -> Result<(), AppError> {
    session.insert(NEW_ENDPOINT_KEY, key).await.map_err(store_failed(meta))
}

/// The waiting key of `environment_id`, for this request's render only.
pub async fn show_endpoint_key(
    session: &Session,
    meta: &RequestMeta,
    environment_id: &str,
) -> Result<Option<String>, AppError> {
    let shown: Option<NewEndpointKey> = show_once(session, meta, NEW_ENDPOINT_KEY).await?;
    Ok(shown.filter(|k| k.environment_id == environment_id).map(|k| k.key))
}

/// A new webhook's secret waiting to be shown once, after a plain (pre-WASM) form post.
const NEW_WEBHOOK_SECRET: &str = "new_webhook_secret";

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct NewWebhookSecret {
    pub tenant_id: i64,
    pub id: i64,
    pub url: String,
    pub secret: String,
    pub created_at: i64,
    #[serde(default)]
    pub shown_in: Option<String>,
}

/// Keeps a new webhook's secret in this browser's session until the next render of its
/// tenant's page.
pub async fn hold_webhook_secret(
    session: &Session,
    meta: &RequestMeta,
    new: &NewWebhookSecret,
) -> Result<(), AppError> {
    session.insert(NEW_WEBHOOK_SECRET, new).await.map_err(store_failed(meta))
}

/// The waiting secret of a webhook of `tenant_id`, for this request's render only.
pub async fn show_webhook_secret(
    session: &Session,
    meta: &RequestMeta,
    tenant_id: i64,
) -> Result<Option<NewWebhookSecret>, AppError> {
    let shown: Option<NewWebhookSecret> = show_once(session, meta, NEW_WEBHOOK_SECRET).await?;
    Ok(shown.filter(|s| s.tenant_id == tenant_id))
}

impl ShownOnce for NewWebhookSecret {
    fn created_at(&self) -> i64 {
        self.created_at
    }
    fn shown_in(&mut self) -> &mut Option<String> {
        &mut self.shown_in
    }
}

/// A secret kept in the session to be shown in one render.
trait ShownOnce: serde::Serialize + serde::de::DeserializeOwned + Send + Sync {
    fn created_at(&self) -> i64;
    fn shown_in(&mut self) -> &mut Option<String>;
}

impl ShownOnce for NewToken {
    fn created_at(&self) -> i64 {
        self.created_at
    }
    fn shown_in(&mut self) -> &mut Option<String> {
        &mut self.shown_in
    }
}

impl ShownOnce for NewEndpointKey {
    fn created_at(&self) -> i64 {
        self.created_at
    }
    fn shown_in(&mut self) -> &mut Option<String> {
        &mut self.shown_in
    }
}

/// The secret under `slot`, for this request's render only: a later request finds nothing.
async fn show_once<T: ShownOnce>(session: &Session, meta: &RequestMeta, slot: &str) -> Result<Option<T>, AppError> {
    let Some(mut secret) = session.get::<T>(slot).await.map_err(store_failed(meta))? else {
        return Ok(None);
    };
    let fresh = berth_platform::now_ms() - secret.created_at() <= NEW_TOKEN_TTL_MS;
    match secret.shown_in().clone() {
        Some(request) if request == meta.request_id && fresh => Ok(Some(secret)),
        None if fresh => {
            *secret.shown_in() = Some(meta.request_id.clone());
            session.insert(slot, &secret).await.map_err(store_failed(meta))?;
            Ok(Some(secret))
        }
        _ => {
            session.remove::<T>(slot).await.map_err(store_failed(meta))?;
            Ok(None)
        }
    }
}

async fn forget_shown<T: ShownOnce>(session: &Session, meta: &RequestMeta, slot: &str) -> Result<(), AppError> {
    let Some(mut secret) = session.get::<T>(slot).await.map_err(store_failed(meta))? else {
        return Ok(());
    };
    let stale = berth_platform::now_ms() - secret.created_at() > NEW_TOKEN_TTL_MS;
    if stale || secret.shown_in().as_ref().is_some_and(|request| *request != meta.request_id) {
        session.remove::<T>(slot).await.map_err(store_failed(meta))?;
    }
    Ok(())
}
