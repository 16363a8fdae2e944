use serde::{Deserialize, Serialize};
use server_fn::codec::JsonEncoding;
use server_fn::error::{FromServerFnError, ServerFnErrorErr};
use server_fn::{Bytes, Encodes};
use thiserror::Error;

/// The UI layer's one error type: what a server function can answer, worded for users.
/// Internal causes never get here; they are logged on the server with the request id
/// and only the id travels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Error)]
pub enum AppError {
    /// A rule said no; the text explains why.
    #[error("{0}")]
    Refused(String),
    /// A rule said no about one field of a form (`field`: its argument's name, the last
    /// part of `request[name]`): the form marks that field and says why beside it.
    #[error("{message}")]
    Invalid { field: String, message: String },
    #[error("not found")]
    NotFound,
    #[error("your role does not allow this")]
    Forbidden,
    #[error("sign in to continue")]
    Unauthenticated,
    #[error("the email or password is not right")]
    BadCredentials,
    /// The request's arguments could not be read (a missing field, a number that is not
    /// one): the caller's mistake, answered 400.
    #[error("the request is malformed: {0}")]
    Malformed(String),
    #[error("something went wrong on our side; if it keeps happening, quote request id {request_id}")]
    Internal { request_id: String },
    /// The request did not reach Berth or its answer could not be read.
    #[error("could not talk to Berth ({0}); check your connection and try again")]
    Transport(String),
}

impl FromServerFnError for AppError {
    type Encoder = JsonEncoding;

    /// Errors of server_fn itself. On the server they are about the request's arguments (a
    /// form or body that does not decode into them): the caller's to fix. In the browser
    /// they are about reaching Berth.
    fn from_server_fn_error(value: ServerFnErrorErr) -> AppError {
        match value {
            ServerFnErrorErr::Args(why) => AppError::Malformed(why),
            ServerFnErrorErr::MissingArg(name) => AppError::Malformed(format!("missing argument {name}")),
            #[cfg(feature = "ssr")]
            ServerFnErrorErr::Deserialization(why) => AppError::Malformed(why),
            other => AppError::Transport(other.to_string()),
        }
    }

    /// The error as the browser gets it. server_fn answers every error 500; on the server
    /// this is where a server function's error gets the status that says whose fault it is,
    /// unless the function chose one.
    fn ser(&self) -> Bytes {
        #[cfg(feature = "ssr")]
        self.answer_with_status(false);
        let encoded = <JsonEncoding as Encodes<AppError>>::encode(self);
        encoded
            .or_else(|e| <JsonEncoding as Encodes<AppError>>::encode(&AppError::Transport(e.to_string())))
            .unwrap_or_default()
    }
}

#[cfg(feature = "ssr")]
impl AppError {
    /// Logs `cause` with the request id and answers only the id.
    pub fn internal(request_id: &str, what: &str, cause: impl std::fmt::Display) -> AppError {
        tracing::error!(request_id, error = %cause, "{what}");
        AppError::Internal { request_id: request_id.to_owned() }
    }

    /// Maps a platform error outside a server function (no response to set a status on),
    /// logging internal causes with the request id.
    pub fn from_platform_quiet(error: berth_platform::Error, request_id: &str) -> AppError {
        use berth_platform::Error as E;
        match error {
            E::Refused(refusal) => match refusal.field() {
                Some(field) => AppError::Invalid { field: field.to_owned(), message: refusal.to_string() },
                None => AppError::Refused(refusal.to_string()),
            },
            E::NotFound => AppError::NotFound,
            E::Forbidden => AppError::Forbidden,
            E::Unauthenticated => AppError::Unauthenticated,
            E::BadCredentials => AppError::BadCredentials,
            E::Internal(cause) => AppError::internal(request_id, "internal error", cause),
        }
    }

    /// Maps a platform error at the edge, logging internal causes with the request id, and
    /// gives the answer (a server function's, or a page's whose data it is) its status.
    pub fn from_platform(error: berth_platform::Error, request_id: &str) -> AppError {
        let error = AppError::from_platform_quiet(error, request_id);
        error.answer_with_status(true);
        error
    }

    /// What the error says about whose fault it is: 4xx for the caller's (refusals are
    /// theirs to fix too), 5xx for ours.
    pub fn status(&self) -> http::StatusCode {
        use http::StatusCode;
        match self {
            AppError::Malformed(_) => StatusCode::BAD_REQUEST,
            AppError::Refused(_) | AppError::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            AppError::NotFound => StatusCode::NOT_FOUND,
            AppError::Forbidden => StatusCode::FORBIDDEN,
            AppError::Unauthenticated | AppError::BadCredentials => StatusCode::UNAUTHORIZED,
            AppError::Internal { .. } | AppError::Transport(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Sets the answer's status to this error's (`replace`: even when one was set). A plain
    /// form post (no WASM yet) keeps its redirect back to its page, which carries the error
    /// for the form to show.
    fn answer_with_status(&self, replace: bool) {
        let Some(response) =
            leptos::prelude::use_context::<leptos_axum::ResponseOptions>().filter(|_| !plain_form_post())
        else {
            return;
        };
        let mut answer = response.0.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if replace || answer.status.is_none() {
            answer.status = Some(self.status());
        }
    }
}

/// Whether this request is a plain HTML form post (no WASM yet): its answer is a
/// redirect back to the page, which can carry an error but no return value.
#[cfg(feature = "ssr")]
pub fn plain_form_post() -> bool {
    leptos::prelude::use_context::<http::request::Parts>().is_some_and(|parts| {
        parts.headers.get(http::header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("text/html"))
    })
}
