use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_params_map;

use crate::components::{ErrorAlert, RequireUser, StateBadge, poll_every};
use crate::model::{ConnectionView, EnvironmentView, StepView};
use crate::serverfns::{ChangeEnd, StopEnvironment, environment};

/// One environment: its state, connection details, every step with its timing, and
/// the GPUs it holds. Refreshes itself until the environment is finished.
#[component]
pub fn EnvironmentPage() -> impl IntoView {
    view! {
        <RequireUser>
            <EnvironmentDetail/>
        </RequireUser>
    }
}

#[component]
fn EnvironmentDetail() -> impl IntoView {
    let params = use_params_map();
    let id = move || params.read().get("id").unwrap_or_default();
    let stop = ServerAction::<StopEnvironment>::new();
    let change = ServerAction::<ChangeEnd>::new();
    let tick = RwSignal::new(0u64);
    let env = Resource::new(
        move || (id(), tick.get(), stop.version().get(), change.version().get()),
        |(id, ..)| environment(id),
    );
    poll_every(1000, move || {
        // Stop polling once the environment is finished.
        let finished = env.get_untracked().and_then(Result::ok).is_some_and(|e| e.summary.finished);
        if !finished {
            tick.update(|t| *t += 1);
        }
    });
    view! {
        <Transition fallback=|| view! { <p class="text-slate-500">"Loading..."</p> }>
            {move || Suspend::new(async move {
                match env.await {
                    Ok(view) => view! { <EnvironmentBody view stop change/> }.into_any(),
                    Err(error) => view! { <ErrorAlert error/> }.into_any(),
                }
            })}
        </Transition>
    }
}

#[component]
fn EnvironmentBody(
    view: EnvironmentView,
    stop: ServerAction<StopEnvironment>,
    change: ServerAction<ChangeEnd>,
) -> impl IntoView {
    let s = view.summary.clone();
    let stop_error = stop.value();
    let change_error = change.value();
    let id_for_change = s.id.clone();
    let stop_label = if s.state == "scheduled" { "Cancel booking" } else { "Stop and release" };
    view! {
        <Title text=s.name.clone()/>
        <a href="/environments" class="text-sm text-indigo-600 hover:text-indigo-500">"← My environments"</a>
        <div class="mt-2 flex flex-wrap items-start justify-between gap-4">
            <div>
                <div class="flex items-center gap-3">
                    <h1 class="text-2xl font-bold tracking-tight text-slate-900">{s.name.clone()}</h1>
                    <StateBadge state=s.state.clone() label=s.state_label.clone()/>
                    {s.spot.then(|| view! {
                        <span data-tier="spot" class="rounded-full bg-amber-100 px-2.5 py-0.5 text-xs font-medium text-amber-900 ring-1 ring-inset ring-amber-300"
                            title="Preemptible: reclaimed when a guaranteed booking needs the capacity">"Spot"</span>
                    })}
                </div>
                <p class="mt-1 text-sm text-slate-600">
                    {s.offering.clone()} " · " {s.size.clone()} " · " {s.price.clone()} " · " {s.window.clone()}
                    // The page updates itself once the WASM runs; before that, a plain link does.
                    {(!s.finished).then(|| view! {
                        " · " <a href=format!("/environments/{}", s.id) class="text-indigo-600 hover:text-indigo-500">"Refresh"</a>
                    })}
                </p>
            </div>
            {s.stoppable.then(|| view! {
                <ActionForm action=stop>
                    <input type="hidden" name="id" value=s.id.clone()/>
                    <button type="submit" class="rounded-lg bg-white px-4 py-2 text-sm font-semibold text-red-700 ring-1 ring-red-300 hover:bg-red-50">
                        {stop_label}
                    </button>
                </ActionForm>
            })}
        </div>
        {s.resizable.then(|| view! {
            <ActionForm action=change attr:class="mt-4 flex flex-wrap items-end gap-2">
                <input type="hidden" name="id" value=id_for_change/>
                <div>
                    <label for="end" class="block text-xs font-medium text-slate-600">"Window ends (UTC)"</label>
                    <input id="end" name="end" type="datetime-local" value=s.ends_input.clone() required
                        class="mt-1 rounded-lg border border-slate-300 px-3 py-1.5 text-sm focus:border-indigo-500 focus:outline-none focus:ring-1 focus:ring-indigo-500"/>
                </div>
                <button type="submit" class="rounded-lg bg-white px-3 py-1.5 text-sm font-semibold text-slate-700 ring-1 ring-slate-300 hover:bg-slate-50">
                    "Change end"
                </button>
            </ActionForm>
        })}
        <div class="mt-4 space-y-4">
            {move || stop_error.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
            {move || change_error.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
            {view.failure_reason.clone().map(|reason| view! {
                <div role="alert" class="rounded-lg border border-red-200 bg-red-50 p-4 text-sm text-red-800">
                    <p class="font-semibold">"This environment failed"</p>
                    <p class="mt-1">{reason}</p>
                    <p class="mt-1 text-red-700">"Everything it held has been (or is being) released; you are not charged past this point."</p>
                </div>
            })}
        </div>
        <div class="mt-6 grid gap-6 lg:grid-cols-3">
            <div class="space-y-6 lg:col-span-2">
                {view.connection.clone().map(|c| view! { <ConnectionCard connection=c/> })}
                <section class="rounded-xl border border-slate-200 bg-white shadow-sm" aria-labelledby="steps-title">
                    <h2 id="steps-title" class="border-b border-slate-100 px-5 py-3 font-semibold text-slate-900">"Progress"</h2>
                    <ol class="divide-y divide-slate-100">
                        {view.steps.clone().into_iter().map(|step| view! { <StepRow step/> }).collect_view()}
                    </ol>
                </section>
            </div>
            <div class="space-y-6">
                <section class="rounded-xl border border-slate-200 bg-white p-5 shadow-sm">
                    <h2 class="font-semibold text-slate-900">"Details"</h2>
                    <dl class="mt-3 space-y-2 text-sm">
                        {view.image.clone().map(|i| view! { <div><dt class="text-slate-500">"Image"</dt><dd class="break-all font-mono text-xs text-slate-900">{i}</dd></div> })}
                        {view.command.clone().map(|c| view! { <div><dt class="text-slate-500">"Command"</dt><dd class="break-all font-mono text-xs text-slate-900">{c}</dd></div> })}
                        {view.timeline.clone().into_iter().map(|(what, when)| view! {
                            <div class="flex justify-between gap-2"><dt class="text-slate-500">{what}</dt><dd class="text-slate-900">{when}</dd></div>
                        }).collect_view()}
                    </dl>
                </section>
                <section class="rounded-xl border border-slate-200 bg-white p-5 shadow-sm">
                    <h2 class="font-semibold text-slate-900">"Capacity"</h2>
                    <ul class="mt-3 space-y-2 text-sm">
                        {view.units.clone().into_iter().map(|u| view! {
                            <li class=if u.released { "text-slate-400 line-through" } else { "text-slate-900" }>
                                <div class="font-medium">{u.model} " · " {u.what}</div>
                                <div class="text-xs">{u.location}</div>
                            </li>
                        }).collect_view()}
                    </ul>
                </section>
            </div>
        </div>
    }
}

#[component]
fn ConnectionCard(connection: ConnectionView) -> impl IntoView {
    view! {
        <section class="rounded-xl border border-emerald-200 bg-emerald-50 p-5" aria-labelledby="connect-title">
            <h2 id="connect-title" class="font-semibold text-emerald-900">"Connect"</h2>
            <dl class="mt-3 space-y-3 text-sm">
                <div>
                    <dt class="text-emerald-800">"URL"</dt>
                    <dd><a href=connection.url.clone() class="break-all font-mono text-emerald-900 underline" data-connection-url="">{connection.url.clone()}</a></dd>
                </div>
                {connection.secret_label.clone().zip(connection.secret.clone()).map(|(label, secret)| view! {
                    <div>
                        <dt class="text-emerald-800">{label}</dt>
                        <dd>
                            <details>
                                <summary class="cursor-pointer text-emerald-900">"Show"</summary>
                                <code class="mt-1 block break-all rounded bg-white px-2 py-1 font-mono text-xs text-slate-900">{secret}</code>
                            </details>
                        </dd>
                    </div>
                })}
                <div>
                    <dt class="text-emerald-800">"Example"</dt>
                    <dd><code class="block break-all rounded bg-white px-2 py-1 font-mono text-xs text-slate-900">{connection.example.clone()}</code></dd>
                </div>
            </dl>
        </section>
    }
}

#[component]
fn StepRow(step: StepView) -> impl IntoView {
    let (icon, tone) = match step.status.as_str() {
        "succeeded" => ("✓", "bg-emerald-100 text-emerald-700"),
        "running" => ("•", "bg-amber-100 text-amber-700 animate-pulse"),
        "failed" => ("✕", "bg-red-100 text-red-700"),
        _ => ("", "bg-slate-100 text-slate-400"),
    };
    let phase = if step.phase == "teardown" { "Teardown" } else { "Provision" };
    view! {
        <li class="flex items-start gap-3 px-5 py-3" data-step-status=step.status.clone()>
            <span class=format!("mt-0.5 grid h-6 w-6 shrink-0 place-items-center rounded-full text-xs font-bold {tone}") aria-hidden="true">{icon}</span>
            <div class="min-w-0 flex-1">
                <div class="flex justify-between gap-2 text-sm">
                    <span class="font-medium text-slate-900">{step.label.clone()} <span class="sr-only">{format!(" ({})", step.status)}</span></span>
                    <span class="shrink-0 text-slate-500">{step.timing.clone()}</span>
                </div>
                <div class="text-xs text-slate-500">
                    {phase}
                    {(step.attempts > 1).then(|| format!(" · attempt {}", step.attempts))}
                    {step.detail.clone().map(|d| format!(" · {d}"))}
                </div>
            </div>
        </li>
    }
}
