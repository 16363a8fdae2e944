//! MIG geometry, as in NVIDIA's MIG User Guide (see `shared/reference/gpu-partitioning.md`).
//!
//! A MIG-capable GPU has 8 memory slices and 7 compute slices. A GPU instance takes a
//! contiguous run of memory slices starting at one of its profile's allowed starts;
//! instances never overlap, their compute slices add up to at most 7, and at most one
//! instance per GPU carries the media extensions (`+me`).
//!
//! The module owns the rules for one GPU: which layouts are valid ([`MigLayout::validate`]),
//! where a new instance should go ([`MigLayout::best_start`]), every valid layout
//! ([`MigLayout::enumerate_all`]), how to repartition a partly busy GPU without moving a
//! running instance ([`plan_repartition`]), and the mig-parted config that the GPU
//! Operator's MIG manager applies ([`mig_parted_config`]).

use std::cmp::Reverse;
use std::fmt;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::gpu::GpuModel;

/// Memory slices of a MIG-capable GPU (indexes 0..7).
pub const MEMORY_SLICES: u8 = 8;
/// Compute (SM) slices of a MIG-capable GPU; one fewer than memory slices, which is why
/// seven 1g instances leave memory slice 7 unusable.
pub const COMPUTE_SLICES: u8 = 7;

/// A GPU instance profile; the same ids and placements on A100, H100, H200 and B200, only
/// the memory in the name changes with the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum MigProfile {
    /// 1g: one memory slice, one compute slice.
    G1,
    /// 1g with media extensions; at most one per GPU.
    G1Media,
    /// 1g with two memory slices.
    G1DoubleMemory,
    /// 2g: two memory slices, two compute slices.
    G2,
    /// 3g: four memory slices, three compute slices.
    G3,
    /// 4g: four memory slices, four compute slices.
    G4,
    /// 7g: the whole GPU as one instance.
    G7,
}

impl MigProfile {
    /// Every profile, smallest first.
    pub const ALL: [MigProfile; 7] = [
        MigProfile::G1,
        MigProfile::G1Media,
        MigProfile::G1DoubleMemory,
        MigProfile::G2,
        MigProfile::G3,
        MigProfile::G4,
        MigProfile::G7,
    ];

    /// NVML's GPU instance profile id.
    pub fn profile_id(self) -> u32 {
        match self {
            MigProfile::G1 => 19,
            MigProfile::G1Media => 20,
            MigProfile::G1DoubleMemory => 15,
            MigProfile::G2 => 14,
            MigProfile::G3 => 9,
            MigProfile::G4 => 5,
            MigProfile::G7 => 0,
        }
    }

    /// Contiguous memory slices an instance occupies.
    pub fn memory_slices(self) -> u8 {
        match self {
            MigProfile::G1 | MigProfile::G1Media => 1,
            MigProfile::G1DoubleMemory | MigProfile::G2 => 2,
            MigProfile::G3 | MigProfile::G4 => 4,
            MigProfile::G7 => 8,
        }
    }

    /// Compute slices an instance takes from the GPU's seven.
    pub fn compute_slices(self) -> u8 {
        match self {
            MigProfile::G1 | MigProfile::G1Media | MigProfile::G1DoubleMemory => 1,
            MigProfile::G2 => 2,
            MigProfile::G3 => 3,
            MigProfile::G4 => 4,
            MigProfile::G7 => 7,
        }
    }

    /// Most instances of this profile one GPU can hold.
    pub fn max_per_gpu(self) -> usize {
        match self {
            MigProfile::G1 => 7,
            MigProfile::G1DoubleMemory => 4,
            MigProfile::G2 => 3,
            MigProfile::G3 => 2,
            MigProfile::G1Media | MigProfile::G4 | MigProfile::G7 => 1,
        }
    }

    /// First memory slices an instance of this profile may start at.
    pub fn allowed_starts(self) -> &'static [u8] {
        match self {
            MigProfile::G1 | MigProfile::G1Media => &[0, 1, 2, 3, 4, 5, 6],
            MigProfile::G1DoubleMemory => &[0, 2, 4, 6],
            MigProfile::G2 => &[0, 2, 4],
            MigProfile::G3 => &[0, 4],
            MigProfile::G4 | MigProfile::G7 => &[0],
        }
    }

    /// The profile's name on `model`, e.g. `3g.40gb` on an H100-80GB; `None` when the
    /// model has no MIG.
    pub fn name(self, model: GpuModel) -> Option<String> {
        // Memory (GB) of the 1g, 2g and 4g-or-larger steps, per model.
        let (one, two, four, seven): (u32, u32, u32, u32) = match model {
            GpuModel::A100_40GB => (5, 10, 20, 40),
            GpuModel::A100_80GB | GpuModel::H100_80GB => (10, 20, 40, 80),
            GpuModel::H100_NVL => (12, 24, 47, 94),
            GpuModel::H200 => (18, 35, 71, 141),
            GpuModel::B200 => (23, 45, 90, 180),
            GpuModel::L40S => return None,
        };
        Some(match self {
            MigProfile::G1 => format!("1g.{one}gb"),
            MigProfile::G1Media => format!("1g.{one}gb+me"),
            MigProfile::G1DoubleMemory => format!("1g.{two}gb"),
            MigProfile::G2 => format!("2g.{two}gb"),
            MigProfile::G3 => format!("3g.{four}gb"),
            MigProfile::G4 => format!("4g.{four}gb"),
            MigProfile::G7 => format!("7g.{seven}gb"),
        })
    }

    /// The profile named `name` on `model` (case-insensitive), e.g. `1g.10gb` is the
    /// double-memory 1g on an A100-40GB but the plain 1g on an H100-80GB.
    pub fn parse(model: GpuModel, name: &str) -> Option<MigProfile> {
        MigProfile::ALL.into_iter().find(|p| p.name(model).is_some_and(|n| n.eq_ignore_ascii_case(name)))
    }

    /// A model-independent key for storage (`1g`, `1g+me`, `1g.2m`, `2g`, ...).
    pub fn key(self) -> &'static str {
        match self {
            MigProfile::G1 => "1g",
            MigProfile::G1Media => "1g+me",
            MigProfile::G1DoubleMemory => "1g.2m",
            MigProfile::G2 => "2g",
            MigProfile::G3 => "3g",
            MigProfile::G4 => "4g",
            MigProfile::G7 => "7g",
        }
    }

    /// The profile stored under `key` (see [`MigProfile::key`]).
    pub fn from_key(key: &str) -> Option<MigProfile> {
        MigProfile::ALL.into_iter().find(|p| p.key() == key)
    }
}

/// A stored slice's profile as pages and backends name it: reservations keep it
/// model-independent (`3g`), the GPU's model gives its name (`3g.40gb`). An unknown model
/// or key is shown as stored.
pub fn profile_name(model: &str, key: &str) -> String {
    GpuModel::parse(model).zip(MigProfile::from_key(key)).and_then(|(m, p)| p.name(m)).unwrap_or_else(|| key.to_owned())
}

/// A contiguous run of memory slices on one GPU; a whole GPU is `0..8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SliceRange {
    pub start: u8,
    pub size: u8,
}

/// A development share held as `size` of the memory slices from `start` (shares are
/// reserved as slice positions): which share it is, from 1, and how many ways its GPU is
/// time-sliced.
pub fn time_slice_share(start: i64, size: i64) -> (i64, i64) {
    let size = size.max(1);
    (start / size + 1, i64::from(MEMORY_SLICES) / size)
}

impl SliceRange {
    /// All eight memory slices.
    pub const WHOLE_GPU: SliceRange = SliceRange { start: 0, size: MEMORY_SLICES };

    /// One past the last memory slice. Saturates, so a corrupt stored range cannot panic.
    pub fn end(self) -> u8 {
        self.start.saturating_add(self.size)
    }

    /// Whether the two ranges share a memory slice.
    pub fn overlaps(self, other: SliceRange) -> bool {
        self.start < other.end() && other.start < self.end()
    }

    /// Whether the range is the whole GPU (a GPU booked without MIG).
    pub fn is_whole_gpu(self) -> bool {
        self == SliceRange::WHOLE_GPU
    }
}

/// One GPU instance: a profile at a placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MigInstance {
    pub profile: MigProfile,
    pub start: u8,
}

impl MigInstance {
    /// The memory slices the instance occupies.
    pub fn slices(self) -> SliceRange {
        SliceRange { start: self.start, size: self.profile.memory_slices() }
    }

    /// Bigger instances first (memory, then compute), then by start: the order in which
    /// to create instances, since creating small ones first can block a large one.
    fn creation_order(self) -> (Reverse<u8>, Reverse<u8>, u8) {
        (Reverse(self.profile.memory_slices()), Reverse(self.profile.compute_slices()), self.start)
    }
}

/// `3g@4`: the profile's storage key and its first memory slice.
impl fmt::Display for MigInstance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.profile.key(), self.start)
    }
}

/// Why a set of instances cannot exist together on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LayoutError {
    #[error("{0} is not an allowed placement for its profile")]
    StartNotAllowed(MigInstance),
    #[error("{0} and {1} share memory slices")]
    Overlap(MigInstance, MigInstance),
    #[error("{0} compute slices asked, a GPU has {COMPUTE_SLICES}")]
    TooManyComputeSlices(u8),
    #[error("more {} instances than a GPU can hold ({})", .0.key(), .0.max_per_gpu())]
    TooMany(MigProfile),
}

/// The MIG instances on one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigLayout {
    pub instances: Vec<MigInstance>,
}

impl MigLayout {
    /// A layout of these instances, in any order; not validated.
    pub fn new(instances: Vec<MigInstance>) -> MigLayout {
        MigLayout { instances }
    }

    /// Whether the instances can exist together on one GPU, and if not the first reason.
    pub fn validate(&self) -> Result<(), LayoutError> {
        // Starts first: every placement is then inside the GPU before overlaps are compared.
        if let Some(a) = self.instances.iter().find(|a| !a.profile.allowed_starts().contains(&a.start)) {
            return Err(LayoutError::StartNotAllowed(*a));
        }
        for (i, a) in self.instances.iter().enumerate() {
            if let Some(b) = self.instances[i + 1..].iter().find(|b| a.slices().overlaps(b.slices())) {
                return Err(LayoutError::Overlap(*a, *b));
            }
        }
        let compute: u8 = self.instances.iter().map(|i| i.profile.compute_slices()).sum();
        if compute > COMPUTE_SLICES {
            return Err(LayoutError::TooManyComputeSlices(compute));
        }
        for profile in MigProfile::ALL {
            if self.count(profile) > profile.max_per_gpu() {
                return Err(LayoutError::TooMany(profile));
            }
        }
        Ok(())
    }

    fn count(&self, profile: MigProfile) -> usize {
        self.instances.iter().filter(|i| i.profile == profile).count()
    }

    /// Every start at which `profile` could be added to this layout.
    pub fn free_starts(&self, profile: MigProfile) -> Vec<u8> {
        profile
            .allowed_starts()
            .iter()
            .copied()
            .filter(|&start| self.with(MigInstance { profile, start }).validate().is_ok())
            .collect()
    }

    fn with(&self, instance: MigInstance) -> MigLayout {
        let mut instances = self.instances.clone();
        instances.push(instance);
        MigLayout { instances }
    }

    /// How many (profile, start) pairs could still be added; a measure of how many
    /// future requests the layout leaves room for.
    pub fn open_options(&self) -> usize {
        MigProfile::ALL.iter().map(|&p| self.free_starts(p).len()).sum()
    }

    /// Where to put a new `profile` instance: among the free starts, the one that leaves
    /// the most options open for later requests (ties go to the lowest start). `None`
    /// when the profile does not fit.
    pub fn best_start(&self, profile: MigProfile) -> Option<u8> {
        let mut best: Option<(usize, u8)> = None;
        for start in self.free_starts(profile) {
            let score = self.with(MigInstance { profile, start }).open_options();
            if best.is_none_or(|(s, _)| score > s) {
                best = Some((score, start));
            }
        }
        best.map(|(_, start)| start)
    }
}

/// Every valid layout with, for each, its [`MigLayout::open_options`]; built once.
/// There are only a few hundred, so planning can simply look at all of them.
fn catalog() -> &'static [(MigLayout, usize)] {
    static CATALOG: OnceLock<Vec<(MigLayout, usize)>> = OnceLock::new();
    CATALOG.get_or_init(|| {
        let mut all = Vec::new();
        extend_from(0, &mut Vec::new(), &mut all);
        all.sort_by_cached_key(|l: &MigLayout| l.instances.iter().map(|i| (i.start, i.profile)).collect::<Vec<_>>());
        all.into_iter()
            .map(|l| {
                let options = l.open_options();
                (l, options)
            })
            .collect()
    })
}

/// Walks the memory slices left to right: slice `from` either stays empty or is the start
/// of an instance. Each layout is reached exactly once, already in start order, and a
/// branch stops as soon as it is invalid (every part of a valid layout is valid).
fn extend_from(from: u8, instances: &mut Vec<MigInstance>, out: &mut Vec<MigLayout>) {
    if from >= MEMORY_SLICES {
        out.push(MigLayout::new(instances.clone()));
        return;
    }
    extend_from(from + 1, instances, out);
    for profile in MigProfile::ALL {
        if !profile.allowed_starts().contains(&from) {
            continue;
        }
        instances.push(MigInstance { profile, start: from });
        if MigLayout::new(instances.clone()).validate().is_ok() {
            extend_from(from + profile.memory_slices(), instances, out);
        }
        instances.pop();
    }
}

impl MigLayout {
    /// Every valid layout of one GPU, the empty one included, each once with its instances
    /// in start order; the list is ordered by (start, profile) of the instances. Planning
    /// searches this list instead of guessing placements, so it can never miss a layout.
    pub fn enumerate_all() -> impl Iterator<Item = &'static MigLayout> {
        catalog().iter().map(|(layout, _)| layout)
    }

    /// The valid layouts to which no instance can be added: the ways to fill a GPU. Same
    /// order as [`MigLayout::enumerate_all`].
    pub fn enumerate_maximal() -> impl Iterator<Item = &'static MigLayout> {
        catalog().iter().filter(|(_, options)| *options == 0).map(|(layout, _)| layout)
    }
}

/// One step that changes a GPU's MIG instances (NVML create-with-placement / destroy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MigOperation {
    /// Destroy an idle GPU instance.
    Destroy(MigInstance),
    /// Create a GPU instance at exactly this placement.
    Create(MigInstance),
}

/// How to turn a GPU's current layout into one that holds the requested profiles without
/// touching the instances in use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepartitionPlan {
    /// The layout after the operations: the kept instances plus `placements`, in start order.
    pub target: MigLayout,
    /// Where each requested profile goes, in the order of the request.
    pub placements: Vec<MigInstance>,
    /// Destroys first, then creates, largest instance first, each with its placement:
    /// every intermediate layout is a part of `target`, hence valid, and an explicit
    /// placement never lets the driver choose a start that blocks a later instance.
    pub operations: Vec<MigOperation>,
}

/// Plans a repartition of a GPU whose instances are `current`. `keep` are the instances in
/// use; they stay exactly where they are, because a running MIG instance cannot move. Every
/// profile of `want` (a multiset) gets an instance; idle instances of `current` are reused
/// when they sit where the plan puts a wanted profile and destroyed otherwise.
///
/// Among the layouts that hold `keep` and `want`, the plan picks the one that leaves the
/// most [`MigLayout::open_options`] for later requests, then the fewest operations, then
/// the lowest starts. `None` when no valid layout holds them, or when `keep` is not part of
/// `current` (an instance the GPU does not have cannot be kept).
pub fn plan_repartition(current: &MigLayout, keep: &[MigInstance], want: &[MigProfile]) -> Option<RepartitionPlan> {
    without(&current.instances, keep)?;
    let mut wanted = want.to_vec();
    wanted.sort_unstable();

    // (-options, operations, placed (start, profile)), smaller is better.
    type Score = (Reverse<usize>, usize, Vec<(u8, MigProfile)>);
    let mut best: Option<(Score, &MigLayout, Vec<MigInstance>)> = None;
    for (layout, options) in catalog() {
        if layout.instances.len() != keep.len() + want.len() {
            continue;
        }
        let Some(placed) = without(&layout.instances, keep) else { continue };
        let mut profiles: Vec<MigProfile> = placed.iter().map(|i| i.profile).collect();
        profiles.sort_unstable();
        if profiles != wanted {
            continue;
        }
        let operations = difference(&current.instances, &layout.instances).len()
            + difference(&layout.instances, &current.instances).len();
        let score = (Reverse(*options), operations, placed.iter().map(|i| (i.start, i.profile)).collect());
        if best.as_ref().is_none_or(|(b, _, _)| score < *b) {
            best = Some((score, layout, placed));
        }
    }
    let (_, target, mut placed) = best?;

    // Hand out the placed instances to the request in its order, lowest start first.
    let placements = want
        .iter()
        .filter_map(|&profile| {
            let i = placed.iter().position(|p| p.profile == profile)?;
            Some(placed.remove(i))
        })
        .collect();

    let mut destroy = difference(&current.instances, &target.instances);
    destroy.sort_by_key(|i| (i.start, i.profile));
    let mut create = difference(&target.instances, &current.instances);
    create.sort_by_key(|i| i.creation_order());
    let operations =
        destroy.into_iter().map(MigOperation::Destroy).chain(create.into_iter().map(MigOperation::Create)).collect();

    Some(RepartitionPlan { target: target.clone(), placements, operations })
}

/// Whether `profile` fits on a GPU whose instances are `current` once the idle ones are
/// destroyed, keeping the instances in use (`keep`) where they are. This can be true when
/// `current.free_starts(profile)` is empty: idle instances in the wrong places are no
/// reason to refuse a request the GPU could take. [`plan_repartition`] says how.
pub fn fits_after_repartition(current: &MigLayout, keep: &[MigInstance], profile: MigProfile) -> bool {
    // Kept instances cannot move, so the only freedom left is where the new one starts.
    without(&current.instances, keep).is_some() && !MigLayout::new(keep.to_vec()).free_starts(profile).is_empty()
}

/// `from` with one occurrence of each of `remove` taken out; `None` when `from` lacks one.
fn without(from: &[MigInstance], remove: &[MigInstance]) -> Option<Vec<MigInstance>> {
    let mut rest = from.to_vec();
    for r in remove {
        let i = rest.iter().position(|x| x == r)?;
        rest.remove(i);
    }
    Some(rest)
}

/// The instances of `a` that `b` does not have, counting repeats.
fn difference(a: &[MigInstance], b: &[MigInstance]) -> Vec<MigInstance> {
    let mut unmatched = b.to_vec();
    a.iter()
        .filter(|x| match unmatched.iter().position(|y| y == *x) {
            Some(i) => {
                unmatched.remove(i);
                false
            }
            None => true,
        })
        .copied()
        .collect()
}

/// Why a mig-parted config cannot be written.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MigPartedError {
    #[error("{0} GPUs have no MIG")]
    NoMig(GpuModel),
    #[error(
        "config name {0:?} must be a Kubernetes label value (1 to 63 letters, digits, '-', '_' or '.', \
         starting and ending with a letter or digit) other than all-disabled"
    )]
    BadName(String),
    #[error("an entry lists no devices")]
    NoDevices,
    #[error("device {0} is listed twice")]
    DuplicateDevice(u32),
    #[error("layout of devices {devices:?}: {error}")]
    InvalidLayout { devices: Vec<u32>, error: LayoutError },
}

/// The mig-parted config file (`version: v1`) with `all-disabled` and one config `name`
/// that gives each listed set of device indexes its layout, with the profile names of
/// `model`. The GPU Operator's MIG manager applies the config a node's
/// `nvidia.com/mig.config` label names, so `name` must be a valid label value.
///
/// mig-parted takes counts per profile, not placements: it repartitions a whole idle GPU
/// and chooses starts itself. Placements matter while a GPU is partly busy, which is
/// [`plan_repartition`]'s job.
pub fn mig_parted_config(
    name: &str,
    model: GpuModel,
    devices: &[(Vec<u32>, MigLayout)],
) -> Result<String, MigPartedError> {
    if MigProfile::G7.name(model).is_none() {
        return Err(MigPartedError::NoMig(model));
    }
    if !is_label_value(name) || name == "all-disabled" {
        return Err(MigPartedError::BadName(name.to_owned()));
    }
    let mut seen = Vec::new();
    for (indexes, layout) in devices {
        if indexes.is_empty() {
            return Err(MigPartedError::NoDevices);
        }
        for &d in indexes {
            // mig-parted would apply two layouts to one GPU, the last one silently winning.
            if seen.contains(&d) {
                return Err(MigPartedError::DuplicateDevice(d));
            }
            seen.push(d);
        }
        layout.validate().map_err(|error| MigPartedError::InvalidLayout { devices: indexes.clone(), error })?;
    }

    let mut yaml =
        String::from("version: v1\nmig-configs:\n  all-disabled:\n    - devices: all\n      mig-enabled: false\n");
    yaml.push_str(&format!("  {name}:\n"));
    for (indexes, layout) in devices {
        let list: Vec<String> = indexes.iter().map(u32::to_string).collect();
        let mut counts = Vec::new();
        for profile in MigProfile::ALL {
            let count = layout.count(profile);
            if count > 0 {
                let profile_name = profile.name(model).ok_or(MigPartedError::NoMig(model))?;
                counts.push(format!("\"{profile_name}\": {count}"));
            }
        }
        yaml.push_str(&format!(
            "    - devices: [{}]\n      mig-enabled: true\n      mig-devices: {{{}}}\n",
            list.join(", "),
            counts.join(", ")
        ));
    }
    Ok(yaml)
}

/// Kubernetes label value syntax (the config name becomes `nvidia.com/mig.config=<name>`).
fn is_label_value(s: &str) -> bool {
    let ends_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    s.len() <= 63
        && ends_ok(s.chars().next())
        && ends_ok(s.chars().last())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_slice_is_named_by_its_gpu_model() {
        assert_eq!(profile_name("H100-80GB", "3g"), "3g.40gb");
        assert_eq!(profile_name("H200", "1g"), "1g.18gb");
        // What the store holds but Berth no longer knows is shown as it is.
        assert_eq!(profile_name("TPU-v5", "3g"), "3g");
        assert_eq!(profile_name("H100-80GB", "9g"), "9g");
    }
    use proptest::prelude::*;

    fn layout(items: &[(MigProfile, u8)]) -> MigLayout {
        MigLayout::new(items.iter().map(|&(profile, start)| MigInstance { profile, start }).collect())
    }

    use MigProfile::{G1, G1DoubleMemory, G1Media, G2, G3, G4, G7};

    /// Instances in (start, profile) order, to compare layouts as sets.
    fn sorted(instances: &[MigInstance]) -> Vec<(u8, MigProfile)> {
        let mut v: Vec<_> = instances.iter().map(|i| (i.start, i.profile)).collect();
        v.sort();
        v
    }

    fn is_enumerated(l: &MigLayout) -> bool {
        MigLayout::enumerate_all().any(|e| sorted(&e.instances) == sorted(&l.instances))
    }

    fn is_maximal(l: &MigLayout) -> bool {
        MigLayout::enumerate_maximal().any(|e| sorted(&e.instances) == sorted(&l.instances))
    }

    #[test]
    fn every_valid_layout_is_enumerated_once() {
        let all: Vec<&MigLayout> = MigLayout::enumerate_all().collect();
        assert_eq!(all.len(), 2319);
        assert_eq!(MigLayout::enumerate_maximal().count(), 239);
        for l in &all {
            assert_eq!(l.validate(), Ok(()), "{l:?}");
            assert!(l.instances.windows(2).all(|w| w[0].start < w[1].start), "not in start order: {l:?}");
        }
        let mut keys: Vec<_> = all.iter().map(|l| sorted(&l.instances)).collect();
        keys.dedup();
        assert_eq!(keys.len(), all.len(), "duplicates");
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "order is not deterministic (start, profile)");

        // An independent count: every subset of the 25 (profile, start) placements that
        // validates, grown one placement at a time (a part of a valid layout is valid).
        let placements: Vec<MigInstance> = MigProfile::ALL
            .iter()
            .flat_map(|&profile| profile.allowed_starts().iter().map(move |&start| MigInstance { profile, start }))
            .collect();
        fn grow(i: usize, placements: &[MigInstance], chosen: &mut Vec<MigInstance>, found: &mut usize) {
            if i == placements.len() {
                *found += 1;
                return;
            }
            grow(i + 1, placements, chosen, found);
            chosen.push(placements[i]);
            if MigLayout::new(chosen.clone()).validate().is_ok() {
                grow(i + 1, placements, chosen, found);
            }
            chosen.pop();
        }
        let mut found = 0;
        grow(0, &placements, &mut Vec::new(), &mut found);
        assert_eq!(found, all.len());
    }

    #[test]
    fn well_known_layouts_are_enumerated_and_invalid_ones_are_not() {
        let seven_1g: Vec<(MigProfile, u8)> = (0..7).map(|s| (G1, s)).collect();
        let one_media_six_1g: Vec<(MigProfile, u8)> = (0..7).map(|s| (if s == 3 { G1Media } else { G1 }, s)).collect();
        for full in [
            layout(&[(G7, 0)]),
            layout(&[(G4, 0), (G3, 4)]),
            layout(&[(G3, 0), (G3, 4)]),
            layout(&[(G3, 0), (G2, 4), (G1, 6)]),
            layout(&[(G2, 0), (G2, 2), (G2, 4), (G1, 6)]),
            layout(&[(G1DoubleMemory, 0), (G1DoubleMemory, 2), (G1DoubleMemory, 4), (G1DoubleMemory, 6)]),
            layout(&seven_1g),
            layout(&one_media_six_1g),
        ] {
            assert!(is_maximal(&full), "{full:?}");
        }
        for partial in [MigLayout::default(), layout(&[(G3, 0)]), layout(&[(G2, 0), (G2, 2), (G2, 4)])] {
            assert!(is_enumerated(&partial) && !is_maximal(&partial), "{partial:?}");
        }
        let mut seven_1g_and_more = seven_1g.clone();
        seven_1g_and_more.push((G1DoubleMemory, 6));
        for invalid in [
            layout(&seven_1g_and_more),
            layout(&[(G4, 0), (G4, 0)]),
            layout(&[(G4, 0), (G1, 4), (G1, 5), (G1, 6), (G1Media, 7)]),
            layout(&[(G1Media, 0), (G1Media, 1)]),
            layout(&[(G3, 2)]),
            layout(&[(G3, 0), (G3, 4), (G1, 7)]),
        ] {
            assert!(invalid.validate().is_err() && !is_enumerated(&invalid), "{invalid:?}");
        }
    }

    #[test]
    fn busy_instances_stay_and_idle_ones_in_the_way_go() {
        // The DRA driver report: 1g at 0, 1 and 5 block a 3g. With the one at 5 idle the
        // GPU can still take the 3g; with it busy it cannot.
        let current = layout(&[(G1, 0), (G1, 1), (G1, 5)]);
        let busy = [MigInstance { profile: G1, start: 0 }, MigInstance { profile: G1, start: 1 }];
        assert!(current.free_starts(G3).is_empty());
        assert!(fits_after_repartition(&current, &busy, G3));
        let plan = plan_repartition(&current, &busy, &[G3]).expect("a 3g fits once 1g@5 is gone");
        assert_eq!(plan.target, layout(&[(G1, 0), (G1, 1), (G3, 4)]));
        assert_eq!(plan.placements, vec![MigInstance { profile: G3, start: 4 }]);
        assert_eq!(
            plan.operations,
            vec![
                MigOperation::Destroy(MigInstance { profile: G1, start: 5 }),
                MigOperation::Create(MigInstance { profile: G3, start: 4 }),
            ]
        );

        let all_busy = current.instances.clone();
        assert!(!fits_after_repartition(&current, &all_busy, G3));
        assert_eq!(plan_repartition(&current, &all_busy, &[G3]), None);
        // An instance the GPU does not have cannot be kept.
        assert_eq!(plan_repartition(&current, &[MigInstance { profile: G1, start: 2 }], &[G1]), None);
        assert!(!fits_after_repartition(&current, &[MigInstance { profile: G1, start: 2 }], G1));
    }

    #[test]
    fn repartition_keeps_options_open_then_saves_operations_then_starts_low() {
        // A 3g at 4 leaves room for a 4g at 0; a 3g at 0 does not: the idle 3g@0 moves.
        let plan = plan_repartition(&layout(&[(G3, 0)]), &[], &[G3]).expect("fits");
        assert_eq!(plan.target, layout(&[(G3, 4)]));
        assert_eq!(plan.operations.len(), 2);

        // 1g@0 + 3g@4 and 1g@1 + 3g@4 leave as many options: the lower start wins on an
        // empty GPU, the idle 1g@1 is reused when it is already there.
        let empty = plan_repartition(&MigLayout::default(), &[], &[G1, G3]).expect("fits");
        assert_eq!(empty.target, layout(&[(G1, 0), (G3, 4)]));
        let reused = plan_repartition(&layout(&[(G1, 1)]), &[], &[G1, G3]).expect("fits");
        assert_eq!(reused.target, layout(&[(G1, 1), (G3, 4)]));
        assert_eq!(reused.operations, vec![MigOperation::Create(MigInstance { profile: G3, start: 4 })]);
    }

    #[test]
    fn repartition_creates_the_largest_instances_first_with_placements() {
        let plan = plan_repartition(&MigLayout::default(), &[], &[G1, G2, G3, G1]).expect("fits");
        assert_eq!(plan.target.validate(), Ok(()));
        let created: Vec<MigProfile> = plan
            .operations
            .iter()
            .map(|op| match op {
                MigOperation::Create(i) => i.profile,
                MigOperation::Destroy(i) => panic!("nothing to destroy, got {i}"),
            })
            .collect();
        assert_eq!(created, vec![G3, G2, G1, G1]);
        let asked: Vec<MigProfile> = plan.placements.iter().map(|i| i.profile).collect();
        assert_eq!(asked, vec![G1, G2, G3, G1]);
        assert!(plan.placements[0].start < plan.placements[3].start);
    }

    #[test]
    fn mig_parted_config_matches_the_operator_format() {
        let devices = vec![
            (vec![0, 1], layout(&[(G3, 0), (G3, 4)])),
            (vec![2], layout(&[(G3, 4), (G1, 0), (G2, 2), (G1, 1)])),
            (vec![3], MigLayout::default()),
        ];
        let yaml = mig_parted_config("tenant-a-layout", GpuModel::H100_80GB, &devices).expect("valid");
        assert_eq!(
            yaml,
            r#"version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  tenant-a-layout:
    - devices: [0, 1]
      mig-enabled: true
      mig-devices: {"3g.40gb": 2}
    - devices: [2]
      mig-enabled: true
      mig-devices: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    - devices: [3]
      mig-enabled: true
      mig-devices: {}
"#
        );
        let a100 = mig_parted_config(
            "a100.small",
            GpuModel::A100_40GB,
            &[(vec![0], layout(&[(G1Media, 0), (G1DoubleMemory, 2)]))],
        );
        assert!(a100.expect("valid").ends_with("mig-devices: {\"1g.5gb+me\": 1, \"1g.10gb\": 1}\n"));

        let one = |l: MigLayout| vec![(vec![0], l)];
        assert_eq!(mig_parted_config("x", GpuModel::L40S, &[]), Err(MigPartedError::NoMig(GpuModel::L40S)));
        for bad in ["", "all-disabled", "-x", "x y", "a\"b", &"x".repeat(64)] {
            assert_eq!(mig_parted_config(bad, GpuModel::H200, &[]), Err(MigPartedError::BadName(bad.to_owned())));
        }
        assert_eq!(
            mig_parted_config("x", GpuModel::H200, &[(vec![], MigLayout::default())]),
            Err(MigPartedError::NoDevices)
        );
        assert_eq!(
            mig_parted_config(
                "x",
                GpuModel::H200,
                &[(vec![0, 1], MigLayout::default()), (vec![1], MigLayout::default())]
            ),
            Err(MigPartedError::DuplicateDevice(1))
        );
        assert!(matches!(
            mig_parted_config("x", GpuModel::H200, &one(layout(&[(G4, 0), (G4, 0)]))),
            Err(MigPartedError::InvalidLayout { .. })
        ));
    }

    #[test]
    fn a_corrupt_start_is_refused_without_panicking() {
        let l = layout(&[(G1, 0), (G1, 255)]);
        assert!(matches!(l.validate(), Err(LayoutError::StartNotAllowed(_))));
        assert!(!SliceRange { start: 250, size: 8 }.overlaps(SliceRange::WHOLE_GPU));
    }

    /// A layout reached by valid placements at random free starts (not the best ones), so
    /// fragmented layouts like the DRA driver report come up.
    fn arb_layout() -> impl Strategy<Value = MigLayout> {
        proptest::collection::vec((0usize..7, 0usize..7), 0..12).prop_map(|steps| {
            let mut l = MigLayout::default();
            for (p, pick) in steps {
                let profile = MigProfile::ALL[p];
                let starts = l.free_starts(profile);
                if !starts.is_empty() {
                    l.instances.push(MigInstance { profile, start: starts[pick % starts.len()] });
                }
            }
            l
        })
    }

    /// A layout and the instances of it that are in use.
    fn arb_gpu() -> impl Strategy<Value = (MigLayout, Vec<MigInstance>)> {
        (arb_layout(), proptest::collection::vec(any::<bool>(), 8)).prop_map(|(current, busy)| {
            let keep = current.instances.iter().zip(busy).filter(|(_, b)| *b).map(|(i, _)| *i).collect();
            (current, keep)
        })
    }

    /// The most open options over every way to place `want` around `keep`, by trying all
    /// starts (no enumeration involved); `None` when no way is valid.
    fn brute_force_best(keep: &[MigInstance], want: &[MigProfile]) -> Option<usize> {
        let l = MigLayout::new(keep.to_vec());
        l.validate().ok()?;
        let Some((&profile, rest)) = want.split_first() else { return Some(l.open_options()) };
        l.free_starts(profile)
            .into_iter()
            .filter_map(|start| {
                let mut next = keep.to_vec();
                next.push(MigInstance { profile, start });
                brute_force_best(&next, rest)
            })
            .max()
    }

    /// `current` after `operations`, checking each step: destroys only existing, never
    /// kept instances, all before any create, and every intermediate layout valid.
    fn apply(current: &MigLayout, keep: &[MigInstance], operations: &[MigOperation]) -> Result<MigLayout, String> {
        let mut l = current.clone();
        let mut creating = false;
        for op in operations {
            match *op {
                MigOperation::Destroy(i) => {
                    if creating {
                        return Err(format!("destroy {i} after a create"));
                    }
                    if keep.contains(&i) {
                        return Err(format!("destroys kept {i}"));
                    }
                    let at = l.instances.iter().position(|x| *x == i).ok_or(format!("destroys missing {i}"))?;
                    l.instances.remove(at);
                }
                MigOperation::Create(i) => {
                    creating = true;
                    l.instances.push(i);
                    l.validate().map_err(|e| format!("create {i}: {e}"))?;
                }
            }
        }
        Ok(l)
    }

    #[test]
    fn profile_names_follow_the_model() {
        assert_eq!(MigProfile::G1.name(GpuModel::H100_80GB).as_deref(), Some("1g.10gb"));
        assert_eq!(MigProfile::G3.name(GpuModel::A100_40GB).as_deref(), Some("3g.20gb"));
        assert_eq!(MigProfile::G1Media.name(GpuModel::H200).as_deref(), Some("1g.18gb+me"));
        assert_eq!(MigProfile::G7.name(GpuModel::B200).as_deref(), Some("7g.180gb"));
        assert_eq!(MigProfile::G1DoubleMemory.name(GpuModel::H100_NVL).as_deref(), Some("1g.24gb"));
        assert_eq!(MigProfile::G1.name(GpuModel::L40S), None);
        assert_eq!(MigProfile::parse(GpuModel::H100_80GB, "3g.40gb"), Some(MigProfile::G3));
        assert_eq!(MigProfile::parse(GpuModel::H100_80GB, "3g.20gb"), None);
    }

    #[test]
    fn seven_1g_leave_the_last_memory_slice_unusable() {
        let full = layout(&(0..7).map(|s| (MigProfile::G1, s)).collect::<Vec<_>>());
        assert_eq!(full.validate(), Ok(()));
        assert_eq!(full.open_options(), 0);
    }

    #[test]
    fn a_3g_at_4_blocks_everything_in_4_to_7() {
        let l = layout(&[(MigProfile::G3, 4)]);
        for profile in MigProfile::ALL {
            assert!(l.free_starts(profile).iter().all(|&s| s + profile.memory_slices() <= 4), "{profile:?}");
        }
        assert_eq!(layout(&[(MigProfile::G3, 0), (MigProfile::G2, 4), (MigProfile::G1, 6)]).validate(), Ok(()));
    }

    #[test]
    fn scattered_1g_block_a_3g_so_placement_keeps_them_together() {
        let scattered = layout(&[(MigProfile::G1, 0), (MigProfile::G1, 1), (MigProfile::G1, 5)]);
        assert!(scattered.free_starts(MigProfile::G3).is_empty());

        let mut packed = MigLayout::default();
        for _ in 0..3 {
            let start = packed.best_start(MigProfile::G1).expect("room for a 1g");
            packed.instances.push(MigInstance { profile: MigProfile::G1, start });
        }
        assert!(!packed.free_starts(MigProfile::G3).is_empty(), "{packed:?}");
    }

    #[test]
    fn invalid_layouts_are_named() {
        assert!(matches!(layout(&[(MigProfile::G3, 2)]).validate(), Err(LayoutError::StartNotAllowed(_))));
        assert!(matches!(
            layout(&[(MigProfile::G2, 0), (MigProfile::G1, 1)]).validate(),
            Err(LayoutError::Overlap(..))
        ));
        assert!(matches!(
            layout(&[(MigProfile::G1Media, 0), (MigProfile::G1Media, 1)]).validate(),
            Err(LayoutError::TooMany(MigProfile::G1Media))
        ));
        assert!(matches!(layout(&[(MigProfile::G4, 0), (MigProfile::G3, 4)]).validate(), Ok(())));
    }

    proptest! {

        /// Layouts reached by any valid placements are all in the enumeration.
        #[test]
        fn enumeration_holds_every_reachable_layout(l in arb_layout()) {
            prop_assert_eq!(l.validate(), Ok(()));
            prop_assert!(is_enumerated(&l));
        }

        /// A single request is refused only when no valid layout holds the busy instances
        /// and the request, i.e. the GPU could not take it whatever we destroy.
        #[test]
        fn no_request_is_refused_that_the_gpu_could_take((current, keep) in arb_gpu(), p in 0usize..7) {
            let profile = MigProfile::ALL[p];
            let plan = plan_repartition(&current, &keep, &[profile]);
            let possible = MigLayout::enumerate_all().any(|l| {
                without(&l.instances, &keep).is_some_and(|rest| rest.iter().any(|i| i.profile == profile))
            });
            prop_assert_eq!(plan.is_some(), possible);
            prop_assert_eq!(fits_after_repartition(&current, &keep, profile), possible);
            if let Some(plan) = plan {
                prop_assert_eq!(plan.target.validate(), Ok(()));
                prop_assert_eq!(plan.placements.len(), 1);
                prop_assert_eq!(plan.placements[0].profile, profile);
            }
        }

        /// The operations turn `current` into exactly the target, safely, and the target
        /// is the best that trying every placement can find.
        #[test]
        fn operations_reach_the_target_and_spare_busy_instances(
            (current, keep) in arb_gpu(),
            want in proptest::collection::vec(0usize..7, 0..4),
        ) {
            let want: Vec<MigProfile> = want.into_iter().map(|p| MigProfile::ALL[p]).collect();
            let best = brute_force_best(&keep, &want);
            let plan = plan_repartition(&current, &keep, &want);
            prop_assert_eq!(plan.is_some(), best.is_some());
            let Some(plan) = plan else { return Ok(()) };
            prop_assert_eq!(plan.target.validate(), Ok(()));
            prop_assert_eq!(Some(plan.target.open_options()), best);
            let after = apply(&current, &keep, &plan.operations).map_err(TestCaseError::fail)?;
            prop_assert_eq!(sorted(&after.instances), sorted(&plan.target.instances));
            let mut expected = keep.clone();
            expected.extend(plan.placements.iter().copied());
            prop_assert_eq!(sorted(&expected), sorted(&plan.target.instances));
            let asked: Vec<MigProfile> = plan.placements.iter().map(|i| i.profile).collect();
            prop_assert_eq!(asked, want);
            let creates: Vec<MigInstance> = plan.operations.iter().filter_map(|op| match op {
                MigOperation::Create(i) => Some(*i),
                MigOperation::Destroy(_) => None,
            }).collect();
            prop_assert!(creates.windows(2).all(|w| w[0].creation_order() <= w[1].creation_order()));
        }
        /// Whatever sequence of requests arrives, best_start never produces an invalid
        /// layout, and refuses only when no allowed start would have been valid.
        #[test]
        fn placement_never_makes_an_invalid_layout(requests in proptest::collection::vec(0usize..7, 1..20)) {
            let mut l = MigLayout::default();
            for r in requests {
                let profile = MigProfile::ALL[r];
                match l.best_start(profile) {
                    Some(start) => {
                        l.instances.push(MigInstance { profile, start });
                        prop_assert_eq!(l.validate(), Ok(()));
                    }
                    None => {
                        let nowhere = profile
                            .allowed_starts()
                            .iter()
                            .all(|&start| l.with(MigInstance { profile, start }).validate().is_err());
                        prop_assert!(nowhere);
                    }
                }
            }
        }
    }
}
