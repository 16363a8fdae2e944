//! Opening the SQLite database the way Berth needs it, and applying migrations.

use std::str::FromStr;
use std::time::Duration;

use std::sync::Arc;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{SqliteConnection, SqlitePool};
use tokio::sync::{Mutex, OwnedMutexGuard};

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

/// A write transaction that holds the process's writer turn.
///
/// Writers queue for their turn in order on an async mutex before `BEGIN IMMEDIATE`:
/// SQLite's own busy handler polls rather than queues, so under many concurrent bookings
/// an unlucky writer could wait past the busy timeout and fail with "database is locked".
/// The busy timeout still covers other processes (a `berth migrate` running beside).
pub struct WriteTx {
    tx: sqlx::Transaction<'static, sqlx::Sqlite>,
    _turn: OwnedMutexGuard<()>,
}

impl WriteTx {
    pub async fn commit(self) -> Result<(), Error> {
        self.commit_and(|| {}).await
    }

    /// Commits, then runs `after` while still holding the writer turn: for in-memory
    /// copies of the database that must change in the same order as the commits.
    pub async fn commit_and(self, after: impl FnOnce()) -> Result<(), Error> {
        self.tx.commit().await?;
        after();
        Ok(())
    }
}

impl std::ops::Deref for WriteTx {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        &self.tx
    }
}

impl std::ops::DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        &mut self.tx
    }
}

/// Waits for the writer turn, then starts a transaction that takes SQLite's write lock at
/// once: a plain `BEGIN` that later writes can fail with a busy snapshot error that no
/// timeout cures.
pub(crate) async fn begin_write(pool: &SqlitePool, writer: &Arc<Mutex<()>>) -> Result<WriteTx, Error> {
    let turn = writer.clone().lock_owned().await;
    let tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    Ok(WriteTx { tx, _turn: turn })
}

/// Whether the database answers; for `/readyz`.
pub async fn ping(pool: &SqlitePool) -> Result<(), Error> {
    sqlx::query("SELECT 1").execute(pool).await?;
    Ok(())
}
