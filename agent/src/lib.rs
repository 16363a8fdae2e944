//! `berth agent`: runs on a bare-metal GPU node, reads its GPUs through NVML and reports
//! them to the portal with the node's token, again every interval. With a node host
//! (`--backend baremetal` portals), it also fetches its node's plan, applies it and reports
//! the generation it applied or why it could not.
//!
//! NVML sits behind [`GpuProbe`] so tests can bring a fake node. `nvml-wrapper` loads
//! `libnvidia-ml.so` at run time: on a machine without it the agent says so once and
//! reports zero GPUs, which the portal records as every GPU of the node missing.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_domain::agent::{GpuReport, MAX_XIDS_PER_GPU, NodeReport};
use berth_domain::node_checks::AgentOrder;
use berth_domain::node_plan::{NodePlan, PlanReport};
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;

mod error;
pub mod node;

pub use crate::error::{Error, NodeError};
use crate::node::NodeHost;
use crate::node::commands::CommandRunner;

/// Where the agent posts its reports, under the portal's URL.
pub const REPORT_PATH: &str = "/api/v1/agent/report";
/// Where the agent fetches its node's plan and reports on it.
pub const PLAN_PATH: &str = "/api/v1/agent/plan";
/// Where a bare-metal node's agent takes the checks ordered on its node, and answers each
/// at `CHECKS_PATH/{id}`.
pub const CHECKS_PATH: &str = "/api/v1/agent/checks";

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

/// The XID errors NVML raised since the last report, per GPU index: the watcher thread
/// records them as they come, each report takes them. A GPU in trouble can raise thousands
/// between two reports; the latest [`MAX_XIDS_PER_GPU`] are kept.
#[derive(Debug, Default)]
pub struct XidLog {
    raised: Mutex<BTreeMap<i64, VecDeque<u32>>>,
}

impl XidLog {
    pub fn record(&self, gpu: i64, code: u32) {
        let mut raised = self.raised.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let codes = raised.entry(gpu).or_default();
        if codes.len() == MAX_XIDS_PER_GPU {
            codes.pop_front();
        }
        codes.push_back(code);
    }

    /// GPU `gpu`'s errors since the last take, oldest first.
    pub fn take(&self, gpu: i64) -> Vec<u32> {
        let mut raised = self.raised.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        raised.remove(&gpu).map(Vec::from).unwrap_or_default()
    }
}

/// The node's GPUs through NVML. NVML lives as long as the agent (the XID watcher thread
/// borrows it), so it is leaked once at start-up rather than torn down.
pub struct NvmlProbe {
    nvml: &'static Nvml,
    xids: Arc<XidLog>,
}

impl NvmlProbe {
    /// Opens NVML and starts the thread that listens for XID errors on every GPU that can
    /// raise them.
    pub fn open() -> Result<NvmlProbe, NvmlError> {
        let nvml: &'static Nvml = Box::leak(Box::new(Nvml::init()?));
        let xids = Arc::new(XidLog::default());
        let log = xids.clone();
        let started = std::thread::Builder::new().name("xid-watcher".into()).spawn(move || watch_xids(nvml, &log));
        if let Err(error) = started {
            tracing::warn!(%error, "cannot start the XID watcher: XID errors will not be reported");
        }
        Ok(NvmlProbe { nvml, xids })
    }
}

/// Waits for NVML's critical XID events on every GPU that supports them and logs each in
/// `log`, until NVML fails for good.
fn watch_xids(nvml: &'static Nvml, log: &XidLog) {
    let registered = (|| -> Result<_, nvml_wrapper::error::NvmlErrorWithSource> {
        let mut set = nvml.create_event_set()?;
        for index in 0..nvml.device_count()? {
            let device = nvml.device_by_index(index)?;
            if device.supported_event_types().is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR)) {
                set = device.register_events(EventTypes::CRITICAL_XID_ERROR, set)?;
            }
        }
        Ok(set)
    })();
    let set = match registered {
        Ok(set) => set,
        Err(error) => {
            tracing::warn!(%error, "cannot listen for XID errors: they will not be reported");
            return;
        }
    };
    let mut failures = 0u32;
    loop {
        match set.wait(5_000) {
            Ok(event) => {
                failures = 0;
                let code = match event.event_data {
                    Some(XidError::Value(code)) => u32::try_from(code).unwrap_or(u32::MAX),
                    _ => continue,
                };
                match event.device.index() {
                    Ok(index) => {
                        tracing::warn!(gpu = index, xid = code, "XID error");
                        log.record(i64::from(index), code);
                    }
                    Err(error) => tracing::warn!(xid = code, %error, "XID error on a GPU NVML cannot name"),
                }
            }
            Err(NvmlError::Timeout) => failures = 0,
            // A GPU off the bus ends the wait with an error; the next report leaves that GPU
            // out, which the portal fails. Keep listening for the others, slowing down if
            // the errors repeat.
            Err(error) => {
                failures = failures.saturating_add(1);
                tracing::warn!(%error, failures, "waiting for XID errors failed");
                std::thread::sleep(retry_delay(failures));
            }
        }
    }
}

impl GpuProbe for NvmlProbe {
    fn gpus(&self) -> Result<Vec<GpuReport>, Error> {
        let count = self.nvml.device_count().map_err(Error::Nvml)?;
        let mut gpus = Vec::new();
        for index in 0..count {
            // A GPU NVML cannot open is left out; the portal fails it as not reported.
            match read_gpu(self.nvml, index) {
                Ok(gpu) => gpus.push(GpuReport { xid_errors: self.xids.take(gpu.index), ..gpu }),
                Err(error) => tracing::warn!(index, %error, "NVML cannot read this GPU; leaving it out of the report"),
            }
        }
        Ok(gpus)
    }
}

fn read_gpu(nvml: &Nvml, index: u32) -> Result<GpuReport, NvmlError> {
    let device = nvml.device_by_index(index)?;
    // An error: a GPU without MIG.
    let mig_mode = device.mig_mode();
    // Readings a GPU does not support (ECC off, no power sensor) are left empty.
    Ok(GpuReport {
        index: i64::from(index),
        uuid: device.uuid()?,
        name: device.name()?,
        memory_mib: i64::try_from(device.memory_info()?.total / (1024 * 1024)).unwrap_or(i64::MAX),
        mig_enabled: mig_mode.as_ref().is_ok_and(|mode| mode.current == 1),
        mig_pending: mig_mode.as_ref().ok().map(|mode| mode.pending == 1),
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
        xid_errors: Vec::new(),
        mig_readings: Vec::new(),
    })
}

/// NVML's probe, or none with the one line that tells the operator why.
pub fn open_probe() -> (Arc<dyn GpuProbe>, Option<String>) {
    probe_or_none(NvmlProbe::open())
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

/// Where the agent reads the MIG instances of GPUs in MIG mode (NVML gives no utilization
/// per instance): the node's own DCGM exporter page, with each instance placed by
/// `nvidia-smi mig -lgi`.
pub struct MigSource {
    /// `http://127.0.0.1:9400/metrics` where the exporter runs on the node, as DCGM's
    /// packages and the GPU Operator set it up.
    pub exporter_url: String,
    pub runner: Arc<dyn CommandRunner>,
}

/// How long the node's exporter may take to answer.
const EXPORTER_TIMEOUT: Duration = Duration::from_secs(5);

/// One node's agent: where it reports, with which token, how often, reading what.
pub struct Agent {
    client: reqwest::Client,
    portal: String,
    token: String,
    interval: Duration,
    probe: Arc<dyn GpuProbe>,
    /// The node the plans are applied to, and how often to ask for the plan.
    host: Option<(Arc<dyn NodeHost>, Duration)>,
    mig: Option<MigSource>,
    /// Whether the last MIG read failed: said once per run of failures, not every report.
    mig_failing: std::sync::atomic::AtomicBool,
    /// Whether this agent has taken its node's checks yet: its first ask takes again those
    /// an earlier run of it took and never answered.
    checks_taken: std::sync::atomic::AtomicBool,
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
        Ok(Agent {
            client,
            portal: portal.to_owned(),
            token: token.trim().to_owned(),
            interval,
            probe,
            host: None,
            mig: None,
            mig_failing: std::sync::atomic::AtomicBool::new(false),
            checks_taken: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The agent also applies the node plans of a `--backend baremetal` portal to `host`,
    /// asking for the plan every `plan_interval`.
    pub fn with_host(self, host: Arc<dyn NodeHost>, plan_interval: Duration) -> Agent {
        Agent { host: Some((host, plan_interval)), ..self }
    }

    /// The agent also reads the MIG instances of GPUs in MIG mode from `source`.
    pub fn with_mig_source(self, source: MigSource) -> Agent {
        Agent { mig: Some(source), ..self }
    }

    /// The readings of the MIG instances on the node now, by GPU index.
    async fn read_mig(
        &self,
        source: &MigSource,
    ) -> Result<BTreeMap<i64, Vec<berth_domain::agent::MigReading>>, String> {
        let answer = self
            .client
            .get(&source.exporter_url)
            .timeout(EXPORTER_TIMEOUT)
            .send()
            .await
            .map_err(|e| format!("the DCGM exporter at {} did not answer: {e}", source.exporter_url))?;
        if !answer.status().is_success() {
            return Err(format!("the DCGM exporter at {} answered {}", source.exporter_url, answer.status()));
        }
        let page = answer.text().await.map_err(|e| format!("the DCGM exporter's page broke off: {e}"))?;
        let runner = source.runner.clone();
        let placements = tokio::task::spawn_blocking(move || node::mig::listed_instances(runner.as_ref()))
            .await
            .map_err(|e| format!("listing the GPU instances stopped: {e}"))?
            .map_err(|e| format!("cannot list the GPU instances: {e}"))?;
        let series = berth_domain::dcgm::parse_page(&page);
        Ok(berth_domain::dcgm::mig_readings(&series, |gpu, id| {
            placements
                .iter()
                .find(|p| i64::from(p.gpu) == gpu && i64::from(p.id) == id)
                .map(|p| i64::from(p.instance.start))
        }))
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
            let what = match path {
                REPORT_PATH => "the report",
                PLAN_PATH => "the plan",
                _ => "a check",
            };
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

    /// Takes the checks ordered on the node, runs them one after another and answers each;
    /// how many ran. A check's own failure is its answer; `Err` only when the portal could
    /// not be asked or told.
    pub async fn run_checks_once(&self) -> Result<usize, Error> {
        use std::sync::atomic::Ordering;
        let Some((host, _)) = &self.host else { return Ok(0) };
        let path = if self.checks_taken.load(Ordering::Relaxed) {
            CHECKS_PATH.to_owned()
        } else {
            format!("{CHECKS_PATH}?resume=true")
        };
        let orders: Vec<AgentOrder> = serde_json::from_value(self.call(reqwest::Method::GET, &path, None).await?)
            .map_err(Error::UnreadableChecks)?;
        self.checks_taken.store(true, Ordering::Relaxed);
        for order in &orders {
            tracing::info!(id = order.id, command = %order.task.command(), "running an order");
            let (node, ordered) = (host.clone(), order.clone());
            // Checks run for minutes (DCGM's long level for an hour): off the async threads.
            let answer = tokio::task::spawn_blocking(move || node.run_order(&ordered))
                .await
                .map_err(|source| Error::Stopped { what: "running a check", source })?;
            if let Some(error) = &answer.error {
                tracing::warn!(id = order.id, command = %order.task.command(), %error, "an order could not run");
            }
            let body =
                serde_json::to_vec(&answer).map_err(|source| Error::Encode { what: "a check's answer", source })?;
            self.call(reqwest::Method::POST, &format!("{CHECKS_PATH}/{}", order.id), Some(body)).await?;
        }
        Ok(orders.len())
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
        if let Some(source) = &self.mig
            && report.gpus.iter().any(|gpu| gpu.mig_enabled)
        {
            use std::sync::atomic::Ordering;
            match self.read_mig(source).await {
                Ok(mut by_gpu) => {
                    self.mig_failing.store(false, Ordering::Relaxed);
                    for gpu in &mut report.gpus {
                        gpu.mig_readings = by_gpu.remove(&gpu.index).unwrap_or_default();
                    }
                }
                // The report goes without them: a gap in the instances' charts.
                Err(why) => {
                    if !self.mig_failing.swap(true, Ordering::Relaxed) {
                        tracing::warn!("MIG instances not read (their use is not reported until they are): {why}");
                    }
                }
            }
        }
        let body = serde_json::to_vec(&report).map_err(|source| Error::Encode { what: "the report", source })?;
        self.call(reqwest::Method::POST, REPORT_PATH, Some(body)).await
    }

    /// Reports every interval (and, on a bare-metal portal's node, syncs the node's plan and
    /// takes its checks every plan interval) until `stop` completes; a failed report is
    /// logged and retried with backoff. Checks run beside the reports: a long one does not
    /// hold them up.
    pub async fn run(&self, stop: impl Future<Output = ()>) {
        tokio::select! {
            () = stop => {}
            () = self.report_and_plan() => {}
            () = self.take_checks() => {}
        }
    }

    /// Runs the checks ordered on the node as they come (never, without a node to run them).
    async fn take_checks(&self) {
        let Some((_, plan_interval)) = &self.host else { return std::future::pending().await };
        loop {
            if let Err(error) = self.run_checks_once().await {
                tracing::warn!(%error, "taking or answering checks failed");
            }
            tokio::time::sleep(*plan_interval).await;
        }
    }

    async fn report_and_plan(&self) {
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
            tokio::time::sleep_until(wake).await;
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
    fn xids_are_taken_once_per_gpu_and_the_latest_kept() {
        let log = XidLog::default();
        log.record(3, 13);
        log.record(3, 79);
        log.record(0, 48);
        assert_eq!(log.take(3), [13, 79]);
        assert_eq!(log.take(3), Vec::<u32>::new());
        assert_eq!(log.take(0), [48]);
        for code in 0..(MAX_XIDS_PER_GPU as u32 + 5) {
            log.record(1, code);
        }
        let kept = log.take(1);
        assert_eq!(kept.len(), MAX_XIDS_PER_GPU);
        assert_eq!(kept.first(), Some(&5));
    }

    #[test]
    fn retries_back_off_to_five_minutes() {
        let waits: Vec<u64> = (1..=10).map(|n| retry_delay(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]);
        assert_eq!(retry_delay(u32::MAX), MAX_RETRY);
    }
}
