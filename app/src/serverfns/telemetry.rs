//! GPU use and idle reclamation: an environment's charts, "keep it", the idle policies,
//! and busy against read GPU-hours for the usage page.

use leptos::prelude::*;

use crate::error::AppError;
use crate::model::{GpuEfficiencyRow, GpuUseView, IdlePoliciesView, IdleView};

/// What environment `id`'s GPUs did in the last hour and day, and its standing with the
/// idle watcher.
#[server(endpoint = "environment_gpu_use")]
pub async fn environment_gpu_use(id: String) -> Result<(GpuUseView, IdleView), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let failed = |e| AppError::from_platform(e, &caller.meta.request_id);
    let used = platform.environment_gpu_use(&caller, &id).await.map_err(failed)?;
    let idle = platform.idle_status(&caller, &id).await.map_err(failed)?;
    let now = berth_platform::now_ms();
    Ok((views::gpu_use(&used, now), views::idle(&idle)))
}

/// "Keep it": the environment is in use; its idle clock starts again.
#[server(endpoint = "keep_environment")]
pub async fn keep_environment(id: String) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform.keep_environment(&caller, &id).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect(&format!("/environments/{id}#idle"));
    Ok(())
}

#[server(endpoint = "idle_policies")]
pub async fn idle_policies() -> Result<IdlePoliciesView, AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let policies =
        platform.idle_policies(&caller).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    Ok(views::policies(&policies))
}

/// Sets (or with `remove` set, removes) an idle policy: the platform's when `tenant` is
/// empty, else that tenant's. Durations as `90s`, `15m`, `1h`; an empty `max_keeps` is no
/// limit.
#[server(endpoint = "set_idle_policy")]
pub async fn set_idle_policy(
    tenant: String,
    offering: String,
    below_pct: String,
    idle_for: String,
    grace: String,
    max_keeps: String,
    remove: Option<String>,
) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let tenant_id = match tenant.trim() {
        "" => None,
        t => Some(t.parse::<i64>().map_err(|_| AppError::Refused("unknown tenant".into()))?),
    };
    let offering = berth_domain::catalog::Offering::parse(&offering)
        .ok_or_else(|| AppError::Refused(format!("unknown offering \"{offering}\"")))?;
    let policy = if remove.is_some() {
        None
    } else {
        Some(
            berth_domain::idle::IdlePolicy::parse(&below_pct, &idle_for, &grace, &max_keeps)
                .map_err(|r| AppError::from_platform(r.into(), &caller.meta.request_id))?,
        )
    };
    platform
        .set_idle_policy(&caller, tenant_id, offering, policy)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/idle-policies?saved=idle_policy");
    Ok(())
}

/// Busy against read GPU-hours per day, model and tenant over the last 14 days: every
/// tenant for platform staff, their own for tenant admins and viewers, none for members.
#[server(endpoint = "gpu_efficiency")]
pub async fn gpu_efficiency() -> Result<Vec<GpuEfficiencyRow>, AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let since = berth_platform::now_ms() - 13 * 86_400_000;
    let since = chrono::DateTime::from_timestamp_millis(since).map(|t| t.format("%Y-%m-%d").to_string());
    let days = platform
        .gpu_use_days(&caller, &since.unwrap_or_default())
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    Ok(days.iter().map(views::efficiency).collect())
}

#[cfg(feature = "ssr")]
mod views {
    use berth_domain::catalog::Offering;
    use berth_domain::idle::duration_text;
    use berth_platform::provisioning::idle::{IdlePolicies, IdleStatus};
    use berth_platform::provisioning::telemetry::{EnvironmentGpuUse, GpuUseDay, GpuUsePoint};

    use crate::model::{GpuEfficiencyRow, GpuUseView, IdlePoliciesView, IdlePolicyRow, IdleView, UseChartView};
    use crate::time::utc;

    const W: f64 = 300.0;
    const H: f64 = 60.0;

    pub fn gpu_use(used: &EnvironmentGpuUse, now: i64) -> GpuUseView {
        let latest = used.hour.last().map_or_else(
            || "No readings from its GPUs yet: they come from the node's agent, the DCGM exporter or the simulated fleet once it runs.".to_owned(),
            |p| {
                let mut parts = vec![
                    format!("{:.0}% busy", p.utilization_pct),
                    format!("{:.1} of {:.1} GiB", p.memory_used_mib / 1024.0, p.memory_total_mib / 1024.0),
                ];
                parts.extend(p.power_w.map(|w| format!("{w:.0} W")));
                parts.extend(p.temperature_c.map(|t| format!("{t:.0} °C")));
                format!("{} (minute from {})", parts.join(" · "), utc(p.at))
            },
        );
        let hour = (now - 3_600_000, "last hour", &used.hour);
        let day = (now - 86_400_000, "last day", &used.day);
        let mut charts = Vec::new();
        for (start, span, points) in [hour, day] {
            let memory_top = points.iter().map(|p| p.memory_total_mib).fold(0.0, f64::max).max(1.0);
            let power_top = points.iter().filter_map(|p| p.power_w).fold(0.0, f64::max).max(100.0);
            charts.push(chart(format!("Utilization, {span}"), "100%".into(), 100.0, start, now, points, |p| {
                Some(p.utilization_pct)
            }));
            charts.push(chart(
                format!("Memory used, {span}"),
                format!("{:.0} GiB", memory_top / 1024.0),
                memory_top,
                start,
                now,
                points,
                |p| Some(p.memory_used_mib),
            ));
            charts.push(chart(
                format!("Power, {span}"),
                format!("{power_top:.0} W"),
                power_top,
                start,
                now,
                points,
                |p| p.power_w,
            ));
        }
        GpuUseView {
            latest,
            has_readings: !used.hour.is_empty() || !used.day.is_empty(),
            charts,
            xid_errors: used.xid_errors.iter().map(|x| format!("{}: {}", utc(x.seen_at), x.describe())).collect(),
        }
    }

    fn chart(
        title: String,
        top_text: String,
        top: f64,
        start: i64,
        end: i64,
        points: &[GpuUsePoint],
        value: impl Fn(&GpuUsePoint) -> Option<f64>,
    ) -> UseChartView {
        let span = (end - start).max(1) as f64;
        let values: Vec<(i64, f64)> = points.iter().filter_map(|p| value(p).map(|v| (p.at, v))).collect();
        let polyline = values
            .iter()
            .map(|(at, v)| {
                let x = ((at - start) as f64 / span * W).clamp(0.0, W);
                let y = H - (v / top).clamp(0.0, 1.0) * H;
                format!("{x:.1},{y:.1}")
            })
            .collect::<Vec<_>>()
            .join(" ");
        let summary = if values.is_empty() {
            format!("{title}: no readings")
        } else {
            let average = values.iter().map(|(_, v)| v).sum::<f64>() / values.len() as f64;
            let peak = values.iter().map(|(_, v)| *v).fold(0.0, f64::max);
            let unit = if title.starts_with("Utilization") {
                "%"
            } else if title.starts_with("Power") {
                " W"
            } else {
                " MiB"
            };
            format!("{title}: average {average:.0}{unit}, peak {peak:.0}{unit}")
        };
        UseChartView { title, top: top_text, points: polyline, summary }
    }

    pub fn idle(status: &IdleStatus) -> IdleView {
        let keeps = match status.keeps_left {
            Some(left) => format!("{} of {} keeps used", status.keeps_used, status.keeps_used + left),
            None if status.keeps_used > 0 => format!("{} keeps used", status.keeps_used),
            None => String::new(),
        };
        let outcome = status.outcome.unwrap_or("stopped");
        IdleView {
            policy: status.policy.clone(),
            warning: status.warning.map(|(since, stop_at)| {
                format!(
                    "Its GPUs have been idle since {}. It will be {outcome} at {} unless you keep it.",
                    utc(since),
                    utc(stop_at)
                )
            }),
            warning_title: format!("Idle: it will be {outcome}"),
            may_keep: status.may_keep,
            keeps,
            stopped: status.stopped_at.map(|at| format!("Stopped for idleness at {}.", utc(at))),
        }
    }

    pub fn policies(p: &IdlePolicies) -> IdlePoliciesView {
        let rows = p
            .policies
            .iter()
            .map(|s| IdlePolicyRow {
                whose: s.tenant.as_ref().map_or_else(|| "Platform".to_owned(), |(_, slug)| slug.clone()),
                tenant_id: s.tenant.as_ref().map(|(id, _)| *id),
                offering: s.offering.id().to_owned(),
                offering_title: s.offering.title().to_owned(),
                below_pct: format!("{}", s.policy.below_pct),
                idle_for: duration_text(s.policy.idle_for_s),
                grace: duration_text(s.policy.grace_s),
                max_keeps: s.policy.max_keeps.map(|k| k.to_string()).unwrap_or_default(),
                summary: s.policy.describe(),
                may_change: match &s.tenant {
                    None => p.manages_platform,
                    Some((id, _)) => p.manages_tenants.iter().any(|(t, _)| t == id),
                },
            })
            .collect();
        IdlePoliciesView {
            rows,
            manages_platform: p.manages_platform,
            tenants: p.manages_tenants.clone(),
            offerings: Offering::ALL.iter().map(|o| (o.id().to_owned(), o.title().to_owned())).collect(),
        }
    }

    pub fn efficiency(d: &GpuUseDay) -> GpuEfficiencyRow {
        let share = if d.read_gpu_hours > 0.0 { d.busy_gpu_hours / d.read_gpu_hours * 100.0 } else { 0.0 };
        GpuEfficiencyRow {
            day: d.day.clone(),
            tenant: d.tenant.clone().unwrap_or_else(|| "platform staff".to_owned()),
            model: d.model.clone(),
            read_hours: format!("{:.2}", d.read_gpu_hours),
            busy_hours: format!("{:.2}", d.busy_gpu_hours),
            busy_share: format!("{share:.0}%"),
        }
    }
}
