//! What `berth agent` on a GPU node reports, and how a report becomes GPU health.
//!
//! The agent reads NVML and sends a [`NodeReport`]; the portal checks it against the fleet
//! file ([`assess`], [`MISSING_NOTE`]) and decides, with [`next_health`], whether the GPU's
//! recorded health changes. Only healthy GPUs take new bookings.

use serde::{Deserialize, Serialize};

use crate::Refusal;
use crate::gpu::GpuModel;
use crate::telemetry::GpuReading;

/// One node's inventory and health, as its agent read it from NVML.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeReport {
    /// The `berth` version the agent runs, shown to platform admins.
    pub agent_version: String,
    /// Every GPU NVML sees; empty when NVML is not available on the node.
    pub gpus: Vec<GpuReport>,
    /// How often the agent reports, in seconds: each report's readings stand for that long
    /// in busy GPU-hours. Older agents leave it out (taken as 30 s).
    #[serde(default)]
    pub period_s: Option<f64>,
}

/// One GPU as NVML sees it. Readings a GPU does not support are `None`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuReport {
    /// NVML's device index, the same numbering as the fleet file's GPUs.
    pub index: i64,
    /// `GPU-…`, stable across reboots and slots.
    pub uuid: String,
    /// NVML's product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    pub memory_mib: i64,
    /// MIG mode currently in effect (not the one pending a reset).
    pub mig_enabled: bool,
    /// The MIG mode the GPU takes at its next reset; `None` for a GPU without MIG (or an
    /// agent that does not say). Different from `mig_enabled`, the change waits for a reset.
    #[serde(default)]
    pub mig_pending: Option<bool>,
    /// MIG instances on the GPU, when the agent could count them.
    #[serde(default)]
    pub mig_instances: Option<i64>,
    /// Uncorrected ECC errors since the driver loaded (NVML's volatile counter).
    #[serde(default)]
    pub ecc_uncorrected: Option<i64>,
    #[serde(default)]
    pub temperature_c: Option<i64>,
    #[serde(default)]
    pub power_w: Option<i64>,
    /// GPU utilization over NVML's last sample period, 0 to 100. NVML does not give it for
    /// a GPU in MIG mode (its instances are read one by one, which the agent cannot yet).
    #[serde(default)]
    pub utilization_pct: Option<i64>,
    /// Memory in use, MiB.
    #[serde(default)]
    pub memory_used_mib: Option<i64>,
    /// The XID errors NVML raised on the GPU since the agent's last report, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xid_errors: Vec<u32>,
    /// Its MIG instances' readings, where the agent could read them (NVML gives none per
    /// instance: they come from the node's DCGM exporter, see `crate::dcgm::mig_readings`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_readings: Vec<MigReading>,
}

/// One MIG instance's reading, placed as Berth names a slice.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MigReading {
    /// The first memory slice of its placement (0 to 7).
    pub slice_start: i64,
    /// Its graphics engine activity, 0 to 100.
    pub utilization_pct: f64,
    pub memory_used_mib: f64,
    /// 0 where the source does not know it.
    pub memory_total_mib: f64,
}

/// The most GPUs one node can report; more is a broken or hostile agent.
pub const MAX_GPUS_PER_REPORT: usize = 64;
/// The most XID errors one GPU's report carries: the agent keeps the latest this many
/// between reports, since a GPU in trouble can raise thousands.
pub const MAX_XIDS_PER_GPU: usize = 32;
const MAX_TEXT: usize = 128;

impl NodeReport {
    /// Refuses a report the portal should not store: too many GPUs, an index twice,
    /// negative indices or readings, or oversized text.
    pub fn validate(&self) -> Result<(), Refusal> {
        if self.gpus.len() > MAX_GPUS_PER_REPORT {
            return Err(Refusal::InvalidReport(format!("more than {MAX_GPUS_PER_REPORT} GPUs")));
        }
        if self.agent_version.chars().count() > MAX_TEXT {
            return Err(Refusal::InvalidReport("agent version is too long".into()));
        }
        let mut seen = std::collections::BTreeSet::new();
        for gpu in &self.gpus {
            if gpu.index < 0 || !seen.insert(gpu.index) {
                return Err(Refusal::InvalidReport(format!("GPU index {} is negative or repeated", gpu.index)));
            }
            if gpu.uuid.chars().count() > MAX_TEXT || gpu.name.chars().count() > MAX_TEXT {
                return Err(Refusal::InvalidReport(format!("GPU {}: uuid or name is too long", gpu.index)));
            }
            let readings = [
                gpu.mig_instances,
                gpu.ecc_uncorrected,
                gpu.temperature_c,
                gpu.power_w,
                gpu.utilization_pct,
                gpu.memory_used_mib,
            ];
            if gpu.memory_mib < 0 || readings.iter().flatten().any(|r| *r < 0) {
                return Err(Refusal::InvalidReport(format!("GPU {}: a reading is negative", gpu.index)));
            }
            if gpu.mig_readings.len() > 8 {
                return Err(Refusal::InvalidReport(format!("GPU {}: more than 8 MIG instances", gpu.index)));
            }
            if gpu.xid_errors.len() > MAX_XIDS_PER_GPU {
                return Err(Refusal::InvalidReport(format!(
                    "GPU {}: more than {MAX_XIDS_PER_GPU} XID errors",
                    gpu.index
                )));
            }
        }
        if self.period_s.is_some_and(|p| !(p.is_finite() && p > 0.0)) {
            return Err(Refusal::InvalidReport("the report period is not a positive number of seconds".into()));
        }
        Ok(())
    }

    /// The report's GPU readings for the telemetry store, read at `at_ms` on `node`: one
    /// per GPU whose utilization NVML gave (none for a GPU in MIG mode), and one per MIG
    /// instance the agent read.
    pub fn readings(&self, node: &str, at_ms: i64) -> Vec<GpuReading> {
        let period_s = self.period_s.unwrap_or(DEFAULT_PERIOD_S);
        let mut readings = Vec::new();
        for gpu in &self.gpus {
            let reading = |slice_start, utilization: f64, used: f64, total: f64, power_w| GpuReading {
                node: node.to_owned(),
                gpu_index: gpu.index,
                slice_start,
                environment: None,
                at_ms,
                period_s,
                utilization_pct: utilization,
                memory_used_mib: used,
                memory_total_mib: total,
                power_w,
                temperature_c: gpu.temperature_c.map(|t| t as f64),
            };
            if let Some(utilization) = gpu.utilization_pct {
                let used = gpu.memory_used_mib.unwrap_or(0) as f64;
                readings.push(reading(
                    None,
                    utilization as f64,
                    used,
                    gpu.memory_mib as f64,
                    gpu.power_w.map(|w| w as f64),
                ));
            }
            // An instance is not given its GPU's power: counted per instance it would count
            // several times.
            for mig in &gpu.mig_readings {
                let MigReading { slice_start, utilization_pct, memory_used_mib, memory_total_mib } = *mig;
                readings.push(reading(Some(slice_start), utilization_pct, memory_used_mib, memory_total_mib, None));
            }
        }
        readings
    }
}

/// Why the report's node should take no new work: the first fatal XID it carries (see
/// [`crate::node_checks::is_fatal_xid`]), in words; `None` when there is none. XIDs an
/// application causes (13, 31, 43) are the workload's and leave the node as it is.
pub fn fatal_xid(report: &NodeReport) -> Option<String> {
    report.gpus.iter().find_map(|gpu| {
        let code = gpu.xid_errors.iter().copied().find(|code| crate::node_checks::is_fatal_xid(*code))?;
        Some(format!("the node's agent reports XID {code} on GPU {} ({})", gpu.index, xid_meaning(code)))
    })
}

/// What an XID means, from NVIDIA's XID catalogue.
pub fn xid_meaning(code: u32) -> &'static str {
    match code {
        13 => "graphics engine exception",
        31 => "GPU memory page fault",
        43 => "GPU stopped processing",
        48 => "double-bit ECC error",
        63 => "ECC page retirement or row remapping recorded",
        64 => "ECC page retirement or row remapping failed",
        74 => "NVLink error",
        79 => "GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        119 | 120 => "GSP error",
        _ => "see NVIDIA's XID catalogue",
    }
}

/// What a report without its period stands for: the agent's default interval.
pub const DEFAULT_PERIOD_S: f64 = 30.0;

/// A GPU's recorded health. Only `Healthy` takes new bookings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuHealth {
    Healthy,
    Degraded,
    Failed,
}

impl GpuHealth {
    pub fn as_str(self) -> &'static str {
        match self {
            GpuHealth::Healthy => "healthy",
            GpuHealth::Degraded => "degraded",
            GpuHealth::Failed => "failed",
        }
    }

    pub fn parse(text: &str) -> Option<GpuHealth> {
        [GpuHealth::Healthy, GpuHealth::Degraded, GpuHealth::Failed].into_iter().find(|h| h.as_str() == text)
    }
}

/// Who recorded a GPU's current health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthSource {
    /// A platform admin on the fleet page (also every GPU's starting `healthy`).
    Admin,
    /// The node's agent, through [`next_health`].
    Agent,
}

impl HealthSource {
    pub fn as_str(self) -> &'static str {
        match self {
            HealthSource::Admin => "admin",
            HealthSource::Agent => "agent",
        }
    }

    pub fn parse(text: &str) -> Option<HealthSource> {
        [HealthSource::Admin, HealthSource::Agent].into_iter().find(|s| s.as_str() == text)
    }
}

/// A health with the reason an operator reads next to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub health: GpuHealth,
    /// Empty for healthy.
    pub note: String,
}

/// Above this a GPU throttles and errors grow likelier: keep new work off it.
pub const HOT_GPU_C: i64 = 87;

/// The note on a GPU the fleet file names but the node's agent does not report.
pub const MISSING_NOTE: &str = "not reported by the node's agent";

/// The model an NVML product name stands for (`NVIDIA H100 80GB HBM3` is an H100-80GB),
/// using the memory where the name alone is ambiguous.
pub fn model_of(product_name: &str, memory_mib: i64) -> Option<GpuModel> {
    let name = product_name.to_ascii_uppercase();
    let has = |part: &str| name.contains(part);
    if has("B200") {
        Some(GpuModel::B200)
    } else if has("H200") {
        Some(GpuModel::H200)
    } else if has("H100") && has("NVL") {
        Some(GpuModel::H100_NVL)
    } else if has("H100") {
        Some(GpuModel::H100_80GB)
    } else if has("A100") {
        // The 40 GB A100 reports about 40 536 MiB, the 80 GB one about 81 920 MiB.
        Some(if has("80GB") || memory_mib > 60 * 1024 { GpuModel::A100_80GB } else { GpuModel::A100_40GB })
    } else if has("L40S") {
        Some(GpuModel::L40S)
    } else {
        None
    }
}

/// What one reported GPU's readings say about its health, against the model the fleet
/// file gives it. A different model or any uncorrected ECC error fails it; running hot, or
/// a MIG mode change waiting for a reset, degrades it (a degraded GPU takes no new booking).
pub fn assess(gpu: &GpuReport, expected: GpuModel) -> Verdict {
    let reported = model_of(&gpu.name, gpu.memory_mib);
    if reported != Some(expected) {
        let what = reported.map_or_else(|| format!("\"{}\"", gpu.name), |m| m.name().to_owned());
        return Verdict {
            health: GpuHealth::Failed,
            note: format!("the agent reports {what}, the fleet file says {expected}"),
        };
    }
    // NVML counts MiB, a model's memory is sold in decimal GB (an 80 GB H100 reports
    // 81,559 MiB, 85.5 GB): a GPU with clearly less than its model has is not the GPU
    // placement counts on (a different SKU under the same name, memory disabled).
    let reported_gb = gpu.memory_mib as f64 * 1_048_576.0 / 1e9;
    if gpu.memory_mib > 0 && reported_gb < 0.95 * f64::from(expected.memory_gb()) {
        return Verdict {
            health: GpuHealth::Failed,
            note: format!(
                "the agent reports {reported_gb:.1} GB of GPU memory, the fleet file's {expected} has {} GB",
                expected.memory_gb()
            ),
        };
    }
    if let Some(errors) = gpu.ecc_uncorrected.filter(|e| *e > 0) {
        return Verdict { health: GpuHealth::Failed, note: format!("{errors} uncorrected ECC errors") };
    }
    if let Some(t) = gpu.temperature_c.filter(|t| *t > HOT_GPU_C) {
        return Verdict { health: GpuHealth::Degraded, note: format!("{t} °C, above {HOT_GPU_C} °C") };
    }
    // Placement assumes the mode in effect; a change pending a reset flips it under any
    // booking (MIG slices vanish, or a whole GPU splits), so the GPU takes none until then.
    if let Some(pending) = gpu.mig_pending.filter(|p| *p != gpu.mig_enabled) {
        let (now, then) = if pending { ("off", "on") } else { ("on", "off") };
        return Verdict {
            health: GpuHealth::Degraded,
            note: format!(
                "MIG mode is {now} until a GPU reset turns it {then}: reset it with nothing running on it \
                 (nvidia-smi -i {} -r)",
                gpu.index
            ),
        };
    }
    Verdict { health: GpuHealth::Healthy, note: String::new() }
}

/// The verdict for a GPU the fleet file names and the report leaves out.
pub fn missing() -> Verdict {
    Verdict { health: GpuHealth::Failed, note: MISSING_NOTE.to_owned() }
}

/// The health to record after a report, or `None` to leave it as it is.
///
/// The rule: the agent's verdict replaces whatever the agent said before, in both
/// directions (a GPU it failed for ECC errors is healthy again once the counter resets).
/// A `degraded` or `failed` recorded by an admin stays until an admin changes it: the admin
/// may know what NVML cannot (a bad cable, a vendor ticket), and such a GPU takes no new
/// bookings anyway. An admin's `healthy` is no such judgement, so the agent may overrule it.
pub fn next_health(current: GpuHealth, note: &str, source: HealthSource, verdict: &Verdict) -> Option<Verdict> {
    let admin_judgement = source == HealthSource::Admin && current != GpuHealth::Healthy;
    let same = current == verdict.health && note == verdict.note;
    (!admin_judgement && !same).then(|| verdict.clone())
}

/// A command line the agent runs on its node (`ip`, `nft`, `nvidia-smi`), with what goes
/// to its standard input. Planned here, run by the agent through its command runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    pub program: &'static str,
    pub args: Vec<String>,
    pub stdin: Option<String>,
}

impl Command {
    pub fn new(program: &'static str, args: &[&str]) -> Command {
        Command { program, args: args.iter().map(|a| (*a).to_owned()).collect(), stdin: None }
    }
}

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.program, self.args.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100(index: i64) -> GpuReport {
        GpuReport {
            index,
            uuid: format!("GPU-{index}"),
            name: "NVIDIA H100 80GB HBM3".into(),
            memory_mib: 81_559,
            ecc_uncorrected: Some(0),
            temperature_c: Some(40),
            ..GpuReport::default()
        }
    }

    #[test]
    fn nvml_names_map_to_fleet_models() {
        assert_eq!(model_of("NVIDIA H100 80GB HBM3", 81_559), Some(GpuModel::H100_80GB));
        assert_eq!(model_of("NVIDIA H100 NVL", 95_830), Some(GpuModel::H100_NVL));
        assert_eq!(model_of("NVIDIA A100-SXM4-40GB", 40_536), Some(GpuModel::A100_40GB));
        assert_eq!(model_of("NVIDIA A100-SXM4-80GB", 81_920), Some(GpuModel::A100_80GB));
        assert_eq!(model_of("NVIDIA L40S", 46_068), Some(GpuModel::L40S));
        assert_eq!(model_of("NVIDIA H200", 143_771), Some(GpuModel::H200));
        assert_eq!(model_of("NVIDIA B200", 183_359), Some(GpuModel::B200));
        assert_eq!(model_of("Tesla T4", 15_360), None);
    }

    #[test]
    fn ecc_errors_fail_heat_degrades_and_a_quiet_gpu_is_healthy() {
        assert_eq!(assess(&h100(0), GpuModel::H100_80GB), Verdict { health: GpuHealth::Healthy, note: String::new() });
        let ecc = GpuReport { ecc_uncorrected: Some(3), ..h100(1) };
        assert_eq!(
            assess(&ecc, GpuModel::H100_80GB),
            Verdict { health: GpuHealth::Failed, note: "3 uncorrected ECC errors".into() }
        );
        let hot = GpuReport { temperature_c: Some(HOT_GPU_C + 1), ..h100(2) };
        assert_eq!(assess(&hot, GpuModel::H100_80GB).health, GpuHealth::Degraded);
        let warm = GpuReport { temperature_c: Some(HOT_GPU_C), ..h100(2) };
        assert_eq!(assess(&warm, GpuModel::H100_80GB).health, GpuHealth::Healthy);
        // Readings the GPU does not support say nothing against it.
        let silent = GpuReport { ecc_uncorrected: None, temperature_c: None, ..h100(3) };
        assert_eq!(assess(&silent, GpuModel::H100_80GB).health, GpuHealth::Healthy);
    }

    #[test]
    fn a_mig_mode_waiting_for_a_reset_degrades_the_gpu_until_it_is_in_effect() {
        let stuck_off = GpuReport { mig_enabled: false, mig_pending: Some(true), ..h100(3) };
        let verdict = assess(&stuck_off, GpuModel::H100_80GB);
        assert_eq!(verdict.health, GpuHealth::Degraded);
        assert_eq!(
            verdict.note,
            "MIG mode is off until a GPU reset turns it on: reset it with nothing running on it (nvidia-smi -i 3 -r)"
        );
        let stuck_on = GpuReport { mig_enabled: true, mig_pending: Some(false), ..h100(0) };
        assert!(
            assess(&stuck_on, GpuModel::H100_80GB).note.starts_with("MIG mode is on until a GPU reset turns it off")
        );
        for settled in [
            GpuReport { mig_enabled: true, mig_pending: Some(true), ..h100(0) },
            GpuReport { mig_enabled: false, mig_pending: Some(false), ..h100(0) },
            // A GPU without MIG, or an agent that does not say.
            GpuReport { mig_enabled: false, mig_pending: None, ..h100(0) },
        ] {
            assert_eq!(assess(&settled, GpuModel::H100_80GB).health, GpuHealth::Healthy, "{settled:?}");
        }
        // Once reset, the agent's next report makes it healthy again.
        let degraded = assess(&stuck_off, GpuModel::H100_80GB);
        let reset = assess(&GpuReport { mig_enabled: true, ..stuck_off.clone() }, GpuModel::H100_80GB);
        assert_eq!(
            next_health(degraded.health, &degraded.note, HealthSource::Agent, &reset),
            Some(Verdict { health: GpuHealth::Healthy, note: String::new() })
        );
    }

    #[test]
    fn a_gpu_with_less_memory_than_its_model_fails_and_each_models_own_figure_passes() {
        let short = GpuReport { memory_mib: 40_960, ..h100(1) };
        let verdict = assess(&short, GpuModel::H100_80GB);
        assert_eq!(verdict.health, GpuHealth::Failed);
        assert_eq!(verdict.note, "the agent reports 42.9 GB of GPU memory, the fleet file's H100-80GB has 80 GB");
        // What each model reports through NVML (the H100's recorded, see ../shared/reference).
        for (name, mib, model) in [
            ("NVIDIA H100 80GB HBM3", 81_559, GpuModel::H100_80GB),
            ("NVIDIA A100-SXM4-80GB", 81_920, GpuModel::A100_80GB),
            ("NVIDIA A100-SXM4-40GB", 40_960, GpuModel::A100_40GB),
            ("NVIDIA H100 NVL", 95_830, GpuModel::H100_NVL),
            ("NVIDIA H200", 143_771, GpuModel::H200),
            ("NVIDIA L40S", 46_068, GpuModel::L40S),
        ] {
            let gpu = GpuReport { name: name.into(), memory_mib: mib, ..h100(0) };
            assert_eq!(assess(&gpu, model).health, GpuHealth::Healthy, "{name}: {}", assess(&gpu, model).note);
        }
    }

    #[test]
    fn a_model_other_than_the_fleet_files_fails_naming_both() {
        let verdict = assess(&h100(0), GpuModel::A100_80GB);
        assert_eq!(verdict.health, GpuHealth::Failed);
        assert_eq!(verdict.note, "the agent reports H100-80GB, the fleet file says A100-80GB");
        let unknown = GpuReport { name: "Tesla T4".into(), ..h100(0) };
        assert_eq!(assess(&unknown, GpuModel::L40S).note, "the agent reports \"Tesla T4\", the fleet file says L40S");
    }

    #[test]
    fn a_fatal_xid_names_the_node_unwell_and_an_applications_xid_does_not() {
        let report = |xids: &[u32]| NodeReport {
            gpus: vec![h100(0), GpuReport { xid_errors: xids.to_vec(), ..h100(3) }],
            ..NodeReport::default()
        };
        assert_eq!(fatal_xid(&report(&[])), None);
        // 13 and 43 are a program's faults: the node is fine.
        assert_eq!(fatal_xid(&report(&[13, 43])), None);
        assert_eq!(
            fatal_xid(&report(&[13, 79, 48])).as_deref(),
            Some("the node's agent reports XID 79 on GPU 3 (GPU has fallen off the bus)")
        );
        assert!(report(&[79; MAX_XIDS_PER_GPU]).validate().is_ok());
        let flood = report(&[13; MAX_XIDS_PER_GPU + 1]).validate().unwrap_err();
        assert_eq!(flood, Refusal::InvalidReport("GPU 3: more than 32 XID errors".into()));
        // Older agents send none: the field may be left out.
        let old: GpuReport =
            serde_json::from_str(r#"{"index":0,"uuid":"GPU-0","name":"x","memory_mib":1,"mig_enabled":false}"#)
                .expect("an older agent's GPU");
        assert!(old.xid_errors.is_empty());
    }

    #[test]
    fn the_agent_replaces_its_own_verdicts_but_not_an_admins() {
        let failed = missing();
        let healthy = Verdict { health: GpuHealth::Healthy, note: String::new() };
        // Fresh GPUs start as the admin's healthy: the agent may fail them.
        assert_eq!(next_health(GpuHealth::Healthy, "", HealthSource::Admin, &failed), Some(failed.clone()));
        // Nothing new: no write, no audit row.
        assert_eq!(next_health(GpuHealth::Healthy, "", HealthSource::Admin, &healthy), None);
        assert_eq!(next_health(GpuHealth::Failed, MISSING_NOTE, HealthSource::Agent, &failed), None);
        // The agent clears what it said itself.
        assert_eq!(next_health(GpuHealth::Failed, MISSING_NOTE, HealthSource::Agent, &healthy), Some(healthy.clone()));
        // An admin's failed or degraded stays, whatever the agent says.
        assert_eq!(next_health(GpuHealth::Failed, "XID 79", HealthSource::Admin, &healthy), None);
        assert_eq!(next_health(GpuHealth::Degraded, "fan", HealthSource::Admin, &failed), None);
    }

    /// A report recorded on a real H200 under load (see `fixtures/agent/README.md`).
    #[test]
    fn a_real_h200_report_reads_as_nvidia_smi_read_it() {
        let report: NodeReport =
            serde_json::from_str(include_str!("../fixtures/agent/h200-under-load.json")).expect("the recorded report");
        assert_eq!(report.validate(), Ok(()));
        assert_eq!(assess(&report.gpus[0], GpuModel::H200).health, GpuHealth::Healthy);
        let readings = report.readings("h200-01", 0);
        assert_eq!(readings.len(), 1);
        let r = &readings[0];
        assert_eq!((r.utilization_pct, r.memory_used_mib, r.memory_total_mib), (100.0, 1650.0, 143_771.0));
        assert_eq!((r.power_w, r.temperature_c), (Some(664.0), Some(58.0)));
        assert!(r.is_plausible(0));
    }

    #[test]
    fn reports_with_repeated_indices_or_negative_readings_are_refused() {
        let ok = NodeReport { agent_version: "0.1.0".into(), gpus: vec![h100(0), h100(1)], period_s: None };
        assert_eq!(ok.validate(), Ok(()));
        let twice = NodeReport { gpus: vec![h100(0), h100(0)], ..ok.clone() };
        assert!(twice.validate().is_err());
        let negative = NodeReport { gpus: vec![GpuReport { power_w: Some(-1), ..h100(0) }], ..ok.clone() };
        assert!(negative.validate().is_err());
        let many = NodeReport { gpus: (0..65).map(h100).collect(), ..ok.clone() };
        assert!(many.validate().is_err());
        let never = NodeReport { period_s: Some(0.0), ..ok.clone() };
        assert!(never.validate().is_err());
        // Readings: one per GPU whose utilization NVML gave.
        let busy = GpuReport { utilization_pct: Some(97), memory_used_mib: Some(70_000), ..h100(1) };
        let read = NodeReport { gpus: vec![h100(0), busy], period_s: Some(15.0), ..ok };
        let readings = read.readings("gpu-a-01", 1_000);
        assert_eq!(readings.len(), 1);
        assert_eq!((readings[0].gpu_index, readings[0].utilization_pct, readings[0].period_s), (1, 97.0, 15.0));
        assert_eq!((readings[0].memory_used_mib, readings[0].memory_total_mib), (70_000.0, 81_559.0));
    }

    #[test]
    fn the_report_reads_what_older_agents_leave_out() {
        let json = r#"{"agent_version": "0.1.0", "gpus": [{"index": 0, "uuid": "GPU-0", "name": "NVIDIA L40S",
                       "memory_mib": 46068, "mig_enabled": false}]}"#;
        let report: NodeReport = serde_json::from_str(json).expect("report");
        assert_eq!(report.gpus[0].temperature_c, None);
    }
}
