// `set_quota` takes the quota form's fields one by one, as a plain HTML form sends them.
#![allow(clippy::too_many_arguments)]

use leptos::prelude::*;

use crate::error::AppError;
use crate::model::{FleetPageView, NewNodeTokenView, NodeHealthView};

/// The fleet page: one page of the fleet's nodes and GPUs over `days` days from `from`
/// (`YYYY-MM-DD`, UTC; empty for today), of one `site` (empty for all) and with `search` in
/// their name, with those nodes' agents and a node token just made by a plain form post.
/// One server function, so the page reads its nodes once. Platform staff only.
#[server(endpoint = "fleet_page")]
pub async fn fleet_page(
    from: String,
    days: String,
    site: String,
    search: String,
    page: String,
) -> Result<FleetPageView, AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let fail = |e| AppError::from_platform(e, &caller.meta.request_id);
    let now = berth_platform::now_ms();
    let days = days.parse::<i64>().ok().filter(|d| (1..=31).contains(d)).unwrap_or(7);
    let from = crate::time::day_start(&from, now);
    let to = from + days * berth_domain::booking::DAY_MS;
    let filter = node_filter(site, search, &page);
    let (schedule, agents) = platform.fleet_page(&caller, from, to, &filter).await.map_err(fail)?;
    let session = super::ssr::session(&caller.meta).await?;
    // The session holds one new secret at a time; a person's API token is shown by its page.
    let new_token = crate::session::show_new_token(&session, &caller.meta)
        .await?
        .and_then(|t| t.name.strip_prefix(agents::NODE_TOKEN_NAME).map(|node| (node.to_owned(), t.secret)))
        .map(|(node, secret)| agents::new_token(&node, &secret, platform.public_url()));
    Ok(FleetPageView {
        chart: chart::fleet(&schedule, &filter, from, days, now),
        agents: crate::model::NodeAgentsView { nodes: agents.iter().map(agents::node).collect(), new_token },
    })
}

/// The fleet page's node filter as its query string gives it.
#[cfg(feature = "ssr")]
fn node_filter(site: String, search: String, page: &str) -> berth_platform::capacity::maintenance::NodeFilter {
    let site = Some(site.trim().to_owned()).filter(|s| !s.is_empty());
    berth_platform::capacity::maintenance::NodeFilter {
        site,
        search: search.trim().to_owned(),
        page: page.trim().parse().unwrap_or(1),
    }
}

/// Takes a node out of booking for a window. Platform admins only.
#[server(endpoint = "schedule_maintenance")]
pub async fn schedule_maintenance(
    node: String,
    gpu: String,
    start: String,
    end: String,
    reason: String,
) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let gpu = match gpu.trim() {
        "" => None,
        index => Some(gpu_index(&node, index).map_err(|r| AppError::from_platform(r.into(), &caller.meta.request_id))?),
    };
    platform
        .schedule_maintenance(&caller, &node, gpu, &start, &end, &reason)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/admin/fleet?saved=maintenance");
    Ok(())
}

/// Records a GPU's health; only healthy GPUs take new bookings. Platform admins only.
#[server(endpoint = "set_gpu_health")]
pub async fn set_gpu_health(node: String, gpu: String, health: String, note: String) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let fail = |e| AppError::from_platform(e, &caller.meta.request_id);
    let index = gpu_index(&node, &gpu).map_err(|r| fail(r.into()))?;
    platform.set_gpu_health(&caller, &node, index, &health, &note).await.map_err(fail)?;
    leptos_axum::redirect("/admin/fleet?saved=gpu-health");
    Ok(())
}

/// A GPU index as the forms send it; the inputs are numeric, so anything else names no GPU.
#[cfg(feature = "ssr")]
fn gpu_index(node: &str, text: &str) -> Result<i64, berth_domain::Refusal> {
    text.trim().parse().map_err(|_| berth_domain::Refusal::UnknownGpu { node: node.to_owned(), index: -1 })
}

#[server(endpoint = "cancel_maintenance")]
pub async fn cancel_maintenance(id: i64) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform.cancel_maintenance(&caller, id).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/admin/fleet");
    Ok(())
}

/// One node's lifecycle state, its history and its check runs. Platform staff only.
#[server(endpoint = "node_health")]
pub async fn node_health(node: String) -> Result<NodeHealthView, AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let health =
        platform.node_health(&caller, &node).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    Ok(node_view(&health))
}

/// Starts checks on a node at `level` (`quick`, `medium`, `long`): acceptance on a node
/// nobody holds, else a check on demand. They run in the background; the node page shows
/// the run as running until it ends. Platform admins; tenant admins on nodes their
/// tenant's dedicated cluster holds.
#[server(endpoint = "run_node_checks")]
pub async fn run_node_checks(node: String, level: String) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform
        .start_node_checks(&caller, &node, &level)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect(&format!("/admin/nodes/{}", crate::components::urlencode(&node)));
    Ok(())
}

/// Moves a node (drain, return to service, start repair, repair done or failed, retire,
/// reinstate) and says why. Platform admins only.
#[server(endpoint = "change_node_state")]
pub async fn change_node_state(node: String, event: String, reason: String) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform
        .change_node_state(&caller, &node, &event, &reason)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect(&format!("/admin/nodes/{}", crate::components::urlencode(&node)));
    Ok(())
}

/// Resets one GPU of a node (`nvidia-smi -i <gpu> -r`): applies a MIG mode change that
/// waits for a reset, or clears a GPU that hangs. Platform admins only; the GPU must hold no
/// booking now or within 10 minutes. Back on the node page, which says it was reset.
#[server(endpoint = "reset_gpu")]
pub async fn reset_gpu(node: String, gpu: String) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let index: u32 = gpu.trim().parse().map_err(|_| AppError::Invalid {
        field: "gpu".into(),
        message: format!("\"{}\" is not a GPU index", gpu.chars().take(20).collect::<String>()),
    })?;
    platform.reset_gpu(&caller, &node, index).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect(&format!("/admin/nodes/{}?reset={index}", crate::components::urlencode(&node)));
    Ok(())
}

/// "In repair (tier 2)", "Available".
#[cfg(feature = "ssr")]
fn state_label(state: &str, tier: i64) -> String {
    use berth_domain::node_health::NodeState;
    match NodeState::parse(state) {
        Some(NodeState::InRepair) => format!("In repair (tier {tier})"),
        Some(s) => s.label().to_owned(),
        None => state.to_owned(),
    }
}

#[cfg(feature = "ssr")]
fn node_view(health: &berth_platform::provisioning::node_health::NodeHealth) -> NodeHealthView {
    use berth_domain::node_health::{NodeEvent, next_status};

    use crate::model::{CheckResultView, CheckRunView, NodeChangeView};
    use crate::time::utc;

    let status = health.status;
    let mut label = state_label(status.state.as_str(), i64::from(status.tier));
    if let Some(name) = &health.tier_name {
        label.push_str(&format!(": {name}"));
    }
    if let Some(command) = &health.tier_command_by_hand {
        label.push_str(&format!(" (run `{command}` on the node by hand, then mark the repair done or failed)"));
    }
    let actions = [
        (NodeEvent::Drain, "Drain (finish what it holds, take nothing new)"),
        (NodeEvent::ReturnToService, "Return to service"),
        (NodeEvent::StartRepair, "Start the next repair tier"),
        (NodeEvent::RepairDone, "Repair done: run acceptance"),
        (NodeEvent::RepairFailed, "Repair failed"),
        (NodeEvent::Reinstate, "Reinstate (acceptance needed)"),
    ]
    .into_iter()
    .filter(|(event, _)| next_status(status, *event, health.tiers).is_ok())
    .map(|(event, label)| (event.as_str().to_owned(), label.to_owned()))
    .collect();
    let figure = |value: Option<f64>, unit: &str| value.map(|v| format!("{v:.1} {unit}")).unwrap_or_default();
    NodeHealthView {
        node: health.node.clone(),
        about: format!(
            "{} · {} · {} GPUs · {} bookings now",
            health.site, health.model, health.gpus, health.bookings_now
        ),
        state: status.state.as_str().to_owned(),
        state_label: label,
        bookings_note: if status.state.takes_new_bookings() {
            "Takes new bookings.".to_owned()
        } else {
            "Takes no new bookings; what it holds keeps running.".to_owned()
        },
        changes: health
            .changes
            .iter()
            .map(|c| NodeChangeView {
                when: utc(c.at),
                change: format!("{} → {}", c.from.label(), state_label(c.to.as_str(), i64::from(c.tier))),
                reason: c.reason.clone(),
                by: c.by.clone().unwrap_or_else(|| "Berth".to_owned()),
            })
            .collect(),
        xid_errors: health.xid_errors.iter().map(|x| format!("{}: {}", utc(x.seen_at), x.describe())).collect(),
        gpus: health
            .gpu_states
            .iter()
            .map(|g| {
                let mut summary = g.health.clone();
                summary[..1].make_ascii_uppercase();
                if let Some(note) = &g.note {
                    summary.push_str(&format!(": {note}"));
                }
                crate::model::NodeGpuView {
                    index: g.index,
                    health: g.health.clone(),
                    summary,
                    mig_mode: match g.mig_mode {
                        Some(true) => "on",
                        Some(false) => "off",
                        None => "not reported",
                    }
                    .to_owned(),
                }
            })
            .collect(),
        runs: health
            .runs
            .iter()
            .map(|r| CheckRunView {
                id: r.id,
                title: format!(
                    "{}, level {}, by {}, {}",
                    if r.purpose == "acceptance" { "Acceptance" } else { "Check on demand" },
                    r.level,
                    r.requested_by.as_deref().unwrap_or("Berth"),
                    utc(r.started_at)
                ),
                outcome: match r.passed {
                    Some(true) => "passed",
                    Some(false) => "failed",
                    None => "running",
                }
                .to_owned(),
                results: r
                    .results
                    .iter()
                    .map(|c| CheckResultView {
                        check: berth_domain::node_checks::CheckKind::parse(&c.kind)
                            .map_or_else(|| c.kind.clone(), |k| k.title().to_owned()),
                        passed: c.passed,
                        measured: figure(c.measured, &c.unit),
                        threshold: figure(c.threshold, &c.unit),
                        summary: c.summary.clone(),
                        command: c.command.clone(),
                        raw_output: c.raw_output.clone(),
                    })
                    .collect(),
            })
            .collect(),
        actions,
    }
}

#[cfg(feature = "ssr")]
mod chart {
    use berth_domain::booking::DAY_MS;
    use berth_domain::mig::{MEMORY_SLICES, time_slice_share};
    use berth_platform::capacity::maintenance::{FleetSchedule, NodeFilter};
    use chrono::DateTime;

    use crate::components::urlencode;
    use crate::model::{Bar, FleetGpu, FleetNode, FleetPager, FleetView, MaintenanceView};
    use crate::time::{date, utc};

    /// Memory slices 0..8 from top to bottom of the GPU's row, in thousandths of a percent.
    fn slice_thousandths(slices: i64) -> u32 {
        (100_000 * slices.clamp(0, i64::from(MEMORY_SLICES)) / i64::from(MEMORY_SLICES)) as u32
    }

    pub fn fleet(schedule: &FleetSchedule, filter: &NodeFilter, from: i64, days: i64, now: i64) -> FleetView {
        let nodes = &schedule.nodes;
        let to = from + days * DAY_MS;
        let span = (to - from) as f64;
        // Left and width in thousandths of a percent of the row, clipped to the range; at
        // least 0.4% wide, so a short booking can still be seen and pointed at.
        let place = |start: i64, end: i64| {
            let (s, e) = (start.max(from), end.min(to));
            let thousandths = |ms: i64| (100_000.0 * ms as f64 / span).round() as u32;
            (thousandths(s - from), thousandths(e - s).max(400))
        };
        let mut windows = Vec::new();
        let fleet_nodes = nodes
            .iter()
            .map(|n| {
                // (the one GPU it covers, or the whole node; its bar)
                let maintenance: Vec<(Option<i64>, Bar)> = n
                    .maintenance
                    .iter()
                    .map(|m| {
                        let (left, width) = place(m.starts_at, m.ends_at);
                        let affected = n
                            .gpus
                            .iter()
                            .filter(|g| m.gpu_index.is_none_or(|i| g.index == i))
                            .flat_map(|g| &g.bookings)
                            .filter(|b| b.starts_at < m.ends_at && b.ends_at > m.starts_at)
                            .map(|b| {
                                (b.name.clone(), b.owner_email.clone(), format!("/environments/{}", b.environment_id))
                            })
                            .fold(Vec::new(), |mut acc: Vec<(String, String, String)>, b| {
                                if !acc.contains(&b) {
                                    acc.push(b);
                                }
                                acc
                            });
                        windows.push(MaintenanceView {
                            id: m.id,
                            node: match m.gpu_index {
                                Some(i) => format!("{} GPU {i}", n.node),
                                None => n.node.clone(),
                            },
                            when: format!("{} to {}", utc(m.starts_at), utc(m.ends_at)),
                            reason: m.reason.clone(),
                            affected,
                        });
                        let bar = Bar {
                            left,
                            width,
                            top: 0,
                            height: 100_000,
                            label: format!("maintenance: {}", m.reason),
                            title: format!("{} to {}: {}", utc(m.starts_at), utc(m.ends_at), m.reason),
                            href: String::new(),
                            tone: "maintenance".into(),
                        };
                        (m.gpu_index, bar)
                    })
                    .collect();
                let gpus = n
                    .gpus
                    .iter()
                    .map(|g| FleetGpu {
                        label: {
                            let mut label = format!("GPU {}", g.index);
                            if g.mig_capable {
                                label.push_str(" · MIG");
                            }
                            if g.time_slices > 1 {
                                label.push_str(&format!(" · shared {}", g.time_slices));
                            }
                            if let Some(rail) = g.ib_rail {
                                label.push_str(&format!(" · rail {rail}"));
                            }
                            label
                        },
                        health: g.health.clone(),
                        health_note: g.health_note.clone().unwrap_or_default(),
                        busy: g.utilization_pct.map(|pct| format!("{pct}% busy")),
                        bars: g
                            .bookings
                            .iter()
                            .map(|b| {
                                let (left, width) = place(b.starts_at, b.ends_at);
                                let what = match (&b.mig_profile, b.slice_size) {
                                    (Some(profile), _) => profile.clone(),
                                    (None, size) if size == i64::from(MEMORY_SLICES) => "whole GPU".into(),
                                    (None, size) => format!("shared 1/{}", time_slice_share(0, size).1),
                                };
                                let running = b.starts_at <= now;
                                Bar {
                                    left,
                                    width,
                                    top: slice_thousandths(b.slice_start),
                                    height: slice_thousandths(b.slice_size),
                                    label: format!("{} · {what}", b.name),
                                    title: format!(
                                        "{} ({}) · {what} · {} to {} · {}",
                                        b.name,
                                        b.owner_email,
                                        utc(b.starts_at),
                                        utc(b.ends_at),
                                        b.state
                                    ),
                                    href: format!("/environments/{}", b.environment_id),
                                    tone: if b.mig_profile.is_some() || b.slice_size < 8 {
                                        "slice"
                                    } else if running {
                                        "running"
                                    } else {
                                        "booking"
                                    }
                                    .into(),
                                }
                            })
                            .chain(
                                maintenance.iter().filter(|(gpu, _)| *gpu == Some(g.index)).map(|(_, bar)| bar.clone()),
                            )
                            .collect(),
                    })
                    .collect();
                let maintenance =
                    maintenance.into_iter().filter(|(gpu, _)| gpu.is_none()).map(|(_, bar)| bar).collect();
                let fabric = [
                    n.nvlink_domain.as_ref().map(|d| format!("NVLink {d}")),
                    n.ib_unit.as_ref().map(|u| format!("IB {u}")),
                ];
                FleetNode {
                    name: n.node.clone(),
                    site: n.site.clone(),
                    model: n.model.clone(),
                    fabric: fabric.into_iter().flatten().collect::<Vec<_>>().join(" · "),
                    maintenance,
                    gpus,
                    state: n.state.clone(),
                    state_label: super::state_label(&n.state, n.repair_tier),
                    state_note: match (&n.state_reason, n.state_at) {
                        (Some(reason), Some(at)) => {
                            format!("{reason} · {} · {}", n.state_by.as_deref().unwrap_or("Berth"), utc(at))
                        }
                        _ => String::new(),
                    },
                    href: format!("/admin/nodes/{}", urlencode(&n.node)),
                }
            })
            .collect();
        let columns = (0..days).map(|d| {
            DateTime::from_timestamp_millis(from + d * DAY_MS)
                .map(|t| t.format("%a %-d %b").to_string())
                .unwrap_or_default()
        });
        // Every link keeps the other choices: range, site, search, page.
        let site = filter.site.clone().unwrap_or_default();
        let href = |from: i64, page: usize| {
            format!(
                "/admin/fleet?from={}&days={days}&site={}&search={}&page={page}",
                date(from),
                urlencode(&site),
                urlencode(&filter.search)
            )
        };
        let first = (schedule.page - 1) * berth_platform::capacity::maintenance::NODES_PER_PAGE;
        FleetView {
            title: format!("{} to {}", date(from), date(to - DAY_MS)),
            prev_href: href(from - days * DAY_MS, schedule.page),
            next_href: href(to, schedule.page),
            columns: columns.collect(),
            nodes: fleet_nodes,
            windows,
            node_names: schedule.node_names.clone(),
            pager: FleetPager {
                shown: if nodes.is_empty() {
                    format!("No node matches (of {} in service)", schedule.node_names.len())
                } else {
                    format!("Nodes {}-{} of {}", first + 1, first + nodes.len(), schedule.total_nodes)
                },
                page: schedule.page,
                pages: schedule.pages,
                prev_href: (schedule.page > 1).then(|| href(from, schedule.page - 1)),
                next_href: (schedule.page < schedule.pages).then(|| href(from, schedule.page + 1)),
                from: date(from),
                days,
                sites: schedule.sites.clone(),
                site,
                search: filter.search.clone(),
            },
        }
    }
}

/// The quota rows in the caller's reach, and which levels they may set.
#[server(endpoint = "quotas")]
pub async fn quotas() -> Result<crate::model::QuotasView, AppError> {
    use berth_domain::policy::{Action, Reach};
    use berth_platform::capacity::quotas::QuotaSubject;
    let (platform, caller) = super::ssr::caller().await?;
    let rows = platform.quotas(&caller).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    let reach = caller.principal.reach(Action::QuotaManage);
    let show = |v: Option<String>| v.unwrap_or_else(|| "no limit".into());
    let rows = rows
        .into_iter()
        .map(|row| {
            let q = &row.quota;
            let (level, key) = match row.subject {
                QuotaSubject::Everyone => ("Everyone", "everyone".to_owned()),
                QuotaSubject::Tenant(id) => ("Tenant", format!("tenant:{id}")),
                QuotaSubject::Project(id) => ("Project", format!("project:{id}")),
                QuotaSubject::User(id) => ("User", format!("user:{id}")),
            };
            let removable = match row.subject {
                QuotaSubject::Everyone | QuotaSubject::Tenant(_) => reach == Some(Reach::All),
                QuotaSubject::Project(_) | QuotaSubject::User(_) => reach.is_some(),
            };
            let by_model = q.max_gpus_by_model.iter().map(|(m, v)| format!("{m} = {v}")).collect::<Vec<_>>();
            crate::model::QuotaView {
                id: row.id,
                key,
                level: level.to_owned(),
                who: row.who,
                max_gpus: show(q.max_gpus.map(|v| v.to_string())),
                by_model: by_model.join(", "),
                gpu_hours_per_month: show(q.gpu_hours_per_month.map(|v| v.to_string())),
                max_booking_hours: show(q.max_booking_hours.map(|v| v.to_string())),
                max_overlapping: show(q.max_overlapping.map(|v| v.to_string())),
                allow_spot: if q.allow_spot { "yes" } else { "no" }.into(),
                removable,
            }
        })
        .collect();
    Ok(crate::model::QuotasView { rows, can_set: reach.is_some(), can_set_platform_levels: reach == Some(Reach::All) })
}

/// Sets the quota of everyone (the default per user), a tenant (by slug), a project
/// (`tenant/name`, or the name in the caller's tenant) or a user (by email); empty limits
/// mean "no limit".
#[server(endpoint = "set_quota")]
pub async fn set_quota(
    level: String,
    who: String,
    max_gpus: String,
    by_model: String,
    gpu_hours_per_month: String,
    max_booking_hours: String,
    max_overlapping: String,
    /// A checkbox: sent only when ticked.
    allow_spot: Option<String>,
) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let fail = |e| AppError::from_platform(e, &caller.meta.request_id);
    let quota = berth_domain::booking::Quota::parse(
        &max_gpus,
        &by_model,
        &gpu_hours_per_month,
        &max_booking_hours,
        &max_overlapping,
        allow_spot.is_some(),
    )
    .map_err(|r| fail(r.into()))?;
    platform.set_quota_for(&caller, &level, &who, &quota).await.map_err(fail)?;
    leptos_axum::redirect("/admin/quotas?saved=quota");
    Ok(())
}

/// Removes a quota row: a user falls back to everyone's default, a project or tenant is no
/// longer limited as a whole.
#[server(endpoint = "remove_quota")]
pub async fn remove_quota(id: i64) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform.remove_quota(&caller, id).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/admin/quotas?saved=quota-removed");
    Ok(())
}

/// Makes a token for a node's agent and answers its secret, which Berth does not keep. A
/// plain form post cannot carry the answer back, so there the secret waits in the session
/// for the next render of the fleet page. Platform admins only.
#[server(endpoint = "create_node_token")]
pub async fn create_node_token(node: String) -> Result<Option<NewNodeTokenView>, AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let (token, secret) = platform
        .create_node_token(&caller, &node)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    if crate::error::plain_form_post() {
        let held = crate::session::NewToken {
            name: format!("{}{}", agents::NODE_TOKEN_NAME, token.node),
            secret,
            created_at: token.created_at,
            expires_at: token.created_at,
            shown_in: None,
        };
        let session = super::ssr::session(&caller.meta).await?;
        crate::session::hold_new_token(&session, &caller.meta, &held).await?;
        leptos_axum::redirect("/admin/fleet");
        return Ok(None);
    }
    Ok(Some(agents::new_token(&token.node, &secret, platform.public_url())))
}

/// Stops a node token at once. Platform admins only.
#[server(endpoint = "revoke_node_token")]
pub async fn revoke_node_token(id: i64) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform.revoke_node_token(&caller, id).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/admin/fleet");
    Ok(())
}

#[cfg(feature = "ssr")]
mod agents {
    use berth_platform::provisioning::node_agents::NodeAgent;

    use crate::model::{NewNodeTokenView, NodeAgentView};
    use crate::time::utc;

    /// How a node token's secret is named while it waits in the session.
    pub const NODE_TOKEN_NAME: &str = "node:";

    pub fn node(agent: &NodeAgent) -> NodeAgentView {
        NodeAgentView {
            node: agent.node.clone(),
            site: agent.site.clone(),
            last_report: agent.last_seen_at.map_or_else(|| "never".to_owned(), utc),
            agent_version: agent.agent_version.clone().unwrap_or_default(),
            tokens: agent
                .tokens
                .iter()
                .map(|t| {
                    let used =
                        t.last_used_at.map_or_else(|| "never used".to_owned(), |at| format!("last used {}", utc(at)));
                    (t.id, format!("made {}, {used}", utc(t.created_at)))
                })
                .collect(),
        }
    }

    pub fn new_token(node: &str, secret: &str, origin: &str) -> NewNodeTokenView {
        NewNodeTokenView {
            node: node.to_owned(),
            secret: secret.to_owned(),
            command: format!("BERTH_NODE_TOKEN={secret} berth agent --portal {origin}"),
        }
    }
}
