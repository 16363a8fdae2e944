use leptos::prelude::*;
use leptos_meta::Title;

use crate::components::form::{BUTTON, LABEL};
use crate::components::table::{CELL, ROW_HEADER};
use crate::components::{
    CARD, ConfirmButton, CopyButton, ErrorAlert, Field, FieldsOf, RequireUser, SavedNotice, Table,
};
use crate::model::{AccountView, NewTokenView, NotificationSettingsView, SshKeyView, TokenView};
use crate::serverfns::{
    AddSshKey, ChangePassword, CreateToken, RemoveSshKey, ResetSecondFactor, RevokeToken, SaveNotificationSettings,
    account, notification_settings,
};

/// The signed-in user's personal API tokens (create one, its secret shown once; see when
/// each was last used; revoke them) and SSH keys (for their dedicated clusters' nodes).
/// Its resource is made outside `RequireUser` (see there why).
#[component]
pub fn AccountPage() -> impl IntoView {
    let create = ServerAction::<CreateToken>::new();
    let revoke = ServerAction::<RevokeToken>::new();
    let add_key = ServerAction::<AddSshKey>::new();
    let remove_key = ServerAction::<RemoveSshKey>::new();
    let account = Resource::new(
        move || (create.version().get(), revoke.version().get(), add_key.version().get(), remove_key.version().get()),
        |_| account(),
    );
    let created = create.value();
    let save_choices = ServerAction::<SaveNotificationSettings>::new();
    let choices = Resource::new(move || save_choices.version().get(), |_| notification_settings());
    view! {
        <Title text="Account: API tokens, SSH keys, password"/>
        <RequireUser>
            <h1 class="text-2xl font-bold tracking-tight text-slate-900">"API tokens"</h1>
            <p class="mt-1 text-sm text-slate-600">
                "Personal tokens for scripts and CI on the JSON API under /api/v1. A token acts as you, limited to the actions you give it, never more than your role allows now; revoking it stops it at once."
            </p>
            // Created with the WASM running: the secret came back as the action's answer.
            {move || created.get().and_then(Result::ok).flatten().map(|token| view! { <NewTokenBox token/> })}
            <Transition fallback=|| view! { <p class="text-slate-600">"Loading..."</p> }>
                {move || Suspend::new(async move {
                    match account.await {
                        Ok(mut view) => {
                            let keys = std::mem::take(&mut view.ssh_keys);
                            let (local, resets) = (view.local_account, view.resets_authenticators);
                            view! {
                                <AccountBody view create revoke/>
                                <SshKeys keys add=add_key remove=remove_key/>
                                {local.then(|| view! { <LocalAccount resets/> })}
                            }
                            .into_any()
                        }
                        Err(error) => view! { <div class="mt-4"><ErrorAlert error/></div> }.into_any(),
                    }
                })}
            </Transition>
            <Transition fallback=|| ()>
                {move || Suspend::new(async move {
                    match choices.await {
                        Ok(view) => view! { <NotificationChoices view save=save_choices/> }.into_any(),
                        Err(error) => view! { <div class="mt-4"><ErrorAlert error/></div> }.into_any(),
                    }
                })}
            </Transition>
        </RequireUser>
    }
}

/// Which notifications reach the person, in the bell and by email, per kind.
#[component]
fn NotificationChoices(view: NotificationSettingsView, save: ServerAction<SaveNotificationSettings>) -> impl IntoView {
    let result = save.value();
    view! {
        <section class=CARD id="notifications" aria-labelledby="notifications-title">
            <h2 id="notifications-title" class="text-sm font-semibold text-slate-900">"Notifications"</h2>
            <SavedNotice/>
            <p class="mt-1 text-sm text-slate-600" data-testid="email-status">
                {if view.email_configured {
                    "Email goes to your account's address."
                } else {
                    "Email is not configured on this Berth (the operator has not set an SMTP relay): notifications reach you in the bell only."
                }}
            </p>
            <ActionForm action=save attr:class="mt-3">
                <Table label="Notification channels" columns=&["Event", "In the bell", "By email"]>
                    {view.choices.into_iter().map(|c| {
                        let (in_app_id, email_id) = (format!("in-app-{}", c.kind), format!("email-{}", c.kind));
                        view! {
                            <tr data-kind=c.kind.clone()>
                                <th scope="row" class=ROW_HEADER>{c.label.clone()}</th>
                                <td class=CELL>
                                    <label class="sr-only" for=in_app_id.clone()>{format!("{} in the bell", c.label)}</label>
                                    <input type="checkbox" id=in_app_id name="in_app[]" value=c.kind.clone() checked=c.in_app/>
                                </td>
                                <td class=CELL>
                                    <label class="sr-only" for=email_id.clone()>{format!("{} by email", c.label)}</label>
                                    <input type="checkbox" id=email_id name="email[]" value=c.kind.clone() checked=c.email/>
                                </td>
                            </tr>
                        }
                    }).collect_view()}
                </Table>
                <button type="submit" class=format!("mt-3 {BUTTON}")>"Save notification choices"</button>
            </ActionForm>
            <div class="mt-3">{move || result.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}</div>
        </section>
    }
}

/// The secret, once: Berth keeps only its hash.
#[component]
fn NewTokenBox(token: NewTokenView) -> impl IntoView {
    view! {
        <section data-testid="new-token" role="status" aria-labelledby="new-token-title"
            class="mt-6 rounded-xl border-2 border-amber-300 bg-amber-50 p-5">
            <h2 id="new-token-title" class="font-semibold text-amber-900">{format!("Your new token \u{201c}{}\u{201d}", token.name)}</h2>
            <p class="mt-1 text-sm font-medium text-amber-900">"Copy it now; it will not be shown again."</p>
            <code data-secret="" class="mt-3 block select-all break-all rounded-lg bg-white px-3 py-2 font-mono text-sm text-slate-900 ring-1 ring-amber-200">
                {token.secret.clone()}
            </code>
            <CopyButton text=token.secret.clone() label="Copy the token"/>
            <p class="mt-3 text-xs text-amber-900">{format!("Valid until {}. Try it:", token.expires)}</p>
            <code data-example="" class="mt-1 block select-all break-all rounded-lg bg-white px-3 py-2 font-mono text-xs text-slate-900 ring-1 ring-amber-200">
                {token.example.clone()}
            </code>
        </section>
    }
}

#[component]
fn AccountBody(
    view: AccountView,
    create: ServerAction<CreateToken>,
    revoke: ServerAction<RevokeToken>,
) -> impl IntoView {
    let create_result = create.value();
    let revoke_result = revoke.value();
    view! {
        // Created by a plain form post (no WASM yet): the secret waited in the session.
        {view.new_token.map(|token| view! { <NewTokenBox token/> })}
        <section class=CARD aria-labelledby="create-token">
            <h2 id="create-token" class="text-sm font-semibold text-slate-900">"Create a token"</h2>
            <FieldsOf action=create>
            <ActionForm action=create attr:class="mt-3 space-y-4">
                <div class="grid gap-3 sm:grid-cols-3">
                    <Field id="t-name" name="name" label="Name" placeholder="ci-pipeline" autocomplete="off" class="sm:col-span-2"/>
                    <Field id="t-days" name="days" label=format!("Lifetime (days, at most {})", view.max_days) inputmode="numeric"
                        value="30"/>
                </div>
                <fieldset>
                    <legend class=LABEL>"What it may do (tick none for everything your role allows)"</legend>
                    <div class="mt-2 grid gap-2 sm:grid-cols-2 lg:grid-cols-3">
                        {view.actions.into_iter().map(|a| view! {
                            <label class="flex items-start gap-2 text-sm text-slate-800">
                                <input type="checkbox" name="actions[]" value=a.name.clone() class="mt-0.5"/>
                                <span>
                                    {a.label}
                                    <span class="block font-mono text-xs text-slate-600">{a.name}</span>
                                </span>
                            </label>
                        }).collect_view()}
                    </div>
                </fieldset>
                <button type="submit" class=BUTTON>"Create token"</button>
            </ActionForm>
            </FieldsOf>
            <div class="mt-3">
                {move || create_result.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
            </div>
        </section>
        <section class="mt-6" aria-labelledby="your-tokens">
            <h2 id="your-tokens" class="text-sm font-semibold text-slate-900">"Your tokens"</h2>
            <div class="mt-2">
                {move || revoke_result.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
            </div>
            <TokenTable tokens=view.tokens revoke/>
        </section>
    }
}

#[component]
fn TokenTable(tokens: Vec<TokenView>, revoke: ServerAction<RevokeToken>) -> impl IntoView {
    if tokens.is_empty() {
        return view! { <p class="mt-2 text-sm text-slate-600">"No tokens yet."</p> }.into_any();
    }
    view! {
        <Table label="Your tokens" columns=&["Name", "May do", "Created", "Expires", "Last used", "Status"] buttons_column="Revoke">
            {tokens.into_iter().map(|t| view! {
                <tr data-token=t.name.clone()>
                    <th scope="row" class=ROW_HEADER>{t.name.clone()}</th>
                    <td class="max-w-xs px-4 py-2 text-slate-600" title=t.action_names.clone()>{t.actions.clone()}</td>
                    <td class="whitespace-nowrap px-4 py-2 text-slate-600">{t.created.clone()}</td>
                    <td class="whitespace-nowrap px-4 py-2 text-slate-600">{t.expires.clone()}</td>
                    <td class="whitespace-nowrap px-4 py-2 text-slate-600">{t.last_used.clone()}</td>
                    <td class=CELL><TokenStatus status=t.status.clone()/></td>
                    <td class="px-4 py-2 text-right">
                        {(t.status == "active").then(|| view! {
                            <ActionForm action=revoke>
                                <input type="hidden" name="id" value=t.id/>
                                <ConfirmButton label="Revoke" confirm="Yes, revoke"
                                    consequence="Anything that uses this token stops working at once."/>
                            </ActionForm>
                        })}
                    </td>
                </tr>
            }).collect_view()}
        </Table>
    }
    .into_any()
}

#[component]
fn TokenStatus(status: String) -> impl IntoView {
    let (tone, label) = match status.as_str() {
        "active" => ("bg-emerald-50 text-emerald-800 ring-emerald-300", "Active"),
        "revoked" => ("bg-red-50 text-red-800 ring-red-300", "Revoked"),
        _ => ("bg-slate-100 text-slate-600 ring-slate-300", "Expired"),
    };
    view! {
        <span data-status=status class=format!("inline-flex rounded-full px-2.5 py-0.5 text-xs font-medium ring-1 ring-inset {tone}")>
            {label}
        </span>
    }
}

/// The caller's SSH public keys: a dedicated cluster on bare metal lets in, on each of its
/// nodes, the keys of its owner and their tenant admins.
#[component]
fn SshKeys(keys: Vec<SshKeyView>, add: ServerAction<AddSshKey>, remove: ServerAction<RemoveSshKey>) -> impl IntoView {
    let add_result = add.value();
    let remove_result = remove.value();
    view! {
        <section class="mt-10" aria-labelledby="ssh-keys">
            <h2 id="ssh-keys" class="text-xl font-bold tracking-tight text-slate-900">"SSH keys"</h2>
            <p class="mt-1 text-sm text-slate-600">
                "Your public keys for the nodes of dedicated clusters: each node gets an account named after the cluster (ssh berth-\u{2026}@node) that lets in its owner's keys and their tenant admins'. Keys you add or remove reach running clusters within seconds; the account goes when the cluster ends."
            </p>
            <div class=CARD>
                <h3 class="text-sm font-semibold text-slate-900">"Add a key"</h3>
                <FieldsOf action=add>
                <ActionForm action=add attr:class="mt-3 space-y-3">
                    <Field id="k-key" name="public_key" rows=3 autocomplete="off" monospace=true
                        label="Public key (the contents of ~/.ssh/id_ed25519.pub; ssh-ed25519, ecdsa-sha2-nistp256/384/521 or ssh-rsa of 2048 bits or more)"
                        placeholder="ssh-ed25519 AAAAC3Nza... you@laptop"/>
                    <Field id="k-name" name="name" label="Name (optional; the key's comment otherwise)" placeholder="work laptop"
                        autocomplete="off" class="sm:w-1/2"/>
                    <button type="submit" class=BUTTON>"Add key"</button>
                </ActionForm>
                </FieldsOf>
                <div class="mt-3">
                    {move || add_result.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
                </div>
            </div>
            <div class="mt-2">
                {move || remove_result.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
            </div>
            <SshKeyTable keys remove/>
        </section>
    }
}

#[component]
fn SshKeyTable(keys: Vec<SshKeyView>, remove: ServerAction<RemoveSshKey>) -> impl IntoView {
    if keys.is_empty() {
        return view! { <p class="mt-3 text-sm text-slate-600">"No SSH keys yet."</p> }.into_any();
    }
    view! {
        <Table label="Your SSH keys" columns=&["Name", "Kind", "Fingerprint", "Added"] buttons_column="Remove">
            {keys.into_iter().map(|k| view! {
                <tr data-ssh-key=k.fingerprint.clone()>
                    <th scope="row" class=ROW_HEADER>{k.name.clone()}</th>
                    <td class="whitespace-nowrap px-4 py-2 text-slate-600">{k.kind.clone()}</td>
                    <td class="px-4 py-2 font-mono text-xs text-slate-700 break-all">{k.fingerprint.clone()}</td>
                    <td class="whitespace-nowrap px-4 py-2 text-slate-600">{k.added.clone()}</td>
                    <td class="px-4 py-2 text-right">
                        <ActionForm action=remove>
                            <input type="hidden" name="id" value=k.id/>
                            <ConfirmButton label="Remove" aria_label=format!("Remove {}", k.name) confirm="Yes, remove"
                                consequence="Nodes booked from now on no longer accept this key; running ones keep it until they end."/>
                        </ActionForm>
                    </td>
                </tr>
            }).collect_view()}
        </Table>
    }
    .into_any()
}

/// A local account's password, and, for platform admins, another administrator's lost
/// authenticator. (People who sign in with single sign-on change their password there.)
#[component]
fn LocalAccount(resets: bool) -> impl IntoView {
    let change = ServerAction::<ChangePassword>::new();
    let reset = ServerAction::<ResetSecondFactor>::new();
    let query = leptos_router::hooks::use_query_map();
    let said = move |key: &str, value: &str| query.read().get(key).is_some_and(|v| v == value);
    let changed = move || said("password", "changed");
    let was_reset = move || said("authenticator", "reset");
    let change_result = change.value();
    let reset_result = reset.value();
    view! {
        <section class="mt-10" aria-labelledby="password">
            <h2 id="password" class="text-xl font-bold tracking-tight text-slate-900">"Password"</h2>
            <div class=CARD>
                <FieldsOf action=change>
                <ActionForm action=change attr:class="space-y-3 sm:w-1/2">
                    <Field id="p-current" name="current" label="Current password" input_type="password" required=true
                        autocomplete="current-password"/>
                    <Field id="p-new" name="password" label="New password (12 characters or more)" input_type="password"
                        required=true minlength=12 autocomplete="new-password"/>
                    <Field id="p-again" name="again" label="New password again" input_type="password" required=true minlength=12
                        autocomplete="new-password"/>
                    <button type="submit" class=BUTTON>"Change password"</button>
                </ActionForm>
                </FieldsOf>
                <div class="mt-3" role="status">
                    {move || changed().then(|| view! { <p class="text-sm text-emerald-700" data-testid="password-changed">"Your password was changed."</p> })}
                    {move || change_result.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
                </div>
            </div>
            {resets.then(|| view! {
                <div class=CARD>
                    <h3 class="text-sm font-semibold text-slate-900">"Another administrator lost their authenticator"</h3>
                    <p class="mt-1 text-sm text-slate-600">"Clears their one-time code set-up; their next sign-in, with their password, sets up a new one. Audited. Your own needs another platform admin."</p>
                    <FieldsOf action=reset>
                    <ActionForm action=reset attr:class="mt-3 flex flex-wrap items-end gap-3">
                        <Field id="r-email" name="email" label="Their email" input_type="email" required=true autocomplete="off"/>
                        <button type="submit" class="rounded-lg bg-white px-4 py-2 text-sm font-semibold text-red-700 ring-1 ring-red-300 hover:bg-red-50">"Reset authenticator"</button>
                    </ActionForm>
                    </FieldsOf>
                    <div class="mt-3" role="status">
                        {move || was_reset().then(|| view! { <p class="text-sm text-emerald-700">"Their authenticator was reset."</p> })}
                        {move || reset_result.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
                    </div>
                </div>
            })}
        </section>
    }
}
