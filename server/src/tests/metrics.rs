//! What an operator's Prometheus scrapes from a running Berth: launches booked and refused
//! with their latency, the reconciler's steps with their failures; and the Grafana dashboard
//! shipped beside it (`server/dashboards/berth.json`), whose queries may name only what
//! Berth exports.

use std::collections::BTreeSet;

use berth_domain::launch::LaunchRequest;
use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use berth_platform::provisioning::backend::simulated::{Simulated, SimulatedConfig};
use http::{Method, StatusCode};
use serde_json::Value;

use super::{Berth, FLEET, meta};

const TOKEN: &str = "scrape-token";

/// Berth with the reconciler on an instant simulated fleet whose every `expose_endpoint`
/// fails, and `/metrics` behind [`TOKEN`].
async fn berth_failing_exposure() -> Berth {
    let faults = vec!["expose_endpoint=fail".parse().expect("fault")];
    let fleet = std::sync::Arc::new(Simulated::new(SimulatedConfig { speed: 0.0, faults, volumes_dir: None }));
    Berth::start_with(None, FLEET, Some(fleet), &["--metrics-token", TOKEN], &[]).await
}

async fn scrape(berth: &Berth) -> String {
    let reply = berth.api(Method::GET, "/metrics", "", Some(TOKEN)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.body
}

/// The value of the series written exactly as `series` (name and labels), if present.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn launches_and_reconciler_steps_are_counted_on_the_scrape() {
    let berth = berth_failing_exposure().await;
    let tenant = berth.platform.ensure_tenant("tenant-a", "Tenant A", Isolation::Soft).await.expect("tenant");
    let dana = berth.person("dana@example.com", Role::Member, Some(tenant)).await;
    let id = berth.launch(&dana, "dana-nb").await;
    let too_long = LaunchRequest {
        offering: "notebook".into(),
        size: "h100-1g.10gb".into(),
        name: "too-long".into(),
        hours: "100000".into(),
        ..LaunchRequest::default()
    };
    berth.platform.launch(&dana.caller(meta()), &too_long).await.expect_err("refused");

    // The notebook provisions until its endpoint fails to be exposed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while berth.platform.environment_of(&dana.caller(meta()), &id).await.expect("env").state.as_str() != "failed" {
        assert!(std::time::Instant::now() < deadline, "dana-nb never failed");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let text = scrape(&berth).await;
    let booked = value(&text, r#"berth_bookings_total{offering="notebook",outcome="booked"}"#);
    assert_eq!(booked, Some(1.0), "{text}");
    let refused = value(&text, r#"berth_bookings_total{offering="notebook",outcome="refused"}"#);
    assert_eq!(refused, Some(1.0), "{text}");
    assert_eq!(value(&text, r#"berth_booking_duration_seconds_count{offering="notebook"}"#), Some(2.0), "{text}");
    let started = value(&text, r#"berth_reconciler_step_duration_seconds_count{step="start_workload"}"#);
    assert_eq!(started, Some(1.0), "{text}");
    let failed = value(&text, r#"berth_reconciler_step_failures_total{step="expose_endpoint"}"#);
    assert!(failed.is_some_and(|n| n >= 1.0), "{text}");
    assert_eq!(value(&text, r#"berth_reconciler_step_failures_total{step="start_workload"}"#), None, "{text}");
    assert_eq!(value(&text, r#"berth_environments{state="failed"}"#), Some(1.0), "{text}");
}

/// The dashboard as shipped.
const DASHBOARD: &str = include_str!("../../dashboards/berth.json");

/// The series names a scrape can hold, from its `# TYPE` lines: a histogram's `_bucket`,
/// `_sum` and `_count`, any other family's own name (a counter's ends in `_total`).
fn exported_series(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else { continue };
        let mut words = rest.split_whitespace();
        let (Some(name), Some(kind)) = (words.next(), words.next()) else { continue };
        if kind == "histogram" {
            names.extend(["_bucket", "_sum", "_count"].map(|suffix| format!("{name}{suffix}")));
        } else {
            names.insert(name.to_owned());
        }
    }
    names
}

/// Grouping clauses: their parenthesised lists are labels, not metrics.
const GROUPING: [&str; 6] = ["by", "without", "on", "ignoring", "group_left", "group_right"];
/// Words of PromQL that are neither functions nor metrics.
const KEYWORDS: [&str; 5] = ["bool", "and", "or", "unless", "offset"];

/// The metric names a PromQL expression reads: its identifiers outside strings, label
/// matchers (`{…}`), ranges (`[…]`) and grouping lists, that are not functions (followed by
/// `(`), keywords or numbers.
fn metric_names(expr: &str) -> Vec<String> {
    // What is left outside strings, braces and brackets.
    let mut outside = String::new();
    let (mut depth, mut in_string, mut escaped) = (0_i32, false, false);
    for c in expr.chars() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            _ if depth == 0 => outside.push(c),
            _ => {}
        }
    }
    let chars: Vec<char> = outside.chars().collect();
    let mut names = Vec::new();
    let mut i = 0;
    let next_non_space = |from: usize| chars[from..].iter().position(|c| !c.is_whitespace()).map(|p| from + p);
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) {
            // A number, exponent included.
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.' || chars[i] == '+') {
                i += 1;
            }
            continue;
        }
        if !(c.is_ascii_alphabetic() || c == '_' || c == ':') {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':') {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        let opens = next_non_space(i).filter(|&j| chars[j] == '(');
        // An aggregation may put its grouping first: `sum by (le) (…)`.
        let groups_next = next_non_space(i).is_some_and(|j| {
            let following: String = chars[j..].iter().take_while(|c| c.is_ascii_alphanumeric() || **c == '_').collect();
            following == "by" || following == "without"
        });
        if GROUPING.contains(&word.as_str()) {
            if let Some(open) = opens {
                let close = chars[open..].iter().position(|&c| c == ')').map_or(chars.len(), |p| open + p + 1);
                i = close;
            }
        } else if word == "offset" {
            // Its duration follows.
            i = next_non_space(i).map_or(chars.len(), |j| {
                chars[j..].iter().position(|c| c.is_whitespace() || *c == ')').map_or(chars.len(), |p| j + p)
            });
        } else if opens.is_none() && !groups_next && !KEYWORDS.contains(&word.as_str()) {
            names.push(word);
        }
    }
    names
}

/// A variable's `label_values(<series selector>, <label>)`: the metrics of its selector.
fn variable_metrics(query: &str) -> Vec<String> {
    match query.trim().strip_prefix("label_values(").and_then(|rest| rest.rsplit_once(',')) {
        Some((selector, _label)) => metric_names(selector),
        None => metric_names(query),
    }
}

/// Every query string in the dashboard: panels' targets' `expr`, variables' queries.
fn dashboard_queries(node: &Value, into: &mut Vec<String>) {
    match node {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr", Value::String(expr)) => into.push(expr.clone()),
                    _ => dashboard_queries(value, into),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| dashboard_queries(item, into)),
        _ => {}
    }
}

#[test]
fn metric_names_are_told_from_functions_labels_ranges_and_numbers() {
    let expr = r#"histogram_quantile(0.95, sum by (le, step) (rate(berth_x_bucket{tenant=~"$t",a="b}(c)"}[$__rate_interval])))"#;
    assert_eq!(metric_names(expr), ["berth_x_bucket"]);
    assert_eq!(metric_names("sum(a) / count(b offset 5m) > bool 1e3 * on (x) group_left c"), ["a", "b", "c"]);
    assert_eq!(metric_names("count by (tenant) (berth_y{t=~\"$t\"}) / 100"), ["berth_y"]);
    assert_eq!(variable_metrics(r#"label_values(berth_z{tenant=~"$tenant"}, project)"#), ["berth_z"]);
}

#[tokio::test]
async fn the_dashboard_reads_only_metrics_berth_exports_and_shows_every_family() {
    let berth = Berth::start_with(None, FLEET, None, &["--metrics-token", TOKEN], &[]).await;
    let text = scrape(&berth).await;
    let exported = exported_series(&text);
    assert!(exported.contains("berth_gpu_utilization_percent"), "{text}");

    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    dashboard_queries(&dashboard["panels"], &mut exprs);
    let mut used: BTreeSet<String> = exprs.iter().flat_map(|e| metric_names(e)).collect();
    let variables = dashboard["templating"]["list"].as_array().expect("variables");
    for variable in variables.iter().filter(|v| v["type"] == "query") {
        let query = variable["query"]["query"].as_str().or(variable["query"].as_str()).expect("a variable's query");
        used.extend(variable_metrics(query));
    }
    assert!(exprs.len() >= 20, "{} queries found", exprs.len());
    let missing: Vec<&String> = used.difference(&exported).collect();
    assert!(missing.is_empty(), "the dashboard names metrics Berth does not export: {missing:?}");

    // And the other way: each family Berth exports is on some panel.
    let families: BTreeSet<&str> =
        text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split_whitespace().next()).collect();
    let unshown: Vec<&&str> =
        families.iter().filter(|family| !used.iter().any(|name| name.starts_with(**family))).collect();
    assert!(unshown.is_empty(), "families no panel shows: {unshown:?}");

    // Fleet, tenant and environment views, each filtered by its variable.
    let rows: Vec<&str> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .filter(|p| p["type"] == "row")
        .filter_map(|p| p["title"].as_str())
        .collect();
    assert_eq!(rows, ["Fleet", "Tenant", "Environment"]);
    assert!(exprs.iter().any(|e| e.contains("environment=~\"$environment\"")));
    assert!(exprs.iter().any(|e| e.contains("tenant=~\"$tenant\"")));
}
