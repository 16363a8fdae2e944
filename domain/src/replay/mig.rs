//! The replay's demand on an MIG-partitioned fleet: a share rounded up to the smallest MIG
//! profile that holds it, nodes whose GPUs hold MIG layouts, and the policies compared there.

use crate::mig::{COMPUTE_SLICES, MigInstance, MigLayout, MigProfile};

use super::{Demand, GpuAsk, MILLI_PER_GPU, NodeShape, PlaceError};
use crate::placement::{SliceFit, slice_fit};

/// The MIG profiles a share may be rounded up to.
pub const MIG_SHARE_PROFILES: [MigProfile; 5] =
    [MigProfile::G1, MigProfile::G2, MigProfile::G3, MigProfile::G4, MigProfile::G7];

/// The smallest profile among 1g, 2g, 3g, 4g and 7g whose compute slices (of 7) hold a share
/// of `milli`: `ceil(milli * 7 / 1000)` slices, rounded up to a profile.
pub fn smallest_profile_for(milli: u16) -> MigProfile {
    let slices = (u32::from(milli) * u32::from(COMPUTE_SLICES)).div_ceil(u32::from(MILLI_PER_GPU));
    MIG_SHARE_PROFILES.into_iter().find(|p| u32::from(p.compute_slices()) >= slices).unwrap_or(MigProfile::G7)
}

/// What a task asks of an MIG fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MigAsk {
    None,
    /// One instance of this profile.
    Instance(MigProfile),
    /// This many whole (unpartitioned) GPUs on one node.
    Whole(u8),
}

impl MigAsk {
    pub fn from_gpu_ask(ask: GpuAsk) -> MigAsk {
        match ask {
            GpuAsk::None => MigAsk::None,
            GpuAsk::Share(m) => MigAsk::Instance(smallest_profile_for(m)),
            GpuAsk::Whole(n) => MigAsk::Whole(n),
        }
    }

    /// Compute slices asked in all (a whole GPU is 7).
    pub fn compute_slices(self) -> u32 {
        match self {
            MigAsk::None => 0,
            MigAsk::Instance(p) => u32::from(p.compute_slices()),
            MigAsk::Whole(n) => u32::from(n) * u32::from(COMPUTE_SLICES),
        }
    }
}

/// A task's demand on an MIG fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MigDemand {
    pub cpu_milli: u32,
    pub memory_mib: u32,
    pub ask: MigAsk,
}

impl MigDemand {
    pub fn from_demand(d: &Demand) -> MigDemand {
        MigDemand { cpu_milli: d.cpu_milli, memory_mib: d.memory_mib, ask: MigAsk::from_gpu_ask(d.gpu) }
    }
}

/// One GPU of an MIG fleet: held whole, or a set of MIG instances written as a bit per
/// (profile, start) pair of [`MigFacts::pairs`], so answers about it can be remembered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MigGpu {
    pub whole: bool,
    pub instances: u16,
}

impl MigGpu {
    pub fn is_empty(self) -> bool {
        !self.whole && self.instances == 0
    }
}

/// What [`crate::mig`] says about one GPU layout, remembered.
#[derive(Debug, Clone, Copy)]
struct LayoutFacts {
    compute_used: u8,
    /// Per share profile: the lowest free start, and how placement's MIG rule rates the GPU
    /// for it ([`slice_fit`]), `None` when the profile does not fit.
    first_start: [Option<u8>; 5],
    best_fit: [Option<SliceFit>; 5],
    /// Free compute slices no combination of instances could ever use.
    stranded: u8,
}

/// Remembers [`crate::mig`]'s answers per layout: a GPU has at most 2^14 layouts of the share
/// profiles, and a fleet of thousands of GPUs asks about the same few hundred again and again.
#[derive(Debug, Clone)]
pub struct MigFacts {
    pairs: Vec<(MigProfile, u8)>,
    facts: Vec<Option<LayoutFacts>>,
    addable: Vec<Option<u8>>,
}

impl Default for MigFacts {
    fn default() -> Self {
        MigFacts::new()
    }
}

impl MigFacts {
    pub fn new() -> MigFacts {
        let pairs: Vec<(MigProfile, u8)> =
            MIG_SHARE_PROFILES.iter().flat_map(|&p| p.allowed_starts().iter().map(move |&s| (p, s))).collect();
        let facts = vec![None; 1 << pairs.len()];
        let addable = vec![None; 1 << pairs.len()];
        MigFacts { pairs, facts, addable }
    }

    /// The (profile, start) pair each bit of [`MigGpu::instances`] stands for.
    pub fn pairs(&self) -> &[(MigProfile, u8)] {
        &self.pairs
    }

    pub(super) fn bit(&self, profile: MigProfile, start: u8) -> Option<u16> {
        self.pairs.iter().position(|&(p, s)| p == profile && s == start).map(|i| 1 << i)
    }

    /// The instances a mask stands for.
    pub fn layout(&self, mask: u16) -> MigLayout {
        MigLayout::new(
            self.pairs
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, &(profile, start))| MigInstance { profile, start })
                .collect(),
        )
    }

    fn facts(&mut self, mask: u16) -> LayoutFacts {
        if let Some(f) = self.facts[usize::from(mask)] {
            return f;
        }
        let layout = self.layout(mask);
        let compute_used: u8 = layout.instances.iter().map(|i| i.profile.compute_slices()).sum();
        let mut first_start = [None; 5];
        let mut best_fit = [None; 5];
        for (k, &p) in MIG_SHARE_PROFILES.iter().enumerate() {
            first_start[k] = layout.free_starts(p).first().copied();
            best_fit[k] = slice_fit(&layout, p);
        }
        let usable = self.most_compute_addable(mask);
        let f = LayoutFacts {
            compute_used,
            first_start,
            best_fit,
            stranded: COMPUTE_SLICES.saturating_sub(compute_used).saturating_sub(usable),
        };
        self.facts[usize::from(mask)] = Some(f);
        f
    }

    /// The most compute slices that instances added to `mask` could take.
    fn most_compute_addable(&mut self, mask: u16) -> u8 {
        if let Some(known) = self.addable[usize::from(mask)] {
            return known;
        }
        let layout = self.layout(mask);
        let mut best = 0;
        for &p in &MIG_SHARE_PROFILES {
            for start in layout.free_starts(p) {
                let Some(bit) = self.bit(p, start) else { continue };
                let more = p.compute_slices() + self.most_compute_addable(mask | bit);
                best = best.max(more);
            }
        }
        self.addable[usize::from(mask)] = Some(best);
        best
    }

    /// Compute slices in use on `gpu`.
    pub fn compute_used(&mut self, gpu: MigGpu) -> u8 {
        if gpu.whole { COMPUTE_SLICES } else { self.facts(gpu.instances).compute_used }
    }

    /// Free compute slices on `gpu` that no instance could ever use, given its layout.
    pub fn stranded(&mut self, gpu: MigGpu) -> u8 {
        if gpu.whole { 0 } else { self.facts(gpu.instances).stranded }
    }

    /// The lowest start at which `profile` could be added to `gpu`.
    pub fn first_start(&mut self, gpu: MigGpu, profile: MigProfile) -> Option<u8> {
        let k = MIG_SHARE_PROFILES.iter().position(|&p| p == profile)?;
        if gpu.whole { None } else { self.facts(gpu.instances).first_start[k] }
    }

    /// How placement's MIG rule rates `gpu` for a new `profile` instance ([`slice_fit`]).
    pub fn slice_fit(&mut self, gpu: MigGpu, profile: MigProfile) -> Option<SliceFit> {
        let k = MIG_SHARE_PROFILES.iter().position(|&p| p == profile)?;
        if gpu.whole { None } else { self.facts(gpu.instances).best_fit[k] }
    }
}

/// What is still free on one node of an MIG fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigNode {
    pub cpu_free: u32,
    pub memory_free: u32,
    pub gpus: Vec<MigGpu>,
}

impl MigNode {
    pub fn new(shape: NodeShape) -> MigNode {
        MigNode {
            cpu_free: shape.cpu_milli,
            memory_free: shape.memory_mib,
            gpus: vec![MigGpu::default(); usize::from(shape.gpus)],
        }
    }

    pub fn empty_gpus(&self) -> usize {
        self.gpus.iter().filter(|g| g.is_empty()).count()
    }

    fn has_cpu_and_memory(&self, d: &MigDemand) -> bool {
        self.cpu_free >= d.cpu_milli && self.memory_free >= d.memory_mib
    }
}

/// A node and, for an instance, the GPU and start on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigChoice {
    pub node: usize,
    pub gpu: Option<(u8, u8)>,
}

/// Chooses where a task goes on an MIG fleet, or `None` when no node fits.
pub trait MigPolicy {
    fn choose(&mut self, nodes: &[MigNode], facts: &mut MigFacts, demand: &MigDemand) -> Option<MigChoice>;
}

/// Whether `demand` fits `node` at all.
pub fn mig_fits(node: &MigNode, facts: &mut MigFacts, demand: &MigDemand) -> bool {
    node.has_cpu_and_memory(demand)
        && match demand.ask {
            MigAsk::None => true,
            MigAsk::Instance(p) => node.gpus.iter().any(|&g| facts.first_start(g, p).is_some()),
            MigAsk::Whole(n) => node.empty_gpus() >= usize::from(n),
        }
}

/// The first node in fleet order that fits, its first GPU with room, the lowest free start.
#[derive(Debug, Clone, Default)]
pub struct MigFirstFit;

impl MigPolicy for MigFirstFit {
    fn choose(&mut self, nodes: &[MigNode], facts: &mut MigFacts, demand: &MigDemand) -> Option<MigChoice> {
        for (i, node) in nodes.iter().enumerate() {
            if !node.has_cpu_and_memory(demand) {
                continue;
            }
            match demand.ask {
                MigAsk::None => return Some(MigChoice { node: i, gpu: None }),
                MigAsk::Whole(n) if node.empty_gpus() >= usize::from(n) => {
                    return Some(MigChoice { node: i, gpu: None });
                }
                MigAsk::Whole(_) => {}
                MigAsk::Instance(p) => {
                    for (g, &gpu) in node.gpus.iter().enumerate() {
                        if let Some(start) = facts.first_start(gpu, p) {
                            return Some(MigChoice { node: i, gpu: Some((g as u8, start)) });
                        }
                    }
                }
            }
        }
        None
    }
}

/// Berth's MIG placement rule, with CPU and memory: an instance goes where placement's own
/// [`slice_fit`] rates best (the GPU already most used, at the start that leaves the most
/// options open, as [`crate::placement::place`] does); whole GPUs go to the node with the fewest empty GPUs that
/// still has enough; a CPU-only task goes where it takes least from GPU work: the node with
/// the fewest free compute slices, then the least free CPU. Ties go to the lowest index.
#[derive(Debug, Clone, Default)]
pub struct MigPacking;

impl MigPolicy for MigPacking {
    fn choose(&mut self, nodes: &[MigNode], facts: &mut MigFacts, demand: &MigDemand) -> Option<MigChoice> {
        match demand.ask {
            MigAsk::Instance(p) => {
                let mut best: Option<((u8, usize), MigChoice)> = None;
                for (i, node) in nodes.iter().enumerate() {
                    if !node.has_cpu_and_memory(demand) {
                        continue;
                    }
                    for (g, &gpu) in node.gpus.iter().enumerate() {
                        let Some(fit) = facts.slice_fit(gpu, p) else { continue };
                        if best.is_none_or(|(b, _)| fit.key > b) {
                            best = Some((fit.key, MigChoice { node: i, gpu: Some((g as u8, fit.start)) }));
                        }
                    }
                }
                best.map(|(_, c)| c)
            }
            MigAsk::Whole(n) => nodes
                .iter()
                .enumerate()
                .filter(|(_, node)| node.has_cpu_and_memory(demand) && node.empty_gpus() >= usize::from(n))
                .min_by_key(|(i, node)| (node.empty_gpus(), *i))
                .map(|(i, _)| MigChoice { node: i, gpu: None }),
            MigAsk::None => {
                let mut best: Option<((u32, u32), usize)> = None;
                for (i, node) in nodes.iter().enumerate() {
                    if !node.has_cpu_and_memory(demand) {
                        continue;
                    }
                    let free_compute: u32 =
                        node.gpus.iter().map(|&g| u32::from(COMPUTE_SLICES - facts.compute_used(g))).sum();
                    let key = (free_compute, node.cpu_free);
                    if best.is_none_or(|(b, _)| key < b) {
                        best = Some((key, i));
                    }
                }
                best.map(|(_, node)| MigChoice { node, gpu: None })
            }
        }
    }
}

/// Where a task went on an MIG fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigPlacement {
    pub node: usize,
    /// GPU indexes taken (one for an instance).
    pub gpus: Vec<u8>,
    /// The instance, for an instance ask.
    pub instance: Option<MigInstance>,
}

/// Compute slices on an MIG fleet at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MigUsage {
    pub total: u64,
    pub allocated: u64,
    /// Free slices that no instance could use, given the layouts of their GPUs.
    pub stranded: u64,
    /// Free slices on GPUs that already hold an instance (the rest are on empty GPUs).
    pub free_on_partitioned: u64,
}

/// An MIG fleet and what is taken on it.
#[derive(Debug, Clone)]
pub struct MigCluster {
    nodes: Vec<MigNode>,
    facts: MigFacts,
}

impl MigCluster {
    pub fn new(shapes: impl IntoIterator<Item = NodeShape>) -> MigCluster {
        MigCluster { nodes: shapes.into_iter().map(MigNode::new).collect(), facts: MigFacts::new() }
    }

    pub fn nodes(&self) -> &[MigNode] {
        &self.nodes
    }

    /// The instances on one GPU, as [`crate::mig`] sees them.
    pub fn layout(&self, gpu: MigGpu) -> MigLayout {
        self.facts.layout(gpu.instances)
    }

    pub fn any_fits(&mut self, demand: &MigDemand) -> bool {
        let MigCluster { nodes, facts } = self;
        nodes.iter().any(|n| mig_fits(n, facts, demand))
    }

    pub fn place(&mut self, demand: &MigDemand, policy: &mut dyn MigPolicy) -> Result<MigPlacement, PlaceError> {
        let choice = policy.choose(&self.nodes, &mut self.facts, demand).ok_or(PlaceError::NoNodeFits)?;
        self.take(demand, choice)
    }

    /// Takes `demand` where `choice` says, or changes nothing and says why not.
    pub fn take(&mut self, demand: &MigDemand, choice: MigChoice) -> Result<MigPlacement, PlaceError> {
        let MigCluster { nodes, facts } = self;
        let node = nodes.get_mut(choice.node).ok_or(PlaceError::Misfit)?;
        if !node.has_cpu_and_memory(demand) {
            return Err(PlaceError::Misfit);
        }
        let (gpus, instance) = match demand.ask {
            MigAsk::None => (Vec::new(), None),
            MigAsk::Whole(n) => {
                let ids: Vec<u8> = (0..node.gpus.len())
                    .filter(|&g| node.gpus[g].is_empty())
                    .take(usize::from(n))
                    .map(|g| g as u8)
                    .collect();
                if ids.len() < usize::from(n) {
                    return Err(PlaceError::Misfit);
                }
                for &g in &ids {
                    node.gpus[usize::from(g)].whole = true;
                }
                (ids, None)
            }
            MigAsk::Instance(profile) => {
                let (g, start) = choice.gpu.ok_or(PlaceError::Misfit)?;
                let gpu = *node.gpus.get(usize::from(g)).ok_or(PlaceError::Misfit)?;
                let bit = facts.bit(profile, start).ok_or(PlaceError::Misfit)?;
                if gpu.whole || gpu.instances & bit != 0 || facts.layout(gpu.instances | bit).validate().is_err() {
                    return Err(PlaceError::Misfit);
                }
                node.gpus[usize::from(g)].instances |= bit;
                (vec![g], Some(MigInstance { profile, start }))
            }
        };
        node.cpu_free -= demand.cpu_milli;
        node.memory_free -= demand.memory_mib;
        Ok(MigPlacement { node: choice.node, gpus, instance })
    }

    pub fn usage(&mut self) -> MigUsage {
        let MigCluster { nodes, facts } = self;
        let mut usage = MigUsage::default();
        for &gpu in nodes.iter().flat_map(|n| n.gpus.iter()) {
            usage.total += u64::from(COMPUTE_SLICES);
            let used = facts.compute_used(gpu);
            usage.allocated += u64::from(used);
            usage.stranded += u64::from(facts.stranded(gpu));
            if used > 0 {
                usage.free_on_partitioned += u64::from(COMPUTE_SLICES - used);
            }
        }
        usage
    }
}

/// How an MIG replay went.
#[derive(Debug, Clone, PartialEq)]
pub struct MigReport {
    pub placed: usize,
    pub skipped: usize,
    /// Usage just after the first arrival that brings the arrived compute slices to 100% of
    /// the fleet's (`None` if it never does), and tasks skipped by then.
    pub at_full_arrival: Option<(MigUsage, usize)>,
    pub at_end: MigUsage,
}

/// Places `arrivals` on an MIG fleet one at a time, never removing any; a task that fits
/// nowhere is skipped. `record` hears every arrival's outcome in order.
pub fn replay_mig<'a>(
    cluster: &mut MigCluster,
    arrivals: impl IntoIterator<Item = &'a MigDemand>,
    policy: &mut dyn MigPolicy,
    mut record: impl FnMut(&MigDemand, Option<&MigPlacement>),
) -> Result<MigReport, PlaceError> {
    let capacity = cluster.usage().total;
    let (mut arrived, mut placed, mut skipped) = (0u64, 0, 0);
    let mut at_full = None;
    for demand in arrivals {
        arrived += u64::from(demand.ask.compute_slices());
        match cluster.place(demand, policy) {
            Ok(placement) => {
                placed += 1;
                record(demand, Some(&placement));
            }
            Err(PlaceError::NoNodeFits) => {
                skipped += 1;
                record(demand, None);
            }
            Err(e) => return Err(e),
        }
        if at_full.is_none() && arrived >= capacity {
            at_full = Some((cluster.usage(), skipped));
        }
    }
    Ok(MigReport { placed, skipped, at_full_arrival: at_full, at_end: cluster.usage() })
}
