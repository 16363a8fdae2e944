//! The simulated fleet's health checks and repairs. Each check prints what the real tool
//! prints (the layouts of `domain/fixtures/checks/`), so the simulation is judged by the
//! same parsers as a real node; tests inject failures per node and check.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use berth_domain::node_checks::{CheckKind, CheckLevel};

use super::super::CheckedNode;

/// Failures injected into the simulated fleet's checks.
#[derive(Debug, Default)]
pub(super) struct NodeFaults {
    /// (node, check) pairs that fail until a repair fixes the node.
    failing: HashSet<(String, CheckKind)>,
    /// Nodes whose repairs fix nothing (their failures stay).
    stubborn: HashSet<String>,
    /// (node, check) pairs that cannot run at all (the backend answers an error), as a
    /// Job the kubelet will not start where a tenant holds the GPUs.
    unrunnable: HashSet<(String, CheckKind)>,
    /// Repair commands run, per node, in order.
    pub(super) repairs: HashMap<String, Vec<String>>,
}

impl NodeFaults {
    pub(super) fn fail(&mut self, node: &str, kind: CheckKind) {
        self.failing.insert((node.to_owned(), kind));
    }

    pub(super) fn make_unrunnable(&mut self, node: &str, kind: CheckKind) {
        self.unrunnable.insert((node.to_owned(), kind));
    }

    pub(super) fn runs(&self, node: &str, kind: CheckKind) -> bool {
        !self.unrunnable.contains(&(node.to_owned(), kind))
    }

    pub(super) fn make_stubborn(&mut self, node: &str) {
        self.stubborn.insert(node.to_owned());
    }

    /// A repair on a node that is not stubborn fixes every injected failure of it.
    pub(super) fn repair(&mut self, node: &str, command: &str) {
        self.repairs.entry(node.to_owned()).or_default().push(command.to_owned());
        if !self.stubborn.contains(node) {
            self.failing.retain(|(n, _)| n != node);
        }
    }

    pub(super) fn fails(&self, node: &str, kind: CheckKind) -> bool {
        self.failing.contains(&(node.to_owned(), kind))
    }
}

/// What `kind` prints on `node`, failing when `fail`.
pub(super) fn output(node: &CheckedNode, kind: CheckKind, level: CheckLevel, fail: bool) -> String {
    match kind {
        CheckKind::GpuDiagnostics => dcgm_diag(node, level, fail),
        CheckKind::MemoryErrors => nvidia_smi_q(node, fail),
        CheckKind::XidEvents if fail => {
            "[90144.771630] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
                .to_owned()
        }
        CheckKind::XidEvents => String::new(),
        CheckKind::NcclBandwidth => all_reduce(node, fail),
        CheckKind::Infiniband => ibstat(node, fail),
    }
}

fn dcgm_diag(node: &CheckedNode, level: CheckLevel, fail: bool) -> String {
    let per_gpu = |failing: bool| -> serde_json::Value {
        (0..node.gpus)
            .map(|g| {
                if failing && g == 0 {
                    serde_json::json!({"gpu_ids": g.to_string(), "status": "Fail", "warnings": [{
                        "error_category": 6, "error_id": 28, "error_severity": 2,
                        "warning": "Error using CUDA API cudaMalloc for GPU 0 (simulated)"}]})
                } else {
                    serde_json::json!({"gpu_ids": g.to_string(), "status": "Pass"})
                }
            })
            .collect()
    };
    let mut categories = vec![
        serde_json::json!({"category": "Deployment", "tests": [{"name": "Denylist", "results": [{"status": "Pass"}]}]}),
        serde_json::json!({"category": "Integration", "tests": [{"name": "PCIe", "results": per_gpu(false)}]}),
    ];
    if level >= CheckLevel::Medium || fail {
        categories.push(
            serde_json::json!({"category": "Hardware", "tests": [{"name": "GPU Memory", "results": per_gpu(fail)}]}),
        );
    }
    serde_json::json!({"DCGM GPU Diagnostic": {"test_categories": categories, "version": "3.3.9"}}).to_string()
}

fn nvidia_smi_q(node: &CheckedNode, fail: bool) -> String {
    let mut out = String::from("\n==============NVSMI LOG==============\n\nAttached GPUs : ");
    let _ = writeln!(out, "{}", node.gpus);
    for g in 0..node.gpus {
        let bad = fail && g == 0;
        let _ = write!(
            out,
            "GPU 00000000:{:02X}:00.0\n    ECC Errors\n        Volatile\n            DRAM Correctable : 0\n            \
             DRAM Uncorrectable : {}\n        Aggregate\n            DRAM Correctable : 0\n            \
             DRAM Uncorrectable : {}\n    Remapped Rows\n        Correctable Error : 0\n        \
             Uncorrectable Error : {}\n        Pending : {}\n        Remapping Failure Occurred : No\n",
            0x18 + g * 0x10,
            u8::from(bad),
            u8::from(bad),
            u8::from(bad),
            if bad { "Yes" } else { "No" },
        );
    }
    out
}

fn all_reduce(node: &CheckedNode, fail: bool) -> String {
    let expected = node.expected_bus_bandwidth.unwrap_or(100.0);
    let peak = if fail { expected * 0.5 } else { expected * 1.04 };
    let mut out = format!(
        "# nThread 1 nGpus {g} minBytes 1048576 maxBytes 8589934592 step: 8(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0\n#\n# Using devices\n",
        g = node.gpus
    );
    for r in 0..node.gpus {
        let _ =
            writeln!(out, "#  Rank {r:2} Group  0 Pid  4242 on {:>10} device {r:2} [0x{:02x}] simulated", node.name, r);
    }
    out.push_str("#\n#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n");
    let factor = 2.0 * f64::from(node.gpus.saturating_sub(1)) / f64::from(node.gpus.max(1));
    let mut sum = 0.0;
    let sizes = [1u64 << 20, 1 << 23, 1 << 26, 1 << 29, 1 << 32, 1 << 33];
    for (i, size) in sizes.iter().enumerate() {
        // Bandwidth grows with the message size towards the peak.
        let bus = peak * (i + 1) as f64 / sizes.len() as f64;
        let alg = bus / factor.max(f64::MIN_POSITIVE);
        let time = *size as f64 / (alg * 1e3);
        let _ = writeln!(
            out,
            "{size:>12}  {count:>12}     float     sum      -1  {time:>8.1}  {alg:>6.2}  {bus:>6.2}       0  {time:>8.1}  {alg:>6.2}  {bus:>6.2}       0",
            count = size / 4
        );
        sum += 2.0 * bus;
    }
    let _ = write!(
        out,
        "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : {:.3} \n#\n",
        sum / (2 * sizes.len()) as f64
    );
    out
}

fn ibstat(node: &CheckedNode, fail: bool) -> String {
    let mut out = String::new();
    for ca in 0..4 {
        let down = fail && ca == 2;
        let _ = write!(
            out,
            "CA 'mlx5_{ca}'\n\tCA type: MT4129\n\tNumber of ports: 1\n\tPort 1:\n\t\tState: {}\n\t\tPhysical state: {}\n\t\tRate: {}\n\t\tLink layer: InfiniBand\n",
            if down { "Down" } else { "Active" },
            if down { "Polling" } else { "LinkUp" },
            if down { 10 } else { node.infiniband_rate },
        );
    }
    out
}
