use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use crate::components::form::{BUTTON, INPUT, LABEL};
use crate::components::table::{CELL, ROW_HEADER};
use crate::components::{CARD, ConfirmButton, ErrorAlert, Field, RequireUser, SavedNotice, Table};
use crate::model::{BudgetView, GpuEfficiencyRow, ModelUseView, UsageView};
use crate::serverfns::{RemoveBudget, SetBudget, gpu_efficiency, usage_page};

/// A month of GPU-hours and cost: a chart of each day's cost by line, the cost to date
/// against the budget, the lines as a table (with CSV and JSON downloads), and the budgets
/// that apply with how far the month has gone into them. Works without JavaScript: the
/// filters are a GET form, the charts are drawn on the server.
#[component]
pub fn UsagePage() -> impl IntoView {
    let query = use_query_map();
    let set = ServerAction::<SetBudget>::new();
    let remove = ServerAction::<RemoveBudget>::new();
    let data = Resource::new(
        move || {
            let q = query.read();
            let get = |key: &str| q.get(key).unwrap_or_default();
            (get("month"), get("by"), get("tenant"), get("per"), set.version().get(), remove.version().get())
        },
        |(month, by, tenant, per, _, _)| usage_page(month, by, tenant, per),
    );
    view! {
        <Title text="Usage and cost"/>
        <RequireUser>
            <h1 class="text-2xl font-bold tracking-tight text-slate-900">"Usage and cost"</h1>
            <SavedNotice/>
            <Transition fallback=|| view! { <p class="text-slate-600">"Loading..."</p> }>
                {move || Suspend::new(async move {
                    match data.await {
                        Ok(view) => view! { <Usage view=view.clone() remove/> <BudgetForm view set/> }.into_any(),
                        Err(error) => view! { <ErrorAlert error/> }.into_any(),
                    }
                })}
            </Transition>
            {move || remove.value().get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
            <Efficiency/>
        </RequireUser>
    }
}

/// How busy the booked GPUs were: GPU-hours read against GPU-hours busy (utilization
/// times time), per day, tenant and model, for platform staff and tenant admins and
/// viewers. Members see their GPUs' use on their environments' pages.
#[component]
fn Efficiency() -> impl IntoView {
    let rows = Resource::new(|| (), |_| gpu_efficiency());
    view! {
        <Transition fallback=|| ()>
            {move || Suspend::new(async move {
                match rows.await {
                    Ok(rows) if !rows.is_empty() => view! { <EfficiencyTable rows/> }.into_any(),
                    Ok(_) => ().into_any(),
                    Err(error) => view! { <ErrorAlert error/> }.into_any(),
                }
            })}
        </Transition>
    }
}

#[component]
fn EfficiencyTable(rows: Vec<GpuEfficiencyRow>) -> impl IntoView {
    view! {
        <section class="mt-8" aria-labelledby="efficiency-title" data-efficiency="">
            <h2 id="efficiency-title" class="text-lg font-semibold text-slate-900">"How busy the booked GPUs were"</h2>
            <p class="mt-1 max-w-3xl text-sm text-slate-600">
                "The last 14 days. Read: GPU-hours of booked GPUs (and slices, as GPU-equivalents) with readings from their GPUs. Busy: those hours times the GPUs' utilization. A low share is capacity booked and left idle."
            </p>
            <Table label="GPU-hours read and busy" columns=&["Day", "Tenant", "Model", "Read (GPU-h)", "Busy (GPU-h)", "Busy share"]>
                {rows.into_iter().map(|r| view! {
                    <tr>
                        <th scope="row" class=ROW_HEADER>{r.day}</th>
                        <td class=CELL>{r.tenant}</td>
                        <td class=CELL>{r.model}</td>
                        <td class=CELL>{r.read_hours}</td>
                        <td class=CELL>{r.busy_hours}</td>
                        <td class=CELL>{r.busy_share}</td>
                    </tr>
                }).collect_view()}
            </Table>
        </section>
    }
}

const NAV: &str = "rounded-md px-3 py-1.5 text-sm font-medium text-slate-700 ring-1 ring-slate-300 hover:bg-slate-50";

/// Fills of the chart's series, in the order of the table (the costliest first, then
/// "Others").
const FILLS: [&str; 6] =
    ["fill-indigo-600", "fill-teal-600", "fill-amber-500", "fill-rose-600", "fill-sky-500", "fill-slate-400"];
const SWATCHES: [&str; 6] =
    ["bg-indigo-600", "bg-teal-600", "bg-amber-500", "bg-rose-600", "bg-sky-500", "bg-slate-400"];

#[component]
fn Usage(view: UsageView, remove: ServerAction<RemoveBudget>) -> impl IntoView {
    let month_href = |month: &str| {
        format!(
            "/usage?month={month}&by={}&tenant={}&per={}",
            view.by,
            crate::components::url_encode(&view.tenant),
            view.per
        )
    };
    view! {
        <p class="mt-1 max-w-3xl text-sm text-slate-600">
            {view.basis.clone()}
            " GPU-hours count GPU-equivalents (a 3g slice of an H100 is 3/7 of a GPU, a quarter share 1/4). Times are UTC; time is counted up to "
            {view.counted_to.clone()} ". Each hour is charged at the "
            <a href="/admin/prices" class="text-indigo-700 underline hover:text-indigo-500">"rate card"</a>
            "'s price in force then, less discounts. Closed months: "
            <a href="/usage/statements" class="text-indigo-700 underline hover:text-indigo-500">"statements"</a>
            "."
        </p>
        <form method="get" action="/usage" class="mt-4 flex flex-wrap items-end gap-3" aria-label="Report">
            <div>
                <label for="u-month" class=LABEL>"Month"</label>
                <input id="u-month" name="month" type="month" value=view.month.clone() pattern=r"\d{4}-\d{2}"
                    placeholder="2026-11" class=INPUT/>
            </div>
            <div>
                <label for="u-by" class=LABEL>"Lines by"</label>
                <select id="u-by" name="by" class=INPUT>
                    {view.by_options.iter().map(|(value, label)| view! {
                        <option value=value.clone() selected=*value == view.by>{label.clone()}</option>
                    }).collect_view()}
                </select>
            </div>
            {(!view.tenant_options.is_empty()).then(|| view! {
                <div>
                    <label for="u-tenant" class=LABEL>"Tenant"</label>
                    <select id="u-tenant" name="tenant" class=INPUT>
                        <option value="">"All tenants"</option>
                        {view.tenant_options.iter().map(|(slug, name)| view! {
                            <option value=slug.clone() selected=*slug == view.tenant>{name.clone()}</option>
                        }).collect_view()}
                    </select>
                </div>
            })}
            <button type="submit" class=BUTTON>"Show"</button>
            <a class=NAV href=month_href(&view.previous_month)>"Previous month"</a>
            <a class=NAV href=month_href(&view.next_month)>"Next month"</a>
            <span class="ml-auto flex gap-2 text-sm">
                <a class="text-indigo-700 underline" href=view.csv_href.clone() rel="external" download=format!("berth-usage-{}.csv", view.month)>"Download CSV"</a>
                <a class="text-indigo-700 underline" href=view.csv_week_href.clone() rel="external" download=format!("berth-usage-{}-by-week.csv", view.month)>"CSV by week"</a>
                <a class="text-indigo-700 underline" href=view.csv_day_href.clone() rel="external" download=format!("berth-usage-{}-by-day.csv", view.month)>"CSV by day"</a>
                <a class="text-indigo-700 underline" href=view.json_href.clone() rel="external" download=format!("berth-usage-{}.json", view.month)>"Download JSON"</a>
            </span>
        </form>
        <section class=CARD aria-labelledby="u-summary">
            <h2 id="u-summary" class="text-sm font-semibold text-slate-900">{view.month_title.clone()}</h2>
            <p class="mt-1 text-sm text-slate-700">
                <span class="text-2xl font-semibold text-slate-900" data-testid="usage-total">{view.total.clone()}</span>
                " for " {view.total_gpu_hours.clone()} " GPU-hours"
            </p>
            <CostChart view=view.clone()/>
            <ToDateChart view=view.clone()/>
        </section>
        <UsageTable view=view.clone()/>
        <Weeks view=view.clone()/>
        <Budgets budgets=view.budgets.clone() remove/>
        <FleetAllocation fleet=view.fleet.clone()/>
    }
}

/// Cost per day (or per week), one stacked bar a day (a week) with a part per line, and
/// links that switch between the two (plain links: no JavaScript needed).
#[component]
fn CostChart(view: UsageView) -> impl IntoView {
    const W: f64 = 720.0;
    const H: f64 = 160.0;
    let weekly = view.per == "week";
    let what = if weekly { "week" } else { "day" };
    let count = view.bars.len().max(1);
    let top = view.bars.iter().map(|b| b.cents.iter().sum::<i64>()).max().unwrap_or(0).max(1);
    let slot = W / count as f64;
    let bars = view.bars.iter().enumerate().flat_map(|(i, bar)| {
        let mut y = H;
        bar.cents
            .iter()
            .enumerate()
            .filter(|(_, cents)| **cents > 0)
            .map(|(line, cents)| {
                let height = H * *cents as f64 / top as f64;
                y -= height;
                let label = view.chart_series.get(line).cloned().unwrap_or_default();
                let title = format!("{}: {label} {}", bar.label, berth_domain::metering::format_money(*cents));
                view! {
                    <rect x=format!("{:.1}", i as f64 * slot + 1.0) y=format!("{y:.1}")
                        width=format!("{:.1}", (slot - 2.0).max(1.0)) height=format!("{height:.1}")
                        class=FILLS[line.min(FILLS.len() - 1)]><title>{title}</title></rect>
                }
            })
            .collect::<Vec<_>>()
    });
    // Weeks are few: each is named under its bar; days only at the ends.
    let ticks = view.bars.iter().enumerate().filter(|(i, _)| weekly || *i == 0 || *i + 1 == view.bars.len()).map(|(i, bar)| {
        let x = if weekly { (i as f64 + 0.5) * slot } else if i == 0 { 0.0 } else { W };
        let anchor = if weekly { "middle" } else if i == 0 { "start" } else { "end" };
        view! { <text x=format!("{x:.1}") y=H + 13.0 text-anchor=anchor class="fill-slate-600 text-[10px]">{bar.short.clone()}</text> }
    }).collect_view();
    let switch = |current: bool| if current { "font-semibold text-slate-900" } else { "text-indigo-700 underline" };
    let per_href = |per: &str| {
        format!(
            "/usage?month={}&by={}&tenant={}&per={per}",
            view.month,
            view.by,
            crate::components::url_encode(&view.tenant)
        )
    };
    view! {
        <figure class="mt-4">
            <figcaption class="flex flex-wrap items-baseline gap-3 text-xs font-medium text-slate-700">
                {format!("Cost per {what}")}
                <span class="flex gap-2 font-normal">
                    <a href=per_href("day") aria-current=(!weekly).then_some("page") class=switch(!weekly)>"Per day"</a>
                    <a href=per_href("week") aria-current=weekly.then_some("page") class=switch(weekly)>"Per week"</a>
                </span>
            </figcaption>
            <svg viewBox=format!("0 0 {W} {}", H + 16.0) class="mt-1 h-44 w-full" role="img"
                aria-label=format!("Cost per {what} in {}; the tables below have the figures", view.month_title)>
                <line x1="0" y1=H x2=W y2=H class="stroke-slate-300"/>
                {bars.collect_view()}
                {ticks}
                <text x="2" y="10" class="fill-slate-600 text-[10px]">{berth_domain::metering::format_money(top)}</text>
            </svg>
            <ul class="mt-1 flex flex-wrap gap-3 text-xs text-slate-700">
                {view.chart_series.iter().take(FILLS.len()).enumerate().map(|(i, label)| view! {
                    <li class="flex items-center gap-1"><span class=format!("inline-block h-2.5 w-2.5 rounded-sm {}", SWATCHES[i])></span>{label.clone()}</li>
                }).collect_view()}
            </ul>
        </figure>
    }
}

/// The month week by week.
#[component]
fn Weeks(view: UsageView) -> impl IntoView {
    (!view.lines.is_empty()).then(|| view! {
        <section class="mt-6" aria-labelledby="u-weeks">
            <h2 id="u-weeks" class="text-sm font-semibold text-slate-900">"Week by week"</h2>
            <p class="mt-1 text-xs text-slate-600">
                "Weeks run Monday to Sunday (UTC) and are numbered as ISO 8601 weeks; a week across two months shows its days in this one. Each week's cost is rounded once per line, so weeks can differ from the month's lines by under a cent a line."
            </p>
            <Table label="Week by week" columns=&["Week", "GPU-hours", "Cost"]>
                {view.weeks.iter().map(|w| view! {
                    <tr data-week=w.label.clone()>
                        <th scope="row" class=ROW_HEADER>{w.label.clone()}</th>
                        <td class=CELL>{w.gpu_hours.clone()}</td>
                        <td class=CELL>{w.cost.clone()}</td>
                    </tr>
                }).collect_view()}
            </Table>
        </section>
    })
}

/// The cost to date, day by day, against the budget when there is one.
#[component]
fn ToDateChart(view: UsageView) -> impl IntoView {
    const W: f64 = 720.0;
    const H: f64 = 120.0;
    let days = view.daily_cents.len().max(1);
    let mut total = 0;
    let to_date: Vec<i64> = view
        .daily_cents
        .iter()
        .map(|d| {
            total += d.iter().sum::<i64>();
            total
        })
        .collect();
    let top = to_date.last().copied().unwrap_or(0).max(view.chart_budget_cents.unwrap_or(0)).max(1);
    let y = |cents: i64| H - H * cents as f64 / top as f64;
    let points = std::iter::once(format!("0,{H}"))
        .chain(
            to_date
                .iter()
                .enumerate()
                .map(|(day, cents)| format!("{:.1},{:.1}", (day + 1) as f64 * W / days as f64, y(*cents))),
        )
        .collect::<Vec<_>>()
        .join(" ");
    let money = berth_domain::metering::format_money;
    view! {
        <figure class="mt-4">
            <figcaption class="text-xs font-medium text-slate-700">
                "Cost to date"
                {view.chart_budget_cents.map(|b| format!(" against the budget of {}", money(b)))}
            </figcaption>
            <svg viewBox=format!("0 0 {W} {}", H + 4.0) class="mt-1 h-32 w-full" role="img"
                aria-label=format!("Cost to date: {}", view.total)>
                <line x1="0" y1=H x2=W y2=H class="stroke-slate-300"/>
                {view.chart_budget_cents.map(|b| view! {
                    <line x1="0" y1=format!("{:.1}", y(b)) x2=W y2=format!("{:.1}", y(b)) stroke-dasharray="6 4" class="stroke-rose-600"/>
                    <text x=W y=format!("{:.1}", y(b) - 3.0) text-anchor="end" class="fill-rose-700 text-[10px]">{format!("Budget {}", money(b))}</text>
                })}
                <polyline points=points fill="none" stroke-width="2" class="stroke-indigo-600"/>
            </svg>
        </figure>
    }
}

#[component]
fn UsageTable(view: UsageView) -> impl IntoView {
    if view.lines.is_empty() {
        return view! { <p class="mt-4 text-sm text-slate-600">"Nothing was charged in this month."</p> }.into_any();
    }
    let columns: &'static [&'static str] = match view.by.as_str() {
        "person" => &["Person", "GPU-hours", "Environments", "Cost"],
        "offering" => &["Offering", "GPU-hours", "Environments", "Cost"],
        "model" => &["GPU model / MIG profile", "GPU-hours", "Environments", "Cost"],
        "tier" => &["Tier", "GPU-hours", "Environments", "Cost"],
        "tenant" => &["Tenant", "GPU-hours", "Environments", "Cost"],
        "environment" => &["Environment", "GPU-hours", "Environments", "Cost"],
        _ => &["Project", "GPU-hours", "Environments", "Cost"],
    };
    view! {
        <Table label="Usage" columns>
            {view.lines.into_iter().map(|l| view! {
                <tr data-usage-line=l.label.clone()>
                    <th scope="row" class=ROW_HEADER>{l.label.clone()}</th>
                    <td class=CELL>{l.gpu_hours}</td>
                    <td class=CELL>{l.environments}</td>
                    <td class=CELL>{l.cost}</td>
                </tr>
            }).collect_view()}
            <tr class="bg-slate-50 font-semibold">
                <th scope="row" class=ROW_HEADER>"Total"</th>
                <td class=CELL>{view.total_gpu_hours}</td>
                <td class=CELL></td>
                <td class=CELL>{view.total}</td>
            </tr>
        </Table>
    }
    .into_any()
}

#[component]
fn Budgets(budgets: Vec<BudgetView>, remove: ServerAction<RemoveBudget>) -> impl IntoView {
    if budgets.is_empty() {
        return ().into_any();
    }
    view! {
        <h2 class="mt-8 text-lg font-semibold text-slate-900">"Budgets"</h2>
        <p class="mt-1 max-w-3xl text-sm text-slate-600">
            "A booking whose cost would take its project or tenant past the month's budget is refused (a warn-only budget lets it through and records the mark). Committed counts what ran and what booked and running environments will cost by the month's end."
        </p>
        <Table label="Budgets" buttons_column="Actions" columns=&[
            "Budget of", "A month", "Spent so far", "Committed", "Of the budget", "Marks reached",
        ]>
            {budgets.into_iter().map(|b| {
                let bar = format!("width: {}%", b.percent.clamp(0, 100));
                let of = b.of.clone();
                let fill = if b.percent >= 100 { "bg-rose-600" } else if b.percent >= 80 { "bg-amber-500" } else { "bg-indigo-600" };
                view! {
                    <tr data-budget=b.of.clone()>
                        <th scope="row" class=ROW_HEADER>
                            {b.of.clone()}
                            {b.warn_only.then(|| view! { <span class="ml-2 rounded bg-slate-100 px-1.5 py-0.5 text-xs font-normal text-slate-700">"warn only"</span> })}
                        </th>
                        <td class=CELL>{b.budget}</td>
                        <td class=CELL>{b.spent}</td>
                        <td class=CELL>{b.committed}</td>
                        <td class=CELL>
                            <div class="flex items-center gap-2">
                                <div class="h-2 w-24 rounded bg-slate-200" aria-hidden="true"><div class=format!("h-2 rounded {fill}") style=bar></div></div>
                                <span>{format!("{}%", b.percent)}</span>
                            </div>
                        </td>
                        <td class=CELL>{if b.reached.is_empty() { "none".to_owned() } else { b.reached }}</td>
                        <td class="px-4 py-2 text-right">
                            {b.removable.then(|| view! {
                                <ActionForm action=remove>
                                    <input type="hidden" name="id" value=b.id/>
                                    <ConfirmButton label="Remove" aria_label=format!("Remove the budget of {}", of)
                                        consequence=format!("{of} will no longer be limited by cost.") confirm="Yes, remove"/>
                                </ActionForm>
                            })}
                        </td>
                    </tr>
                }
            }).collect_view()}
        </Table>
    }
    .into_any()
}

/// Platform staff: each model's GPU-hours held against what the fleet had, with the share
/// held each day as a small bar chart.
#[component]
fn FleetAllocation(fleet: Vec<ModelUseView>) -> impl IntoView {
    if fleet.is_empty() {
        return ().into_any();
    }
    view! {
        <h2 class="mt-8 text-lg font-semibold text-slate-900">"Fleet allocation"</h2>
        <p class="mt-1 max-w-3xl text-sm text-slate-600">
            "GPU-hours held by bookings (any tenant, any charge) against what the GPUs in service had; idle is the rest. Each bar is a day's share held."
        </p>
        <Table label="Fleet allocation" columns=&["GPU model", "GPUs", "Allocated GPU-hours", "Idle GPU-hours", "Allocated", "Per day"]>
            {fleet.into_iter().map(|m| {
                let days = m.daily_percent.len().max(1);
                let bars = m.daily_percent.iter().enumerate().filter_map(|(day, pct)| {
                    let pct = (*pct)?;
                    let height = 24.0 * pct.clamp(0, 100) as f64 / 100.0;
                    Some(view! {
                        <rect x=format!("{:.1}", day as f64 * 120.0 / days as f64) y=format!("{:.1}", 24.0 - height)
                            width=format!("{:.1}", 120.0 / days as f64 - 0.5) height=format!("{height:.1}") class="fill-indigo-600">
                            <title>{format!("Day {}: {pct}%", day + 1)}</title>
                        </rect>
                    })
                }).collect_view();
                view! {
                    <tr data-model=m.model.clone()>
                        <th scope="row" class=ROW_HEADER>{m.model.clone()}</th>
                        <td class=CELL>{m.gpus}</td>
                        <td class=CELL>{m.allocated}</td>
                        <td class=CELL>{m.idle}</td>
                        <td class=CELL>{format!("{}%", m.percent)}</td>
                        <td class=CELL>
                            <svg viewBox="0 0 120 24" class="h-6 w-32" role="img" aria-label=format!("{}: share held per day", m.model)>
                                <line x1="0" y1="24" x2="120" y2="24" class="stroke-slate-300"/>
                                {bars}
                            </svg>
                        </td>
                    </tr>
                }
            }).collect_view()}
        </Table>
    }
    .into_any()
}

#[component]
fn BudgetForm(view: UsageView, set: ServerAction<SetBudget>) -> impl IntoView {
    if !view.can_set_budgets {
        return ().into_any();
    }
    let result = set.value();
    let levels: &[(&str, &str)] = if view.can_set_tenant_budgets {
        &[("project", "Project (tenant/project)"), ("tenant", "Tenant (by slug)")]
    } else {
        &[("project", "Project (by name)")]
    };
    view! {
        <section class=CARD aria-labelledby="set-budget">
            <h2 id="set-budget" class="text-sm font-semibold text-slate-900">"Set a monthly budget"</h2>
            <ActionForm action=set attr:class="mt-3 grid gap-3 sm:grid-cols-6">
                <Field id="b-level" name="level" label="Applies to" class="sm:col-span-2">
                    {levels.iter().map(|(value, label)| view! { <option value=*value>{*label}</option> }).collect_view()}
                </Field>
                <Field id="b-who" name="who" label="Which" class="sm:col-span-2" required=true
                    placeholder="vision, acme/vision or acme"/>
                <Field id="b-amount" name="amount" label="Dollars a month" inputmode="decimal" required=true placeholder="2,000"/>
                <div class="flex items-end">
                    <button type="submit" class=format!("w-full {BUTTON}")>"Save budget"</button>
                </div>
                <label class="flex items-center gap-2 text-xs text-slate-700 sm:col-span-6">
                    <input type="checkbox" name="warn_only" value="yes"/>
                    "Warn only: record and show the 50%, 80% and 100% marks, but do not refuse bookings."
                </label>
            </ActionForm>
            <p class="mt-2 text-xs text-slate-600">"Saving replaces the budget of the same project or tenant. Months are calendar months in UTC; a booking across two months counts in each by its hours there."</p>
            {move || result.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
        </section>
    }
    .into_any()
}
