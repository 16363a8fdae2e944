//! MIG geometry, as in NVIDIA's MIG User Guide (see `shared/reference/gpu-partitioning.md`).
//!
//! A MIG-capable GPU has 8 memory slices and 7 compute slices. A GPU instance takes a
//! contiguous run of memory slices starting at one of its profile's allowed starts;
//! instances never overlap, their compute slices add up to at most 7, and at most one
//! instance per GPU carries the media extensions (`+me`).

use serde::{Deserialize, Serialize};

use crate::gpu::GpuModel;

pub const MEMORY_SLICES: u8 = 8;
pub const COMPUTE_SLICES: u8 = 7;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum MigProfile {
    /// 1g: one memory slice, one compute slice.
    G1,
    /// 1g with media extensions; at most one per GPU.
    G1Media,
    /// 1g with two memory slices.
    G1DoubleMemory,
    G2,
    G3,
    G4,
    G7,
}

impl MigProfile {
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

    pub fn memory_slices(self) -> u8 {
        match self {
            MigProfile::G1 | MigProfile::G1Media => 1,
            MigProfile::G1DoubleMemory | MigProfile::G2 => 2,
            MigProfile::G3 | MigProfile::G4 => 4,
            MigProfile::G7 => 8,
        }
    }

    pub fn compute_slices(self) -> u8 {
        match self {
            MigProfile::G1 | MigProfile::G1Media | MigProfile::G1DoubleMemory => 1,
            MigProfile::G2 => 2,
            MigProfile::G3 => 3,
            MigProfile::G4 => 4,
            MigProfile::G7 => 7,
        }
    }

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

    pub fn from_key(key: &str) -> Option<MigProfile> {
        MigProfile::ALL.into_iter().find(|p| p.key() == key)
    }
}

/// A contiguous run of memory slices on one GPU; a whole GPU is `0..8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SliceRange {
    pub start: u8,
    pub size: u8,
}

impl SliceRange {
    pub const WHOLE_GPU: SliceRange = SliceRange { start: 0, size: MEMORY_SLICES };

    pub fn end(self) -> u8 {
        self.start + self.size
    }

    pub fn overlaps(self, other: SliceRange) -> bool {
        self.start < other.end() && other.start < self.end()
    }

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
    pub fn slices(self) -> SliceRange {
        SliceRange { start: self.start, size: self.profile.memory_slices() }
    }
}

/// Why a set of instances cannot exist together on one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayoutError {
    StartNotAllowed(MigInstance),
    Overlap(MigInstance, MigInstance),
    TooManyComputeSlices(u8),
    TooMany(MigProfile),
}

/// The MIG instances on one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigLayout {
    pub instances: Vec<MigInstance>,
}

impl MigLayout {
    pub fn new(instances: Vec<MigInstance>) -> MigLayout {
        MigLayout { instances }
    }

    pub fn validate(&self) -> Result<(), LayoutError> {
        for (i, a) in self.instances.iter().enumerate() {
            if !a.profile.allowed_starts().contains(&a.start) {
                return Err(LayoutError::StartNotAllowed(*a));
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn layout(items: &[(MigProfile, u8)]) -> MigLayout {
        MigLayout::new(items.iter().map(|&(profile, start)| MigInstance { profile, start }).collect())
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
