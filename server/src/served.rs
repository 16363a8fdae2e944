//! The routes Berth serves beside Leptos' pages and server functions (the JSON API, the
//! browser routes, an environment's origin), recorded as they are added. axum cannot list a
//! router's routes, and the authorization matrix must see every route the real router has:
//! a route added through [`Routes`] fails that test until the matrix calls it.

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};

use axum::handler::Handler;
use axum::routing::MethodRouter;

use crate::http::AppState;

/// Every `(method, path pattern)` a [`Routes`] was given in this process; `ANY` for a route
/// that takes every method.
static SERVED: Mutex<BTreeSet<(&'static str, String)>> = Mutex::new(BTreeSet::new());

/// The routes served so far: those of every router built in this process.
#[cfg_attr(not(test), allow(dead_code))]
pub fn served() -> BTreeSet<(&'static str, String)> {
    SERVED.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

/// An axum router that records what it serves.
pub struct Routes(axum::Router<AppState>);

impl Routes {
    pub fn new() -> Routes {
        Routes(axum::Router::new())
    }

    pub fn route(self, path: &str, handlers: Handlers) -> Routes {
        let mut served = SERVED.lock().unwrap_or_else(PoisonError::into_inner);
        served.extend(handlers.methods.iter().map(|method| (*method, path.to_owned())));
        Routes(self.0.route(path, handlers.router))
    }
}

impl Default for Routes {
    fn default() -> Routes {
        Routes::new()
    }
}

impl From<Routes> for axum::Router<AppState> {
    fn from(routes: Routes) -> axum::Router<AppState> {
        routes.0
    }
}

/// The handlers of one path, and the methods they answer.
pub struct Handlers {
    methods: Vec<&'static str>,
    router: MethodRouter<AppState>,
}

impl Handlers {
    pub fn get<H: Handler<T, AppState>, T: 'static>(mut self, handler: H) -> Handlers {
        self.methods.push("GET");
        Handlers { methods: self.methods, router: self.router.get(handler) }
    }

    pub fn post<H: Handler<T, AppState>, T: 'static>(mut self, handler: H) -> Handlers {
        self.methods.push("POST");
        Handlers { methods: self.methods, router: self.router.post(handler) }
    }
}

/// `handler` for GET (and HEAD).
pub fn get<H: Handler<T, AppState>, T: 'static>(handler: H) -> Handlers {
    Handlers { methods: vec!["GET"], router: axum::routing::get(handler) }
}

/// `handler` for POST.
pub fn post<H: Handler<T, AppState>, T: 'static>(handler: H) -> Handlers {
    Handlers { methods: vec!["POST"], router: axum::routing::post(handler) }
}

/// `handler` for every method.
pub fn any<H: Handler<T, AppState>, T: 'static>(handler: H) -> Handlers {
    Handlers { methods: vec!["ANY"], router: axum::routing::any(handler) }
}
