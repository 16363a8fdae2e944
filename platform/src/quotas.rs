//! Quotas: everyone's default and per-user limits, and the check every booking passes in
//! its own transaction.

use std::sync::Arc;

use berth_domain::Refusal;
use berth_domain::booking::{self, Quota, Tier, Usage, Window};
use berth_domain::gpu::GpuModel;
use berth_domain::mig::MigProfile;
use berth_domain::placement::Hold;
use berth_domain::policy::{Action, Target};
use sqlx::{Row, SqliteConnection};

use crate::audit::{self, Event, Outcome};
use crate::{Caller, Error, Platform, now_ms};

/// What a booking asks of its owner's quota: GPU-equivalents of a model for a window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct QuotaAsk {
    pub model: GpuModel,
    pub window: Window,
    pub gpus: f64,
    pub tier: Tier,
}

impl Platform {
    /// The limits that apply to `user_id`: their own row, else everyone's default, else none.
    pub async fn quota_of(&self, user_id: i64) -> Result<Quota, Error> {
        let mut conn = self.db.acquire().await?;
        quota_of(&mut conn, user_id).await
    }

    /// Every quota row: everyone's default (`None`) first, then per user by email.
    /// Platform admins only.
    pub async fn quotas(&self, caller: &Caller) -> Result<Vec<(Option<String>, Quota)>, Error> {
        self.authorize(caller, Action::QuotaRead, Target::Platform).await?;
        let rows = sqlx::query(
            "SELECT u.email, q.max_gpus, q.gpu_hours_per_month, q.max_booking_hours, q.max_overlapping, q.allow_spot
             FROM quotas q LEFT JOIN users u ON u.id = q.user_id ORDER BY q.user_id IS NOT NULL, u.email",
        )
        .fetch_all(&self.db)
        .await?;
        rows.iter().map(|row| Ok((row.try_get("email")?, quota_from_row(row)?))).collect()
    }

    /// Sets the limits of the user with `email`, or everyone's default when it is empty.
    /// Platform admins only.
    pub async fn set_quota_for(&self, caller: &Caller, email: &str, quota: &Quota) -> Result<(), Error> {
        self.authorize(caller, Action::QuotaManage, Target::Platform).await?;
        let email = email.trim();
        let user_id = if email.is_empty() {
            None
        } else {
            let id: Option<i64> =
                sqlx::query_scalar("SELECT id FROM users WHERE email = ?").bind(email).fetch_optional(&self.db).await?;
            Some(id.ok_or_else(|| Refusal::UnknownUser(email.to_owned()))?)
        };
        self.set_quota(caller, user_id, quota).await
    }

    /// Sets `user_id`'s limits, or everyone's default with `None`. Platform admins only.
    pub async fn set_quota(&self, caller: &Caller, user_id: Option<i64>, quota: &Quota) -> Result<(), Error> {
        self.authorize(caller, Action::QuotaManage, Target::Platform).await?;
        let mut tx = self.begin_write().await?;
        sqlx::query("DELETE FROM quotas WHERE user_id IS ?").bind(user_id).execute(&mut *tx).await?;
        sqlx::query(
            "INSERT INTO quotas (user_id, max_gpus, gpu_hours_per_month, max_booking_hours, max_overlapping, allow_spot,
                 updated_at)
             VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(user_id)
        .bind(quota.max_gpus)
        .bind(quota.gpu_hours_per_month)
        .bind(quota.max_booking_hours)
        .bind(quota.max_overlapping)
        .bind(quota.allow_spot)
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        let target = user_id.map_or_else(|| "default".to_owned(), |u| format!("user:{u}"));
        let detail = format!("{quota:?}");
        let event =
            Event { action: "quota.set", target: Some(&target), outcome: Outcome::Success, detail: Some(&detail) };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Refuses a booking that would pass the user's quota. `except` leaves out an
    /// environment being changed.
    pub(crate) async fn check_quota(
        &self,
        conn: &mut SqliteConnection,
        user_id: i64,
        ask: QuotaAsk,
        except: Option<&str>,
    ) -> Result<(), Error> {
        let QuotaAsk { model, window, gpus: ask, tier } = ask;
        let quota = quota_of(conn, user_id).await?;
        if quota == Quota::default() {
            return Ok(());
        }
        let now = now_ms();
        let mut same_model: Vec<(Window, f64)> = Vec::new();
        let mut by_env: std::collections::BTreeMap<Arc<str>, (Window, Vec<Hold>)> = Default::default();
        self.load_book(conn).await?;
        let gpus = self.gpus_of_model(conn, model).await?;
        // Spot bookings are beyond the quota: they do not use it up.
        for b in self.book_bookings(&gpus, now, Some(user_id), Some(window)).into_iter().filter(|b| !b.spot) {
            if Some(&*b.environment_id) != except {
                by_env.entry(b.environment_id).or_insert((b.booking.window, Vec::new())).1.push(b.booking.hold);
            }
        }
        for (w, holds) in by_env.values() {
            same_model.push((*w, booking::gpu_equivalents(holds)));
        }
        let overlapping: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM environments WHERE owner_id = ? AND state NOT IN ('released', 'failed')
               AND desired = 'running' AND starts_at < ? AND ends_at > ? AND id IS NOT ?",
        )
        .bind(user_id)
        .bind(window.ends_at)
        .bind(window.starts_at)
        .bind(except)
        .fetch_one(&mut *conn)
        .await?;
        let gpu_hours_this_month = gpu_hours_in_month(conn, user_id, window.starts_at, except).await?;
        let usage =
            Usage { same_model, overlapping: u32::try_from(overlapping).unwrap_or(u32::MAX), gpu_hours_this_month };
        Ok(booking::check_quota(&quota, &usage, model, window, ask, tier)?)
    }
}

async fn quota_of(conn: &mut SqliteConnection, user_id: i64) -> Result<Quota, Error> {
    let row = sqlx::query(
        "SELECT max_gpus, gpu_hours_per_month, max_booking_hours, max_overlapping, allow_spot FROM quotas
         WHERE user_id = ? OR user_id IS NULL ORDER BY user_id IS NULL LIMIT 1",
    )
    .bind(user_id)
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map_or(Ok(Quota::default()), quota_from_row)
}

/// A `quotas` row's four limit columns, by name.
fn quota_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<Quota, Error> {
    let hours: Option<i64> = row.try_get("max_booking_hours")?;
    let overlapping: Option<i64> = row.try_get("max_overlapping")?;
    Ok(Quota {
        max_gpus: row.try_get("max_gpus")?,
        gpu_hours_per_month: row.try_get("gpu_hours_per_month")?,
        max_booking_hours: hours.and_then(|h| u32::try_from(h).ok()),
        max_overlapping: overlapping.and_then(|n| u32::try_from(n).ok()),
        allow_spot: row.try_get("allow_spot")?,
    })
}

/// GPU-equivalent hours of the user's bookings inside the UTC calendar month of `at`
/// (the parts of windows that fall in it); failed and stopped bookings count for the time
/// they held capacity.
async fn gpu_hours_in_month(
    conn: &mut SqliteConnection,
    user_id: i64,
    at: i64,
    except: Option<&str>,
) -> Result<f64, Error> {
    use chrono::Datelike;
    let Some(t) = chrono::DateTime::from_timestamp_millis(at) else { return Ok(0.0) };
    let first = t.date_naive().with_day(1).and_then(|d| d.and_hms_opt(0, 0, 0)).map(|d| d.and_utc());
    let next = first.and_then(|f| f.checked_add_months(chrono::Months::new(1)));
    let (Some(first), Some(next)) = (first, next) else { return Ok(0.0) };
    let (month_start, month_end) = (first.timestamp_millis(), next.timestamp_millis());
    let rows: Vec<(i64, i64, Option<String>)> = sqlx::query_as(
        "SELECT max(r.starts_at, ?1), min(coalesce(r.released_at, r.ends_at), r.ends_at, ?2), r.mig_profile
         FROM reservations r JOIN environments e ON e.id = r.environment_id
         WHERE e.owner_id = ?3 AND r.starts_at < ?2 AND coalesce(r.released_at, r.ends_at) > ?1 AND e.id IS NOT ?4",
    )
    .bind(month_start)
    .bind(month_end)
    .bind(user_id)
    .bind(except)
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(from, to, profile)| {
            let share = profile
                .as_deref()
                .and_then(MigProfile::from_key)
                .map_or(1.0, |p| f64::from(p.compute_slices()) / f64::from(berth_domain::mig::COMPUTE_SLICES));
            share * (to - from).max(0) as f64 / booking::HOUR_MS as f64
        })
        .sum())
}
