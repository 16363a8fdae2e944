//! Volumes on Kubernetes, request by request: a soft tenant's claim stays in the tenant's
//! namespace from one environment to the next; a hard tenant's environments each have a
//! namespace of their own, so the volume's PersistentVolume is kept (`Retain`, labelled)
//! when the first one's namespace goes and bound to the next one's claim. In both, nothing
//! else of the environment remains.

use berth_domain::catalog::Offering;
use berth_domain::lifecycle::{Step, provision_plan, teardown_plan};
use berth_platform::capacity::volumes::VolumeMount;
use berth_platform::provisioning::backend::kubernetes::manifests::Names;
use berth_platform::provisioning::backend::{Backend, StoredVolume, Workload};
use serde_json::json;

use crate::kubernetes_api::FakeCluster;
use crate::support::{
    ENV_ID, OTHER_ENV_ID, acme, assert_nothing_left, backend, body_of, bundle_calls, mig_unit, ns, run, vault, with,
    workload,
};

fn home(volume_id: i64) -> VolumeMount {
    VolumeMount {
        volume_id,
        name: "home".into(),
        size_gib: 10,
        mount_path: "/home/jovyan/work".into(),
        project_id: None,
        owner_id: 3,
    }
}

fn datasets() -> VolumeMount {
    VolumeMount {
        volume_id: 8,
        name: "datasets".into(),
        size_gib: 50,
        mount_path: "/data/datasets".into(),
        project_id: Some(2),
        owner_id: 3,
    }
}

/// A MIG notebook of `tenant` with `volumes`, as environment `id`.
fn notebook(
    id: &str,
    tenant: berth_platform::provisioning::backend::TenantScope,
    volumes: Vec<VolumeMount>,
) -> Workload {
    let mut w = workload(Offering::Notebook, "h100-1g.10gb", tenant, vec![mig_unit("h100-1", 0, 0, "1g.10gb")]);
    w.environment_id = id.into();
    for u in &mut w.units {
        u.environment_id = id.into();
    }
    w.tenant_volumes = if w.tenant.isolation == berth_domain::tenancy::Isolation::Soft {
        volumes.iter().map(|v| v.size_gib).collect()
    } else {
        Vec::new()
    };
    w.volumes = volumes;
    w
}

fn claim_path(namespace: &str, volume_id: i64) -> String {
    format!("/api/v1/namespaces/{namespace}/persistentvolumeclaims/berth-vol-{volume_id}")
}

async fn teardown(k8s: &impl Backend, w: &Workload) {
    for step in teardown_plan(w.shape) {
        k8s.run(w, step).await.unwrap_or_else(|e| panic!("{}: {e}", step.as_str()));
    }
}

#[tokio::test]
async fn a_soft_tenants_volume_stays_in_its_namespace_and_is_mounted_by_the_next_environment() {
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    let first = notebook(ENV_ID, acme(), vec![home(7), datasets()]);
    let ns = ns(&first);
    assert_eq!(ns, "berth-acme");
    let mut started = Vec::new();
    for step in provision_plan(first.offering, first.shape) {
        let calls = run(&k8s, &cluster, &first, step).await;
        if step == Step::StartWorkload {
            started = calls;
        }
    }
    let names = Names::of(&first);
    let secret = format!("/api/v1/namespaces/{ns}/secrets/{}", names.credential);
    let lines: Vec<String> = started.iter().map(|c| c.line()).collect();
    assert_eq!(
        lines,
        with(
            bundle_calls(&ns, false),
            &[
                format!("GET {secret}"),
                format!("POST /api/v1/namespaces/{ns}/secrets"),
                format!("GET {secret}"),
                format!("PATCH {}", claim_path(&ns, 7)),
                format!("PATCH {}", claim_path(&ns, 8)),
                format!("PATCH /apis/apps/v1/namespaces/{ns}/statefulsets/{}", names.workload),
            ],
        )
    );
    // The claim: ReadWriteMany, its size, the tenant's and the volume's labels, no
    // environment's, owned by nothing.
    let claim = body_of(&started, &format!("PATCH {}", claim_path(&ns, 8)));
    assert_eq!(claim["spec"]["accessModes"], json!(["ReadWriteMany"]));
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "50Gi");
    assert_eq!(claim["metadata"]["labels"]["berth.dev/volume"], "8");
    assert_eq!(claim["metadata"]["labels"]["berth.dev/tenant"], "acme");
    assert!(claim.pointer("/metadata/labels/berth.dev~1environment").is_none());
    assert!(claim.pointer("/metadata/ownerReferences").is_none());
    // The namespace's quota counts the volumes on top of the booking.
    let quota = body_of(&started, &format!("PATCH /api/v1/namespaces/{ns}/resourcequotas/berth"));
    assert_eq!(quota["spec"]["hard"]["requests.storage"], "160Gi");
    // The notebook mounts them: home at the working directory, no claim of its own.
    let set = body_of(&started, &format!("PATCH /apis/apps/v1/namespaces/{ns}/statefulsets/{}", names.workload));
    assert!(set.pointer("/spec/volumeClaimTemplates").is_none());
    let pod = &set["spec"]["template"]["spec"];
    assert_eq!(
        pod["volumes"],
        json!([
            { "name": "vol-7", "persistentVolumeClaim": { "claimName": "berth-vol-7" } },
            { "name": "vol-8", "persistentVolumeClaim": { "claimName": "berth-vol-8" } },
        ])
    );
    assert_eq!(
        pod["containers"][0]["volumeMounts"],
        json!([
            { "name": "vol-7", "mountPath": "/home/jovyan/work" },
            { "name": "vol-8", "mountPath": "/data/datasets" },
        ])
    );
    assert_eq!(k8s.volume_location(&first, &first.volumes[1]), "claim berth-acme/berth-vol-8");

    // Torn down: nothing of the environment remains, the claims do.
    teardown(&k8s, &first).await;
    let deletes: Vec<String> =
        cluster.take_lines().into_iter().filter(|l| l.starts_with("DELETE") && l.contains("berth-vol-")).collect();
    assert_eq!(deletes, Vec::<String>::new(), "teardown deletes no volume claim");
    assert_nothing_left(&cluster, "soft tenant volume");
    assert!(cluster.lock().objects.contains_key(&claim_path(&ns, 7)));
    assert!(cluster.lock().objects.contains_key(&claim_path(&ns, 8)));

    // The next environment mounts the same claims.
    let second = notebook(OTHER_ENV_ID, acme(), vec![home(7), datasets()]);
    for step in provision_plan(second.offering, second.shape) {
        k8s.run(&second, step).await.unwrap();
    }
    let second_names = Names::of(&second);
    let set_path = format!("/apis/apps/v1/namespaces/{ns}/statefulsets/{}", second_names.workload);
    let set = cluster.lock().objects.get(&set_path).cloned().expect("the second notebook");
    assert_eq!(set["spec"]["template"]["spec"]["volumes"][1]["persistentVolumeClaim"]["claimName"], "berth-vol-8");
    teardown(&k8s, &second).await;
    assert_nothing_left(&cluster, "soft tenant volume, second environment");

    // Deleting the volume deletes its claim.
    cluster.take_calls();
    let stored = StoredVolume { volume_id: 8, location: "claim berth-acme/berth-vol-8".into() };
    assert!(k8s.remove_volume(&stored).await.unwrap());
    assert_eq!(
        cluster.take_lines(),
        vec![format!("DELETE {}", claim_path(&ns, 8)), "GET /api/v1/persistentvolumes".to_owned()]
    );
    assert!(!cluster.lock().objects.contains_key(&claim_path(&ns, 8)));
}

#[tokio::test]
async fn a_hard_tenants_volume_is_kept_and_bound_to_the_next_environments_namespace() {
    let (cluster, client) = FakeCluster::start();
    let k8s = backend(client);
    let first = notebook(ENV_ID, vault(), vec![home(9)]);
    let first_ns = ns(&first);
    assert!(first_ns.starts_with("berth-vault-"), "{first_ns}");
    let pv_path = "/api/v1/persistentvolumes/pvc-0001";
    for step in provision_plan(first.offering, first.shape) {
        let calls = run(&k8s, &cluster, &first, step).await;
        let lines: Vec<String> = calls.iter().map(|c| c.line()).collect();
        match step {
            Step::StartWorkload => {
                // No PersistentVolume kept yet: a new claim, provisioned by the class.
                let at = lines.iter().position(|l| l == "GET /api/v1/persistentvolumes").expect("looked for one");
                assert_eq!(lines[at + 1], format!("PATCH {}", claim_path(&first_ns, 9)));
                let claim = body_of(&calls, &format!("PATCH {}", claim_path(&first_ns, 9)));
                assert!(claim.pointer("/spec/volumeName").is_none());
                // The provisioner makes a PersistentVolume (reclaimed with Delete, as
                // classes do by default) and the controller binds it to the claim.
                let mut state = cluster.lock();
                state.objects.insert(
                    pv_path.into(),
                    json!({
                        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": { "name": "pvc-0001" },
                        "spec": { "persistentVolumeReclaimPolicy": "Delete",
                                  "claimRef": { "namespace": first_ns, "name": "berth-vol-9", "uid": "uid-1" } },
                    }),
                );
                state.objects.get_mut(&claim_path(&first_ns, 9)).unwrap()["spec"]["volumeName"] = json!("pvc-0001");
            }
            Step::WaitHealthy => {
                // Once bound, Berth keeps the PersistentVolume and labels it.
                assert_eq!(
                    lines[lines.len() - 2..],
                    [format!("GET {}", claim_path(&first_ns, 9)), format!("PATCH {pv_path}")]
                );
                let kept = body_of(&calls, &format!("PATCH {pv_path}"));
                assert_eq!(kept["spec"]["persistentVolumeReclaimPolicy"], "Retain");
                assert_eq!(kept["metadata"]["labels"]["berth.dev/volume"], "9");
                assert_eq!(kept["metadata"]["labels"]["berth.dev/tenant"], "vault");
            }
            _ => {}
        }
    }
    assert_eq!(k8s.volume_location(&first, &first.volumes[0]), "persistentvolume berth.dev/volume=9");

    // Its namespace goes with the claim in it; the kept PersistentVolume stays.
    teardown(&k8s, &first).await;
    cluster.take_calls();
    assert_nothing_left(&cluster, "hard tenant volume");
    assert!(!cluster.lock().objects.contains_key(&format!("/api/v1/namespaces/{first_ns}")));
    assert!(!cluster.lock().objects.contains_key(&claim_path(&first_ns, 9)));
    assert_eq!(cluster.lock().objects[pv_path]["spec"]["persistentVolumeReclaimPolicy"], "Retain");

    // The next environment, in a namespace of its own: its claim names the kept
    // PersistentVolume, which is pointed at that claim (by uid where the API gives one).
    let second = notebook(OTHER_ENV_ID, vault(), vec![home(9)]);
    let second_ns = ns(&second);
    assert_ne!(second_ns, first_ns);
    let mut started = Vec::new();
    for step in provision_plan(second.offering, second.shape) {
        let calls = run(&k8s, &cluster, &second, step).await;
        if step == Step::StartWorkload {
            started = calls;
        }
    }
    let lines: Vec<String> = started.iter().map(|c| c.line()).collect();
    let at = lines.iter().position(|l| l == "GET /api/v1/persistentvolumes").expect("looked for the kept one");
    assert_eq!(
        lines[at..at + 4],
        [
            "GET /api/v1/persistentvolumes".to_owned(),
            format!("PATCH {}", claim_path(&second_ns, 9)),
            format!("GET {}", claim_path(&second_ns, 9)),
            format!("PATCH {pv_path}"),
        ]
    );
    let claim = body_of(&started, &format!("PATCH {}", claim_path(&second_ns, 9)));
    assert_eq!(claim["spec"]["volumeName"], "pvc-0001");
    let rebound = body_of(&started, &format!("PATCH {pv_path}"));
    assert_eq!(rebound["spec"]["claimRef"]["namespace"], json!(second_ns));
    assert_eq!(rebound["spec"]["claimRef"]["name"], "berth-vol-9");
    assert_eq!(rebound["spec"]["persistentVolumeReclaimPolicy"], "Retain");
    let set = body_of(
        &started,
        &format!("PATCH /apis/apps/v1/namespaces/{second_ns}/statefulsets/{}", Names::of(&second).workload),
    );
    assert_eq!(set["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"], "berth-vol-9");
    teardown(&k8s, &second).await;
    assert_nothing_left(&cluster, "hard tenant volume, second environment");

    // Deleting the volume gives its PersistentVolume back to the provisioner.
    cluster.take_calls();
    let stored = StoredVolume { volume_id: 9, location: "persistentvolume berth.dev/volume=9".into() };
    assert!(k8s.remove_volume(&stored).await.unwrap());
    let calls = cluster.take_calls();
    let lines: Vec<String> = calls.iter().map(|c| c.line()).collect();
    assert_eq!(lines, ["GET /api/v1/persistentvolumes".to_owned(), format!("PATCH {pv_path}")]);
    assert_eq!(body_of(&calls, &format!("PATCH {pv_path}"))["spec"]["persistentVolumeReclaimPolicy"], "Delete");
}
