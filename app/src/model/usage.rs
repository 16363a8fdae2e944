//! What the usage and statement pages show (`/usage`, `/usage/statements`).

use serde::{Deserialize, Serialize};

/// A month of usage and cost within the caller's reach, for `/usage`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageView {
    /// "2026-11" and "November 2026".
    pub month: String,
    pub month_title: String,
    pub previous_month: String,
    pub next_month: String,
    /// How lines are grouped (`project`, `person`, ...), with the options as (value, label).
    pub by: String,
    pub by_title: String,
    pub by_options: Vec<(String, String)>,
    /// The tenant a platform admin narrowed the report to (its slug), and the tenants to pick.
    pub tenant: String,
    pub tenant_options: Vec<(String, String)>,
    /// "Charged for the time its GPUs are held ..." and up to when time is counted.
    pub basis: String,
    pub counted_to: String,
    pub lines: Vec<UsageLineView>,
    pub total_gpu_hours: String,
    pub total: String,
    /// The chart's series: the costliest lines, the rest together as "Others".
    pub chart_series: Vec<String>,
    /// Cents per day (one entry per day of the month) for each series.
    pub daily_cents: Vec<Vec<i64>>,
    /// `day` or `week`: what a bar of the cost chart is.
    pub per: String,
    /// The cost chart's bars, a day or a week each.
    pub bars: Vec<ChartBar>,
    /// The month's weeks (Monday to Sunday, cut at the month's edges).
    pub weeks: Vec<WeekRow>,
    /// The budget drawn on the chart, in cents (the tenant's, when the report is one tenant's).
    pub chart_budget_cents: Option<i64>,
    pub budgets: Vec<BudgetView>,
    /// Platform staff on the whole platform: each GPU model's allocation.
    pub fleet: Vec<ModelUseView>,
    /// Projects' budgets (tenant admins) or any (platform admins).
    pub can_set_budgets: bool,
    pub can_set_tenant_budgets: bool,
    /// The same report as a download.
    pub csv_href: String,
    pub json_href: String,
    /// The CSV with a row per line and week, or per line and day.
    pub csv_week_href: String,
    pub csv_day_href: String,
}

/// One bar of the usage chart: a day or a week, its cents per series.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChartBar {
    /// Under the bar ("3", "W45") and in its tooltip ("Tue 3 Nov", "Week 45: ...").
    pub short: String,
    pub label: String,
    pub cents: Vec<i64>,
}

/// A week of the usage report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeekRow {
    /// "Week 45: Mon 2 Nov – Sun 8 Nov"
    pub label: String,
    pub gpu_hours: String,
    pub cost: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageLineView {
    pub label: String,
    pub gpu_hours: String,
    pub environments: usize,
    pub cost: String,
    pub cents: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetView {
    pub id: i64,
    /// "Tenant Acme", "Project acme/vision"
    pub of: String,
    pub budget: String,
    pub warn_only: bool,
    pub spent: String,
    pub committed: String,
    /// Committed against the budget, in whole percent (may pass 100).
    pub percent: i64,
    /// "50%, 80%": the marks reached this month.
    pub reached: String,
    pub removable: bool,
}

/// One GPU model's month: GPU-hours held by bookings against what the fleet had.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelUseView {
    pub model: String,
    pub gpus: i64,
    pub allocated: String,
    pub idle: String,
    /// Allocated share of the month so far, whole percent.
    pub percent: i64,
    /// Allocated share of each day so far (none for days to come).
    pub daily_percent: Vec<Option<i64>>,
}

/// A closed monthly statement in the list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatementRow {
    pub id: i64,
    pub tenant: String,
    /// "November 2026"
    pub month: String,
    pub total: String,
}

/// A closed monthly statement, its figures in words and money.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatementView {
    pub id: i64,
    pub tenant: String,
    pub month: String,
    /// What bookings were charged for, in words.
    pub basis: String,
    pub closed_at: String,
    pub lines: Vec<StatementLineView>,
    pub amount: String,
    pub discount: String,
    pub total: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatementLineView {
    pub project: String,
    pub person: String,
    pub offering: String,
    pub size: String,
    pub tier: String,
    pub unit_hours: String,
    pub gpu_hours: String,
    pub rate: String,
    pub amount: String,
    pub discount: String,
    pub total: String,
}
