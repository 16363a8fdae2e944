//! Choosing concrete capacity for a size: which GPUs, and which MIG slices on them.
//!
//! Placement is a pure function of the fleet and of what is already held, so the
//! platform can run it inside the same transaction that records the result. Whole GPUs and
//! time-sliced shares are placed by [`rule`], the fragmentation-aware rule the openb replay
//! measures; MIG slices by their layouts ([`slice_fit`]), which the replay's MIG part uses
//! too.

pub mod rule;

use std::collections::BTreeMap;

use rustc_hash::{FxHashMap, FxHashSet};

use serde::{Deserialize, Serialize};

use crate::Refusal;
use crate::booking::GpuSet;
use crate::catalog::Offering;
use crate::gpu::GpuModel;
use crate::mig::{COMPUTE_SLICES, MEMORY_SLICES, MigInstance, MigLayout, MigProfile, SliceRange};
use crate::tenancy::Isolation;

/// The capacity a size asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Shape {
    /// One MIG instance of `profile` on a GPU of `model`.
    MigSlice { model: GpuModel, profile: MigProfile },
    /// `count` whole GPUs of `model`, all on one node.
    Gpus { model: GpuModel, count: u32 },
    /// `count` whole nodes whose GPUs are all `model`.
    Nodes { model: GpuModel, count: u32 },
    /// One share of a `model` GPU time-sliced `ways` ways (the development tier): the
    /// GPU's time and memory are shared with up to `ways - 1` others, with no isolation
    /// between them beyond separate containers.
    Share { model: GpuModel, ways: u8 },
}

impl Shape {
    pub fn model(self) -> GpuModel {
        match self {
            Shape::MigSlice { model, .. }
            | Shape::Gpus { model, .. }
            | Shape::Nodes { model, .. }
            | Shape::Share { model, .. } => model,
        }
    }

    /// Whether `other` asks for the same capacity on a GPU model of its own: the same
    /// number of GPUs or nodes, the same MIG profile, or a share of as many ways.
    pub fn same_kind(self, other: Shape) -> bool {
        match (self, other) {
            (Shape::MigSlice { profile: a, .. }, Shape::MigSlice { profile: b, .. }) => a == b,
            (Shape::Gpus { count: a, .. }, Shape::Gpus { count: b, .. })
            | (Shape::Nodes { count: a, .. }, Shape::Nodes { count: b, .. }) => a == b,
            (Shape::Share { ways: a, .. }, Shape::Share { ways: b, .. }) => a == b,
            _ => false,
        }
    }

    /// What the shape holds of its model's GPUs: whole GPUs count 1, a MIG slice its share
    /// of the compute slices, a time-sliced share 1/ways; `None` for whole nodes, whose GPU
    /// count is the fleet's.
    pub fn gpu_equivalents(self) -> Option<f64> {
        match self {
            Shape::MigSlice { profile, .. } => Some(f64::from(profile.compute_slices()) / f64::from(COMPUTE_SLICES)),
            Shape::Gpus { count, .. } => Some(f64::from(count)),
            Shape::Nodes { .. } => None,
            Shape::Share { ways, .. } => Some(1.0 / f64::from(ways)),
        }
    }

    pub fn describe(self) -> String {
        match self {
            Shape::MigSlice { model, profile } => {
                format!("a {model} {} slice", profile.name(model).unwrap_or_default())
            }
            Shape::Gpus { model, count } => format!("{count} x {model}"),
            Shape::Nodes { model, count: 1 } => format!("a whole {model} node"),
            Shape::Nodes { model, count } => format!("{count} whole {model} nodes"),
            Shape::Share { model, ways } => format!("a 1/{ways} time-sliced share of a {model}"),
        }
    }
}

/// How many ways a GPU may be time-sliced for the development tier; a share takes
/// `MEMORY_SLICES / ways` of the GPU's eight slice positions, so shares of one GPU never
/// overlap and the database's overlap check holds for them as for MIG slices.
pub const TIME_SLICE_WAYS: [u8; 3] = [2, 4, 8];

/// One GPU of the fleet, as placement sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuUnit {
    pub id: i64,
    pub node_id: i64,
    pub model: GpuModel,
    pub mig_capable: bool,
    /// The network a multi-node request may span: nodes of one site share its fabric,
    /// nodes of two sites never serve one cluster.
    pub fabric: i64,
    /// 1 for a GPU given whole or as MIG slices; 2, 4 or 8 for one time-sliced into that
    /// many development shares, which serves nothing else.
    pub time_slices: u8,
    /// The multi-node NVLink domain (an NVL72 rack) the node belongs to; `None` when the
    /// node's NVLink reaches no other node.
    pub nvlink_domain: Option<i64>,
    /// The InfiniBand scalable unit of the node: nodes one hop apart on every rail.
    pub ib_unit: i64,
}

impl GpuUnit {
    pub fn is_shared(&self) -> bool {
        self.time_slices > 1
    }

    /// What every node of one multi-node request must share: a multi-node NVLink domain
    /// when the node is in one, else a site's fabric.
    pub fn span(&self) -> Span {
        match self.nvlink_domain {
            Some(domain) => Span::NvlinkDomain(domain),
            None => Span::Fabric(self.fabric),
        }
    }
}

/// See [`GpuUnit::span`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Span {
    NvlinkDomain(i64),
    Fabric(i64),
}

/// Who holds capacity, as far as sharing a node with others goes.
///
/// While a hard or hybrid tenant holds anything on a node, nobody else holds anything
/// there: not another tenant, not platform staff's own bookings, with the cleaning gap
/// between them as between two bookings of one GPU. Its own bookings share its nodes
/// (a hybrid tenant's projects are soft among themselves, hard toward everyone else).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Occupant {
    /// A maintenance window: it takes its GPUs and keeps nobody off the node's others.
    Nobody,
    /// A soft tenant or platform staff: shares nodes with everyone but dedicated tenants.
    Sharing,
    /// A hard or hybrid tenant, by id: its nodes are its own while it holds them.
    Dedicated(i64),
}

impl Occupant {
    /// The occupant a booking of `tenant` (`None`: platform staff) is, given its isolation.
    pub fn of(tenant: Option<i64>, isolation: Isolation) -> Occupant {
        match (tenant, isolation) {
            (Some(id), Isolation::Hard | Isolation::Hybrid) => Occupant::Dedicated(id),
            _ => Occupant::Sharing,
        }
    }

    /// Whether `self` and `other` may not hold capacity on one node at the same time.
    pub fn excludes(self, other: Occupant) -> bool {
        match (self, other) {
            (Occupant::Nobody, _) | (_, Occupant::Nobody) | (Occupant::Sharing, Occupant::Sharing) => false,
            (Occupant::Dedicated(a), Occupant::Dedicated(b)) => a != b,
            (Occupant::Sharing, Occupant::Dedicated(_)) | (Occupant::Dedicated(_), Occupant::Sharing) => true,
        }
    }

    pub fn is_dedicated(self) -> bool {
        matches!(self, Occupant::Dedicated(_))
    }
}

/// Capacity already taken on a GPU: whole (`profile` is `None`) or one MIG instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    pub gpu_id: i64,
    pub slices: SliceRange,
    pub profile: Option<MigProfile>,
}

impl Hold {
    /// Whole GPUs count 1, a MIG slice its share of the compute slices (a 3g slice of an
    /// H100 is 3/7), a time-sliced share 1/ways.
    pub fn gpu_equivalents(&self) -> f64 {
        match self.profile {
            Some(p) => f64::from(p.compute_slices()) / f64::from(COMPUTE_SLICES),
            None => f64::from(self.slices.size) / f64::from(MEMORY_SLICES),
        }
    }

    /// A share of a time-sliced GPU rather than the whole GPU or a MIG slice.
    pub fn is_share(&self) -> bool {
        self.profile.is_none() && !self.slices.is_whole_gpu()
    }
}

/// What placement decided; the platform records one reservation per assignment.
pub type Assignment = Hold;

/// How well a GPU whose instances form `layout` takes one more `profile` instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceFit {
    /// Higher is better: the compute slices already used (the fullest GPU first, keeping
    /// empty GPUs whole), then the MIG options left open after placing.
    pub key: (u8, usize),
    /// Where the instance goes: the start that leaves the most options open.
    pub start: u8,
}

/// See [`SliceFit`]; `None` when `profile` does not fit `layout`.
pub fn slice_fit(layout: &MigLayout, profile: MigProfile) -> Option<SliceFit> {
    let start = layout.best_start(profile)?;
    let used: u8 = layout.instances.iter().map(|i| i.profile.compute_slices()).sum();
    let mut after = layout.clone();
    after.instances.push(MigInstance { profile, start });
    Some(SliceFit { key: (used, after.open_options()), start })
}

/// The tasks placement expects on GPUs of `model`, for the fragmentation measure: every
/// catalog size of that model and kind (whole GPUs, or shares of GPUs time-sliced `ways`
/// ways), equally likely. The product does not yet know its nodes' CPU and memory, so the
/// kinds ask none and the measure is FGD's on GPUs alone.
fn expected_tasks(model: GpuModel, shares_of: Option<u8>) -> rule::TaskMix {
    let mut kinds: Vec<rule::GpuAsk> = Offering::ALL
        .iter()
        .flat_map(|o| o.sizes())
        .filter_map(|size| match (size.shape, shares_of) {
            (Shape::Gpus { model: m, count }, None) if m == model => Some(rule::GpuAsk::Whole(count.min(255) as u8)),
            (Shape::Share { model: m, ways }, Some(w)) if m == model && ways == w => {
                Some(rule::GpuAsk::Share(rule::MILLI_PER_GPU / u16::from(ways)))
            }
            _ => None,
        })
        .collect();
    kinds.sort();
    kinds.dedup();
    rule::TaskMix::from_counts(kinds.into_iter().map(|gpu| (0, gpu, 1.0)))
}

/// Candidate GPUs grouped by node, in node order, laid out flat: placement groups every
/// GPU of a model for each booking (10,000 of them in the contention benchmark), and a list
/// per node was thousands of small allocations each time.
struct NodesFree<'a> {
    /// Each GPU's index on its node, and the GPU.
    gpus: Vec<(usize, &'a GpuUnit)>,
    /// Each GPU's free milli, as the rule reads it.
    free: Vec<u16>,
    /// Each node's position in the [`Capacity`], and where its GPUs end in `gpus`.
    nodes: Vec<(usize, usize)>,
}

impl<'a> NodesFree<'a> {
    /// Groups candidate GPUs, given as `(node, index on it, GPU, free milli)` in node order.
    fn of(candidates: impl Iterator<Item = (usize, usize, &'a GpuUnit, u16)>) -> NodesFree<'a> {
        let mut grouped = NodesFree { gpus: Vec::new(), free: Vec::new(), nodes: Vec::new() };
        for (n, i, gpu, free) in candidates {
            match grouped.nodes.last_mut() {
                Some((last, end)) if *last == n => *end += 1,
                _ => grouped.nodes.push((n, grouped.gpus.len() + 1)),
            }
            grouped.gpus.push((i, gpu));
            grouped.free.push(free);
        }
        grouped
    }

    fn range(&self, k: usize) -> std::ops::Range<usize> {
        (if k == 0 { 0 } else { self.nodes[k - 1].1 })..self.nodes[k].1
    }

    /// The `k`th node's position in the [`Capacity`] and its candidate GPUs.
    fn node(&self, k: usize) -> (usize, &[(usize, &'a GpuUnit)]) {
        (self.nodes[k].0, &self.gpus[self.range(k)])
    }

    /// The free milli of the `k`th node's candidate GPUs.
    fn free_of(&self, k: usize) -> &[u16] {
        &self.free[self.range(k)]
    }
}

/// Places `ask` on `nodes` by the fragmentation-aware rule, ties to the earliest node; the
/// position in `nodes` of the node chosen, and the positions in its list of the GPUs.
fn by_rule(nodes: &NodesFree<'_>, ask: rule::GpuAsk, mix: rule::TaskMix) -> Option<(usize, Vec<u8>)> {
    // A node's GPUs as the rule counts them: at most 255.
    let free_of = |k: usize| {
        let free = nodes.free_of(k);
        &free[..free.len().min(usize::from(u8::MAX))]
    };
    // Nodes whose GPUs have the same free amounts score the same, and ties go to the
    // earliest node, so only the first node of each such group is scored: a fleet of
    // thousands of nodes has a few dozen groups.
    let mut seen: FxHashSet<&[u16]> = FxHashSet::default();
    let firsts: Vec<usize> = (0..nodes.nodes.len()).filter(|&k| seen.insert(free_of(k))).collect();
    let states = firsts
        .iter()
        .map(|&k| {
            let shape = rule::NodeShape::new(0, 0, free_of(k).len() as u8);
            rule::NodeState::with_free(shape, 0, 0, free_of(k).to_vec())
        })
        .collect::<Option<Vec<_>>>()?;
    let mut cluster = rule::Cluster::of(states);
    let demand = rule::Demand::new(0, 0, ask);
    let choice = rule::Rule::berth(mix, rule::NodeOrder::fleet(firsts.len())).choose(&cluster, &demand)?;
    let placed = cluster.take(&demand, choice).ok()?;
    Some((firsts[placed.node], placed.gpus))
}

/// What placement chooses among: GPUs grouped by node, nodes in node id order, and what
/// is already held on each GPU. A [`crate::booking::Timeline`] is one over a window, and
/// [`place`] makes one of a list of GPUs and holds.
pub trait Capacity {
    fn node_count(&self) -> usize;
    /// The GPUs of the node at `n`.
    fn gpus_of(&self, n: usize) -> &[GpuUnit];
    /// What is held on the `i`th GPU of the node at `n`.
    fn holds_on(&self, n: usize, i: usize) -> impl Iterator<Item = Hold> + '_;
    /// Whether nothing is held on that GPU; asked of every GPU of a model by each booking
    /// of whole GPUs, so a capacity may answer it without making holds.
    fn is_free(&self, n: usize, i: usize) -> bool {
        self.holds_on(n, i).next().is_none()
    }
}

/// GPUs and holds as listed: the GPUs grouped by node as a [`GpuSet`] groups them.
struct Listed<'a> {
    set: GpuSet,
    /// Fx rather than SipHash: every GPU is looked up, by our own ids.
    holds: FxHashMap<i64, Vec<&'a Hold>>,
}

impl<'a> Listed<'a> {
    fn new(gpus: &[GpuUnit], holds: &'a [Hold]) -> Listed<'a> {
        let mut by_gpu: FxHashMap<i64, Vec<&Hold>> = FxHashMap::default();
        for h in holds {
            by_gpu.entry(h.gpu_id).or_default().push(h);
        }
        Listed { set: GpuSet::new(gpus.to_vec()), holds: by_gpu }
    }
}

impl Capacity for Listed<'_> {
    fn node_count(&self) -> usize {
        self.set.node_count()
    }

    fn gpus_of(&self, n: usize) -> &[GpuUnit] {
        self.set.node_gpus(n)
    }

    fn holds_on(&self, n: usize, i: usize) -> impl Iterator<Item = Hold> + '_ {
        self.holds.get(&self.set.node_gpus(n)[i].id).into_iter().flatten().map(|&&h| h)
    }
}

/// Choose capacity for `shape` on `gpus`, given what `holds` already take: [`place_on`]
/// over them.
pub fn place(shape: Shape, gpus: &[GpuUnit], holds: &[Hold]) -> Result<Vec<Assignment>, Refusal> {
    place_on(shape, &Listed::new(gpus, holds))
}

/// Choose capacity for `shape` on `capacity`.
///
/// Whole GPUs and time-sliced shares go where the fragmentation-aware rule ([`rule::Rule`])
/// leaves the least unusable for the catalog's other sizes of the model (in effect the
/// fullest node that still fits, and the fullest shared GPU); slices go to the GPU that is
/// already most used (keeping whole GPUs free), at the start that leaves the most options
/// open; whole nodes to the lowest-numbered free nodes.
pub fn place_on(shape: Shape, capacity: &impl Capacity) -> Result<Vec<Assignment>, Refusal> {
    let refuse = |detail: String| Refusal::NoCapacity {
        size: shape.describe(),
        when: "right now".into(),
        detail,
        hint: String::new(),
    };
    let model = shape.model();
    // Time-sliced GPUs serve only shares; every other shape takes exclusive GPUs.
    let shared = matches!(shape, Shape::Share { .. });
    let of_model = |gpu: &GpuUnit| gpu.model == model && gpu.is_shared() == shared;
    // Every GPU of the model: (node, index on it, the GPU).
    let candidates = || {
        (0..capacity.node_count()).flat_map(move |n| {
            capacity.gpus_of(n).iter().enumerate().filter(move |(_, g)| of_model(g)).map(move |(i, g)| (n, i, g))
        })
    };
    if candidates().next().is_none() {
        return Err(refuse(if shared {
            format!("this fleet has no {model} GPUs shared for development")
        } else {
            format!("this fleet has no {model} GPUs")
        }));
    }
    let is_free = |n: usize, i: usize| capacity.is_free(n, i);

    match shape {
        Shape::MigSlice { profile, .. } => {
            // Most GPUs share a few layouts (above all the empty one, kept aside from the
            // map), so each layout is scored once; equal fits go to the first GPU.
            let mut scored: FxHashMap<Vec<MigInstance>, Option<SliceFit>> = FxHashMap::default();
            let mut empty: Option<Option<SliceFit>> = None;
            let mut best: Option<((u8, usize), i64, u8)> = None;
            for (n, i, gpu) in candidates().filter(|(_, _, g)| g.mig_capable) {
                let mut instances = Vec::new();
                let mut whole_gpu = false;
                for h in capacity.holds_on(n, i) {
                    match h.profile {
                        Some(profile) => instances.push(MigInstance { profile, start: h.slices.start }),
                        None => whole_gpu = true,
                    }
                }
                if whole_gpu {
                    continue;
                }
                let fit = if instances.is_empty() {
                    *empty.get_or_insert_with(|| slice_fit(&MigLayout::new(Vec::new()), profile))
                } else {
                    instances.sort_by_key(|i| i.start);
                    *scored
                        .entry(instances)
                        .or_insert_with_key(|instances| slice_fit(&MigLayout::new(instances.clone()), profile))
                };
                let Some(fit) = fit else { continue };
                if best.is_none_or(|(key, _, _)| fit.key > key) {
                    best = Some((fit.key, gpu.id, fit.start));
                }
            }
            let (_, gpu_id, start) = best
                .ok_or_else(|| refuse(format!("every {model} GPU is fully used or partitioned without room for it")))?;
            Ok(vec![Hold {
                gpu_id,
                slices: SliceRange { start, size: profile.memory_slices() },
                profile: Some(profile),
            }])
        }
        Shape::Gpus { count, .. } => {
            // Each node's GPUs of the model: a GPU anything holds (a MIG slice included) is
            // not free for whole-GPU work.
            let nodes = NodesFree::of(
                candidates().map(|(n, i, g)| (n, i, g, if is_free(n, i) { rule::MILLI_PER_GPU } else { 0 })),
            );
            let placed = u8::try_from(count)
                .ok()
                .and_then(|n| by_rule(&nodes, rule::GpuAsk::Whole(n), expected_tasks(model, None)));
            let Some((node, indexes)) = placed else {
                let most_free = (0..nodes.nodes.len())
                    .map(|k| nodes.free_of(k).iter().filter(|&&f| f == rule::MILLI_PER_GPU).count())
                    .max()
                    .unwrap_or(0);
                return Err(refuse(format!(
                    "no node has {count} free {model} GPUs together (the most free on one node is {most_free})"
                )));
            };
            Ok(indexes.iter().map(|&i| whole(nodes.node(node).1[usize::from(i)].1.id)).collect())
        }
        Shape::Share { ways, .. } => {
            let ways = ways.max(1);
            let width = MEMORY_SLICES / ways;
            let share_milli = rule::MILLI_PER_GPU / u16::from(ways);
            // The free shares of a GPU, by start. A maintenance window holds the whole GPU,
            // and so every share of it.
            let free_starts = |n: usize, i: usize| -> Vec<u8> {
                let taken: Vec<SliceRange> = capacity.holds_on(n, i).map(|h| h.slices).collect();
                (0..ways)
                    .map(|k| k * width)
                    .filter(|&start| !taken.iter().any(|t| t.overlaps(SliceRange { start, size: width })))
                    .collect()
            };
            let nodes = NodesFree::of(
                candidates()
                    .filter(|(_, _, g)| g.time_slices == ways)
                    .map(|(n, i, g)| (n, i, g, free_starts(n, i).len() as u16 * share_milli)),
            );
            let placed = by_rule(&nodes, rule::GpuAsk::Share(share_milli), expected_tasks(model, Some(ways)));
            let found = placed.and_then(|(node, indexes)| {
                let (n, gpus) = nodes.node(node);
                let &(i, gpu) = gpus.get(usize::from(*indexes.first()?))?;
                Some((gpu, *free_starts(n, i).first()?))
            });
            let Some((gpu, start)) = found else {
                return Err(refuse(format!("every share of the {model} GPUs time-sliced {ways} ways is taken")));
            };
            Ok(vec![Hold { gpu_id: gpu.id, slices: SliceRange { start, size: width }, profile: None }])
        }
        Shape::Nodes { count, .. } => {
            // Every node whose GPUs are all of the model, exclusive and free, with its span
            // and InfiniBand unit.
            let nodes: Vec<(Span, i64, bool, &[GpuUnit])> = (0..capacity.node_count())
                .map(|n| {
                    let gpus = capacity.gpus_of(n);
                    let free =
                        gpus.iter().enumerate().all(|(i, g)| g.model == model && !g.is_shared() && is_free(n, i));
                    (gpus[0].span(), gpus[0].ib_unit, free, gpus)
                })
                .collect();
            // All nodes of one request share a span (an NVLink domain or a site's fabric),
            // preferably one InfiniBand unit inside it; the group with the fewest free
            // nodes that still fits keeps larger groups whole.
            let mut by_unit: BTreeMap<(Span, i64), Vec<&[GpuUnit]>> = BTreeMap::new();
            let mut by_span: BTreeMap<Span, Vec<&[GpuUnit]>> = BTreeMap::new();
            for &(span, unit, free, gpus) in &nodes {
                if free {
                    by_unit.entry((span, unit)).or_default().push(gpus);
                    by_span.entry(span).or_default().push(gpus);
                }
            }
            let fits = |free: &&Vec<&[GpuUnit]>| free.len() >= count as usize;
            let chosen = by_unit
                .values()
                .filter(fits)
                .min_by_key(|f| f.len())
                .or_else(|| by_span.values().filter(fits).min_by_key(|f| f.len()));
            let Some(free) = chosen else {
                let whole_nodes_of_model =
                    (0..capacity.node_count()).filter(|&n| capacity.gpus_of(n).iter().any(of_model)).count();
                let free: usize = by_span.values().map(Vec::len).sum();
                let most = by_span.values().map(Vec::len).max().unwrap_or(0);
                let together = if by_span.keys().any(|s| matches!(s, Span::NvlinkDomain(_))) {
                    "an NVLink domain"
                } else {
                    "a site's fabric"
                };
                return Err(refuse(if free >= count as usize {
                    format!("{free} {model} nodes are entirely free, but at most {most} of them share {together}")
                } else {
                    format!("{free} of the {whole_nodes_of_model} {model} nodes are entirely free")
                }));
            };
            Ok(free.iter().take(count as usize).flat_map(|gpus| gpus.iter()).map(|gpu| whole(gpu.id)).collect())
        }
    }
}

fn whole(gpu_id: i64) -> Hold {
    Hold { gpu_id, slices: SliceRange::WHOLE_GPU, profile: None }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two H100 nodes of 4 GPUs and one L40S node of 2.
    fn fleet() -> Vec<GpuUnit> {
        let mut gpus = Vec::new();
        for node in 0..2 {
            for i in 0..4 {
                gpus.push(GpuUnit {
                    id: node * 10 + i,
                    node_id: node,
                    model: GpuModel::H100_80GB,
                    mig_capable: true,
                    fabric: 0,
                    time_slices: 1,
                    nvlink_domain: None,
                    ib_unit: 0,
                });
            }
        }
        for i in 0..2 {
            gpus.push(GpuUnit {
                id: 20 + i,
                node_id: 2,
                model: GpuModel::L40S,
                mig_capable: false,
                fabric: 0,
                time_slices: 1,
                nvlink_domain: None,
                ib_unit: 0,
            });
        }
        gpus
    }

    fn slice(model: GpuModel, profile: MigProfile) -> Shape {
        Shape::MigSlice { model, profile }
    }

    /// Places `shape` repeatedly until refused, checking no two holds ever overlap.
    fn fill(shape: Shape) -> Vec<Hold> {
        let gpus = fleet();
        let mut holds: Vec<Hold> = Vec::new();
        while let Ok(assignments) = place(shape, &gpus, &holds) {
            for a in &assignments {
                assert!(holds.iter().all(|h| h.gpu_id != a.gpu_id || !h.slices.overlaps(a.slices)));
            }
            holds.extend(assignments);
        }
        holds
    }

    #[test]
    fn slices_pack_onto_one_gpu_before_using_the_next() {
        let shape = slice(GpuModel::H100_80GB, MigProfile::G1);
        let gpus = fleet();
        let first = place(shape, &gpus, &[]).expect("fits");
        let second = place(shape, &gpus, &first).expect("fits");
        assert_eq!(first[0].gpu_id, second[0].gpu_id);
        assert_eq!(fill(shape).len(), 8 * 7, "seven 1g slices on each of 8 H100s");
    }

    #[test]
    fn development_shares_pack_onto_shared_gpus_and_nothing_else_goes_there() {
        // The L40S node's two GPUs: the first time-sliced 4 ways, the second exclusive.
        let mut gpus = fleet();
        gpus.retain(|g| g.model == GpuModel::L40S);
        gpus[0].time_slices = 4;
        let share = Shape::Share { model: GpuModel::L40S, ways: 4 };
        let mut holds = Vec::new();
        for expected_start in [0, 2, 4, 6] {
            let placed = place(share, &gpus, &holds).expect("a share is free");
            assert_eq!(
                (placed[0].gpu_id, placed[0].slices.start, placed[0].slices.size),
                (gpus[0].id, expected_start, 2)
            );
            assert!(placed[0].is_share() && (placed[0].gpu_equivalents() - 0.25).abs() < 1e-9);
            holds.extend(placed);
        }
        let full = place(share, &gpus, &holds).expect_err("four shares taken");
        assert!(full.to_string().contains("every share of the L40S GPUs time-sliced 4 ways is taken"), "{full}");
        assert!(place(Shape::Share { model: GpuModel::L40S, ways: 8 }, &gpus, &[]).is_err(), "not split 8 ways");
        // Whole GPUs and nodes never land on the shared GPU, even when it is idle.
        let one = place(Shape::Gpus { model: GpuModel::L40S, count: 1 }, &gpus, &[]).expect("the exclusive one");
        assert_eq!(one[0].gpu_id, gpus[1].id);
        assert!(place(Shape::Gpus { model: GpuModel::L40S, count: 2 }, &gpus, &[]).is_err());
        assert!(place(Shape::Nodes { model: GpuModel::L40S, count: 1 }, &gpus, &[]).is_err());
        // A maintenance window holds the shared GPU whole, and so every share of it.
        let maintenance = whole(gpus[0].id);
        assert!(place(share, &gpus, &[maintenance]).is_err());
    }

    #[test]
    fn two_3g_per_gpu() {
        assert_eq!(fill(slice(GpuModel::H100_80GB, MigProfile::G3)).len(), 16);
    }

    #[test]
    fn whole_gpus_stay_on_one_node_and_prefer_the_fuller_node() {
        let gpus = fleet();
        let one = place(Shape::Gpus { model: GpuModel::H100_80GB, count: 1 }, &gpus, &[]).expect("fits");
        let three = place(Shape::Gpus { model: GpuModel::H100_80GB, count: 3 }, &gpus, &one).expect("fits");
        let nodes: std::collections::BTreeSet<i64> = three.iter().map(|a| a.gpu_id / 10).collect();
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes.into_iter().next(), Some(one[0].gpu_id / 10), "best fit fills the started node");
        let err = place(Shape::Gpus { model: GpuModel::H100_80GB, count: 5 }, &gpus, &[]).expect_err("no node has 5");
        assert!(err.to_string().contains("no node has 5 free H100-80GB GPUs"), "{err}");
    }

    #[test]
    fn a_node_with_one_slice_taken_is_not_free() {
        let gpus = fleet();
        let held = place(slice(GpuModel::H100_80GB, MigProfile::G1), &gpus, &[]).expect("fits");
        let two = place(Shape::Nodes { model: GpuModel::H100_80GB, count: 2 }, &gpus, &held);
        assert!(
            two.expect_err("one node is busy").to_string().contains("1 of the 2 H100-80GB nodes are entirely free")
        );
        let one = place(Shape::Nodes { model: GpuModel::H100_80GB, count: 1 }, &gpus, &held).expect("fits");
        assert_eq!(one.len(), 4);
        assert!(one.iter().all(|a| a.gpu_id / 10 != held[0].gpu_id / 10));
    }

    #[test]
    fn a_multi_node_request_stays_inside_one_site() {
        // Three H100 nodes of one GPU: node 0 at site 1, nodes 1 and 2 at site 2.
        let gpus: Vec<GpuUnit> = (0..3)
            .map(|n| GpuUnit {
                id: n,
                node_id: n,
                model: GpuModel::H100_80GB,
                mig_capable: true,
                fabric: n.min(1),
                time_slices: 1,
                nvlink_domain: None,
                ib_unit: 0,
            })
            .collect();
        let two = Shape::Nodes { model: GpuModel::H100_80GB, count: 2 };
        let placed = place(two, &gpus, &[]).expect("site 2 has two");
        assert_eq!(placed.iter().map(|a| a.gpu_id).collect::<Vec<_>>(), vec![1, 2]);
        let one = Shape::Nodes { model: GpuModel::H100_80GB, count: 1 };
        assert_eq!(place(one, &gpus, &[]).expect("one").first().map(|a| a.gpu_id), Some(0), "the smaller site first");
        let busy = [Hold { gpu_id: 2, slices: SliceRange::WHOLE_GPU, profile: None }];
        let err = place(two, &gpus, &busy).expect_err("one free per site");
        assert!(
            err.to_string()
                .contains("2 H100-80GB nodes are entirely free, but at most 1 of them share a site's fabric"),
            "{err}"
        );
    }

    /// Eight one-GPU B200 nodes at one site: nodes 0-3 form NVLink domain 100 and 4-7
    /// domain 200; InfiniBand units of two nodes each (0-1, 2-3, ...).
    fn racks() -> Vec<GpuUnit> {
        (0..8)
            .map(|n| GpuUnit {
                id: n,
                node_id: n,
                model: GpuModel::B200,
                mig_capable: true,
                fabric: 0,
                time_slices: 1,
                nvlink_domain: Some(if n < 4 { 100 } else { 200 }),
                ib_unit: n / 2,
            })
            .collect()
    }

    #[test]
    fn a_multi_node_request_stays_inside_one_nvlink_domain_and_prefers_one_infiniband_unit() {
        let gpus = racks();
        let nodes = |count| Shape::Nodes { model: GpuModel::B200, count };
        // Node 0 busy: the two nodes go to one whole unit (2-3), not across units (1 and 2).
        let busy = [whole(0)];
        let two = place(nodes(2), &gpus, &busy).expect("fits");
        assert_eq!(two.iter().map(|a| a.gpu_id).collect::<Vec<_>>(), vec![2, 3]);
        // Three nodes fit only across units, inside a domain: the fuller domain (1-3).
        let three = place(nodes(3), &gpus, &busy).expect("fits");
        assert_eq!(three.iter().map(|a| a.gpu_id).collect::<Vec<_>>(), vec![1, 2, 3]);
        // Never across domains, though six nodes are free in all.
        let busy = [whole(0), whole(4)];
        let err = place(nodes(4), &gpus, &busy).expect_err("3 + 3");
        assert!(
            err.to_string().contains("6 B200 nodes are entirely free, but at most 3 of them share an NVLink domain"),
            "{err}"
        );
        // The calendar counts the same way: one 3-node booking fits in each domain.
        let timeline = crate::booking::Timeline::new(
            gpus.clone(),
            busy.iter().map(|&hold| crate::booking::Booking {
                hold,
                window: crate::booking::Window { starts_at: 0, ends_at: 10 },
                occupant: Occupant::Nobody,
            }),
            0,
        );
        let window = crate::booking::Window { starts_at: 0, ends_at: 5 };
        assert_eq!(timeline.free_count(nodes(3), window, Occupant::Sharing), 2);
        assert_eq!(timeline.free_count(nodes(4), window, Occupant::Sharing), 0);
    }

    #[test]
    fn slices_never_land_on_whole_gpus_or_models_without_mig() {
        let gpus = fleet();
        let whole = place(Shape::Gpus { model: GpuModel::H100_80GB, count: 4 }, &gpus, &[]).expect("fits");
        let s = place(slice(GpuModel::H100_80GB, MigProfile::G7), &gpus, &whole).expect("other node");
        assert!(whole.iter().all(|w| w.gpu_id != s[0].gpu_id));
        assert!(place(slice(GpuModel::L40S, MigProfile::G1), &gpus, &[]).is_err());
        assert!(
            place(Shape::Gpus { model: GpuModel::B200, count: 1 }, &gpus, &[])
                .expect_err("no B200")
                .to_string()
                .contains("no B200")
        );
    }

    proptest::proptest! {
        /// Whatever slices are already held, placement refuses a slice only when no GPU of
        /// the model could take it: the instances in use cannot move, and around them no
        /// valid layout has room (checked against the planner, independently of `place`).
        #[test]
        fn a_slice_is_refused_only_when_no_gpu_could_take_it(
            asks in proptest::collection::vec(0usize..7, 1..60)
        ) {
            let gpus = fleet();
            let mut holds: Vec<Hold> = Vec::new();
            for ask in asks {
                let profile = MigProfile::ALL[ask];
                let shape = slice(GpuModel::H100_80GB, profile);
                match place(shape, &gpus, &holds) {
                    Ok(assignments) => holds.extend(assignments),
                    Err(_) => {
                        for gpu in gpus.iter().filter(|g| g.model == GpuModel::H100_80GB) {
                            let busy: Vec<MigInstance> = holds
                                .iter()
                                .filter(|h| h.gpu_id == gpu.id)
                                .filter_map(|h| h.profile.map(|profile| MigInstance { profile, start: h.slices.start }))
                                .collect();
                            let layout = MigLayout::new(busy.clone());
                            proptest::prop_assert!(!crate::mig::fits_after_repartition(&layout, &busy, profile));
                        }
                    }
                }
            }
        }
    }
}
