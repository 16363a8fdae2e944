//! The append-only audit log (the table refuses updates and deletes).

use sqlx::SqliteConnection;

use crate::{Error, RequestMeta, now_ms};

pub enum Outcome {
    Success,
    Failure,
}

impl Outcome {
    fn as_str(&self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Failure => "failure",
        }
    }
}

/// What happened, to what, and how it went.
pub struct Event<'a> {
    pub action: &'a str,
    pub target: Option<&'a str>,
    pub outcome: Outcome,
    /// Never a secret.
    pub detail: Option<&'a str>,
}

/// Writes one audit row on the caller's connection, so it commits (or not) together with
/// the change it records.
pub async fn record(
    conn: &mut SqliteConnection,
    actor_id: Option<i64>,
    meta: &RequestMeta,
    event: Event<'_>,
) -> Result<(), Error> {
    sqlx::query(
        "INSERT INTO audit_events (at, actor_id, action, target, outcome, source, request_id, detail)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(now_ms())
    .bind(actor_id)
    .bind(event.action)
    .bind(event.target)
    .bind(event.outcome.as_str())
    .bind(meta.source.as_deref())
    .bind(&meta.request_id)
    .bind(event.detail)
    .execute(conn)
    .await?;
    Ok(())
}
