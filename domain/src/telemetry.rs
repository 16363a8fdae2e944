//! GPU telemetry: what a GPU (or one MIG instance of it) was doing, as a source read it.
//!
//! Readings come from three places: the node agent's NVML reports (bare metal), the NVIDIA
//! DCGM exporter's metrics (Kubernetes) and the simulated fleet. Each becomes a
//! [`GpuReading`]; the platform attributes it to the booking that holds that GPU or slice
//! and keeps it at two resolutions ([`FINE`] and [`COARSE`]).

use serde::{Deserialize, Serialize};

/// One reading of one GPU, or of one MIG instance on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuReading {
    /// The node's name as the fleet file gives it.
    pub node: String,
    /// NVML's device index on the node (the fleet file's GPU index).
    pub gpu_index: i64,
    /// For a MIG instance: the first memory slice of its placement (0 to 7), where the
    /// source knows it. `None` for a whole GPU, or for a MIG instance known only by its
    /// environment (see `environment`).
    #[serde(default)]
    pub slice_start: Option<i64>,
    /// The environment the source says the reading belongs to (the DCGM exporter's pod
    /// labels), where it knows. Otherwise the platform finds it from what is held on the
    /// GPU at the time.
    #[serde(default)]
    pub environment: Option<String>,
    /// When it was read, ms since the epoch.
    pub at_ms: i64,
    /// How long this reading stands for, in seconds (the source's sampling period): busy
    /// GPU-hours are utilization times this.
    pub period_s: f64,
    /// Utilization over the sampling period, 0 to 100 (for a MIG instance: its graphics
    /// engine activity).
    pub utilization_pct: f64,
    pub memory_used_mib: f64,
    pub memory_total_mib: f64,
    #[serde(default)]
    pub power_w: Option<f64>,
    #[serde(default)]
    pub temperature_c: Option<f64>,
}

/// Fine resolution: one-minute buckets, kept for [`FINE_KEPT_MS`].
pub const FINE: Resolution = Resolution { seconds: 60 };
/// Coarse resolution: five-minute buckets, kept for [`COARSE_KEPT_MS`].
pub const COARSE: Resolution = Resolution { seconds: 300 };
/// Fine buckets cover the environment page's "last hour" (with margin for the idle rule).
pub const FINE_KEPT_MS: i64 = 2 * 3_600_000;
/// Coarse buckets cover its "last day".
pub const COARSE_KEPT_MS: i64 = 25 * 3_600_000;

/// The longest a single reading may stand for: a source that went quiet for an hour does
/// not make its next reading count for the hour.
pub const MAX_PERIOD_S: f64 = 300.0;

/// A bucket width of the sample store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolution {
    pub seconds: i64,
}

impl Resolution {
    /// The start (ms since the epoch) of the bucket holding `at_ms`.
    pub fn bucket_of(self, at_ms: i64) -> i64 {
        let width = self.seconds * 1000;
        at_ms.div_euclid(width) * width
    }
}

impl GpuReading {
    /// Refuses readings the store should not keep: out-of-range figures, a reading from
    /// the future, text too long.
    pub fn is_plausible(&self, now_ms: i64) -> bool {
        let pct = (0.0..=100.0).contains(&self.utilization_pct);
        // A total of 0 is a source that does not know it; otherwise used fits in it.
        let memory = self.memory_used_mib >= 0.0
            && self.memory_total_mib >= 0.0
            && (self.memory_total_mib == 0.0 || self.memory_used_mib <= self.memory_total_mib);
        let optional = |v: Option<f64>| v.is_none_or(|v| v.is_finite() && v >= 0.0);
        pct && memory
            && self.period_s.is_finite()
            && self.period_s > 0.0
            && optional(self.power_w)
            && optional(self.temperature_c)
            && self.gpu_index >= 0
            && self.slice_start.is_none_or(|s| (0..8).contains(&s))
            && self.node.len() <= 128
            && self.environment.as_ref().is_none_or(|e| e.len() <= 64)
            && self.at_ms <= now_ms + 60_000
    }

    /// The seconds this reading counts for (its period, at most [`MAX_PERIOD_S`]).
    pub fn counted_seconds(&self) -> f64 {
        self.period_s.min(MAX_PERIOD_S)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading() -> GpuReading {
        GpuReading {
            node: "gpu-a-01".into(),
            gpu_index: 0,
            slice_start: None,
            environment: None,
            at_ms: 1_000_000,
            period_s: 30.0,
            utilization_pct: 50.0,
            memory_used_mib: 1000.0,
            memory_total_mib: 81_559.0,
            power_w: Some(300.0),
            temperature_c: Some(40.0),
        }
    }

    #[test]
    fn buckets_start_at_whole_widths() {
        assert_eq!(FINE.bucket_of(119_999), 60_000);
        assert_eq!(FINE.bucket_of(120_000), 120_000);
        assert_eq!(COARSE.bucket_of(299_999), 0);
    }

    #[test]
    fn implausible_readings_are_refused() {
        assert!(reading().is_plausible(1_000_000));
        assert!(!GpuReading { utilization_pct: 101.0, ..reading() }.is_plausible(1_000_000));
        assert!(!GpuReading { utilization_pct: f64::NAN, ..reading() }.is_plausible(1_000_000));
        assert!(!GpuReading { memory_used_mib: 90_000.0, ..reading() }.is_plausible(1_000_000));
        assert!(!GpuReading { power_w: Some(-1.0), ..reading() }.is_plausible(1_000_000));
        assert!(!GpuReading { slice_start: Some(8), ..reading() }.is_plausible(1_000_000));
        assert!(!GpuReading { at_ms: 2_000_000, ..reading() }.is_plausible(1_000_000));
        assert_eq!(GpuReading { period_s: 3600.0, ..reading() }.counted_seconds(), MAX_PERIOD_S);
    }
}
