//! The few browser routes that are not Leptos pages: single sign-on redirects and the audit
//! log download. Each is one platform call; the session rules are the app's.

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use berth_app::error::AppError;
use berth_app::serverfns::safe_next;
use berth_platform::audit::{AuditFilter, to_csv};
use berth_platform::oidc::Callback;
use berth_platform::sso::CALLBACK_PATH;
use http::request::Parts;
use http::{StatusCode, header};
use serde::Deserialize;
use tower_sessions::Session;

use crate::api::request_meta;
use crate::http::AppState;

pub fn routes() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/auth/oidc/{slug}/start", get(start_sign_in))
        .route(CALLBACK_PATH, get(finish_sign_in))
        .route("/audit.csv", get(audit_csv))
}

/// Back to the sign-in page with a message it shows.
fn to_login(message: &str) -> Response {
    let query = berth_app::url_encode(message);
    Redirect::to(&format!("/login?sso_error={query}")).into_response()
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StartQuery {
    next: Option<String>,
}

async fn start_sign_in(
    State(state): State<AppState>,
    Path(slug): Path<String>,
    Query(q): Query<StartQuery>,
    session: Session,
    parts: Parts,
) -> Response {
    let meta = request_meta(&parts);
    let binding = match berth_app::session::new_sso_binding(&session, &meta).await {
        Ok(binding) => binding,
        Err(e) => return to_login(&e.to_string()),
    };
    match state.platform.begin_sign_in(&slug, &safe_next(q.next.as_deref()), &binding).await {
        Ok(url) => Redirect::to(&url).into_response(),
        Err(berth_platform::Error::NotFound) => to_login("there is no such sign-in option"),
        Err(e) => {
            tracing::error!(request_id = %meta.request_id, error = %e, provider = %slug, "could not start single sign-on");
            to_login(&format!(
                "could not reach your identity provider; try again later (request id {})",
                meta.request_id
            ))
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct CallbackQuery {
    code: String,
    state: String,
    iss: Option<String>,
    error: Option<String>,
}

async fn finish_sign_in(
    State(state): State<AppState>,
    Query(q): Query<CallbackQuery>,
    session: Session,
    parts: Parts,
) -> Response {
    let meta = request_meta(&parts);
    if let Some(error) = q.error {
        tracing::info!(request_id = %meta.request_id, error = %error, "identity provider returned an error");
        return to_login("your identity provider did not sign you in");
    }
    let binding = match berth_app::session::sso_binding(&session, &meta).await {
        Ok(binding) => binding,
        Err(e) => return to_login(&e.to_string()),
    };
    let callback = Callback { code: q.code, state: q.state, iss: q.iss };
    match state.platform.finish_sign_in(&callback, binding.as_deref(), &meta).await {
        Ok((user, next)) => match berth_app::session::start(&session, &meta, user.id).await {
            Ok(()) => Redirect::to(&next).into_response(),
            Err(e) => to_login(&e.to_string()),
        },
        Err(e) => to_login(&AppError::from_platform_quiet(e, &meta.request_id).to_string()),
    }
}

/// The audit log as CSV with the page's filters, for the signed-in user's reach.
async fn audit_csv(
    State(state): State<AppState>,
    Query(filter): Query<AuditFilter>,
    session: Session,
    parts: Parts,
) -> Response {
    let meta = request_meta(&parts);
    let user = match berth_app::session::signed_in_user(&session, &state.platform, &meta).await {
        Ok(Some(user)) => user,
        Ok(None) => return (StatusCode::UNAUTHORIZED, "sign in to continue").into_response(),
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    let caller = user.caller(meta.clone());
    match state.platform.audit_log(&caller, &filter, 100_000).await {
        Ok(rows) => (
            [
                (header::CONTENT_TYPE, "text/csv; charset=utf-8"),
                (header::CONTENT_DISPOSITION, "attachment; filename=\"berth-audit.csv\""),
            ],
            to_csv(&rows),
        )
            .into_response(),
        Err(e) => {
            let status = match e {
                berth_platform::Error::Forbidden => StatusCode::FORBIDDEN,
                berth_platform::Error::NotFound => StatusCode::NOT_FOUND,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            (status, AppError::from_platform_quiet(e, &meta.request_id).to_string()).into_response()
        }
    }
}
