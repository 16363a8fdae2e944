//! The GPU-sharing replay: a production trace's tasks (a share of one GPU, whole GPUs or no
//! GPU at all) placed on nodes with CPU, memory and GPUs, and the same demand on an
//! MIG-partitioned fleet, under the policies the replay compares
//! (`domain/benches/openb_replay.rs`).
//!
//! **Not the rule that places bookings.** Bookings are placed by [`crate::placement`] and
//! [`crate::booking::Timeline`]; nothing in the portal calls this module. Its policies are
//! candidates measured on the trace: [`FragmentationAware`] is the one proposed for Berth,
//! and [`mig::MigPacking`] re-implements placement's MIG rule over the trace's model (CPU,
//! memory, shares), so the two can drift apart.
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
//!   (FGD with CPU and memory in the measure, proposed for Berth);
//! - [`tuned_arrivals`] and [`replay`]: the published experiment (workload tuned to a ratio of
//!   capacity, placed one task at a time, nothing leaves, a task that fits nowhere is skipped);
//! - the MIG counterpart in [`mig`]: `MigAsk` (a share rounded up to the smallest MIG
//!   profile that holds it), `MigCluster`, `MigFirstFit` and `MigPacking` (placement's MIG
//!   rule over this model), with the geometry itself left to [`crate::mig`].
//!
//! Pure and deterministic: randomness (workload sampling, tie-breaking) comes from a seeded
//! [`SplitMix64`], so a seed gives the same placements on every machine.

use std::collections::HashMap;

use thiserror::Error;

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

pub mod mig;
#[cfg(test)]
mod tests;
