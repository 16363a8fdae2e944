//! An inference endpoint's replicas. The owner asks for a count on the environment page;
//! each replica books the endpoint's size again for the rest of its window, so scaling up
//! is a booking: placed on free capacity and checked against every quota in one
//! `BEGIN IMMEDIATE` transaction, all or nothing. (Replicas sharing the booked GPUs would
//! not fit: a Kubernetes pod asks for its GPU whole, and the namespace quota holds exactly
//! what was booked.)
//!
//! The reconciler then has the backend run that many (`Backend::scale`). Scaling down
//! releases the surplus replicas' capacity only after the backend confirmed they stopped,
//! so no GPU is ever handed out while something still runs on it.

use std::sync::Arc;
use std::time::Duration;

use berth_domain::Refusal;
use berth_domain::booking::{self as rules, Booking, Timeline, Window};
use berth_domain::catalog::Offering;
use berth_domain::launch;
use berth_domain::lifecycle::{Desired, EnvState};
use berth_domain::mig::{MigProfile, SliceRange};
use berth_domain::placement::Hold;
use berth_domain::policy::Action;
use berth_domain::rates::RateKey;
use tokio::task::JoinSet;

use crate::audit::{self, Event, Outcome};
use crate::capacity::budgets::BookingCost;
use crate::capacity::environments::{Environment, environment_in};
use crate::capacity::quotas::QuotaAsk;
use crate::provisioning::backend::Backend;
use crate::provisioning::running_changes::{applied_within, kept_and_dropped};
use crate::{Caller, Error, Platform, lock, now_ms};

/// A failed scaling is tried again after this long.
const SCALE_RETRY_MS: i64 = 10_000;

impl Platform {
    /// Sets how many replicas endpoint `id` runs (`replicas`: as typed). More replicas
    /// book more capacity until the endpoint's end, within quota; fewer give theirs back
    /// once stopped.
    pub async fn set_replicas(&self, caller: &Caller, id: &str, replicas: &str) -> Result<Environment, Error> {
        let wanted = launch::validate_replicas(replicas)?;
        self.environment_for(caller, id, Action::EnvironmentChange).await?;
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        let env = environment_in(&mut tx, id).await?;
        if env.offering != Offering::InferenceEndpoint {
            return Err(Refusal::NoReplicas(env.offering.title()).into());
        }
        if env.desired == Desired::Released {
            return Err(Refusal::NotScalable("stopping").into());
        }
        if env.state != EnvState::Ready {
            return Err(Refusal::NotScalable(env.state.as_str()).into());
        }
        let asked: i64 =
            sqlx::query_scalar("SELECT replicas FROM environments WHERE id = ?").bind(id).fetch_one(&mut *tx).await?;
        // Replicas still holding capacity: 0..held (a scale-down not yet applied keeps its own).
        let held: i64 = sqlx::query_scalar(
            "SELECT coalesce(max(replica) + 1, 0) FROM reservations WHERE environment_id = ? AND released_at IS NULL",
        )
        .bind(id)
        .fetch_one(&mut *tx)
        .await?;
        let window = Window { starts_at: now, ends_at: env.ends_at };
        let occupant = crate::capacity::book::occupant_of(&mut tx, env.tenant_id).await?;
        let mut placed: Vec<(i64, Vec<Hold>)> = Vec::new();
        if i64::from(wanted) > held {
            if window.ends_at <= now {
                return Err(Refusal::NotScalable("at the end of its window").into());
            }
            let model = env.size.gpu_model();
            self.load_book(&mut tx).await?;
            let gpus = self.gpus_of_model(&mut tx, model).await?;
            let gap = self.policy.cleaning_gap_ms;
            let nearby: Vec<Booking> = self
                .book_bookings(gpus.gpus(), now, None, Some(window.widened(gap)))
                .into_iter()
                .map(|b| b.booking)
                .collect();
            for replica in held..i64::from(wanted) {
                let taken =
                    placed.iter().flat_map(|(_, holds)| holds.iter().map(|&hold| Booking { hold, window, occupant }));
                let timeline = Timeline::new(gpus.gpus().to_vec(), nearby.iter().copied().chain(taken), gap);
                let holds = timeline.place(env.size.shape, window, occupant).map_err(|refusal| match refusal {
                    Refusal::NoCapacity { size, detail, .. } => Refusal::NoCapacity {
                        size: format!("replica {} ({size})", replica + 1),
                        when: format!("until {}", berth_domain::booking::utc_short(window.ends_at)),
                        detail,
                        hint: format!("; the endpoint keeps its {held} replica(s)"),
                    },
                    other => other,
                })?;
                placed.push((replica, holds));
            }
            let new_holds: Vec<Hold> = placed.iter().flat_map(|(_, holds)| holds.iter().copied()).collect();
            let ask = QuotaAsk { model, window, gpus: rules::gpu_equivalents(&new_holds), tier: env.tier };
            self.check_quota(&mut tx, env.booker(), ask, None).await?;
            let cost = BookingCost {
                what: "scale-up",
                key: RateKey::of_shape(env.size.shape).0,
                units: i64::try_from(new_holds.len()).unwrap_or(i64::MAX),
                tier: env.tier,
                window,
                hours: berth_domain::metering::started_hours(window.ends_at - window.starts_at),
            };
            let card = crate::capacity::rates::rate_card(&mut tx).await?;
            self.check_budgets(&mut tx, caller, env.booker(), cost, &card).await?;
            for (replica, holds) in &placed {
                crate::capacity::environments::insert_reservations(&mut tx, id, holds, window, *replica, now).await?;
            }
        }
        sqlx::query("UPDATE environments SET replicas = ?, scale_error = NULL WHERE id = ?")
            .bind(i64::from(wanted))
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let detail = format!("replicas {asked} -> {wanted}");
        let event =
            Event { action: "endpoint.scale", target: Some(id), outcome: Outcome::Success, detail: Some(&detail) };
        audit::record(&mut tx, &caller.actor(), event).await?;
        let (booker, spot) = (env.booker(), env.tier == rules::Tier::Spot);
        tx.commit_and(|| {
            self.with_book(|book| {
                for (_, holds) in &placed {
                    book.add(id, booker, occupant, holds, window, spot);
                }
            })
        })
        .await?;
        lock(&self.access.retry_after).remove(id);
        self.wake_reconciler();
        self.environment_of(caller, id).await
    }

    /// For the reconciler: has the backend run every ready endpoint whose replica count
    /// changed, each in a task of `tasks`. A failure is shown to the owner and tried again.
    pub async fn scale_endpoints(
        &self,
        backend: &Arc<dyn Backend>,
        timeout: Duration,
        tasks: &mut JoinSet<()>,
    ) -> Result<(), Error> {
        // Due: a count not applied yet, or reservations of replicas beyond the count (asked
        // up and down again before the way up was applied: the count matches what runs, but
        // the booked-up replica still holds its capacity).
        let due: Vec<String> = sqlx::query_scalar(
            "SELECT e.id FROM environments e
             WHERE e.offering = 'inference' AND e.state = 'ready' AND e.desired = 'running'
               AND (e.replicas <> e.replicas_applied
                    OR EXISTS (SELECT 1 FROM reservations r WHERE r.environment_id = e.id
                               AND r.released_at IS NULL AND r.replica >= e.replicas))",
        )
        .fetch_all(&self.db)
        .await?;
        let now = now_ms();
        for id in due {
            let backend = backend.clone();
            self.spawn_running_change(id, now, "scaling", tasks, move |this, id| async move {
                this.scale_endpoint(&backend, &id, timeout).await
            });
        }
        Ok(())
    }

    async fn scale_endpoint(&self, backend: &Arc<dyn Backend>, id: &str, timeout: Duration) -> Result<(), Error> {
        let mut conn = self.db.acquire().await?;
        let env = environment_in(&mut conn, id).await?;
        let wanted: i64 =
            sqlx::query_scalar("SELECT replicas FROM environments WHERE id = ?").bind(id).fetch_one(&mut *conn).await?;
        let (workload, dropped) = kept_and_dropped(&mut conn, &env, |u| u.replica >= wanted).await?;
        drop(conn);
        let result = applied_within(timeout, backend.scale(&workload, &dropped)).await;
        if let Err(message) = result {
            tracing::warn!(environment = %id, error = %message, "scaling failed; will retry");
            self.retry_running_change_after(id, now_ms() + SCALE_RETRY_MS);
            sqlx::query("UPDATE environments SET scale_error = ? WHERE id = ?")
                .bind(&message)
                .bind(id)
                .execute(&self.db)
                .await?;
            return Ok(());
        }
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        // The owner may have asked again meanwhile: then the next pass applies that.
        let applied = sqlx::query(
            "UPDATE environments SET replicas_applied = ?1, scale_error = NULL WHERE id = ?2 AND replicas = ?1",
        )
        .bind(wanted)
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if applied == 0 {
            return Ok(());
        }
        let released = sqlx::query(
            "UPDATE reservations SET released_at = ? WHERE environment_id = ? AND replica >= ? AND released_at IS NULL",
        )
        .bind(now)
        .bind(id)
        .bind(wanted)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        // The released replicas' charges are final, and the tenant's space follows.
        self.commit_partial_release(tx, &env, released).await?;
        tracing::info!(environment = %id, replicas = wanted, released, "endpoint scaled");
        Ok(())
    }
}

/// An environment's unreleased reservations as the booking book holds them, by window.
pub(crate) async fn unreleased_bookings(
    conn: &mut sqlx::SqliteConnection,
    id: &str,
) -> Result<Vec<(Window, Vec<Hold>)>, Error> {
    let rows: Vec<(i64, i64, i64, Option<String>, i64, i64)> = sqlx::query_as(
        "SELECT gpu_id, slice_start, slice_size, mig_profile, starts_at, ends_at FROM reservations
         WHERE environment_id = ? AND released_at IS NULL ORDER BY starts_at, id",
    )
    .bind(id)
    .fetch_all(&mut *conn)
    .await?;
    let mut by_window: Vec<(Window, Vec<Hold>)> = Vec::new();
    for (gpu_id, start, size, profile, starts_at, ends_at) in rows {
        let bad = || Error::internal(format!("reservation of {id} has an impossible slice range"));
        let hold = Hold {
            gpu_id,
            slices: SliceRange {
                start: u8::try_from(start).map_err(|_| bad())?,
                size: u8::try_from(size).map_err(|_| bad())?,
            },
            profile: profile.map(|k| MigProfile::from_key(&k).ok_or_else(bad)).transpose()?,
        };
        let window = Window { starts_at, ends_at };
        match by_window.iter_mut().find(|(w, _)| *w == window) {
            Some((_, holds)) => holds.push(hold),
            None => by_window.push((window, vec![hold])),
        }
    }
    Ok(by_window)
}
