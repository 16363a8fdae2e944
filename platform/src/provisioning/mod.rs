//! Provisioning: turning a placed booking into a running workload and back. The reconciler
//! (`reconciler`) walks each environment's steps on a backend (`backend`: Kubernetes,
//! bare metal, simulated), from the one description of what to run (`workloads`); the
//! environment page's journal (`journal`); reaching a ready environment (`connect`,
//! `environment_sessions`), training-job logs (`jobs`), endpoint replicas (`replicas`),
//! node agents and their plans (`node_agents`, `node_plans`), volumes' storage on the
//! backend (`volume_storage`), nodes' health lifecycle with its checks and repairs (`node_health`) and each tenant's queue on the
//! backend (`tenant_queues`).
//!
//! Uses the root and capacity (environments, reservations, quotas); nothing of tenancy or
//! identity, which call into it when people or tenants change (node access plans,
//! sessions on environments' origins).

pub mod backend;
pub mod cluster_nodes;
pub mod connect;
pub mod environment_sessions;
pub mod idle;
pub(crate) mod jobs;
pub mod journal;
pub mod node_agents;
mod node_check_runs;
pub mod node_health;
pub mod node_orders;
pub mod node_plans;
pub mod reconciler;
pub mod replicas;
pub(crate) mod running_changes;
pub mod telemetry;
pub(crate) mod tenant_queues;
pub(crate) mod volume_storage;
pub(crate) mod workloads;
