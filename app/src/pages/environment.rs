use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_params_map;

use crate::components::form::{UTC_TIME_PATTERN, UTC_TIME_PLACEHOLDER};
use crate::components::{ConfirmButton, CopyButton, ErrorAlert, RequireUser, StateBadge, poll_every};
use crate::error::AppError;
use crate::model::{ConnectionView, EndpointView, EnvironmentView, GpuUseView, IdleView, JobLogsView, StepView};
use crate::serverfns::{
    ChangeEnd, KeepEnvironment, ReplaceApiKey, RevealApiKey, SetReplicas, StopEnvironment, environment,
    environment_gpu_use,
};

/// The forms of an environment's page, held above its body so their answers (an API key
/// shown once) survive the body's refreshes.
#[derive(Clone, Copy)]
struct Actions {
    stop: ServerAction<StopEnvironment>,
    change: ServerAction<ChangeEnd>,
    reveal: ServerAction<RevealApiKey>,
    replace: ServerAction<ReplaceApiKey>,
    scale: ServerAction<SetReplicas>,
    keep: ServerAction<KeepEnvironment>,
    /// The endpoint key the last reveal or replace answered.
    shown_key: RwSignal<Option<String>>,
    /// Its GPUs' use and its standing with the idle watcher, read every few seconds.
    gpu_use: Resource<Result<(GpuUseView, IdleView), AppError>>,
}

/// One environment: its state, connection details, every step with its timing, and
/// the GPUs it holds. Refreshes itself until the environment is finished. Its resource is
/// made outside `RequireUser` (see there why).
#[component]
pub fn EnvironmentPage() -> impl IntoView {
    let params = use_params_map();
    let id = move || params.read().get("id").unwrap_or_default();
    let stop = ServerAction::<StopEnvironment>::new();
    let change = ServerAction::<ChangeEnd>::new();
    let reveal = ServerAction::<RevealApiKey>::new();
    let replace = ServerAction::<ReplaceApiKey>::new();
    let scale = ServerAction::<SetReplicas>::new();
    let keep = ServerAction::<KeepEnvironment>::new();
    let shown_key = RwSignal::new(None);
    Effect::new(move |_| {
        if let Some(Ok(Some(key))) = reveal.value().get() {
            shown_key.set(Some(key));
        }
    });
    Effect::new(move |_| {
        if let Some(Ok(Some(key))) = replace.value().get() {
            shown_key.set(Some(key));
        }
    });
    let tick = RwSignal::new(0u64);
    // Readings arrive every half minute or so: every fifth refresh is often enough.
    let gpu_use = Resource::new(
        move || (id(), tick.get() / 5, keep.version().get(), stop.version().get()),
        |(id, ..)| environment_gpu_use(id),
    );
    let actions = Actions { stop, change, reveal, replace, scale, keep, shown_key, gpu_use };
    let env = Resource::new(
        move || {
            let versions = (reveal.version().get(), replace.version().get(), scale.version().get());
            (id(), tick.get(), stop.version().get(), change.version().get(), versions)
        },
        |(id, ..)| environment(id),
    );
    // Polling stops once the environment is finished (copied by an effect: the timer must
    // not read the resource outside Suspense).
    let finished = RwSignal::new(false);
    Effect::new(move |_| finished.set(env.get().and_then(Result::ok).is_some_and(|e| e.summary.finished)));
    poll_every(1000, move || {
        if !finished.get_untracked() {
            tick.update(|t| *t += 1);
        }
    });
    view! {
        <RequireUser>
            <Transition fallback=|| view! { <p class="text-slate-600">"Loading..."</p> }>
                {move || Suspend::new(async move {
                    match env.await {
                        Ok(view) => view! { <EnvironmentBody view actions/> }.into_any(),
                        Err(error) => view! { <ErrorAlert error/> }.into_any(),
                    }
                })}
            </Transition>
        </RequireUser>
    }
}

#[component]
fn EnvironmentBody(view: EnvironmentView, actions: Actions) -> impl IntoView {
    let Actions { stop, change, .. } = actions;
    let s = view.summary.clone();
    let stop_error = stop.value();
    let change_error = change.value();
    let id_for_change = s.id.clone();
    let id_for_endpoint = s.id.clone();
    let (stop_label, stop_consequence, stop_confirm) = if s.state == "scheduled" {
        ("Cancel booking", "Cancels the booking and frees its time for others.", "Yes, cancel the booking")
    } else {
        (
            "Stop and release",
            "Stops it now and releases its GPUs. Files outside your volumes are lost.",
            "Yes, stop and release",
        )
    };
    view! {
        <Title text=s.name.clone()/>
        <a href="/environments" class="text-sm text-indigo-600 hover:text-indigo-500">"← Environments"</a>
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
                    <ConfirmButton label=stop_label consequence=stop_consequence confirm=stop_confirm
                        class="rounded-lg bg-white px-4 py-2 text-sm font-semibold text-red-700 ring-1 ring-red-300 hover:bg-red-50"/>
                </ActionForm>
            })}
        </div>
        {s.resizable.then(|| view! {
            <ActionForm action=change attr:id="change-end" attr:class="mt-4 flex flex-wrap items-end gap-2">
                <input type="hidden" name="id" value=id_for_change/>
                <div>
                    <label for="end" class="block text-xs font-medium text-slate-600">"Window ends (UTC)"</label>
                    <input id="end" name="end" type="text" value=s.ends_input.clone() required
                        pattern=UTC_TIME_PATTERN placeholder=UTC_TIME_PLACEHOLDER
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
                <GpuUse actions id=view.summary.id.clone()/>
                {view.open_url.clone().zip(view.notebook_url.clone()).map(|(url, address)| view! { <NotebookCard url address/> })}
                {view.endpoint.clone().map(|endpoint| view! { <EndpointCard id=id_for_endpoint.clone() endpoint actions/> })}
                {view.logs.clone().map(|logs| view! { <JobLogsCard logs id=view.summary.id.clone()/> })}
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
                        {view.image.clone().map(|i| view! { <div><dt class="text-slate-600">"Image"</dt><dd class="break-all font-mono text-xs text-slate-900">{i}</dd></div> })}
                        {view.command.clone().map(|c| view! { <div><dt class="text-slate-600">"Command"</dt><dd class="break-all font-mono text-xs text-slate-900">{c}</dd></div> })}
                        {view.model.clone().map(|m| view! { <div><dt class="text-slate-600">"Model"</dt><dd class="break-all font-mono text-xs text-slate-900" data-testid="model">{m}</dd></div> })}
                        {view.args.clone().map(|a| view! { <div><dt class="text-slate-600">"Server arguments"</dt><dd class="break-all font-mono text-xs text-slate-900" data-testid="server-args">{a}</dd></div> })}
                        {view.env_names.clone().map(|n| view! { <div><dt class="text-slate-600">"Environment variables (values hidden)"</dt><dd class="break-all font-mono text-xs text-slate-900" data-testid="env-names">{n}</dd></div> })}
                        {view.timeline.clone().into_iter().map(|(what, when)| view! {
                            <div class="flex justify-between gap-2"><dt class="text-slate-600">{what}</dt><dd class="text-slate-900">{when}</dd></div>
                        }).collect_view()}
                    </dl>
                </section>
                {(!view.node_changes.is_empty()).then(|| view! {
                    <section class="rounded-xl border border-amber-200 bg-amber-50 p-5" data-node-changes="">
                        <h2 class="font-semibold text-amber-900">"Nodes replaced"</h2>
                        <ul class="mt-3 space-y-2 text-sm text-amber-900">
                            {view.node_changes.clone().into_iter().map(|change| view! { <li>{change}</li> }).collect_view()}
                        </ul>
                    </section>
                })}
                {(!view.volumes.is_empty()).then(|| view! {
                    <section class="rounded-xl border border-slate-200 bg-white p-5 shadow-sm" data-environment-volumes="">
                        <h2 class="font-semibold text-slate-900">"Volumes"</h2>
                        <ul class="mt-3 space-y-2 text-sm">
                            {view.volumes.clone().into_iter().map(|v| {
                                let tone = if v.until.is_some() { "text-slate-600" } else { "text-slate-900" };
                                let (mount, shown_mount) = (v.mount_path.clone(), v.mount_path);
                                let detached = v.until.map(|until| view! { ", detached " {until} });
                                view! {
                                    <li class=tone data-mount=mount>
                                        <div class="font-medium">
                                            <a href="/volumes" class="text-indigo-700 underline hover:text-indigo-500">{v.volume}</a>
                                            " at " <code class="text-xs">{shown_mount}</code>
                                        </div>
                                        <div class="text-xs">"attached " {v.since} {detached}</div>
                                    </li>
                                }
                            }).collect_view()}
                        </ul>
                    </section>
                })}
                <section class="rounded-xl border border-slate-200 bg-white p-5 shadow-sm">
                    <h2 class="font-semibold text-slate-900">"Capacity"</h2>
                    <ul class="mt-3 space-y-2 text-sm">
                        {view.units.clone().into_iter().map(|u| view! {
                            <li class=if u.released { "text-slate-600 line-through" } else { "text-slate-900" }
                                data-unit=if u.released { "released" } else { "held" }>
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

/// The idle watcher's warning (with "keep it") and the GPU charts.
#[component]
fn GpuUse(actions: Actions, id: String) -> impl IntoView {
    let Actions { keep, gpu_use, .. } = actions;
    let keep_error = keep.value();
    view! {
        {move || keep_error.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
        <Transition fallback=|| ()>
            {move || {
                let id = id.clone();
                Suspend::new(async move {
                    match gpu_use.await {
                        Ok((used, idle)) => view! { <IdleCard idle keep id/> <GpuUseCard used/> }.into_any(),
                        // The page's own alert says what is wrong with the environment.
                        Err(_) => ().into_any(),
                    }
                })
            }}
        </Transition>
    }
}

#[component]
fn IdleCard(idle: IdleView, keep: ServerAction<KeepEnvironment>, id: String) -> impl IntoView {
    let IdleView { policy, warning, warning_title, may_keep, keeps, stopped } = idle;
    let keep_form = may_keep.then(|| {
        view! {
            <ActionForm action=keep attr:class="mt-3">
                <input type="hidden" name="id" value=id/>
                <button type="submit" class="rounded-lg bg-amber-700 px-3 py-1.5 text-sm font-semibold text-white hover:bg-amber-600">
                    "Keep it"
                </button>
            </ActionForm>
        }
    });
    match (warning, stopped) {
        (Some(warning), _) => view! {
            <section id="idle" role="alert" data-idle="warned" class="rounded-xl border border-amber-300 bg-amber-50 p-5 text-sm text-amber-950">
                <h2 class="font-semibold">{warning_title}</h2>
                <p class="mt-1">{warning}</p>
                <p class="mt-1 text-amber-900">{policy.unwrap_or_default()} {(!keeps.is_empty()).then(|| format!(" ({keeps})."))}</p>
                {keep_form}
            </section>
        }
        .into_any(),
        (None, Some(stopped)) => view! {
            <section id="idle" data-idle="stopped" class="rounded-xl border border-slate-200 bg-slate-50 p-5 text-sm text-slate-800">
                <h2 class="font-semibold">"Stopped for idleness"</h2>
                <p class="mt-1">{stopped} " " {policy.unwrap_or_default()}</p>
            </section>
        }
        .into_any(),
        (None, None) => policy
            .map(|policy| {
                view! {
                    <p id="idle" data-idle="watched" class="text-xs text-slate-600">
                        "Idle policy: " {policy} {(!keeps.is_empty()).then(|| format!(" ({keeps})"))}
                    </p>
                }
            })
            .into_any(),
    }
}

/// Utilization, memory and power over the last hour and day, as SVG (no script needed).
#[component]
fn GpuUseCard(used: GpuUseView) -> impl IntoView {
    view! {
        <section class="rounded-xl border border-slate-200 bg-white p-5 shadow-sm" aria-labelledby="gpu-use-title" data-gpu-use="">
            <h2 id="gpu-use-title" class="font-semibold text-slate-900">"GPU use"</h2>
            <p class="mt-1 text-sm text-slate-700" data-gpu-latest="">{used.latest}</p>
            {used.has_readings.then(|| view! {
                <div class="mt-3 grid gap-3 sm:grid-cols-3">
                    {used.charts.into_iter().map(|c| view! {
                        <figure>
                            <figcaption class="flex justify-between text-xs text-slate-700">
                                <span>{c.title}</span><span>{c.top}</span>
                            </figcaption>
                            <svg viewBox="0 0 300 60" class="mt-1 h-16 w-full rounded bg-slate-50" role="img" aria-label=c.summary>
                                <polyline points=c.points fill="none" stroke-width="1.5" class="stroke-indigo-600"/>
                            </svg>
                        </figure>
                    }).collect_view()}
                </div>
            })}
            {(!used.xid_errors.is_empty()).then(|| view! {
                <h3 class="mt-4 text-sm font-semibold text-slate-900">"GPU errors (XID) while it ran"</h3>
                <ul class="mt-1 list-disc pl-5 text-sm text-slate-700" data-xid-errors="">
                    {used.xid_errors.into_iter().map(|x| view! { <li>{x}</li> }).collect_view()}
                </ul>
            })}
        </section>
    }
}

const CARD: &str = "rounded-xl border border-emerald-200 bg-emerald-50 p-5";
const SMALL_BUTTON: &str =
    "rounded-lg bg-white px-3 py-1.5 text-sm font-semibold text-slate-700 ring-1 ring-slate-300 hover:bg-slate-50";

/// A ready notebook, opened through Berth on an origin of its own: the link is a full page
/// load of the portal's open route (not the app's router), which signs this browser in
/// there; in a tab of its own.
#[component]
fn NotebookCard(url: String, address: String) -> impl IntoView {
    view! {
        <section class=CARD aria-labelledby="open-title">
            <h2 id="open-title" class="font-semibold text-emerald-900">"Connect"</h2>
            <p class="mt-2 text-sm text-emerald-900">
                "JupyterLab opens on an address of its own, signed in through Berth: only you and your tenant admins can open it, and no token is needed."
            </p>
            <a href=url target="_blank" rel="noopener external" data-testid="open-notebook"
                class="mt-3 inline-block rounded-lg bg-emerald-700 px-4 py-2 text-sm font-semibold text-white hover:bg-emerald-600">
                "Open JupyterLab"
            </a>
            <p class="mt-2 break-all font-mono text-xs text-emerald-800" data-testid="notebook-address">{address}</p>
        </section>
    }
}

/// An inference endpoint: its URL, its API key (shown once), an example, its replicas.
#[component]
fn EndpointCard(id: String, endpoint: EndpointView, actions: Actions) -> impl IntoView {
    let Actions { reveal, replace, scale, shown_key, .. } = actions;
    let key_from_form = endpoint.shown_key.clone();
    let key_error = move || {
        let failed = |v: Option<Result<Option<String>, crate::error::AppError>>| v.and_then(Result::err);
        failed(reveal.value().get()).or_else(|| failed(replace.value().get()))
    };
    let scale_error = scale.value();
    let replicas_note = if endpoint.replicas == endpoint.replicas_applied {
        format!("{} running", endpoint.replicas)
    } else {
        format!("{} asked, {} running; applying", endpoint.replicas, endpoint.replicas_applied)
    };
    let (id_reveal, id_replace, id_scale) = (id.clone(), id.clone(), id);
    view! {
        <section class=CARD aria-labelledby="endpoint-title" data-testid="endpoint">
            <h2 id="endpoint-title" class="font-semibold text-emerald-900">"Call the endpoint"</h2>
            <dl class="mt-3 space-y-3 text-sm">
                <div>
                    <dt class="text-emerald-800">"URL"</dt>
                    <dd class="break-all font-mono text-emerald-900" data-endpoint-url="">{endpoint.url.clone()}</dd>
                </div>
                <div>
                    <dt class="text-emerald-800">"API key"</dt>
                    <dd>
                        {move || shown_key.get().or_else(|| key_from_form.clone()).map(|key| view! {
                            <div role="status" class="mt-1 rounded-lg border-2 border-amber-300 bg-amber-50 p-3">
                                <p class="text-xs font-medium text-amber-900">"Copy it now: Berth keeps only its hash and will not show it again."</p>
                                <code data-testid="api-key" class="mt-1 block select-all break-all rounded bg-white px-2 py-1 font-mono text-xs text-slate-900">{key.clone()}</code>
                                <CopyButton text=key label="Copy the API key"/>
                            </div>
                        })}
                        {match (endpoint.may_connect, endpoint.key_state.as_str()) {
                            (false, _) => view! { <p class="text-emerald-900">"Only its owner and their tenant admins see the key."</p> }.into_any(),
                            (true, "pending") => view! { <p class="text-emerald-900">"Made when the endpoint is first ready."</p> }.into_any(),
                            (true, "unrevealed") => view! {
                                <ActionForm action=reveal attr:class="mt-1">
                                    <input type="hidden" name="id" value=id_reveal/>
                                    <button type="submit" class=SMALL_BUTTON>"Show API key (once)"</button>
                                </ActionForm>
                            }.into_any(),
                            _ => view! {
                                <ActionForm action=replace attr:class="mt-1 flex flex-wrap items-center gap-2">
                                    <input type="hidden" name="id" value=id_replace/>
                                    <span class="text-emerald-900">{format!("Shown once ({}).", endpoint.key_note.clone().unwrap_or_default())}</span>
                                    <button type="submit" class=SMALL_BUTTON>"Replace API key"</button>
                                </ActionForm>
                            }.into_any(),
                        }}
                        {move || key_error().map(|error| view! { <ErrorAlert error/> })}
                    </dd>
                </div>
                <div>
                    <dt class="text-emerald-800">"Example"</dt>
                    <dd><code class="block break-all rounded bg-white px-2 py-1 font-mono text-xs text-slate-900">{endpoint.example.clone()}</code></dd>
                </div>
                <div>
                    <dt class="text-emerald-800">"Replicas"</dt>
                    <dd>
                        <span class="text-emerald-900" data-testid="replicas">{replicas_note}</span>
                        <span class="text-xs text-emerald-800">" · each replica books the endpoint's size until its end, within your quota"</span>
                        {endpoint.scale_error.clone().map(|why| view! {
                            <p role="alert" class="mt-1 text-sm text-red-800">{format!("Applying the replicas failed (Berth keeps trying): {why}")}</p>
                        })}
                        {endpoint.can_scale.then(|| view! {
                            <ActionForm action=scale attr:class="mt-2 flex flex-wrap items-end gap-2">
                                <input type="hidden" name="id" value=id_scale/>
                                <div>
                                    <label for="replicas" class="block text-xs font-medium text-emerald-800">"Replicas"</label>
                                    <input id="replicas" name="replicas" type="number" min="1" max=endpoint.max_replicas.to_string()
                                        value=endpoint.replicas.to_string() required
                                        class="mt-1 w-24 rounded-lg border border-slate-300 px-3 py-1.5 text-sm"/>
                                </div>
                                <button type="submit" class=SMALL_BUTTON>"Apply"</button>
                            </ActionForm>
                        })}
                        {move || scale_error.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
                    </dd>
                </div>
            </dl>
        </section>
    }
}

/// A training job's log (its last lines) and status, refreshed with the page, and the
/// whole log Berth keeps as a download.
#[component]
fn JobLogsCard(logs: JobLogsView, id: String) -> impl IntoView {
    let tone = match logs.state.as_str() {
        "succeeded" => "bg-emerald-100 text-emerald-800",
        "failed" | "unavailable" => "bg-red-100 text-red-800",
        _ => "bg-amber-100 text-amber-800",
    };
    let text = if logs.lines.is_empty() { "(no output yet)".to_owned() } else { logs.lines.join("\n") };
    view! {
        <section class="rounded-xl border border-slate-200 bg-white shadow-sm" aria-labelledby="logs-title">
            <div class="flex items-center justify-between gap-2 border-b border-slate-100 px-5 py-3">
                <h2 id="logs-title" class="font-semibold text-slate-900">"Training log"</h2>
                <span class="flex items-center gap-3">
                    <a href=format!("/environments/{id}/log.txt") download="" data-log-download=""
                        class="text-xs text-indigo-700 underline hover:text-indigo-500">"Download the whole log"</a>
                    <span data-job-state=logs.state.clone() class=format!("rounded-full px-2.5 py-0.5 text-xs font-medium {tone}")>{logs.label.clone()}</span>
                </span>
            </div>
            <pre data-testid="job-logs" tabindex="0" class="max-h-96 overflow-auto whitespace-pre-wrap break-all bg-slate-950 px-5 py-3 font-mono text-xs text-slate-100">{text}</pre>
        </section>
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
                {connection.secret_label.clone().zip(connection.secret.clone()).map(|(label, secret)| {
                    let copy_label = format!("Copy the {}", label.to_lowercase());
                    view! {
                    <div>
                        <dt class="text-emerald-800">{label}</dt>
                        <dd>
                            <details>
                                <summary class="cursor-pointer text-emerald-900">"Show"</summary>
                                <code class="mt-1 block break-all rounded bg-white px-2 py-1 font-mono text-xs text-slate-900">{secret.clone()}</code>
                                <CopyButton text=secret label=copy_label/>
                            </details>
                        </dd>
                    </div>
                }})}
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
        _ => ("", "bg-slate-100 text-slate-600"),
    };
    let phase = if step.phase == "teardown" { "Teardown" } else { "Provision" };
    view! {
        <li class="flex items-start gap-3 px-5 py-3" data-step-status=step.status.clone()>
            <span class=format!("mt-0.5 grid h-6 w-6 shrink-0 place-items-center rounded-full text-xs font-bold {tone}") aria-hidden="true">{icon}</span>
            <div class="min-w-0 flex-1">
                <div class="flex justify-between gap-2 text-sm">
                    <span class="font-medium text-slate-900">{step.label.clone()} <span class="sr-only">{format!(" ({})", step.status)}</span></span>
                    <span class="shrink-0 text-slate-600">{step.timing.clone()}</span>
                </div>
                <div class="text-xs text-slate-600">
                    {phase}
                    {(step.attempts > 1).then(|| format!(" · attempt {}", step.attempts))}
                    {step.detail.clone().map(|d| format!(" · {d}"))}
                </div>
            </div>
        </li>
    }
}
