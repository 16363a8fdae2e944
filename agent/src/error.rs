//! The agent's errors, in two enums: [`Error`] for what stops the agent from talking to
//! the portal, reading its GPUs or starting, and [`NodeError`] for what stops its node
//! from reaching a plan. Their texts are for operators: the agent logs them, and a
//! `NodeError` reaches the portal as the plan's error and becomes the failed step's words.

use berth_domain::Refusal;
use berth_domain::mig::MigInstance;
use nvml_wrapper::error::NvmlError;

use crate::node::commands::CommandError;

/// Why the agent could not report, fetch or answer its node's plan, or start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("--portal must be the portal's URL, e.g. https://berth.example.com (got {0})")]
    PortalUrl(String),
    #[error("cannot set up the HTTP client: {0}")]
    HttpClient(#[source] reqwest::Error),
    #[error("cannot reach the portal at {url}: {source}")]
    Unreachable { url: String, source: reqwest::Error },
    #[error("the portal's answer broke off: {0}")]
    AnswerBrokeOff(#[source] reqwest::Error),
    /// The portal answered with an error; `what` is "the report" or "the plan", `message`
    /// the portal's own words.
    #[error("the portal refused {what} ({status}): {message}")]
    Refused { what: &'static str, status: reqwest::StatusCode, message: String },
    #[error("cannot read the portal's plan: {0}")]
    UnreadablePlan(#[source] serde_json::Error),
    #[error("cannot read the portal's check orders: {0}")]
    UnreadableChecks(#[source] serde_json::Error),
    /// `what` is "the report" or "the plan report".
    #[error("cannot encode {what}: {source}")]
    Encode { what: &'static str, source: serde_json::Error },
    /// The blocking task (NVML, the plan's commands) panicked or was cancelled; `what` is
    /// "reading the GPUs" or "applying the plan".
    #[error("{what} stopped: {source}")]
    Stopped { what: &'static str, source: tokio::task::JoinError },
    /// NVML started but cannot read the GPUs (the driver is gone). A sick GPU is not
    /// this: it is a reading.
    #[error("NVML cannot count the GPUs: {0}")]
    Nvml(#[source] NvmlError),
    /// The node cannot be set up for plans as its flags say (at start-up).
    #[error(transparent)]
    Node(#[from] NodeError),
}

/// Why the node could not be brought to its plan, or set up for plans.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    /// The plan breaks the domain's rules; nothing was run.
    #[error("the plan cannot be applied: {0}")]
    InvalidPlan(Refusal),
    /// The domain refused the node's networks or accounts as planned (an address outside
    /// its segment, an account name taken by someone else's account); nothing was run.
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("tenant networks are planned for this node, but its agent runs without --underlay-interface")]
    NoUnderlayInterface,
    /// The interface has no IPv4 address to take for the underlay's.
    #[error("{0} has no IPv4 address; give --underlay-address")]
    NoUnderlayAddress(String),
    #[error("--container-runtime must be auto, podman or docker, not \"{0}\"")]
    UnknownRuntime(String),
    #[error("no container runtime on this node: install podman or docker with the NVIDIA Container Toolkit")]
    NoContainerRuntime,
    #[error("nvidia-smi is not installed on this node: MIG layouts and GPU workloads need the NVIDIA driver")]
    NoNvidiaSmi,
    /// A program tenant networks need (`ip`, `bridge`, `nft`) is missing.
    #[error(
        "{0} is not installed on this node; tenant networks need iproute2 and nftables \
         (Debian and Ubuntu: apt-get install iproute2 nftables)"
    )]
    NoNetworkTool(String),
    /// A program dedicated clusters' accounts need is missing.
    #[error(
        "{0} is not installed on this node; SSH access to dedicated clusters needs useradd, \
         usermod, userdel (passwd), runuser (util-linux) and pkill (procps)"
    )]
    NoAccountTool(String),
    /// A command failed (or its program is missing), in its own words.
    #[error(transparent)]
    Command(#[from] CommandError),
    /// A command failed while the agent was doing `doing` ("set up SSH access", "pull
    /// IMAGE").
    #[error("cannot {doing}: {source}")]
    CommandFailed { doing: String, source: CommandError },
    /// A command's answer is not what the agent can read: `what` names it, `reason` says
    /// why.
    #[error("cannot read {what}: {reason}")]
    Unreadable { what: String, reason: String },
    /// A line of `nvidia-smi`'s the agent cannot read.
    #[error("nvidia-smi said \"{0}\"")]
    NvidiaSmiSaid(String),
    /// The plan lays out MIG on a GPU `nvidia-smi` does not list.
    #[error("GPU {gpu} is not on this node (nvidia-smi lists {listed:?})")]
    GpuNotListed { gpu: u32, listed: Vec<u32> },
    #[error("GPU {0} does not support MIG")]
    NoMigSupport(u32),
    #[error("MIG mode on GPU {0} is pending: the GPU is in use or needs a reset (nvidia-smi -i {0} -r)")]
    MigPending(u32),
    /// A workload is given a GPU the node does not have.
    #[error("GPU {0} is not on this node")]
    UnknownGpu(u32),
    #[error("GPU {gpu} has no MIG instance {instance}")]
    NoMigInstance { gpu: u32, instance: MigInstance },
    #[error("MIG instance {instance} on GPU {gpu} has no compute instance")]
    NoComputeInstance { gpu: u32, instance: MigInstance },
    #[error("nvidia-smi -L lists no MIG device {dev} on GPU {gpu}")]
    NoMigDevice { gpu: u32, dev: u32 },
}
