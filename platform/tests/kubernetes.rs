//! The Kubernetes backend against a mock API server: the exact requests of every step of
//! every offering, golden manifests, the tenant-namespace security checklist, full
//! provision/teardown, a second pass over a converged environment, crashes after each
//! step, MIG layouts shared with neighbours (and kept in the mig-parted ConfigMap only
//! while needed), tenants' Kueue ClusterQueues, soft tenants' namespaces shared by their
//! environments, the orphan sweep, volumes that outlive their environments (a soft
//! tenant's claim kept in its namespace, a hard tenant's PersistentVolume bound to the next
//! one), and volumes' use from the kubelets' stats summaries.
#![allow(clippy::expect_used, clippy::unwrap_used)] // a failed expectation stops the test with its message

mod common;
mod kubernetes_api;

#[path = "kubernetes/checklist.rs"]
mod checklist;
#[path = "kubernetes/cluster_queues.rs"]
mod cluster_queues;
#[path = "kubernetes/dcgm.rs"]
mod dcgm;
#[path = "kubernetes/dedicated_nodes.rs"]
mod dedicated_nodes;
#[path = "kubernetes/golden.rs"]
mod golden;
#[path = "kubernetes/lifecycles.rs"]
mod lifecycles;
#[path = "kubernetes/node_checks.rs"]
mod node_checks;
#[path = "kubernetes/orphans.rs"]
mod orphans;
#[path = "kubernetes/reaching.rs"]
mod reaching;
#[path = "kubernetes/scenarios.rs"]
mod scenarios;
#[path = "kubernetes/soft_tenants.rs"]
mod soft_tenants;
#[path = "kubernetes/support.rs"]
mod support;
#[path = "kubernetes/volume_use.rs"]
mod volume_use;
#[path = "kubernetes/volumes.rs"]
mod volumes;
