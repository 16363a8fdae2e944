//! The fleet's gaps as a population: how likely the shares still to come fill a partly taken
//! GPU, given how many other gaps they could fill instead.
//!
//! [`super::TaskMix::sliver_waste`] follows one GPU until it is full as if every share the mix
//! sends could come to it. Near full that is not so. With `N(f)` partly taken GPUs of a class
//! of models (below) with `f` milli free, and `T` tasks still to come (free GPU milli over the
//! mix's mean GPU milli per task), `T * P(f)` of them are shares that fit a gap of `f` (`P(f)`:
//! the mix's weight of those shares), and they are spread over every gap of `f` or less that
//! they fit. So a gap of `f` is filled with probability
//! `q(f) = min(1, T * P(f) / gaps of f or less)`.
//! Filled, it costs what the share that fills it leaves, averaged over the shares that fit
//! (`fill(f)`: the mean `cost(f - m)`, followed down until nothing fits); not filled, it costs
//! its sliver waste as before. So `cost(f) = (1 - q(f)) * waste(f) + q(f) * fill(f)`, and a
//! share put on a GPU with `f` free is charged `cost(f - m) - cost(f)` rather than
//! `waste(f - m) - waste(f)`: the rule adds the difference ([`Gaps::extra`]).
//!
//! The gaps are counted by class of models: models that every kind of GPU task in the mix
//! allows or refuses alike (all of them, for a mix that names no model) are one class. Within
//! a class no task to come can tell one model from another, so a share that fits a gap there
//! competes with every gap of its size in the class, whichever model it is on. Classes that
//! some kind tells apart fare differently (the constrained kinds fill one and not the other),
//! so each class counts its own gaps against the shares that may land on it: a kind allowed on
//! several classes is spread over them in proportion to their free GPU milli. So a share takes
//! a gap in a class whose gaps outnumber the shares to come (most of them stay empty anyway)
//! and leaves a gap in a class short of gaps to the share that fits it. (Counted model by
//! model where no kind tells the models apart, each model's gaps would be set against the
//! shares to come divided among the models by free milli, a division no task to come makes:
//! of two models with the same gaps, the one with more free GPUs would look the likelier to
//! see its gaps filled.)
//!
//! Cost, kept proportional to what the rule does anyway: the mix's share kinds once per mix;
//! the gap counts kept node by node (only the nodes changed since the last share, found by
//! [`Cluster::version`] as the rule's memory finds them, are recounted); per placement of a
//! share, a class's table (1,000 entries times its share sizes) is worked out again only when
//! its gaps or the shares expected on it changed, when its first candidate node is scored.

use super::{Cluster, GpuAsk, MILLI_PER_GPU, Models, TaskMix};

const WHOLE: usize = MILLI_PER_GPU as usize;

/// Models are numbered 0..32 ([`Models`]): a node of another number takes no share.
const MODELS: usize = 32;

/// A kind of share the mix expects.
#[derive(Debug, Clone, Copy)]
struct ShareKind {
    milli: u16,
    models: Models,
    weight: f64,
}

/// One class's gaps and what they cost.
#[derive(Debug, Clone)]
struct ClassGaps {
    /// GPUs by free milli (1..1000: gaps; 0 and 1000, full and free ones, counted but unused).
    count: Vec<u32>,
    free_milli: u64,
    /// `cost(f) - waste(f)` for every free amount, worked out from `built_from` (the share
    /// sizes expected on the class and how many of each are still to come) and `count`.
    extra: Vec<f64>,
    built_from: Vec<(usize, f64)>,
    /// Whether `count` changed since `extra` was worked out.
    recounted: bool,
    /// The placement `extra` was last checked for.
    checked_for: u64,
    /// For that placement and a share size: the most `extra` can add to a placement's score.
    most_added: Option<(u16, f64)>,
}

impl ClassGaps {
    fn new() -> ClassGaps {
        ClassGaps {
            count: vec![0; WHOLE + 1],
            free_milli: 0,
            extra: vec![0.0; WHOLE + 1],
            built_from: Vec::new(),
            recounted: true,
            checked_for: 0,
            most_added: None,
        }
    }
}

/// The gap population of one [`Cluster`], kept up to date by [`Gaps::count`].
#[derive(Debug, Clone)]
pub(super) struct Gaps {
    /// The mix's share kinds, smallest first.
    kinds: Vec<ShareKind>,
    /// Expected GPU milli of one task of the mix (0 for CPU-only tasks).
    mean_task_milli: f64,
    /// Each model number's class: the lowest model number that every kind of GPU task in the
    /// mix allows or refuses alike.
    class: [u8; MODELS],
    /// By class; a class with no node stays empty.
    classes: Vec<ClassGaps>,
    /// The node version each node's GPUs were counted at, and where they start in `counted`.
    node_version: Vec<Option<u32>>,
    gpu_start: Vec<usize>,
    /// Each GPU's free milli as counted.
    counted: Vec<u16>,
    /// `1 / n` for every number of GPUs up to the cluster's (infinite for 0).
    reciprocal: Vec<f64>,
    /// For the placement being chosen: the fleet's free GPU milli over the free GPU milli
    /// of the classes each kind may land on; and a number for the placement.
    kind_spread: Vec<f64>,
    placement: u64,
    // Scratch for a table, by free amount: cost, the sum of what the shares that fit leave,
    // 1 / (shares that fit) and q(f); and the sizes expected on the class.
    cost: Vec<f64>,
    fill: Vec<f64>,
    per_fit: Vec<f64>,
    filled: Vec<f64>,
    sizes: Vec<(usize, f64)>,
}

impl Gaps {
    pub(super) fn of(mix: &TaskMix) -> Gaps {
        let mut kinds: Vec<ShareKind> = mix
            .kinds()
            .filter_map(|(gpu, _, models, weight)| match gpu {
                GpuAsk::Share(milli) if milli > 0 => Some(ShareKind { milli, models, weight }),
                _ => None,
            })
            .collect();
        kinds.sort_by_key(|k| k.milli);
        // The sets of models the mix's GPU tasks name; a model's class is the first model
        // with its answer to each of them.
        let mut named: Vec<Models> = Vec::new();
        for (gpu, _, models, _) in mix.kinds() {
            if gpu != GpuAsk::None && !named.contains(&models) {
                named.push(models);
            }
        }
        let alike = |a: u8, b: u8| named.iter().all(|m| m.allows(a) == m.allows(b));
        let class = std::array::from_fn(|model| (0..MODELS as u8).find(|&c| alike(c, model as u8)).unwrap_or(0));
        Gaps {
            kinds,
            class,
            mean_task_milli: mix.kinds().map(|(gpu, _, _, weight)| weight * f64::from(gpu.total_milli())).sum(),
            classes: Vec::new(),
            node_version: Vec::new(),
            gpu_start: Vec::new(),
            counted: Vec::new(),
            reciprocal: Vec::new(),
            kind_spread: Vec::new(),
            placement: 0,
            // Sized at the first table: a rule that places no share (every booking of whole
            // GPUs makes one) never needs them.
            cost: Vec::new(),
            fill: Vec::new(),
            per_fit: Vec::new(),
            filled: Vec::new(),
            sizes: Vec::new(),
        }
    }

    /// Brings the counts up to date with `cluster`, recounting only the nodes that changed
    /// since the last call, and starts a new placement.
    pub(super) fn count(&mut self, cluster: &Cluster) {
        let nodes = cluster.nodes();
        if self.node_version.len() != nodes.len() {
            self.classes.clear();
            self.node_version = vec![None; nodes.len()];
            self.gpu_start = Vec::with_capacity(nodes.len() + 1);
            let mut start = 0;
            for node in nodes {
                self.gpu_start.push(start);
                start += node.gpu_free.len();
            }
            self.gpu_start.push(start);
            self.counted = vec![0; start];
            self.reciprocal = (0..=start).map(|n| 1.0 / n as f64).collect();
        }
        for (i, node) in nodes.iter().enumerate() {
            let version = cluster.version(i);
            let model = usize::from(node.shape.model);
            if self.node_version[i] == Some(version) || model >= MODELS {
                continue;
            }
            let class = usize::from(self.class[model]);
            if self.classes.len() <= class {
                self.classes.resize_with(class + 1, ClassGaps::new);
            }
            let gaps = &mut self.classes[class];
            gaps.recounted = true;
            let counted = &mut self.counted[self.gpu_start[i]..self.gpu_start[i + 1]];
            if self.node_version[i].is_some() {
                for &f in counted.iter() {
                    gaps.count[usize::from(f)] -= 1;
                    gaps.free_milli -= u64::from(f);
                }
            }
            for (was, &f) in counted.iter_mut().zip(&node.gpu_free) {
                gaps.count[usize::from(f)] += 1;
                gaps.free_milli += u64::from(f);
                *was = f;
            }
            self.node_version[i] = Some(version);
        }
        let free = (cluster.total_gpu_milli() - cluster.allocated_gpu_milli()) as f64;
        let classes = &self.classes;
        self.kind_spread.clear();
        self.kind_spread.extend(self.kinds.iter().map(|k| {
            // A class is numbered by one of its models, and a kind allows all or none of them.
            let on = |(class, gaps): (usize, &ClassGaps)| k.models.allows(class as u8).then_some(gaps.free_milli);
            free / classes.iter().enumerate().filter_map(on).sum::<u64>() as f64
        }));
        self.placement += 1;
    }

    /// `extra(f) = cost(f) - waste(f)` on `model`, by free milli `f` (0..=1000), for the
    /// placement being chosen: a share of `m` on a GPU with `f` free adds
    /// `extra[f - m] - extra[f]` to the measure. Only after [`Gaps::count`] for this placement.
    /// Also the most it adds to any placement's score for a share of `milli`
    /// (`max extra[f] - extra[f - milli]`), so that a node whose best score plus that cannot
    /// win is passed over.
    pub(super) fn extra(&mut self, mix: &TaskMix, model: u8, milli: u16) -> (&[f64], f64) {
        let Some(&class) = self.class.get(usize::from(model)) else { return (&[], 0.0) };
        let class = usize::from(class);
        if class >= self.classes.len() {
            return (&[], 0.0);
        }
        if self.classes[class].checked_for != self.placement {
            self.classes[class].checked_for = self.placement;
            self.classes[class].most_added = None;
            self.expected_sizes(class);
            let gaps = &self.classes[class];
            if gaps.recounted || gaps.built_from != self.sizes {
                self.build(mix, class);
            }
        }
        let gaps = &mut self.classes[class];
        let most = match gaps.most_added {
            Some((m, most)) if m == milli => most,
            _ => {
                let (extra, m) = (&gaps.extra, usize::from(milli));
                let most = extra[m..].iter().zip(extra).map(|(before, after)| before - after).fold(0.0, f64::max);
                gaps.most_added = Some((milli, most));
                most
            }
        };
        (&gaps.extra, most)
    }

    /// Into `sizes`: the share sizes that may land on `class`, smallest first, with how many
    /// such shares are still to come there. The tasks to come are the fleet's free GPU milli
    /// over the mix's mean GPU milli per task; a kind gets its weight of them, spread over the
    /// classes it may land on in proportion to their free GPU milli. Written as
    /// `weight * (free here / mean) * (free / free where the kind may land)` so that for a kind
    /// on any model (the last factor is 1) the figure changes only when this class does.
    fn expected_sizes(&mut self, class: usize) {
        let Gaps { kinds, classes, kind_spread, sizes, mean_task_milli, .. } = self;
        let here = classes[class].free_milli as f64 / *mean_task_milli;
        sizes.clear();
        if here <= 0.0 {
            return;
        }
        for (k, &spread) in kinds.iter().zip(kind_spread.iter()) {
            if !(k.models.allows(class as u8) && spread > 0.0 && spread.is_finite()) {
                continue;
            }
            let expected = k.weight * here * spread;
            match sizes.last_mut() {
                Some((m, e)) if *m == usize::from(k.milli) => *e += expected,
                _ => sizes.push((usize::from(k.milli), expected)),
            }
        }
    }

    /// `extra` of `class` from `sizes` and its gaps: `cost(f) - waste(f)` for every `f`
    /// below a whole GPU (a whole GPU and a full one cost nothing more).
    fn build(&mut self, mix: &TaskMix, class: usize) {
        let Gaps { classes, reciprocal, sizes, cost, fill, per_fit, filled, .. } = self;
        for scratch in [&mut *cost, &mut *fill, &mut *per_fit, &mut *filled] {
            scratch.resize(WHOLE, 0.0);
        }
        let gaps = &mut classes[class];
        gaps.recounted = false;
        gaps.built_from.clone_from(sizes);
        let (count, waste) = (&gaps.count[..WHOLE], &mix.sliver_waste[..WHOLE]);
        // Below the smallest size nothing fits: a gap costs all of itself.
        let smallest = sizes.first().map_or(WHOLE, |s| s.0);
        for (f, c) in cost.iter_mut().enumerate().take(smallest) {
            *c = f as f64;
        }
        // q(f) = min(1, shares to come that fit f / gaps of f or less), size by size.
        let mut gaps_up_to: usize = count[1..smallest].iter().map(|&n| n as usize).sum();
        let mut fits = 0.0;
        for (i, &(m, expected)) in sizes.iter().enumerate() {
            fits += expected;
            let end = sizes.get(i + 1).map_or(WHOLE, |s| s.0);
            per_fit[m..end].fill(1.0 / fits);
            for (q, &n) in filled[m..end].iter_mut().zip(&count[m..end]) {
                gaps_up_to += n as usize;
                *q = (fits * reciprocal[gaps_up_to]).min(1.0);
            }
        }
        // cost(f) = (1 - q) waste(f) + q fill(f), fill(f) the mean of cost(f - m) over the
        // shares that fit. In blocks of `smallest` amounts, every cost a block reads is final
        // before the block starts, and the loops run over slices (vectorised).
        let mut start = smallest;
        while start < WHOLE {
            let end = (start + smallest).min(WHOLE);
            fill[start..end].fill(0.0);
            for &(m, expected) in sizes.iter().take_while(|s| s.0 < end) {
                let from = start.max(m);
                for (sum, &c) in fill[from..end].iter_mut().zip(&cost[from - m..end - m]) {
                    *sum += expected * c;
                }
            }
            let block = (cost[start..end].iter_mut().zip(&fill[start..end])).zip(&per_fit[start..end]);
            for (((c, &sum), &per), (&q, &w)) in block.zip(filled[start..end].iter().zip(&waste[start..end])) {
                *c = (1.0 - q) * w + q * sum * per;
            }
            start = end;
        }
        for ((e, &c), &w) in gaps.extra.iter_mut().zip(cost.iter()).zip(waste).skip(1) {
            *e = c - w;
        }
    }
}
