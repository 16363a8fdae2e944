//! Named scenarios: the exact requests of each step of each offering, and how owners reach each.

use berth_domain::catalog::Offering;
use berth_domain::lifecycle::{Step, provision_plan};
use berth_platform::provisioning::backend::kubernetes::manifests::{
    self, NodeStage, namespace_bundle, node_manifest, workload_manifests,
};
use berth_platform::provisioning::backend::{Backend, Workload};
use serde_json::{Value, json};

use crate::kubernetes_api;
use crate::kubernetes_api::FakeCluster;
use crate::support::{ENV_ID, MIG_MAP, all_steps, backend, body_of, bundle_calls, cases, ns, run, settings, with};

fn proxy_policy(w: &Workload) -> String {
    let names = manifests::Names::of(w);
    format!("/apis/networking.k8s.io/v1/namespaces/{}/networkpolicies/{}", names.namespace, names.proxy_policy)
}

/// A soft tenant's environment at the end: its objects in the tenant's namespace deleted
/// by name (gone already but for its credential, which is waited for), then the tenant's
/// quota applied without it.
fn release_in_tenant_namespace(w: &Workload, workload: &str) -> Vec<String> {
    let names = manifests::Names::of(w);
    let (ns, name) = (&names.namespace, &names.workload);
    let secret = format!("/api/v1/namespaces/{ns}/secrets/{}", names.credential);
    let claims = match w.offering {
        Offering::Notebook => vec![format!("DELETE /api/v1/namespaces/{ns}/persistentvolumeclaims/work-{name}-0")],
        _ => vec![],
    };
    [format!("DELETE {workload}")]
        .into_iter()
        .chain(claims)
        .chain([
            format!("DELETE /api/v1/namespaces/{ns}/services/{name}"),
            format!("DELETE {}", proxy_policy(w)),
            format!("DELETE {secret}"),
            format!("GET {secret}"),
            format!("PATCH /api/v1/namespaces/{ns}/resourcequotas/berth"),
        ])
        .collect()
}

/// What each step of a case sends to the API server, first time round.
fn scenario(case: &str, w: &Workload, step: Step) -> Vec<String> {
    let ns = ns(w);
    let names = manifests::Names::of(w);
    let (workload, credential) = (names.workload.as_str(), names.credential.as_str());
    let secret = |name: &str| format!("/api/v1/namespaces/{ns}/secrets/{name}");
    let release = vec![format!("DELETE /api/v1/namespaces/{ns}")];
    // At the end of an environment that may have written MIG layouts: the ConfigMap read,
    // and when a layout has no writer left, the nodes listed before it is dropped.
    let forget_layouts = format!("GET {MIG_MAP}/berth-mig-parted-config");
    // Where an earlier placement would have put it (see `manifests::other_home`): looked
    // at when stopping and releasing, nothing there.
    let elsewhere = manifests::other_home(w).map(|o| manifests::Names::of(&o));
    let (other_ns, other_workload) =
        elsewhere.as_ref().map(|n| (n.namespace.clone(), n.workload.clone())).unwrap_or_default();
    match (case, step) {
        (_, Step::PullImage) => vec![],
        ("notebook-mig-soft", Step::ConfigurePartition) => with(
            bundle_calls(&ns, false),
            &[
                format!("GET {MIG_MAP}/berth-mig-parted-config"),
                format!("POST {MIG_MAP}"),
                "PATCH /api/v1/nodes/h100-1".into(),
                "GET /api/v1/nodes/h100-1".into(),
            ],
        ),
        ("notebook-mig-soft", Step::StartWorkload) => with(
            bundle_calls(&ns, false),
            &[
                format!("GET {}", secret(credential)),
                format!("POST /api/v1/namespaces/{ns}/secrets"),
                format!("GET {}", secret(credential)),
                format!("PATCH /apis/apps/v1/namespaces/{ns}/statefulsets/{workload}"),
            ],
        ),
        ("notebook-mig-soft", Step::WaitHealthy) => {
            vec![format!("GET /apis/apps/v1/namespaces/{ns}/statefulsets/{workload}")]
        }
        ("notebook-mig-soft", Step::ExposeEndpoint) => {
            vec![
                format!("PATCH /api/v1/namespaces/{ns}/services/{workload}"),
                format!("PATCH {}", proxy_policy(w)),
                format!("GET {}", secret(credential)),
            ]
        }
        ("notebook-mig-soft", Step::RemoveEndpoint) => {
            vec![format!("DELETE /api/v1/namespaces/{ns}/services/{workload}"), format!("DELETE {}", proxy_policy(w))]
        }
        ("notebook-mig-soft", Step::StopWorkload) => vec![
            format!("DELETE /apis/apps/v1/namespaces/{ns}/statefulsets/{workload}"),
            format!("GET /apis/apps/v1/namespaces/{ns}/statefulsets/{workload}"),
            format!("DELETE /apis/apps/v1/namespaces/{other_ns}/statefulsets/{other_workload}"),
        ],
        ("notebook-mig-soft", Step::ClearPartition) => vec!["PATCH /api/v1/nodes/h100-1".into()],
        ("notebook-mig-soft", Step::ReleaseCapacity) => with(
            release_in_tenant_namespace(w, &format!("/apis/apps/v1/namespaces/{ns}/statefulsets/{workload}")),
            &[
                format!("DELETE /api/v1/namespaces/{other_ns}"),
                forget_layouts,
                "GET /api/v1/nodes".into(),
                format!("PUT {MIG_MAP}/berth-mig-parted-config"),
            ],
        ),

        ("training-gpus-hard", Step::StartWorkload) => with(
            bundle_calls(&ns, false),
            &["PATCH /api/v1/nodes/h100-2".into(), format!("PATCH /apis/batch/v1/namespaces/{ns}/jobs/training")],
        ),
        ("training-gpus-hard", Step::WaitHealthy) => vec![format!("GET /apis/batch/v1/namespaces/{ns}/jobs/training")],
        ("training-gpus-hard", Step::ExposeEndpoint | Step::RemoveEndpoint) => vec![],
        ("training-gpus-hard", Step::StopWorkload) => vec![
            format!("DELETE /apis/batch/v1/namespaces/{ns}/jobs/training"),
            format!("GET /apis/batch/v1/namespaces/{ns}/jobs/training"),
            format!("DELETE /apis/batch/v1/namespaces/{other_ns}/jobs/{other_workload}"),
        ],
        ("training-gpus-hard", Step::ReleaseCapacity) => with(
            release,
            &[
                format!("DELETE /apis/batch/v1/namespaces/{other_ns}/jobs/{other_workload}"),
                "PATCH /api/v1/nodes/h100-2".into(),
                forget_layouts,
            ],
        ),

        ("inference-gpu-soft", Step::StartWorkload) => with(
            bundle_calls(&ns, false),
            &[
                format!("GET {}", secret(credential)),
                format!("POST /api/v1/namespaces/{ns}/secrets"),
                format!("GET {}", secret(credential)),
                format!("PATCH /apis/apps/v1/namespaces/{ns}/deployments/{workload}"),
            ],
        ),
        ("inference-gpu-soft", Step::WaitHealthy) => {
            vec![format!("GET /apis/apps/v1/namespaces/{ns}/deployments/{workload}")]
        }
        ("inference-gpu-soft", Step::ExposeEndpoint) => {
            vec![
                format!("PATCH /api/v1/namespaces/{ns}/services/{workload}"),
                format!("PATCH {}", proxy_policy(w)),
                format!("GET {}", secret(credential)),
            ]
        }
        ("inference-gpu-soft", Step::RemoveEndpoint) => {
            vec![format!("DELETE /api/v1/namespaces/{ns}/services/{workload}"), format!("DELETE {}", proxy_policy(w))]
        }
        ("inference-gpu-soft", Step::StopWorkload) => vec![
            format!("DELETE /apis/apps/v1/namespaces/{ns}/deployments/{workload}"),
            format!("GET /apis/apps/v1/namespaces/{ns}/deployments/{workload}"),
            format!("DELETE /apis/apps/v1/namespaces/{other_ns}/deployments/{other_workload}"),
        ],
        ("inference-gpu-soft", Step::ReleaseCapacity) => with(
            release_in_tenant_namespace(w, &format!("/apis/apps/v1/namespaces/{ns}/deployments/{workload}")),
            &[format!("DELETE /api/v1/namespaces/{other_ns}")],
        ),

        ("dedicated-cluster", Step::StartWorkload) => with(
            bundle_calls(&ns, false),
            &[
                "PATCH /api/v1/nodes/h100-1".into(),
                "PATCH /api/v1/nodes/h100-2".into(),
                format!("PATCH /api/v1/namespaces/{ns}/serviceaccounts/tenant"),
                format!("PATCH {}", secret("tenant-token")),
                format!("PATCH /apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings/berth-cluster-user"),
            ],
        ),
        // The reconciler runs it through the node checks: the backend asks nothing.
        ("dedicated-cluster", Step::AcceptanceChecks) => vec![],
        ("dedicated-cluster", Step::WaitHealthy) => {
            vec!["GET /api/v1/nodes/h100-1".into(), "GET /api/v1/nodes/h100-2".into()]
        }
        ("dedicated-cluster", Step::ExposeEndpoint) => vec![format!("GET {}", secret("tenant-token"))],
        ("dedicated-cluster", Step::RemoveEndpoint) => vec![],
        ("dedicated-cluster", Step::StopWorkload) => vec![
            format!("DELETE /api/v1/namespaces/{ns}/serviceaccounts/tenant"),
            format!("GET /api/v1/namespaces/{ns}/serviceaccounts/tenant"),
            format!("DELETE {}", secret("tenant-token")),
            format!("GET {}", secret("tenant-token")),
            format!("DELETE /apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings/berth-cluster-user"),
            format!("GET /apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings/berth-cluster-user"),
        ],
        ("dedicated-cluster", Step::ReleaseCapacity) => {
            with(release, &["PATCH /api/v1/nodes/h100-1".into(), "PATCH /api/v1/nodes/h100-2".into(), forget_layouts])
        }

        ("training-gpu-staff", Step::StartWorkload) => {
            with(bundle_calls(&ns, true), &[format!("PATCH /apis/batch/v1/namespaces/{ns}/jobs/training")])
        }
        ("training-gpu-staff", Step::WaitHealthy) => vec![format!("GET /apis/batch/v1/namespaces/{ns}/jobs/training")],
        ("training-gpu-staff", Step::ExposeEndpoint | Step::RemoveEndpoint) => vec![],
        ("training-gpu-staff", Step::StopWorkload) => vec![
            format!("DELETE /apis/batch/v1/namespaces/{ns}/jobs/training"),
            format!("GET /apis/batch/v1/namespaces/{ns}/jobs/training"),
        ],
        ("training-gpu-staff", Step::ReleaseCapacity) => {
            with(release, &[format!("DELETE /apis/kueue.x-k8s.io/v1beta1/clusterqueues/{ns}")])
        }
        (case, step) => panic!("no scenario for {case} {}", step.as_str()),
    }
}

#[tokio::test]
async fn every_step_of_every_offering_makes_exactly_the_expected_requests() {
    for (case, w) in cases() {
        let (cluster, client) = FakeCluster::start();
        let k8s = backend(client);
        for step in all_steps(&w) {
            let calls = run(&k8s, &cluster, &w, step).await;
            let lines: Vec<String> = calls.iter().map(kubernetes_api::Call::line).collect();
            assert_eq!(lines, scenario(case, &w, step), "scenario {case}/{}", step.as_str());

            // The applied bodies of the important requests are the manifests, exactly.
            let ns = ns(&w);
            match step {
                Step::StartWorkload => {
                    for m in workload_manifests(&w) {
                        let path = match m.kind.group {
                            "" => format!("/api/v1/namespaces/{ns}/{}/{}", m.kind.plural, m.name()),
                            g => format!("/apis/{g}/{}/namespaces/{ns}/{}/{}", m.kind.version, m.kind.plural, m.name()),
                        };
                        assert_eq!(
                            body_of(&calls, &format!("PATCH {path}")),
                            &m.object,
                            "{case}: applied {}",
                            m.name()
                        );
                    }
                    assert_eq!(
                        body_of(&calls, &format!("PATCH /api/v1/namespaces/{ns}")),
                        &namespace_bundle(&w, &settings())[0].object,
                        "{case}"
                    );
                }
                Step::ConfigurePartition => {
                    let node = node_manifest(&w, "h100-1", NodeStage::Held).unwrap().unwrap();
                    assert_eq!(body_of(&calls, "PATCH /api/v1/nodes/h100-1"), &node.object, "{case}");
                    let layout = manifests::node_mig_layout(&w, "h100-1").unwrap();
                    assert_eq!(node.object["metadata"]["labels"]["nvidia.com/mig.config"], json!(layout.name));
                    let map = body_of(&calls, &format!("POST {MIG_MAP}"));
                    assert_eq!(map["data"][&layout.name], json!(layout.entry), "{case}");
                    let document = map["data"]["config.yaml"].as_str().unwrap();
                    assert!(document.contains(&layout.entry) && document.contains("all-disabled"), "{document}");
                    // Its writer is named before any node is set to it.
                    let writers = format!("layouts.berth.dev/{}", layout.name);
                    assert_eq!(map["metadata"]["annotations"][&writers], ENV_ID, "{case}");
                }
                Step::ReleaseCapacity if case == "notebook-mig-soft" => {
                    let map = body_of(&calls, &format!("PUT {MIG_MAP}/berth-mig-parted-config"));
                    assert_eq!(map["data"].as_object().unwrap().keys().collect::<Vec<_>>(), ["config.yaml"], "{case}");
                    assert!(map["metadata"].get("annotations").is_none_or(Value::is_null), "{case}: {map}");
                    let list = calls.iter().find(|c| c.line() == "GET /api/v1/nodes").unwrap();
                    assert!(list.query.contains("nvidia.com"), "{case}: nodes with a MIG config: {}", list.query);
                }
                _ => {}
            }
        }
    }
}

#[tokio::test]
async fn connections_tell_the_owner_how_to_reach_each_offering() {
    for (case, w) in cases() {
        let (cluster, client) = FakeCluster::start();
        let k8s = backend(client);
        let mut connection = None;
        for step in provision_plan(w.offering, w.shape) {
            connection = k8s.run(&w, step).await.unwrap().connection.or(connection);
        }
        let c = connection.unwrap_or_else(|| panic!("{case}: a connection once exposed"));
        let ns = ns(&w);
        match w.offering {
            Offering::Notebook | Offering::InferenceEndpoint => {
                let secret = c.secret.expect("token or API key");
                assert_eq!(secret.len(), 32, "{case}");
                // The token is the one the workload reads from its Secret.
                let name = manifests::Names::of(&w).credential;
                let stored = cluster.lock().objects[&format!("/api/v1/namespaces/{ns}/secrets/{name}")].clone();
                assert_eq!(
                    stored["data"]["value"],
                    json!(base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &secret))
                );
                assert!(c.example.contains(&format!("kubectl port-forward -n {ns}")), "{case}: {}", c.example);
            }
            Offering::TrainingJob => assert!(c.example.contains(&format!("kubectl logs -n {ns}")), "{}", c.example),
            Offering::DedicatedCluster => {
                let kubeconfig = c.secret.expect("kubeconfig");
                assert!(kubeconfig.contains("server: https://k8s.test:6443"), "{kubeconfig}");
                assert!(kubeconfig.contains("token: sa-token"), "{kubeconfig}");
                assert!(kubeconfig.contains(&format!("namespace: {ns}")), "{kubeconfig}");
                assert_eq!(c.secret_label.as_deref(), Some("Kubeconfig"));
            }
        }
    }
}
