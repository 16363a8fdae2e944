//! The API's OpenAPI 3.1 description, made by utoipa from the handlers' `#[utoipa::path]`
//! attributes and their request and response types (`api::ApiDoc`), served at
//! `GET /api/v1/openapi.json` to anyone (it describes, it grants nothing). What every
//! operation shares is added here rather than repeated on each: its security scheme and the
//! problems (RFC 9457) it can answer with.

use std::sync::OnceLock;

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, header};
use serde_json::{Value, json};
use utoipa::Modify;
use utoipa::OpenApi as _;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::Operation;
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi, Ref, ResponseBuilder};

use crate::problem::PROBLEM_JSON;

/// The description's own path.
pub const DOCUMENT_PATH: &str = "/api/v1/openapi.json";

/// The description, made once.
pub fn document() -> &'static Value {
    static DOCUMENT: OnceLock<Value> = OnceLock::new();
    DOCUMENT.get_or_init(|| {
        let mut document = serde_json::to_value(crate::api::ApiDoc::openapi()).unwrap_or_default();
        add_links(&mut document);
        document
    })
}

/// This description of the API (OpenAPI 3.1), for clients, generators and fuzzers.
#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "description",
    responses((status = 200, description = "The OpenAPI 3.1 description of this API", body = Object)))]
pub async fn document_json() -> Response {
    static JSON: OnceLock<String> = OnceLock::new();
    let json = JSON.get_or_init(|| document().to_string());
    let mut response = json.clone().into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// Adds what every operation shares: the security schemes, each operation's (none for the
/// description itself; a node token for the agents' routes; a person's token for the rest),
/// and the problems it may answer with.
pub struct Described;

/// The person's API token's scheme.
pub const BEARER: &str = "bearer";
/// A node's token (`berth agent`).
pub const NODE_TOKEN: &str = "node_token";

impl Modify for Described {
    fn modify(&self, openapi: &mut OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let mut person = Http::new(HttpAuthScheme::Bearer);
        person.bearer_format = Some("berth_…".into());
        person.description = Some("A personal API token, made on the account page (Tokens).".into());
        components.add_security_scheme(BEARER, SecurityScheme::Http(person));
        let mut node = Http::new(HttpAuthScheme::Bearer);
        node.bearer_format = Some("berth_node_…".into());
        node.description = Some("A node's token for `berth agent`, made on the fleet page.".into());
        components.add_security_scheme(NODE_TOKEN, SecurityScheme::Http(node));

        for (path, item) in openapi.paths.paths.iter_mut() {
            let operations =
                [&mut item.get, &mut item.post, &mut item.put, &mut item.patch, &mut item.delete, &mut item.head];
            for operation in operations.into_iter().flatten() {
                describe_operation(path, operation);
            }
        }
    }
}

/// Where an answer leads (OpenAPI links): the id a launch, a volume, a quota, a maintenance
/// window or a listing answers with, given to the operations on that thing. Clients and
/// schemathesis' stateful tests follow them. `(path, method, status, link, operation id,
/// parameter, where the value is)`.
const LINKS: &[(&str, &str, &str, &str, &str, &str, &str)] = &[
    ("/api/v1/environments", "post", "201", "show", "environment", "id", "$response.body#/id"),
    ("/api/v1/environments", "post", "201", "stop", "stop", "id", "$response.body#/id"),
    ("/api/v1/environments", "post", "201", "change_end", "change_end", "id", "$response.body#/id"),
    ("/api/v1/environments", "post", "201", "logs", "logs", "id", "$response.body#/id"),
    ("/api/v1/environments", "get", "200", "first", "environment", "id", "$response.body#/environments/0/id"),
    ("/api/v1/environments", "post", "201", "idle", "idle_status", "id", "$response.body#/id"),
    ("/api/v1/environments", "post", "201", "keep", "keep_environment", "id", "$response.body#/id"),
    ("/api/v1/environments", "post", "201", "gpu_use", "gpu_use", "id", "$response.body#/id"),
    ("/api/v1/volumes", "post", "201", "show", "volume", "id", "$response.body#/id"),
    ("/api/v1/volumes", "post", "201", "resize", "resize_volume", "id", "$response.body#/id"),
    ("/api/v1/volumes", "post", "201", "delete", "delete_volume", "id", "$response.body#/id"),
    ("/api/v1/volumes", "get", "200", "first", "volume", "id", "$response.body#/volumes/0/id"),
    ("/api/v1/images", "post", "201", "remove", "remove_image", "id", "$response.body#/id"),
    ("/api/v1/images", "post", "201", "make_default", "set_default_image", "id", "$response.body#/id"),
    ("/api/v1/tenants", "get", "200", "members", "members", "id", "$response.body#/tenants/0/id"),
    ("/api/v1/tenants", "get", "200", "projects", "projects", "id", "$response.body#/tenants/0/id"),
    ("/api/v1/quotas", "put", "200", "remove", "remove_quota", "id", "$response.body#/id"),
    ("/api/v1/maintenance", "post", "201", "cancel", "cancel_maintenance", "id", "$response.body#/window/id"),
    ("/api/v1/ssh-keys", "get", "200", "remove_first", "remove_ssh_key", "id", "$response.body#/ssh_keys/0/id"),
];

/// Adds [`LINKS`] to the document as JSON: utoipa 5's `Link` writes `operation_id` where
/// OpenAPI says `operationId`.
fn add_links(document: &mut Value) {
    for (path, method, status, name, target, parameter, value) in LINKS {
        if let Some(response) = document.pointer_mut(&format!("/paths/{}/{method}/responses/{status}", pointer(path)))
            && let Some(response) = response.as_object_mut()
        {
            let links = response.entry("links").or_insert_with(|| json!({}));
            links[*name] = json!({ "operationId": target, "parameters": { *parameter: value } });
        }
    }
}

/// A JSON pointer's escaping of one key (RFC 6901).
fn pointer(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn describe_operation(path: &str, operation: &mut Operation) {
    let public = path == DOCUMENT_PATH;
    if !public {
        let scheme = if path.starts_with("/api/v1/agent/") { NODE_TOKEN } else { BEARER };
        operation.security = Some(vec![SecurityRequirement::new(scheme, Vec::<String>::new())]);
    }
    let mut problems: Vec<(&str, &str)> = vec![
        ("429", "Too many requests: `Retry-After` says in how many seconds to try again"),
        ("500", "Something went wrong on Berth's side; the request id finds its log lines"),
    ];
    if !public {
        problems.extend([
            ("400", "The request could not be read: a path or query parameter, or the body's JSON"),
            ("401", "No valid token: `Authorization: Bearer …`"),
            ("403", "The token's person (or the token) may not do this"),
            ("404", "No such thing in the caller's reach"),
            ("422", "Refused: the detail says why (a rule, a quota, no capacity, a body that does not fit)"),
        ]);
    }
    if operation.request_body.is_some() {
        problems.extend([("413", "The body is too large"), ("415", "The body is not sent as `application/json`")]);
    }
    // A success that says nothing more is described by its status's reason phrase.
    for (status, response) in operation.responses.responses.iter_mut() {
        if let utoipa::openapi::RefOr::T(response) = response
            && response.description.is_empty()
        {
            let reason = status.parse::<u16>().ok().and_then(|s| http::StatusCode::from_u16(s).ok());
            response.description = reason.and_then(|s| s.canonical_reason()).unwrap_or("Success").to_owned();
        }
    }
    for (status, description) in problems {
        operation.responses.responses.entry(status.to_owned()).or_insert_with(|| {
            let mut response = ResponseBuilder::new()
                .description(description)
                .content(PROBLEM_JSON, ContentBuilder::new().schema(Some(Ref::from_schema_name("Problem"))).build());
            let integer = || ObjectBuilder::new().schema_type(Type::Integer);
            let text = || ObjectBuilder::new().schema_type(Type::String);
            response = match status {
                "429" => response.header(
                    "Retry-After",
                    HeaderBuilder::new().schema(integer()).description(Some("Seconds to wait")).build(),
                ),
                "401" => response.header(
                    "WWW-Authenticate",
                    HeaderBuilder::new().schema(text()).description(Some("`Bearer`")).build(),
                ),
                _ => response,
            };
            response.build().into()
        });
    }
}
