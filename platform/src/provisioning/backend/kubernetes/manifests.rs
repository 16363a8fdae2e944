//! What Berth asks a Kubernetes cluster for, as pure functions of the workload: the
//! environment's namespace bundle (Pod Security, quota, limits, network policy, access,
//! Kueue queues), its workload and endpoint, node labels and taints, MIG layouts and the
//! dedicated cluster's kubeconfig. No I/O here, so every manifest can be golden-tested.
//!
//! Where an environment lives:
//! - A soft tenant's notebooks, training jobs and inference endpoints share the tenant's
//!   namespace, `berth-<slug>` (soft isolation): Pod Security
//!   `restricted`, a LimitRange, a default-deny NetworkPolicy (same namespace and DNS),
//!   Berth's Roles bound to the tenant's members, the LocalQueue feeding the tenant's
//!   ClusterQueue, and one ResourceQuota: the sum of what the tenant's environments there
//!   hold now (see [`tenant_namespace_bundle`]). Each environment's objects in it are named
//!   after its short id (`nb-<12 hex>`, `job-…`, `inf-…`, with `-token`, `-api-key`,
//!   `-proxy`) and carry its label; its teardown deletes exactly those. The namespace and
//!   everything tenant-wide carry the tenant's label and no environment's; they go when
//!   the tenant is deleted.
//! - A dedicated cluster, every environment of a hard or hybrid tenant, and platform
//!   staff's environments (they have no tenant) keep a namespace of their own,
//!   `berth-<tenant>-<12 hex>`, with the whole bundle, its quota equal to the booking, and
//!   go with it. A dedicated cluster's kubeconfig is limited to its namespace, and the
//!   namespace's node selector (PodNodeSelector/PodTolerationRestriction) to the tenant's
//!   dedicated nodes: a namespace shared with other environments could not say that.
//!
//! The tenant namespace's quota is computed from the database, the source of truth: by the
//! environment's own steps (configure, start: what the tenant's environments hold, read
//! when the step began, and this one; release: without this one) and by the tenant's
//! sync (see `tenant_queues`), which runs after each of those steps and after every
//! change of the tenant. All apply with the one field manager, so the last apply wins.
//! Why that converges when environments start and end at once: syncs of one tenant never
//! overlap, each reads the tenant's version before the holdings, and every change of the
//! holdings (and every step that applied a quota read earlier) raises the version after
//! it, so the last apply of all is a sync that read every change committed before it.
//! Until then an apply read earlier may land after a newer one: an environment starting
//! may briefly find the quota without it, and Kubernetes' controllers retry the pods it
//! refused until the sync that follows the environment's own step has landed; one ending
//! leaves the quota too large for as long.
//!
//! Kueue: each tenant has one ClusterQueue, `berth-tenant-<slug>`, whose quota mirrors the
//! tenant's Berth quota (see [`tenant_cluster_queue`]); every environment's LocalQueue
//! points at it. The namespace's ResourceQuota, equal to the booking, is what bounds an
//! environment; the tenant's queue mirrors the tenant-wide limit for Kueue's admission and
//! fair sharing. Platform staff belong to no tenant, so a staff environment keeps a
//! ClusterQueue of its own whose quota equals its booking. All queues share one cohort.

use std::collections::{BTreeMap, BTreeSet};

use berth_domain::catalog::{NODE_MEMORY_GB, NODE_VCPUS, Offering};
use berth_domain::image::PullPolicy;
use berth_domain::mig::{COMPUTE_SLICES, MigInstance, MigLayout, MigProfile, mig_parted_config};
use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::provisioning::backend::{Holding, PlacedUnit, TenantQueue, TenantSpace, VolumeMount, Workload};

// One module in three files: the parts share this file's vocabulary (`Names`, labels,
// `Manifest`), and callers name everything `manifests::…`.
mod namespaces;
use namespaces::role_binding;
mod checks;
mod nodes;

pub use checks::{CHECK_CONTAINER, CHECK_JOB_LABEL, CheckImages, check_job, check_job_name, check_namespace};
pub use namespaces::{
    has_own_cluster_queue, namespace_bundle, space_of, tenant_cluster_queue, tenant_namespace_bundle,
    tenant_queue_name, tenant_queue_quota, tenant_quota,
};
pub use nodes::{
    MigLayouts, NodeMigLayout, NodeStage, borrowed_mig_layout, cleared_mig_config, connection, kubeconfig,
    mig_parted_document, node_manifest, node_mig_layout,
};

pub const FIELD_MANAGER: &str = "berth";
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const ENVIRONMENT_LABEL: &str = "berth.dev/environment";
pub const TENANT_LABEL: &str = "berth.dev/tenant";
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
/// On a volume's claim and (for environments in namespaces of their own) its
/// PersistentVolume: the Berth volume's id.
pub const VOLUME_LABEL: &str = "berth.dev/volume";
pub const MIG_CONFIG_LABEL: &str = "nvidia.com/mig.config";
pub const MIG_STATE_LABEL: &str = "nvidia.com/mig.config.state";
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// The mig-parted config that disables MIG; the GPU Operator knows it by this name.
pub const MIG_DISABLED: &str = "all-disabled";
/// The ConfigMap key the GPU Operator's MIG manager reads.
pub const MIG_CONFIG_KEY: &str = "config.yaml";
/// Tenant label of platform staff's own environments (they belong to no tenant); no tenant
/// may take the slug, so a tenant's ClusterQueue never admits staff's namespaces.
pub const STAFF_TENANT: &str = berth_domain::tenancy::STAFF_SLUG;
/// Prefix of a tenant's ClusterQueue's name; the tenant's slug follows.
pub const TENANT_QUEUE_PREFIX: &str = "berth-tenant-";
/// Prefix of the mig-parted ConfigMap's annotations that name, per layout Berth wrote
/// (`layouts.berth.dev/<layout>`), the environments that wrote it: each may be about to
/// set it on a node, so the layout stays while any of them is live.
pub const MIG_LAYOUT_WRITERS_PREFIX: &str = "layouts.berth.dev/";
/// On a node whose MIG layout Berth set: the environments that keep it in place, so the
/// orphan sweep can tell a layout nobody needs any more.
pub const MIG_ENVIRONMENTS_ANNOTATION: &str = "berth.dev/mig-environments";
/// On a node dedicated to a tenant (labelled `berth.dev/tenant=<tenant>` and tainted for
/// it): the tenant's environments that hold it, so it is given back only when the last of
/// them leaves, and the orphan sweep can tell a dedication nobody needs any more.
pub const TENANT_ENVIRONMENTS_ANNOTATION: &str = "berth.dev/tenant-environments";
/// Jupyter's user (jovyan) and group (users): restricted Pod Security needs a non-root uid.
const RUN_AS_USER: i64 = 1000;
const RUN_AS_GROUP: i64 = 100;
const NOTEBOOK_PORT: i64 = 8888;
const INFERENCE_PORT: i64 = 8000;

/// Cluster settings the manifests depend on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSettings {
    /// Where the GPU Operator runs and reads its mig-parted ConfigMap.
    pub gpu_operator_namespace: String,
    /// The mig-parted ConfigMap Berth writes (the ClusterPolicy's `migManager.config.name`).
    pub mig_config_map: String,
    /// The Kueue ResourceFlavor the ClusterQueues use.
    pub queue_flavor: String,
    /// The Kueue cohort of every ClusterQueue Berth makes.
    pub cohort: String,
    /// Prefix of Kubernetes user names for Berth members (e.g. `oidc:` as the API server's
    /// `--oidc-username-prefix`); the member's email follows it.
    pub user_prefix: String,
    /// Persistent storage an environment may claim.
    pub storage_gb: u32,
    /// The namespace Berth runs in: its proxy may reach notebooks and endpoints from there.
    pub berth_namespace: String,
    /// The cluster's DNS domain, for Services' names (`<svc>.<ns>.svc.<domain>`).
    pub cluster_domain: String,
    /// The StorageClass of volumes' claims (`--kube-storage-class`); `None` for the
    /// cluster's default. It should offer ReadWriteMany, which the claims ask for.
    pub storage_class: Option<String>,
    /// Where node health checks run as Jobs (`checks`): a namespace of Berth's that
    /// allows privileged pods.
    pub check_namespace: String,
    /// The images node health checks run in.
    pub check_images: CheckImages,
}

impl Default for ClusterSettings {
    fn default() -> ClusterSettings {
        ClusterSettings {
            gpu_operator_namespace: "gpu-operator".into(),
            mig_config_map: "berth-mig-parted-config".into(),
            queue_flavor: "default-flavor".into(),
            cohort: "berth".into(),
            user_prefix: String::new(),
            storage_gb: 100,
            berth_namespace: "berth".into(),
            cluster_domain: "cluster.local".into(),
            storage_class: None,
            check_namespace: "berth-node-checks".into(),
            check_images: CheckImages::default(),
        }
    }
}

/// A kind of object, enough to address it through the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub namespaced: bool,
}

impl Kind {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.to_owned() } else { format!("{}/{}", self.group, self.version) }
    }
}

const fn kind(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
) -> Kind {
    Kind { group, version, kind, plural, namespaced }
}

pub const NAMESPACE: Kind = kind("", "v1", "Namespace", "namespaces", false);
pub const NODE: Kind = kind("", "v1", "Node", "nodes", false);
pub const RESOURCE_QUOTA: Kind = kind("", "v1", "ResourceQuota", "resourcequotas", true);
pub const LIMIT_RANGE: Kind = kind("", "v1", "LimitRange", "limitranges", true);
pub const SERVICE: Kind = kind("", "v1", "Service", "services", true);
pub const SECRET: Kind = kind("", "v1", "Secret", "secrets", true);
pub const SERVICE_ACCOUNT: Kind = kind("", "v1", "ServiceAccount", "serviceaccounts", true);
pub const CONFIG_MAP: Kind = kind("", "v1", "ConfigMap", "configmaps", true);
pub const PERSISTENT_VOLUME_CLAIM: Kind = kind("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", true);
pub const NETWORK_POLICY: Kind = kind("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", true);
pub const ROLE: Kind = kind("rbac.authorization.k8s.io", "v1", "Role", "roles", true);
pub const ROLE_BINDING: Kind = kind("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", true);
pub const STATEFUL_SET: Kind = kind("apps", "v1", "StatefulSet", "statefulsets", true);
pub const DEPLOYMENT: Kind = kind("apps", "v1", "Deployment", "deployments", true);
pub const JOB: Kind = kind("batch", "v1", "Job", "jobs", true);
pub const PERSISTENT_VOLUME: Kind = kind("", "v1", "PersistentVolume", "persistentvolumes", false);
pub const CLUSTER_QUEUE: Kind = kind("kueue.x-k8s.io", "v1beta1", "ClusterQueue", "clusterqueues", false);
pub const LOCAL_QUEUE: Kind = kind("kueue.x-k8s.io", "v1beta1", "LocalQueue", "localqueues", true);

/// One object Berth wants to exist, as the API takes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    pub kind: Kind,
    pub object: Value,
}

impl Manifest {
    fn new(kind: Kind, object: Value) -> Manifest {
        Manifest { kind, object }
    }

    pub fn name(&self) -> &str {
        self.object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default()
    }

    pub fn namespace(&self) -> Option<&str> {
        self.object.pointer("/metadata/namespace").and_then(Value::as_str)
    }
}

/// The names of an environment's objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub tenant: String,
    /// The environment's namespace: its tenant's (shared), or its own.
    pub namespace: String,
    /// Whether the namespace is the tenant's, shared with its other environments.
    pub shared: bool,
    /// The ClusterQueue its LocalQueue points at: its tenant's, or for platform staff its
    /// own, named as the namespace (cluster-wide unique).
    pub cluster_queue: String,
    pub local_queue: String,
    /// The StatefulSet, Job or Deployment, and its Service.
    pub workload: String,
    /// What the workload is (`notebook`, `training`, `inference`, `cluster`): its pods'
    /// component label, with the environment's label selecting them.
    pub component: &'static str,
    /// The notebook token or inference API key.
    pub credential: String,
    /// The NetworkPolicy that lets Berth's proxy reach the workload.
    pub proxy_policy: String,
    /// The dedicated cluster's ServiceAccount and its token Secret.
    pub service_account: &'static str,
    pub service_account_token: &'static str,
}

impl Names {
    pub fn of(w: &Workload) -> Names {
        let tenant = w.tenant.slug.clone().unwrap_or_else(|| STAFF_TENANT.to_owned());
        // 12 hex digits of the environment's id keep `berth-<40-char slug>-<id>` within the
        // 63 characters of a namespace name while two environments practically never collide.
        let short: String = w.environment_id.chars().filter(char::is_ascii_alphanumeric).take(12).collect();
        let short = short.to_ascii_lowercase();
        let shared = shares_tenant_namespace(w);
        let namespace = if shared { tenant_namespace_name(&tenant) } else { format!("berth-{tenant}-{short}") };
        let component = match w.offering {
            Offering::Notebook => "notebook",
            Offering::TrainingJob => "training",
            Offering::InferenceEndpoint => "inference",
            Offering::DedicatedCluster => "cluster",
        };
        let credential_suffix = match w.offering {
            Offering::InferenceEndpoint => "api-key",
            _ => "token",
        };
        // In a namespace of its own the names say what the object is; in the tenant's, the
        // environment's short id keeps them apart from its neighbours'.
        let (workload, credential, proxy_policy) = if shared {
            let prefix = match w.offering {
                Offering::Notebook => "nb",
                Offering::TrainingJob => "job",
                Offering::InferenceEndpoint => "inf",
                Offering::DedicatedCluster => "cluster",
            };
            let workload = format!("{prefix}-{short}");
            (workload.clone(), format!("{workload}-{credential_suffix}"), format!("{workload}-proxy"))
        } else {
            let credential = match w.offering {
                Offering::InferenceEndpoint => "inference-api-key",
                _ => "notebook-token",
            };
            (component.to_owned(), credential.to_owned(), PROXY_POLICY.to_owned())
        };
        Names {
            cluster_queue: match &w.tenant.slug {
                Some(slug) => tenant_queue_name(slug),
                None => namespace.clone(),
            },
            namespace,
            shared,
            tenant,
            local_queue: "berth".into(),
            workload,
            component,
            credential,
            proxy_policy,
            service_account: "tenant",
            service_account_token: "tenant-token",
        }
    }
}

/// `managed-by`, environment and tenant: on everything Berth creates.
pub fn owner_labels(w: &Workload) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_owned(), FIELD_MANAGER.to_owned()),
        (ENVIRONMENT_LABEL.to_owned(), w.environment_id.clone()),
        (TENANT_LABEL.to_owned(), Names::of(w).tenant),
    ])
}

/// `managed-by` and tenant: on what a tenant's environments share (its namespace and
/// what is in it for all of them), which no environment explains alone.
pub fn tenant_labels(slug: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_owned(), FIELD_MANAGER.to_owned()),
        (TENANT_LABEL.to_owned(), slug.to_owned()),
    ])
}

fn metadata(w: &Workload, name: &str, namespace: Option<&str>) -> Value {
    labelled(&owner_labels(w), name, namespace)
}

fn labelled(labels: &BTreeMap<String, String>, name: &str, namespace: Option<&str>) -> Value {
    let mut meta = json!({ "name": name, "labels": labels });
    if let Some(ns) = namespace {
        meta["namespace"] = json!(ns);
    }
    meta
}

/// Whether the environment lives in its tenant's namespace: a soft tenant's notebooks,
/// training jobs and inference endpoints do (see the module's comment and
/// `berth_domain::tenancy::shares_tenant_space`); platform staff's have no tenant.
pub fn shares_tenant_namespace(w: &Workload) -> bool {
    w.tenant.slug.is_some() && berth_domain::tenancy::shares_tenant_space(w.offering, w.tenant.isolation)
}

/// The environment placed as it would be in the other home: in its own namespace when it
/// now lives in its tenant's, and the other way round. An environment an earlier Berth
/// provisioned in a namespace of its own, or whose tenant changed isolation while it ran,
/// is there; teardown looks in both, so no workload outlives its capacity. `None` for
/// what only ever has a namespace of its own (a dedicated cluster, platform staff's).
pub fn other_home(w: &Workload) -> Option<Workload> {
    if w.tenant.slug.is_none() || w.offering == Offering::DedicatedCluster {
        return None;
    }
    let isolation = if shares_tenant_namespace(w) { Isolation::Hard } else { Isolation::Soft };
    Some(Workload {
        tenant: crate::provisioning::backend::TenantScope { isolation, ..w.tenant.clone() },
        tenant_holdings: Vec::new(),
        ..w.clone()
    })
}

/// A soft tenant's namespace.
pub fn tenant_namespace_name(slug: &str) -> String {
    format!("berth-{slug}")
}

/// Whether the environment's nodes are dedicated to its tenant: a dedicated cluster's
/// always, any environment's of a hard or hybrid tenant too (booking keeps every other
/// tenant off such a node while the tenant holds it).
pub fn dedicates_nodes(w: &Workload) -> bool {
    w.offering == Offering::DedicatedCluster || w.tenant.isolation != Isolation::Soft
}

/// The extended resources the booked units are, with their counts: `nvidia.com/gpu` for
/// whole GPUs, `nvidia.com/mig-<profile>` for MIG slices (the device plugin's mixed strategy),
/// `nvidia.com/gpu.shared` for a development share (the device plugin's time-slicing with
/// `renameByDefault`, so a share can never be mistaken for a whole GPU).
pub fn gpu_resources(w: &Workload) -> BTreeMap<String, i64> {
    gpu_resources_of(&w.units)
}

/// [`gpu_resources`] of some units.
pub fn gpu_resources_of(units: &[PlacedUnit]) -> BTreeMap<String, i64> {
    let mut counts = BTreeMap::new();
    for u in units {
        let resource = match &u.mig_profile {
            Some(profile) => mig_resource(profile),
            None if u.slice_size < i64::from(berth_domain::mig::MEMORY_SLICES) => "nvidia.com/gpu.shared".to_owned(),
            None => "nvidia.com/gpu".to_owned(),
        };
        *counts.entry(resource).or_insert(0) += 1;
    }
    counts
}

/// The extended resource the device plugin (mixed strategy) advertises a MIG profile as:
/// `nvidia.com/mig-<profile>`, the `+` of a media-extension profile written `.`
/// (`1g.10gb+me` is `nvidia.com/mig-1g.10gb.me`), as resource names allow no `+`.
pub fn mig_resource(profile: &str) -> String {
    format!("nvidia.com/mig-{}", profile.replace('+', "."))
}

fn dedicated_toleration(tenant: &str) -> Value {
    json!({ "key": TENANT_LABEL, "operator": "Equal", "value": tenant, "effect": "NoSchedule" })
}

fn component_labels(w: &Workload, names: &Names) -> BTreeMap<String, String> {
    let mut labels = owner_labels(w);
    labels.insert(COMPONENT_LABEL.to_owned(), names.component.to_owned());
    labels
}

/// The pod of a notebook, training job or inference endpoint: restricted Pod Security,
/// pinned to the booked nodes, requesting exactly the booked CPUs, memory and GPUs.
fn pod_template(w: &Workload, names: &Names, container: Value) -> Value {
    let mut limits = json!({ "cpu": w.vcpus.to_string(), "memory": format!("{}Gi", w.memory_gb) });
    // Each replica asks for its share: the booked size (the units hold every replica's).
    let replicas = i64::from(w.replicas());
    for (resource, count) in gpu_resources(w) {
        limits[resource] = json!((count / replicas).to_string());
    }
    let mut container = container;
    container["resources"] = json!({ "requests": limits, "limits": limits });
    container["securityContext"] = json!({
        "allowPrivilegeEscalation": false,
        "capabilities": { "drop": ["ALL"] },
        "runAsNonRoot": true,
        "seccompProfile": { "type": "RuntimeDefault" },
    });
    // GPU nodes usually carry the GPU Operator's `nvidia.com/gpu` taint.
    let mut tolerations = vec![json!({ "key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule" })];
    let mut spec = json!({
        "automountServiceAccountToken": false,
        "securityContext": {
            "runAsNonRoot": true, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_GROUP, "fsGroup": RUN_AS_GROUP,
            "seccompProfile": { "type": "RuntimeDefault" },
        },
        "affinity": { "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": { "nodeSelectorTerms": [
            { "matchExpressions": [{ "key": HOSTNAME_LABEL, "operator": "In", "values": w.nodes() }] },
        ] } } },
        "containers": [container],
    });
    if dedicates_nodes(w) {
        spec["nodeSelector"] = json!({ TENANT_LABEL: names.tenant });
        tolerations.push(dedicated_toleration(&names.tenant));
    }
    spec["tolerations"] = json!(tolerations);
    // Berth's volumes, each its claim mounted at its path.
    if !w.volumes.is_empty() {
        let volumes: Vec<Value> = w
            .volumes
            .iter()
            .map(|v| json!({ "name": volume_name(v), "persistentVolumeClaim": { "claimName": v.storage_name() } }))
            .collect();
        spec["volumes"] = json!(volumes);
        let mounts = spec["containers"][0]["volumeMounts"].as_array().cloned().unwrap_or_default();
        let mounts: Vec<Value> = mounts
            .into_iter()
            .chain(w.volumes.iter().map(|v| json!({ "name": volume_name(v), "mountPath": v.mount_path })))
            .collect();
        spec["containers"][0]["volumeMounts"] = json!(mounts);
    }
    json!({ "metadata": { "labels": component_labels(w, names) }, "spec": spec })
}

fn credential_env(names: &Names, variable: &str) -> Value {
    json!({ "name": variable, "valueFrom": { "secretKeyRef": { "name": names.credential, "key": "value" } } })
}

/// The workload's objects: StatefulSet, Job or Deployment; for a dedicated cluster the
/// tenant's ServiceAccount, its token Secret and its RoleBinding.
pub fn workload_manifests(w: &Workload) -> Vec<Manifest> {
    let names = Names::of(w);
    let ns = names.namespace.as_str();
    let selector = json!({ "matchLabels": { ENVIRONMENT_LABEL: w.environment_id, COMPONENT_LABEL: names.component } });
    let image = w.image.clone().unwrap_or_default();
    // A digest is pulled once per node; a tag is looked up again at each start.
    let pull = PullPolicy::of(&image).kubernetes();
    match w.offering {
        Offering::Notebook => {
            // Each environment has an origin of its own, so Jupyter serves at its root (said
            // explicitly: some images set another base URL). The proxy keeps the browser's
            // Host, which Jupyter's WebSocket origin check compares with the Origin.
            let notebook_args = "--ServerApp.base_url=/ --ServerApp.trust_xheaders=True";
            // A notebook with its owner's home volume mounts it at the working directory;
            // one without (booked before volumes) keeps a claim of its own there.
            let has_home = w.volumes.iter().any(|v| v.mount_path == berth_domain::volume::HOME_MOUNT);
            let mut container = json!({
                "name": "notebook", "image": image, "imagePullPolicy": pull,
                "ports": [{ "name": "http", "containerPort": NOTEBOOK_PORT }],
                "env": [credential_env(&names, "JUPYTER_TOKEN"), { "name": "NOTEBOOK_ARGS", "value": notebook_args }],
            });
            if !has_home {
                container["volumeMounts"] = json!([{ "name": "work", "mountPath": "/home/jovyan/work" }]);
            }
            let mut spec = json!({
                "replicas": 1, "serviceName": names.workload, "selector": selector,
                "template": pod_template(w, &names, container),
            });
            if !has_home {
                spec["persistentVolumeClaimRetentionPolicy"] =
                    json!({ "whenDeleted": "Delete", "whenScaled": "Retain" });
                spec["volumeClaimTemplates"] = json!([{
                    "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": { "name": "work", "labels": owner_labels(w) },
                    "spec": { "accessModes": ["ReadWriteOnce"], "resources": { "requests": { "storage": "20Gi" } } },
                }]);
            }
            vec![Manifest::new(
                STATEFUL_SET,
                json!({
                    "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": metadata(w, &names.workload, Some(ns)),
                    "spec": spec,
                }),
            )]
        }
        Offering::TrainingJob => {
            let mut container = json!({ "name": "training", "image": image, "imagePullPolicy": pull });
            if let Some(command) = &w.command {
                container["command"] = json!(["/bin/sh", "-c", command]);
            }
            let mut template = pod_template(w, &names, container);
            template["spec"]["restartPolicy"] = json!("Never");
            // Kueue admits the Job through the environment's LocalQueue. `suspend` is left
            // to Kueue's webhook: applying `suspend: true` again would stop a running job.
            let mut meta = metadata(w, &names.workload, Some(ns));
            meta["labels"]["kueue.x-k8s.io/queue-name"] = json!(names.local_queue);
            vec![Manifest::new(
                JOB,
                json!({
                    "apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
                    "spec": { "backoffLimit": 0, "completions": 1, "parallelism": 1, "template": template },
                }),
            )]
        }
        Offering::InferenceEndpoint => {
            let mut container = json!({
                "name": "inference", "image": image, "imagePullPolicy": pull,
                "ports": [{ "name": "http", "containerPort": INFERENCE_PORT }],
                "env": [credential_env(&names, "BERTH_API_KEY")],
            });
            if let Some(command) = &w.command {
                container["command"] = json!(["/bin/sh", "-c", command]);
            }
            // The model server's arguments follow the image's entrypoint; its variables
            // sit beside the API key (values in the Deployment, read by those who may read
            // the namespace's Deployments: the tenant's own and the platform's).
            let args = w.serving.container_args();
            if !args.is_empty() {
                container["args"] = json!(args);
            }
            for var in w.serving.container_env() {
                if let Some(env) = container["env"].as_array_mut() {
                    env.push(json!({ "name": var.name, "value": var.value }));
                }
            }
            vec![Manifest::new(
                DEPLOYMENT,
                json!({
                    "apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata(w, &names.workload, Some(ns)),
                    "spec": { "replicas": w.replicas(), "selector": selector, "template": pod_template(w, &names, container) },
                }),
            )]
        }
        Offering::DedicatedCluster => {
            let mut token_meta = metadata(w, names.service_account_token, Some(ns));
            token_meta["annotations"] = json!({ "kubernetes.io/service-account.name": names.service_account });
            let subjects = vec![json!({ "kind": "ServiceAccount", "name": names.service_account, "namespace": ns })];
            vec![
                Manifest::new(
                    SERVICE_ACCOUNT,
                    json!({
                        "apiVersion": "v1", "kind": "ServiceAccount",
                        "metadata": metadata(w, names.service_account, Some(ns)),
                        "automountServiceAccountToken": false,
                    }),
                ),
                Manifest::new(
                    SECRET,
                    json!({ "apiVersion": "v1", "kind": "Secret", "metadata": token_meta, "type": "kubernetes.io/service-account-token" }),
                ),
                role_binding(&owner_labels(w), ns, "berth-cluster-user", "berth-edit", subjects),
            ]
        }
    }
}

/// A Berth volume's name inside the pod.
fn volume_name(v: &VolumeMount) -> String {
    format!("vol-{}", v.volume_id)
}

/// The claim of Berth volume `v` in the environment's namespace: `berth-vol-<id>`,
/// ReadWriteMany on the configured StorageClass, labelled with the volume and the tenant
/// and never with the environment, and owned by nothing, so no teardown and no garbage
/// collector takes it. In a soft tenant's namespace it stays between bookings; in a
/// namespace of the environment's own it goes with the namespace, and its
/// PersistentVolume, kept (`Retain`, see [`kept_volume`]), is bound to the next
/// environment's claim (`bound_to`: the PersistentVolume's name, once Berth knows it).
pub fn volume_claim(w: &Workload, v: &VolumeMount, bound_to: Option<&str>, settings: &ClusterSettings) -> Manifest {
    let names = Names::of(w);
    let mut labels = tenant_labels(&names.tenant);
    labels.insert(VOLUME_LABEL.to_owned(), v.volume_id.to_string());
    let mut spec = json!({
        "accessModes": ["ReadWriteMany"],
        "resources": { "requests": { "storage": format!("{}Gi", v.size_gib) } },
    });
    if let Some(class) = &settings.storage_class {
        spec["storageClassName"] = json!(class);
    }
    if let Some(pv) = bound_to {
        spec["volumeName"] = json!(pv);
    }
    Manifest::new(
        PERSISTENT_VOLUME_CLAIM,
        json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": labelled(&labels, &v.storage_name(), Some(&names.namespace)), "spec": spec,
        }),
    )
}

/// What Berth sets on the PersistentVolume of a volume that lives in environments' own
/// namespaces: its labels (found again by [`VOLUME_LABEL`]), `Retain` so that it outlives
/// the claim its namespace takes with it, and (`claim`: namespace, name and uid) the claim
/// it is bound to next: set before that claim binds, so the PersistentVolume controller
/// binds exactly that one.
pub fn kept_volume(pv: &str, volume_id: i64, tenant: &str, claim: Option<(&str, &str, Option<&str>)>) -> Manifest {
    let mut labels = tenant_labels(tenant);
    labels.insert(VOLUME_LABEL.to_owned(), volume_id.to_string());
    let mut spec = json!({ "persistentVolumeReclaimPolicy": "Retain" });
    if let Some((namespace, name, uid)) = claim {
        spec["claimRef"] =
            json!({ "apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": namespace, "name": name });
        if let Some(uid) = uid {
            spec["claimRef"]["uid"] = json!(uid);
        }
    }
    Manifest::new(
        PERSISTENT_VOLUME,
        json!({ "apiVersion": "v1", "kind": "PersistentVolume", "metadata": labelled(&labels, pv, None), "spec": spec }),
    )
}

/// A deleted volume's PersistentVolume given back to its provisioner: `Delete`, so the
/// storage goes with it once no claim holds it.
pub fn released_volume(pv: &str) -> Manifest {
    Manifest::new(
        PERSISTENT_VOLUME,
        json!({
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": { "name": pv },
            "spec": { "persistentVolumeReclaimPolicy": "Delete" },
        }),
    )
}

/// The volume claims a notebook's StatefulSet makes (`<template>-<statefulset>-<ordinal>`),
/// by name, for deleting them: the StatefulSet's retention policy deletes them too, but
/// teardown does not leave the tenant's namespace to the garbage collector's timing.
pub fn volume_claims(w: &Workload) -> Vec<Manifest> {
    if w.offering != Offering::Notebook || w.volumes.iter().any(|v| v.mount_path == berth_domain::volume::HOME_MOUNT) {
        return Vec::new();
    }
    let names = Names::of(w);
    let name = format!("work-{}-0", names.workload);
    vec![Manifest::new(
        PERSISTENT_VOLUME_CLAIM,
        json!({ "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata(w, &name, Some(&names.namespace)) }),
    )]
}

/// The Service in front of a notebook or an inference endpoint.
pub fn endpoint_manifest(w: &Workload) -> Option<Manifest> {
    let names = Names::of(w);
    let port = match w.offering {
        Offering::Notebook => NOTEBOOK_PORT,
        Offering::InferenceEndpoint => INFERENCE_PORT,
        Offering::TrainingJob | Offering::DedicatedCluster => return None,
    };
    Some(Manifest::new(
        SERVICE,
        json!({
            "apiVersion": "v1", "kind": "Service", "metadata": metadata(w, &names.workload, Some(&names.namespace)),
            "spec": {
                "type": "ClusterIP",
                "selector": { ENVIRONMENT_LABEL: w.environment_id, COMPONENT_LABEL: names.component },
                "ports": [{ "name": "http", "port": port, "targetPort": "http", "protocol": "TCP" }],
            },
        }),
    ))
}

/// Lets Berth's proxy (pods in Berth's namespace) reach the notebook or endpoint's port,
/// the one way in besides the namespace itself: applied with the Service, removed with it.
pub fn proxy_access_manifest(w: &Workload, settings: &ClusterSettings) -> Option<Manifest> {
    endpoint_manifest(w)?;
    let names = Names::of(w);
    Some(Manifest::new(
        NETWORK_POLICY,
        json!({
            "apiVersion": NETWORK_POLICY.api_version(), "kind": "NetworkPolicy",
            "metadata": metadata(w, &names.proxy_policy, Some(&names.namespace)),
            "spec": {
                "podSelector": { "matchLabels": { ENVIRONMENT_LABEL: w.environment_id, COMPONENT_LABEL: names.component } },
                "policyTypes": ["Ingress"],
                "ingress": [{
                    "from": [{ "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": settings.berth_namespace } } }],
                    "ports": [{ "protocol": "TCP", "port": "http" }],
                }],
            },
        }),
    ))
}

/// The NetworkPolicy that lets Berth's proxy in, in a namespace of the environment's own
/// (in its tenant's: `<workload>-proxy`).
pub const PROXY_POLICY: &str = "berth-proxy";

/// Where Berth's proxy reaches a notebook or an endpoint: its Service's cluster DNS name.
pub fn upstream_base_url(w: &Workload, settings: &ClusterSettings) -> Option<String> {
    let names = Names::of(w);
    let port = match w.offering {
        Offering::Notebook => NOTEBOOK_PORT,
        Offering::InferenceEndpoint => INFERENCE_PORT,
        Offering::TrainingJob | Offering::DedicatedCluster => return None,
    };
    Some(format!("http://{}.{}.svc.{}:{port}", names.workload, names.namespace, settings.cluster_domain))
}

/// The Secret holding a notebook token or an inference API key, created once (a random
/// value cannot be re-applied without changing it).
pub fn credential_manifest(w: &Workload, value: &str) -> Option<Manifest> {
    let names = Names::of(w);
    matches!(w.offering, Offering::Notebook | Offering::InferenceEndpoint).then(|| {
        Manifest::new(
            SECRET,
            json!({
                "apiVersion": "v1", "kind": "Secret", "metadata": metadata(w, &names.credential, Some(&names.namespace)),
                "type": "Opaque", "stringData": { "value": value },
            }),
        )
    })
}
