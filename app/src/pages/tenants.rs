use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_params_map;

use crate::components::{ErrorAlert, RequireUser};
use crate::model::{MemberView, ProjectView, SsoView, TenantPageView, TenantView, TokenView};
use crate::serverfns::{
    AddProjectMember, ChangeMemberRole, ChangeTenant, CreateProject, CreateTenant, InviteMember, RemoveMember,
    RevokeTenantToken, SaveSso, SetTenantIsolation, tenant_detail, tenants_overview,
};

const INPUT: &str = "mt-1 block w-full rounded-lg border border-slate-300 px-3 py-1.5 text-sm focus:border-indigo-500 focus:outline-none focus:ring-1 focus:ring-indigo-500";
const LABEL: &str = "block text-xs font-medium text-slate-600";
const BUTTON: &str = "rounded-lg bg-indigo-600 px-4 py-2 text-sm font-semibold text-white hover:bg-indigo-500";
const SMALL_BUTTON: &str =
    "rounded-md px-2 py-1 text-xs font-medium ring-1 ring-inset ring-slate-300 hover:bg-slate-50";
const CARD: &str = "mt-6 rounded-xl border border-slate-200 bg-white p-4 shadow-sm";

/// Platform admins: every tenant, with its isolation and state; create, suspend, resume,
/// delete.
#[component]
pub fn TenantsPage() -> impl IntoView {
    let create = ServerAction::<CreateTenant>::new();
    let change = ServerAction::<ChangeTenant>::new();
    let isolation = ServerAction::<SetTenantIsolation>::new();
    let tenants = Resource::new(
        move || (create.version().get(), change.version().get(), isolation.version().get()),
        |_| tenants_overview(),
    );
    let errors = move || {
        [
            create.value().get().and_then(Result::err),
            change.value().get().and_then(Result::err),
            isolation.value().get().and_then(Result::err),
        ]
        .into_iter()
        .flatten()
        .next()
    };
    view! {
        <Title text="Tenants"/>
        <RequireUser>
            <h1 class="text-2xl font-bold tracking-tight text-slate-900">"Tenants"</h1>
            <p class="mt-1 text-sm text-slate-600">
                "Each tenant is an organisation sharing the fleet. Soft isolation keeps tenants apart with namespaces, quotas and network policies; hard isolation gives them dedicated nodes and fabric identifiers; hybrid is hard toward other tenants with soft projects inside."
            </p>
            {move || errors().map(|error| view! { <div class="mt-4"><ErrorAlert error/></div> })}
            <Transition fallback=|| view! { <p class="text-slate-500">"Loading..."</p> }>
                {move || Suspend::new(async move {
                    match tenants.await {
                        Ok(rows) => view! { <TenantTable rows change isolation/> }.into_any(),
                        Err(error) => view! { <ErrorAlert error/> }.into_any(),
                    }
                })}
            </Transition>
            <section class=CARD aria-labelledby="new-tenant">
                <h2 id="new-tenant" class="text-sm font-semibold text-slate-900">"New tenant"</h2>
                <ActionForm action=create attr:class="mt-3 grid gap-3 sm:grid-cols-5">
                    <div>
                        <label for="t-slug" class=LABEL>"Short name"</label>
                        <input id="t-slug" name="slug" required class=INPUT placeholder="acme"/>
                    </div>
                    <div class="sm:col-span-2">
                        <label for="t-name" class=LABEL>"Name"</label>
                        <input id="t-name" name="name" required class=INPUT placeholder="Acme Research"/>
                    </div>
                    <div>
                        <label for="t-isolation" class=LABEL>"Isolation"</label>
                        <select id="t-isolation" name="isolation" class=INPUT>
                            <option value="soft">"Soft"</option>
                            <option value="hard">"Hard"</option>
                            <option value="hybrid">"Hybrid"</option>
                        </select>
                    </div>
                    <div>
                        <label for="t-admin" class=LABEL>"First tenant admin (email)"</label>
                        <input id="t-admin" name="first_admin" type="email" class=INPUT/>
                    </div>
                    <div><button type="submit" class=BUTTON>"Create tenant"</button></div>
                </ActionForm>
            </section>
        </RequireUser>
    }
}

#[component]
fn TenantTable(
    rows: Vec<TenantView>,
    change: ServerAction<ChangeTenant>,
    isolation: ServerAction<SetTenantIsolation>,
) -> impl IntoView {
    if rows.is_empty() {
        return view! { <p class="mt-4 text-sm text-slate-500">"No tenants yet."</p> }.into_any();
    }
    view! {
        <div class="mt-4 overflow-x-auto rounded-xl border border-slate-200 bg-white shadow-sm">
            <table class="min-w-full divide-y divide-slate-200 text-sm" aria-label="Tenants">
                <thead class="bg-slate-50 text-left text-xs font-medium text-slate-500">
                    <tr>
                        <th scope="col" class="px-4 py-2">"Tenant"</th>
                        <th scope="col" class="px-4 py-2">"Isolation"</th>
                        <th scope="col" class="px-4 py-2">"State"</th>
                        <th scope="col" class="px-4 py-2">"Members"</th>
                        <th scope="col" class="px-4 py-2">"Active environments"</th>
                        <th scope="col" class="px-4 py-2"><span class="sr-only">"Actions"</span></th>
                    </tr>
                </thead>
                <tbody class="divide-y divide-slate-100">
                    {rows.into_iter().map(|t| {
                        let suspended = t.status == "suspended";
                        view! {
                            <tr data-tenant=t.slug.clone()>
                                <th scope="row" class="px-4 py-2 text-left font-medium">
                                    <a href=format!("/tenants/{}", t.id) class="text-indigo-600 hover:text-indigo-500">{t.name.clone()}</a>
                                    <span class="ml-2 text-xs text-slate-500">{t.slug.clone()}</span>
                                    {t.queue_failure.clone().map(|failure| view! {
                                        <p data-queue-failure="" class="mt-1 max-w-md text-xs font-normal text-red-700">{failure}</p>
                                    })}
                                </th>
                                <td class="px-4 py-2">
                                    <ActionForm action=isolation attr:class="flex items-center gap-1">
                                        <input type="hidden" name="id" value=t.id/>
                                        <label class="sr-only" for=format!("iso-{}", t.id)>"Isolation"</label>
                                        <select id=format!("iso-{}", t.id) name="isolation" class="rounded border border-slate-300 px-1 py-0.5 text-xs">
                                            {["soft", "hard", "hybrid"].into_iter().map(|mode| view! {
                                                <option value=mode selected=mode == t.isolation>{mode}</option>
                                            }).collect_view()}
                                        </select>
                                        <button type="submit" class=SMALL_BUTTON>"Set"</button>
                                    </ActionForm>
                                </td>
                                <td class="px-4 py-2" data-status=t.status.clone()>{t.status.clone()}</td>
                                <td class="px-4 py-2">{t.members}</td>
                                <td class="px-4 py-2">{t.active_environments}</td>
                                <td class="px-4 py-2">
                                    <div class="flex gap-2">
                                        <ActionForm action=change>
                                            <input type="hidden" name="id" value=t.id/>
                                            <input type="hidden" name="change" value=if suspended { "resume" } else { "suspend" }/>
                                            <button type="submit" class=SMALL_BUTTON>{if suspended { "Resume" } else { "Suspend" }}</button>
                                        </ActionForm>
                                        <ActionForm action=change>
                                            <input type="hidden" name="id" value=t.id/>
                                            <input type="hidden" name="change" value="delete"/>
                                            <button type="submit" class="rounded-md px-2 py-1 text-xs font-medium text-red-700 ring-1 ring-inset ring-red-300 hover:bg-red-50"
                                                title="Stops every environment of the tenant and ends its members' sessions">
                                                "Delete"
                                            </button>
                                        </ActionForm>
                                    </div>
                                </td>
                            </tr>
                        }
                    }).collect_view()}
                </tbody>
            </table>
        </div>
    }
    .into_any()
}

/// One tenant: members and their roles, projects, and the single sign-on connection.
/// Tenant admins manage them; members and viewers read.
#[component]
pub fn TenantPage() -> impl IntoView {
    let params = use_params_map();
    let id = move || params.read().get("id").and_then(|id| id.parse::<i64>().ok()).unwrap_or(-1);
    let actions = TenantActions::new();
    let detail = Resource::new(move || (id(), actions.version()), |(id, _)| tenant_detail(id));
    view! {
        <Title text="Team"/>
        <RequireUser>
            {move || actions.error().map(|error| view! { <div class="mb-4"><ErrorAlert error/></div> })}
            <Transition fallback=|| view! { <p class="text-slate-500">"Loading..."</p> }>
                {move || Suspend::new(async move {
                    match detail.await {
                        Ok(page) => view! { <TenantBody page actions/> }.into_any(),
                        Err(error) => view! { <ErrorAlert error/> }.into_any(),
                    }
                })}
            </Transition>
        </RequireUser>
    }
}

/// The page's forms, so one place knows when to reload and which error to show.
#[derive(Clone, Copy)]
struct TenantActions {
    invite: ServerAction<InviteMember>,
    role: ServerAction<ChangeMemberRole>,
    remove: ServerAction<RemoveMember>,
    project: ServerAction<CreateProject>,
    project_member: ServerAction<AddProjectMember>,
    sso: ServerAction<SaveSso>,
    revoke: ServerAction<RevokeTenantToken>,
}

impl TenantActions {
    fn new() -> TenantActions {
        TenantActions {
            invite: ServerAction::new(),
            role: ServerAction::new(),
            remove: ServerAction::new(),
            project: ServerAction::new(),
            project_member: ServerAction::new(),
            sso: ServerAction::new(),
            revoke: ServerAction::new(),
        }
    }

    fn version(&self) -> usize {
        self.invite.version().get()
            + self.role.version().get()
            + self.remove.version().get()
            + self.project.version().get()
            + self.project_member.version().get()
            + self.sso.version().get()
            + self.revoke.version().get()
    }

    fn error(&self) -> Option<crate::error::AppError> {
        [
            self.invite.value().get().and_then(Result::err),
            self.role.value().get().and_then(Result::err),
            self.remove.value().get().and_then(Result::err),
            self.project.value().get().and_then(Result::err),
            self.project_member.value().get().and_then(Result::err),
            self.sso.value().get().and_then(Result::err),
            self.revoke.value().get().and_then(Result::err),
        ]
        .into_iter()
        .flatten()
        .next()
    }
}

#[component]
fn TenantBody(page: TenantPageView, actions: TenantActions) -> impl IntoView {
    let tenant_id = page.tenant.id;
    view! {
        <div class="flex items-baseline justify-between">
            <h1 class="text-2xl font-bold tracking-tight text-slate-900">{page.tenant.name.clone()}</h1>
            <span class="text-sm text-slate-500">
                {format!("{} isolation · {}", page.tenant.isolation, page.tenant.status)}
            </span>
        </div>
        <Members members=page.members.clone() manage=page.can_manage_members me=page.me tenant_id actions/>
        <Projects projects=page.projects.clone() manage=page.can_manage_projects tenant_id actions/>
        {page.sso.clone().map(|sso| view! { <Sso sso manage=page.can_manage_sso tenant_id actions/> })}
        {page.tokens.clone().map(|tokens| view! { <TenantTokens tokens manage=page.can_manage_tokens tenant_id actions/> })}
    }
}

#[component]
fn Members(members: Vec<MemberView>, manage: bool, me: i64, tenant_id: i64, actions: TenantActions) -> impl IntoView {
    view! {
        <section class=CARD aria-labelledby="members">
            <h2 id="members" class="text-sm font-semibold text-slate-900">"Members"</h2>
            <table class="mt-3 min-w-full divide-y divide-slate-200 text-sm" aria-label="Members">
                <thead class="text-left text-xs font-medium text-slate-500">
                    <tr>
                        <th scope="col" class="py-2 pr-4">"Person"</th>
                        <th scope="col" class="py-2 pr-4">"Role"</th>
                        <th scope="col" class="py-2 pr-4">"Signed in through SSO"</th>
                        <th scope="col" class="py-2"><span class="sr-only">"Actions"</span></th>
                    </tr>
                </thead>
                <tbody class="divide-y divide-slate-100">
                    {members.into_iter().map(|m| {
                        let editable = manage && m.user_id != me;
                        view! {
                            <tr data-member=m.email.clone()>
                                <th scope="row" class="py-2 pr-4 text-left font-normal">
                                    <span class="font-medium text-slate-900">{m.name.clone()}</span>
                                    <span class="ml-2 text-xs text-slate-500">{m.email.clone()}</span>
                                </th>
                                <td class="py-2 pr-4">
                                    {if editable {
                                        view! {
                                            <ActionForm action=actions.role attr:class="flex items-center gap-1">
                                                <input type="hidden" name="tenant_id" value=tenant_id/>
                                                <input type="hidden" name="user_id" value=m.user_id/>
                                                <label class="sr-only" for=format!("role-{}", m.user_id)>"Role"</label>
                                                <select id=format!("role-{}", m.user_id) name="role" class="rounded border border-slate-300 px-1 py-0.5 text-xs">
                                                    <RoleOptions selected=m.role.clone()/>
                                                </select>
                                                <button type="submit" class=SMALL_BUTTON>"Change"</button>
                                            </ActionForm>
                                        }.into_any()
                                    } else {
                                        view! { <span data-role=m.role.clone()>{m.role_label.clone()}</span> }.into_any()
                                    }}
                                </td>
                                <td class="py-2 pr-4">{if m.linked { "yes" } else { "not yet" }}</td>
                                <td class="py-2">
                                    {editable.then(|| view! {
                                        <ActionForm action=actions.remove>
                                            <input type="hidden" name="tenant_id" value=tenant_id/>
                                            <input type="hidden" name="user_id" value=m.user_id/>
                                            <button type="submit" class="rounded-md px-2 py-1 text-xs font-medium text-red-700 ring-1 ring-inset ring-red-300 hover:bg-red-50">"Remove"</button>
                                        </ActionForm>
                                    })}
                                </td>
                            </tr>
                        }
                    }).collect_view()}
                </tbody>
            </table>
            {manage.then(|| view! {
                <ActionForm action=actions.invite attr:class="mt-4 grid gap-3 sm:grid-cols-4">
                    <input type="hidden" name="tenant_id" value=tenant_id/>
                    <div class="sm:col-span-2">
                        <label for="invite-email" class=LABEL>"Invite by email"</label>
                        <input id="invite-email" name="email" type="email" required class=INPUT placeholder="ada@example.com"/>
                    </div>
                    <div>
                        <label for="invite-role" class=LABEL>"Role"</label>
                        <select id="invite-role" name="role" class=INPUT><RoleOptions selected="member".to_owned()/></select>
                    </div>
                    <div class="flex items-end"><button type="submit" class=BUTTON>"Invite"</button></div>
                    <p class="text-xs text-slate-500 sm:col-span-4">
                        "They sign in with your company's SSO; the invitation is linked at their first sign-in with this (verified) email."
                    </p>
                </ActionForm>
            })}
        </section>
    }
}

#[component]
fn RoleOptions(selected: String) -> impl IntoView {
    [("tenant_admin", "Tenant admin"), ("member", "Member"), ("viewer", "Viewer")]
        .into_iter()
        .map(|(value, label)| view! { <option value=value selected=value == selected>{label}</option> })
        .collect_view()
}

#[component]
fn Projects(projects: Vec<ProjectView>, manage: bool, tenant_id: i64, actions: TenantActions) -> impl IntoView {
    view! {
        <section class=CARD aria-labelledby="projects">
            <h2 id="projects" class="text-sm font-semibold text-slate-900">"Projects"</h2>
            {if projects.is_empty() {
                view! { <p class="mt-2 text-sm text-slate-500">"No projects yet."</p> }.into_any()
            } else {
                view! {
                    <ul class="mt-2 divide-y divide-slate-100 text-sm">
                        {projects.into_iter().map(|p| view! {
                            <li class="flex flex-wrap items-center justify-between gap-2 py-2" data-project=p.name.clone()>
                                <div>
                                    <span class="font-medium text-slate-900">{p.name.clone()}</span>
                                    <span class="ml-2 text-xs text-slate-500">
                                        {if p.members.is_empty() { "no members".to_owned() } else { p.members.join(", ") }}
                                    </span>
                                </div>
                                {manage.then(|| view! {
                                    <ActionForm action=actions.project_member attr:class="flex items-center gap-1">
                                        <input type="hidden" name="tenant_id" value=tenant_id/>
                                        <input type="hidden" name="project_id" value=p.id/>
                                        <label class="sr-only" for=format!("pm-{}", p.id)>"Member email"</label>
                                        <input id=format!("pm-{}", p.id) name="email" type="email" required placeholder="member email"
                                            class="rounded border border-slate-300 px-2 py-0.5 text-xs"/>
                                        <button type="submit" class=SMALL_BUTTON>"Add"</button>
                                    </ActionForm>
                                })}
                            </li>
                        }).collect_view()}
                    </ul>
                }.into_any()
            }}
            {manage.then(|| view! {
                <ActionForm action=actions.project attr:class="mt-3 flex items-end gap-2">
                    <input type="hidden" name="tenant_id" value=tenant_id/>
                    <div>
                        <label for="project-name" class=LABEL>"New project"</label>
                        <input id="project-name" name="name" required class=INPUT/>
                    </div>
                    <button type="submit" class=BUTTON>"Create"</button>
                </ActionForm>
            })}
        </section>
    }
}

#[component]
fn Sso(sso: SsoView, manage: bool, tenant_id: i64, actions: TenantActions) -> impl IntoView {
    let configured = !sso.issuer.is_empty();
    view! {
        <section class=CARD aria-labelledby="sso">
            <h2 id="sso" class="text-sm font-semibold text-slate-900">"Single sign-on (OpenID Connect)"</h2>
            <p class="mt-1 text-xs text-slate-600">
                "Register Berth at your identity provider as a web application with this redirect URI: "
                <code class="rounded bg-slate-100 px-1" data-testid="redirect-uri">{sso.redirect_uri.clone()}</code>
                ". Scopes: openid email profile (and groups where the provider has it)."
            </p>
            {sso.sign_in_link.clone().map(|link| view! {
                <p class="mt-1 text-xs text-slate-600">
                    "People sign in with their work email (in the allowed domains) or the organization name "
                    <code class="rounded bg-slate-100 px-1" data-testid="organization">{sso.organization.clone()}</code>
                    " on the sign-in page, or straight from this link: "
                    <code class="rounded bg-slate-100 px-1 break-all" data-testid="sign-in-link">{link}</code>
                    ". The sign-in page lists no tenant by name."
                </p>
            })}
            {if manage {
                view! {
                    <ActionForm action=actions.sso attr:class="mt-3 grid gap-3 sm:grid-cols-2">
                        <input type="hidden" name="tenant_id" value=tenant_id/>
                        <div>
                            <label for="sso-name" class=LABEL>"Button label (\"Sign in with ...\")"</label>
                            <input id="sso-name" name="display_name" required class=INPUT value=sso.display_name.clone() placeholder="Acme SSO"/>
                        </div>
                        <div>
                            <label for="sso-issuer" class=LABEL>"Issuer URL"</label>
                            <input id="sso-issuer" name="issuer" required class=INPUT value=sso.issuer.clone() placeholder="https://login.example.com/realms/acme"/>
                        </div>
                        <div>
                            <label for="sso-client" class=LABEL>"Client id"</label>
                            <input id="sso-client" name="client_id" required class=INPUT value=sso.client_id.clone()/>
                        </div>
                        <div>
                            <label for="sso-secret" class=LABEL>
                                {if sso.has_secret { "Client secret (stored; leave empty to keep it)" } else { "Client secret" }}
                            </label>
                            <input id="sso-secret" name="client_secret" type="password" autocomplete="off" class=INPUT/>
                        </div>
                        <div>
                            <label for="sso-claim" class=LABEL>"Group claim"</label>
                            <input id="sso-claim" name="groups_claim" class=INPUT value=sso.groups_claim.clone()/>
                        </div>
                        <div>
                            <label for="sso-domains" class=LABEL>"Allowed email domains (empty: any)"</label>
                            <input id="sso-domains" name="allowed_domains" class=INPUT value=sso.allowed_domains.clone() placeholder="acme.example"/>
                        </div>
                        <div class="sm:col-span-2">
                            <label for="sso-groups" class=LABEL>"Group to role, one per line: group = tenant_admin | member | viewer"</label>
                            <textarea id="sso-groups" name="group_roles" rows="4" class=INPUT placeholder="ml-admins = tenant_admin\nml-team = member">
                                {sso.group_roles.clone()}
                            </textarea>
                        </div>
                        <label class="flex items-center gap-2 text-xs text-slate-700">
                            <input type="checkbox" name="enabled" value="yes" checked=sso.enabled || !configured/>
                            "Offer this sign-in on the sign-in page"
                        </label>
                        <div class="flex justify-end"><button type="submit" class=BUTTON>"Save connection"</button></div>
                    </ActionForm>
                }.into_any()
            } else if configured {
                view! {
                    <dl class="mt-3 grid gap-2 text-sm sm:grid-cols-2">
                        <div><dt class=LABEL>"Issuer"</dt><dd>{sso.issuer.clone()}</dd></div>
                        <div><dt class=LABEL>"Client id"</dt><dd>{sso.client_id.clone()}</dd></div>
                        <div class="sm:col-span-2"><dt class=LABEL>"Group mappings"</dt><dd><pre class="text-xs">{sso.group_roles.clone()}</pre></dd></div>
                    </dl>
                }.into_any()
            } else {
                view! { <p class="mt-2 text-sm text-slate-500">"Not configured."</p> }.into_any()
            }}
        </section>
    }
}

/// Every member's API tokens; a tenant admin revokes any of them at once.
#[component]
fn TenantTokens(tokens: Vec<TokenView>, manage: bool, tenant_id: i64, actions: TenantActions) -> impl IntoView {
    view! {
        <section class=CARD aria-labelledby="tenant-tokens">
            <h2 id="tenant-tokens" class="text-sm font-semibold text-slate-900">"API tokens of the tenant's members"</h2>
            {if tokens.is_empty() {
                view! { <p class="mt-2 text-sm text-slate-500">"No tokens."</p> }.into_any()
            } else {
                view! {
                    <table class="mt-3 min-w-full divide-y divide-slate-200 text-sm" aria-label="Tenant tokens">
                        <thead class="text-left text-xs font-medium text-slate-500">
                            <tr>
                                <th scope="col" class="py-2 pr-4">"Owner"</th>
                                <th scope="col" class="py-2 pr-4">"Name"</th>
                                <th scope="col" class="py-2 pr-4">"Expires"</th>
                                <th scope="col" class="py-2 pr-4">"Last used"</th>
                                <th scope="col" class="py-2 pr-4">"State"</th>
                                <th scope="col" class="py-2"><span class="sr-only">"Actions"</span></th>
                            </tr>
                        </thead>
                        <tbody class="divide-y divide-slate-100">
                            {tokens.into_iter().map(|t| {
                                let active = t.status == "active";
                                view! {
                                    <tr data-token=t.name.clone()>
                                        <td class="py-2 pr-4">{t.owner.clone()}</td>
                                        <td class="py-2 pr-4" title=t.action_names.clone()>{t.name.clone()}</td>
                                        <td class="py-2 pr-4">{t.expires.clone()}</td>
                                        <td class="py-2 pr-4">{t.last_used.clone()}</td>
                                        <td class="py-2 pr-4" data-status=t.status.clone()>{t.status.clone()}</td>
                                        <td class="py-2">
                                            {(manage && active).then(|| view! {
                                                <ActionForm action=actions.revoke>
                                                    <input type="hidden" name="tenant_id" value=tenant_id/>
                                                    <input type="hidden" name="id" value=t.id/>
                                                    <button type="submit" class="rounded-md px-2 py-1 text-xs font-medium text-red-700 ring-1 ring-inset ring-red-300 hover:bg-red-50">"Revoke"</button>
                                                </ActionForm>
                                            })}
                                        </td>
                                    </tr>
                                }
                            }).collect_view()}
                        </tbody>
                    </table>
                }.into_any()
            }}
        </section>
    }
}
