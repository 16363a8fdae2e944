//! The bare-metal backend: GPU nodes run `berth agent`, which fetches its node's plan with
//! its node token, applies it and reports the generation it applied. Each step records the
//! environment's part of its nodes' plans in the database and succeeds once every node's
//! agent reports a generation that includes it (or fails with the agent's error, or on the
//! reconciler's step timeout).
//!
//! | step | on the node |
//! |---|---|
//! | configure partition (MIG) | the environment's MIG instances join the node's layout (its neighbours' stay) |
//! | pull image | the image is pulled (`podman pull` / `docker pull`) |
//! | start workload | hard and hybrid tenants' network attached (VXLAN/VLAN, bridge, nftables); the container runs with `CUDA_VISIBLE_DEVICES` set to its GPUs or MIG devices (a hard or hybrid tenant's also on its tenant network, with an address of its own there); a dedicated cluster's local account (`berth-<short id>`) is made with its people's SSH keys |
//! | wait healthy | the agent reports the container running (a training job: running or done) |
//! | expose endpoint | nothing: the container's port is published on the node; the owner gets its URL |
//! | remove endpoint | nothing on the node (the port goes with the container) |
//! | stop workload | the container is removed, the tenant network detached, the cluster's account removed |
//! | clear partition | the environment's MIG instances leave the layout |
//! | release capacity | whatever part of the environment is left goes |
//!
//! Health checks run on the node too: the agent takes the portal's check orders and runs
//! each check's own command (`node_orders`). Repair tiers' commands do not: the
//! agent runs no command line the portal sends, so a tier with one waits for a person.

use std::sync::Arc;
use std::time::Duration;

use berth_domain::catalog::Offering;
use berth_domain::lifecycle::Step;
use berth_domain::mig::{MigInstance, MigProfile};
use berth_domain::node_access::account_name;
use berth_domain::node_checks::{CheckKind, CheckLevel, NodeTask};
use berth_domain::node_plan::{Device, NodeVolume, NodeWorkload, WorkloadState, WorkloadStatus, free_host_port};
use berth_domain::tenancy::Isolation;

use super::volume_quotas::{QuotaKind, VolumeQuotas};
use super::{
    Backend, BackendError, CheckFuture, CheckedNode, Connection, HoldFuture, JobLogs, JobLogsFuture, JobStatus,
    MoveFuture, OwnedFuture, OwnedObject, PlacedUnit, RemoveFuture, StepFuture, StepOutput, StoredVolume, Upstream,
    UpstreamFuture, UseFuture, VolumeMount, Workload, workload_secret,
};
use crate::Platform;
use crate::provisioning::node_plans::{AccessPart, MigSlice, NetworkPart, NodeTarget, PartKind, PartWrite};

#[derive(Debug, Clone)]
pub struct BareMetalConfig {
    /// Pause between two looks at the agents' reports.
    pub poll_interval: Duration,
    /// Where the shared filesystem that keeps volumes (NFS, Lustre, CephFS) is mounted, the
    /// same path on every node and on Berth's own host: volume `<id>` is the directory
    /// `<path>/berth-vol-<id>`, made by the agent and bind-mounted into the container, and
    /// removed by Berth when the volume is deleted. `None`: volumes are not kept on bare
    /// metal (a booking's volumes are recorded but nothing is mounted).
    pub volumes_path: Option<std::path::PathBuf>,
}

impl Default for BareMetalConfig {
    fn default() -> BareMetalConfig {
        BareMetalConfig { poll_interval: Duration::from_millis(500), volumes_path: None }
    }
}

pub struct BareMetal {
    platform: Platform,
    config: BareMetalConfig,
    /// Quotas on the volumes' filesystem (XFS projects, CephFS directories), where found at start.
    quotas: Option<Arc<VolumeQuotas>>,
}

impl BareMetal {
    pub fn new(platform: Platform, config: BareMetalConfig) -> BareMetal {
        BareMetal { platform, config, quotas: None }
    }

    /// Volumes get a filesystem quota of their size (XFS `xfs_quota`, CephFS `setfattr`): found by
    /// [`VolumeQuotas::detect`] on `volumes_path` at start.
    pub fn with_volume_quotas(self, quotas: VolumeQuotas) -> BareMetal {
        BareMetal { quotas: Some(Arc::new(quotas)), ..self }
    }

    async fn step(&self, w: &Workload, step: Step) -> Result<StepOutput, BackendError> {
        let nodes = w.nodes();
        let mut output = StepOutput::default();
        match step {
            // The reconciler runs it through the node checks; nothing of the backend's.
            Step::AcceptanceChecks => {}
            Step::ConfigurePartition => {
                let writes: Vec<(String, PartWrite)> = nodes
                    .iter()
                    .map(|node| Ok((node.clone(), PartWrite::Mig(mig_slices(w, node)?))))
                    .collect::<Result<_, BackendError>>()?;
                self.write_and_wait(w, &writes, false).await?;
                let slices: Vec<String> = w
                    .units
                    .iter()
                    .filter_map(|u| {
                        Some(format!("{} on {}/gpu{}@{}", u.mig_profile.as_ref()?, u.node, u.gpu_index, u.slice_start))
                    })
                    .collect();
                output.detail = Some(format!("MIG layout applied: {}", slices.join(", ")));
            }
            Step::PullImage => {
                let Some(image) = &w.image else { return Ok(output) };
                let mut writes = Vec::new();
                for node in &nodes {
                    writes.push((node.clone(), PartWrite::WorkloadIfAbsent(self.fresh_workload(w, node).await?)));
                }
                self.write_and_wait(w, &writes, false).await?;
                self.wait_workloads(w, |state| state.is_some()).await?;
                output.detail = Some(format!("{image} is on {}", nodes.join(", ")));
            }
            Step::StartWorkload => {
                let mut writes = Vec::new();
                let network = self.network_part(w).await?;
                if let Some(part) = &network {
                    writes.extend(nodes.iter().map(|n| (n.clone(), PartWrite::Network(part.clone()))));
                }
                if w.offering == Offering::DedicatedCluster {
                    let part = AccessPart { account: account_name(&w.environment_id) };
                    writes.extend(nodes.iter().map(|n| (n.clone(), PartWrite::Access(part.clone()))));
                }
                if w.image.is_some() {
                    let existing = self.platform.environment_workloads(&w.environment_id).await.map_err(internal)?;
                    for node in &nodes {
                        let workload = match existing.iter().find(|(n, _)| n == node) {
                            Some((_, workload)) => workload.clone(),
                            None => self.fresh_workload(w, node).await?,
                        };
                        let workload = NodeWorkload { run: true, ..workload };
                        // A hard or hybrid tenant's container joins its tenant network.
                        writes.push((
                            node.clone(),
                            match &network {
                                Some(part) => PartWrite::WorkloadOnNetwork(workload, part.clone()),
                                None => PartWrite::Workload(workload),
                            },
                        ));
                    }
                }
                self.write_and_wait(w, &writes, false).await?;
                if w.image.is_some() {
                    self.wait_workloads(w, |state| state.is_some()).await?;
                }
                output.detail = Some(match &w.image {
                    Some(_) => format!("container {} on {}", container(w), nodes.join(", ")),
                    None => format!("{} handed over; SSH as {}", nodes.join(", "), account_name(&w.environment_id)),
                });
            }
            Step::WaitHealthy => {
                if w.image.is_some() {
                    let training = w.offering == Offering::TrainingJob;
                    self.wait_workloads(w, |state| {
                        state == Some(WorkloadState::Running) || (training && state == Some(WorkloadState::Exited))
                    })
                    .await?;
                    output.detail = Some(format!("container {} is running", container(w)));
                }
            }
            Step::ExposeEndpoint => output.connection = Some(self.connection(w).await?),
            Step::RemoveEndpoint => {
                output.detail = Some("the published port goes with the container".into());
            }
            Step::StopWorkload => {
                let writes: Vec<(String, PartWrite)> = nodes
                    .iter()
                    .flat_map(|n| {
                        [
                            (n.clone(), PartWrite::Delete(PartKind::Workload)),
                            (n.clone(), PartWrite::Delete(PartKind::Network)),
                            (n.clone(), PartWrite::Delete(PartKind::Access)),
                        ]
                    })
                    .collect();
                self.write_and_wait(w, &writes, false).await?;
            }
            Step::ClearPartition => {
                let writes: Vec<(String, PartWrite)> =
                    nodes.iter().map(|n| (n.clone(), PartWrite::Delete(PartKind::Mig))).collect();
                self.write_and_wait(w, &writes, false).await?;
            }
            Step::ReleaseCapacity => self.write_and_wait(w, &[], true).await?,
        }
        Ok(output)
    }

    /// Records `writes` and waits until every node they touch has applied them.
    async fn write_and_wait(
        &self,
        w: &Workload,
        writes: &[(String, PartWrite)],
        delete_all: bool,
    ) -> Result<(), BackendError> {
        // Dropped by the reconciler's step timeout, the write is committed or rolled back
        // whole, never left holding the database (see `store`); the step runs again.
        let targets =
            self.platform.write_node_parts(&w.environment_id, writes, delete_all).await.map_err(|e| match e {
                crate::Error::Refused(refusal) => BackendError(refusal.to_string()),
                other => internal(other),
            })?;
        self.wait_applied(&targets).await
    }

    /// Until each node's agent reports at least its target generation; the agent's error
    /// when it reports one for such a generation.
    async fn wait_applied(&self, targets: &[NodeTarget]) -> Result<(), BackendError> {
        loop {
            let progress = self.platform.node_progress(targets).await.map_err(internal)?;
            let mut done = true;
            for (target, p) in targets.iter().zip(&progress) {
                if p.reported_generation < target.generation {
                    done = false;
                } else if let Some(error) = &p.error {
                    return Err(BackendError(format!("the agent on {} reports: {error}", target.node)));
                }
            }
            if done {
                return Ok(());
            }
            tokio::time::sleep(self.config.poll_interval).await;
        }
    }

    /// Until `ready` holds for the environment's workload on each of its nodes; fails with
    /// the agent's word when it could not pull or start it, or when it ended badly.
    async fn wait_workloads(
        &self,
        w: &Workload,
        ready: impl Fn(Option<WorkloadState>) -> bool,
    ) -> Result<(), BackendError> {
        let parts = self.platform.environment_workloads(&w.environment_id).await.map_err(internal)?;
        let nodes = self.node_targets(&parts.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>()).await?;
        loop {
            let progress = self.platform.node_progress(&nodes).await.map_err(internal)?;
            let mut all = true;
            for p in &progress {
                let status = p.workloads.iter().find(|s| s.environment_id == w.environment_id);
                if let Some(error) = status.and_then(|s| s.error.as_ref()) {
                    return Err(BackendError(format!("on {}: {error}", p.node)));
                }
                if let Some(status) = status
                    && status.state == Some(WorkloadState::Exited)
                    && status.exit_code.is_some_and(|c| c != 0)
                {
                    return Err(BackendError(format!(
                        "the container on {} exited with code {}",
                        p.node,
                        status.exit_code.unwrap_or_default()
                    )));
                }
                all &= ready(status.and_then(|s| s.state));
            }
            if all {
                return Ok(());
            }
            tokio::time::sleep(self.config.poll_interval).await;
        }
    }

    async fn node_targets(&self, nodes: &[String]) -> Result<Vec<NodeTarget>, BackendError> {
        let mut targets = Vec::new();
        for node in nodes {
            let (node_id,): (i64,) = sqlx::query_as("SELECT id FROM nodes WHERE name = ?")
                .bind(node)
                .fetch_one(self.platform.db())
                .await
                .map_err(|e| internal(crate::Error::from(e)))?;
            targets.push(NodeTarget { node_id, node: node.clone(), generation: 0 });
        }
        Ok(targets)
    }

    /// How a training job stands by its agent's last report: a job runs on one node (a
    /// multi-node job would be one container per node; the first that failed decides).
    async fn job_logs_of(&self, w: &Workload, tail: usize) -> Result<JobLogs, BackendError> {
        if w.offering != Offering::TrainingJob {
            return Err(BackendError(format!("a {} has no job log", w.offering.title())));
        }
        let targets = self.node_targets(&w.nodes()).await?;
        let progress = self.platform.node_progress(&targets).await.map_err(internal)?;
        let statuses: Vec<_> =
            progress.iter().flat_map(|p| &p.workloads).filter(|s| s.environment_id == w.environment_id).collect();
        let Some(first) = statuses.first() else {
            return Ok(JobLogs { status: JobStatus::Pending, lines: Vec::new() });
        };
        let exited = |s: &WorkloadStatus| s.state == Some(WorkloadState::Exited);
        let failed = statuses.iter().find(|s| exited(s) && s.exit_code != Some(0));
        let status = if let Some(f) = failed {
            let code = f.exit_code.and_then(|c| i32::try_from(c).ok());
            let reason = code.map_or_else(|| "the container ended".to_owned(), |c| format!("exited with code {c}"));
            JobStatus::Failed { exit_code: code, reason }
        } else if statuses.iter().all(|s| exited(s)) {
            JobStatus::Succeeded
        } else if statuses.iter().any(|s| s.state == Some(WorkloadState::Running)) {
            JobStatus::Running
        } else {
            JobStatus::Pending
        };
        let lines = failed.unwrap_or(first).log_tail.clone();
        let skip = lines.len().saturating_sub(tail);
        Ok(JobLogs { status, lines: lines[skip..].to_vec() })
    }

    /// A not yet started workload of `w` on `node`, with a free host port and a new secret
    /// for what the owner connects to.
    async fn fresh_workload(&self, w: &Workload, node: &str) -> Result<NodeWorkload, BackendError> {
        let image = w.image.clone().ok_or_else(|| BackendError("the environment has no image".into()))?;
        let serves = matches!(w.offering, Offering::Notebook | Offering::InferenceEndpoint);
        let host_port = if serves {
            let taken = self.platform.host_ports_in_use(node, &w.environment_id).await.map_err(internal)?;
            Some(free_host_port(&taken).ok_or_else(|| BackendError(format!("{node} has no free host port left")))?)
        } else {
            None
        };
        Ok(NodeWorkload {
            environment_id: w.environment_id.clone(),
            offering: w.offering,
            image,
            command: w.command.clone(),
            devices: devices(w, node)?,
            run: false,
            host_port,
            secret: serves.then(workload_secret),
            vcpus: w.vcpus,
            memory_gb: w.memory_gb,
            network: None,
            volumes: self.node_volumes(w),
            args: w.serving.container_args(),
            env: w.serving.container_env(),
        })
    }

    /// The workload's volumes as directories on the shared filesystem.
    fn node_volumes(&self, w: &Workload) -> Vec<NodeVolume> {
        let Some(root) = &self.config.volumes_path else { return Vec::new() };
        w.volumes
            .iter()
            .map(|v| NodeVolume {
                host_path: root.join(v.storage_name()).display().to_string(),
                mount_path: v.mount_path.clone(),
            })
            .collect()
    }

    /// The tenant's network on its nodes: hard and hybrid tenants that hold a segment.
    async fn network_part(&self, w: &Workload) -> Result<Option<NetworkPart>, BackendError> {
        let Some(slug) = w.tenant.slug.as_ref().filter(|_| w.tenant.isolation != Isolation::Soft) else {
            return Ok(None);
        };
        let segment = self.platform.tenant_segment(slug).await.map_err(internal)?;
        Ok(segment.map(|segment| NetworkPart { tenant: slug.clone(), segment }))
    }

    /// Where Berth's proxy reaches a notebook or endpoint: the port its node publishes,
    /// with the workload's own token (the proxy's network must reach the nodes).
    async fn upstream_of(&self, w: &Workload) -> Result<Upstream, BackendError> {
        if !matches!(w.offering, Offering::Notebook | Offering::InferenceEndpoint) {
            return Err(BackendError(format!("a {} serves nothing through Berth", w.offering.title())));
        }
        let workloads = self.platform.environment_workloads(&w.environment_id).await.map_err(internal)?;
        let Some((node, workload)) = workloads.into_iter().find(|(_, wl)| wl.run && wl.host_port.is_some()) else {
            return Err(BackendError("the workload is not running on its node yet".into()));
        };
        let port = workload.host_port.unwrap_or_default();
        let secret = workload.secret.unwrap_or_default();
        Ok(Upstream::with_credential(w.offering, format!("http://{node}:{port}"), &secret))
    }

    async fn connection(&self, w: &Workload) -> Result<Connection, BackendError> {
        let workloads = self.platform.environment_workloads(&w.environment_id).await.map_err(internal)?;
        let first = workloads.first();
        let node = first.map(|(n, _)| n.clone()).or_else(|| w.nodes().into_iter().next()).unwrap_or_default();
        let port = first.and_then(|(_, wl)| wl.host_port).unwrap_or_default();
        let secret = first.and_then(|(_, wl)| wl.secret.clone());
        Ok(match w.offering {
            Offering::Notebook => Connection {
                url: format!("http://{node}:{port}/lab"),
                secret_label: Some("Token".into()),
                secret,
                example: format!("open http://{node}:{port}/lab?token=<token>"),
            },
            Offering::InferenceEndpoint => Connection {
                url: format!("http://{node}:{port}/v1"),
                secret_label: Some("API key".into()),
                secret,
                example: format!("curl -H \"Authorization: Bearer <api key>\" http://{node}:{port}/v1/models"),
            },
            Offering::TrainingJob => Connection {
                url: format!("baremetal://{node}/{}", container(w)),
                secret_label: None,
                secret: None,
                example: format!("podman logs -f {} (on {node})", container(w)),
            },
            // The account on each node holds the SSH keys of the owner (and their tenant
            // admins) from their account pages.
            Offering::DedicatedCluster => {
                let account = account_name(&w.environment_id);
                let logins: Vec<String> = w.nodes().iter().map(|n| format!("ssh {account}@{n}")).collect();
                Connection {
                    url: format!("ssh://{account}@{node}"),
                    secret_label: None,
                    secret: None,
                    example: logins.join(" / "),
                }
            }
        })
    }
}

/// What a bare-metal Berth without a shared filesystem says of where a volume is.
const NOT_KEPT: &str = "not kept: bare metal without --baremetal-volumes-path";

impl Backend for BareMetal {
    fn volume_location(&self, _workload: &Workload, volume: &VolumeMount) -> String {
        match &self.config.volumes_path {
            Some(root) => root.join(volume.storage_name()).display().to_string(),
            None => NOT_KEPT.to_owned(),
        }
    }

    /// The shared filesystem is mounted on Berth's host too, at the same path: the
    /// directory is removed here. Only a directory under that path named for the volume.
    fn remove_volume<'a>(&'a self, volume: &'a StoredVolume) -> RemoveFuture<'a> {
        Box::pin(async move {
            let Some(root) = &self.config.volumes_path else { return Ok(false) };
            let dir = root.join(crate::capacity::volumes::storage_name(volume.volume_id));
            if volume.location != dir.display().to_string() {
                // Made elsewhere (another path, or when volumes were not kept): not ours to remove.
                return Ok(false);
            }
            match tokio::fs::remove_dir_all(&dir).await {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
                Err(e) => {
                    tracing::error!(volume = volume.volume_id, error = %e, dir = %dir.display(), "cannot remove a volume's directory");
                    Err(BackendError(format!("could not remove volume {}", volume.volume_id)))
                }
            }
        })
    }

    fn volume_size_rule(&self) -> &'static str {
        match self.quotas.as_ref().map(|q| q.kind()) {
            Some(QuotaKind::XfsProject) => {
                "A volume is a directory with an XFS project quota of its size: writes past its size fail. One whose quota could not be set is held by measuring it: found holding more than its size, it is not attached again until it is grown."
            }
            Some(QuotaKind::CephDirectory) => {
                "A volume is a CephFS directory with a quota of its size: writes stop at about its size (CephFS clients may overshoot a little before they notice). One whose quota could not be set is held by measuring it: found holding more than its size, it is not attached again until it is grown."
            }
            None => {
                "A volume's size is held by measuring it: one found holding more than its size is not attached again until it is grown."
            }
        }
    }

    fn holds_volume_sizes(&self) -> bool {
        self.quotas.is_some() && self.config.volumes_path.is_some()
    }

    /// A dedicated cluster on bare metal is its tenant's network and its SSH account on
    /// each node (no container): both are planned on its nodes now and taken off `dropped`.
    fn moves_clusters(&self) -> bool {
        true
    }

    fn move_cluster<'a>(&'a self, workload: &'a Workload, dropped: &'a [PlacedUnit]) -> MoveFuture<'a> {
        Box::pin(async move {
            let nodes = workload.nodes();
            let network = self.network_part(workload).await?;
            let account = AccessPart { account: account_name(&workload.environment_id) };
            let mut writes = Vec::new();
            for node in &nodes {
                if let Some(part) = &network {
                    writes.push((node.clone(), PartWrite::Network(part.clone())));
                }
                writes.push((node.clone(), PartWrite::Access(account.clone())));
            }
            let mut leaving: Vec<&str> =
                dropped.iter().map(|u| u.node.as_str()).filter(|n| !nodes.iter().any(|k| k == n)).collect();
            leaving.sort_unstable();
            leaving.dedup();
            for node in leaving {
                for kind in [PartKind::Workload, PartKind::Network, PartKind::Access] {
                    writes.push((node.to_owned(), PartWrite::Delete(kind)));
                }
            }
            self.write_and_wait(workload, &writes, false).await?;
            self.connection(workload).await
        })
    }

    /// The node's agent runs each check (see `node_orders`).
    fn runs_node_checks(&self) -> bool {
        true
    }

    fn run_check<'a>(&'a self, node: &'a CheckedNode, kind: CheckKind, level: CheckLevel) -> CheckFuture<'a> {
        Box::pin(async move {
            self.platform
                .order_task(&node.name, NodeTask::Check { kind, level, gpus: node.gpus }, self.config.poll_interval)
                .await
                .map_err(BackendError)
        })
    }

    /// The node's agent resets it (an order, as a check is).
    fn resets_gpus(&self) -> bool {
        true
    }

    fn reset_gpu<'a>(&'a self, node: &'a CheckedNode, gpu: u32) -> CheckFuture<'a> {
        Box::pin(async move {
            self.platform
                .order_task(&node.name, NodeTask::ResetGpu { gpu }, self.config.poll_interval)
                .await
                .map_err(BackendError)
        })
    }

    /// The volume's directory is made here, on Berth's host, and given a quota of the
    /// volume's size; a volume whose quota fails is logged and measured.
    fn hold_volume_size<'a>(&'a self, volume: &'a StoredVolume, size_gib: u32) -> HoldFuture<'a> {
        Box::pin(async move {
            let (Some(quotas), Some(root)) = (&self.quotas, &self.config.volumes_path) else { return };
            let dir = root.join(crate::capacity::volumes::storage_name(volume.volume_id));
            if volume.location != dir.display().to_string() {
                // Kept elsewhere (another path, or when volumes were not kept): not ours.
                return;
            }
            if let Err(why) = quotas.hold(volume.volume_id, &dir, size_gib).await {
                tracing::warn!(
                    volume = volume.volume_id,
                    size_gib,
                    dir = %dir.display(),
                    error = %why,
                    "no filesystem quota for this volume; its size is held by measuring it"
                );
            }
        })
    }

    fn volume_use<'a>(&'a self, volume: &'a StoredVolume) -> UseFuture<'a> {
        let dir = self
            .config
            .volumes_path
            .as_ref()
            .map(|root| root.join(crate::capacity::volumes::storage_name(volume.volume_id)));
        Box::pin(async move {
            let dir = dir?;
            tokio::task::spawn_blocking(move || super::bytes_under(&dir)).await.ok().flatten()
        })
    }

    fn name(&self) -> &'static str {
        "baremetal"
    }

    fn run<'a>(&'a self, workload: &'a Workload, step: Step) -> StepFuture<'a> {
        Box::pin(self.step(workload, step))
    }

    /// Berth's objects on bare metal are the environments' parts of the node plans: a part
    /// no live environment explains is taken out of its node's plan, and the agent then
    /// removes the container, network or MIG instances it stood for.
    fn owned_objects(&self) -> OwnedFuture<'_> {
        Box::pin(async move {
            let parts = self.platform.node_plan_parts().await.map_err(internal)?;
            Ok(parts
                .into_iter()
                .map(|(node, environment_id, kind)| {
                    OwnedObject::for_environments(
                        plan_part_kind(kind),
                        format!("{node}/{environment_id}"),
                        vec![environment_id],
                    )
                })
                .collect())
        })
    }

    fn upstream<'a>(&'a self, workload: &'a Workload) -> UpstreamFuture<'a> {
        Box::pin(self.upstream_of(workload))
    }

    fn job_logs<'a>(&'a self, workload: &'a Workload, tail: usize) -> JobLogsFuture<'a> {
        Box::pin(self.job_logs_of(workload, tail))
    }

    fn remove_owned<'a>(&'a self, object: &'a OwnedObject) -> RemoveFuture<'a> {
        Box::pin(async move {
            let kind = PartKind::ALL
                .into_iter()
                .find(|&k| plan_part_kind(k) == object.kind)
                .ok_or_else(|| BackendError(format!("the bare-metal backend has no {} objects", object.kind)))?;
            let (Some((node, _)), [environment_id]) = (object.name.split_once('/'), object.environments.as_slice())
            else {
                return Err(BackendError(format!("{} is not a node plan part", object.name)));
            };
            let writes = [(node.to_owned(), PartWrite::Delete(kind))];
            self.platform.write_node_parts(environment_id, &writes, false).await.map_err(internal)?;
            Ok(true)
        })
    }
}

/// The sweep's name for a kind of plan part.
fn plan_part_kind(kind: PartKind) -> &'static str {
    match kind {
        PartKind::Mig => "node plan MIG part",
        PartKind::Network => "node plan network part",
        PartKind::Workload => "node plan workload part",
        PartKind::Access => "node plan access part",
    }
}

fn container(w: &Workload) -> String {
    berth_domain::node_plan::container_name(&w.environment_id)
}

fn mig_instance(w: &Workload, profile: &str, start: i64) -> Result<MigInstance, BackendError> {
    let model = w.shape.model();
    let profile = MigProfile::parse(model, profile)
        .ok_or_else(|| BackendError(format!("{profile} is no MIG profile of {}", model.name())))?;
    let start = u8::try_from(start).map_err(|_| BackendError(format!("slice start {start}")))?;
    Ok(MigInstance { profile, start })
}

fn gpu_index(index: i64) -> Result<u32, BackendError> {
    u32::try_from(index).map_err(|_| BackendError(format!("GPU index {index}")))
}

/// This environment's MIG instances on `node`.
fn mig_slices(w: &Workload, node: &str) -> Result<Vec<MigSlice>, BackendError> {
    w.units
        .iter()
        .filter(|u| u.node == node)
        .filter_map(|u| u.mig_profile.as_ref().map(|p| (u, p)))
        .map(|(u, p)| Ok(MigSlice { gpu: gpu_index(u.gpu_index)?, instance: mig_instance(w, p, u.slice_start)? }))
        .collect()
}

/// The GPUs and MIG slices of `w` on `node`.
fn devices(w: &Workload, node: &str) -> Result<Vec<Device>, BackendError> {
    w.units
        .iter()
        .filter(|u| u.node == node)
        .map(|u| {
            let gpu = gpu_index(u.gpu_index)?;
            Ok(match &u.mig_profile {
                Some(p) => Device::Mig { gpu, instance: mig_instance(w, p, u.slice_start)? },
                // A development share runs on the GPU it shares (time-sliced).
                None => Device::Gpu(gpu),
            })
        })
        .collect()
}

fn internal(e: crate::Error) -> BackendError {
    tracing::error!(error = %e, "bare-metal backend: store failure");
    BackendError("Berth could not record the node plan; see the portal's log".into())
}
