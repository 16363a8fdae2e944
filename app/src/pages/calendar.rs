use std::sync::Arc;

use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use crate::components::{ErrorAlert, RequireUser, escape_html};
use crate::model::CalendarView;
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
    // The cells are not views, so the stretch being dragged is marked on them here: the
    // last one's cells unmarked, this one's marked (`data-selected`, style/main.css).
    let body = NodeRef::<leptos::html::Tbody>::new();
    Effect::new(move |last: Option<Option<Selection>>| {
        let now = drag.get();
        if let Some(body) = body.get() {
            for (selection, mark) in [(last.flatten(), false), (now, true)] {
                if let Some(s) = selection {
                    mark_cells(&body, s, mark);
                }
            }
        }
        now
    });
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
                // One string, not a view per cell: see `grid_html`. Pressing and dragging are
                // handled here for every cell, which says where it is in `data-row`/`data-col`.
                <tbody node_ref=body inner_html=grid_html(&view)
                    on:pointerdown=move |ev| {
                        if ev.button() == 0 && ev.is_primary()
                            && let Some((row, column)) = cell_at(&ev)
                        {
                            drag.set(Some(Selection { row, anchor: column, to: column }));
                        }
                    }
                    on:pointerover=move |ev| {
                        let Some((row, column)) = cell_at(&ev) else { return };
                        // Only across free cells: a full or past one ends the stretch.
                        let free = |s: &Selection| shared.with_value(|view| {
                            view.rows.get(row).is_some_and(|r| {
                                r.cells.get(s.anchor.min(column)..=s.anchor.max(column))
                                    .is_some_and(|cells| cells.iter().all(|c| c.tone.bookable()))
                            })
                        });
                        drag.update(|d| {
                            if let Some(s) = d.as_mut()
                                && s.row == row
                                && free(s)
                            {
                                s.to = column;
                            }
                        });
                    }>
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

/// The calendar's rows as HTML: a header cell with the size, then a cell per column, a
/// link to book it (`CalendarView::launch_href` for that column) when it is free and ahead,
/// titled "H100 slice 1g.10gb: 112 of 224 free from Mon 30 00h". Written as one string
/// because the calendar has hundreds of cells, and as views (each with its handlers, made
/// and then converted for the page's suspense) they were most of the time the page took to
/// draw. What a row's or a column's cells share is escaped once, as Leptos escapes a
/// view's values; the rest are numbers. A cell's look comes from `calendar-cell` and its
/// `data-tone` (style/main.css), and its `<td>` has no class (Tailwind's base styles
/// already take a cell's padding away).
fn grid_html(view: &CalendarView) -> String {
    use std::fmt::Write;

    let escape = |s: &str| escape_html(s).into_owned();
    let columns: Vec<String> = view.columns.iter().map(|c| escape(c)).collect();
    let starts: Vec<String> = view.starts.iter().map(|s| escape(s)).collect();
    let mut html = String::with_capacity(view.rows.len() * view.columns.len() * 320);
    for (r, row) in view.rows.iter().enumerate() {
        let (label, launch, capacity) = (escape(&row.label), escape(&row.launch), row.capacity);
        let hours = view.hours(row, 1);
        let _ = write!(
            html,
            "<tr data-size=\"{label}\"><th scope=\"row\" class=\"whitespace-nowrap pr-3 text-left font-medium text-slate-800\">\
             {label}<span class=\"block text-[11px] font-normal text-slate-600\">{capacity} at most</span></th>"
        );
        for (c, cell) in row.cells.iter().enumerate() {
            let (tone, free) = (cell.tone.as_str(), cell.free);
            let from = columns.get(c).map_or("", String::as_str);
            let _ = if cell.tone.bookable() {
                let start = starts.get(c).map_or("", String::as_str);
                write!(
                    html,
                    "<td data-tone=\"{tone}\"><a href=\"{launch}&amp;start={start}&amp;hours={hours}\" class=\"calendar-cell\" \
                     aria-label=\"Book: {label}: {free} of {capacity} free from {from}\" \
                     title=\"{label}: {free} of {capacity} free from {from}\" draggable=\"false\" \
                     data-row=\"{r}\" data-col=\"{c}\">{free}</a></td>"
                )
            } else {
                write!(
                    html,
                    "<td data-tone=\"{tone}\"><span class=\"calendar-cell\" \
                     title=\"{label}: {free} of {capacity} free from {from}\">{free}</span></td>"
                )
            };
        }
        html.push_str("</tr>");
    }
    html
}

/// The row and column of the calendar cell an event happened on, if it is a free one.
fn cell_at(ev: &leptos::ev::PointerEvent) -> Option<(usize, usize)> {
    let cell = event_target::<leptos::web_sys::Element>(ev).closest("a[data-col]").ok()??;
    let number = |name| cell.get_attribute(name)?.parse().ok();
    Some((number("data-row")?, number("data-col")?))
}

/// Marks (or unmarks) the cells of `selection` as selected.
fn mark_cells(body: &leptos::web_sys::HtmlTableSectionElement, selection: Selection, mark: bool) {
    use leptos::wasm_bindgen::JsCast;

    let Some(row) = body.rows().item(selection.row as u32) else { return };
    let Ok(row) = row.dyn_into::<leptos::web_sys::HtmlTableRowElement>() else { return };
    // The row's first cell is its size.
    for column in selection.columns() {
        let link = row.cells().item(column as u32 + 1).and_then(|cell| cell.first_element_child());
        if let Some(link) = link.filter(|l| l.has_attribute("data-col")) {
            let _ =
                if mark { link.set_attribute("data-selected", "true") } else { link.remove_attribute("data-selected") };
        }
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

#[cfg(test)]
mod tests {
    use super::grid_html;
    use crate::model::{CalendarCell, CalendarRow, CalendarView, Tone};

    #[test]
    fn the_grid_links_free_cells_ahead_and_escapes_what_it_writes() {
        let cell = |free, tone| CalendarCell { free, tone };
        let view = CalendarView {
            view: "day".into(),
            title: String::new(),
            prev_href: String::new(),
            next_href: String::new(),
            today_href: String::new(),
            columns: vec!["Wed 2 06h".into(), "Wed 2 12h".into(), "Wed 2 18h".into()],
            starts: vec![String::new(), "2026-12-02T12:00".into(), "2026-12-02T18:00".into()],
            rows: vec![CalendarRow {
                model: "H100-80GB".into(),
                label: "<b>\"A&B\"</b>".into(),
                capacity: 8,
                launch: "/launch/training?size=a&b".into(),
                max_hours: 24,
                cells: vec![cell(0, Tone::Past), cell(8, Tone::Plenty), cell(0, Tone::None)],
            }],
            bookings: Vec::new(),
            cleaning_gap: String::new(),
            bucket_hours: 6,
        };
        let html = grid_html(&view);
        let label = "&lt;b&gt;&quot;A&amp;B&quot;&lt;/b&gt;";
        assert!(html.starts_with(&format!("<tr data-size=\"{label}\"><th scope=\"row\"")), "{html}");
        assert!(html.contains(&format!("\">{label}<span")), "the size as text: {html}");
        assert!(!html.contains("<b>"), "{html}");
        // A past cell and a full one are not links; the free one is, with where it is, to
        // the launch form the dragging handlers open for one cell.
        assert!(html.contains(&format!(
            "<td data-tone=\"past\"><span class=\"calendar-cell\" title=\"{label}: 0 of 8 free from Wed 2 06h\">0</span></td>"
        )));
        let href = crate::components::escape_html(&view.launch_href(&view.rows[0], 1, 1)).into_owned();
        assert_eq!(href, "/launch/training?size=a&amp;b&amp;start=2026-12-02T12:00&amp;hours=6");
        assert!(
            html.contains(&format!(
                "<td data-tone=\"plenty\"><a href=\"{href}\" class=\"calendar-cell\" \
             aria-label=\"Book: {label}: 8 of 8 free from Wed 2 12h\" \
             title=\"{label}: 8 of 8 free from Wed 2 12h\" draggable=\"false\" data-row=\"0\" data-col=\"1\">8</a></td>"
            )),
            "{html}"
        );
        assert!(html.contains("<td data-tone=\"none\"><span"));
        assert_eq!(html.matches("<a ").count(), 1);
        assert!(html.ends_with("</tr>"));
    }
}
