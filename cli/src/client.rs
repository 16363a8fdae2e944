//! Berth's JSON API over HTTP: a bearer token, JSON in and out, and its RFC 9457 problems
//! turned into a [`Failure`] that says in plain words what went wrong.

use std::fmt;
use std::time::Duration;

use reqwest::StatusCode;
use reqwest::blocking::{Client, RequestBuilder, Response};
use serde_json::Value;

/// Why a command failed; each kind has its own exit status (`code`), so scripts can tell
/// a refused booking from a bad token or a server that cannot be reached.
#[derive(Debug)]
pub enum Failure {
    /// Wrong use of the command line or of its values (clap's own errors exit 2 too).
    Usage(String),
    /// No token, or the server did not accept it (unknown, revoked, expired).
    Unauthenticated(String),
    /// The token's person or the token itself may not do this.
    Forbidden(String),
    NotFound(String),
    /// A rule said no: no capacity, over quota, a bad value (the server's 4xx problems
    /// other than the above).
    Refused(String),
    /// Too many requests; try again later.
    RateLimited(String),
    /// The server could not be reached or answered something that is not Berth's API.
    Unreachable(String),
    /// The server failed (5xx).
    Server(String),
    /// Something on this machine: the config file, running `ssh`.
    Local(String),
}

impl Failure {
    /// The exit status: distinct for each kind.
    pub fn code(&self) -> i32 {
        match self {
            Failure::Local(_) => 1,
            Failure::Usage(_) => 2,
            Failure::Unauthenticated(_) => 3,
            Failure::Forbidden(_) => 4,
            Failure::NotFound(_) => 5,
            Failure::Refused(_) => 6,
            Failure::RateLimited(_) => 7,
            Failure::Unreachable(_) => 8,
            Failure::Server(_) => 9,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Usage(m) => write!(f, "{m}"),
            Failure::Unauthenticated(m) => write!(f, "not signed in: {m}"),
            Failure::Forbidden(m) => write!(f, "not allowed: {m}"),
            Failure::NotFound(m) => write!(f, "not found: {m}"),
            Failure::Refused(m) => write!(f, "refused: {m}"),
            Failure::RateLimited(m) => write!(f, "too many requests: {m}"),
            Failure::Unreachable(m) => write!(f, "cannot reach Berth: {m}"),
            Failure::Server(m) => write!(f, "Berth failed: {m}"),
            Failure::Local(m) => write!(f, "{m}"),
        }
    }
}

/// A connection to one Berth with one token.
pub struct Api {
    base: String,
    token: String,
    http: Client,
}

impl Api {
    pub fn new(base: &str, token: &str) -> Result<Api, Failure> {
        let http = Client::builder()
            .timeout(Duration::from_secs(60))
            .user_agent(concat!("berthctl/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Failure::Local(format!("cannot set up HTTP: {e}")))?;
        Ok(Api { base: base.trim_end_matches('/').to_owned(), token: token.to_owned(), http })
    }

    /// The portal's address, e.g. `https://berth.example.com`.
    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn get(&self, path: &str) -> Result<Value, Failure> {
        self.send(self.http.get(self.url(path)))
    }

    pub fn get_query(&self, path: &str, query: &[(&str, String)]) -> Result<Value, Failure> {
        self.send(self.http.get(self.url(path)).query(query))
    }

    /// Every page of a listing (`items` in each answer), following `next_cursor` to the end:
    /// one answer with all of them.
    pub fn get_all(&self, path: &str, query: &[(&str, String)], items: &str) -> Result<Value, Failure> {
        let mut all = Vec::new();
        let mut cursor = String::new();
        loop {
            let mut asked = query.to_vec();
            asked.extend([("limit", "500".to_owned()), ("cursor", cursor)]);
            let mut page = self.get_query(path, &asked)?;
            if let Some(Value::Array(more)) = page.get_mut(items).map(Value::take) {
                all.extend(more);
            }
            match page.get("next_cursor").and_then(Value::as_str) {
                Some(next) => cursor = next.to_owned(),
                None => return Ok(serde_json::json!({ items: all })),
            }
        }
    }

    pub fn post(&self, path: &str, body: &Value) -> Result<Value, Failure> {
        self.send(self.json(self.http.post(self.url(path)), body))
    }

    pub fn delete(&self, path: &str) -> Result<Value, Failure> {
        self.send(self.http.delete(self.url(path)))
    }

    /// A launch under `key`: retried on a lost connection or a server error with the same
    /// key, so the retry answers the booking the first try made instead of booking again.
    pub fn post_once(&self, path: &str, body: &Value, key: &str) -> Result<Value, Failure> {
        let mut tries = 0;
        loop {
            tries += 1;
            let request = self.json(self.http.post(self.url(path)), body).header("Idempotency-Key", key);
            match self.send(request) {
                Err(Failure::Unreachable(_) | Failure::Server(_)) if tries < 3 => {
                    std::thread::sleep(Duration::from_millis(500 * tries));
                }
                answer => return answer,
            }
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn json(&self, request: RequestBuilder, body: &Value) -> RequestBuilder {
        request.header("content-type", "application/json").body(body.to_string())
    }

    fn send(&self, request: RequestBuilder) -> Result<Value, Failure> {
        let response = request
            .bearer_auth(&self.token)
            .send()
            .map_err(|e| Failure::Unreachable(format!("{} ({})", self.base, plain_cause(&e))))?;
        answer(response)
    }
}

/// The innermost cause of an HTTP error, which names what actually failed ("connection
/// refused"), without reqwest's wrapping.
fn plain_cause(error: &reqwest::Error) -> String {
    let mut cause: &dyn std::error::Error = error;
    while let Some(inner) = cause.source() {
        cause = inner;
    }
    cause.to_string()
}

/// A success's JSON, or the problem the server answered as a [`Failure`].
fn answer(response: Response) -> Result<Value, Failure> {
    let status = response.status();
    let retry_after = response.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let text = response.text().map_err(|e| Failure::Unreachable(format!("the answer broke off ({e})")))?;
    if status.is_success() {
        return serde_json::from_str(&text)
            .map_err(|_| Failure::Unreachable(format!("the answer ({status}) is not JSON: is this Berth's address?")));
    }
    let problem: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let detail = problem["detail"].as_str().map(str::to_owned).unwrap_or_else(|| match status.canonical_reason() {
        Some(reason) => format!("{} {reason}", status.as_u16()),
        None => status.as_u16().to_string(),
    });
    let mut message = detail;
    if let Some(id) = problem["request_id"].as_str().filter(|id| !id.is_empty()) {
        message.push_str(&format!(" (request id {id})"));
    }
    Err(match status {
        StatusCode::UNAUTHORIZED => Failure::Unauthenticated(format!(
            "{message}; the token may be wrong, revoked or expired: make a new one on the account page \
             and run `berthctl login`"
        )),
        StatusCode::FORBIDDEN => Failure::Forbidden(message),
        StatusCode::NOT_FOUND => Failure::NotFound(message),
        StatusCode::TOO_MANY_REQUESTS => {
            let wait = retry_after.map(|s| format!("; try again in {s} s")).unwrap_or_default();
            Failure::RateLimited(format!("{message}{wait}"))
        }
        s if s.is_server_error() => Failure::Server(message),
        _ => Failure::Refused(message),
    })
}
