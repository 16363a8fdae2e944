//! The Kubernetes backend: each lifecycle step becomes a few calls to the API server, all
//! server-side applies with the one field manager `berth`, or deletes that count a missing
//! object as done, so every step is safe to repeat.
//!
//! | step | Kubernetes |
//! |---|---|
//! | configure partition (MIG) | namespace bundle (the tenant's, with its quota, for a soft tenant's environment); MIG layout into the mig-parted ConfigMap, node label `nvidia.com/mig.config`, wait for `nvidia.com/mig.config.state=success` |
//! | pull image | nothing: the kubelet pulls it when the pod starts |
//! | start workload | namespace bundle; dedicated nodes labelled and tainted; credential Secret; StatefulSet / Job / Deployment, or the dedicated cluster's ServiceAccount |
//! | wait healthy | read the workload's status (dedicated: the nodes' `Ready`) |
//! | expose endpoint | Service and the NetworkPolicy that lets Berth's proxy in; connection details (dedicated: a kubeconfig) |
//! | remove endpoint | delete the Service and that NetworkPolicy |
//! | stop workload | delete the workload (where it lives, and where an earlier placement put it) and wait until its pods are gone |
//! | clear partition | node's MIG config cleared |
//! | release capacity | in the tenant's namespace: delete the environment's objects by name, wait until they are gone, apply the tenant's quota without it; in its own: delete the namespace (and a staff environment's own ClusterQueue); the node's label and taint removed once no other environment of the tenant holds it; the environment taken off the MIG layouts it wrote, and layouts nobody wrote or names any more dropped from the mig-parted ConfigMap |
//! | orphan sweep | list labelled namespaces (environments' and tenants'), environments' objects in tenants' namespaces, ClusterQueues (environments' and tenants'), dedicated nodes, nodes with a Berth MIG layout (each annotated with the environments holding it) and the mig-parted ConfigMap's layouts; delete, give back or disable what nothing live explains |
//!
//! Besides the steps, each tenant has a ClusterQueue mirroring its Berth quota (see
//! `manifests::tenant_cluster_queue`) and a soft tenant its namespace (see
//! `manifests::tenant_namespace_bundle`), applied whenever the quota, the members or what
//! its environments hold changes, and removed when the tenant is deleted. Where each
//! environment lives, and why its tenant's quota converges, is in `manifests`.
//!
//! A node dedicated to a hard or hybrid tenant is labelled `berth.dev/tenant=<tenant>` and
//! tainted for it once, with every environment of the tenant on it in one annotation;
//! each apply to a node carries all of Berth's state there (its neighbours' MIG slices and
//! its tenant's other environments), so no environment overwrites another's.
//!
//! Kubernetes errors go to the log; the step fails with an operational message.
//!
//! Owners reach notebooks and endpoints through Berth's proxy, which talks to the
//! workload's Service by its cluster DNS name (`nb-<id>.berth-<tenant>.svc.cluster.local:8888`
//! in a soft tenant's namespace, `notebook.<ns>.svc…` in an environment's own).
//! That needs Berth to run inside the cluster (its Dockerfile is made for that) or on a
//! host that routes to Services. The API server's service proxy would work from anywhere,
//! but it sends every notebook byte and long-lived kernel WebSocket through the control
//! plane, and needs `services/proxy`, which reaches every Service in the cluster; the
//! data plane should not depend on either.
//!
//! Training logs come from the Job's newest pod (`pods/log`), its exit status from the
//! container's terminated state. An endpoint's replicas are the Deployment's `replicas`,
//! applied with its namespace's quota and queue sized for all of them. What volumes hold
//! comes from the kubelets' stats summaries, through the API server's node proxy
//! (`volume_stats`).

mod checks;
mod dcgm;
pub mod manifests;
mod mig;
mod sweep;
pub mod volume_stats;

pub use dcgm::DcgmExporter;

pub use mig::{MIG_CONFIG_ENTRY, MIG_LAYOUT};
use mig::{layouts_named_by, mig_holders, mig_layouts_of};

use std::collections::BTreeMap;
use std::time::Duration;

use berth_domain::catalog::Offering;
use berth_domain::lifecycle::Step;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, ObjectMeta};
use kube::{Client, ResourceExt};

use self::manifests::{
    CLUSTER_QUEUE, COMPONENT_LABEL, ClusterSettings, ENVIRONMENT_LABEL, FIELD_MANAGER, Kind, MANAGED_BY_LABEL,
    MIG_CONFIG_LABEL, MIG_DISABLED, MIG_ENVIRONMENTS_ANNOTATION, MIG_STATE_LABEL, Manifest, MigLayouts, NAMESPACE,
    NODE, NodeStage, TENANT_ENVIRONMENTS_ANNOTATION, TENANT_LABEL,
};
use super::{
    Backend, BackendError, CheckFuture, CheckedNode, Connection, JobLogs, JobLogsFuture, JobStatus, MoveFuture,
    OwnedFuture, OwnedObject, PlacedUnit, QueueFuture, ReadingsFuture, RemoveFuture, ScaleFuture, StepFuture,
    StepOutput, StoredVolume, TenantQueue, Upstream, UpstreamFuture, VolumeMount, VolumesUseFuture, Workload,
    workload_secret,
};
use berth_domain::node_checks::{CheckKind, CheckLevel};

/// Where a soft tenant's volume is kept: `claim <namespace>/<name>`.
const CLAIM_LOCATION: &str = "claim ";
/// Where a volume of environments in namespaces of their own is kept: a PersistentVolume
/// found by its label, bound to each environment's claim in turn.
const KEPT_LOCATION: &str = "persistentvolume ";

/// How the backend reaches and uses the cluster.
#[derive(Debug, Clone)]
pub struct KubernetesConfig {
    pub cluster: ClusterSettings,
    /// The API server address written into dedicated clusters' kubeconfigs; defaults to
    /// the address Berth itself uses.
    pub api_server_url: Option<String>,
    /// Pause between two reads while waiting for a MIG layout, a workload or a token.
    pub poll_interval: Duration,
    /// Where GPU readings come from (`--kube-dcgm-exporter`); `None`: no readings.
    pub dcgm_exporter: Option<DcgmExporter>,
    /// How long one node's kubelet may take to give its stats summary (volumes' use).
    pub node_stats_timeout: Duration,
}

impl Default for KubernetesConfig {
    fn default() -> KubernetesConfig {
        KubernetesConfig {
            cluster: ClusterSettings::default(),
            api_server_url: None,
            poll_interval: Duration::from_secs(2),
            dcgm_exporter: Some(DcgmExporter::default()),
            node_stats_timeout: Duration::from_secs(10),
        }
    }
}

pub struct Kubernetes {
    client: Client,
    config: KubernetesConfig,
    api_server_url: String,
    /// When the DCGM exporters were last read (ms): what the next readings stand for.
    readings_read_at: std::sync::Mutex<Option<i64>>,
}

impl Kubernetes {
    /// Connects with the kubeconfig (`KUBECONFIG`, `~/.kube/config`) or, inside a pod, the
    /// service account, and checks that the API server answers.
    pub async fn connect(config: KubernetesConfig) -> Result<Kubernetes, String> {
        let inferred = kube::Config::infer().await.map_err(|e| {
            format!(
                "no Kubernetes cluster configured: neither a kubeconfig nor in-cluster credentials were found ({e})"
            )
        })?;
        Kubernetes::connect_with(inferred, config).await
    }

    /// Connects with explicit client settings and checks that the API server answers.
    pub async fn connect_with(client: kube::Config, config: KubernetesConfig) -> Result<Kubernetes, String> {
        let url = client.cluster_url.to_string().trim_end_matches('/').to_owned();
        let client =
            Client::try_from(client).map_err(|e| format!("cannot set up a Kubernetes client for {url}: {e}"))?;
        let version = client
            .apiserver_version()
            .await
            .map_err(|e| format!("the Kubernetes API server at {url} does not answer: {e}"))?;
        tracing::info!(api_server = %url, version = %version.git_version, "connected to Kubernetes");
        Ok(Kubernetes::with_client(client, config, &url))
    }

    /// A backend over an existing client (tests hand it a mock API server).
    pub fn with_client(client: Client, config: KubernetesConfig, cluster_url: &str) -> Kubernetes {
        let api_server_url = config.api_server_url.clone().unwrap_or_else(|| cluster_url.to_owned());
        Kubernetes { client, config, api_server_url, readings_read_at: Default::default() }
    }

    async fn step(&self, w: &Workload, step: Step) -> Result<StepOutput, BackendError> {
        let names = manifests::Names::of(w);
        let mut output = StepOutput::default();
        match step {
            // The reconciler runs it through the node checks; nothing of the backend's.
            Step::AcceptanceChecks => {}
            Step::ConfigurePartition => {
                self.apply_bundle(w).await?;
                let layouts = self.configure_mig(w).await?;
                output.detail =
                    Some(format!("namespace {} ready; MIG layout {} applied", names.namespace, layouts.join(", ")));
            }
            Step::PullImage => {
                output.detail = w.image.as_ref().map(|i| format!("{i} is pulled by the node when the workload starts"));
            }
            Step::StartWorkload => {
                self.apply_bundle(w).await?;
                if manifests::dedicates_nodes(w) {
                    for node in w.nodes() {
                        self.apply_node(w, &node, NodeStage::Held).await?;
                    }
                }
                self.credential(w).await?;
                self.claim_volumes(w).await?;
                let workload = manifests::workload_manifests(w);
                self.apply_all(&workload).await?;
                let kinds: Vec<String> = workload.iter().map(|m| format!("{} {}", m.kind.kind, m.name())).collect();
                output.detail = Some(format!("{} applied in {}", kinds.join(", "), names.namespace));
            }
            Step::WaitHealthy => {
                output.detail = Some(self.wait_healthy(w).await?);
                self.keep_volumes(w).await?;
            }
            Step::ExposeEndpoint => {
                if let Some(service) = manifests::endpoint_manifest(w) {
                    self.apply(&service).await?;
                }
                if let Some(policy) = manifests::proxy_access_manifest(w, &self.config.cluster) {
                    self.apply(&policy).await?;
                }
                let credential = self.credential(w).await?;
                let kubeconfig = match w.offering {
                    Offering::DedicatedCluster => Some(self.kubeconfig(w).await?),
                    _ => None,
                };
                output.connection =
                    Some(manifests::connection(w, credential.as_deref(), &self.api_server_url, kubeconfig));
            }
            Step::RemoveEndpoint => {
                if let Some(service) = manifests::endpoint_manifest(w) {
                    self.delete(&service.kind, service.namespace(), service.name(), false).await?;
                }
                if let Some(policy) = manifests::proxy_access_manifest(w, &self.config.cluster) {
                    self.delete(&policy.kind, policy.namespace(), policy.name(), false).await?;
                }
            }
            Step::StopWorkload => {
                // Before the namespace goes with its claims (at the release).
                self.keep_volumes(w).await?;
                let mut workloads = manifests::workload_manifests(w);
                workloads.extend(manifests::other_home(w).iter().flat_map(manifests::workload_manifests));
                for m in workloads {
                    // Foreground: the object goes only after its pods, so once it is gone the
                    // GPUs are free and releasing the capacity tells the truth.
                    if self.delete(&m.kind, m.namespace(), m.name(), true).await? {
                        self.wait_gone(&m).await?;
                    }
                }
            }
            Step::ClearPartition => {
                for node in w.nodes() {
                    self.apply_node(w, &node, NodeStage::Cleared).await?;
                }
            }
            Step::ReleaseCapacity => {
                self.remove_home(w).await?;
                if names.shared {
                    // What is left for the tenant's other environments, as read when the
                    // step began; the tenant's sync after the release applies the newest.
                    let quota =
                        manifests::tenant_quota(&names.tenant, &manifests::space_of(w, false), &self.config.cluster);
                    match self.apply_answer(&quota).await {
                        Ok(()) => {}
                        // The tenant's namespace went with the tenant: nothing to bound.
                        Err(kube::Error::Api(status)) if status.code == 404 => {}
                        Err(e) => return Err(api_failure("apply the tenant's ResourceQuota", e)),
                    }
                }
                // What an earlier placement left (see `manifests::other_home`).
                if let Some(other) = manifests::other_home(w) {
                    self.remove_home(&other).await?;
                }
                if manifests::has_own_cluster_queue(w) {
                    self.delete(&CLUSTER_QUEUE, None, &names.cluster_queue, false).await?;
                }
                for node in w.nodes() {
                    self.apply_node(w, &node, NodeStage::Released).await?;
                }
                // Only an environment with slices, or one that marks nodes (and so keeps
                // its neighbours' layouts), ever writes a layout.
                if manifests::dedicates_nodes(w) || w.units.iter().any(|u| u.mig_profile.is_some()) {
                    self.forget_mig_layouts(w).await?;
                }
            }
        }
        Ok(output)
    }

    /// Where the proxy reaches the workload: where it lives, or (it is not there) where an
    /// earlier placement put it and it still runs (see `manifests::other_home`).
    async fn upstream_of(&self, w: &Workload) -> Result<Upstream, BackendError> {
        let mut found = self.upstream_credential(w).await?;
        if found.is_none()
            && let Some(other) = manifests::other_home(w)
        {
            found = self.upstream_credential(&other).await?;
        }
        let names = manifests::Names::of(w);
        let (base_url, credential) = found.ok_or_else(|| {
            BackendError(format!("the workload's credential (Secret {}) is missing", names.credential))
        })?;
        Ok(Upstream::with_credential(w.offering, base_url, &credential))
    }

    /// The workload's Service address and credential where `w` places it, if its
    /// credential is there.
    async fn upstream_credential(&self, w: &Workload) -> Result<Option<(String, String)>, BackendError> {
        let base_url = manifests::upstream_base_url(w, &self.config.cluster)
            .ok_or_else(|| BackendError(format!("a {} serves nothing through Berth", w.offering.title())))?;
        let names = manifests::Names::of(w);
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &names.namespace);
        let doing = format!("read Secret {}", names.credential);
        let credential =
            api.get_opt(&names.credential).await.map_err(|e| api_failure(&doing, e))?.and_then(secret_value);
        Ok(credential.map(|c| (base_url, c)))
    }

    async fn training_job(&self, w: &Workload) -> Result<Option<Job>, BackendError> {
        let names = manifests::Names::of(w);
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), &names.namespace);
        jobs.get_opt(&names.workload).await.map_err(|e| api_failure("read the training job", e))
    }

    /// The pods of the workload, by the labels its template gives them.
    async fn workload_pods(&self, w: &Workload) -> Result<Vec<Pod>, BackendError> {
        let names = manifests::Names::of(w);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &names.namespace);
        let selector = format!("{ENVIRONMENT_LABEL}={},{COMPONENT_LABEL}={}", w.environment_id, names.component);
        let pods = api
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| api_failure(&format!("list the pods of {}", names.workload), e))?;
        Ok(pods.items)
    }

    async fn job_logs_of(&self, w: &Workload, tail: usize) -> Result<JobLogs, BackendError> {
        if w.offering != Offering::TrainingJob {
            return Err(BackendError("only training jobs have logs".into()));
        }
        // Where it lives, or where an earlier placement put it (see `upstream_of`).
        let mut job = self.training_job(w).await?.map(|job| (job, w.clone()));
        if job.is_none()
            && let Some(other) = manifests::other_home(w)
        {
            job = self.training_job(&other).await?.map(|job| (job, other));
        }
        let (job, w) = job.ok_or_else(|| BackendError("the training Job is missing".into()))?;
        let w = &w;
        let names = manifests::Names::of(w);
        let mut pods = self.workload_pods(w).await?;
        // The newest pod is the one that ran last (with backoffLimit 0 there is one).
        pods.sort_by_key(|p| p.metadata.creation_timestamp.clone());
        let pod = pods.pop();
        let container = pod
            .as_ref()
            .and_then(|p| p.status.as_ref())
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.iter().find(|c| c.name == "training").cloned());
        let state = container.as_ref().and_then(|c| c.state.clone());
        let started = state.as_ref().is_some_and(|s| s.running.is_some() || s.terminated.is_some());
        let status = job.status.unwrap_or_default();
        let terminated = state.and_then(|s| s.terminated);
        let status = if status.succeeded.unwrap_or(0) > 0 {
            JobStatus::Succeeded
        } else if status.failed.unwrap_or(0) > 0 {
            let exit_code = terminated.as_ref().map(|t| t.exit_code);
            let reason = terminated.and_then(|t| t.reason).unwrap_or_else(|| "the job failed".to_owned());
            JobStatus::Failed { exit_code, reason }
        } else if started {
            JobStatus::Running
        } else {
            JobStatus::Pending
        };
        let lines = match pod.filter(|_| started) {
            Some(pod) => {
                let api: Api<Pod> = Api::namespaced(self.client.clone(), &names.namespace);
                let params = LogParams {
                    container: Some("training".to_owned()),
                    tail_lines: Some(i64::try_from(tail).unwrap_or(i64::MAX)),
                    ..LogParams::default()
                };
                let name = pod.name_any();
                let text = api
                    .logs(&name, &params)
                    .await
                    .map_err(|e| api_failure(&format!("read the log of pod {name}"), e))?;
                text.lines().map(str::to_owned).collect()
            }
            None => Vec::new(),
        };
        Ok(JobLogs { status, lines })
    }

    /// Scales an endpoint: MIG layouts (and dedication) on the nodes it now uses, quota and
    /// queue for every replica, the Deployment's replicas; when scaling down, waits until
    /// the surplus pods are gone and gives back the nodes the endpoint left.
    async fn scale_to(&self, w: &Workload, dropped: &[PlacedUnit]) -> Result<(), BackendError> {
        if w.offering != Offering::InferenceEndpoint {
            return Err(BackendError("only inference endpoints have replicas".into()));
        }
        self.configure_mig(w).await?;
        for m in manifests::namespace_bundle(w, &self.config.cluster) {
            if m.kind == manifests::RESOURCE_QUOTA || m.kind == CLUSTER_QUEUE {
                self.apply(&m).await?;
            }
        }
        self.apply_all(&manifests::workload_manifests(w)).await?;
        if dropped.is_empty() {
            return Ok(());
        }
        let replicas = usize::try_from(w.replicas()).unwrap_or(usize::MAX);
        while self.workload_pods(w).await?.len() > replicas {
            tokio::time::sleep(self.config.poll_interval).await;
        }
        let kept = w.nodes();
        let mut left: Vec<&str> =
            dropped.iter().map(|u| u.node.as_str()).filter(|n| !kept.iter().any(|k| k == n)).collect();
        left.sort();
        left.dedup();
        for node in left {
            let gone = Workload { units: dropped.iter().filter(|u| u.node == node).cloned().collect(), ..w.clone() };
            self.apply_node(&gone, node, NodeStage::Cleared).await?;
            self.apply_node(&gone, node, NodeStage::Released).await?;
        }
        Ok(())
    }

    /// Moves a dedicated cluster onto its units now: every node it holds (the replacement
    /// among them) labelled and tainted for its tenant, the nodes it left given back (kept
    /// for the tenant's other environments there), and the cluster's pods on those nodes
    /// deleted and waited out, so their controllers start them on the nodes it holds. The
    /// kubeconfig does not name nodes: the connection is the same.
    async fn move_to(&self, w: &Workload, dropped: &[PlacedUnit]) -> Result<Connection, BackendError> {
        if w.offering != Offering::DedicatedCluster {
            return Err(BackendError("only a dedicated cluster moves to another node".into()));
        }
        let nodes = w.nodes();
        if manifests::dedicates_nodes(w) {
            for node in &nodes {
                self.apply_node(w, node, NodeStage::Held).await?;
            }
        }
        let left = Workload { units: dropped.to_vec(), ..w.clone() };
        let mut leaving: Vec<String> = left.nodes().into_iter().filter(|n| !nodes.contains(n)).collect();
        leaving.dedup();
        let names = manifests::Names::of(w);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &names.namespace);
        for node in &leaving {
            // First the node stops being the tenant's, so nothing of the cluster is
            // scheduled there again; then what still runs there goes.
            if manifests::dedicates_nodes(w) {
                self.apply_node(&left, node, NodeStage::Released).await?;
            }
            let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
            let doing = format!("list the cluster's pods on {node}");
            let running = pods.list(&on_node).await.map_err(|e| api_failure(&doing, e))?.items;
            for pod in &running {
                match pods.delete(&pod.name_any(), &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(status)) if status.code == 404 => {}
                    Err(e) => return Err(api_failure(&format!("delete pod {} on {node}", pod.name_any()), e)),
                }
            }
            while !running.is_empty()
                && !pods.list(&on_node).await.map_err(|e| api_failure(&doing, e))?.items.is_empty()
            {
                tokio::time::sleep(self.config.poll_interval).await;
            }
        }
        let kubeconfig = self.kubeconfig(w).await?;
        Ok(manifests::connection(w, None, &self.api_server_url, Some(kubeconfig)))
    }

    fn api(&self, kind: &Kind, namespace: Option<&str>) -> Api<DynamicObject> {
        let resource = ApiResource {
            group: kind.group.to_owned(),
            version: kind.version.to_owned(),
            api_version: kind.api_version(),
            kind: kind.kind.to_owned(),
            plural: kind.plural.to_owned(),
        };
        match namespace {
            Some(ns) if kind.namespaced => Api::namespaced_with(self.client.clone(), ns, &resource),
            _ => Api::all_with(self.client.clone(), &resource),
        }
    }

    async fn apply(&self, m: &Manifest) -> Result<(), BackendError> {
        self.apply_answer(m).await.map_err(|e| api_failure(&format!("apply {} {}", m.kind.kind, m.name()), e))
    }

    async fn apply_answer(&self, m: &Manifest) -> Result<(), kube::Error> {
        // Forced: Berth is the one owner of these fields, also against a manager that set
        // them before (the GPU Operator's default `nvidia.com/mig.config`, for one).
        let params = PatchParams::apply(FIELD_MANAGER).force();
        self.api(&m.kind, m.namespace()).patch(m.name(), &params, &Patch::Apply(&m.object)).await?;
        Ok(())
    }

    /// The claims of the workload's volumes, in its namespace. In its tenant's namespace a
    /// claim stays between bookings and is applied again (a grown volume asks for more).
    /// In a namespace of its own the claim is new: the volume's kept PersistentVolume, if
    /// it has one, is named in the claim and pointed at it (claimRef with the claim's uid),
    /// so that the two bind to each other and to nothing else.
    async fn claim_volumes(&self, w: &Workload) -> Result<(), BackendError> {
        let names = manifests::Names::of(w);
        for v in &w.volumes {
            let kept = if names.shared { None } else { self.kept_volume_of(v.volume_id).await? };
            let claim = manifests::volume_claim(w, v, kept.as_deref(), &self.config.cluster);
            self.apply(&claim).await?;
            if let Some(pv) = kept {
                let api = self.api(&manifests::PERSISTENT_VOLUME_CLAIM, Some(&names.namespace));
                let found = api
                    .get_opt(claim.name())
                    .await
                    .map_err(|e| api_failure(&format!("read claim {}", claim.name()), e))?;
                let uid = found.and_then(|c| c.metadata.uid);
                let claim_ref = Some((names.namespace.as_str(), claim.name(), uid.as_deref()));
                self.apply(&manifests::kept_volume(&pv, v.volume_id, &names.tenant, claim_ref)).await?;
            }
        }
        Ok(())
    }

    /// For an environment in a namespace of its own: the PersistentVolume each of its
    /// volumes' claims bound to is labelled with the volume and kept (`Retain`), so that it
    /// outlives the namespace and the next environment's claim finds it.
    async fn keep_volumes(&self, w: &Workload) -> Result<(), BackendError> {
        let names = manifests::Names::of(w);
        if names.shared {
            return Ok(());
        }
        for v in &w.volumes {
            let api = self.api(&manifests::PERSISTENT_VOLUME_CLAIM, Some(&names.namespace));
            let claim = v.storage_name();
            let found = api.get_opt(&claim).await.map_err(|e| api_failure(&format!("read claim {claim}"), e))?;
            let bound =
                found.and_then(|c| c.data.pointer("/spec/volumeName").and_then(|n| n.as_str()).map(str::to_owned));
            if let Some(pv) = bound {
                self.apply(&manifests::kept_volume(&pv, v.volume_id, &names.tenant, None)).await?;
            }
        }
        Ok(())
    }

    /// The PersistentVolume Berth kept for volume `volume_id`, by its label.
    async fn kept_volume_of(&self, volume_id: i64) -> Result<Option<String>, BackendError> {
        let selector = ListParams::default().labels(&format!("{}={volume_id}", manifests::VOLUME_LABEL));
        let found = self
            .api(&manifests::PERSISTENT_VOLUME, None)
            .list(&selector)
            .await
            .map_err(|e| api_failure("list kept PersistentVolumes", e))?;
        Ok(found.items.first().map(|pv| pv.name_any()))
    }

    /// Removes a deleted volume's storage: its claim where it stays (a soft tenant's
    /// namespace), and every PersistentVolume kept for it, given back to its provisioner
    /// with `Delete`. `false` when there was nothing.
    async fn remove_volume_storage(&self, volume: &StoredVolume) -> Result<bool, BackendError> {
        let mut removed = false;
        if let Some(claim) = volume.location.strip_prefix(CLAIM_LOCATION) {
            let (namespace, name) = claim
                .split_once('/')
                .ok_or_else(|| BackendError(format!("volume {} has no claim at {claim}", volume.volume_id)))?;
            removed |= self.delete(&manifests::PERSISTENT_VOLUME_CLAIM, Some(namespace), name, false).await?;
        }
        let selector = ListParams::default().labels(&format!("{}={}", manifests::VOLUME_LABEL, volume.volume_id));
        let kept = self
            .api(&manifests::PERSISTENT_VOLUME, None)
            .list(&selector)
            .await
            .map_err(|e| api_failure("list kept PersistentVolumes", e))?;
        for pv in kept.items {
            self.apply(&manifests::released_volume(&pv.name_any())).await?;
            removed = true;
        }
        Ok(removed)
    }

    /// The environment's namespace bundle (its own, or its tenant's).
    async fn apply_bundle(&self, w: &Workload) -> Result<(), BackendError> {
        self.apply_namespace(&manifests::namespace_bundle(w, &self.config.cluster), &w.environment_id).await
    }

    /// A namespace bundle, for `whose` (an environment or a tenant). A LocalQueue's
    /// ClusterQueue cannot change, and an environment provisioned by an earlier Berth fed a
    /// queue of its own rather than its tenant's: such a LocalQueue is replaced.
    async fn apply_namespace(&self, bundle: &[Manifest], whose: &str) -> Result<(), BackendError> {
        for m in bundle {
            if m.kind != manifests::LOCAL_QUEUE {
                self.apply(m).await?;
                continue;
            }
            match self.apply_answer(m).await {
                Ok(()) => {}
                Err(kube::Error::Api(status)) if status.code == 422 => {
                    tracing::info!(
                        namespace = m.namespace(),
                        whose,
                        "LocalQueue feeds another ClusterQueue; replacing it"
                    );
                    self.delete(&m.kind, m.namespace(), m.name(), false).await?;
                    self.apply(m).await?;
                }
                Err(e) => return Err(api_failure(&format!("apply LocalQueue {}", m.name()), e)),
            }
        }
        Ok(())
    }

    async fn apply_all(&self, manifests: &[Manifest]) -> Result<(), BackendError> {
        for m in manifests {
            self.apply(m).await?;
        }
        Ok(())
    }

    /// Deletes an object; `false` when it was already gone.
    async fn delete(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        name: &str,
        foreground: bool,
    ) -> Result<bool, BackendError> {
        let params = if foreground { DeleteParams::foreground() } else { DeleteParams::background() };
        match self.api(kind, namespace).delete(name, &params).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
            // A namespace already being deleted answers 409: it is on its way out.
            Err(kube::Error::Api(status)) if status.code == 409 && kind.kind == "Namespace" => Ok(true),
            Err(e) => Err(api_failure(&format!("delete {} {name}", kind.kind), e)),
        }
    }

    async fn wait_gone(&self, m: &Manifest) -> Result<(), BackendError> {
        let api = self.api(&m.kind, m.namespace());
        loop {
            match api.get_opt(m.name()).await {
                Ok(None) => return Ok(()),
                Ok(Some(_)) => tokio::time::sleep(self.config.poll_interval).await,
                Err(e) => return Err(api_failure(&format!("read {} {}", m.kind.kind, m.name()), e)),
            }
        }
    }

    async fn apply_node(&self, w: &Workload, node: &str, stage: NodeStage) -> Result<(), BackendError> {
        let Some(m) = manifests::node_manifest(w, node, stage).map_err(|e| invalid(w, &e))? else {
            return Ok(());
        };
        if let Some(layout) = manifests::borrowed_mig_layout(w, node).map_err(|e| invalid(w, &e))? {
            self.store_mig_layout(&layout, w).await?;
        }
        self.apply(&m).await
    }

    /// The notebook token or inference API key: created once with a random value, then
    /// read back on every later call.
    async fn credential(&self, w: &Workload) -> Result<Option<String>, BackendError> {
        let Some(fresh) = manifests::credential_manifest(w, &workload_secret()) else {
            return Ok(None);
        };
        let api: Api<Secret> = Api::namespaced(self.client.clone(), fresh.namespace().unwrap_or_default());
        let doing = format!("read Secret {}", fresh.name());
        if let Some(value) = api.get_opt(fresh.name()).await.map_err(|e| api_failure(&doing, e))?.and_then(secret_value)
        {
            return Ok(Some(value));
        }
        let secret: Secret = serde_json::from_value(fresh.object.clone()).map_err(|e| invalid(w, &e.to_string()))?;
        match api.create(&PostParams::default(), &secret).await {
            Ok(_) => {}
            // Someone else created it first: theirs counts.
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => return Err(api_failure(&format!("create Secret {}", fresh.name()), e)),
        }
        let stored = api.get(fresh.name()).await.map_err(|e| api_failure(&doing, e))?;
        secret_value(stored).map(Some).ok_or_else(|| BackendError(format!("Secret {} holds no value", fresh.name())))
    }

    async fn kubeconfig(&self, w: &Workload) -> Result<String, BackendError> {
        let names = manifests::Names::of(w);
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &names.namespace);
        loop {
            let secret = api
                .get_opt(names.service_account_token)
                .await
                .map_err(|e| api_failure("read the service account token", e))?;
            let data = secret.and_then(|s| s.data).unwrap_or_default();
            // The token controller fills the Secret shortly after it is created.
            if let (Some(token), Some(ca)) = (data.get("token"), data.get("ca.crt")) {
                let token = String::from_utf8_lossy(&token.0).into_owned();
                let ca = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &ca.0);
                return Ok(manifests::kubeconfig(&self.api_server_url, &ca, &token, &names.namespace));
            }
            tokio::time::sleep(self.config.poll_interval).await;
        }
    }

    async fn wait_healthy(&self, w: &Workload) -> Result<String, BackendError> {
        let names = manifests::Names::of(w);
        let ns = names.namespace.as_str();
        let name = names.workload.as_str();
        loop {
            let ready = match w.offering {
                Offering::Notebook => {
                    let api: Api<StatefulSet> = Api::namespaced(self.client.clone(), ns);
                    let found = api.get_opt(name).await.map_err(|e| api_failure("read the notebook", e))?;
                    let found = found.ok_or_else(|| BackendError("the notebook's StatefulSet is missing".into()))?;
                    found.status.and_then(|s| s.ready_replicas).unwrap_or(0) >= 1
                }
                Offering::InferenceEndpoint => {
                    let api: Api<Deployment> = Api::namespaced(self.client.clone(), ns);
                    let found = api.get_opt(name).await.map_err(|e| api_failure("read the inference endpoint", e))?;
                    let found = found.ok_or_else(|| BackendError("the inference Deployment is missing".into()))?;
                    found.status.and_then(|s| s.ready_replicas).unwrap_or(0) >= 1
                }
                Offering::TrainingJob => {
                    let api: Api<Job> = Api::namespaced(self.client.clone(), ns);
                    let found = api.get_opt(name).await.map_err(|e| api_failure("read the training job", e))?;
                    let status = found.ok_or_else(|| BackendError("the training Job is missing".into()))?.status;
                    let status = status.unwrap_or_default();
                    if status.failed.unwrap_or(0) > 0 {
                        return Err(BackendError(format!(
                            "the training job failed; its logs: kubectl logs -n {ns} job/{name}"
                        )));
                    }
                    status.active.unwrap_or(0) > 0 || status.succeeded.unwrap_or(0) > 0
                }
                Offering::DedicatedCluster => {
                    let api: Api<Node> = Api::all(self.client.clone());
                    let mut all_ready = true;
                    for node in w.nodes() {
                        let found =
                            api.get_opt(&node).await.map_err(|e| api_failure(&format!("read node {node}"), e))?;
                        let found = found.ok_or_else(|| BackendError(format!("node {node} is not in the cluster")))?;
                        let conditions = found.status.and_then(|s| s.conditions).unwrap_or_default();
                        all_ready &= conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True");
                    }
                    all_ready
                }
            };
            if ready {
                return Ok(format!("{name} in {ns} is ready"));
            }
            tokio::time::sleep(self.config.poll_interval).await;
        }
    }

    /// Removes what the environment has where `w` places it: its objects in its tenant's
    /// namespace, or its own namespace.
    async fn remove_home(&self, w: &Workload) -> Result<(), BackendError> {
        let names = manifests::Names::of(w);
        if names.shared {
            self.delete_environment_objects(w).await
        } else {
            self.delete(&NAMESPACE, None, &names.namespace, false).await.map(|_| ())
        }
    }

    /// Deletes the environment's objects in its tenant's namespace by name (those already
    /// gone count as done) and waits until each is gone; the workload in the foreground,
    /// so its pods and their volumes go before it does.
    async fn delete_environment_objects(&self, w: &Workload) -> Result<(), BackendError> {
        let mut objects = manifests::workload_manifests(w);
        objects.extend(manifests::volume_claims(w));
        objects.extend(manifests::endpoint_manifest(w));
        objects.extend(manifests::proxy_access_manifest(w, &self.config.cluster));
        objects.extend(manifests::credential_manifest(w, ""));
        for m in objects {
            if self.delete(&m.kind, m.namespace(), m.name(), true).await? {
                self.wait_gone(&m).await?;
            }
        }
        Ok(())
    }
}

impl Backend for Kubernetes {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    /// A node's labels carry its one MIG layout, with every environment holding slices
    /// there, and its dedication, with the tenant's environments holding it; only an
    /// environment with slices or dedicated nodes writes them (see `apply_node`).
    fn writes_neighbours_state(&self, w: &Workload, step: Step) -> bool {
        matches!(step, Step::ConfigurePartition | Step::StartWorkload | Step::ClearPartition | Step::ReleaseCapacity)
            && (manifests::dedicates_nodes(w) || w.units.iter().any(|u| u.mig_profile.is_some()))
    }

    /// The DCGM exporters' pages now (see `dcgm`), each reading standing for the time since
    /// the last call.
    fn gpu_readings(&self) -> ReadingsFuture<'_> {
        Box::pin(async move {
            let Some(exporter) = &self.config.dcgm_exporter else {
                return Ok(Vec::new());
            };
            let now = crate::now_ms();
            let previous = self.readings_read_at.lock().unwrap_or_else(|p| p.into_inner()).replace(now);
            let period_s = previous.map_or(dcgm::FIRST_PERIOD_S, |then| ((now - then) as f64 / 1000.0).max(1.0));
            dcgm::collect(&self.client, exporter, now, period_s).await
        })
    }

    fn run<'a>(&'a self, workload: &'a Workload, step: Step) -> StepFuture<'a> {
        Box::pin(self.step(workload, step))
    }

    fn owned_objects(&self) -> OwnedFuture<'_> {
        Box::pin(self.owned())
    }

    fn remove_owned<'a>(&'a self, object: &'a OwnedObject) -> RemoveFuture<'a> {
        Box::pin(self.remove(object))
    }

    fn volume_size_rule(&self) -> &'static str {
        "A volume is a claim of its size on the cluster's storage class: storage that gives each claim a filesystem of its own (block storage, CephFS) stops writes past it; a subdirectory of a shared export (NFS) is held by nothing, and its use is not measured."
    }

    /// Every Ready node's kubelet stats summary, for the claims of `volumes` (see
    /// `volume_stats`).
    fn volumes_use<'a>(&'a self, volumes: &'a [StoredVolume]) -> VolumesUseFuture<'a> {
        Box::pin(volume_stats::collect(&self.client, volumes, self.config.node_stats_timeout))
    }

    fn volume_location(&self, workload: &Workload, volume: &VolumeMount) -> String {
        let names = manifests::Names::of(workload);
        if names.shared {
            format!("{CLAIM_LOCATION}{}/{}", names.namespace, volume.storage_name())
        } else {
            format!("{KEPT_LOCATION}{}={}", manifests::VOLUME_LABEL, volume.volume_id)
        }
    }

    fn remove_volume<'a>(&'a self, volume: &'a StoredVolume) -> RemoveFuture<'a> {
        Box::pin(self.remove_volume_storage(volume))
    }

    fn has_tenant_queues(&self) -> bool {
        true
    }

    /// The tenant's ClusterQueue, and for a soft tenant its namespace with everything in
    /// it for all its environments (see `manifests::tenant_namespace_bundle`).
    fn apply_tenant_queue<'a>(&'a self, queue: &'a TenantQueue) -> QueueFuture<'a> {
        Box::pin(async move {
            self.apply(&manifests::tenant_cluster_queue(queue, &self.config.cluster)).await?;
            if let Some(space) = &queue.space {
                let bundle = manifests::tenant_namespace_bundle(&queue.slug, space, &self.config.cluster);
                self.apply_namespace(&bundle, &queue.slug).await?;
            }
            Ok(())
        })
    }

    /// The tenant's ClusterQueue and namespace (everything in it goes with it).
    fn remove_tenant_queue<'a>(&'a self, slug: &'a str) -> RemoveFuture<'a> {
        Box::pin(async move {
            let queue = self.delete(&CLUSTER_QUEUE, None, &manifests::tenant_queue_name(slug), false).await?;
            let namespace = self.delete(&NAMESPACE, None, &manifests::tenant_namespace_name(slug), false).await?;
            Ok(queue || namespace)
        })
    }

    fn upstream<'a>(&'a self, workload: &'a Workload) -> UpstreamFuture<'a> {
        Box::pin(self.upstream_of(workload))
    }

    fn job_logs<'a>(&'a self, workload: &'a Workload, tail: usize) -> JobLogsFuture<'a> {
        Box::pin(self.job_logs_of(workload, tail))
    }

    /// Each check is a Job pinned to the node (see `checks`).
    fn runs_node_checks(&self) -> bool {
        true
    }

    fn run_check<'a>(&'a self, node: &'a CheckedNode, kind: CheckKind, level: CheckLevel) -> CheckFuture<'a> {
        Box::pin(self.run_check_job(node, kind, level))
    }

    fn moves_clusters(&self) -> bool {
        true
    }

    fn move_cluster<'a>(&'a self, workload: &'a Workload, dropped: &'a [PlacedUnit]) -> MoveFuture<'a> {
        Box::pin(self.move_to(workload, dropped))
    }

    fn scale<'a>(&'a self, workload: &'a Workload, dropped: &'a [PlacedUnit]) -> ScaleFuture<'a> {
        Box::pin(self.scale_to(workload, dropped))
    }
}

fn secret_value(secret: Secret) -> Option<String> {
    let data = secret.data?;
    data.get("value").map(|v| String::from_utf8_lossy(&v.0).into_owned())
}

/// The cause goes to the log; the owner sees what Berth was doing.
fn api_failure(doing: &str, error: kube::Error) -> BackendError {
    tracing::warn!(error = %error, "Kubernetes API call failed: {doing}");
    let why = match &error {
        kube::Error::Api(status) if status.code == 403 => "Berth is not allowed to",
        kube::Error::Api(status) if status.code == 422 || status.code == 400 => "the cluster refused to",
        kube::Error::Api(_) => "the Kubernetes API failed to",
        _ => "the Kubernetes API server could not be reached to",
    };
    BackendError(format!("{why} {doing}; the platform team has the details in Berth's log"))
}

fn invalid(w: &Workload, why: &str) -> BackendError {
    tracing::error!(environment = %w.environment_id, error = why, "cannot describe the environment to Kubernetes");
    BackendError(format!("Berth cannot describe this environment to Kubernetes: {why}"))
}
