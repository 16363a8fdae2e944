//! Changes to what a running environment holds that the backend applies outside its steps:
//! an endpoint's replicas (`replicas`) and a cluster moved off a failed node
//! (`cluster_nodes`). Both run one task per environment at a time, wait after a failure
//! before trying again, and release the units the environment no longer uses only after the
//! backend confirmed nothing runs on them, with the same bookkeeping.

use std::future::Future;
use std::time::Duration;

use berth_domain::booking::Tier;
use tokio::task::JoinSet;

use crate::capacity::environments::{Environment, HeldUnit, held_units};
use crate::provisioning::backend::{BackendError, PlacedUnit, Workload};
use crate::store::WriteTx;
use crate::{Error, Platform, lock};

/// What the backend is told of `env`: the workload of the units it keeps, and the
/// unreleased units `drops` says it no longer uses.
pub(crate) async fn kept_and_dropped(
    conn: &mut sqlx::SqliteConnection,
    env: &Environment,
    drops: impl Fn(&HeldUnit) -> bool,
) -> Result<(Workload, Vec<PlacedUnit>), Error> {
    let workload = crate::provisioning::workloads::workload_of(&mut *conn, env, |u| !drops(u)).await?;
    let dropped = held_units(&mut *conn, &env.id)
        .await?
        .into_iter()
        .filter(|u| u.released_at.is_none() && drops(u))
        .map(|u| u.placed(&env.id))
        .collect();
    Ok((workload, dropped))
}

/// The backend's answer to `call` within `timeout`, or why there is none.
pub(crate) async fn applied_within<T>(
    timeout: Duration,
    call: impl Future<Output = Result<T, BackendError>>,
) -> Result<T, String> {
    match tokio::time::timeout(timeout, call).await {
        Ok(result) => result.map_err(|e| e.0),
        Err(_) => Err(format!("did not finish within {} s", timeout.as_secs())),
    }
}

impl Platform {
    /// Runs `work` for environment `id` in a task of `tasks`, unless work for it runs
    /// already or its last failure asked to wait past `now`. `what` names the work in the log.
    pub(crate) fn spawn_running_change<Work, Done>(
        &self,
        id: String,
        now: i64,
        what: &'static str,
        tasks: &mut JoinSet<()>,
        work: Work,
    ) where
        Work: FnOnce(Platform, String) -> Done + Send + 'static,
        Done: Future<Output = Result<(), Error>> + Send + 'static,
    {
        if lock(&self.access.retry_after).get(&id).is_some_and(|&at| at > now)
            || !lock(&self.access.changing).insert(id.clone())
        {
            return;
        }
        let this = self.clone();
        tasks.spawn(async move {
            if let Err(e) = work(this.clone(), id.clone()).await {
                tracing::error!(environment = %id, error = %e, "{what}: bookkeeping failed");
            }
            lock(&this.access.changing).remove(&id);
            this.wake_reconciler();
        });
    }

    /// After the backend failed to apply a change to `id`: not tried again before `at`.
    pub(crate) fn retry_running_change_after(&self, id: &str, at: i64) {
        lock(&self.access.retry_after).insert(id.to_owned(), at);
    }

    /// Commits `tx`, in which `released` of `env`'s units were released: their charges
    /// made final, its tenant's space told to follow, and the booking book left holding
    /// what it still has.
    pub(crate) async fn commit_partial_release(
        &self,
        mut tx: WriteTx,
        env: &Environment,
        released: u64,
    ) -> Result<(), Error> {
        crate::capacity::usage_sums::sum_released_units(&mut tx, &env.id).await?;
        crate::capacity::quotas::follow_holdings(&mut tx, &env.id).await?;
        let kept = crate::provisioning::replicas::unreleased_bookings(&mut tx, &env.id).await?;
        let occupant = crate::capacity::book::occupant_of(&mut tx, env.tenant_id).await?;
        let (booker, spot) = (env.booker(), env.tier == Tier::Spot);
        tx.commit_and(|| {
            if released > 0 {
                self.with_book(|book| {
                    book.release(&env.id);
                    for (window, holds) in &kept {
                        book.add(&env.id, booker, occupant, holds, *window, spot);
                    }
                });
            }
        })
        .await?;
        lock(&self.access.retry_after).remove(&env.id);
        Ok(())
    }
}
