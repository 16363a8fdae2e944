//! The booking book: every unreleased reservation and maintenance window held in memory,
//! and the timelines built from it for placement, the calendar and earliest starts.

use std::collections::HashMap;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use berth_domain::booking::{Booking, GpuSet, Timeline, Window};
use berth_domain::gpu::GpuModel;
use berth_domain::mig::{MigProfile, SliceRange};
use berth_domain::placement::{self, Capacity, GpuUnit, Hold, Occupant, Shape};
use berth_domain::tenancy::Isolation;
use sqlx::{Row, SqliteConnection};

use crate::capacity::quotas::{Booker, Holder};
use crate::store::WriteTx;
use crate::{Error, Platform, now_ms, read, write};

/// Every unreleased reservation, by GPU, held in memory: the calendar and every booking
/// read it instead of tens of thousands of rows.
///
/// It is loaded once from the database and then changed only by writers holding the
/// writer turn, right after their commit (`WriteTx::commit_and`), so it always equals
/// the committed table. The database stays the authority: its trigger refuses an
/// overlapping reservation even if this copy were ever wrong.
///
/// A group commit of launches (`group_commit`) decides several bookings before its one
/// COMMIT; each must see those decided before it. They wait in `deciding`, which only the
/// task deciding them sees (as a transaction sees its own writes), and join the book
/// itself only after the COMMIT.
#[derive(Debug, Default)]
pub(crate) struct BookingBook {
    /// Every booking reads each of its model's GPUs here (10,000 in the contention
    /// benchmark), so by id without hashing.
    by_gpu: ByGpu,
    by_environment: HashMap<Arc<str>, Vec<i64>>,
    deciding: Deciding,
}

/// Bookings decided in the open group commit and not committed yet.
#[derive(Debug, Default)]
struct Deciding {
    /// Who decided them, holding the writer turn.
    task: Option<DecidingTask>,
    by_gpu: ByGpu,
}

/// The bookings of each GPU, by GPU id. Ids are the `gpus` table's row ids, which SQLite
/// hands out from 1 up, so a vector indexed by id is as long as the fleet has ever been;
/// an id beyond [`ByGpu::DENSE`] (only written by hand) goes to a map instead.
#[derive(Debug, Default)]
struct ByGpu {
    dense: Vec<Vec<Held>>,
    sparse: FxHashMap<i64, Vec<Held>>,
    /// Bookings held, so an empty one is known without a look.
    count: usize,
    /// Those of them held by a hard or hybrid tenant, which may keep others off a node.
    dedicated: usize,
}

impl ByGpu {
    const DENSE: i64 = 1 << 20;

    #[inline]
    fn get(&self, gpu_id: i64) -> &[Held] {
        match usize::try_from(gpu_id) {
            Ok(i) if gpu_id < Self::DENSE => self.dense.get(i).map_or(&[], Vec::as_slice),
            _ => self.sparse.get(&gpu_id).map_or(&[], Vec::as_slice),
        }
    }

    fn get_mut(&mut self, gpu_id: i64) -> Option<&mut Vec<Held>> {
        match usize::try_from(gpu_id) {
            Ok(i) if gpu_id < Self::DENSE => self.dense.get_mut(i),
            _ => self.sparse.get_mut(&gpu_id),
        }
    }

    fn push(&mut self, held: Held) {
        let gpu_id = held.booking.hold.gpu_id;
        self.count += 1;
        self.dedicated += usize::from(held.booking.occupant.is_dedicated());
        match usize::try_from(gpu_id) {
            Ok(i) if gpu_id < Self::DENSE => {
                if self.dense.len() <= i {
                    self.dense.resize_with(i + 1, Vec::new);
                }
                self.dense[i].push(held);
            }
            _ => self.sparse.entry(gpu_id).or_default().push(held),
        }
    }

    /// Drops the bookings of `gpu_id` that `drop` picks.
    fn remove(&mut self, gpu_id: i64, drop: impl Fn(&Held) -> bool) {
        let Some(list) = self.get_mut(gpu_id) else { return };
        let mut dropped = (0, 0);
        list.retain(|h| {
            let gone = drop(h);
            if gone {
                dropped.0 += 1;
                dropped.1 += usize::from(h.booking.occupant.is_dedicated());
            }
            !gone
        });
        self.count -= dropped.0;
        self.dedicated -= dropped.1;
    }

    fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Changes the occupant of every booking `change` picks.
    fn set_occupant(&mut self, change: impl Fn(&Held) -> bool, occupant: Occupant) {
        let all = self.dense.iter_mut().chain(self.sparse.values_mut()).flatten();
        self.dedicated = 0;
        for held in all {
            if change(held) {
                held.booking.occupant = occupant;
            }
            self.dedicated += usize::from(held.booking.occupant.is_dedicated());
        }
    }
}

/// The task running a group commit's leader; a future run by `block_on` (a test's body)
/// is no task, and is known by its thread, which polls nothing else meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DecidingTask {
    Task(tokio::task::Id),
    Thread(std::thread::ThreadId),
}

impl DecidingTask {
    pub(crate) fn current() -> DecidingTask {
        tokio::task::try_id().map_or_else(|| DecidingTask::Thread(std::thread::current().id()), DecidingTask::Task)
    }
}

#[derive(Debug, Clone)]
struct Held {
    /// The environment, or `maintenance:<id>` for a maintenance window.
    environment_id: Arc<str>,
    /// Nobody (user 0) for a maintenance window.
    booker: Booker,
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
                    e.tier = 'spot', e.tenant_id, e.project_id, t.isolation
             FROM reservations r JOIN environments e ON e.id = r.environment_id
             LEFT JOIN tenants t ON t.id = e.tenant_id
             WHERE r.released_at IS NULL",
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
            let booker = Booker { user_id: row.try_get(1)?, tenant_id: row.try_get(9)?, project_id: row.try_get(10)? };
            let isolation: Option<&str> = row.try_get(11)?;
            let occupant = Occupant::of(booker.tenant_id, parse_isolation(isolation)?);
            book.insert(env, booker, Booking { hold, window, occupant }, true, row.try_get(8)?);
        }
        let maintenance: Vec<(i64, i64, i64, i64)> = sqlx::query_as(
            "SELECT m.id, g.id, m.starts_at, m.ends_at FROM maintenance_windows m
             JOIN gpus g ON (m.gpu_id IS NULL AND g.node_id = m.node_id) OR g.id = m.gpu_id
             WHERE m.cancelled_at IS NULL AND m.ends_at > ?",
        )
        .bind(now_ms())
        .fetch_all(&mut *conn)
        .await?;
        for (id, gpu, starts_at, ends_at) in maintenance {
            book.add_maintenance(&crate::capacity::maintenance::hold_id(id), &[gpu], Window { starts_at, ends_at });
        }
        Ok(book)
    }

    fn insert(&mut self, environment_id: Arc<str>, booker: Booker, booking: Booking, until_released: bool, spot: bool) {
        let gpu = booking.hold.gpu_id;
        self.by_environment.entry(environment_id.clone()).or_default().push(gpu);
        self.by_gpu.push(Held { environment_id, booker, booking, until_released, spot });
    }

    /// After a maintenance window on `gpus` committed: each GPU is taken whole.
    pub(crate) fn add_maintenance(&mut self, id: &str, gpus: &[i64], window: Window) {
        let id: Arc<str> = Arc::from(id);
        for &gpu_id in gpus {
            let hold = Hold { gpu_id, slices: SliceRange::WHOLE_GPU, profile: None };
            self.insert(id.clone(), Booker::NOBODY, Booking { hold, window, occupant: Occupant::Nobody }, false, false);
        }
    }

    /// After a launch committed `holds` for `window`, held by `occupant`.
    pub(crate) fn add(
        &mut self,
        environment_id: &str,
        booker: Booker,
        occupant: Occupant,
        holds: &[Hold],
        window: Window,
        spot: bool,
    ) {
        let id: Arc<str> = Arc::from(environment_id);
        for &hold in holds {
            self.insert(id.clone(), booker, Booking { hold, window, occupant }, true, spot);
        }
    }

    /// A launch decided in the open group commit: seen by the deciding task alone until
    /// [`BookingBook::add`] enters it after the COMMIT.
    pub(crate) fn decide(
        &mut self,
        environment_id: &str,
        booker: Booker,
        occupant: Occupant,
        holds: &[Hold],
        window: Window,
        spot: bool,
    ) {
        let id: Arc<str> = Arc::from(environment_id);
        self.deciding.task = Some(DecidingTask::current());
        for &hold in holds {
            let held = Held {
                environment_id: id.clone(),
                booker,
                booking: Booking { hold, window, occupant },
                until_released: true,
                spot,
            };
            self.deciding.by_gpu.push(held);
        }
    }

    /// Before the group commit `task` led commits (the book then takes its launches), or
    /// when it ends without: what it decided is seen no more.
    pub(crate) fn forget_decided_by(&mut self, task: DecidingTask) {
        if self.deciding.task == Some(task) {
            self.deciding = Deciding::default();
        }
    }

    /// Whether the caller is the leader deciding the open group commit, and so sees it.
    fn sees_decided(&self) -> bool {
        !self.deciding.by_gpu.is_empty() && self.deciding.task == Some(DecidingTask::current())
    }

    /// After a tenant's isolation changed: its bookings are held by `occupant` now.
    pub(crate) fn set_occupant(&mut self, tenant_id: i64, occupant: Occupant) {
        self.by_gpu.set_occupant(|held| held.booker.tenant_id == Some(tenant_id) && held.until_released, occupant);
    }

    /// After a change of end committed.
    pub(crate) fn set_end(&mut self, environment_id: &str, ends_at: i64) {
        for gpu in self.by_environment.get(environment_id).into_iter().flatten() {
            for held in self.by_gpu.get_mut(*gpu).into_iter().flatten() {
                if &*held.environment_id == environment_id {
                    held.booking.window.ends_at = ends_at;
                }
            }
        }
    }

    /// After an environment's capacity was released.
    pub(crate) fn release(&mut self, environment_id: &str) {
        for gpu in self.by_environment.remove(environment_id).into_iter().flatten() {
            self.by_gpu.remove(gpu, |h| &*h.environment_id == environment_id);
        }
    }

    /// Bookings on `gpus` that overlap `range` (any with `None`), optionally only those
    /// counted against one user, project or tenant.
    fn bookings(&self, gpus: &[GpuUnit], now: i64, holder: Option<Holder>, range: Option<Window>) -> Vec<BookedBy> {
        let mut out = Vec::new();
        let decided = self.sees_decided();
        for gpu in gpus {
            for held in self.held_on(gpu.id, now, range, decided) {
                if holder.is_none_or(|h| held.booker.counts_for(h)) {
                    out.push(BookedBy {
                        environment_id: held.environment_id.clone(),
                        booking: held.booking_until(now),
                        spot: held.spot,
                    });
                }
            }
        }
        out
    }

    /// What is held on `gpu_id` that overlaps `range` (everything with `None`), with what
    /// the open group commit decided if `decided` (see [`BookingBook::sees_decided`]).
    fn held_on(&self, gpu_id: i64, now: i64, range: Option<Window>, decided: bool) -> impl Iterator<Item = &Held> {
        let decided = if decided { self.deciding.by_gpu.get(gpu_id) } else { &[] };
        self.by_gpu
            .get(gpu_id)
            .iter()
            .chain(decided)
            .filter(move |held| range.is_none_or(|r| held.window_until(now).conflicts(r, 0)))
    }
}

/// The book on a set of GPUs during a window, as placement reads it: what `timeline_of`
/// would copy for the window, read where it is.
struct BookIn<'a> {
    book: &'a BookingBook,
    set: &'a GpuSet,
    /// The window widened by the cleaning gap.
    range: Window,
    now: i64,
    decided: bool,
}

impl Capacity for BookIn<'_> {
    fn node_count(&self) -> usize {
        self.set.node_count()
    }

    fn gpus_of(&self, n: usize) -> &[GpuUnit] {
        self.set.node_gpus(n)
    }

    fn holds_on(&self, n: usize, i: usize) -> impl Iterator<Item = Hold> + '_ {
        let gpu = &self.set.node_gpus(n)[i];
        self.book.held_on(gpu.id, self.now, Some(self.range), self.decided).map(|held| held.booking.hold)
    }

    /// As `holds_on(n, i).next().is_none()`, in a plain loop over the GPU's bookings.
    fn is_free(&self, n: usize, i: usize) -> bool {
        let id = self.set.node_gpus(n)[i].id;
        let conflicts = |held: &Held| held.window_until(self.now).conflicts(self.range, 0);
        let decided = if self.decided { self.book.deciding.by_gpu.get(id) } else { &[] };
        !self.book.by_gpu.get(id).iter().any(conflicts) && !decided.iter().any(conflicts)
    }
}

/// A tenant's isolation as stored; `None` (platform staff) shares like a soft tenant.
pub(crate) fn parse_isolation(isolation: Option<&str>) -> Result<Isolation, Error> {
    isolation.map_or(Ok(Isolation::Soft), |i| Isolation::parse(i).map_err(|_| Error::internal("unknown isolation")))
}

/// Who a booking of `tenant_id` (`None`: platform staff) is to placement, read in the
/// caller's transaction so a launch and its tenant's isolation agree.
pub(crate) async fn occupant_of(conn: &mut SqliteConnection, tenant_id: Option<i64>) -> Result<Occupant, Error> {
    let Some(id) = tenant_id else { return Ok(Occupant::Sharing) };
    let isolation: Option<String> =
        sqlx::query_scalar("SELECT isolation FROM tenants WHERE id = ?").bind(id).fetch_optional(&mut *conn).await?;
    Ok(Occupant::of(tenant_id, parse_isolation(isolation.as_deref())?))
}

impl Held {
    /// The booking as it holds its unit now: one held past its end (teardown still
    /// running) holds it until `now`.
    fn booking_until(&self, now: i64) -> Booking {
        Booking { window: self.window_until(now), ..self.booking }
    }

    /// Its window as it holds its unit now (see [`Held::booking_until`]).
    #[inline]
    fn window_until(&self, now: i64) -> Window {
        let end = self.booking.window.ends_at;
        let ends_at = if self.until_released { end.max(now) } else { end };
        Window { ends_at, ..self.booking.window }
    }
}

impl Platform {
    /// Runs `f` on the booking book; for writers holding the turn, right after commit.
    pub(crate) fn with_book(&self, f: impl FnOnce(&mut BookingBook)) {
        if let Some(book) = write(&self.book).as_mut() {
            f(book);
        }
        // After the change: a calendar made from the book before it is not handed out.
        self.calendars.changed();
    }

    /// Loads the booking book if it is not yet. The caller holds the writer turn, so no
    /// commit can slip between the load and the book.
    pub(crate) async fn load_book(&self, conn: &mut SqliteConnection) -> Result<(), Error> {
        if read(&self.book).is_none() {
            let book = BookingBook::load(conn).await?;
            *write(&self.book) = Some(book);
            self.calendars.changed();
        }
        Ok(())
    }

    /// For readers not holding the writer turn: takes it just to load the book once.
    pub(crate) async fn ensure_book(&self) -> Result<(), Error> {
        if read(&self.book).is_some() {
            return Ok(());
        }
        let mut tx = self.begin_write().await?;
        self.load_book(&mut tx).await
    }

    pub(crate) fn book_bookings(
        &self,
        gpus: &[GpuUnit],
        now: i64,
        holder: Option<Holder>,
        range: Option<Window>,
    ) -> Vec<BookedBy> {
        read(&self.book).as_ref().map(|book| book.bookings(gpus, now, holder, range)).unwrap_or_default()
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

    /// Capacity for `shape` during `window`, as `timeline_in(..).place(..)` would choose it,
    /// for a writer holding the turn; read from the book where it is, without building a
    /// timeline of the model's GPUs (about a fifth of a booking's turn on 10,000 GPUs).
    /// `None` where that does not apply: when a hard or hybrid tenant's booking could keep
    /// the asker off a node (the timeline knows which nodes), or when nothing fits (the
    /// timeline explains the refusal).
    pub(crate) async fn place_from_book(
        &self,
        tx: &mut WriteTx,
        shape: Shape,
        window: Window,
        now: i64,
        asker: Occupant,
    ) -> Result<Option<Vec<Hold>>, Error> {
        self.load_book(tx).await?;
        let set = self.gpus_of_model(tx, shape.model()).await?;
        let book = read(&self.book);
        let Some(book) = book.as_ref() else { return Ok(None) };
        let decided = book.sees_decided();
        let barring = book.by_gpu.dedicated > 0 || (decided && book.deciding.by_gpu.dedicated > 0);
        if barring || asker.is_dedicated() {
            return Ok(None);
        }
        let range = window.widened(self.policy.cleaning_gap_ms);
        Ok(placement::place_on(shape, &BookIn { book, set: &set, range, now, decided }).ok())
    }

    /// The same for readers.
    pub(crate) async fn timeline(&self, model: GpuModel, now: i64, range: Option<Window>) -> Result<Timeline, Error> {
        self.ensure_book().await?;
        let mut conn = self.db.acquire().await?;
        let gpus = self.gpus_of_model(&mut conn, model).await?;
        Ok(self.timeline_of(&gpus, now, range, true))
    }

    /// The timeline of `gpus` with the bookings that could matter during `range`; without
    /// spot bookings it shows what a guaranteed booking could have by reclaiming them.
    pub(crate) fn timeline_of(&self, gpus: &Arc<GpuSet>, now: i64, range: Option<Window>, with_spot: bool) -> Timeline {
        let gap = self.policy.cleaning_gap_ms;
        let range = range.map(|r| r.widened(gap));
        let book = read(&self.book);
        let decided = book.as_ref().is_some_and(BookingBook::sees_decided);
        Timeline::on(gpus.clone(), gap, |gpu, out| {
            if let Some(book) = book.as_ref() {
                let held = book.held_on(gpu.id, now, range, decided).filter(|h| with_spot || !h.spot);
                out.extend(held.map(|h| h.booking_until(now)));
            }
        })
    }
}
