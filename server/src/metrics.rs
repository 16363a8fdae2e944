//! `/metrics` in the Prometheus text format (0.0.4), written by prometheus-client: HTTP
//! requests by route and status with a latency histogram; launches by offering and outcome
//! with their latency, and the reconciler's step durations and failures (counted in the
//! platform, `berth_platform::metrics`); and, read per scrape and handed to [`HttpMetrics::render`]
//! as plain inputs ([`Readings`]): environments by state, GPU-hours and cost charged per
//! tenant and project, notifications sent and failed per channel, each held GPU's figures
//! now and idle stops per tenant.
//!
//! Every family is declared on every scrape, with its HELP and TYPE even while it has no
//! series yet (prometheus-client's registry leaves empty families out), so dashboards and
//! alerts find each name from the first scrape on.
//!
//! Cardinality: every label comes from a fixed list (method, route pattern, status,
//! offering, outcome, step, state, channel) or from records an administrator creates
//! (tenants, projects), except the per-GPU gauges, which have one series per GPU held by an
//! environment and go away with the booking. `BENCHMARKS.md` counts a 10,000-GPU fleet.

use std::fmt;
use std::time::Duration;

use berth_domain::lifecycle::EnvState;
use berth_platform::capacity::metering::UsageTotal;
use berth_platform::notifications::ChannelTotals;
pub use berth_platform::provisioning::telemetry::GpuNow;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The answer's `Content-Type`: the Prometheus text format, version 0.0.4.
pub use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Upper bounds of the HTTP latency buckets, in seconds.
const BUCKETS: [f64; 11] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0];

type FloatCounter = Counter<f64, std::sync::atomic::AtomicU64>;
type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    method: String,
    route: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantProject {
    tenant: String,
    project: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ChannelLabel {
    channel: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    tenant: String,
    project: String,
    environment: String,
    node: String,
    gpu: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabel {
    tenant: String,
}

/// What a scrape reads from the database (or the sample store) and hands to the render.
#[derive(Debug, Clone, Copy, Default)]
pub struct Readings<'a> {
    pub environments: &'a [(EnvState, i64)],
    pub usage: &'a [UsageTotal],
    pub notifications: &'a [ChannelTotals],
    pub gpus: &'a [GpuNow],
    /// Environments stopped for idleness, per tenant, since the records began.
    pub idle_stops: &'a [(String, u64)],
}

/// Request counts and latencies, keyed by (method, route pattern, status).
pub struct HttpMetrics {
    requests: Family<HttpLabels, Counter>,
    durations: Family<HttpLabels, Histogram, fn() -> Histogram>,
}

impl Default for HttpMetrics {
    fn default() -> Self {
        HttpMetrics { requests: Family::default(), durations: Family::new_with_constructor(|| Histogram::new(BUCKETS)) }
    }
}

impl HttpMetrics {
    pub fn observe(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        let labels = HttpLabels { method: method.to_owned(), route: route.to_owned(), status };
        self.requests.get_or_create(&labels).inc();
        self.durations.get_or_create(&labels).observe(elapsed.as_secs_f64());
    }

    /// The whole exposition: what this process counted, what the platform counted
    /// (`platform`), and what the scrape read (`now`).
    pub fn render(
        &self,
        platform: &berth_platform::metrics::Metrics,
        now: &Readings<'_>,
    ) -> Result<String, fmt::Error> {
        let mut registry = Registry::default();
        let mut declare = |name: &'static str, help: &'static str, metric: Box<dyn EncodeMetric + Send + Sync>| {
            registry.register_collector(Box::new(Declared { name, help, metric }));
        };
        declare("berth_http_requests", "HTTP requests answered.", Box::new(self.requests.clone()));
        declare(
            "berth_http_request_duration_seconds",
            "Time to answer HTTP requests.",
            Box::new(self.durations.clone()),
        );

        let environments = Family::<StateLabel, Gauge>::default();
        for (state, n) in now.environments {
            environments.get_or_create(&StateLabel { state: state.as_str() }).set(*n);
        }
        declare("berth_environments", "Environments by lifecycle state.", Box::new(environments));

        let gpu_hours = Family::<TenantProject, FloatCounter>::default();
        let cents = Family::<TenantProject, Counter>::default();
        for u in now.usage {
            let labels = TenantProject { tenant: u.tenant.clone(), project: u.project.clone() };
            gpu_hours.get_or_create(&labels).inc_by(u.gpu_hours);
            // Never negative: a charge is a product of non-negative rates and times.
            cents.get_or_create(&labels).inc_by(u64::try_from(u.cents).unwrap_or(0));
        }
        declare("berth_usage_gpu_hours", "GPU-equivalent hours charged, by tenant and project.", Box::new(gpu_hours));
        declare("berth_usage_cost_cents", "Cost charged in US cents, by tenant and project.", Box::new(cents));

        let sent = Family::<ChannelLabel, Counter>::default();
        let failed = Family::<ChannelLabel, Counter>::default();
        for n in now.notifications {
            let channel = ChannelLabel { channel: n.channel.as_str() };
            sent.get_or_create(&channel).inc_by(n.sent);
            failed.get_or_create(&channel).inc_by(n.failed);
        }
        declare(
            "berth_notifications_sent",
            "Notifications delivered, by channel (in_app: written to the inbox).",
            Box::new(sent),
        );
        declare(
            "berth_notifications_failed",
            "Failed tries to deliver a notification (each retry counts), by channel.",
            Box::new(failed),
        );

        declare(
            "berth_bookings",
            "Launches by offering and outcome (booked or refused).",
            Box::new(platform.launches().clone()),
        );
        declare(
            "berth_booking_duration_seconds",
            "Time a launch takes in the platform, from authorization to its answer, by offering.",
            Box::new(platform.launch_seconds().clone()),
        );
        declare(
            "berth_reconciler_step_duration_seconds",
            "Time a reconciler step's backend call took, by step.",
            Box::new(platform.step_seconds().clone()),
        );
        declare(
            "berth_reconciler_step_failures",
            "Reconciler steps whose backend call failed or timed out, by step.",
            Box::new(platform.step_failures().clone()),
        );

        let utilization = Family::<GpuLabels, FloatGauge>::default();
        let memory = Family::<GpuLabels, FloatGauge>::default();
        let power = Family::<GpuLabels, FloatGauge>::default();
        let temperature = Family::<GpuLabels, FloatGauge>::default();
        for g in now.gpus {
            let labels = GpuLabels {
                tenant: g.tenant.clone(),
                project: g.project.clone(),
                environment: g.environment.clone(),
                node: g.node.clone(),
                gpu: g.gpu.clone(),
            };
            utilization.get_or_create(&labels).set(g.utilization_pct);
            memory.get_or_create(&labels).set(g.memory_used_mib * 1_048_576.0);
            if let Some(w) = g.power_w {
                power.get_or_create(&labels).set(w);
            }
            if let Some(c) = g.temperature_c {
                temperature.get_or_create(&labels).set(c);
            }
        }
        declare(
            "berth_gpu_utilization_percent",
            "Utilization of a GPU or MIG instance held by an environment, 0 to 100, as last read.",
            Box::new(utilization),
        );
        declare(
            "berth_gpu_memory_used_bytes",
            "Memory used on a GPU or MIG instance held by an environment, as last read.",
            Box::new(memory),
        );
        declare("berth_gpu_power_watts", "Power drawn by a GPU held by an environment, as last read.", Box::new(power));
        declare(
            "berth_gpu_temperature_celsius",
            "Temperature of a GPU held by an environment, as last read.",
            Box::new(temperature),
        );

        let idle_stops = Family::<TenantLabel, Counter>::default();
        for (tenant, n) in now.idle_stops {
            idle_stops.get_or_create(&TenantLabel { tenant: tenant.clone() }).inc_by(*n);
        }
        declare("berth_idle_stops", "Environments stopped for idleness, by tenant.", Box::new(idle_stops));

        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry)?;
        Ok(text)
    }
}

/// A metric family written with its HELP and TYPE even when it has no series.
struct Declared {
    name: &'static str,
    help: &'static str,
    metric: Box<dyn EncodeMetric + Send + Sync>,
}

impl fmt::Debug for Declared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Declared").field("name", &self.name).finish()
    }
}

impl Collector for Declared {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let series = encoder.encode_descriptor(self.name, self.help, None, self.metric.metric_type())?;
        self.metric.encode(series)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_domain::catalog::Offering;
    use berth_domain::lifecycle::Step;
    use berth_domain::notification::Channel;
    use berth_platform::metrics::{LaunchOutcome, Metrics};

    #[test]
    fn renders_counters_histograms_and_states() {
        let m = HttpMetrics::default();
        m.observe("GET", "/catalog", 200, Duration::from_millis(3));
        m.observe("GET", "/catalog", 200, Duration::from_millis(30));
        let usage = [UsageTotal { tenant: "acme".into(), project: "vision".into(), gpu_hours: 1.5, cents: 480 }];
        let notifications = [ChannelTotals { channel: Channel::Email, sent: 3, failed: 1 }];
        let environments = [(EnvState::Ready, 2), (EnvState::Failed, 0)];
        let now = Readings {
            environments: &environments,
            usage: &usage,
            notifications: &notifications,
            ..Default::default()
        };
        let text = m.render(&Metrics::default(), &now).expect("rendered");
        assert!(text.contains("# TYPE berth_http_requests_total counter"), "{text}");
        assert!(
            text.contains("berth_http_requests_total{method=\"GET\",route=\"/catalog\",status=\"200\"} 2"),
            "{text}"
        );
        assert!(text.contains("le=\"0.005\"} 1"));
        assert!(text.contains("le=\"0.05\"} 2"));
        assert!(text.contains("le=\"+Inf\"} 2"));
        assert!(text.contains("berth_environments{state=\"ready\"} 2"));
        assert!(text.contains("berth_environments{state=\"failed\"} 0"));
        assert!(text.contains("berth_usage_gpu_hours_total{tenant=\"acme\",project=\"vision\"} 1.5"), "{text}");
        assert!(text.contains("berth_usage_cost_cents_total{tenant=\"acme\",project=\"vision\"} 480"));
        assert!(text.contains("berth_notifications_sent_total{channel=\"email\"} 3"));
        assert!(text.contains("berth_notifications_failed_total{channel=\"email\"} 1"));
    }

    #[test]
    fn every_family_is_declared_before_it_has_a_series() {
        let text = HttpMetrics::default().render(&Metrics::default(), &Readings::default()).expect("rendered");
        for (family, kind) in [
            ("berth_bookings_total", "counter"),
            ("berth_booking_duration_seconds", "histogram"),
            ("berth_reconciler_step_duration_seconds", "histogram"),
            ("berth_reconciler_step_failures_total", "counter"),
            ("berth_gpu_utilization_percent", "gauge"),
            ("berth_gpu_memory_used_bytes", "gauge"),
            ("berth_gpu_power_watts", "gauge"),
            ("berth_gpu_temperature_celsius", "gauge"),
            ("berth_idle_stops_total", "counter"),
            ("berth_notifications_sent_total", "counter"),
        ] {
            assert!(text.contains(&format!("# TYPE {family} {kind}\n")), "{family}: {text}");
            assert!(text.contains(&format!("# HELP {family} ")), "{family}: {text}");
        }
    }

    /// The cardinality `BENCHMARKS.md` states: four series per held GPU.
    #[test]
    fn a_fleet_of_ten_thousand_held_gpus_makes_four_series_each() {
        let gpus: Vec<GpuNow> = (0..10_000)
            .map(|i| GpuNow {
                tenant: format!("tenant-{}", i % 100),
                project: format!("project-{}", i % 1000),
                environment: format!("env-{}", i / 8),
                node: format!("node-{}", i / 8),
                gpu: (i % 8).to_string(),
                utilization_pct: 50.0,
                memory_used_mib: 1000.0,
                power_w: Some(300.0),
                temperature_c: Some(50.0),
            })
            .collect();
        let started = std::time::Instant::now();
        let text = HttpMetrics::default()
            .render(&Metrics::default(), &Readings { gpus: &gpus, ..Default::default() })
            .expect("rendered");
        let took = started.elapsed();
        let gpu_series = text.lines().filter(|l| l.starts_with("berth_gpu_")).count();
        assert_eq!(gpu_series, 40_000, "rendered in {took:?}, {} bytes", text.len());
    }

    #[test]
    fn launches_steps_gpus_and_idle_stops_have_their_labels() {
        let platform = Metrics::default();
        platform.launch_ended(Some(Offering::Notebook), LaunchOutcome::Booked, Duration::from_millis(4));
        platform.launch_ended(Some(Offering::Notebook), LaunchOutcome::Refused, Duration::from_millis(2));
        platform.step_ended(Step::StartWorkload, Duration::from_millis(700), true);
        let gpus = [GpuNow {
            tenant: "acme".into(),
            project: "vision".into(),
            environment: "env-1".into(),
            node: "h100-1".into(),
            gpu: "0".into(),
            utilization_pct: 87.5,
            memory_used_mib: 1024.0,
            power_w: Some(310.0),
            temperature_c: None,
        }];
        let idle_stops = [("acme".to_owned(), 3)];
        let now = Readings { gpus: &gpus, idle_stops: &idle_stops, ..Default::default() };
        let text = HttpMetrics::default().render(&platform, &now).expect("rendered");
        assert!(text.contains("berth_bookings_total{offering=\"notebook\",outcome=\"booked\"} 1"), "{text}");
        assert!(text.contains("berth_bookings_total{offering=\"notebook\",outcome=\"refused\"} 1"), "{text}");
        assert!(text.contains("berth_booking_duration_seconds_count{offering=\"notebook\"} 2"), "{text}");
        assert!(
            text.contains("berth_reconciler_step_duration_seconds_bucket{step=\"start_workload\",le=\"1\"} 1"),
            "{text}"
        );
        assert!(text.contains("berth_reconciler_step_failures_total{step=\"start_workload\"} 1"), "{text}");
        let labels = "tenant=\"acme\",project=\"vision\",environment=\"env-1\",node=\"h100-1\",gpu=\"0\"";
        assert!(text.contains(&format!("berth_gpu_utilization_percent{{{labels}}} 87.5")), "{text}");
        assert!(text.contains(&format!("berth_gpu_memory_used_bytes{{{labels}}} 1073741824")), "{text}");
        assert!(text.contains(&format!("berth_gpu_power_watts{{{labels}}} 310")), "{text}");
        assert!(!text.contains("berth_gpu_temperature_celsius{"), "an unknown temperature is left out: {text}");
        assert!(text.contains("berth_idle_stops_total{tenant=\"acme\"} 3"), "{text}");
    }
}
