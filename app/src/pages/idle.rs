use leptos::prelude::*;
use leptos_meta::Title;

use crate::components::form::{BUTTON, SMALL_DANGER_BUTTON};
use crate::components::table::{CELL, ROW_HEADER};
use crate::components::{CARD, ErrorAlert, Field, RequireUser, SavedNotice, Table};
use crate::model::{IdlePoliciesView, IdlePolicyRow};
use crate::serverfns::{SetIdlePolicy, idle_policies};

/// Idle policies (`/idle-policies`): platform admins set one per offering, tenant admins a
/// stricter one for their tenant; whoever reads quotas reads them.
#[component]
pub fn IdlePoliciesPage() -> impl IntoView {
    let set = ServerAction::<SetIdlePolicy>::new();
    let page = Resource::new(move || set.version().get(), |_| idle_policies());
    view! {
        <Title text="Idle policies"/>
        <RequireUser>
            <h1 class="text-2xl font-bold tracking-tight text-slate-900">"Idle policies"</h1>
            <SavedNotice/>
            <p class="mt-1 max-w-3xl text-sm text-slate-600">
                "An environment whose GPUs all stay under the threshold for the idle time, and whose notebook or endpoint gets no requests through Berth, is warned (on its page, in the bell and by the channels its owner chose); after the grace it is stopped and its GPUs go back to the calendar, unless its owner chooses \"Keep it\". Its volumes keep its files. Without readings from its GPUs nothing is judged idle. A tenant's policy may only be stricter than the platform's; where both exist, the stricter of each part applies. Offerings without a policy are never stopped for idleness (training jobs by default)."
            </p>
            <Transition fallback=|| view! { <p class="text-slate-600">"Loading..."</p> }>
                {move || Suspend::new(async move {
                    match page.await {
                        Ok(page) => view! { <PolicyTable page=page.clone() set/> <PolicyForm page set/> }.into_any(),
                        Err(error) => view! { <ErrorAlert error/> }.into_any(),
                    }
                })}
            </Transition>
        </RequireUser>
    }
}

#[component]
fn PolicyTable(page: IdlePoliciesView, set: ServerAction<SetIdlePolicy>) -> impl IntoView {
    if page.rows.is_empty() {
        return view! { <p class="mt-4 text-sm text-slate-600">"No idle policies: nothing is stopped for idleness."</p> }
            .into_any();
    }
    view! {
        <Table label="Idle policies" buttons_column="Actions" columns=&[
            "Whose", "Offering", "Under", "Idle for", "Grace", "Keeps", "In words",
        ]>
            {page.rows.into_iter().map(|r: IdlePolicyRow| {
                let key = format!("{}/{}", r.whose, r.offering);
                let label = format!("Remove the idle policy of {} for {}", r.whose, r.offering_title);
                view! {
                <tr data-idle-policy=key>
                    <th scope="row" class=ROW_HEADER>{r.whose.clone()}</th>
                    <td class=CELL>{r.offering_title.clone()}</td>
                    <td class=CELL>{format!("{}%", r.below_pct)}</td>
                    <td class=CELL>{r.idle_for.clone()}</td>
                    <td class=CELL>{r.grace.clone()}</td>
                    <td class=CELL>{if r.max_keeps.is_empty() { "no limit".to_owned() } else { r.max_keeps.clone() }}</td>
                    <td class="px-4 py-2 text-xs text-slate-700">{r.summary.clone()}</td>
                    <td class="px-4 py-2 text-right">
                        {r.may_change.then(|| view! {
                            <ActionForm action=set>
                                <input type="hidden" name="tenant" value=r.tenant_id.map(|t| t.to_string()).unwrap_or_default()/>
                                <input type="hidden" name="offering" value=r.offering.clone()/>
                                <input type="hidden" name="below_pct" value=""/>
                                <input type="hidden" name="idle_for" value=""/>
                                <input type="hidden" name="grace" value=""/>
                                <input type="hidden" name="max_keeps" value=""/>
                                <button type="submit" name="remove" value="yes" class=SMALL_DANGER_BUTTON
                                    aria-label=label>"Remove"</button>
                            </ActionForm>
                        })}
                    </td>
                </tr>
            }}).collect_view()}
        </Table>
    }
    .into_any()
}

#[component]
fn PolicyForm(page: IdlePoliciesView, set: ServerAction<SetIdlePolicy>) -> impl IntoView {
    if !page.manages_platform && page.tenants.is_empty() {
        return ().into_any();
    }
    let result = set.value();
    let platform = page.manages_platform.then(|| view! { <option value="">"Platform (every tenant)"</option> });
    view! {
        <section class=CARD aria-labelledby="set-idle-policy">
            <h2 id="set-idle-policy" class="text-sm font-semibold text-slate-900">"Set a policy"</h2>
            <ActionForm action=set attr:class="mt-3 grid gap-3 sm:grid-cols-6">
                <Field id="ip-tenant" name="tenant" label="Whose" class="sm:col-span-2">
                    {platform}
                    {page.tenants.iter().map(|(id, slug)| view! { <option value=id.to_string()>{format!("Tenant {slug}")}</option> }).collect_view()}
                </Field>
                <Field id="ip-offering" name="offering" label="Offering" class="sm:col-span-2">
                    {page.offerings.iter().map(|(id, title)| view! { <option value=id.clone()>{title.clone()}</option> }).collect_view()}
                </Field>
                <Field id="ip-below" name="below_pct" label="GPUs under (%)" inputmode="decimal" value="5" required=true/>
                <Field id="ip-keeps" name="max_keeps" label="Keeps per booking" inputmode="numeric"
                    placeholder="no limit"/>
                <Field id="ip-idle" name="idle_for" label="Idle for" value="60m" required=true class="sm:col-span-2"
                    help=|| "90s, 15m, 1h or 1h30m; from 10s to 24h"/>
                <Field id="ip-grace" name="grace" label="Grace after the warning" value="15m" required=true class="sm:col-span-2"/>
                <div class="flex items-end sm:col-span-2">
                    <button type="submit" class=format!("w-full {BUTTON}")>"Save policy"</button>
                </div>
            </ActionForm>
            <p class="mt-2 text-xs text-slate-600">"Saving replaces the policy of the same owner and offering."</p>
            {move || result.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
        </section>
    }
    .into_any()
}
