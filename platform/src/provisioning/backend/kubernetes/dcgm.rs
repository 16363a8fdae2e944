//! GPU readings on Kubernetes from the NVIDIA DCGM exporter (the GPU Operator's
//! `nvidia-dcgm-exporter` DaemonSet): each exporter pod's page in the Prometheus text format,
//! read with `prometheus-parse`, becomes one [`GpuReading`] per GPU or MIG instance.
//!
//! Why `prometheus-parse`: prometheus-client (which writes Berth's own `/metrics`) has no
//! parser, and prometheus-parse reads the exporter's whole page (gauges and counters with
//! their labels, Go's float syntax) in one call. Its label parsing splits on `,` and `=`, so a
//! label value holding either would be cut; none of the labels read here (`gpu`, `Hostname`,
//! `GPU_I_ID`, `GPU_I_PROFILE`, `namespace`, `pod`) can hold them.
//!
//! What is read: utilization from `DCGM_FI_DEV_GPU_UTIL` for a whole GPU and from
//! `DCGM_FI_PROF_GR_ENGINE_ACTIVE` (a 0 to 1 ratio, as percent) for a MIG instance (labels
//! `GPU_I_ID`, `GPU_I_PROFILE`), which DCGM does not measure otherwise; memory from
//! `DCGM_FI_DEV_FB_USED` and `_FB_FREE` (MiB); power from `DCGM_FI_DEV_POWER_USAGE` (whole
//! GPUs only: the exporter repeats the GPU's power on each of its instances, and counting it
//! per instance would count it several times); temperature from `DCGM_FI_DEV_GPU_TEMP`. The
//! node is the exporter pod's node as the API says (its `Hostname` label where not known: the
//! exporter writes the node's name there only when told it). The environment is the one whose
//! pod the exporter names (`namespace`, `pod`), found by the `berth.dev/environment` label
//! Berth's manifests give every pod; a pod that is not Berth's gives none.

use std::collections::{BTreeMap, HashMap};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

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
/// DCGM's "blank" values (no reading for this field) start here (`DCGM_INT64_BLANK`).
const DCGM_BLANK: f64 = 9.223_372_036_854_775e18;

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

/// A pod the exporter names as a GPU's user.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodRef {
    pub namespace: String,
    pub pod: String,
}

/// A MIG instance as the exporter names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct MigInstance {
    /// DCGM's GPU instance id (`GPU_I_ID`), not the placement's first slice.
    pub id: i64,
    pub profile: String,
}

/// One GPU's or MIG instance's series on an exporter's page, gathered by their labels.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuSeries {
    /// The `Hostname` label.
    pub hostname: Option<String>,
    pub gpu_index: i64,
    pub instance: Option<MigInstance>,
    pub pod: Option<PodRef>,
    pub gpu_util_pct: Option<f64>,
    pub engine_active: Option<f64>,
    pub fb_used_mib: Option<f64>,
    pub fb_free_mib: Option<f64>,
    pub power_w: Option<f64>,
    pub temperature_c: Option<f64>,
}

type SeriesKey = (Option<String>, i64, Option<MigInstance>, Option<PodRef>);

/// The GPUs and MIG instances on one exporter page, in label order. Samples without a
/// `gpu` index, of other fields, or with DCGM's blank value are passed over.
pub fn parse_page(page: &str) -> Vec<GpuSeries> {
    let lines = page.lines().map(|l| Ok(l.to_owned()));
    // Reading from a string cannot fail; the parser passes over lines it cannot read.
    let Ok(scrape) = prometheus_parse::Scrape::parse(lines) else {
        return Vec::new();
    };
    let mut gathered: BTreeMap<SeriesKey, GpuSeries> = BTreeMap::new();
    for sample in &scrape.samples {
        let value = match sample.value {
            prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => continue,
        };
        if !(0.0..DCGM_BLANK).contains(&value) {
            continue;
        }
        const FIELDS: [&str; 6] = [
            "DCGM_FI_DEV_GPU_UTIL",
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "DCGM_FI_DEV_FB_USED",
            "DCGM_FI_DEV_FB_FREE",
            "DCGM_FI_DEV_POWER_USAGE",
            "DCGM_FI_DEV_GPU_TEMP",
        ];
        let Some(field) = FIELDS.iter().position(|f| *f == sample.metric) else {
            continue;
        };
        let labels = &sample.labels;
        let Some(gpu_index) = labels.get("gpu").and_then(|g| g.parse::<i64>().ok()) else {
            continue;
        };
        let present = |name: &str| labels.get(name).filter(|v| !v.is_empty()).map(str::to_owned);
        let instance = match (present("GPU_I_ID").and_then(|i| i.parse().ok()), present("GPU_I_PROFILE")) {
            (Some(id), profile) => Some(MigInstance { id, profile: profile.unwrap_or_default() }),
            (None, _) => None,
        };
        let pod = match (present("namespace"), present("pod")) {
            (Some(namespace), Some(pod)) => Some(PodRef { namespace, pod }),
            _ => None,
        };
        let hostname = present("Hostname");
        let series = gathered
            .entry((hostname.clone(), gpu_index, instance.clone(), pod.clone()))
            .or_insert_with(|| GpuSeries { hostname, gpu_index, instance, pod, ..GpuSeries::default() });
        let slot = match field {
            0 => &mut series.gpu_util_pct,
            1 => &mut series.engine_active,
            2 => &mut series.fb_used_mib,
            3 => &mut series.fb_free_mib,
            4 => &mut series.power_w,
            _ => &mut series.temperature_c,
        };
        *slot = Some(value);
    }
    gathered.into_values().collect()
}

/// When and where a page was read.
#[derive(Debug, Clone)]
pub struct PageContext {
    /// The exporter pod's node, where the API said it.
    pub node: Option<String>,
    pub at_ms: i64,
    pub period_s: f64,
}

/// The readings of one page's series: those with a node, a utilization and plausible
/// figures, each with the environment `environment_of` says its pod belongs to.
pub fn readings(
    series: &[GpuSeries],
    context: &PageContext,
    environment_of: impl Fn(&PodRef) -> Option<String>,
) -> Vec<GpuReading> {
    series
        .iter()
        .filter_map(|s| {
            let node = context.node.clone().or_else(|| s.hostname.clone())?;
            let engine_pct = s.engine_active.map(|ratio| (ratio * 100.0).clamp(0.0, 100.0));
            let utilization_pct = match s.instance {
                Some(_) => engine_pct?,
                None => s.gpu_util_pct.or(engine_pct)?,
            };
            let used = s.fb_used_mib.unwrap_or(0.0);
            let reading = GpuReading {
                node,
                gpu_index: s.gpu_index,
                slice_start: None,
                environment: s.pod.as_ref().and_then(&environment_of),
                at_ms: context.at_ms,
                period_s: context.period_s,
                utilization_pct,
                memory_used_mib: used,
                // A total of 0 says the source does not know it.
                memory_total_mib: s.fb_free_mib.map_or(0.0, |free| used + free),
                power_w: if s.instance.is_some() { None } else { s.power_w },
                temperature_c: s.temperature_c,
            };
            reading.is_plausible(context.at_ms).then_some(reading)
        })
        .collect()
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

    const T4: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/dcgm/t4-docker.txt"));
    const MIG: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/dcgm/mig-kubernetes.txt"));
    const NOTEBOOK: &str = "0f1e2d3c-4b5a-4978-8a9b-0c1d2e3f4a5b";
    const JOB: &str = "99999999-8888-4777-8666-555555555555";

    fn at(node: Option<&str>) -> PageContext {
        PageContext { node: node.map(str::to_owned), at_ms: 1_800_000_000_000, period_s: 30.0 }
    }

    fn berth_pods(pod: &PodRef) -> Option<String> {
        match (pod.namespace.as_str(), pod.pod.as_str()) {
            ("berth-acme", "nb-0f1e2d3c4b5a-0") => Some(NOTEBOOK.into()),
            ("berth-vault-999999998888", "training-x7k2p") => Some(JOB.into()),
            _ => None,
        }
    }

    #[test]
    fn a_recorded_page_gives_its_gpu_with_every_figure() {
        let series = parse_page(T4);
        assert_eq!(series.len(), 1, "{series:?}");
        let readings = readings(&series, &at(None), berth_pods);
        assert_eq!(
            readings,
            [GpuReading {
                node: "424773df46e0".into(),
                gpu_index: 0,
                slice_start: None,
                environment: None,
                at_ms: 1_800_000_000_000,
                period_s: 30.0,
                utilization_pct: 0.0,
                memory_used_mib: 0.0,
                memory_total_mib: 15109.0,
                power_w: Some(8.969),
                temperature_c: Some(25.0),
            }]
        );
        // The exporter pod's node, where the API says it, wins over the `Hostname` label.
        assert_eq!(readings_on(T4, Some("gpu-node-7"))[0].node, "gpu-node-7");
    }

    fn readings_on(page: &str, node: Option<&str>) -> Vec<GpuReading> {
        readings(&parse_page(page), &at(node), berth_pods)
    }

    #[test]
    fn mig_instances_read_engine_activity_and_map_to_berths_pods_only() {
        let readings = readings_on(MIG, None);
        assert_eq!(readings.len(), 4, "{readings:#?}");
        let notebook = readings.iter().find(|r| r.environment.as_deref() == Some(NOTEBOOK)).expect("notebook's");
        assert_eq!((notebook.node.as_str(), notebook.gpu_index), ("h100-1", 0));
        assert!((notebook.utilization_pct - 45.31).abs() < 1e-9, "{notebook:?}");
        assert_eq!((notebook.memory_used_mib, notebook.memory_total_mib), (12664.0, 40308.0));
        assert_eq!(notebook.power_w, None, "a MIG instance is not given its GPU's power");
        assert_eq!(notebook.temperature_c, Some(41.0));

        let job = readings.iter().find(|r| r.environment.as_deref() == Some(JOB)).expect("job's");
        assert_eq!((job.gpu_index, job.utilization_pct, job.power_w), (1, 97.0, Some(655.183)));

        // Another team's pod on the same GPU, and an idle GPU: readings with no environment.
        let unattributed: Vec<(i64, f64)> =
            readings.iter().filter(|r| r.environment.is_none()).map(|r| (r.gpu_index, r.memory_used_mib)).collect();
        assert_eq!(unattributed, [(0, 5870.0), (2, 0.0)]);
    }

    #[test]
    fn blank_and_missing_figures_leave_a_gpu_out_or_unknown() {
        let page = "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",Hostname=\"n\"} 9223372036854775794\n\
                    DCGM_FI_DEV_GPU_UTIL{gpu=\"1\",Hostname=\"n\"} 12\n\
                    DCGM_FI_DEV_POWER_USAGE{gpu=\"1\",Hostname=\"n\"} 9223372036854775794\n\
                    DCGM_FI_DEV_GPU_UTIL{Hostname=\"n\"} 50\n\
                    DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu=\"2\",GPU_I_ID=\"1\",Hostname=\"n\"} 1.7\n";
        let readings = readings_on(page, None);
        // GPU 0 has no utilization, the unindexed sample no GPU; an instance's ratio is capped.
        assert_eq!(readings.iter().map(|r| r.gpu_index).collect::<Vec<_>>(), [1, 2]);
        assert_eq!((readings[0].power_w, readings[0].memory_total_mib), (None, 0.0));
        assert_eq!(readings[1].utilization_pct, 100.0);
        assert!(readings_on("not a metrics page\n", None).is_empty());
    }

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
