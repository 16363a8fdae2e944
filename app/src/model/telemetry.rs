//! What pages show of GPU use and idle reclamation: an environment's GPU charts and idle
//! card, the idle policies page, and the usage page's GPU efficiency.

use serde::{Deserialize, Serialize};

/// What an environment's GPUs did, for its page: charts drawn from these on the server
/// and in the browser alike (SVG, so they need no script).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuUseView {
    /// The latest minute in words ("43% busy · 12.1 of 80.0 GiB · 310 W · 52 °C"), or
    /// why there is none.
    pub latest: String,
    /// `true` when any reading exists (otherwise the charts say why there are none).
    pub has_readings: bool,
    pub charts: Vec<UseChartView>,
    /// XID errors raised on its GPUs while it held them, newest first, in words
    /// ("25 Nov 10:02 UTC: XID 13 on gpu-a1 GPU 3 (graphics engine exception)").
    pub xid_errors: Vec<String>,
}

/// One small chart: a series over a span, as SVG polyline points in a 300 x 60 box.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UseChartView {
    /// "Utilization, last hour".
    pub title: String,
    /// The top of the scale in words ("100%", "80 GiB", "700 W").
    pub top: String,
    pub points: String,
    /// The chart in words for screen readers: average and peak.
    pub summary: String,
}

/// An environment's standing with the idle watcher, for its page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdleView {
    /// The policy in a sentence; `None` when no idle policy applies.
    pub policy: Option<String>,
    /// The standing warning in words, and its heading ("Idle: it will be stopped").
    pub warning: Option<String>,
    pub warning_title: String,
    /// Whether the caller may choose "keep it" now.
    pub may_keep: bool,
    /// "1 of 2 keeps used", or empty.
    pub keeps: String,
    /// "Stopped for idleness at …", once it was.
    pub stopped: Option<String>,
}

/// The idle policies page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdlePoliciesView {
    pub rows: Vec<IdlePolicyRow>,
    pub manages_platform: bool,
    /// (id, slug) of the tenants whose policies the caller sets.
    pub tenants: Vec<(i64, String)>,
    /// (id, title) of each offering.
    pub offerings: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdlePolicyRow {
    /// "Platform" or the tenant's slug.
    pub whose: String,
    /// The tenant's id, or `None` for the platform's.
    pub tenant_id: Option<i64>,
    pub offering: String,
    pub offering_title: String,
    pub below_pct: String,
    pub idle_for: String,
    pub grace: String,
    pub max_keeps: String,
    pub summary: String,
    pub may_change: bool,
}

/// Busy against read GPU-hours per day, model and tenant, for `/usage`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuEfficiencyRow {
    pub day: String,
    pub tenant: String,
    pub model: String,
    pub read_hours: String,
    pub busy_hours: String,
    /// Busy as a share of read: "42%".
    pub busy_share: String,
}
