use leptos::prelude::*;
use leptos_meta::Title;

use crate::components::{ErrorAlert, RequireUser, StateBadge, poll_every};
use crate::serverfns::my_environments;

/// "My environments": everything the user launched, refreshed every two seconds. Its
/// resource is made outside `RequireUser` (see there why).
#[component]
pub fn EnvironmentsPage() -> impl IntoView {
    let environments = Resource::new(|| (), |_| my_environments());
    poll_every(2000, move || environments.refetch());
    view! {
        <Title text="My environments"/>
        <RequireUser>
            <div class="mb-6 flex items-center justify-between">
                <h1 class="text-2xl font-bold tracking-tight text-slate-900">"My environments"</h1>
                <a href="/catalog" class="rounded-lg bg-indigo-600 px-3 py-1.5 text-sm font-semibold text-white hover:bg-indigo-500">"Launch new"</a>
            </div>
            <Transition fallback=|| view! { <p class="text-slate-500">"Loading..."</p> }>
                {move || Suspend::new(async move {
                    match environments.await {
                        Ok(list) if list.is_empty() => view! {
                            <div class="rounded-xl border-2 border-dashed border-slate-200 p-12 text-center">
                                <p class="font-medium text-slate-900">"Nothing running yet"</p>
                                <p class="mt-1 text-sm text-slate-500">"Pick a notebook, job, endpoint or cluster from the catalog."</p>
                            </div>
                        }.into_any(),
                        Ok(list) => view! {
                            <div class="overflow-hidden rounded-xl border border-slate-200 bg-white shadow-sm">
                                <table class="w-full text-sm">
                                    <thead class="bg-slate-50 text-left text-xs uppercase tracking-wide text-slate-500">
                                        <tr>
                                            <th class="px-4 py-2 font-medium">"Name"</th>
                                            <th class="px-4 py-2 font-medium">"State"</th>
                                            <th class="hidden px-4 py-2 font-medium md:table-cell">"Size"</th>
                                            <th class="hidden px-4 py-2 font-medium sm:table-cell">"Window"</th>
                                            <th class="px-4 py-2 text-right font-medium">"Price"</th>
                                        </tr>
                                    </thead>
                                    <tbody class="divide-y divide-slate-100">
                                        {list.into_iter().map(|e| view! {
                                            <tr data-environment=e.name.clone()>
                                                <td class="px-4 py-3">
                                                    <a href=format!("/environments/{}", e.id) class="font-medium text-indigo-600 hover:text-indigo-500">{e.name.clone()}</a>
                                                    <div class="text-xs text-slate-500">{e.offering.clone()}</div>
                                                </td>
                                                <td class="px-4 py-3">
                                                    <StateBadge state=e.state.clone() label=e.state_label.clone()/>
                                                    {e.spot.then(|| view! { <span data-tier="spot" class="ml-1 rounded-full bg-amber-100 px-2 py-0.5 text-xs font-medium text-amber-900">"Spot"</span> })}
                                                </td>
                                                <td class="hidden px-4 py-3 text-slate-600 md:table-cell">{e.size.clone()}</td>
                                                <td class="hidden px-4 py-3 text-slate-600 sm:table-cell">{e.window.clone()}</td>
                                                <td class="px-4 py-3 text-right text-slate-900">{e.price.clone()}</td>
                                            </tr>
                                        }).collect_view()}
                                    </tbody>
                                </table>
                            </div>
                        }.into_any(),
                        Err(error) => view! { <ErrorAlert error/> }.into_any(),
                    }
                })}
            </Transition>
        </RequireUser>
    }
}
