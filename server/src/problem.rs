//! Errors as RFC 9457 problem details (`application/problem+json`): what every `/api/v1`
//! error and every rate-limited answer looks like. `type` names the kind of problem
//! (`about:blank` when the status says it all), `title` is the same for every problem of
//! that type, `detail` says what happened to this request, and `request_id` finds its log
//! lines.

use axum::Json;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde::Serialize;

/// The media type of a problem (RFC 9457 section 3).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// One problem, as sent.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// `about:blank` (the status says it all), `urn:berth:problem:refused` (the platform
    /// refused: the detail says why), `urn:berth:problem:invalid-request` (the request could
    /// not be read) or `urn:berth:problem:rate-limited`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The same for every problem of its type.
    pub title: &'static str,
    /// The HTTP status code.
    #[serde(serialize_with = "status_code")]
    #[schema(value_type = u16)]
    pub status: StatusCode,
    /// What happened to this request.
    pub detail: String,
    /// Finds the request's log lines: quote it when reporting a problem.
    pub request_id: String,
}

fn status_code<S: serde::Serializer>(status: &StatusCode, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_u16(status.as_u16())
}

impl Problem {
    /// A problem the status code describes on its own (`type` is `about:blank`, so the
    /// title is the status's reason phrase).
    pub fn status(status: StatusCode, detail: impl Into<String>, request_id: &str) -> Problem {
        Problem {
            kind: "about:blank",
            title: status.canonical_reason().unwrap_or("Error"),
            status,
            detail: detail.into(),
            request_id: request_id.to_owned(),
        }
    }

    /// A problem of one of Berth's own kinds.
    pub fn of(kind: ProblemKind, detail: impl Into<String>, request_id: &str) -> Problem {
        Problem {
            kind: kind.uri(),
            title: kind.title(),
            status: kind.status(),
            detail: detail.into(),
            request_id: request_id.to_owned(),
        }
    }
}

/// Berth's kinds of problem beyond what a status code says. Their URIs are names, not
/// pages (RFC 9457 section 3.1.1 allows a URI that is not meant to be fetched).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemKind {
    /// The platform refused the request for a reason the user can act on (no capacity, a
    /// quota, a bad value): the detail is the reason.
    Refused,
    /// Too many requests: `Retry-After` says when to try again.
    RateLimited,
    /// The request could not be read (a body that is not the JSON expected, a bad path or
    /// query parameter).
    InvalidRequest,
}

impl ProblemKind {
    pub fn uri(self) -> &'static str {
        match self {
            ProblemKind::Refused => "urn:berth:problem:refused",
            ProblemKind::RateLimited => "urn:berth:problem:rate-limited",
            ProblemKind::InvalidRequest => "urn:berth:problem:invalid-request",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            ProblemKind::Refused => "The request was refused",
            ProblemKind::RateLimited => "Too many requests",
            ProblemKind::InvalidRequest => "The request could not be read",
        }
    }

    pub fn status(self) -> StatusCode {
        match self {
            ProblemKind::Refused => StatusCode::UNPROCESSABLE_ENTITY,
            ProblemKind::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            ProblemKind::InvalidRequest => StatusCode::BAD_REQUEST,
        }
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = self.status;
        let mut response = (status, Json(self)).into_response();
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        response
    }
}

/// The request id the request-id layer gave this request (empty if it has none).
pub fn request_id_of(headers: &http::HeaderMap) -> &str {
    headers.get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("")
}
