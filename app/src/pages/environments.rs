use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use crate::components::form::BUTTON;
use crate::components::table::CELL;
use crate::components::{CARD, ErrorAlert, Field, IfMayLaunch, RequireUser, StateBadge, Table, poll_every};
use crate::model::{EnvironmentListView, EnvironmentSummary};
use crate::serverfns::environments_listing;

/// Environments, refreshed every two seconds: one's own by default; tenant admins, viewers
/// and platform staff filter by person, project, tenant and state (in the query string, so
/// a view can be shared as a link). Its resource is made outside `RequireUser` (see there
/// why).
#[component]
pub fn EnvironmentsPage() -> impl IntoView {
    let query = use_query_map();
    let filters = move || {
        let q = query.read();
        let get = |key: &str| q.get(key).filter(|v| !v.is_empty());
        (get("person"), get("project"), get("tenant"), get("state"))
    };
    let listing =
        Resource::new(filters, |(person, project, tenant, state)| environments_listing(person, project, tenant, state));
    poll_every(2000, move || listing.refetch());
    view! {
        <Title text="Environments"/>
        <RequireUser>
            <div class="mb-6 flex items-center justify-between">
                <h1 class="text-2xl font-bold tracking-tight text-slate-900">"Environments"</h1>
                <IfMayLaunch>
                    <a href="/catalog" class="rounded-lg bg-indigo-600 px-3 py-1.5 text-sm font-semibold text-white hover:bg-indigo-500">"Launch new"</a>
                </IfMayLaunch>
            </div>
            <Transition fallback=|| view! { <p class="text-slate-600">"Loading..."</p> }>
                {move || Suspend::new(async move {
                    match listing.await {
                        Ok(view) => view! { <Listing view/> }.into_any(),
                        Err(error) => view! { <ErrorAlert error/> }.into_any(),
                    }
                })}
            </Transition>
        </RequireUser>
    }
}

#[component]
fn Listing(view: EnvironmentListView) -> impl IntoView {
    let own = view.person == "me";
    let filtered = !own || !view.project.is_empty() || !view.tenant.is_empty() || view.state != "any";
    let columns: &'static [&'static str] = match (own, view.all_tenants) {
        (true, _) => &["Name", "State", "Size", "Window", "Price"],
        (false, false) => &["Name", "Owner", "Project", "State", "Size", "Window", "Price"],
        (false, true) => &["Name", "Tenant", "Owner", "Project", "State", "Size", "Window", "Price"],
    };
    let all_tenants = view.all_tenants;
    let filter = view.wider.then(|| view! { <Filter view=view.clone()/> });
    let body = if view.environments.is_empty() && !filtered {
        view! {
            <div class="rounded-xl border-2 border-dashed border-slate-200 p-12 text-center">
                <p class="font-medium text-slate-900">"Nothing running yet"</p>
                <IfMayLaunch>
                    <p class="mt-1 text-sm text-slate-600">"Pick a notebook, job, endpoint or cluster from the catalog."</p>
                </IfMayLaunch>
            </div>
        }
        .into_any()
    } else if view.environments.is_empty() {
        view! { <p class="mt-4 text-sm text-slate-600" data-testid="environments-count">"Nothing matches these filters."</p> }
            .into_any()
    } else {
        view! {
            <Table label="Environments" columns>
                {view.environments.into_iter().map(|e| view! { <Row e own all_tenants/> }).collect_view()}
            </Table>
        }
        .into_any()
    };
    view! { {filter} {body} }
}

#[component]
fn Row(e: EnvironmentSummary, own: bool, all_tenants: bool) -> impl IntoView {
    view! {
        <tr data-environment=e.name.clone()>
            <td class=CELL>
                <a href=format!("/environments/{}", e.id) class="font-medium text-indigo-700 underline hover:text-indigo-500">{e.name.clone()}</a>
                <div class="text-xs text-slate-600">{e.offering.clone()}</div>
            </td>
            {(!own && all_tenants).then(|| view! { <td class=CELL>{e.tenant.clone()}</td> })}
            {(!own).then(|| view! {
                <td class=CELL data-testid="owner">{e.owner.clone()}</td>
                <td class=CELL>{e.project.clone()}</td>
            })}
            <td class=CELL>
                <StateBadge state=e.state.clone() label=e.state_label.clone()/>
                {e.spot.then(|| view! { <span data-tier="spot" class="ml-1 rounded-full bg-amber-100 px-2 py-0.5 text-xs font-medium text-amber-900">"Spot"</span> })}
            </td>
            <td class=format!("{CELL} text-slate-700")>{e.size.clone()}</td>
            <td class=format!("{CELL} text-slate-700")>{e.window.clone()}</td>
            <td class=format!("{CELL} text-slate-900")>{e.price.clone()}</td>
        </tr>
    }
}

/// A plain GET form: the filters end up in the URL, with or without the WASM.
#[component]
fn Filter(view: EnvironmentListView) -> impl IntoView {
    let states = [("any", "Any"), ("active", "Booked or running"), ("finished", "Ended")];
    let person = view.person.clone();
    let project = view.project.clone();
    let tenant = view.tenant.clone();
    view! {
        <form method="get" action="/environments" role="search" aria-label="Filter the environments"
            class=format!("{CARD} mb-4 mt-0 grid gap-3 sm:grid-cols-5")>
            <Field id="e-person" name="person" label="Person">
                <option value="me" selected=person == "me">"Me"</option>
                <option value="any" selected=person == "any">"Anyone"</option>
                {view.people.into_iter().map(|p| {
                    let id = p.id.to_string();
                    view! { <option selected=person == id value=id.clone()>{p.name}</option> }
                }).collect_view()}
            </Field>
            <Field id="e-project" name="project" label="Project">
                <option value="" selected=project.is_empty()>"Any"</option>
                {view.projects.into_iter().map(|p| {
                    let id = p.id.to_string();
                    view! { <option selected=project == id value=id.clone()>{p.name}</option> }
                }).collect_view()}
            </Field>
            {view.all_tenants.then(|| view! {
                <Field id="e-tenant" name="tenant" label="Tenant">
                    <option value="" selected=tenant.is_empty()>"Any"</option>
                    {view.tenants.into_iter().map(|t| {
                        let id = t.id.to_string();
                        view! { <option selected=tenant == id value=id.clone()>{t.name}</option> }
                    }).collect_view()}
                </Field>
            })}
            <Field id="e-state" name="state" label="State">
                {states.into_iter().map(|(value, label)| view! {
                    <option value=value selected=view.state == value>{label}</option>
                }).collect_view()}
            </Field>
            <div class="flex items-end gap-2">
                <button type="submit" class=BUTTON>"Filter"</button>
                <a href="/environments" class="px-2 py-2 text-sm text-slate-700 underline hover:text-slate-900">"Only mine"</a>
            </div>
        </form>
    }
}
