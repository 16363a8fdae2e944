//! Replays Alibaba's openb GPU-sharing trace through `berth_domain::replay`, the way the FGD
//! paper's simulator does (Weng et al., USENIX ATC'23): seeds 42..=51, the workload tuned to
//! 1.3 x the fleet's GPU milli, shuffled, placed one task at a time, nothing leaves.
//!
//! Run: `cargo bench -p berth-domain --bench openb_replay`
//!
//! Environment:
//! - `OPENB_DIR`: the folder with the two CSV files (default `../shared/data/openb` from the
//!   workspace root).
//! - `OPENB_PLACEMENTS`: a folder to write one placements CSV per policy and seed into
//!   (`arrival,task,node,gpu_indexes,gpu_milli_per_gpu`; a skipped task has an empty node),
//!   and `replay.csv`, what each run reported; likewise `mig-placements-<policy>-seed<n>.csv`
//!   (`arrival,task,node,gpu_indexes,profile,start`) and `mig-replay.csv` for the MIG part.
//!   `bench/check_openb.py` checks them.
//! - `OPENB_TRACE`: the pod list to replay, a file in `OPENB_DIR` (default
//!   `openb_pod_list_default.csv`; the variants, e.g. `openb_pod_list_gpuspec33.csv`, have the
//!   same columns). A task's `gpu_spec` is honoured: it lands only on the models it names.
//! - `OPENB_SEEDS`: how many seeds from 42 (default 10).
//! - `OPENB_POLICIES`: comma-separated policy names to run (default all).
//! - `OPENB_MIG=0`: skip the MIG benchmark.
#![allow(clippy::print_stdout)]

use std::error::Error;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use berth_domain::gpu::GpuModel;
use berth_domain::replay::mig::{MigCluster, MigDemand, MigFirstFit, MigPacking, MigPolicy, MigUsage, replay_mig};
use berth_domain::replay::{
    Berth, BestFit, Cluster, Demand, Fgd, FirstFit, Models, NodeOrder, NodeShape, Policy, TaskMix, replay,
    tuned_arrivals,
};

const FIRST_SEED: u64 = 42;
const TUNING_RATIO: f64 = 1.3;
/// FGD's "typical pods": the most common task kinds covering 95% of the trace.
const MIX_COVERAGE: f64 = 0.95;
/// A separate stream for the tie-breaking node order, so the workload of a seed is the same for every policy.
const TIE_STREAM: u64 = 0x5EED_71E5;

struct Trace {
    node_names: Vec<String>,
    shapes: Vec<NodeShape>,
    task_names: Vec<String>,
    demands: Vec<Demand>,
}

fn main() -> Result<(), Box<dyn Error>> {
    let dir = std::env::var_os("OPENB_DIR").map(PathBuf::from).unwrap_or_else(default_dir);
    let pods = std::env::var("OPENB_TRACE").unwrap_or_else(|_| "openb_pod_list_default.csv".into());
    let trace = read_trace(&dir, &pods)?;
    let seeds: u64 = std::env::var("OPENB_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let wanted: Option<Vec<String>> =
        std::env::var("OPENB_POLICIES").ok().map(|s| s.split(',').map(|p| p.trim().to_string()).collect());
    let placements_dir = std::env::var_os("OPENB_PLACEMENTS").map(PathBuf::from);
    // What each run reported, for the independent check to recompute from the placements.
    let mut reported = String::from("policy,seed,placed,skipped,around_full,at_full,at_end\n");
    if let Some(d) = &placements_dir {
        fs::create_dir_all(d)?;
    }

    let capacity: u64 = trace.shapes.iter().map(|s| u64::from(s.gpus) * 1000).sum();
    let asked: u64 = trace.demands.iter().map(|d| u64::from(d.gpu.total_milli())).sum();
    println!(
        "openb: {} nodes, {} GPUs; {} tasks asking {} GPU milli ({:.1}% of capacity); seeds {}..={}",
        trace.shapes.len(),
        capacity / 1000,
        trace.demands.len(),
        asked,
        100.0 * asked as f64 / capacity as f64,
        FIRST_SEED,
        FIRST_SEED + seeds - 1
    );
    let mix = TaskMix::typical(&trace.demands, MIX_COVERAGE);
    let workloads: Vec<Vec<usize>> = (FIRST_SEED..FIRST_SEED + seeds)
        .map(|seed| tuned_arrivals(&trace.demands, capacity, TUNING_RATIO, seed))
        .collect();

    // The simulator's node order: a per-seed random permutation, drawn apart from the workload.
    let nodes = trace.shapes.len();
    let ties = |seed: u64| NodeOrder::shuffled(nodes, seed ^ TIE_STREAM);
    type MakePolicy<'a> = Box<dyn Fn(u64) -> Box<dyn Policy> + 'a>;
    let policies: Vec<(&str, MakePolicy)> = vec![
        ("first-fit", Box::new(|_| Box::new(FirstFit))),
        ("best-fit", Box::new(|seed| Box::new(BestFit::new(ties(seed))))),
        ("fgd-published", Box::new(|seed| Box::new(Fgd::new(mix.clone(), ties(seed))))),
        ("berth", Box::new(|seed| Box::new(Berth::new(mix.clone(), ties(seed))))),
    ];

    println!();
    println!("GPU allocation at 100% arrival (allocated / total GPU milli), {seeds} seeds");
    println!(
        "{:<14} {:>8} {:>8} {:>8} {:>10} {:>9} {:>9} {:>9}",
        "policy", "mean", "min", "max", "point mean", "at 130%", "skipped", "time"
    );
    for (name, make) in &policies {
        if wanted.as_ref().is_some_and(|w| !w.iter().any(|p| p == name)) {
            continue;
        }
        let (mut window, mut point, mut end, mut skipped) = (Vec::new(), Vec::new(), Vec::new(), 0usize);
        let mut elapsed = Duration::ZERO;
        for (k, order) in workloads.iter().enumerate() {
            let seed = FIRST_SEED + k as u64;
            let mut policy = make(seed);
            let mut cluster = Cluster::new(trace.shapes.iter().copied());
            let mut rows: Vec<Option<(usize, Vec<u8>, u16)>> = Vec::with_capacity(order.len());
            let started = Instant::now();
            let report = replay(&mut cluster, order.iter().map(|&i| &trace.demands[i]), policy.as_mut(), |_, p| {
                if placements_dir.is_some() {
                    rows.push(p.map(|p| (p.node, p.gpus.clone(), p.milli_per_gpu)));
                }
            })?;
            elapsed += started.elapsed();
            window.push(report.allocation_around_full_arrival.ok_or("the workload never reached 100% arrival")?);
            point.push(report.allocation_at_full_arrival.ok_or("the workload never reached 100% arrival")?);
            end.push(report.allocation_at_end);
            skipped += report.skipped;
            if let Some(d) = &placements_dir {
                write_placements(&d.join(format!("placements-{name}-seed{seed}.csv")), &trace, order, &rows)?;
                let figure = |f: Option<f64>| f.map(|f| f.to_string()).unwrap_or_default();
                writeln!(
                    reported,
                    "{name},{seed},{},{},{},{},{}",
                    report.placed,
                    report.skipped,
                    figure(report.allocation_around_full_arrival),
                    figure(report.allocation_at_full_arrival),
                    report.allocation_at_end
                )?;
            }
        }
        let (mean, min, max) = stats(&window);
        println!(
            "{:<14} {:>7.2}% {:>7.2}% {:>7.2}% {:>9.2}% {:>8.2}% {:>9.0} {:>8.1}s",
            name,
            100.0 * mean,
            100.0 * min,
            100.0 * max,
            100.0 * stats(&point).0,
            100.0 * stats(&end).0,
            skipped as f64 / window.len() as f64,
            elapsed.as_secs_f64()
        );
    }
    if let Some(d) = &placements_dir {
        fs::write(d.join("replay.csv"), &reported)?;
    }
    println!("published (FGD paper, 10 seeds): best-fit 92.86%, FGD 95.23%");
    println!("mean/min/max: mean allocation over arrivals at 99.5..=100.5% (the simulator's reading);");
    println!("point mean: allocation just after arrivals first reach 100%; skipped: tasks per seed, whole run");

    if std::env::var("OPENB_MIG").is_ok_and(|v| v == "0") {
        return Ok(());
    }
    println!();
    println!("MIG fragmentation: the same workloads on {} H100-80GB GPUs (same nodes), shares", capacity / 1000);
    println!("rounded up to 1g/2g/3g/4g/7g; compute slices at 100% arrival (in slices), {seeds} seeds");
    println!(
        "{:<12} {:>10} {:>9} {:>9} {:>10} {:>12} {:>13} {:>9} {:>8}",
        "policy", "allocated", "alloc %", "stranded", "free", "free partial", "skipped@100%", "at end", "time"
    );
    let mig_demands: Vec<MigDemand> = trace.demands.iter().map(MigDemand::from_demand).collect();
    type MakeMig = fn() -> Box<dyn MigPolicy>;
    let mig_policies: [(&str, MakeMig); 2] =
        [("first-fit", || Box::new(MigFirstFit)), ("berth", || Box::new(MigPacking))];
    let mut mig_reported =
        String::from("policy,seed,placed,skipped,allocated_at_full,skipped_at_full,allocated_at_end,total\n");
    for (name, make) in mig_policies {
        let mut at_full: Vec<(MigUsage, usize)> = Vec::new();
        let mut at_end: Vec<MigUsage> = Vec::new();
        let mut elapsed = Duration::ZERO;
        for (k, order) in workloads.iter().enumerate() {
            let seed = FIRST_SEED + k as u64;
            let mut cluster = MigCluster::new(trace.shapes.iter().copied());
            let mut policy = make();
            let mut rows: Vec<Option<String>> = Vec::with_capacity(order.len());
            let started = Instant::now();
            let report = replay_mig(&mut cluster, order.iter().map(|&i| &mig_demands[i]), policy.as_mut(), |_, p| {
                if placements_dir.is_some() {
                    rows.push(p.map(|p| {
                        let gpus: Vec<String> = p.gpus.iter().map(u8::to_string).collect();
                        let (profile, start) = p
                            .instance
                            .map(|i| (i.profile.name(GpuModel::H100_80GB).unwrap_or_default(), i.start.to_string()))
                            .unwrap_or_default();
                        format!("{},{},{profile},{start}", trace.node_names[p.node], gpus.join("-"))
                    }));
                }
            })?;
            elapsed += started.elapsed();
            let full = report.at_full_arrival.ok_or("MIG workload never reached 100% arrival")?;
            if let Some(d) = &placements_dir {
                let path = d.join(format!("mig-placements-{name}-seed{seed}.csv"));
                write_arrivals(&path, "node,gpu_indexes,profile,start", &trace, order, &rows)?;
                writeln!(
                    mig_reported,
                    "{name},{seed},{},{},{},{},{},{}",
                    report.placed, report.skipped, full.0.allocated, full.1, report.at_end.allocated, full.0.total
                )?;
            }
            at_full.push(full);
            at_end.push(report.at_end);
        }
        let n = at_full.len() as f64;
        let mean = |f: &dyn Fn(&(MigUsage, usize)) -> f64| at_full.iter().map(f).sum::<f64>() / n;
        let total = at_full.first().map(|u| u.0.total).unwrap_or(0) as f64;
        let allocated = mean(&|u| u.0.allocated as f64);
        println!(
            "{:<12} {:>10.0} {:>8.2}% {:>9.1} {:>10.0} {:>12.0} {:>13.0} {:>8.2}% {:>7.1}s",
            name,
            allocated,
            100.0 * allocated / total,
            mean(&|u| u.0.stranded as f64),
            mean(&|u| (u.0.total - u.0.allocated) as f64),
            mean(&|u| u.0.free_on_partitioned as f64),
            mean(&|u| u.1 as f64),
            100.0 * at_end.iter().map(|u| u.allocated as f64).sum::<f64>() / n / total,
            elapsed.as_secs_f64()
        );
    }
    if let Some(d) = &placements_dir {
        fs::write(d.join("mig-replay.csv"), &mig_reported)?;
    }
    println!("stranded: free slices no MIG instance could use, given their GPU's layout; free partial: free");
    println!("slices on GPUs that hold an instance; at end: allocation after the whole (130%) workload");
    Ok(())
}

fn default_dir() -> PathBuf {
    // Benches run with the package folder as working directory; the data sits next to the
    // workspace root.
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("..").join("shared").join("data").join("openb")
}

fn stats(values: &[f64]) -> (f64, f64, f64) {
    let mean = values.iter().sum::<f64>() / values.len().max(1) as f64;
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (mean, min, max)
}

/// Rows of a CSV file with a header, as maps from the named columns to their fields.
fn read_csv(path: &Path, columns: &[&str]) -> Result<Vec<Vec<String>>, Box<dyn Error>> {
    let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().ok_or_else(|| format!("{}: empty file", path.display()))?.split(',').collect();
    let index: Vec<usize> = columns
        .iter()
        .map(|c| header.iter().position(|h| h.trim() == *c).ok_or_else(|| format!("{}: no column {c}", path.display())))
        .collect::<Result<_, _>>()?;
    let mut rows = Vec::new();
    for (n, line) in lines.enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        // The trace has no quoted fields.
        let fields: Vec<&str> = line.split(',').collect();
        let row = index
            .iter()
            .map(|&i| fields.get(i).map(|f| f.trim().to_string()))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| format!("{}: line {} is short", path.display(), n + 2))?;
        rows.push(row);
    }
    Ok(rows)
}

fn number<T: std::str::FromStr>(field: &str, what: &str) -> Result<T, Box<dyn Error>> {
    field.parse().map_err(|_| format!("{what}: not a number: {field:?}").into())
}

/// The nodes and the tasks of `pods` (a pod list in `dir`). GPU models are numbered in the
/// order the node list first names them; a task's `gpu_spec` (models separated by `|`) allows
/// only those, and a model no node has allows nothing.
fn read_trace(dir: &Path, pods: &str) -> Result<Trace, Box<dyn Error>> {
    let nodes =
        read_csv(&dir.join("openb_node_list_gpu_node.csv"), &["sn", "cpu_milli", "memory_mib", "gpu", "model"])?;
    let mut trace = Trace { node_names: Vec::new(), shapes: Vec::new(), task_names: Vec::new(), demands: Vec::new() };
    let mut models: Vec<String> = Vec::new();
    for row in nodes {
        let model = match models.iter().position(|m| *m == row[4]) {
            Some(i) => i,
            None => {
                models.push(row[4].clone());
                models.len() - 1
            }
        };
        trace.shapes.push(NodeShape {
            cpu_milli: number(&row[1], &row[0])?,
            memory_mib: number(&row[2], &row[0])?,
            gpus: number(&row[3], &row[0])?,
            model: u8::try_from(model).ok().filter(|&m| m < 32).ok_or("more than 32 GPU models")?,
        });
        trace.node_names.push(row[0].clone());
    }
    let tasks = read_csv(&dir.join(pods), &["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec"])?;
    for row in tasks {
        let demand = Demand::from_trace(
            number(&row[1], &row[0])?,
            number(&row[2], &row[0])?,
            number(&row[3], &row[0])?,
            number(&row[4], &row[0])?,
        )
        .map_err(|e| format!("{}: {e}", row[0]))?;
        let spec: Vec<&str> = row[5].split('|').map(str::trim).filter(|m| !m.is_empty()).collect();
        let demand = if spec.is_empty() {
            demand
        } else {
            demand.on(Models::of(spec.iter().filter_map(|name| models.iter().position(|m| m == name)).map(|i| i as u8)))
        };
        trace.demands.push(demand);
        trace.task_names.push(row[0].clone());
    }
    Ok(trace)
}

/// One line per arrival of the share replay.
fn write_placements(
    path: &Path,
    trace: &Trace,
    order: &[usize],
    rows: &[Option<(usize, Vec<u8>, u16)>],
) -> Result<(), Box<dyn Error>> {
    let rows: Vec<Option<String>> = rows
        .iter()
        .map(|row| {
            row.as_ref().map(|(node, gpus, milli)| {
                let gpus: Vec<String> = gpus.iter().map(u8::to_string).collect();
                format!("{},{},{milli}", trace.node_names[*node], gpus.join("-"))
            })
        })
        .collect();
    write_arrivals(path, "node,gpu_indexes,gpu_milli_per_gpu", trace, order, &rows)
}

/// One line per arrival, `arrival,task,` and then `columns` (all empty for a skipped task);
/// tasks drawn again by the tuning are named `<task>-tuned-<n>` as in the published simulator.
fn write_arrivals(
    path: &Path,
    columns: &str,
    trace: &Trace,
    order: &[usize],
    rows: &[Option<String>],
) -> Result<(), Box<dyn Error>> {
    let originals = trace.demands.len();
    let skipped = ",".repeat(columns.matches(',').count());
    let mut out = format!("arrival,task,{columns}\n");
    for (arrival, (&task, row)) in order.iter().zip(rows).enumerate() {
        let name = &trace.task_names[task];
        let tuned = arrival.checked_sub(originals).map(|n| format!("{name}-tuned-{n}")).unwrap_or_else(|| name.clone());
        writeln!(out, "{arrival},{tuned},{}", row.as_deref().unwrap_or(&skipped))?;
    }
    fs::write(path, out)?;
    Ok(())
}
