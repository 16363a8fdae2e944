use berth_domain::Refusal;
use thiserror::Error;

/// The platform layer's one error type.
///
/// `Refused` and `NotFound` carry messages fit for users; `Internal` carries the cause
/// for the log only, and the edge shows a generic message with the request id.
#[derive(Debug, Error)]
pub enum Error {
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// Also what a caller gets for someone else's object, so ids reveal nothing.
    #[error("not found")]
    NotFound,
    /// The caller's role does not include the action. Only given where the caller may
    /// see the object anyway; otherwise it is `NotFound`.
    #[error("your role does not allow this")]
    Forbidden,
    #[error("sign in to continue")]
    Unauthenticated,
    /// Deliberately vague: it must not tell which of email or password was wrong.
    #[error("the email or password is not right")]
    BadCredentials,
    #[error("internal error: {0}")]
    Internal(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl Error {
    pub fn internal(cause: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Error {
        Error::Internal(cause.into())
    }
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Error {
        Error::Internal(Box::new(e))
    }
}

impl From<sqlx::migrate::MigrateError> for Error {
    fn from(e: sqlx::migrate::MigrateError) -> Error {
        Error::Internal(Box::new(e))
    }
}
