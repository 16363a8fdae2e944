//! GPU sharing: tasks that ask for a share of one GPU, for whole GPUs or for no GPU at all,
//! placed on nodes with CPU, memory and GPUs; and the same demand on an MIG-partitioned fleet.
//!
//! The model is the one of Alibaba's openb trace and of the simulator published with "Beware
//! of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent"
//! (Weng et al., USENIX ATC'23, hkust-adsl/kubernetes-scheduler-simulator):
//!
//! - a GPU is 1000 milli; a task asks for CPU milli, memory MiB and a [`GpuAsk`]: nothing, a
//!   share (1..=999 milli) of one GPU, or whole GPUs, all on one node;
//! - a task fits a node when the node has its CPU and memory free and, for a share, one GPU
//!   with that many milli free (several shares may sit on one GPU up to 1000 milli), or, for
//!   whole GPUs, that many entirely free GPUs.
//!
//! This module owns:
//! - [`NodeState`] and [`Cluster`]: the state, which never lets a GPU go above 1000 milli or
//!   a node above its CPU or memory;
//! - the [`Policy`] trait and its policies: [`FirstFit`], [`BestFit`] (the published
//!   baseline), [`Fgd`] (the paper's policy as published) and [`FragmentationAware`]
//!   (Berth's);
//! - [`tuned_arrivals`] and [`replay`]: the published experiment (workload tuned to a ratio of
//!   capacity, placed one task at a time, nothing leaves, a task that fits nowhere is skipped);
//! - the MIG counterpart: [`MigAsk`] (a share rounded up to the smallest MIG profile that holds
//!   it), [`MigCluster`], [`MigFirstFit`] and [`MigPacking`] (Berth's placement rule), with
//!   the geometry itself left to [`crate::mig`].
//!
//! Pure and deterministic: randomness (workload sampling, tie-breaking) comes from a seeded
//! [`SplitMix64`], so a seed gives the same placements on every machine.

use std::collections::HashMap;

use thiserror::Error;

use crate::mig::{COMPUTE_SLICES, MigInstance, MigLayout, MigProfile};

/// Milli in one GPU.
pub const MILLI_PER_GPU: u16 = 1000;

// ---------------------------------------------------------------------------------------------
// Demand and node state
// ---------------------------------------------------------------------------------------------

/// What a task asks of GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GpuAsk {
    /// No GPU: CPU and memory only.
    None,
    /// A share of one GPU, 1..=999 milli.
    Share(u16),
    /// This many whole GPUs, all on one node.
    Whole(u8),
}

impl GpuAsk {
    /// GPU milli asked in all.
    pub fn total_milli(self) -> u32 {
        match self {
            GpuAsk::None => 0,
            GpuAsk::Share(m) => u32::from(m),
            GpuAsk::Whole(n) => u32::from(n) * u32::from(MILLI_PER_GPU),
        }
    }

    /// Milli asked of each GPU the task touches (0 for none).
    pub fn milli_per_gpu(self) -> u16 {
        match self {
            GpuAsk::None => 0,
            GpuAsk::Share(m) => m,
            GpuAsk::Whole(_) => MILLI_PER_GPU,
        }
    }

    /// How many GPUs the task touches.
    pub fn gpu_count(self) -> u8 {
        match self {
            GpuAsk::None => 0,
            GpuAsk::Share(_) => 1,
            GpuAsk::Whole(n) => n,
        }
    }
}

/// What one task asks of the node it lands on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Demand {
    pub cpu_milli: u32,
    pub memory_mib: u32,
    pub gpu: GpuAsk,
}

/// Why a trace row is not a demand this model can hold.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DemandError {
    #[error("{0} milli per GPU is more than a whole GPU")]
    MoreThanAGpu(u32),
    #[error("{count} GPUs of {milli} milli each: only whole GPUs can be asked for several at a time")]
    SeveralShares { count: u32, milli: u32 },
    #[error("{0} GPUs is more than a node can hold")]
    TooManyGpus(u32),
}

impl Demand {
    /// A demand as the trace writes it: `num_gpu` GPUs of `gpu_milli` each. No GPU, or 0
    /// milli, is a CPU-only task; one GPU under 1000 milli is a share; otherwise whole GPUs.
    pub fn from_trace(cpu_milli: u32, memory_mib: u32, num_gpu: u32, gpu_milli: u32) -> Result<Demand, DemandError> {
        let gpu = match (num_gpu, gpu_milli) {
            (0, _) | (_, 0) => GpuAsk::None,
            (_, m) if m > u32::from(MILLI_PER_GPU) => return Err(DemandError::MoreThanAGpu(m)),
            (1, m) if m < u32::from(MILLI_PER_GPU) => GpuAsk::Share(m as u16),
            (n, m) if m == u32::from(MILLI_PER_GPU) => {
                GpuAsk::Whole(u8::try_from(n).map_err(|_| DemandError::TooManyGpus(n))?)
            }
            (count, milli) => return Err(DemandError::SeveralShares { count, milli }),
        };
        Ok(Demand { cpu_milli, memory_mib, gpu })
    }
}

/// A node as built: CPU milli, memory MiB and how many GPUs of 1000 milli.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodeShape {
    pub cpu_milli: u32,
    pub memory_mib: u32,
    pub gpus: u8,
}

/// What is still free on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    shape: NodeShape,
    cpu_free: u32,
    memory_free: u32,
    gpu_free: Vec<u16>,
    // Kept with every change so that `fits` is O(1): placement asks it of every node.
    gpu_free_total: u32,
    whole_gpus_free: u8,
    largest_gpu_free: u16,
}

impl NodeState {
    pub fn new(shape: NodeShape) -> NodeState {
        let mut node = NodeState {
            shape,
            cpu_free: shape.cpu_milli,
            memory_free: shape.memory_mib,
            gpu_free: vec![MILLI_PER_GPU; usize::from(shape.gpus)],
            gpu_free_total: 0,
            whole_gpus_free: 0,
            largest_gpu_free: 0,
        };
        node.recount();
        node
    }

    fn recount(&mut self) {
        self.gpu_free_total = self.gpu_free.iter().map(|&f| u32::from(f)).sum();
        self.whole_gpus_free = self.gpu_free.iter().filter(|&&f| f == MILLI_PER_GPU).count() as u8;
        self.largest_gpu_free = self.gpu_free.iter().copied().max().unwrap_or(0);
    }

    pub fn shape(&self) -> NodeShape {
        self.shape
    }

    pub fn cpu_free(&self) -> u32 {
        self.cpu_free
    }

    pub fn memory_free(&self) -> u32 {
        self.memory_free
    }

    /// Free milli of each GPU, by GPU index.
    pub fn gpu_free(&self) -> &[u16] {
        &self.gpu_free
    }

    pub fn gpu_free_total(&self) -> u32 {
        self.gpu_free_total
    }

    pub fn whole_gpus_free(&self) -> u8 {
        self.whole_gpus_free
    }

    /// Whether `demand` fits here: CPU, memory, and a GPU with room for a share or enough
    /// entirely free GPUs.
    pub fn fits(&self, demand: &Demand) -> bool {
        self.cpu_free >= demand.cpu_milli
            && self.memory_free >= demand.memory_mib
            && match demand.gpu {
                GpuAsk::None => true,
                GpuAsk::Share(m) => self.largest_gpu_free >= m,
                GpuAsk::Whole(n) => self.whole_gpus_free >= n,
            }
    }

    /// The GPU with the least room that still holds a share of `milli` (lowest index on ties).
    pub fn tightest_gpu_for(&self, milli: u16) -> Option<u8> {
        let mut best: Option<(u16, usize)> = None;
        for (i, &free) in self.gpu_free.iter().enumerate() {
            if free >= milli && best.is_none_or(|(f, _)| free < f) {
                best = Some((free, i));
            }
        }
        best.map(|(_, i)| i as u8)
    }

    /// The lowest-indexed GPU with room for a share of `milli`.
    pub fn first_gpu_for(&self, milli: u16) -> Option<u8> {
        self.gpu_free.iter().position(|&f| f >= milli).map(|i| i as u8)
    }

    /// Takes `demand`; a share goes on GPU `share_gpu`, whole GPUs are the lowest-indexed
    /// entirely free ones (they are interchangeable: the trace knows no GPU topology).
    /// Returns the GPU indexes taken, or an error and no change.
    fn take(&mut self, demand: &Demand, share_gpu: Option<u8>) -> Result<Vec<u8>, PlaceError> {
        let misfit = PlaceError::Misfit;
        if self.cpu_free < demand.cpu_milli || self.memory_free < demand.memory_mib {
            return Err(misfit);
        }
        let taken: Vec<u8> = match demand.gpu {
            GpuAsk::None => Vec::new(),
            GpuAsk::Share(m) => {
                let gpu = share_gpu.ok_or(misfit.clone())?;
                let free = self.gpu_free.get_mut(usize::from(gpu)).ok_or(misfit.clone())?;
                if *free < m {
                    return Err(misfit);
                }
                *free -= m;
                vec![gpu]
            }
            GpuAsk::Whole(n) => {
                if self.whole_gpus_free < n {
                    return Err(misfit);
                }
                let ids: Vec<u8> = (0..self.gpu_free.len())
                    .filter(|&i| self.gpu_free[i] == MILLI_PER_GPU)
                    .take(usize::from(n))
                    .map(|i| i as u8)
                    .collect();
                for &i in &ids {
                    self.gpu_free[usize::from(i)] = 0;
                }
                ids
            }
        };
        self.cpu_free -= demand.cpu_milli;
        self.memory_free -= demand.memory_mib;
        self.recount();
        Ok(taken)
    }
}

/// Why a task was not placed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PlaceError {
    #[error("no node has room for this task")]
    NoNodeFits,
    /// A policy chose a node or GPU that cannot hold the task: a bug in the policy.
    #[error("the policy chose a node or GPU without room for this task")]
    Misfit,
}

/// Where a task went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub node: usize,
    /// GPU indexes on the node, empty for a CPU-only task.
    pub gpus: Vec<u8>,
    /// Milli taken on each of `gpus`.
    pub milli_per_gpu: u16,
}

/// A node and, for a share, the GPU on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub node: usize,
    pub share_gpu: Option<u8>,
}

/// Chooses where a task goes, or `None` when no node fits.
///
/// A policy instance serves one [`Cluster`]: policies may remember what they computed per
/// node, keyed on [`Cluster::version`].
pub trait Policy {
    fn choose(&mut self, cluster: &Cluster, demand: &Demand) -> Option<Choice>;
}

/// A fleet of nodes and what is taken on them.
#[derive(Debug, Clone)]
pub struct Cluster {
    nodes: Vec<NodeState>,
    versions: Vec<u32>,
    total_gpu_milli: u64,
    allocated_gpu_milli: u64,
    largest_cpu_milli: u32,
    most_gpus: u8,
}

impl Cluster {
    pub fn new(shapes: impl IntoIterator<Item = NodeShape>) -> Cluster {
        let nodes: Vec<NodeState> = shapes.into_iter().map(NodeState::new).collect();
        Cluster {
            versions: vec![0; nodes.len()],
            total_gpu_milli: nodes.iter().map(|n| u64::from(n.gpu_free_total)).sum(),
            allocated_gpu_milli: 0,
            largest_cpu_milli: nodes.iter().map(|n| n.shape.cpu_milli).max().unwrap_or(0),
            most_gpus: nodes.iter().map(|n| n.shape.gpus).max().unwrap_or(0),
            nodes,
        }
    }

    pub fn nodes(&self) -> &[NodeState] {
        &self.nodes
    }

    /// How many times node `node` has changed; policies key their memory on it.
    pub fn version(&self, node: usize) -> u32 {
        self.versions[node]
    }

    pub fn total_gpu_milli(&self) -> u64 {
        self.total_gpu_milli
    }

    pub fn allocated_gpu_milli(&self) -> u64 {
        self.allocated_gpu_milli
    }

    /// Allocated GPU milli over all GPU milli, 0..=1.
    pub fn allocation_rate(&self) -> f64 {
        if self.total_gpu_milli == 0 { 0.0 } else { self.allocated_gpu_milli as f64 / self.total_gpu_milli as f64 }
    }

    /// The largest node CPU in the fleet (best-fit normalises by it).
    pub fn largest_cpu_milli(&self) -> u32 {
        self.largest_cpu_milli
    }

    /// The most GPUs any node has (best-fit normalises by it).
    pub fn most_gpus(&self) -> u8 {
        self.most_gpus
    }

    /// Whether any node could take `demand`.
    pub fn any_fits(&self, demand: &Demand) -> bool {
        self.nodes.iter().any(|n| n.fits(demand))
    }

    /// Asks `policy` where `demand` goes and takes it there.
    pub fn place(&mut self, demand: &Demand, policy: &mut dyn Policy) -> Result<Placement, PlaceError> {
        let choice = policy.choose(self, demand).ok_or(PlaceError::NoNodeFits)?;
        self.take(demand, choice)
    }

    /// Takes `demand` where `choice` says, or changes nothing and says why not.
    pub fn take(&mut self, demand: &Demand, choice: Choice) -> Result<Placement, PlaceError> {
        let node = self.nodes.get_mut(choice.node).ok_or(PlaceError::Misfit)?;
        let gpus = node.take(demand, choice.share_gpu)?;
        self.versions[choice.node] = self.versions[choice.node].wrapping_add(1);
        self.allocated_gpu_milli += u64::from(demand.gpu.total_milli());
        Ok(Placement { node: choice.node, gpus, milli_per_gpu: demand.gpu.milli_per_gpu() })
    }
}

// ---------------------------------------------------------------------------------------------
// Seeded randomness
// ---------------------------------------------------------------------------------------------

/// SplitMix64 (Steele, Lea, Flood 2014): a small, fast, seedable generator. Not for secrets;
/// here so that a seed reproduces a replay exactly on any machine.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0); the multiply-shift bias is below 2^-40 for any n here.
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Policies
// ---------------------------------------------------------------------------------------------

/// The order in which tied nodes win: the node with the lowest rank. The published simulator
/// prefixes node names with a seeded random permutation and its scheduler (a Kubernetes fork)
/// takes the lexicographically smallest name among top-scored nodes, so ties go to the
/// earliest node of a per-seed random order: a packing tie-break, not a random one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeOrder(Vec<u32>);

impl NodeOrder {
    /// Ties go to the lowest index.
    pub fn fleet(nodes: usize) -> NodeOrder {
        NodeOrder((0..nodes as u32).collect())
    }

    /// Ties go to the earliest node of a random order drawn from `seed`.
    pub fn shuffled(nodes: usize, seed: u64) -> NodeOrder {
        let mut order: Vec<u32> = (0..nodes as u32).collect();
        SplitMix64::new(seed).shuffle(&mut order);
        let mut rank = vec![0; nodes];
        for (position, &node) in order.iter().enumerate() {
            rank[node as usize] = position as u32;
        }
        NodeOrder(rank)
    }

    /// The rank of `node`; nodes beyond the order rank after every ranked one, by index.
    pub fn rank(&self, node: usize) -> u64 {
        self.0.get(node).map_or(u64::from(u32::MAX) + node as u64, |&r| u64::from(r))
    }
}

/// The first node, in fleet order, that fits; a share goes on the lowest-indexed GPU with room.
#[derive(Debug, Clone, Default)]
pub struct FirstFit;

impl Policy for FirstFit {
    fn choose(&mut self, cluster: &Cluster, demand: &Demand) -> Option<Choice> {
        let node = cluster.nodes().iter().position(|n| n.fits(demand))?;
        let share_gpu = match demand.gpu {
            GpuAsk::Share(m) => Some(cluster.nodes()[node].first_gpu_for(m)?),
            _ => None,
        };
        Some(Choice { node, share_gpu })
    }
}

/// Best-fit as the published simulator defines it (`BestFitScore`): the node that would have
/// the least left, scored `100 * (1 - (cpu_left / largest_cpu + gpu_milli_left / (most_gpus *
/// 1000)) / 2)` after placing and truncated to a whole number as the Kubernetes scheduler
/// framework does; equal scores go to the earliest node in `ties` (see [`NodeOrder`]). A share
/// goes on the GPU with the least room that holds it.
#[derive(Debug, Clone)]
pub struct BestFit {
    ties: NodeOrder,
}

impl BestFit {
    pub fn new(ties: NodeOrder) -> BestFit {
        BestFit { ties }
    }

    fn score(cluster: &Cluster, node: &NodeState, demand: &Demand) -> i64 {
        let cpu_left = f64::from(node.cpu_free - demand.cpu_milli);
        let gpu_left = f64::from(node.gpu_free_total - demand.gpu.total_milli());
        let largest_cpu = f64::from(cluster.largest_cpu_milli().max(1));
        let most_gpu_milli = f64::from(u32::from(cluster.most_gpus().max(1)) * u32::from(MILLI_PER_GPU));
        // Same operations in the same order as the simulator, so truncation lands the same way.
        let mut left = 0.0;
        left += cpu_left / largest_cpu * 0.5;
        left += gpu_left / most_gpu_milli * 0.5;
        ((1.0 - left) * 100.0) as i64
    }
}

impl Policy for BestFit {
    fn choose(&mut self, cluster: &Cluster, demand: &Demand) -> Option<Choice> {
        let mut best: Option<(i64, u64, usize)> = None;
        for (i, node) in cluster.nodes().iter().enumerate() {
            if !node.fits(demand) {
                continue;
            }
            // Higher score first, then lower rank.
            let key = (Self::score(cluster, node, demand), self.ties.rank(i));
            if best.is_none_or(|(s, r, _)| key.0 > s || (key.0 == s && key.1 < r)) {
                best = Some((key.0, key.1, i));
            }
        }
        let (_, _, node) = best?;
        let share_gpu = match demand.gpu {
            GpuAsk::Share(m) => Some(cluster.nodes()[node].tightest_gpu_for(m)?),
            _ => None,
        };
        Some(Choice { node, share_gpu })
    }
}

/// The kinds of task a fleet expects, weighted by how often they come: what fragmentation is
/// measured against.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskMix {
    /// Kinds grouped by GPU ask, so that each group scans the GPUs once.
    groups: Vec<MixGroup>,
    appetite: Appetite,
}

#[derive(Debug, Clone, PartialEq)]
struct MixGroup {
    gpu: GpuAsk,
    /// (CPU milli, weight), CPU ascending.
    kinds: Vec<(u32, f64)>,
}

/// What GPU tasks ask of CPU and memory per GPU milli, on average over a workload: how much
/// CPU and memory a node must keep to put its free GPUs to use. Zero means no bound.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Appetite {
    pub cpu_milli_per_gpu_milli: f64,
    pub memory_mib_per_gpu_milli: f64,
}

impl Appetite {
    /// Total CPU and memory over total GPU milli of the tasks that ask for GPUs.
    pub fn of(demands: &[Demand]) -> Appetite {
        let (mut cpu, mut memory, mut milli) = (0.0, 0.0, 0.0);
        for d in demands.iter().filter(|d| d.gpu != GpuAsk::None) {
            cpu += f64::from(d.cpu_milli);
            memory += f64::from(d.memory_mib);
            milli += f64::from(d.gpu.total_milli());
        }
        if milli == 0.0 {
            return Appetite::default();
        }
        Appetite { cpu_milli_per_gpu_milli: cpu / milli, memory_mib_per_gpu_milli: memory / milli }
    }
}

impl TaskMix {
    /// The most common kinds of task (CPU milli and GPU ask; memory is not part of a kind)
    /// that together make up at least `coverage` of `demands`, weighted by count and
    /// renormalised to sum to 1. Kinds are ranked by count, ties by (CPU, milli per GPU, GPU
    /// count) descending, as the published simulator ranks its "typical pods". The appetite
    /// is that of all of `demands`.
    pub fn typical(demands: &[Demand], coverage: f64) -> TaskMix {
        let mut counts: HashMap<(u32, GpuAsk), usize> = HashMap::new();
        for d in demands {
            *counts.entry((d.cpu_milli, d.gpu)).or_default() += 1;
        }
        let mut ranked: Vec<((u32, GpuAsk), usize)> = counts.into_iter().collect();
        ranked.sort_by(|a, b| {
            let key =
                |((cpu, gpu), count): &((u32, GpuAsk), usize)| (*count, *cpu, gpu.milli_per_gpu(), gpu.gpu_count());
            key(b).cmp(&key(a))
        });
        let wanted = coverage * demands.len() as f64;
        let mut taken = Vec::new();
        let mut cumulative = 0usize;
        for entry in ranked {
            if cumulative as f64 >= wanted && !taken.is_empty() {
                break;
            }
            cumulative += entry.1;
            taken.push(entry);
        }
        let mix = TaskMix::from_counts(taken.into_iter().map(|((cpu, gpu), count)| (cpu, gpu, count as f64)));
        TaskMix { appetite: Appetite::of(demands), ..mix }
    }

    /// A mix from explicit (CPU milli, GPU ask, weight) kinds; weights are renormalised. The
    /// appetite is the kinds' CPU per GPU milli, with no memory bound.
    pub fn from_counts(kinds: impl IntoIterator<Item = (u32, GpuAsk, f64)>) -> TaskMix {
        let kinds: Vec<(u32, GpuAsk, f64)> = kinds.into_iter().filter(|k| k.2 > 0.0).collect();
        let total: f64 = kinds.iter().map(|k| k.2).sum();
        let (mut cpu, mut milli) = (0.0, 0.0);
        let mut groups: Vec<MixGroup> = Vec::new();
        for (kind_cpu, gpu, weight) in kinds {
            let weight = weight / total;
            if gpu != GpuAsk::None {
                cpu += weight * f64::from(kind_cpu);
                milli += weight * f64::from(gpu.total_milli());
            }
            match groups.iter_mut().find(|g| g.gpu == gpu) {
                Some(g) => g.kinds.push((kind_cpu, weight)),
                None => groups.push(MixGroup { gpu, kinds: vec![(kind_cpu, weight)] }),
            }
        }
        for g in &mut groups {
            g.kinds.sort_by_key(|k| k.0);
        }
        groups.sort_by_key(|g| g.gpu);
        let cpu_milli_per_gpu_milli = if milli > 0.0 { cpu / milli } else { 0.0 };
        TaskMix { groups, appetite: Appetite { cpu_milli_per_gpu_milli, memory_mib_per_gpu_milli: 0.0 } }
    }

    pub fn appetite(&self) -> Appetite {
        self.appetite
    }

    /// Expected GPU milli on a node, with `cpu_free` CPU and GPUs `gpu_free`, that a task
    /// drawn from the mix could not use: all of it when the task does not fit the node (or
    /// takes no GPU), otherwise the free milli of the GPUs too small for it. This is the
    /// fragmentation measure of the FGD paper.
    pub fn unusable_gpu_milli(&self, cpu_free: u32, gpu_free: &[u16]) -> f64 {
        let total: u32 = gpu_free.iter().map(|&f| u32::from(f)).sum();
        if total == 0 {
            return 0.0;
        }
        let mut out = 0.0;
        for group in &self.groups {
            let milli = group.gpu.milli_per_gpu();
            let (mut enough, mut too_small) = (0u8, 0u32);
            for &f in gpu_free {
                if f >= milli {
                    enough += 1;
                } else {
                    too_small += u32::from(f);
                }
            }
            let gpu_fits = group.gpu != GpuAsk::None && enough >= group.gpu.gpu_count();
            for &(cpu, weight) in &group.kinds {
                let unusable = if gpu_fits && cpu <= cpu_free { too_small } else { total };
                out += weight * f64::from(unusable);
            }
        }
        out
    }

    /// Free GPU milli that the node's free CPU and memory cannot feed, at the mix's appetite:
    /// however the next tasks are shaped, on average they run out of CPU or memory first.
    pub fn unfed_gpu_milli(&self, cpu_free: u32, memory_free: u32, gpu_free_total: u32) -> f64 {
        let mut fed = f64::INFINITY;
        if self.appetite.cpu_milli_per_gpu_milli > 0.0 {
            fed = fed.min(f64::from(cpu_free) / self.appetite.cpu_milli_per_gpu_milli);
        }
        if self.appetite.memory_mib_per_gpu_milli > 0.0 {
            fed = fed.min(f64::from(memory_free) / self.appetite.memory_mib_per_gpu_milli);
        }
        (f64::from(gpu_free_total) - fed).max(0.0)
    }
}

/// How a policy measures what a node's free GPUs are worth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Measure {
    /// FGD's: [`TaskMix::unusable_gpu_milli`].
    Fgd,
    /// Berth's: FGD's plus [`TaskMix::unfed_gpu_milli`].
    FgdAndUnfed,
}

impl Measure {
    fn of(self, mix: &TaskMix, cpu_free: u32, memory_free: u32, gpu_free: &[u16]) -> f64 {
        let unusable = mix.unusable_gpu_milli(cpu_free, gpu_free);
        match self {
            Measure::Fgd => unusable,
            Measure::FgdAndUnfed => {
                let total: u32 = gpu_free.iter().map(|&f| u32::from(f)).sum();
                unusable + mix.unfed_gpu_milli(cpu_free, memory_free, total)
            }
        }
    }
}

/// What one node offers one kind of demand, remembered until the node changes.
#[derive(Debug, Clone, Copy)]
struct Offer {
    version: u32,
    /// Higher is better.
    score: f64,
    share_gpu: u8,
}

const NO_OFFER: Offer = Offer { version: u32::MAX, score: f64::NEG_INFINITY, share_gpu: 0 };

/// Remembers each node's offer per kind of demand, so that a node is scored again only after
/// it changed: one placement changes one node, and tasks repeat a few hundred kinds.
#[derive(Debug, Clone, Default)]
struct OfferMemo {
    rows: HashMap<Demand, usize>,
    offers: Vec<Offer>,
    nodes: usize,
    /// The measure of each node before any new placement, with the node version.
    before: Vec<(u32, f64)>,
}

impl OfferMemo {
    fn row(&mut self, cluster: &Cluster, demand: &Demand) -> usize {
        let nodes = cluster.nodes().len();
        if self.nodes != nodes {
            *self = OfferMemo { nodes, before: vec![(u32::MAX, 0.0); nodes], ..OfferMemo::default() };
        }
        let next = self.rows.len();
        let row = *self.rows.entry(*demand).or_insert(next);
        if row == next {
            self.offers.extend(std::iter::repeat_n(NO_OFFER, nodes));
        }
        row
    }

    fn before(&mut self, cluster: &Cluster, mix: &TaskMix, measure: Measure, node: usize) -> f64 {
        let version = cluster.version(node);
        let (v, value) = self.before[node];
        if v == version {
            return value;
        }
        let state = &cluster.nodes()[node];
        let value = measure.of(mix, state.cpu_free, state.memory_free, &state.gpu_free);
        self.before[node] = (version, value);
        value
    }
}

/// Calls `each(gpu, measure_after)` for every way `demand` can go on `node` (one per
/// distinct free amount for a share: GPUs with equal room give equal outcomes, the lowest
/// index speaks for them).
fn outcomes(
    mix: &TaskMix,
    measure: Measure,
    node: &NodeState,
    demand: &Demand,
    scratch: &mut Vec<u16>,
    mut each: impl FnMut(u8, f64),
) {
    let cpu_after = node.cpu_free - demand.cpu_milli;
    let memory_after = node.memory_free - demand.memory_mib;
    scratch.clear();
    scratch.extend_from_slice(&node.gpu_free);
    match demand.gpu {
        GpuAsk::None => each(0, measure.of(mix, cpu_after, memory_after, scratch)),
        GpuAsk::Whole(n) => {
            let mut left = n;
            for f in scratch.iter_mut() {
                if left > 0 && *f == MILLI_PER_GPU {
                    *f = 0;
                    left -= 1;
                }
            }
            each(0, measure.of(mix, cpu_after, memory_after, scratch));
        }
        GpuAsk::Share(m) => {
            for (i, &free) in node.gpu_free.iter().enumerate() {
                if free < m || node.gpu_free[..i].contains(&free) {
                    continue;
                }
                scratch[i] = free - m;
                each(i as u8, measure.of(mix, cpu_after, memory_after, scratch));
                scratch[i] = free;
            }
        }
    }
}

/// The node and GPU with the best score among the nodes that fit; equal scores go to the
/// earliest node of `ties`. `score(before, after)` scores one outcome, higher is better; on
/// one node the first GPU with the top score wins. Offers are remembered per node version.
fn best_offer(
    state: &mut FragmentationState,
    cluster: &Cluster,
    demand: &Demand,
    score: impl Fn(f64, f64) -> f64,
) -> Option<Choice> {
    let FragmentationState { mix, measure, ties, memo, scratch } = state;
    let row = memo.row(cluster, demand);
    let base = row * memo.nodes;
    let mut best: Option<(f64, usize, u8)> = None;
    for (i, node) in cluster.nodes().iter().enumerate() {
        if !node.fits(demand) {
            continue;
        }
        let mut offer = memo.offers[base + i];
        if offer.version != cluster.version(i) {
            let before = memo.before(cluster, mix, *measure, i);
            offer = NO_OFFER;
            outcomes(mix, *measure, node, demand, scratch, |gpu, after| {
                let s = score(before, after);
                if s > offer.score {
                    offer = Offer { score: s, share_gpu: gpu, ..offer };
                }
            });
            offer.version = cluster.version(i);
            memo.offers[base + i] = offer;
        }
        let better = match best {
            None => true,
            Some((s, _, _)) if offer.score != s => offer.score > s,
            Some((_, j, _)) => ties.rank(i) < ties.rank(j),
        };
        if better {
            best = Some((offer.score, i, offer.share_gpu));
        }
    }
    let (_, node, gpu) = best?;
    Some(Choice { node, share_gpu: matches!(demand.gpu, GpuAsk::Share(_)).then_some(gpu) })
}

/// What the fragmentation-measuring policies keep.
#[derive(Debug, Clone)]
struct FragmentationState {
    mix: TaskMix,
    measure: Measure,
    ties: NodeOrder,
    memo: OfferMemo,
    scratch: Vec<u16>,
}

impl FragmentationState {
    fn new(mix: TaskMix, measure: Measure, ties: NodeOrder) -> FragmentationState {
        FragmentationState { mix, measure, ties, memo: OfferMemo::default(), scratch: Vec::new() }
    }
}

/// FGD as published (Weng et al., `FGDScore`): the node and GPU whose placement lowers the
/// mix's unusable GPU milli the most, scored `sigmoid(drop / 1000) * 100` truncated to a whole
/// number; on one node the first GPU with the top score wins, equal nodes go to the earliest
/// in `ties` (see [`NodeOrder`]). The published mix is the trace's typical tasks (95%
/// coverage, CPU-only tasks included).
#[derive(Debug, Clone)]
pub struct Fgd(FragmentationState);

impl Fgd {
    pub fn new(mix: TaskMix, ties: NodeOrder) -> Fgd {
        Fgd(FragmentationState::new(mix, Measure::Fgd, ties))
    }
}

impl Policy for Fgd {
    fn choose(&mut self, cluster: &Cluster, demand: &Demand) -> Option<Choice> {
        best_offer(&mut self.0, cluster, demand, |before, after| {
            ((1.0 / (1.0 + (-(before - after) / 1000.0).exp())) * 100.0) as i64 as f64
        })
    }
}

/// Berth's policy: FGD with the node's CPU and memory in the measure. A node's free GPU milli
/// is worth only what its free CPU and memory can feed: at the workload's appetite (see
/// [`Appetite`]) anything beyond is stranded however the next tasks are shaped, a loss FGD's
/// one-task-ahead measure does not see. The placement chosen is the one that adds the least
/// to FGD's unusable milli plus this unfed milli, compared exactly; equal outcomes go to the
/// earliest node of `ties`, and on one node to the lowest-indexed GPU.
#[derive(Debug, Clone)]
pub struct FragmentationAware(FragmentationState);

impl FragmentationAware {
    pub fn new(mix: TaskMix, ties: NodeOrder) -> FragmentationAware {
        FragmentationAware(FragmentationState::new(mix, Measure::FgdAndUnfed, ties))
    }
}

impl Policy for FragmentationAware {
    fn choose(&mut self, cluster: &Cluster, demand: &Demand) -> Option<Choice> {
        // Rounded to a millionth of a milli so float noise does not split true ties.
        best_offer(&mut self.0, cluster, demand, |before, after| ((before - after) * 1e6).round() / 1e6)
    }
}

// ---------------------------------------------------------------------------------------------
// The published experiment
// ---------------------------------------------------------------------------------------------

/// The published workload tuning, for one seed: every task of the trace once, shuffled,
/// then tasks drawn at random (with replacement, CPU-only ones included) appended until the
/// next draw would take the total GPU ask above `ratio` x `capacity_gpu_milli`. When the trace
/// alone asks more than that, random tasks are dropped instead until it no longer does.
/// Returns indexes into `demands`, in arrival order.
pub fn tuned_arrivals(demands: &[Demand], capacity_gpu_milli: u64, ratio: f64, seed: u64) -> Vec<usize> {
    let mut rng = SplitMix64::new(seed);
    let mut order: Vec<usize> = (0..demands.len()).collect();
    rng.shuffle(&mut order);
    let target = ratio * capacity_gpu_milli as f64;
    let ask = |i: usize| u64::from(demands[i].gpu.total_milli());
    let mut total: u64 = order.iter().map(|&i| ask(i)).sum();
    if demands.is_empty() {
        return order;
    }
    if total as f64 > target {
        while total as f64 > target && !order.is_empty() {
            let gone = order.remove(rng.below(order.len()));
            total -= ask(gone);
        }
        return order;
    }
    loop {
        let drawn = rng.below(demands.len());
        if (total + ask(drawn)) as f64 > target {
            return order;
        }
        total += ask(drawn);
        order.push(drawn);
    }
}

/// How a replay went, read as the published experiment reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayReport {
    pub placed: usize,
    pub skipped: usize,
    /// Allocated over total GPU milli just after the first arrival that brings the arrived
    /// tasks' GPU ask to 100% of capacity (`None` if it never does).
    pub allocation_at_full_arrival: Option<f64>,
    /// The published simulator's reading of "100% arrival": the mean allocation over every
    /// arrival whose arrived ask, in percent of capacity, rounds to 100 (99.5..=100.5).
    pub allocation_around_full_arrival: Option<f64>,
    /// Allocation after the last arrival.
    pub allocation_at_end: f64,
    /// Arrived GPU ask after the last arrival, over capacity.
    pub arrival_at_end: f64,
}

/// Places `arrivals` one at a time with `policy`, never removing any; a task that fits
/// nowhere is skipped. `record` hears every arrival's outcome in order. Stops with the error
/// if the policy ever chooses a node without room (a bug, never a skip).
pub fn replay<'a>(
    cluster: &mut Cluster,
    arrivals: impl IntoIterator<Item = &'a Demand>,
    policy: &mut dyn Policy,
    mut record: impl FnMut(&Demand, Option<&Placement>),
) -> Result<ReplayReport, PlaceError> {
    let capacity = cluster.total_gpu_milli();
    let mut arrived: u64 = 0;
    let (mut placed, mut skipped) = (0, 0);
    let mut at_full = None;
    let (mut window_sum, mut window_rows) = (0.0, 0usize);
    for demand in arrivals {
        arrived += u64::from(demand.gpu.total_milli());
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
        let rate = cluster.allocation_rate();
        if at_full.is_none() && arrived >= capacity {
            at_full = Some(rate);
        }
        if arrived * 1000 >= capacity * 995 && arrived * 1000 <= capacity * 1005 {
            window_sum += rate;
            window_rows += 1;
        }
    }
    Ok(ReplayReport {
        placed,
        skipped,
        allocation_at_full_arrival: at_full,
        allocation_around_full_arrival: (window_rows > 0).then(|| window_sum / window_rows as f64),
        allocation_at_end: cluster.allocation_rate(),
        arrival_at_end: if capacity == 0 { 0.0 } else { arrived as f64 / capacity as f64 },
    })
}

// ---------------------------------------------------------------------------------------------
// The same demand on an MIG-partitioned fleet
// ---------------------------------------------------------------------------------------------

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
    /// Per share profile: (lowest free start, the start `MigLayout::best_start` picks and the
    /// open options it leaves), `None` when the profile does not fit.
    first_start: [Option<u8>; 5],
    best_start: [Option<(u8, usize)>; 5],
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

    fn bit(&self, profile: MigProfile, start: u8) -> Option<u16> {
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
        let mut best_start = [None; 5];
        for (k, &p) in MIG_SHARE_PROFILES.iter().enumerate() {
            first_start[k] = layout.free_starts(p).first().copied();
            best_start[k] = layout.best_start(p).map(|s| {
                let mut after = layout.clone();
                after.instances.push(MigInstance { profile: p, start: s });
                (s, after.open_options())
            });
        }
        let usable = self.most_compute_addable(mask);
        let f = LayoutFacts {
            compute_used,
            first_start,
            best_start,
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

    /// `MigLayout::best_start` for `profile` on `gpu`, with the open options it leaves.
    pub fn best_start(&mut self, gpu: MigGpu, profile: MigProfile) -> Option<(u8, usize)> {
        let k = MIG_SHARE_PROFILES.iter().position(|&p| p == profile)?;
        if gpu.whole { None } else { self.facts(gpu.instances).best_start[k] }
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

/// Berth's MIG placement rule (as in [`crate::placement::place`]), with CPU and memory: an
/// instance goes to the GPU already most used, at the start (`MigLayout::best_start`) that
/// leaves the most options open; whole GPUs go to the node with the fewest empty GPUs that
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
                        let Some((start, open)) = facts.best_start(gpu, p) else { continue };
                        let key = (facts.compute_used(gpu), open);
                        if best.is_none_or(|(b, _)| key > b) {
                            best = Some((key, MigChoice { node: i, gpu: Some((g as u8, start)) }));
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn share(cpu: u32, milli: u16) -> Demand {
        Demand { cpu_milli: cpu, memory_mib: 0, gpu: GpuAsk::Share(milli) }
    }

    fn node(cpu: u32, gpus: u8) -> NodeShape {
        NodeShape { cpu_milli: cpu, memory_mib: 1024, gpus }
    }

    #[test]
    fn trace_rows_become_demands() {
        assert_eq!(Demand::from_trace(1, 2, 0, 0).map(|d| d.gpu), Ok(GpuAsk::None));
        assert_eq!(Demand::from_trace(1, 2, 1, 470).map(|d| d.gpu), Ok(GpuAsk::Share(470)));
        assert_eq!(Demand::from_trace(1, 2, 1, 1000).map(|d| d.gpu), Ok(GpuAsk::Whole(1)));
        assert_eq!(Demand::from_trace(1, 2, 8, 1000).map(|d| d.gpu), Ok(GpuAsk::Whole(8)));
        assert_eq!(Demand::from_trace(1, 2, 2, 500), Err(DemandError::SeveralShares { count: 2, milli: 500 }));
        assert_eq!(Demand::from_trace(1, 2, 1, 1200), Err(DemandError::MoreThanAGpu(1200)));
    }

    #[test]
    fn shares_stack_on_one_gpu_up_to_a_whole_one() {
        let mut cluster = Cluster::new([node(64_000, 1)]);
        let mut policy = FirstFit;
        for _ in 0..3 {
            cluster.place(&share(1000, 330), &mut policy).expect("room for 330");
        }
        assert_eq!(cluster.nodes()[0].gpu_free(), &[10]);
        assert_eq!(cluster.place(&share(1000, 11), &mut policy), Err(PlaceError::NoNodeFits));
        assert_eq!(cluster.allocated_gpu_milli(), 990);
    }

    #[test]
    fn whole_gpus_need_entirely_free_gpus_on_one_node() {
        let mut cluster = Cluster::new([node(64_000, 2), node(64_000, 2)]);
        let mut policy = FirstFit;
        cluster.place(&share(0, 100), &mut policy).expect("share fits");
        let two = Demand { cpu_milli: 0, memory_mib: 0, gpu: GpuAsk::Whole(2) };
        assert_eq!(cluster.place(&two, &mut policy).map(|p| p.node), Ok(1));
        assert_eq!(cluster.place(&two, &mut policy), Err(PlaceError::NoNodeFits));
        let one = Demand { gpu: GpuAsk::Whole(1), ..two };
        assert_eq!(cluster.place(&one, &mut policy).map(|p| (p.node, p.gpus)), Ok((0, vec![1])));
    }

    #[test]
    fn cpu_and_memory_bound_a_node_too() {
        let mut cluster = Cluster::new([NodeShape { cpu_milli: 4000, memory_mib: 100, gpus: 1 }]);
        let mut policy = FirstFit;
        let big_memory = Demand { cpu_milli: 1, memory_mib: 101, gpu: GpuAsk::None };
        assert_eq!(cluster.place(&big_memory, &mut policy), Err(PlaceError::NoNodeFits));
        cluster.place(&share(4000, 100), &mut policy).expect("fits");
        assert_eq!(cluster.place(&share(1, 100), &mut policy), Err(PlaceError::NoNodeFits));
    }

    #[test]
    fn a_misfit_choice_changes_nothing() {
        let mut cluster = Cluster::new([node(1000, 1)]);
        let before = cluster.nodes().to_vec();
        assert_eq!(cluster.take(&share(2000, 10), Choice { node: 0, share_gpu: Some(0) }), Err(PlaceError::Misfit));
        assert_eq!(cluster.take(&share(10, 10), Choice { node: 0, share_gpu: Some(3) }), Err(PlaceError::Misfit));
        assert_eq!(cluster.take(&share(10, 10), Choice { node: 5, share_gpu: Some(0) }), Err(PlaceError::Misfit));
        assert_eq!(cluster.nodes(), before.as_slice());
    }

    #[test]
    fn best_fit_takes_the_fullest_node_and_the_tightest_gpu() {
        let mut cluster = Cluster::new([node(64_000, 2), node(64_000, 2)]);
        let mut policy = BestFit::new(NodeOrder::fleet(2));
        cluster.take(&share(0, 600), Choice { node: 1, share_gpu: Some(1) }).expect("fits");
        cluster.take(&share(0, 300), Choice { node: 1, share_gpu: Some(0) }).expect("fits");
        // Node 1 has 700 + 400 free: a 350 goes there, on GPU 1 (400 free, tighter than 700).
        let p = cluster.place(&share(0, 350), &mut policy).expect("fits");
        assert_eq!((p.node, p.gpus), (1, vec![1]));
    }

    #[test]
    fn best_fit_scores_as_the_published_simulator() {
        let cluster = Cluster::new([NodeShape { cpu_milli: 128_000, memory_mib: 1, gpus: 8 }]);
        let n = &cluster.nodes()[0];
        // Left after: 96000 CPU (0.375) and 7000 milli (0.4375): (1 - 0.8125) * 100 = 18.75 -> 18.
        assert_eq!(
            BestFit::score(&cluster, n, &Demand { cpu_milli: 32_000, memory_mib: 0, gpu: GpuAsk::Whole(1) }),
            18
        );
    }

    #[test]
    fn unusable_milli_counts_gpus_too_small_for_the_mix() {
        // Half the tasks want 500 milli, half a whole GPU, all with 1 CPU.
        let mix = TaskMix::from_counts([(1000, GpuAsk::Share(500), 1.0), (1000, GpuAsk::Whole(1), 1.0)]);
        // GPUs 1000 and 300 free: the 500 can use it all but the 300; the whole GPU the 1000.
        assert!((mix.unusable_gpu_milli(8000, &[1000, 300]) - (0.5 * 300.0 + 0.5 * 300.0)).abs() < 1e-9);
        // No CPU: nothing can be used.
        assert!((mix.unusable_gpu_milli(0, &[1000, 300]) - 1300.0).abs() < 1e-9);
        assert_eq!(mix.unusable_gpu_milli(8000, &[0, 0]), 0.0);
    }

    #[test]
    fn unfed_milli_is_what_free_cpu_and_memory_cannot_feed() {
        let demands = [Demand { cpu_milli: 10_000, memory_mib: 40_000, gpu: GpuAsk::Whole(1) }];
        let mix = TaskMix::typical(&demands, 1.0);
        assert_eq!(mix.appetite(), Appetite { cpu_milli_per_gpu_milli: 10.0, memory_mib_per_gpu_milli: 40.0 });
        // 30 cores feed 3 GPUs of the 8 free: 5000 milli unfed.
        assert!((mix.unfed_gpu_milli(30_000, 1_000_000, 8000) - 5000.0).abs() < 1e-9);
        // Memory for 2 GPUs binds first.
        assert!((mix.unfed_gpu_milli(30_000, 80_000, 8000) - 6000.0).abs() < 1e-9);
        assert_eq!(mix.unfed_gpu_milli(200_000, 1_000_000, 8000), 0.0);
    }

    #[test]
    fn berth_keeps_cpu_where_gpus_need_it() {
        // Whole-GPU tasks need 12 cores each. Node 0: 8 GPUs, 96 cores (just enough);
        // node 1: 2 GPUs, 104 cores. A CPU-only task of 30 cores belongs on node 1.
        let gpu_task = Demand { cpu_milli: 12_000, memory_mib: 0, gpu: GpuAsk::Whole(1) };
        let cpu_task = Demand { cpu_milli: 30_000, memory_mib: 0, gpu: GpuAsk::None };
        let mut demands = vec![gpu_task; 9];
        demands.push(cpu_task);
        let mix = TaskMix::typical(&demands, 1.0);
        let shapes = [node(96_000, 8), node(104_000, 2)];
        let mut cluster = Cluster::new(shapes);
        let mut policy = FragmentationAware::new(mix, NodeOrder::fleet(2));
        assert_eq!(cluster.place(&cpu_task, &mut policy).map(|p| p.node), Ok(1));
    }

    #[test]
    fn shuffled_node_order_is_a_permutation() {
        let order = NodeOrder::shuffled(50, 7);
        let mut ranks: Vec<u64> = (0..50).map(|i| order.rank(i)).collect();
        assert_ne!(ranks, (0..50).collect::<Vec<u64>>());
        ranks.sort_unstable();
        assert_eq!(ranks, (0..50).collect::<Vec<u64>>());
        assert_eq!(order, NodeOrder::shuffled(50, 7));
        assert!(order.rank(50) > order.rank(49), "nodes beyond the order come after it");
    }

    #[test]
    fn typical_mix_keeps_the_common_kinds() {
        let mut demands = vec![share(1000, 500); 90];
        demands.extend(vec![share(1000, 250); 9]);
        demands.push(share(7, 7));
        let mix = TaskMix::typical(&demands, 0.95);
        assert_eq!(mix.groups.len(), 2);
        let weight: f64 = mix.groups.iter().flat_map(|g| g.kinds.iter().map(|k| k.1)).sum();
        assert!((weight - 1.0).abs() < 1e-9);
    }

    #[test]
    fn fragmentation_aware_keeps_a_gpu_whole_when_a_share_fits_elsewhere() {
        // Shares of 500 and whole GPUs come; a GPU already at 500 free should take a 500.
        let mix = TaskMix::from_counts([(0, GpuAsk::Share(500), 1.0), (0, GpuAsk::Whole(1), 1.0)]);
        let mut cluster = Cluster::new([node(64_000, 1), node(64_000, 1)]);
        cluster.take(&share(0, 500), Choice { node: 1, share_gpu: Some(0) }).expect("fits");
        let p = cluster
            .place(&share(0, 500), &mut FragmentationAware::new(mix.clone(), NodeOrder::fleet(2)))
            .expect("fits");
        assert_eq!(p.node, 1);
        let p = cluster.place(&share(0, 500), &mut Fgd::new(mix, NodeOrder::fleet(2))).expect("fits");
        assert_eq!(p.node, 0);
    }

    #[test]
    fn policies_remember_offers_only_until_a_node_changes() {
        let mix = TaskMix::from_counts([(0, GpuAsk::Share(300), 1.0)]);
        let mut cluster = Cluster::new([node(64_000, 1), node(64_000, 1)]);
        let mut policy = FragmentationAware::new(mix, NodeOrder::fleet(2));
        let first = cluster.place(&share(0, 300), &mut policy).expect("fits").node;
        // The same kind again must see the change and pack onto the same GPU (700 free).
        assert_eq!(cluster.place(&share(0, 300), &mut policy).map(|p| p.node), Ok(first));
        // A third there would strand 100 milli no 300 can use: it goes to the other node.
        assert_eq!(cluster.place(&share(0, 300), &mut policy).map(|p| p.node), Ok(1 - first));
    }

    #[test]
    fn tuning_reaches_the_ratio_and_no_further() {
        let demands: Vec<Demand> = (0..50)
            .map(|i| Demand {
                cpu_milli: 1,
                memory_mib: 1,
                gpu: if i % 5 == 0 { GpuAsk::None } else { GpuAsk::Share(100 + i) },
            })
            .collect();
        let capacity = 4000;
        let order = tuned_arrivals(&demands, capacity, 1.3, 42);
        let total: u64 = order.iter().map(|&i| u64::from(demands[i].gpu.total_milli())).sum();
        assert!(total as f64 <= 1.3 * capacity as f64);
        assert!(total as f64 > 1.3 * capacity as f64 - 150.0);
        // Every task of the trace comes once, first, in some order.
        let mut head = order[..50].to_vec();
        head.sort_unstable();
        assert_eq!(head, (0..50).collect::<Vec<_>>());
        assert_eq!(order, tuned_arrivals(&demands, capacity, 1.3, 42));
        assert_ne!(order, tuned_arrivals(&demands, capacity, 1.3, 43));
        // More than the ratio already: tasks are dropped.
        assert!(tuned_arrivals(&demands, 1000, 1.3, 42).len() < 50);
    }

    #[test]
    fn replay_reads_allocation_at_full_arrival() {
        let mut cluster = Cluster::new([node(64_000, 1)]);
        let arrivals = [share(0, 600), share(0, 600), share(0, 300)];
        let mut seen = Vec::new();
        let report = replay(&mut cluster, &arrivals, &mut FirstFit, |_, p| seen.push(p.map(|p| p.node)))
            .expect("first-fit never misfits");
        assert_eq!(seen, vec![Some(0), None, Some(0)]);
        assert_eq!((report.placed, report.skipped), (2, 1));
        assert_eq!(report.allocation_at_full_arrival, Some(0.6));
        assert_eq!(report.allocation_around_full_arrival, None);
        assert!((report.allocation_at_end - 0.9).abs() < 1e-12);
    }

    #[test]
    fn shares_round_up_to_the_smallest_mig_profile() {
        assert_eq!(smallest_profile_for(142), MigProfile::G1);
        assert_eq!(smallest_profile_for(143), MigProfile::G2);
        assert_eq!(smallest_profile_for(320), MigProfile::G3);
        assert_eq!(smallest_profile_for(470), MigProfile::G4);
        assert_eq!(smallest_profile_for(571), MigProfile::G4);
        assert_eq!(smallest_profile_for(650), MigProfile::G7);
        assert_eq!(smallest_profile_for(810), MigProfile::G7);
    }

    #[test]
    fn two_3g_strand_a_compute_slice() {
        let mut facts = MigFacts::new();
        let g3 = |s| facts_bit(MigProfile::G3, s);
        let gpu = MigGpu { whole: false, instances: g3(0) | g3(4) };
        assert_eq!(facts.compute_used(gpu), 6);
        assert_eq!(facts.stranded(gpu), 1);
        let gpu = MigGpu { whole: false, instances: facts_bit(MigProfile::G4, 0) | facts_bit(MigProfile::G2, 4) };
        assert_eq!(facts.stranded(gpu), 0, "a 1g still fits at 6");
        assert_eq!(facts.stranded(MigGpu::default()), 0);
    }

    fn facts_bit(profile: MigProfile, start: u8) -> u16 {
        MigFacts::new().bit(profile, start).expect("a share profile at an allowed start")
    }

    #[test]
    fn mig_packing_fills_used_gpus_first() {
        let shape = node(64_000, 2);
        let mut cluster = MigCluster::new([shape, shape]);
        let one = MigDemand { cpu_milli: 0, memory_mib: 0, ask: MigAsk::Instance(MigProfile::G1) };
        let first = cluster.place(&one, &mut MigPacking).expect("fits");
        let second = cluster.place(&one, &mut MigPacking).expect("fits");
        assert_eq!((first.node, &first.gpus), (second.node, &second.gpus));
        let whole = MigDemand { ask: MigAsk::Whole(1), ..one };
        // Node 0 has one empty GPU left, node 1 two: whole GPUs go to the fuller node.
        assert_eq!(cluster.place(&whole, &mut MigPacking).map(|p| p.node), Ok(0));
    }

    fn arb_demand() -> impl Strategy<Value = Demand> {
        (0u32..40_000, 0u32..2048, 0u8..4, 1u16..1000).prop_map(|(cpu, mem, kind, milli)| Demand {
            cpu_milli: cpu,
            memory_mib: mem,
            gpu: match kind {
                0 => GpuAsk::None,
                1 | 2 => GpuAsk::Share(milli),
                _ => GpuAsk::Whole(1 + (milli % 4) as u8),
            },
        })
    }

    fn arb_shapes() -> impl Strategy<Value = Vec<NodeShape>> {
        proptest::collection::vec(
            (1u32..128_000, 1u32..4096, 0u8..9).prop_map(|(c, m, g)| NodeShape {
                cpu_milli: c,
                memory_mib: m,
                gpus: g,
            }),
            1..8,
        )
    }

    fn check_nodes(cluster: &Cluster) -> Result<(), TestCaseError> {
        let mut allocated = 0u64;
        for n in cluster.nodes() {
            prop_assert!(n.cpu_free() <= n.shape().cpu_milli);
            prop_assert!(n.memory_free() <= n.shape().memory_mib);
            prop_assert_eq!(n.gpu_free().len(), usize::from(n.shape().gpus));
            for &f in n.gpu_free() {
                prop_assert!(f <= MILLI_PER_GPU);
                allocated += u64::from(MILLI_PER_GPU - f);
            }
        }
        prop_assert_eq!(allocated, cluster.allocated_gpu_milli());
        Ok(())
    }

    proptest! {
        /// Whatever arrives, no policy ever takes more than 1000 milli of a GPU or more than
        /// a node's CPU or memory, and a task is refused only when no node could take it.
        #[test]
        fn no_policy_overfills_or_refuses_what_fits(
            shapes in arb_shapes(),
            demands in proptest::collection::vec(arb_demand(), 1..60),
            seed in 0u64..1000,
        ) {
            let mix = TaskMix::typical(&demands, 0.95);
            let policies: Vec<Box<dyn Policy>> = vec![
                Box::new(FirstFit),
                Box::new(BestFit::new(NodeOrder::shuffled(shapes.len(), seed))),
                Box::new(Fgd::new(mix.clone(), NodeOrder::shuffled(shapes.len(), seed))),
                Box::new(FragmentationAware::new(mix, NodeOrder::fleet(shapes.len()))),
            ];
            for mut policy in policies {
                let mut cluster = Cluster::new(shapes.clone());
                for d in &demands {
                    let could = cluster.any_fits(d);
                    match cluster.place(d, policy.as_mut()) {
                        Ok(p) => {
                            prop_assert!(could);
                            prop_assert_eq!(p.gpus.len(), usize::from(d.gpu.gpu_count()));
                        }
                        Err(e) => {
                            prop_assert_eq!(e, PlaceError::NoNodeFits);
                            prop_assert!(!could);
                        }
                    }
                    check_nodes(&cluster)?;
                }
            }
        }

        /// On an MIG fleet every GPU's layout stays valid, CPU and memory are never
        /// overdrawn, and a task is refused only when no node could take it.
        #[test]
        fn mig_policies_keep_layouts_valid(
            shapes in arb_shapes(),
            demands in proptest::collection::vec(arb_demand(), 1..60),
        ) {
            let policies: Vec<Box<dyn MigPolicy>> = vec![Box::new(MigFirstFit), Box::new(MigPacking)];
            for mut policy in policies {
                let mut cluster = MigCluster::new(shapes.clone());
                for d in demands.iter().map(MigDemand::from_demand) {
                    let could = cluster.any_fits(&d);
                    match cluster.place(&d, policy.as_mut()) {
                        Ok(_) => prop_assert!(could),
                        Err(e) => {
                            prop_assert_eq!(e, PlaceError::NoNodeFits);
                            prop_assert!(!could);
                        }
                    }
                    for (n, shape) in cluster.nodes().iter().zip(&shapes) {
                        prop_assert!(n.cpu_free <= shape.cpu_milli && n.memory_free <= shape.memory_mib);
                        for &g in &n.gpus {
                            prop_assert!(!(g.whole && g.instances != 0));
                            prop_assert_eq!(cluster.layout(g).validate(), Ok(()));
                        }
                    }
                    let usage = cluster.usage();
                    prop_assert!(usage.allocated + usage.stranded <= usage.total);
                }
            }
        }
    }
}
