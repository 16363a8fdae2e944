use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::{use_params_map, use_query_map};

use crate::components::form::BUTTON;
use crate::components::table::{CELL, ROW_HEADER};
use crate::components::{CARD, ConfirmButton, ErrorAlert, Field, FieldsOf, RequireUser, StateBadge, Table, poll_every};
use crate::model::{CheckRunView, NodeHealthView};
use crate::serverfns::{ChangeNodeState, ResetGpu, RunNodeChecks, node_health};

/// Platform admins: one node's lifecycle state with why, who and when; its history; its
/// check runs with each check's figure, threshold and raw output; and the actions the
/// lifecycle allows now (run checks, drain, repair, return to service, retire). Every form
/// is a plain post, so it works before (or without) WASM.
#[component]
pub fn NodePage() -> impl IntoView {
    let params = use_params_map();
    let name = move || params.read().get("id").unwrap_or_default();
    let checks = ServerAction::<RunNodeChecks>::new();
    let change = ServerAction::<ChangeNodeState>::new();
    let reset = ServerAction::<ResetGpu>::new();
    let data = Resource::new(
        move || (name(), checks.version().get(), change.version().get(), reset.version().get()),
        |(name, _, _, _)| node_health(name),
    );
    // Checks run in the background: while one does, the page reads the node again every
    // few seconds (without WebAssembly, a refresh in <noscript> does).
    let running = RwSignal::new(false);
    poll_every(3000, move || {
        if running.get_untracked() {
            data.refetch();
        }
    });
    // Where a reset sends the browser back (`?reset=3`), with or without WebAssembly.
    let query = use_query_map();
    let was_reset = move || query.read().get("reset");
    view! {
        <Title text="Node"/>
        <RequireUser>
            {move || {
                let error = checks.value().get().and_then(Result::err).or_else(|| change.value().get().and_then(Result::err));
                error.map(|error| view! { <div class="mb-4"><ErrorAlert error/></div> })
            }}
            {move || was_reset().filter(|_| reset.value().get().is_none_or(|r| r.is_ok())).map(|gpu| view! {
                <p class="mb-4 rounded-md bg-emerald-50 p-3 text-sm text-emerald-800" role="status" data-gpu-reset="">
                    "GPU " {gpu} " was reset. Its agent's next report shows its MIG mode and health."
                </p>
            })}
            <Transition fallback=|| view! { <p class="text-slate-600">"Loading..."</p> }>
                {move || Suspend::new(async move {
                    match data.await {
                        Ok(node) => view! { <Node node checks change reset running/> }.into_any(),
                        Err(error) => view! { <ErrorAlert error/> }.into_any(),
                    }
                })}
            </Transition>
        </RequireUser>
    }
}

#[component]
fn Node(
    node: NodeHealthView,
    checks: ServerAction<RunNodeChecks>,
    change: ServerAction<ChangeNodeState>,
    reset: ServerAction<ResetGpu>,
    running: RwSignal<bool>,
) -> impl IntoView {
    let checks_running = node.runs.iter().any(|r| r.outcome == "running");
    Effect::new(move |_| running.set(checks_running));
    let retirable = node.state != "retired";
    let name = node.node.clone();
    let (name_for_state, name_for_retire) = (name.clone(), name.clone());
    let (gpus, name_for_reset) = (node.gpus.clone(), name.clone());
    view! {
        <p class="text-sm"><a href="/admin/fleet" class="text-indigo-600 hover:text-indigo-500">"← Fleet"</a></p>
        <div class="mt-2 flex flex-wrap items-center gap-3">
            <h1 class="text-2xl font-bold tracking-tight text-slate-900">{node.node.clone()}</h1>
            <StateBadge state=node.state.clone() label=node.state_label.clone()/>
        </div>
        <p class="mt-1 text-sm text-slate-600">{node.about.clone()} " · " {node.bookings_note.clone()}</p>
        {checks_running.then(|| view! {
            <noscript><meta http-equiv="refresh" content="3"/></noscript>
            <p class="mt-2 text-sm text-amber-800" role="status" data-checks-running="">"Checks are running on this node; this page shows their results when they end."</p>
        })}
        <div class="grid gap-x-6 lg:grid-cols-2">
            <section class=CARD aria-labelledby="run-checks">
                <h2 id="run-checks" class="text-sm font-semibold text-slate-900">"Run checks"</h2>
                <p class="mt-1 text-xs text-slate-600">"On a node nobody holds this is acceptance: the node tests, then becomes available or degraded. On a held node only quick checks run, and a failure degrades it."</p>
                <ActionForm action=checks attr:class="mt-3 flex flex-wrap items-end gap-3">
                    <input type="hidden" name="node" value=name.clone()/>
                    <Field id="c-level" name="level" label="Level">
                        <option value="quick">"Quick (dcgmi diag -r 1, ECC, XID, InfiniBand)"</option>
                        <option value="medium">"Medium (-r 2, plus NCCL bandwidth)"</option>
                        <option value="long">"Long (-r 3, plus NCCL bandwidth)"</option>
                    </Field>
                    <button type="submit" class=BUTTON>"Run checks"</button>
                </ActionForm>
            </section>
            <section class=CARD aria-labelledby="change-state">
                <h2 id="change-state" class="text-sm font-semibold text-slate-900">"Change state"</h2>
                {if node.actions.is_empty() {
                    view! { <p class="mt-2 text-sm text-slate-600">"Nothing to do by hand in this state."</p> }.into_any()
                } else {
                    view! {
                        <FieldsOf action=change>
                        <ActionForm action=change attr:class="mt-3 grid gap-3">
                            <input type="hidden" name="node" value=name_for_state.clone()/>
                            <Field id="s-event" name="event" label="Action">
                                {node.actions.iter().map(|(event, label)| view! { <option value=event.clone()>{label.clone()}</option> }).collect_view()}
                            </Field>
                            <Field id="s-reason" name="reason" label="Why" required=true maxlength=500 placeholder="firmware update"/>
                            <div><button type="submit" class=BUTTON>"Apply"</button></div>
                        </ActionForm>
                        </FieldsOf>
                    }.into_any()
                }}
                {retirable.then(|| view! {
                    <FieldsOf action=change>
                    <ActionForm action=change attr:class="mt-4 flex flex-wrap items-end gap-3">
                        <input type="hidden" name="node" value=name_for_retire.clone()/>
                        <input type="hidden" name="event" value="retire"/>
                        <Field id="r-reason" name="reason" label="Why retire it" required=true maxlength=500 placeholder="returned to the vendor"/>
                        <ConfirmButton label="Retire" confirm="Yes, retire the node"
                            consequence="The node takes no bookings until a person reinstates it and it passes acceptance; what it holds keeps running."/>
                    </ActionForm>
                    </FieldsOf>
                })}
            </section>
        </div>
        <section class="mt-8" aria-labelledby="gpus">
            <h2 id="gpus" class="text-sm font-semibold text-slate-900">"GPUs"</h2>
            <p class="mt-1 text-xs text-slate-600">"A reset applies a MIG mode change that waits for one and clears a GPU that hangs. It kills what runs on the GPU, so Berth resets only a GPU with no booking now or within 10 minutes."</p>
            {move || reset.value().get().and_then(Result::err).map(|error| view! { <div class="mt-2"><ErrorAlert error/></div> })}
            <Table label="GPUs" columns=&["GPU", "Health", "MIG mode", ""]>
                {gpus.into_iter().map(|g| {
                    let (index, node) = (g.index.to_string(), name_for_reset.clone());
                    view! {
                        <tr data-gpu=g.index.to_string()>
                            <th scope="row" class=ROW_HEADER>{format!("GPU {}", g.index)}</th>
                            <td class=CELL><StateBadge state=g.health.clone() label=g.summary.clone()/></td>
                            <td class=CELL>{g.mig_mode}</td>
                            <td class=CELL>
                                <ActionForm action=reset>
                                    <input type="hidden" name="node" value=node/>
                                    <input type="hidden" name="gpu" value=index/>
                                    <ConfirmButton label="Reset" confirm=format!("Yes, reset GPU {}", g.index)
                                        aria_label=format!("Reset GPU {}", g.index)
                                        consequence="nvidia-smi resets the GPU on the node: what runs on it stops. Refused while it holds a booking."/>
                                </ActionForm>
                            </td>
                        </tr>
                    }
                }).collect_view()}
            </Table>
        </section>
        <section class="mt-8" aria-labelledby="state-history">
            <h2 id="state-history" class="text-sm font-semibold text-slate-900">"State history"</h2>
            {if node.changes.is_empty() {
                view! { <p class="mt-2 text-sm text-slate-600">"No change since the node joined the fleet."</p> }.into_any()
            } else {
                view! {
                    <Table label="State changes" columns=&["When", "Change", "Why", "By"]>
                        {node.changes.iter().map(|c| view! {
                            <tr data-change="">
                                <th scope="row" class=ROW_HEADER>{c.when.clone()}</th>
                                <td class=CELL>{c.change.clone()}</td>
                                <td class=CELL>{c.reason.clone()}</td>
                                <td class=CELL>{c.by.clone()}</td>
                            </tr>
                        }).collect_view()}
                    </Table>
                }.into_any()
            }}
        </section>
        <section class="mt-8" aria-labelledby="xid-errors">
            <h2 id="xid-errors" class="text-sm font-semibold text-slate-900">"GPU errors (XID), last 7 days"</h2>
            {if node.xid_errors.is_empty() {
                view! { <p class="mt-2 text-sm text-slate-600">"None reported by the node's agent."</p> }.into_any()
            } else {
                view! {
                    <ul class="mt-2 list-disc pl-5 text-sm text-slate-700" data-xid-errors="">
                        {node.xid_errors.iter().map(|x| view! { <li>{x.clone()}</li> }).collect_view()}
                    </ul>
                }.into_any()
            }}
        </section>
        <section class="mt-8" aria-labelledby="check-runs">
            <h2 id="check-runs" class="text-sm font-semibold text-slate-900">"Check runs"</h2>
            {if node.runs.is_empty() {
                view! { <p class="mt-2 text-sm text-slate-600">"No checks yet."</p> }.into_any()
            } else {
                node.runs.into_iter().map(|run| view! { <Run run/> }).collect_view().into_any()
            }}
        </section>
    }
}

#[component]
fn Run(run: CheckRunView) -> impl IntoView {
    let tone = if run.outcome == "passed" { "text-emerald-700" } else { "text-red-700" };
    view! {
        <div class="mt-4" data-check-run=run.id data-outcome=run.outcome.clone()>
            <p class="text-sm text-slate-700">{run.title.clone()} " · " <span class=format!("font-semibold {tone}")>{run.outcome.clone()}</span></p>
            <Table label="Checks" columns=&["Check", "Result", "Measured", "Threshold", "Why", "Output"]>
                {run.results.into_iter().map(|r| view! {
                    <tr data-check=r.check.clone() data-passed=r.passed.to_string()>
                        <th scope="row" class=ROW_HEADER>{r.check.clone()}</th>
                        <td class=CELL>{if r.passed { "passed" } else { "failed" }}</td>
                        <td class=CELL>{r.measured.clone()}</td>
                        <td class=CELL>{r.threshold.clone()}</td>
                        <td class=CELL>{r.summary.clone()}</td>
                        <td class=CELL>
                            <details>
                                <summary class="cursor-pointer text-xs text-indigo-600">{r.command.clone()}</summary>
                                <pre tabindex="0" class="mt-2 max-h-64 max-w-xl overflow-auto rounded bg-slate-900 p-2 text-[11px] text-slate-100">{r.raw_output.clone()}</pre>
                            </details>
                        </td>
                    </tr>
                }).collect_view()}
            </Table>
        </div>
    }
}
