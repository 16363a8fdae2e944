use leptos::prelude::*;
use leptos_meta::Title;

use crate::components::{ErrorAlert, RequireUser};
use crate::model::{QuotaView, QuotasView};
use crate::serverfns::{RemoveQuota, SetQuota, quotas};

const INPUT: &str = "mt-1 block w-full rounded-lg border border-slate-300 px-3 py-1.5 text-sm focus:border-indigo-500 focus:outline-none focus:ring-1 focus:ring-indigo-500";
const LABEL: &str = "block text-xs font-medium text-slate-600";

/// Quotas at every level: platform admins set everyone's default and tenants' limits,
/// tenant admins their projects' and members'; everyone with access reads the rows that
/// apply within their reach.
#[component]
pub fn QuotasPage() -> impl IntoView {
    let set = ServerAction::<SetQuota>::new();
    let remove = ServerAction::<RemoveQuota>::new();
    let page = Resource::new(move || (set.version().get(), remove.version().get()), |_| quotas());
    view! {
        <Title text="Quotas"/>
        <RequireUser>
            <h1 class="text-2xl font-bold tracking-tight text-slate-900">"Quotas"</h1>
            <p class="mt-1 max-w-3xl text-sm text-slate-600">
                "A booking must fit every quota it counts against: its owner's own (or everyone's default), its project's and its tenant's. GPU limits count GPU-equivalents held at once, for each GPU model on its own (a 3g slice of an H100 is 3/7). A tenant whose quota allows spot may burst beyond it with preemptible bookings."
            </p>
            <Transition fallback=|| view! { <p class="text-slate-500">"Loading..."</p> }>
                {move || Suspend::new(async move {
                    match page.await {
                        Ok(page) => view! { <QuotaTable page=page.clone() remove/> <QuotaForm page set/> }.into_any(),
                        Err(error) => view! { <ErrorAlert error/> }.into_any(),
                    }
                })}
            </Transition>
            {move || remove.value().get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
        </RequireUser>
    }
}

#[component]
fn QuotaForm(page: QuotasView, set: ServerAction<SetQuota>) -> impl IntoView {
    if !page.can_set {
        return ().into_any();
    }
    let result = set.value();
    let levels: &[(&str, &str)] = if page.can_set_platform_levels {
        &[
            ("everyone", "Everyone (default per user)"),
            ("tenant", "Tenant (by slug)"),
            ("project", "Project (tenant/project)"),
            ("user", "User (by email)"),
        ]
    } else {
        &[("project", "Project (by name)"), ("user", "Member (by email)")]
    };
    view! {
        <section class="mt-6 rounded-xl border border-slate-200 bg-white p-4 shadow-sm" aria-labelledby="set-quota">
            <h2 id="set-quota" class="text-sm font-semibold text-slate-900">"Set a quota"</h2>
            <ActionForm action=set attr:class="mt-3 grid gap-3 sm:grid-cols-6">
                <div class="sm:col-span-2">
                    <label for="q-level" class=LABEL>"Applies to"</label>
                    <select id="q-level" name="level" class=INPUT>
                        {levels.iter().map(|(value, label)| view! { <option value=*value>{*label}</option> }).collect_view()}
                    </select>
                </div>
                <div class="sm:col-span-4">
                    <label for="q-who" class=LABEL>"Who (empty for everyone)"</label>
                    <input id="q-who" name="who" class=INPUT placeholder="acme, acme/vision or dana@example.com"/>
                </div>
                <div>
                    <label for="q-gpus" class=LABEL>"GPUs at once, per model"</label>
                    <input id="q-gpus" name="max_gpus" inputmode="decimal" class=INPUT/>
                </div>
                <div class="sm:col-span-2">
                    <label for="q-by-model" class=LABEL>"Limits of particular models"</label>
                    <input id="q-by-model" name="by_model" class=INPUT placeholder="H100-80GB = 8, A100-80GB = 16"/>
                </div>
                <div>
                    <label for="q-hours" class=LABEL>"GPU-hours a month"</label>
                    <input id="q-hours" name="gpu_hours_per_month" inputmode="decimal" class=INPUT/>
                </div>
                <div>
                    <label for="q-longest" class=LABEL>"Longest booking (h)"</label>
                    <input id="q-longest" name="max_booking_hours" inputmode="numeric" class=INPUT/>
                </div>
                <div>
                    <label for="q-overlap" class=LABEL>"Bookings at once"</label>
                    <input id="q-overlap" name="max_overlapping" inputmode="numeric" class=INPUT/>
                </div>
                <label class="flex items-center gap-2 text-xs text-slate-700 sm:col-span-5">
                    <input type="checkbox" name="allow_spot" value="yes"/>
                    "May book beyond the GPU limits as spot (preemptible: reclaimed when a guaranteed booking needs the capacity). For users of a tenant with a quota, the tenant's row decides."
                </label>
                <div class="flex items-end">
                    <button type="submit" class="w-full rounded-lg bg-indigo-600 px-4 py-2 text-sm font-semibold text-white hover:bg-indigo-500">"Save quota"</button>
                </div>
            </ActionForm>
            <p class="mt-2 text-xs text-slate-500">"Leave a limit empty for no limit. Saving replaces the row of the same level and name."</p>
            {move || result.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
        </section>
    }
    .into_any()
}

#[component]
fn QuotaTable(page: QuotasView, remove: ServerAction<RemoveQuota>) -> impl IntoView {
    if page.rows.is_empty() {
        return view! { <p class="mt-4 text-sm text-slate-500">"No quotas: nobody is limited."</p> }.into_any();
    }
    view! {
        <div class="mt-4 overflow-x-auto rounded-xl border border-slate-200 bg-white shadow-sm">
            <table class="min-w-full divide-y divide-slate-200 text-sm" aria-label="Quotas">
                <thead class="bg-slate-50 text-left text-xs font-medium text-slate-500">
                    <tr>
                        <th scope="col" class="px-4 py-2">"Who"</th>
                        <th scope="col" class="px-4 py-2">"Level"</th>
                        <th scope="col" class="px-4 py-2">"GPUs at once"</th>
                        <th scope="col" class="px-4 py-2">"Per model"</th>
                        <th scope="col" class="px-4 py-2">"GPU-hours a month"</th>
                        <th scope="col" class="px-4 py-2">"Longest booking (h)"</th>
                        <th scope="col" class="px-4 py-2">"Bookings at once"</th>
                        <th scope="col" class="px-4 py-2">"May burst as spot"</th>
                        <th scope="col" class="px-4 py-2"><span class="sr-only">"Actions"</span></th>
                    </tr>
                </thead>
                <tbody class="divide-y divide-slate-100">
                    {page.rows.into_iter().map(|r: QuotaView| view! {
                        <tr data-quota=r.key.clone()>
                            <th scope="row" class="px-4 py-2 text-left font-medium text-slate-900">{r.who.clone()}</th>
                            <td class="px-4 py-2 text-slate-600">{r.level}</td>
                            <td class="px-4 py-2">{r.max_gpus}</td>
                            <td class="px-4 py-2">{r.by_model}</td>
                            <td class="px-4 py-2">{r.gpu_hours_per_month}</td>
                            <td class="px-4 py-2">{r.max_booking_hours}</td>
                            <td class="px-4 py-2">{r.max_overlapping}</td>
                            <td class="px-4 py-2">{r.allow_spot}</td>
                            <td class="px-4 py-2 text-right">
                                {r.removable.then(|| view! {
                                    <ActionForm action=remove>
                                        <input type="hidden" name="id" value=r.id/>
                                        <button type="submit" class="text-xs font-medium text-red-700 hover:text-red-600"
                                            aria-label=format!("Remove the quota of {}", r.who)>"Remove"</button>
                                    </ActionForm>
                                })}
                            </td>
                        </tr>
                    }).collect_view()}
                </tbody>
            </table>
        </div>
    }
    .into_any()
}
