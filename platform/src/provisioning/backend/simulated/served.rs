//! What the simulated fleet serves: for a notebook, a small JupyterLab stand-in at `/` (its
//! own origin's root, as Berth serves it; its page, `api/status`, a kernel WebSocket that echoes); for an
//! inference endpoint, an OpenAI-style API (`/v1/models`, `/v1/completions`) that says
//! which replica answered. Both demand the workload's own credential, as Jupyter and a
//! model server would, so only Berth's proxy (which holds it) gets through. And a training
//! job that writes log lines over time and ends with an exit status.
//!
//! A notebook also serves Jupyter's contents API (`GET`/`PUT /api/contents/<path>`, text
//! files and directories) from its attached volumes, which are real directories: `<path>`
//! is read from the filesystem's root as the container sees it, so
//! `home/jovyan/work/notes.txt` is in the home volume and `data/shared/x.csv` in the
//! volume mounted at `/data/shared`. Anything outside a volume is answered 404.

use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{OriginalUri, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{any, get, post};
use berth_domain::catalog::Offering;
use serde_json::{Value, json};
use tokio::sync::watch;

use super::World;
use crate::lock;
use crate::provisioning::backend::Workload;

/// One workload's server.
pub(super) struct Server {
    pub offering: Offering,
    pub name: String,
    pub image: String,
    /// An endpoint's model, which its `/v1/models` lists (as vLLM lists the model it
    /// serves); the image when none was given.
    pub model: Option<String>,
    pub units: String,
    /// What a request must carry: `token <credential>` for a notebook, `Bearer <credential>`
    /// for an endpoint.
    pub credential: String,
    pub replicas: Arc<AtomicU32>,
    /// Becomes true (or its sender goes) when the workload stops.
    pub stopped: watch::Receiver<bool>,
    /// The attached volumes: mount path -> the directory that holds it.
    pub mounts: Vec<(String, PathBuf)>,
}

struct Shared {
    server: Server,
    /// Requests answered, to spread them over the replicas.
    answered: AtomicU64,
}

/// Starts `server` on a free loopback port and returns the port. It stops when its
/// `stopped` says so: no new connections, idle ones closed, WebSockets closed.
pub(super) fn start(server: Server) -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let port = listener.local_addr()?.port();
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let mut stopped = server.stopped.clone();
    let offering = server.offering;
    let shared = Arc::new(Shared { server, answered: AtomicU64::new(0) });
    let router = match offering {
        Offering::Notebook => notebook_routes(),
        _ => inference_routes(),
    }
    .layer(middleware::from_fn_with_state(shared.clone(), require_credential))
    .with_state(shared);
    tokio::spawn(async move {
        let shutdown = async move { until_stopped(&mut stopped).await };
        if let Err(e) = axum::serve(listener, router).with_graceful_shutdown(shutdown).await {
            tracing::warn!(error = %e, port, "a simulated server stopped with an error");
        }
    });
    Ok(port)
}

/// Resolves once the workload is stopped (or whoever could stop it is gone).
async fn until_stopped(stopped: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is dropped here, before anything else awaits.
    let _ = stopped.wait_for(|stop| *stop).await.is_ok();
}

fn notebook_routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/lab") }))
        .route("/lab", get(lab))
        .route("/lab/{*rest}", get(lab))
        .route("/api/status", get(status))
        .route("/api/kernels/{kernel}/channels", get(kernel_channels))
        .route("/api/berth/echo", any(echo))
        .route("/api/contents/{*path}", get(read_contents).put(write_contents))
}

fn inference_routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completion))
        .route("/v1/chat/completions", post(completion))
        .route("/berth/echo", any(echo))
}

/// Jupyter answers 403 without its token; a model server started with `--api-key` 401.
async fn require_credential(State(s): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    let (scheme, refusal) = match s.server.offering {
        Offering::Notebook => ("token", StatusCode::FORBIDDEN),
        _ => ("Bearer", StatusCode::UNAUTHORIZED),
    };
    let expected = format!("{scheme} {}", s.server.credential);
    let given = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if given != Some(expected.as_str()) {
        return (refusal, axum::Json(json!({ "message": "the workload's credential is missing or wrong" })))
            .into_response();
    }
    next.run(request).await
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

async fn lab(State(s): State<Arc<Shared>>) -> Html<String> {
    let server = &s.server;
    let (name, image, units) = (escape(&server.name), escape(&server.image), escape(&server.units));
    let channels = "/api/kernels/simulated/channels";
    Html(format!(
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>JupyterLab · {name}</title></head>
<body>
<h1>JupyterLab</h1>
<p>Notebook <strong>{name}</strong> on the simulated fleet.</p>
<p>Image <code>{image}</code> · GPUs: <span data-testid="notebook-gpus">{units}</span></p>
<p id="kernel" data-testid="kernel-status">Kernel: connecting…</p>
<script>
const ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + "{channels}");
const status = document.getElementById("kernel");
ws.onopen = () => ws.send("print('hello from Berth')");
ws.onmessage = (e) => {{ status.textContent = "Kernel: connected (echo: " + e.data + ")"; }};
ws.onerror = () => {{ status.textContent = "Kernel: could not connect"; }};
</script>
</body></html>"#
    ))
}

async fn status(State(s): State<Arc<Shared>>) -> axum::Json<Value> {
    axum::Json(json!({ "name": s.server.name, "kernels": 1, "started": true }))
}

/// A kernel's channels: every message comes back, until the client or the workload stops.
async fn kernel_channels(State(s): State<Arc<Shared>>, upgrade: WebSocketUpgrade) -> Response {
    let stopped = s.server.stopped.clone();
    upgrade.on_upgrade(move |socket| echo_socket(socket, stopped))
}

async fn echo_socket(mut socket: WebSocket, mut stopped: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = until_stopped(&mut stopped) => {
                let _ = socket.send(Message::Close(None)).await;
                return;
            }
            message = socket.recv() => match message {
                Some(Ok(Message::Text(text))) => {
                    if socket.send(Message::Text(text)).await.is_err() {
                        return;
                    }
                }
                Some(Ok(Message::Binary(bytes))) => {
                    if socket.send(Message::Binary(bytes)).await.is_err() {
                        return;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            },
        }
    }
}

/// Where `path` (relative to `/`) lands in the attached volumes: the directory of the
/// volume with the longest mount path that holds it, joined with the rest. `None` outside
/// every volume, or for a path that tries to climb out of one (`..`, `.`, empty parts).
fn resolve(mounts: &[(String, PathBuf)], path: &str) -> Option<PathBuf> {
    let path = path.trim_end_matches('/');
    let parts: Vec<&str> = path.split('/').collect();
    if parts.iter().any(|p| p.is_empty() || *p == "." || *p == ".." || p.contains(['\\', '\0'])) {
        return None;
    }
    let absolute = format!("/{path}");
    mounts
        .iter()
        .filter_map(|(mount, dir)| {
            let rest = absolute.strip_prefix(mount.as_str())?;
            let rest = if rest.is_empty() { "" } else { rest.strip_prefix('/')? };
            Some((mount.len(), if rest.is_empty() { dir.clone() } else { dir.join(rest) }))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, found)| found)
}

/// Jupyter's contents model of `file` at `path` (without content unless `content`).
fn content_model(file: &FsPath, path: &str, content: bool) -> std::io::Result<Value> {
    let meta = std::fs::metadata(file)?;
    let modified = meta.modified().map(chrono::DateTime::<chrono::Utc>::from).map(|t| t.to_rfc3339()).ok();
    let name = path.trim_end_matches('/').rsplit('/').next().unwrap_or_default();
    if meta.is_dir() {
        let listing = if content {
            let mut entries = Vec::new();
            for entry in std::fs::read_dir(file)? {
                let entry = entry?;
                let child = format!("{}/{}", path.trim_end_matches('/'), entry.file_name().to_string_lossy());
                entries.push(content_model(&entry.path(), &child, false)?);
            }
            entries.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
            Value::Array(entries)
        } else {
            Value::Null
        };
        return Ok(json!({
            "name": name, "path": path, "type": "directory", "format": content.then_some("json"),
            "mimetype": null, "content": listing, "writable": true, "created": modified,
            "last_modified": modified, "size": null,
        }));
    }
    let text = if content { Some(std::fs::read_to_string(file)?) } else { None };
    Ok(json!({
        "name": name, "path": path, "type": "file", "format": content.then_some("text"),
        "mimetype": "text/plain", "content": text, "writable": true, "created": modified,
        "last_modified": modified, "size": meta.len(),
    }))
}

fn contents_error(status: StatusCode, message: String) -> Response {
    (status, axum::Json(json!({ "message": message, "reason": null }))).into_response()
}

/// `GET /api/contents/<path>`: a file's text or a directory's listing.
async fn read_contents(
    State(s): State<Arc<Shared>>,
    Path(path): Path<String>,
    Query(query): Query<std::collections::HashMap<String, String>>,
) -> Response {
    let Some(file) = resolve(&s.server.mounts, &path) else {
        return contents_error(StatusCode::NOT_FOUND, format!("No such file or directory: {path}"));
    };
    let content = query.get("content").is_none_or(|c| c != "0");
    match content_model(&file, &path, content) {
        Ok(model) => axum::Json(model).into_response(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            contents_error(StatusCode::NOT_FOUND, format!("No such file or directory: {path}"))
        }
        Err(e) => contents_error(StatusCode::BAD_REQUEST, format!("{path} cannot be read as text: {e}")),
    }
}

/// `PUT /api/contents/<path>` with `{"type": "file", "format": "text", "content": ...}`
/// or `{"type": "directory"}`: 201 when it is new, 200 when it replaced a file.
async fn write_contents(State(s): State<Arc<Shared>>, Path(path): Path<String>, body: String) -> Response {
    let Some(file) = resolve(&s.server.mounts, &path) else {
        return contents_error(
            StatusCode::NOT_FOUND,
            format!("{path} is not in an attached volume; write under one of their mount paths"),
        );
    };
    let model: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let existed = file.exists();
    let written = match (model["type"].as_str(), model["format"].as_str(), model["content"].as_str()) {
        (Some("directory"), _, _) => std::fs::create_dir_all(&file),
        (Some("file"), Some("text") | None, Some(text)) => match file.parent() {
            Some(parent) if parent.is_dir() => std::fs::write(&file, text),
            _ => return contents_error(StatusCode::NOT_FOUND, format!("the folder of {path} does not exist")),
        },
        _ => {
            return contents_error(
                StatusCode::BAD_REQUEST,
                "send a model: {\"type\": \"file\", \"format\": \"text\", \"content\": \"...\"} or {\"type\": \"directory\"}".into(),
            );
        }
    };
    if let Err(e) = written {
        return contents_error(StatusCode::BAD_REQUEST, format!("{path} cannot be written: {e}"));
    }
    let status = if existed { StatusCode::OK } else { StatusCode::CREATED };
    match content_model(&file, &path, false) {
        Ok(model) => (status, axum::Json(model)).into_response(),
        Err(e) => {
            contents_error(StatusCode::INTERNAL_SERVER_ERROR, format!("{path} was written but cannot be read: {e}"))
        }
    }
}

/// What reached the workload, so one can see what the proxy forwards (and what it keeps).
/// It also tries what a hostile workload would: setting Berth's cookies beside its own.
async fn echo(OriginalUri(uri): OriginalUri, request: Request) -> Response {
    let headers: serde_json::Map<String, Value> = request
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), json!(v.to_str().unwrap_or("<binary>"))))
        .collect();
    let body = axum::Json(json!({
        "method": request.method().as_str(),
        "path": uri.path(),
        "query": uri.query().unwrap_or_default(),
        "headers": headers,
    }));
    let mut response = body.into_response();
    for cookie in [
        "workload_cookie=kept; Path=/",
        "berth_session=planted; Path=/",
        "berth_env=planted; Path=/",
        "__Host-berth_env=planted; Secure; Path=/",
    ] {
        response.headers_mut().append(header::SET_COOKIE, header::HeaderValue::from_static(cookie));
    }
    response
}

/// Which replica answers: requests go round the replicas in turn.
fn replica(s: &Shared) -> (u32, u32) {
    let replicas = s.server.replicas.load(Ordering::Relaxed).max(1);
    let n = s.answered.fetch_add(1, Ordering::Relaxed);
    (u32::try_from(n % u64::from(replicas)).unwrap_or(0), replicas)
}

async fn models(State(s): State<Arc<Shared>>) -> Response {
    let (answering, replicas) = replica(&s);
    let body = json!({
        "object": "list",
        "data": [{ "id": s.server.model.as_ref().unwrap_or(&s.server.image), "object": "model", "owned_by": "berth-simulated" }],
        "replicas": replicas,
    });
    ([("x-berth-replica", answering.to_string())], axum::Json(body)).into_response()
}

async fn completion(State(s): State<Arc<Shared>>, headers: HeaderMap, body: String) -> Response {
    let (answering, replicas) = replica(&s);
    let asked: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    if headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) != Some("application/json") || asked.is_null() {
        return (StatusCode::BAD_REQUEST, axum::Json(json!({ "error": "send a JSON body" }))).into_response();
    }
    let prompt = asked["prompt"]
        .as_str()
        .map(str::to_owned)
        .or_else(|| {
            asked["messages"].as_array().and_then(|m| m.last()).and_then(|m| m["content"].as_str()).map(str::to_owned)
        })
        .unwrap_or_default();
    let body = json!({
        "object": "text_completion",
        "model": s.server.model.as_ref().unwrap_or(&s.server.image),
        "choices": [{ "index": 0, "text": format!("(simulated) you said: {prompt}"), "finish_reason": "stop" }],
        "replica": answering,
        "replicas": replicas,
    });
    ([("x-berth-replica", answering.to_string())], axum::Json(body)).into_response()
}

/// A training job: its command echoed, a few epochs, then its exit status. A command that
/// ends with `exit N` ends with N (a way to try a failing job on the simulated fleet).
pub(super) async fn run_job(world: Arc<Mutex<World>>, w: Workload, speed: f64, mut stopped: watch::Receiver<bool>) {
    let id = w.environment_id.clone();
    let write = |line: String| {
        if let Some(job) = lock(&world).jobs.get_mut(&id) {
            job.lines.push(line);
        }
    };
    let command = w.command.clone().unwrap_or_default();
    write(format!("$ {command}"));
    write(format!("[berth] image {} on {}", w.image.as_deref().unwrap_or("?"), super::describe_units(&w)));
    let epochs = epochs_of(&command);
    let mut loss = 2.5_f64;
    for epoch in 1..=epochs {
        let pause = Duration::from_secs_f64((1.5 * speed).max(0.0));
        tokio::select! {
            _ = until_stopped(&mut stopped) => return,
            _ = tokio::time::sleep(pause) => {}
        }
        loss *= 0.55;
        write(format!("epoch {epoch}/{epochs}: loss {loss:.4}"));
    }
    if command.contains("sleep infinity") {
        // A job that waits to be stopped (a service, or a test that needs one running).
        write("sleeping until stopped".to_owned());
        until_stopped(&mut stopped).await;
        return;
    }
    let exit_code = exit_code_of(&command);
    write(if exit_code == 0 {
        "training finished".to_owned()
    } else {
        format!("process exited with code {exit_code}")
    });
    if let Some(job) = lock(&world).jobs.get_mut(&id) {
        job.exit_code = Some(exit_code);
    }
}

/// How many epochs a simulated job trains: `--epochs N` (at most 10,000), else 5.
fn epochs_of(command: &str) -> u32 {
    let mut words = command.split_whitespace();
    while let Some(word) = words.next() {
        if let Some(n) = word.strip_prefix("--epochs=").or_else(|| (word == "--epochs").then(|| words.next()).flatten())
        {
            return n.parse().unwrap_or(5).clamp(1, 10_000);
        }
    }
    5
}

/// `... exit 3` -> 3; anything else succeeds.
fn exit_code_of(command: &str) -> i32 {
    let last = command.rsplit([';', '&', '|']).next().unwrap_or_default().trim();
    last.strip_prefix("exit").and_then(|n| n.trim().parse().ok()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::{epochs_of, exit_code_of, resolve};

    #[test]
    fn contents_paths_land_in_the_volume_mounted_there_and_never_climb_out() {
        let mounts = vec![
            ("/home/jovyan/work".to_owned(), PathBuf::from("/v/home")),
            ("/data/shared".to_owned(), PathBuf::from("/v/shared")),
        ];
        assert_eq!(resolve(&mounts, "home/jovyan/work/a.txt"), Some(PathBuf::from("/v/home/a.txt")));
        assert_eq!(resolve(&mounts, "data/shared"), Some(PathBuf::from("/v/shared")));
        assert_eq!(resolve(&mounts, "data/shared/sub/b.txt"), Some(PathBuf::from("/v/shared/sub/b.txt")));
        for outside in
            ["data/sharedx/a", "data", "etc/passwd", "data/shared/../../etc", "data/shared//a", "data/shared/./a"]
        {
            assert_eq!(resolve(&mounts, outside), None, "{outside}");
        }
    }

    #[test]
    fn a_command_may_say_how_many_epochs_it_trains() {
        assert_eq!(epochs_of("python train.py"), 5);
        assert_eq!(epochs_of("python train.py --epochs 12"), 12);
        assert_eq!(epochs_of("python train.py --epochs=3 --lr 0.1"), 3);
        assert_eq!(epochs_of("python train.py --epochs lots"), 5);
        assert_eq!(epochs_of("python train.py --epochs 99999999"), 10_000);
    }

    #[test]
    fn a_command_ending_in_exit_sets_the_status() {
        assert_eq!(exit_code_of("python train.py"), 0);
        assert_eq!(exit_code_of("python train.py; exit 3"), 3);
        assert_eq!(exit_code_of("python train.py && exit 17"), 17);
        assert_eq!(exit_code_of("exit"), 0);
    }
}
