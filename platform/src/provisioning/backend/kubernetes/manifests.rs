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
use berth_domain::mig::{COMPUTE_SLICES, MigInstance, MigLayout, MigProfile, mig_parted_config};
use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::provisioning::backend::{Holding, PlacedUnit, TenantQueue, TenantSpace, Workload};

pub const FIELD_MANAGER: &str = "berth";
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const ENVIRONMENT_LABEL: &str = "berth.dev/environment";
pub const TENANT_LABEL: &str = "berth.dev/tenant";
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
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

/// The namespace bundle: everything the environment's namespace holds before a workload
/// runs. In its tenant's namespace that is the tenant's bundle, its quota holding what the
/// tenant's other environments there hold and this one.
pub fn namespace_bundle(w: &Workload, settings: &ClusterSettings) -> Vec<Manifest> {
    let names = Names::of(w);
    if names.shared {
        return tenant_namespace_bundle(&names.tenant, &space_of(w, true), settings);
    }
    let ns = names.namespace.as_str();
    let labels = owner_labels(w);
    let mut bundle = vec![
        namespace(w, &names),
        resource_quota(&labels, ns, &[Holding::of(w)], false, settings),
        limit_range(&labels, ns, w.vcpus, w.memory_gb, settings),
        network_policy(&labels, ns),
    ];
    bundle.extend(access(&labels, ns, &w.tenant.members, settings));
    if has_own_cluster_queue(w) {
        bundle.push(cluster_queue(w, &names, settings));
    }
    bundle.push(local_queue(&labels, &names.local_queue, ns, &names.cluster_queue));
    bundle
}

/// The tenant's namespace as environment `w` sees it: the tenant's members, what its other
/// environments there hold, and (while `holding`) what `w` holds.
pub fn space_of(w: &Workload, holding: bool) -> TenantSpace {
    let mut holdings: Vec<Holding> =
        w.tenant_holdings.iter().filter(|h| h.environment_id != w.environment_id).cloned().collect();
    if holding {
        holdings.push(Holding::of(w));
    }
    holdings.sort_by(|a, b| a.environment_id.cmp(&b.environment_id));
    TenantSpace { members: w.tenant.members.clone(), holdings }
}

/// A soft tenant's namespace and what it holds for all of the tenant's environments there:
/// Pod Security, one ResourceQuota for what they hold together, a LimitRange (a container
/// may be as large as a node; the quota bounds them all), the default-deny NetworkPolicy,
/// Berth's Roles bound to the members, and the LocalQueue feeding the tenant's
/// ClusterQueue. Everything carries the tenant's label and no environment's.
pub fn tenant_namespace_bundle(slug: &str, space: &TenantSpace, settings: &ClusterSettings) -> Vec<Manifest> {
    let ns = tenant_namespace_name(slug);
    let labels = tenant_labels(slug);
    let mut meta = labelled(&labels, &ns, None);
    pod_security(&mut meta);
    let mut bundle = vec![
        Manifest::new(NAMESPACE, json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": meta })),
        tenant_quota(slug, space, settings),
        limit_range(&labels, &ns, NODE_VCPUS, NODE_MEMORY_GB, settings),
        network_policy(&labels, &ns),
    ];
    bundle.extend(access(&labels, &ns, &space.members, settings));
    bundle.push(local_queue(&labels, "berth", &ns, &tenant_queue_name(slug)));
    bundle
}

/// The ResourceQuota of a soft tenant's namespace: what its environments there hold.
pub fn tenant_quota(slug: &str, space: &TenantSpace, settings: &ClusterSettings) -> Manifest {
    resource_quota(&tenant_labels(slug), &tenant_namespace_name(slug), &space.holdings, true, settings)
}

/// Berth's Roles and the tenant's members bound to them by their Berth role.
fn access(
    labels: &BTreeMap<String, String>,
    ns: &str,
    members: &[(String, Role)],
    settings: &ClusterSettings,
) -> Vec<Manifest> {
    let mut bundle = Vec::new();
    for (role, rules) in [("berth-admin", admin_rules()), ("berth-edit", edit_rules()), ("berth-view", view_rules())] {
        bundle.push(Manifest::new(
            ROLE,
            json!({ "apiVersion": ROLE.api_version(), "kind": "Role", "metadata": labelled(labels, role, Some(ns)), "rules": rules }),
        ));
    }
    for (binding, berth_role, role) in [
        ("berth-tenant-admins", Role::TenantAdmin, "berth-admin"),
        ("berth-members", Role::Member, "berth-edit"),
        ("berth-viewers", Role::Viewer, "berth-view"),
    ] {
        let subjects: Vec<Value> = members
            .iter()
            .filter(|(_, r)| *r == berth_role)
            .map(|(email, _)| {
                json!({ "kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": format!("{}{email}", settings.user_prefix) })
            })
            .collect();
        bundle.push(role_binding(labels, ns, binding, role, subjects));
    }
    bundle
}

fn local_queue(labels: &BTreeMap<String, String>, name: &str, ns: &str, cluster_queue: &str) -> Manifest {
    Manifest::new(
        LOCAL_QUEUE,
        json!({
            "apiVersion": LOCAL_QUEUE.api_version(), "kind": "LocalQueue",
            "metadata": labelled(labels, name, Some(ns)),
            "spec": { "clusterQueue": cluster_queue },
        }),
    )
}

/// Whether the environment has a ClusterQueue of its own: platform staff's do, having no
/// tenant whose queue they could share.
pub fn has_own_cluster_queue(w: &Workload) -> bool {
    w.tenant.slug.is_none()
}

fn pod_security(meta: &mut Value) {
    for mode in ["enforce", "audit", "warn"] {
        meta["labels"][format!("pod-security.kubernetes.io/{mode}")] = json!("restricted");
        meta["labels"][format!("pod-security.kubernetes.io/{mode}-version")] = json!("latest");
    }
}

fn namespace(w: &Workload, names: &Names) -> Manifest {
    let mut meta = metadata(w, &names.namespace, None);
    pod_security(&mut meta);
    meta["annotations"] = json!({ "berth.dev/name": w.name });
    if dedicates_nodes(w) {
        // With the PodNodeSelector and PodTolerationRestriction admission plugins, even pods
        // the tenant creates itself land only on its dedicated nodes.
        meta["annotations"]["scheduler.alpha.kubernetes.io/node-selector"] =
            json!(format!("{TENANT_LABEL}={}", names.tenant));
        meta["annotations"]["scheduler.alpha.kubernetes.io/defaultTolerations"] =
            json!(json!([dedicated_toleration(&names.tenant)]).to_string());
    }
    Manifest::new(NAMESPACE, json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": meta }))
}

/// The CPUs and memory of every replica together (one replica but for scaled endpoints).
fn total_cpu_memory(w: &Workload) -> (String, String) {
    let replicas = w.replicas();
    ((w.vcpus * replicas).to_string(), format!("{}Gi", w.memory_gb * replicas))
}

/// A namespace's quota: what `holdings` hold together, every replica of each. Objects
/// are counted per environment, at least one's worth (a namespace holds a few objects of
/// its own, such as the cluster's CA ConfigMap). In a tenant's namespace (`whole_gpus`)
/// whole and time-sliced GPUs are always named, at zero when nobody holds one, so an
/// empty namespace runs nothing on a GPU.
fn resource_quota(
    labels: &BTreeMap<String, String>,
    ns: &str,
    holdings: &[Holding],
    whole_gpus: bool,
    settings: &ClusterSettings,
) -> Manifest {
    let cpu: u64 = holdings.iter().map(|h| u64::from(h.vcpus) * u64::from(h.replicas())).sum();
    let memory: u64 = holdings.iter().map(|h| u64::from(h.memory_gb) * u64::from(h.replicas())).sum();
    let storage = u64::from(settings.storage_gb) * holdings.len() as u64;
    let objects = (holdings.len() as u64).max(1);
    let (cpu, memory) = (cpu.to_string(), format!("{memory}Gi"));
    let mut hard = json!({
        "requests.cpu": cpu, "limits.cpu": cpu,
        "requests.memory": memory, "limits.memory": memory,
        "requests.storage": format!("{storage}Gi"),
        "persistentvolumeclaims": (4 * objects).to_string(),
        "pods": (16 * objects).to_string(),
        "services": (4 * objects).to_string(),
        "secrets": (16 * objects).to_string(),
        "configmaps": (16 * objects).to_string(),
        "services.nodeports": "0",
        "services.loadbalancers": "0",
    });
    let mut gpus: BTreeMap<String, i64> = BTreeMap::new();
    if whole_gpus {
        gpus.extend([("nvidia.com/gpu".to_owned(), 0), ("nvidia.com/gpu.shared".to_owned(), 0)]);
    }
    for h in holdings {
        for (resource, count) in gpu_resources_of(&h.units) {
            *gpus.entry(resource).or_insert(0) += count;
        }
    }
    for (resource, count) in gpus {
        hard[format!("requests.{resource}")] = json!(count.to_string());
    }
    Manifest::new(
        RESOURCE_QUOTA,
        json!({ "apiVersion": "v1", "kind": "ResourceQuota", "metadata": labelled(labels, "berth", Some(ns)), "spec": { "hard": hard } }),
    )
}

fn limit_range(
    labels: &BTreeMap<String, String>,
    ns: &str,
    vcpus: u32,
    memory_gb: u32,
    settings: &ClusterSettings,
) -> Manifest {
    Manifest::new(
        LIMIT_RANGE,
        json!({
            "apiVersion": "v1", "kind": "LimitRange", "metadata": labelled(labels, "berth", Some(ns)),
            "spec": { "limits": [
                {
                    "type": "Container",
                    "default": { "cpu": "1", "memory": "2Gi" },
                    "defaultRequest": { "cpu": "250m", "memory": "512Mi" },
                    "max": { "cpu": vcpus.to_string(), "memory": format!("{memory_gb}Gi") },
                },
                { "type": "PersistentVolumeClaim", "max": { "storage": format!("{}Gi", settings.storage_gb) } },
            ] },
        }),
    )
}

fn network_policy(labels: &BTreeMap<String, String>, ns: &str) -> Manifest {
    Manifest::new(
        NETWORK_POLICY,
        json!({
            "apiVersion": NETWORK_POLICY.api_version(), "kind": "NetworkPolicy",
            "metadata": labelled(labels, "berth-default-deny", Some(ns)),
            "spec": {
                "podSelector": {},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [{ "from": [{ "podSelector": {} }] }],
                "egress": [
                    { "to": [{ "podSelector": {} }] },
                    {
                        "to": [{
                            "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": "kube-system" } },
                            "podSelector": { "matchLabels": { "k8s-app": "kube-dns" } },
                        }],
                        "ports": [{ "protocol": "UDP", "port": 53 }, { "protocol": "TCP", "port": 53 }],
                    },
                ],
            },
        }),
    )
}
const READ: [&str; 3] = ["get", "list", "watch"];
const WRITE: [&str; 7] = ["get", "list", "watch", "create", "update", "patch", "delete"];

/// Berth's own namespaced Roles rather than the built-in `admin`/`edit`/`view` ClusterRoles:
/// `edit` lets its holders impersonate service accounts and rewrite network policies, which
/// the tenant-namespace checklist forbids.
fn view_rules() -> Value {
    json!([
        { "apiGroups": [""], "resources": ["pods", "pods/log", "services", "endpoints", "configmaps", "persistentvolumeclaims",
            "events", "resourcequotas", "limitranges", "serviceaccounts"], "verbs": READ },
        { "apiGroups": ["apps"], "resources": ["deployments", "statefulsets", "replicasets"], "verbs": READ },
        { "apiGroups": ["batch"], "resources": ["jobs"], "verbs": READ },
        { "apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": READ },
        { "apiGroups": ["kueue.x-k8s.io"], "resources": ["localqueues", "workloads"], "verbs": READ },
    ])
}

fn edit_rules() -> Value {
    let mut rules = view_rules();
    if let Some(list) = rules.as_array_mut() {
        list.extend([
            json!({ "apiGroups": [""], "resources": ["pods", "services", "configmaps", "persistentvolumeclaims", "secrets"], "verbs": WRITE }),
            json!({ "apiGroups": [""], "resources": ["pods/exec", "pods/portforward", "pods/attach"], "verbs": ["get", "create"] }),
            json!({ "apiGroups": ["apps"], "resources": ["deployments", "statefulsets"], "verbs": WRITE }),
            json!({ "apiGroups": ["apps"], "resources": ["deployments/scale", "statefulsets/scale"], "verbs": ["get", "update", "patch"] }),
            json!({ "apiGroups": ["batch"], "resources": ["jobs"], "verbs": WRITE }),
        ]);
    }
    rules
}

fn admin_rules() -> Value {
    let mut rules = edit_rules();
    if let Some(list) = rules.as_array_mut() {
        list.push(json!({ "apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"], "verbs": READ }));
    }
    rules
}

fn role_binding(labels: &BTreeMap<String, String>, ns: &str, name: &str, role: &str, subjects: Vec<Value>) -> Manifest {
    Manifest::new(
        ROLE_BINDING,
        json!({
            "apiVersion": ROLE_BINDING.api_version(), "kind": "RoleBinding", "metadata": labelled(labels, name, Some(ns)),
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role },
            "subjects": subjects,
        }),
    )
}

/// A staff environment's own ClusterQueue: quota equal to its booking, never borrowing
/// (its namespace's ResourceQuota would refuse the pods of anything admitted beyond it).
fn cluster_queue(w: &Workload, names: &Names, settings: &ClusterSettings) -> Manifest {
    let (cpu, memory) = total_cpu_memory(w);
    let mut quota = vec![("cpu".to_owned(), cpu), ("memory".to_owned(), memory)];
    quota.extend(gpu_resources(w).into_iter().map(|(resource, count)| (resource, count.to_string())));
    let selector = json!({ "matchLabels": { "kubernetes.io/metadata.name": names.namespace } });
    Manifest::new(
        CLUSTER_QUEUE,
        json!({
            "apiVersion": CLUSTER_QUEUE.api_version(), "kind": "ClusterQueue", "metadata": metadata(w, &names.cluster_queue, None),
            "spec": queue_spec(settings, selector, &quota, Some("0")),
        }),
    )
}

/// A ClusterQueue's spec: one resource group of the given quotas in Berth's flavor and
/// cohort. A queue may reclaim what it lent (preempting the borrower) and, within itself,
/// preempt lower priorities.
fn queue_spec(
    settings: &ClusterSettings,
    namespace_selector: Value,
    quota: &[(String, String)],
    borrowing_limit: Option<&str>,
) -> Value {
    let covered: Vec<&str> = quota.iter().map(|(resource, _)| resource.as_str()).collect();
    let resources: Vec<Value> = quota
        .iter()
        .map(|(resource, amount)| {
            let mut r = json!({ "name": resource, "nominalQuota": amount });
            if let Some(limit) = borrowing_limit {
                r["borrowingLimit"] = json!(limit);
            }
            r
        })
        .collect();
    json!({
        "cohort": settings.cohort,
        "namespaceSelector": namespace_selector,
        "resourceGroups": [{
            "coveredResources": covered,
            "flavors": [{ "name": settings.queue_flavor, "resources": resources }],
        }],
        "preemption": { "reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority" },
    })
}

/// The name of a tenant's ClusterQueue.
pub fn tenant_queue_name(slug: &str) -> String {
    format!("{TENANT_QUEUE_PREFIX}{slug}")
}

/// The quota of a tenant's ClusterQueue, resource by resource: for each resource, the
/// most of it the tenant's Berth quota lets it hold at once. Berth limits GPU-equivalents
/// per model; one flavor cannot tell models apart, so a resource's quota adds up what
/// each model allows of it (`nvidia.com/mig-1g.10gb` is a slice of an A100-80GB and of an
/// H100-80GB alike):
/// - `nvidia.com/gpu`: whole GPUs, at most the limit (rounded down) and the fleet's
///   GPUs of the model that are not time-sliced;
/// - `nvidia.com/mig-<profile>`: slices, each its compute share of a GPU (a 3g is 3/7), at
///   most what the model's MIG-enabled GPUs hold of that profile;
/// - `nvidia.com/gpu.shared`: time-sliced shares, each 1/ways of a GPU, at most the
///   fleet's shares;
/// - `cpu` and `memory`: Berth's quotas do not limit them (each environment's
///   ResourceQuota holds its booked CPUs and memory), so the queue allows what the fleet's
///   nodes hold as the catalog sells them whole.
///
/// Each resource alone is bounded; that GPU-equivalents of one model add up across
/// whole GPUs and slices is Berth's booking check to hold, not Kueue's.
pub fn tenant_queue_quota(queue: &TenantQueue) -> Vec<(String, String)> {
    // Rounding down a limit like 6/7 that floating point holds as 0.857...: a hair of
    // tolerance, as Berth's own quota check allows.
    let fit = |amount: f64| (amount + 1e-9).floor().max(0.0) as i64;
    let mut gpus: BTreeMap<String, i64> = BTreeMap::new();
    for m in &queue.models {
        *gpus.entry("nvidia.com/gpu".into()).or_default() += fit(m.gpus).min(i64::from(m.whole_gpus));
        if m.mig_gpus > 0 {
            for profile in MigProfile::ALL {
                let Some(name) = profile.name(m.model) else { continue };
                let share = f64::from(profile.compute_slices()) / f64::from(COMPUTE_SLICES);
                let held = i64::from(m.mig_gpus) * profile.max_per_gpu() as i64;
                *gpus.entry(mig_resource(&name)).or_default() += fit(m.gpus / share).min(held);
            }
        }
        for &(ways, count) in &m.shared_gpus {
            let shares = i64::from(ways) * i64::from(count);
            *gpus.entry("nvidia.com/gpu.shared".into()).or_default() += fit(m.gpus * f64::from(ways)).min(shares);
        }
    }
    let mut quota = vec![
        ("cpu".to_owned(), (u64::from(queue.nodes) * u64::from(NODE_VCPUS)).to_string()),
        ("memory".to_owned(), format!("{}Gi", u64::from(queue.nodes) * u64::from(NODE_MEMORY_GB))),
    ];
    quota.extend(gpus.into_iter().map(|(resource, count)| (resource, count.to_string())));
    quota
}

/// A tenant's ClusterQueue: its quota mirrors the tenant's Berth quota (see
/// [`tenant_queue_quota`]), for the namespaces Berth labels with the tenant only.
///
/// Borrowing from the cohort is what a spot booking is to Berth: capacity beyond the
/// quota, taken back when its owner needs it. So a tenant whose quota allows spot may
/// borrow without limit, and other tenants not at all (their guaranteed bookings always
/// fit their nominal quota). Nothing limits lending: unused quota is lent to spot tenants
/// and reclaimed by preemption (`reclaimWithinCohort: Any`), as Berth reclaims spot
/// capacity. Kueue's quota is accounting, never capacity: the booking holds the GPUs and
/// the namespace's ResourceQuota what each environment may use.
pub fn tenant_cluster_queue(queue: &TenantQueue, settings: &ClusterSettings) -> Manifest {
    let labels = tenant_labels(&queue.slug);
    let selector = json!({ "matchLabels": labels });
    let borrowing_limit = if queue.spot { None } else { Some("0") };
    Manifest::new(
        CLUSTER_QUEUE,
        json!({
            "apiVersion": CLUSTER_QUEUE.api_version(), "kind": "ClusterQueue",
            "metadata": { "name": tenant_queue_name(&queue.slug), "labels": labels },
            "spec": queue_spec(settings, selector, &tenant_queue_quota(queue), borrowing_limit),
        }),
    )
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
    match w.offering {
        Offering::Notebook => {
            // Each environment has an origin of its own, so Jupyter serves at its root (said
            // explicitly: some images set another base URL). The proxy keeps the browser's
            // Host, which Jupyter's WebSocket origin check compares with the Origin.
            let notebook_args = "--ServerApp.base_url=/ --ServerApp.trust_xheaders=True";
            let container = json!({
                "name": "notebook", "image": image,
                "ports": [{ "name": "http", "containerPort": NOTEBOOK_PORT }],
                "env": [credential_env(&names, "JUPYTER_TOKEN"), { "name": "NOTEBOOK_ARGS", "value": notebook_args }],
                "volumeMounts": [{ "name": "work", "mountPath": "/home/jovyan/work" }],
            });
            vec![Manifest::new(
                STATEFUL_SET,
                json!({
                    "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": metadata(w, &names.workload, Some(ns)),
                    "spec": {
                        "replicas": 1, "serviceName": names.workload, "selector": selector,
                        "template": pod_template(w, &names, container),
                        "persistentVolumeClaimRetentionPolicy": { "whenDeleted": "Delete", "whenScaled": "Retain" },
                        "volumeClaimTemplates": [{
                            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                            "metadata": { "name": "work", "labels": owner_labels(w) },
                            "spec": { "accessModes": ["ReadWriteOnce"], "resources": { "requests": { "storage": "20Gi" } } },
                        }],
                    },
                }),
            )]
        }
        Offering::TrainingJob => {
            let mut container = json!({ "name": "training", "image": image });
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
                "name": "inference", "image": image,
                "ports": [{ "name": "http", "containerPort": INFERENCE_PORT }],
                "env": [credential_env(&names, "BERTH_API_KEY")],
            });
            if let Some(command) = &w.command {
                container["command"] = json!(["/bin/sh", "-c", command]);
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

/// The volume claims a notebook's StatefulSet makes (`<template>-<statefulset>-<ordinal>`),
/// by name, for deleting them: the StatefulSet's retention policy deletes them too, but
/// teardown does not leave the tenant's namespace to the garbage collector's timing.
pub fn volume_claims(w: &Workload) -> Vec<Manifest> {
    if w.offering != Offering::Notebook {
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

/// Where a node's Berth-owned labels and taint stand in a lifecycle step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeStage {
    /// Configure and start: the environment's MIG layout, and the node dedicated if it is.
    Held,
    /// After clearing the partition: MIG layout cleared, still dedicated.
    Cleared,
    /// After the window: nothing of this environment left on the node.
    Released,
}

/// The node fields Berth owns at `stage` of this environment, as one server-side apply.
///
/// Every environment on a node applies with the one field manager, and fields of the
/// manager that an apply leaves out are removed; so each apply carries the whole of what
/// Berth wants on the node, its neighbours' part included: the MIG layout with their
/// slices, and the tenant's dedication with their environments. No environment then
/// undoes another's. `None` when Berth has nothing to do on the node at this stage.
pub fn node_manifest(w: &Workload, node: &str, stage: NodeStage) -> Result<Option<Manifest>, String> {
    let names = Names::of(w);
    let owns_mig = w.units.iter().any(|u| u.node == node && u.mig_profile.is_some());
    let dedicating = dedicates_nodes(w);
    let mig = match (owns_mig, stage) {
        (true, NodeStage::Held) => Some(node_mig_layout(w, node)?.name),
        (true, NodeStage::Cleared | NodeStage::Released) => Some(cleared_mig_config(w, node)?),
        // A dedicated environment without slices there still applies to the node, and then
        // keeps the layout its neighbours' slices need.
        (false, _) => borrowed_mig_layout(w, node)?.map(|layout| layout.name),
    };
    let touches = match stage {
        NodeStage::Held => owns_mig || dedicating,
        NodeStage::Cleared => owns_mig,
        NodeStage::Released => dedicating,
    };
    if !touches {
        return Ok(None);
    }
    let mut meta = json!({ "name": node });
    let mut labels = BTreeMap::new();
    let mut annotations = BTreeMap::new();
    if let Some(config) = mig {
        if config != MIG_DISABLED {
            // Held: this environment and its neighbours; cleared: the neighbours alone,
            // whose slices keep the layout in place until the last of them clears it.
            let own = (owns_mig && stage == NodeStage::Held).then_some(&w.environment_id);
            let mut holders: Vec<&String> =
                own.into_iter().chain(units_on(&w.mig_neighbours, node).map(|u| &u.environment_id)).collect();
            holders.sort();
            holders.dedup();
            annotations
                .insert(MIG_ENVIRONMENTS_ANNOTATION, holders.iter().map(|e| e.as_str()).collect::<Vec<_>>().join(","));
        }
        labels.insert(MIG_CONFIG_LABEL.to_owned(), config);
    }
    // The tenant's environments holding the node: this one until its window is over, and
    // its tenant's others there.
    let own = (dedicating && stage != NodeStage::Released).then_some(&w.environment_id);
    let others = w.tenant_neighbours.iter().filter(|u| dedicating && u.node == node).map(|u| &u.environment_id);
    let mut holders: Vec<&String> = own.into_iter().chain(others).collect();
    holders.sort();
    holders.dedup();
    let dedicated = !holders.is_empty();
    if dedicated {
        labels.insert(TENANT_LABEL.to_owned(), names.tenant.clone());
        annotations
            .insert(TENANT_ENVIRONMENTS_ANNOTATION, holders.iter().map(|e| e.as_str()).collect::<Vec<_>>().join(","));
    }
    if !labels.is_empty() {
        meta["labels"] = json!(labels);
    }
    if !annotations.is_empty() {
        meta["annotations"] = json!(annotations);
    }
    let mut object = json!({ "apiVersion": "v1", "kind": "Node", "metadata": meta });
    if dedicated {
        object["spec"] = json!({ "taints": [dedicated_toleration_taint(&names.tenant)] });
    }
    Ok(Some(Manifest::new(NODE, object)))
}

fn dedicated_toleration_taint(tenant: &str) -> Value {
    json!({ "key": TENANT_LABEL, "value": tenant, "effect": "NoSchedule" })
}

/// A node's MIG layout as a named mig-parted config entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeMigLayout {
    /// `berth-<hash>`: named by content, so equal layouts share one entry and writing an
    /// entry twice changes nothing.
    pub name: String,
    /// The entry's lines under `mig-configs:`, starting with `  <name>:`.
    pub entry: String,
}

fn units_on<'a>(units: &'a [PlacedUnit], node: &'a str) -> impl Iterator<Item = &'a PlacedUnit> + 'a {
    units.iter().filter(move |u| u.node == node && u.mig_profile.is_some())
}

/// The MIG layout of `node` holding this environment's slices and its neighbours'.
pub fn node_mig_layout(w: &Workload, node: &str) -> Result<NodeMigLayout, String> {
    let model = w.shape.model();
    let mut gpus: BTreeMap<u32, Vec<MigInstance>> = BTreeMap::new();
    for u in units_on(&w.units, node).chain(units_on(&w.mig_neighbours, node)) {
        let name = u.mig_profile.as_deref().unwrap_or_default();
        let profile =
            MigProfile::parse(model, name).ok_or_else(|| format!("{name} is no MIG profile of {}", model.name()))?;
        let gpu = u32::try_from(u.gpu_index).map_err(|_| format!("GPU index {} on {node}", u.gpu_index))?;
        let start = u8::try_from(u.slice_start).map_err(|_| format!("slice start {} on {node}", u.slice_start))?;
        gpus.entry(gpu).or_default().push(MigInstance { profile, start });
    }
    // GPUs with the same instances share one device list, as mig-parted configs are written.
    let mut groups: BTreeMap<Vec<(u8, MigProfile)>, Vec<u32>> = BTreeMap::new();
    for (gpu, instances) in &gpus {
        let mut key: Vec<(u8, MigProfile)> = instances.iter().map(|i| (i.start, i.profile)).collect();
        key.sort();
        groups.entry(key).or_default().push(*gpu);
    }
    let mut devices: Vec<(Vec<u32>, MigLayout)> = groups
        .into_iter()
        .map(|(key, gpus)| {
            (gpus, MigLayout::new(key.into_iter().map(|(start, profile)| MigInstance { profile, start }).collect()))
        })
        .collect();
    devices.sort_by_key(|(gpus, _)| gpus.first().copied());
    // Rendered under a placeholder first: the name is the hash of the rest.
    const PLACEHOLDER: &str = "berth-layout";
    let document = mig_parted_config(PLACEHOLDER, model, &devices).map_err(|e| e.to_string())?;
    let body = document
        .split_once(&format!("  {PLACEHOLDER}:\n"))
        .map(|(_, body)| body.to_owned())
        .ok_or("mig-parted config without its entry")?;
    let digest = Sha256::digest(format!("{}\n{body}", model.name()).as_bytes());
    let name = format!("berth-{}", &hex::encode(digest)[..12]);
    Ok(NodeMigLayout { entry: format!("  {name}:\n{body}"), name })
}

/// The layout of `node` this environment names without holding a slice there: a dedicated
/// environment keeps its neighbours' layout in each apply to the node, so the GPU Operator
/// must be able to read it even before the neighbour that needs it wrote it.
pub fn borrowed_mig_layout(w: &Workload, node: &str) -> Result<Option<NodeMigLayout>, String> {
    let owns_mig = w.units.iter().any(|u| u.node == node && u.mig_profile.is_some());
    if owns_mig || !dedicates_nodes(w) || units_on(&w.mig_neighbours, node).next().is_none() {
        return Ok(None);
    }
    node_mig_layout(w, node).map(Some)
}

/// The MIG config a node gets once this environment's slices are cleared. With no other
/// environment's slice on the node, MIG is disabled; otherwise the layout stays as it is,
/// because the MIG manager repartitions whole GPUs and would destroy the instances the
/// neighbours are using (the idle instance is simply there for the next booking).
pub fn cleared_mig_config(w: &Workload, node: &str) -> Result<String, String> {
    if units_on(&w.mig_neighbours, node).next().is_none() {
        Ok(MIG_DISABLED.to_owned())
    } else {
        Ok(node_mig_layout(w, node)?.name)
    }
}

/// Berth's part of the mig-parted ConfigMap: the layouts it wrote, and for each the
/// environments that wrote it. A layout is written before a node is set to it, so between
/// the two no node names it yet; its writers say who may be about to, and it stays while
/// any of them is live or a node names it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigLayouts {
    /// Entry lines (see [`NodeMigLayout::entry`]) by layout name.
    pub entries: BTreeMap<String, String>,
    /// The environments that wrote each layout, by layout name.
    pub writers: BTreeMap<String, BTreeSet<String>>,
}

impl MigLayouts {
    /// Reads the ConfigMap's data (every key but the document is an entry) and its
    /// writers' annotations.
    pub fn read(data: &BTreeMap<String, String>, annotations: &BTreeMap<String, String>) -> MigLayouts {
        let entries =
            data.iter().filter(|(k, _)| k.as_str() != MIG_CONFIG_KEY).map(|(k, v)| (k.clone(), v.clone())).collect();
        let writers = annotations
            .iter()
            .filter_map(|(k, v)| {
                let name = k.strip_prefix(MIG_LAYOUT_WRITERS_PREFIX)?;
                Some((name.to_owned(), v.split(',').filter(|e| !e.is_empty()).map(str::to_owned).collect()))
            })
            .collect();
        MigLayouts { entries, writers }
    }

    /// Adds `layout` written by `environment`.
    pub fn add(&mut self, layout: &NodeMigLayout, environment: &str) {
        self.entries.insert(layout.name.clone(), layout.entry.clone());
        self.writers.entry(layout.name.clone()).or_default().insert(environment.to_owned());
    }

    /// The environments that wrote `name`.
    pub fn writers_of(&self, name: &str) -> BTreeSet<String> {
        self.writers.get(name).cloned().unwrap_or_default()
    }

    /// Takes out a layout and its writers.
    pub fn remove(&mut self, name: &str) {
        self.entries.remove(name);
        self.writers.remove(name);
    }

    /// The ConfigMap's data: every entry and the document the MIG manager reads.
    pub fn data(&self) -> BTreeMap<String, String> {
        let mut data = self.entries.clone();
        data.insert(MIG_CONFIG_KEY.to_owned(), mig_parted_document(&self.entries));
        data
    }

    /// `annotations` with the writers' annotations replaced by these layouts' writers
    /// (annotations of others kept as they are).
    pub fn annotate(&self, annotations: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        let mut out: BTreeMap<String, String> = annotations
            .iter()
            .filter(|(k, _)| !k.starts_with(MIG_LAYOUT_WRITERS_PREFIX))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (name, writers) in self.writers.iter().filter(|(_, w)| !w.is_empty()) {
            out.insert(
                format!("{MIG_LAYOUT_WRITERS_PREFIX}{name}"),
                writers.iter().cloned().collect::<Vec<_>>().join(","),
            );
        }
        out
    }
}

/// The mig-parted document of the ConfigMap from its entries (key: config name, value:
/// entry lines): `all-disabled` first, then every entry in name order.
pub fn mig_parted_document(entries: &BTreeMap<String, String>) -> String {
    let mut document =
        String::from("version: v1\nmig-configs:\n  all-disabled:\n    - devices: all\n      mig-enabled: false\n");
    for entry in entries.values() {
        document.push_str(entry);
    }
    document
}

/// How the owner of an environment connects, given its credential.
pub fn connection(
    w: &Workload,
    credential: Option<&str>,
    api_server_url: &str,
    kubeconfig: Option<String>,
) -> crate::provisioning::backend::Connection {
    let names = Names::of(w);
    let ns = &names.namespace;
    match w.offering {
        Offering::Notebook => crate::provisioning::backend::Connection {
            url: format!("http://{}.{ns}.svc:{NOTEBOOK_PORT}/lab", names.workload),
            secret_label: Some("Token".into()),
            secret: credential.map(str::to_owned),
            example: format!(
                "kubectl port-forward -n {ns} svc/{} {NOTEBOOK_PORT}:{NOTEBOOK_PORT}, then open http://127.0.0.1:{NOTEBOOK_PORT}/lab?token=<token>",
                names.workload
            ),
        },
        Offering::TrainingJob => crate::provisioning::backend::Connection {
            url: format!("{api_server_url}/apis/batch/v1/namespaces/{ns}/jobs/{}", names.workload),
            secret_label: None,
            secret: None,
            example: format!("kubectl logs -n {ns} -f job/{}", names.workload),
        },
        Offering::InferenceEndpoint => crate::provisioning::backend::Connection {
            url: format!("http://{}.{ns}.svc:{INFERENCE_PORT}/v1", names.workload),
            secret_label: Some("API key".into()),
            secret: credential.map(str::to_owned),
            example: format!(
                "kubectl port-forward -n {ns} svc/{} {INFERENCE_PORT}:{INFERENCE_PORT}, then curl -H \"Authorization: Bearer <api key>\" http://127.0.0.1:{INFERENCE_PORT}/v1/models",
                names.workload
            ),
        },
        Offering::DedicatedCluster => crate::provisioning::backend::Connection {
            url: api_server_url.to_owned(),
            secret_label: Some("Kubeconfig".into()),
            secret: kubeconfig,
            example: format!("kubectl --kubeconfig berth-{ns}.yaml get pods -n {ns}"),
        },
    }
}

/// A kubeconfig for the dedicated cluster's ServiceAccount, limited to its namespace.
pub fn kubeconfig(api_server_url: &str, ca_base64: &str, token: &str, namespace: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: berth\n  cluster:\n    server: {api_server_url}\n    certificate-authority-data: {ca_base64}\n\
         users:\n- name: {namespace}\n  user:\n    token: {token}\ncontexts:\n- name: {namespace}\n  context:\n    cluster: berth\n    user: {namespace}\n    namespace: {namespace}\n\
         current-context: {namespace}\n"
    )
}
