//! The orphan sweep on Kubernetes: what Berth made (found by its labels and annotations)
//! and how each orphan is removed or given back. Which of them are orphans is decided by
//! `backend::orphans`, from what is live.

use super::*;

impl Kubernetes {
    /// Everything Berth made: namespaces labelled for an environment (everything in them
    /// goes with them), tenants' namespaces and the objects labelled for an environment in
    /// them (named `<namespace>/<name>`), ClusterQueues (an environment's, or a tenant's), dedicated nodes,
    /// nodes' MIG layouts with the environments that keep each in place, and the layouts
    /// of the mig-parted ConfigMap with the environments that wrote them or hold them on a
    /// node. Nodes are listed before the ConfigMap, so a sweep disables a stale layout on a
    /// node before it looks at the ConfigMap's copy. Objects being deleted are left out.
    pub(super) async fn owned(&self) -> Result<Vec<OwnedObject>, BackendError> {
        let mut owned = Vec::new();
        let berths = ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={FIELD_MANAGER}"));
        // What is being deleted already (a namespace emptying, a queue whose workloads are
        // finishing: Kueue holds it with a finalizer) is on its way out, not an orphan.
        let going = |object: &DynamicObject| object.metadata.deletion_timestamp.is_some();
        let found =
            self.api(&NAMESPACE, None).list(&berths).await.map_err(|e| api_failure("list Berth's namespaces", e))?;
        for namespace in found.iter().filter(|o| !going(o)) {
            let labels = namespace.labels();
            let Some(object) = OwnedObject::by_labels(
                NAMESPACE.kind,
                namespace.name_any(),
                labels.get(ENVIRONMENT_LABEL),
                labels.get(TENANT_LABEL),
            ) else {
                continue;
            };
            // A tenant's namespace: the tenant's, and its environments' objects in it.
            let tenants = object.tenant.is_some();
            owned.push(object);
            if tenants {
                owned.extend(self.environment_objects_in(&namespace.name_any()).await?);
            }
        }
        let found = self
            .api(&CLUSTER_QUEUE, None)
            .list(&berths)
            .await
            .map_err(|e| api_failure("list Berth's ClusterQueues", e))?;
        owned.extend(found.iter().filter(|o| !going(o)).filter_map(|queue| {
            let labels = queue.labels();
            OwnedObject::by_labels(
                CLUSTER_QUEUE.kind,
                queue.name_any(),
                labels.get(ENVIRONMENT_LABEL),
                labels.get(TENANT_LABEL),
            )
        }));
        let nodes: Api<Node> = Api::all(self.client.clone());
        let dedicated = ListParams::default().labels(TENANT_LABEL);
        let found = nodes.list(&dedicated).await.map_err(|e| api_failure("list dedicated nodes", e))?;
        owned.extend(
            found
                .iter()
                .map(|node| OwnedObject::for_environments(NODE.kind, node.name_any(), dedication_holders(node))),
        );
        let with_mig = ListParams::default().labels(MIG_CONFIG_LABEL);
        let found = nodes.list(&with_mig).await.map_err(|e| api_failure("list nodes with MIG layouts", e))?;
        owned.extend(
            found.iter().filter_map(|node| {
                Some(OwnedObject::for_environments(MIG_LAYOUT, node.name_any(), mig_holders(node)?))
            }),
        );
        let named = layouts_named_by(&found.items);
        let doing = format!("read ConfigMap {}", self.config.cluster.mig_config_map);
        if let Some(map) = self.mig_config_map().await.map_err(|e| api_failure(&doing, e))? {
            let layouts = mig_layouts_of(&map);
            owned.extend(layouts.entries.keys().map(|name| {
                let mut environments = layouts.writers_of(name);
                environments.extend(named.get(name).into_iter().flatten().cloned());
                OwnedObject::for_environments(MIG_CONFIG_ENTRY, name.clone(), environments.into_iter().collect())
            }));
        }
        Ok(owned)
    }

    /// The objects of environments in a tenant's namespace, named `<namespace>/<name>`.
    async fn environment_objects_in(&self, namespace: &str) -> Result<Vec<OwnedObject>, BackendError> {
        let labelled = ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={FIELD_MANAGER},{ENVIRONMENT_LABEL}"));
        let mut owned = Vec::new();
        for kind in ENVIRONMENT_KINDS {
            let doing = format!("list Berth's {} in {namespace}", kind.plural);
            let found = self.api(&kind, Some(namespace)).list(&labelled).await.map_err(|e| api_failure(&doing, e))?;
            owned.extend(found.iter().filter(|o| o.metadata.deletion_timestamp.is_none()).map(|object| {
                let environments = object.labels().get(ENVIRONMENT_LABEL).cloned().into_iter().collect();
                OwnedObject::for_environments(kind.kind, format!("{namespace}/{}", object.name_any()), environments)
            }));
        }
        Ok(owned)
    }

    /// Removes an orphan: namespaces, queues and an environment's objects in its tenant's
    /// namespace are deleted; a dedicated node loses Berth's labels, annotation and taint;
    /// a MIG layout nobody holds is disabled on its node, and dropped from the mig-parted
    /// ConfigMap once no node names it.
    pub(super) async fn remove(&self, object: &OwnedObject) -> Result<bool, BackendError> {
        match object.kind {
            "Namespace" => self.delete(&NAMESPACE, None, &object.name, false).await,
            kind if ENVIRONMENT_KINDS.iter().any(|k| k.kind == kind) => {
                let Some(k) = ENVIRONMENT_KINDS.iter().find(|k| k.kind == kind) else { return Ok(false) };
                let Some((namespace, name)) = object.name.split_once('/') else {
                    return Err(BackendError(format!("{kind} {} names no namespace", object.name)));
                };
                self.delete(k, Some(namespace), name, false).await
            }
            "ClusterQueue" => self.delete(&CLUSTER_QUEUE, None, &object.name, false).await,
            "Node" | MIG_LAYOUT => self.release_node_part(object).await,
            MIG_CONFIG_ENTRY => self.remove_mig_layout(object).await,
            other => Err(BackendError(format!("Berth does not sweep Kubernetes {other} objects"))),
        }
    }

    /// Takes the orphaned part (dedication or MIG layout) off a node, unless the node has
    /// changed hands since the sweep listed it. The apply keeps the rest of what Berth
    /// set and names the node's resourceVersion, so a change between reading and writing
    /// fails it with a conflict instead of undoing someone else's step.
    async fn release_node_part(&self, object: &OwnedObject) -> Result<bool, BackendError> {
        let api: Api<Node> = Api::all(self.client.clone());
        let doing = format!("read node {}", object.name);
        let Some(node) = api.get_opt(&object.name).await.map_err(|e| api_failure(&doing, e))? else {
            return Ok(false);
        };
        let labels = node.labels();
        let annotations = node.annotations();
        let mig = labels.get(MIG_CONFIG_LABEL).filter(|c| c.starts_with("berth-") || *c == MIG_DISABLED);
        let mig_holders = mig_holders(&node);
        let dedicated = labels.contains_key(TENANT_LABEL);
        let (keep_dedication, keep_mig) = if object.kind == MIG_LAYOUT {
            if mig_holders.as_ref() != Some(&object.environments) {
                return Ok(false);
            }
            (true, false)
        } else {
            if !dedicated || dedication_holders(&node) != object.environments {
                return Ok(false);
            }
            (false, true)
        };
        let mut meta = serde_json::json!({ "name": object.name });
        if let Some(version) = node.resource_version() {
            meta["resourceVersion"] = serde_json::json!(version);
        }
        let (mut kept_labels, mut kept_annotations) = (serde_json::Map::new(), serde_json::Map::new());
        let mut taints = Vec::new();
        if keep_dedication && dedicated {
            for key in [TENANT_LABEL, ENVIRONMENT_LABEL] {
                if let Some(value) = labels.get(key) {
                    kept_labels.insert(key.to_owned(), value.clone().into());
                }
            }
            if let Some(holders) = annotations.get(TENANT_ENVIRONMENTS_ANNOTATION) {
                kept_annotations.insert(TENANT_ENVIRONMENTS_ANNOTATION.to_owned(), holders.clone().into());
            }
            let spec_taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
            taints.extend(spec_taints.into_iter().filter(|t| t.key == TENANT_LABEL));
        }
        if keep_mig {
            if let Some(config) = mig {
                kept_labels.insert(MIG_CONFIG_LABEL.to_owned(), config.clone().into());
            }
            if let Some(holders) = annotations.get(MIG_ENVIRONMENTS_ANNOTATION) {
                kept_annotations.insert(MIG_ENVIRONMENTS_ANNOTATION.to_owned(), holders.clone().into());
            }
        } else {
            // Disabled rather than dropped: the MIG manager acts on the label's value.
            kept_labels.insert(MIG_CONFIG_LABEL.to_owned(), MIG_DISABLED.into());
        }
        if !kept_labels.is_empty() {
            meta["labels"] = kept_labels.into();
        }
        if !kept_annotations.is_empty() {
            meta["annotations"] = kept_annotations.into();
        }
        let mut release = serde_json::json!({ "apiVersion": "v1", "kind": "Node", "metadata": meta });
        if !taints.is_empty() {
            release["spec"] = serde_json::json!({ "taints": taints });
        }
        match self.apply_answer(&Manifest { kind: NODE, object: release }).await {
            Ok(()) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => Ok(false),
            Err(e) => Err(api_failure(&format!("give back node {}", object.name), e)),
        }
    }
}

/// The kinds of an environment's objects in its tenant's namespace, as the sweep lists them.
const ENVIRONMENT_KINDS: [Kind; 7] = [
    manifests::STATEFUL_SET,
    manifests::JOB,
    manifests::DEPLOYMENT,
    manifests::PERSISTENT_VOLUME_CLAIM,
    manifests::SERVICE,
    manifests::SECRET,
    manifests::NETWORK_POLICY,
];

/// The environments keeping a node dedicated to their tenant: its annotation, or the one
/// environment label nodes dedicated by earlier versions of Berth carry.
fn dedication_holders(node: &Node) -> Vec<String> {
    match node.annotations().get(TENANT_ENVIRONMENTS_ANNOTATION) {
        Some(holders) => holders.split(',').filter(|e| !e.is_empty()).map(str::to_owned).collect(),
        None => node.labels().get(ENVIRONMENT_LABEL).cloned().into_iter().collect(),
    }
}
