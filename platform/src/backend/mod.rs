//! Provisioning backends: one trait, several drivers. A backend runs one lifecycle step
//! for one workload; every step must be safe to repeat, because after a crash the
//! reconciler runs the interrupted step again.

pub mod kubernetes;
pub mod simulated;

use std::collections::HashSet;
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
    /// The environment that holds it (a neighbour's, among `mig_neighbours`).
    pub environment_id: String,
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
pub type OwnedFuture<'a> = Pin<Box<dyn Future<Output = Result<Vec<OwnedObject>, BackendError>> + Send + 'a>>;
pub type RemoveFuture<'a> = Pin<Box<dyn Future<Output = Result<bool, BackendError>> + Send + 'a>>;

/// Something a backend made for environments, as the orphan sweep finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedObject {
    /// What it is to the backend, e.g. `Namespace`, `Node`, `workload`.
    pub kind: &'static str,
    pub name: String,
    /// The environments that explain it: one, or several for what neighbours share (a
    /// node's MIG layout holds the slices of every environment on the node).
    pub environments: Vec<String>,
}

impl OwnedObject {
    /// No live environment explains it (an object naming none is never explained).
    pub fn is_orphan(&self, live: &HashSet<String>) -> bool {
        !self.environments.iter().any(|e| live.contains(e))
    }
}

/// The objects of `owned` that no live environment explains.
pub fn orphans(owned: &[OwnedObject], live: &HashSet<String>) -> Vec<OwnedObject> {
    owned.iter().filter(|o| o.is_orphan(live)).cloned().collect()
}

pub trait Backend: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn run<'a>(&'a self, workload: &'a Workload, step: Step) -> StepFuture<'a>;

    /// Everything the backend made for environments and still holds, each with the
    /// environments it belongs to. Listing changes nothing.
    fn owned_objects(&self) -> OwnedFuture<'_>;

    /// Removes one object a sweep found orphaned; `false` when there was nothing to do
    /// (already gone, or changed since it was listed, which the next sweep looks at
    /// again). Safe to repeat.
    fn remove_owned<'a>(&'a self, object: &'a OwnedObject) -> RemoveFuture<'a>;
}
