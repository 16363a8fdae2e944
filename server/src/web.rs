//! The few browser routes that are not Leptos pages: single sign-on redirects, the audit log
//! and usage downloads, and opening a notebook on its own origin. Each is one platform call; the
//! session rules are the app's.

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use berth_app::error::AppError;
use berth_app::serverfns::after_sign_in;
use berth_domain::{Refusal, SignInProblem};
use berth_platform::Caller;
use berth_platform::audit::{AuditFilter, to_csv};
use berth_platform::identity::oidc::Callback;
use berth_platform::identity::sso::CALLBACK_PATH;
use http::request::Parts;
use http::{StatusCode, header};
use serde::Deserialize;
use tower_sessions::Session;

use crate::api::{UsageQuery, usage_json, usage_report};
use crate::served::{Routes, get};
use crate::state::{AppState, escape_html, request_meta};
use berth_platform::capacity::metering::UsageCut;

pub fn routes() -> Routes<AppState> {
    Routes::new()
        .route(berth_app::SSO_FIND_PATH, get(find_sign_in))
        .route("/auth/oidc/{slug}/start", get(start_sign_in))
        .route(CALLBACK_PATH, get(finish_sign_in))
        .route("/audit.csv", get(audit_csv))
        .route("/usage.csv", get(usage_csv))
        .route("/usage/statements/{id}/csv", get(statement_csv))
        .route("/usage.json", get(usage_download))
        .route(OPEN_ROUTE, get(open_environment))
        .route("/environments/{id}/log.txt", get(job_log))
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
    // Before a ticket is made: where it leads must be a path on the environment's origin.
    let next = match berth_domain::redirect::next_or(q.next.as_deref(), "/") {
        Ok(next) => next,
        Err(refusal) => return (StatusCode::BAD_REQUEST, refusal.to_string()).into_response(),
    };
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

/// Back to the sign-in page, which shows the problem's own words (never the URL's); an
/// internal failure carries the request id the log has it under.
fn to_login(problem: SignInProblem, request_id: Option<&str>) -> Response {
    let mut url = format!("/login?sso_error={}", problem.code());
    if let Some(id) = request_id {
        url = format!("{url}&request_id={}", berth_app::url_encode(id));
    }
    Redirect::to(&url).into_response()
}

/// The sign-in page's code for a refused or failed single sign-on; internal causes are
/// logged with the request id.
fn sign_in_problem(error: berth_platform::Error, request_id: &str) -> (SignInProblem, Option<&str>) {
    match error {
        berth_platform::Error::Refused(Refusal::SignInFailed(problem)) => (problem, None),
        berth_platform::Error::Refused(Refusal::TooManyAttempts { .. }) => (SignInProblem::TooMany, None),
        berth_platform::Error::NotFound => (SignInProblem::UnknownProvider, None),
        other => {
            tracing::error!(request_id, error = %other, "single sign-on failed");
            (SignInProblem::Internal, Some(request_id))
        }
    }
}

fn session_failed(error: AppError, request_id: &str) -> Response {
    tracing::error!(request_id, error = %error, "single sign-on: the session could not be kept");
    to_login(SignInProblem::Internal, Some(request_id))
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct FindQuery {
    hint: String,
    next: Option<String>,
}

/// The sign-in page's "Continue with single sign-on", `?hint=<work email or
/// organization>&next=<path>`: on to the start of the provider the hint names (a plain GET
/// form, so it works before the page's script has loaded).
async fn find_sign_in(State(state): State<AppState>, Query(q): Query<FindQuery>, parts: Parts) -> Response {
    let meta = request_meta(&parts);
    let Ok(next) = after_sign_in(q.next.as_deref()) else { return to_login(SignInProblem::NotLocalPath, None) };
    match state.platform.find_sign_in(&q.hint, &meta).await {
        Ok(option) => {
            let slug = berth_app::url_encode(&option.slug);
            let start = format!("/auth/oidc/{slug}/start?next={}", berth_app::url_encode(&next));
            on_to(&start, &option.display_name)
        }
        Err(e) => {
            let (problem, request_id) = sign_in_problem(e, &meta.request_id);
            to_login(problem, request_id)
        }
    }
}

/// A page that goes on to `start` (same origin) at once. Not a redirect: the sign-in form's
/// navigation may not leave Berth (CSP `form-action 'self'` holds for its redirects too), and
/// the start goes on to the provider; a fresh navigation may.
fn on_to(start: &str, provider: &str) -> Response {
    let (start, provider) = (escape_html(start), escape_html(provider));
    let page = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"0;url={start}\"><title>Signing in</title></head>\
         <body><p>On to <a href=\"{start}\">{provider}</a>…</p></body></html>"
    );
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], page).into_response()
}

async fn start_sign_in(
    State(state): State<AppState>,
    Path(slug): Path<String>,
    Query(q): Query<NextQuery>,
    session: Session,
    parts: Parts,
) -> Response {
    let meta = request_meta(&parts);
    let Ok(next) = after_sign_in(q.next.as_deref()) else { return to_login(SignInProblem::NotLocalPath, None) };
    let binding = match berth_app::session::new_sso_binding(&session, &meta).await {
        Ok(binding) => binding,
        Err(e) => return session_failed(e, &meta.request_id),
    };
    match state.platform.begin_sign_in(&slug, &next, &binding, &meta).await {
        Ok(url) => Redirect::to(&url).into_response(),
        Err(berth_platform::Error::NotFound) => to_login(SignInProblem::UnknownProvider, None),
        Err(e @ berth_platform::Error::Refused(_)) => {
            let (problem, request_id) = sign_in_problem(e, &meta.request_id);
            to_login(problem, request_id)
        }
        Err(e) => {
            tracing::error!(request_id = %meta.request_id, error = %e, provider = %slug, "could not start single sign-on");
            to_login(SignInProblem::Unreachable, Some(&meta.request_id))
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
        return to_login(SignInProblem::Declined, None);
    }
    let binding = match berth_app::session::sso_binding(&session, &meta).await {
        Ok(binding) => binding,
        Err(e) => return session_failed(e, &meta.request_id),
    };
    let callback = Callback { code: q.code, state: q.state, iss: q.iss };
    match state.platform.finish_sign_in(&callback, binding.as_deref(), &meta).await {
        Ok((user, next)) => match berth_app::session::start(&session, &meta, user.id).await {
            // `next` was checked when the sign-in began; checked again, as it goes into a header.
            Ok(()) => {
                Redirect::to(&after_sign_in(Some(&next)).unwrap_or_else(|_| "/environments".into())).into_response()
            }
            Err(e) => session_failed(e, &meta.request_id),
        },
        Err(e) => {
            let (problem, request_id) = sign_in_problem(e, &meta.request_id);
            to_login(problem, request_id)
        }
    }
}

/// The usage page's report as CSV, for the browser session that shows it.
/// How the usage page's CSV cuts the month: `month` (empty), `week` or `day`.
#[derive(Debug, Default, serde::Deserialize)]
struct CutQuery {
    #[serde(default)]
    per: String,
}

async fn usage_csv(
    state: State<AppState>,
    query: Query<UsageQuery>,
    Query(cut): Query<CutQuery>,
    session: Session,
    parts: Parts,
) -> Response {
    usage_file(state, query, session, parts, Some(&cut.per)).await
}

/// The usage page's report as JSON (the API's form), for the browser session that shows it.
async fn usage_download(state: State<AppState>, query: Query<UsageQuery>, session: Session, parts: Parts) -> Response {
    usage_file(state, query, session, parts, None).await
}

async fn usage_file(
    State(state): State<AppState>,
    Query(query): Query<UsageQuery>,
    session: Session,
    parts: Parts,
    // `Some`: CSV cut so; `None`: JSON.
    csv_cut: Option<&str>,
) -> Response {
    let caller = match download_caller(&state, &session, &parts).await {
        Ok(caller) => caller,
        Err(answer) => return answer,
    };
    let cut = match csv_cut.map(UsageCut::parse).transpose() {
        Ok(cut) => cut,
        Err(e) => return download_error(e, &caller.meta.request_id),
    };
    match usage_report(&state.platform, &caller, &query).await {
        Ok(report) => {
            let month = report.month.key();
            match cut {
                Some(UsageCut::Month) => {
                    download("text/csv; charset=utf-8", &format!("berth-usage-{month}.csv"), report.to_csv())
                }
                Some(cut) => {
                    let name =
                        format!("berth-usage-{month}-by-{}.csv", if cut == UsageCut::Week { "week" } else { "day" });
                    download("text/csv; charset=utf-8", &name, report.to_csv_cut(cut))
                }
                None => {
                    download("application/json", &format!("berth-usage-{month}.json"), usage_json(&report).to_string())
                }
            }
        }
        Err(e) => download_error(e, &caller.meta.request_id),
    }
}

/// A closed monthly statement as CSV, for whoever may read the tenant's statements.
async fn statement_csv(State(state): State<AppState>, Path(id): Path<i64>, session: Session, parts: Parts) -> Response {
    let caller = match download_caller(&state, &session, &parts).await {
        Ok(caller) => caller,
        Err(answer) => return answer,
    };
    match state.platform.statement(&caller, id).await {
        Ok(statement) => {
            let name = format!("berth-statement-{}-{id}.csv", statement.month.key());
            download("text/csv; charset=utf-8", &name, statement.to_csv())
        }
        Err(e) => download_error(e, &caller.meta.request_id),
    }
}

/// The audit log as CSV with the page's filters, for the signed-in user's reach.
async fn audit_csv(
    State(state): State<AppState>,
    Query(filter): Query<AuditFilter>,
    session: Session,
    parts: Parts,
) -> Response {
    let caller = match download_caller(&state, &session, &parts).await {
        Ok(caller) => caller,
        Err(answer) => return answer,
    };
    match state.platform.audit_log(&caller, &filter, 100_000).await {
        Ok(rows) => download("text/csv; charset=utf-8", "berth-audit.csv", to_csv(&rows)),
        Err(e) => download_error(e, &caller.meta.request_id),
    }
}

/// A training job's log as Berth keeps it (its last lines, bounded: `node_plan::kept_log`),
/// for whoever may see the job.
async fn job_log(State(state): State<AppState>, Path(id): Path<String>, session: Session, parts: Parts) -> Response {
    let caller = match download_caller(&state, &session, &parts).await {
        Ok(caller) => caller,
        Err(answer) => return answer,
    };
    match state.platform.job_log_text(&caller, &id).await {
        // The id is a UUID the platform found; anything else was answered not found.
        Ok(text) => download("text/plain; charset=utf-8", &format!("berth-job-{id}.log"), text),
        Err(e) => download_error(e, &caller.meta.request_id),
    }
}

/// Who asks for a download: the browser session's person, or the answer to give instead.
async fn download_caller(state: &AppState, session: &Session, parts: &Parts) -> Result<Caller, Response> {
    let meta = request_meta(parts);
    match berth_app::session::signed_in_user(session, &state.platform, &meta).await {
        Ok(Some(user)) => Ok(user.caller(meta)),
        Ok(None) => Err((StatusCode::UNAUTHORIZED, "sign in to continue").into_response()),
        Err(e) => Err((StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()),
    }
}

/// A file the browser saves as `name` (a plain ASCII name Berth made).
fn download(kind: &'static str, name: &str, body: String) -> Response {
    let disposition = http::HeaderValue::from_str(&format!("attachment; filename=\"{name}\""))
        .unwrap_or(http::HeaderValue::from_static("attachment"));
    ([(header::CONTENT_TYPE, http::HeaderValue::from_static(kind)), (header::CONTENT_DISPOSITION, disposition)], body)
        .into_response()
}

/// Why a download was not given, in plain words; an internal cause stays in the log.
fn download_error(e: berth_platform::Error, request_id: &str) -> Response {
    let status = match e {
        berth_platform::Error::Forbidden => StatusCode::FORBIDDEN,
        berth_platform::Error::NotFound => StatusCode::NOT_FOUND,
        berth_platform::Error::Refused(_) => StatusCode::UNPROCESSABLE_ENTITY,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (status, AppError::from_platform_quiet(e, request_id).to_string()).into_response()
}
