//! The simulated backend: an in-process fleet with realistic step delays and faults that
//! can be injected, so `berth serve` works on a laptop and tests can break things.
//!
//! What it runs is real enough to use: a notebook or an inference endpoint is a small HTTP
//! server on loopback (started by the start step, stopped by the stop step) that Berth's
//! proxy reaches like any other upstream, and a training job writes log lines over time
//! and ends with an exit status. See [`served`] for what those servers answer.

mod checks;
mod served;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_domain::catalog::Offering;
use berth_domain::lifecycle::Step;
use berth_domain::node_checks::{CheckKind, CheckLevel};
use berth_domain::telemetry::{self, GpuReading};
use rand::Rng;

use super::{
    Backend, BackendError, CheckFuture, CheckedNode, Connection, JobLogs, JobLogsFuture, JobStatus, MoveFuture,
    OwnedFuture, OwnedObject, PlacedUnit, ReadingsFuture, RemoveFuture, ScaleFuture, StepFuture, StepOutput,
    StoredVolume, Upstream, UpstreamFuture, UseFuture, VolumeMount, Workload, workload_secret,
};
use crate::lock;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// The step reports an error.
    Fail,
    /// The step never returns (the reconciler's step timeout must catch it).
    Hang,
    /// The answer is lost: the step reports an error, yet what it did lands a moment
    /// later ([`LATE_BY`] after its usual delay), as with a real backend that timed out
    /// after all. What lands after the environment's teardown is an orphan for the sweep.
    Late,
}

/// How much later than its usual delay a step with a lost answer takes effect.
pub const LATE_BY: Duration = Duration::from_millis(250);

/// `STEP=fail`, `STEP=hang`, `STEP=late`, optionally with a probability: `start_workload=fail@0.2`.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRule {
    pub step: Step,
    pub fault: Fault,
    pub probability: f64,
}

impl FromStr for FaultRule {
    type Err = String;

    fn from_str(s: &str) -> Result<FaultRule, String> {
        let (step, rest) =
            s.split_once('=').ok_or_else(|| format!("fault \"{s}\" should look like STEP=fail or STEP=hang@0.5"))?;
        let step = Step::parse(step.trim())
            .ok_or_else(|| format!("unknown step \"{step}\" (steps: {})", Step::ALL.map(Step::as_str).join(", ")))?;
        let (fault, probability) = match rest.split_once('@') {
            Some((f, p)) => (
                f,
                p.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=1.0).contains(p))
                    .ok_or_else(|| format!("probability in \"{s}\" must be between 0 and 1"))?,
            ),
            None => (rest, 1.0),
        };
        let fault = match fault.trim() {
            "fail" => Fault::Fail,
            "hang" => Fault::Hang,
            "late" => Fault::Late,
            other => return Err(format!("unknown fault \"{other}\" (fail, hang or late)")),
        };
        Ok(FaultRule { step, fault, probability })
    }
}

#[derive(Debug, Clone)]
pub struct SimulatedConfig {
    /// Multiplies the built-in step delays: 1.0 is realistic, 0.0 instant.
    pub speed: f64,
    pub faults: Vec<FaultRule>,
    /// Where volumes are kept, a directory each (`berth-vol-<id>`); `None` for a fresh
    /// folder under the system's temporary directory (tests).
    pub volumes_dir: Option<PathBuf>,
}

impl Default for SimulatedConfig {
    fn default() -> SimulatedConfig {
        SimulatedConfig { speed: 1.0, faults: Vec::new(), volumes_dir: None }
    }
}

/// What exists in the simulated world; it outlives a reconciler crash, like a real fleet.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct World {
    pub partitions: HashSet<String>,
    pub images: HashSet<String>,
    pub workloads: HashSet<String>,
    pub endpoints: HashMap<String, Connection>,
    /// Notebooks' and inference endpoints' servers: environment -> loopback port.
    pub serving: BTreeMap<String, u16>,
    /// Training jobs: their log so far and, once they ended, their exit status.
    pub jobs: HashMap<String, SimulatedJob>,
    /// Inference endpoints' replica counts, as last scaled.
    pub replicas: HashMap<String, u32>,
}

/// A simulated training job's output.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SimulatedJob {
    pub lines: Vec<String>,
    pub exit_code: Option<i32>,
}

impl World {
    /// Everything of a stopped workload: its server's port, job output and replicas.
    fn forget_workload(&mut self, id: &str) {
        self.workloads.remove(id);
        self.serving.remove(id);
        self.jobs.remove(id);
        self.replicas.remove(id);
    }

    /// Everything that belongs to an environment (the image cache belongs to the nodes).
    pub fn owned(&self) -> Vec<OwnedObject> {
        let object = |kind, id: &String| OwnedObject::for_environments(kind, id.clone(), vec![id.clone()]);
        let mut owned: Vec<OwnedObject> = self
            .partitions
            .iter()
            .map(|id| object(PARTITION, id))
            .chain(self.workloads.iter().map(|id| object(WORKLOAD, id)))
            .chain(self.endpoints.keys().map(|id| object(ENDPOINT, id)))
            .collect();
        owned.sort_by(|a, b| (a.kind, &a.name).cmp(&(b.kind, &b.name)));
        owned
    }

    /// Objects an environment left behind.
    pub fn objects_of(&self, environment_id: &str) -> usize {
        usize::from(self.partitions.contains(environment_id))
            + usize::from(self.workloads.contains(environment_id))
            + usize::from(self.endpoints.contains_key(environment_id))
            + usize::from(self.serving.contains_key(environment_id))
            + usize::from(self.jobs.contains_key(environment_id))
    }
}

/// A running server or job, with what stops it.
struct Running {
    stop: tokio::sync::watch::Sender<bool>,
    /// What it runs and where, for its GPU readings.
    offering: Offering,
    shape: berth_domain::placement::Shape,
    units: Vec<PlacedUnit>,
    /// The workload's own credential (Jupyter token, model server key); the proxy sends it.
    credential: String,
    replicas: Arc<std::sync::atomic::AtomicU32>,
}

/// The kinds of simulated objects, named by the environment they belong to.
pub const PARTITION: &str = "partition";
pub const WORKLOAD: &str = "workload";
pub const ENDPOINT: &str = "endpoint";

pub struct Simulated {
    config: Mutex<SimulatedConfig>,
    world: Arc<Mutex<World>>,
    running: Mutex<HashMap<String, Running>>,
    node_faults: Mutex<checks::NodeFaults>,
    /// Real directories, so that files outlive the workloads that wrote them.
    volumes_dir: PathBuf,
    /// Environments told to be idle or busy, overriding their offering's usual activity.
    activity: Mutex<HashMap<String, Activity>>,
    /// When the GPUs were last read: a reading stands for the time since.
    last_read: Mutex<Option<std::time::Instant>>,
}

/// How busy a simulated environment's GPUs are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    /// Under 3% (a notebook nobody works in).
    Idle,
    /// 20 to 60% (an endpoint serving requests now and then).
    Moderate,
    /// 85 to 99% (training).
    Busy,
}

impl Activity {
    /// What an offering's GPUs usually do: notebooks mostly sit idle, training keeps its
    /// GPUs busy, endpoints are in between.
    pub fn usual(offering: Offering) -> Activity {
        match offering {
            Offering::Notebook => Activity::Idle,
            Offering::InferenceEndpoint => Activity::Moderate,
            Offering::TrainingJob | Offering::DedicatedCluster => Activity::Busy,
        }
    }

    fn utilization(self, rng: &mut impl Rng) -> f64 {
        match self {
            Activity::Idle => rng.random_range(0.0..3.0),
            Activity::Moderate => rng.random_range(20.0..60.0),
            Activity::Busy => rng.random_range(85.0..99.0),
        }
    }
}

impl Simulated {
    pub fn new(config: SimulatedConfig) -> Simulated {
        let volumes_dir = config
            .volumes_dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join(format!("berth-simulated-volumes-{}", uuid::Uuid::new_v4())));
        Simulated {
            volumes_dir,
            config: Mutex::new(config),
            world: Arc::new(Mutex::new(World::default())),
            running: Mutex::new(HashMap::new()),
            node_faults: Mutex::new(checks::NodeFaults::default()),
            activity: Mutex::new(HashMap::new()),
            last_read: Mutex::new(None),
        }
    }

    /// Makes an environment's GPUs idle or busy from now on, whatever its offering.
    pub fn set_activity(&self, environment_id: &str, activity: Activity) {
        lock(&self.activity).insert(environment_id.to_owned(), activity);
    }

    /// One reading per GPU or MIG slice of every running workload, standing for the time
    /// since the last call (at most [`telemetry::MAX_PERIOD_S`]). Power and temperature
    /// follow utilization, as on a real GPU; memory is what the offering typically holds.
    pub fn read_gpus(&self) -> Vec<GpuReading> {
        let now = std::time::Instant::now();
        let period_s = lock(&self.last_read)
            .replace(now)
            .map_or(30.0, |last| now.duration_since(last).as_secs_f64())
            .clamp(0.1, telemetry::MAX_PERIOD_S);
        let at_ms = crate::now_ms();
        let activity = lock(&self.activity).clone();
        let running = lock(&self.running);
        let mut rng = rand::rng();
        let mut readings = Vec::new();
        for (id, r) in running.iter() {
            let doing = activity.get(id).copied().unwrap_or(Activity::usual(r.offering));
            let model = r.shape.model();
            for unit in r.units.iter().filter(|u| &u.environment_id == id) {
                let utilization_pct = doing.utilization(&mut rng);
                let total_mib = f64::from(model.memory_gb()) * 1024.0 * unit.slice_size as f64 / 8.0;
                let held = match doing {
                    Activity::Idle => rng.random_range(0.02..0.06),
                    Activity::Moderate => rng.random_range(0.4..0.6),
                    Activity::Busy => rng.random_range(0.6..0.9),
                };
                readings.push(GpuReading {
                    node: unit.node.clone(),
                    gpu_index: unit.gpu_index,
                    slice_start: unit.mig_profile.as_ref().map(|_| unit.slice_start),
                    environment: Some(id.clone()),
                    at_ms,
                    period_s,
                    utilization_pct,
                    memory_used_mib: (total_mib * held).round(),
                    memory_total_mib: total_mib,
                    power_w: Some(70.0 + 6.3 * utilization_pct * unit.slice_size as f64 / 8.0),
                    temperature_c: Some((31.0 + 0.4 * utilization_pct).round()),
                });
            }
        }
        readings
    }

    /// Makes `kind` fail on `node` until a repair fixes the node.
    pub fn fail_check(&self, node: &str, kind: CheckKind) {
        lock(&self.node_faults).fail(node, kind);
    }

    /// Makes `kind` on `node` fail to run at all (the backend answers an error, as for a
    /// check whose Job cannot start), rather than run and find a fault.
    pub fn make_check_unrunnable(&self, node: &str, kind: CheckKind) {
        lock(&self.node_faults).make_unrunnable(node, kind);
    }

    /// Makes repairs of `node` fix nothing: its failures stay through every tier.
    pub fn make_stubborn(&self, node: &str) {
        lock(&self.node_faults).make_stubborn(node);
    }

    /// The repair commands run on `node`, in order.
    pub fn repairs_of(&self, node: &str) -> Vec<String> {
        lock(&self.node_faults).repairs.get(node).cloned().unwrap_or_default()
    }

    /// How slow the fleet is (0 instant; tests slow it down to catch a step midway).
    pub fn set_speed(&self, speed: f64) {
        lock(&self.config).speed = speed;
    }

    /// Replaces the fault rules (tests change them between phases of a scenario).
    pub fn set_faults(&self, faults: Vec<FaultRule>) {
        lock(&self.config).faults = faults;
    }

    pub fn world(&self) -> World {
        lock(&self.world).clone()
    }

    /// The directory that holds volume `volume_id`.
    pub fn volume_dir(&self, volume_id: i64) -> PathBuf {
        self.volumes_dir.join(crate::capacity::volumes::storage_name(volume_id))
    }

    /// The workload's volumes as directories, made where missing, with their mount paths.
    fn mount_volumes(&self, w: &Workload) -> Result<Vec<(String, PathBuf)>, BackendError> {
        w.volumes
            .iter()
            .map(|v: &VolumeMount| {
                let dir = self.volume_dir(v.volume_id);
                std::fs::create_dir_all(&dir).map_err(|e| {
                    tracing::error!(volume = v.volume_id, error = %e, dir = %dir.display(), "cannot make a volume's directory");
                    BackendError(format!("the simulated node could not make volume {}", v.name))
                })?;
                Ok((v.mount_path.clone(), dir))
            })
            .collect()
    }

    fn delay(&self, step: Step) -> Duration {
        let base_ms = match step {
            // Its checks take their own time (see `simulated/checks.rs`).
            Step::AcceptanceChecks => 0.0,
            Step::ConfigurePartition => 4000.0,
            Step::PullImage => 3500.0,
            Step::StartWorkload => 2000.0,
            Step::WaitHealthy => 2500.0,
            Step::ExposeEndpoint => 800.0,
            Step::RemoveEndpoint => 500.0,
            Step::StopWorkload => 1500.0,
            Step::ClearPartition => 2000.0,
            Step::ReleaseCapacity => 200.0,
        };
        let speed = lock(&self.config).speed;
        let jitter = rand::rng().random_range(0.75..1.25);
        Duration::from_secs_f64((base_ms * jitter * speed / 1000.0).max(0.0))
    }

    fn fault_for(&self, step: Step) -> Option<Fault> {
        let config = lock(&self.config);
        let mut rng = rand::rng();
        config.faults.iter().find(|r| r.step == step && rng.random_bool(r.probability)).map(|r| r.fault)
    }

    fn apply(&self, w: &Workload, step: Step) -> Result<StepOutput, BackendError> {
        // The servers and jobs a step starts or stops first, then what the world records.
        // Locks in one order everywhere: `running`, then `world`.
        let credential = lock(&self.running).get(&w.environment_id).map(|r| r.credential.clone());
        let started = match step {
            Step::StartWorkload => self.start(w)?,
            Step::StopWorkload => {
                self.stop(&w.environment_id);
                None
            }
            _ => None,
        };
        record(&mut lock(&self.world), w, step, started, credential)
    }

    /// Stops an environment's server or job, if one runs.
    fn stop(&self, environment_id: &str) {
        if let Some(running) = lock(&self.running).remove(environment_id) {
            let _ = running.stop.send(true);
        }
    }
}

/// What a step leaves in the simulated world; `started` says what its start step started.
/// A step whose answer was lost lands here alone, later, starting nothing.
fn record(
    world: &mut World,
    w: &Workload,
    step: Step,
    started: Option<String>,
    credential: Option<String>,
) -> Result<StepOutput, BackendError> {
    let id = w.environment_id.clone();
    let mut output = StepOutput::default();
    match step {
        // The reconciler runs it through the node checks; nothing of the world's.
        Step::AcceptanceChecks => {}
        Step::ConfigurePartition => {
            world.partitions.insert(id);
            output.detail = Some(describe_units(w));
        }
        Step::PullImage => {
            if let Some(image) = &w.image {
                output.detail = Some(if world.images.insert(image.clone()) {
                    format!("pulled {image}")
                } else {
                    format!("{image} already cached")
                });
            }
        }
        Step::StartWorkload => {
            world.workloads.insert(id);
            output.detail = Some(match started {
                Some(more) => format!("{}; {more}", describe_units(w)),
                None => describe_units(w),
            });
        }
        Step::WaitHealthy => {
            if !world.workloads.contains(&id) {
                return Err(BackendError("the workload is not running".into()));
            }
        }
        Step::ExposeEndpoint => {
            let port = world.serving.get(&id).copied();
            let connection = world.endpoints.entry(id).or_insert_with(|| connection_for(w, port, credential)).clone();
            output.connection = Some(connection);
        }
        Step::RemoveEndpoint => {
            world.endpoints.remove(&id);
        }
        Step::StopWorkload => world.forget_workload(&id),
        Step::ClearPartition => {
            world.partitions.remove(&id);
        }
        Step::ReleaseCapacity => {}
    }
    Ok(output)
}

impl Simulated {
    /// Starts what the workload runs, unless it runs already: a server for a notebook or
    /// an endpoint, the job for a training job. Says what it started.
    fn start(&self, w: &Workload) -> Result<Option<String>, BackendError> {
        let id = &w.environment_id;
        // Held throughout, so two callers never start two servers for one environment.
        let mut running = lock(&self.running);
        if running.contains_key(id) {
            return Ok(None);
        }
        let mounts = self.mount_volumes(w)?;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let credential = workload_secret();
        let replicas = Arc::new(std::sync::atomic::AtomicU32::new(w.replicas()));
        let detail = match w.offering {
            Offering::Notebook | Offering::InferenceEndpoint => {
                let server = served::Server {
                    offering: w.offering,
                    name: w.name.clone(),
                    image: w.image.clone().unwrap_or_default(),
                    model: w.serving.model.clone(),
                    units: describe_units(w),
                    credential: credential.clone(),
                    replicas: replicas.clone(),
                    stopped,
                    mounts,
                };
                let port = served::start(server).map_err(|e| {
                    tracing::error!(environment = %id, error = %e, "cannot start a simulated server");
                    BackendError("the simulated node could not start the workload's server".into())
                })?;
                let mut world = lock(&self.world);
                world.serving.insert(id.clone(), port);
                world.replicas.insert(id.clone(), w.replicas());
                Some(format!("serving on 127.0.0.1:{port}"))
            }
            Offering::TrainingJob => {
                lock(&self.world).jobs.insert(id.clone(), SimulatedJob::default());
                let speed = lock(&self.config).speed;
                tokio::spawn(served::run_job(self.world.clone(), w.clone(), speed, stopped));
                Some("job started".to_owned())
            }
            Offering::DedicatedCluster => None,
        };
        running.insert(
            id.clone(),
            Running { stop, offering: w.offering, shape: w.shape, units: w.units.clone(), credential, replicas },
        );
        Ok(detail)
    }

    fn upstream_of(&self, w: &Workload) -> Result<Upstream, BackendError> {
        if !matches!(w.offering, Offering::Notebook | Offering::InferenceEndpoint) {
            return Err(BackendError(format!("a {} serves nothing through Berth", w.offering.title())));
        }
        // The simulated fleet lives in Berth's process: after a restart the first request
        // starts the server again, as if the node had kept it running.
        self.start(w)?;
        let port = lock(&self.world)
            .serving
            .get(&w.environment_id)
            .copied()
            .ok_or_else(|| BackendError("the simulated server is not running".into()))?;
        let credential = lock(&self.running).get(&w.environment_id).map(|r| r.credential.clone()).unwrap_or_default();
        Ok(Upstream::with_credential(w.offering, format!("http://127.0.0.1:{port}"), &credential))
    }

    fn job_logs_of(&self, w: &Workload, tail: usize) -> Result<JobLogs, BackendError> {
        let world = lock(&self.world);
        let Some(job) = world.jobs.get(&w.environment_id) else {
            return Ok(JobLogs {
                status: JobStatus::Failed {
                    exit_code: None,
                    reason: "the simulated job ended when Berth restarted (the simulated fleet lives in its process)"
                        .into(),
                },
                lines: Vec::new(),
            });
        };
        let status = match job.exit_code {
            None => JobStatus::Running,
            Some(0) => JobStatus::Succeeded,
            Some(code) => JobStatus::Failed { exit_code: Some(code), reason: format!("exited with code {code}") },
        };
        let skip = job.lines.len().saturating_sub(tail);
        Ok(JobLogs { status, lines: job.lines[skip..].to_vec() })
    }

    fn scale_to(&self, w: &Workload) -> Result<(), BackendError> {
        if w.offering != Offering::InferenceEndpoint {
            return Err(BackendError("only inference endpoints have replicas".into()));
        }
        self.start(w)?;
        let replicas = w.replicas();
        if let Some(running) = lock(&self.running).get_mut(&w.environment_id) {
            running.replicas.store(replicas, std::sync::atomic::Ordering::Relaxed);
            running.units = w.units.clone();
        }
        lock(&self.world).replicas.insert(w.environment_id.clone(), replicas);
        Ok(())
    }
}

impl Backend for Simulated {
    fn name(&self) -> &'static str {
        "simulated"
    }

    fn gpu_readings(&self) -> ReadingsFuture<'_> {
        Box::pin(async move { Ok(self.read_gpus()) })
    }

    fn runs_node_checks(&self) -> bool {
        true
    }

    fn run_check<'a>(&'a self, node: &'a CheckedNode, kind: CheckKind, level: CheckLevel) -> CheckFuture<'a> {
        let (fail, runs) = {
            let faults = lock(&self.node_faults);
            (faults.fails(&node.name, kind), faults.runs(&node.name, kind))
        };
        // A check takes a moment of its own, as the fleet's speed scales it.
        let takes = Duration::from_secs_f64(0.6 * lock(&self.config).speed);
        Box::pin(async move {
            tokio::time::sleep(takes).await;
            if !runs {
                return Err(BackendError(format!("the check's pod did not run on {}: OutOfnvidia.com/gpu", node.name)));
            }
            Ok(checks::output(node, kind, level, fail))
        })
    }

    fn runs_repair_commands(&self) -> bool {
        true
    }

    fn run_repair<'a>(&'a self, node: &'a CheckedNode, command: &'a str) -> CheckFuture<'a> {
        lock(&self.node_faults).repair(&node.name, command);
        Box::pin(async move { Ok(format!("simulated: ran `{command}` for {}", node.name)) })
    }

    fn resets_gpus(&self) -> bool {
        true
    }

    /// Recorded with the repairs (`repairs_of`), answered as `nvidia-smi -r` words it.
    fn reset_gpu<'a>(&'a self, node: &'a CheckedNode, gpu: u32) -> CheckFuture<'a> {
        lock(&self.node_faults).repairs.entry(node.name.clone()).or_default().push(format!("nvidia-smi -i {gpu} -r"));
        Box::pin(
            async move { Ok(format!("GPU 00000000:{:02X}:00.0 was successfully reset.\nAll done.\n", 0x18 + gpu)) },
        )
    }

    fn run<'a>(&'a self, workload: &'a Workload, step: Step) -> StepFuture<'a> {
        Box::pin(async move {
            let delay = self.delay(step);
            tokio::time::sleep(delay).await;
            match self.fault_for(step) {
                Some(Fault::Fail) => Err(BackendError(format!("simulated fault in {}", step.as_str()))),
                Some(Fault::Hang) => std::future::pending().await,
                Some(Fault::Late) => {
                    let (world, workload) = (self.world.clone(), workload.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep(delay + LATE_BY).await;
                        let _ = record(&mut lock(&world), &workload, step, None, None);
                    });
                    Err(BackendError(format!("simulated lost answer from {}", step.as_str())))
                }
                None => self.apply(workload, step),
            }
        })
    }

    fn owned_objects(&self) -> OwnedFuture<'_> {
        Box::pin(async move { Ok(lock(&self.world).owned()) })
    }

    fn volume_location(&self, _workload: &Workload, volume: &VolumeMount) -> String {
        self.volume_dir(volume.volume_id).display().to_string()
    }

    fn remove_volume<'a>(&'a self, volume: &'a StoredVolume) -> RemoveFuture<'a> {
        Box::pin(async move {
            let dir = self.volume_dir(volume.volume_id);
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
                Err(e) => {
                    tracing::error!(volume = volume.volume_id, error = %e, "cannot remove a volume's directory");
                    Err(BackendError(format!("could not remove volume {}", volume.volume_id)))
                }
            }
        })
    }

    fn volume_use<'a>(&'a self, volume: &'a StoredVolume) -> UseFuture<'a> {
        let dir = self.volume_dir(volume.volume_id);
        Box::pin(async move { tokio::task::spawn_blocking(move || super::bytes_under(&dir)).await.ok().flatten() })
    }

    fn remove_owned<'a>(&'a self, object: &'a OwnedObject) -> RemoveFuture<'a> {
        Box::pin(async move {
            if object.kind == WORKLOAD {
                self.stop(&object.name);
            }
            let mut world = lock(&self.world);
            let removed = match object.kind {
                PARTITION => world.partitions.remove(&object.name),
                WORKLOAD => {
                    let was = world.workloads.contains(&object.name);
                    world.forget_workload(&object.name);
                    was
                }
                ENDPOINT => world.endpoints.remove(&object.name).is_some(),
                other => return Err(BackendError(format!("the simulated backend has no {other} objects"))),
            };
            Ok(removed)
        })
    }

    fn upstream<'a>(&'a self, workload: &'a Workload) -> UpstreamFuture<'a> {
        Box::pin(async move { self.upstream_of(workload) })
    }

    fn job_logs<'a>(&'a self, workload: &'a Workload, tail: usize) -> JobLogsFuture<'a> {
        Box::pin(async move { self.job_logs_of(workload, tail) })
    }

    fn moves_clusters(&self) -> bool {
        true
    }

    fn move_cluster<'a>(&'a self, workload: &'a Workload, dropped: &'a [PlacedUnit]) -> MoveFuture<'a> {
        let _ = dropped; // nothing of the simulated cluster runs on a unit but its readings
        Box::pin(async move {
            // As long as starting it took: the new node is handed over with the tenant's
            // network and accounts.
            tokio::time::sleep(self.delay(Step::StartWorkload)).await;
            if let Some(Fault::Fail) = self.fault_for(Step::StartWorkload) {
                return Err(BackendError("simulated failure moving the cluster".into()));
            }
            if let Some(running) = lock(&self.running).get_mut(&workload.environment_id) {
                running.units = workload.units.clone();
            }
            Ok(connection_for(workload, None, None))
        })
    }

    fn scale<'a>(&'a self, workload: &'a Workload, dropped: &'a [PlacedUnit]) -> ScaleFuture<'a> {
        let _ = dropped; // the simulated replicas share one server; nothing runs on the units
        Box::pin(async move {
            // As long as exposing an endpoint takes: a rollout of new pods.
            tokio::time::sleep(self.delay(Step::ExposeEndpoint)).await;
            self.scale_to(workload)
        })
    }
}

fn describe_units(w: &Workload) -> String {
    let units: Vec<String> = w
        .units
        .iter()
        .map(|u| match &u.mig_profile {
            Some(p) => format!("{}/gpu{} {p}@{}", u.node, u.gpu_index, u.slice_start),
            None if u.slice_size < 8 => format!("{}/gpu{} share@{}", u.node, u.gpu_index, u.slice_start),
            None => format!("{}/gpu{}", u.node, u.gpu_index),
        })
        .collect();
    units.join(", ")
}

/// The workload's own address on the simulated node (owners reach notebooks and endpoints
/// through Berth's proxy instead; this is what the proxy talks to).
fn connection_for(w: &Workload, port: Option<u16>, credential: Option<String>) -> Connection {
    let short = w.environment_id.get(..8).unwrap_or(&w.environment_id);
    let site = w.units.first().map(|u| u.site.as_str()).unwrap_or("site");
    let host = format!("{}-{short}.{site}.berth.example", w.name);
    let local = format!("127.0.0.1:{}", port.unwrap_or_default());
    match w.offering {
        Offering::Notebook => Connection {
            url: format!("http://{local}/lab"),
            secret_label: Some("Token".into()),
            secret: credential,
            example: format!("curl -H \"Authorization: token <token>\" http://{local}/api/status"),
        },
        Offering::TrainingJob => Connection {
            url: format!("https://{host}/logs"),
            secret_label: None,
            secret: None,
            example: "its log and exit status are on the environment page".to_owned(),
        },
        Offering::InferenceEndpoint => Connection {
            url: format!("http://{local}/v1"),
            secret_label: Some("Upstream key".into()),
            secret: credential,
            example: format!("curl -H \"Authorization: Bearer <upstream key>\" http://{local}/v1/models"),
        },
        Offering::DedicatedCluster => {
            let node = w.units.first().map(|u| u.node.as_str()).unwrap_or("node");
            Connection {
                url: format!("ssh://{node}.{site}.berth.example"),
                secret_label: None,
                secret: None,
                example: format!("ssh ubuntu@{node}.{site}.berth.example"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_rules_parse_and_explain_mistakes() {
        assert_eq!(
            "start_workload=fail".parse::<FaultRule>(),
            Ok(FaultRule { step: Step::StartWorkload, fault: Fault::Fail, probability: 1.0 })
        );
        assert_eq!("pull_image=hang@0.5".parse::<FaultRule>().map(|r| r.probability), Ok(0.5));
        assert!("boot=fail".parse::<FaultRule>().unwrap_err().contains("unknown step"));
        assert!("pull_image=explode".parse::<FaultRule>().unwrap_err().contains("unknown fault"));
        assert_eq!("start_workload=late@0.1".parse::<FaultRule>().map(|r| r.fault), Ok(Fault::Late));
        assert!("pull_image=fail@2".parse::<FaultRule>().unwrap_err().contains("between 0 and 1"));
    }
}
