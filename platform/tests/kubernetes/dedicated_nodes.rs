//! Nodes dedicated to a hard tenant, shared by its environments, and swept only when all are gone.

use berth_domain::catalog::Offering;
use berth_domain::lifecycle::{Step, provision_plan, teardown_plan};
use berth_platform::provisioning::backend::kubernetes::manifests::{self};
use berth_platform::provisioning::backend::kubernetes::{Kubernetes, KubernetesConfig};
use berth_platform::provisioning::backend::{Backend, OwnedObject, PlacedUnit, Workload, orphans};
use serde_json::{Value, json};

use crate::kubernetes_api::FakeCluster;
use crate::support::{
    ENV_ID, MIG_MAP, OTHER_ENV_ID, THIRD_ENV_ID, assert_nothing_left, backend, cases, gpu_unit, live, mig_unit, vault,
    workload,
};

#[tokio::test]
async fn the_sweep_leaves_a_node_alone_that_another_environment_took_since_the_listing() {
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    let mut dead = cases()[1].1.clone(); // a hard tenant's training job on h100-2
    dead.environment_id = OTHER_ENV_ID.into();
    k8s.run(&dead, Step::StartWorkload).await.unwrap();
    let owned = k8s.owned_objects().await.unwrap();
    let node = owned.iter().find(|o| o.kind == "Node").expect("dedicated node listed").clone();
    // Between the listing and the removal the dead one is torn down and a new
    // environment takes the node.
    for step in teardown_plan(dead.shape) {
        k8s.run(&dead, step).await.unwrap();
    }
    let newcomer = cases()[1].1.clone();
    k8s.run(&newcomer, Step::StartWorkload).await.unwrap();
    assert!(!k8s.remove_owned(&node).await.unwrap(), "not the listed environment's any more");
    assert_eq!(holders(&cluster, "h100-2"), json!(ENV_ID));

    // The same when the node changes between the sweep's read and its write: the
    // conditional apply is refused and nothing is undone.
    let taken = OwnedObject { environments: vec![ENV_ID.into()], ..node };
    cluster.lock().bump_node_on_next_read = Some("h100-2".into());
    assert!(!k8s.remove_owned(&taken).await.unwrap(), "changed between read and write");
    assert_eq!(holders(&cluster, "h100-2"), json!(ENV_ID));
    assert!(k8s.remove_owned(&taken).await.unwrap(), "removed once it holds still");
    let node = cluster.node("h100-2");
    assert!(node["metadata"]["labels"].get("berth.dev/tenant").is_none(), "{node}");
    assert!(node.pointer("/metadata/annotations/berth.dev~1tenant-environments").is_none(), "{node}");
}

/// The environments a node's dedication names.
fn holders(cluster: &FakeCluster, node: &str) -> Value {
    cluster.node(node).pointer("/metadata/annotations/berth.dev~1tenant-environments").cloned().unwrap_or(Value::Null)
}

/// Two environments of the hard tenant vault on h100-2: a 4-GPU training job on GPUs 0-3
/// and a MIG notebook on GPU 4, each told of the other as booking tells them.
fn vault_pair() -> (Workload, Workload) {
    let mut training = cases()[1].1.clone();
    let slice = PlacedUnit { environment_id: OTHER_ENV_ID.into(), ..mig_unit("h100-2", 4, 0, "1g.10gb") };
    let mut notebook = workload(Offering::Notebook, "h100-1g.10gb", vault(), vec![slice]);
    notebook.environment_id = OTHER_ENV_ID.into();
    training.tenant_neighbours = notebook.units.clone();
    training.mig_neighbours = notebook.units.clone();
    notebook.tenant_neighbours = training.units.clone();
    (training, notebook)
}

#[tokio::test]
async fn a_hard_tenants_node_is_marked_once_and_given_back_when_its_last_environment_leaves() {
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    let (mut training, mut notebook) = vault_pair();
    for step in provision_plan(notebook.offering, notebook.shape) {
        k8s.run(&notebook, step).await.unwrap();
    }
    let layout = manifests::node_mig_layout(&notebook, "h100-2").unwrap().name;
    for step in provision_plan(training.offering, training.shape) {
        k8s.run(&training, step).await.unwrap();
    }
    // One label, one taint, one annotation naming both; the notebook's MIG layout kept by
    // the training job's apply, which holds no slice there itself.
    let node = cluster.node("h100-2");
    assert_eq!(node["metadata"]["labels"]["berth.dev/tenant"], "vault", "{node}");
    assert_eq!(
        node["spec"]["taints"],
        json!([{ "key": "berth.dev/tenant", "value": "vault", "effect": "NoSchedule" }])
    );
    assert_eq!(holders(&cluster, "h100-2"), json!(format!("{ENV_ID},{OTHER_ENV_ID}")));
    assert_eq!(node["metadata"]["labels"]["nvidia.com/mig.config"], json!(layout), "{node}");
    assert_eq!(node["metadata"]["annotations"]["berth.dev/mig-environments"], OTHER_ENV_ID, "{node}");
    let owned = k8s.owned_objects().await.unwrap();
    let dedicated = owned.iter().find(|o| o.kind == "Node").expect("listed");
    assert_eq!(dedicated.environments, [ENV_ID, OTHER_ENV_ID]);
    assert!(orphans(std::slice::from_ref(dedicated), &live(&[OTHER_ENV_ID])).is_empty());

    // The training job leaves first: the node stays the tenant's, the notebook's layout stays.
    notebook.tenant_neighbours.clear();
    for step in teardown_plan(training.shape) {
        k8s.run(&training, step).await.unwrap();
    }
    let node = cluster.node("h100-2");
    assert_eq!(node["metadata"]["labels"]["berth.dev/tenant"], "vault", "{node}");
    assert_eq!(node["spec"]["taints"][0]["value"], "vault", "{node}");
    assert_eq!(holders(&cluster, "h100-2"), json!(OTHER_ENV_ID));
    assert_eq!(node["metadata"]["labels"]["nvidia.com/mig.config"], json!(layout), "{node}");

    // The last one out gives the node back.
    training.tenant_neighbours.clear();
    for step in teardown_plan(notebook.shape) {
        k8s.run(&notebook, step).await.unwrap();
    }
    assert_nothing_left(&cluster, "vault pair");
    assert!(
        cluster.node("h100-2")["metadata"]
            .get("annotations")
            .is_none_or(|a| a.get("berth.dev/tenant-environments").is_none())
    );
}

#[tokio::test]
async fn a_dedicated_node_keeps_a_neighbours_layout_the_operator_can_read() {
    // The notebook's slice is booked and started, but its own MIG step has not run yet
    // when the training job marks the node: the layout it names is written first.
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    let (training, notebook) = vault_pair();
    k8s.run(&training, Step::StartWorkload).await.unwrap();
    let layout = manifests::node_mig_layout(&notebook, "h100-2").unwrap();
    let map = cluster.lock().objects[&format!("{MIG_MAP}/berth-mig-parted-config")].clone();
    assert_eq!(map["data"][&layout.name], json!(layout.entry));
    assert_eq!(cluster.node("h100-2")["metadata"]["labels"]["nvidia.com/mig.config"], json!(layout.name));
}

#[tokio::test]
async fn a_node_shared_by_one_tenants_environments_is_an_orphan_only_when_all_are_gone() {
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    let (training, notebook) = vault_pair();
    for w in [&notebook, &training] {
        for step in provision_plan(w.offering, w.shape) {
            k8s.run(w, step).await.unwrap();
        }
    }
    let owned = k8s.owned_objects().await.unwrap();
    let node = owned.iter().find(|o| o.kind == "Node").expect("listed").clone();
    for env in [ENV_ID, OTHER_ENV_ID] {
        assert!(orphans(std::slice::from_ref(&node), &live(&[env])).is_empty(), "{env}");
    }
    assert_eq!(orphans(std::slice::from_ref(&node), &live(&[])), std::slice::from_ref(&node));
    // A third environment of the tenant joins between the listing and the removal: the
    // node is not the listed environments' alone any more, so the sweep leaves it.
    let mut third = training.clone();
    third.environment_id = THIRD_ENV_ID.into();
    third.units = vec![PlacedUnit { environment_id: THIRD_ENV_ID.into(), ..gpu_unit("h100-2", 5) }];
    third.tenant_neighbours = training.units.iter().chain(&notebook.units).cloned().collect();
    k8s.run(&third, Step::StartWorkload).await.unwrap();
    assert_eq!(holders(&cluster, "h100-2"), json!(format!("{ENV_ID},{THIRD_ENV_ID},{OTHER_ENV_ID}")));
    assert!(!k8s.remove_owned(&node).await.unwrap(), "a live environment joined");
    assert_eq!(cluster.node("h100-2")["metadata"]["labels"]["berth.dev/tenant"], "vault");
    // Listed again with all three gone, it is given back, keeping the MIG layout's part.
    let node = k8s.owned_objects().await.unwrap().into_iter().find(|o| o.kind == "Node").expect("listed");
    assert!(k8s.remove_owned(&node).await.unwrap());
    let after = cluster.node("h100-2");
    assert!(after["metadata"]["labels"].get("berth.dev/tenant").is_none(), "{after}");
    assert!(after.pointer("/spec/taints").is_none(), "{after}");
    assert_eq!(after["metadata"]["annotations"]["berth.dev/mig-environments"], OTHER_ENV_ID, "{after}");
}

#[tokio::test]
async fn an_unreachable_cluster_is_refused_at_start_up_with_a_clear_message() {
    // Port 9 (discard) on loopback: nothing listens, the connection is refused at once.
    let client = kube::Config::new("https://127.0.0.1:9".parse().unwrap());
    let error = Kubernetes::connect_with(client, KubernetesConfig::default()).await.err().expect("no cluster");
    assert!(error.starts_with("the Kubernetes API server at https://127.0.0.1:9 does not answer"), "{error}");
}
