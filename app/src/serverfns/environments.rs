use berth_domain::launch::LaunchRequest;
use leptos::prelude::*;

use crate::error::AppError;
use crate::model::EnvironmentView;

/// Launches an environment and sends the browser to its page.
#[server(endpoint = "launch")]
pub async fn launch(request: LaunchRequest) -> Result<String, AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    match platform.launch(&caller, &request).await {
        Ok(env) => {
            leptos_axum::redirect(&format!("/environments/{}", env.id));
            Ok(env.id)
        }
        Err(e) => {
            // A plain form post is answered by a redirect back to the form, which would come
            // back empty: what was typed waits in the session for it (`launch_draft`). The
            // refusal is answered even if that fails (the failure is logged where it happens).
            if crate::error::plain_form_post()
                && let Ok(session) = super::ssr::session(&caller.meta).await
            {
                let _kept = crate::session::hold_launch_draft(&session, &caller.meta, &request).await;
            }
            Err(AppError::from_platform(e, &caller.meta.request_id))
        }
    }
}

/// What a launch of `offering` refused after a plain form post had typed (see
/// `session::hold_launch_draft`), for the form that shows the refusal; `None` otherwise,
/// and for anyone signed out.
#[server(endpoint = "launch_draft")]
pub async fn launch_draft(offering: String) -> Result<Option<LaunchRequest>, AppError> {
    use super::ssr;
    let meta = ssr::request_meta().await;
    let platform = ssr::platform(&meta)?;
    if ssr::signed_in_user(&platform, &meta).await?.is_none() {
        return Ok(None);
    }
    let session = ssr::session(&meta).await?;
    Ok(crate::session::show_launch_draft(&session, &meta).await?.filter(|draft| draft.offering == offering))
}

/// The projects the caller may book in, for the launch form.
#[server(endpoint = "bookable_projects")]
pub async fn bookable_projects() -> Result<Vec<crate::model::ProjectOption>, AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let projects =
        platform.projects_to_book_in(&caller).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    Ok(projects.into_iter().map(|(id, name)| crate::model::ProjectOption { id, name }).collect())
}

/// The environments page's listing: the caller's own by default (`person` empty or `me`);
/// those who see more may filter by person (`any` or an id), project, tenant and state.
#[server(endpoint = "environments_listing")]
pub async fn environments_listing(
    person: Option<String>,
    project: Option<String>,
    tenant: Option<String>,
    state: Option<String>,
) -> Result<crate::model::EnvironmentListView, AppError> {
    use berth_domain::policy::{Action, Reach};
    use berth_platform::capacity::environments::EnvironmentFilter;
    let (platform, caller) = super::ssr::caller().await?;
    let fail = |e| AppError::from_platform(e, &caller.meta.request_id);
    let reach = caller.principal.reach(Action::EnvironmentRead);
    let wider = matches!(reach, Some(Reach::Tenant | Reach::All));
    let person = person.filter(|p| !p.is_empty() && wider).unwrap_or_else(|| "me".into());
    let owner = match person.as_str() {
        "me" => caller.user_id().to_string(),
        "any" => String::new(),
        id => id.to_owned(),
    };
    let (project, tenant, state) = (project.unwrap_or_default(), tenant.unwrap_or_default(), state.unwrap_or_default());
    let filter = EnvironmentFilter::parse(&owner, &project, &tenant, &state).map_err(fail)?;
    let listing = platform.environments_in_reach(&caller, &filter).await.map_err(fail)?;
    let now = berth_platform::now_ms();
    let choices = |list: Vec<(i64, String)>| {
        list.into_iter().map(|(id, name)| crate::model::ProjectOption { id, name }).collect::<Vec<_>>()
    };
    Ok(crate::model::EnvironmentListView {
        environments: listing.environments.iter().map(|listed| views::listed(listed, now)).collect(),
        wider,
        all_tenants: reach == Some(Reach::All),
        person,
        project,
        tenant,
        state: if state.is_empty() { "any".into() } else { state },
        people: choices(listing.people),
        projects: choices(listing.projects),
        tenants: choices(listing.tenants),
    })
}

#[server(endpoint = "environment")]
pub async fn environment(id: String) -> Result<EnvironmentView, AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let detail = platform
        .environment_detail(&caller, &id)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    // A key revealed or replaced by a plain form post waited in the session for this render.
    let shown_key = if detail.endpoint.is_some() {
        let session = super::ssr::session(&caller.meta).await?;
        crate::session::show_endpoint_key(&session, &caller.meta, &id).await?
    } else {
        None
    };
    if shown_key.is_some()
        && let Some(response) = use_context::<leptos_axum::ResponseOptions>()
    {
        // The page holds a secret: keep it out of the browser's cache and back button.
        response.insert_header(http::header::CACHE_CONTROL, http::HeaderValue::from_static("no-store"));
    }
    let may_change = {
        let e = &detail.environment;
        let target = berth_domain::policy::Target::Owned { tenant_id: e.tenant_id, owner_id: e.owner_id };
        caller.principal.authorize(berth_domain::policy::Action::EnvironmentChange, target).is_ok()
    };
    let access = views::Access { origin: platform.environment_origin(&id), may_change, shown_key };
    let mut view = views::environment(&detail, &access, berth_platform::now_ms());
    // A running training job's log comes with every refresh of the page.
    if view.logs.is_some() {
        view.logs =
            Some(match platform.job_logs(&caller, &id, berth_platform::provisioning::connect::LOG_TAIL).await {
                Ok(logs) => views::job_logs(&logs),
                Err(e) => crate::model::JobLogsView {
                    state: "unavailable".into(),
                    label: AppError::from_platform_quiet(e, &caller.meta.request_id).to_string(),
                    lines: Vec::new(),
                },
            });
    }
    Ok(view)
}

/// Shows an inference endpoint's API key, once (Berth keeps only its hash afterwards).
#[server(endpoint = "reveal_api_key")]
pub async fn reveal_api_key(id: String) -> Result<Option<String>, AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let key = platform
        .reveal_endpoint_key(&caller, &id)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    hand_over_key(&caller, &id, key).await
}

/// Gives an inference endpoint a new API key (the old one stops at once) and shows it once.
#[server(endpoint = "replace_api_key")]
pub async fn replace_api_key(id: String) -> Result<Option<String>, AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let key = platform
        .replace_endpoint_key(&caller, &id)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    hand_over_key(&caller, &id, key).await
}

/// The key as the action's answer; a plain form post cannot carry it back, so there it
/// waits in the session for the page's next render.
#[cfg(feature = "ssr")]
async fn hand_over_key(caller: &berth_platform::Caller, id: &str, key: String) -> Result<Option<String>, AppError> {
    if crate::error::plain_form_post() {
        let session = super::ssr::session(&caller.meta).await?;
        let held = crate::session::NewEndpointKey {
            environment_id: id.to_owned(),
            key,
            created_at: berth_platform::now_ms(),
            shown_in: None,
        };
        crate::session::hold_endpoint_key(&session, &caller.meta, &held).await?;
        leptos_axum::redirect(&format!("/environments/{id}"));
        return Ok(None);
    }
    Ok(Some(key))
}

/// Sets how many replicas an inference endpoint runs; each books the endpoint's size.
#[server(endpoint = "set_replicas")]
pub async fn set_replicas(id: String, replicas: String) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform
        .set_replicas(&caller, &id, &replicas)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect(&format!("/environments/{id}"));
    Ok(())
}

#[server(endpoint = "stop_environment")]
pub async fn stop_environment(id: String) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform.stop(&caller, &id).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect(&format!("/environments/{id}"));
    Ok(())
}

/// Moves the end of a booked or running environment (`end`: a UTC date and time).
#[server(endpoint = "change_end")]
pub async fn change_end(id: String, end: String) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform.change_end(&caller, &id, &end).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect(&format!("/environments/{id}"));
    Ok(())
}

#[cfg(feature = "ssr")]
pub(crate) mod views {
    use berth_domain::catalog::Offering;
    use berth_domain::catalog::format_cents;
    use berth_domain::lifecycle::{Desired, EnvState, Phase, provision_plan, teardown_plan};
    use berth_domain::mig::{MEMORY_SLICES, time_slice_share};
    use berth_platform::capacity::environments::{Environment, ListedEnvironment};
    use berth_platform::provisioning::backend::{JobLogs, JobStatus};
    use berth_platform::provisioning::connect::KeyState;
    use berth_platform::provisioning::journal::EnvironmentDetail;

    use crate::model::{
        ConnectionView, EndpointView, EnvironmentSummary, EnvironmentView, JobLogsView, StepView, UnitView,
    };
    use crate::time::{duration_words, field_value, utc};

    /// What the environment page needs beyond the environment itself.
    pub struct Access {
        /// The environment's own origin, e.g. `https://<id>.env.berth.example`.
        pub origin: String,
        /// The caller may change the environment (stop, resize, scale).
        pub may_change: bool,
        /// An endpoint key to show in this render.
        pub shown_key: Option<String>,
    }

    pub fn job_logs(logs: &JobLogs) -> JobLogsView {
        let (state, label) = match &logs.status {
            JobStatus::Pending => ("pending", "Waiting to start".to_owned()),
            JobStatus::Running => ("running", "Running".to_owned()),
            JobStatus::Succeeded => ("succeeded", "Succeeded (exit code 0)".to_owned()),
            JobStatus::Failed { exit_code: Some(code), reason } => {
                ("failed", format!("Failed (exit code {code}): {reason}"))
            }
            JobStatus::Failed { exit_code: None, reason } => ("failed", format!("Failed: {reason}")),
        };
        JobLogsView { state: state.to_owned(), label, lines: logs.lines.clone() }
    }

    /// A listing's row: the summary with whose, which project's and which tenant's it is.
    pub fn listed(listed: &ListedEnvironment, now: i64) -> EnvironmentSummary {
        EnvironmentSummary {
            owner: listed.owner.clone(),
            project: listed.project.clone().unwrap_or_default(),
            tenant: listed.tenant.clone().unwrap_or_default(),
            ..summary(&listed.environment, now)
        }
    }

    pub fn summary(e: &Environment, now: i64) -> EnvironmentSummary {
        let scheduled = e.state == EnvState::Requested && e.starts_at > now;
        let window = match (e.state.is_final(), e.finished_at) {
            (true, Some(at)) => format!("ended {}", utc(at)),
            _ if scheduled => format!("starts in {} ({})", duration_words(e.starts_at - now), utc(e.starts_at)),
            _ if e.ends_at > now => format!("ends in {}", duration_words(e.ends_at - now)),
            _ => "window over, tearing down".to_owned(),
        };
        let running = e.desired == Desired::Running;
        EnvironmentSummary {
            id: e.id.clone(),
            name: e.name.clone(),
            owner: String::new(),
            project: String::new(),
            tenant: String::new(),
            offering: e.offering.title().to_owned(),
            size: e.size.label.to_owned(),
            state: if scheduled { "scheduled" } else { e.state.as_str() }.to_owned(),
            state_label: if scheduled { "Scheduled" } else { e.state.label_for(e.offering) }.to_owned(),
            price: format!("{}/h", format_cents(u32::try_from(e.cents_per_hour).unwrap_or(0))),
            created: utc(e.created_at),
            window,
            stoppable: e.state.is_stoppable() && running,
            spot: e.tier == berth_domain::booking::Tier::Spot,
            resizable: running && matches!(e.state, EnvState::Requested | EnvState::Provisioning | EnvState::Ready),
            finished: e.state.is_final(),
            ends_input: field_value(e.ends_at),
        }
    }

    pub fn environment(d: &EnvironmentDetail, access: &Access, now: i64) -> EnvironmentView {
        let e = &d.environment;
        let ready = e.state == EnvState::Ready && e.desired == Desired::Running;
        let mut plans = vec![(Phase::Provision, provision_plan(e.offering, e.size.shape))];
        if matches!(e.state, EnvState::TearingDown | EnvState::Released | EnvState::Failed) {
            plans.push((Phase::Teardown, teardown_plan(e.size.shape)));
        }
        let steps = plans
            .into_iter()
            .flat_map(|(phase, plan)| {
                plan.into_iter().enumerate().map(move |(i, step)| (phase, i, step)).collect::<Vec<_>>()
            })
            .map(|(phase, i, step)| {
                let record = d.steps.iter().find(|s| s.phase == phase && s.index == i as i64);
                let timing = match record {
                    Some(r) => match r.finished_at {
                        Some(end) => duration_words(end - r.started_at),
                        None => format!("running for {}", duration_words(now - r.started_at)),
                    },
                    None => String::new(),
                };
                StepView {
                    phase: phase.as_str().to_owned(),
                    label: step.label_for(e.offering).to_owned(),
                    status: record.map_or("pending", |r| r.status.as_str()).to_owned(),
                    attempts: record.map_or(0, |r| r.attempts),
                    timing,
                    detail: record.and_then(|r| r.detail.clone()),
                }
            })
            .collect();
        let units = d
            .units
            .iter()
            .map(|u| UnitView {
                location: format!("{} / {} / GPU {}", u.site, u.node, u.gpu_index),
                model: u.model.clone(),
                what: match (&u.mig_profile, u.slice_size) {
                    (Some(p), _) => format!("MIG {p} at memory slice {}", u.slice_start),
                    (None, size) if size == i64::from(MEMORY_SLICES) => "whole GPU".to_owned(),
                    (None, size) => {
                        let (share, ways) = time_slice_share(u.slice_start, size);
                        format!(
                            "share {share} of {ways} of a time-sliced GPU (shared with others; no memory or fault isolation)"
                        )
                    }
                },
                released: u.released_at.is_some(),
            })
            .collect();
        let mut timeline =
            vec![("Requested".to_owned(), utc(e.created_at)), ("Window starts".to_owned(), utc(e.starts_at))];
        if let Some(at) = e.ready_at {
            timeline.push((EnvState::Ready.label_for(e.offering).to_owned(), utc(at)));
        }
        timeline.push(("Window ends".to_owned(), utc(e.ends_at)));
        if let Some(at) = e.finished_at {
            timeline.push((e.state.label_for(e.offering).to_owned(), utc(at)));
        }
        let node_changes = d
            .node_replacements
            .iter()
            .map(|r| {
                let then = match (&r.replacement, r.moved_at, &r.problem, r.next_free_at) {
                    (Some(node), Some(at), _, _) => format!("{node} replaced it, moved there {}", utc(at)),
                    (Some(node), None, Some(problem), _) => format!("{node} replaces it; {problem}"),
                    (Some(node), None, None, _) => format!("{node} replaces it; moving the cluster there"),
                    (None, _, Some(problem), _) => format!("no node replaces it: {problem}"),
                    (None, _, None, Some(at)) => {
                        format!("no node of its kind is free now; the first is from {}", utc(at))
                    }
                    (None, _, None, None) => "no node of its kind is free before the window ends".to_owned(),
                };
                format!("{} failed {}: {}. {then}.", r.failed_node, utc(r.decided_at), r.reason)
            })
            .collect();
        EnvironmentView {
            node_changes,
            volumes: d.volumes.iter().cloned().map(super::super::volumes::attachment_view).collect(),
            summary: summary(e, now),
            image: e.image.clone(),
            command: e.command.clone(),
            model: e.serving.model.clone(),
            args: Some(e.serving.container_args())
                .filter(|a| !a.is_empty())
                .map(|a| berth_domain::serving::shell_words(&a)),
            env_names: Some(e.serving.env_names()).filter(|n| !n.is_empty()).map(|n| n.join(", ")),
            failure_reason: e.failure_reason.clone(),
            // Notebooks and endpoints are reached through Berth (below), training jobs show
            // their log; a dedicated cluster's kubeconfig is for those who may act in it.
            connection: e
                .connection
                .as_ref()
                .filter(|_| e.state == EnvState::Ready && e.offering == Offering::DedicatedCluster && d.may_connect)
                .map(|c| ConnectionView {
                    url: c.url.clone(),
                    secret_label: c.secret_label.clone(),
                    secret: c.secret.clone(),
                    example: c.example.clone(),
                }),
            steps,
            units,
            timeline,
            // Through the portal, which signs the browser in on the notebook's own origin.
            open_url: (ready && d.may_connect && e.offering == Offering::Notebook)
                .then(|| format!("/environments/{}/open", e.id)),
            notebook_url: (ready && d.may_connect && e.offering == Offering::Notebook)
                .then(|| format!("{}/", access.origin)),
            endpoint: d.endpoint.as_ref().map(|state| {
                let url = format!("{}/v1", access.origin);
                let (key_state, key_note) = match state.key {
                    KeyState::NotYetMade => ("pending", None),
                    KeyState::Unrevealed => ("unrevealed", None),
                    KeyState::Shown { at } => ("shown", Some(format!("shown {}", utc(at)))),
                };
                EndpointView {
                    example: format!("curl -H \"Authorization: Bearer $BERTH_ENDPOINT_KEY\" {url}/models"),
                    url,
                    may_connect: d.may_connect,
                    key_state: key_state.to_owned(),
                    key_note,
                    shown_key: access.shown_key.clone().filter(|_| d.may_connect),
                    replicas: state.replicas,
                    replicas_applied: state.replicas_applied,
                    max_replicas: berth_domain::launch::MAX_REPLICAS,
                    scale_error: state.scale_error.clone(),
                    can_scale: ready && access.may_change,
                }
            }),
            // Filled in by the server function, which asks the backend.
            // A job's kept log stays on its page after the job ended.
            logs: (e.offering == Offering::TrainingJob && (ready || e.state.is_final())).then(|| JobLogsView {
                state: "pending".into(),
                label: "Waiting to start".into(),
                lines: Vec::new(),
            }),
        }
    }
}
