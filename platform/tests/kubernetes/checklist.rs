//! The security checklist's "Tenant namespaces on Kubernetes", item by item.

use std::collections::BTreeMap;

use berth_platform::provisioning::backend::kubernetes::manifests::{
    self, endpoint_manifest, namespace_bundle, workload_manifests,
};
use serde_json::{Value, json};

use crate::support::{ENV_ID, cases, ns, of_kind, settings, strings};

#[test]
fn every_tenant_namespace_meets_the_security_checklist() {
    for (name, w) in cases() {
        let mut all = namespace_bundle(&w, &settings());
        all.extend(workload_manifests(&w));
        all.extend(endpoint_manifest(&w));

        // 1. Pod Security `restricted`, and pods that pass it.
        let namespace = of_kind(&all, "Namespace");
        assert_eq!(namespace.len(), 1, "{name}");
        for mode in ["enforce", "audit", "warn"] {
            assert_eq!(
                namespace[0]["metadata"]["labels"][format!("pod-security.kubernetes.io/{mode}")],
                "restricted",
                "{name}: {mode}"
            );
        }
        for m in all.iter().filter(|m| ["StatefulSet", "Deployment", "Job"].contains(&m.kind.kind)) {
            let pod = &m.object["spec"]["template"]["spec"];
            assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{name}");
            assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault", "{name}");
            for key in ["hostNetwork", "hostPID", "hostIPC"] {
                assert!(pod.get(key).is_none_or(|v| v == false), "{name}: {key}");
            }
            assert!(
                pod["volumes"].as_array().is_none_or(|v| v.iter().all(|v| v.get("hostPath").is_none())),
                "{name}: hostPath"
            );
            for c in pod["containers"].as_array().unwrap() {
                let sc = &c["securityContext"];
                assert_eq!(sc["allowPrivilegeEscalation"], false, "{name}");
                assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"], "{name}");
                assert!(sc.get("privileged").is_none_or(|v| v == false), "{name}");
                assert!(
                    c["ports"].as_array().is_none_or(|p| p.iter().all(|p| p.get("hostPort").is_none())),
                    "{name}: hostPort"
                );
            }
        }

        // 2. ResourceQuota: CPU, memory, storage, object counts, no NodePorts or
        // LoadBalancers, and the booked GPU resources.
        let quota = of_kind(&all, "ResourceQuota");
        assert_eq!(quota.len(), 1, "{name}");
        let hard = &quota[0]["spec"]["hard"];
        for key in [
            "requests.cpu",
            "limits.cpu",
            "requests.memory",
            "limits.memory",
            "requests.storage",
            "pods",
            "services",
            "persistentvolumeclaims",
        ] {
            assert!(hard.get(key).is_some(), "{name}: quota lacks {key}");
        }
        assert_eq!(hard["services.nodeports"], "0", "{name}");
        assert_eq!(hard["services.loadbalancers"], "0", "{name}");
        assert_eq!(hard["requests.cpu"], w.vcpus.to_string(), "{name}");
        let gpu_keys: BTreeMap<String, String> = hard
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| k.starts_with("requests.nvidia.com/"))
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
            .collect();
        let mut booked: BTreeMap<String, String> =
            manifests::gpu_resources(&w).into_iter().map(|(k, v)| (format!("requests.{k}"), v.to_string())).collect();
        assert!(!booked.is_empty(), "{name}");
        let shared = manifests::shares_tenant_namespace(&w);
        if shared {
            // A tenant's namespace names whole and time-sliced GPUs even when nobody
            // there holds one: zero of them, not any number.
            for key in ["requests.nvidia.com/gpu", "requests.nvidia.com/gpu.shared"] {
                booked.entry(key.to_owned()).or_insert_with(|| "0".to_owned());
            }
        }
        assert_eq!(gpu_keys, booked, "{name}: GPU quota equals the booking");

        // 3. LimitRange with defaults; default-deny NetworkPolicy allowing the namespace and DNS.
        let limits = of_kind(&all, "LimitRange");
        assert_eq!(limits.len(), 1, "{name}");
        let container =
            limits[0]["spec"]["limits"].as_array().unwrap().iter().find(|l| l["type"] == "Container").unwrap();
        assert!(container.get("default").is_some() && container.get("defaultRequest").is_some(), "{name}");
        let policies = of_kind(&all, "NetworkPolicy");
        assert_eq!(policies.len(), 1, "{name}");
        let spec = &policies[0]["spec"];
        assert_eq!(spec["podSelector"], json!({}), "{name}: applies to every pod");
        assert_eq!(strings(&spec["policyTypes"]), ["Ingress", "Egress"], "{name}");
        assert_eq!(
            spec["ingress"],
            json!([{ "from": [{ "podSelector": {} }] }]),
            "{name}: only the namespace may connect"
        );
        for rule in spec["egress"].as_array().unwrap() {
            let same_namespace = rule["to"] == json!([{ "podSelector": {} }]) && rule.get("ports").is_none();
            let dns = rule["to"][0]["podSelector"]["matchLabels"]["k8s-app"] == "kube-dns"
                && rule["ports"].as_array().unwrap().iter().all(|p| p["port"] == 53);
            assert!(same_namespace || dns, "{name}: egress beyond the namespace and DNS: {rule}");
        }
        // The one way in besides the namespace: Berth's proxy, to the workload's http port.
        if let Some(proxy) = manifests::proxy_access_manifest(&w, &settings()) {
            let spec = &proxy.object["spec"];
            assert_eq!(strings(&spec["policyTypes"]), ["Ingress"], "{name}: the proxy policy adds no egress");
            let component = manifests::Names::of(&w).component;
            assert_eq!(
                spec["podSelector"]["matchLabels"],
                json!({ "berth.dev/environment": ENV_ID, "app.kubernetes.io/component": component }),
                "{name}: only the workload's pods"
            );
            assert_eq!(
                spec["ingress"],
                json!([{
                    "from": [{ "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": "berth" } } }],
                    "ports": [{ "protocol": "TCP", "port": "http" }],
                }]),
                "{name}: only Berth's namespace, only the http port"
            );
        }

        // 4. RoleBindings: no escalate, bind, impersonate; no writes to quotas, limits or
        // network policies; nothing cluster-scoped.
        assert!(of_kind(&all, "ClusterRole").is_empty() && of_kind(&all, "ClusterRoleBinding").is_empty(), "{name}");
        let roles: BTreeMap<&str, &Value> =
            of_kind(&all, "Role").into_iter().map(|r| (r["metadata"]["name"].as_str().unwrap(), r)).collect();
        for binding in of_kind(&all, "RoleBinding") {
            assert_eq!(binding["roleRef"]["kind"], "Role", "{name}: bindings grant namespaced Roles only");
            let role = roles.get(binding["roleRef"]["name"].as_str().unwrap()).expect("bound role in the bundle");
            for rule in role["rules"].as_array().unwrap() {
                let verbs = strings(&rule["verbs"]);
                let resources = strings(&rule["resources"]);
                assert!(!verbs.iter().any(|v| ["escalate", "bind", "impersonate", "*"].contains(v)), "{name}: {rule}");
                assert!(!resources.contains(&"*") && !strings(&rule["apiGroups"]).contains(&"*"), "{name}: {rule}");
                if resources.iter().any(|r| ["resourcequotas", "limitranges", "networkpolicies"].contains(r)) {
                    assert!(verbs.iter().all(|v| ["get", "list", "watch"].contains(v)), "{name}: {rule}");
                }
                assert!(rule.get("nonResourceURLs").is_none(), "{name}");
            }
        }
        // Berth roles map to Berth's Roles.
        let bound: BTreeMap<&str, &str> = of_kind(&all, "RoleBinding")
            .into_iter()
            .map(|b| (b["metadata"]["name"].as_str().unwrap(), b["roleRef"]["name"].as_str().unwrap()))
            .collect();
        assert_eq!(bound.get("berth-tenant-admins"), Some(&"berth-admin"), "{name}");
        assert_eq!(bound.get("berth-members"), Some(&"berth-edit"), "{name}");
        assert_eq!(bound.get("berth-viewers"), Some(&"berth-view"), "{name}");
        // Queues are cluster-scoped: no Role reaches them, nor the namespace's own labels
        // (which pick the tenant's ClusterQueue).
        for role in roles.values() {
            for rule in role["rules"].as_array().unwrap() {
                let resources = strings(&rule["resources"]);
                assert!(
                    !resources
                        .iter()
                        .any(|r| ["clusterqueues", "namespaces", "resourceflavors", "cohorts"].contains(r)),
                    "{name}: {rule}"
                );
            }
        }
        // Kueue: the LocalQueue feeds the tenant's ClusterQueue, which admits the namespace
        // by the labels Berth gives it; staff's environment has a queue of its own.
        let local = of_kind(&all, "LocalQueue");
        assert_eq!(local.len(), 1, "{name}");
        let own = of_kind(&all, "ClusterQueue");
        match &w.tenant.slug {
            Some(slug) => {
                assert_eq!(local[0]["spec"]["clusterQueue"], format!("berth-tenant-{slug}"), "{name}");
                assert!(own.is_empty(), "{name}: no queue of its own");
                let ns_labels = &namespace[0]["metadata"]["labels"];
                assert_eq!(ns_labels["berth.dev/tenant"], json!(slug), "{name}");
                assert_eq!(ns_labels["app.kubernetes.io/managed-by"], "berth", "{name}");
            }
            None => {
                assert_eq!(own.len(), 1, "{name}");
                assert_eq!(local[0]["spec"]["clusterQueue"], own[0]["metadata"]["name"], "{name}");
                assert_eq!(
                    own[0]["spec"]["namespaceSelector"],
                    json!({ "matchLabels": { "kubernetes.io/metadata.name": ns(&w) } }),
                    "{name}: its own namespace only"
                );
                for r in own[0]["spec"]["resourceGroups"][0]["flavors"][0]["resources"].as_array().unwrap() {
                    assert_eq!(r["borrowingLimit"], "0", "{name}: never beyond its booking: {r}");
                }
            }
        }

        // Owner labels on everything: the environment's on what is its own, the tenant's
        // alone on what a tenant's namespace holds for all its environments.
        let bundle = namespace_bundle(&w, &settings()).len();
        for (i, m) in all.iter().enumerate() {
            let labels = &m.object["metadata"]["labels"];
            assert_eq!(labels["app.kubernetes.io/managed-by"], "berth", "{name}: {}", m.name());
            let environment = if shared && i < bundle { Value::Null } else { json!(ENV_ID) };
            assert_eq!(labels["berth.dev/environment"], environment, "{name}: {}", m.name());
            assert!(labels["berth.dev/tenant"].is_string(), "{name}: {}", m.name());
        }
    }
}
