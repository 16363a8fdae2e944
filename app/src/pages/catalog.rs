use berth_domain::catalog::{Offering, Size};
use berth_domain::metering::format_money;
use berth_domain::placement::Shape;
use berth_domain::rates::SizePrice;
use leptos::prelude::*;
use leptos_meta::Title;

use crate::components::IfMayLaunch;
use crate::serverfns::{fleet_capacity, size_prices};

/// The service catalog: every offering with its sizes and prices, open to everyone.
#[component]
pub fn CatalogPage() -> impl IntoView {
    let capacity = Resource::new(|| (), |_| fleet_capacity());
    let prices = Resource::new(|| (), |_| size_prices());
    view! {
        <Title text="Catalog"/>
        <div class="mb-8 flex flex-wrap items-end justify-between gap-4">
            <div>
                <h1 class="text-2xl font-bold tracking-tight text-slate-900">"Service catalog"</h1>
                <p class="mt-1 text-slate-600">
                    "GPU environments from a MIG slice to whole nodes, billed per hour. "
                    <a href="/images" class="text-indigo-700 underline hover:text-indigo-500">"Images they run"</a>
                </p>
            </div>
            <Suspense fallback=|| ()>
                {move || Suspend::new(async move {
                    capacity.await.ok().map(|models| view! {
                        <div>
                        <ul class="flex flex-wrap gap-2" aria-label="Free GPUs by model">
                            {models.into_iter().map(|m| view! {
                                <li class="rounded-lg bg-white px-3 py-1.5 text-xs text-slate-600 ring-1 ring-slate-200">
                                    <span class="font-semibold text-slate-900">{m.model}</span>
                                    " · " {m.idle_gpus} " of " {m.gpus} " GPUs free now"
                                </li>
                            }).collect_view()}
                        </ul>
                        <p class="mt-1 max-w-md text-xs text-slate-600" data-free-means="">
                            "Free: healthy, and no booking holds any part of it now. The launch form counts how many of each size fit for your duration, from your start."
                        </p>
                        </div>
                    })
                })}
            </Suspense>
        </div>
        <Suspense fallback=|| ()>
            {move || Suspend::new(async move {
                let prices = prices.await.unwrap_or_default();
                view! {
                    <div class="grid gap-6 lg:grid-cols-2">
                        {Offering::ALL.into_iter().map(|o| view! { <OfferingCard offering=o prices=prices.clone()/> }).collect_view()}
                    </div>
                }
            })}
        </Suspense>
        <p class="mt-6 text-xs text-slate-600">
            "List prices in force now, from the "
            <a href="/prices" class="text-indigo-700 underline hover:text-indigo-500">"rate card"</a>
            ". A booking is charged the rates in force while it runs, less your team's discount; the launch form shows its cost."
        </p>
    }
}

/// "$3.20/h", or "no price yet" (the size cannot be booked until the rate card prices it).
fn price_of(prices: &[SizePrice], offering: Offering, size: &Size) -> String {
    prices
        .iter()
        .find(|p| p.offering == offering.id() && p.size == size.id)
        .and_then(|p| p.cents_per_hour)
        .map_or_else(|| "no price yet".to_owned(), |cents| format!("{}/h", format_money(cents)))
}

#[component]
fn OfferingCard(offering: Offering, prices: Vec<SizePrice>) -> impl IntoView {
    let launch = format!("/launch/{}", offering.id());
    view! {
        <section class="flex flex-col rounded-xl border border-slate-200 bg-white shadow-sm" aria-labelledby=format!("offering-{}", offering.id())>
            <div class="border-b border-slate-100 p-5">
                <h2 id=format!("offering-{}", offering.id()) class="text-lg font-semibold text-slate-900">{offering.title()}</h2>
                <p class="mt-1 text-sm text-slate-600">{offering.summary()}</p>
            </div>
            <table class="w-full text-sm">
                <thead>
                    <tr class="text-left text-xs uppercase tracking-wide text-slate-600">
                        <th class="px-5 py-2 font-medium">"Size"</th>
                        <th class="px-2 py-2 font-medium">"vCPU / RAM"</th>
                        <th class="px-2 py-2 text-right font-medium">"Price"</th>
                        <th class="px-5 py-2"><span class="sr-only">"Launch"</span></th>
                    </tr>
                </thead>
                <tbody class="divide-y divide-slate-100">
                    {offering.sizes().iter().map(|s| view! { <SizeRow offering size=s prices=prices.clone()/> }).collect_view()}
                </tbody>
            </table>
            <div class="mt-auto flex items-center justify-between p-5">
                <span class="text-xs text-slate-600">"Up to " {offering.max_hours()} " hours per booking"</span>
                <IfMayLaunch signed_out=true>
                    <a href=launch.clone() class="rounded-lg bg-indigo-600 px-3 py-1.5 text-sm font-semibold text-white hover:bg-indigo-500">
                        "Launch " {offering.title()}
                    </a>
                </IfMayLaunch>
            </div>
        </section>
    }
}

#[component]
fn SizeRow(offering: Offering, size: &'static Size, prices: Vec<SizePrice>) -> impl IntoView {
    let kind = match size.shape {
        Shape::MigSlice { .. } => "MIG slice",
        Shape::Gpus { .. } => "dedicated GPU",
        Shape::Nodes { .. } => "whole nodes",
        Shape::Share { .. } => "development tier: time-sliced, shared with others, no isolation guarantees",
    };
    // The same size on other GPU models: a launch may take whichever is free.
    let others: String = offering
        .same_size_on_other_models(size)
        .map(|s| format!("{} ({})", s.gpu_model(), price_of(&prices, offering, s)))
        .collect::<Vec<_>>()
        .join(", ");
    view! {
        <tr>
            <td class="px-5 py-2.5">
                <div class="font-medium text-slate-900">{size.label}</div>
                <div class="text-xs text-slate-600">{kind}</div>
                {(!others.is_empty()).then(|| view! {
                    <div class="text-xs text-slate-600" data-also=size.id>"Also on " {others.clone()} ": a booking may allow either"</div>
                })}
            </td>
            <td class="px-2 py-2.5 text-slate-600">{size.vcpus} " / " {size.memory_gb} " GB"</td>
            <td class="px-2 py-2.5 text-right font-medium text-slate-900">{price_of(&prices, offering, size)}</td>
            <td class="px-5 py-2.5 text-right">
                <IfMayLaunch signed_out=true>
                    <a href=format!("/launch/{}?size={}", offering.id(), size.id) class="text-sm font-semibold text-indigo-600 hover:text-indigo-500"
                       aria-label=format!("Launch {} {}", offering.title(), size.label)>
                        "Launch"
                    </a>
                </IfMayLaunch>
            </td>
        </tr>
    }
}
