//! Health checks of a node: which checks an acceptance level runs, the commands behind
//! them, the parsers of their outputs, the expected NCCL bus bandwidth per GPU model and
//! interconnect, and the verdict of each check (measured figure against threshold).
//!
//! The parsers are tested on outputs in `domain/fixtures/checks/` (its README says which
//! were recorded on real hardware and which were reconstructed from the tools' formats).
//! Whoever runs a check (the node's agent, a Kubernetes Job, the simulation) hands the raw
//! output to [`evaluate`], so every backend is judged by the same rule.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::Refusal;
use crate::agent::Command;
use crate::gpu::GpuModel;

/// How deep acceptance goes: DCGM's run levels (`dcgmi diag -r 1|2|3`), and from medium
/// on the NCCL bandwidth test, which takes every GPU of the node for a minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckLevel {
    Quick,
    Medium,
    Long,
}

impl CheckLevel {
    pub const ALL: [CheckLevel; 3] = [CheckLevel::Quick, CheckLevel::Medium, CheckLevel::Long];

    pub fn as_str(self) -> &'static str {
        match self {
            CheckLevel::Quick => "quick",
            CheckLevel::Medium => "medium",
            CheckLevel::Long => "long",
        }
    }

    pub fn parse(text: &str) -> Result<CheckLevel, Refusal> {
        CheckLevel::ALL
            .into_iter()
            .find(|l| l.as_str() == text.trim())
            .ok_or_else(|| Refusal::InvalidCheckLevel(text.chars().take(40).collect()))
    }

    /// `dcgmi diag -r <n>`.
    pub fn dcgm_run_level(self) -> u8 {
        match self {
            CheckLevel::Quick => 1,
            CheckLevel::Medium => 2,
            CheckLevel::Long => 3,
        }
    }

    /// Whether the level disturbs work on the node (the NCCL test and DCGM's stress tests
    /// take every GPU): such levels run only on nodes nobody holds.
    pub fn disturbs_work(self) -> bool {
        self != CheckLevel::Quick
    }
}

/// One check of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckKind {
    /// `dcgmi diag -r <level> -j`.
    GpuDiagnostics,
    /// ECC and row-remapper counters from `nvidia-smi -q`.
    MemoryErrors,
    /// The driver's XID events in the kernel log.
    XidEvents,
    /// NCCL `all_reduce_perf` bus bandwidth across the node's GPUs.
    NcclBandwidth,
    /// `ibstat`: every InfiniBand port active and at its rate.
    Infiniband,
}

impl CheckKind {
    pub const ALL: [CheckKind; 5] = [
        CheckKind::GpuDiagnostics,
        CheckKind::MemoryErrors,
        CheckKind::XidEvents,
        CheckKind::NcclBandwidth,
        CheckKind::Infiniband,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CheckKind::GpuDiagnostics => "gpu_diagnostics",
            CheckKind::MemoryErrors => "memory_errors",
            CheckKind::XidEvents => "xid_events",
            CheckKind::NcclBandwidth => "nccl_bandwidth",
            CheckKind::Infiniband => "infiniband",
        }
    }

    pub fn parse(text: &str) -> Option<CheckKind> {
        CheckKind::ALL.into_iter().find(|k| k.as_str() == text)
    }

    pub fn title(self) -> &'static str {
        match self {
            CheckKind::GpuDiagnostics => "GPU diagnostics (DCGM)",
            CheckKind::MemoryErrors => "ECC and row remapping",
            CheckKind::XidEvents => "XID events",
            CheckKind::NcclBandwidth => "NCCL all-reduce bus bandwidth",
            CheckKind::Infiniband => "InfiniBand ports",
        }
    }

    /// The command that produces the output [`evaluate`] reads, as a node runs it. A node's
    /// agent builds it from the check it is asked for: the portal never sends a command line.
    pub fn command(self, level: CheckLevel, gpus: u32) -> Command {
        match self {
            CheckKind::GpuDiagnostics => {
                Command::new("dcgmi", &["diag", "-r", &level.dcgm_run_level().to_string(), "-j"])
            }
            CheckKind::MemoryErrors => Command::new("nvidia-smi", &["-q", "-d", "ECC,ROW_REMAPPER"]),
            CheckKind::XidEvents => Command::new("dmesg", &["--ctime", "--level=err,warn,info", "--facility=kern"]),
            CheckKind::NcclBandwidth => {
                Command::new("all_reduce_perf", &["-b", "8", "-e", "8G", "-f", "2", "-g", &gpus.to_string()])
            }
            CheckKind::Infiniband => Command::new("ibstat", &[]),
        }
    }

    /// How long the check may take on a node before it counts as failed: DCGM's levels
    /// take about 1, 3 and 30 to 60 minutes on eight GPUs, the NCCL sweep a few minutes,
    /// the rest read counters.
    pub fn time_limit(self, level: CheckLevel) -> std::time::Duration {
        let minutes = match (self, level) {
            (CheckKind::GpuDiagnostics, CheckLevel::Quick) => 10,
            (CheckKind::GpuDiagnostics, CheckLevel::Medium) => 20,
            (CheckKind::GpuDiagnostics, CheckLevel::Long) => 120,
            (CheckKind::NcclBandwidth, _) => 15,
            (CheckKind::MemoryErrors | CheckKind::XidEvents | CheckKind::Infiniband, _) => 2,
        };
        std::time::Duration::from_secs(minutes * 60)
    }
}

/// What a bare-metal node's agent is asked to do (`GET /api/v1/agent/checks`): it runs
/// [`NodeTask::command`] and answers with a [`CheckAnswer`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentOrder {
    pub id: i64,
    #[serde(flatten)]
    pub task: NodeTask,
}

/// A task the portal may order on a node: one of its commands, never a command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "task", rename_all = "snake_case")]
pub enum NodeTask {
    /// A health check.
    Check {
        kind: CheckKind,
        level: CheckLevel,
        /// The GPUs the portal books on the node (the NCCL test's `-g`).
        gpus: u32,
    },
    /// A reset of one idle GPU (`nvidia-smi -i <gpu> -r`): it applies a MIG mode change
    /// that waits for one, and clears a GPU that hangs.
    ResetGpu { gpu: u32 },
}

impl NodeTask {
    /// The command the node runs for it.
    pub fn command(self) -> Command {
        match self {
            NodeTask::Check { kind, level, gpus } => kind.command(level, gpus),
            NodeTask::ResetGpu { gpu } => Command::new("nvidia-smi", &["-i", &gpu.to_string(), "-r"]),
        }
    }

    /// How long it may take before it counts as failed: a reset takes seconds.
    pub fn time_limit(self) -> std::time::Duration {
        match self {
            NodeTask::Check { kind, level, .. } => kind.time_limit(level),
            NodeTask::ResetGpu { .. } => std::time::Duration::from_secs(2 * 60),
        }
    }
}

/// Whether `nvidia-smi -i <gpu> -r` reset the GPU, from what it printed: it says "was
/// successfully reset" when it did, and why not otherwise (a process using the GPU, a
/// GPU that cannot be reset alone on an NVLink board, not root).
pub fn reset_outcome(output: &str) -> Result<(), String> {
    if output.contains("successfully reset") {
        return Ok(());
    }
    let said: Vec<&str> = output.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    Err(if said.is_empty() { "nvidia-smi printed nothing".to_owned() } else { said.join(" ") })
}

/// What a check printed, whatever its exit status (a failing `dcgmi diag` exits non-zero
/// and says why in its output), or why it could not run at all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckAnswer {
    #[serde(default)]
    pub output: String,
    #[serde(default)]
    pub error: Option<String>,
}

impl CheckAnswer {
    /// The most of a check's output an agent sends: a long `dmesg` is cut at its start,
    /// where the oldest lines are.
    pub const MAX_OUTPUT: usize = 256 * 1024;

    /// What a check printed, its last [`CheckAnswer::MAX_OUTPUT`] bytes.
    pub fn printed(mut output: String) -> CheckAnswer {
        if output.len() > Self::MAX_OUTPUT {
            let mut start = output.len() - Self::MAX_OUTPUT;
            while !output.is_char_boundary(start) {
                start += 1;
            }
            output.drain(..start);
        }
        CheckAnswer { output, error: None }
    }

    pub fn failed(error: String) -> CheckAnswer {
        CheckAnswer { output: String::new(), error: Some(error) }
    }
}

/// What a node is checked with at `level`: the NCCL test only from medium on and only
/// with two GPUs or more, `ibstat` only where the node has InfiniBand.
pub fn checks_for(level: CheckLevel, gpus: u32, has_infiniband: bool) -> Vec<CheckKind> {
    let mut kinds = vec![CheckKind::GpuDiagnostics, CheckKind::MemoryErrors, CheckKind::XidEvents];
    if level >= CheckLevel::Medium && gpus >= 2 {
        kinds.push(CheckKind::NcclBandwidth);
    }
    if has_infiniband {
        kinds.push(CheckKind::Infiniband);
    }
    kinds
}

/// How a node's GPUs talk to each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Interconnect {
    /// NVLink through NVSwitch (SXM boards).
    Nvlink,
    /// PCIe only (or NVLink bridges between pairs, which all-reduce across the node
    /// does not benefit from as a whole).
    Pcie,
}

impl Interconnect {
    pub fn as_str(self) -> &'static str {
        match self {
            Interconnect::Nvlink => "nvlink",
            Interconnect::Pcie => "pcie",
        }
    }
}

/// Typical all-reduce bus bandwidth (GB/s) of one node's GPUs, large messages, as
/// nccl-tests reports it. Sites override these with what their own accepted nodes measure.
const EXPECTED_BUS_BANDWIDTH: &[(GpuModel, Interconnect, f64)] = &[
    (GpuModel::A100_40GB, Interconnect::Nvlink, 230.0),
    (GpuModel::A100_80GB, Interconnect::Nvlink, 230.0),
    (GpuModel::H100_80GB, Interconnect::Nvlink, 450.0),
    (GpuModel::H200, Interconnect::Nvlink, 450.0),
    (GpuModel::B200, Interconnect::Nvlink, 800.0),
    (GpuModel::A100_40GB, Interconnect::Pcie, 20.0),
    (GpuModel::A100_80GB, Interconnect::Pcie, 20.0),
    (GpuModel::H100_80GB, Interconnect::Pcie, 40.0),
    (GpuModel::H100_NVL, Interconnect::Pcie, 40.0),
    (GpuModel::H100_NVL, Interconnect::Nvlink, 40.0),
    (GpuModel::H200, Interconnect::Pcie, 40.0),
    (GpuModel::L40S, Interconnect::Pcie, 20.0),
];

/// Below this share of the expected bandwidth a node fails the NCCL check.
pub const BANDWIDTH_TOLERANCE: f64 = 0.9;

/// Expected bus bandwidth per model and interconnect: the defaults above, overridden per
/// site where the operator measured otherwise.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BandwidthTable {
    /// `(site, model, interconnect)` → GB/s; `site` `None` overrides everywhere.
    overrides: BTreeMap<(Option<String>, GpuModel, Interconnect), f64>,
}

impl BandwidthTable {
    pub fn set(&mut self, site: Option<&str>, model: GpuModel, interconnect: Interconnect, gbps: f64) {
        self.overrides.insert((site.map(str::to_owned), model, interconnect), gbps);
    }

    /// GB/s expected, if anything is known for the combination.
    pub fn expected(&self, site: &str, model: GpuModel, interconnect: Interconnect) -> Option<f64> {
        let key = |site: Option<&str>| (site.map(str::to_owned), model, interconnect);
        self.overrides.get(&key(Some(site))).or_else(|| self.overrides.get(&key(None))).copied().or_else(|| {
            EXPECTED_BUS_BANDWIDTH.iter().find(|(m, i, _)| *m == model && *i == interconnect).map(|(_, _, g)| *g)
        })
    }
}

/// What [`evaluate`] needs to know about the node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeFacts {
    pub model: GpuModel,
    pub gpus: u32,
    pub interconnect: Interconnect,
    /// GB/s from [`BandwidthTable::expected`].
    pub expected_bus_bandwidth: Option<f64>,
    /// Rate of the node's InfiniBand ports in Gb/s (`ibstat`'s `Rate`), e.g. 400 for NDR.
    pub infiniband_rate: u32,
}

/// One check's verdict: what was measured against what threshold, and a line saying why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckVerdict {
    pub kind: CheckKind,
    pub passed: bool,
    pub measured: Option<f64>,
    pub threshold: Option<f64>,
    /// The unit of `measured` and `threshold` ("GB/s", "errors", "ports down").
    pub unit: String,
    pub summary: String,
}

/// Judges one check's raw output. An output that cannot be read is a refusal (the check
/// is recorded as failed with that text by the caller: an unreadable check proves nothing).
pub fn evaluate(kind: CheckKind, raw: &str, node: &NodeFacts) -> Result<CheckVerdict, Refusal> {
    let verdict = |passed, measured: Option<f64>, threshold: Option<f64>, unit: &str, summary: String| CheckVerdict {
        kind,
        passed,
        measured,
        threshold,
        unit: unit.into(),
        summary,
    };
    match kind {
        CheckKind::GpuDiagnostics => {
            let results = parse_dcgm_diag(raw)?;
            let failed: Vec<&DiagResult> = results.iter().filter(|r| r.status == "Fail").collect();
            let summary = match failed.first() {
                None => format!("{} results, none failed", results.len()),
                Some(first) => format!(
                    "{} failed; first: {}{}{}",
                    failed.len(),
                    first.test,
                    first.gpu.as_deref().map(|g| format!(" on GPU {g}")).unwrap_or_default(),
                    first.warnings.first().map(|w| format!(": {w}")).unwrap_or_default()
                ),
            };
            Ok(verdict(failed.is_empty(), Some(failed.len() as f64), Some(0.0), "failed tests", summary))
        }
        CheckKind::MemoryErrors => {
            let gpus = parse_nvidia_smi_q(raw)?;
            let bad: Vec<String> = gpus.iter().filter_map(GpuMemoryHealth::problem).collect();
            let errors: u64 = gpus.iter().map(|g| g.volatile_uncorrectable + g.remapped_uncorrectable).sum();
            let summary = if bad.is_empty() {
                format!("{} GPUs: no uncorrectable errors, no remapping pending or failed", gpus.len())
            } else {
                bad.join("; ")
            };
            Ok(verdict(bad.is_empty(), Some(errors as f64), Some(0.0), "uncorrectable errors", summary))
        }
        CheckKind::XidEvents => {
            let events = parse_xid(raw);
            let fatal: Vec<&XidEvent> = events.iter().filter(|e| is_fatal_xid(e.code)).collect();
            let summary = match fatal.first() {
                None => format!("{} XID events, none fatal", events.len()),
                Some(e) => format!("{} fatal; first: XID {} on {}: {}", fatal.len(), e.code, e.pci, e.text),
            };
            Ok(verdict(fatal.is_empty(), Some(fatal.len() as f64), Some(0.0), "fatal XIDs", summary))
        }
        CheckKind::NcclBandwidth => {
            let run = parse_all_reduce(raw)?;
            let threshold = node.expected_bus_bandwidth.map(|g| g * BANDWIDTH_TOLERANCE);
            let fast_enough = threshold.is_none_or(|t| run.peak_bus_bandwidth >= t);
            let ranks_ok = run.ranks == node.gpus;
            let passed = fast_enough && run.wrong == 0 && ranks_ok;
            let summary = format!(
                "{:.1} GB/s at {} bytes over {} GPUs{}{}{}",
                run.peak_bus_bandwidth,
                run.largest_bytes,
                run.ranks,
                match threshold {
                    Some(t) => format!(
                        " (needs {t:.1}: {:.0}% of {} for {} over {})",
                        BANDWIDTH_TOLERANCE * 100.0,
                        node.expected_bus_bandwidth.unwrap_or_default(),
                        node.model,
                        node.interconnect.as_str()
                    ),
                    None => format!(" (nothing expected for {} over {})", node.model, node.interconnect.as_str()),
                },
                if run.wrong > 0 { format!("; {} wrong results", run.wrong) } else { String::new() },
                if ranks_ok { String::new() } else { format!("; the node has {} GPUs", node.gpus) },
            );
            Ok(verdict(passed, Some(run.peak_bus_bandwidth), threshold, "GB/s", summary))
        }
        CheckKind::Infiniband => {
            let ports: Vec<IbPort> = parse_ibstat(raw)?.into_iter().filter(|p| p.link_layer == "InfiniBand").collect();
            if ports.is_empty() {
                return Ok(verdict(false, Some(0.0), None, "ports down", "no InfiniBand port found".into()));
            }
            let down: Vec<String> = ports
                .iter()
                .filter(|p| p.state != "Active" || p.physical_state != "LinkUp" || p.rate < node.infiniband_rate)
                .map(|p| format!("{} port {}: {}/{} at {}", p.ca, p.port, p.state, p.physical_state, p.rate))
                .collect();
            let summary = if down.is_empty() {
                format!("{} InfiniBand ports active at {} Gb/s or more", ports.len(), node.infiniband_rate)
            } else {
                down.join("; ")
            };
            Ok(verdict(down.is_empty(), Some(down.len() as f64), Some(0.0), "ports down", summary))
        }
    }
}

fn unreadable(what: &str, why: impl std::fmt::Display) -> Refusal {
    Refusal::InvalidCheckOutput(format!("the {what} output cannot be read: {why}"))
}

/// One result line of `dcgmi diag -j`: a test on one GPU (or on the node, for DCGM's
/// deployment tests, which name no GPU).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiagResult {
    pub category: String,
    pub test: String,
    pub gpu: Option<String>,
    /// `Pass`, `Fail`, `Warn` or `Skip`, as DCGM writes it.
    pub status: String,
    pub warnings: Vec<String>,
}

/// Reads DCGM 3's `dcgmi diag -j`: `{"DCGM GPU Diagnostic": {"test_categories": [{"category",
/// "tests": [{"name", "results": [{"gpu_ids"?, "status", "warnings"?}]}]}]}}`. Warnings
/// are objects with a `warning` text (older releases wrote plain strings).
pub fn parse_dcgm_diag(raw: &str) -> Result<Vec<DiagResult>, Refusal> {
    use serde_json::Value;
    let doc: Value = serde_json::from_str(raw).map_err(|e| unreadable("dcgmi diag", e))?;
    let categories = doc
        .get("DCGM GPU Diagnostic")
        .and_then(|d| d.get("test_categories"))
        .and_then(Value::as_array)
        .ok_or_else(|| unreadable("dcgmi diag", "no \"DCGM GPU Diagnostic\".test_categories"))?;
    let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or_default().to_owned();
    let mut out = Vec::new();
    for category in categories {
        for test in category.get("tests").and_then(Value::as_array).into_iter().flatten() {
            for result in test.get("results").and_then(Value::as_array).into_iter().flatten() {
                let status = text(result.get("status"));
                if status.is_empty() {
                    return Err(unreadable(
                        "dcgmi diag",
                        format!("a result of {} has no status", text(test.get("name"))),
                    ));
                }
                let warnings = result
                    .get("warnings")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|w| w.as_str().map(str::to_owned).unwrap_or_else(|| text(w.get("warning"))))
                    .collect();
                out.push(DiagResult {
                    category: text(category.get("category")),
                    test: text(test.get("name")),
                    gpu: result.get("gpu_ids").map(|g| g.as_str().map(str::to_owned).unwrap_or_else(|| g.to_string())),
                    status,
                    warnings,
                });
            }
        }
    }
    if out.is_empty() {
        return Err(unreadable("dcgmi diag", "no test results"));
    }
    Ok(out)
}

/// What `all_reduce_perf` measured.
#[derive(Debug, Clone, PartialEq)]
pub struct AllReduceRun {
    /// The ranks listed under `# Using devices`.
    pub ranks: u32,
    /// The largest message size tested, in bytes.
    pub largest_bytes: u64,
    /// Out-of-place bus bandwidth at the largest size, GB/s: what the link can carry.
    pub peak_bus_bandwidth: f64,
    /// `# Avg bus bandwidth`, GB/s (over every size, so latency-bound sizes pull it down).
    pub average_bus_bandwidth: f64,
    /// Results that failed validation (the `#wrong` columns), summed.
    pub wrong: u64,
}

/// Reads nccl-tests' `all_reduce_perf` table: data rows of 13 columns (size, count, type,
/// redop, root, then time, algbw, busbw, #wrong out of place and in place).
pub fn parse_all_reduce(raw: &str) -> Result<AllReduceRun, Refusal> {
    let mut ranks = 0;
    let mut rows: Vec<(u64, f64)> = Vec::new();
    let mut wrong = 0u64;
    let mut average = None;
    for line in raw.lines() {
        let line = line.trim();
        if line.starts_with("#  Rank") || line.starts_with("# Rank") {
            ranks += 1;
        } else if let Some(avg) = line.strip_prefix("# Avg bus bandwidth") {
            let figure = avg.trim_start_matches([' ', ':']).trim();
            average = Some(
                figure.parse::<f64>().map_err(|e| unreadable("all_reduce_perf", format!("average {figure:?}: {e}")))?,
            );
        } else if !line.starts_with('#') && !line.is_empty() {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() != 13 {
                return Err(unreadable(
                    "all_reduce_perf",
                    format!("a row has {} columns, not 13: {line:?}", cols.len()),
                ));
            }
            let number = |i: usize| {
                cols[i].parse::<f64>().map_err(|e| unreadable("all_reduce_perf", format!("{:?}: {e}", cols[i])))
            };
            let size = cols[0]
                .parse::<u64>()
                .map_err(|e| unreadable("all_reduce_perf", format!("size {:?}: {e}", cols[0])))?;
            // `N/A` in #wrong means validation was off: nothing counted as wrong.
            wrong += cols[8].parse::<u64>().unwrap_or(0) + cols[12].parse::<u64>().unwrap_or(0);
            rows.push((size, number(7)?));
        }
    }
    let (largest_bytes, peak) = rows
        .iter()
        .copied()
        .max_by_key(|(size, _)| *size)
        .ok_or_else(|| unreadable("all_reduce_perf", "no result rows"))?;
    Ok(AllReduceRun {
        ranks,
        largest_bytes,
        peak_bus_bandwidth: peak,
        average_bus_bandwidth: average
            .ok_or_else(|| unreadable("all_reduce_perf", "no \"# Avg bus bandwidth\" line"))?,
        wrong,
    })
}

/// One GPU's memory health as `nvidia-smi -q` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuMemoryHealth {
    /// The section's `GPU 00000000:18:00.0` bus id.
    pub bus_id: String,
    /// Volatile (since the driver loaded) uncorrectable ECC errors, DRAM and SRAM.
    pub volatile_uncorrectable: u64,
    /// Aggregate (lifetime) uncorrectable ECC errors, DRAM and SRAM.
    pub aggregate_uncorrectable: u64,
    /// Rows remapped for uncorrectable errors (`Remapped Rows` → `Uncorrectable Error`).
    pub remapped_uncorrectable: u64,
    /// A remapping waits for a GPU reset.
    pub remap_pending: bool,
    /// The GPU ran out of spare rows: it needs the vendor.
    pub remap_failed: bool,
    /// `MIG Mode` → `Current`, when shown.
    pub mig_enabled: Option<bool>,
}

impl GpuMemoryHealth {
    /// Why this GPU fails the memory check, if it does. Lifetime (aggregate) errors alone
    /// do not fail it: a remapped row is repaired, and a reset clears the volatile count.
    pub fn problem(&self) -> Option<String> {
        let mut why = Vec::new();
        if self.volatile_uncorrectable > 0 {
            why.push(format!("{} uncorrectable ECC errors since the driver loaded", self.volatile_uncorrectable));
        }
        if self.remap_pending {
            why.push("row remapping pending (needs a GPU reset)".to_owned());
        }
        if self.remap_failed {
            why.push("row remapping failed (no spare rows left)".to_owned());
        }
        (!why.is_empty()).then(|| format!("GPU {}: {}", self.bus_id, why.join(", ")))
    }
}

/// Reads `nvidia-smi -q` (whole or `-d ECC,ROW_REMAPPER,…`): a `GPU <bus id>` section per
/// GPU, nested by four spaces, `Name : value` lines.
pub fn parse_nvidia_smi_q(raw: &str) -> Result<Vec<GpuMemoryHealth>, Refusal> {
    let mut gpus: Vec<GpuMemoryHealth> = Vec::new();
    // The section names above the current line, by depth (depth 1 is inside a GPU).
    let mut path: Vec<String> = Vec::new();
    for line in raw.lines() {
        if let Some(bus) = line.strip_prefix("GPU ") {
            gpus.push(GpuMemoryHealth { bus_id: bus.trim().to_owned(), ..Default::default() });
            path.clear();
            continue;
        }
        let Some(gpu) = gpus.last_mut() else { continue };
        let depth = (line.len() - line.trim_start().len()) / 4;
        if depth == 0 || line.trim().is_empty() {
            continue;
        }
        let (name, value) = match line.split_once(" : ") {
            Some((name, value)) => (name.trim(), Some(value.trim())),
            None => (line.trim(), None),
        };
        path.truncate(depth - 1);
        let Some(value) = value else {
            path.push(name.to_owned());
            continue;
        };
        let count = || value.parse::<u64>().unwrap_or(0);
        let sections: Vec<&str> = path.iter().map(String::as_str).collect();
        match (sections.as_slice(), name) {
            (["ECC Errors", "Volatile"], n) if n.contains("Uncorrectable") => gpu.volatile_uncorrectable += count(),
            (["ECC Errors", "Aggregate"], n) if n.contains("Uncorrectable") => gpu.aggregate_uncorrectable += count(),
            (["Remapped Rows"], "Uncorrectable Error") => gpu.remapped_uncorrectable = count(),
            (["Remapped Rows"], "Pending") => gpu.remap_pending = value == "Yes",
            (["Remapped Rows"], "Remapping Failure Occurred") => gpu.remap_failed = value == "Yes",
            (["MIG Mode"], "Current") => gpu.mig_enabled = Some(value == "Enabled"),
            _ => {}
        }
    }
    if gpus.is_empty() {
        return Err(unreadable("nvidia-smi -q", "no \"GPU <bus id>\" section"));
    }
    Ok(gpus)
}

/// One `NVRM: Xid (PCI:<bus>): <code>, …` line of the kernel log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidEvent {
    pub pci: String,
    pub code: u32,
    /// The rest of the line after the code.
    pub text: String,
}

/// The XID lines of a kernel log; other lines are ignored.
pub fn parse_xid(raw: &str) -> Vec<XidEvent> {
    raw.lines()
        .filter_map(|line| {
            let rest = line.split_once("NVRM: Xid (")?.1;
            let (pci, rest) = rest.split_once("): ")?;
            let (code, text) = rest.split_once(',').unwrap_or((rest, ""));
            // The driver names the process first (`pid=…, name=…,`); the message follows.
            let mut text = text.trim();
            for field in ["pid=", "name="] {
                if text.starts_with(field) {
                    text = text.split_once(", ").map_or("", |(_, after)| after);
                }
            }
            Some(XidEvent {
                pci: pci.trim_start_matches("PCI:").to_owned(),
                code: code.trim().parse().ok()?,
                text: text.to_owned(),
            })
        })
        .collect()
}

/// XIDs that mean the GPU itself is unwell (NVIDIA's XID catalogue: double-bit ECC 48,
/// row-remap events 63/64, NVLink 74, fallen off the bus 79, high single-bit ECC rate 92,
/// contained/uncontained ECC 94/95, GSP 119/120). Others (13, 31, 43: an application's
/// fault) are the workload's, not the node's.
pub fn is_fatal_xid(code: u32) -> bool {
    matches!(code, 48 | 63 | 64 | 74 | 79 | 92 | 94 | 95 | 119 | 120)
}

/// One port of `ibstat`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IbPort {
    pub ca: String,
    pub port: u32,
    pub state: String,
    pub physical_state: String,
    /// Gb/s.
    pub rate: u32,
    /// `InfiniBand` or `Ethernet` (RoCE).
    pub link_layer: String,
}

/// Reads `ibstat`: `CA '<name>'` blocks, each with `Port <n>:` blocks of `Key: value`.
pub fn parse_ibstat(raw: &str) -> Result<Vec<IbPort>, Refusal> {
    let mut ports: Vec<IbPort> = Vec::new();
    let mut ca: Option<String> = None;
    for line in raw.lines() {
        let trimmed = line.trim();
        if let Some(name) = trimmed.strip_prefix("CA '") {
            ca = Some(name.trim_end_matches('\'').to_owned());
        } else if let Some(port) = trimmed.strip_prefix("Port ").and_then(|p| p.strip_suffix(':')) {
            let ca = ca.clone().ok_or_else(|| unreadable("ibstat", "a port before any CA"))?;
            let port = port.parse().map_err(|e| unreadable("ibstat", format!("port {port:?}: {e}")))?;
            ports.push(IbPort {
                ca,
                port,
                state: String::new(),
                physical_state: String::new(),
                rate: 0,
                link_layer: String::new(),
            });
        } else if let (Some(port), Some((key, value))) = (ports.last_mut(), trimmed.split_once(": ")) {
            // Keys of the CA itself come before its first port and are skipped above.
            if line.starts_with("\t\t") || line.starts_with("        ") {
                match key {
                    "State" => port.state = value.to_owned(),
                    "Physical state" => port.physical_state = value.to_owned(),
                    "Rate" => port.rate = value.parse().unwrap_or(0),
                    "Link layer" => port.link_layer = value.to_owned(),
                    _ => {}
                }
            }
        }
    }
    if ports.is_empty() {
        return Err(unreadable("ibstat", "no CA ports"));
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_gpu_reset_is_its_own_command_and_judged_by_what_nvidia_smi_says() {
        let reset = NodeTask::ResetGpu { gpu: 3 };
        assert_eq!(reset.command().to_string(), "nvidia-smi -i 3 -r");
        assert_eq!(reset.time_limit().as_secs(), 120);
        let order = AgentOrder { id: 7, task: reset };
        let wire = serde_json::to_value(&order).unwrap();
        assert_eq!(wire, serde_json::json!({ "id": 7, "task": "reset_gpu", "gpu": 3 }));
        let check = AgentOrder {
            id: 8,
            task: NodeTask::Check { kind: CheckKind::Infiniband, level: CheckLevel::Quick, gpus: 8 },
        };
        let wire = serde_json::to_value(&check).unwrap();
        assert_eq!(
            wire,
            serde_json::json!({ "id": 8, "task": "check", "kind": "infiniband", "level": "quick", "gpus": 8 })
        );
        assert_eq!(serde_json::from_value::<AgentOrder>(wire).unwrap(), check);

        assert_eq!(reset_outcome("GPU 00000000:1B:00.0 was successfully reset.\nAll done.\n"), Ok(()));
        let busy = "The following GPUs could not be reset:\n  GPU 00000000:1B:00.0: In use by another client\n\n\
                    1 device is currently being used by one or more other processes.\n";
        let why = reset_outcome(busy).unwrap_err();
        assert!(
            why.starts_with("The following GPUs could not be reset: GPU 00000000:1B:00.0: In use by another client"),
            "{why}"
        );
        assert_eq!(reset_outcome(""), Err("nvidia-smi printed nothing".to_owned()));
    }
    use super::*;

    fn fixture(name: &str) -> String {
        let path = format!("{}/fixtures/checks/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn h100_node() -> NodeFacts {
        NodeFacts {
            model: GpuModel::H100_80GB,
            gpus: 8,
            interconnect: Interconnect::Nvlink,
            expected_bus_bandwidth: BandwidthTable::default().expected("a", GpuModel::H100_80GB, Interconnect::Nvlink),
            infiniband_rate: 400,
        }
    }

    #[test]
    fn recorded_nvidia_smi_q_of_a_healthy_h100() {
        let gpus = parse_nvidia_smi_q(&fixture("nvidia-smi-q.recorded.txt")).unwrap();
        assert_eq!(gpus.len(), 1);
        let gpu = &gpus[0];
        assert_eq!(gpu.bus_id, "00000000:00:06.0");
        assert_eq!(gpu.mig_enabled, Some(false), "the recorded H100 had MIG off");
        assert_eq!((gpu.volatile_uncorrectable, gpu.remapped_uncorrectable), (0, 0));
        assert!(!gpu.remap_pending && !gpu.remap_failed);
        let verdict = evaluate(CheckKind::MemoryErrors, &fixture("nvidia-smi-q.recorded.txt"), &h100_node()).unwrap();
        assert!(verdict.passed, "{verdict:?}");
        assert_eq!((verdict.measured, verdict.threshold), (Some(0.0), Some(0.0)));
    }

    #[test]
    fn recorded_health_query_counts_only_uncorrectable_errors() {
        // The recorded -d ECC,… output has one aggregate *correctable* SRAM error.
        let raw = fixture("nvidia-smi-q-health.recorded.txt");
        let gpu = &parse_nvidia_smi_q(&raw).unwrap()[0];
        assert_eq!(gpu.aggregate_uncorrectable, 0);
        assert!(evaluate(CheckKind::MemoryErrors, &raw, &h100_node()).unwrap().passed);
    }

    #[test]
    fn a_pending_remap_or_volatile_error_fails_the_memory_check() {
        let raw = fixture("nvidia-smi-q.recorded.txt")
            .replace(
                "            DRAM Uncorrectable                         : 0\n        Aggregate",
                "            DRAM Uncorrectable                         : 2\n        Aggregate",
            )
            .replace(
                "        Pending                                        : No\n        Remapping",
                "        Pending                                        : Yes\n        Remapping",
            );
        let verdict = evaluate(CheckKind::MemoryErrors, &raw, &h100_node()).unwrap();
        assert!(!verdict.passed);
        assert_eq!(verdict.measured, Some(2.0));
        assert!(
            verdict.summary.contains("2 uncorrectable ECC errors") && verdict.summary.contains("pending"),
            "{}",
            verdict.summary
        );
    }

    #[test]
    fn dcgm_diag_pass_and_fail() {
        let pass = evaluate(CheckKind::GpuDiagnostics, &fixture("dcgmi-diag-r1-pass.json"), &h100_node()).unwrap();
        assert!(pass.passed, "{pass:?}");
        assert_eq!(parse_dcgm_diag(&fixture("dcgmi-diag-r1-pass.json")).unwrap().len(), 9 + 8);
        let fail =
            evaluate(CheckKind::GpuDiagnostics, &fixture("dcgmi-diag-r3-memory-fail.json"), &h100_node()).unwrap();
        assert!(!fail.passed);
        assert_eq!(fail.measured, Some(1.0));
        assert!(
            fail.summary.starts_with("1 failed; first: GPU Memory on GPU 3: Error using CUDA API"),
            "{}",
            fail.summary
        );
    }

    #[test]
    fn nccl_bandwidth_against_the_expected_figure() {
        let run = parse_all_reduce(&fixture("all_reduce_perf-8xH100-nvlink.txt")).unwrap();
        assert_eq!((run.ranks, run.largest_bytes, run.wrong), (8, 8_589_934_592, 0));
        assert!((run.peak_bus_bandwidth - 477.47).abs() < 1e-9);
        assert!((run.average_bus_bandwidth - 159.332).abs() < 1e-9);
        let good =
            evaluate(CheckKind::NcclBandwidth, &fixture("all_reduce_perf-8xH100-nvlink.txt"), &h100_node()).unwrap();
        assert!(good.passed, "{good:?}");
        assert_eq!(good.threshold, Some(450.0 * BANDWIDTH_TOLERANCE));
        let weak =
            evaluate(CheckKind::NcclBandwidth, &fixture("all_reduce_perf-8xH100-weak-link.txt"), &h100_node()).unwrap();
        assert!(!weak.passed);
        assert!(weak.summary.contains("needs 405.0"), "{}", weak.summary);
    }

    #[test]
    fn nccl_fails_when_a_gpu_is_missing_or_results_are_wrong() {
        let mut node = h100_node();
        node.gpus = 9;
        assert!(
            !evaluate(CheckKind::NcclBandwidth, &fixture("all_reduce_perf-8xH100-nvlink.txt"), &node).unwrap().passed
        );
        let wrong =
            fixture("all_reduce_perf-8xH100-nvlink.txt").replacen("       0     34.86", "       3     34.86", 1);
        assert_eq!(parse_all_reduce(&wrong).unwrap().wrong, 3);
        assert!(parse_all_reduce("# nThread 1\n").is_err());
    }

    #[test]
    fn ibstat_ports() {
        let ports = parse_ibstat(&fixture("ibstat-4xNDR.txt")).unwrap();
        assert_eq!(ports.len(), 5);
        assert_eq!(ports[4].link_layer, "Ethernet");
        assert!(evaluate(CheckKind::Infiniband, &fixture("ibstat-4xNDR.txt"), &h100_node()).unwrap().passed);
        let down = evaluate(CheckKind::Infiniband, &fixture("ibstat-port-down.txt"), &h100_node()).unwrap();
        assert!(!down.passed);
        assert_eq!(down.summary, "mlx5_2 port 1: Down/Polling at 10");
    }

    #[test]
    fn xid_79_is_fatal_and_13_is_not() {
        let events = parse_xid(&fixture("dmesg-xid.txt"));
        assert_eq!(events.iter().map(|e| e.code).collect::<Vec<_>>(), vec![13, 13, 79]);
        assert_eq!(events[2].pci, "0000:9a:00");
        let verdict = evaluate(CheckKind::XidEvents, &fixture("dmesg-xid.txt"), &h100_node()).unwrap();
        assert!(!verdict.passed);
        assert!(verdict.summary.contains("XID 79 on 0000:9a:00: GPU has fallen off the bus."), "{}", verdict.summary);
        assert!(evaluate(CheckKind::XidEvents, "", &h100_node()).unwrap().passed);
    }

    #[test]
    fn unreadable_outputs_are_refused_not_passed() {
        for kind in
            [CheckKind::GpuDiagnostics, CheckKind::MemoryErrors, CheckKind::NcclBandwidth, CheckKind::Infiniband]
        {
            assert!(
                matches!(evaluate(kind, "command not found", &h100_node()), Err(Refusal::InvalidCheckOutput(_))),
                "{kind:?}"
            );
        }
    }

    #[test]
    fn levels_and_site_overrides() {
        assert_eq!(checks_for(CheckLevel::Quick, 8, false).len(), 3);
        assert!(checks_for(CheckLevel::Medium, 8, true).contains(&CheckKind::NcclBandwidth));
        assert!(!checks_for(CheckLevel::Long, 1, false).contains(&CheckKind::NcclBandwidth));
        assert_eq!(CheckLevel::parse("medium"), Ok(CheckLevel::Medium));
        assert!(CheckLevel::parse("extreme").is_err());
        let mut table = BandwidthTable::default();
        table.set(Some("lab"), GpuModel::H100_80GB, Interconnect::Nvlink, 380.0);
        assert_eq!(table.expected("lab", GpuModel::H100_80GB, Interconnect::Nvlink), Some(380.0));
        assert_eq!(table.expected("dc1", GpuModel::H100_80GB, Interconnect::Nvlink), Some(450.0));
        assert_eq!(table.expected("dc1", GpuModel::L40S, Interconnect::Nvlink), None);
    }
}
