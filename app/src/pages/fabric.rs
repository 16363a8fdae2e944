use leptos::prelude::*;
use leptos_meta::Title;

use crate::components::form::{SMALL_BUTTON, SMALL_INPUT};
use crate::components::table::{CELL, ROW_HEADER};
use crate::components::{CARD, ErrorAlert, RequireUser, SavedNotice, Table};
use crate::model::{FabricTenantView, FabricView};
use crate::serverfns::{SetPortGuids, fabric_overview};

/// The identifier cells: a port GUIDs form makes the tenants' rows tall.
const TD: &str = "px-4 py-2 align-top";

/// Platform staff: each hard and hybrid tenant's fabric isolation identifiers, those in
/// quarantine, how full each pool is, the tenants' InfiniBand port GUIDs and the OpenSM
/// partitions.conf that follows from them.
#[component]
pub fn FabricPage() -> impl IntoView {
    let ports = ServerAction::<SetPortGuids>::new();
    let data = Resource::new(move || ports.version().get(), |_| fabric_overview());
    view! {
        <Title text="Fabric"/>
        <RequireUser>
            <h1 class="text-2xl font-bold tracking-tight text-slate-900">"Fabric isolation"</h1>
            <SavedNotice/>
            <p class="mt-1 text-sm text-slate-600">
                "Hard and hybrid tenants each hold a network segment, an InfiniBand P_Key, an NVLink partition and a storage volume. Identifiers come from the pools below; a released one waits out its quarantine before another tenant gets it."
            </p>
            {move || ports.value().get().and_then(Result::err).map(|error| view! { <div class="mt-4"><ErrorAlert error/></div> })}
            <Transition fallback=|| view! { <p class="text-slate-600">"Loading..."</p> }>
                {move || Suspend::new(async move {
                    match data.await {
                        Ok(view) => view! { <Fabric view ports/> }.into_any(),
                        Err(error) => view! { <ErrorAlert error/> }.into_any(),
                    }
                })}
            </Transition>
        </RequireUser>
    }
}

#[component]
fn Fabric(view: FabricView, ports: ServerAction<SetPortGuids>) -> impl IntoView {
    let can_manage = view.can_manage;
    view! {
        <section class=CARD aria-labelledby="fabric-tenants">
            <h2 id="fabric-tenants" class="text-sm font-semibold text-slate-900">
                "Tenants (" {view.segment.clone()} " segments)"
            </h2>
            {if view.tenants.is_empty() {
                view! { <p class="mt-2 text-sm text-slate-600">"No hard or hybrid tenants."</p> }.into_any()
            } else {
                view! {
                    <Table label="Tenant identifiers" columns=&[
                        "Tenant", "Segment", "P_Key", "NVLink partition", "Storage volume", "InfiniBand port GUIDs",
                    ]>
                        {view.tenants.clone().into_iter().map(|tenant| view! { <TenantRow tenant ports can_manage/> }).collect_view()}
                    </Table>
                }.into_any()
            }}
        </section>
        <section class=CARD aria-labelledby="fabric-pools">
            <h2 id="fabric-pools" class="text-sm font-semibold text-slate-900">"Pools"</h2>
            <Table label="Pools" columns=&["Identifier", "Range", "Held", "In quarantine", "Free"]>
                {view.pools.clone().into_iter().map(|p| view! {
                    <tr data-pool=p.what.clone()>
                        <th scope="row" class=ROW_HEADER>{p.what.clone()}</th>
                        <td class=CELL><code>{p.range.clone()}</code></td>
                        <td class=CELL>{p.held}</td>
                        <td class=CELL>{p.quarantined}</td>
                        <td class=CELL>{p.free.clone()} " of " {p.size.clone()}</td>
                    </tr>
                }).collect_view()}
            </Table>
        </section>
        <section class=CARD aria-labelledby="fabric-quarantine">
            <h2 id="fabric-quarantine" class="text-sm font-semibold text-slate-900">
                "In quarantine (" {view.quarantine.clone()} " after release)"
            </h2>
            {if view.quarantined.is_empty() {
                view! { <p class="mt-2 text-sm text-slate-600">"Nothing is in quarantine."</p> }.into_any()
            } else {
                view! {
                    <Table label="Quarantined identifiers" columns=&["Identifier", "Last held by", "Released", "Free again"]>
                        {view.quarantined.clone().into_iter().map(|q| view! {
                            <tr>
                                <th scope="row" class=ROW_HEADER>{q.identifier.clone()}</th>
                                <td class=CELL>{q.tenant.clone()}</td>
                                <td class=CELL>{q.released.clone()}</td>
                                <td class=CELL>{q.free_at.clone()} <span class="ml-1 text-xs text-slate-600">{q.free_in.clone()}</span></td>
                            </tr>
                        }).collect_view()}
                    </Table>
                }.into_any()
            }}
        </section>
        <section class=CARD aria-labelledby="partitions-conf">
            <h2 id="partitions-conf" class="text-sm font-semibold text-slate-900">"OpenSM partitions.conf"</h2>
            <p class="mt-1 text-xs text-slate-600">
                "One partition per tenant holding a P_Key, its ports full members. Add it to the subnet manager's partitions.conf (or a UFM partitions.conf.user_ext)."
            </p>
            <pre tabindex="0" class="mt-3 overflow-x-auto rounded-lg bg-slate-900 p-3 text-xs text-slate-100" data-testid="partitions-conf">{view.partitions_conf.clone()}</pre>
        </section>
    }
}

#[component]
fn TenantRow(tenant: FabricTenantView, ports: ServerAction<SetPortGuids>, can_manage: bool) -> impl IntoView {
    let field = format!("guids-{}", tenant.id);
    let field_label = format!("Port GUIDs of {}", tenant.slug);
    let listed = tenant.port_guids.join("\n");
    let (id, editable, guids) = (tenant.id, can_manage && tenant.has_pkey, tenant.port_guids.clone());
    let dash = |s: String| if s.is_empty() { "—".to_owned() } else { s };
    view! {
        <tr data-tenant=tenant.slug.clone()>
            <th scope="row" class=format!("{ROW_HEADER} align-top")>
                {tenant.name.clone()}
                <span class="ml-2 text-xs text-slate-600">{tenant.slug.clone()} " · " {tenant.isolation.clone()}</span>
            </th>
            <td class=TD data-identifier="segment">{dash(tenant.segment.clone())}</td>
            <td class=TD data-identifier="pkey"><code>{dash(tenant.pkey.clone())}</code></td>
            <td class=TD data-identifier="nvlink">{dash(tenant.nvlink.clone())}</td>
            <td class=TD data-identifier="volume">{dash(tenant.volume.clone())}</td>
            <td class=TD>
                {if editable {
                    view! {
                        <ActionForm action=ports attr:class="flex flex-col gap-1">
                            <input type="hidden" name="tenant_id" value=id/>
                            <label class="sr-only" for=field.clone()>{field_label}</label>
                            <textarea id=field name="guids" rows="3" placeholder="0x0002c9030001e3f1"
                                class=format!("w-64 {SMALL_INPUT} font-mono")>{listed}</textarea>
                            <button type="submit" class=format!("self-start {SMALL_BUTTON}")>"Save ports"</button>
                        </ActionForm>
                    }.into_any()
                } else if guids.is_empty() {
                    view! { <span class="text-slate-600">"none"</span> }.into_any()
                } else {
                    view! {
                        <ul class="font-mono text-xs">
                            {guids.into_iter().map(|g| view! { <li>{g}</li> }).collect_view()}
                        </ul>
                    }.into_any()
                }}
            </td>
        </tr>
    }
}
