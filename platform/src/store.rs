//! Opening the SQLite database the way Berth needs it, applying migrations, and the write
//! transaction every writer goes through ([`WriteTx`]).
//!
//! # Writes dropped half-way
//!
//! Any write may be dropped at any await: the reconciler's step timeout, shutdown, an HTTP
//! handler whose client went away. sqlx 0.8's own transactions were not safe for that:
//!
//! - `begin_with("BEGIN IMMEDIATE")` runs the BEGIN on the connection's thread, then awaits
//!   a check that the connection is in a transaction. Dropped at that await, no
//!   `Transaction` exists yet to roll back: the connection went back to the pool holding
//!   SQLite's write lock for good. Every other writer then failed with "database is
//!   locked" after the busy timeout, and the one handed that connection with
//!   "InvalidSavePointStatement".
//! - A dropped `Transaction` only queues its ROLLBACK behind whatever the connection's
//!   thread is still running, while the writer turn was handed on at once: the next writer
//!   met the lock still held and fell back on the busy handler.
//! - A COMMIT dropped in flight can land without `commit_and`'s `after` running, leaving
//!   the in-memory copies (booking book, fleet) behind the tables.
//!
//! So [`WriteTx`] runs BEGIN IMMEDIATE, COMMIT and ROLLBACK itself on a pool connection it
//! owns, and knows at every await whether that connection may be in a transaction.
//! Dropped while it may, it hands the connection and the writer turn to a spawned task
//! that rolls back, behind whatever the dropped write left running, and only then lets the
//! next writer in. The connection returns to the pool only when that ROLLBACK succeeded
//! (it is then outside any transaction); otherwise (BEGIN never ran, the COMMIT landed, or
//! the connection broke) it is closed, which ends any transaction it had. Dropped during
//! COMMIT, whose outcome it cannot know, it forgets the in-memory copies at once; loading
//! them again takes the turn, so they are read from the tables as that COMMIT left them.
//!
//! Running each write in a task of its own would also finish it, but every caller would
//! have to remember to, and a write would outlive the request or step that asked for it.

use std::str::FromStr;
use std::time::Duration;

use std::sync::Arc;

use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteArguments, SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Arguments, Connection, Sqlite, SqliteConnection, SqlitePool};
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
    // No ping before handing out a connection (sqlx's default): a local SQLite file does not
    // drop connections, and the ping is a round trip to the connection's thread on every
    // query a page makes.
    let pool = SqlitePoolOptions::new().max_connections(8).test_before_acquire(false).connect_with(options).await?;
    Ok(pool)
}

pub async fn migrate(pool: &SqlitePool) -> Result<(), Error> {
    MIGRATOR.run(pool).await?;
    Ok(())
}

/// A write transaction that holds the process's writer turn; safe to drop at any await
/// (see the module documentation).
///
/// Writers queue for their turn in order on an async mutex before `BEGIN IMMEDIATE`:
/// SQLite's own busy handler polls rather than queues, so under many concurrent bookings
/// an unlucky writer could wait past the busy timeout and fail with "database is locked".
/// The busy timeout still covers other processes (a `berth migrate` running beside).
pub struct WriteTx {
    /// Always `Some` until `drop` hands it on.
    held: Option<Held>,
    state: TxState,
}

struct Held {
    conn: PoolConnection<Sqlite>,
    turn: OwnedMutexGuard<()>,
    /// Drops every in-memory copy of committed rows, for a commit whose outcome is unknown.
    forget_copies: ForgetCopies,
}

/// See [`begin_write`].
pub(crate) type ForgetCopies = Box<dyn FnOnce() + Send + Sync>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TxState {
    /// The connection is outside any transaction.
    Clean,
    /// BEGIN may have run and nothing ended it yet.
    Open,
    /// COMMIT was sent and has not answered.
    Committing,
}

impl WriteTx {
    pub async fn commit(self) -> Result<(), Error> {
        self.commit_and(|| {}).await
    }

    /// Commits, then runs `after` while still holding the writer turn: for in-memory
    /// copies of the database that must change in the same order as the commits.
    pub async fn commit_and(mut self, after: impl FnOnce()) -> Result<(), Error> {
        self.state = TxState::Committing;
        match sqlx::query("COMMIT").execute(&mut *self).await {
            Ok(_) => {
                self.state = TxState::Clean;
                after();
                Ok(())
            }
            Err(e) => {
                // A failed COMMIT may leave the transaction open: rolled back on drop.
                self.state = TxState::Open;
                Err(e.into())
            }
        }
    }

    /// Opens the savepoint one member of a group commit runs in (see
    /// `capacity::group_commit`): what it writes can be undone alone.
    pub(crate) async fn savepoint(&mut self) -> Result<(), Error> {
        sqlx::query("SAVEPOINT member").execute(&mut **self).await?;
        Ok(())
    }

    /// Keeps what the member wrote, as part of the transaction (nothing is durable before
    /// the COMMIT).
    pub(crate) async fn release_savepoint(&mut self) -> Result<(), Error> {
        sqlx::query("RELEASE member").execute(&mut **self).await?;
        Ok(())
    }

    /// Undoes what the member wrote and nothing else: the members before it stay.
    pub(crate) async fn roll_back_to_savepoint(&mut self) -> Result<(), Error> {
        sqlx::query("ROLLBACK TO member").execute(&mut **self).await?;
        self.release_savepoint().await
    }

    fn held(&self) -> &Held {
        #[allow(clippy::expect_used)] // only `drop` takes it
        self.held.as_ref().expect("a write transaction holds its connection until dropped")
    }

    fn held_mut(&mut self) -> &mut Held {
        #[allow(clippy::expect_used)] // only `drop` takes it
        self.held.as_mut().expect("a write transaction holds its connection until dropped")
    }
}

impl std::ops::Deref for WriteTx {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        &self.held().conn
    }
}

impl std::ops::DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        &mut self.held_mut().conn
    }
}

impl Drop for WriteTx {
    fn drop(&mut self) {
        if self.state == TxState::Clean {
            // The connection goes back to the pool and the turn to the next writer.
            return;
        }
        let Some(Held { conn, turn, forget_copies }) = self.held.take() else { return };
        if self.state == TxState::Committing {
            // Forgotten now, so that no reader goes on with them; loading them again
            // needs the turn, which is held until the COMMIT has landed or not.
            forget_copies();
        }
        let abandoned = Abandoned { conn: Some(conn), _turn: turn };
        // Without a runtime (the process ending) `abandoned` is dropped here, which closes
        // the connection.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(abandoned.roll_back());
        }
    }
}

/// A write transaction dropped before it ended, with the writer turn it still holds.
struct Abandoned {
    conn: Option<PoolConnection<Sqlite>>,
    /// Released last, once the write lock is surely free.
    _turn: OwnedMutexGuard<()>,
}

impl Abandoned {
    async fn roll_back(mut self) {
        let Some(mut conn) = self.conn.take() else { return };
        // Queued behind whatever the dropped write left running on the connection.
        match sqlx::query("ROLLBACK").execute(&mut *conn).await {
            Ok(_) => drop(conn),
            Err(error) => {
                // No transaction to roll back (BEGIN never ran, or COMMIT landed) or a
                // broken connection: either way it is not handed to anyone again.
                tracing::debug!(%error, "closing the connection of an abandoned write");
                if let Err(error) = conn.detach().close().await {
                    tracing::warn!(%error, "closing the connection of an abandoned write failed");
                }
            }
        }
    }
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        // Not rolled back (no runtime, or the runtime shutting down): closed rather than
        // pooled; SQLite rolls back what a closing connection left open.
        if let Some(conn) = self.conn.take() {
            drop(conn.detach());
        }
    }
}

/// Waits for the writer turn, then starts a transaction that takes SQLite's write lock at
/// once: a plain `BEGIN` that later writes can fail with a busy snapshot error that no
/// timeout cures. `forget_copies` runs if the transaction is dropped during its COMMIT.
pub(crate) async fn begin_write(
    pool: &SqlitePool,
    writer: &Arc<Mutex<()>>,
    forget_copies: ForgetCopies,
) -> Result<WriteTx, Error> {
    let turn = writer.clone().lock_owned().await;
    let conn = pool.acquire().await?;
    let mut tx = WriteTx { held: Some(Held { conn, turn, forget_copies }), state: TxState::Open };
    if let Err(e) = sqlx::query("BEGIN IMMEDIATE").execute(&mut *tx).await {
        // SQLite leaves a connection whose BEGIN failed outside any transaction.
        tx.state = TxState::Clean;
        return Err(e.into());
    }
    Ok(tx)
}

/// Statements sent to SQLite in one round trip: sqlx runs the statements of one query in
/// turn, stopping at the first that fails. Inside the writer turn every round trip is two
/// thread wake-ups (to the connection's thread and back), which under contention cost more
/// than most statements do (see BENCHMARKS.md, "Fewer round trips"). Each `?` takes the next
/// value bound, across statements; numbered parameters (`?1`) would count from the first
/// statement's values, so they are not used here. Not all or nothing on its own: those
/// before a failing statement stay written, so it is for a transaction (or a savepoint)
/// that rolls back on the error.
pub(crate) struct Statements<'q> {
    sql: String,
    args: SqliteArguments<'q>,
    /// A value sqlx could not encode, reported by `execute`.
    unbound: Option<sqlx::error::BoxDynError>,
}

impl<'q> Statements<'q> {
    pub(crate) fn new() -> Statements<'q> {
        Statements { sql: String::new(), args: SqliteArguments::default(), unbound: None }
    }

    /// Appends a statement (or a piece of one: statements are separated by `;`).
    pub(crate) fn push(&mut self, sql: &str) -> &mut Statements<'q> {
        self.sql.push_str(sql);
        self
    }

    /// Binds the next `?`.
    pub(crate) fn bind<T>(&mut self, value: T) -> &mut Statements<'q>
    where
        T: 'q + sqlx::Encode<'q, Sqlite> + sqlx::Type<Sqlite>,
    {
        if let Err(e) = self.args.add(value) {
            self.unbound.get_or_insert(e);
        }
        self
    }

    /// Sends the statements; nothing pushed sends nothing.
    pub(crate) async fn execute(self, conn: &mut SqliteConnection) -> Result<(), Error> {
        if let Some(e) = self.unbound {
            return Err(Error::internal(format!("a value could not be bound: {e}")));
        }
        if self.sql.trim().is_empty() {
            return Ok(());
        }
        sqlx::query_with(&self.sql, self.args).execute(conn).await?;
        Ok(())
    }
}

/// Whether the database answers; for `/readyz`.
pub async fn ping(pool: &SqlitePool) -> Result<(), Error> {
    sqlx::query("SELECT 1").execute(pool).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used, clippy::unwrap_used)]

    use super::*;

    /// Counts to a million inside the transaction: long enough to be dropped in the
    /// middle of it.
    const LONG_STATEMENT: &str = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1000000)
                                  SELECT count(*) FROM c";

    /// The turn is what keeps this process's writers off SQLite's busy handler: with no
    /// busy timeout at all, the writer after one dropped mid-statement begins at once only
    /// if the dropped one had rolled back before handing the turn on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_write_hands_the_turn_on_only_after_its_rollback() {
        let dir = std::env::temp_dir().join(format!("berth-test-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let options = SqliteConnectOptions::new()
            .filename(dir.join("berth.db"))
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::ZERO);
        let pool = SqlitePoolOptions::new().max_connections(4).connect_with(options).await.unwrap();
        sqlx::query("CREATE TABLE marks (mark INTEGER)").execute(&pool).await.unwrap();
        let writer = Arc::new(Mutex::new(()));
        let nothing_to_forget = || -> ForgetCopies { Box::new(|| {}) };

        let dropped = async {
            let mut tx = begin_write(&pool, &writer, nothing_to_forget()).await?;
            sqlx::query("INSERT INTO marks VALUES (1)").execute(&mut *tx).await?;
            sqlx::query(LONG_STATEMENT).fetch_one(&mut *tx).await?;
            tx.commit().await
        };
        let started = std::time::Instant::now();
        let outcome = tokio::time::timeout(Duration::from_millis(50), dropped).await;
        assert!(outcome.is_err(), "the long statement finished within 50 ms; make it longer");

        let mut next = begin_write(&pool, &writer, nothing_to_forget())
            .await
            .expect("the next writer begins once the dropped one has rolled back");
        sqlx::query("INSERT INTO marks VALUES (2)").execute(&mut *next).await.unwrap();
        next.commit().await.unwrap();
        let marks: Vec<i64> = sqlx::query_scalar("SELECT mark FROM marks").fetch_all(&pool).await.unwrap();
        assert_eq!(marks, [2], "the dropped write's row is gone, the next one's kept");
        println!("the next write committed {:?} after the drop", started.elapsed());
    }

    #[tokio::test]
    async fn statements_bind_their_values_in_order_across_statements_and_stop_at_a_failure() {
        let mut conn = SqliteConnection::connect("sqlite::memory:").await.unwrap();
        sqlx::query("CREATE TABLE pairs (a INTEGER NOT NULL, b TEXT NOT NULL)").execute(&mut conn).await.unwrap();
        let mut two = Statements::new();
        two.push("INSERT INTO pairs VALUES (?, ?);").bind(1).bind("one");
        two.push("INSERT INTO pairs VALUES (?, ?), (?, ?);").bind(2).bind("two").bind(3).bind("three");
        two.execute(&mut conn).await.unwrap();
        let pairs: Vec<(i64, String)> =
            sqlx::query_as("SELECT a, b FROM pairs ORDER BY a").fetch_all(&mut conn).await.unwrap();
        assert_eq!(pairs, [(1, "one".into()), (2, "two".into()), (3, "three".into())]);
        Statements::new().execute(&mut conn).await.expect("nothing to send");

        let mut failing = Statements::new();
        failing.push("INSERT INTO pairs VALUES (?, ?);").bind(4).bind("four");
        failing.push("INSERT INTO pairs VALUES (?, NULL);").bind(5);
        failing.push("INSERT INTO pairs VALUES (?, ?);").bind(6).bind("six");
        failing.execute(&mut conn).await.expect_err("the second statement breaks NOT NULL");
        let after: Vec<i64> = sqlx::query_scalar("SELECT a FROM pairs ORDER BY a").fetch_all(&mut conn).await.unwrap();
        assert_eq!(after, [1, 2, 3, 4], "the statements before the failure stay written, those after it never run");
    }
}
