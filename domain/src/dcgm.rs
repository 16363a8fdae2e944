//! The NVIDIA DCGM exporter's page (Prometheus text format), read with `prometheus-parse`:
//! each GPU's and MIG instance's series gathered by their labels ([`parse_page`]), and the
//! readings they give ([`readings`] for Kubernetes, where pods name the environments;
//! [`mig_readings`] for a bare-metal node's agent, which places instances itself).
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
//! per instance would count it several times); temperature from `DCGM_FI_DEV_GPU_TEMP`.

use std::collections::BTreeMap;

use crate::agent::MigReading;
use crate::telemetry::GpuReading;

/// DCGM's "blank" values (no reading for this field) start here (`DCGM_INT64_BLANK`).
const DCGM_BLANK: f64 = 9.223_372_036_854_775e18;

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

/// A bare-metal node's MIG instances as its own exporter page gives them, by GPU index:
/// each instance's engine activity and memory, placed at the first slice `start_of(gpu,
/// GPU instance id)` gives it (the agent reads placements from `nvidia-smi mig -lgi`). An
/// instance without engine activity or a placement is left out; an instance the page lists
/// under several pods is read once.
pub fn mig_readings(
    series: &[GpuSeries],
    start_of: impl Fn(i64, i64) -> Option<i64>,
) -> BTreeMap<i64, Vec<MigReading>> {
    let mut by_gpu: BTreeMap<i64, Vec<MigReading>> = BTreeMap::new();
    for s in series {
        let Some(instance) = &s.instance else { continue };
        let (Some(active), Some(slice_start)) = (s.engine_active, start_of(s.gpu_index, instance.id)) else {
            continue;
        };
        let readings = by_gpu.entry(s.gpu_index).or_default();
        if readings.iter().any(|r| r.slice_start == slice_start) {
            continue;
        }
        let used = s.fb_used_mib.unwrap_or(0.0);
        readings.push(MigReading {
            slice_start,
            utilization_pct: (active * 100.0).clamp(0.0, 100.0),
            memory_used_mib: used,
            memory_total_mib: s.fb_free_mib.map_or(0.0, |free| used + free),
        });
    }
    by_gpu
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
    fn a_bare_metal_agent_places_mig_instances_at_their_first_slice() {
        // GPU instance 3 starts at slice 0 and 5 at slice 6 (as `nvidia-smi mig -lgi` says);
        // GPU 1's instance has no placement the agent knows: left out.
        let start_of = |gpu, id| match (gpu, id) {
            (0, 3) => Some(0),
            (0, 5) => Some(6),
            _ => None,
        };
        let by_gpu = mig_readings(&parse_page(MIG), start_of);
        assert_eq!(by_gpu.keys().copied().collect::<Vec<_>>(), [0]);
        let readings = &by_gpu[&0];
        assert_eq!(readings.len(), 2, "{readings:?}");
        assert_eq!(readings[0].slice_start, 0);
        assert!((readings[0].utilization_pct - 45.31).abs() < 1e-9, "{readings:?}");
        assert_eq!((readings[0].memory_used_mib, readings[0].memory_total_mib), (12664.0, 40308.0));
        assert_eq!((readings[1].slice_start, readings[1].utilization_pct), (6, 0.0));

        // A host's own exporter names no pods; an instance listed twice is read once.
        let page = "DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu=\"2\",GPU_I_ID=\"1\",GPU_I_PROFILE=\"3g.40gb\"} 0.9\n\
                    DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu=\"2\",GPU_I_ID=\"1\",GPU_I_PROFILE=\"3g.40gb\",pod=\"x\",namespace=\"y\"} 0.1\n\
                    DCGM_FI_DEV_FB_USED{gpu=\"2\",GPU_I_ID=\"1\",GPU_I_PROFILE=\"3g.40gb\"} 2048\n\
                    DCGM_FI_DEV_GPU_UTIL{gpu=\"3\"} 50\n";
        let by_gpu = mig_readings(&parse_page(page), |_, _| Some(4));
        assert_eq!(
            by_gpu[&2],
            [MigReading { slice_start: 4, utilization_pct: 90.0, memory_used_mib: 2048.0, memory_total_mib: 0.0 }]
        );
        assert!(!by_gpu.contains_key(&3), "a whole GPU is NVML's to read");
    }
}
