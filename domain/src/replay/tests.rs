//! The replay's model and policies, tested.
use super::mig::*;
use super::*;
use crate::mig::MigProfile;
use proptest::prelude::*;

fn share(cpu: u32, milli: u16) -> Demand {
    Demand { cpu_milli: cpu, memory_mib: 0, gpu: GpuAsk::Share(milli), models: Models::ANY }
}

fn node(cpu: u32, gpus: u8) -> NodeShape {
    NodeShape { cpu_milli: cpu, memory_mib: 1024, gpus, model: 0 }
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
    let two = Demand { cpu_milli: 0, memory_mib: 0, gpu: GpuAsk::Whole(2), models: Models::ANY };
    assert_eq!(cluster.place(&two, &mut policy).map(|p| p.node), Ok(1));
    assert_eq!(cluster.place(&two, &mut policy), Err(PlaceError::NoNodeFits));
    let one = Demand { gpu: GpuAsk::Whole(1), ..two };
    assert_eq!(cluster.place(&one, &mut policy).map(|p| (p.node, p.gpus)), Ok((0, vec![1])));
}

#[test]
fn cpu_and_memory_bound_a_node_too() {
    let mut cluster = Cluster::new([NodeShape { cpu_milli: 4000, memory_mib: 100, gpus: 1, model: 0 }]);
    let mut policy = FirstFit;
    let big_memory = Demand { cpu_milli: 1, memory_mib: 101, gpu: GpuAsk::None, models: Models::ANY };
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
    let cluster = Cluster::new([NodeShape { cpu_milli: 128_000, memory_mib: 1, gpus: 8, model: 0 }]);
    let n = &cluster.nodes()[0];
    // Left after: 96000 CPU (0.375) and 7000 milli (0.4375): (1 - 0.8125) * 100 = 18.75 -> 18.
    assert_eq!(
        BestFit::score(
            &cluster,
            n,
            &Demand { cpu_milli: 32_000, memory_mib: 0, gpu: GpuAsk::Whole(1), models: Models::ANY }
        ),
        18
    );
}

#[test]
fn unusable_milli_counts_gpus_too_small_for_the_mix() {
    // Half the tasks want 500 milli, half a whole GPU, all with 1 CPU.
    let mix = TaskMix::from_counts([(1000, GpuAsk::Share(500), 1.0), (1000, GpuAsk::Whole(1), 1.0)]);
    // GPUs 1000 and 300 free: the 500 can use it all but the 300; the whole GPU the 1000.
    assert!((mix.unusable_gpu_milli(0, 8000, &[1000, 300]) - (0.5 * 300.0 + 0.5 * 300.0)).abs() < 1e-9);
    // No CPU: nothing can be used.
    assert!((mix.unusable_gpu_milli(0, 0, &[1000, 300]) - 1300.0).abs() < 1e-9);
    assert_eq!(mix.unusable_gpu_milli(0, 8000, &[0, 0]), 0.0);
}

#[test]
fn unfed_milli_is_what_free_cpu_and_memory_cannot_feed() {
    let demands = [Demand { cpu_milli: 10_000, memory_mib: 40_000, gpu: GpuAsk::Whole(1), models: Models::ANY }];
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
    let gpu_task = Demand { cpu_milli: 12_000, memory_mib: 0, gpu: GpuAsk::Whole(1), models: Models::ANY };
    let cpu_task = Demand { cpu_milli: 30_000, memory_mib: 0, gpu: GpuAsk::None, models: Models::ANY };
    let mut demands = vec![gpu_task; 9];
    demands.push(cpu_task);
    let mix = TaskMix::typical(&demands, 1.0);
    let shapes = [node(96_000, 8), node(104_000, 2)];
    let mut cluster = Cluster::new(shapes);
    let mut policy = Berth::new(mix, NodeOrder::fleet(2));
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
    assert_eq!(mix.kinds().count(), 2);
    let weight: f64 = mix.kinds().map(|k| k.3).sum();
    assert!((weight - 1.0).abs() < 1e-9);
}

#[test]
fn fragmentation_aware_keeps_a_gpu_whole_when_a_share_fits_elsewhere() {
    // Shares of 500 and whole GPUs come; a GPU already at 500 free should take a 500.
    let mix = TaskMix::from_counts([(0, GpuAsk::Share(500), 1.0), (0, GpuAsk::Whole(1), 1.0)]);
    let mut cluster = Cluster::new([node(64_000, 1), node(64_000, 1)]);
    cluster.take(&share(0, 500), Choice { node: 1, share_gpu: Some(0) }).expect("fits");
    let p = cluster.place(&share(0, 500), &mut Berth::new(mix.clone(), NodeOrder::fleet(2))).expect("fits");
    assert_eq!(p.node, 1);
    let p = cluster.place(&share(0, 500), &mut Fgd::new(mix, NodeOrder::fleet(2))).expect("fits");
    assert_eq!(p.node, 0);
}

#[test]
fn policies_remember_offers_only_until_a_node_changes() {
    let mix = TaskMix::from_counts([(0, GpuAsk::Share(300), 1.0)]);
    let mut cluster = Cluster::new([node(64_000, 1), node(64_000, 1)]);
    let mut policy = Berth::new(mix, NodeOrder::fleet(2));
    let first = cluster.place(&share(0, 300), &mut policy).expect("fits").node;
    // The same kind again must see the change and pack onto the same GPU (700 free).
    assert_eq!(cluster.place(&share(0, 300), &mut policy).map(|p| p.node), Ok(first));
    // A third there leaves 100 milli no 300 can use; but with only 300s to come every GPU ends
    // 100 short, so opening the other GPU would only strand a second 100 later: it fills this one.
    assert_eq!(cluster.place(&share(0, 300), &mut policy).map(|p| p.node), Ok(first));
    // That GPU has 100 free now: the next goes to the other node.
    assert_eq!(cluster.place(&share(0, 300), &mut policy).map(|p| p.node), Ok(1 - first));
}

#[test]
fn the_berth_measure_follows_a_gpu_until_it_is_full() {
    // Half the tasks take a whole GPU, a quarter a 470 share, a quarter a 320 share, 4 cores each.
    let mix = TaskMix::from_counts([
        (4_000, GpuAsk::Whole(1), 2.0),
        (4_000, GpuAsk::Share(470), 1.0),
        (4_000, GpuAsk::Share(320), 1.0),
    ]);
    // Nothing fits 60 or 210: FGD's one-task loss, all of it.
    assert!((mix.sliver_waste(60) - 60.0).abs() < 1e-9);
    assert!((mix.sliver_waste(210) - 210.0).abs() < 1e-9);
    // 530 free: half the tasks cannot use it; a 470 leaves 60, a 320 leaves 210.
    let w530 = 0.5 * 530.0 + 0.25 * 60.0 + 0.25 * 210.0;
    assert!((mix.sliver_waste(530) - w530).abs() < 1e-9);
    // FGD's measure counts the 530 as usable by both shares; Berth's by what they leave.
    assert!((mix.unusable_gpu_milli(0, 64_000, &[530, 1000]) - 0.5 * 530.0).abs() < 1e-9);
    assert!((mix.unused_gpu_milli(0, 64_000, &[530, 1000]) - w530).abs() < 1e-9);
    // A fully free GPU is not followed: a whole-GPU task takes it whole.
    assert_eq!(mix.unused_gpu_milli(0, 64_000, &[1000]), 0.0);
    // Without the CPU for any task, all of it is unusable, as in FGD's measure.
    assert!((mix.unused_gpu_milli(0, 0, &[530]) - 530.0).abs() < 1e-9);
}

/// The gap population: a gap is worth what the shares still to come will make of it, and they
/// are spread over every gap of their size on the models they may land on. Whole GPUs take
/// half the tasks, shares of 300 and 500 a quarter each; half the whole-GPU tasks may land
/// only on model A, half only on B, so the mix tells A and B apart (and its measure of a node
/// is the same on either model) and each model counts its own gaps. One node of model B
/// has a gap of 500 and four free GPUs; six nodes of model A have a gap of 500 each. A 300
/// leaves 200 (nothing fits) wherever it goes, so the measure alone ties and the earliest
/// node, B's, would take it. But B expects 3.2 more shares for its one gap (the shares are
/// spread over the models by free milli), which a 500 will fill; A expects 2.1 for six gaps,
/// most of which stay empty anyway: the 300 goes to A.
#[test]
fn a_share_takes_a_gap_where_gaps_outnumber_the_shares_to_come() {
    let (a, b) = (0u8, 1u8);
    let mix = TaskMix::of_kinds([
        (0, GpuAsk::Whole(1), Models::of([a]), 1.0),
        (0, GpuAsk::Whole(1), Models::of([b]), 1.0),
        (0, GpuAsk::Share(300), Models::ANY, 1.0),
        (0, GpuAsk::Share(500), Models::ANY, 1.0),
    ]);
    let (mut cluster, even) = two_models_of_gaps(a, b);
    let mut rule = Rule::berth(mix.clone(), NodeOrder::fleet(8));
    let placed = cluster.place(&share(1, 300), &mut rule).expect("fits");
    assert_eq!((placed.node, placed.gpus), (1, vec![0]), "the first of A's gaps");
    // The next 300 goes on to A's next gap: B's stays for a 500.
    assert_eq!(cluster.place(&share(1, 300), &mut rule).map(|p| p.node), Ok(2));
    // With its gaps as scarce as B's (one each, and the same free milli) A is no better: ties.
    let mut even = even;
    assert_eq!(even.place(&share(1, 300), &mut Rule::berth(mix, NodeOrder::fleet(2))).map(|p| p.node), Ok(0));
}

/// Where no kind of the mix tells two models apart, their gaps are one population: the same
/// fleet as above, but the whole GPUs may land anywhere. Every gap of 500 then competes for
/// the same shares to come, whichever model it is on, so A's six are no emptier than B's
/// one and the 300 ties, going to the earliest node, B's. (Counted model by model, with the
/// shares spread by free milli, B's gap would look the likelier filled and the 300 would go
/// to A, a difference between the models that no task to come makes.)
#[test]
fn models_no_kind_tells_apart_share_one_gap_population() {
    let (a, b) = (0u8, 1u8);
    let mix =
        TaskMix::from_counts([(0, GpuAsk::Whole(1), 2.0), (0, GpuAsk::Share(300), 1.0), (0, GpuAsk::Share(500), 1.0)]);
    let (mut cluster, _) = two_models_of_gaps(a, b);
    let mut rule = Rule::berth(mix, NodeOrder::fleet(8));
    assert_eq!(cluster.place(&share(1, 300), &mut rule).map(|p| p.node), Ok(0), "B's gap, the earliest");
}

/// One node of model `b` with a gap of 500, six of model `a` with a gap of 500 each and one of
/// model `b` with four free GPUs but no free CPU (its free milli counts, a share with CPU
/// cannot land there); and a fleet of one gap of each model.
fn two_models_of_gaps(a: u8, b: u8) -> (Cluster, Cluster) {
    let gap = |model: u8| {
        NodeState::with_free(NodeShape { cpu_milli: 64_000, memory_mib: 1024, gpus: 1, model }, 64_000, 1024, vec![500])
            .expect("valid node")
    };
    let mut nodes = vec![gap(b)];
    nodes.extend((0..6).map(|_| gap(a)));
    let idle = NodeShape { cpu_milli: 64_000, memory_mib: 1024, gpus: 4, model: b };
    nodes.push(NodeState::with_free(idle, 0, 1024, vec![1000; 4]).expect("valid node"));
    (Cluster::of(nodes), Cluster::of(vec![gap(b), gap(a)]))
}

/// A trace like openb's `gpu_spec` variants, built here: two models, a third of the tasks
/// allowing only one of them. Every placement honours the task's models, a constrained task
/// is skipped while the other model still has room, and the models count in the measure.
#[test]
fn tasks_naming_gpu_models_land_only_on_them() {
    let (p100, v100) = (0u8, 1u8);
    let shapes: Vec<NodeShape> = (0..12)
        .map(|i| NodeShape { cpu_milli: 64_000, memory_mib: 262_144, gpus: 4, model: if i < 8 { p100 } else { v100 } })
        .collect();
    let demands: Vec<Demand> = (0..120u16)
        .map(|i| {
            let gpu = if i % 4 == 0 { GpuAsk::Whole(1 + (i % 3) as u8) } else { GpuAsk::Share(200 + 50 * (i % 7)) };
            let demand = Demand::new(4_000, 8_192, gpu);
            if i % 3 == 0 { demand.on(Models::of([v100])) } else { demand }
        })
        .collect();
    let mix = TaskMix::typical(&demands, 0.95);
    assert!(mix.kinds().any(|k| k.2 == Models::of([v100])), "the mix keeps the constrained kinds");
    let mut cluster = Cluster::new(shapes.clone());
    let mut policy = Berth::new(mix, NodeOrder::shuffled(shapes.len(), 7));
    let mut constrained_skipped_with_room_elsewhere = 0;
    replay(&mut cluster, demands.iter(), &mut policy, |demand, placed| match placed {
        Some(p) => assert!(demand.models.allows(shapes[p.node].model), "{demand:?} on a {} node", shapes[p.node].model),
        None if demand.models != Models::ANY => constrained_skipped_with_room_elsewhere += 1,
        None => {}
    })
    .expect("no misfit");
    // The V100 nodes fill up first for the constrained tasks; P100 room stays unused by them.
    assert!(constrained_skipped_with_room_elsewhere > 0);
    let v100_free: u32 = cluster.nodes()[8..].iter().map(|n| n.gpu_free_total()).sum();
    let p100_free: u32 = cluster.nodes()[..8].iter().map(|n| n.gpu_free_total()).sum();
    assert!(p100_free > v100_free, "P100 {p100_free} free, V100 {v100_free}");
    // Kinds that may not land on a node's model ask nothing of it.
    let only_v100 = TaskMix::of_kinds([(0, GpuAsk::Share(500), Models::of([v100]), 1.0)]);
    assert_eq!(only_v100.unusable_gpu_milli(p100, 64_000, &[1000, 300]), 0.0);
    assert_eq!(only_v100.unusable_gpu_milli(v100, 64_000, &[1000, 300]), 300.0);
}

#[test]
fn tuning_reaches_the_ratio_and_no_further() {
    let demands: Vec<Demand> = (0..50)
        .map(|i| Demand {
            cpu_milli: 1,
            memory_mib: 1,
            gpu: if i % 5 == 0 { GpuAsk::None } else { GpuAsk::Share(100 + i) },
            models: Models::ANY,
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
    // Half of the demands name models (a random subset of the three the shapes use).
    let models =
        prop_oneof![Just(Models::ANY), (0u8..8).prop_map(|bits| Models::of((0..3).filter(|m| bits & 1 << m != 0)))];
    (0u32..40_000, 0u32..2048, 0u8..4, 1u16..1000, models).prop_map(|(cpu, mem, kind, milli, models)| Demand {
        cpu_milli: cpu,
        memory_mib: mem,
        gpu: match kind {
            0 => GpuAsk::None,
            1 | 2 => GpuAsk::Share(milli),
            _ => GpuAsk::Whole(1 + (milli % 4) as u8),
        },
        models,
    })
}

fn arb_shapes() -> impl Strategy<Value = Vec<NodeShape>> {
    proptest::collection::vec(
        (1u32..128_000, 1u32..4096, 0u8..9, 0u8..3).prop_map(|(c, m, g, model)| NodeShape {
            cpu_milli: c,
            memory_mib: m,
            gpus: g,
            model,
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
    /// a node's CPU or memory, never puts a task on a GPU model it does not allow, and a task
    /// is refused only when no node could take it.
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
            Box::new(Berth::new(mix, NodeOrder::fleet(shapes.len()))),
        ];
        for mut policy in policies {
            let mut cluster = Cluster::new(shapes.clone());
            for d in &demands {
                let could = cluster.any_fits(d);
                match cluster.place(d, policy.as_mut()) {
                    Ok(p) => {
                        prop_assert!(could);
                        prop_assert_eq!(p.gpus.len(), usize::from(d.gpu.gpu_count()));
                        let model = cluster.nodes()[p.node].shape().model;
                        prop_assert!(d.gpu == GpuAsk::None || d.models.allows(model));
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
