#![recursion_limit = "256"]
//! Berth's web UI: server-rendered with Leptos, hydrated in the browser, every form
//! usable before the WASM loads.
//!
//! - [`shell`]: the HTML document and the router.
//! - `pages/`: one module per page.
//! - [`serverfns`]: the server functions; each authenticates, makes one platform call and
//!   maps the result to the view types in [`model`] (times in words by `time`).

pub mod error;
pub mod model;
pub mod serverfns;
#[cfg(feature = "ssr")]
pub mod session;
pub mod shell;
#[cfg(feature = "ssr")]
pub mod time;

mod components;
mod pages;

pub use components::url_encode;

pub use shell::{App, shell};

/// Where the sign-in page's "Continue with single sign-on" goes: the server finds the
/// person's provider by `hint` (work email or organization) and sends them on.
pub const SSO_FIND_PATH: &str = "/auth/oidc/find";

#[cfg(feature = "hydrate")]
#[wasm_bindgen::prelude::wasm_bindgen]
pub fn hydrate() {
    console_error_panic_hook::set_once();
    leptos::mount::hydrate_body(App);
    // A mark for the browser tests: the page is interactive now (a hydration panic never
    // gets here).
    if let Some(body) = leptos::prelude::document().body() {
        let _ = body.set_attribute("data-hydrated", "");
    }
}
