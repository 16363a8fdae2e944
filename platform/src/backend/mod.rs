//! Provisioning backends: one trait, several drivers. A backend runs one lifecycle step
//! for one workload; every step must be safe to repeat, because after a crash the
//! reconciler runs the interrupted step again.

pub mod baremetal;
pub mod kubernetes;
pub mod simulated;

use std::future::Future;
use std::pin::Pin;

use berth_domain::catalog::Offering;
use berth_domain::lifecycle::Step;
use berth_domain::placement::Shape;
use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Everything a backend needs to know about an environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub environment_id: String,
    pub name: String,
    pub offering: Offering,
    pub shape: Shape,
    pub image: Option<String>,
    pub command: Option<String>,
    pub units: Vec<PlacedUnit>,
    /// vCPUs and memory of the booked size (a backend's namespace quota holds exactly these).
    pub vcpus: u32,
    pub memory_gb: u32,
    /// The environment's window end (ms since the epoch): dedicated nodes say until when.
    pub ends_at: i64,
    /// Whose environment this is: namespaces, labels, access and isolation follow from it.
    pub tenant: TenantScope,
    /// MIG slices that other live environments hold on this workload's nodes. A node has
    /// one MIG layout, so a backend that sets it must keep theirs in it.
    pub mig_neighbours: Vec<PlacedUnit>,
}

/// The tenant an environment belongs to, as a backend needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantScope {
    /// `None` for platform staff's own environments.
    pub slug: Option<String>,
    pub isolation: Isolation,
    /// Active members and their tenant roles, for access to the environment's resources.
    pub members: Vec<(String, Role)>,
}

/// One reserved GPU or MIG slice, named as the backend knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacedUnit {
    pub site: String,
    pub node: String,
    pub gpu_index: i64,
    pub slice_start: i64,
    pub slice_size: i64,
    /// e.g. `3g.40gb`; `None` for a whole GPU.
    pub mig_profile: Option<String>,
}

/// How the owner reaches a ready environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Connection {
    pub url: String,
    /// e.g. "Token" or "API key"; shown with `secret`.
    pub secret_label: Option<String>,
    pub secret: Option<String>,
    /// A command that uses the connection, for copy and paste.
    pub example: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepOutput {
    pub detail: Option<String>,
    pub connection: Option<Connection>,
}

/// A step did not succeed; the message is operational and shown to the owner.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{0}")]
pub struct BackendError(pub String);

pub type StepFuture<'a> = Pin<Box<dyn Future<Output = Result<StepOutput, BackendError>> + Send + 'a>>;

pub trait Backend: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn run<'a>(&'a self, workload: &'a Workload, step: Step) -> StepFuture<'a>;
}
