//! What the rule remembers between placements: each node's offer per kind of demand, kept
//! until the node changes, and for a share under the gap population every way it can go.

use std::collections::HashMap;

use super::{Cluster, Demand, Measure, TaskMix};

/// What one node offers one kind of demand, remembered until the node changes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Offer {
    pub(super) version: u32,
    /// Higher is better.
    pub(super) score: f64,
    pub(super) share_gpu: u8,
    /// How many [`ShareWay`]s the node has, where the row keeps them, and the free milli of
    /// `share_gpu` (a node with one way is read from here).
    pub(super) ways: u8,
    pub(super) free: u16,
}

pub(super) const NO_OFFER: Offer =
    Offer { version: u32::MAX, score: f64::NEG_INFINITY, share_gpu: 0, ways: 0, free: 0 };

/// Remembers each node's offer per kind of demand, so that a node is scored again only after
/// it changed: one placement changes one node, and tasks repeat a few hundred kinds.
#[derive(Debug, Clone, Default)]
pub(super) struct OfferMemo {
    rows: HashMap<Demand, usize>,
    pub(super) offers: Vec<Offer>,
    /// For a share placed with [`Gaps`]: every way it can go on each node, not only the best
    /// (the gaps' part of the score changes with every placement, anywhere). Such a row has
    /// a block of one way per GPU of the cluster, node after node (`gpu_start`), starting at
    /// `ways_at[row]`: flat, as the rule reads them all for each share.
    pub(super) ways: Vec<ShareWay>,
    ways_at: Vec<usize>,
    gpu_start: Vec<usize>,
    pub(super) nodes: usize,
    /// The measure of each node before any new placement, with the node version.
    before: Vec<(u32, f64)>,
}

/// A share on one GPU of a node: the GPU, its free milli before, and the measure's score.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ShareWay {
    pub(super) score: f64,
    pub(super) free: u16,
    pub(super) gpu: u8,
}

impl OfferMemo {
    /// The row of `demand`, made when new (with a block of ways when `keep_ways`).
    pub(super) fn row(&mut self, cluster: &Cluster, demand: &Demand, keep_ways: bool) -> usize {
        let nodes = cluster.nodes().len();
        if self.nodes != nodes || self.gpu_start.is_empty() {
            let mut gpu_start = Vec::with_capacity(nodes + 1);
            gpu_start.push(0);
            for node in cluster.nodes() {
                gpu_start.push(gpu_start[gpu_start.len() - 1] + node.gpu_free.len());
            }
            *self = OfferMemo { nodes, before: vec![(u32::MAX, 0.0); nodes], gpu_start, ..OfferMemo::default() };
        }
        let next = self.rows.len();
        let row = *self.rows.entry(*demand).or_insert(next);
        if row == next {
            self.offers.extend(std::iter::repeat_n(NO_OFFER, nodes));
            self.ways_at.push(self.ways.len());
            if keep_ways {
                self.ways.resize(self.ways.len() + self.gpu_start[nodes], ShareWay::default());
            }
        }
        row
    }

    /// Where node `node`'s ways are kept in row `row`.
    pub(super) fn ways_of(&self, row: usize, node: usize) -> std::ops::Range<usize> {
        let at = self.ways_at[row];
        at + self.gpu_start[node]..at + self.gpu_start[node + 1]
    }

    pub(super) fn before(&mut self, cluster: &Cluster, mix: &TaskMix, measure: Measure, node: usize) -> f64 {
        let version = cluster.version(node);
        let (v, value) = self.before[node];
        if v == version {
            return value;
        }
        let state = &cluster.nodes()[node];
        let value = measure.of(mix, state.shape.model, state.cpu_free, state.memory_free, &state.gpu_free);
        self.before[node] = (version, value);
        value
    }
}
