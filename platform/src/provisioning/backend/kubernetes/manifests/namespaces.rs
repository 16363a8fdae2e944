//! A namespace and what it holds before a workload runs: Pod Security, quota, limits,
//! default-deny network policy, Berth's roles bound to members, and the Kueue queues.

use super::*;

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
        resource_quota(&labels, ns, &[Holding::of(w)], &[], false, settings),
        limit_range(&labels, ns, w.vcpus, w.memory_gb, &[], settings),
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
    TenantSpace { members: w.tenant.members.clone(), holdings, volumes: w.tenant_volumes.clone() }
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
        limit_range(&labels, &ns, NODE_VCPUS, NODE_MEMORY_GB, &space.volumes, settings),
        network_policy(&labels, &ns),
    ];
    bundle.extend(access(&labels, &ns, &space.members, settings));
    bundle.push(local_queue(&labels, "berth", &ns, &tenant_queue_name(slug)));
    bundle
}

/// The ResourceQuota of a soft tenant's namespace: what its environments there hold.
pub fn tenant_quota(slug: &str, space: &TenantSpace, settings: &ClusterSettings) -> Manifest {
    resource_quota(&tenant_labels(slug), &tenant_namespace_name(slug), &space.holdings, &space.volumes, true, settings)
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
/// empty namespace runs nothing on a GPU. The tenant's volumes (`volumes`, GiB each) are
/// claims of their own in it, kept between bookings: their storage and count come on top.
fn resource_quota(
    labels: &BTreeMap<String, String>,
    ns: &str,
    holdings: &[Holding],
    volumes: &[u32],
    whole_gpus: bool,
    settings: &ClusterSettings,
) -> Manifest {
    let cpu: u64 = holdings.iter().map(|h| u64::from(h.vcpus) * u64::from(h.replicas())).sum();
    let memory: u64 = holdings.iter().map(|h| u64::from(h.memory_gb) * u64::from(h.replicas())).sum();
    let storage =
        u64::from(settings.storage_gb) * holdings.len() as u64 + volumes.iter().map(|&g| u64::from(g)).sum::<u64>();
    let objects = (holdings.len() as u64).max(1);
    let (cpu, memory) = (cpu.to_string(), format!("{memory}Gi"));
    let mut hard = json!({
        "requests.cpu": cpu, "limits.cpu": cpu,
        "requests.memory": memory, "limits.memory": memory,
        "requests.storage": format!("{storage}Gi"),
        "persistentvolumeclaims": (4 * objects + volumes.len() as u64).to_string(),
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

/// `volumes`: the sizes of the volumes kept in the namespace; a claim may be as large as
/// the largest of them.
fn limit_range(
    labels: &BTreeMap<String, String>,
    ns: &str,
    vcpus: u32,
    memory_gb: u32,
    volumes: &[u32],
    settings: &ClusterSettings,
) -> Manifest {
    let largest_claim = volumes.iter().copied().fold(settings.storage_gb, u32::max);
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
                { "type": "PersistentVolumeClaim", "max": { "storage": format!("{largest_claim}Gi") } },
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

pub(super) fn role_binding(
    labels: &BTreeMap<String, String>,
    ns: &str,
    name: &str,
    role: &str,
    subjects: Vec<Value>,
) -> Manifest {
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
