//! Booking in time: availability for the calendar and the launch form, earliest starts,
//! changing a booking's end, and what a refusal suggests instead.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use berth_domain::Refusal;
use berth_domain::booking::{self, GpuSet, Timeline, Window, utc_short};
use berth_domain::catalog::{Offering, Size};
use berth_domain::gpu::GpuModel;
use berth_domain::lifecycle::{Desired, EnvState};
use berth_domain::metering::Month;
use berth_domain::placement::{Hold, Occupant, Shape};
use berth_domain::policy::Action;
use berth_domain::rates::RateKey;

use sqlx::SqliteConnection;

use crate::audit::{self, Event, Outcome};
use crate::capacity::budgets::BookingCost;
use crate::capacity::calendars::CalendarKey;
use crate::capacity::environments::{Environment, environment_in};
use crate::capacity::quotas::{Booker, QuotaAsk};
use crate::{Caller, Error, Platform, now_ms};

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
        Shape::Share { ways, .. } => (0, u32::from(u8::MAX - ways)),
        Shape::MigSlice { profile, .. } => (1, u32::from(profile.compute_slices())),
        Shape::Gpus { count, .. } => (2, count),
        Shape::Nodes { count, .. } => (3, count),
    }
}

/// How much of one size is free, for the launch form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeAvailability {
    pub size: &'static Size,
    /// How many fit for the asked duration from the asked start (now when none).
    pub free_now: u32,
    /// The asked start when one fits, else the earliest start after it within the horizon,
    /// if any (within the asker's budgets, when asked for them).
    pub earliest_start: Option<i64>,
    /// Why the asker's budgets would refuse the size at its first fit ("this booking costs
    /// $12.80 for 4 h; project vision has $7.20 of $50.00 left in November"), so that
    /// `earliest_start` is the first fit from a month they allow.
    pub over_budget: Option<String>,
}

/// A booking asked for, as a refusal explains it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Asked {
    pub offering: Offering,
    pub size: &'static Size,
    pub hours: u32,
    pub window: Window,
    /// Who asks: a hard tenant sees only nodes free of other tenants, and the others only
    /// nodes no hard tenant holds.
    pub occupant: Occupant,
}

impl Platform {
    /// Who a user of `tenant` (`None`: platform staff, or nobody signed in) books as.
    async fn occupant_for(&self, tenant: Option<i64>) -> Result<Occupant, Error> {
        let mut conn = self.db.acquire().await?;
        crate::capacity::book::occupant_of(&mut conn, tenant).await
    }

    /// The availability calendar as `caller` sees it: counted as their tenant could book
    /// (a hard tenant's people see the nodes free of others).
    pub async fn calendar(
        &self,
        caller: &Caller,
        from: i64,
        bucket_ms: i64,
        buckets: usize,
    ) -> Result<Availability, Error> {
        self.authorize_in_tenant(caller, Action::CalendarRead).await?;
        self.availability(caller.tenant_id(), from, bucket_ms, buckets).await
    }

    /// Free capacity of every catalog shape in `buckets` consecutive buckets of `bucket_ms`
    /// from `from`, as a user of `tenant` (`None`: platform staff) could book it. Made
    /// once for everyone asking the same until a booking or the fleet changes, or time alone
    /// would change it (see `calendars`).
    pub async fn availability(
        &self,
        tenant: Option<i64>,
        from: i64,
        bucket_ms: i64,
        buckets: usize,
    ) -> Result<Availability, Error> {
        self.ensure_book().await?;
        let occupant = self.occupant_for(tenant).await?;
        let key = CalendarKey { occupant, from, bucket_ms, buckets };
        if let Some(kept) = self.calendars.get(&key, now_ms()) {
            return Ok((*kept).clone());
        }
        let _making = self.calendars.making(&key).await;
        let now = now_ms();
        if let Some(kept) = self.calendars.get(&key, now) {
            return Ok((*kept).clone());
        }
        // Read before the book and the fleet: a change meanwhile makes this one stale.
        let generation = self.calendars.generation();
        // One connection for every model's GPUs (cached after the first read), not one per
        // model; taken only once the turn to make the calendar is ours.
        let mut conn = self.db.acquire().await?;
        let all_shapes = catalog_shapes();
        let models: BTreeSet<GpuModel> = all_shapes.iter().map(|s| s.model()).collect();
        let range = Window { starts_at: from, ends_at: from + bucket_ms * buckets as i64 };
        let mut rows = Vec::new();
        for model in models {
            let gpus = self.gpus_of_model(&mut conn, model).await?;
            let timeline = self.timeline_of(&gpus, now, Some(range), true);
            if timeline.gpus().is_empty() {
                continue;
            }
            let empty = Timeline::on(timeline.set().clone(), 0, |_, _| {});
            let shapes: Vec<Shape> = all_shapes.iter().copied().filter(|s| s.model() == model).collect();
            let capacities = empty.heatmaps(&shapes, from, bucket_ms, 1, occupant);
            let free = timeline.heatmaps(&shapes, from, bucket_ms, buckets, occupant);
            for ((shape, capacity), free) in shapes.into_iter().zip(capacities).zip(free) {
                let capacity = capacity.first().copied().unwrap_or(0);
                if capacity > 0 {
                    rows.push(AvailabilityRow { shape, capacity, free });
                }
            }
        }
        let calendar = Availability { from, bucket_ms, rows };
        let fresh_until = key.fresh_until(now, self.policy.cleaning_gap_ms);
        self.calendars.keep(key, generation, now, fresh_until, Arc::new(calendar.clone()));
        Ok(calendar)
    }

    /// For the launch form: per size of `offering`, how many fit for `hours` from `start`
    /// (now when `None` or past) for a user of `tenant`, and the earliest start after it for
    /// one when none does.
    pub async fn size_availability(
        &self,
        tenant: Option<i64>,
        offering: Offering,
        hours: u32,
        start: Option<i64>,
    ) -> Result<Vec<SizeAvailability>, Error> {
        let now = now_ms();
        let from = start.map_or(now, |start| start.max(now));
        let occupant = self.occupant_for(tenant).await?;
        let window = Window { starts_at: from, ends_at: from + i64::from(hours) * booking::HOUR_MS };
        let mut timelines: HashMap<GpuModel, Timeline> = HashMap::new();
        let mut out = Vec::new();
        for size in offering.sizes() {
            let model = size.gpu_model();
            if let std::collections::hash_map::Entry::Vacant(entry) = timelines.entry(model) {
                entry.insert(self.timeline(model, now, Some(window)).await?);
            }
            let Some(timeline) = timelines.get(&model) else { continue };
            let free_now = timeline.free_count(size.shape, window, occupant);
            let earliest_start = if free_now > 0 {
                Some(from)
            } else {
                self.earliest_start_on(timeline.set(), size.shape, hours, from, now, occupant)
            };
            out.push(SizeAvailability { size, free_now, earliest_start, over_budget: None });
        }
        Ok(out)
    }

    /// `size_availability` for `caller` booking in `project` (its id, as the launch form and
    /// the API name it; empty: none), within their budgets: a size whose first fit a budget
    /// would refuse is looked for again from the next month's first hour, month after month
    /// within the horizon, as a launch "as soon as possible" is. Only reads.
    pub async fn size_availability_within_budget(
        &self,
        caller: &Caller,
        project: &str,
        offering: Offering,
        hours: u32,
        start: Option<i64>,
    ) -> Result<Vec<SizeAvailability>, Error> {
        // A project the caller may not book in is refused as the launch refuses it (platform
        // staff book in none).
        let project_id = self.project_to_book_in(&mut *self.db.acquire().await?, caller, project).await?;
        let mut sizes = self.size_availability(caller.tenant_id(), offering, hours, start).await?;
        if caller.tenant_id().is_none() {
            return Ok(sizes);
        }
        let now = now_ms();
        let mut conn = self.db.acquire().await?;
        let booker = Booker { user_id: caller.user_id(), tenant_id: caller.tenant_id(), project_id };
        let occupant = crate::capacity::book::occupant_of(&mut conn, booker.tenant_id).await?;
        let card = crate::capacity::rates::rate_card(&mut conn).await?;
        for size in &mut sizes {
            let shape = size.size.shape;
            let gpus = self.gpus_of_model(&mut conn, shape.model()).await?;
            let mut fit = size.earliest_start;
            while let Some(start) = fit {
                let window = Window { starts_at: start, ends_at: start + i64::from(hours) * booking::HOUR_MS };
                match self
                    .budget_marks(
                        &mut conn,
                        booker,
                        BookingCost::of_size(shape, booking::Tier::Guaranteed, window, hours),
                        &card,
                    )
                    .await
                {
                    Ok(_) => break,
                    Err(Error::Refused(Refusal::OverBudget(why))) => {
                        size.over_budget.get_or_insert(why);
                        let next_month = Month::of(start).next().starts_at();
                        fit = self.earliest_start_on(&gpus, shape, hours, next_month, now, occupant);
                    }
                    Err(e) => return Err(e),
                }
            }
            size.earliest_start = fit;
        }
        Ok(sizes)
    }

    /// The earliest start at or after `not_before` for `shape` held `hours` by a user of
    /// `tenant`, within the booking horizon.
    pub async fn earliest_start(
        &self,
        tenant: Option<i64>,
        shape: Shape,
        hours: u32,
        not_before: i64,
    ) -> Result<Option<i64>, Error> {
        let now = now_ms();
        let occupant = self.occupant_for(tenant).await?;
        self.ensure_book().await?;
        let mut conn = self.db.acquire().await?;
        let gpus = self.gpus_of_model(&mut conn, shape.model()).await?;
        Ok(self.earliest_start_on(&gpus, shape, hours, not_before.max(now), now, occupant))
    }

    /// Moves the end of a booked or running environment. Longer needs its own GPUs free
    /// for the extra time (with the cleaning gap) and room in the quota; shorter always
    /// works while the new end is after now.
    pub async fn change_end(&self, caller: &Caller, id: &str, new_end: &str) -> Result<Environment, Error> {
        let new_end = booking::parse_end(new_end)?;
        let now = now_ms();
        self.environment_for(caller, id, Action::EnvironmentChange).await?;
        let mut tx = self.begin_write().await?;
        let env = environment_in(&mut tx, id).await?;
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
            let gap = self.policy.cleaning_gap_ms;
            // Only bookings near the new window can stand in its way.
            let all = self.book_bookings(gpus.gpus(), now, None, Some(window.widened(gap)));
            let (own, others): (Vec<_>, Vec<_>) =
                all.into_iter().map(|b| (b.environment_id, b.booking)).partition(|(env_id, _)| &**env_id == id);
            let node_of: HashMap<i64, i64> = gpus.gpus().iter().map(|g| (g.id, g.node_id)).collect();
            let own_nodes: BTreeSet<i64> =
                own.iter().filter_map(|(_, o)| node_of.get(&o.hold.gpu_id).copied()).collect();
            let occupant = own.first().map(|(_, o)| o.occupant).unwrap_or(Occupant::Sharing);
            // The first booking in the way: on its own GPUs, or on its nodes by a tenant it
            // may not share a node with (`true`).
            let blocking = others
                .iter()
                .filter(|(_, b)| b.window.conflicts(window, gap))
                .filter_map(|(_, b)| {
                    let on_its_gpus = own
                        .iter()
                        .any(|(_, o)| o.hold.gpu_id == b.hold.gpu_id && o.hold.slices.overlaps(b.hold.slices));
                    let on_its_nodes = b.occupant.excludes(occupant)
                        && node_of.get(&b.hold.gpu_id).is_some_and(|n| own_nodes.contains(n));
                    (on_its_gpus || on_its_nodes).then_some((b.window.starts_at, !on_its_gpus))
                })
                .min();
            if let Some((next_start, tenant_in_the_way)) = blocking {
                let latest = next_start - gap;
                let detail = if tenant_in_the_way {
                    format!(
                        "its node is held by another tenant from {} (a hard-isolated tenant never shares a node)",
                        utc_short(next_start)
                    )
                } else {
                    format!("its capacity is taken from {} (another booking or maintenance)", utc_short(next_start))
                };
                return Err(Refusal::NoCapacity {
                    size: env.size.shape.describe(),
                    when: format!("until {}", utc_short(window.ends_at)),
                    detail,
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
            self.check_quota(&mut tx, env.booker(), ask, Some(id)).await?;
            // The budget counts what the extension adds, for each unit it holds.
            let added = Window { starts_at: current.ends_at.max(now), ends_at: window.ends_at };
            let cost = BookingCost {
                what: "extension",
                key: RateKey::of_shape(env.size.shape).0,
                units: i64::try_from(held.len()).unwrap_or(i64::MAX),
                tier: env.tier,
                window: added,
                hours: berth_domain::metering::started_hours(added.ends_at - added.starts_at),
            };
            let card = crate::capacity::rates::rate_card(&mut tx).await?;
            self.check_budgets(&mut tx, caller, env.booker(), cost, &card).await?;
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
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit_and(|| self.with_book(|book| book.set_end(id, window.ends_at))).await?;
        self.wake_reconciler();
        self.environment_of(caller, id).await
    }
}

impl Platform {
    /// Turns placement's "no capacity" into a refusal that says for when, and what would
    /// work instead: the earliest start for the same size and duration, and other sizes of
    /// the offering (of any GPU model) free in the asked window. `timeline` is the asked
    /// model's; the caller holds the writer turn on `conn`.
    pub(crate) async fn explain_no_capacity(
        &self,
        conn: &mut SqliteConnection,
        refusal: Refusal,
        timeline: &Timeline,
        asked: Asked,
        now: i64,
    ) -> Result<Error, Error> {
        let Asked { offering, size, hours, window, occupant } = asked;
        let Refusal::NoCapacity { size: what, detail, .. } = refusal else { return Ok(refusal.into()) };
        let when = if window.starts_at > now {
            format!("from {} to {}", utc_short(window.starts_at), utc_short(window.ends_at))
        } else {
            "right now".to_owned()
        };
        let mut hints = Vec::new();
        if let Some(t) = self.earliest_start_on(timeline.set(), size.shape, hours, window.starts_at, now, occupant) {
            hints.push(format!("the earliest start for {hours} h is {}", utc_short(t)));
        }
        let mut others: Vec<&str> = Vec::new();
        for other in offering.sizes().iter().filter(|s| s.id != size.id) {
            let free = if other.gpu_model() == size.gpu_model() {
                timeline.free_count(other.shape, window, occupant)
            } else {
                let gpus = self.gpus_of_model(conn, other.gpu_model()).await?;
                self.timeline_of(&gpus, now, Some(window), true).free_count(other.shape, window, occupant)
            };
            if free > 0 {
                others.push(other.label);
            }
        }
        if !others.is_empty() {
            hints.push(format!("free for that window: {}", others.join(", ")));
        }
        let hint = if hints.is_empty() { String::new() } else { format!(". Instead: {}", hints.join("; ")) };
        Ok(Refusal::NoCapacity { size: what, when, detail, hint }.into())
    }
}

impl Platform {
    /// The earliest start at or after `not_before` for `shape` held `hours` on `gpus` by
    /// `occupant`, ending within the horizon. Searched a week at a time (then two, four,
    /// ...), so the common answer, something soon, looks at few bookings.
    pub(crate) fn earliest_start_on(
        &self,
        gpus: &Arc<GpuSet>,
        shape: Shape,
        hours: u32,
        not_before: i64,
        now: i64,
        occupant: Occupant,
    ) -> Option<i64> {
        let duration = i64::from(hours) * booking::HOUR_MS;
        let last_start = now + self.policy.horizon_ms - duration;
        let (mut from, mut chunk) = (not_before, 7 * booking::DAY_MS);
        while from <= last_start {
            // Starts in [from, to]; the timeline holds every booking such a window could meet.
            let to = (from + chunk).min(last_start);
            let timeline = self.timeline_of(gpus, now, Some(Window { starts_at: from, ends_at: to + duration }), true);
            if let Some(t) = timeline.earliest_start(shape, duration, from, to + duration, occupant) {
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
