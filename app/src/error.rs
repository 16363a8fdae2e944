use serde::{Deserialize, Serialize};
use server_fn::codec::JsonEncoding;
use server_fn::error::{FromServerFnError, ServerFnErrorErr};
use thiserror::Error;

/// The UI layer's one error type: what a server function can answer, worded for users.
/// Internal causes never get here; they are logged on the server with the request id
/// and only the id travels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Error)]
pub enum AppError {
    /// A rule said no; the text explains why.
    #[error("{0}")]
    Refused(String),
    #[error("not found")]
    NotFound,
    #[error("your role does not allow this")]
    Forbidden,
    #[error("sign in to continue")]
    Unauthenticated,
    #[error("the email or password is not right")]
    BadCredentials,
    #[error("something went wrong on our side; if it keeps happening, quote request id {request_id}")]
    Internal { request_id: String },
    /// The request did not reach Berth or its answer could not be read.
    #[error("could not talk to Berth ({0}); check your connection and try again")]
    Transport(String),
}

impl FromServerFnError for AppError {
    type Encoder = JsonEncoding;

    fn from_server_fn_error(value: ServerFnErrorErr) -> AppError {
        AppError::Transport(value.to_string())
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
            E::Refused(refusal) => AppError::Refused(refusal.to_string()),
            E::NotFound => AppError::NotFound,
            E::Forbidden => AppError::Forbidden,
            E::Unauthenticated => AppError::Unauthenticated,
            E::BadCredentials => AppError::BadCredentials,
            E::Internal(cause) => AppError::internal(request_id, "internal error", cause),
        }
    }

    /// Maps a platform error at the edge, logging internal causes with the request id.
    pub fn from_platform(error: berth_platform::Error, request_id: &str) -> AppError {
        use berth_platform::Error as E;
        use http::StatusCode;
        // Refusals are the caller's to fix: answer 4xx so clients and logs can tell them
        // from our own failures.
        let status = match &error {
            E::Refused(_) => StatusCode::UNPROCESSABLE_ENTITY,
            E::NotFound => StatusCode::NOT_FOUND,
            E::Forbidden => StatusCode::FORBIDDEN,
            E::Unauthenticated | E::BadCredentials => StatusCode::UNAUTHORIZED,
            E::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        // A plain form post (no WASM yet) must keep the redirect back to its page, which
        // carries the error for the form to show.
        if let Some(response) = leptos::prelude::use_context::<leptos_axum::ResponseOptions>()
            .filter(|_| !crate::serverfns::ssr::plain_form_post())
        {
            response.set_status(status);
        }
        AppError::from_platform_quiet(error, request_id)
    }
}
