//! A node's health lifecycle: the states a node passes through from delivery to
//! retirement, the events that move it, and which moves are allowed.
//!
//! ```text
//!   new --start acceptance--> testing --passed--> available --drain--> draining
//!                               |  ^                  |   ^               |
//!                         failed|  |repair done  fault|   |return         |fault, repair
//!                               v  |                  v   |               v
//!                            degraded --start repair--> in repair (tier n)
//!                               |                          |repair failed -> degraded
//!                               +-- no tier left ---------> retired --reinstate--> new
//! ```
//!
//! Only `available` nodes take new bookings; a draining node keeps what it holds. Each
//! incident climbs the repair tiers (reset GPUs, reboot, reimage, vendor …): a failed
//! acceptance after tier `n` makes the next repair tier `n + 1`, and when no tier is left
//! the node is retired until a person reinstates it. That is why every path from
//! `degraded` ends in `available` or `retired`.

use serde::{Deserialize, Serialize};

use crate::Refusal;

/// Where a node is in its health lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Delivered or reinstated, never accepted: takes no bookings until acceptance passes.
    New,
    /// Acceptance checks are running.
    Testing,
    /// Accepted and healthy: the only state that takes new bookings.
    Available,
    /// A check failed or the node reported a fatal fault: no new bookings, awaits repair.
    Degraded,
    /// Finishes what it holds, takes nothing new (before maintenance or a repair).
    Draining,
    /// A repair tier is being carried out (its number is kept beside the state).
    InRepair,
    /// Out of the fleet until a person reinstates it.
    Retired,
}

impl NodeState {
    pub const ALL: [NodeState; 7] = [
        NodeState::New,
        NodeState::Testing,
        NodeState::Available,
        NodeState::Degraded,
        NodeState::Draining,
        NodeState::InRepair,
        NodeState::Retired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::New => "new",
            NodeState::Testing => "testing",
            NodeState::Available => "available",
            NodeState::Degraded => "degraded",
            NodeState::Draining => "draining",
            NodeState::InRepair => "in_repair",
            NodeState::Retired => "retired",
        }
    }

    pub fn parse(text: &str) -> Option<NodeState> {
        NodeState::ALL.into_iter().find(|s| s.as_str() == text)
    }

    pub fn label(self) -> &'static str {
        match self {
            NodeState::New => "New",
            NodeState::Testing => "Testing",
            NodeState::Available => "Available",
            NodeState::Degraded => "Degraded",
            NodeState::Draining => "Draining",
            NodeState::InRepair => "In repair",
            NodeState::Retired => "Retired",
        }
    }

    /// Whether placement may put a new booking on the node. Bookings already held keep
    /// running whatever the state; their owners are told when the node degrades.
    pub fn takes_new_bookings(self) -> bool {
        self == NodeState::Available
    }
}

/// A node's state with the repair tier of the incident it is in: the tier in progress
/// while `InRepair`, else the last tier tried since the node was last available (0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub state: NodeState,
    pub tier: u32,
}

impl NodeStatus {
    pub const fn new(state: NodeState) -> NodeStatus {
        NodeStatus { state, tier: 0 }
    }
}

/// What moves a node. Admin actions and check outcomes alike; the platform records who
/// caused each and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeEvent {
    /// Run the acceptance checks (a new node, after maintenance, after a repair tier, or on
    /// an available node nobody holds).
    StartAcceptance,
    AcceptancePassed,
    AcceptanceFailed,
    /// A check run outside acceptance failed, or the agent reported a fatal XID/ECC event.
    Fault,
    /// Take no new bookings; finish what is held.
    Drain,
    /// Back to taking bookings from draining, without checks (a drain called off).
    ReturnToService,
    /// Start the next repair tier (or retire when none is left).
    StartRepair,
    /// The tier's command or manual step finished: acceptance follows.
    RepairDone,
    /// The tier's command failed: degraded again, the next repair climbs a tier.
    RepairFailed,
    Retire,
    /// A person brings a retired node back: it is new again and needs acceptance.
    Reinstate,
}

impl NodeEvent {
    pub const ALL: [NodeEvent; 11] = [
        NodeEvent::StartAcceptance,
        NodeEvent::AcceptancePassed,
        NodeEvent::AcceptanceFailed,
        NodeEvent::Fault,
        NodeEvent::Drain,
        NodeEvent::ReturnToService,
        NodeEvent::StartRepair,
        NodeEvent::RepairDone,
        NodeEvent::RepairFailed,
        NodeEvent::Retire,
        NodeEvent::Reinstate,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NodeEvent::StartAcceptance => "start_acceptance",
            NodeEvent::AcceptancePassed => "acceptance_passed",
            NodeEvent::AcceptanceFailed => "acceptance_failed",
            NodeEvent::Fault => "fault",
            NodeEvent::Drain => "drain",
            NodeEvent::ReturnToService => "return_to_service",
            NodeEvent::StartRepair => "start_repair",
            NodeEvent::RepairDone => "repair_done",
            NodeEvent::RepairFailed => "repair_failed",
            NodeEvent::Retire => "retire",
            NodeEvent::Reinstate => "reinstate",
        }
    }

    pub fn parse(text: &str) -> Option<NodeEvent> {
        NodeEvent::ALL.into_iter().find(|e| e.as_str() == text)
    }
}

/// The status `event` moves `from` to, with `tiers` repair tiers configured, or why the
/// move is not allowed.
pub fn next_status(from: NodeStatus, event: NodeEvent, tiers: u32) -> Result<NodeStatus, Refusal> {
    use NodeEvent as E;
    use NodeState as S;
    let to = |state, tier| Ok(NodeStatus { state, tier });
    match (from.state, event) {
        (S::New | S::Available | S::Draining, E::StartAcceptance) => to(S::Testing, 0),
        (S::Testing, E::AcceptancePassed) => to(S::Available, 0),
        // The tier tried stays, so the next repair climbs.
        (S::Testing, E::AcceptanceFailed) => to(S::Degraded, from.tier),
        (S::Available | S::Draining, E::Fault) => to(S::Degraded, 0),
        (S::Available, E::Drain) => to(S::Draining, 0),
        (S::Draining, E::ReturnToService) => to(S::Available, 0),
        (S::Degraded | S::Draining, E::StartRepair) => {
            if from.tier < tiers {
                to(S::InRepair, from.tier + 1)
            } else {
                to(S::Retired, from.tier)
            }
        }
        (S::InRepair, E::RepairDone) => to(S::Testing, from.tier),
        (S::InRepair, E::RepairFailed) => to(S::Degraded, from.tier),
        (state, E::Retire) if state != S::Retired => to(S::Retired, from.tier),
        (S::Retired, E::Reinstate) => to(S::New, 0),
        (state, event) => Err(Refusal::NodeTransition { state: state.label(), event: event.as_str() }),
    }
}

/// One step of the repair ladder an incident climbs. Operators configure the ladder; the
/// default is [`default_repair_tiers`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepairTier {
    pub name: String,
    /// Run by the backend on (or for) the node, e.g. a Redfish call; `None`: a person does
    /// it and marks the repair done or failed.
    pub command: Option<String>,
}

/// Reset the GPUs, reboot, reimage, hand to the vendor: the first two are commands the
/// backend runs, the last two are manual steps.
pub fn default_repair_tiers() -> Vec<RepairTier> {
    vec![
        RepairTier { name: "reset GPUs".into(), command: Some("nvidia-smi --gpu-reset".into()) },
        RepairTier { name: "reboot".into(), command: Some("systemctl reboot".into()) },
        RepairTier { name: "reimage".into(), command: None },
        RepairTier { name: "hand to the vendor".into(), command: None },
    ]
}

/// The nodes among `nodes` (id, state) that placement may offer for a new booking.
pub fn bookable(nodes: &[(i64, NodeState)]) -> Vec<i64> {
    nodes.iter().filter(|(_, state)| state.takes_new_bookings()).map(|(id, _)| id).copied().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn status(state: NodeState, tier: u32) -> NodeStatus {
        NodeStatus { state, tier }
    }

    #[test]
    fn names_round_trip() {
        for s in NodeState::ALL {
            assert_eq!(NodeState::parse(s.as_str()), Some(s));
        }
        for e in NodeEvent::ALL {
            assert_eq!(NodeEvent::parse(e.as_str()), Some(e));
        }
        assert_eq!(NodeState::parse("healthy"), None);
    }

    #[test]
    fn a_new_node_is_accepted_before_it_takes_bookings() {
        let new = NodeStatus::new(NodeState::New);
        assert!(!new.state.takes_new_bookings());
        assert!(next_status(new, NodeEvent::AcceptancePassed, 3).is_err(), "no acceptance without testing");
        let testing = next_status(new, NodeEvent::StartAcceptance, 3).unwrap();
        assert_eq!(
            next_status(testing, NodeEvent::AcceptancePassed, 3).unwrap(),
            NodeStatus::new(NodeState::Available)
        );
    }

    #[test]
    fn repairs_climb_the_tiers_then_retire() {
        let mut s = status(NodeState::Degraded, 0);
        for tier in 1..=2 {
            s = next_status(s, NodeEvent::StartRepair, 2).unwrap();
            assert_eq!(s, status(NodeState::InRepair, tier));
            s = next_status(s, NodeEvent::RepairDone, 2).unwrap();
            s = next_status(s, NodeEvent::AcceptanceFailed, 2).unwrap();
            assert_eq!(s, status(NodeState::Degraded, tier));
        }
        assert_eq!(next_status(s, NodeEvent::StartRepair, 2).unwrap().state, NodeState::Retired);
    }

    #[test]
    fn a_refused_move_names_the_state_and_the_event() {
        let err = next_status(NodeStatus::new(NodeState::Retired), NodeEvent::Drain, 3).unwrap_err();
        assert_eq!(err.to_string(), "a node that is retired cannot drain");
    }

    fn any_status() -> impl Strategy<Value = NodeStatus> {
        (prop::sample::select(NodeState::ALL.to_vec()), 0u32..5).prop_map(|(state, tier)| status(state, tier))
    }

    proptest! {
        /// Whatever happens to a node, only an available one is offered to placement, and
        /// every state a node can be moved to keeps that: a refused event changes nothing.
        #[test]
        fn only_available_nodes_take_bookings(
            start in any_status(),
            events in prop::collection::vec(prop::sample::select(NodeEvent::ALL.to_vec()), 0..40),
            tiers in 0u32..4,
        ) {
            let mut s = start;
            for event in events {
                if let Ok(next) = next_status(s, event, tiers) {
                    s = next;
                }
                let offered = crate::node_health::bookable(&[(1, s.state)]);
                prop_assert_eq!(offered.contains(&1), s.state == NodeState::Available);
            }
        }

        /// From degraded, whatever the checks answer and the repairs do, the node reaches
        /// available or retired within `2 + 3 * tiers` steps when nobody retires it by hand
        /// or drains it: no incident loops forever.
        #[test]
        fn every_path_from_degraded_ends_available_or_retired(
            tiers in 0u32..5,
            choices in prop::collection::vec(any::<u8>(), 64),
        ) {
            let mut s = status(NodeState::Degraded, 0);
            let mut steps = 0;
            while !matches!(s.state, NodeState::Available | NodeState::Retired) {
                // Every event the lifecycle allows here except a person's Retire (which
                // ends the path anyway) and Drain (only from available).
                let allowed: Vec<NodeStatus> = NodeEvent::ALL
                    .into_iter()
                    .filter(|e| *e != NodeEvent::Retire)
                    .filter_map(|e| next_status(s, e, tiers).ok())
                    .collect();
                prop_assert!(!allowed.is_empty(), "stuck in {:?}", s);
                s = allowed[usize::from(choices[steps % choices.len()]) % allowed.len()];
                steps += 1;
                prop_assert!(steps <= 2 + 3 * tiers as usize, "no end after {} steps: {:?}", steps, s);
            }
        }
    }
}
