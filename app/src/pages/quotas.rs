use leptos::prelude::*;
use leptos_meta::Title;

use crate::components::{ErrorAlert, RequireUser};
use crate::model::QuotaView;
use crate::serverfns::{SetQuota, quotas};

const INPUT: &str = "mt-1 block w-full rounded-lg border border-slate-300 px-3 py-1.5 text-sm focus:border-indigo-500 focus:outline-none focus:ring-1 focus:ring-indigo-500";
const LABEL: &str = "block text-xs font-medium text-slate-600";

/// Platform admins: everyone's default quota and per-user quotas.
#[component]
pub fn QuotasPage() -> impl IntoView {
    let set = ServerAction::<SetQuota>::new();
    let rows = Resource::new(move || set.version().get(), |_| quotas());
    let result = set.value();
    view! {
        <Title text="Quotas"/>
        <RequireUser>
            <h1 class="text-2xl font-bold tracking-tight text-slate-900">"Quotas"</h1>
            <p class="mt-1 text-sm text-slate-600">
                "Limits per user; a user without a row of their own gets everyone's default. GPU-equivalents count a MIG slice as its share of the GPU (a 3g slice of an H100 is 3/7)."
            </p>
            <Transition fallback=|| view! { <p class="text-slate-500">"Loading..."</p> }>
                {move || Suspend::new(async move {
                    match rows.await {
                        Ok(rows) => view! { <QuotaTable rows/> }.into_any(),
                        Err(error) => view! { <ErrorAlert error/> }.into_any(),
                    }
                })}
            </Transition>
            <section class="mt-6 rounded-xl border border-slate-200 bg-white p-4 shadow-sm" aria-labelledby="set-quota">
                <h2 id="set-quota" class="text-sm font-semibold text-slate-900">"Set a quota"</h2>
                <ActionForm action=set attr:class="mt-3 grid gap-3 sm:grid-cols-5">
                    <div class="sm:col-span-5">
                        <label for="q-email" class=LABEL>"User email (empty for everyone's default)"</label>
                        <input id="q-email" name="email" type="email" class=INPUT placeholder="dana.demo@berth.local"/>
                    </div>
                    <div>
                        <label for="q-gpus" class=LABEL>"GPUs at once, per model"</label>
                        <input id="q-gpus" name="max_gpus" inputmode="decimal" class=INPUT/>
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
                        "May book beyond the GPU limits as spot (preemptible: reclaimed when a guaranteed booking needs the capacity)"
                    </label>
                    <div class="flex items-end">
                        <button type="submit" class="w-full rounded-lg bg-indigo-600 px-4 py-2 text-sm font-semibold text-white hover:bg-indigo-500">"Save quota"</button>
                    </div>
                </ActionForm>
                <p class="mt-2 text-xs text-slate-500">"Leave a limit empty for no limit."</p>
                {move || result.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
            </section>
        </RequireUser>
    }
}

#[component]
fn QuotaTable(rows: Vec<QuotaView>) -> impl IntoView {
    if rows.is_empty() {
        return view! { <p class="mt-4 text-sm text-slate-500">"No quotas: nobody is limited."</p> }.into_any();
    }
    view! {
        <div class="mt-4 overflow-x-auto rounded-xl border border-slate-200 bg-white shadow-sm">
            <table class="min-w-full divide-y divide-slate-200 text-sm" aria-label="Quotas">
                <thead class="bg-slate-50 text-left text-xs font-medium text-slate-500">
                    <tr>
                        <th scope="col" class="px-4 py-2">"Who"</th>
                        <th scope="col" class="px-4 py-2">"GPUs at once"</th>
                        <th scope="col" class="px-4 py-2">"GPU-hours a month"</th>
                        <th scope="col" class="px-4 py-2">"Longest booking (h)"</th>
                        <th scope="col" class="px-4 py-2">"Bookings at once"</th>
                        <th scope="col" class="px-4 py-2">"May burst as spot"</th>
                    </tr>
                </thead>
                <tbody class="divide-y divide-slate-100">
                    {rows.into_iter().map(|r| view! {
                        <tr data-quota=r.email.clone()>
                            <th scope="row" class="px-4 py-2 text-left font-medium text-slate-900">{r.who}</th>
                            <td class="px-4 py-2">{r.max_gpus}</td>
                            <td class="px-4 py-2">{r.gpu_hours_per_month}</td>
                            <td class="px-4 py-2">{r.max_booking_hours}</td>
                            <td class="px-4 py-2">{r.max_overlapping}</td>
                            <td class="px-4 py-2">{r.allow_spot}</td>
                        </tr>
                    }).collect_view()}
                </tbody>
            </table>
        </div>
    }
    .into_any()
}
