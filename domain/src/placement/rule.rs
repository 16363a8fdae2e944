//! The placement rule: where a demand for CPU, memory and GPUs goes among nodes, measured by
//! the fragmentation it leaves behind.
//!
//! This is the rule bookings are placed by ([`super::place`] turns a booking's
//! [`super::Shape`] into a [`Demand`] on a [`Cluster`] of the GPUs free for its window and
//! asks [`Rule::choose`]), and the rule the openb replay measures ([`crate::replay`] turns
//! trace tasks into the same [`Demand`] and asks the same [`Rule`]). One implementation, so
//! the replay's figures are figures about the product.
//!
//! The model, shared with the FGD paper's simulator (Weng et al., "Beware of Fragmentation",
//! USENIX ATC'23):
//! - a GPU is 1000 milli; a demand asks for CPU milli, memory MiB and a [`GpuAsk`]: nothing,
//!   a share (1..=999 milli) of one GPU, or whole GPUs, all on one node, on a node of one of
//!   the GPU models it allows;
//! - a demand fits a node when the node has its CPU and memory free and, for a share, one GPU
//!   with that many milli free, or, for whole GPUs, that many entirely free GPUs.
//!
//! The measure: a node's free GPU milli is worth what the next tasks could use. A [`TaskMix`]
//! says what tasks to expect; a free GPU too small for a kind, or on a node without the CPU,
//! memory or model for it, is unusable by it (FGD's measure); a GPU partly taken that a share
//! fits is worth what the mix is expected to leave of it once full (FGD counts it usable
//! outright); and free milli that the node's free CPU and memory cannot feed at the mix's
//! appetite is unusable by any of them. For a share, whether the mix comes to fill a gap at
//! all depends on how many other gaps compete for the shares still to come, among the models
//! no kind of the mix tells apart (the `gaps` module). The rule takes the placement that adds
//! the least unusable milli.

use std::collections::HashMap;

use thiserror::Error;

mod gaps;
mod memo;
use gaps::Gaps;
use memo::{NO_OFFER, Offer, OfferMemo, ShareWay};

/// Milli in one GPU.
pub const MILLI_PER_GPU: u16 = 1000;

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
    /// The GPU models it may land on (any, for a CPU-only demand, is what it should say).
    pub models: Models,
}

/// A set of GPU models, by number (0..32): each fleet numbers its own models (the product by
/// [`crate::gpu::GpuModel`], the replay by the trace's model names in order of appearance).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Models(u32);

impl Models {
    /// Every model: the request names none.
    pub const ANY: Models = Models(u32::MAX);

    /// The set of `models`; numbers of 32 and above are never allowed.
    pub fn of(models: impl IntoIterator<Item = u8>) -> Models {
        Models(models.into_iter().filter(|&m| m < 32).fold(0, |set, m| set | 1 << m))
    }

    pub fn allows(self, model: u8) -> bool {
        model < 32 && self.0 & 1 << model != 0
    }
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
        Ok(Demand { cpu_milli, memory_mib, gpu, models: Models::ANY })
    }

    /// A demand on any model.
    pub fn new(cpu_milli: u32, memory_mib: u32, gpu: GpuAsk) -> Demand {
        Demand { cpu_milli, memory_mib, gpu, models: Models::ANY }
    }

    /// The same demand, allowed only on `models`.
    pub fn on(self, models: Models) -> Demand {
        Demand { models, ..self }
    }
}

/// A node as built: CPU milli, memory MiB, how many GPUs of 1000 milli and their model
/// (every GPU of a node is of one model).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodeShape {
    pub cpu_milli: u32,
    pub memory_mib: u32,
    pub gpus: u8,
    pub model: u8,
}

impl NodeShape {
    /// A node of model 0, for fleets of one model.
    pub fn new(cpu_milli: u32, memory_mib: u32, gpus: u8) -> NodeShape {
        NodeShape { cpu_milli, memory_mib, gpus, model: 0 }
    }
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

    /// A node of `shape` with only `cpu_free`, `memory_free` and `gpu_free` (milli per GPU)
    /// left; `None` when that is more than the shape has.
    pub fn with_free(shape: NodeShape, cpu_free: u32, memory_free: u32, gpu_free: Vec<u16>) -> Option<NodeState> {
        if cpu_free > shape.cpu_milli
            || memory_free > shape.memory_mib
            || gpu_free.len() != usize::from(shape.gpus)
            || gpu_free.iter().any(|&f| f > MILLI_PER_GPU)
        {
            return None;
        }
        let mut node = NodeState { cpu_free, memory_free, gpu_free, ..NodeState::new(shape) };
        node.recount();
        Some(node)
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
        (demand.gpu == GpuAsk::None || demand.models.allows(self.shape.model))
            && self.cpu_free >= demand.cpu_milli
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
        if !self.fits(demand) {
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
        Cluster::of(shapes.into_iter().map(NodeState::new).collect())
    }

    /// A cluster of nodes in the state they are in.
    pub fn of(nodes: Vec<NodeState>) -> Cluster {
        let total_gpu_milli: u64 = nodes.iter().map(|n| u64::from(n.shape.gpus) * u64::from(MILLI_PER_GPU)).sum();
        Cluster {
            versions: vec![0; nodes.len()],
            total_gpu_milli,
            allocated_gpu_milli: total_gpu_milli - nodes.iter().map(|n| u64::from(n.gpu_free_total)).sum::<u64>(),
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

    /// Ties go to the node whose position in `order` (a permutation of node indexes) comes first.
    pub fn from_order(order: &[u32]) -> NodeOrder {
        let mut rank = vec![0; order.len()];
        for (position, &node) in order.iter().enumerate() {
            if let Some(r) = rank.get_mut(node as usize) {
                *r = position as u32;
            }
        }
        NodeOrder(rank)
    }

    /// The rank of `node`; nodes beyond the order rank after every ranked one, by index.
    pub fn rank(&self, node: usize) -> u64 {
        self.0.get(node).map_or(u64::from(u32::MAX) + node as u64, |&r| u64::from(r))
    }
}

/// The kinds of task a fleet expects, weighted by how often they come: what fragmentation is
/// measured against.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskMix {
    /// Kinds grouped by GPU ask, so that each group scans the GPUs once.
    groups: Vec<MixGroup>,
    appetite: Appetite,
    /// [`TaskMix::sliver_waste`] of each free amount 0..1000, worked out once per mix.
    sliver_waste: Vec<f64>,
}

#[derive(Debug, Clone, PartialEq)]
struct MixGroup {
    gpu: GpuAsk,
    /// CPU ascending.
    kinds: Vec<MixKind>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct MixKind {
    cpu_milli: u32,
    models: Models,
    weight: f64,
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
    /// The most common kinds of task (CPU milli, GPU ask and the models allowed; memory is
    /// not part of a kind) that together make up at least `coverage` of `demands`, weighted
    /// by count and renormalised to sum to 1. Kinds are ranked by count, ties by (CPU, milli
    /// per GPU, GPU count) descending, as the published simulator ranks its "typical pods",
    /// then by models. The appetite is that of all of `demands`.
    pub fn typical(demands: &[Demand], coverage: f64) -> TaskMix {
        type Kind = (u32, GpuAsk, Models);
        let mut counts: HashMap<Kind, usize> = HashMap::new();
        for d in demands {
            *counts.entry((d.cpu_milli, d.gpu, d.models)).or_default() += 1;
        }
        let mut ranked: Vec<(Kind, usize)> = counts.into_iter().collect();
        ranked.sort_by(|a, b| {
            let key = |((cpu, gpu, models), count): &(Kind, usize)| {
                (*count, *cpu, gpu.milli_per_gpu(), gpu.gpu_count(), *models)
            };
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
        let kinds = taken.into_iter().map(|((cpu, gpu, models), count)| (cpu, gpu, models, count as f64));
        TaskMix { appetite: Appetite::of(demands), ..TaskMix::of_kinds(kinds) }
    }

    /// A mix from explicit (CPU milli, GPU ask, weight) kinds on any model; weights are
    /// renormalised. The appetite is the kinds' CPU per GPU milli, with no memory bound.
    pub fn from_counts(kinds: impl IntoIterator<Item = (u32, GpuAsk, f64)>) -> TaskMix {
        TaskMix::of_kinds(kinds.into_iter().map(|(cpu, gpu, weight)| (cpu, gpu, Models::ANY, weight)))
    }

    /// A mix from explicit (CPU milli, GPU ask, models allowed, weight) kinds; as
    /// [`TaskMix::from_counts`].
    pub fn of_kinds(kinds: impl IntoIterator<Item = (u32, GpuAsk, Models, f64)>) -> TaskMix {
        let kinds: Vec<(u32, GpuAsk, Models, f64)> = kinds.into_iter().filter(|k| k.3 > 0.0).collect();
        let total: f64 = kinds.iter().map(|k| k.3).sum();
        let (mut cpu, mut milli) = (0.0, 0.0);
        let mut groups: Vec<MixGroup> = Vec::new();
        for (kind_cpu, gpu, models, weight) in kinds {
            let weight = weight / total;
            if gpu != GpuAsk::None {
                cpu += weight * f64::from(kind_cpu);
                milli += weight * f64::from(gpu.total_milli());
            }
            let kind = MixKind { cpu_milli: kind_cpu, models, weight };
            match groups.iter_mut().find(|g| g.gpu == gpu) {
                Some(g) => g.kinds.push(kind),
                None => groups.push(MixGroup { gpu, kinds: vec![kind] }),
            }
        }
        for g in &mut groups {
            g.kinds.sort_by_key(|k| (k.cpu_milli, k.models));
        }
        groups.sort_by_key(|g| g.gpu);
        let cpu_milli_per_gpu_milli = if milli > 0.0 { cpu / milli } else { 0.0 };
        let sliver_waste = sliver_waste(&groups);
        TaskMix { groups, appetite: Appetite { cpu_milli_per_gpu_milli, memory_mib_per_gpu_milli: 0.0 }, sliver_waste }
    }

    pub fn appetite(&self) -> Appetite {
        self.appetite
    }

    /// The kinds, as (GPU ask, CPU milli, models, weight), by GPU ask then CPU.
    pub fn kinds(&self) -> impl Iterator<Item = (GpuAsk, u32, Models, f64)> + '_ {
        self.groups.iter().flat_map(|g| g.kinds.iter().map(|k| (g.gpu, k.cpu_milli, k.models, k.weight)))
    }

    /// Expected GPU milli on a node of `model`, with `cpu_free` CPU and GPUs `gpu_free`, that
    /// a task drawn from the mix could not use: all of it when the task does not fit the node
    /// (or takes no GPU), otherwise the free milli of the GPUs too small for it; tasks that may
    /// not land on `model` count nothing. This is the fragmentation measure of the FGD paper,
    /// but for the models: the published one counts a node of a model the task does not allow
    /// as wholly unusable to it.
    pub fn unusable_gpu_milli(&self, model: u8, cpu_free: u32, gpu_free: &[u16]) -> f64 {
        self.unusable(model, cpu_free, gpu_free, Reading::OneTask)
    }

    /// Expected GPU milli of the node that the tasks to come never use, following each GPU
    /// until it is full: [`TaskMix::unusable_gpu_milli`], except that a GPU partly taken that
    /// a share fits is not counted usable outright but by the sliver the share leaves,
    /// [`TaskMix::sliver_waste`] of it. FGD's measure sees a GPU with 530 milli free as usable
    /// by a 470 or a 320 share alike; this one sees that the 470 leaves 60 and the 320 leaves
    /// 210, and which of those the mix goes on to fill. A fully free GPU stays usable outright
    /// (whole-GPU tasks take it whole). On a node whose CPU fits every kind, each partly taken
    /// GPU with `f` free counts exactly `sliver_waste(f)`.
    pub fn unused_gpu_milli(&self, model: u8, cpu_free: u32, gpu_free: &[u16]) -> f64 {
        self.unusable(model, cpu_free, gpu_free, Reading::UntilFull)
    }

    /// Expected milli, of a GPU with `free_milli` free (below 1000), that the mix never uses
    /// when each next task is drawn from it: a task that cannot take the GPU (it takes whole
    /// GPUs, or none, or a larger share) finds `free_milli` unusable, FGD's one-task measure;
    /// a share of `m` that fits leaves `free_milli - m`, worth this again. So
    /// `waste(f) = (1 - P(f)) * f + sum over shares m <= f of weight(m) * waste(f - m)`, with
    /// `P(f)` the weight of the shares that fit. CPU, memory and models are left out: the node
    /// measure checks them for the first task. The weights are the mix's own, nothing tuned.
    pub fn sliver_waste(&self, free_milli: u16) -> f64 {
        self.sliver_waste.get(usize::from(free_milli)).copied().unwrap_or(0.0)
    }

    /// The measure of [`TaskMix::unusable_gpu_milli`] (or of [`TaskMix::unused_gpu_milli`]),
    /// read as `reading` says.
    fn unusable(&self, model: u8, cpu_free: u32, gpu_free: &[u16], reading: Reading) -> f64 {
        let published = reading == Reading::Published;
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
            // Followed until full: what the share would leave on each partly taken GPU it fits.
            let mut slivers = 0.0;
            if let (Reading::UntilFull, GpuAsk::Share(m)) = (reading, group.gpu) {
                for &f in gpu_free.iter().filter(|&&f| f >= m && f < MILLI_PER_GPU) {
                    slivers += self.sliver_waste(f - m);
                }
            }
            // A kind that may not land on this model asks nothing of the node: its free milli
            // is no loss to it (counting it as unusable, as the published simulator does,
            // steers other tasks away from the models constrained tasks need).
            for kind in group.kinds.iter().filter(|k| published || k.models.allows(model)) {
                let fits = gpu_fits && kind.cpu_milli <= cpu_free && kind.models.allows(model);
                out += kind.weight * if fits { f64::from(too_small) + slivers } else { f64::from(total) };
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

/// How [`TaskMix::unusable`] reads a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    /// FGD as published: a kind not allowed on the node's model finds it wholly unusable.
    Published,
    /// FGD's, one task ahead ([`TaskMix::unusable_gpu_milli`]).
    OneTask,
    /// Each GPU followed until full ([`TaskMix::unused_gpu_milli`]).
    UntilFull,
}

/// [`TaskMix::sliver_waste`] for every free amount below a whole GPU, smallest first (each
/// amount only needs the smaller ones): 1000 entries times the mix's share sizes, once per mix.
fn sliver_waste(groups: &[MixGroup]) -> Vec<f64> {
    let shares: Vec<(u16, f64)> = groups
        .iter()
        .filter_map(|g| match g.gpu {
            GpuAsk::Share(m) => Some((m, g.kinds.iter().map(|k| k.weight).sum())),
            _ => None,
        })
        .collect();
    let mut waste: Vec<f64> = Vec::with_capacity(usize::from(MILLI_PER_GPU));
    for free in 0..MILLI_PER_GPU {
        let (mut fit, mut after) = (0.0, 0.0);
        for &(m, weight) in shares.iter().filter(|&&(m, _)| 0 < m && m <= free) {
            fit += weight;
            after += weight * waste[usize::from(free - m)];
        }
        waste.push((1.0 - fit) * f64::from(free) + after);
    }
    waste
}

/// How a rule measures what a node's free GPUs are worth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Measure {
    /// FGD's: [`TaskMix::unusable_gpu_milli`].
    Fgd,
    /// Berth's: [`TaskMix::unused_gpu_milli`] (FGD's, each GPU followed until full) plus
    /// [`TaskMix::unfed_gpu_milli`].
    UntilFullAndUnfed,
}

impl Measure {
    fn of(self, mix: &TaskMix, model: u8, cpu_free: u32, memory_free: u32, gpu_free: &[u16]) -> f64 {
        match self {
            Measure::Fgd => mix.unusable(model, cpu_free, gpu_free, Reading::Published),
            Measure::UntilFullAndUnfed => {
                let unusable = mix.unused_gpu_milli(model, cpu_free, gpu_free);
                let total: u32 = gpu_free.iter().map(|&f| u32::from(f)).sum();
                unusable + mix.unfed_gpu_milli(cpu_free, memory_free, total)
            }
        }
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
    let model = node.shape.model;
    let cpu_after = node.cpu_free - demand.cpu_milli;
    let memory_after = node.memory_free - demand.memory_mib;
    scratch.clear();
    scratch.extend_from_slice(&node.gpu_free);
    match demand.gpu {
        GpuAsk::None => each(0, measure.of(mix, model, cpu_after, memory_after, scratch)),
        GpuAsk::Whole(n) => {
            let mut left = n;
            for f in scratch.iter_mut() {
                if left > 0 && *f == MILLI_PER_GPU {
                    *f = 0;
                    left -= 1;
                }
            }
            each(0, measure.of(mix, model, cpu_after, memory_after, scratch));
        }
        GpuAsk::Share(m) => {
            for (i, &free) in node.gpu_free.iter().enumerate() {
                if free < m || node.gpu_free[..i].contains(&free) {
                    continue;
                }
                scratch[i] = free - m;
                each(i as u8, measure.of(mix, model, cpu_after, memory_after, scratch));
                scratch[i] = free;
            }
        }
    }
}

/// How a rule turns the measure before and after a placement into a score, higher is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Score {
    /// The drop in the measure, compared exactly (rounded to a millionth of a milli so float
    /// noise does not split true ties).
    Exact,
    /// FGD as published: `int(sigmoid(drop / 1000) * 100)`.
    Sigmoid,
}

impl Score {
    fn of(self, before: f64, after: f64) -> f64 {
        match self {
            Score::Exact => ((before - after) * 1e6).round() / 1e6,
            Score::Sigmoid => ((1.0 / (1.0 + (-(before - after) / 1000.0).exp())) * 100.0) as i64 as f64,
        }
    }
}

/// The placement rule, with what it remembers between calls on one [`Cluster`].
///
/// [`Rule::berth`] is the rule Berth places bookings by: FGD with each partly taken GPU followed
/// until it is full and the node's CPU and memory in the measure. FGD counts a GPU that a share
/// fits as usable outright; this rule counts the sliver the share would leave, as the mix goes
/// on filling it ([`TaskMix::sliver_waste`]), so a 470 share goes where it leaves 60 rather
/// than 210 the mix rarely fills. Whether the mix comes to fill a gap at all depends on how
/// many other gaps compete for the shares still to come (on the models no kind of the mix
/// tells apart from the gap's own): a share's placement is also charged the change in that
/// expected cost (see the `gaps` module: the population of gaps). And a node's free GPU milli
/// is worth only what its free CPU and memory can feed: at the workload's appetite (see
/// [`Appetite`]) anything beyond is stranded however the next tasks are shaped, a loss FGD's
/// one-task-ahead measure does not see. The placement chosen
/// is the one that adds the least to [`TaskMix::unused_gpu_milli`] plus this unfed milli
/// (plus, for a share, the gaps' extra cost), compared exactly; equal outcomes go to the one
/// the measure without the gaps prefers, then to the earliest node of `ties`, and on one node
/// to the lowest-indexed GPU.
/// [`Rule::fgd_as_published`] is the paper's policy, kept as the comparison the replay reports.
#[derive(Debug, Clone)]
pub struct Rule {
    mix: TaskMix,
    measure: Measure,
    score: Score,
    ties: NodeOrder,
    memo: OfferMemo,
    scratch: Vec<u16>,
    /// Berth's: the gap population shares are placed against.
    gaps: Option<Gaps>,
}

impl Rule {
    /// Berth's rule, measured against `mix`, ties to the earliest node of `ties`.
    pub fn berth(mix: TaskMix, ties: NodeOrder) -> Rule {
        let gaps = Gaps::of(&mix);
        Rule { gaps: Some(gaps), ..Rule::with(mix, Measure::UntilFullAndUnfed, Score::Exact, ties) }
    }

    /// FGD as published (Weng et al., `FGDScore`): the node and GPU whose placement lowers the
    /// mix's unusable GPU milli the most, scored `sigmoid(drop / 1000) * 100` truncated to a
    /// whole number; on one node the first GPU with the top score wins, equal nodes go to the
    /// earliest in `ties` (see [`NodeOrder`]). A comparison, not the product's rule.
    pub fn fgd_as_published(mix: TaskMix, ties: NodeOrder) -> Rule {
        Rule::with(mix, Measure::Fgd, Score::Sigmoid, ties)
    }

    fn with(mix: TaskMix, measure: Measure, score: Score, ties: NodeOrder) -> Rule {
        Rule { mix, measure, score, ties, memo: OfferMemo::default(), scratch: Vec::new(), gaps: None }
    }

    /// The node and GPU with the best score among the nodes `demand` fits; `None` when it
    /// fits none. What was scored is remembered per node version, so a rule serves one
    /// cluster (or a fresh one, each time).
    pub fn choose(&mut self, cluster: &Cluster, demand: &Demand) -> Option<Choice> {
        let Rule { mix, measure, score, ties, memo, scratch, gaps } = self;
        let keep_ways = matches!(demand.gpu, GpuAsk::Share(_)) && gaps.is_some();
        let row = memo.row(cluster, demand, keep_ways);
        let base = row * memo.nodes;
        // A share under the gap population: each way on a node is scored again every time
        // (the population changes with every placement); the measure's part is remembered.
        let mut gaps = match (demand.gpu, gaps.as_mut()) {
            (GpuAsk::Share(milli), Some(gaps)) => {
                gaps.count(cluster);
                Some((milli, gaps))
            }
            _ => None,
        };
        // The best score, the measure's part of it, its node and GPU: the higher score wins,
        // then the higher measure (where the gaps' part evens out two placements, what the
        // GPUs alone say decides), then the earlier node in `ties`.
        type Best = Option<(f64, f64, usize, u8)>;
        let mut best: Best = None;
        let consider = |best: &mut Best, s: f64, measured: f64, i: usize, gpu: u8| {
            let better = match *best {
                None => true,
                Some((b, _, _, _)) if s != b => s > b,
                Some((_, m, _, _)) if measured != m => measured > m,
                Some((_, _, j, _)) => ties.rank(i) < ties.rank(j),
            };
            if better {
                *best = Some((s, measured, i, gpu));
            }
        };
        for (i, node) in cluster.nodes().iter().enumerate() {
            if !node.fits(demand) {
                continue;
            }
            let mut offer = memo.offers[base + i];
            if offer.version != cluster.version(i) {
                let before = memo.before(cluster, mix, *measure, i);
                let range = memo.ways_of(row, i);
                let ways = if keep_ways { &mut memo.ways[range] } else { &mut [] };
                offer = NO_OFFER;
                outcomes(mix, *measure, node, demand, scratch, |gpu, after| {
                    let s = score.of(before, after);
                    let free = node.gpu_free.get(usize::from(gpu)).copied().unwrap_or(0);
                    if let Some(way) = ways.get_mut(usize::from(offer.ways)) {
                        *way = ShareWay { score: s, free, gpu };
                        offer.ways += 1;
                    }
                    if s > offer.score {
                        offer = Offer { score: s, share_gpu: gpu, free, ..offer };
                    }
                });
                offer.version = cluster.version(i);
                memo.offers[base + i] = offer;
            }
            match &mut gaps {
                None => consider(&mut best, offer.score, offer.score, i, offer.share_gpu),
                Some((milli, gaps)) => {
                    let (extra, most_added) = gaps.extra(mix, node.shape.model, *milli);
                    if best.is_some_and(|(b, _, _, _)| offer.score + most_added < b - 2e-6) {
                        continue;
                    }
                    let one = [ShareWay { score: offer.score, free: offer.free, gpu: offer.share_gpu }];
                    let ways = match offer.ways {
                        1 => &one[..],
                        n => &memo.ways[memo.ways_of(row, i)][..usize::from(n)],
                    };
                    for way in ways {
                        let (f, m) = (usize::from(way.free), usize::from(*milli));
                        let added = extra.get(f - m).zip(extra.get(f)).map_or(0.0, |(after, before)| after - before);
                        // Rounding moves a score by half a millionth at most: one clearly
                        // below the best cannot win, and is not rounded.
                        if best.is_some_and(|(b, _, _, _)| way.score - added < b - 2e-6) {
                            continue;
                        }
                        consider(&mut best, Score::Exact.of(way.score, added), way.score, i, way.gpu);
                    }
                }
            }
        }
        let (_, _, node, gpu) = best?;
        Some(Choice { node, share_gpu: matches!(demand.gpu, GpuAsk::Share(_)).then_some(gpu) })
    }
}

impl Policy for Rule {
    fn choose(&mut self, cluster: &Cluster, demand: &Demand) -> Option<Choice> {
        Rule::choose(self, cluster, demand)
    }
}
