use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use crate::components::form::BUTTON;
use crate::components::{CARD, ErrorAlert, Field, RequireUser, Table};
use crate::model::{AuditRowView, AuditView};
use crate::serverfns::audit_log;

/// The audit log: everything for platform staff, their tenant for a tenant admin. The
/// filters live in the query string, so a filtered view can be shared as a link. Its
/// resource is made outside `RequireUser` (see there why).
#[component]
pub fn AuditPage() -> impl IntoView {
    let query = use_query_map();
    let filters = move || -> Filters {
        let q = query.read();
        let get = |key: &str| q.get(key).unwrap_or_default();
        (get("tenant"), get("actor"), get("action"), get("outcome"), get("before"))
    };
    let log = Resource::new(filters, |(tenant, actor, action, outcome, before)| {
        audit_log(tenant, actor, action, outcome, before)
    });
    view! {
        <Title text="Audit log"/>
        <RequireUser>
            <h1 class="text-2xl font-bold tracking-tight text-slate-900">"Audit log"</h1>
            <p class="mt-1 text-sm text-slate-600">"Who did what, from where, and how it went; newest first, times in UTC."</p>
            <Transition fallback=|| view! { <p class="text-slate-600">"Loading..."</p> }>
                {move || Suspend::new(async move {
                    match log.await {
                        Ok(view) => {
                            let filters = untrack(filters);
                            view! { <AuditBody view filters/> }.into_any()
                        }
                        Err(error) => view! { <div class="mt-4"><ErrorAlert error/></div> }.into_any(),
                    }
                })}
            </Transition>
        </RequireUser>
    }
}

/// The filters as the query string has them: tenant, actor, action, outcome, before.
type Filters = (String, String, String, String, String);

#[component]
fn AuditBody(view: AuditView, filters: Filters) -> impl IntoView {
    let (tenant, actor, action, outcome, _) = filters;
    let outcomes = [("", "Any"), ("success", "Success"), ("failure", "Failure"), ("denied", "Denied")];
    view! {
        // A plain GET form: the filters end up in the URL, with or without the WASM.
        <form method="get" action="/audit" role="search" aria-label="Filter the audit log"
            class=format!("{CARD} grid gap-3 sm:grid-cols-5")>
            {view.tenant_filter.then(|| view! {
                <Field id="a-tenant" name="tenant" label="Tenant (short name)" value=tenant placeholder="acme"/>
            })}
            <Field id="a-actor" name="actor" label="Actor email contains" value=actor placeholder="dana"/>
            <Field id="a-action" name="action" label="Action starts with" value=action placeholder="session."/>
            <Field id="a-outcome" name="outcome" label="Outcome">
                {outcomes.into_iter().map(|(value, label)| view! {
                    <option value=value selected=outcome == value>{label}</option>
                }).collect_view()}
            </Field>
            <div class="flex items-end gap-2">
                <button type="submit" class=BUTTON>"Filter"</button>
                <a href="/audit" class="px-2 py-2 text-sm text-slate-600 hover:text-slate-900">"Clear"</a>
            </div>
        </form>
        <div class="mt-4 flex flex-wrap items-center justify-between gap-2 text-sm">
            <p class="text-slate-600" data-testid="audit-count">
                {match view.rows.len() {
                    0 => "Nothing matches these filters.".to_owned(),
                    1 => "1 event".to_owned(),
                    n => format!("{n} events"),
                }}
            </p>
            // `rel="external"`: a file for the browser to download, not a page for the router.
            <a href=view.csv_href rel="external" download="berth-audit.csv"
                class="rounded-lg bg-white px-3 py-1.5 text-sm font-semibold text-slate-700 ring-1 ring-slate-300 hover:bg-slate-50">
                "Download CSV"
            </a>
        </div>
        {(!view.rows.is_empty()).then(|| view! { <AuditTable rows=view.rows/> })}
        <nav class="mt-4 flex gap-4 text-sm" aria-label="Audit pages">
            {view.newest_href.map(|href| view! {
                <a href=href class="font-semibold text-indigo-600 hover:text-indigo-500">"← Newest"</a>
            })}
            {view.older_href.map(|href| view! {
                <a href=href class="font-semibold text-indigo-600 hover:text-indigo-500">"Older →"</a>
            })}
        </nav>
    }
}

#[component]
fn AuditTable(rows: Vec<AuditRowView>) -> impl IntoView {
    // Small print, aligned at the top: a row's target and detail can run long.
    const CELL: &str = "px-4 py-2 align-top";
    view! {
        <Table label="Audit events" columns=&[
            "Time (UTC)", "Actor", "Tenant", "Action", "Target", "Outcome", "Source", "Request id", "Detail",
        ]>
            {rows.into_iter().map(|r| view! {
                <tr data-audit-id=r.id data-audit-action=r.action.clone() class="text-xs text-slate-700">
                    <td class=format!("{CELL} whitespace-nowrap")>{r.time}</td>
                    <td class=CELL>
                        {if r.actor.is_empty() {
                            view! { <span class="text-slate-600" title="Berth itself, or someone not signed in">"—"</span> }.into_any()
                        } else {
                            view! { <span class="text-slate-900">{r.actor}</span> }.into_any()
                        }}
                    </td>
                    <td class=CELL>{r.tenant}</td>
                    <td class=format!("{CELL} whitespace-nowrap font-mono text-slate-900")>{r.action.clone()}</td>
                    <td class=format!("{CELL} break-words")>
                        {(!r.target_name.is_empty()).then(|| view! { <span class="block text-slate-900">{r.target_name.clone()}</span> })}
                        <span class=if r.target_name.is_empty() { "" } else { "font-mono text-slate-600" }>{r.target}</span>
                    </td>
                    <td class=CELL><OutcomeBadge outcome=r.outcome/></td>
                    <td class=format!("{CELL} whitespace-nowrap font-mono")>{r.source}</td>
                    <td class=format!("{CELL} font-mono text-slate-600")>{r.request_id}</td>
                    <td class=format!("{CELL} max-w-xs break-words")>{r.detail}</td>
                </tr>
            }).collect_view()}
        </Table>
    }
}

#[component]
fn OutcomeBadge(outcome: String) -> impl IntoView {
    let tone = match outcome.as_str() {
        "success" => "bg-emerald-50 text-emerald-800 ring-emerald-300",
        "failure" => "bg-red-50 text-red-800 ring-red-300",
        "denied" => "bg-amber-50 text-amber-900 ring-amber-300",
        _ => "bg-slate-50 text-slate-600 ring-slate-200",
    };
    view! {
        <span data-outcome=outcome.clone() class=format!("inline-flex rounded-full px-2 py-0.5 font-medium ring-1 ring-inset {tone}")>
            {outcome.clone()}
        </span>
    }
}
