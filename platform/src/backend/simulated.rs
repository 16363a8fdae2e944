//! The simulated backend: an in-process fleet with realistic step delays and faults that
//! can be injected, so `berth serve` works on a laptop and tests can break things.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_domain::catalog::Offering;
use berth_domain::lifecycle::Step;
use rand::Rng;

use super::{
    Backend, BackendError, Connection, OwnedFuture, OwnedObject, RemoveFuture, StepFuture, StepOutput, Workload,
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
}

impl Default for SimulatedConfig {
    fn default() -> SimulatedConfig {
        SimulatedConfig { speed: 1.0, faults: Vec::new() }
    }
}

/// What exists in the simulated world; it outlives a reconciler crash, like a real fleet.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct World {
    pub partitions: HashSet<String>,
    pub images: HashSet<String>,
    pub workloads: HashSet<String>,
    pub endpoints: HashMap<String, Connection>,
}

impl World {
    /// Objects an environment left behind.
    pub fn objects_of(&self, environment_id: &str) -> usize {
        usize::from(self.partitions.contains(environment_id))
            + usize::from(self.workloads.contains(environment_id))
            + usize::from(self.endpoints.contains_key(environment_id))
    }

    /// Everything that belongs to an environment (the image cache belongs to the nodes).
    pub fn owned(&self) -> Vec<OwnedObject> {
        let object = |kind, id: &String| OwnedObject { kind, name: id.clone(), environments: vec![id.clone()] };
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
}

/// The kinds of simulated objects, named by the environment they belong to.
pub const PARTITION: &str = "partition";
pub const WORKLOAD: &str = "workload";
pub const ENDPOINT: &str = "endpoint";

pub struct Simulated {
    config: Mutex<SimulatedConfig>,
    /// Shared with steps whose answer was lost and that land later.
    world: Arc<Mutex<World>>,
}

impl Simulated {
    pub fn new(config: SimulatedConfig) -> Simulated {
        Simulated { config: Mutex::new(config), world: Arc::default() }
    }

    /// Replaces the fault rules (tests change them between phases of a scenario).
    pub fn set_faults(&self, faults: Vec<FaultRule>) {
        lock(&self.config).faults = faults;
    }

    pub fn world(&self) -> World {
        lock(&self.world).clone()
    }

    fn delay(&self, step: Step) -> Duration {
        let base_ms = match step {
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
}

fn apply(world: &Mutex<World>, w: &Workload, step: Step) -> Result<StepOutput, BackendError> {
    let mut world = lock(world);
    let id = w.environment_id.clone();
    let mut output = StepOutput::default();
    match step {
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
            output.detail = Some(describe_units(w));
        }
        Step::WaitHealthy => {
            if !world.workloads.contains(&id) {
                return Err(BackendError("the workload is not running".into()));
            }
        }
        Step::ExposeEndpoint => {
            let connection = world.endpoints.entry(id).or_insert_with(|| connection_for(w)).clone();
            output.connection = Some(connection);
        }
        Step::RemoveEndpoint => {
            world.endpoints.remove(&id);
        }
        Step::StopWorkload => {
            world.workloads.remove(&id);
        }
        Step::ClearPartition => {
            world.partitions.remove(&id);
        }
        Step::ReleaseCapacity => {}
    }
    Ok(output)
}

impl Backend for Simulated {
    fn name(&self) -> &'static str {
        "simulated"
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
                        let _ = apply(&world, &workload, step);
                    });
                    Err(BackendError(format!("simulated lost answer from {}", step.as_str())))
                }
                None => apply(&self.world, workload, step),
            }
        })
    }

    fn owned_objects(&self) -> OwnedFuture<'_> {
        Box::pin(async move { Ok(lock(&self.world).owned()) })
    }

    fn remove_owned<'a>(&'a self, object: &'a OwnedObject) -> RemoveFuture<'a> {
        Box::pin(async move {
            let mut world = lock(&self.world);
            let removed = match object.kind {
                PARTITION => world.partitions.remove(&object.name),
                WORKLOAD => world.workloads.remove(&object.name),
                ENDPOINT => world.endpoints.remove(&object.name).is_some(),
                other => return Err(BackendError(format!("the simulated backend has no {other} objects"))),
            };
            Ok(removed)
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

fn secret() -> String {
    let mut rng = rand::rng();
    (0..32).map(|_| format!("{:x}", rng.random_range(0..16u8))).collect()
}

fn connection_for(w: &Workload) -> Connection {
    let short = w.environment_id.get(..8).unwrap_or(&w.environment_id);
    let site = w.units.first().map(|u| u.site.as_str()).unwrap_or("site");
    let host = format!("{}-{short}.{site}.berth.example", w.name);
    match w.offering {
        Offering::Notebook => Connection {
            url: format!("https://{host}/lab"),
            secret_label: Some("Token".into()),
            secret: Some(secret()),
            example: format!("open https://{host}/lab?token=<token>"),
        },
        Offering::TrainingJob => Connection {
            url: format!("https://{host}/logs"),
            secret_label: None,
            secret: None,
            example: format!("curl -N https://{host}/logs"),
        },
        Offering::InferenceEndpoint => Connection {
            url: format!("https://{host}/v1"),
            secret_label: Some("API key".into()),
            secret: Some(secret()),
            example: format!("curl -H \"Authorization: Bearer <api key>\" https://{host}/v1/models"),
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
