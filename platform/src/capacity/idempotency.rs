//! `Idempotency-Key` on launches: a client that did not hear the answer (a timeout, a
//! dropped connection) sends the same request with the same key again and gets the booking
//! the first one made, never a second one.
//!
//! A key is a person's (`user_id`), kept for [`KEY_HOURS`] with the SHA-256 of the request
//! it came with and the environment it booked. It is looked up and written under the writer
//! turn, inside the launch's batch (`group_commit::decide_member` and `decide_launch`): two
//! requests with one key, even at the same moment, are decided one after the other, and
//! the second finds the first's row whether it was committed earlier or decided just before
//! it in the same transaction. The row is written in the launch's savepoint, so a refused
//! launch keeps no key (the retry is decided afresh) and a booking never lacks its key. The
//! table's primary key refuses a second row for one key besides.

use sqlx::SqliteConnection;

use crate::Error;

/// How long a key is remembered: a retry comes within minutes; a day covers a script
/// re-run the next morning by mistake.
pub const KEY_HOURS: i64 = 24;

/// A launch's `Idempotency-Key`, with the fingerprint of the request that came with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IdempotencyKey {
    pub key: String,
    pub request_sha256: String,
}

/// What a person's key says about a launch asked with it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum KeyUse {
    /// Not used within [`KEY_HOURS`]: book.
    New,
    /// Used for this same request: it booked this environment.
    Booked(String),
    /// Used for another request.
    OtherRequest,
}

/// What `user_id`'s `key` was used for. Forgets expired keys first (everyone's: the table
/// stays as small as a day's keyed launches).
pub(crate) async fn key_use(
    tx: &mut SqliteConnection,
    user_id: i64,
    key: &IdempotencyKey,
    now: i64,
) -> Result<KeyUse, Error> {
    sqlx::query("DELETE FROM launch_idempotency_keys WHERE expires_at <= ?").bind(now).execute(&mut *tx).await?;
    let used: Option<(String, String)> = sqlx::query_as(
        "SELECT request_sha256, environment_id FROM launch_idempotency_keys
         WHERE user_id = ? AND idempotency_key = ?",
    )
    .bind(user_id)
    .bind(&key.key)
    .fetch_optional(&mut *tx)
    .await?;
    Ok(match used {
        None => KeyUse::New,
        Some((sha256, environment_id)) if sha256 == key.request_sha256 => KeyUse::Booked(environment_id),
        Some(_) => KeyUse::OtherRequest,
    })
}

/// Remembers that `user_id`'s `key` booked `environment_id`, in the launch's savepoint.
pub(crate) async fn remember(
    tx: &mut SqliteConnection,
    user_id: i64,
    key: &IdempotencyKey,
    environment_id: &str,
    now: i64,
) -> Result<(), Error> {
    sqlx::query(
        "INSERT INTO launch_idempotency_keys
             (user_id, idempotency_key, request_sha256, environment_id, created_at, expires_at)
         VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(user_id)
    .bind(&key.key)
    .bind(&key.request_sha256)
    .bind(environment_id)
    .bind(now)
    .bind(now + KEY_HOURS * berth_domain::booking::HOUR_MS)
    .execute(&mut *tx)
    .await?;
    Ok(())
}
