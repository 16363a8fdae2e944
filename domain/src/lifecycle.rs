//! The environment lifecycle: states, the steps that move an environment between them,
//! and the one decision the reconciler asks for: what to do next.
//!
//! `requested -> provisioning -> ready -> tearing_down -> released`; a failure at any
//! point records its reason and still tears down, ending in `failed`.

use serde::{Deserialize, Serialize};

use crate::catalog::Offering;
use crate::placement::Shape;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EnvState {
    Requested,
    Provisioning,
    Ready,
    TearingDown,
    Released,
    /// Torn down after a failure; the reason is kept with the environment.
    Failed,
}

impl EnvState {
    pub const ALL: [EnvState; 6] = [
        EnvState::Requested,
        EnvState::Provisioning,
        EnvState::Ready,
        EnvState::TearingDown,
        EnvState::Released,
        EnvState::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EnvState::Requested => "requested",
            EnvState::Provisioning => "provisioning",
            EnvState::Ready => "ready",
            EnvState::TearingDown => "tearing_down",
            EnvState::Released => "released",
            EnvState::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<EnvState> {
        EnvState::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Words for the UI.
    pub fn label(self) -> &'static str {
        match self {
            EnvState::Requested => "Requested",
            EnvState::Provisioning => "Provisioning",
            EnvState::Ready => "Ready",
            EnvState::TearingDown => "Tearing down",
            EnvState::Released => "Released",
            EnvState::Failed => "Failed",
        }
    }

    /// Words for the UI about an environment of `offering`: a training job that is up is
    /// running (its work under way), not "ready" for someone to connect.
    pub fn label_for(self, offering: Offering) -> &'static str {
        match (self, offering) {
            (EnvState::Ready, Offering::TrainingJob) => "Running",
            _ => self.label(),
        }
    }

    /// Nothing more will happen to an environment in this state.
    pub fn is_final(self) -> bool {
        matches!(self, EnvState::Released | EnvState::Failed)
    }

    /// The transitions the lifecycle allows; the store refuses any other.
    pub fn can_become(self, next: EnvState) -> bool {
        use EnvState::*;
        matches!(
            (self, next),
            (Requested, Provisioning)
                | (Requested, TearingDown)
                | (Provisioning, Ready)
                | (Provisioning, TearingDown)
                | (Ready, TearingDown)
                | (TearingDown, Released)
                | (TearingDown, Failed)
        )
    }

    /// A user may ask to stop it (again asking is refused with a reason).
    pub fn is_stoppable(self) -> bool {
        matches!(self, EnvState::Requested | EnvState::Provisioning | EnvState::Ready)
    }
}

impl std::fmt::Display for EnvState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Phase {
    Provision,
    Teardown,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Provision => "provision",
            Phase::Teardown => "teardown",
        }
    }

    pub fn parse(s: &str) -> Option<Phase> {
        [Phase::Provision, Phase::Teardown].into_iter().find(|p| p.as_str() == s)
    }
}

/// One idempotent thing a backend does; each has an undo in the teardown plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Step {
    /// A dedicated cluster's nodes pass the quick acceptance checks before it starts. The
    /// reconciler runs it through the node checks, not the backend's steps.
    AcceptanceChecks,
    ConfigurePartition,
    PullImage,
    StartWorkload,
    WaitHealthy,
    ExposeEndpoint,
    RemoveEndpoint,
    StopWorkload,
    ClearPartition,
    ReleaseCapacity,
}

impl Step {
    pub const ALL: [Step; 10] = [
        Step::AcceptanceChecks,
        Step::ConfigurePartition,
        Step::PullImage,
        Step::StartWorkload,
        Step::WaitHealthy,
        Step::ExposeEndpoint,
        Step::RemoveEndpoint,
        Step::StopWorkload,
        Step::ClearPartition,
        Step::ReleaseCapacity,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Step::AcceptanceChecks => "acceptance_checks",
            Step::ConfigurePartition => "configure_partition",
            Step::PullImage => "pull_image",
            Step::StartWorkload => "start_workload",
            Step::WaitHealthy => "wait_healthy",
            Step::ExposeEndpoint => "expose_endpoint",
            Step::RemoveEndpoint => "remove_endpoint",
            Step::StopWorkload => "stop_workload",
            Step::ClearPartition => "clear_partition",
            Step::ReleaseCapacity => "release_capacity",
        }
    }

    pub fn parse(s: &str) -> Option<Step> {
        Step::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Words for the UI about a step of an environment of `offering`: a training job has
    /// no endpoint to connect to; what it publishes is how to follow its log.
    pub fn label_for(self, offering: Offering) -> &'static str {
        match (self, offering) {
            (Step::ExposeEndpoint, Offering::TrainingJob) => "Publish how to follow the job",
            (Step::RemoveEndpoint, Offering::TrainingJob) => "Withdraw how to follow the job",
            _ => self.label(),
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Step::AcceptanceChecks => "Run acceptance checks on its nodes",
            Step::ConfigurePartition => "Configure GPU partition",
            Step::PullImage => "Pull container image",
            Step::StartWorkload => "Start workload",
            Step::WaitHealthy => "Wait until healthy",
            Step::ExposeEndpoint => "Expose connection endpoint",
            Step::RemoveEndpoint => "Remove connection endpoint",
            Step::StopWorkload => "Stop workload",
            Step::ClearPartition => "Clear GPU partition",
            Step::ReleaseCapacity => "Release capacity",
        }
    }
}

/// The steps that bring an environment of this kind up, in order.
pub fn provision_plan(offering: Offering, shape: Shape) -> Vec<Step> {
    let mut plan = Vec::new();
    // A tenant is handed nodes that passed acceptance just now, as neoclouds' cluster
    // consoles do ("running acceptance tests").
    if offering == Offering::DedicatedCluster {
        plan.push(Step::AcceptanceChecks);
    }
    if matches!(shape, Shape::MigSlice { .. }) {
        plan.push(Step::ConfigurePartition);
    }
    if offering != Offering::DedicatedCluster {
        plan.push(Step::PullImage);
    }
    plan.extend([Step::StartWorkload, Step::WaitHealthy, Step::ExposeEndpoint]);
    plan
}

/// The steps that take it down again. Every step runs even if its provisioning twin
/// never did (each is idempotent), so a crash anywhere leaves nothing behind; releasing
/// capacity is always last.
pub fn teardown_plan(shape: Shape) -> Vec<Step> {
    let mut plan = vec![Step::RemoveEndpoint, Step::StopWorkload];
    if matches!(shape, Shape::MigSlice { .. }) {
        plan.push(Step::ClearPartition);
    }
    plan.push(Step::ReleaseCapacity);
    plan
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Desired {
    Running,
    Released,
}

impl Desired {
    pub fn as_str(self) -> &'static str {
        match self {
            Desired::Running => "running",
            Desired::Released => "released",
        }
    }

    pub fn parse(s: &str) -> Option<Desired> {
        [Desired::Running, Desired::Released].into_iter().find(|d| d.as_str() == s)
    }
}

/// What the reconciler knows about one environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    pub state: EnvState,
    pub desired: Desired,
    /// The booked window has not begun yet (an advance booking).
    pub not_started: bool,
    /// The booked window has ended.
    pub window_over: bool,
    /// A step failed; the environment ends as `failed` after teardown.
    pub failed: bool,
    /// Steps of the current phase that have succeeded.
    pub steps_done: usize,
}

/// The reconciler's next move for one environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Move to `state` (and start its phase from step 0).
    Become(EnvState),
    /// Run step `index` of `phase`.
    Run { phase: Phase, index: usize, step: Step },
    /// Nothing to do until something changes.
    Wait,
}

pub fn next_action(offering: Offering, shape: Shape, p: &Progress) -> Action {
    let wants_down = p.desired == Desired::Released || p.window_over || p.failed;
    match p.state {
        EnvState::Released | EnvState::Failed => Action::Wait,
        EnvState::Requested if wants_down => Action::Become(EnvState::TearingDown),
        EnvState::Requested if p.not_started => Action::Wait,
        EnvState::Requested => Action::Become(EnvState::Provisioning),
        EnvState::Provisioning if wants_down => Action::Become(EnvState::TearingDown),
        EnvState::Provisioning => {
            let plan = provision_plan(offering, shape);
            match plan.get(p.steps_done) {
                Some(&step) => Action::Run { phase: Phase::Provision, index: p.steps_done, step },
                None => Action::Become(EnvState::Ready),
            }
        }
        EnvState::Ready if wants_down => Action::Become(EnvState::TearingDown),
        EnvState::Ready => Action::Wait,
        EnvState::TearingDown => {
            let plan = teardown_plan(shape);
            match plan.get(p.steps_done) {
                Some(&step) => Action::Run { phase: Phase::Teardown, index: p.steps_done, step },
                None if p.failed => Action::Become(EnvState::Failed),
                None => Action::Become(EnvState::Released),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_training_job_is_called_running_and_has_no_endpoint() {
        assert_eq!(EnvState::Ready.label_for(Offering::TrainingJob), "Running");
        assert_eq!(EnvState::Ready.label_for(Offering::Notebook), "Ready");
        assert_eq!(Step::ExposeEndpoint.label_for(Offering::TrainingJob), "Publish how to follow the job");
        assert_eq!(Step::ExposeEndpoint.label_for(Offering::InferenceEndpoint), "Expose connection endpoint");
    }
    use crate::gpu::GpuModel;
    use crate::mig::MigProfile;

    const SLICE: Shape = Shape::MigSlice { model: GpuModel::H100_80GB, profile: MigProfile::G1 };
    const NODE: Shape = Shape::Nodes { model: GpuModel::H100_80GB, count: 1 };

    fn progress(state: EnvState, steps_done: usize) -> Progress {
        Progress { state, desired: Desired::Running, not_started: false, window_over: false, failed: false, steps_done }
    }

    /// Follows next_action from `requested`, as if every step succeeded, and returns the
    /// states visited and steps run.
    fn walk(offering: Offering, shape: Shape, stop_when_ready: bool) -> (Vec<EnvState>, Vec<Step>) {
        let mut p = progress(EnvState::Requested, 0);
        let (mut states, mut steps) = (vec![p.state], vec![]);
        for _ in 0..50 {
            match next_action(offering, shape, &p) {
                Action::Become(next) => {
                    assert!(p.state.can_become(next), "{:?} -> {next:?}", p.state);
                    p.state = next;
                    p.steps_done = 0;
                    states.push(next);
                }
                Action::Run { index, step, .. } => {
                    assert_eq!(index, p.steps_done);
                    steps.push(step);
                    p.steps_done += 1;
                }
                Action::Wait if p.state == EnvState::Ready && stop_when_ready => p.desired = Desired::Released,
                Action::Wait => break,
            }
        }
        (states, steps)
    }

    #[test]
    fn a_slice_notebook_goes_through_every_state_and_step() {
        let (states, steps) = walk(Offering::Notebook, SLICE, true);
        use EnvState::*;
        assert_eq!(states, [Requested, Provisioning, Ready, TearingDown, Released]);
        assert_eq!(steps.first(), Some(&Step::ConfigurePartition));
        assert_eq!(steps.last(), Some(&Step::ReleaseCapacity));
        assert!(steps.contains(&Step::ClearPartition));
    }

    #[test]
    fn a_cluster_has_no_image_and_no_partition() {
        let plan = provision_plan(Offering::DedicatedCluster, NODE);
        assert!(!plan.contains(&Step::PullImage) && !plan.contains(&Step::ConfigurePartition));
        assert!(!teardown_plan(NODE).contains(&Step::ClearPartition));
    }

    #[test]
    fn ready_waits_until_stopped_or_the_window_ends() {
        let ready = progress(EnvState::Ready, 0);
        assert_eq!(next_action(Offering::Notebook, SLICE, &ready), Action::Wait);
        let over = Progress { window_over: true, ..ready.clone() };
        assert_eq!(next_action(Offering::Notebook, SLICE, &over), Action::Become(EnvState::TearingDown));
        let stopped = Progress { desired: Desired::Released, ..ready };
        assert_eq!(next_action(Offering::Notebook, SLICE, &stopped), Action::Become(EnvState::TearingDown));
    }

    #[test]
    fn a_failure_while_provisioning_tears_down_and_ends_failed() {
        let failing = Progress { failed: true, ..progress(EnvState::Provisioning, 2) };
        assert_eq!(next_action(Offering::Notebook, SLICE, &failing), Action::Become(EnvState::TearingDown));
        let done = Progress { failed: true, ..progress(EnvState::TearingDown, teardown_plan(SLICE).len()) };
        assert_eq!(next_action(Offering::Notebook, SLICE, &done), Action::Become(EnvState::Failed));
    }

    #[test]
    fn stopping_before_start_still_releases_capacity() {
        let booked = Progress { not_started: true, ..progress(EnvState::Requested, 0) };
        assert_eq!(next_action(Offering::Notebook, SLICE, &booked), Action::Wait, "an advance booking waits");
        let cancelled = Progress { desired: Desired::Released, ..progress(EnvState::Requested, 0) };
        assert_eq!(next_action(Offering::TrainingJob, NODE, &cancelled), Action::Become(EnvState::TearingDown));
    }

    #[test]
    fn final_states_go_nowhere() {
        for from in [EnvState::Released, EnvState::Failed] {
            assert!(from.is_final() && !from.is_stoppable());
            assert!(EnvState::ALL.iter().all(|&to| !from.can_become(to)));
        }
        assert!(!EnvState::Ready.can_become(EnvState::Provisioning));
        assert!(!EnvState::Requested.can_become(EnvState::Ready));
    }

    #[test]
    fn names_round_trip() {
        for s in EnvState::ALL {
            assert_eq!(EnvState::parse(s.as_str()), Some(s));
        }
        for s in Step::ALL {
            assert_eq!(Step::parse(s.as_str()), Some(s));
        }
    }
}
