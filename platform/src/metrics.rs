//! What the platform counts for the operator's `/metrics`: launches by offering and outcome
//! with the time each took, and the reconciler's steps (how long each ran, which failed).
//! Counted in prometheus-client's atomic metrics, so counting takes no lock of Berth's; the
//! server names the families and writes the exposition (`server/src/metrics.rs`). Labels
//! come from fixed lists (offerings, outcomes, steps), never from what a user typed.

use std::time::Duration;

use berth_domain::catalog::Offering;
use berth_domain::lifecycle::Step;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

/// Bounds of the launch latency buckets, in seconds: a launch decides in milliseconds
/// alone and waits up to seconds for the writer turn under load.
const LAUNCH_BUCKETS: [f64; 13] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Bounds of the step duration buckets, in seconds: simulated steps take milliseconds,
/// an image pull or a MIG repartition minutes.
const STEP_BUCKETS: [f64; 13] = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0];

/// What became of a launch.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum LaunchOutcome {
    Booked,
    /// Refused for the caller to read: validation, capacity, quota, budget, authorization.
    Refused,
}

impl LaunchOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            LaunchOutcome::Booked => "booked",
            LaunchOutcome::Refused => "refused",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LaunchLabels {
    pub offering: &'static str,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OfferingLabel {
    pub offering: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabel {
    pub step: &'static str,
}

/// A histogram family whose every member has the same buckets.
pub type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// The platform's counters; cloned families share their values.
#[derive(Debug)]
pub struct Metrics {
    launches: Family<LaunchLabels, Counter>,
    launch_seconds: HistogramFamily<OfferingLabel>,
    step_seconds: HistogramFamily<StepLabel>,
    step_failures: Family<StepLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            launches: Family::default(),
            launch_seconds: Family::new_with_constructor(|| Histogram::new(LAUNCH_BUCKETS)),
            step_seconds: Family::new_with_constructor(|| Histogram::new(STEP_BUCKETS)),
            step_failures: Family::default(),
        }
    }
}

impl Metrics {
    /// A launch ended in `outcome` after `took`. `offering` is `None` where the request
    /// named no offering Berth sells (counted as `unknown`, so typing cannot add series).
    pub fn launch_ended(&self, offering: Option<Offering>, outcome: LaunchOutcome, took: Duration) {
        let offering = offering.map_or("unknown", Offering::id);
        self.launches.get_or_create(&LaunchLabels { offering, outcome: outcome.as_str() }).inc();
        self.launch_seconds.get_or_create(&OfferingLabel { offering }).observe(took.as_secs_f64());
    }

    /// A reconciler step's backend call ended after `took`, `failed` or not.
    pub fn step_ended(&self, step: Step, took: Duration, failed: bool) {
        let label = StepLabel { step: step.as_str() };
        self.step_seconds.get_or_create(&label).observe(took.as_secs_f64());
        if failed {
            self.step_failures.get_or_create(&label).inc();
        }
    }

    /// Launches by offering and outcome.
    pub fn launches(&self) -> &Family<LaunchLabels, Counter> {
        &self.launches
    }

    /// Time a launch took in the platform (authorization to answer), by offering.
    pub fn launch_seconds(&self) -> &HistogramFamily<OfferingLabel> {
        &self.launch_seconds
    }

    /// Time a step's backend call took, by step.
    pub fn step_seconds(&self) -> &HistogramFamily<StepLabel> {
        &self.step_seconds
    }

    /// Steps whose backend call failed or timed out, by step.
    pub fn step_failures(&self) -> &Family<StepLabel, Counter> {
        &self.step_failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launches_and_steps_are_counted_under_fixed_labels() {
        let m = Metrics::default();
        m.launch_ended(Some(Offering::Notebook), LaunchOutcome::Booked, Duration::from_millis(4));
        m.launch_ended(None, LaunchOutcome::Refused, Duration::from_millis(1));
        m.step_ended(Step::PullImage, Duration::from_secs(2), true);
        m.step_ended(Step::PullImage, Duration::from_secs(1), false);
        let booked = LaunchLabels { offering: "notebook", outcome: "booked" };
        assert_eq!(m.launches().get_or_create(&booked).get(), 1);
        let refused = LaunchLabels { offering: "unknown", outcome: "refused" };
        assert_eq!(m.launches().get_or_create(&refused).get(), 1);
        assert_eq!(m.step_failures().get_or_create(&StepLabel { step: Step::PullImage.as_str() }).get(), 1);
    }
}
