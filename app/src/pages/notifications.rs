use leptos::prelude::*;
use leptos_meta::Title;

use crate::components::{Auth, CARD, ErrorAlert, RequireUser};
use crate::model::NotificationsView;
use crate::serverfns::{MarkNotificationsRead, notifications};

/// `/notifications`: the signed-in person's notifications, newest first, each linking to
/// what it is about, and "Mark all read" (a plain form post without JavaScript).
#[component]
pub fn NotificationsPage() -> impl IntoView {
    let mark = ServerAction::<MarkNotificationsRead>::new();
    let inbox = Resource::new(move || mark.version().get(), |_| notifications());
    // The bell follows at once, not at its next look.
    Effect::new(move |_| {
        if mark.version().get() > 0
            && let Some(auth) = Auth::get()
        {
            auth.refresh_bell();
        }
    });
    view! {
        <Title text="Notifications"/>
        <RequireUser>
            <Transition fallback=|| view! { <p class="text-slate-600">"Loading..."</p> }>
                {move || Suspend::new(async move {
                    match inbox.await {
                        Ok(view) => view! { <Inbox view mark/> }.into_any(),
                        Err(error) => view! { <ErrorAlert error/> }.into_any(),
                    }
                })}
            </Transition>
        </RequireUser>
    }
}

#[component]
fn Inbox(view: NotificationsView, mark: ServerAction<MarkNotificationsRead>) -> impl IntoView {
    let unread = view.unread;
    let error = move || {
        mark.value().get().and_then(Result::err).map(|error| view! { <div class="mt-4"><ErrorAlert error/></div> })
    };
    view! {
        <div class="flex flex-wrap items-end justify-between gap-4">
            <div>
                <h1 class="text-2xl font-bold tracking-tight text-slate-900">"Notifications"</h1>
                <p class="mt-1 text-sm text-slate-600" data-testid="unread-summary">
                    {match unread {
                        0 => "Nothing unread.".to_owned(),
                        1 => "1 unread.".to_owned(),
                        n => format!("{n} unread."),
                    }}
                    " Choose what reaches you, and how, on your "
                    <a href="/account#notifications" class="text-indigo-600 hover:text-indigo-500">"account page"</a>
                    "."
                </p>
            </div>
            {(unread > 0).then(|| view! {
                <ActionForm action=mark>
                    <button type="submit" data-testid="mark-all-read"
                        class="rounded-lg bg-white px-3 py-1.5 text-sm font-semibold text-slate-700 ring-1 ring-slate-300 hover:bg-slate-50">
                        "Mark all read"
                    </button>
                </ActionForm>
            })}
        </div>
        {error}
        <section class=CARD aria-label="Your notifications">
            {if view.items.is_empty() {
                view! { <p class="text-sm text-slate-600">"No notifications yet."</p> }.into_any()
            } else {
                view! {
                    <ul class="divide-y divide-slate-100" data-testid="notifications">
                        {view.items.into_iter().map(|n| {
                            let tone = if n.read { "text-slate-600" } else { "font-semibold text-slate-900" };
                            view! {
                                <li class="py-3" data-kind=n.kind.clone() data-read=n.read.to_string()>
                                    <a href=n.link.clone() class=format!("hover:text-indigo-600 {tone}")>{n.title.clone()}</a>
                                    {(!n.read).then(|| view! {
                                        <span class="ml-2 rounded-full bg-amber-100 px-2 py-0.5 text-xs text-amber-900">"new"</span>
                                    })}
                                    <p class="mt-0.5 text-sm text-slate-600">{n.body.clone()}</p>
                                    <p class="mt-0.5 text-xs text-slate-600">{n.when.clone()}</p>
                                </li>
                            }
                        }).collect_view()}
                    </ul>
                }.into_any()
            }}
        </section>
    }
}
