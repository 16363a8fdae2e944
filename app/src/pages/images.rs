use leptos::prelude::*;
use leptos_meta::Title;

use crate::components::form::{BUTTON, HINT, LABEL, SMALL_BUTTON};
use crate::components::table::{CELL, ROW_HEADER};
use crate::components::{CARD, ConfirmButton, ErrorAlert, Field, RequireUser, SavedNotice, Table};
use crate::model::{ImageView, ImagesView};
use crate::serverfns::{AddImage, RemoveImage, SetCustomImages, SetDefaultImage, images};

/// The image catalog (`/images`, also `/admin/images`): the platform's entries and one's
/// team's, with their CUDA and framework versions and the offerings they suit. Platform
/// admins keep the platform's catalog and set each tenant's rule for custom images; a
/// tenant admin adds the team's own entries. Actions and resource are made outside
/// `RequireUser`.
#[component]
pub fn ImagesPage() -> impl IntoView {
    let add = ServerAction::<AddImage>::new();
    let remove = ServerAction::<RemoveImage>::new();
    let default = ServerAction::<SetDefaultImage>::new();
    let custom = ServerAction::<SetCustomImages>::new();
    let page = Resource::new(
        move || (add.version().get(), remove.version().get(), default.version().get(), custom.version().get()),
        |_| images(),
    );
    let actions = RowActions { remove, default };
    view! {
        <Title text="Images"/>
        <RequireUser>
            <h1 class="text-2xl font-bold tracking-tight text-slate-900">"Images"</h1>
            <SavedNotice/>
            <p class="mt-1 max-w-3xl text-sm text-slate-600">
                "The container images environments run. Notebooks run images from this catalog; training jobs and inference endpoints may also run an image of your own where your team allows it. Each entry is pinned by its digest, so every booking of it runs the same image."
            </p>
            <Transition fallback=|| view! { <p class="text-slate-600">"Loading..."</p> }>
                {move || Suspend::new(async move {
                    match page.await {
                        Ok(page) => view! { <Catalogs page=page.clone() actions/> <AddImageForm page=page.clone() add/> <CustomImagesForm page custom/> }.into_any(),
                        Err(error) => view! { <ErrorAlert error/> }.into_any(),
                    }
                })}
            </Transition>
            {move || remove.value().get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
            {move || default.value().get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
        </RequireUser>
    }
}

#[derive(Clone, Copy)]
struct RowActions {
    remove: ServerAction<RemoveImage>,
    default: ServerAction<SetDefaultImage>,
}

#[component]
fn Catalogs(page: ImagesView, actions: RowActions) -> impl IntoView {
    view! {
        <section class="mt-6" aria-labelledby="platform-images">
            <h2 id="platform-images" class="text-lg font-semibold text-slate-900">"The platform's catalog"</h2>
            <ImageTable label="The platform's images" images=page.platform actions/>
        </section>
        {page.tenants.into_iter().map(|t| {
            let (heading, labelled_by) = (format!("tenant-images-{}", t.tenant_id), format!("tenant-images-{}", t.tenant_id));
            view! {
                <section class="mt-6" aria-labelledby=labelled_by data-tenant-images=t.tenant.clone()>
                    <h2 id=heading class="text-lg font-semibold text-slate-900">"Team " {t.tenant.clone()} "'s images"</h2>
                    <p class="mt-1 text-sm text-slate-600" data-custom-images="">
                        "Besides the catalog, its people may run " <strong>{t.custom.clone()}</strong>
                        " in training jobs and inference endpoints."
                    </p>
                    {if t.images.is_empty() {
                        view! { <p class="mt-2 text-sm text-slate-600">"No images of its own."</p> }.into_any()
                    } else {
                        view! { <ImageTable label="The team's images" images=t.images actions/> }.into_any()
                    }}
                </section>
            }
        }).collect_view()}
    }
}

#[component]
fn ImageTable(label: &'static str, images: Vec<ImageView>, actions: RowActions) -> impl IntoView {
    if images.is_empty() {
        return view! { <p class="mt-2 text-sm text-slate-600">"No images yet."</p> }.into_any();
    }
    let RowActions { remove, default } = actions;
    view! {
        <Table label buttons_column="Actions" columns=&["Name", "Image", "CUDA", "Framework", "Suits", "Default for"]>
            {images.into_iter().map(|i| {
                let id = i.id;
                let remove_aria = format!("Remove {}", i.name);
                view! {
                    <tr data-image=i.name.clone()>
                        <th scope="row" class=ROW_HEADER>
                            {i.name.clone()}
                            {(!i.description.is_empty()).then(|| view! { <span class="block text-xs font-normal text-slate-600">{i.description.clone()}</span> })}
                        </th>
                        <td class=CELL>
                            <code class="break-all text-xs">{i.reference.clone()}</code>
                            {(!i.pinned).then(|| view! {
                                <span class="ml-1 rounded bg-amber-100 px-1.5 py-0.5 text-xs text-amber-900" title="Named by a tag, which may move: add a pinned entry for it">
                                    "not pinned"
                                </span>
                            })}
                        </td>
                        <td class=CELL>{i.cuda.clone()}</td>
                        <td class=CELL>{i.framework.clone()}</td>
                        <td class=CELL>{i.suits.clone()}</td>
                        <td class=CELL data-default-for="">{i.default_for.clone()}</td>
                        <td class="px-4 py-2 text-right">
                            {i.may_manage.then(|| view! {
                                <div class="flex flex-wrap items-center justify-end gap-2">
                                    {i.may_default.clone().into_iter().map(|(offering, title)| view! {
                                        <ActionForm action=default>
                                            <input type="hidden" name="id" value=id/>
                                            <input type="hidden" name="offering" value=offering/>
                                            <button type="submit" class=SMALL_BUTTON>"Default for " {title.to_lowercase()} "s"</button>
                                        </ActionForm>
                                    }).collect_view()}
                                    <ActionForm action=remove>
                                        <input type="hidden" name="id" value=id/>
                                        <ConfirmButton label="Remove" aria_label=remove_aria confirm="Yes, remove"
                                            consequence="New bookings can no longer pick it. Environments running it keep running it."/>
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

/// One form for every catalog the caller may add to (the platform's, a team's).
#[component]
fn AddImageForm(page: ImagesView, add: ServerAction<AddImage>) -> impl IntoView {
    let mut catalogs: Vec<(String, String)> = Vec::new();
    if page.may_manage_platform {
        // Empty: the caller's own catalog, which for platform staff is the platform's.
        catalogs.push((String::new(), "The platform's".to_owned()));
    }
    catalogs.extend(
        page.tenants.iter().filter(|t| t.may_manage).map(|t| (t.tenant_id.to_string(), format!("Team {}", t.tenant))),
    );
    if catalogs.is_empty() {
        return ().into_any();
    }
    let result = add.value();
    let offerings =
        [("notebook", "Jupyter notebooks"), ("training", "Training jobs"), ("inference", "Inference endpoints")];
    view! {
        <section class=CARD aria-labelledby="new-image">
            <h2 id="new-image" class="text-sm font-semibold text-slate-900">"Add an image"</h2>
            <ActionForm action=add attr:class="mt-3 grid gap-3 sm:grid-cols-6">
                <Field id="i-catalog" name="tenant" label="Catalog" class="sm:col-span-2">
                    {catalogs.into_iter().map(|(value, label)| view! { <option value=value>{label}</option> }).collect_view()}
                </Field>
                <Field id="i-name" name="image[name]" label="Name" class="sm:col-span-2" required=true maxlength=60
                    placeholder="PyTorch 2.4"/>
                <Field id="i-cuda" name="image[cuda]" label="CUDA version" maxlength=40 placeholder="12.4"/>
                <Field id="i-framework" name="image[framework]" label="Framework" maxlength=40 placeholder="PyTorch 2.4"/>
                <Field id="i-reference" name="image[reference]" label="Image, pinned by digest" class="sm:col-span-6"
                    required=true monospace=true placeholder="nvcr.io/nvidia/pytorch:24.05-py3@sha256:…"
                    help=|| "Its digest (@sha256:…) names the exact image: find it with `docker buildx imagetools inspect` or `crane digest`."/>
                <Field id="i-description" name="image[description]" label="Description" class="sm:col-span-6" maxlength=500/>
                <fieldset class="sm:col-span-3">
                    <legend class=LABEL>"Suits"</legend>
                    {offerings.iter().enumerate().map(|(index, (id, title))| {
                        let (control, label_for) = (format!("i-suits-{id}"), format!("i-suits-{id}"));
                        view! {
                            <label for=label_for class="mt-1 flex items-center gap-2 text-sm text-slate-700">
                                <input type="checkbox" id=control name=format!("image[offerings][{index}]") value=*id/>
                                {*title}
                            </label>
                        }
                    }).collect_view()}
                </fieldset>
                <fieldset class="sm:col-span-3">
                    <legend class=LABEL>"Default for"</legend>
                    {offerings.iter().enumerate().map(|(index, (id, title))| {
                        let (control, label_for) = (format!("i-default-{id}"), format!("i-default-{id}"));
                        view! {
                            <label for=label_for class="mt-1 flex items-center gap-2 text-sm text-slate-700">
                                <input type="checkbox" id=control name=format!("image[default_for][{index}]") value=*id/>
                                {*title}
                            </label>
                        }
                    }).collect_view()}
                    <p class=HINT>"What a launch gets when it names no image; a team's default comes before the platform's."</p>
                </fieldset>
                <div class="sm:col-span-2">
                    <button type="submit" class=format!("w-full {BUTTON}")>"Add image"</button>
                </div>
            </ActionForm>
            {move || result.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
        </section>
    }
    .into_any()
}

/// A tenant's rule for images besides the catalog's (platform admins).
#[component]
fn CustomImagesForm(page: ImagesView, custom: ServerAction<SetCustomImages>) -> impl IntoView {
    if !page.may_set_custom_images || page.tenants.is_empty() {
        return ().into_any();
    }
    let result = custom.value();
    view! {
        <section class=CARD aria-labelledby="custom-images">
            <h2 id="custom-images" class="text-sm font-semibold text-slate-900">"Custom images per tenant"</h2>
            <p class=HINT>"Which images besides the catalog's a tenant's training jobs and endpoints may run. Notebooks always run catalog images."</p>
            <ActionForm action=custom attr:class="mt-3 grid gap-3 sm:grid-cols-6">
                <Field id="c-tenant" name="tenant_id" label="Tenant" class="sm:col-span-2">
                    {page.tenants.into_iter().map(|t| view! { <option value=t.tenant_id.to_string()>{t.tenant}</option> }).collect_view()}
                </Field>
                <Field id="c-mode" name="mode" label="May run" class="sm:col-span-2">
                    <option value="registries">"Images from these registries"</option>
                    <option value="catalog">"Only catalog images"</option>
                    <option value="any">"Images from any registry"</option>
                </Field>
                <Field id="c-registries" name="registries" label="Registries" class="sm:col-span-2" monospace=true
                    placeholder="ghcr.io, nvcr.io" help=|| "Hosts, separated by commas; only for \"these registries\"."/>
                <div class="sm:col-span-2">
                    <button type="submit" class=format!("w-full {BUTTON}")>"Set the rule"</button>
                </div>
            </ActionForm>
            {move || result.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
        </section>
    }
    .into_any()
}
