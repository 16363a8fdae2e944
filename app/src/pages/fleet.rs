use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use crate::components::form::SMALL_BUTTON;
use crate::components::table::CELL;
use crate::components::{
    CARD, ConfirmButton, CopyButton, ErrorAlert, Field, FieldsOf, RequireUser, STATE_DOT, STATE_PILL, SavedNotice,
    Table, escape_html as escape, state_colours,
};
use crate::model::{Bar, FleetGpu, FleetNode, FleetPageView, FleetPager, FleetView, NewNodeTokenView, NodeAgentsView};
use crate::serverfns::{
    CancelMaintenance, CreateNodeToken, RevokeNodeToken, ScheduleMaintenance, SetGpuHealth, fleet_page,
};

/// Platform admins: a Gantt chart of every node and GPU (MIG slices drawn inside their
/// GPU) with bookings and maintenance windows, and maintenance scheduling; then the agents
/// of the chart's nodes and their tokens. One resource reads both (`fleet_page`), again
/// after any of the page's actions.
#[component]
pub fn FleetPage() -> impl IntoView {
    let query = use_query_map();
    let actions = FleetActions {
        schedule: ServerAction::new(),
        cancel: ServerAction::new(),
        health: ServerAction::new(),
        create_token: ServerAction::new(),
        revoke_token: ServerAction::new(),
    };
    let data = Resource::new(
        move || {
            let q = query.read();
            let get = |key: &str| q.get(key).unwrap_or_default();
            ((get("from"), get("days"), get("site"), get("search"), get("page")), actions.versions())
        },
        |((from, days, site, search, page), _)| fleet_page(from, days, site, search, page),
    );
    view! {
        <Title text="Fleet"/>
        <RequireUser>
            <Transition fallback=|| view! { <p class="text-slate-600">"Loading..."</p> }>
                {move || Suspend::new(async move {
                    match data.await {
                        Ok(FleetPageView { chart, agents }) => {
                            let FleetActions { schedule, cancel, health, create_token, revoke_token } = actions;
                            view! {
                                <Fleet view=chart schedule cancel health/>
                                <NodeAgents view=agents create=create_token revoke=revoke_token/>
                            }
                            .into_any()
                        }
                        Err(error) => view! { <ErrorAlert error/> }.into_any(),
                    }
                })}
            </Transition>
        </RequireUser>
    }
}

/// The fleet page's actions, made with the page outside `RequireUser` (see there why).
#[derive(Clone, Copy)]
struct FleetActions {
    schedule: ServerAction<ScheduleMaintenance>,
    cancel: ServerAction<CancelMaintenance>,
    health: ServerAction<SetGpuHealth>,
    create_token: ServerAction<CreateNodeToken>,
    revoke_token: ServerAction<RevokeNodeToken>,
}

impl FleetActions {
    /// Changes whenever one of them has finished: the page is read again.
    fn versions(self) -> [usize; 5] {
        [
            self.schedule.version().get(),
            self.cancel.version().get(),
            self.health.version().get(),
            self.create_token.version().get(),
            self.revoke_token.version().get(),
        ]
    }
}

/// The nodes' agents (`berth agent`): when each last reported, with which version, and the
/// node tokens they report with.
#[component]
fn NodeAgents(
    view: NodeAgentsView,
    create: ServerAction<CreateNodeToken>,
    revoke: ServerAction<RevokeNodeToken>,
) -> impl IntoView {
    let created = create.value();
    let revoke_result = revoke.value();
    view! {
        <section class=CARD aria-labelledby="node-agents">
            <h2 id="node-agents" class="text-sm font-semibold text-slate-900">"Node agents"</h2>
            <p class="mt-1 text-xs text-slate-600">"The nodes of the chart's page. On a bare-metal GPU node, " <code>"berth agent"</code> " reports its GPUs and their health with a node token. A GPU the node does not report, or reports with ECC errors, is marked failed."</p>
            // Made with the WASM running: the secret came back as the action's answer.
            {move || created.get().and_then(Result::ok).flatten().map(|token| view! { <NewNodeTokenBox token/> })}
            // Made by a plain form post (no WASM yet): the secret waited in the session.
            {view.new_token.clone().map(|token| view! { <NewNodeTokenBox token/> })}
            {move || created.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
            {move || revoke_result.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
            <Table label="Node agents" columns=&["Node", "Last report", "Agent", "Tokens"] buttons_column="New token">
                {view.nodes.into_iter().map(|n| { let node = n.node.clone(); view! {
                    <tr data-agent-node=n.node.clone()>
                        <td class="px-4 py-2 font-medium text-slate-900">
                            {n.node.clone()} <span class="text-xs font-normal text-slate-600">" · " {n.site.clone()}</span>
                        </td>
                        <td class="px-4 py-2 text-slate-700" data-last-report="">{n.last_report.clone()}</td>
                        <td class="px-4 py-2 text-slate-700">{n.agent_version.clone()}</td>
                        <td class=CELL>
                            <ul class="space-y-1">
                                {n.tokens.into_iter().map(|(id, label)| view! {
                                    <li class="flex items-center gap-2 text-xs text-slate-600">
                                        {label}
                                        <ActionForm action=revoke>
                                            <input type="hidden" name="id" value=id/>
                                            <ConfirmButton label="Revoke" confirm="Yes, revoke"
                                                consequence="The node's agent can no longer report with this token."/>
                                        </ActionForm>
                                    </li>
                                }).collect_view()}
                            </ul>
                        </td>
                        <td class="px-4 py-2 text-right">
                            <ActionForm action=create>
                                <input type="hidden" name="node" value=node.clone()/>
                                <button type="submit" class=SMALL_BUTTON>"New token"</button>
                            </ActionForm>
                        </td>
                    </tr>
                }}).collect_view()}
            </Table>
        </section>
    }
}

/// The node token's secret, once: Berth keeps only its hash.
#[component]
fn NewNodeTokenBox(token: NewNodeTokenView) -> impl IntoView {
    view! {
        <div class="mt-3 rounded-lg bg-amber-50 p-3 text-sm text-amber-900 ring-1 ring-amber-200" role="status">
            <p class="font-medium">"Node token for " {token.node.clone()} ": copy it now, it is not shown again."</p>
            <code data-node-secret="" class="mt-2 block select-all break-all rounded bg-white px-2 py-1 font-mono text-xs text-slate-900 ring-1 ring-amber-200">{token.secret.clone()}</code>
            <CopyButton text=token.secret.clone() label="Copy the node token"/>
            <p class="mt-2 text-xs">"On the node:"</p>
            <code class="mt-1 block select-all break-all rounded bg-white px-2 py-1 font-mono text-xs text-slate-900 ring-1 ring-amber-200">{token.command.clone()}</code>
        </div>
    }
}

#[component]
fn Fleet(
    view: FleetView,
    schedule: ServerAction<ScheduleMaintenance>,
    cancel: ServerAction<CancelMaintenance>,
    health: ServerAction<SetGpuHealth>,
) -> impl IntoView {
    let health_result = health.value();
    let schedule_result = schedule.value();
    let cancel_result = cancel.value();
    let FleetView { title, prev_href, next_href, columns, nodes, windows, node_names, pager } = view;
    // The days' lines in every row come from `.fleet-track` (style/main.css), given the
    // number of days once here rather than a background in each of hundreds of rows.
    let days = format!("--days: {}", columns.len());
    let header_grid = format!("grid-template-columns: repeat({}, minmax(0, 1fr));", columns.len());
    view! {
        <div class="flex flex-wrap items-end justify-between gap-4">
            <div>
                <h1 class="text-2xl font-bold tracking-tight text-slate-900">"Fleet"</h1>
                <p class="mt-1 text-sm text-slate-600">"Every node and GPU, " {title} " (UTC). Bars are bookings; MIG slices sit at their memory slices inside the GPU."</p>
            </div>
            <nav aria-label="Chart range" class="flex gap-2">
                <a href=prev_href class="rounded-md px-3 py-1.5 text-sm font-medium text-slate-700 ring-1 ring-slate-300 hover:bg-slate-50">"← Earlier"</a>
                <a href="/admin/fleet" class="rounded-md px-3 py-1.5 text-sm font-medium text-slate-700 ring-1 ring-slate-300 hover:bg-slate-50">"Today"</a>
                <a href=next_href class="rounded-md px-3 py-1.5 text-sm font-medium text-slate-700 ring-1 ring-slate-300 hover:bg-slate-50">"Later →"</a>
            </nav>
        </div>
        <SavedNotice/>
        <NodePager pager/>
        <div tabindex="0" role="region" aria-label="Nodes over time" class="mt-3 overflow-x-auto rounded-xl border border-slate-200 bg-white p-4 shadow-sm">
            <div class="min-w-[56rem]" style=days>
                <div class="flex text-xs text-slate-600">
                    <div class="w-44 shrink-0"></div>
                    <div class="grid flex-1" style=header_grid>
                        {columns.into_iter().map(|c| view! { <div class="border-l border-slate-200 pl-1">{c}</div> }).collect_view()}
                    </div>
                </div>
                <div inner_html=rows_html(&nodes)></div>
            </div>
            <p class="mt-3 flex flex-wrap gap-4 text-xs text-slate-600">
                <span class="inline-flex items-center gap-1.5"><span class="inline-block h-3 w-3 rounded bg-emerald-700"></span>"running"</span>
                <span class="inline-flex items-center gap-1.5"><span class="inline-block h-3 w-3 rounded bg-indigo-600"></span>"booked ahead"</span>
                <span class="inline-flex items-center gap-1.5"><span class="inline-block h-3 w-3 rounded bg-sky-700"></span>"MIG slice"</span>
                <span class="inline-flex items-center gap-1.5"><span class="inline-block h-3 w-3 rounded bg-amber-300"></span>"maintenance"</span>
            </p>
        </div>
        // One list of every node's name for both forms: typing picks from thousands.
        <datalist id="fleet-node-names">
            {node_names.into_iter().map(|n| view! { <option value=n></option> }).collect_view()}
        </datalist>
        // Each card's top margin spaces the grid's rows.
        <div class="grid gap-x-6 lg:grid-cols-2">
            <section class=CARD aria-labelledby="schedule-maintenance">
                <h2 id="schedule-maintenance" class="text-sm font-semibold text-slate-900">"Schedule maintenance"</h2>
                <p class="mt-1 text-xs text-slate-600">"No booking can be placed on the node during the window; bookings already there are listed for rebooking."</p>
                <FieldsOf action=schedule>
                <ActionForm action=schedule attr:class="mt-3 grid gap-3 sm:grid-cols-2">
                    <Field id="m-node" name="node" label="Node" list="fleet-node-names" required=true autocomplete="off"
                        placeholder="node name"/>
                    <Field id="m-gpu" name="gpu" label="GPU index (empty for the whole node)" input_type="number" min=0 max=15/>
                    <Field id="m-reason" name="reason" label="Reason" required=true maxlength=200 placeholder="firmware update"
                        class="sm:col-span-2"/>
                    <Field id="m-start" name="start" label="Start (UTC, empty for now)" utc_time=true/>
                    <Field id="m-end" name="end" label="End (UTC)" utc_time=true required=true/>
                    <div class="sm:col-span-2 flex items-center justify-end">
                        <button type="submit" class="rounded-lg bg-amber-700 px-4 py-2 text-sm font-semibold text-white hover:bg-amber-600">"Schedule maintenance"</button>
                    </div>
                </ActionForm>
                </FieldsOf>
                {move || schedule_result.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
            </section>
            <section class=format!("{CARD} lg:col-span-2") aria-labelledby="gpu-health">
                <h2 id="gpu-health" class="text-sm font-semibold text-slate-900">"GPU health"</h2>
                <p class="mt-1 text-xs text-slate-600">"Only healthy GPUs take new bookings. What still runs on a GPU you mark is in the chart above."</p>
                <FieldsOf action=health>
                <ActionForm action=health attr:class="mt-3 grid gap-3 sm:grid-cols-5">
                    <Field id="h-node" name="node" label="Node" list="fleet-node-names" required=true autocomplete="off"
                        placeholder="node name"/>
                    <Field id="h-gpu" name="gpu" label="GPU index" input_type="number" min=0 max=15 value="0" required=true/>
                    <Field id="h-health" name="health" label="Health">
                        <option value="healthy">"healthy"</option>
                        <option value="degraded">"degraded"</option>
                        <option value="failed">"failed"</option>
                    </Field>
                    <Field id="h-note" name="note" label="Note" maxlength=200 placeholder="XID 79, ECC errors"/>
                    <div class="flex items-end">
                        <button type="submit" class="w-full rounded-lg bg-slate-800 px-4 py-2 text-sm font-semibold text-white hover:bg-slate-700">"Record health"</button>
                    </div>
                </ActionForm>
                </FieldsOf>
                {move || health_result.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
            </section>
            <section class=CARD aria-labelledby="maintenance-windows">
                <h2 id="maintenance-windows" class="text-sm font-semibold text-slate-900">"Maintenance in this range"</h2>
                {move || cancel_result.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
                {if windows.is_empty() {
                    view! { <p class="mt-2 text-sm text-slate-600">"None."</p> }.into_any()
                } else {
                    view! {
                        <ul class="mt-2 divide-y divide-slate-100">
                            {windows.into_iter().map(|w| view! {
                                <li class="py-3 text-sm">
                                    <div class="flex items-start justify-between gap-3">
                                        <div>
                                            <p class="font-medium text-slate-900">{w.node.clone()} " · " {w.reason.clone()}</p>
                                            <p class="text-xs text-slate-600">{w.when.clone()}</p>
                                        </div>
                                        <ActionForm action=cancel>
                                            <input type="hidden" name="id" value=w.id/>
                                            <button type="submit" class=SMALL_BUTTON>"End now"</button>
                                        </ActionForm>
                                    </div>
                                    {(!w.affected.is_empty()).then(|| view! {
                                        <div class="mt-2 rounded-lg bg-amber-50 p-2 text-xs text-amber-900">
                                            <p class="font-medium">"Bookings to rebook:"</p>
                                            <ul class="mt-1 list-disc pl-4">
                                                {w.affected.clone().into_iter().map(|(name, owner, href)| view! {
                                                    <li><a href=href.clone() class="underline">{name.clone()}</a> " · " {owner.clone()}</li>
                                                }).collect_view()}
                                            </ul>
                                        </div>
                                    })}
                                </li>
                            }).collect_view()}
                        </ul>
                    }.into_any()
                }}
            </section>
        </div>
    }
}

/// Which nodes the chart shows: a plain GET form (site, part of a name, range) and the
/// pages of nodes, so a fleet of thousands of nodes is read a page at a time.
#[component]
fn NodePager(pager: FleetPager) -> impl IntoView {
    let link = "rounded-md px-3 py-1.5 text-sm font-medium text-slate-700 ring-1 ring-slate-300 hover:bg-slate-50";
    let days = pager.days;
    view! {
        <div class="mt-6 flex flex-wrap items-end justify-between gap-4">
            <form method="get" action="/admin/fleet" class="flex flex-wrap items-end gap-3" aria-label="Filter nodes">
                <input type="hidden" name="from" value=pager.from.clone()/>
                <Field id="f-site" name="site" label="Site">
                    <option value="" selected=pager.site.is_empty()>"All sites"</option>
                    {pager.sites.iter().map(|s| view! { <option value=s.clone() selected=*s == pager.site>{s.clone()}</option> }).collect_view()}
                </Field>
                <Field id="f-search" name="search" label="Node name contains" value=pager.search.clone() placeholder="h100-01"
                    maxlength=100/>
                <Field id="f-days" name="days" label="Range">
                    {[(1, "Day"), (7, "Week"), (14, "Two weeks"), (30, "Month")].into_iter().map(|(d, label)| view! {
                        <option value=d.to_string() selected=d == days>{label}</option>
                    }).collect_view()}
                </Field>
                <button type="submit" class="rounded-lg bg-slate-800 px-4 py-2 text-sm font-semibold text-white hover:bg-slate-700">"Show"</button>
            </form>
            <nav aria-label="Pages of nodes" class="flex items-center gap-2 text-sm text-slate-600">
                <span data-nodes-shown="">{pager.shown.clone()}</span>
                {pager.prev_href.clone().map(|href| view! { <a href=href class=link rel="prev">"← Previous nodes"</a> })}
                <span>{format!("Page {} of {}", pager.page, pager.pages)}</span>
                {pager.next_href.clone().map(|href| view! { <a href=href class=link rel="next">"Next nodes →"</a> })}
            </nav>
        </div>
    }
}

/// The chart's rows as HTML: for each node a row (its name, site and model, state, fabric
/// and maintenance), then a row per GPU (its health, how busy it is, and its bars). One
/// string, as the calendar's cells are: the chart has a row per GPU of the page, and drawn
/// as views they were most of the time the page took. Every text is escaped as Leptos
/// escapes a view's. The rows and bars look as `.fleet-track`, `.fleet-gpu` and
/// `.fleet-bar` say (style/main.css).
fn rows_html(nodes: &[FleetNode]) -> String {
    use std::fmt::Write;

    let mut html = String::with_capacity(nodes.iter().map(|n| 600 + n.gpus.len() * 400).sum());
    for node in nodes {
        let FleetNode { name, site, model, fabric, maintenance, gpus, state, state_label, state_note, href } = node;
        let (name, state) = (escape(name), escape(state));
        let (tone, dot) = state_colours(&state);
        let _ = write!(
            html,
            "<div class=\"mt-3 flex items-center\" data-node=\"{name}\"><div class=\"w-44 shrink-0 pr-2\">\
             <p class=\"text-sm font-semibold text-slate-900\"><a href=\"{}\" class=\"hover:text-indigo-600\">{name}</a></p>\
             <p class=\"text-[11px] text-slate-600\">{} · {}</p>\
             <p class=\"mt-0.5\"{} data-node-state=\"{state}\"><span data-state=\"{state}\" \
             class=\"{STATE_PILL} {tone}\"><span class=\"{STATE_DOT} {dot}\"></span>{}</span></p>",
            escape(href),
            escape(site),
            escape(model),
            title(state_note),
            escape(state_label),
        );
        if !state_note.is_empty() && state != "available" {
            let _ = write!(
                html,
                "<p class=\"text-[11px] text-slate-600\" data-node-state-note=\"\">{}</p>",
                escape(state_note)
            );
        }
        if !fabric.is_empty() {
            let _ = write!(html, "<p class=\"text-[11px] text-slate-600\" data-fabric=\"\">{}</p>", escape(fabric));
        }
        html.push_str("</div><div class=\"fleet-track relative h-5 flex-1 rounded bg-slate-50\">");
        for bar in maintenance {
            bar_html(&mut html, bar, &bar.label);
        }
        html.push_str("</div></div>");
        for FleetGpu { label, health, health_note, bars, busy } in gpus {
            let _ = write!(
                html,
                "<div class=\"flex items-center\"><div class=\"fleet-gpu-label\" data-gpu-health=\"{}\"{}>{}",
                escape(health),
                title(health_note),
                escape(label)
            );
            let badge = match health.as_str() {
                "healthy" => None,
                "failed" => Some("ml-1 rounded px-1 font-medium bg-red-100 text-red-800"),
                _ => Some("ml-1 rounded px-1 font-medium bg-amber-100 text-amber-800"),
            };
            if let Some(class) = badge {
                let _ = write!(html, "<span class=\"{class}\">{}</span>", escape(health));
            }
            if let Some(busy) = busy {
                let _ = write!(
                    html,
                    "<span class=\"ml-1 rounded bg-slate-100 px-1 font-medium text-slate-800\" data-gpu-busy=\"\" \
                     title=\"Utilization over the last minute of readings\">{}</span>",
                    escape(busy)
                );
            }
            html.push_str("</div><div class=\"fleet-track fleet-gpu\">");
            // A window over the whole node shows on each of its GPUs' rows too, unlabelled.
            for bar in maintenance {
                bar_html(&mut html, bar, "");
            }
            for bar in bars {
                bar_html(&mut html, bar, &bar.label);
            }
            html.push_str("</div></div>");
        }
    }
    html
}

/// A booking or maintenance window on the chart, with `label` written in it: its colour
/// comes from `data-bar`, its place from its own style: left and width to the thousandth
/// of a percent the chart rounds them to, top and height (memory slices, eighths) to the
/// tenth.
fn bar_html(html: &mut String, bar: &Bar, label: &str) {
    use std::fmt::Write;

    let Bar { left, width, top, height, title, href, tone, .. } = bar;
    let (tag, href) =
        if href.is_empty() { ("span", String::new()) } else { ("a", format!(" href=\"{}\"", escape(href))) };
    let thousandths = |t: u32| (t / 1000, t % 1000);
    let tenths = |t: u32| ((t + 50) / 1000, (t + 50) % 1000 / 100);
    let ((left, left_frac), (width, width_frac)) = (thousandths(*left), thousandths(*width));
    let ((top, top_frac), (height, height_frac)) = (tenths(*top), tenths(*height));
    let _ = write!(
        html,
        "<{tag}{href} class=\"fleet-bar\" style=\"left: {left}.{left_frac:03}%; width: {width}.{width_frac:03}%; \
         top: {top}.{top_frac}%; height: {height}.{height_frac}%;\" title=\"{}\" data-bar=\"{}\">{}</{tag}>",
        escape(title),
        escape(tone),
        escape(label)
    );
}

/// ` title="…"`, or nothing for an empty one.
fn title(text: &str) -> String {
    if text.is_empty() { String::new() } else { format!(" title=\"{}\"", escape(text)) }
}

#[cfg(test)]
mod tests {
    use super::rows_html;
    use crate::model::{Bar, FleetGpu, FleetNode};

    #[test]
    fn the_chart_writes_each_node_then_its_gpus_escaped() {
        let bar = |label: &str, href: &str, tone: &str| Bar {
            left: 12_500,
            width: 400,
            top: 0,
            height: 100_000,
            label: label.into(),
            title: format!("{label} <title>"),
            href: href.into(),
            tone: tone.into(),
        };
        let gpu = |label: &str, health: &str, note: &str, busy: Option<&str>, bars| FleetGpu {
            label: label.into(),
            health: health.into(),
            health_note: note.into(),
            bars,
            busy: busy.map(Into::into),
        };
        let node = FleetNode {
            name: "fra1-h100-01".into(),
            site: "fra-1".into(),
            model: "H100-80GB".into(),
            fabric: "IB fra1-h100-su01".into(),
            maintenance: vec![bar("maintenance: firmware", "", "maintenance")],
            gpus: vec![
                gpu("GPU 0", "healthy", "", Some("73% busy"), vec![bar("run & \"go\"", "/environments/e1", "running")]),
                gpu("GPU 1 · MIG", "failed", "XID 79", None, Vec::new()),
            ],
            state: "in_repair".into(),
            state_label: "In repair (tier 2)".into(),
            state_note: "fans <loud> · admin@example.com".into(),
            href: "/admin/nodes/fra1-h100-01".into(),
        };
        let html = rows_html(&[node]);
        assert!(html.starts_with("<div class=\"mt-3 flex items-center\" data-node=\"fra1-h100-01\">"), "{html}");
        assert!(html.contains(
            "<p class=\"mt-0.5\" title=\"fans &lt;loud&gt; · admin@example.com\" data-node-state=\"in_repair\"><span data-state=\"in_repair\""
        ));
        assert!(html.contains("data-node-state-note=\"\">fans &lt;loud&gt; · admin@example.com</p>"));
        assert!(html.contains("data-fabric=\"\">IB fra1-h100-su01</p>"));
        // The node's maintenance is labelled on its own row, and drawn unlabelled on each GPU's.
        assert_eq!(html.matches("data-bar=\"maintenance\">maintenance: firmware</span>").count(), 1);
        assert_eq!(html.matches("data-bar=\"maintenance\"></span>").count(), 2);
        // A healthy GPU has no badge and no title; a failed one both.
        assert!(html.contains("<div class=\"fleet-gpu-label\" data-gpu-health=\"healthy\">GPU 0<span"));
        assert!(
            html.contains("data-gpu-busy=\"\" title=\"Utilization over the last minute of readings\">73% busy</span>")
        );
        assert!(html.contains(
            "<div class=\"fleet-gpu-label\" data-gpu-health=\"failed\" title=\"XID 79\">GPU 1 · MIG<span class=\"ml-1 rounded px-1 font-medium bg-red-100 text-red-800\">failed</span></div>"
        ));
        assert!(html.contains(
            "<a href=\"/environments/e1\" class=\"fleet-bar\" style=\"left: 12.500%; width: 0.400%; top: 0.0%; height: 100.0%;\" \
             title=\"run &amp; &quot;go&quot; &lt;title&gt;\" data-bar=\"running\">run &amp; &quot;go&quot;</a>"
        ));
        assert!(!html.contains("<title>") && !html.contains("<loud>"));
        assert_eq!(html.matches("<div").count(), html.matches("</div>").count());
    }

    #[test]
    fn a_bar_is_placed_to_the_thousandth_and_its_slices_to_the_tenth() {
        let slice =
            Bar { left: 99_001, width: 1_050, top: 37_500, height: 12_500, tone: "slice".into(), ..Bar::default() };
        let mut html = String::new();
        super::bar_html(&mut html, &slice, "");
        assert!(html.contains("style=\"left: 99.001%; width: 1.050%; top: 37.5%; height: 12.5%;\""), "{html}");
    }
}
