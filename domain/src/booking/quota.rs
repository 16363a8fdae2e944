//! Quotas: the limits of a user, a project or a tenant, and the check a new booking passes
//! against them (what it would hold at its peak beside what is already held, and GPU-hours
//! this month), with refusals that say whose limit and what would still fit.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Window;
use crate::Refusal;
use crate::catalog::Offering;
use crate::gpu::GpuModel;

/// The limits of a user, a project or a tenant; `None` is "no limit".
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Quota {
    /// GPU-equivalents held at any one moment, for each GPU model on its own.
    pub max_gpus: Option<f64>,
    /// Limits for particular models, in place of `max_gpus` for them.
    #[serde(default)]
    pub max_gpus_by_model: BTreeMap<GpuModel, f64>,
    /// GPU-equivalent hours booked in one calendar month (UTC), all models together.
    pub gpu_hours_per_month: Option<f64>,
    /// Longest single booking.
    pub max_booking_hours: Option<u32>,
    /// Bookings (running or future) whose windows overlap one another.
    pub max_overlapping: Option<u32>,
    /// May book beyond the GPU limits in the spot tier.
    #[serde(default)]
    pub allow_spot: bool,
}

/// How firmly a booking holds its capacity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Tier {
    /// Counted against the quota; never taken away.
    #[default]
    Guaranteed,
    /// Beyond the quota's GPU limits, starting now, and reclaimed when a guaranteed booking
    /// needs its capacity.
    Spot,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Guaranteed => "guaranteed",
            Tier::Spot => "spot",
        }
    }

    /// As a form sends it: empty is guaranteed.
    pub fn parse(text: &str) -> Result<Tier, Refusal> {
        match text.trim() {
            "" | "guaranteed" => Ok(Tier::Guaranteed),
            "spot" => Ok(Tier::Spot),
            other => Err(Refusal::InvalidTier(other.to_owned())),
        }
    }
}

impl Quota {
    /// The GPU-equivalents of `model` that may be held at once.
    pub fn max_gpus_of(&self, model: GpuModel) -> Option<f64> {
        self.max_gpus_by_model.get(&model).copied().or(self.max_gpus)
    }

    /// Whether the row limits anything or allows spot: a row of all "no limit" does neither.
    pub fn is_unlimited(&self) -> bool {
        *self == Quota::default()
    }

    /// Reads limits as typed in a form: empty means "no limit". `by_model` reads like
    /// "H100-80GB = 8, A100-80GB = 16".
    pub fn parse(
        max_gpus: &str,
        by_model: &str,
        gpu_hours_per_month: &str,
        max_booking_hours: &str,
        max_overlapping: &str,
        allow_spot: bool,
    ) -> Result<Quota, Refusal> {
        fn number<T: std::str::FromStr + PartialOrd>(
            text: &str,
            what: &str,
            least: T,
            kind: &str,
        ) -> Result<Option<T>, Refusal> {
            let text = text.trim();
            if text.is_empty() {
                return Ok(None);
            }
            match text.parse::<T>() {
                Ok(v) if v >= least => Ok(Some(v)),
                _ => Err(Refusal::InvalidQuota(format!("{what} must be {kind}, or empty for no limit"))),
            }
        }
        let mut max_gpus_by_model = BTreeMap::new();
        for item in by_model.split([',', '\n']).map(str::trim).filter(|i| !i.is_empty()) {
            let bad = || {
                Refusal::InvalidQuota(format!(
                    "\"{item}\" should read MODEL = GPUs, like H100-80GB = 8 (models: {})",
                    GpuModel::ALL.map(GpuModel::name).join(", ")
                ))
            };
            let (model, limit) = item.split_once('=').ok_or_else(bad)?;
            let model = GpuModel::parse(model.trim()).ok_or_else(bad)?;
            let limit = number(limit, model.name(), 0.0, "a number of GPU-equivalents, 0 or more")?.ok_or_else(bad)?;
            if max_gpus_by_model.insert(model, limit).is_some() {
                return Err(Refusal::InvalidQuota(format!("{} is limited twice", model.name())));
            }
        }
        Ok(Quota {
            max_gpus: number(max_gpus, "GPUs at once", 0.0, "a number of GPU-equivalents, 0 or more")?,
            max_gpus_by_model,
            gpu_hours_per_month: number(gpu_hours_per_month, "GPU-hours a month", 0.0, "a number, 0 or more")?,
            max_booking_hours: number(max_booking_hours, "longest booking", 1, "a whole number of hours, at least 1")?,
            max_overlapping: number(max_overlapping, "bookings at the same time", 1, "a whole number, at least 1")?,
            allow_spot,
        })
    }
}

/// Whose limits a quota check applies: the booking user's own, or those of the project or
/// tenant the booking counts against. Refusals name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuotaScope {
    User,
    Project(String),
    Tenant(String),
}

impl QuotaScope {
    /// "your limit", "project vision's limit".
    fn whose(&self) -> String {
        match self {
            QuotaScope::User => "your".to_owned(),
            QuotaScope::Project(name) => format!("project {name}'s"),
            QuotaScope::Tenant(name) => format!("tenant {name}'s"),
        }
    }

    /// The subject of "holds" and "may have".
    fn who(&self) -> String {
        match self {
            QuotaScope::User => "you".to_owned(),
            QuotaScope::Project(name) => format!("project {name}"),
            QuotaScope::Tenant(name) => format!("tenant {name}"),
        }
    }
}

/// What a user, project or tenant already has, as the quota check needs it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    /// Other unreleased guaranteed bookings of the same GPU model: window and GPU-equivalents.
    pub same_model: Vec<(Window, f64)>,
    /// Bookings overlapping the new window, any model.
    pub overlapping: u32,
    /// GPU-equivalent hours already booked in the month the new booking starts.
    pub gpu_hours_this_month: f64,
}

/// Checks a new booking of `ask` GPU-equivalents of `model` for `window` against the
/// `quota` of `scope`; a refusal says whose limit, what is used and what would still fit.
/// A spot booking (allowed or not by the caller: see `spot_allowed`) goes beyond the GPU
/// limits; the other limits still hold. `usage` counts guaranteed bookings only.
pub fn check_quota(
    quota: &Quota,
    scope: &QuotaScope,
    usage: &Usage,
    model: GpuModel,
    window: Window,
    ask: f64,
    tier: Tier,
) -> Result<(), Refusal> {
    if let Some(max) = quota.max_booking_hours
        && window.hours() > f64::from(max)
    {
        let within = match scope {
            QuotaScope::User => String::new(),
            other => format!(" in {}", other.who()),
        };
        return Err(Refusal::QuotaExceeded(format!(
            "bookings{within} are limited to {max} hours; this one is {:.0} hours",
            window.hours()
        )));
    }
    if let Some(max) = quota.max_overlapping
        && usage.overlapping >= max
    {
        return Err(Refusal::QuotaExceeded(format!(
            "{} may have at most {max} bookings at the same time; {} already overlap this window",
            scope.who(),
            usage.overlapping
        )));
    }
    if tier == Tier::Spot {
        return Ok(());
    }
    if let Some(max) = quota.max_gpus_of(model) {
        let peak = peak_during(&usage.same_model, window);
        if peak + ask > max + 1e-9 {
            let room = (max - peak).max(0.0);
            let holds = if *scope == QuotaScope::User { "you hold" } else { "it holds" };
            // "1 GPU-equivalent", "0.5 GPU-equivalents": only exactly one is singular.
            let unit = if round2(max) == "1" { "GPU-equivalent" } else { "GPU-equivalents" };
            return Err(Refusal::QuotaExceeded(format!(
                "{} limit is {} {model} {unit} at once; {holds} up to {} during this window and this booking asks for {}, {}",
                scope.whose(),
                round2(max),
                round2(peak),
                round2(ask),
                what_fits(model, room)
            )));
        }
    }
    if let Some(max) = quota.gpu_hours_per_month {
        let asked = ask * window.hours();
        if usage.gpu_hours_this_month + asked > max + 1e-9 {
            return Err(Refusal::QuotaExceeded(format!(
                "{} limit is {} GPU-hours a month; {} are booked this month and this booking needs {}, so {} more would fit",
                scope.whose(),
                round2(max),
                round2(usage.gpu_hours_this_month),
                round2(asked),
                round2((max - usage.gpu_hours_this_month).max(0.0))
            )));
        }
    }
    Ok(())
}

/// The most GPU-equivalents `bookings` hold at one moment inside `window`.
fn peak_during(bookings: &[(Window, f64)], window: Window) -> f64 {
    let mut events: Vec<(i64, f64)> = Vec::new();
    for &(w, gpus) in bookings.iter().filter(|(w, _)| w.conflicts(window, 0)) {
        events.push((w.starts_at.max(window.starts_at), gpus));
        events.push((w.ends_at.min(window.ends_at), -gpus));
    }
    // Ends before starts at the same instant: back-to-back bookings do not add up.
    events.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let (mut now, mut peak) = (0.0_f64, 0.0_f64);
    for (_, delta) in events {
        now += delta;
        peak = peak.max(now);
    }
    peak
}

fn round2(x: f64) -> String {
    let s = format!("{x:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// What still fits in `room` GPU-equivalents of `model`, in sizes: "so nothing more fits",
/// "so 0.43 more would fit: up to a H100-80GB 3g.40gb slice".
fn what_fits(model: GpuModel, room: f64) -> String {
    if round2(room) == "0" {
        return "so nothing more fits".to_owned();
    }
    let largest = Offering::ALL
        .iter()
        .flat_map(|o| o.sizes())
        .filter(|s| s.gpu_model() == model)
        .filter_map(|s| Some((s.shape, s.shape.gpu_equivalents()?)))
        .filter(|(_, gpus)| *gpus <= room + 1e-9)
        .max_by(|a, b| a.1.total_cmp(&b.1));
    match largest {
        Some((shape, _)) => format!("so {} more would fit: up to {}", round2(room), shape.describe()),
        None => format!("so {} more would fit, less than any size of it", round2(room)),
    }
}
