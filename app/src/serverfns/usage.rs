use leptos::prelude::*;

use crate::error::AppError;
use crate::model::UsageView;

/// A month of GPU-hours and cost within the caller's reach (`month` "2026-11", empty for
/// this month), grouped `by` project, person, offering, model, tier, tenant or environment,
/// with the budgets that apply. Platform staff may narrow it to one `tenant` (slug).
#[server(endpoint = "usage_page")]
pub async fn usage_page(month: String, by: String, tenant: String, per: String) -> Result<UsageView, AppError> {
    use berth_domain::metering::format_money;
    use berth_domain::policy::{Action, Reach};
    use berth_platform::capacity::metering::UsageBy;

    use chrono::Datelike;

    use crate::components::url_encode;
    let (platform, caller) = super::ssr::caller().await?;
    let fail = |e| AppError::from_platform(e, &caller.meta.request_id);
    let (month, by) = berth_platform::capacity::metering::parse_report(&month, &by).map_err(fail)?;
    let staff = caller.principal.reach(Action::UsageRead) == Some(Reach::All);
    let tenant = tenant.trim().to_owned();
    let report = platform
        .usage_report(&caller, month, by, Some(tenant.as_str()).filter(|t| !t.is_empty()))
        .await
        .map_err(fail)?;
    let tenant_options = if staff {
        let tenants = platform.tenants(&caller).await.map_err(fail)?;
        tenants.into_iter().map(|t| (t.slug, t.name)).collect()
    } else {
        Vec::new()
    };
    let (can_set_budgets, can_set_tenant_budgets) = platform.budget_reach(&caller);
    // The chart's budget line: the tenant's own, when the report covers one tenant.
    let one_tenant = !staff || !tenant.is_empty();
    let chart_budget_cents =
        report.budgets.iter().find(|b| one_tenant && b.project_id.is_none()).map(|b| b.cents_per_month);
    let budgets = report
        .budgets
        .iter()
        .map(|b| crate::model::BudgetView {
            id: b.id,
            of: b.of.clone(),
            budget: format_money(b.cents_per_month),
            warn_only: b.warn_only,
            spent: format_money(b.spent_cents),
            committed: format_money(b.committed_cents),
            percent: if b.cents_per_month > 0 { b.committed_cents * 100 / b.cents_per_month } else { 0 },
            reached: b.reached.iter().map(|p| format!("{p}%")).collect::<Vec<_>>().join(", "),
            removable: can_set_tenant_budgets || (can_set_budgets && b.project_id.is_some()),
        })
        .collect();
    // The chart draws the costliest lines and the rest as one: a bar per day stays readable.
    let shown = report.lines.len().min(CHART_SERIES - usize::from(report.lines.len() > CHART_SERIES));
    let mut chart_series: Vec<String> = report.lines.iter().take(shown).map(|l| l.label.clone()).collect();
    if report.lines.len() > shown {
        chart_series.push("Others".to_owned());
    }
    let series_of = |cents: &[i64]| {
        let mut series: Vec<i64> = cents.iter().take(shown).copied().collect();
        if cents.len() > shown {
            series.push(cents[shown..].iter().sum());
        }
        series
    };
    let daily_cents: Vec<Vec<i64>> = report.daily.iter().map(|day| series_of(&day.cents)).collect();
    // The bars: a day each, or a week each (`per=week`).
    let weekly = per.trim() == "week";
    let bars = if weekly {
        report
            .weekly
            .iter()
            .map(|w| crate::model::ChartBar {
                short: format!("W{}", w.first_day.iso_week().week()),
                label: week_label(w),
                cents: series_of(&w.cents),
            })
            .collect()
    } else {
        report
            .daily
            .iter()
            .map(|d| crate::model::ChartBar {
                short: d.first_day.day().to_string(),
                label: d.first_day.format("%a %-d %b").to_string(),
                cents: series_of(&d.cents),
            })
            .collect()
    };
    let weeks = report
        .weekly
        .iter()
        .map(|w| crate::model::WeekRow {
            label: week_label(w),
            gpu_hours: format!("{:.2}", w.total_gpu_hours()),
            cost: format_money(w.total_cents()),
        })
        .collect();
    let fleet = report
        .fleet
        .iter()
        .map(|m| {
            let (held, had): (f64, f64) = (m.allocated_gpu_hours.iter().sum(), m.capacity_gpu_hours.iter().sum());
            let share = |held: f64, had: f64| (had > 0.0).then(|| (held / had * 100.0).round() as i64);
            crate::model::ModelUseView {
                model: m.model.clone(),
                gpus: m.gpus,
                allocated: format!("{held:.1}"),
                idle: format!("{:.1}", (had - held).max(0.0)),
                percent: share(held, had).unwrap_or(0),
                daily_percent: m
                    .allocated_gpu_hours
                    .iter()
                    .zip(&m.capacity_gpu_hours)
                    .map(|(h, c)| share(*h, *c))
                    .collect(),
            }
        })
        .collect();
    let query = format!("month={}&by={}&tenant={}", month.key(), by.as_str(), url_encode(&tenant));
    let by_options = UsageBy::ALL
        .into_iter()
        .filter(|b| staff || *b != UsageBy::Tenant)
        .map(|b| (b.as_str().to_owned(), b.title().to_owned()))
        .collect();
    Ok(UsageView {
        month: month.key(),
        month_title: month.title(),
        previous_month: month.previous().key(),
        next_month: month.next().key(),
        by: by.as_str().to_owned(),
        by_title: by.title().to_owned(),
        by_options,
        tenant,
        tenant_options,
        basis: format!("A booking is charged for {}.", report.basis.describe()),
        counted_to: berth_domain::booking::utc_short(report.counted_to),
        lines: report
            .lines
            .iter()
            .map(|l| crate::model::UsageLineView {
                label: l.label.clone(),
                gpu_hours: format!("{:.2}", l.gpu_hours),
                environments: l.environments,
                cost: format_money(l.cents),
                cents: l.cents,
            })
            .collect(),
        total_gpu_hours: format!("{:.2}", report.total_gpu_hours),
        total: format_money(report.total_cents),
        chart_series,
        daily_cents,
        per: if weekly { "week" } else { "day" }.to_owned(),
        bars,
        weeks,
        fleet,
        chart_budget_cents,
        budgets,
        can_set_budgets,
        can_set_tenant_budgets,
        csv_href: format!("/usage.csv?{query}"),
        csv_week_href: format!("/usage.csv?{query}&per=week"),
        csv_day_href: format!("/usage.csv?{query}&per=day"),
        json_href: format!("/usage.json?{query}"),
    })
}

/// "Week 45: Mon 2 – Sun 8 Nov" (the days of the week in the month).
#[cfg(feature = "ssr")]
fn week_label(week: &berth_platform::capacity::metering::UsagePeriod) -> String {
    use chrono::Datelike;
    let day = |d: chrono::NaiveDate| d.format("%a %-d %b").to_string();
    let number = week.first_day.iso_week().week();
    if week.first_day == week.last_day {
        format!("Week {number}: {}", day(week.first_day))
    } else {
        format!("Week {number}: {} – {}", day(week.first_day), day(week.last_day))
    }
}

/// Series the usage chart draws (lines past the last but one are drawn together).
#[cfg(feature = "ssr")]
const CHART_SERIES: usize = 6;

/// Sets a monthly budget: a project's (`tenant/name`, or the name in the caller's tenant)
/// or, for platform admins, a tenant's (by slug). `amount` in dollars a month.
#[server(endpoint = "set_budget")]
pub async fn set_budget(
    level: String,
    who: String,
    amount: String,
    /// A checkbox: sent only when ticked.
    warn_only: Option<String>,
) -> Result<(), AppError> {
    use berth_platform::capacity::budgets::BudgetChange;
    let (platform, caller) = super::ssr::caller().await?;
    let change = BudgetChange { level, who, amount, warn_only: warn_only.is_some() };
    platform.set_budget(&caller, &change).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/usage?saved=budget");
    Ok(())
}

/// Removes a monthly budget.
#[server(endpoint = "remove_budget")]
pub async fn remove_budget(id: i64) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform.remove_budget(&caller, id).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/usage?saved=budget-removed");
    Ok(())
}

/// The closed monthly statements the caller may read (the tenant's admins and viewers, and
/// platform staff), newest first.
#[server(endpoint = "statements")]
pub async fn statements() -> Result<Vec<crate::model::StatementRow>, AppError> {
    use berth_domain::metering::{Month, format_money};
    let (platform, caller) = super::ssr::caller().await?;
    let rows = platform.statements(&caller).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    Ok(rows
        .into_iter()
        .map(|s| crate::model::StatementRow {
            id: s.id,
            tenant: s.tenant,
            month: Month::parse(&s.month).map_or(s.month, |m| m.title()),
            total: format_money(s.total_cents),
        })
        .collect())
}

/// One closed statement with its lines.
#[server(endpoint = "statement")]
pub async fn statement(id: i64) -> Result<crate::model::StatementView, AppError> {
    use berth_domain::metering::{ChargeBasis, format_money};
    let (platform, caller) = super::ssr::caller().await?;
    let s = platform.statement(&caller, id).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    let basis =
        ChargeBasis::parse(&s.basis).map_or_else(|| s.basis.clone(), |b| format!("Charged for {}.", b.describe()));
    Ok(crate::model::StatementView {
        id: s.id,
        tenant: s.tenant,
        month: s.month.title(),
        basis,
        closed_at: crate::time::utc(s.closed_at),
        lines: s
            .lines
            .into_iter()
            .map(|l| crate::model::StatementLineView {
                project: l.project.unwrap_or_else(|| "(none)".into()),
                person: l.person,
                offering: berth_domain::catalog::Offering::parse(&l.offering)
                    .map_or(l.offering, |o| o.title().to_owned()),
                size: l.size,
                tier: l.tier,
                unit_hours: format!("{:.2}", l.unit_hours),
                gpu_hours: format!("{:.2}", l.gpu_hours),
                rate: l.rate,
                amount: format_money(l.list_cents),
                discount: format_money(l.discount_cents),
                total: format_money(l.total_cents),
            })
            .collect(),
        amount: format_money(s.list_cents),
        discount: format_money(s.discount_cents),
        total: format_money(s.total_cents),
    })
}
