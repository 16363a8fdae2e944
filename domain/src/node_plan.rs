//! What the portal asks of a bare-metal node (`GET /api/v1/agent/plan`) and what the
//! node's agent answers (`POST /api/v1/agent/plan`).
//!
//! The portal keeps one [`NodePlan`] per node; every change bumps its generation. The agent
//! applies the whole plan (MIG layout, tenant networks, workloads), each part idempotently,
//! and reports the generation it applied or why it could not: that report is what the
//! bare-metal backend's steps wait for.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::Refusal;
use crate::catalog::Offering;
use crate::host_network::{TenantAttachment, TenantSegment, is_host_of};
use crate::mig::{MigInstance, MigLayout};
use crate::node_access::{self, NodeAccount};

/// Everything the node should hold now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePlan {
    /// Grows with every change; 0 is the empty plan of a node nothing was ever planned on.
    pub generation: i64,
    /// The node's GPUs that hold MIG slices, each with exactly the instances it should
    /// have. Every other GPU of the node runs without MIG.
    pub mig: Vec<GpuMig>,
    /// The hard and hybrid tenants attached to the node.
    pub networks: Vec<TenantAttachment>,
    pub workloads: Vec<NodeWorkload>,
    /// Dedicated clusters' local accounts with their people's SSH keys (older plans
    /// have none).
    #[serde(default)]
    pub accounts: Vec<NodeAccount>,
}

/// One GPU's MIG instances.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuMig {
    pub gpu: u32,
    pub instances: Vec<MigInstance>,
}

/// A GPU or MIG slice a workload runs on, as the node's driver numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Device {
    Gpu(u32),
    Mig { gpu: u32, instance: MigInstance },
}

/// One environment's container on the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeWorkload {
    pub environment_id: String,
    pub offering: Offering,
    pub image: String,
    pub command: Option<String>,
    /// This node's share of the environment's GPUs and slices.
    pub devices: Vec<Device>,
    /// `false`: only pull the image (the pull step); `true`: keep it running.
    pub run: bool,
    /// Where the node publishes the notebook's or endpoint's port.
    pub host_port: Option<u16>,
    /// The notebook token or endpoint API key, handed to the container.
    pub secret: Option<String>,
    /// The booked size's CPUs and memory: the container's limits.
    pub vcpus: u32,
    pub memory_gb: u32,
    /// A hard or hybrid tenant's container also sits on its tenant's network (older plans
    /// have none).
    #[serde(default)]
    pub network: Option<ContainerNetwork>,
    /// Berth volumes bind-mounted into the container from the shared filesystem every
    /// node mounts (older plans have none).
    #[serde(default)]
    pub volumes: Vec<NodeVolume>,
    /// An inference endpoint's model server arguments (after the image) and variables
    /// (`Serving::container_args`/`container_env`; older plans have none).
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: Vec<crate::serving::EnvVar>,
}

/// A volume's directory on the shared filesystem and where the container sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeVolume {
    /// An absolute path on the node, e.g. `/mnt/berth-volumes/berth-vol-7`.
    pub host_path: String,
    /// An absolute path in the container, e.g. `/home/jovyan/work`.
    pub mount_path: String,
}

impl NodeVolume {
    /// The runtime's `--volume` value, `host:container`; `None` for a path that is not
    /// absolute, climbs (`..`) or holds a `:` or a control character, which no plan of
    /// Berth's makes and the agent refuses to mount.
    pub fn bind(&self) -> Option<String> {
        let plain = |p: &str| {
            p.starts_with('/')
                && !p.split('/').any(|part| part == "..")
                && !p.contains(':')
                && !p.chars().any(char::is_control)
        };
        (plain(&self.host_path) && plain(&self.mount_path)).then(|| format!("{}:{}", self.host_path, self.mount_path))
    }
}

/// A container's place on its tenant's network: the tenant and its segment (whose bridge
/// the node holds, see [`NodePlan::networks`]) and its own address there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerNetwork {
    pub tenant: String,
    pub segment: TenantSegment,
    pub address: Ipv4Addr,
}

impl NodeWorkload {
    /// The container's name on the node: Berth owns every container named `berth-…`.
    pub fn container_name(&self) -> String {
        container_name(&self.environment_id)
    }
}

pub fn container_name(environment_id: &str) -> String {
    format!("{CONTAINER_PREFIX}{environment_id}")
}

/// The port the container serves on: a notebook's Jupyter, an endpoint's API.
pub fn container_port(offering: Offering) -> Option<u16> {
    match offering {
        Offering::Notebook => Some(8888),
        Offering::InferenceEndpoint => Some(8000),
        Offering::TrainingJob | Offering::DedicatedCluster => None,
    }
}

/// Containers Berth starts are named with this prefix, and only those are stopped by it.
pub const CONTAINER_PREFIX: &str = "berth-";

/// Host ports the node publishes workloads on, one per workload on the node.
pub const HOST_PORTS: std::ops::RangeInclusive<u16> = 30_000..=30_999;

/// The lowest host port no other workload of the node uses.
pub fn free_host_port(taken: &[u16]) -> Option<u16> {
    HOST_PORTS.into_iter().find(|p| !taken.contains(p))
}

/// How a workload is doing on the node, as the agent last saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadState {
    /// The image is on the node; no container runs (the pull step's goal).
    Pulled,
    Running,
    /// The container ended; a training job that ended with 0 finished its work.
    Exited,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadStatus {
    pub environment_id: String,
    /// `None` until the image is on the node.
    pub state: Option<WorkloadState>,
    #[serde(default)]
    pub exit_code: Option<i64>,
    /// Why the agent could not pull or start it; one workload's trouble is not the node's.
    #[serde(default)]
    pub error: Option<String>,
    /// A training job's last log lines, oldest first (the portal keeps them after the job).
    #[serde(default)]
    pub log_tail: Vec<String>,
}

/// How many of a job's last log lines an agent reports, and how long each may be.
pub const LOG_TAIL_LINES: usize = 200;
pub const MAX_LOG_LINE: usize = 1000;

/// The agent's answer after applying (or failing to apply) a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanReport {
    /// The generation the agent worked on.
    pub generation: i64,
    /// `None`: the whole plan is applied. Otherwise what stopped it, for the owner.
    #[serde(default)]
    pub error: Option<String>,
    /// The node's underlay address, which the tenants' other nodes tunnel to.
    #[serde(default)]
    pub underlay_address: Option<Ipv4Addr>,
    #[serde(default)]
    pub workloads: Vec<WorkloadStatus>,
}

/// The longest error the portal keeps from an agent.
pub const MAX_REPORTED_ERROR: usize = 1000;

impl PlanReport {
    /// Refuses a report the portal should not store.
    pub fn validate(&self) -> Result<(), Refusal> {
        if self.generation < 0 {
            return Err(Refusal::InvalidReport("the generation is negative".into()));
        }
        if self.error.as_ref().is_some_and(|e| e.trim().is_empty()) {
            return Err(Refusal::InvalidReport("an error must say what went wrong".into()));
        }
        if self.workloads.len() > 256 || self.workloads.iter().any(|w| w.environment_id.len() > 64) {
            return Err(Refusal::InvalidReport("too many or malformed workloads".into()));
        }
        Ok(())
    }

    /// The report with every message cut to what the portal keeps.
    pub fn trimmed(&self) -> PlanReport {
        let cut = |e: &Option<String>| e.as_ref().map(|e| e.chars().take(MAX_REPORTED_ERROR).collect());
        PlanReport {
            error: cut(&self.error),
            workloads: self
                .workloads
                .iter()
                .map(|w| WorkloadStatus { error: cut(&w.error), log_tail: tail_of(&w.log_tail), ..w.clone() })
                .collect(),
            ..self.clone()
        }
    }
}

/// How much of a training job's log the portal keeps when it ends and offers as a download:
/// its last lines, at most this many and this many bytes (the page shows the last
/// `LOG_TAIL_LINES`). Bare metal's agents report `LOG_TAIL_LINES` only.
pub const KEPT_LOG_LINES: usize = 10_000;
pub const KEPT_LOG_BYTES: usize = 1 << 20;

/// The last of `lines` within [`KEPT_LOG_LINES`] and [`KEPT_LOG_BYTES`] (a line and its
/// newline count), oldest first.
pub fn kept_log(mut lines: Vec<String>) -> Vec<String> {
    let mut bytes = 0;
    let mut keep = 0;
    for line in lines.iter().rev().take(KEPT_LOG_LINES) {
        if bytes + line.len() + 1 > KEPT_LOG_BYTES {
            break;
        }
        bytes += line.len() + 1;
        keep += 1;
    }
    lines.drain(..lines.len() - keep);
    lines
}

/// The last `LOG_TAIL_LINES` lines, each cut to `MAX_LOG_LINE` characters.
pub fn tail_of(lines: &[String]) -> Vec<String> {
    let skip = lines.len().saturating_sub(LOG_TAIL_LINES);
    lines[skip..].iter().map(|l| l.chars().take(MAX_LOG_LINE).collect()).collect()
}

impl NodePlan {
    /// Refuses a plan whose MIG layouts could not exist (two instances sharing memory
    /// slices, a GPU listed twice), whose containers are on a tenant network the node does
    /// not hold, or whose accounts are not Berth's to make: the agent checks before it
    /// touches the node.
    pub fn validate(&self) -> Result<(), Refusal> {
        let mut seen = Vec::new();
        for gpu in &self.mig {
            if seen.contains(&gpu.gpu) {
                return Err(Refusal::InvalidReport(format!("GPU {} has two MIG layouts", gpu.gpu)));
            }
            seen.push(gpu.gpu);
            MigLayout::new(gpu.instances.clone())
                .validate()
                .map_err(|e| Refusal::InvalidReport(format!("MIG layout of GPU {}: {e}", gpu.gpu)))?;
        }
        for w in &self.workloads {
            let Some(network) = &w.network else { continue };
            let attached = self.networks.iter().find(|a| a.segment == network.segment);
            if attached.is_none_or(|a| a.address == network.address) || !is_host_of(network.segment, network.address) {
                return Err(Refusal::InvalidReport(format!(
                    "the container of {} is on {} at {}, which the node does not hold or is not a container's address",
                    w.environment_id,
                    network.segment.describe(),
                    network.address
                )));
            }
        }
        node_access::validate(&self.accounts)
    }

    /// The plan without its generation, to tell whether a change changes anything.
    pub fn content_equals(&self, other: &NodePlan) -> bool {
        NodePlan { generation: 0, ..self.clone() } == NodePlan { generation: 0, ..other.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_log_is_its_last_lines_within_both_bounds() {
        let lines: Vec<String> = (0..KEPT_LOG_LINES + 5).map(|n| format!("line {n}")).collect();
        let kept = kept_log(lines);
        assert_eq!(kept.len(), KEPT_LOG_LINES);
        assert_eq!(kept.last().map(String::as_str), Some("line 10004"));
        let long: Vec<String> = (0..40).map(|n| format!("{n:>65535}")).collect();
        let kept = kept_log(long);
        assert_eq!(kept.len(), 16, "16 lines of 64 KiB each make 1 MiB");
        assert!(kept.last().is_some_and(|l| l.trim() == "39"));
        assert!(kept_log(Vec::new()).is_empty());
    }
    use crate::mig::MigProfile;

    #[test]
    fn a_volume_binds_only_plain_absolute_paths() {
        let volume = |host: &str, mount: &str| NodeVolume { host_path: host.into(), mount_path: mount.into() };
        assert_eq!(
            volume("/mnt/berth/berth-vol-7", "/home/jovyan/work").bind().as_deref(),
            Some("/mnt/berth/berth-vol-7:/home/jovyan/work")
        );
        for (host, mount) in [
            ("mnt/x", "/data/x"),
            ("/mnt/../etc", "/data/x"),
            ("/mnt/x", "/data/x:ro"),
            ("/mnt/x", "data/x"),
            ("/mnt/x\n", "/data/x"),
        ] {
            assert_eq!(volume(host, mount).bind(), None, "{host} {mount}");
        }
    }

    #[test]
    fn plans_with_impossible_layouts_are_refused() {
        let g3 = |start| MigInstance { profile: MigProfile::G3, start };
        let fine = NodePlan { mig: vec![GpuMig { gpu: 0, instances: vec![g3(0), g3(4)] }], ..NodePlan::default() };
        assert_eq!(fine.validate(), Ok(()));
        let overlap = NodePlan { mig: vec![GpuMig { gpu: 0, instances: vec![g3(0), g3(0)] }], ..NodePlan::default() };
        assert!(overlap.validate().is_err());
        let twice = NodePlan { mig: [fine.mig.clone(), fine.mig.clone()].concat(), ..NodePlan::default() };
        assert!(twice.validate().is_err());
    }

    #[test]
    fn host_ports_are_handed_out_lowest_first() {
        assert_eq!(free_host_port(&[]), Some(30_000));
        assert_eq!(free_host_port(&[30_000, 30_002]), Some(30_001));
        let all: Vec<u16> = HOST_PORTS.collect();
        assert_eq!(free_host_port(&all), None);
    }

    #[test]
    fn a_report_reads_as_older_agents_write_it() {
        let report: PlanReport = serde_json::from_str(r#"{"generation": 3}"#).expect("report");
        assert_eq!(report, PlanReport { generation: 3, error: None, underlay_address: None, workloads: vec![] });
        assert!(PlanReport { error: Some(" ".into()), ..report.clone() }.validate().is_err());
        let long = PlanReport { error: Some("x".repeat(5000)), ..report };
        assert_eq!(long.trimmed().error.map(|e| e.len()), Some(MAX_REPORTED_ERROR));
    }
}
