//! The few browser routes that are not Leptos pages: single sign-on redirects, the audit log
//! download, and opening a notebook on its own origin. Each is one platform call; the
//! session rules are the app's.

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
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
use crate::served::{Routes, get};

pub fn routes() -> Routes {
    Routes::new()
        .route("/auth/oidc/{slug}/start", get(start_sign_in))
        .route(CALLBACK_PATH, get(finish_sign_in))
        .route("/audit.csv", get(audit_csv))
        .route(OPEN_ROUTE, get(open_environment))
        // Links from when notebooks were served on Berth's own origin.
        .route("/env/{id}", get(old_link))
        .route("/env/{id}/{*rest}", get(old_link))
}

/// Opens a notebook on its own origin: `/environments/<id>/open?next=<path there>`.
pub const OPEN_ROUTE: &str = "/environments/{id}/open";

/// `?next=<path>`: where to go once signed in (or, for a notebook, on its own origin).
#[derive(Deserialize, Default)]
#[serde(default)]
struct NextQuery {
    next: Option<String>,
}

/// "Open JupyterLab": for its owner or their tenant admin (audited, as is a refusal), a
/// single-use ticket carried to the notebook's own origin, which makes it a session there.
/// Berth's session cookie stays on this origin.
async fn open_environment(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<NextQuery>,
    session: Session,
    parts: Parts,
) -> Response {
    let meta = request_meta(&parts);
    let user = match berth_app::session::signed_in_user(&session, &state.platform, &meta).await {
        Ok(Some(user)) => user,
        Ok(None) if crate::proxy::is_page_load(&parts) => {
            let here = parts.uri.path_and_query().map_or(parts.uri.path(), |p| p.as_str());
            return Redirect::to(&format!("/login?next={}", berth_app::url_encode(here))).into_response();
        }
        Ok(None) => return (StatusCode::UNAUTHORIZED, "sign in to continue").into_response(),
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    match state.platform.open_notebook(&user.caller(meta.clone()), &id).await {
        Ok(ticket) => {
            let next = berth_app::serverfns::safe_next_or(q.next.as_deref(), "/");
            let url = format!(
                "{}{}?ticket={ticket}&next={}",
                state.platform.environment_origin(&id),
                crate::proxy::AUTH_PATH,
                berth_app::url_encode(&next)
            );
            let mut response = Redirect::to(&url).into_response();
            crate::proxy::keep_ticket_private(&mut response);
            response
        }
        Err(e) => crate::proxy::refused(e, &parts, &meta),
    }
}

/// `/env/<id>/<path>` on Berth's origin, from before environments had origins of their own:
/// on to the open route, which goes to `<path>` on the environment's origin.
async fn old_link(Path(params): Path<Vec<(String, String)>>, parts: Parts) -> Response {
    let id = params.iter().find(|(k, _)| k == "id").map(|(_, v)| v.as_str()).unwrap_or_default();
    let rest = parts.uri.path().strip_prefix(&format!("/env/{id}")).unwrap_or_default();
    let mut next = if rest.is_empty() { "/".to_owned() } else { rest.to_owned() };
    if let Some(query) = parts.uri.query() {
        next = format!("{next}?{query}");
    }
    let id = berth_app::url_encode(id);
    Redirect::to(&format!("/environments/{id}/open?next={}", berth_app::url_encode(&next))).into_response()
}

/// Back to the sign-in page with a message it shows.
fn to_login(message: &str) -> Response {
    let query = berth_app::url_encode(message);
    Redirect::to(&format!("/login?sso_error={query}")).into_response()
}

async fn start_sign_in(
    State(state): State<AppState>,
    Path(slug): Path<String>,
    Query(q): Query<NextQuery>,
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
