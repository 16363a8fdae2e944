//! Berth's pure rules: no I/O, no async, compiles to wasm so the UI can share them.
//!
//! - [`gpu`]: the GPU models Berth knows.
//! - [`agent`]: what a node's agent reports, and the GPU health it leads to.
//! - [`mig`]: MIG slice geometry (profiles, placements, layout validity).
//! - [`catalog`]: what users can launch, in which sizes, at what price.
//! - [`fabric`]: fabric isolation identifiers for hard tenants, their pools and quarantine,
//!   InfiniBand port GUIDs and the OpenSM partitions.conf fragment.
//! - [`host_network`]: a bare-metal node's tenant networks (VXLAN/VLAN devices, bridges,
//!   nftables isolation) and the changes that bring a node to them.
//! - [`node_plan`]: what the portal asks of a bare-metal node's agent, and its answer.
//! - [`node_access`]: a dedicated cluster's local account on its nodes, with the SSH keys
//!   of the people who may act in it.
//! - [`ssh_key`]: the OpenSSH public keys people keep on their account.
//! - [`fleet`]: the fleet description file an operator writes.
//! - [`outbound`]: which addresses a URL that a tenant chose may make Berth reach.
//! - [`placement`]: choosing concrete GPUs and MIG slices for a size.
//! - [`booking`]: windows in time, availability over time, earliest fits and quotas.
//! - [`replay`]: the GPU-sharing replay of a production trace (fractional and whole GPUs on nodes with CPU and memory) and the policies it compares; not what places bookings.
//! - [`launch`]: validating a launch request before anything is written.
//! - [`lifecycle`]: the environment state machine and its step plans.
//! - [`metering`]: what a booking is charged for, money in exact units, months, budgets.
//! - [`volume`]: volumes that outlive a booking: names, sizes, mount paths, who may attach
//!   what, storage quotas.
//! - [`redirect`]: where a `next` parameter may send a browser (only this origin).

pub mod agent;
pub mod booking;
pub mod calendar;
pub mod catalog;
#[cfg(feature = "dcgm")]
pub mod dcgm;
pub mod fabric;
pub mod fleet;
pub mod gpu;
pub mod host_network;
pub mod idle;
pub mod image;
pub mod launch;
pub mod lifecycle;
pub mod metering;
pub mod mig;
pub mod node_access;
pub mod node_checks;
pub mod node_health;
pub mod node_plan;
pub mod notification;
pub mod outbound;
pub mod placement;
pub mod policy;
pub mod rates;
pub mod redirect;
mod refusal;
pub mod replay;
pub mod serving;
pub mod ssh_key;
pub mod telemetry;
pub mod tenancy;
pub mod volume;

pub use refusal::{Refusal, SignInProblem};
