//! What pages show, as plain serialisable values. Everything time-dependent is computed
//! on the server, so the server render and the hydrated page agree.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionUser {
    pub email: String,
    pub display_name: String,
    pub is_admin: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelCapacity {
    pub model: String,
    pub gpus: i64,
    pub idle_gpus: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvironmentSummary {
    pub id: String,
    pub name: String,
    pub offering: String,
    pub size: String,
    /// `requested`, `provisioning`, ... (for styling and tests).
    pub state: String,
    pub state_label: String,
    pub price: String,
    pub created: String,
    /// "ends in 1 h 58 min", "ended 14:05 UTC", ...
    pub window: String,
    pub stoppable: bool,
    pub finished: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionView {
    pub url: String,
    pub secret_label: Option<String>,
    pub secret: Option<String>,
    pub example: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepView {
    pub phase: String,
    pub label: String,
    /// `pending`, `running`, `succeeded` or `failed`.
    pub status: String,
    pub attempts: i64,
    pub timing: String,
    pub detail: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitView {
    pub location: String,
    pub model: String,
    pub what: String,
    pub released: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvironmentView {
    pub summary: EnvironmentSummary,
    pub image: Option<String>,
    pub command: Option<String>,
    pub failure_reason: Option<String>,
    pub connection: Option<ConnectionView>,
    pub steps: Vec<StepView>,
    pub units: Vec<UnitView>,
    pub timeline: Vec<(String, String)>,
}
