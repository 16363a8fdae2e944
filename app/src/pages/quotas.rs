use leptos::prelude::*;
use leptos_meta::Title;

use crate::components::form::{BUTTON, SMALL_DANGER_BUTTON};
use crate::components::table::{CELL, ROW_HEADER};
use crate::components::{CARD, ErrorAlert, Field, RequireUser, SavedNotice, Table};
use crate::model::{QuotaView, QuotasView, StorageQuotasView};
use crate::serverfns::{RemoveQuota, SetQuota, SetStorageQuota, quotas, storage_quotas};

/// Quotas at every level: platform admins set everyone's default and tenants' limits,
/// tenant admins their projects' and members'; everyone with access reads the rows that
/// apply within their reach.
#[component]
pub fn QuotasPage() -> impl IntoView {
    let set = ServerAction::<SetQuota>::new();
    let remove = ServerAction::<RemoveQuota>::new();
    let page = Resource::new(move || (set.version().get(), remove.version().get()), |_| quotas());
    let set_storage = ServerAction::<SetStorageQuota>::new();
    let storage = Resource::new(move || set_storage.version().get(), |_| storage_quotas());
    view! {
        <Title text="Quotas"/>
        <RequireUser>
            <h1 class="text-2xl font-bold tracking-tight text-slate-900">"Quotas"</h1>
            <SavedNotice/>
            <p class="mt-1 max-w-3xl text-sm text-slate-600">
                "A booking must fit every quota it counts against: its owner's own (or everyone's default), its project's and its tenant's. GPU limits count GPU-equivalents held at once, for each GPU model on its own (a 3g slice of an H100 is 3/7). A tenant whose quota allows spot may burst beyond it with preemptible bookings. "
                <a href="/idle-policies" class="text-indigo-700 underline hover:text-indigo-500">"Idle policies"</a>
                " say when idle environments are stopped."
            </p>
            <Transition fallback=|| view! { <p class="text-slate-600">"Loading..."</p> }>
                {move || Suspend::new(async move {
                    match page.await {
                        Ok(page) => view! { <QuotaTable page=page.clone() remove/> <QuotaForm page set/> }.into_any(),
                        Err(error) => view! { <ErrorAlert error/> }.into_any(),
                    }
                })}
            </Transition>
            {move || remove.value().get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
            <h2 class="mt-8 text-lg font-semibold text-slate-900">"Storage"</h2>
            <p class="mt-1 max-w-3xl text-sm text-slate-600">
                "GiB of volumes a tenant or a project may keep (a project's volumes count against its tenant too), and the size of each person's home volume in a tenant (10 GiB when not set). Making or growing a volume beyond a limit is refused with what is left."
            </p>
            <Transition fallback=|| ()>
                {move || Suspend::new(async move {
                    match storage.await {
                        Ok(page) => view! { <StorageTable page=page.clone()/> <StorageForm page set=set_storage/> }.into_any(),
                        Err(error) => view! { <ErrorAlert error/> }.into_any(),
                    }
                })}
            </Transition>
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
        <section class=CARD aria-labelledby="set-quota">
            <h2 id="set-quota" class="text-sm font-semibold text-slate-900">"Set a quota"</h2>
            <ActionForm action=set attr:class="mt-3 grid gap-3 sm:grid-cols-6">
                <Field id="q-level" name="level" label="Applies to" class="sm:col-span-2">
                    {levels.iter().map(|(value, label)| view! { <option value=*value>{*label}</option> }).collect_view()}
                </Field>
                <Field id="q-who" name="who" label="Who (empty for everyone)" class="sm:col-span-4"
                    placeholder="acme, acme/vision or dana@example.com"/>
                <Field id="q-gpus" name="max_gpus" label="GPUs at once, per model" inputmode="decimal"/>
                <Field id="q-by-model" name="by_model" label="Limits of particular models" class="sm:col-span-2"
                    placeholder="H100-80GB = 8, A100-80GB = 16"/>
                <Field id="q-hours" name="gpu_hours_per_month" label="GPU-hours a month" inputmode="decimal"/>
                <Field id="q-longest" name="max_booking_hours" label="Longest booking (h)" inputmode="numeric"/>
                <Field id="q-overlap" name="max_overlapping" label="Bookings at once" inputmode="numeric"/>
                <label class="flex items-center gap-2 text-xs text-slate-700 sm:col-span-5">
                    <input type="checkbox" name="allow_spot" value="yes"/>
                    "May book beyond the GPU limits as spot (preemptible: reclaimed when a guaranteed booking needs the capacity). For users of a tenant with a quota, the tenant's row decides."
                </label>
                <div class="flex items-end">
                    <button type="submit" class=format!("w-full {BUTTON}")>"Save quota"</button>
                </div>
            </ActionForm>
            <p class="mt-2 text-xs text-slate-600">"Leave a limit empty for no limit. Saving replaces the row of the same level and name."</p>
            {move || result.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
        </section>
    }
    .into_any()
}

#[component]
fn QuotaTable(page: QuotasView, remove: ServerAction<RemoveQuota>) -> impl IntoView {
    if page.rows.is_empty() {
        return view! { <p class="mt-4 text-sm text-slate-600">"No quotas: nobody is limited."</p> }.into_any();
    }
    view! {
        <Table label="Quotas" buttons_column="Actions" columns=&[
            "Who", "Level", "GPUs at once", "Per model", "GPU-hours a month", "Longest booking (h)", "Bookings at once",
            "May burst as spot",
        ]>
            {page.rows.into_iter().map(|r: QuotaView| view! {
                <tr data-quota=r.key.clone()>
                    <th scope="row" class=ROW_HEADER>{r.who.clone()}</th>
                    <td class="px-4 py-2 text-slate-600">{r.level}</td>
                    <td class=CELL>{r.max_gpus}</td>
                    <td class=CELL>{r.by_model}</td>
                    <td class=CELL>{r.gpu_hours_per_month}</td>
                    <td class=CELL>{r.max_booking_hours}</td>
                    <td class=CELL>{r.max_overlapping}</td>
                    <td class=CELL>{r.allow_spot}</td>
                    <td class="px-4 py-2 text-right">
                        {r.removable.then(|| view! {
                            <ActionForm action=remove>
                                <input type="hidden" name="id" value=r.id/>
                                <button type="submit" class=SMALL_DANGER_BUTTON
                                    aria-label=format!("Remove the quota of {}", r.who)>"Remove"</button>
                            </ActionForm>
                        })}
                    </td>
                </tr>
            }).collect_view()}
        </Table>
    }
    .into_any()
}

#[component]
fn StorageTable(page: StorageQuotasView) -> impl IntoView {
    if page.rows.is_empty() {
        return view! { <p class="mt-3 text-sm text-slate-600">"No storage limits."</p> }.into_any();
    }
    view! {
        <Table label="Storage limits" columns=&["Who", "Limit", "In use", "Home volumes"]>
            {page.rows.into_iter().map(|r| view! {
                <tr data-storage-quota=r.who.clone()>
                    <th scope="row" class=ROW_HEADER>{r.who.clone()}</th>
                    <td class=CELL>{r.max}</td>
                    <td class=CELL>{r.used_gib} " GiB"</td>
                    <td class=CELL>{r.home}</td>
                </tr>
            }).collect_view()}
        </Table>
    }
    .into_any()
}

#[component]
fn StorageForm(page: StorageQuotasView, set: ServerAction<SetStorageQuota>) -> impl IntoView {
    if !page.can_set {
        return ().into_any();
    }
    let result = set.value();
    let levels: &[(&str, &str)] = if page.can_set_tenants {
        &[("tenant", "Tenant (by slug)"), ("project", "Project (tenant/project)")]
    } else {
        &[("project", "Project (by name)")]
    };
    view! {
        <section class=CARD aria-labelledby="set-storage">
            <h2 id="set-storage" class="text-sm font-semibold text-slate-900">"Set a storage limit"</h2>
            <ActionForm action=set attr:class="mt-3 grid gap-3 sm:grid-cols-6">
                <Field id="s-level" name="level" label="Applies to" class="sm:col-span-2">
                    {levels.iter().map(|(value, label)| view! { <option value=*value>{*label}</option> }).collect_view()}
                </Field>
                <Field id="s-who" name="who" label="Who" class="sm:col-span-2" required=true placeholder="acme or acme/vision"/>
                <Field id="s-max" name="max_gib" label="Storage (GiB)" input_type="number" min=0/>
                {if page.can_set_tenants {
                    view! { <Field id="s-home" name="home_gib" label="Home volumes (GiB, tenants)" input_type="number" min=1/> }.into_any()
                } else {
                    view! { <input type="hidden" name="home_gib" value=""/> }.into_any()
                }}
                <div class="flex items-end sm:col-span-6">
                    <button type="submit" class=BUTTON>"Save storage limit"</button>
                </div>
            </ActionForm>
            <p class="mt-2 text-xs text-slate-600">"Leave the storage empty for no limit; saving both empty removes the row."</p>
            {move || result.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
        </section>
    }
    .into_any()
}
