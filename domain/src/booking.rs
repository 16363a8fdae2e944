//! Advance booking: windows in time, the rules a window must follow, what is free when,
//! and per-user quotas.
//!
//! Everything here is a pure function of the fleet, the bookings already held and the
//! clock passed in, so the platform can run it inside the transaction that records a
//! booking, and the availability shown to users is computed by the same placement rules
//! that later place the booking.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use chrono::{DateTime, NaiveDateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::Refusal;
use crate::gpu::GpuModel;
use crate::mig::{MEMORY_SLICES, MigInstance, MigLayout, MigProfile};
use crate::placement::{self, Assignment, GpuUnit, Hold, Occupant, Shape, Span};

pub const MINUTE_MS: i64 = 60_000;
pub const HOUR_MS: i64 = 60 * MINUTE_MS;
pub const DAY_MS: i64 = 24 * HOUR_MS;

/// Rules every booking follows, set by the platform operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BookingPolicy {
    /// Time a unit stays free between two bookings, for scrubbing and health checks.
    pub cleaning_gap_ms: i64,
    /// How far ahead a booking may end.
    pub horizon_ms: i64,
    /// A start this little in the past still counts as "now" (the form took a while).
    pub start_grace_ms: i64,
}

impl Default for BookingPolicy {
    fn default() -> BookingPolicy {
        BookingPolicy { cleaning_gap_ms: 15 * MINUTE_MS, horizon_ms: 90 * DAY_MS, start_grace_ms: 5 * MINUTE_MS }
    }
}

/// A half-open interval of time `[starts_at, ends_at)` in unix milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Window {
    pub starts_at: i64,
    pub ends_at: i64,
}

impl Window {
    pub fn hours(self) -> f64 {
        (self.ends_at - self.starts_at) as f64 / HOUR_MS as f64
    }

    /// Whether a booking of `self` and one of `other` may not both hold a unit: they
    /// overlap once each is widened by the cleaning gap.
    #[inline]
    pub fn conflicts(self, other: Window, gap_ms: i64) -> bool {
        self.starts_at < other.ends_at + gap_ms && other.starts_at < self.ends_at + gap_ms
    }

    /// `self` with the cleaning gap on both sides: every booking that `conflicts` with
    /// `self` overlaps this.
    pub fn widened(self, gap_ms: i64) -> Window {
        Window { starts_at: self.starts_at - gap_ms, ends_at: self.ends_at + gap_ms }
    }
}

/// A time as refusals and pages say it: "Tue 24 Nov 14:15 UTC".
pub fn utc_short(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map(|t| t.format("%a %-d %b %H:%M UTC").to_string()).unwrap_or_default()
}

/// Reads the start a user typed: empty for "now", else a UTC date and time as an HTML
/// `datetime-local` input sends it (`2026-11-23T14:00`), or RFC 3339 with an offset.
pub fn parse_start(text: &str) -> Result<Option<i64>, Refusal> {
    let text = text.trim();
    if text.is_empty() || text.eq_ignore_ascii_case("now") {
        return Ok(None);
    }
    parse_time(text).map(Some).map_err(Refusal::InvalidStart)
}

/// Reads a new end a user typed, in the same forms as [`parse_start`]; one is required.
pub fn parse_end(text: &str) -> Result<i64, Refusal> {
    match text.trim() {
        "" => Err(Refusal::InvalidEnd("is required: a date and time like 2026-11-23T18:00 (UTC)".into())),
        text => parse_time(text).map_err(Refusal::InvalidEnd),
    }
}

/// A UTC date and time, or RFC 3339 with an offset; the error says what was typed.
fn parse_time(text: &str) -> Result<i64, String> {
    let parsed = DateTime::parse_from_rfc3339(text)
        .or_else(|_| DateTime::parse_from_str(text, "%Y-%m-%dT%H:%M%:z"))
        .map(|t| t.with_timezone(&Utc))
        .or_else(|_| {
            ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"]
                .iter()
                .find_map(|f| NaiveDateTime::parse_from_str(text, f).ok())
                .map(|t| t.and_utc())
                .ok_or(())
        });
    parsed
        .map(|t| t.timestamp_millis())
        .map_err(|_| format!("\"{text}\" is not a date and time like 2026-11-23T14:00 (UTC)"))
}

/// When something asked to start at `start` (`None`: now) begins: a start a little in the
/// past is now, one further back is refused.
pub fn start_at(start: Option<i64>, now: i64, policy: &BookingPolicy) -> Result<i64, Refusal> {
    match start {
        None => Ok(now),
        Some(s) if s < now - policy.start_grace_ms => Err(Refusal::StartInPast),
        Some(s) => Ok(s.max(now)),
    }
}

/// The window for a new booking of `hours` starting at `start` (`None`: now).
pub fn new_window(start: Option<i64>, hours: u32, now: i64, policy: &BookingPolicy) -> Result<Window, Refusal> {
    let starts_at = start_at(start, now, policy)?;
    let window = Window { starts_at, ends_at: starts_at + i64::from(hours) * HOUR_MS };
    within_horizon(window, now, policy)?;
    Ok(window)
}

/// `current` with its end moved to `new_end` (longer or shorter). A running booking cannot
/// end in the past, and the whole window still follows the offering's and policy's limits.
pub fn resized_window(
    current: Window,
    new_end: i64,
    max_hours: u32,
    now: i64,
    policy: &BookingPolicy,
) -> Result<Window, Refusal> {
    if new_end <= current.starts_at.max(now) {
        return Err(Refusal::EndNotAfterStart);
    }
    let window = Window { starts_at: current.starts_at, ends_at: new_end };
    if window.ends_at - window.starts_at > i64::from(max_hours) * HOUR_MS {
        return Err(Refusal::TooLong { max_hours });
    }
    within_horizon(window, now, policy)?;
    Ok(window)
}

fn within_horizon(window: Window, now: i64, policy: &BookingPolicy) -> Result<(), Refusal> {
    if window.ends_at > now + policy.horizon_ms {
        return Err(Refusal::BeyondHorizon { days: policy.horizon_ms / DAY_MS });
    }
    Ok(())
}

/// Capacity held for a window: what placement sees as a `Hold`, in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Booking {
    pub hold: Hold,
    pub window: Window,
    /// Who holds it: a dedicated tenant's nodes are its own while it holds them.
    pub occupant: Occupant,
}

/// The in-service GPUs of one model (or a few), grouped by node and by model: what
/// every timeline of them shares. Built once per fleet change, not per question.
#[derive(Debug)]
pub struct GpuSet {
    gpus: Vec<GpuUnit>,
    /// In node id order.
    nodes: Vec<NodeGpus>,
    /// Position in `nodes` of each GPU's node.
    node_of: Vec<usize>,
    /// The models present, and the position in it of each GPU's model.
    models: Vec<GpuModel>,
    model_of: Vec<usize>,
}

#[derive(Debug)]
struct NodeGpus {
    /// Positions in `GpuSet::gpus`.
    positions: Vec<usize>,
    /// The same GPUs, for placement.
    units: Vec<GpuUnit>,
}

impl GpuSet {
    pub fn new(gpus: Vec<GpuUnit>) -> GpuSet {
        let mut by_node: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
        let mut models: Vec<GpuModel> = Vec::new();
        let mut model_of = Vec::with_capacity(gpus.len());
        for (i, gpu) in gpus.iter().enumerate() {
            by_node.entry(gpu.node_id).or_default().push(i);
            let slot = models.iter().position(|&m| m == gpu.model).unwrap_or_else(|| {
                models.push(gpu.model);
                models.len() - 1
            });
            model_of.push(slot);
        }
        let mut node_of = vec![0; gpus.len()];
        let nodes = by_node
            .into_values()
            .enumerate()
            .map(|(n, positions)| {
                for &i in &positions {
                    node_of[i] = n;
                }
                NodeGpus { units: positions.iter().map(|&i| gpus[i]).collect(), positions }
            })
            .collect();
        GpuSet { gpus, nodes, node_of, models, model_of }
    }

    pub fn gpus(&self) -> &[GpuUnit] {
        &self.gpus
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The GPUs of the node at `n`, in node id order.
    pub fn node_gpus(&self, n: usize) -> &[GpuUnit] {
        &self.nodes[n].units
    }

    fn model_slot(&self, model: GpuModel) -> Option<usize> {
        self.models.iter().position(|&m| m == model)
    }

    /// Whether the node at `n` holds GPUs of `model` (a node holds one model).
    fn node_is(&self, n: usize, model: GpuModel) -> bool {
        self.nodes[n].units.first().is_some_and(|g| g.model == model)
    }
}

/// A set of GPUs with every booking on them, indexed for the questions the launch form
/// and the calendar ask: what is free in a window, how much over time, and the earliest
/// start that fits.
#[derive(Debug, Clone)]
pub struct Timeline {
    set: Arc<GpuSet>,
    /// The bookings of every GPU, those of `set.gpus[i]` at `bookings[starts[i]..starts[i + 1]]`,
    /// each GPU's by start: one allocation however many GPUs.
    bookings: Vec<Booking>,
    starts: Vec<usize>,
    gap_ms: i64,
    /// The occupants of `bookings` besides maintenance: none, one, or several. Most
    /// fleets have no dedicated tenant on most days, and then nobody is kept off a node.
    occupants: Occupants,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Occupants {
    None,
    Only(Occupant),
    Several,
}

/// A timeline during one window, as placement reads it: every GPU with what holds it at
/// any time during the window (cleaning gap included), without copying either.
struct InWindow<'a> {
    timeline: &'a Timeline,
    window: Window,
}

impl placement::Capacity for InWindow<'_> {
    fn node_count(&self) -> usize {
        self.timeline.set.node_count()
    }

    fn gpus_of(&self, n: usize) -> &[GpuUnit] {
        self.timeline.set.node_gpus(n)
    }

    fn holds_on(&self, n: usize, i: usize) -> impl Iterator<Item = Hold> + '_ {
        self.timeline.during(self.timeline.set.nodes[n].positions[i], self.window).map(|b| b.hold)
    }
}

/// How a node stands for someone asking for capacity during a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stand {
    /// Nothing on it keeps the asker off.
    Open,
    /// The asker, a dedicated tenant, already holds something there.
    Own,
    /// Someone holds something there that the asker may not share a node with.
    Barred,
}

/// What a GPU holds during a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GpuState {
    /// Nothing: free for anything.
    Free,
    Whole,
    /// MIG instances, packed by `LayoutKey`.
    Slices(LayoutKey),
    /// MIG instances that two bookings at different times put at the same start: counted
    /// from the instances themselves (rare, so not worth a key).
    Overlapping,
    /// A time-sliced GPU with this many shares free.
    Shares {
        free: u8,
    },
}

/// A MIG layout packed into one number: 4 bits per memory slice start, holding the
/// profile's position in `MigProfile::ALL` plus one (0 for no instance at that start).
/// Counting by layout lets thousands of GPUs share a handful of distinct layouts.
type LayoutKey = u32;

fn layout_key(instances: impl IntoIterator<Item = MigInstance>) -> Option<LayoutKey> {
    let mut key: LayoutKey = 0;
    for i in instances {
        let shift = 4 * u32::from(i.start & 7);
        if key >> shift & 0xF != 0 {
            return None;
        }
        let index = MigProfile::ALL.iter().position(|&p| p == i.profile).unwrap_or(0) as LayoutKey;
        key |= (index + 1) << shift;
    }
    Some(key)
}

fn layout_of(key: LayoutKey) -> Vec<MigInstance> {
    (0..MEMORY_SLICES)
        .filter_map(|start| match (key >> (4 * u32::from(start)) & 0xF) as usize {
            0 => None,
            p => Some(MigInstance { profile: MigProfile::ALL[p - 1], start }),
        })
        .collect()
}

fn slices_that_fit(profile: MigProfile, instances: Vec<MigInstance>) -> u32 {
    let mut layout = MigLayout::new(instances);
    let mut fits = 0;
    while let Some(start) = layout.best_start(profile) {
        layout.instances.push(MigInstance { profile, start });
        fits += 1;
    }
    fits
}

/// How many more slices of a profile fit a layout, remembered per (profile, layout).
type SliceFits = HashMap<(MigProfile, LayoutKey), u32>;

/// What the GPUs of a timeline hold during one window, summed up so that counting a size
/// looks at nodes and distinct layouts instead of every GPU.
#[derive(Debug, Default)]
struct Holdings {
    /// Per node: its exclusive GPUs with nothing on them.
    free_by_node: Vec<u32>,
    /// Per model slot: those of them that are MIG-capable (the empty layout, by far the
    /// most common, counted without hashing).
    free_mig_by_model: Vec<u32>,
    /// MIG-capable exclusive GPUs with instances, per (model slot, layout).
    layouts: HashMap<(usize, LayoutKey), u32>,
    overlapping: Vec<(usize, Vec<MigInstance>)>,
    /// Free shares of time-sliced GPUs per (model slot, ways).
    shares: HashMap<(usize, u8), u32>,
}

impl Timeline {
    /// A timeline of `gpus` from bookings in any order.
    pub fn new(gpus: Vec<GpuUnit>, bookings: impl IntoIterator<Item = Booking>, gap_ms: i64) -> Timeline {
        let mut by_gpu: HashMap<i64, Vec<Booking>> = HashMap::new();
        for b in bookings {
            by_gpu.entry(b.hold.gpu_id).or_default().push(b);
        }
        Timeline::on(Arc::new(GpuSet::new(gpus)), gap_ms, |gpu, out| {
            out.extend(by_gpu.remove(&gpu.id).into_iter().flatten());
        })
    }

    /// A timeline of `set` where `bookings_of(gpu, out)` appends the bookings on each GPU.
    pub fn on(set: Arc<GpuSet>, gap_ms: i64, mut bookings_of: impl FnMut(&GpuUnit, &mut Vec<Booking>)) -> Timeline {
        let mut bookings = Vec::new();
        let mut starts = Vec::with_capacity(set.gpus.len() + 1);
        for gpu in &set.gpus {
            let first = bookings.len();
            starts.push(first);
            bookings_of(gpu, &mut bookings);
            bookings[first..].sort_by_key(|b: &Booking| b.window.starts_at);
        }
        starts.push(bookings.len());
        let mut occupants = Occupants::None;
        for b in bookings.iter().filter(|b| b.occupant != Occupant::Nobody) {
            occupants = match occupants {
                Occupants::None => Occupants::Only(b.occupant),
                Occupants::Only(o) if o == b.occupant => occupants,
                _ => Occupants::Several,
            };
            if occupants == Occupants::Several {
                break;
            }
        }
        Timeline { set, bookings, starts, gap_ms, occupants }
    }

    pub fn gpus(&self) -> &[GpuUnit] {
        &self.set.gpus
    }

    /// Whether anything on the timeline could keep `asker` off a node.
    fn may_bar(&self, asker: Occupant) -> bool {
        match self.occupants {
            Occupants::None => false,
            Occupants::Only(o) => o.excludes(asker),
            Occupants::Several => asker != Occupant::Nobody,
        }
    }

    pub fn set(&self) -> &Arc<GpuSet> {
        &self.set
    }

    /// The bookings of the GPU at `index` that hold it at any time during `window`
    /// (cleaning gap included). They are sorted by start, so the scan stops early.
    fn during(&self, index: usize, window: Window) -> impl Iterator<Item = &Booking> {
        self.bookings[self.starts[index]..self.starts[index + 1]]
            .iter()
            .take_while(move |b| b.window.starts_at < window.ends_at + self.gap_ms)
            .filter(move |b| b.window.conflicts(window, self.gap_ms))
    }

    /// What is held on the GPUs at `positions` at any time during `window`.
    fn holds_on(&self, positions: impl IntoIterator<Item = usize>, window: Window) -> Vec<Hold> {
        positions.into_iter().flat_map(|i| self.during(i, window)).map(|b| b.hold).collect()
    }

    /// How the node at `n` stands for `asker` during `window` (cleaning gap included).
    fn stand(&self, n: usize, window: Window, asker: Occupant) -> Stand {
        let mut stand = Stand::Open;
        for &i in &self.set.nodes[n].positions {
            for b in self.during(i, window) {
                if b.occupant.excludes(asker) {
                    return Stand::Barred;
                }
                if asker.is_dedicated() && b.occupant == asker {
                    stand = Stand::Own;
                }
            }
        }
        stand
    }

    /// Concrete capacity for `shape` during `window` for `asker`, by the same rules as a
    /// launch now, on nodes nobody `asker` excludes holds anything on. A dedicated tenant
    /// goes to nodes it already holds first, then to the others (best fit on each).
    pub fn place(&self, shape: Shape, window: Window, asker: Occupant) -> Result<Vec<Assignment>, Refusal> {
        let set = &self.set;
        if !self.may_bar(asker) {
            return placement::place_on(shape, &InWindow { timeline: self, window });
        }
        let holds = self.holds_on(0..set.gpus.len(), window);
        let stands: Vec<Stand> = (0..set.nodes.len()).map(|n| self.stand(n, window, asker)).collect();
        let on = |keep: fn(Stand) -> bool| -> Vec<GpuUnit> {
            set.gpus.iter().zip(&set.node_of).filter(|(_, n)| keep(stands[**n])).map(|(g, _)| *g).collect()
        };
        if stands.contains(&Stand::Own)
            && let Ok(placed) = placement::place(shape, &on(|s| s == Stand::Own), &holds)
        {
            return Ok(placed);
        }
        if !stands.contains(&Stand::Barred) {
            return placement::place(shape, &set.gpus, &holds);
        }
        if let Ok(placed) = placement::place(shape, &on(|s| s != Stand::Barred), &holds) {
            return Ok(placed);
        }
        // Say why: tenants kept apart, if the fleet would have room without that rule.
        placement::place(shape, &set.gpus, &holds)?;
        Err(self.kept_apart(shape, &stands, asker))
    }

    /// The refusal when only nodes `asker` may not share have room for `shape`.
    fn kept_apart(&self, shape: Shape, stands: &[Stand], asker: Occupant) -> Refusal {
        let model = shape.model();
        let of_model: Vec<usize> = (0..self.set.nodes.len()).filter(|&n| self.set.node_is(n, model)).collect();
        let barred = of_model.iter().filter(|&&n| stands[n] == Stand::Barred).count();
        let total = of_model.len();
        let (hold, are) = if barred == 1 { ("holds", "is") } else { ("hold", "are") };
        let detail = if asker.is_dedicated() {
            format!(
                "no node is free of other tenants for it: {barred} of the {total} {model} nodes {hold} other tenants' bookings at that time, and your tenant's isolation keeps it off them"
            )
        } else {
            format!(
                "no node is free of other tenants for it: {barred} of the {total} {model} nodes {are} dedicated to hard-isolated tenants at that time"
            )
        };
        Refusal::NoCapacity { size: shape.describe(), when: "right now".into(), detail, hint: String::new() }
    }

    /// How many more bookings of `shape` fit during all of `window` for `asker`.
    pub fn free_count(&self, shape: Shape, window: Window, asker: Occupant) -> u32 {
        self.heatmaps(&[shape], window.starts_at, window.ends_at - window.starts_at, 1, asker)[0][0]
    }

    /// `free_count` of each of `shapes` for `buckets` consecutive windows of `bucket_ms`
    /// from `from`, as `asker` could book them: the rows of the calendar's heatmap, one
    /// per shape.
    ///
    /// Each GPU's bookings are read once per bucket and summed per bucket into `Holdings`
    /// (free GPUs per node, GPUs per MIG layout), which every shape then counts. A node
    /// holding anything `asker` may not share a node with counts for nothing.
    pub fn heatmaps(
        &self,
        shapes: &[Shape],
        from: i64,
        bucket_ms: i64,
        buckets: usize,
        asker: Occupant,
    ) -> Vec<Vec<u32>> {
        let set = &self.set;
        let mut holdings: Vec<Holdings> = (0..buckets)
            .map(|_| Holdings {
                free_by_node: vec![0; set.nodes.len()],
                free_mig_by_model: vec![0; set.models.len()],
                ..Holdings::default()
            })
            .collect();
        if !self.may_bar(asker) {
            let mut states = Vec::with_capacity(buckets);
            for (i, &n) in set.node_of.iter().enumerate() {
                self.states(i, from, bucket_ms, buckets, &mut states);
                for (b, (holding, &state)) in holdings.iter_mut().zip(&states).enumerate() {
                    self.count_in(holding, i, n, state, bucket(from, bucket_ms, b));
                }
            }
            return self.rows(shapes, &holdings);
        }
        let mut states: Vec<GpuState> = Vec::new();
        for (n, node) in set.nodes.iter().enumerate() {
            for (b, holding) in holdings.iter_mut().enumerate() {
                let window = bucket(from, bucket_ms, b);
                states.clear();
                let mut barred = false;
                for &i in &node.positions {
                    barred |= self.during(i, window).any(|b| b.occupant.excludes(asker));
                    states.push(self.state(i, window));
                }
                if barred {
                    continue;
                }
                for (&i, &state) in node.positions.iter().zip(&states) {
                    self.count_in(holding, i, n, state, window);
                }
            }
        }
        self.rows(shapes, &holdings)
    }

    /// The heatmap's rows: each shape counted in each bucket's holdings.
    fn rows(&self, shapes: &[Shape], holdings: &[Holdings]) -> Vec<Vec<u32>> {
        let mut fits = SliceFits::new();
        let mut rows = vec![Vec::with_capacity(holdings.len()); shapes.len()];
        for holding in holdings {
            for (row, &shape) in rows.iter_mut().zip(shapes) {
                row.push(self.count(shape, holding, &mut fits));
            }
        }
        rows
    }

    /// Adds the GPU at `i` (on the node at `n`), holding `state` during `window`, to `holding`.
    fn count_in(&self, holding: &mut Holdings, i: usize, n: usize, state: GpuState, window: Window) {
        let gpu = &self.set.gpus[i];
        let slot = self.set.model_of[i];
        match state {
            GpuState::Free => {
                holding.free_by_node[n] += 1;
                if gpu.mig_capable {
                    holding.free_mig_by_model[slot] += 1;
                }
            }
            GpuState::Whole => {}
            GpuState::Slices(key) => {
                if gpu.mig_capable {
                    *holding.layouts.entry((slot, key)).or_default() += 1;
                }
            }
            GpuState::Overlapping => {
                if gpu.mig_capable {
                    let mut instances: Vec<MigInstance> = self.during(i, window).filter_map(mig_instance).collect();
                    instances.sort_by_key(|i| i.start);
                    holding.overlapping.push((slot, instances));
                }
            }
            GpuState::Shares { free } => {
                *holding.shares.entry((slot, gpu.time_slices)).or_default() += u32::from(free);
            }
        }
    }

    /// `state` of the GPU at `index` in each of `buckets` windows of `bucket_ms` from `from`,
    /// into `states`. A GPU with only whole-GPU bookings (most of a fleet) is free or taken
    /// in each window, so each of its bookings marks the windows it conflicts with, in one
    /// pass, instead of every window reading every booking up to it; any other GPU is read
    /// window by window.
    fn states(&self, index: usize, from: i64, bucket_ms: i64, buckets: usize, states: &mut Vec<GpuState>) {
        states.clear();
        let bookings = &self.bookings[self.starts[index]..self.starts[index + 1]];
        if self.set.gpus[index].is_shared() || bucket_ms <= 0 || bookings.iter().any(|b| b.hold.profile.is_some()) {
            states.extend((0..buckets).map(|b| self.state(index, bucket(from, bucket_ms, b))));
            return;
        }
        states.resize(buckets, GpuState::Free);
        for b in bookings {
            // Window k conflicts with the booking when
            // from + k * bucket_ms < b.ends_at + gap and b.starts_at - gap < from + (k + 1) * bucket_ms.
            let first = (b.window.starts_at - self.gap_ms - from).div_euclid(bucket_ms).max(0);
            let past_last = (b.window.ends_at + self.gap_ms - from + bucket_ms - 1).div_euclid(bucket_ms);
            let (first, past_last) = (first as usize, past_last.clamp(0, buckets as i64) as usize);
            if first < past_last {
                states[first..past_last].fill(GpuState::Whole);
            }
        }
    }

    /// What the GPU at `index` holds at any time during `window` (cleaning gap included).
    fn state(&self, index: usize, window: Window) -> GpuState {
        let gpu = &self.set.gpus[index];
        if gpu.is_shared() {
            let width = MEMORY_SLICES / gpu.time_slices;
            let taken: u8 = self.during(index, window).fold(0, |t, b| t.saturating_add(b.hold.slices.size));
            return GpuState::Shares { free: MEMORY_SLICES.saturating_sub(taken) / width };
        }
        let mut during = self.during(index, window).peekable();
        if during.peek().is_none() {
            return GpuState::Free;
        }
        let mut instances = Vec::new();
        for b in during {
            match mig_instance(b) {
                None => return GpuState::Whole,
                Some(instance) => instances.push(instance),
            }
        }
        layout_key(instances).map_or(GpuState::Overlapping, GpuState::Slices)
    }

    fn count(&self, shape: Shape, holding: &Holdings, fits: &mut SliceFits) -> u32 {
        let set = &self.set;
        let Some(slot) = set.model_slot(shape.model()) else { return 0 };
        let nodes = || (0..set.nodes.len()).filter(|&n| set.node_is(n, shape.model()));
        match shape {
            Shape::MigSlice { profile, .. } => {
                let regular: u32 = holding
                    .layouts
                    .iter()
                    .filter(|((s, _), _)| *s == slot)
                    .map(|(&(_, key), &gpus)| {
                        gpus * *fits.entry((profile, key)).or_insert_with(|| slices_that_fit(profile, layout_of(key)))
                    })
                    .sum();
                let overlapping: u32 = holding
                    .overlapping
                    .iter()
                    .filter(|(s, _)| *s == slot)
                    .map(|(_, instances)| slices_that_fit(profile, instances.clone()))
                    .sum();
                let free = holding.free_mig_by_model[slot]
                    * *fits.entry((profile, 0)).or_insert_with(|| slices_that_fit(profile, Vec::new()));
                free + regular + overlapping
            }
            Shape::Gpus { count, .. } => nodes().map(|n| holding.free_by_node[n] / count.max(1)).sum(),
            Shape::Share { ways, .. } => holding.shares.get(&(slot, ways)).copied().unwrap_or(0),
            Shape::Nodes { count, .. } => {
                // A multi-node request stays inside one span (NVLink domain or site fabric).
                let mut free_by_span: BTreeMap<Span, u32> = BTreeMap::new();
                for n in nodes() {
                    let node = &set.nodes[n];
                    if holding.free_by_node[n] as usize == node.positions.len() {
                        *free_by_span.entry(node.units[0].span()).or_default() += 1;
                    }
                }
                free_by_span.values().map(|free| free / count.max(1)).sum()
            }
        }
    }

    /// The earliest start at or after `not_before` at which `shape` fits for `duration_ms`
    /// for `asker`, ending no later than `latest_end`; `None` if it never does.
    ///
    /// Each group of GPUs that could hold the booking alone (one GPU for a slice, one node
    /// for GPUs of a node, every node for several nodes) is tried at `not_before` and at
    /// the moments its bookings end, and those of anything on its nodes that keeps `asker`
    /// off them; the first start where placement succeeds wins.
    pub fn earliest_start(
        &self,
        shape: Shape,
        duration_ms: i64,
        not_before: i64,
        latest_end: i64,
        asker: Occupant,
    ) -> Option<i64> {
        let set = &self.set;
        let model = shape.model();
        let gap = self.gap_ms;
        // Per node of the model: the windows of bookings that keep `asker` off it.
        let may_bar = self.may_bar(asker);
        let barring: Vec<Vec<Window>> = (0..set.nodes.len())
            .map(|n| {
                if !may_bar || !set.node_is(n, model) {
                    return Vec::new();
                }
                set.nodes[n]
                    .positions
                    .iter()
                    .flat_map(|&i| &self.bookings[self.starts[i]..self.starts[i + 1]])
                    .filter(|b| b.occupant.excludes(asker))
                    .map(|b| b.window)
                    .collect()
            })
            .collect();
        let kept_apart = barring.iter().any(|b| !b.is_empty());
        let barred = |n: usize, window: Window| barring[n].iter().any(|b| b.conflicts(window, gap));
        let single = |i: usize| (i..i + 1, std::slice::from_ref(&set.gpus[i]));
        // (positions in the set, the same GPUs)
        let groups: Vec<(std::ops::Range<usize>, &[GpuUnit])> = match shape {
            Shape::MigSlice { .. } => (0..set.gpus.len())
                .filter(|&i| set.gpus[i].model == model && set.gpus[i].mig_capable && !set.gpus[i].is_shared())
                .map(single)
                .collect(),
            Shape::Share { ways, .. } => (0..set.gpus.len())
                .filter(|&i| set.gpus[i].model == model && set.gpus[i].time_slices == ways)
                .map(single)
                .collect(),
            Shape::Gpus { .. } | Shape::Nodes { count: 1, .. } => (0..set.nodes.len())
                .filter(|&n| set.node_is(n, model))
                .map(|n| (n..n + 1, set.nodes[n].units.as_slice()))
                .collect(),
            Shape::Nodes { .. } => vec![(0..set.nodes.len(), set.gpus.as_slice())],
        };
        // Node groups hold node positions; the others GPU positions.
        let by_node = matches!(shape, Shape::Gpus { .. } | Shape::Nodes { .. });
        let positions = |range: std::ops::Range<usize>| -> Vec<usize> {
            if by_node { range.flat_map(|n| set.nodes[n].positions.iter().copied()).collect() } else { range.collect() }
        };
        let mut best: Option<i64> = None;
        for (range, units) in groups {
            let nodes = if by_node { range.clone() } else { set.node_of[range.start]..set.node_of[range.start] + 1 };
            let positions = positions(range);
            let mut candidates: Vec<i64> = positions
                .iter()
                .flat_map(|&i| &self.bookings[self.starts[i]..self.starts[i + 1]])
                .map(|b| b.window)
                .chain(nodes.clone().flat_map(|n| barring[n].iter().copied()))
                .map(|w| w.ends_at + gap)
                .filter(|&t| t > not_before)
                .collect();
            candidates.push(not_before);
            candidates.sort_unstable();
            candidates.dedup();
            for t in candidates {
                if best.is_some_and(|b| t >= b) || t + duration_ms > latest_end {
                    break;
                }
                let window = Window { starts_at: t, ends_at: t + duration_ms };
                let holds = self.holds_on(positions.iter().copied(), window);
                let fits = if !kept_apart {
                    placement::place(shape, units, &holds).is_ok()
                } else {
                    let allowed: Vec<GpuUnit> =
                        positions.iter().filter(|&&i| !barred(set.node_of[i], window)).map(|&i| set.gpus[i]).collect();
                    !allowed.is_empty() && placement::place(shape, &allowed, &holds).is_ok()
                };
                if fits {
                    best = Some(t);
                    break;
                }
            }
            if best == Some(not_before) {
                break; // nothing starts earlier
            }
        }
        best
    }
}

/// The `b`-th of a row of windows of `bucket_ms` from `from` (a heatmap's bucket).
fn bucket(from: i64, bucket_ms: i64, b: usize) -> Window {
    let starts_at = from + b as i64 * bucket_ms;
    Window { starts_at, ends_at: starts_at + bucket_ms }
}

/// A booking's MIG instance; `None` for a whole GPU or a share.
fn mig_instance(b: &Booking) -> Option<MigInstance> {
    b.hold.profile.map(|profile| MigInstance { profile, start: b.hold.slices.start })
}

/// GPU-equivalents of held capacity: a whole GPU is 1, a MIG slice its share of the
/// GPU's compute (a 3g is 3/7).
pub fn gpu_equivalents(holds: &[Hold]) -> f64 {
    holds.iter().map(Hold::gpu_equivalents).sum()
}

mod quota;
pub use quota::{Quota, QuotaScope, Tier, Usage, check_quota};

#[cfg(test)]
mod tests;
