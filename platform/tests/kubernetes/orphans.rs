//! The orphan sweep: objects no live environment explains, MIG layouts and the mig-parted ConfigMap.

use std::collections::BTreeMap;

use berth_domain::catalog::Offering;
use berth_domain::lifecycle::{Step, provision_plan};
use berth_platform::provisioning::backend::kubernetes::manifests::{self};
use berth_platform::provisioning::backend::{Backend, OwnedObject, PlacedUnit, Workload, orphans};
use serde_json::json;

use crate::kubernetes_api::FakeCluster;
use crate::support::{ENV_ID, MIG_MAP, OTHER_ENV_ID, THIRD_ENV_ID, acme, backend, cases, live, mig_unit, ns, workload};

#[tokio::test]
async fn the_orphan_sweep_finds_and_removes_what_no_live_environment_explains() {
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    let cases = cases();
    let kept = &cases[0].1; // the notebook stays
    let mut dead = cases[1].1.clone(); // a hard-isolated training job whose environment is gone
    dead.environment_id = OTHER_ENV_ID.into();
    for w in [kept, &dead] {
        for step in provision_plan(w.offering, w.shape) {
            k8s.run(w, step).await.unwrap();
        }
    }
    cluster.take_calls();
    let live_ids = live(&[ENV_ID]);

    let owned = k8s.owned_objects().await.unwrap();
    assert_eq!(
        owned.len(),
        9,
        "the tenant's namespace and the notebook's StatefulSet, Service, Secret and proxy policy in it, the dead \
         environment's namespace, one dedicated node, one MIG layout on its node and in the ConfigMap: {owned:?}"
    );
    let layout = owned.iter().find(|o| o.kind == "MigLayout").expect("the notebook's MIG layout");
    assert_eq!((layout.name.as_str(), layout.environments.as_slice()), ("h100-1", [ENV_ID.to_owned()].as_slice()));
    let entry = owned.iter().find(|o| o.kind == "MigConfigEntry").expect("the layout in the ConfigMap");
    assert_eq!(entry.name, manifests::node_mig_layout(kept, "h100-1").unwrap().name);
    assert_eq!(entry.environments, [ENV_ID], "written by the notebook, which its node names");
    let reported = orphans(&owned, &live_ids);
    let found: Vec<(&str, String)> = reported.iter().map(|o| (o.kind, o.name.clone())).collect();
    assert_eq!(found, [("Namespace", ns(&dead)), ("Node", "h100-2".to_owned())], "only the dead environment's objects");
    assert!(reported.iter().all(|o| o.environments == [OTHER_ENV_ID]));
    let calls = cluster.take_calls();
    assert!(calls.iter().all(|c| c.method == "GET"), "listing changes nothing");
    let selector = calls.iter().map(|c| c.query.clone()).next().unwrap_or_default();
    assert!(selector.contains("managed-by"), "lists only Berth's objects: {selector}");

    for orphan in &reported {
        assert!(k8s.remove_owned(orphan).await.unwrap(), "{orphan:?} removed");
    }
    let paths = cluster.environment_objects();
    assert!(paths.iter().all(|p| !p.contains(&ns(&dead))), "{paths:?}");
    assert!(paths.iter().any(|p| p.contains(&ns(kept))), "the live environment keeps its objects");
    let node = cluster.node("h100-2");
    assert!(node["metadata"]["labels"].get("berth.dev/tenant").is_none(), "{node}");
    assert!(node.pointer("/spec/taints").is_none(), "{node}");
    let owned = k8s.owned_objects().await.unwrap();
    assert_eq!(orphans(&owned, &live_ids), vec![], "a second sweep finds nothing");
    // Removing again what is already gone does nothing, and says so.
    for orphan in &reported {
        assert!(!k8s.remove_owned(orphan).await.unwrap(), "{orphan:?} was gone already");
    }
}

#[tokio::test]
async fn a_mig_layout_no_live_environment_holds_is_disabled_by_the_sweep() {
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    // Two notebooks share h100-1's layout; the second's MIG step landed after both had
    // gone (an answer lost in a timeout), so the node keeps a layout nobody holds.
    let mut first = cases()[0].1.clone();
    let mut second = first.clone();
    second.environment_id = OTHER_ENV_ID.into();
    second.units = vec![PlacedUnit { environment_id: OTHER_ENV_ID.into(), ..mig_unit("h100-1", 0, 1, "1g.10gb") }];
    second.mig_neighbours = first.units.clone();
    first.mig_neighbours = second.units.clone();
    k8s.run(&second, Step::ConfigurePartition).await.unwrap();
    let labels = cluster.node("h100-1")["metadata"].clone();
    assert_eq!(labels["annotations"]["berth.dev/mig-environments"], format!("{ENV_ID},{OTHER_ENV_ID}"), "{labels}");

    let owned = k8s.owned_objects().await.unwrap();
    let layout = owned.iter().find(|o| o.kind == "MigLayout").expect("listed").clone();
    assert_eq!(layout.environments, [ENV_ID, OTHER_ENV_ID]);
    // Either environment alive explains it; with both gone it is an orphan.
    let layouts = |found: Vec<OwnedObject>| found.into_iter().filter(|o| o.kind == "MigLayout").collect::<Vec<_>>();
    assert!(layouts(orphans(&owned, &live(&[OTHER_ENV_ID]))).is_empty());
    assert_eq!(layouts(orphans(&owned, &live(&[]))), std::slice::from_ref(&layout));
    cluster.take_calls();
    assert!(k8s.remove_owned(&layout).await.unwrap());
    let node = cluster.node("h100-1");
    assert_eq!(node["metadata"]["labels"]["nvidia.com/mig.config"], "all-disabled", "{node}");
    assert!(node["metadata"].get("annotations").is_none(), "{node}");
    let apply = cluster.take_calls().into_iter().find(|c| c.method == "PATCH").expect("one apply");
    assert!(apply.body.unwrap()["metadata"]["resourceVersion"].is_string(), "the apply is conditional");
    assert!(layouts(k8s.owned_objects().await.unwrap()).is_empty(), "no MIG layout of Berth's left");
    assert!(!k8s.remove_owned(&layout).await.unwrap(), "a second removal finds nothing to do");

    // The layout is still in the ConfigMap, written by the second notebook: with it gone and
    // no node set to it, the sweep drops it there too.
    let entry = k8s.owned_objects().await.unwrap().into_iter().find(|o| o.kind == "MigConfigEntry").expect("listed");
    assert_eq!(entry.environments, [OTHER_ENV_ID]);
    cluster.take_calls();
    assert!(k8s.remove_owned(&entry).await.unwrap());
    assert_eq!(
        cluster.take_lines(),
        [
            format!("GET {MIG_MAP}/berth-mig-parted-config"),
            "GET /api/v1/nodes".into(),
            format!("PUT {MIG_MAP}/berth-mig-parted-config")
        ]
    );
    assert_eq!(cluster.mig_layouts(), Vec::<String>::new());
    let document = cluster.lock().objects[&format!("{MIG_MAP}/berth-mig-parted-config")]["data"]["config.yaml"].clone();
    assert_eq!(document, "version: v1\nmig-configs:\n  all-disabled:\n    - devices: all\n      mig-enabled: false\n");
    assert!(!k8s.remove_owned(&entry).await.unwrap(), "a second removal finds nothing to do");
}

/// The mig-parted ConfigMap no longer grows: a layout leaves it once no node is set to it
/// and no live environment wrote it; never while a writer may be about to set a node to
/// it, nor once a node is set to it again.
#[tokio::test]
async fn the_sweep_drops_layouts_from_the_config_map_that_nothing_needs_and_only_those() {
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    let map_path = format!("{MIG_MAP}/berth-mig-parted-config");
    // The notebook's layout, set on h100-1.
    let notebook = cases()[0].1.clone();
    k8s.run(&notebook, Step::ConfigurePartition).await.unwrap();
    let named = manifests::node_mig_layout(&notebook, "h100-1").unwrap().name;
    // Another environment's layout, written but its node not set yet: the step failed
    // between the two (or the sweep looks right then).
    let on_h100_2 = |id: &str| {
        let unit = PlacedUnit { environment_id: id.into(), ..mig_unit("h100-2", 0, 4, "3g.40gb") };
        Workload { environment_id: id.into(), ..workload(Offering::Notebook, "h100-3g.40gb", acme(), vec![unit]) }
    };
    let pending = on_h100_2(OTHER_ENV_ID);
    let write_only = |w: Workload| {
        let (cluster, k8s) = (&cluster, &k8s);
        async move {
            cluster.lock().failing.insert("/api/v1/nodes/h100-2".into(), 403);
            assert!(k8s.run(&w, Step::ConfigurePartition).await.is_err(), "the node is not set");
            cluster.lock().failing.clear();
        }
    };
    write_only(pending.clone()).await;
    let written = manifests::node_mig_layout(&pending, "h100-2").unwrap().name;
    // And one an earlier Berth wrote, with no writer on record: nothing needs it.
    let stray = "berth-000000000000";
    cluster.lock().objects.get_mut(&map_path).unwrap()["data"][stray] = json!(format!(
        "  {stray}:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {{\"7g.80gb\": 1}}\n"
    ));
    let owned = k8s.owned_objects().await.unwrap();
    let entries: BTreeMap<String, Vec<String>> =
        owned.iter().filter(|o| o.kind == "MigConfigEntry").map(|o| (o.name.clone(), o.environments.clone())).collect();
    assert_eq!(
        entries,
        BTreeMap::from([
            (stray.to_owned(), vec![]),
            (named.clone(), vec![ENV_ID.to_owned()]),
            (written.clone(), vec![OTHER_ENV_ID.to_owned()]),
        ])
    );

    // Both environments live: only the stray layout is an orphan.
    let entries_of =
        |found: Vec<OwnedObject>| found.into_iter().filter(|o| o.kind == "MigConfigEntry").collect::<Vec<_>>();
    let orphaned = entries_of(orphans(&owned, &live(&[ENV_ID, OTHER_ENV_ID])));
    assert_eq!(orphaned.iter().map(|o| o.name.as_str()).collect::<Vec<_>>(), [stray]);
    cluster.take_calls();
    assert!(k8s.remove_owned(&orphaned[0]).await.unwrap());
    assert_eq!(
        cluster.take_lines(),
        [format!("GET {map_path}"), "GET /api/v1/nodes".into(), format!("PUT {map_path}")],
        "read, see that no node is set to it, write back naming the version read"
    );
    let mut kept = vec![named.clone(), written.clone()];
    kept.sort();
    assert_eq!(cluster.mig_layouts(), kept);

    // Both gone. The pending layout stays when a writer came since the listing: that one
    // may be about to set its node.
    let orphaned = entries_of(orphans(&owned, &live(&[])));
    let pending_entry = orphaned.iter().find(|o| o.name == written).unwrap();
    write_only(on_h100_2(THIRD_ENV_ID)).await;
    assert!(!k8s.remove_owned(pending_entry).await.unwrap(), "a writer came since the listing");
    let relisted = k8s.owned_objects().await.unwrap().into_iter().find(|o| o.name == written).unwrap();
    assert_eq!(relisted.environments, [THIRD_ENV_ID, OTHER_ENV_ID], "in order");
    assert!(orphans(std::slice::from_ref(&relisted), &live(&[THIRD_ENV_ID])).is_empty(), "its writer is live");
    assert!(k8s.remove_owned(&relisted).await.unwrap(), "listed again with all its writers gone");
    assert_eq!(cluster.mig_layouts(), std::slice::from_ref(&named));

    // The notebook's layout stays while h100-1 is set to it...
    let named_entry = orphaned.iter().find(|o| o.name == named).unwrap();
    assert!(!k8s.remove_owned(named_entry).await.unwrap(), "h100-1 is set to it");
    // ...and when h100-1 is set to it again after the listing.
    k8s.run(&notebook, Step::ClearPartition).await.unwrap();
    let cleared = k8s.owned_objects().await.unwrap().into_iter().find(|o| o.name == named).unwrap();
    assert_eq!(cleared.environments, [ENV_ID], "its writer, until the notebook's capacity is released");
    k8s.run(&notebook, Step::ConfigurePartition).await.unwrap();
    assert!(!k8s.remove_owned(&cleared).await.unwrap(), "a node is set to it again");
    k8s.run(&notebook, Step::ClearPartition).await.unwrap();
    assert!(k8s.remove_owned(&cleared).await.unwrap(), "no node is set to it any more");
    assert_eq!(cluster.mig_layouts(), Vec::<String>::new());
}
