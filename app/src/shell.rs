//! The HTML document and the routes.

use leptos::prelude::*;
use leptos_meta::{MetaTags, Stylesheet, Title, provide_meta_context};
use leptos_router::components::{Route, Router, Routes};
use leptos_router::{SsrMode, path};

use crate::components::{Auth, NavBar};
use crate::pages::{
    AccountPage, AuditPage, CalendarPage, CatalogPage, EnvironmentPage, EnvironmentsPage, FabricPage, FleetPage,
    LaunchPage, LoginPage, NewPasswordPage, NodePage, NotFound, NotificationsPage, QuotasPage, SecondFactorPage,
    TenantPage, TenantsPage, UsagePage, WebhooksPage,
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
                <HydrationScripts options/>
                <MetaTags/>
            </head>
            <body class="h-full">
                <App/>
            </body>
        </html>
    }
}

#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    view! {
        <Stylesheet id="berth" href="/pkg/berth.css"/>
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
                <NavBar/>
                <main class="mx-auto w-full max-w-6xl flex-1 px-4 py-8">
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
                        <Route path=path!("/usage") view=UsagePage ssr=SsrMode::Async/>
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
                <footer class="border-t border-slate-200 py-4 text-center text-xs text-slate-500">
                    "Berth · self-service GPU cloud"
                </footer>
            </div>
    }
}
