//! Pieces every page uses: the signed-in user, state badges, alerts, tables and form
//! fields.

pub mod form;
pub mod table;

pub use form::{ConfirmButton, CopyButton, Field, FieldErrors, FieldsOf, SavedNotice};
pub use table::Table;

use leptos::prelude::*;
use leptos_router::components::A;
use leptos_router::hooks::use_location;

use crate::error::AppError;
use crate::model::{BellView, SessionUser};
use crate::serverfns::{SignIn, SignOut, current_user, notification_bell};

/// A page's section in a white box, with its heading, forms or tables.
pub const CARD: &str = "mt-6 rounded-xl border border-slate-200 bg-white p-4 shadow-sm";

/// The session as the UI knows it, refreshed after every sign-in and sign-out.
#[derive(Clone, Copy)]
pub struct Auth {
    pub sign_out: ServerAction<SignOut>,
    pub user: Resource<Result<Option<SessionUser>, AppError>>,
    /// Bumped by the sign-in page after a sign-in, to re-read the user.
    signed_in: RwSignal<u64>,
    /// The bell's count, read again every few seconds and after marking read (apart from
    /// `user`, so pages waiting on `user` are not re-rendered by it).
    pub bell: Resource<Result<Option<BellView>, AppError>>,
    bell_tick: RwSignal<u64>,
}

impl Auth {
    pub fn provide() -> Auth {
        let sign_out = ServerAction::<SignOut>::new();
        let signed_in = RwSignal::new(0);
        let user = Resource::new(move || (signed_in.get(), sign_out.version().get()), |_| current_user());
        let bell_tick = RwSignal::new(0);
        let bell = Resource::new(
            move || (signed_in.get(), sign_out.version().get(), bell_tick.get()),
            |_| notification_bell(),
        );
        let auth = Auth { sign_out, user, signed_in, bell, bell_tick };
        provide_context(auth);
        auth
    }

    /// The sign-in action lives on the sign-in page, inside the routes: only there does
    /// the router hand back its error after a plain (pre-WASM) form post.
    pub fn sign_in_action(self) -> ServerAction<SignIn> {
        let sign_in = ServerAction::<SignIn>::new();
        Effect::new(move |_| {
            if sign_in.version().get() > 0 {
                self.signed_in.update(|n| *n += 1);
            }
        });
        sign_in
    }

    /// Re-reads who is signed in (after a sign-in finished elsewhere on the page).
    pub fn refresh(self) {
        self.signed_in.update(|n| *n += 1);
    }

    /// Re-reads the bell (after notifications were marked read, and periodically).
    pub fn refresh_bell(self) {
        self.bell_tick.update(|n| *n += 1);
    }

    pub fn get() -> Option<Auth> {
        use_context::<Auth>()
    }
}

/// Shows `children` to a signed-in user and a sign-in prompt to anyone else.
///
/// On the server a Suspense runs its children again until no resource read is left
/// pending, so `children` may be built several times there but once in the browser. A page
/// must therefore make its resources before `RequireUser`, never inside its children: each
/// extra build would take the next hydration id, and the browser would hydrate the page
/// with a discarded build's value (an error, as that build lost its request context).
#[component]
pub fn RequireUser(children: ChildrenFn) -> impl IntoView {
    let location = use_location();
    let children = StoredValue::new(children);
    let Some(auth) = Auth::get() else { return view! { <ErrorAlert error=AppError::Unauthenticated/> }.into_any() };
    view! {
        <Suspense fallback=|| view! { <p class="text-slate-600">"Loading..."</p> }>
            {move || Suspend::new(async move {
                match auth.user.await {
                    Ok(Some(_)) => children.read_value()().into_any(),
                    Ok(None) => {
                        // `search` comes without its leading `?`.
                        let search = location.search.get_untracked();
                        let path = location.pathname.get_untracked();
                        let next = if search.is_empty() { path } else { format!("{path}?{search}") };
                        view! { <SignInPrompt next/> }.into_any()
                    }
                    Err(error) => view! { <ErrorAlert error/> }.into_any(),
                }
            })}
        </Suspense>
    }
    .into_any()
}

/// Shows `children` only to those whose role may book capacity (not viewers and auditors)
/// and, where `signed_out` is set, to those not signed in yet (signing in may let them):
/// the others see no launch controls.
#[component]
pub fn IfMayLaunch(#[prop(optional)] signed_out: bool, children: ChildrenFn) -> impl IntoView {
    let children = StoredValue::new(children);
    let auth = Auth::get();
    move || {
        let auth = auth?;
        Some(view! {
            <Transition fallback=|| ()>
                {move || Suspend::new(async move {
                    let shown = match auth.user.await {
                        Ok(Some(user)) => user.can_launch,
                        Ok(None) => signed_out,
                        Err(_) => false,
                    };
                    shown.then(|| children.read_value()())
                })}
            </Transition>
        })
    }
}

#[component]
fn SignInPrompt(next: String) -> impl IntoView {
    let href = format!("/login?next={}", urlencode(&next));
    view! {
        <div class="mx-auto max-w-md rounded-xl border border-slate-200 bg-white p-8 text-center shadow-sm">
            <h2 class="text-lg font-semibold text-slate-900">"Sign in to continue"</h2>
            <p class="mt-2 text-sm text-slate-600">"Launching and managing environments needs an account."</p>
            <a href=href class="mt-6 inline-block rounded-lg bg-indigo-600 px-4 py-2 text-sm font-semibold text-white hover:bg-indigo-500">
                "Sign in"
            </a>
        </div>
    }
}

/// Percent-encodes a path for use in a query string.
pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[component]
pub fn ErrorAlert(error: AppError) -> impl IntoView {
    let (title, body) = match &error {
        AppError::Refused(_) | AppError::Invalid { .. } | AppError::Malformed(_) => {
            ("That did not work", error.to_string())
        }
        AppError::NotFound => ("Not found", "There is nothing here, or it is not yours to see.".to_owned()),
        AppError::Unauthenticated => ("Signed out", "Your session has ended; sign in again.".to_owned()),
        AppError::Forbidden => ("Not allowed", "Your role does not allow this.".to_owned()),
        _ => ("Something went wrong", error.to_string()),
    };
    view! {
        <div role="alert" class="rounded-lg border border-red-200 bg-red-50 p-4 text-sm text-red-800">
            <p class="font-semibold">{title}</p>
            <p class="mt-1">{capitalize(&body)}</p>
        </div>
    }
}

pub fn capitalize(s: &str) -> String {
    let mut chars = s.chars();
    chars.next().map(|c| c.to_uppercase().chain(chars).collect()).unwrap_or_default()
}

/// A coloured pill for an environment state.
#[component]
pub fn StateBadge(state: String, label: String) -> impl IntoView {
    let (tone, dot) = state_colours(&state);
    view! {
        <span data-state=state class=format!("{STATE_PILL} {tone}")>
            <span class=format!("{STATE_DOT} {dot}")></span>
            {label}
        </span>
    }
}

/// A state pill's shape and its dot's, before their colours (`state_colours`).
pub const STATE_PILL: &str =
    "inline-flex items-center gap-1.5 rounded-full px-2.5 py-0.5 text-xs font-medium ring-1 ring-inset";
pub const STATE_DOT: &str = "h-1.5 w-1.5 rounded-full";

/// `text` as an HTML attribute's value or an element's text, escaped as Leptos escapes a
/// view's: for the pages that write hundreds of elements as one string.
pub fn escape_html(text: &str) -> std::borrow::Cow<'_, str> {
    html_escape::encode_double_quoted_attribute(text)
}

/// A state pill's classes: its colours, and its dot's.
pub fn state_colours(state: &str) -> (&'static str, &'static str) {
    match state {
        "requested" => ("bg-slate-100 text-slate-700 ring-slate-300", "bg-slate-400"),
        "scheduled" => ("bg-indigo-50 text-indigo-800 ring-indigo-300", "bg-indigo-400"),
        "provisioning" => ("bg-amber-50 text-amber-800 ring-amber-300", "bg-amber-500 animate-pulse"),
        "ready" => ("bg-emerald-50 text-emerald-800 ring-emerald-300", "bg-emerald-500"),
        "tearing_down" => ("bg-orange-50 text-orange-800 ring-orange-300", "bg-orange-500 animate-pulse"),
        "failed" | "degraded" => ("bg-red-50 text-red-800 ring-red-300", "bg-red-500"),
        // A node's lifecycle states (`domain::node_health`).
        "available" => ("bg-emerald-50 text-emerald-800 ring-emerald-300", "bg-emerald-500"),
        "testing" | "in_repair" => ("bg-amber-50 text-amber-800 ring-amber-300", "bg-amber-500"),
        "draining" => ("bg-orange-50 text-orange-800 ring-orange-300", "bg-orange-500"),
        _ => ("bg-slate-50 text-slate-600 ring-slate-200", "bg-slate-300"),
    }
}

/// The top bar: brand, navigation, and who is signed in. From `xl` widths on, everything
/// sits in one line; below, the links and the account collapse behind a "Menu" button (a
/// `<details>`, so it opens without JavaScript too).
#[component]
pub fn NavBar() -> impl IntoView {
    // The menu closes when anything in it is clicked: a link then goes to another page
    // while the bar stays (without JavaScript the new page comes with the menu closed).
    let menu = NodeRef::<leptos::html::Details>::new();
    let close_menu = move |_| {
        if let Some(details) = menu.get_untracked() {
            let _ = details.remove_attribute("open");
        }
    };
    if let Some(auth) = Auth::get() {
        poll_every(5_000, move || auth.refresh_bell());
    }
    view! {
        <header class="bg-slate-900 print:hidden">
            <nav class="mx-auto flex max-w-7xl items-center justify-between gap-4 px-4 py-3" aria-label="Main">
                <div class="flex items-center gap-4">
                    <A href="/catalog" attr:class="flex items-center gap-2 text-white">
                        <span class="grid h-8 w-8 place-items-center rounded-lg bg-indigo-600 font-bold">"B"</span>
                        <span class="text-lg font-semibold tracking-tight">"Berth"</span>
                    </A>
                    <div class="hidden gap-1 xl:flex">
                        <MainLinks/>
                    </div>
                </div>
                <div class="hidden xl:block">
                    <UserArea wide=true/>
                </div>
                <details node_ref=menu class="relative xl:hidden" data-menu="">
                    <summary class="cursor-pointer list-none rounded-md px-3 py-1.5 text-sm text-slate-100 ring-1 ring-slate-600 hover:bg-slate-800 [&::-webkit-details-marker]:hidden">
                        "Menu"
                    </summary>
                    <div on:click=close_menu class="absolute right-0 z-30 mt-2 flex w-64 flex-col gap-1 rounded-lg bg-slate-900 p-2 shadow-xl ring-1 ring-slate-700">
                        <MainLinks/>
                        <UserArea wide=false/>
                    </div>
                </details>
            </nav>
        </header>
    }
}

const NAV_LINK: &str = "rounded-md px-2 py-1.5 text-sm text-slate-300 hover:bg-slate-800 hover:text-white aria-[current=page]:bg-slate-800 aria-[current=page]:text-white";

/// Catalog, environments, availability, usage, volumes: for everyone.
#[component]
fn MainLinks() -> impl IntoView {
    view! {
        <A href="/catalog" attr:class=NAV_LINK>"Catalog"</A>
        <A href="/environments" attr:class=NAV_LINK>"Environments"</A>
        <A href="/calendar" attr:class=NAV_LINK>"Availability"</A>
        <A href="/volumes" attr:class=NAV_LINK>"Volumes"</A>
        <A href="/usage" attr:class=NAV_LINK>"Usage"</A>
    }
}

/// The links a role may use, who is signed in, and signing out; "Sign in" for the others.
/// `wide`: in the one-line bar (the test ids are there), else stacked in the menu.
#[component]
fn UserArea(wide: bool) -> impl IntoView {
    let auth = Auth::get();
    let layout = if wide { "flex items-center gap-1" } else { "flex flex-col gap-1 border-t border-slate-700 pt-2" };
    let testid = move |id: &'static str| wide.then_some(id);
    move || {
        let auth = auth?;
        Some(view! {
            <Transition fallback=|| ()>
                {move || Suspend::new(async move {
                    // Read in the same turn as the user: one Transition for the whole area.
                    let bell = auth.bell.await.ok().flatten().unwrap_or(BellView { unread: 0, latest: None });
                    match auth.user.await {
                        Ok(Some(user)) => view! {
                            <div class=layout>
                                {user.can_read_fleet.then(|| view! {
                                    <A href="/admin/fleet" attr:class=NAV_LINK>"Fleet"</A>
                                })}
                                {user.can_read_fleet.then(|| view! {
                                    <A href="/admin/fabric" attr:class=NAV_LINK>"Fabric"</A>
                                })}
                                {(user.can_set_quotas || user.can_read_fleet).then(|| view! {
                                    <A href="/admin/quotas" attr:class=NAV_LINK>"Quotas"</A>
                                })}
                                {user.can_read_tenants.then(|| view! {
                                    <A href="/admin/tenants" attr:class=NAV_LINK>"Tenants"</A>
                                })}
                                {user.tenant_id.map(|id| view! {
                                    <A href=format!("/tenants/{id}") attr:class=NAV_LINK>"Team"</A>
                                })}
                                {user.can_read_audit.then(|| view! {
                                    <A href="/audit" attr:class=NAV_LINK>"Audit"</A>
                                })}
                                <A href="/account" attr:class=NAV_LINK>"Account"</A>
                                <Bell bell=bell.clone() wide/>
                                <span class="px-2 text-sm text-slate-300" title=user.email.clone() data-testid=testid("who")>
                                    <span class=if wide { "hidden 2xl:inline" } else { "" }>{user.display_name.clone()}</span>
                                    <span class="ml-2 rounded bg-slate-700 px-1.5 py-0.5 text-xs" data-testid=testid("role")>{user.role.clone()}</span>
                                    {user.tenant_name.clone().map(|t| view! { <span class="ml-1 text-xs text-slate-400" data-testid=testid("tenant")>{t}</span> })}
                                </span>
                                <ActionForm action=auth.sign_out>
                                    <button type="submit" class="rounded-md px-3 py-1.5 text-sm text-slate-200 ring-1 ring-slate-600 hover:bg-slate-800">
                                        "Sign out"
                                    </button>
                                </ActionForm>
                            </div>
                        }.into_any(),
                        _ => view! {
                            <a href="/login" class="rounded-md bg-indigo-600 px-3 py-1.5 text-sm font-semibold text-white hover:bg-indigo-500">
                                "Sign in"
                            </a>
                        }.into_any(),
                    }
                })}
            </Transition>
        })
    }
}

/// The bell: a link to `/notifications` (so it works without JavaScript) with the unread
/// count; its title names the newest unread notification.
#[component]
fn Bell(bell: BellView, wide: bool) -> impl IntoView {
    let testid = move |id: &'static str| wide.then_some(id);
    let title = match (&bell.latest, bell.unread) {
        (Some(latest), n) => format!("Notifications: {n} unread; newest: {latest}"),
        (None, _) => "Notifications: none unread".to_owned(),
    };
    let badge = if bell.unread > 0 {
        "ml-1 rounded-full bg-amber-400 px-1.5 text-xs font-semibold text-slate-900"
    } else {
        "ml-1 rounded-full bg-slate-700 px-1.5 text-xs text-slate-300"
    };
    view! {
        // Named by its words, which include the count it shows ("Notifications, 2 unread").
        <A href="/notifications" attr:class=NAV_LINK attr:title=title>
            <span aria-hidden="true">"\u{1F514}"</span>
            <span class="sr-only">"Notifications, "</span>
            <span class=badge data-testid=testid("unread")>{bell.unread}</span>
            <span class="sr-only">" unread"</span>
        </A>
    }
}

/// Re-runs `refresh` every `ms` milliseconds in the browser (never on the server), so
/// pages show progress without a reload; only while someone is signed in, as the pages'
/// resources are made outside `RequireUser`.
pub fn poll_every(ms: u64, refresh: impl Fn() + Clone + 'static) {
    // Copied from the session's resource by an effect: a timer reading the resource itself
    // reads it outside Suspense, which Leptos warns of.
    let signed_in = RwSignal::new(true);
    if let Some(auth) = Auth::get() {
        Effect::new(move |_| signed_in.set(matches!(auth.user.get(), Some(Ok(Some(_))))));
    }
    Effect::new(move |_| {
        let refresh = refresh.clone();
        let tick = move || {
            if signed_in.get_untracked() {
                refresh()
            }
        };
        let handle = set_interval_with_handle(tick, std::time::Duration::from_millis(ms)).ok();
        on_cleanup(move || {
            if let Some(h) = handle {
                h.clear();
            }
        });
    });
}

/// Percent-encodes a query value.
pub fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
