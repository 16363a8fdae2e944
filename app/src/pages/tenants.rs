use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_params_map;

use crate::components::form::{BUTTON, LABEL, SMALL_BUTTON, SMALL_INPUT};
use crate::components::table::{CELL, ROW_HEADER};
use crate::components::{CARD, ConfirmButton, ErrorAlert, Field, FieldsOf, RequireUser, SavedNotice, Table};
use crate::model::{
    MemberView, NewWebhookView, ProjectView, SsoView, TenantPageView, TenantView, TokenView, WebhooksView,
};
use crate::serverfns::{
    AddProjectMember, AddWebhook, ChangeMemberRole, ChangeTenant, CreateProject, CreateTenant, InviteMember,
    RemoveMember, RemoveWebhook, RevokeTenantToken, SaveSso, SetTenantIsolation, tenant_detail, tenant_webhooks,
    tenants_overview,
};

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
            <SavedNotice/>
            <p class="mt-1 text-sm text-slate-600">
                "Each tenant is an organisation sharing the fleet. Soft isolation keeps tenants apart with namespaces, quotas and network policies; hard isolation gives them dedicated nodes and fabric identifiers; hybrid is hard toward other tenants with soft projects inside."
            </p>
            {move || errors().map(|error| view! { <div class="mt-4"><ErrorAlert error/></div> })}
            <Transition fallback=|| view! { <p class="text-slate-600">"Loading..."</p> }>
                {move || Suspend::new(async move {
                    match tenants.await {
                        Ok(rows) => view! { <TenantTable rows change isolation/> }.into_any(),
                        Err(error) => view! { <ErrorAlert error/> }.into_any(),
                    }
                })}
            </Transition>
            <section class=CARD aria-labelledby="new-tenant">
                <h2 id="new-tenant" class="text-sm font-semibold text-slate-900">"New tenant"</h2>
                <FieldsOf action=create>
                <ActionForm action=create attr:class="mt-3 grid gap-3 sm:grid-cols-5">
                    <Field id="t-slug" name="slug" label="Short name" required=true placeholder="acme"/>
                    <Field id="t-name" name="name" label="Name" required=true placeholder="Acme Research" class="sm:col-span-2"/>
                    <Field id="t-isolation" name="isolation" label="Isolation">
                        <option value="soft">"Soft"</option>
                        <option value="hard">"Hard"</option>
                        <option value="hybrid">"Hybrid"</option>
                    </Field>
                    <Field id="t-admin" name="first_admin" label="First tenant admin (email)" input_type="email"/>
                    <div><button type="submit" class=BUTTON>"Create tenant"</button></div>
                </ActionForm>
                </FieldsOf>
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
        return view! { <p class="mt-4 text-sm text-slate-600">"No tenants yet."</p> }.into_any();
    }
    view! {
        <Table label="Tenants" columns=&["Tenant", "Isolation", "State", "Members", "Active environments"] buttons_column="Actions">
            {rows.into_iter().map(|t| {
                let suspended = t.status == "suspended";
                view! {
                    <tr data-tenant=t.slug.clone()>
                        <th scope="row" class=ROW_HEADER>
                            <a href=format!("/tenants/{}", t.id) class="text-indigo-600 hover:text-indigo-500">{t.name.clone()}</a>
                            <span class="ml-2 text-xs text-slate-600">{t.slug.clone()}</span>
                            {t.queue_failure.clone().map(|failure| view! {
                                <p data-queue-failure="" class="mt-1 max-w-md text-xs font-normal text-red-700">{failure}</p>
                            })}
                        </th>
                        <td class=CELL>
                            <ActionForm action=isolation attr:class="flex items-center gap-1">
                                <input type="hidden" name="id" value=t.id/>
                                <label class="sr-only" for=format!("iso-{}", t.id)>"Isolation"</label>
                                <select id=format!("iso-{}", t.id) name="isolation" class=SMALL_INPUT>
                                    {["soft", "hard", "hybrid"].into_iter().map(|mode| view! {
                                        <option value=mode selected=mode == t.isolation>{mode}</option>
                                    }).collect_view()}
                                </select>
                                <button type="submit" class=SMALL_BUTTON>"Set"</button>
                            </ActionForm>
                        </td>
                        <td class=CELL data-status=t.status.clone()>{t.status.clone()}</td>
                        <td class=CELL>{t.members}</td>
                        <td class=CELL>{t.active_environments}</td>
                        <td class=CELL>
                            <div class="flex gap-2">
                                <ActionForm action=change>
                                    <input type="hidden" name="id" value=t.id/>
                                    <input type="hidden" name="change" value=if suspended { "resume" } else { "suspend" }/>
                                    <button type="submit" class=SMALL_BUTTON>{if suspended { "Resume" } else { "Suspend" }}</button>
                                </ActionForm>
                                <ActionForm action=change>
                                    <input type="hidden" name="id" value=t.id/>
                                    <input type="hidden" name="change" value="delete"/>
                                    <ConfirmButton label="Delete" confirm="Yes, delete the tenant"
                                        consequence="Stops every environment of the tenant, releases its capacity and ends its members' sessions."/>
                                </ActionForm>
                            </div>
                        </td>
                    </tr>
                }
            }).collect_view()}
        </Table>
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
            <Transition fallback=|| view! { <p class="text-slate-600">"Loading..."</p> }>
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
            <span class="text-sm text-slate-600">
                {format!("{} isolation · {}", page.tenant.isolation, page.tenant.status)}
            </span>
        </div>
        <SavedNotice/>
        <Members members=page.members.clone() manage=page.can_manage_members me=page.me tenant_id actions/>
        <Projects projects=page.projects.clone() manage=page.can_manage_projects tenant_id actions/>
        {page.sso.clone().map(|sso| view! { <Sso sso manage=page.can_manage_sso tenant_id actions/> })}
        {page.tokens.clone().map(|tokens| view! { <TenantTokens tokens manage=page.can_manage_tokens tenant_id actions/> })}
        {page.can_read_webhooks.then(|| view! {
            <p class="mt-6 text-sm">
                <a href=format!("/tenants/{tenant_id}/webhooks") data-testid="webhooks-link" class="font-semibold text-indigo-600 hover:text-indigo-500">
                    "Webhooks and their delivery log"
                </a>
            </p>
        })}
    }
}

#[component]
fn Members(members: Vec<MemberView>, manage: bool, me: i64, tenant_id: i64, actions: TenantActions) -> impl IntoView {
    view! {
        <section class=CARD aria-labelledby="members">
            <h2 id="members" class="text-sm font-semibold text-slate-900">"Members"</h2>
            <Table label="Members" columns=&["Person", "Role", "Signed in through SSO"] buttons_column="Actions">
                {members.into_iter().map(|m| {
                    let editable = manage && m.user_id != me;
                    view! {
                        <tr data-member=m.email.clone()>
                            <th scope="row" class=ROW_HEADER>
                                {m.name.clone()}
                                <span class="ml-2 text-xs font-normal text-slate-600">{m.email.clone()}</span>
                            </th>
                            <td class=CELL>
                                {if editable {
                                    view! {
                                        <ActionForm action=actions.role attr:class="flex items-center gap-1">
                                            <input type="hidden" name="tenant_id" value=tenant_id/>
                                            <input type="hidden" name="user_id" value=m.user_id/>
                                            <label class="sr-only" for=format!("role-{}", m.user_id)>"Role"</label>
                                            <select id=format!("role-{}", m.user_id) name="role" class=SMALL_INPUT>
                                                <RoleOptions selected=m.role.clone()/>
                                            </select>
                                            <button type="submit" class=SMALL_BUTTON>"Change"</button>
                                        </ActionForm>
                                    }.into_any()
                                } else {
                                    view! { <span data-role=m.role.clone()>{m.role_label.clone()}</span> }.into_any()
                                }}
                            </td>
                            <td class=CELL>{if m.linked { "yes" } else { "not yet" }}</td>
                            <td class=CELL>
                                {editable.then(|| view! {
                                    <ActionForm action=actions.remove>
                                        <input type="hidden" name="tenant_id" value=tenant_id/>
                                        <input type="hidden" name="user_id" value=m.user_id/>
                                        <ConfirmButton label="Remove" confirm="Yes, remove"
                                            consequence="They lose access to the tenant at once; their environments keep running until stopped."/>
                                    </ActionForm>
                                })}
                            </td>
                        </tr>
                    }
                }).collect_view()}
            </Table>
            {manage.then(|| view! {
                <FieldsOf action=actions.invite>
                <ActionForm action=actions.invite attr:class="mt-4 grid gap-3 sm:grid-cols-4">
                    <input type="hidden" name="tenant_id" value=tenant_id/>
                    <Field id="invite-email" name="email" label="Invite by email" input_type="email" required=true
                        placeholder="ada@example.com" class="sm:col-span-2"/>
                    <Field id="invite-role" name="role" label="Role"><RoleOptions selected="member".to_owned()/></Field>
                    <div class="flex items-end"><button type="submit" class=BUTTON>"Invite"</button></div>
                    <p class="text-xs text-slate-600 sm:col-span-4">
                        "They sign in with your company's SSO; the invitation is linked at their first sign-in with this (verified) email."
                    </p>
                </ActionForm>
                </FieldsOf>
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
                view! { <p class="mt-2 text-sm text-slate-600">"No projects yet."</p> }.into_any()
            } else {
                view! {
                    <ul class="mt-2 divide-y divide-slate-100 text-sm">
                        {projects.into_iter().map(|p| view! {
                            <li class="flex flex-wrap items-center justify-between gap-2 py-2" data-project=p.name.clone()>
                                <div>
                                    <span class="font-medium text-slate-900">{p.name.clone()}</span>
                                    <span class="ml-2 text-xs text-slate-600">
                                        {if p.members.is_empty() { "no members".to_owned() } else { p.members.join(", ") }}
                                    </span>
                                </div>
                                {manage.then(|| view! {
                                    <ActionForm action=actions.project_member attr:class="flex items-center gap-1">
                                        <input type="hidden" name="tenant_id" value=tenant_id/>
                                        <input type="hidden" name="project_id" value=p.id/>
                                        <label class="sr-only" for=format!("pm-{}", p.id)>"Member email"</label>
                                        <input id=format!("pm-{}", p.id) name="email" type="email" required placeholder="member email"
                                            class=SMALL_INPUT/>
                                        <button type="submit" class=SMALL_BUTTON>"Add"</button>
                                    </ActionForm>
                                })}
                            </li>
                        }).collect_view()}
                    </ul>
                }.into_any()
            }}
            {manage.then(|| view! {
                <FieldsOf action=actions.project>
                <ActionForm action=actions.project attr:class="mt-3 flex items-end gap-2">
                    <input type="hidden" name="tenant_id" value=tenant_id/>
                    <Field id="project-name" name="name" label="New project" required=true/>
                    <button type="submit" class=BUTTON>"Create"</button>
                </ActionForm>
                </FieldsOf>
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
                    <FieldsOf action=actions.sso>
                    <ActionForm action=actions.sso attr:class="mt-3 grid gap-3 sm:grid-cols-2">
                        <input type="hidden" name="tenant_id" value=tenant_id/>
                        <Field id="sso-name" name="display_name" label="Button label (\"Sign in with ...\")" required=true
                            value=sso.display_name.clone() placeholder="Acme SSO"/>
                        <Field id="sso-issuer" name="issuer" label="Issuer URL" required=true value=sso.issuer.clone()
                            placeholder="https://login.example.com/realms/acme"/>
                        <Field id="sso-client" name="client_id" label="Client id" required=true value=sso.client_id.clone()/>
                        <Field id="sso-secret" name="client_secret" input_type="password" autocomplete="off"
                            label=if sso.has_secret { "Client secret (stored; leave empty to keep it)" } else { "Client secret" }/>
                        <Field id="sso-claim" name="groups_claim" label="Group claim" value=sso.groups_claim.clone()/>
                        <Field id="sso-domains" name="allowed_domains" label="Allowed email domains (empty: any)"
                            value=sso.allowed_domains.clone() placeholder="acme.example"/>
                        <Field id="sso-groups" name="group_roles" rows=4 class="sm:col-span-2"
                            label="Group to role, one per line: group = tenant_admin | member | viewer"
                            placeholder="ml-admins = tenant_admin\nml-team = member" value=sso.group_roles.clone()/>
                        <label class="flex items-center gap-2 text-xs text-slate-700">
                            <input type="checkbox" name="enabled" value="yes" checked=sso.enabled || !configured/>
                            "Offer this sign-in on the sign-in page"
                        </label>
                        <div class="flex justify-end"><button type="submit" class=BUTTON>"Save connection"</button></div>
                    </ActionForm>
                    </FieldsOf>
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
                view! { <p class="mt-2 text-sm text-slate-600">"Not configured."</p> }.into_any()
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
                view! { <p class="mt-2 text-sm text-slate-600">"No tokens."</p> }.into_any()
            } else {
                view! {
                    <Table label="Tenant tokens" columns=&["Owner", "Name", "Expires", "Last used", "State"] buttons_column="Actions">
                        {tokens.into_iter().map(|t| {
                            let active = t.status == "active";
                            view! {
                                <tr data-token=t.name.clone()>
                                    <td class=CELL>{t.owner.clone()}</td>
                                    <td class=CELL title=t.action_names.clone()>{t.name.clone()}</td>
                                    <td class=CELL>{t.expires.clone()}</td>
                                    <td class=CELL>{t.last_used.clone()}</td>
                                    <td class=CELL data-status=t.status.clone()>{t.status.clone()}</td>
                                    <td class=CELL>
                                        {(manage && active).then(|| view! {
                                            <ActionForm action=actions.revoke>
                                                <input type="hidden" name="tenant_id" value=tenant_id/>
                                                <input type="hidden" name="id" value=t.id/>
                                                <ConfirmButton label="Revoke" confirm="Yes, revoke"
                                                    consequence="Anything that uses this token stops working at once."/>
                                            </ActionForm>
                                        })}
                                    </td>
                                </tr>
                            }
                        }).collect_view()}
                    </Table>
                }.into_any()
            }}
        </section>
    }
}

/// `/tenants/:id/webhooks`: the tenant's webhooks, for its admins and platform staff.
#[component]
pub fn WebhooksPage() -> impl IntoView {
    let params = use_params_map();
    let id = move || params.read().get("id").and_then(|id| id.parse::<i64>().ok()).unwrap_or(-1);
    let add = ServerAction::<AddWebhook>::new();
    let remove = ServerAction::<RemoveWebhook>::new();
    let hooks =
        Resource::new(move || (id(), add.version().get(), remove.version().get()), |(id, _, _)| tenant_webhooks(id));
    view! {
        <Title text="Webhooks"/>
        <RequireUser>
            <Transition fallback=|| view! { <p class="text-slate-600">"Loading..."</p> }>
                {move || Suspend::new(async move {
                    match hooks.await {
                        Ok(view) => view! { <Webhooks view add remove/> }.into_any(),
                        Err(error) => view! { <ErrorAlert error/> }.into_any(),
                    }
                })}
            </Transition>
        </RequireUser>
    }
}

/// The tenant's webhooks (Slack-compatible or plain JSON, signed with HMAC-SHA256), the
/// form that adds one (its secret shown once), and the log of every call.
#[component]
fn Webhooks(view: WebhooksView, add: ServerAction<AddWebhook>, remove: ServerAction<RemoveWebhook>) -> impl IntoView {
    let tenant_id = view.tenant_id;
    let added = add.value();
    let errors = move || {
        [add.value().get().and_then(Result::err), remove.value().get().and_then(Result::err)]
            .into_iter()
            .flatten()
            .map(|error| view! { <div class="mt-3"><ErrorAlert error/></div> })
            .collect_view()
    };
    view! {
        <h1 class="text-2xl font-bold tracking-tight text-slate-900">"Webhooks"</h1>
        <p class="mt-1 text-sm"><a href=format!("/tenants/{tenant_id}") class="text-indigo-600 hover:text-indigo-500">"Back to the team"</a></p>
        <section class=CARD id="webhooks" aria-labelledby="webhooks-title">
            <h2 id="webhooks-title" class="text-sm font-semibold text-slate-900">"Webhooks of this tenant"</h2>
            <p class="mt-1 text-sm text-slate-600">
                "Berth posts the chosen events to each URL, signed: the header Berth-Signature is t=<unix seconds>,v1=<hex HMAC-SHA256 of \"<t>.<body>\" with the webhook's secret>; Berth-Delivery names the delivery (the same on a retry). Failed calls are retried with growing waits for about an hour and a half."
            </p>
            {view.new_secret.clone().map(|new| view! { <NewWebhookBox new/> })}
            {move || added.get().and_then(Result::ok).flatten().map(|new| view! { <NewWebhookBox new/> })}
            {errors}
            {if view.webhooks.is_empty() {
                view! { <p class="mt-2 text-sm text-slate-600">"No webhooks."</p> }.into_any()
            } else {
                let manage = view.can_manage;
                view! {
                    <Table label="Webhooks" columns=&["URL", "Format", "Events", "Added"] buttons_column="Actions">
                        {view.webhooks.clone().into_iter().map(|w| view! {
                            <tr data-webhook=w.url.clone()>
                                <th scope="row" class=format!("{ROW_HEADER} break-all")>{w.url.clone()}</th>
                                <td class=CELL>{w.format.clone()}</td>
                                <td class=CELL>{w.kinds.join(", ")}</td>
                                <td class=CELL>{w.created.clone()}</td>
                                <td class=CELL>
                                    {manage.then(|| view! {
                                        <ActionForm action=remove>
                                            <input type="hidden" name="tenant_id" value=tenant_id/>
                                            <input type="hidden" name="id" value=w.id/>
                                            <ConfirmButton label="Remove" confirm="Yes, remove"
                                                consequence="Berth stops calling it; calls not yet made are dropped."/>
                                        </ActionForm>
                                    })}
                                </td>
                            </tr>
                        }).collect_view()}
                    </Table>
                }.into_any()
            }}
            {view.can_manage.then(|| view! {
                <FieldsOf action=add>
                <ActionForm action=add attr:class="mt-4 space-y-3">
                    <input type="hidden" name="tenant_id" value=tenant_id/>
                    <div class="grid gap-3 sm:grid-cols-3">
                        <Field id="hook-url" name="url" label="URL" placeholder="https://hooks.slack.com/services/..." autocomplete="off" class="sm:col-span-2"/>
                        <div>
                            <label for="hook-format" class=LABEL>"Format"</label>
                            <select id="hook-format" name="format" class=format!("mt-1 block w-full {SMALL_INPUT}")>
                                <option value="slack">"Slack-compatible {\"text\": ...}"</option>
                                <option value="json">"Plain JSON"</option>
                            </select>
                        </div>
                    </div>
                    <fieldset>
                        <legend class=LABEL>"Events"</legend>
                        <div class="mt-2 grid gap-2 sm:grid-cols-2">
                            {view.kinds.clone().into_iter().map(|(name, label)| view! {
                                <label class="flex items-start gap-2 text-sm text-slate-800">
                                    <input type="checkbox" name="kinds[]" value=name.clone() class="mt-0.5"/>
                                    <span>{label}<span class="block font-mono text-xs text-slate-600">{name.clone()}</span></span>
                                </label>
                            }).collect_view()}
                        </div>
                    </fieldset>
                    <button type="submit" class=BUTTON>"Add webhook"</button>
                </ActionForm>
                </FieldsOf>
            })}
            <h3 class="mt-6 text-sm font-semibold text-slate-900">"Delivery log"</h3>
            {if view.deliveries.is_empty() {
                view! { <p class="mt-2 text-sm text-slate-600">"No calls yet."</p> }.into_any()
            } else {
                view! {
                    <Table label="Webhook delivery log" columns=&["When", "Webhook", "Event", "Try", "Answer"]>
                        {view.deliveries.clone().into_iter().map(|d| {
                            let answer = match (d.status, &d.error) {
                                (Some(status), None) => status.to_string(),
                                (Some(status), Some(error)) => format!("{status}: {error}"),
                                (None, Some(error)) => error.clone(),
                                (None, None) => String::new(),
                            };
                            let ok = d.status.is_some_and(|s| (200..300).contains(&s));
                            view! {
                                <tr data-delivery-ok=ok.to_string()>
                                    <td class=CELL>{d.when.clone()}</td>
                                    <td class=CELL>{d.webhook_id}</td>
                                    <td class=CELL>{d.title.clone()}</td>
                                    <td class=CELL>{d.attempt}</td>
                                    <td class=format!("{CELL} break-all")>{answer}</td>
                                </tr>
                            }
                        }).collect_view()}
                    </Table>
                }.into_any()
            }}
        </section>
    }
}

/// A new webhook's secret, once: receivers need it to check signatures.
#[component]
fn NewWebhookBox(new: NewWebhookView) -> impl IntoView {
    view! {
        <div data-testid="new-webhook" role="status" class="mt-4 rounded-xl border-2 border-amber-300 bg-amber-50 p-4">
            <p class="text-sm font-semibold text-amber-900">{format!("Signing secret of {}", new.url)}</p>
            <p class="mt-1 text-sm text-amber-900">"Copy it now; it will not be shown again."</p>
            <code data-secret="" class="mt-2 block select-all break-all rounded-lg bg-white px-3 py-2 font-mono text-sm text-slate-900 ring-1 ring-amber-200">
                {new.secret.clone()}
            </code>
        </div>
    }
}
