//! `GET /api/docs`: the API's reference, rendered on the server from the same OpenAPI
//! document `GET /api/v1/openapi.json` serves (`openapi::document`). Plain HTML with its
//! styles inline: no script, no asset from elsewhere, so it works without JavaScript, under
//! the portal's content security policy and offline.

use std::fmt::Write as _;
use std::sync::OnceLock;

use axum::response::Html;
use serde_json::Value;

use crate::served::{Routes, get};
use crate::state::{AppState, escape_html};

/// The reference page's path.
pub const DOCS_PATH: &str = "/api/docs";

pub fn routes() -> Routes<AppState> {
    Routes::new().route(DOCS_PATH, get(reference))
}

/// The reference page, made once from the description.
async fn reference() -> Html<&'static str> {
    static PAGE: OnceLock<String> = OnceLock::new();
    Html(PAGE.get_or_init(|| render(crate::openapi::document())))
}

const METHODS: [&str; 6] = ["get", "post", "put", "patch", "delete", "head"];

/// One operation of the document, as the page lists it.
struct Operation<'a> {
    method: &'a str,
    path: &'a str,
    body: &'a Value,
}

impl Operation<'_> {
    fn anchor(&self) -> String {
        let id = self.body["operationId"].as_str().map(str::to_owned);
        format!(
            "op-{}",
            id.unwrap_or_else(|| format!("{}-{}", self.method, self.path.replace(['/', '{', '}', '.'], "-")))
        )
    }

    fn tag(&self) -> &str {
        self.body["tags"][0].as_str().unwrap_or("other")
    }
}

/// The whole page.
pub fn render(document: &Value) -> String {
    let title = text(&document["info"]["title"]);
    let mut operations: Vec<Operation> = document["paths"]
        .as_object()
        .into_iter()
        .flatten()
        .flat_map(|(path, item)| {
            METHODS.iter().filter_map(move |method| item.get(*method).map(|body| Operation { method, path, body }))
        })
        .collect();
    operations.sort_by(|a, b| (a.tag(), a.path).cmp(&(b.tag(), b.path)));
    let mut tags: Vec<&str> = operations.iter().map(Operation::tag).collect();
    tags.dedup();
    let schemas = document["components"]["schemas"].as_object();

    let mut html = String::with_capacity(64 * 1024);
    let _ = write!(
        html,
        r##"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>{title} reference</title><style>{STYLE}</style></head><body><a class="skip" href="#main">Skip to content</a><header><a href="/">Berth</a> <span aria-hidden="true">/</span> API reference</header><div class="layout"><nav aria-label="API contents"><p class="nav-title">Contents</p><ul><li><a href="#authentication">Authentication and errors</a></li>"##
    );
    for tag in &tags {
        let _ = write!(html, r##"<li><a href="#tag-{tag}">{}</a><ul>"##, escape_html(&capitalised(tag)));
        for op in operations.iter().filter(|op| op.tag() == *tag) {
            let _ = write!(
                html,
                r##"<li><a href="#{}"><span class="method">{}</span> {}</a></li>"##,
                op.anchor(),
                op.method.to_uppercase(),
                escape_html(op.path)
            );
        }
        html.push_str("</ul></li>");
    }
    html.push_str(r##"<li><a href="#schemas">Schemas</a></li></ul></nav><main id="main" tabindex="-1">"##);
    let _ = write!(
        html,
        r#"<h1>{title} reference</h1><p>{}</p><p>Version {}. The machine-readable description (OpenAPI {}): <a href="{}">{}</a>.</p>"#,
        prose(&document["info"]["description"]),
        text(&document["info"]["version"]),
        text(&document["openapi"]),
        crate::openapi::DOCUMENT_PATH,
        crate::openapi::DOCUMENT_PATH,
    );

    html.push_str(r#"<section aria-labelledby="authentication"><h2 id="authentication">Authentication and errors</h2><table><caption>Security schemes</caption><thead><tr><th scope="col">Name</th><th scope="col">Kind</th><th scope="col">Description</th></tr></thead><tbody>"#);
    for (name, scheme) in document["components"]["securitySchemes"].as_object().into_iter().flatten() {
        let _ = write!(
            html,
            "<tr><td><code>{}</code></td><td>HTTP {} ({})</td><td>{}</td></tr>",
            escape_html(name),
            text(&scheme["scheme"]),
            text(&scheme["bearerFormat"]),
            prose(&scheme["description"])
        );
    }
    let _ = write!(
        html,
        r##"</tbody></table><p>Every error is a problem (RFC 9457, <code>application/problem+json</code>): see <a href="#schema-Problem">Problem</a>. Too many requests are answered 429 with <code>Retry-After</code>.</p></section>"##
    );

    for tag in &tags {
        let _ = write!(
            html,
            r#"<section aria-labelledby="tag-{tag}"><h2 id="tag-{tag}">{}</h2>"#,
            escape_html(&capitalised(tag))
        );
        for op in operations.iter().filter(|op| op.tag() == *tag) {
            operation(&mut html, op);
        }
        html.push_str("</section>");
    }

    html.push_str(r#"<section aria-labelledby="schemas"><h2 id="schemas">Schemas</h2>"#);
    for (name, schema) in schemas.into_iter().flatten() {
        let _ = write!(html, r#"<h3 id="schema-{0}">{0}</h3>"#, escape_html(name));
        schema_body(&mut html, name, schema);
    }
    html.push_str("</section></main></div></body></html>");
    html
}

fn operation(html: &mut String, op: &Operation) {
    let body = op.body;
    let _ = write!(
        html,
        r#"<article aria-labelledby="{0}"><h3 id="{0}"><span class="method">{1}</span> <code>{2}</code></h3>"#,
        op.anchor(),
        op.method.to_uppercase(),
        escape_html(op.path)
    );
    for part in ["summary", "description"] {
        if body[part].is_string() {
            let _ = write!(html, "<p>{}</p>", prose(&body[part]));
        }
    }
    let security: Vec<String> = body["security"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r.as_object().into_iter().flat_map(|o| o.keys()))
        .map(|name| format!("<code>{}</code>", escape_html(name)))
        .collect();
    let _ = write!(
        html,
        "<p><strong>Authentication:</strong> {}</p>",
        if security.is_empty() { "none".to_owned() } else { security.join(" or ") }
    );

    if let Some(parameters) = body["parameters"].as_array().filter(|p| !p.is_empty()) {
        html.push_str(r#"<table><caption>Parameters</caption><thead><tr><th scope="col">Name</th><th scope="col">In</th><th scope="col">Type</th><th scope="col">Required</th><th scope="col">Description</th></tr></thead><tbody>"#);
        for p in parameters {
            let _ = write!(
                html,
                "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                text(&p["name"]),
                text(&p["in"]),
                type_of(&p["schema"]),
                yes_no(p["required"].as_bool().unwrap_or(false)),
                prose(&p["description"])
            );
        }
        html.push_str("</tbody></table>");
    }

    if let Some(request) = body["requestBody"].as_object() {
        let required = request.get("required").and_then(Value::as_bool).unwrap_or(false);
        for (media, content) in request.get("content").and_then(Value::as_object).into_iter().flatten() {
            let _ = write!(
                html,
                "<p><strong>Body</strong> ({}, <code>{}</code>): {}{}</p>",
                if required { "required" } else { "optional" },
                escape_html(media),
                type_of(&content["schema"]),
                request.get("description").map(|d| format!(". {}", prose(d))).unwrap_or_default()
            );
        }
    }

    html.push_str(r#"<table><caption>Responses</caption><thead><tr><th scope="col">Status</th><th scope="col">Description</th><th scope="col">Body</th></tr></thead><tbody>"#);
    for (status, response) in body["responses"].as_object().into_iter().flatten() {
        let bodies: Vec<String> = response["content"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(media, content)| format!("{} (<code>{}</code>)", type_of(&content["schema"]), escape_html(media)))
            .collect();
        let headers: Vec<String> = response["headers"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(name, header)| format!("<code>{}</code>: {}", escape_html(name), prose(&header["description"])))
            .collect();
        let headers = if headers.is_empty() { String::new() } else { format!(" Headers: {}.", headers.join("; ")) };
        let links: Vec<String> = response["links"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(_, link)| {
                let target = link["operationId"].as_str()?;
                let (parameter, value) = link["parameters"].as_object()?.iter().next()?;
                Some(format!(
                    r##"<a href="#op-{0}">{0}</a> (<code>{1}</code> from <code>{2}</code>)"##,
                    escape_html(target),
                    escape_html(parameter),
                    text(value)
                ))
            })
            .collect();
        let headers = match links.is_empty() {
            true => headers,
            false => format!("{headers} Leads to: {}.", links.join(", ")),
        };
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}{}</td><td>{}</td></tr>",
            escape_html(status),
            prose(&response["description"]),
            headers,
            if bodies.is_empty() { "none".to_owned() } else { bodies.join(", ") }
        );
    }
    html.push_str("</tbody></table></article>");
}

/// A schema of `components`: its description, and its fields in a table.
fn schema_body(html: &mut String, name: &str, schema: &Value) {
    if schema["description"].is_string() {
        let _ = write!(html, "<p>{}</p>", prose(&schema["description"]));
    }
    let mut parts = vec![schema];
    if let Some(all) = schema["allOf"].as_array() {
        let whole: Vec<String> = all.iter().filter(|s| s.get("$ref").is_some()).map(type_of).collect();
        if !whole.is_empty() {
            let _ = write!(html, "<p>Every field of {}, and:</p>", whole.join(", "));
        }
        parts.extend(all.iter().filter(|s| s.get("properties").is_some()));
    }
    let fields: Vec<(&String, &Value, bool)> = parts
        .iter()
        .flat_map(|part| {
            let required: Vec<&str> =
                part["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
            part["properties"]
                .as_object()
                .into_iter()
                .flatten()
                .map(move |(field, s)| (field, s, required.contains(&field.as_str())))
        })
        .collect();
    if fields.is_empty() {
        let _ = write!(html, "<p>{}</p>", type_of(schema));
        return;
    }
    let _ = write!(
        html,
        r#"<table><caption>Fields of {}</caption><thead><tr><th scope="col">Field</th><th scope="col">Type</th><th scope="col">Required</th><th scope="col">Description</th></tr></thead><tbody>"#,
        escape_html(name)
    );
    for (field, s, required) in fields {
        let _ = write!(
            html,
            "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape_html(field),
            type_of(s),
            yes_no(required),
            prose(&s["description"])
        );
    }
    html.push_str("</tbody></table>");
}

/// A schema's type in words, with links to the named schemas it uses.
fn type_of(schema: &Value) -> String {
    if let Some(reference) = schema["$ref"].as_str() {
        let name = escape_html(reference.rsplit('/').next().unwrap_or(reference));
        return format!(r##"<a href="#schema-{name}">{name}</a>"##);
    }
    for (key, joint) in [("oneOf", " or "), ("anyOf", " or "), ("allOf", " and ")] {
        if let Some(items) = schema[key].as_array() {
            return items.iter().map(type_of).collect::<Vec<_>>().join(joint);
        }
    }
    let kinds: Vec<&str> = match &schema["type"] {
        Value::String(kind) => vec![kind.as_str()],
        Value::Array(kinds) => kinds.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if kinds.is_empty() {
        return if schema.as_object().is_some_and(|o| o.contains_key("properties")) {
            "object".to_owned()
        } else {
            "any JSON".to_owned()
        };
    }
    let words: Vec<String> = kinds
        .iter()
        .map(|kind| match *kind {
            "array" => format!("array of {}", type_of(&schema["items"])),
            "string" if schema["enum"].is_array() => {
                let values: Vec<String> = schema["enum"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|v| format!("<code>{}</code>", text(v)))
                    .collect();
                format!("one of {}", values.join(", "))
            }
            kind => match schema["format"].as_str() {
                Some(format) => format!("{} ({})", escape_html(kind), escape_html(format)),
                None => escape_html(kind),
            },
        })
        .collect();
    words.join(" or ")
}

fn yes_no(yes: bool) -> &'static str {
    if yes { "yes" } else { "no" }
}

/// A JSON string, escaped; anything else empty.
fn text(value: &Value) -> String {
    value.as_str().map(escape_html).unwrap_or_default()
}

/// A description: escaped, with `code` spans as code.
fn prose(value: &Value) -> String {
    let escaped = text(value);
    let mut out = String::with_capacity(escaped.len());
    for (i, piece) in escaped.split('`').enumerate() {
        if i % 2 == 1 {
            let _ = write!(out, "<code>{piece}</code>");
        } else {
            out.push_str(piece);
        }
    }
    out
}

fn capitalised(word: &str) -> String {
    let mut chars = word.chars();
    chars.next().map(|c| c.to_uppercase().chain(chars).collect()).unwrap_or_default()
}

/// The page's styles: system fonts, high contrast (WCAG AA), a contents column from 64rem.
const STYLE: &str = "\
*{box-sizing:border-box}\
body{margin:0;font:16px/1.5 system-ui,-apple-system,'Segoe UI',sans-serif;color:#0f172a;background:#fff}\
a{color:#1d4ed8;text-decoration:underline}\
code{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:.9em;background:#f1f5f9;padding:0 .2em;border-radius:3px;overflow-wrap:anywhere}\
.skip{position:absolute;left:-999px;top:0;background:#0f172a;color:#fff;padding:.5rem 1rem}\
.skip:focus{left:0;z-index:1}\
header{padding:.75rem 1.5rem;border-bottom:1px solid #cbd5e1;font-weight:600}\
.layout{display:block}\
nav{padding:1rem 1.5rem;border-bottom:1px solid #cbd5e1;font-size:.9rem}\
nav ul{list-style:none;margin:0;padding-left:.75rem}\
nav>ul{padding-left:0}\
.nav-title{font-weight:600;margin:0 0 .5rem}\
main{padding:1rem 1.5rem;max-width:70rem;min-width:0}\
main:focus{outline:none}\
article{border-top:1px solid #e2e8f0;padding-top:.5rem;margin-top:1.5rem}\
h1{font-size:1.75rem;margin:.5rem 0}\
h2{font-size:1.4rem;margin-top:2.5rem}\
h3{font-size:1.1rem;overflow-wrap:anywhere}\
.method{display:inline-block;min-width:3.5rem;font:600 .75rem ui-monospace,monospace;background:#1e293b;color:#fff;padding:.1rem .35rem;border-radius:3px;text-align:center}\
table{border-collapse:collapse;width:100%;margin:.75rem 0;font-size:.9rem}\
caption{text-align:left;font-weight:600;padding:.25rem 0}\
th,td{border:1px solid #cbd5e1;padding:.3rem .5rem;text-align:left;vertical-align:top;overflow-wrap:anywhere}\
th{background:#f1f5f9;overflow-wrap:normal}\
@media (min-width:64rem){.layout{display:flex}nav{width:22rem;flex:none;border-bottom:0;border-right:1px solid #cbd5e1;position:sticky;top:0;max-height:100vh;overflow-y:auto}}\
";
