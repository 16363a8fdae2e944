use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use crate::components::{Auth, ErrorAlert, Field, FieldErrors};
use crate::error::AppError;
use crate::serverfns::{ChoosePassword, VerifyCode, second_factor, sign_in_options};

#[component]
pub fn LoginPage() -> impl IntoView {
    let query = use_query_map();
    let next = move || query.read().get("next").unwrap_or_else(|| "/environments".to_owned());
    let Some(auth) = Auth::get() else { return ().into_any() };
    let sign_in = auth.sign_in_action();
    let result = sign_in.value();
    let providers = Resource::new(|| (), |_| sign_in_options());
    // Only a known code's own words, so a crafted link cannot put text on this page; the
    // request id only if it looks like one.
    let sso_error = move || {
        let query = query.read();
        let problem = berth_domain::SignInProblem::from_code(&query.get("sso_error")?);
        let request_id = query
            .get("request_id")
            .filter(|id| id.len() <= 36 && id.chars().all(|c| c.is_ascii_hexdigit() || c == '-'));
        Some(match request_id {
            Some(id) => format!("{problem} (request id {id})"),
            None => problem.to_string(),
        })
    };
    view! {
        <Title text="Sign in"/>
        <div class="mx-auto mt-8 max-w-sm">
            <h1 class="text-center text-2xl font-bold tracking-tight text-slate-900">"Sign in to Berth"</h1>
            {move || sso_error().map(|message| view! {
                <div class="mt-6"><ErrorAlert error=AppError::Refused(message)/></div>
            })}
            // The operator's providers by name; a tenant's is found by the person's email or
            // organization, so this page lists no customers.
            <Suspense fallback=|| ()>
                {move || Suspend::new(async move {
                    let providers = providers.await.unwrap_or_default();
                    (!providers.is_empty()).then(|| view! {
                        <div class="mt-8 space-y-2" aria-label="Platform sign-in">
                            {providers.into_iter().map(|p| {
                                let href = format!("/auth/oidc/{}/start?next={}", p.slug, crate::components::url_encode(&next()));
                                view! {
                                    <a href=href data-provider=p.slug.clone() rel="external"
                                        class="block w-full rounded-lg bg-slate-900 px-4 py-2.5 text-center text-sm font-semibold text-white hover:bg-slate-700">
                                        {format!("Sign in with {}", p.name)}
                                    </a>
                                }
                            }).collect_view()}
                        </div>
                    })
                })}
            </Suspense>
            <form method="get" action=crate::SSO_FIND_PATH class="mt-6 rounded-xl border border-slate-200 bg-white p-6 shadow-sm">
                <input type="hidden" name="next" value=next/>
                <label for="sso-hint" class="block text-sm font-medium text-slate-700">"Work email or organization"</label>
                <input id="sso-hint" name="hint" type="text" required autocomplete="email" spellcheck="false"
                    aria-describedby="sso-hint-help"
                    class="mt-1 block w-full rounded-lg border border-slate-300 px-3 py-2 text-sm shadow-sm focus:border-indigo-500 focus:outline-none focus:ring-1 focus:ring-indigo-500"/>
                <p id="sso-hint-help" class="mt-1 text-xs text-slate-600">"We send you to your organization's single sign-on."</p>
                <button type="submit"
                    class="mt-4 w-full rounded-lg bg-slate-900 px-4 py-2 text-sm font-semibold text-white hover:bg-slate-700">
                    "Continue with single sign-on"
                </button>
            </form>
            <p class="mt-6 text-center text-xs text-slate-600">"or, for local accounts"</p>
            <div class="mt-2 rounded-xl border border-slate-200 bg-white p-6 shadow-sm">
                <ActionForm action=sign_in>
                    <input type="hidden" name="next" value=next/>
                    <div class="space-y-4">
                        <div>
                            <label for="email" class="block text-sm font-medium text-slate-700">"Email"</label>
                            <input id="email" name="email" type="email" required autocomplete="username"
                                class="mt-1 block w-full rounded-lg border border-slate-300 px-3 py-2 text-sm shadow-sm focus:border-indigo-500 focus:outline-none focus:ring-1 focus:ring-indigo-500"/>
                        </div>
                        <div>
                            <label for="password" class="block text-sm font-medium text-slate-700">"Password"</label>
                            <input id="password" name="password" type="password" required autocomplete="current-password"
                                class="mt-1 block w-full rounded-lg border border-slate-300 px-3 py-2 text-sm shadow-sm focus:border-indigo-500 focus:outline-none focus:ring-1 focus:ring-indigo-500"/>
                        </div>
                        {move || result.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
                        <button type="submit" disabled=move || sign_in.pending().get()
                            class="w-full rounded-lg bg-indigo-600 px-4 py-2 text-sm font-semibold text-white hover:bg-indigo-500 disabled:opacity-60">
                            "Sign in"
                        </button>
                    </div>
                </ActionForm>
            </div>
            <p class="mt-4 text-center text-xs text-slate-600">
                "First start? The administrator's one-time password was printed by "<code>"make run"</code>"."
            </p>
        </div>
    }
    .into_any()
}

/// The second step for local administrators: the code from their authenticator app, after
/// setting one up at the first sign-in.
#[component]
pub fn SecondFactorPage() -> impl IntoView {
    let query = use_query_map();
    let next = move || query.read().get("next").unwrap_or_else(|| "/environments".to_owned());
    let Some(auth) = Auth::get() else { return ().into_any() };
    let verify = ServerAction::<VerifyCode>::new();
    Effect::new(move |_| {
        if verify.version().get() > 0 {
            auth.refresh();
        }
    });
    let result = verify.value();
    FieldErrors::of(verify);
    let step = Resource::new(|| (), |_| second_factor());
    view! {
        <Title text="One-time code"/>
        <div class="mx-auto mt-8 max-w-md">
            <h1 class="text-center text-2xl font-bold tracking-tight text-slate-900">"One-time code"</h1>
            <Suspense fallback=|| view! { <p class="text-slate-600">"Loading..."</p> }>
                {move || Suspend::new(async move {
                    match step.await {
                        Ok(step) => view! {
                            {step.secret.is_none().then(|| view! {
                                <p class="mt-4 text-center text-sm text-slate-600" data-testid="totp-ready">
                                    "Enter the code your authenticator app shows for Berth."
                                </p>
                            })}
                            {step.secret.map(|secret| view! {
                                <div class="mt-6 rounded-xl border border-amber-200 bg-amber-50 p-4 text-sm text-amber-900">
                                    <p class="font-semibold">"Set up your authenticator app"</p>
                                    <p class="mt-1">"Administrators with a local account sign in with a one-time code as well. Scan this code with your authenticator app, or add the key by hand (time-based, 6 digits, 30 seconds), then enter the code it shows."</p>
                                    {step.qr.map(|qr| view! {
                                        <img src=qr width="200" height="200" data-testid="totp-qr"
                                            alt="QR code of the authenticator key below"
                                            class="mx-auto mt-3 rounded bg-white p-2"/>
                                    })}
                                    <p class="mt-2 font-mono text-base tracking-wider" data-testid="totp-secret">{secret}</p>
                                    <p class="mt-2 break-all text-xs">{step.uri.unwrap_or_default()}</p>
                                </div>
                            })}
                        }.into_any(),
                        Err(error) => view! { <div class="mt-6"><ErrorAlert error/></div> }.into_any(),
                    }
                })}
            </Suspense>
            <div class="mt-6 rounded-xl border border-slate-200 bg-white p-6 shadow-sm">
                <ActionForm action=verify>
                    <input type="hidden" name="next" value=next/>
                    <Field id="code" name="code" label="Code from your authenticator" required=true inputmode="numeric"
                        autocomplete="one-time-code" minlength=6 maxlength=7 monospace=true/>
                    <div class="mt-4">{move || result.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}</div>
                    <button type="submit" class="mt-4 w-full rounded-lg bg-indigo-600 px-4 py-2 text-sm font-semibold text-white hover:bg-indigo-500">
                        "Verify"
                    </button>
                </ActionForm>
            </div>
        </div>
    }
    .into_any()
}

/// The first sign-in with a password someone else chose or saw (the first-start
/// administrator's, printed in the log): the person chooses their own before going on.
#[component]
pub fn NewPasswordPage() -> impl IntoView {
    let query = use_query_map();
    let next = move || query.read().get("next").unwrap_or_else(|| "/environments".to_owned());
    let Some(auth) = Auth::get() else { return ().into_any() };
    let choose = ServerAction::<ChoosePassword>::new();
    Effect::new(move |_| {
        if choose.version().get() > 0 {
            auth.refresh();
        }
    });
    let result = choose.value();
    FieldErrors::of(choose);
    view! {
        <Title text="Choose your password"/>
        <div class="mx-auto mt-8 max-w-sm">
            <h1 class="text-center text-2xl font-bold tracking-tight text-slate-900">"Choose your password"</h1>
            <p class="mt-4 text-center text-sm text-slate-600">
                "The password you signed in with was printed when Berth first started, so others may have seen it. Choose your own (12 characters or more); the printed one stops working."
            </p>
            <div class="mt-6 rounded-xl border border-slate-200 bg-white p-6 shadow-sm">
                <ActionForm action=choose>
                    <input type="hidden" name="next" value=next/>
                    <div class="space-y-4">
                        <Field id="new-password" name="password" label="New password" input_type="password" required=true
                            minlength=12 autocomplete="new-password"/>
                        <Field id="new-password-again" name="again" label="New password again" input_type="password"
                            required=true minlength=12 autocomplete="new-password"/>
                        {move || result.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
                        <button type="submit" class="w-full rounded-lg bg-indigo-600 px-4 py-2 text-sm font-semibold text-white hover:bg-indigo-500">
                            "Save and continue"
                        </button>
                    </div>
                </ActionForm>
            </div>
        </div>
    }
    .into_any()
}
