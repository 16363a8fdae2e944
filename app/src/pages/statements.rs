use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_params_map;

use crate::components::table::{CELL, ROW_HEADER};
use crate::components::{ErrorAlert, RequireUser, Table};
use crate::model::{StatementRow, StatementView};
use crate::serverfns::{statement, statements};

/// Closed monthly statements (`/usage/statements`): the tenant's bill for each month that
/// has ended, for its admins and viewers and for platform staff.
#[component]
pub fn StatementsPage() -> impl IntoView {
    let list = Resource::new(|| (), |_| statements());
    view! {
        <Title text="Statements"/>
        <RequireUser>
            <a href="/usage" class="text-sm text-indigo-700 underline hover:text-indigo-500">"← Usage"</a>
            <h1 class="mt-2 text-2xl font-bold tracking-tight text-slate-900">"Statements"</h1>
            <p class="mt-1 max-w-3xl text-sm text-slate-600">
                "Each month is closed into a statement within the hour after it ends: line items per project, person and size, at the rates in force while they ran. A closed statement never changes, whatever happens to prices later."
            </p>
            <Transition fallback=|| view! { <p class="text-slate-600">"Loading..."</p> }>
                {move || Suspend::new(async move {
                    match list.await {
                        Ok(rows) if rows.is_empty() => view! {
                            <p class="mt-4 text-sm text-slate-600">"No month has been closed yet."</p>
                        }.into_any(),
                        Ok(rows) => view! {
                            <Table label="Statements" columns=&["Month", "Tenant", "Total"] buttons_column="Statement">
                                {rows.into_iter().map(|s: StatementRow| view! {
                                    <tr data-statement=s.id.to_string()>
                                        <th scope="row" class=ROW_HEADER>{s.month.clone()}</th>
                                        <td class=CELL>{s.tenant.clone()}</td>
                                        <td class=CELL>{s.total.clone()}</td>
                                        <td class="px-4 py-2 text-right">
                                            // The visible word starts the link's name (WCAG 2.5.3).
                                            <a href=format!("/usage/statements/{}", s.id) class="text-sm font-semibold text-indigo-700 underline hover:text-indigo-500">
                                                "View"<span class="sr-only">{format!(" the statement of {} for {}", s.tenant, s.month)}</span>
                                            </a>
                                        </td>
                                    </tr>
                                }).collect_view()}
                            </Table>
                        }.into_any(),
                        Err(error) => view! { <ErrorAlert error/> }.into_any(),
                    }
                })}
            </Transition>
        </RequireUser>
    }
}

/// One statement (`/usage/statements/:id`), laid out to print cleanly (the navigation is
/// left off on paper), with its CSV.
#[component]
pub fn StatementPage() -> impl IntoView {
    let params = use_params_map();
    let id = move || params.read().get("id").and_then(|id| id.parse::<i64>().ok());
    let found = Resource::new(id, |id| async move {
        match id {
            Some(id) => statement(id).await.map(Some),
            None => Ok(None),
        }
    });
    view! {
        <Title text="Statement"/>
        <RequireUser>
            <Transition fallback=|| view! { <p class="text-slate-600">"Loading..."</p> }>
                {move || Suspend::new(async move {
                    match found.await {
                        Ok(Some(s)) => view! { <Statement s/> }.into_any(),
                        Ok(None) => view! { <super::NotFound/> }.into_any(),
                        Err(error) => view! { <ErrorAlert error/> }.into_any(),
                    }
                })}
            </Transition>
        </RequireUser>
    }
}

#[component]
fn Statement(s: StatementView) -> impl IntoView {
    let columns = &["Project", "Person", "Size", "Tier", "Hours", "GPU-hours", "Rate", "Amount", "Discount", "Total"];
    view! {
        <div class="print:hidden">
            <a href="/usage/statements" class="text-sm text-indigo-700 underline hover:text-indigo-500">"← Statements"</a>
        </div>
        <h1 class="mt-2 text-2xl font-bold tracking-tight text-slate-900">{format!("Statement: {}, {}", s.tenant, s.month)}</h1>
        <p class="mt-1 text-sm text-slate-600">
            {s.basis.clone()} " Closed " {s.closed_at.clone()} ". Amounts in US dollars; each line is rounded once to the cent and the totals add the lines."
        </p>
        <p class="mt-2 text-sm print:hidden">
            <a href=format!("/usage/statements/{}/csv", s.id) class="text-indigo-700 underline hover:text-indigo-500" download="">"Download CSV"</a>
            <span class="text-slate-600">" · Print this page for a paper copy: the navigation is left off."</span>
        </p>
        {if s.lines.is_empty() {
            view! { <p class="mt-4 text-sm text-slate-600">"Nothing was charged in this month."</p> }.into_any()
        } else {
            view! {
                <Table label="Line items" columns>
                    {s.lines.into_iter().map(|l| view! {
                        <tr data-statement-line="">
                            <th scope="row" class=ROW_HEADER>{l.project}</th>
                            <td class=CELL>{l.person}</td>
                            <td class=CELL>{l.size}<span class="block text-xs text-slate-600">{l.offering}</span></td>
                            <td class=CELL>{l.tier}</td>
                            <td class="px-4 py-2 text-right tabular-nums">{l.unit_hours}</td>
                            <td class="px-4 py-2 text-right tabular-nums">{l.gpu_hours}</td>
                            <td class=CELL>{l.rate}</td>
                            <td class="px-4 py-2 text-right tabular-nums">{l.amount}</td>
                            <td class="px-4 py-2 text-right tabular-nums">{l.discount}</td>
                            <td class="px-4 py-2 text-right font-medium tabular-nums">{l.total}</td>
                        </tr>
                    }).collect_view()}
                    <tr data-statement-total="" class="border-t-2 border-slate-300">
                        <th scope="row" colspan="7" class="px-4 py-2 text-left font-semibold text-slate-900">"Total"</th>
                        <td class="px-4 py-2 text-right tabular-nums">{s.amount.clone()}</td>
                        <td class="px-4 py-2 text-right tabular-nums">{s.discount.clone()}</td>
                        <td class="px-4 py-2 text-right font-semibold tabular-nums">{s.total.clone()}</td>
                    </tr>
                </Table>
            }.into_any()
        }}
    }
}
