//! Whole lifecycles (a second pass, a crash after any step) and MIG layouts shared on one node.

use berth_domain::catalog::Offering;
use berth_domain::lifecycle::{Step, provision_plan, teardown_plan};
use berth_platform::provisioning::backend::Backend;
use berth_platform::provisioning::backend::kubernetes::manifests::{self};
use serde_json::{Value, json};

use crate::kubernetes_api::FakeCluster;
use crate::support::{
    ENV_ID, MIG_MAP, OTHER_ENV_ID, acme, all_steps, assert_nothing_left, backend, cases, gpu_unit, mig_unit, ns,
    workload,
};

#[tokio::test]
async fn each_offering_provisions_and_tears_down_leaving_nothing_behind() {
    for (case, w) in cases() {
        let (cluster, client) = FakeCluster::start();
        let k8s = backend(client);
        for step in provision_plan(w.offering, w.shape) {
            k8s.run(&w, step).await.unwrap();
        }
        assert!(!cluster.environment_objects().is_empty(), "{case}");
        if manifests::dedicates_nodes(&w) {
            for node in w.nodes() {
                let n = cluster.node(&node);
                assert_eq!(
                    n["metadata"]["labels"]["berth.dev/tenant"],
                    json!(manifests::Names::of(&w).tenant),
                    "{case}"
                );
                assert_eq!(n["spec"]["taints"][0]["key"], "berth.dev/tenant", "{case}");
            }
        }
        for step in teardown_plan(w.shape) {
            k8s.run(&w, step).await.unwrap();
        }
        assert_nothing_left(&cluster, case);
    }
}

#[tokio::test]
async fn a_second_pass_over_a_converged_environment_creates_and_deletes_nothing() {
    for (case, w) in cases() {
        let (cluster, client) = FakeCluster::start();
        let k8s = backend(client);
        let plan = provision_plan(w.offering, w.shape);
        for &step in &plan {
            k8s.run(&w, step).await.unwrap();
        }
        cluster.take_calls();
        let converged = cluster.snapshot();
        for &step in &plan {
            k8s.run(&w, step).await.unwrap();
        }
        let calls = cluster.take_calls();
        let writes: Vec<String> =
            calls.iter().filter(|c| c.method != "GET" && c.method != "PATCH").map(|c| c.line()).collect();
        assert_eq!(writes, Vec::<String>::new(), "{case}: only applies and reads");
        assert_eq!(cluster.snapshot(), converged, "{case}: a second pass changed the cluster");
    }
}

#[tokio::test]
async fn a_crash_after_any_step_converges_when_the_step_runs_again() {
    for (case, w) in cases() {
        let steps = all_steps(&w);
        // The cluster after a clean run up to each step.
        let mut clean = Vec::new();
        {
            let (cluster, client) = FakeCluster::start();
            let k8s = backend(client);
            for &step in &steps {
                k8s.run(&w, step).await.unwrap();
                clean.push(cluster.snapshot());
            }
        }
        for crash_after in 0..steps.len() {
            let (cluster, client) = FakeCluster::start();
            let k8s = backend(client);
            for &step in &steps[..=crash_after] {
                k8s.run(&w, step).await.unwrap();
            }
            // The journal never heard of the last step: the reconciler runs it again.
            k8s.run(&w, steps[crash_after])
                .await
                .unwrap_or_else(|e| panic!("{case}: repeating {}: {e}", steps[crash_after].as_str()));
            assert_eq!(cluster.snapshot(), clean[crash_after], "{case}: repeat of {}", steps[crash_after].as_str());
            for &step in &steps[crash_after + 1..] {
                k8s.run(&w, step).await.unwrap();
            }
            assert_nothing_left(&cluster, case);
        }
    }
}

// ---------------------------------------------------------------------------------------
// MIG layouts shared by environments on one node

#[tokio::test]
async fn a_mig_layout_keeps_the_neighbours_slices_and_is_cleared_only_by_the_last() {
    let mut mine = workload(Offering::Notebook, "h100-1g.10gb", acme(), vec![mig_unit("h100-1", 0, 0, "1g.10gb")]);
    mine.mig_neighbours = vec![mig_unit("h100-1", 0, 1, "1g.10gb"), mig_unit("h100-1", 1, 0, "3g.40gb")];
    let layout = manifests::node_mig_layout(&mine, "h100-1").unwrap();
    assert!(layout.entry.contains("devices: [0]") && layout.entry.contains("\"1g.10gb\": 2"), "{}", layout.entry);
    assert!(layout.entry.contains("devices: [1]") && layout.entry.contains("\"3g.40gb\": 1"), "{}", layout.entry);

    // The same slices booked the other way round give the same layout name.
    let mut theirs = mine.clone();
    theirs.environment_id = OTHER_ENV_ID.into();
    theirs.units = vec![mig_unit("h100-1", 0, 1, "1g.10gb")];
    theirs.mig_neighbours = vec![mig_unit("h100-1", 0, 0, "1g.10gb"), mig_unit("h100-1", 1, 0, "3g.40gb")];
    assert_eq!(manifests::node_mig_layout(&theirs, "h100-1").unwrap(), layout);

    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    k8s.run(&mine, Step::ConfigurePartition).await.unwrap();
    k8s.run(&theirs, Step::ConfigurePartition).await.unwrap();
    let calls = cluster.take_calls();
    let writes: Vec<&Value> =
        calls.iter().filter(|c| c.method == "POST" || c.method == "PUT").filter_map(|c| c.body.as_ref()).collect();
    assert_eq!(writes.len(), 2, "each writer records itself");
    assert_eq!(writes[0]["data"], writes[1]["data"], "one entry, written once, shared");
    assert_eq!(
        writes[1]["metadata"]["annotations"][format!("layouts.berth.dev/{}", layout.name)],
        format!("{ENV_ID},{OTHER_ENV_ID}")
    );
    // Written again by a writer on record already: nothing to write.
    k8s.run(&theirs, Step::ConfigurePartition).await.unwrap();
    assert!(cluster.take_calls().iter().all(|c| c.method != "POST" && c.method != "PUT"));
    assert_eq!(cluster.node("h100-1")["metadata"]["labels"]["nvidia.com/mig.config"], json!(layout.name));

    // Clearing mine while theirs runs leaves the layout alone...
    k8s.run(&mine, Step::ClearPartition).await.unwrap();
    assert_eq!(cluster.node("h100-1")["metadata"]["labels"]["nvidia.com/mig.config"], json!(layout.name));
    // ...and the last one out disables MIG.
    theirs.mig_neighbours.clear();
    k8s.run(&theirs, Step::ClearPartition).await.unwrap();
    assert_eq!(cluster.node("h100-1")["metadata"]["labels"]["nvidia.com/mig.config"], "all-disabled");

    // A second layout lands next to the first in the shared document.
    let mut other = workload(Offering::Notebook, "h100-3g.40gb", acme(), vec![mig_unit("h100-2", 0, 4, "3g.40gb")]);
    other.environment_id = OTHER_ENV_ID.into();
    k8s.run(&other, Step::ConfigurePartition).await.unwrap();
    let map = cluster.lock().objects[&format!("{MIG_MAP}/berth-mig-parted-config")].clone();
    let document = map["data"]["config.yaml"].as_str().unwrap();
    let second = manifests::node_mig_layout(&other, "h100-2").unwrap();
    assert!(document.contains(&layout.entry) && document.contains(&second.entry), "{document}");
    assert!(document.starts_with("version: v1\nmig-configs:\n  all-disabled:\n"), "{document}");
}

#[tokio::test]
async fn a_failed_mig_layout_fails_the_step_with_a_clear_message() {
    let w = workload(Offering::Notebook, "h100-1g.10gb", acme(), vec![mig_unit("h100-1", 0, 0, "1g.10gb")]);
    let (cluster, client) = FakeCluster::start();
    cluster.lock().mig_state = "failed".into();
    let k8s = backend(client);
    let error = k8s.run(&w, Step::ConfigurePartition).await.unwrap_err();
    assert!(error.0.starts_with("the GPU Operator could not apply MIG layout berth-"), "{error}");
    assert!(error.0.ends_with("on node h100-1"), "{error}");
}

/// An environment provisioned by an earlier Berth fed a ClusterQueue of its own; Kueue
/// will not change the queue a LocalQueue feeds, so a repeated step replaces it.
#[tokio::test]
async fn a_local_queue_of_an_earlier_berth_is_replaced_to_feed_the_tenants_queue() {
    let w = cases()[2].1.clone(); // acme's inference endpoint
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    k8s.run(&w, Step::StartWorkload).await.unwrap();
    let ns = ns(&w);
    let local = format!("/apis/kueue.x-k8s.io/v1beta1/namespaces/{ns}/localqueues/berth");
    cluster.lock().objects.get_mut(&local).unwrap()["spec"]["clusterQueue"] = json!(ns);
    cluster.take_calls();
    k8s.run(&w, Step::StartWorkload).await.unwrap();
    let lines = cluster.take_lines();
    let at = lines.iter().position(|l| *l == format!("PATCH {local}")).unwrap();
    assert_eq!(lines[at..at + 3], [format!("PATCH {local}"), format!("DELETE {local}"), format!("PATCH {local}")]);
    assert_eq!(cluster.lock().objects[&local]["spec"]["clusterQueue"], "berth-tenant-acme");
}

#[tokio::test]
async fn kubernetes_errors_reach_the_owner_as_operational_messages_only() {
    let w = workload(Offering::InferenceEndpoint, "l40s-1", acme(), vec![gpu_unit("l40s-1", 1)]);
    let (cluster, client) = FakeCluster::start();
    let ns = ns(&w);
    cluster.lock().failing.insert(format!("/api/v1/namespaces/{ns}/resourcequotas/berth"), 403);
    let error = backend(client).run(&w, Step::StartWorkload).await.unwrap_err();
    assert_eq!(
        error.0,
        "Berth is not allowed to apply ResourceQuota berth; the platform team has the details in Berth's log"
    );
    assert!(!error.0.contains("secret internal detail"));
}

#[tokio::test]
async fn steps_repeat_safely_after_objects_vanished() {
    // Teardown of an environment whose provisioning never ran: every delete finds nothing.
    for (case, w) in cases() {
        let (cluster, client) = FakeCluster::start();
        let k8s = backend(client);
        for step in teardown_plan(w.shape) {
            k8s.run(&w, step).await.unwrap_or_else(|e| panic!("{case} {}: {e}", step.as_str()));
        }
        assert_nothing_left(&cluster, case);
    }
}

#[test]
fn an_endpoints_model_arguments_and_variables_reach_its_container() {
    let mut w = workload(Offering::InferenceEndpoint, "l40s-1", acme(), vec![gpu_unit("l40s-1", 1)]);
    w.serving = berth_domain::serving::Serving::parse(
        Offering::InferenceEndpoint,
        "org/model-7b",
        "--model {model} --max-model-len 8192",
        "HF_TOKEN=hf_secret",
    )
    .unwrap();
    let deployment = manifests::workload_manifests(&w).remove(0).object;
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["args"], json!(["--model", "org/model-7b", "--max-model-len", "8192"]));
    assert!(container.get("command").is_none(), "the image's own entrypoint runs");
    let env = container["env"].as_array().unwrap();
    assert_eq!(env[0]["name"], "BERTH_API_KEY", "the key, from its Secret, first");
    assert_eq!(
        &env[1..],
        [
            json!({ "name": "HF_TOKEN", "value": "hf_secret" }),
            json!({ "name": "BERTH_MODEL", "value": "org/model-7b" })
        ]
    );
}
