//! The GPU-sharing replay: a production trace's tasks (a share of one GPU, whole GPUs or no
//! GPU at all) placed on nodes with CPU, memory and GPUs, and the same demand on an
//! MIG-partitioned fleet, under the policies the replay compares
//! (`domain/benches/openb_replay.rs`).
//!
//! **The rule it measures is the product's.** Trace tasks become the placement rule's own
//! [`Demand`] and the [`Berth`] policy asks [`crate::placement::rule::Rule::berth`], the same
//! function a booking of whole GPUs or of a time-sliced share is placed by. The other
//! policies are comparisons: [`FirstFit`], [`BestFit`] (the published baseline) and [`Fgd`]
//! (the paper's policy as published). The MIG part ([`mig`]) compares first-fit with
//! [`mig::MigPacking`], which scores instances with placement's own MIG rule
//! ([`crate::placement::slice_score`]).
//!
//! The model is the one of Alibaba's openb trace and of the simulator published with "Beware
//! of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent"
//! (Weng et al., USENIX ATC'23, hkust-adsl/kubernetes-scheduler-simulator); it lives in
//! [`crate::placement::rule`] and is re-exported here. A task naming GPU models (the trace's
//! `gpu_spec`) only goes to nodes of those models.
//!
//! This module owns:
//! - the comparison policies and [`Berth`];
//! - [`tuned_arrivals`] and [`replay`]: the published experiment (workload tuned to a ratio of
//!   capacity, placed one task at a time, nothing leaves, a task that fits nowhere is skipped);
//! - the MIG counterpart in [`mig`]: `MigAsk` (a share rounded up to the smallest MIG
//!   profile that holds it), `MigCluster`, `MigFirstFit` and `MigPacking`, with the geometry
//!   itself left to [`crate::mig`].
//!
//! Pure and deterministic: randomness (workload sampling, tie-breaking) comes from a seeded
//! [`SplitMix64`], so a seed gives the same placements on every machine.

pub use crate::placement::rule::{
    Appetite, Choice, Cluster, Demand, DemandError, GpuAsk, MILLI_PER_GPU, Models, NodeOrder, NodeShape, NodeState,
    PlaceError, Placement, Policy, Rule, TaskMix,
};

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

impl NodeOrder {
    /// Ties go to the earliest node of a random order drawn from `seed`.
    pub fn shuffled(nodes: usize, seed: u64) -> NodeOrder {
        let mut order: Vec<u32> = (0..nodes as u32).collect();
        SplitMix64::new(seed).shuffle(&mut order);
        NodeOrder::from_order(&order)
    }
}

// ---------------------------------------------------------------------------------------------
// Policies
// ---------------------------------------------------------------------------------------------

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
        let cpu_left = f64::from(node.cpu_free() - demand.cpu_milli);
        let gpu_left = f64::from(node.gpu_free_total() - demand.gpu.total_milli());
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

/// FGD as published (see [`Rule::fgd_as_published`]): a comparison. The published mix is the
/// trace's typical tasks (95% coverage, CPU-only tasks included).
#[derive(Debug, Clone)]
pub struct Fgd(Rule);

impl Fgd {
    pub fn new(mix: TaskMix, ties: NodeOrder) -> Fgd {
        Fgd(Rule::fgd_as_published(mix, ties))
    }
}

impl Policy for Fgd {
    fn choose(&mut self, cluster: &Cluster, demand: &Demand) -> Option<Choice> {
        self.0.choose(cluster, demand)
    }
}

/// Berth: the product's placement rule ([`Rule::berth`]), nothing added.
#[derive(Debug, Clone)]
pub struct Berth(Rule);

impl Berth {
    pub fn new(mix: TaskMix, ties: NodeOrder) -> Berth {
        Berth(Rule::berth(mix, ties))
    }
}

impl Policy for Berth {
    fn choose(&mut self, cluster: &Cluster, demand: &Demand) -> Option<Choice> {
        self.0.choose(cluster, demand)
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
