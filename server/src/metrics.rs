//! `/metrics` in the Prometheus text format: HTTP requests by route and status with a
//! latency histogram, plus environments by state and GPU-hours and cost charged per tenant
//! and project (read from the database per scrape), and notifications sent and failed per
//! channel.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

use berth_domain::lifecycle::EnvState;
use berth_platform::capacity::metering::UsageTotal;
use berth_platform::notifications::ChannelTotals;

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS: [f64; 11] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0];

#[derive(Default)]
struct Series {
    count: u64,
    sum_seconds: f64,
    /// Requests at or under each bound of `BUCKETS` (cumulative).
    buckets: [u64; BUCKETS.len()],
}

/// Request counts and latencies, keyed by (method, route pattern, status).
#[derive(Default)]
pub struct HttpMetrics {
    series: Mutex<BTreeMap<(String, String, u16), Series>>,
}

impl HttpMetrics {
    pub fn observe(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let mut series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        let s = series.entry((method.to_owned(), route.to_owned(), status)).or_default();
        s.count += 1;
        s.sum_seconds += seconds;
        for (bucket, bound) in s.buckets.iter_mut().zip(BUCKETS) {
            if seconds <= bound {
                *bucket += 1;
            }
        }
    }

    pub fn render(
        &self,
        environments: &[(EnvState, i64)],
        usage: &[UsageTotal],
        notifications: &[ChannelTotals],
    ) -> String {
        let mut out = String::new();
        let series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        out.push_str(
            "# HELP berth_http_requests_total HTTP requests answered.\n# TYPE berth_http_requests_total counter\n",
        );
        for ((method, route, status), s) in series.iter() {
            let _ = writeln!(
                out,
                "berth_http_requests_total{{method=\"{method}\",route=\"{}\",status=\"{status}\"}} {}",
                escape(route),
                s.count
            );
        }
        out.push_str(
            "# HELP berth_http_request_duration_seconds Time to answer HTTP requests.\n# TYPE berth_http_request_duration_seconds histogram\n",
        );
        for ((method, route, status), s) in series.iter() {
            let labels = format!("method=\"{method}\",route=\"{}\",status=\"{status}\"", escape(route));
            for (bound, n) in BUCKETS.iter().zip(s.buckets) {
                let _ = writeln!(out, "berth_http_request_duration_seconds_bucket{{{labels},le=\"{bound}\"}} {n}");
            }
            let _ = writeln!(out, "berth_http_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}", s.count);
            let _ = writeln!(out, "berth_http_request_duration_seconds_sum{{{labels}}} {}", s.sum_seconds);
            let _ = writeln!(out, "berth_http_request_duration_seconds_count{{{labels}}} {}", s.count);
        }
        out.push_str("# HELP berth_environments Environments by lifecycle state.\n# TYPE berth_environments gauge\n");
        for (state, n) in environments {
            let _ = writeln!(out, "berth_environments{{state=\"{}\"}} {n}", state.as_str());
        }
        out.push_str(
            "# HELP berth_usage_gpu_hours_total GPU-equivalent hours charged, by tenant and project.\n# TYPE berth_usage_gpu_hours_total counter\n",
        );
        for u in usage {
            let labels = format!("tenant=\"{}\",project=\"{}\"", escape(&u.tenant), escape(&u.project));
            let _ = writeln!(out, "berth_usage_gpu_hours_total{{{labels}}} {}", u.gpu_hours);
        }
        out.push_str(
            "# HELP berth_usage_cost_cents_total Cost charged in US cents, by tenant and project.\n# TYPE berth_usage_cost_cents_total counter\n",
        );
        for u in usage {
            let labels = format!("tenant=\"{}\",project=\"{}\"", escape(&u.tenant), escape(&u.project));
            let _ = writeln!(out, "berth_usage_cost_cents_total{{{labels}}} {}", u.cents);
        }
        out.push_str(
            "# HELP berth_notifications_sent_total Notifications delivered, by channel (in_app: written to the inbox).\n# TYPE berth_notifications_sent_total counter\n",
        );
        for n in notifications {
            let _ = writeln!(out, "berth_notifications_sent_total{{channel=\"{}\"}} {}", n.channel.as_str(), n.sent);
        }
        out.push_str(
            "# HELP berth_notifications_failed_total Failed tries to deliver a notification (each retry counts), by channel.\n# TYPE berth_notifications_failed_total counter\n",
        );
        for n in notifications {
            let _ =
                writeln!(out, "berth_notifications_failed_total{{channel=\"{}\"}} {}", n.channel.as_str(), n.failed);
        }
        out
    }
}

fn escape(label: &str) -> String {
    label.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_domain::notification::Channel;

    #[test]
    fn renders_counters_histograms_and_states() {
        let m = HttpMetrics::default();
        m.observe("GET", "/catalog", 200, Duration::from_millis(3));
        m.observe("GET", "/catalog", 200, Duration::from_millis(30));
        let usage = [UsageTotal { tenant: "acme".into(), project: "vision".into(), gpu_hours: 1.5, cents: 480 }];
        let notifications = [ChannelTotals { channel: Channel::Email, sent: 3, failed: 1 }];
        let text = m.render(&[(EnvState::Ready, 2), (EnvState::Failed, 0)], &usage, &notifications);
        assert!(text.contains("berth_http_requests_total{method=\"GET\",route=\"/catalog\",status=\"200\"} 2"));
        assert!(text.contains("le=\"0.005\"} 1"));
        assert!(text.contains("le=\"0.05\"} 2"));
        assert!(text.contains("le=\"+Inf\"} 2"));
        assert!(text.contains("berth_environments{state=\"ready\"} 2"));
        assert!(text.contains("berth_environments{state=\"failed\"} 0"));
        assert!(text.contains("berth_usage_gpu_hours_total{tenant=\"acme\",project=\"vision\"} 1.5"));
        assert!(text.contains("berth_usage_cost_cents_total{tenant=\"acme\",project=\"vision\"} 480"));
        assert!(text.contains("berth_notifications_sent_total{channel=\"email\"} 3"));
        assert!(text.contains("berth_notifications_failed_total{channel=\"email\"} 1"));
    }
}
