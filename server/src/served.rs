//! The routes Berth's portal serves, recorded as they are added: axum cannot list a router's
//! routes, and the authorization matrix must see every route the real router has. A route
//! added through [`Routes`] fails that test until the matrix calls it.

use std::collections::BTreeSet;

use axum::handler::Handler;
use axum::routing::MethodRouter;

/// `(method, path pattern)` pairs; `ANY` for a route that takes every method.
pub type Served = BTreeSet<(&'static str, String)>;

/// An axum router, with state `S`, that keeps the list of what it serves.
pub struct Routes<S> {
    router: axum::Router<S>,
    served: Served,
}

impl<S: Clone + Send + Sync + 'static> Routes<S> {
    pub fn new() -> Routes<S> {
        Routes { router: axum::Router::new(), served: Served::new() }
    }

    pub fn route(mut self, path: &str, handlers: Handlers<S>) -> Routes<S> {
        self.served.extend(handlers.methods.iter().map(|method| (*method, path.to_owned())));
        Routes { router: self.router.route(path, handlers.router), served: self.served }
    }

    /// These routes and `other`'s.
    pub fn merge(mut self, other: Routes<S>) -> Routes<S> {
        self.served.extend(other.served);
        Routes { router: self.router.merge(other.router), served: self.served }
    }

    /// Routes served by a router built elsewhere (Leptos' pages), listed here.
    pub fn with(
        mut self,
        router: axum::Router<S>,
        served: impl IntoIterator<Item = (&'static str, String)>,
    ) -> Routes<S> {
        self.served.extend(served);
        Routes { router: self.router.merge(router), served: self.served }
    }

    /// The router, and what it serves.
    pub fn into_parts(self) -> (axum::Router<S>, Served) {
        (self.router, self.served)
    }
}

impl<S: Clone + Send + Sync + 'static> Default for Routes<S> {
    fn default() -> Routes<S> {
        Routes::new()
    }
}

/// The handlers of one path, and the methods they answer.
pub struct Handlers<S> {
    methods: Vec<&'static str>,
    router: MethodRouter<S>,
}

impl<S: Clone + Send + Sync + 'static> Handlers<S> {
    pub fn get<H: Handler<T, S>, T: 'static>(mut self, handler: H) -> Handlers<S> {
        self.methods.push("GET");
        Handlers { methods: self.methods, router: self.router.get(handler) }
    }

    pub fn post<H: Handler<T, S>, T: 'static>(mut self, handler: H) -> Handlers<S> {
        self.methods.push("POST");
        Handlers { methods: self.methods, router: self.router.post(handler) }
    }

    pub fn patch<H: Handler<T, S>, T: 'static>(mut self, handler: H) -> Handlers<S> {
        self.methods.push("PATCH");
        Handlers { methods: self.methods, router: self.router.patch(handler) }
    }

    pub fn delete<H: Handler<T, S>, T: 'static>(mut self, handler: H) -> Handlers<S> {
        self.methods.push("DELETE");
        Handlers { methods: self.methods, router: self.router.delete(handler) }
    }

    pub fn put<H: Handler<T, S>, T: 'static>(mut self, handler: H) -> Handlers<S> {
        self.methods.push("PUT");
        Handlers { methods: self.methods, router: self.router.put(handler) }
    }
}

/// `handler` for GET (and HEAD).
pub fn get<S: Clone + Send + Sync + 'static, H: Handler<T, S>, T: 'static>(handler: H) -> Handlers<S> {
    Handlers { methods: vec!["GET"], router: axum::routing::get(handler) }
}

/// `handler` for POST.
pub fn post<S: Clone + Send + Sync + 'static, H: Handler<T, S>, T: 'static>(handler: H) -> Handlers<S> {
    Handlers { methods: vec!["POST"], router: axum::routing::post(handler) }
}

/// `handler` for PUT.
pub fn put<S: Clone + Send + Sync + 'static, H: Handler<T, S>, T: 'static>(handler: H) -> Handlers<S> {
    Handlers { methods: vec!["PUT"], router: axum::routing::put(handler) }
}

/// `handler` for DELETE.
pub fn delete<S: Clone + Send + Sync + 'static, H: Handler<T, S>, T: 'static>(handler: H) -> Handlers<S> {
    Handlers { methods: vec!["DELETE"], router: axum::routing::delete(handler) }
}

/// `handler` for every method.
pub fn any<S: Clone + Send + Sync + 'static, H: Handler<T, S>, T: 'static>(handler: H) -> Handlers<S> {
    Handlers { methods: vec!["ANY"], router: axum::routing::any(handler) }
}
