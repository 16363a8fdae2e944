//! Group commit of launches: the launch that gets the writer turn decides every launch
//! waiting for it, in the order they asked, in one transaction.
//!
//! Measured before (64 clients, 10,000 GPUs): a booking held the turn for about 2.4 ms,
//! about 0.5 ms of it for what every transaction pays whatever it writes: BEGIN, COMMIT
//! with its WAL append, handing the turn and a connection to the next writer (placement
//! was most of the rest; see BENCHMARKS.md). So launches queue here, and the one that
//! gets the turn (the leader) takes the queue:
//!
//! - each launch runs in its own SAVEPOINT; a refused one (or one that fails) rolls back to
//!   it alone and gets its own error, and the batch goes on;
//! - each sees what the launches before it decided (`BookingBook::decide`, visible to the
//!   leader only), so a batch places exactly as the same launches one after another would;
//! - one COMMIT. Only then does the booking book take the batch, in order, and does any
//!   launch get its answer. If the COMMIT fails, every launch of the batch gets the error
//!   and nothing is applied.
//!
//! Durability is the COMMIT's, as before (WAL with `synchronous = NORMAL`: a commit
//! survives the process being killed): no launch is told it is booked before the COMMIT
//! that wrote it has returned.
//!
//! Nobody waits on someone else's future: every launch in the queue also waits for the
//! turn itself, so it is answered by a leader or leads. A leader dropped half-way (its
//! client went away) drops its transaction like any write (see `store`): the batch rolls
//! back and the launches it held, finding their answer gone, queue again. Their ids were
//! chosen beforehand, so a launch whose batch was dropped during its COMMIT (which may have
//! landed) is found booked rather than booked twice. A launch whose caller went away
//! before a leader took it is not booked.

use std::sync::{Mutex, MutexGuard};

use berth_domain::Refusal;
use tokio::sync::oneshot;

use crate::capacity::book::DecidingTask;
use crate::capacity::environments::{Decided, LaunchAsk, TurnReads};
use crate::capacity::idempotency::{self, KeyUse};
use crate::store::WriteTx;
use crate::{Error, Platform};

/// At most this many launches share a transaction, so one batch holds the turn for a
/// bounded time (64 launches of the contention benchmark take about 0.1 s) and other
/// writers get theirs.
const MAX_BATCH: usize = 64;

/// Launches waiting for a leader, in the order they asked.
#[derive(Default)]
pub(crate) struct LaunchQueue {
    waiting: Mutex<Vec<Queued>>,
}

struct Queued {
    ask: LaunchAsk,
    /// The environment's id, or why not.
    answer: oneshot::Sender<Result<String, Error>>,
}

/// What one launch of a batch came to.
enum Outcome {
    Booked(Decided),
    /// Asked again, and an earlier batch had committed it after all.
    AlreadyBooked,
    /// Its `Idempotency-Key` had booked this environment (in an earlier batch, or earlier
    /// in this one) for the same request.
    BookedUnderKey(String),
    Refused(Error),
}

impl LaunchQueue {
    fn waiting(&self) -> MutexGuard<'_, Vec<Queued>> {
        self.waiting.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The next batch: the oldest launches whose callers still wait.
    fn take(&self) -> Vec<Queued> {
        let mut waiting = self.waiting();
        waiting.retain(|q| !q.answer.is_closed());
        let n = waiting.len().min(MAX_BATCH);
        waiting.drain(..n).collect()
    }
}

impl Platform {
    /// Queues `ask` and waits until a batch has committed it (its environment's id) or
    /// refused it, leading a batch whenever the turn comes first.
    pub(crate) async fn launch_in_turn(&self, mut ask: LaunchAsk) -> Result<String, Error> {
        loop {
            let (answer, mut answered) = oneshot::channel();
            self.launches.waiting().push(Queued { ask: ask.clone(), answer });
            let outcome = loop {
                tokio::select! {
                    // Decided by another leader while this waited for the turn.
                    biased;
                    outcome = &mut answered => break outcome,
                    // Its own launch is in this batch unless the queue held more than a batch.
                    tx = self.begin_write() => self.decide_batch(tx?).await,
                }
            };
            match outcome {
                Ok(result) => return result,
                // The batch that took it was dropped before answering.
                Err(_) => ask.retried = true,
            }
        }
    }

    /// As the leader holding `tx`'s turn: decides the waiting launches, commits once and
    /// answers them.
    async fn decide_batch(&self, mut tx: WriteTx) {
        let batch = self.launches.take();
        // Loaded before any launch writes: loaded later, it would read this transaction's
        // uncommitted rows as if they were committed.
        if let Err(e) = self.load_book(&mut tx).await {
            return answer_all(batch, &e);
        }
        let mut reads = match TurnReads::new(&mut tx).await {
            Ok(reads) => reads,
            Err(e) => return answer_all(batch, &e),
        };
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut broken = None;
        {
            // Dropped half-way, the decided bookings are forgotten with the transaction.
            let _forget = ForgetDecided { platform: self, task: DecidingTask::current() };
            for queued in &batch {
                match self.decide_member(&mut tx, &mut reads, &queued.ask).await {
                    Ok(outcome) => outcomes.push(outcome),
                    Err(e) => {
                        broken = Some(e);
                        break;
                    }
                }
            }
            // Decided or not, the book takes nothing before the COMMIT, below.
        }
        if let Some(broken) = broken {
            // The transaction cannot go on; dropped, it rolls back.
            drop(tx);
            return answer_all(batch, &broken);
        }
        tracing::debug!(launches = batch.len(), "committing a batch of launches");
        // Answered right after the book, still in the turn: a launch waiting for the turn
        // finds its answer rather than beginning a transaction with nothing to do.
        let mut decided = Some((batch, outcomes));
        let committed = tx
            .commit_and(|| {
                let Some((batch, outcomes)) = decided.take() else { return };
                self.with_book(|book| {
                    for outcome in &outcomes {
                        if let Outcome::Booked(d) = outcome {
                            for (victim, ends_at) in &d.reclaimed {
                                book.set_end(victim, *ends_at);
                            }
                            book.add(&d.id, d.booker, d.occupant, &d.assignments, d.window, d.spot);
                        }
                    }
                });
                for (queued, outcome) in batch.into_iter().zip(outcomes) {
                    let answer = match outcome {
                        Outcome::Booked(decided) => Ok(decided.id),
                        Outcome::AlreadyBooked => Ok(queued.ask.id),
                        Outcome::BookedUnderKey(id) => Ok(id),
                        Outcome::Refused(e) => Err(e),
                    };
                    // Its caller may have gone away meanwhile: booked all the same.
                    let _ = queued.answer.send(answer);
                }
            })
            .await;
        if let (Err(e), Some((batch, _))) = (committed, decided) {
            answer_all(batch, &e);
        }
    }

    /// One launch in its savepoint. An error here means the transaction itself failed.
    async fn decide_member(&self, tx: &mut WriteTx, reads: &mut TurnReads, ask: &LaunchAsk) -> Result<Outcome, Error> {
        if ask.retried {
            let booked: Option<i64> = sqlx::query_scalar("SELECT 1 FROM environments WHERE id = ?")
                .bind(&ask.id)
                .fetch_optional(&mut **tx)
                .await?;
            if booked.is_some() {
                return Ok(Outcome::AlreadyBooked);
            }
        }
        if let Some(key) = &ask.idempotency {
            match idempotency::key_use(tx, ask.caller.user_id(), key, ask.now).await? {
                KeyUse::New => {}
                KeyUse::Booked(id) => return Ok(Outcome::BookedUnderKey(id)),
                KeyUse::OtherRequest => {
                    let refusal = Refusal::IdempotencyKeyReused { hours: idempotency::KEY_HOURS };
                    return Ok(Outcome::Refused(refusal.into()));
                }
            }
        }
        tx.savepoint().await?;
        match self.decide_launch(tx, reads, ask).await {
            Ok(decided) => {
                tx.release_savepoint().await?;
                self.with_book(|book| {
                    let Decided { id, booker, occupant, assignments, window, spot, .. } = &decided;
                    book.decide(id, *booker, *occupant, assignments, *window, *spot);
                });
                Ok(Outcome::Booked(decided))
            }
            Err(refused) => {
                tx.roll_back_to_savepoint().await?;
                Ok(Outcome::Refused(refused))
            }
        }
    }
}

/// Every launch of a batch that could not be committed gets the cause.
fn answer_all(batch: Vec<Queued>, cause: &Error) {
    tracing::warn!(error = %cause, launches = batch.len(), "a batch of launches failed as a whole");
    for queued in batch {
        let _ = queued.answer.send(Err(Error::internal(format!("the launch's transaction failed: {cause}"))));
    }
}

/// Forgets the bookings a batch decided, when it ends before the COMMIT: only this
/// leader's, as a later leader may already be deciding its own.
struct ForgetDecided<'a> {
    platform: &'a Platform,
    task: DecidingTask,
}

impl Drop for ForgetDecided<'_> {
    fn drop(&mut self) {
        self.platform.with_book(|book| book.forget_decided_by(self.task));
    }
}
