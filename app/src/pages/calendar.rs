use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use crate::components::{ErrorAlert, RequireUser};
use crate::model::{CalendarCell, CalendarView};
use crate::serverfns::calendar;

/// Free capacity per size over a day, week or month, with the caller's own bookings drawn
/// on the same columns. Every free cell is a link to the launch form for that size and
/// start, so booking works from the keyboard and without JavaScript.
#[component]
pub fn CalendarPage() -> impl IntoView {
    let query = use_query_map();
    let data = Resource::new(
        move || {
            let q = query.read();
            (q.get("view").unwrap_or_default(), q.get("from").unwrap_or_default())
        },
        |(view, from)| calendar(view, from),
    );
    view! {
        <Title text="Availability"/>
        <RequireUser>
            <Transition fallback=|| view! { <p class="text-slate-500">"Loading..."</p> }>
                {move || Suspend::new(async move {
                    match data.await {
                        Ok(view) => view! { <Calendar view/> }.into_any(),
                        Err(error) => view! { <ErrorAlert error/> }.into_any(),
                    }
                })}
            </Transition>
        </RequireUser>
    }
}

const NAV: &str = "rounded-md px-3 py-1.5 text-sm font-medium text-slate-700 ring-1 ring-slate-300 hover:bg-slate-50";

#[component]
fn Calendar(view: CalendarView) -> impl IntoView {
    let columns = view.columns.len();
    let grid = format!("grid-template-columns: 14rem repeat({columns}, minmax(2.25rem, 1fr));");
    let span_link = |span: &'static str, label: &'static str| {
        let current = view.view == span;
        let from = view.today_href.split("from=").nth(1).unwrap_or_default().to_owned();
        view! {
            <a href=format!("/calendar?view={span}&from={from}") aria-current=current.then_some("page")
                class="rounded-md px-3 py-1.5 text-sm font-medium text-slate-600 hover:bg-slate-100 aria-[current=page]:bg-indigo-600 aria-[current=page]:text-white">
                {label}
            </a>
        }
    };
    view! {
        <div class="flex flex-wrap items-end justify-between gap-4">
            <div>
                <h1 class="text-2xl font-bold tracking-tight text-slate-900">"Availability"</h1>
                <p class="mt-1 text-sm text-slate-600">
                    "Free capacity per size, " {view.title.clone()} " (UTC). Pick a free cell to book that size from then."
                </p>
            </div>
            <nav aria-label="Calendar range" class="flex flex-wrap items-center gap-2">
                <div class="flex gap-1 rounded-lg bg-white p-1 ring-1 ring-slate-200">
                    {span_link("day", "Day")} {span_link("week", "Week")} {span_link("month", "Month")}
                </div>
                <a href=view.prev_href.clone() class=NAV>"← Earlier"</a>
                <a href=view.today_href.clone() class=NAV>"Today"</a>
                <a href=view.next_href.clone() class=NAV>"Later →"</a>
            </nav>
        </div>
        <div class="mt-6 overflow-x-auto rounded-xl border border-slate-200 bg-white p-4 shadow-sm">
            <table class="w-full border-separate border-spacing-0.5 text-xs" aria-label="Free capacity per size over time">
                <thead>
                    <tr>
                        <th scope="col" class="w-56 text-left font-medium text-slate-500">"Size"</th>
                        {view.columns.iter().map(|c| view! {
                            <th scope="col" class="h-16 whitespace-nowrap align-bottom font-normal text-slate-500">
                                <span class="inline-block origin-bottom-left -rotate-45 translate-x-3">{c.clone()}</span>
                            </th>
                        }).collect_view()}
                    </tr>
                </thead>
                <tbody>
                    {view.rows.iter().map(|row| view! {
                        <tr data-size=row.label.clone()>
                            <th scope="row" class="whitespace-nowrap pr-3 text-left font-medium text-slate-800">
                                {row.label.clone()}
                                <span class="block text-[11px] font-normal text-slate-500">{row.capacity} " at most"</span>
                            </th>
                            {row.cells.iter().cloned().map(|cell| view! { <Cell cell/> }).collect_view()}
                        </tr>
                    }).collect_view()}
                </tbody>
            </table>
            <Legend gap=view.cleaning_gap.clone()/>
        </div>
        <section class="mt-6 rounded-xl border border-slate-200 bg-white p-4 shadow-sm" aria-labelledby="mine">
            <h2 id="mine" class="text-sm font-semibold text-slate-900">"Your bookings in this range"</h2>
            {if view.bookings.is_empty() {
                view! { <p class="mt-2 text-sm text-slate-500">"None. Pick a free cell above to book."</p> }.into_any()
            } else {
                view! {
                    <div class="mt-3 grid gap-y-1 text-xs" style=grid>
                        {view.bookings.iter().map(|b| {
                            let bar = format!("grid-column: {} / span {};", b.first + 2, b.span);
                            view! {
                                <a href=b.href.clone() class="truncate pr-3 font-medium text-indigo-700 hover:text-indigo-500" style="grid-column: 1;">
                                    {b.name.clone()}
                                </a>
                                <a href=b.href.clone() style=bar title=format!("{} · {}", b.size, b.when)
                                    class="truncate rounded bg-indigo-500 px-2 py-1 text-white hover:bg-indigo-600">
                                    {b.size.clone()} " · " {b.when.clone()}
                                </a>
                            }
                        }).collect_view()}
                    </div>
                }.into_any()
            }}
        </section>
    }
}

#[component]
fn Cell(cell: CalendarCell) -> impl IntoView {
    let tone = match cell.tone.as_str() {
        "past" => "bg-slate-100 text-slate-400",
        "none" => "bg-rose-100 text-rose-700",
        "low" => "bg-amber-100 text-amber-800 hover:ring-2 hover:ring-amber-400",
        _ => "bg-emerald-100 text-emerald-800 hover:ring-2 hover:ring-emerald-500",
    };
    let class = format!("block h-8 rounded text-center leading-8 tabular-nums {tone}");
    view! {
        <td data-tone=cell.tone.clone() class="p-0">
            {if cell.href.is_empty() {
                view! { <span class=class title=cell.title.clone()>{cell.free}</span> }.into_any()
            } else {
                view! {
                    <a href=cell.href.clone() class=format!("{class} focus:outline-none focus:ring-2 focus:ring-indigo-600")
                        title=cell.title.clone() aria-label=format!("Book: {}", cell.title)>{cell.free}</a>
                }.into_any()
            }}
        </td>
    }
}

#[component]
fn Legend(gap: String) -> impl IntoView {
    let item = |tone: &'static str, label: &'static str| {
        view! {
            <span class="inline-flex items-center gap-1.5">
                <span class=format!("inline-block h-3 w-3 rounded {tone}")></span>
                {label}
            </span>
        }
    };
    view! {
        <p class="mt-3 flex flex-wrap gap-4 text-xs text-slate-500">
            {item("bg-emerald-100", "plenty free")}
            {item("bg-amber-100", "under a quarter free")}
            {item("bg-rose-100", "nothing free")}
            {item("bg-slate-100", "past")}
            <span>"Bookings keep a cleaning gap of " {gap} " on their GPUs."</span>
        </p>
    }
}
