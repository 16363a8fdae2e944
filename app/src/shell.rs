//! The HTML document and the routes.

use leptos::prelude::*;
use leptos_meta::{MetaTags, Title, provide_meta_context};
use leptos_router::components::{Route, Router, Routes};
use leptos_router::hooks::use_location;
use leptos_router::{SsrMode, path};

use crate::components::{Auth, NavBar};
use crate::pages::{
    AccountPage, AuditPage, CalendarPage, CatalogPage, EnvironmentPage, EnvironmentsPage, FabricPage, FleetPage,
    IdlePoliciesPage, ImagesPage, LaunchPage, LoginPage, NewPasswordPage, NodePage, NotFound, NotificationsPage,
    PricesPage, QuotasPage, SecondFactorPage, StatementPage, StatementsPage, TenantPage, TenantsPage, UsagePage,
    VolumesPage, WebhooksPage,
};

/// The whole document, rendered on the server.
pub fn shell(options: LeptosOptions) -> impl IntoView {
    view! {
        <!DOCTYPE html>
        <html lang="en" class="h-full bg-slate-50">
            <head>
                <meta charset="utf-8"/>
                <meta name="viewport" content="width=device-width, initial-scale=1"/>
                <link rel="icon" href="/favicon.svg" type="image/svg+xml"/>
                <link rel="stylesheet" href=stylesheet_href(&options)/>
                <HydrationScripts options/>
                <MetaTags/>
            </head>
            <body class="h-full">
                <App/>
            </body>
        </html>
    }
}

/// The styles' address: `berth.<hash>.css` in a release site (`css:` in its hash file, the
/// file Leptos reads for the script and the WebAssembly), `berth.css` in a development one.
fn stylesheet_href(options: &LeptosOptions) -> String {
    let pkg = &options.site_pkg_dir;
    let hashes = if options.hash_files {
        std::fs::read_to_string(options.hash_file.as_ref()).unwrap_or_default()
    } else {
        String::new()
    };
    match hashes.lines().filter_map(|line| line.split_once(':')).find(|(file, _)| file.trim() == "css") {
        Some((_, hash)) => format!("/{pkg}/berth.{}.css", hash.trim()),
        None => format!("/{pkg}/berth.css"),
    }
}

#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    view! {
        <Title formatter=|page: String| if page.is_empty() { "Berth".to_owned() } else { format!("{page} · Berth") }/>
        <Router>
            <Frame/>
        </Router>
    }
}

/// Everything inside the router. Pages render whole on the server (`SsrMode::Async`):
/// streamed Suspense fragments need JavaScript to be put in place, and every page must
/// work before the WASM loads.
#[component]
fn Frame() -> impl IntoView {
    Auth::provide();
    view! {
            <div class="flex min-h-full flex-col">
                // The first stop for a keyboard: past the navigation's links to the page.
                // `rel="external"`: the browser, not the router, follows it and moves the focus.
                <a href="#main" rel="external" class="sr-only rounded-md bg-white px-3 py-2 text-sm font-semibold text-indigo-800 focus:not-sr-only focus:absolute focus:left-2 focus:top-2 focus:z-50">
                    "Skip to content"
                </a>
                <NavBar/>
                <RouteAnnouncer/>
                <main id="main" tabindex="-1" class="mx-auto w-full max-w-6xl flex-1 px-4 py-8 focus:outline-none">
                    <Routes fallback=NotFound>
                        <Route path=path!("/") view=CatalogPage ssr=SsrMode::Async/>
                        <Route path=path!("/catalog") view=CatalogPage ssr=SsrMode::Async/>
                        <Route path=path!("/launch/:offering") view=LaunchPage ssr=SsrMode::Async/>
                        <Route path=path!("/environments") view=EnvironmentsPage ssr=SsrMode::Async/>
                        <Route path=path!("/calendar") view=CalendarPage ssr=SsrMode::Async/>
                        <Route path=path!("/admin/fleet") view=FleetPage ssr=SsrMode::Async/>
                        <Route path=path!("/admin/nodes/:id") view=NodePage ssr=SsrMode::Async/>
                        <Route path=path!("/admin/fabric") view=FabricPage ssr=SsrMode::Async/>
                        <Route path=path!("/admin/quotas") view=QuotasPage ssr=SsrMode::Async/>
                        <Route path=path!("/idle-policies") view=IdlePoliciesPage ssr=SsrMode::Async/>
                        <Route path=path!("/usage") view=UsagePage ssr=SsrMode::Async/>
                        <Route path=path!("/volumes") view=VolumesPage ssr=SsrMode::Async/>
                        <Route path=path!("/images") view=ImagesPage ssr=SsrMode::Async/>
                        <Route path=path!("/admin/images") view=ImagesPage ssr=SsrMode::Async/>
                        <Route path=path!("/prices") view=PricesPage ssr=SsrMode::Async/>
                        <Route path=path!("/usage/statements") view=StatementsPage ssr=SsrMode::Async/>
                        <Route path=path!("/usage/statements/:id") view=StatementPage ssr=SsrMode::Async/>
                        <Route path=path!("/admin/prices") view=PricesPage ssr=SsrMode::Async/>
                        <Route path=path!("/admin/tenants") view=TenantsPage ssr=SsrMode::Async/>
                        <Route path=path!("/tenants/:id") view=TenantPage ssr=SsrMode::Async/>
                        <Route path=path!("/tenants/:id/webhooks") view=WebhooksPage ssr=SsrMode::Async/>
                        <Route path=path!("/environments/:id") view=EnvironmentPage ssr=SsrMode::Async/>
                        <Route path=path!("/account") view=AccountPage ssr=SsrMode::Async/>
                        <Route path=path!("/notifications") view=NotificationsPage ssr=SsrMode::Async/>
                        <Route path=path!("/audit") view=AuditPage ssr=SsrMode::Async/>
                        <Route path=path!("/login") view=LoginPage ssr=SsrMode::Async/>
                        <Route path=path!("/login/code") view=SecondFactorPage ssr=SsrMode::Async/>
                        <Route path=path!("/login/password") view=NewPasswordPage/>
                    </Routes>
                </main>
                <footer class="border-t border-slate-200 py-4 text-center text-xs text-slate-600">
                    "Berth · self-service GPU cloud"
                </footer>
            </div>
    }
}

/// Tells screen readers that the page changed after a navigation in the browser (a full
/// page load they announce themselves): the new page's title, in a polite live region.
#[component]
fn RouteAnnouncer() -> impl IntoView {
    let location = use_location();
    let message = RwSignal::new(String::new());
    // The page the document was loaded with; the effect may first run after a navigation.
    let shown = StoredValue::new(location.pathname.get_untracked());
    Effect::new(move |_| {
        let path = location.pathname.get();
        if path == shown.get_value() {
            return;
        }
        shown.set_value(path);
        // After the new page's `<Title>` has set the document's title.
        set_timeout(move || message.set(document().title()), std::time::Duration::from_millis(100));
    });
    view! {
        <p class="sr-only" aria-live="polite" aria-atomic="true" data-testid="route-announcer">{move || message.get()}</p>
    }
}
