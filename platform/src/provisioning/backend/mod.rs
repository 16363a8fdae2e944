//! Provisioning backends: one trait, several drivers. A backend runs one lifecycle step
//! for one workload; every step must be safe to repeat, because after a crash the
//! reconciler runs the interrupted step again.

pub mod baremetal;
pub mod kubernetes;
pub mod simulated;
pub mod volume_quotas;

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;

use berth_domain::catalog::Offering;
use berth_domain::gpu::GpuModel;
use berth_domain::lifecycle::Step;
use berth_domain::node_checks::{CheckKind, CheckLevel};
use berth_domain::placement::Shape;
use berth_domain::policy::Role;
use berth_domain::telemetry::GpuReading;
use berth_domain::tenancy::Isolation;
use rand::Rng;
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
    /// An inference endpoint's model, arguments and variables (`Serving::container_args`
    /// and `container_env` are what the container gets).
    pub serving: berth_domain::serving::Serving,
    pub units: Vec<PlacedUnit>,
    /// vCPUs and memory of the booked size (a backend's namespace quota holds exactly these).
    pub vcpus: u32,
    pub memory_gb: u32,
    /// The environment's window end (ms since the epoch).
    pub ends_at: i64,
    /// Whose environment this is: namespaces, labels, access and isolation follow from it.
    pub tenant: TenantScope,
    /// MIG slices that other live environments hold on this workload's nodes. A node has
    /// one MIG layout, so a backend that sets it must keep theirs in it.
    pub mig_neighbours: Vec<PlacedUnit>,
    /// For a hard or hybrid tenant: what its other live environments hold on this
    /// workload's nodes. Such a node is dedicated to the tenant until the last of them
    /// leaves, so a backend marking it must keep theirs in the mark.
    pub tenant_neighbours: Vec<PlacedUnit>,
    /// For an environment that shares its tenant's space on the backend (Kubernetes: a
    /// soft tenant's notebooks, jobs and endpoints share the tenant's namespace): what the
    /// tenant's other environments there hold now, read from the database when the
    /// workload is built. The space's quota is theirs and this one's together.
    pub tenant_holdings: Vec<Holding>,
    /// The volumes attached to the environment, each with its mount path. They outlive
    /// the workload: a backend makes a volume's storage when it is first missing and never
    /// removes it with the environment (only [`Backend::remove_volume`] does).
    pub volumes: Vec<VolumeMount>,
    /// For an environment that shares its tenant's space: the sizes (GiB) of every live
    /// volume of the tenant, which all live in that space (Kubernetes: their claims count
    /// against the tenant namespace's quota).
    pub tenant_volumes: Vec<u32>,
}

/// What one live environment holds, as a space it shares with its tenant's other
/// environments must allow for (Kubernetes: the tenant namespace's ResourceQuota).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    pub environment_id: String,
    pub offering: Offering,
    pub shape: Shape,
    /// Per replica, as [`Workload::vcpus`] and [`Workload::memory_gb`].
    pub vcpus: u32,
    pub memory_gb: u32,
    /// Its unreleased units (every replica's).
    pub units: Vec<PlacedUnit>,
}

impl Holding {
    /// What `w` itself holds.
    pub fn of(w: &Workload) -> Holding {
        Holding {
            environment_id: w.environment_id.clone(),
            offering: w.offering,
            shape: w.shape,
            vcpus: w.vcpus,
            memory_gb: w.memory_gb,
            units: w.units.clone(),
        }
    }

    pub fn replicas(&self) -> u32 {
        replicas_of(self.offering, self.shape, self.units.len())
    }
}

/// What a soft tenant's environments share on the backend besides its queue (Kubernetes:
/// the tenant's namespace), as the tenant's sync keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantSpace {
    /// Active members and their tenant roles.
    pub members: Vec<(String, Role)>,
    /// What the tenant's environments in the space hold now.
    pub holdings: Vec<Holding>,
    /// The sizes (GiB) of the tenant's live volumes, kept in the space between bookings.
    pub volumes: Vec<u32>,
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

/// What a backend answers once an environment is ready: how its owner reaches it (kept
/// with the environment).
pub use crate::capacity::environments::Connection;
pub use crate::capacity::volumes::VolumeMount;

/// A deleted volume whose storage a backend is to remove.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredVolume {
    pub volume_id: i64,
    /// Where the backend said it keeps it ([`Backend::volume_location`]).
    pub location: String,
}

/// What a backend measured of one volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeUse {
    pub volume_id: i64,
    pub used_bytes: u64,
    /// The size of the filesystem the figure was taken on, where the backend reports one
    /// (the kubelet does): a claim on a shared export reports the whole export's use, which
    /// is then not the volume's (`domain::volume::own_use`). `None`: the volume's own files.
    pub capacity_bytes: Option<u64>,
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
pub type HoldFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;
pub type UseFuture<'a> = Pin<Box<dyn Future<Output = Option<u64>> + Send + 'a>>;
pub type VolumesUseFuture<'a> = Pin<Box<dyn Future<Output = Vec<VolumeUse>> + Send + 'a>>;
pub type ReadingsFuture<'a> = Pin<Box<dyn Future<Output = Result<Vec<GpuReading>, BackendError>> + Send + 'a>>;
pub type QueueFuture<'a> = Pin<Box<dyn Future<Output = Result<(), BackendError>> + Send + 'a>>;

/// Something a backend made for environments or a tenant, as the orphan sweep finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedObject {
    /// What it is to the backend, e.g. `Namespace`, `Node`, `workload`.
    pub kind: &'static str,
    pub name: String,
    /// The environments that explain it: one, or several for what neighbours share (a
    /// node's MIG layout holds the slices of every environment on the node).
    pub environments: Vec<String>,
    /// For what stands for a tenant rather than for environments (its queue mirroring
    /// its quota): the tenant's slug. Such an object is explained by the tenant alone.
    pub tenant: Option<String>,
}

impl OwnedObject {
    /// Something made for `environments`.
    pub fn for_environments(kind: &'static str, name: String, environments: Vec<String>) -> OwnedObject {
        OwnedObject { kind, name, environments, tenant: None }
    }

    /// Something made for tenant `slug` (its queue, its namespace).
    pub fn for_tenant(kind: &'static str, name: String, slug: String) -> OwnedObject {
        OwnedObject { kind, name, environments: Vec::new(), tenant: Some(slug) }
    }

    /// Something Berth labelled for an environment or else for a tenant; `None` when it
    /// names neither.
    pub fn by_labels(
        kind: &'static str,
        name: String,
        environment: Option<&String>,
        tenant: Option<&String>,
    ) -> Option<OwnedObject> {
        match (environment, tenant) {
            (Some(environment), _) => Some(OwnedObject::for_environments(kind, name, vec![environment.clone()])),
            (None, Some(tenant)) => Some(OwnedObject::for_tenant(kind, name, tenant.clone())),
            (None, None) => None,
        }
    }

    /// Nothing live explains it: none of its environments is live (an object naming none
    /// is never explained), or, for a tenant's object, the tenant is deleted.
    pub fn is_orphan(&self, live: &Live) -> bool {
        match &self.tenant {
            Some(slug) => !live.tenants.contains(slug),
            None => !self.environments.iter().any(|e| live.environments.contains(e)),
        }
    }
}

/// What the orphan sweep counts as live, read after the backend's listing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Live {
    /// Environments not yet released or failed.
    pub environments: HashSet<String>,
    /// Slugs of tenants not deleted (a tenant's slug is never given to another).
    pub tenants: HashSet<String>,
}

/// The objects of `owned` that nothing live explains.
pub fn orphans(owned: &[OwnedObject], live: &Live) -> Vec<OwnedObject> {
    owned.iter().filter(|o| o.is_orphan(live)).cloned().collect()
}

/// A tenant's GPU quota as a backend with a queueing system of its own mirrors it
/// (Kubernetes: the tenant's Kueue ClusterQueue): for each GPU model of the fleet, what
/// the tenant may hold of it at once and how the fleet offers it.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantQueue {
    pub slug: String,
    /// The tenant may book beyond its GPU limits in the spot tier (reclaimed when a
    /// guaranteed booking needs the capacity).
    pub spot: bool,
    /// In-service GPU nodes of the fleet.
    pub nodes: u32,
    /// One per GPU model the fleet holds, by model.
    pub models: Vec<ModelAllowance>,
    /// For a soft tenant: its shared space, applied with the queue (`None` for a hard or
    /// hybrid tenant, whose environments each have a space of their own).
    pub space: Option<TenantSpace>,
}

/// What a tenant may hold of one GPU model, and the fleet's GPUs of that model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelAllowance {
    pub model: GpuModel,
    /// GPU-equivalents the tenant may hold at once: its Berth limit for the model, or the
    /// fleet's capacity of the model when it has none (never more than that capacity).
    pub gpus: f64,
    /// In-service GPUs of the model that are not time-sliced (bookable whole).
    pub whole_gpus: u32,
    /// Those of them with MIG enabled (bookable as MIG slices).
    pub mig_gpus: u32,
    /// Time-sliced GPUs of the model: (ways, GPUs sliced that many ways).
    pub shared_gpus: Vec<(u8, u32)>,
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

    /// Whether `step` of `workload` writes node state that includes what the environment's
    /// neighbours there hold ([`Workload::mig_neighbours`], [`Workload::tenant_neighbours`]).
    /// The reconciler does such a step again while those neighbours change under it.
    fn writes_neighbours_state(&self, _workload: &Workload, _step: Step) -> bool {
        false
    }

    /// Whether the backend has a queueing system of its own that mirrors tenants' quotas
    /// (Kubernetes: Kueue). Without one there is nothing to mirror: Berth's booking alone
    /// holds the quota, and the two methods below are never called.
    fn has_tenant_queues(&self) -> bool {
        false
    }

    /// Makes the backend's queueing system mirror a tenant's quota (Kubernetes: the
    /// tenant's Kueue ClusterQueue). Safe to repeat.
    fn apply_tenant_queue<'a>(&'a self, queue: &'a TenantQueue) -> QueueFuture<'a> {
        let _ = queue;
        Box::pin(async { Ok(()) })
    }

    /// Where this backend keeps `volume` for `workload` (a directory, a claim), as shown
    /// on the volume's page and given back to [`Backend::remove_volume`]. Cheap: no call.
    fn volume_location(&self, workload: &Workload, volume: &VolumeMount) -> String {
        let _ = workload;
        volume.storage_name()
    }

    /// How a volume's size holds on this backend, in a sentence for the volumes page. The
    /// default is for storage that holds no size itself: what `volume_use` measures is
    /// checked at each attach (`domain::volume::check_within_size`).
    fn volume_size_rule(&self) -> &'static str {
        "A volume's size is held by measuring it: one found holding more than its size is not attached again until it is grown."
    }

    /// Whether this backend's storage holds each volume to its size once told the size (bare
    /// metal on XFS with project quotas). Without, [`Backend::hold_volume_size`] is never
    /// called.
    fn holds_volume_sizes(&self) -> bool {
        false
    }

    /// Holds a volume's storage to `size_gib`, making it where it is first missing; asked
    /// before a workload that mounts it starts and after it grows. Never fails: what cannot
    /// be done is logged, and that volume's size is held by measuring it.
    fn hold_volume_size<'a>(&'a self, volume: &'a StoredVolume, size_gib: u32) -> HoldFuture<'a> {
        let _ = (volume, size_gib);
        Box::pin(async {})
    }

    /// Removes a deleted volume's storage; `false` when there was none. Safe to repeat.
    /// The default is for a backend that makes no storage for volumes (bare metal today).
    fn remove_volume<'a>(&'a self, volume: &'a StoredVolume) -> RemoveFuture<'a> {
        let _ = volume;
        Box::pin(async { Ok(false) })
    }

    /// Bytes a volume holds now, where the backend can measure it (`None` where not).
    fn volume_use<'a>(&'a self, volume: &'a StoredVolume) -> UseFuture<'a> {
        let _ = volume;
        Box::pin(async { None })
    }

    /// What each of `volumes` holds now, where the backend can measure it; one left out
    /// keeps its last measurement. Never fails: what cannot be read is logged and left out.
    /// The default asks [`Backend::volume_use`] one volume after another; Kubernetes reads
    /// every node's kubelet once for all of them.
    fn volumes_use<'a>(&'a self, volumes: &'a [StoredVolume]) -> VolumesUseFuture<'a> {
        Box::pin(async move {
            let mut measured = Vec::new();
            for volume in volumes {
                if let Some(used_bytes) = self.volume_use(volume).await {
                    measured.push(VolumeUse { volume_id: volume.volume_id, used_bytes, capacity_bytes: None });
                }
            }
            measured
        })
    }

    /// Removes a deleted tenant's queue; `false` when there was none. Safe to repeat.
    fn remove_tenant_queue<'a>(&'a self, slug: &'a str) -> RemoveFuture<'a> {
        let _ = slug;
        Box::pin(async { Ok(false) })
    }

    /// GPU readings the backend collects itself since it was last asked (Kubernetes: the
    /// DCGM exporter's metrics; the simulated fleet: its made-up series). A bare-metal
    /// node's agent sends its readings with its reports instead, so the default is none.
    fn gpu_readings(&self) -> ReadingsFuture<'_> {
        Box::pin(async { Ok(Vec::new()) })
    }

    // What a ready environment offers its owner beyond the lifecycle steps. The defaults
    // say plainly that a backend does not support a part yet.

    /// Where the proxy reaches a ready notebook or inference endpoint. Called when a
    /// request arrives (the platform caches the answer briefly), so it should be cheap.
    fn upstream<'a>(&'a self, workload: &'a Workload) -> UpstreamFuture<'a> {
        let _ = workload;
        Box::pin(async {
            Err(BackendError("this backend cannot serve notebooks or endpoints through Berth yet".into()))
        })
    }

    /// The last `tail` lines of a training job's log, and its status.
    fn job_logs<'a>(&'a self, workload: &'a Workload, tail: usize) -> JobLogsFuture<'a> {
        let _ = (workload, tail);
        Box::pin(async { Err(BackendError("this backend cannot show training logs yet".into())) })
    }

    /// Whether [`Backend::run_check`] does anything: the platform refuses checks up front
    /// (writing nothing) on a backend that cannot run them.
    fn runs_node_checks(&self) -> bool {
        false
    }

    /// Whether [`Backend::run_repair`] does anything: where it does not, a repair tier
    /// with a command waits for a person to run it and mark the repair done or failed.
    fn runs_repair_commands(&self) -> bool {
        false
    }

    /// Runs one health check on a node and returns what its command printed (the
    /// platform judges it with `domain::node_checks::evaluate`); an error when the command
    /// could not be run at all.
    fn run_check<'a>(&'a self, node: &'a CheckedNode, kind: CheckKind, level: CheckLevel) -> CheckFuture<'a> {
        let _ = (node, kind, level);
        Box::pin(async { Err(BackendError("this backend cannot run node checks yet".into())) })
    }

    /// Runs a repair tier's operator-configured command for a node (a GPU reset, a
    /// Redfish call); the answer is its output.
    fn run_repair<'a>(&'a self, node: &'a CheckedNode, command: &'a str) -> CheckFuture<'a> {
        let _ = (node, command);
        Box::pin(async { Err(BackendError("this backend cannot run repair commands yet".into())) })
    }

    /// Whether [`Backend::reset_gpu`] does anything.
    fn resets_gpus(&self) -> bool {
        false
    }

    /// Resets one GPU of the node (`nvidia-smi -i <gpu> -r`), which nothing may be using;
    /// the answer is what the reset printed (`node_checks::reset_outcome` judges it).
    fn reset_gpu<'a>(&'a self, node: &'a CheckedNode, gpu: u32) -> CheckFuture<'a> {
        let _ = (node, gpu);
        Box::pin(async { Err(BackendError("this backend cannot reset a GPU yet".into())) })
    }

    /// Runs an inference endpoint at [`Workload::replicas`], on the workload's units.
    /// `dropped` are units the endpoint no longer uses (scaling down): once this returns,
    /// nothing runs on them any more and their capacity may be released. Safe to repeat.
    fn scale<'a>(&'a self, workload: &'a Workload, dropped: &'a [PlacedUnit]) -> ScaleFuture<'a> {
        let _ = (workload, dropped);
        Box::pin(async { Err(BackendError("this backend cannot change an endpoint's replicas yet".into())) })
    }

    /// Whether [`Backend::move_cluster`] can move a running dedicated cluster off a node.
    fn moves_clusters(&self) -> bool {
        false
    }

    /// Moves a running dedicated cluster onto its units now (a replacement node's among
    /// them) and off `dropped` (a failed node's): once this returns, nothing of the cluster
    /// runs on them and their capacity may be released. Safe to repeat. The answer is the
    /// cluster's connection details as they are now (they name its nodes).
    fn move_cluster<'a>(&'a self, workload: &'a Workload, dropped: &'a [PlacedUnit]) -> MoveFuture<'a> {
        let _ = (workload, dropped);
        Box::pin(async { Err(BackendError("this backend cannot move a cluster to another node yet".into())) })
    }
}

// ---------------------------------------------------------------------------------------
// Reaching and running what was booked: the proxy's upstream, training logs, replicas.

/// Where Berth's proxy sends a ready notebook's or inference endpoint's requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// `http://host:port`, without a trailing slash. Each environment has an origin of its
    /// own, so the workload serves at `/` and paths are forwarded as the browser sent them.
    pub base_url: String,
    /// Headers the proxy sets on every forwarded request: the workload's own credential
    /// (the Jupyter token, the model server's key). Never shown to anyone.
    pub headers: Vec<(String, String)>,
}

impl Upstream {
    /// The workload at `base_url`, let in with its credential as its server expects it:
    /// Jupyter's `token`, an inference server's bearer key.
    pub fn with_credential(offering: Offering, base_url: String, credential: &str) -> Upstream {
        let authorization =
            if offering == Offering::Notebook { format!("token {credential}") } else { format!("Bearer {credential}") };
        Upstream { base_url, headers: vec![("authorization".to_owned(), authorization)] }
    }
}

/// Bytes of the files under `dir` (a volume's directory); `None` when it cannot be read
/// or does not exist yet.
pub(crate) fn bytes_under(dir: &std::path::Path) -> Option<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).ok()? {
        let entry = entry.ok()?;
        let meta = entry.metadata().ok()?;
        total += if meta.is_dir() { bytes_under(&entry.path()).unwrap_or(0) } else { meta.len() };
    }
    Some(total)
}

/// A workload's credential (a Jupyter token, an endpoint's own key): 128 random bits, hex.
pub(crate) fn workload_secret() -> String {
    let mut rng = rand::rng();
    (0..32).map(|_| format!("{:x}", rng.random_range(0..16u8))).collect()
}

/// How a training job stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobStatus {
    /// Not started yet (waiting for its pod, its image, the queue).
    Pending,
    Running,
    Succeeded,
    Failed {
        exit_code: Option<i32>,
        reason: String,
    },
}

/// The end of a training job's log and its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobLogs {
    pub status: JobStatus,
    /// The last lines, oldest first.
    pub lines: Vec<String>,
}

pub type UpstreamFuture<'a> = Pin<Box<dyn Future<Output = Result<Upstream, BackendError>> + Send + 'a>>;
pub type JobLogsFuture<'a> = Pin<Box<dyn Future<Output = Result<JobLogs, BackendError>> + Send + 'a>>;
pub type CheckFuture<'a> = Pin<Box<dyn Future<Output = Result<String, BackendError>> + Send + 'a>>;

/// A node as a check or a repair sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedNode {
    pub name: String,
    pub model: GpuModel,
    pub gpus: u32,
    /// What the NCCL test should reach here (GB/s), for backends that simulate it.
    pub expected_bus_bandwidth: Option<f64>,
    pub infiniband_rate: u32,
}

pub type ScaleFuture<'a> = Pin<Box<dyn Future<Output = Result<(), BackendError>> + Send + 'a>>;
pub type MoveFuture<'a> = Pin<Box<dyn Future<Output = Result<Connection, BackendError>> + Send + 'a>>;

impl Workload {
    /// The booked nodes, in order, each once.
    pub fn nodes(&self) -> Vec<String> {
        let mut nodes: Vec<String> = self.units.iter().map(|u| u.node.clone()).collect();
        nodes.sort();
        nodes.dedup();
        nodes
    }

    /// How many replicas the workload's units make: each replica of an inference endpoint
    /// holds the booked size again (one GPU or slice per replica for today's sizes).
    pub fn replicas(&self) -> u32 {
        replicas_of(self.offering, self.shape, self.units.len())
    }
}

/// How many replicas `units` units of an environment make.
fn replicas_of(offering: Offering, shape: Shape, units: usize) -> u32 {
    let per_replica = match shape {
        Shape::Gpus { count, .. } => count.max(1) as usize,
        Shape::MigSlice { .. } | Shape::Share { .. } | Shape::Nodes { .. } => 1,
    };
    match offering {
        Offering::InferenceEndpoint => u32::try_from((units / per_replica).max(1)).unwrap_or(1),
        _ => 1,
    }
}
