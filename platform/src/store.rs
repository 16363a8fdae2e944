//! Opening the SQLite database the way Berth needs it, and applying migrations.

use std::str::FromStr;
use std::time::Duration;

use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use crate::Error;

/// The migrations in `migrations/`, compiled into the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// Opens (creating if needed) the database at `url` (`sqlite://path` or `sqlite::memory:`)
/// with WAL, a busy timeout and foreign keys on.
pub async fn connect(url: &str) -> Result<SqlitePool, Error> {
    open(SqliteConnectOptions::from_str(url)?).await
}

/// Opens the database `options` name with the settings Berth runs with; tests use it to
/// get the same database behaviour as production.
pub async fn open(options: SqliteConnectOptions) -> Result<SqlitePool, Error> {
    let options = options
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(10))
        .foreign_keys(true);
    if let Some(dir) = options.get_filename().parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(Error::internal)?;
    }
    let pool = SqlitePoolOptions::new().max_connections(8).connect_with(options).await?;
    Ok(pool)
}

pub async fn migrate(pool: &SqlitePool) -> Result<(), Error> {
    MIGRATOR.run(pool).await?;
    Ok(())
}

/// Serialises writers from the start: a plain `BEGIN` that later writes can fail with a
/// busy snapshot error that no timeout cures.
pub async fn begin_immediate(pool: &SqlitePool) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>, Error> {
    Ok(pool.begin_with("BEGIN IMMEDIATE").await?)
}

/// Whether the database answers; for `/readyz`.
pub async fn ping(pool: &SqlitePool) -> Result<(), Error> {
    sqlx::query("SELECT 1").execute(pool).await?;
    Ok(())
}
