//! Volume use on Kubernetes from the kubelets: each Ready node's stats summary, read through
//! the API server's node proxy (`GET /api/v1/nodes/{node}/proxy/stats/summary`, what
//! `kubectl get --raw` reads), lists every running pod's volumes; those with a `pvcRef`
//! name the claim they mount and carry the kubelet's `usedBytes` and `capacityBytes` of it.
//!
//! A claim is a Berth volume's where its location says so: a soft tenant's claim by its
//! namespace and name (`claim <namespace>/berth-vol-<id>`), and a volume kept as a
//! PersistentVolume (`persistentvolume berth.dev/volume=<id>`) by that PersistentVolume's
//! `claimRef`: the claim it is bound to now, whichever environment's namespace it is in.
//! A volume whose claim no running pod mounts is in no summary, so it is not measured and
//! keeps its last figure. Nodes are read [`NODES_AT_ONCE`] at a time, each within the
//! configured timeout; a node that does not answer, or answers nonsense, is logged with
//! its name and left out, so one sick kubelet never hides the others.
//!
//! Berth needs `get` on `nodes/proxy` for this (and `list` on nodes and
//! PersistentVolumes, which it has for its other work).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde::Deserialize;

use super::super::{StoredVolume, VolumeUse};
use super::manifests::VOLUME_LABEL;
use super::{CLAIM_LOCATION, KEPT_LOCATION};

/// Kubelets asked at once.
const NODES_AT_ONCE: usize = 16;

/// A PersistentVolumeClaim, by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
}

/// One pod volume's figures for the claim it mounts, as one kubelet reported them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimUse {
    pub claim: ClaimRef,
    pub used_bytes: u64,
    pub capacity_bytes: Option<u64>,
}

// The parts of the kubelet's `stats/v1alpha1` Summary read here (`Summary.pods[]`,
// `PodStats.volume[]`, `VolumeStats` with its inlined `FsStats` and `pvcRef`); serde passes
// over the rest (node, containers, CPU, memory, network, ephemeral storage).
#[derive(Deserialize)]
struct Summary {
    #[serde(default)]
    pods: Vec<PodStats>,
}

#[derive(Deserialize)]
struct PodStats {
    #[serde(default)]
    volume: Vec<VolumeStats>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct VolumeStats {
    used_bytes: Option<u64>,
    capacity_bytes: Option<u64>,
    pvc_ref: Option<PvcReference>,
}

#[derive(Deserialize)]
struct PvcReference {
    name: String,
    namespace: String,
}

/// The claims' figures in one node's stats summary: every pod volume that names a claim
/// and has a `usedBytes` (the kubelet leaves it out until it has measured the volume once).
/// Volumes that are not claims (a ConfigMap, an emptyDir, the service account's token) are
/// left out.
pub fn parse_summary(text: &str) -> Result<Vec<ClaimUse>, serde_json::Error> {
    let summary: Summary = serde_json::from_str(text)?;
    Ok(summary
        .pods
        .into_iter()
        .flat_map(|pod| pod.volume)
        .filter_map(|v| {
            let claim = v.pvc_ref?;
            Some(ClaimUse {
                claim: ClaimRef { namespace: claim.namespace, name: claim.name },
                used_bytes: v.used_bytes?,
                capacity_bytes: v.capacity_bytes,
            })
        })
        .collect())
}

/// The claims of `volumes` Berth can tell from their locations alone (a soft tenant's, in
/// its namespace), and the ids of those kept as PersistentVolumes, whose claims their
/// `claimRef` names.
pub fn claims_by_location(volumes: &[StoredVolume]) -> (HashMap<ClaimRef, i64>, Vec<i64>) {
    let mut claims = HashMap::new();
    let mut kept = Vec::new();
    for v in volumes {
        if let Some((namespace, name)) = v.location.strip_prefix(CLAIM_LOCATION).and_then(|c| c.split_once('/')) {
            claims.insert(ClaimRef { namespace: namespace.to_owned(), name: name.to_owned() }, v.volume_id);
        } else if v.location.starts_with(KEPT_LOCATION) {
            kept.push(v.volume_id);
        }
    }
    (claims, kept)
}

/// Each volume's use from what the kubelets reported of its claim. A claim mounted by pods
/// on several nodes (ReadWriteMany) is reported by each; the largest figure counts, the
/// one the next attach must allow for.
pub fn volume_use(claims: &HashMap<ClaimRef, i64>, reported: impl IntoIterator<Item = ClaimUse>) -> Vec<VolumeUse> {
    let mut by_volume: BTreeMap<i64, VolumeUse> = BTreeMap::new();
    for found in reported {
        let Some(&volume_id) = claims.get(&found.claim) else { continue };
        let figure = VolumeUse { volume_id, used_bytes: found.used_bytes, capacity_bytes: found.capacity_bytes };
        by_volume
            .entry(volume_id)
            .and_modify(|kept| {
                if figure.used_bytes > kept.used_bytes {
                    *kept = figure;
                }
            })
            .or_insert(figure);
    }
    by_volume.into_values().collect()
}

/// What `volumes` hold now, from every Ready node's kubelet. Listing nodes or kept
/// PersistentVolumes failing is logged and measures nothing this time.
pub(super) async fn collect(client: &Client, volumes: &[StoredVolume], timeout: Duration) -> Vec<VolumeUse> {
    let (mut claims, kept) = claims_by_location(volumes);
    if !kept.is_empty() {
        match tokio::time::timeout(timeout, kept_claims(client, &kept)).await {
            Ok(Ok(found)) => claims.extend(found),
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot list kept PersistentVolumes to measure their volumes"),
            Err(_) => tracing::warn!("listing kept PersistentVolumes to measure their volumes timed out"),
        }
    }
    if claims.is_empty() {
        return Vec::new();
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let listed = match tokio::time::timeout(timeout, nodes.list(&ListParams::default())).await {
        Ok(Ok(listed)) => listed.items,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot list nodes to measure volumes; they keep their last figures");
            return Vec::new();
        }
        Err(_) => {
            tracing::warn!("listing nodes to measure volumes timed out; they keep their last figures");
            return Vec::new();
        }
    };
    let limit = Arc::new(tokio::sync::Semaphore::new(NODES_AT_ONCE));
    let mut reads = tokio::task::JoinSet::new();
    for node in listed.iter().filter(|n| is_ready(n)) {
        let (client, limit, name) = (client.clone(), limit.clone(), node.name_any());
        reads.spawn(async move {
            let _turn = limit.acquire_owned().await;
            let read = tokio::time::timeout(timeout, summary_of(&client, &name)).await;
            (name, read)
        });
    }
    let mut reported = Vec::new();
    while let Some(done) = reads.join_next().await {
        match done {
            Ok((_, Ok(Ok(found)))) => reported.extend(found),
            Ok((node, Ok(Err(why)))) => tracing::warn!(node = %node, "kubelet stats summary not read: {why}"),
            Ok((node, Err(_))) => tracing::warn!(
                node = %node,
                "kubelet stats summary not read: no answer within {} s",
                timeout.as_secs_f64()
            ),
            Err(e) => tracing::warn!(error = %e, "a kubelet stats summary read did not finish"),
        }
    }
    volume_use(&claims, reported)
}

/// The claims the PersistentVolumes kept for volumes `kept` are bound to now (their
/// `claimRef`), by the volume label Berth gives them. A PersistentVolume is the cluster's,
/// so its label and `claimRef` are Berth's word, not a tenant's.
async fn kept_claims(client: &Client, kept: &[i64]) -> Result<Vec<(ClaimRef, i64)>, kube::Error> {
    let api: Api<PersistentVolume> = Api::all(client.clone());
    let listed = api.list(&ListParams::default().labels(VOLUME_LABEL)).await?;
    Ok(listed
        .items
        .iter()
        .filter_map(|pv| {
            let volume_id: i64 = pv.labels().get(VOLUME_LABEL)?.parse().ok()?;
            let bound = pv.spec.as_ref()?.claim_ref.as_ref()?;
            let claim = ClaimRef { namespace: bound.namespace.clone()?, name: bound.name.clone()? };
            kept.contains(&volume_id).then_some((claim, volume_id))
        })
        .collect())
}

/// One node's stats summary through the API server's proxy, parsed.
async fn summary_of(client: &Client, node: &str) -> Result<Vec<ClaimUse>, String> {
    let request = http::Request::get(format!("/api/v1/nodes/{node}/proxy/stats/summary"))
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    let text = client.request_text(request).await.map_err(|e| e.to_string())?;
    parse_summary(&text).map_err(|e| format!("not a stats summary: {e}"))
}

/// A node whose kubelet reports Ready: the others' kubelets would not answer.
fn is_ready(node: &Node) -> bool {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Reconstructed from the kubelet's `stats/v1alpha1` Summary type, not recorded from a
    // cluster: see `fixtures/kubelet/README.md`.
    const SUMMARY: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/kubelet/stats-summary.json"));
    const GIB: u64 = 1 << 30;

    fn claim(namespace: &str, name: &str) -> ClaimRef {
        ClaimRef { namespace: namespace.into(), name: name.into() }
    }

    #[test]
    fn a_summary_gives_each_mounted_claim_with_its_figures_and_nothing_else() {
        let found = parse_summary(SUMMARY).expect("a summary");
        let seen: Vec<(&str, &str, u64, Option<u64>)> = found
            .iter()
            .map(|c| (c.claim.namespace.as_str(), c.claim.name.as_str(), c.used_bytes, c.capacity_bytes))
            .collect();
        assert_eq!(
            seen,
            [
                // A soft tenant's notebook: its home and a project volume (CephFS, quota = size).
                ("berth-acme", "berth-vol-7", 3_221_225_472, Some(10 * GIB)),
                ("berth-acme", "berth-vol-8", 12_884_901_888, Some(50 * GIB)),
                // A hard tenant's job, in its own namespace.
                ("berth-vault-999999998888", "berth-vol-12", 524_288_000, Some(20 * GIB)),
                // Another team's pod: a claim that is not Berth's.
                ("ml-team", "checkpoints", 107_374_182_400, Some(2_199_023_255_552)),
            ],
            "no emptyDir, token or ConfigMap volume, and no claim the kubelet has not measured yet"
        );
        assert!(parse_summary("{\"kind\": \"Status\"").is_err());
        assert_eq!(parse_summary("{\"node\": {\"nodeName\": \"idle\"}}").expect("no pods"), []);
    }

    #[test]
    fn claims_map_to_volumes_by_location_and_the_largest_figure_counts() {
        let stored = |volume_id, location: &str| StoredVolume { volume_id, location: location.into() };
        let (mut claims, kept) = claims_by_location(&[
            stored(7, "claim berth-acme/berth-vol-7"),
            stored(8, "claim berth-acme/berth-vol-8"),
            stored(12, "persistentvolume berth.dev/volume=12"),
            stored(13, "/srv/volumes/berth-vol-13"),
        ]);
        assert_eq!(kept, [12]);
        claims.insert(claim("berth-vault-999999998888", "berth-vol-12"), 12);
        let mut reported = parse_summary(SUMMARY).expect("a summary");
        // The project volume also mounted by a pod on another node, read a moment later.
        reported.push(ClaimUse {
            claim: claim("berth-acme", "berth-vol-8"),
            used_bytes: 13 * GIB,
            capacity_bytes: Some(50 * GIB),
        });
        // A claim of the same name in another namespace is not the volume's.
        reported.push(ClaimUse { claim: claim("ml-team", "berth-vol-7"), used_bytes: 99 * GIB, capacity_bytes: None });
        let used: Vec<(i64, u64)> = volume_use(&claims, reported).iter().map(|u| (u.volume_id, u.used_bytes)).collect();
        assert_eq!(used, [(7, 3 * GIB), (8, 13 * GIB), (12, 524_288_000)]);
    }
}
