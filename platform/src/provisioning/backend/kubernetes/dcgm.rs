//! GPU readings on Kubernetes from the NVIDIA DCGM exporter (the GPU Operator's
//! `nvidia-dcgm-exporter` DaemonSet): each ready exporter pod's page is scraped and read by
//! `berth_domain::dcgm` into one [`GpuReading`] per GPU or MIG instance. The node is the
//! exporter pod's node as the API says (its `Hostname` label where not known: the exporter
//! writes the node's name there only when told it). The environment is the one whose pod the
//! exporter names (`namespace`, `pod`), found by the `berth.dev/environment` label Berth's
//! manifests give every pod; a pod that is not Berth's gives none.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use berth_domain::dcgm::{GpuSeries, PageContext, PodRef, parse_page, readings};
use berth_domain::telemetry::GpuReading;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use super::BackendError;
use super::api_failure;
use super::manifests::ENVIRONMENT_LABEL;

/// How long one exporter may take to answer a scrape.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);
/// Exporters scraped at once.
const SCRAPES_AT_ONCE: usize = 32;
/// What a first scrape's readings stand for, before there is a previous one to count from.
pub const FIRST_PERIOD_S: f64 = 30.0;

/// Which Service fronts the exporter pods, and their port: `--kube-dcgm-exporter`
/// (`gpu-operator/nvidia-dcgm-exporter:9400` by default, `off` for none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DcgmExporter {
    pub namespace: String,
    pub service: String,
    pub port: u16,
}

impl Default for DcgmExporter {
    fn default() -> DcgmExporter {
        DcgmExporter { namespace: "gpu-operator".into(), service: "nvidia-dcgm-exporter".into(), port: 9400 }
    }
}

impl FromStr for DcgmExporter {
    type Err = String;

    /// `NAMESPACE/SERVICE` or `NAMESPACE/SERVICE:PORT`.
    fn from_str(s: &str) -> Result<DcgmExporter, String> {
        let shape = || {
            format!(
                "\"{s}\" should be NAMESPACE/SERVICE or NAMESPACE/SERVICE:PORT, e.g. gpu-operator/nvidia-dcgm-exporter:9400"
            )
        };
        let (namespace, rest) = s.trim().split_once('/').ok_or_else(shape)?;
        let (service, port) = match rest.split_once(':') {
            Some((service, port)) => (service, port.parse::<u16>().map_err(|_| shape())?),
            None => (rest, DcgmExporter::default().port),
        };
        let dns_label = |n: &str| {
            !n.is_empty()
                && n.len() <= 63
                && n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !n.starts_with('-')
                && !n.ends_with('-')
        };
        if !dns_label(namespace) || !dns_label(service) || port == 0 {
            return Err(shape());
        }
        Ok(DcgmExporter { namespace: namespace.to_owned(), service: service.to_owned(), port })
    }
}

/// One exporter pod to scrape.
#[derive(Debug, Clone)]
struct Target {
    url: String,
    node: Option<String>,
}

/// Every ready exporter pod's readings now. Listing the exporters fails the whole call; an
/// exporter that does not answer within [`SCRAPE_TIMEOUT`] or answers nonsense is logged and
/// left out, so one sick node does not hide the others.
pub(super) async fn collect(
    client: &Client,
    exporter: &DcgmExporter,
    at_ms: i64,
    period_s: f64,
) -> Result<Vec<GpuReading>, BackendError> {
    let targets = exporter_targets(client, exporter).await?;
    let http = reqwest::Client::builder()
        .timeout(SCRAPE_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| BackendError(format!("cannot set up the DCGM exporter client: {e}")))?;
    let limit = Arc::new(tokio::sync::Semaphore::new(SCRAPES_AT_ONCE));
    let mut scrapes = tokio::task::JoinSet::new();
    for target in targets {
        let (http, limit) = (http.clone(), limit.clone());
        scrapes.spawn(async move {
            let _turn = limit.acquire_owned().await;
            let page = scrape(&http, &target.url).await;
            (target, page)
        });
    }
    let mut pages = Vec::new();
    while let Some(done) = scrapes.join_next().await {
        match done {
            Ok((target, Ok(page))) => pages.push((target, parse_page(&page))),
            Ok((target, Err(why))) => tracing::warn!(exporter = %target.url, "DCGM exporter not read: {why}"),
            Err(e) => tracing::warn!(error = %e, "a DCGM exporter scrape did not finish"),
        }
    }
    let owners = pod_environments(client, pages.iter().flat_map(|(_, series)| series.iter())).await?;
    Ok(pages
        .iter()
        .flat_map(|(target, series)| {
            let context = PageContext { node: target.node.clone(), at_ms, period_s };
            readings(series, &context, |pod| owners.get(pod).cloned())
        })
        .collect())
}

async fn scrape(http: &reqwest::Client, url: &str) -> Result<String, String> {
    let answer = http.get(url).send().await.map_err(|e| e.to_string())?;
    if !answer.status().is_success() {
        return Err(format!("answered {}", answer.status()));
    }
    answer.text().await.map_err(|e| e.to_string())
}

/// The ready endpoints of the exporter's Service, from its EndpointSlices.
async fn exporter_targets(client: &Client, exporter: &DcgmExporter) -> Result<Vec<Target>, BackendError> {
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &exporter.namespace);
    let selector = format!("kubernetes.io/service-name={}", exporter.service);
    let doing = format!("list the DCGM exporter's endpoints ({}/{})", exporter.namespace, exporter.service);
    let listed = slices.list(&ListParams::default().labels(&selector)).await.map_err(|e| api_failure(&doing, e))?;
    let mut targets = Vec::new();
    for slice in listed.items {
        for endpoint in slice.endpoints {
            // An endpoint without conditions is ready, as the API defines it.
            if endpoint.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                continue;
            }
            if let Some(address) = endpoint.addresses.first() {
                let host = if address.contains(':') { format!("[{address}]") } else { address.clone() };
                targets.push(Target {
                    url: format!("http://{host}:{}/metrics", exporter.port),
                    node: endpoint.node_name.clone(),
                });
            }
        }
    }
    Ok(targets)
}

/// The environment of each Berth pod the pages name, by its `berth.dev/environment` label:
/// one list per namespace, and only Berth's namespaces (`berth-…`).
async fn pod_environments<'a>(
    client: &Client,
    series: impl Iterator<Item = &'a GpuSeries>,
) -> Result<HashMap<PodRef, String>, BackendError> {
    let mut namespaces: Vec<&str> = series
        .filter_map(|s| s.pod.as_ref())
        .map(|p| p.namespace.as_str())
        .filter(|ns| ns.starts_with("berth-"))
        .collect();
    namespaces.sort_unstable();
    namespaces.dedup();
    let mut owners = HashMap::new();
    for namespace in namespaces {
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let listed = pods
            .list(&ListParams::default().labels(ENVIRONMENT_LABEL))
            .await
            .map_err(|e| api_failure(&format!("list the pods of {namespace}"), e))?;
        for pod in listed.items {
            if let Some(environment) = pod.labels().get(ENVIRONMENT_LABEL) {
                owners.insert(PodRef { namespace: namespace.to_owned(), pod: pod.name_any() }, environment.clone());
            }
        }
    }
    Ok(owners)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exporter_flag_names_a_service_and_its_port() {
        assert_eq!("gpu-operator/nvidia-dcgm-exporter".parse(), Ok(DcgmExporter::default()));
        let custom: DcgmExporter = "monitoring/dcgm:9500".parse().expect("parsed");
        assert_eq!((custom.namespace.as_str(), custom.service.as_str(), custom.port), ("monitoring", "dcgm", 9500));
        for wrong in ["dcgm", "ns/", "/svc", "ns/svc:0", "ns/svc:http", "NS/svc", "ns/svc/x"] {
            let refused = wrong.parse::<DcgmExporter>().expect_err(wrong);
            assert!(refused.contains("NAMESPACE/SERVICE"), "{wrong}: {refused}");
        }
    }
}
