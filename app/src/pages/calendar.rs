use std::sync::Arc;

use leptos::either::Either;
use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use crate::components::{ErrorAlert, RequireUser};
use crate::model::{CalendarCell, CalendarView};
use crate::serverfns::calendar;

/// Free capacity per size over a day, week or month, with the caller's own bookings drawn
/// on the same columns. Every free cell is a link to the launch form for that size and
/// start, so booking works from the keyboard and without JavaScript; with it, dragging
/// across free cells of a row books the whole stretch.
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
            <Transition fallback=|| view! { <p class="text-slate-600">"Loading..."</p> }>
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

/// Free cells being dragged over in one row: from the cell pressed to the one under the
/// pointer, either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Selection {
    row: usize,
    anchor: usize,
    to: usize,
}

impl Selection {
    fn columns(self) -> std::ops::RangeInclusive<usize> {
        self.anchor.min(self.to)..=self.anchor.max(self.to)
    }

    /// The launch form for the selected stretch: its first cell's start, for as many
    /// hours as the cells cover (at most what the offering allows).
    fn href(self, view: &CalendarView) -> Option<String> {
        let columns = self.columns();
        let row = view.rows.get(self.row)?;
        Some(view.launch_href(row, *columns.start(), columns.count()))
    }
}

#[component]
fn Calendar(view: CalendarView) -> impl IntoView {
    let drag = RwSignal::new(None::<Selection>);
    // Shared, not copied: the dragging handlers need the rows and starts after drawing.
    let view = Arc::new(view);
    let shared = StoredValue::new(Arc::clone(&view));
    let navigate = leptos_router::hooks::use_navigate();
    // Effects run only in the browser: the table says when dragging works there.
    let draggable = RwSignal::new(false);
    Effect::new(move |_| draggable.set(true));
    // A press and release on the same cell is a click on its link; a stretch opens the
    // launch form for all of it.
    let finish = move |_| {
        let Some(selection) = drag.get_untracked() else { return };
        drag.set(None);
        if selection.anchor != selection.to
            && let Some(href) = shared.with_value(|view| selection.href(view))
        {
            navigate(&href, Default::default());
        }
    };
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
                    "Free capacity per size, " {view.title.clone()} " (UTC). Pick a free cell to book that size from then, or drag across free cells to book the whole stretch."
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
        <div tabindex="0" role="region" aria-label="Calendar" class="mt-6 overflow-x-auto rounded-xl border border-slate-200 bg-white p-4 shadow-sm">
            <table class="w-full select-none border-separate border-spacing-0.5 text-xs" aria-label="Free capacity per size over time"
                data-drag=move || if draggable.get() { "ready" } else { "off" }
                on:pointerup=finish on:pointerleave=move |_| drag.set(None)>
                <thead>
                    <tr>
                        <th scope="col" class="w-56 text-left font-medium text-slate-600">"Size"</th>
                        {view.columns.iter().map(|c| view! {
                            <th scope="col" class="h-16 whitespace-nowrap align-bottom font-normal text-slate-600">
                                <span class="inline-block origin-bottom-left -rotate-45 translate-x-3">{c.clone()}</span>
                            </th>
                        }).collect_view()}
                    </tr>
                </thead>
                <tbody>
                    {view.rows.iter().enumerate().map(|(r, row)| {
                        let bookable: Arc<[bool]> = row.cells.iter().map(|c| c.tone.bookable()).collect();
                        view! {
                            <tr data-size=row.label.clone()>
                                <th scope="row" class="whitespace-nowrap pr-3 text-left font-medium text-slate-800">
                                    {row.label.clone()}
                                    <span class="block text-[11px] font-normal text-slate-600">{row.capacity} " at most"</span>
                                </th>
                                {row.cells.iter().enumerate().map(|(c, cell)| {
                                    let bookable = Arc::clone(&bookable);
                                    // Only across free cells: a full or past one ends the stretch.
                                    let extend = move || drag.update(|d| {
                                        if let Some(s) = d.as_mut()
                                            && s.row == r
                                            && bookable[s.anchor.min(c)..=s.anchor.max(c)].iter().all(|b| *b)
                                        {
                                            s.to = c;
                                        }
                                    });
                                    let selected = move || drag.get().is_some_and(|s| s.row == r && s.columns().contains(&c));
                                    let press = move || drag.set(Some(Selection { row: r, anchor: c, to: c }));
                                    let href = view.cell_href(row, c);
                                    let title = view.cell_title(row, c);
                                    view! { <Cell cell=*cell href title selected press extend/> }
                                }).collect_view()}
                            </tr>
                        }
                    }).collect_view()}
                </tbody>
            </table>
            <Legend gap=view.cleaning_gap.clone()/>
        </div>
        <section class="mt-6 rounded-xl border border-slate-200 bg-white p-4 shadow-sm" aria-labelledby="mine">
            <h2 id="mine" class="text-sm font-semibold text-slate-900">"Your bookings in this range"</h2>
            {if view.bookings.is_empty() {
                view! { <p class="mt-2 text-sm text-slate-600">"None. Pick a free cell above to book."</p> }.into_any()
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
                                    class="truncate rounded bg-indigo-600 px-2 py-1 text-white hover:bg-indigo-700">
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

/// One bucket of a size: its free count, a link to book it when it is free and ahead.
/// Its look comes from `calendar-cell` and its `data-tone` (style/main.css): the calendar
/// draws hundreds of cells, and the classes on each were most of the page. For the same
/// reason a cell says `data-selected` only while it is selected, and its `<td>` has no class
/// (Tailwind's base styles already take a cell's padding away).
#[component]
fn Cell(
    cell: CalendarCell,
    href: Option<String>,
    title: String,
    selected: impl Fn() -> bool + Send + Sync + 'static,
    press: impl Fn() + Send + Sync + 'static,
    extend: impl Fn() + Send + Sync + 'static,
) -> impl IntoView {
    view! {
        <td data-tone=cell.tone.as_str()>
            // `Either`, not `into_any`: no boxed view for each of hundreds of cells.
            {match href {
                None => Either::Left(view! { <span class="calendar-cell" title=title>{cell.free}</span> }),
                Some(href) => Either::Right(view! {
                    <a href=href class="calendar-cell" aria-label=format!("Book: {title}") title=title draggable="false"
                        data-selected=move || selected().then_some("true")
                        on:pointerdown=move |ev| {
                            if ev.button() == 0 && ev.is_primary() {
                                press();
                            }
                        }
                        on:pointerenter=move |_| extend()>{cell.free}</a>
                }),
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
        <p class="mt-3 flex flex-wrap gap-4 text-xs text-slate-600">
            {item("bg-emerald-100", "plenty free")}
            {item("bg-amber-100", "under a quarter free")}
            {item("bg-rose-100", "nothing free")}
            {item("bg-slate-100", "past")}
            <span>"Bookings keep a cleaning gap of " {gap} " on their GPUs."</span>
        </p>
    }
}
