//! Booking in time: loading the timeline of a GPU model, availability for the calendar and
//! the launch form, earliest starts, changing a booking's end, and quotas.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use berth_domain::Refusal;
use berth_domain::booking::{self, Booking, Quota, Tier, Timeline, Usage, Window};
use berth_domain::catalog::{Offering, Size};
use berth_domain::gpu::GpuModel;
use berth_domain::lifecycle::{Desired, EnvState};
use berth_domain::mig::{MigProfile, SliceRange};
use berth_domain::placement::{GpuUnit, Hold, Shape};
use sqlx::{Row, SqliteConnection};

use crate::audit::{self, Event, Outcome};
use crate::environments::{Environment, visible_environment};
use crate::store::WriteTx;
use crate::{Caller, Error, Platform, now_ms};

/// "Tue 24 Nov 14:15 UTC"
pub fn utc_short(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map(|t| t.format("%a %-d %b %H:%M UTC").to_string()).unwrap_or_default()
}

/// Every unreleased reservation, by GPU, held in memory: the calendar and every booking
/// read it instead of tens of thousands of rows.
///
/// It is loaded once from the database and then changed only by writers holding the
/// writer turn, right after their commit (`WriteTx::commit_and`), so it always equals
/// the committed table. The database stays the authority: its trigger refuses an
/// overlapping reservation even if this copy were ever wrong.
#[derive(Debug, Default)]
pub(crate) struct BookingBook {
    by_gpu: HashMap<i64, Vec<Held>>,
    by_environment: HashMap<Arc<str>, Vec<i64>>,
}

#[derive(Debug, Clone)]
struct Held {
    /// The environment, or `maintenance:<id>` for a maintenance window.
    environment_id: Arc<str>,
    owner_id: i64,
    booking: Booking,
    /// A reservation holds its unit until released, even past its end (teardown may still
    /// run); a maintenance window ends when it ends.
    until_released: bool,
    /// A spot booking, which a guaranteed one may reclaim.
    spot: bool,
}

/// A booking as the book hands it out: whose, where and when, and whether it is spot.
#[derive(Debug, Clone)]
pub(crate) struct BookedBy {
    pub environment_id: Arc<str>,
    pub booking: Booking,
    pub spot: bool,
}

impl BookingBook {
    async fn load(conn: &mut SqliteConnection) -> Result<BookingBook, Error> {
        let rows = sqlx::query(
            "SELECT r.environment_id, e.owner_id, r.gpu_id, r.slice_start, r.slice_size, r.mig_profile, r.starts_at, r.ends_at,
                    e.tier = 'spot'
             FROM reservations r JOIN environments e ON e.id = r.environment_id WHERE r.released_at IS NULL",
        )
        .fetch_all(&mut *conn)
        .await?;
        let mut book = BookingBook::default();
        let mut ids: HashMap<String, Arc<str>> = HashMap::new();
        for row in &rows {
            let gpu_id: i64 = row.try_get(2)?;
            let bad = || Error::internal(format!("reservation on gpu {gpu_id} has an impossible slice range"));
            let start: i64 = row.try_get(3)?;
            let size: i64 = row.try_get(4)?;
            let profile: Option<&str> = row.try_get(5)?;
            let hold = Hold {
                gpu_id,
                slices: SliceRange {
                    start: u8::try_from(start).map_err(|_| bad())?,
                    size: u8::try_from(size).map_err(|_| bad())?,
                },
                profile: profile.map(|k| MigProfile::from_key(k).ok_or_else(bad)).transpose()?,
            };
            let env: String = row.try_get(0)?;
            let env = ids.entry(env).or_insert_with_key(|k| Arc::from(k.as_str())).clone();
            let window = Window { starts_at: row.try_get(6)?, ends_at: row.try_get(7)? };
            book.insert(env, row.try_get(1)?, Booking { hold, window }, true, row.try_get(8)?);
        }
        let maintenance: Vec<(i64, i64, i64, i64)> = sqlx::query_as(
            "SELECT m.id, g.id, m.starts_at, m.ends_at FROM maintenance_windows m JOIN gpus g ON g.node_id = m.node_id
             WHERE m.cancelled_at IS NULL AND m.ends_at > ?",
        )
        .bind(now_ms())
        .fetch_all(&mut *conn)
        .await?;
        for (id, gpu, starts_at, ends_at) in maintenance {
            book.add_maintenance(&crate::maintenance::hold_id(id), &[gpu], Window { starts_at, ends_at });
        }
        Ok(book)
    }

    fn insert(&mut self, environment_id: Arc<str>, owner_id: i64, booking: Booking, until_released: bool, spot: bool) {
        let gpu = booking.hold.gpu_id;
        self.by_environment.entry(environment_id.clone()).or_default().push(gpu);
        self.by_gpu.entry(gpu).or_default().push(Held { environment_id, owner_id, booking, until_released, spot });
    }

    /// After a maintenance window on `gpus` committed: each GPU is taken whole.
    pub(crate) fn add_maintenance(&mut self, id: &str, gpus: &[i64], window: Window) {
        let id: Arc<str> = Arc::from(id);
        for &gpu_id in gpus {
            let hold = Hold { gpu_id, slices: SliceRange::WHOLE_GPU, profile: None };
            self.insert(id.clone(), 0, Booking { hold, window }, false, false);
        }
    }

    /// After a launch committed `holds` for `window`.
    pub(crate) fn add(&mut self, environment_id: &str, owner_id: i64, holds: &[Hold], window: Window, spot: bool) {
        let id: Arc<str> = Arc::from(environment_id);
        for &hold in holds {
            self.insert(id.clone(), owner_id, Booking { hold, window }, true, spot);
        }
    }

    /// After a change of end committed.
    pub(crate) fn set_end(&mut self, environment_id: &str, ends_at: i64) {
        for gpu in self.by_environment.get(environment_id).into_iter().flatten() {
            for held in self.by_gpu.get_mut(gpu).into_iter().flatten() {
                if &*held.environment_id == environment_id {
                    held.booking.window.ends_at = ends_at;
                }
            }
        }
    }

    /// After an environment's capacity was released.
    pub(crate) fn release(&mut self, environment_id: &str) {
        for gpu in self.by_environment.remove(environment_id).into_iter().flatten() {
            if let Some(list) = self.by_gpu.get_mut(&gpu) {
                list.retain(|h| &*h.environment_id != environment_id);
            }
        }
    }

    /// Bookings on `gpus` that overlap `range` (any with `None`), optionally of one owner.
    /// One held past its end (teardown still running) holds its unit until `now`.
    fn bookings(&self, gpus: &[GpuUnit], now: i64, owner: Option<i64>, range: Option<Window>) -> Vec<BookedBy> {
        let mut out = Vec::new();
        for gpu in gpus {
            for held in self.by_gpu.get(&gpu.id).into_iter().flatten() {
                let end = held.booking.window.ends_at;
                let window =
                    Window { ends_at: if held.until_released { end.max(now) } else { end }, ..held.booking.window };
                if owner.is_some_and(|o| o != held.owner_id) || range.is_some_and(|r| !window.conflicts(r, 0)) {
                    continue;
                }
                out.push(BookedBy {
                    environment_id: held.environment_id.clone(),
                    booking: Booking { window, ..held.booking },
                    spot: held.spot,
                });
            }
        }
        out
    }
}

impl Platform {
    /// Runs `f` on the booking book; for writers holding the turn, right after commit.
    pub(crate) fn with_book(&self, f: impl FnOnce(&mut BookingBook)) {
        if let Some(book) = self.book.write().unwrap_or_else(|poisoned| poisoned.into_inner()).as_mut() {
            f(book);
        }
    }

    /// Loads the booking book if it is not yet; `tx` proves the caller holds the writer turn,
    /// so no commit can slip between the load and the book.
    async fn load_book(&self, conn: &mut SqliteConnection) -> Result<(), Error> {
        if self.book.read().unwrap_or_else(|poisoned| poisoned.into_inner()).is_none() {
            let book = BookingBook::load(conn).await?;
            *self.book.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(book);
        }
        Ok(())
    }

    /// For readers not holding the writer turn: takes it just to load the book once.
    async fn ensure_book(&self) -> Result<(), Error> {
        if self.book.read().unwrap_or_else(|poisoned| poisoned.into_inner()).is_some() {
            return Ok(());
        }
        let mut tx = self.begin_write().await?;
        self.load_book(&mut tx).await
    }

    pub(crate) fn book_bookings(
        &self,
        gpus: &[GpuUnit],
        now: i64,
        owner: Option<i64>,
        range: Option<Window>,
    ) -> Vec<BookedBy> {
        self.book
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .as_ref()
            .map(|book| book.bookings(gpus, now, owner, range))
            .unwrap_or_default()
    }

    /// Every GPU of `model` in service with the unreleased bookings on it that could
    /// matter during `range` (all of them with `None`), for a writer holding the turn.
    pub(crate) async fn timeline_in(
        &self,
        tx: &mut WriteTx,
        model: GpuModel,
        now: i64,
        range: Option<Window>,
    ) -> Result<Timeline, Error> {
        self.load_book(tx).await?;
        let gpus = self.gpus_of_model(tx, model).await?;
        Ok(self.timeline_of(&gpus, now, range, true))
    }

    /// The same for readers.
    async fn timeline(&self, model: GpuModel, now: i64, range: Option<Window>) -> Result<Timeline, Error> {
        self.ensure_book().await?;
        let mut conn = self.db.acquire().await?;
        let gpus = self.gpus_of_model(&mut conn, model).await?;
        Ok(self.timeline_of(&gpus, now, range, true))
    }

    /// The timeline of `gpus`; without spot bookings it shows what a guaranteed booking
    /// could have by reclaiming them.
    pub(crate) fn timeline_of(&self, gpus: &[GpuUnit], now: i64, range: Option<Window>, with_spot: bool) -> Timeline {
        let gap = self.policy.cleaning_gap_ms;
        // Widened by the cleaning gap, as `Window::conflicts` widens bookings.
        let range = range.map(|r| Window { starts_at: r.starts_at - gap, ends_at: r.ends_at + gap });
        let bookings = self.book_bookings(gpus, now, None, range).into_iter().filter(|b| with_spot || !b.spot);
        Timeline::new(gpus.to_vec(), bookings.map(|b| b.booking), gap)
    }
}

/// One row of the availability calendar: how many of a shape are free in each bucket.
#[derive(Debug, Clone, PartialEq)]
pub struct AvailabilityRow {
    pub shape: Shape,
    /// How many fit on an empty fleet, to draw `free` as a share.
    pub capacity: u32,
    pub free: Vec<u32>,
}

/// Free capacity over time for every shape the catalog sells on this fleet.
#[derive(Debug, Clone, PartialEq)]
pub struct Availability {
    pub from: i64,
    pub bucket_ms: i64,
    pub rows: Vec<AvailabilityRow>,
}

/// The shapes the catalog sells, each once, ordered by GPU model and size.
pub fn catalog_shapes() -> Vec<Shape> {
    let mut shapes: Vec<Shape> = Vec::new();
    for offering in Offering::ALL {
        for size in offering.sizes() {
            if !shapes.contains(&size.shape) {
                shapes.push(size.shape);
            }
        }
    }
    shapes.sort_by_key(|s| (s.model(), shape_rank(*s)));
    shapes
}

fn shape_rank(shape: Shape) -> (u8, u32) {
    match shape {
        Shape::MigSlice { profile, .. } => (0, u32::from(profile.compute_slices())),
        Shape::Gpus { count, .. } => (1, count),
        Shape::Nodes { count, .. } => (2, count),
    }
}

/// What a booking asks of its owner's quota: GPU-equivalents of a model for a window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct QuotaAsk {
    pub model: GpuModel,
    pub window: Window,
    pub gpus: f64,
    pub tier: Tier,
}

/// How much of one size is free, for the launch form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeAvailability {
    pub size: &'static Size,
    /// How many fit for the asked duration starting now.
    pub free_now: u32,
    /// Now when one fits, else the earliest start within the horizon, if any.
    pub earliest_start: Option<i64>,
}

impl Platform {
    /// Free capacity of every catalog shape in `buckets` consecutive buckets of `bucket_ms`
    /// from `from`.
    pub async fn availability(&self, from: i64, bucket_ms: i64, buckets: usize) -> Result<Availability, Error> {
        let now = now_ms();
        let models: BTreeSet<GpuModel> = catalog_shapes().iter().map(|s| s.model()).collect();
        let mut rows = Vec::new();
        for model in models {
            let range = Window { starts_at: from, ends_at: from + bucket_ms * buckets as i64 };
            let timeline = self.timeline(model, now, Some(range)).await?;
            if timeline.gpus().is_empty() {
                continue;
            }
            let empty = Timeline::new(timeline.gpus().to_vec(), [], 0);
            let shapes: Vec<Shape> = catalog_shapes().into_iter().filter(|s| s.model() == model).collect();
            let capacities = empty.heatmaps(&shapes, from, bucket_ms, 1);
            let free = timeline.heatmaps(&shapes, from, bucket_ms, buckets);
            for ((shape, capacity), free) in shapes.into_iter().zip(capacities).zip(free) {
                let capacity = capacity.first().copied().unwrap_or(0);
                if capacity > 0 {
                    rows.push(AvailabilityRow { shape, capacity, free });
                }
            }
        }
        Ok(Availability { from, bucket_ms, rows })
    }

    /// For the launch form: per size of `offering`, how many fit for `hours` from now, and
    /// the earliest start for one when none does.
    pub async fn size_availability(&self, offering: Offering, hours: u32) -> Result<Vec<SizeAvailability>, Error> {
        let now = now_ms();
        let window = Window { starts_at: now, ends_at: now + i64::from(hours) * booking::HOUR_MS };
        let mut timelines: HashMap<GpuModel, Timeline> = HashMap::new();
        let mut out = Vec::new();
        for size in offering.sizes() {
            let model = size.gpu_model();
            if let std::collections::hash_map::Entry::Vacant(entry) = timelines.entry(model) {
                entry.insert(self.timeline(model, now, None).await?);
            }
            let Some(timeline) = timelines.get(&model) else { continue };
            let free_now = timeline.free_count(size.shape, window);
            let earliest_start = if free_now > 0 {
                Some(now)
            } else {
                self.earliest_start_on(timeline.gpus(), size.shape, hours, now, now)
            };
            out.push(SizeAvailability { size, free_now, earliest_start });
        }
        Ok(out)
    }

    /// The earliest start at or after `not_before` for `shape` held `hours`, within the
    /// booking horizon.
    pub async fn earliest_start(&self, shape: Shape, hours: u32, not_before: i64) -> Result<Option<i64>, Error> {
        let now = now_ms();
        self.ensure_book().await?;
        let mut conn = self.db.acquire().await?;
        let gpus = self.gpus_of_model(&mut conn, shape.model()).await?;
        Ok(self.earliest_start_on(&gpus, shape, hours, not_before.max(now), now))
    }

    /// Moves the end of a booked or running environment. Longer needs its own GPUs free
    /// for the extra time (with the cleaning gap) and room in the quota; shorter always
    /// works while the new end is after now.
    pub async fn change_end(&self, caller: &Caller, id: &str, new_end: &str) -> Result<Environment, Error> {
        let new_end = booking::parse_start(new_end)?.ok_or(Refusal::EndNotAfterStart)?;
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        let env = visible_environment(&mut tx, caller, id).await?;
        if !matches!(env.state, EnvState::Requested | EnvState::Provisioning | EnvState::Ready) {
            return Err(Refusal::NotResizable(env.state.as_str()).into());
        }
        if env.desired == Desired::Released {
            return Err(Refusal::NotResizable("stopping").into());
        }
        let current = Window { starts_at: env.starts_at, ends_at: env.ends_at };
        let window = booking::resized_window(current, new_end, env.offering.max_hours(), now, &self.policy)?;
        let model = env.size.gpu_model();

        if window.ends_at > current.ends_at {
            self.load_book(&mut tx).await?;
            let gpus = self.gpus_of_model(&mut tx, model).await?;
            let all = self.book_bookings(&gpus, now, None, None);
            let (own, others): (Vec<_>, Vec<_>) =
                all.into_iter().map(|b| (b.environment_id, b.booking)).partition(|(env_id, _)| &**env_id == id);
            let blocking = others
                .iter()
                .filter(|(_, b)| {
                    own.iter().any(|(_, o)| {
                        o.hold.gpu_id == b.hold.gpu_id
                            && o.hold.slices.overlaps(b.hold.slices)
                            && b.window.conflicts(window, self.policy.cleaning_gap_ms)
                    })
                })
                .map(|(_, b)| b.window.starts_at)
                .min();
            if let Some(next_start) = blocking {
                let latest = next_start - self.policy.cleaning_gap_ms;
                return Err(Refusal::NoCapacity {
                    size: env.size.shape.describe(),
                    when: format!("until {}", utc_short(window.ends_at)),
                    detail: format!(
                        "its capacity is taken from {} (another booking or maintenance)",
                        utc_short(next_start)
                    ),
                    hint: if latest > current.ends_at {
                        format!("; it can run until {} at the latest", utc_short(latest))
                    } else {
                        String::new()
                    },
                }
                .into());
            }
            let held: Vec<Hold> = own.iter().map(|(_, b)| b.hold).collect();
            let ask = QuotaAsk { model, window, gpus: booking::gpu_equivalents(&held), tier: env.tier };
            self.check_quota(&mut tx, caller.user_id, ask, Some(id)).await?;
        }

        sqlx::query("UPDATE environments SET ends_at = ? WHERE id = ?")
            .bind(window.ends_at)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("UPDATE reservations SET ends_at = ? WHERE environment_id = ? AND released_at IS NULL")
            .bind(window.ends_at)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let detail = format!("end {} -> {}", utc_short(current.ends_at), utc_short(window.ends_at));
        let event = Event {
            action: "environment.change_end",
            target: Some(id),
            outcome: Outcome::Success,
            detail: Some(&detail),
        };
        audit::record(&mut tx, Some(caller.user_id), &caller.meta, event).await?;
        tx.commit_and(|| self.with_book(|book| book.set_end(id, window.ends_at))).await?;
        self.wake_reconciler();
        self.environment_of(caller, id).await
    }

    /// The limits that apply to `user_id`: their own row, else everyone's default, else none.
    pub async fn quota_of(&self, user_id: i64) -> Result<Quota, Error> {
        let mut conn = self.db.acquire().await?;
        quota_of(&mut conn, user_id).await
    }

    /// Every quota row: everyone's default (`None`) first, then per user by email.
    /// Platform admins only.
    pub async fn quotas(&self, caller: &Caller) -> Result<Vec<(Option<String>, Quota)>, Error> {
        if !caller.is_admin {
            return Err(Error::NotFound);
        }
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
        if !caller.is_admin {
            return Err(Error::NotFound);
        }
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
        if !caller.is_admin {
            return Err(Error::NotFound);
        }
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
        audit::record(&mut tx, Some(caller.user_id), &caller.meta, event).await?;
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

impl Platform {
    /// Turns placement's "no capacity" into a refusal that says for when, and what would
    /// work instead: the earliest start for the same size and duration, and other sizes of
    /// the offering free in the asked window (`timeline` covers that window).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn explain_no_capacity(
        &self,
        refusal: Refusal,
        timeline: &Timeline,
        offering: Offering,
        size: &'static Size,
        hours: u32,
        window: Window,
        now: i64,
    ) -> Error {
        let Refusal::NoCapacity { size: what, detail, .. } = refusal else { return refusal.into() };
        let when = if window.starts_at > now {
            format!("from {} to {}", utc_short(window.starts_at), utc_short(window.ends_at))
        } else {
            "right now".to_owned()
        };
        let mut hints = Vec::new();
        if let Some(t) = self.earliest_start_on(timeline.gpus(), size.shape, hours, window.starts_at, now) {
            hints.push(format!("the earliest start for {hours} h is {}", utc_short(t)));
        }
        let others: Vec<&str> = offering
            .sizes()
            .iter()
            .filter(|s| {
                s.id != size.id && s.gpu_model() == size.gpu_model() && timeline.free_count(s.shape, window) > 0
            })
            .map(|s| s.label)
            .collect();
        if !others.is_empty() {
            hints.push(format!("free for that window: {}", others.join(", ")));
        }
        let hint = if hints.is_empty() { String::new() } else { format!(". Instead: {}", hints.join("; ")) };
        Refusal::NoCapacity { size: what, when, detail, hint }.into()
    }
}

impl Platform {
    /// The earliest start at or after `not_before` for `shape` held `hours` on `gpus`,
    /// ending within the horizon. Searched a week at a time (then two, four, ...), so the
    /// common answer, something soon, looks at few bookings.
    fn earliest_start_on(&self, gpus: &[GpuUnit], shape: Shape, hours: u32, not_before: i64, now: i64) -> Option<i64> {
        let duration = i64::from(hours) * booking::HOUR_MS;
        let last_start = now + self.policy.horizon_ms - duration;
        let (mut from, mut chunk) = (not_before, 7 * booking::DAY_MS);
        while from <= last_start {
            // Starts in [from, to]; the timeline holds every booking such a window could meet.
            let to = (from + chunk).min(last_start);
            let timeline = self.timeline_of(gpus, now, Some(Window { starts_at: from, ends_at: to + duration }), true);
            if let Some(t) = timeline.earliest_start(shape, duration, from, to + duration) {
                return Some(t);
            }
            if to == last_start {
                break;
            }
            (from, chunk) = (to, chunk * 2);
        }
        None
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
