use leptos::prelude::*;
use leptos_meta::Title;

use crate::components::form::{BUTTON, SMALL_BUTTON, SMALL_INPUT};
use crate::components::table::{CELL, ROW_HEADER};
use crate::components::{CARD, ConfirmButton, ErrorAlert, Field, FieldErrors, RequireUser, Table};
use crate::model::{VolumeView, VolumesView};
use crate::serverfns::{CreateVolume, DeleteVolume, ResizeVolume, volumes};

/// Volumes: storage that outlives a booking. Make one (personal, or shared with a
/// project), see its size, use and where it is attached since when, grow it, delete it
/// once nothing has it attached. Its actions and resource are made outside `RequireUser`.
#[component]
pub fn VolumesPage() -> impl IntoView {
    let create = ServerAction::<CreateVolume>::new();
    let resize = ServerAction::<ResizeVolume>::new();
    let delete = ServerAction::<DeleteVolume>::new();
    let page =
        Resource::new(move || (create.version().get(), resize.version().get(), delete.version().get()), |_| volumes());
    view! {
        <Title text="Volumes"/>
        <RequireUser>
            <h1 class="text-2xl font-bold tracking-tight text-slate-900">"Volumes"</h1>
            <p class="mt-1 max-w-3xl text-sm text-slate-600">
                "Files on a volume outlive the booking that wrote them. Your home volume is mounted at /home/jovyan/work in every notebook you launch (it is made on your first launch); other volumes at /data/<name> when you pick them on the launch form. A project's volumes are shared with everyone who books in the project."
            </p>
            <Transition fallback=|| view! { <p class="text-slate-600">"Loading..."</p> }>
                {move || Suspend::new(async move {
                    match page.await {
                        Ok(page) => view! {
                            {page.size_rule.clone().map(|rule| view! { <p class="mt-1 max-w-3xl text-sm text-slate-600" data-size-rule="">{rule}</p> })}
                            <VolumeTable page=page.clone() resize delete/>
                            <CreateVolumeForm page create/>
                        }.into_any(),
                        Err(error) => view! { <ErrorAlert error/> }.into_any(),
                    }
                })}
            </Transition>
            {move || resize.value().get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
            {move || delete.value().get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
        </RequireUser>
    }
}

#[component]
fn CreateVolumeForm(page: VolumesView, create: ServerAction<CreateVolume>) -> impl IntoView {
    if !page.can_manage {
        return ().into_any();
    }
    let result = create.value();
    FieldErrors::of(create);
    view! {
        <section class=CARD aria-labelledby="new-volume">
            <h2 id="new-volume" class="text-sm font-semibold text-slate-900">"New volume"</h2>
            <ActionForm action=create attr:class="mt-3 grid gap-3 sm:grid-cols-6">
                <Field id="v-name" name="name" label="Name" class="sm:col-span-2" required=true maxlength=63
                    placeholder="datasets" help=|| "Lowercase letters, digits and hyphens; it is mounted at /data/<name>."/>
                <Field id="v-size" name="size_gib" label="Size (GiB)" input_type="number" min=1 required=true value="10"/>
                <Field id="v-project" name="project" label="Shared with" class="sm:col-span-2">
                    <option value="">"Nobody (personal)"</option>
                    {page.projects.into_iter().map(|p| view! { <option value=p.id.to_string()>"Project " {p.name}</option> }).collect_view()}
                </Field>
                <div class="flex items-end">
                    <button type="submit" class=format!("w-full {BUTTON}")>"Create volume"</button>
                </div>
            </ActionForm>
            {move || result.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
        </section>
    }
    .into_any()
}

#[component]
fn VolumeTable(
    page: VolumesView,
    resize: ServerAction<ResizeVolume>,
    delete: ServerAction<DeleteVolume>,
) -> impl IntoView {
    if page.volumes.is_empty() {
        return view! {
            <p class="mt-4 text-sm text-slate-600">"No volumes yet. Your home volume is made on your first launch."</p>
        }
        .into_any();
    }
    let can_manage = page.can_manage;
    view! {
        <Table label="Volumes" buttons_column="Actions" columns=&[
            "Name", "Shared", "Owner", "Size", "Used", "Mounted at", "Attached to", "Kept at",
        ]>
            {page.volumes.into_iter().map(|v: VolumeView| {
                let attached = v.attachments.clone();
                let (id, size) = (v.id, v.size_gib);
                let grow_label = format!("New size of {} (GiB)", v.name);
                let grow_aria = format!("Grow {}", v.name);
                let delete_aria = format!("Delete {}", v.name);
                view! {
                    <tr data-volume=v.name.clone()>
                        <th scope="row" class=ROW_HEADER>{v.name.clone()}</th>
                        <td class=CELL>{v.scope.clone()}</td>
                        <td class=CELL>{v.owner.clone()}</td>
                        <td class=CELL data-size="">{v.size_gib} " GiB"</td>
                        <td class=CELL>{v.used.clone()}</td>
                        <td class=CELL><code class="text-xs">{v.mount_path.clone()}</code></td>
                        <td class=CELL data-attached="">
                            {if attached.is_empty() {
                                view! { <span class="text-slate-600">"nothing"</span> }.into_any()
                            } else {
                                attached.into_iter().map(|a| view! {
                                    <span class="block">
                                        <a class="text-indigo-600 hover:text-indigo-500" href=format!("/environments/{}", a.environment_id)>
                                            {a.environment_name}
                                        </a>
                                        " since " {a.since}
                                    </span>
                                }).collect_view().into_any()
                            }}
                        </td>
                        <td class=CELL><code class="break-all text-xs">{v.location.clone()}</code></td>
                        <td class="px-4 py-2 text-right">
                            {can_manage.then(|| view! {
                                <div class="flex items-center justify-end gap-2">
                                    <ActionForm action=resize attr:class="flex items-center gap-1">
                                        <input type="hidden" name="id" value=id/>
                                        <label class="sr-only" for=format!("grow-{id}")>{grow_label}</label>
                                        <input id=format!("grow-{id}") name="size_gib" type="number" min=size + 1
                                            class=format!("w-20 {SMALL_INPUT}") placeholder=(size + 1).to_string()/>
                                        <button type="submit" class=SMALL_BUTTON aria-label=grow_aria>"Grow"</button>
                                    </ActionForm>
                                    <ActionForm action=delete>
                                        <input type="hidden" name="id" value=id/>
                                        <ConfirmButton label="Delete" aria_label=delete_aria confirm="Yes, delete"
                                            consequence="Its files are deleted for good. A volume that is attached cannot be deleted: stop its environments first."/>
                                    </ActionForm>
                                </div>
                            })}
                        </td>
                    </tr>
                }
            }).collect_view()}
        </Table>
    }
    .into_any()
}
