//! One module per page.

mod account;
mod audit;
mod calendar;
mod catalog;
mod environment;
mod environments;
mod fabric;
mod fleet;
mod idle;
mod images;
mod launch;
mod login;
mod node;
mod notifications;
mod prices;
mod quotas;
mod statements;
mod tenants;
mod usage;
mod volumes;

pub use account::AccountPage;
pub use audit::AuditPage;
pub use calendar::CalendarPage;
pub use catalog::CatalogPage;
pub use environment::EnvironmentPage;
pub use environments::EnvironmentsPage;
pub use fabric::FabricPage;
pub use fleet::FleetPage;
pub use idle::IdlePoliciesPage;
pub use images::ImagesPage;
pub use launch::LaunchPage;
pub use login::{LoginPage, NewPasswordPage, SecondFactorPage};
pub use node::NodePage;
pub use notifications::NotificationsPage;
pub use prices::PricesPage;
pub use quotas::QuotasPage;
pub use statements::{StatementPage, StatementsPage};
pub use tenants::{TenantPage, TenantsPage, WebhooksPage};
pub use usage::UsagePage;
pub use volumes::VolumesPage;

use leptos::prelude::*;
use leptos_meta::Title;

/// `/environments/<id>/open` and `/env/...`: answered by the server, never by the app.
#[cfg(feature = "hydrate")]
fn is_server_route(path: &str) -> bool {
    let open = path
        .strip_prefix("/environments/")
        .and_then(|rest| rest.strip_suffix("/open"))
        .is_some_and(|id| !id.is_empty() && !id.contains('/'));
    open || path.starts_with("/env/")
}

#[component]
pub fn NotFound() -> impl IntoView {
    #[cfg(feature = "ssr")]
    if let Some(response) = use_context::<leptos_axum::ResponseOptions>() {
        response.set_status(http::StatusCode::NOT_FOUND);
    }
    // Opening an environment (and old `/env/` links) are server routes, not the app's: a
    // client-side navigation there (after signing in, say) loads it from the server instead.
    #[cfg(feature = "hydrate")]
    if is_server_route(&leptos_router::hooks::use_location().pathname.get_untracked()) {
        Effect::new(move |_| {
            let _ = window().location().reload();
        });
    }
    view! {
        <Title text="Not found"/>
        <div class="py-24 text-center">
            <p class="text-sm font-semibold text-indigo-600">"404"</p>
            <h1 class="mt-2 text-3xl font-bold text-slate-900">"Page not found"</h1>
            <a href="/catalog" class="mt-6 inline-block text-sm font-semibold text-indigo-600 hover:text-indigo-500">"Back to the catalog"</a>
        </div>
    }
}
