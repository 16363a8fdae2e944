//! The API's description (`GET /api/v1/openapi.json`) against the router: every `/api/v1`
//! route the router serves is described, and nothing that it does not serve; the schemas of
//! what the domain reads (a launch, the audit filter) name what it reads.

use std::collections::BTreeSet;

use berth_domain::agent::{GpuReport, NodeReport};
use berth_domain::launch::LaunchRequest;
use berth_domain::node_plan::{PlanReport, WorkloadStatus};
use berth_platform::audit::AuditFilter;
use http::{Method, StatusCode};
use serde_json::{Value, json};

use super::Berth;

const METHODS: [&str; 6] = ["get", "post", "put", "patch", "delete", "head"];

/// `(METHOD, path)` of every operation the description has.
fn described(document: &Value) -> BTreeSet<(String, String)> {
    let paths = document["paths"].as_object().expect("paths");
    paths
        .iter()
        .flat_map(|(path, item)| {
            METHODS
                .iter()
                .filter(|method| item.get(**method).is_some())
                .map(move |method| (method.to_uppercase(), path.clone()))
        })
        .collect()
}

async fn document(berth: &Berth) -> Value {
    let reply = berth.api(Method::GET, "/api/v1/openapi.json", "", None).await;
    assert_eq!(reply.status, StatusCode::OK, "served without a token: {}", reply.body);
    assert_eq!(reply.header("content-type"), Some("application/json"));
    serde_json::from_str(&reply.body).expect("the description is JSON")
}

#[tokio::test]
async fn every_api_route_is_described_and_nothing_else() {
    let berth = Berth::start(None).await;
    let document = document(&berth).await;
    let served: BTreeSet<(String, String)> = berth
        .served
        .iter()
        .filter(|(_, path)| path == "/api/v1" || path.starts_with("/api/v1/"))
        .map(|(method, path)| (method.to_string(), path.clone()))
        .collect();
    assert!(served.len() > 20, "the API's routes are listed: {served:?}");
    let described = described(&document);
    let undescribed: Vec<_> = served.difference(&described).collect();
    let unserved: Vec<_> = described.difference(&served).collect();
    assert!(
        undescribed.is_empty(),
        "routes without a description (add #[utoipa::path] and list it in api::ApiDoc): {undescribed:?}"
    );
    assert!(unserved.is_empty(), "descriptions of routes the router does not serve: {unserved:?}");
}

#[tokio::test]
async fn every_operation_says_its_security_and_its_problems() {
    let berth = Berth::start(None).await;
    let document = document(&berth).await;
    assert_eq!(document["openapi"], "3.1.0");
    let schemes = &document["components"]["securitySchemes"];
    assert_eq!(schemes["bearer"]["scheme"], "bearer", "{schemes}");
    assert_eq!(schemes["node_token"]["scheme"], "bearer", "{schemes}");
    let problem = &document["components"]["schemas"]["Problem"];
    let required: BTreeSet<&str> =
        problem["required"].as_array().expect("required").iter().filter_map(Value::as_str).collect();
    assert_eq!(required, BTreeSet::from(["type", "title", "status", "detail", "request_id"]), "{problem}");

    for (method, path) in described(&document) {
        let operation = &document["paths"][&path][method.to_lowercase()];
        let security = operation["security"]
            .as_array()
            .map(|s| s.iter().flat_map(|r| r.as_object()).flat_map(|r| r.keys()).cloned().collect::<Vec<_>>());
        match path.as_str() {
            "/api/v1/openapi.json" => assert_eq!(security, None, "the description needs no token"),
            p if p.starts_with("/api/v1/agent/") => {
                assert_eq!(security, Some(vec!["node_token".to_owned()]), "{method} {path}")
            }
            _ => assert_eq!(security, Some(vec!["bearer".to_owned()]), "{method} {path}"),
        }
        let responses = operation["responses"].as_object().expect("responses");
        assert!(responses.keys().any(|s| s.starts_with('2')), "{method} {path} says what it answers");
        for status in ["429", "500"] {
            let content = &responses[status]["content"]["application/problem+json"]["schema"]["$ref"];
            assert_eq!(content, "#/components/schemas/Problem", "{method} {path} {status}");
        }
        if path != "/api/v1/openapi.json" {
            for status in ["400", "401", "403", "404", "422"] {
                assert!(responses.contains_key(status), "{method} {path} {status}");
            }
        }
        for (name, link) in responses.values().flat_map(|r| r["links"].as_object()).flatten() {
            let target = link["operationId"].as_str().expect("a link names an operation");
            let found = described(&document)
                .iter()
                .any(|(m, p)| document["paths"][p][m.to_lowercase()]["operationId"] == target);
            assert!(found, "{method} {path}: link {name} leads to {target}, which the description has");
        }
        if operation.get("requestBody").is_some() {
            assert!(responses.contains_key("415"), "{method} {path}: a body's media type is checked");
        }
    }
}

/// `schema` (a schema of the description written beside a domain type that builds without
/// utoipa) and `T` (the type that reads it) agree field for field: the same names, and a
/// field is required in the schema exactly when `T` cannot be read without it. `full` is a
/// `T` with every field, as JSON.
fn assert_schema_reads<T: serde::de::DeserializeOwned>(document: &Value, schema: &str, full: Value) {
    let described = &document["components"]["schemas"][schema];
    let properties: BTreeSet<String> =
        described["properties"].as_object().expect("properties").keys().cloned().collect();
    let read: BTreeSet<String> = full.as_object().expect("object").keys().cloned().collect();
    assert_eq!(properties, read, "{schema} names the fields its type reads");
    let required: BTreeSet<&str> =
        described["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    for field in &read {
        let mut without = full.clone();
        without.as_object_mut().expect("object").remove(field);
        let reads = serde_json::from_value::<T>(without).is_ok();
        assert_eq!(!reads, required.contains(field.as_str()), "{schema}.{field}: required exactly when needed");
    }
}

/// The launch's schema is written beside `LaunchRequest` (domain builds without utoipa);
/// the agents' bodies beside theirs.
#[tokio::test]
async fn the_schemas_of_domain_bodies_are_what_the_domain_reads() {
    let berth = Berth::start(None).await;
    let document = document(&berth).await;
    let launch = serde_json::to_value(LaunchRequest::default()).expect("a launch as JSON");
    assert_schema_reads::<LaunchRequest>(&document, "LaunchBody", launch);
    let with_ids = json!({ "offering": "notebook", "size": "s", "name": "n", "hours": "1", "volumes": [3, "4"] });
    assert!(serde_json::from_value::<LaunchRequest>(with_ids).is_ok(), "volumes as the schema allows them");

    let gpu = json!({ "index": 0, "uuid": "GPU-1", "name": "H100", "memory_mib": 81559, "mig_enabled": false, "mig_pending": false,
        "mig_instances": 0, "ecc_uncorrected": 0, "temperature_c": 40, "power_w": 300, "utilization_pct": 5 });
    assert_schema_reads::<GpuReport>(&document, "GpuReportBody", gpu.clone());
    assert_schema_reads::<NodeReport>(&document, "NodeReportBody", json!({ "agent_version": "1", "gpus": [gpu] }));
    let workload =
        json!({ "environment_id": "e", "state": "running", "exit_code": null, "error": null, "log_tail": [] });
    assert_schema_reads::<WorkloadStatus>(&document, "WorkloadStatusBody", workload.clone());
    let plan = json!({ "generation": 1, "error": null, "underlay_address": "10.0.0.1", "workloads": [workload] });
    assert_schema_reads::<PlanReport>(&document, "PlanReportBody", plan);
}

/// The audit route's query parameters are the names `AuditFilter` reads.
#[tokio::test]
async fn the_audit_parameters_are_what_the_filter_reads() {
    let berth = Berth::start(None).await;
    let document = document(&berth).await;
    let parameters = document["paths"]["/api/v1/audit"]["get"]["parameters"].as_array().expect("parameters").clone();
    assert_eq!(parameters.len(), 7, "{parameters:?}");
    for parameter in parameters {
        let name = parameter["name"].as_str().expect("name");
        // The page's, read by `api::paging`.
        if ["limit", "cursor"].contains(&name) {
            continue;
        }
        assert_eq!(parameter["in"], "query");
        let value = if name == "before" { json!(7) } else { json!("x") };
        let filter: AuditFilter = serde_json::from_value(json!({ name: value })).expect("a filter");
        assert_ne!(filter, AuditFilter::default(), "the filter reads {name}");
    }
}
