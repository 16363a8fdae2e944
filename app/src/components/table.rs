//! The pages' tables: a header row of column headings over the rows a page gives, in a
//! white box that scrolls sideways when the page is narrow.

use leptos::prelude::*;

/// A cell of a row.
pub const CELL: &str = "px-4 py-2";
/// The cell that names its row (`<th scope="row">`).
pub const ROW_HEADER: &str = "px-4 py-2 text-left font-medium text-slate-900";

#[component]
pub fn Table(
    /// What the rows are, for screen readers (the table's `aria-label`).
    label: &'static str,
    /// The column headings, left to right.
    columns: &'static [&'static str],
    /// The heading of a last column of buttons, read only by screen readers.
    #[prop(optional)]
    buttons_column: Option<&'static str>,
    /// The rows: one `<tr>` each.
    children: Children,
) -> impl IntoView {
    view! {
        // Focusable and named: a keyboard user scrolls a wide table sideways (WCAG 2.1.1).
        <div tabindex="0" role="region" aria-label=label class="mt-3 overflow-x-auto rounded-xl border border-slate-200 bg-white shadow-sm">
            <table class="min-w-full divide-y divide-slate-200 text-sm" aria-label=label>
                <thead class="bg-slate-50 text-left text-xs font-medium text-slate-600">
                    <tr>
                        {columns.iter().map(|heading| view! { <th scope="col" class=CELL>{*heading}</th> }).collect_view()}
                        {buttons_column.map(|heading| view! {
                            <th scope="col" class=CELL><span class="sr-only">{heading}</span></th>
                        })}
                    </tr>
                </thead>
                <tbody class="divide-y divide-slate-100">{children()}</tbody>
            </table>
        </div>
    }
}
