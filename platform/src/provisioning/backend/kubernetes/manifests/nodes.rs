//! A node's Berth-owned labels and taint, and the MIG layouts written for the GPU
//! Operator's MIG manager.

use super::*;

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
