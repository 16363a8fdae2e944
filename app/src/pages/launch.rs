use berth_domain::catalog::{ImageRule, Offering};
use berth_domain::launch::LaunchRequest;
use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::{use_params_map, use_query_map};

use crate::components::form::{BUTTON, LABEL};
use crate::components::{Auth, ErrorAlert, Field, FieldErrors, RequireUser};
use crate::error::AppError;
use crate::model::{ImageOffer, ProjectOption, SizeHint, VolumeOption};
use crate::serverfns::{Launch, attachable_volumes, bookable_projects, launch_draft, launch_images, size_hints};

/// The launch form for one offering. The server checks everything again and explains
/// each refusal; nothing is written unless every rule passes. Its action and resources are
/// made outside `RequireUser` (see there why).
#[component]
pub fn LaunchPage() -> impl IntoView {
    let params = use_params_map();
    let query = use_query_map();
    let offering = move || params.read().get("offering").and_then(|o| Offering::parse(&o));
    let chosen_size = move || query.read().get("size");
    let start = move || query.read().get("start").unwrap_or_default();
    let hours = move || offering().map(|offering| form_hours(offering, query.read().get("hours")));
    let launch = ServerAction::<Launch>::new();
    // What is free follows the duration and the start as they are typed (for the offering
    // they were typed for).
    let typed = RwSignal::new(None::<(Offering, String)>);
    let typed_start = RwSignal::new(None::<(Offering, String)>);
    // The project picked: only its shared volumes are offered, and the hints count its
    // budget (once hydrated; a plain form lists every project's volumes, and the server
    // refuses another project's).
    let project = RwSignal::new(String::new());
    let hints = Resource::new(
        move || {
            let offering = offering()?;
            let typed = typed.get().filter(|(o, _)| *o == offering).map(|(_, hours)| hours);
            let from = typed_start.get().filter(|(o, _)| *o == offering).map(|(_, start)| start);
            Some((offering, typed.or_else(hours)?, from.unwrap_or_else(start), project.get()))
        },
        |wanted| async move {
            match wanted {
                Some((offering, hours, start, project)) => {
                    size_hints(offering.id().to_owned(), hours, start, project).await
                }
                None => Ok(Vec::new()),
            }
        },
    );
    let projects = Resource::new(|| (), |_| bookable_projects());
    let volumes = Resource::new(|| (), |_| attachable_volumes());
    let images = Resource::new(offering, |offering| async move {
        match offering.filter(|o| o.image_rule() != ImageRule::None) {
            Some(offering) => launch_images(offering.id().to_owned()).await,
            None => Ok(ImageOffer { options: Vec::new(), custom: None }),
        }
    });
    // What a refused plain form post typed, to fill the form in again. Only a server render
    // can have one (the refusal's redirect is a whole page load), so in the browser, after
    // hydration, the form is shown at once, not after a request that answers nothing; with
    // the WASM running the form keeps what was typed anyway.
    let draft = Resource::new(offering, |offering| async move {
        match offering {
            Some(offering) if cfg!(feature = "ssr") => launch_draft(offering.id().to_owned()).await.ok().flatten(),
            _ => None,
        }
    });
    let form = LaunchState { launch, typed, typed_start, project, hints, projects, volumes, images };
    view! {
        <RequireUser>
            {move || match offering() {
                Some(offering) if !may_launch() => view! { <MayNotLaunch offering/> }.into_any(),
                Some(offering) => view! {
                    <Suspense fallback=|| ()>
                        {move || Suspend::new(async move {
                            // What the hints were first asked for: the link's start and duration.
                            let asked = (hours().unwrap_or_default(), start());
                            let filled = draft.await.unwrap_or_else(|| LaunchRequest {
                                size: chosen_size().unwrap_or_default(),
                                start: asked.1.clone(),
                                hours: asked.0.clone(),
                                ..LaunchRequest::default()
                            });
                            view! { <LaunchForm offering filled asked form/> }
                        })}
                    </Suspense>
                }
                .into_any(),
                // No such offering: the page does not exist (404), as any other unknown path.
                None => view! { <super::NotFound/> }.into_any(),
            }}
        </RequireUser>
    }
}

/// Whether the signed-in user's role may book (read inside `RequireUser`, where the user
/// is known).
fn may_launch() -> bool {
    Auth::get().and_then(|auth| auth.user.get()).and_then(Result::ok).flatten().is_some_and(|user| user.can_launch)
}

/// What a viewer or an auditor sees instead of the form: why, and where to go.
#[component]
fn MayNotLaunch(offering: Offering) -> impl IntoView {
    view! {
        <Title text=format!("Launch {}", with_article(offering))/>
        <div class="mx-auto max-w-2xl rounded-xl border border-slate-200 bg-white p-6 shadow-sm" data-testid="may-not-launch">
            <h1 class="text-xl font-bold tracking-tight text-slate-900">"Launch " {with_article(offering)}</h1>
            <p class="mt-2 text-sm text-slate-700">
                "Your role can see the catalog, the calendar and environments, but not book capacity. "
                "A tenant admin can make you a member of the tenant."
            </p>
            <a href="/calendar" class="mt-4 inline-block text-sm font-medium text-indigo-700 underline hover:text-indigo-500">"See availability"</a>
        </div>
    }
}

/// The duration the form starts with: the query's if it is allowed, else four hours.
fn form_hours(offering: Offering, hours: Option<String>) -> String {
    hours
        .filter(|h| h.parse::<u32>().is_ok_and(|h| (1..=offering.max_hours()).contains(&h)))
        .unwrap_or_else(|| "4".into())
}

/// The launch page's reactive parts, made once above the form.
#[derive(Clone, Copy)]
struct LaunchState {
    launch: ServerAction<Launch>,
    typed: RwSignal<Option<(Offering, String)>>,
    typed_start: RwSignal<Option<(Offering, String)>>,
    project: RwSignal<String>,
    hints: Resource<Result<Vec<SizeHint>, AppError>>,
    projects: Resource<Result<Vec<ProjectOption>, AppError>>,
    volumes: Resource<Result<Vec<VolumeOption>, AppError>>,
    images: Resource<Result<ImageOffer, AppError>>,
}

/// The form, `filled` in with the size, start and duration a link asked for, or with
/// everything a refused plain form post had typed. `asked` is the duration and start the
/// size hints were first read for (the link's).
#[component]
fn LaunchForm(offering: Offering, filled: LaunchRequest, asked: (String, String), form: LaunchState) -> impl IntoView {
    let LaunchState { launch, typed, typed_start, project, hints, projects, volumes, images } = form;
    let LaunchRequest {
        size: chosen_size,
        name,
        hours,
        start,
        earliest_within_days,
        models,
        min_gpu_memory_gb,
        tier,
        project: typed_project,
        image: typed_image,
        command,
        model,
        args,
        env,
        volumes: typed_volumes,
        ..
    } = filled;
    FieldErrors::of(launch);
    let result = launch.value();
    let sizes = offering.sizes();
    let chosen = Some(chosen_size).filter(|id| offering.size(id).is_some()).unwrap_or_else(|| sizes[0].id.to_owned());
    let max_hours = offering.max_hours();
    // What the booking costs, following the size picked and the duration typed.
    let picked = RwSignal::new(chosen.clone());
    let initial_hours = hours.clone();
    // The server prices it by the rate card over the window (the hints carry it), once the
    // duration typed is one a booking may have.
    let hours_ok = move || {
        let typed =
            typed.get().filter(|(o, _)| *o == offering).map(|(_, h)| h).unwrap_or_else(|| initial_hours.clone());
        typed.trim().parse::<u32>().ok().is_some_and(|h| (1..=max_hours).contains(&h))
    };
    // The duration, start, size and project as the form has them once hydrated: what was typed before
    // raised no event, and the hints and the cost would otherwise follow the values they were
    // first asked for (which a refused plain form post's may differ from).
    #[cfg(not(feature = "hydrate"))]
    let _ = asked;
    #[cfg(feature = "hydrate")]
    {
        use crate::components::form::input_value;
        let (first_hours, first_start, first_size) = (asked.0, asked.1.replace('T', " "), chosen.clone());
        Effect::new(move |_| {
            if let Some(h) = input_value("#hours").filter(|h| *h != first_hours) {
                typed.set(Some((offering, h)));
            }
            if let Some(s) = input_value("#start").filter(|s| *s != first_start) {
                typed_start.set(Some((offering, s)));
            }
            if let Some(size) = input_value(r#"input[name="request[size]"]:checked"#).filter(|s| *s != first_size) {
                picked.set(size);
            }
            if let Some(picked_project) = input_value("#project").filter(|p| !p.is_empty()) {
                project.set(picked_project);
            }
        });
    }
    let cost = move |hints: Vec<SizeHint>, picked: String| {
        let size = offering.size(&picked)?;
        let hint = hints.into_iter().find(|h| h.size_id == size.id)?;
        let price = hint.price.unwrap_or_default();
        let discount = hint.discount.map(|d| format!(", {d}")).unwrap_or_default();
        hint.cost.map(|cost| format!("{cost} ({} at {price}{discount})", size.label))
    };
    view! {
        <Title text=format!("Launch {}", with_article(offering))/>
        <div class="mx-auto max-w-2xl">
            <a href="/catalog" class="text-sm text-indigo-600 hover:text-indigo-500">"← Catalog"</a>
            <h1 class="mt-2 text-2xl font-bold tracking-tight text-slate-900">"Launch " {with_article(offering)}</h1>
            <p class="mt-1 text-slate-600">{offering.summary()}</p>
            <div class="mt-6 rounded-xl border border-slate-200 bg-white p-6 shadow-sm">
                <ActionForm action=launch>
                    <input type="hidden" name="request[offering]" value=offering.id()/>
                    <div class="space-y-6">
                        <fieldset>
                            <legend class=LABEL>"Size"</legend>
                            <div class="mt-2 grid gap-2 sm:grid-cols-2">
                                {sizes.iter().map(|s| {
                                    let id = format!("size-{}", s.id);
                                    let label_for = id.clone();
                                    let size_id = s.id;
                                    view! {
                                        <label for=label_for class="flex cursor-pointer items-start gap-3 rounded-lg border border-slate-200 p-3 hover:border-indigo-300 has-[:checked]:border-indigo-500 has-[:checked]:bg-indigo-50">
                                            <input type="radio" id=id name="request[size]" value=s.id checked=s.id == chosen class="mt-1"
                                                on:change=move |_| picked.set(size_id.to_owned())/>
                                            <span>
                                                <span class="block text-sm font-medium text-slate-900">{s.label}</span>
                                                <Transition fallback=move || view! { <span class="block text-xs text-slate-600">{s.vcpus} " vCPU · " {s.memory_gb} " GB RAM"</span> }>
                                                    {move || Suspend::new(async move {
                                                        let hint = hints.await.ok().and_then(|all| all.into_iter().find(|h| h.size_id == size_id));
                                                        let price = hint.as_ref().map(|h| h.price.clone().unwrap_or_else(|| "no price yet".into()));
                                                        view! {
                                                            <span class="block text-xs text-slate-600" data-price=size_id>
                                                                {s.vcpus} " vCPU · " {s.memory_gb} " GB RAM" {price.map(|p| format!(" · {p}"))}
                                                            </span>
                                                            {hint.map(|h| {
                                                                let tone = if h.free_now { "text-emerald-700" } else { "text-amber-700" };
                                                                view! { <span data-hint=size_id class=format!("mt-1 block text-xs {tone}")>{h.text}</span> }
                                                            })}
                                                        }
                                                    })}
                                                </Transition>
                                            </span>
                                        </label>
                                    }
                                }).collect_view()}
                            </div>
                        </fieldset>
                        <div class="grid gap-4 sm:grid-cols-3">
                            <Field id="name" name="request[name]" label="Name" value=name required=true maxlength=40 placeholder="my-experiment"
                                help=|| "Lowercase letters, digits and hyphens."/>
                            <Field id="hours" name="request[hours]" label="Duration (hours)" input_type="number" min=1 max=max_hours
                                value=hours required=true
                                on:input=move |ev| typed.set(Some((offering, event_target_value(&ev))))
                                help=move || view! { "1 to " {max_hours} " hours; torn down automatically at the end." }/>
                            <Field id="start" name="request[start]" label="Start (UTC)" utc_time=true value=start.replace('T', " ")
                                on:change=move |ev| typed_start.set(Some((offering, event_target_value(&ev))))
                                help=|| view! {
                                    "Empty to start now, or book ahead. See "
                                    <a href="/calendar" class="text-indigo-600 hover:text-indigo-500">"availability"</a> "."
                                }/>
                        </div>
                        <Field id="earliest" name="request[earliest_within_days]" label="Or: as soon as possible within (days)"
                            input_type="number" min=1 max=berth_domain::launch::MAX_EARLIEST_DAYS value=earliest_within_days
                            help=|| "Leave the start empty: Berth books the earliest time the size is free for the whole duration, within this many days, and shows the start it got."/>
                        <fieldset>
                            <legend class=LABEL>"Other GPU models"</legend>
                            <div class="mt-2 grid gap-4 sm:grid-cols-2">
                                <label for="models-any" class="flex cursor-pointer items-start gap-3 rounded-lg border border-slate-200 p-3 has-[:checked]:border-indigo-500 has-[:checked]:bg-indigo-50">
                                    <input type="checkbox" id="models-any" name="request[models]" value="any" checked=models == "any" class="mt-1"/>
                                    <span class="text-sm"><span class="block font-medium text-slate-900">"Any GPU model of this size"</span>
                                        <span class="block text-xs text-slate-600">"When the size you chose is full, take the same size on another model (see the catalog), at that size's price."</span></span>
                                </label>
                                <Field id="min-memory" name="request[min_gpu_memory_gb]" label="GPU memory at least (GB)" input_type="number" min=1 max=1000
                                    value=min_gpu_memory_gb
                                    help=|| "Optional: only models with this much memory per GPU; also takes other models of this size that have it."/>
                            </div>
                        </fieldset>
                        <ProjectField projects project typed=typed_project/>
                        {matches!(offering, Offering::Notebook | Offering::TrainingJob).then(|| view! {
                            <VolumesField offering volumes project typed=typed_volumes/>
                        })}
                        <fieldset>
                            <legend class=LABEL>"Tier"</legend>
                            <div class="mt-2 grid gap-2 sm:grid-cols-2">
                                <label for="tier-guaranteed" class="flex cursor-pointer items-start gap-3 rounded-lg border border-slate-200 p-3 has-[:checked]:border-indigo-500 has-[:checked]:bg-indigo-50">
                                    <input type="radio" id="tier-guaranteed" name="request[tier]" value="guaranteed" checked=tier != "spot" class="mt-1"/>
                                    <span class="text-sm"><span class="block font-medium text-slate-900">"Guaranteed"</span>
                                        <span class="block text-xs text-slate-600">"Counts against your quota; never taken away."</span></span>
                                </label>
                                <label for="tier-spot" class="flex cursor-pointer items-start gap-3 rounded-lg border border-slate-200 p-3 has-[:checked]:border-amber-500 has-[:checked]:bg-amber-50">
                                    <input type="radio" id="tier-spot" name="request[tier]" value="spot" checked=tier == "spot" class="mt-1"/>
                                    <span class="text-sm"><span class="block font-medium text-slate-900">"Spot (preemptible)"</span>
                                        <span class="block text-xs text-slate-600">"Beyond your quota if it allows; starts now; reclaimed when a guaranteed booking needs the capacity."</span></span>
                                </label>
                            </div>
                        </fieldset>
                        <ImageField offering images typed=typed_image/>
                        {offering.needs_command().then(|| view! {
                            <Field id="command" name="request[command]" label="Command" rows=3 required=true monospace=true value=command
                                placeholder="python train.py --epochs 10"/>
                        })}
                        {(!offering.needs_command()).then(|| view! { <input type="hidden" name="request[command]" value=""/> })}
                        {(offering == Offering::InferenceEndpoint).then(|| view! {
                            <Field id="model" name="request[model]" label="Model" value=model monospace=true maxlength=200 autocomplete="off"
                                placeholder="meta-llama/Llama-3.1-8B-Instruct"
                                help=|| "A Hugging Face id or a path in the image. The server gets it as --model (or wherever {model} stands in the arguments) and as BERTH_MODEL."/>
                            <Field id="args" name="request[args]" label="Server arguments" value=args monospace=true maxlength=2000 autocomplete="off"
                                placeholder="--max-model-len 8192 --dtype bfloat16"
                                help=|| "After the image's entrypoint, split as a shell would (quotes group words; nothing is expanded). Empty with a model: --model {model}."/>
                            <Field id="env" name="request[env]" label="Environment variables" value=env rows=3 monospace=true autocomplete="off"
                                placeholder="HF_TOKEN=hf_..."
                                help=|| "NAME=value, one a line. Values are handed to the server only: pages and the API show the names."/>
                        })}
                        {move || result.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
                        <p class="text-sm text-slate-700" data-cost="">
                            <Transition fallback=|| ()>
                                {move || {
                                    // Read before the wait, so that a change follows.
                                    let (picked, ok) = (picked.get(), hours_ok());
                                    Suspend::new(async move {
                                        let c = hints.await.ok().filter(|_| ok).and_then(|all| cost(all, picked))?;
                                        Some(view! { "Cost: " <span class="font-semibold text-slate-900">{c}</span> })
                                    })
                                }}
                            </Transition>
                        </p>
                        <div class="flex items-center justify-end gap-3">
                            <a href="/catalog" class="rounded-lg px-4 py-2 text-sm font-medium text-slate-700 hover:bg-slate-100">"Cancel"</a>
                            <button type="submit" disabled=move || launch.pending().get() class=format!("{BUTTON} disabled:opacity-60")>
                                {move || if launch.pending().get() { "Launching..." } else { "Launch" }}
                            </button>
                        </div>
                    </div>
                </ActionForm>
            </div>
        </div>
    }
}

/// The project whose quota the booking also counts against; shown only to those who
/// belong to a project.
#[component]
fn ProjectField(
    projects: Resource<Result<Vec<ProjectOption>, AppError>>,
    project: RwSignal<String>,
    /// The project picked before (a refused plain form post's); empty for none.
    typed: String,
) -> impl IntoView {
    view! {
        <Transition fallback=|| ()>
            {move || {
                let typed = typed.clone();
                Suspend::new(async move {
                    let projects = projects.await.unwrap_or_default();
                    (!projects.is_empty()).then(|| view! {
                        <Field id="project" name="request[project]" label="Project"
                            on:change=move |ev| project.set(event_target_value(&ev))
                            help=|| "The booking also counts against the project's quota.">
                            <option value="">"No project"</option>
                            {projects.into_iter().map(|p| {
                                let id = p.id.to_string();
                                view! { <option selected=id == typed value=id>{p.name}</option> }
                            }).collect_view()}
                        </Field>
                    })
                })
            }}
        </Transition>
    }
}

/// The volumes to attach: the home volume (always, for a notebook), one's own personal
/// volumes, and the shared volumes of the project picked, each with its mount path.
#[component]
fn VolumesField(
    offering: Offering,
    volumes: Resource<Result<Vec<VolumeOption>, AppError>>,
    project: RwSignal<String>,
    /// The volumes ticked before (a refused plain form post's).
    typed: Vec<String>,
) -> impl IntoView {
    // Filtering by the project picked starts once the page is hydrated.
    let hydrated = RwSignal::new(false);
    Effect::new(move |_| hydrated.set(true));
    view! {
        <Transition fallback=|| ()>
            {move || {
                let typed = typed.clone();
                Suspend::new(async move {
                    let volumes = volumes.await.unwrap_or_default();
                    let mut index = 0;
                    view! {
                        <fieldset data-volumes="">
                            <legend class=LABEL>"Volumes"</legend>
                            <p class="mt-1 text-xs text-slate-600">
                                "Files on a volume stay after the booking ends. "
                                <a href="/volumes" class="text-indigo-700 underline hover:text-indigo-500">"Manage volumes"</a>
                            </p>
                            <ul class="mt-2 space-y-1 text-sm">
                                {volumes.into_iter().filter(|v| offering == Offering::Notebook || !v.is_home || v.id != 0).map(|v| {
                                    let what = match (&v.project, v.is_home) {
                                        (_, true) => "your home volume".to_owned(),
                                        (Some(p), _) => format!("shared with project {p}"),
                                        (None, false) => "personal".to_owned(),
                                    };
                                    let text = format!("{} ({} GiB, {what}) at {}", v.name, v.size_gib, v.mount_path);
                                    if v.is_home && offering == Offering::Notebook {
                                        return view! {
                                            <li data-volume-option=v.name.clone() class="flex items-center gap-2 text-slate-700">
                                                <input type="checkbox" checked disabled aria-label="Home volume, always attached"/>
                                                {text} " · always attached"
                                            </li>
                                        }.into_any();
                                    }
                                    let ticked = typed.contains(&v.id.to_string());
                                    let id = format!("volume-{}", v.id);
                                    let name = format!("request[volumes][{index}]");
                                    index += 1;
                                    let of_project = v.project_id;
                                    let hidden = move || {
                                        hydrated.get() && of_project.is_some_and(|p| p.to_string() != project.get())
                                    };
                                    view! {
                                        <li data-volume-option=v.name.clone() class="text-slate-700" hidden=hidden>
                                            <label for=id.clone() class="flex items-center gap-2">
                                                <input type="checkbox" id=id.clone() name=name value=v.id.to_string() checked=ticked/>
                                                {text}
                                            </label>
                                        </li>
                                    }.into_any()
                                }).collect_view()}
                            </ul>
                        </fieldset>
                    }
                })
            }}
        </Transition>
    }
}

/// "a Jupyter notebook", "an inference endpoint", ...
fn with_article(offering: Offering) -> &'static str {
    match offering {
        Offering::Notebook => "a Jupyter notebook",
        Offering::TrainingJob => "a training job",
        Offering::InferenceEndpoint => "an inference endpoint",
        Offering::DedicatedCluster => "a dedicated cluster",
    }
}

/// The image: a catalog entry (the default first), or for a training job or an endpoint
/// where the tenant allows it, a reference of one's own (typed, with the catalog's entries
/// suggested).
#[component]
fn ImageField(
    offering: Offering,
    images: Resource<Result<ImageOffer, AppError>>,
    /// The image chosen or typed before (a refused plain form post's); empty for the default.
    typed: String,
) -> impl IntoView {
    if offering.image_rule() == ImageRule::None {
        return view! { <input type="hidden" name="request[image]" value=""/> }.into_any();
    }
    let catalog_link = || {
        view! {
            " " <a href="/images" class="text-indigo-700 underline hover:text-indigo-500">"See the image catalog"</a>
        }
    };
    view! {
        <Transition fallback=|| ()>
            {move || {
                let typed = typed.clone();
                Suspend::new(async move {
                    let images = images.await.unwrap_or(ImageOffer { options: Vec::new(), custom: None });
                    match images.custom {
                        None => view! {
                            <Field id="image" name="request[image]" label="Image"
                                help=move || view! { "Images from the catalog, with their CUDA versions." {catalog_link()} }>
                                {images.options.into_iter().map(|i| {
                                    let selected = i.reference == typed;
                                    view! { <option selected=selected value=i.reference>{i.label}</option> }
                                }).collect_view()}
                            </Field>
                        }.into_any(),
                        Some(allowed) => {
                            let first = Some(typed.clone())
                                .filter(|typed| !typed.is_empty())
                                .or_else(|| images.options.first().map(|i| i.reference.clone()));
                            view! {
                                <Field id="image" name="request[image]" label="Container image" required=true monospace=true
                                    list="catalog-images" value=first.unwrap_or_default()
                                    placeholder="ghcr.io/your-org/model-server:1.0"
                                    help=move || view! {
                                        "A catalog image, or one of your own: your team may run " {allowed.clone()} "."
                                        {catalog_link()}
                                    }/>
                                <datalist id="catalog-images">
                                    {images.options.into_iter().map(|i| view! { <option value=i.reference>{i.label}</option> }).collect_view()}
                                </datalist>
                            }.into_any()
                        }
                    }
                })
            }}
        </Transition>
    }
    .into_any()
}
