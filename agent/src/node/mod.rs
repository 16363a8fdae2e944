//! What `berth agent` does to its node besides reporting: apply the plan the portal made
//! for it (`--backend baremetal`): MIG layout, tenant networks, dedicated clusters' SSH
//! accounts, workloads. Everything goes
//! through a command runner tests can replace; [`NodeHost`] is the whole of it, so the
//! agent loop can be tested against a served portal with a fake node.

pub mod access;
pub mod commands;
pub mod mig;
pub mod network;
pub mod workloads;

#[cfg(test)]
mod host_network_test;

use std::net::Ipv4Addr;
use std::sync::Arc;

use berth_domain::agent::Command;
use berth_domain::node_checks::{AgentOrder, CheckAnswer};
use berth_domain::node_plan::{NodePlan, WorkloadStatus};

use self::commands::CommandRunner;
use self::network::NodeNetwork;
use self::workloads::Runtime;
use crate::NodeError;

/// The node the agent runs on, as far as plans go.
pub trait NodeHost: Send + Sync {
    /// Brings the node to `plan`; each workload's status, or what stopped the node from
    /// getting there (a MIG layout or network that could not be set up).
    fn apply(&self, plan: &NodePlan) -> Result<Vec<WorkloadStatus>, NodeError>;
    /// The node's address on its underlay network, for the tenants' other nodes.
    fn underlay_address(&self) -> Option<Ipv4Addr>;
    /// Runs what the portal ordered (a health check, a GPU reset) with its own command
    /// (`NodeTask::command`, never a command line from the portal): what it printed, or
    /// why it could not run.
    fn run_order(&self, order: &AgentOrder) -> CheckAnswer;
}

/// This machine, through its `nvidia-smi`, `ip`, `bridge`, `nft` and container runtime.
pub struct Machine {
    runner: Arc<dyn CommandRunner>,
    /// `None` when the agent was started without `--underlay-interface`: tenant networks
    /// then cannot be set up here.
    network: Option<NodeNetwork>,
    runtime: Option<Runtime>,
    /// The groups dedicated clusters' accounts join (see `access::DEFAULT_GPU_GROUPS`).
    gpu_groups: Vec<String>,
}

impl Machine {
    pub fn new(runner: Arc<dyn CommandRunner>, network: Option<NodeNetwork>, runtime: Option<Runtime>) -> Machine {
        let gpu_groups = access::DEFAULT_GPU_GROUPS.map(str::to_owned).to_vec();
        Machine { runner, network, runtime, gpu_groups }
    }

    /// Dedicated clusters' accounts join `groups` (those the node has) instead.
    pub fn with_gpu_groups(self, groups: Vec<String>) -> Machine {
        Machine { gpu_groups: groups, ..self }
    }
}

impl NodeHost for Machine {
    fn apply(&self, plan: &NodePlan) -> Result<Vec<WorkloadStatus>, NodeError> {
        plan.validate().map_err(NodeError::InvalidPlan)?;
        // MIG first (workloads run on its instances), then the networks the workloads use.
        let changed = mig::apply(self.runner.as_ref(), &plan.mig)?;
        for change in changed {
            tracing::info!(%change, "MIG layout changed");
        }
        match &self.network {
            Some(node) => {
                for change in network::apply(self.runner.as_ref(), node, &plan.networks)? {
                    tracing::info!(change = ?change, "tenant network changed");
                }
            }
            None if plan.networks.is_empty() => {}
            None => return Err(NodeError::NoUnderlayInterface),
        }
        for change in access::apply(self.runner.as_ref(), &self.gpu_groups, &plan.accounts)? {
            tracing::info!(change = ?change, "SSH access changed");
        }
        workloads::apply(self.runner.as_ref(), self.runtime, &plan.workloads, &plan.networks)
    }

    fn underlay_address(&self) -> Option<Ipv4Addr> {
        self.network.as_ref().map(|n| n.underlay.address)
    }

    fn run_order(&self, order: &AgentOrder) -> CheckAnswer {
        match self.runner.run_check(&order.task.command(), order.task.time_limit()) {
            Ok(output) => CheckAnswer::printed(output),
            Err(error) => CheckAnswer::failed(error.to_string()),
        }
    }
}

/// The first IPv4 address of `interface`, from `ip -json -4 address show dev IFACE`.
pub fn interface_address(runner: &dyn CommandRunner, interface: &str) -> Result<Ipv4Addr, NodeError> {
    let text = runner
        .run(&Command::new("ip", &["-json", "-4", "address", "show", "dev", interface]))
        .map_err(|source| NodeError::CommandFailed { doing: format!("read {interface}'s address"), source })?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| NodeError::Unreadable { what: format!("{interface}'s address"), reason: e.to_string() })?;
    json.as_array()
        .into_iter()
        .flatten()
        .flat_map(|link| link["addr_info"].as_array().into_iter().flatten())
        .find_map(|a| a["local"].as_str().and_then(|a| a.parse().ok()))
        .ok_or_else(|| NodeError::NoUnderlayAddress(interface.to_owned()))
}

#[cfg(test)]
mod tests {
    use berth_domain::host_network::{TenantAttachment, TenantSegment, Underlay};

    use super::*;
    use crate::node::commands::recording::Recording;

    #[test]
    fn networks_without_an_underlay_interface_are_refused_by_name() {
        let machine = Machine::new(Arc::new(Recording::default()), None, None);
        let plan = NodePlan {
            generation: 1,
            networks: vec![TenantAttachment {
                tenant: "acme".into(),
                segment: TenantSegment::Vlan(100),
                address: Ipv4Addr::new(100, 65, 144, 1),
                peers: vec![],
            }],
            ..NodePlan::default()
        };
        let error = machine.apply(&plan).expect_err("no underlay");
        assert_eq!(error, NodeError::NoUnderlayInterface);
        assert!(error.to_string().ends_with("but its agent runs without --underlay-interface"), "{error}");
        assert_eq!(machine.apply(&NodePlan::default()), Ok(Vec::new()));
        let network = NodeNetwork {
            underlay: Underlay { interface: "eth0".into(), address: Ipv4Addr::new(10, 0, 0, 1) },
            management: vec![],
        };
        let machine = Machine::new(Arc::new(Recording::default()), Some(network), None);
        assert_eq!(machine.underlay_address(), Some(Ipv4Addr::new(10, 0, 0, 1)));
    }

    #[test]
    fn a_check_runs_its_own_command_and_answers_with_what_it_printed() {
        use berth_domain::node_checks::{CheckKind, CheckLevel, NodeTask};

        let node = Arc::new(Recording::default());
        let diag = include_str!("../../../domain/fixtures/checks/dcgmi-diag-r1-pass.json");
        node.answer("dcgmi diag -r 1 -j", diag);
        node.fail("ibstat", commands::Failure::NotInstalled { program: "ibstat".into() });
        let machine = Machine::new(node.clone(), None, None);
        let order = |kind, level| AgentOrder { id: 1, task: NodeTask::Check { kind, level, gpus: 8 } };
        assert_eq!(
            machine.run_order(&order(CheckKind::GpuDiagnostics, CheckLevel::Quick)),
            CheckAnswer::printed(diag.into())
        );
        assert_eq!(
            machine.run_order(&order(CheckKind::Infiniband, CheckLevel::Quick)),
            CheckAnswer::failed("ibstat is not installed on this node".into())
        );
        machine.run_order(&order(CheckKind::NcclBandwidth, CheckLevel::Medium));
        machine.run_order(&AgentOrder { id: 2, task: NodeTask::ResetGpu { gpu: 5 } });
        assert_eq!(
            node.take(),
            ["dcgmi diag -r 1 -j", "ibstat ", "all_reduce_perf -b 8 -e 8G -f 2 -g 8", "nvidia-smi -i 5 -r"],
            "each order's own command, nothing else"
        );
    }

    #[test]
    fn the_underlay_address_is_read_from_the_interface() {
        let node = Recording::default();
        node.answer(
            "ip -json -4 address show dev eth0",
            r#"[{"ifname":"eth0","addr_info":[{"family":"inet","local":"10.0.0.7","prefixlen":24}]}]"#,
        );
        assert_eq!(interface_address(&node, "eth0"), Ok(Ipv4Addr::new(10, 0, 0, 7)));
        node.answer("ip -json -4 address show dev eth0", "[]");
        let error = interface_address(&node, "eth0").expect_err("no address");
        assert_eq!(error.to_string(), "eth0 has no IPv4 address; give --underlay-address");
    }
}
