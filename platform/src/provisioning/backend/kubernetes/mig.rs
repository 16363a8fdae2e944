//! MIG on Kubernetes: Berth's layouts in the GPU Operator's mig-parted ConfigMap, a node
//! set to a layout and waited on until the MIG manager reports success, and layouts given
//! back when the last environment holding them ends.

use super::*;

impl Kubernetes {
    /// The MIG layout of every node where the workload holds slices, applied and confirmed
    /// by the GPU Operator. Says which layout went where.
    pub(super) async fn configure_mig(&self, w: &Workload) -> Result<Vec<String>, BackendError> {
        let mut layouts = Vec::new();
        for node in w.nodes() {
            if !w.units.iter().any(|u| u.node == node && u.mig_profile.is_some()) {
                // Nothing to partition; a dedicated node is still held for the tenant.
                self.apply_node(w, &node, NodeStage::Held).await?;
                continue;
            }
            let layout = manifests::node_mig_layout(w, &node).map_err(|e| invalid(w, &e))?;
            self.store_mig_layout(&layout, w).await?;
            self.apply_node(w, &node, NodeStage::Held).await?;
            self.wait_mig_success(&node, &layout.name).await?;
            layouts.push(format!("{} on {node}", layout.name));
        }
        Ok(layouts)
    }

    /// Adds a layout to the mig-parted ConfigMap, with the environment among its writers
    /// (before any node is set to it: see [`MigLayouts`]). The file is shared by every node,
    /// so it is read, extended and written back with its resourceVersion; a concurrent
    /// writer makes the write fail with a conflict and it is tried again. Entries are named
    /// by content, so one already present (with this writer) is left alone.
    pub(super) async fn store_mig_layout(
        &self,
        layout: &manifests::NodeMigLayout,
        w: &Workload,
    ) -> Result<(), BackendError> {
        let doing = format!("write MIG layout {} into ConfigMap {}", layout.name, self.config.cluster.mig_config_map);
        for _ in 0..5 {
            let current = self.mig_config_map().await.map_err(|e| api_failure(&doing, e))?;
            let before = current.as_ref().map(mig_layouts_of).unwrap_or_default();
            let mut layouts = before.clone();
            layouts.add(layout, &w.environment_id);
            let stored_document =
                current.as_ref().and_then(|c| c.data.as_ref()).and_then(|d| d.get(manifests::MIG_CONFIG_KEY));
            if layouts == before && stored_document == layouts.data().get(manifests::MIG_CONFIG_KEY) {
                return Ok(());
            }
            match self.write_mig_layouts(current, &layouts).await {
                Ok(()) => return Ok(()),
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(e) => return Err(api_failure(&doing, e)),
            }
        }
        Err(BackendError(format!("could not {doing}: other writers kept changing it; the step is retried")))
    }

    /// At the end of an environment: takes it off the writers of every layout, and drops
    /// the layouts no writer may still set and no node names any more. A writer records
    /// itself before it sets a node, and both writes name the resourceVersion they read,
    /// so a layout someone is about to use is never dropped.
    pub(super) async fn forget_mig_layouts(&self, w: &Workload) -> Result<(), BackendError> {
        let doing =
            format!("clear {}'s MIG layouts from ConfigMap {}", w.environment_id, self.config.cluster.mig_config_map);
        for _ in 0..5 {
            let Some(current) = self.mig_config_map().await.map_err(|e| api_failure(&doing, e))? else {
                return Ok(());
            };
            let before = mig_layouts_of(&current);
            let mut layouts = before.clone();
            for writers in layouts.writers.values_mut() {
                writers.remove(&w.environment_id);
            }
            let unwritten: Vec<String> =
                layouts.entries.keys().filter(|name| layouts.writers_of(name).is_empty()).cloned().collect();
            if !unwritten.is_empty() {
                let named = self.layouts_on_nodes().await?;
                for name in unwritten.iter().filter(|name| !named.contains_key(*name)) {
                    layouts.remove(name);
                }
            }
            if layouts == before {
                return Ok(());
            }
            match self.write_mig_layouts(Some(current), &layouts).await {
                Ok(()) => return Ok(()),
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(e) => return Err(api_failure(&doing, e)),
            }
        }
        Err(BackendError(format!("could not {doing}: other writers kept changing it; the step is retried")))
    }

    /// The mig-parted ConfigMap Berth writes, if it exists yet.
    pub(super) async fn mig_config_map(&self) -> Result<Option<ConfigMap>, kube::Error> {
        let cluster = &self.config.cluster;
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &cluster.gpu_operator_namespace);
        api.get_opt(&cluster.mig_config_map).await
    }

    /// Writes `layouts` into the ConfigMap read as `current` (creating it when there was
    /// none): a replace naming the resourceVersion read, so it fails with a conflict when
    /// someone wrote in between.
    pub(super) async fn write_mig_layouts(
        &self,
        current: Option<ConfigMap>,
        layouts: &MigLayouts,
    ) -> Result<(), kube::Error> {
        let cluster = &self.config.cluster;
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &cluster.gpu_operator_namespace);
        let annotations = |existing: Option<BTreeMap<String, String>>| {
            let annotations = layouts.annotate(&existing.unwrap_or_default());
            (!annotations.is_empty()).then_some(annotations)
        };
        match current {
            Some(mut map) => {
                map.data = Some(layouts.data());
                map.metadata.annotations = annotations(map.metadata.annotations.take());
                api.replace(&cluster.mig_config_map, &PostParams::default(), &map).await?;
            }
            None => {
                let map = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(cluster.mig_config_map.clone()),
                        namespace: Some(cluster.gpu_operator_namespace.clone()),
                        labels: Some(BTreeMap::from([(MANAGED_BY_LABEL.to_owned(), FIELD_MANAGER.to_owned())])),
                        annotations: annotations(None),
                        ..ObjectMeta::default()
                    },
                    data: Some(layouts.data()),
                    ..ConfigMap::default()
                };
                api.create(&PostParams::default(), &map).await?;
            }
        }
        Ok(())
    }

    /// The MIG configs nodes are set to now, each with the environments annotated as
    /// holding it there.
    pub(super) async fn layouts_on_nodes(&self) -> Result<BTreeMap<String, Vec<String>>, BackendError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let with_mig = ListParams::default().labels(MIG_CONFIG_LABEL);
        let found = nodes.list(&with_mig).await.map_err(|e| api_failure("list nodes with MIG layouts", e))?;
        Ok(layouts_named_by(&found.items))
    }

    /// Removes a layout of the mig-parted ConfigMap the sweep found orphaned, unless a
    /// writer came since the listing or a node names it now; the write names the
    /// resourceVersion read, so a change in between leaves it for the next sweep.
    pub(super) async fn remove_mig_layout(&self, object: &OwnedObject) -> Result<bool, BackendError> {
        let doing = format!("drop MIG layout {} from ConfigMap {}", object.name, self.config.cluster.mig_config_map);
        let Some(current) = self.mig_config_map().await.map_err(|e| api_failure(&doing, e))? else {
            return Ok(false);
        };
        let mut layouts = mig_layouts_of(&current);
        if !layouts.entries.contains_key(&object.name)
            || !layouts.writers_of(&object.name).iter().all(|e| object.environments.contains(e))
        {
            return Ok(false);
        }
        if self.layouts_on_nodes().await?.contains_key(&object.name) {
            return Ok(false);
        }
        layouts.remove(&object.name);
        match self.write_mig_layouts(Some(current), &layouts).await {
            Ok(()) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => Ok(false),
            Err(e) => Err(api_failure(&doing, e)),
        }
    }

    /// Waits until the GPU Operator's MIG manager reports the layout applied on the node.
    pub(super) async fn wait_mig_success(&self, node: &str, config: &str) -> Result<(), BackendError> {
        let api: Api<Node> = Api::all(self.client.clone());
        loop {
            let found = api.get_opt(node).await.map_err(|e| api_failure(&format!("read node {node}"), e))?;
            let Some(found) = found else {
                return Err(BackendError(format!("node {node} is not in the Kubernetes cluster")));
            };
            let labels = found.metadata.labels.unwrap_or_default();
            let applied = labels.get(MIG_CONFIG_LABEL).map(String::as_str) == Some(config);
            match labels.get(MIG_STATE_LABEL).map(String::as_str) {
                Some("success") if applied => return Ok(()),
                Some("failed") if applied => {
                    return Err(BackendError(format!(
                        "the GPU Operator could not apply MIG layout {config} on node {node}"
                    )));
                }
                _ => tokio::time::sleep(self.config.poll_interval).await,
            }
        }
    }
}

/// What the orphan sweep calls a node's MIG layout set by Berth.
pub const MIG_LAYOUT: &str = "MigLayout";
/// What the orphan sweep calls a layout in the mig-parted ConfigMap.
pub const MIG_CONFIG_ENTRY: &str = "MigConfigEntry";

/// Berth's layouts in the mig-parted ConfigMap.
pub(super) fn mig_layouts_of(map: &ConfigMap) -> MigLayouts {
    MigLayouts::read(&map.data.clone().unwrap_or_default(), &map.metadata.annotations.clone().unwrap_or_default())
}

/// The MIG configs `nodes` are set to (MIG disabled aside), each with the environments
/// the nodes annotate as holding it.
pub(super) fn layouts_named_by(nodes: &[Node]) -> BTreeMap<String, Vec<String>> {
    let mut named: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for node in nodes {
        if let Some(config) = node.labels().get(MIG_CONFIG_LABEL).filter(|c| *c != MIG_DISABLED) {
            named.entry(config.clone()).or_default().extend(mig_holders(node).unwrap_or_default());
        }
    }
    named
}

/// The environments keeping the node's Berth MIG layout in place; `None` when Berth set
/// no layout there (or only disabled MIG).
pub(super) fn mig_holders(node: &Node) -> Option<Vec<String>> {
    let config = node.labels().get(MIG_CONFIG_LABEL)?;
    if config == MIG_DISABLED {
        return None;
    }
    let holders = node.annotations().get(MIG_ENVIRONMENTS_ANNOTATION)?;
    Some(holders.split(',').filter(|e| !e.is_empty()).map(str::to_owned).collect())
}
