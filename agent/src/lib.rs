//! `berth agent`: runs on a bare-metal GPU node, reads its GPUs through NVML and reports
//! them to the portal with the node's token, again every interval. With a node host
//! (`--backend baremetal` portals), it also fetches its node's plan, applies it and reports
//! the generation it applied or why it could not.
//!
//! NVML sits behind [`GpuProbe`] so tests can bring a fake node. `nvml-wrapper` loads
//! `libnvidia-ml.so` at run time: on a machine without it the agent says so once and
//! reports zero GPUs, which the portal records as every GPU of the node missing.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use berth_domain::agent::{GpuReport, NodeReport};
use berth_domain::node_plan::{NodePlan, PlanReport};
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::error::NvmlError;

mod error;
pub mod node;

pub use crate::error::{Error, NodeError};
use crate::node::NodeHost;

/// Where the agent posts its reports, under the portal's URL.
pub const REPORT_PATH: &str = "/api/v1/agent/report";
/// Where the agent fetches its node's plan and reports on it.
pub const PLAN_PATH: &str = "/api/v1/agent/plan";

/// Failed reports are retried sooner than the interval at first, then ever more rarely,
/// so a portal that comes back is not met by every node at once for long.
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(300);

/// Reads the node's GPUs. NVML in production; a fixed list in tests.
pub trait GpuProbe: Send + Sync {
    /// Every GPU the node has, read now. An error means nothing could be read (the
    /// driver is gone), not that a GPU is sick: a sick GPU is a reading.
    fn gpus(&self) -> Result<Vec<GpuReport>, Error>;
}

/// A node where NVML could not start: it has no GPUs Berth can use.
pub struct NoGpus;

impl GpuProbe for NoGpus {
    fn gpus(&self) -> Result<Vec<GpuReport>, Error> {
        Ok(Vec::new())
    }
}

/// The node's GPUs through NVML.
pub struct NvmlProbe {
    nvml: Nvml,
}

impl GpuProbe for NvmlProbe {
    fn gpus(&self) -> Result<Vec<GpuReport>, Error> {
        let count = self.nvml.device_count().map_err(Error::Nvml)?;
        let mut gpus = Vec::new();
        for index in 0..count {
            // A GPU NVML cannot open is left out; the portal fails it as not reported.
            match read_gpu(&self.nvml, index) {
                Ok(gpu) => gpus.push(gpu),
                Err(error) => tracing::warn!(index, %error, "NVML cannot read this GPU; leaving it out of the report"),
            }
        }
        Ok(gpus)
    }
}

fn read_gpu(nvml: &Nvml, index: u32) -> Result<GpuReport, NvmlError> {
    let device = nvml.device_by_index(index)?;
    // Readings a GPU does not support (ECC off, no power sensor) are left empty.
    Ok(GpuReport {
        index: i64::from(index),
        uuid: device.uuid()?,
        name: device.name()?,
        memory_mib: i64::try_from(device.memory_info()?.total / (1024 * 1024)).unwrap_or(i64::MAX),
        mig_enabled: device.mig_mode().is_ok_and(|mode| mode.current == 1),
        // nvml-wrapper's safe API cannot list MIG instances yet (it needs
        // nvmlDeviceGetMigDeviceHandleByIndex); left for the nvidia-smi fallback.
        mig_instances: None,
        // Volatile: since the driver loaded, so a reset GPU gets a fresh start.
        ecc_uncorrected: device
            .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            .ok()
            .map(|n| i64::try_from(n).unwrap_or(i64::MAX)),
        temperature_c: device.temperature(TemperatureSensor::Gpu).ok().map(i64::from),
        power_w: device.power_usage().ok().map(|milliwatts| i64::from(milliwatts / 1000)),
        utilization_pct: device.utilization_rates().ok().map(|u| i64::from(u.gpu)),
        memory_used_mib: device.memory_info().ok().and_then(|m| i64::try_from(m.used / (1024 * 1024)).ok()),
    })
}

/// NVML's probe, or none with the one line that tells the operator why.
pub fn open_probe() -> (Arc<dyn GpuProbe>, Option<String>) {
    probe_or_none(Nvml::init().map(|nvml| NvmlProbe { nvml }))
}

/// The probe NVML's start gave, or [`NoGpus`] and the reason when it failed.
pub fn probe_or_none<P: GpuProbe + 'static>(init: Result<P, NvmlError>) -> (Arc<dyn GpuProbe>, Option<String>) {
    match init {
        Ok(probe) => (Arc::new(probe), None),
        Err(error) => {
            let why = match error {
                NvmlError::LibloadingError(_) | NvmlError::LibraryNotFound => "libnvidia-ml.so not found".to_owned(),
                other => other.to_string(),
            };
            (Arc::new(NoGpus), Some(format!("NVML is not available on this machine ({why}): reporting zero GPUs")))
        }
    }
}

/// The node's report as `probe` reads it now.
pub fn node_report(probe: &dyn GpuProbe) -> Result<NodeReport, Error> {
    Ok(NodeReport { agent_version: env!("CARGO_PKG_VERSION").to_owned(), gpus: probe.gpus()?, period_s: None })
}

/// How long to wait after `failures` failed reports in a row: 1 s, 2 s, 4 s, ... up to
/// five minutes, and never longer than that even when the interval is.
pub fn retry_delay(failures: u32) -> Duration {
    FIRST_RETRY.saturating_mul(1 << failures.saturating_sub(1).min(16)).min(MAX_RETRY)
}

/// One node's agent: where it reports, with which token, how often, reading what.
pub struct Agent {
    client: reqwest::Client,
    portal: String,
    token: String,
    interval: Duration,
    probe: Arc<dyn GpuProbe>,
    /// The node the plans are applied to, and how often to ask for the plan.
    host: Option<(Arc<dyn NodeHost>, Duration)>,
}

impl Agent {
    pub fn new(portal: &str, token: &str, interval: Duration, probe: Arc<dyn GpuProbe>) -> Result<Agent, Error> {
        let portal = portal.trim_end_matches('/');
        if !(portal.starts_with("https://") || portal.starts_with("http://")) {
            return Err(Error::PortalUrl(portal.to_owned()));
        }
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(20))
            .user_agent(concat!("berth-agent/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(Error::HttpClient)?;
        Ok(Agent { client, portal: portal.to_owned(), token: token.trim().to_owned(), interval, probe, host: None })
    }

    /// The agent also applies the node plans of a `--backend baremetal` portal to `host`,
    /// asking for the plan every `plan_interval`.
    pub fn with_host(self, host: Arc<dyn NodeHost>, plan_interval: Duration) -> Agent {
        Agent { host: Some((host, plan_interval)), ..self }
    }

    /// Sends `body` (or nothing) to `path` with the node token; the portal's JSON answer or
    /// why it failed, in words for the agent's log.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<serde_json::Value, Error> {
        let url = format!("{}{path}", self.portal);
        let mut request = self.client.request(method, &url).bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.header(reqwest::header::CONTENT_TYPE, "application/json").body(body);
        }
        let response = request.send().await.map_err(|source| Error::Unreachable { url, source })?;
        let status = response.status();
        let text = response.text().await.map_err(Error::AnswerBrokeOff)?;
        let answer: serde_json::Value = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
        if !status.is_success() {
            // A problem's `detail` (RFC 9457); `error` from portals before it.
            let message = answer["detail"]
                .as_str()
                .or_else(|| answer["error"].as_str())
                .map_or_else(|| text.chars().take(200).collect(), str::to_owned);
            let what = if path == REPORT_PATH { "the report" } else { "the plan" };
            return Err(Error::Refused { what, status, message });
        }
        Ok(answer)
    }

    /// Fetches the node's plan, applies it and reports the outcome: the generation worked
    /// on, `None` when nothing was ever planned for the node (it is left as it is), and
    /// `Err` only when the portal could not be asked or told.
    pub async fn sync_plan(&self) -> Result<Option<i64>, Error> {
        let Some((host, _)) = &self.host else { return Ok(None) };
        let plan: NodePlan = serde_json::from_value(self.call(reqwest::Method::GET, PLAN_PATH, None).await?)
            .map_err(Error::UnreadablePlan)?;
        if plan.generation == 0 {
            return Ok(None);
        }
        let generation = plan.generation;
        // `ip`, `nft`, `nvidia-smi` and the container runtime block: off the async threads.
        let node = host.clone();
        let (outcome, underlay_address) =
            tokio::task::spawn_blocking(move || (node.apply(&plan), node.underlay_address()))
                .await
                .map_err(|source| Error::Stopped { what: "applying the plan", source })?;
        let report = match outcome {
            Ok(workloads) => PlanReport { generation, error: None, underlay_address, workloads },
            Err(error) => {
                tracing::warn!(generation, %error, "cannot apply the node's plan");
                PlanReport { generation, error: Some(error.to_string()), underlay_address, workloads: Vec::new() }
            }
        };
        let body = serde_json::to_vec(&report).map_err(|source| Error::Encode { what: "the plan report", source })?;
        self.call(reqwest::Method::POST, PLAN_PATH, Some(body)).await?;
        Ok(Some(generation))
    }

    /// Reads the GPUs and posts one report; the portal's answer (which GPUs changed
    /// health) or why it failed.
    pub async fn report_once(&self) -> Result<serde_json::Value, Error> {
        // NVML calls block, at times for long on a sick GPU: off the async threads.
        let probe = self.probe.clone();
        let mut report = tokio::task::spawn_blocking(move || node_report(probe.as_ref()))
            .await
            .map_err(|source| Error::Stopped { what: "reading the GPUs", source })??;
        // Each report's readings stand for the time until the next one.
        report.period_s = Some(self.interval.as_secs_f64());
        let body = serde_json::to_vec(&report).map_err(|source| Error::Encode { what: "the report", source })?;
        self.call(reqwest::Method::POST, REPORT_PATH, Some(body)).await
    }

    /// Reports every interval (and syncs the node's plan every plan interval) until `stop`
    /// completes; a failed report is logged and retried with backoff.
    pub async fn run(&self, stop: impl Future<Output = ()>) {
        tokio::pin!(stop);
        let mut failures = 0u32;
        let mut next_report = tokio::time::Instant::now();
        let mut next_plan = tokio::time::Instant::now();
        let mut last_generation = None;
        loop {
            let now = tokio::time::Instant::now();
            if now >= next_report {
                next_report = now
                    + match self.report_once().await {
                        Ok(answer) => {
                            failures = 0;
                            let gpus = answer["gpus"].as_u64().unwrap_or_default();
                            tracing::info!(node = %answer["node"].as_str().unwrap_or_default(), gpus, "report accepted");
                            for change in answer["changes"].as_array().into_iter().flatten() {
                                tracing::warn!(change = %change.as_str().unwrap_or_default(), "GPU health changed");
                            }
                            self.interval
                        }
                        Err(error) => {
                            failures = failures.saturating_add(1);
                            let wait = retry_delay(failures);
                            tracing::warn!(%error, failures, retry_in = ?wait, "report failed");
                            wait
                        }
                    };
            }
            if let Some((_, plan_interval)) = &self.host
                && now >= next_plan
            {
                match self.sync_plan().await {
                    Ok(generation) if generation != last_generation => {
                        tracing::info!(?generation, "node plan synced");
                        last_generation = generation;
                    }
                    Ok(_) => {}
                    Err(error) => tracing::warn!(%error, "node plan sync failed"),
                }
                next_plan = tokio::time::Instant::now() + *plan_interval;
            }
            let wake = match &self.host {
                Some(_) => next_report.min(next_plan),
                None => next_report,
            };
            tokio::select! {
                () = &mut stop => return,
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_nvml_the_agent_says_so_and_reports_zero_gpus() {
        let (probe, message) = probe_or_none::<NoGpus>(Err(NvmlError::LibraryNotFound));
        assert_eq!(
            message.as_deref(),
            Some("NVML is not available on this machine (libnvidia-ml.so not found): reporting zero GPUs")
        );
        assert_eq!(node_report(probe.as_ref()).expect("report").gpus, []);
        let (_, message) = probe_or_none::<NoGpus>(Err(NvmlError::DriverNotLoaded));
        assert!(message.is_some_and(|m| m.starts_with("NVML is not available on this machine (")));
    }

    /// The real start-up path: on a machine without the NVIDIA driver (every CI machine
    /// so far) NVML fails to load and the agent carries on with zero GPUs.
    #[test]
    fn on_a_machine_without_the_driver_nvml_reports_zero_gpus() {
        let (probe, message) = open_probe();
        if message.is_some() {
            assert_eq!(
                message.as_deref(),
                Some("NVML is not available on this machine (libnvidia-ml.so not found): reporting zero GPUs")
            );
            assert_eq!(node_report(probe.as_ref()).expect("report").gpus, []);
        }
    }

    #[test]
    fn retries_back_off_to_five_minutes() {
        let waits: Vec<u64> = (1..=10).map(|n| retry_delay(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]);
        assert_eq!(retry_delay(u32::MAX), MAX_RETRY);
    }
}
