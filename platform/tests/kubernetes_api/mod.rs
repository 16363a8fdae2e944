//! A mock Kubernetes API server behind `tower-test`: it records every request and answers
//! like a small cluster would (server-side apply, create, replace, get, list, delete with
//! 404s and conflicts), with four nodes, a GPU Operator that applies MIG layouts at once,
//! workloads that become ready at once, and kubelets whose stats summaries a test sets
//! (through the node proxy). Tests compare the recorded requests with the
//! exact list a scenario expects, so a missing or an extra call fails.
//!
//! The same server is the stateful fake for random runs ([`FakeCluster::stateful`]): the
//! fleet's nodes, no recording (exact requests cannot follow a random run), and injected
//! faults ([`Faults`]): errors, requests that never get an answer, and writes whose
//! answer is a timeout but that land a moment later, as an overloaded API server does.
#![allow(dead_code)] // shared by several test binaries, each using a part

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http::{Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// One request as the API server received it.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub body: Option<Value>,
}

impl Call {
    /// `METHOD /path`, the form scenarios list.
    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

#[derive(Debug, Default)]
pub struct State {
    /// Objects by their path, as stored.
    pub objects: BTreeMap<String, Value>,
    /// Nodes as the cluster knows them (status, discovery labels).
    pub nodes: BTreeMap<String, Value>,
    /// What Berth applied to each node (its field manager's fields).
    pub node_applied: BTreeMap<String, Value>,
    pub calls: Vec<Call>,
    /// Paths whose requests fail with this status code.
    pub failing: BTreeMap<String, u16>,
    /// The MIG manager's answer for new layouts.
    pub mig_state: String,
    /// What the Job controller reports (`{"active": 1}` unless set).
    pub job_status: Option<Value>,
    /// Pods' logs by pod name.
    pub pod_logs: BTreeMap<String, String>,
    /// What the pod of a Job of this name prints: a Job created with an entry here runs its
    /// one pod to the end at once (exit 0), and reports itself succeeded.
    pub job_outputs: BTreeMap<String, String>,
    /// Each node's kubelet stats summary, as its node proxy answers
    /// (`/api/v1/nodes/<node>/proxy/stats/summary`); a node without one has no pods.
    pub stats_summaries: BTreeMap<String, Value>,
    /// Paths whose requests are recorded and never answered (a kubelet that hangs).
    pub hanging: std::collections::BTreeSet<String>,
    /// Whether requests are kept in `calls`.
    pub record: bool,
    /// Chances of injected faults per request.
    pub faults: Faults,
    /// The resourceVersion of each node, changed by every apply to it.
    node_revisions: BTreeMap<String, u64>,
    /// A node that someone else changes right after the next GET of it (a race, on cue).
    pub bump_node_on_next_read: Option<String>,
    /// The next request of this `METHOD /path` waits, unanswered and not yet done, until
    /// the test releases it ([`FakeCluster::release_held`]): a write that lands late, on cue.
    pub hold_next: Option<String>,
    revision: u64,
}

/// Chances (0 to 1) per request of an injected fault.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Faults {
    /// Answered 503 without doing anything.
    pub error: f64,
    /// Never answered (the reconciler's step timeout must end the step).
    pub hang: f64,
    /// A write answered 504 at once, yet done [`LATE_BY`] later.
    pub late: f64,
}

/// How long after its timeout answer a late write lands.
pub const LATE_BY: Duration = Duration::from_millis(150);

type Responder = tower_test::mock::SendResponse<Response<Body>>;

pub struct FakeCluster {
    pub state: Arc<Mutex<State>>,
    /// Late writes not yet landed.
    pending: Arc<AtomicUsize>,
    /// Requests held on cue (see [`State::hold_next`]), not yet done.
    held: Arc<Mutex<Vec<(Call, Responder)>>>,
    task: JoinHandle<()>,
}

impl Drop for FakeCluster {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub const NODES: [&str; 4] = ["h100-1", "h100-2", "l40s-1", "a100-1"];

impl FakeCluster {
    /// The recording mock with [`NODES`], for exact-request scenarios.
    pub fn start() -> (FakeCluster, Client) {
        FakeCluster::serve(&NODES.map(str::to_owned), true)
    }

    /// The fake for random runs: `nodes` (the fleet's), no recording, faults as set later.
    pub fn stateful(nodes: &[String]) -> (FakeCluster, Client) {
        FakeCluster::serve(nodes, false)
    }

    fn serve(nodes: &[String], record: bool) -> (FakeCluster, Client) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let mut state = State { mig_state: "success".into(), record, ..State::default() };
        for node in nodes {
            state.nodes.insert(
                node.to_owned(),
                json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": { "name": node, "labels": { "kubernetes.io/hostname": node, "nvidia.com/mig.capable": "true" } },
                    "status": { "conditions": [{ "type": "Ready", "status": "True" }] },
                }),
            );
        }
        // The GPU Operator's namespace exists, as in any cluster running it.
        state.objects.insert(
            "/api/v1/namespaces/gpu-operator".into(),
            json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": "gpu-operator" } }),
        );
        let state = Arc::new(Mutex::new(state));
        let pending = Arc::new(AtomicUsize::new(0));
        let held = Arc::new(Mutex::new(Vec::new()));
        let (shared, late, on_cue) = (state.clone(), pending.clone(), held.clone());
        let task = tokio::spawn(async move {
            // Requests that never get an answer; dropping them would answer with an error.
            let mut unanswered = Vec::new();
            while let Some((request, respond)) = handle.next_request().await {
                let (parts, body) = request.into_parts();
                let bytes = body.collect_bytes().await.expect("request body");
                let body: Option<Value> =
                    if bytes.is_empty() { None } else { Some(serde_json::from_slice(&bytes).expect("JSON body")) };
                let call = Call {
                    method: parts.method.to_string(),
                    path: parts.uri.path().to_owned(),
                    query: parts.uri.query().unwrap_or_default().to_owned(),
                    content_type: parts
                        .headers
                        .get(http::header::CONTENT_TYPE)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned(),
                    body,
                };
                {
                    let mut state = shared.lock().unwrap();
                    if state.hold_next.as_ref() == Some(&call.line()) {
                        state.hold_next = None;
                        on_cue.lock().unwrap().push((call, respond));
                        continue;
                    }
                }
                let log = call.path.ends_with("/log");
                let faults = shared.lock().unwrap().faults;
                let roll = rand::random::<f64>();
                let hangs = {
                    let mut state = shared.lock().unwrap();
                    let hangs = state.hanging.contains(&call.path);
                    if hangs && state.record {
                        state.calls.push(call.clone());
                    }
                    hangs
                };
                let (status, answer) = if hangs {
                    unanswered.push(respond);
                    continue;
                } else if roll < faults.error {
                    status(503, "ServiceUnavailable", "injected: the server is currently unable to handle the request")
                } else if roll < faults.error + faults.hang {
                    unanswered.push(respond);
                    continue;
                } else if roll < faults.error + faults.hang + faults.late && call.method != "GET" {
                    late.fetch_add(1, Ordering::SeqCst);
                    let (state, late) = (shared.clone(), late.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep(LATE_BY).await;
                        let _ = state.lock().unwrap().answer(call);
                        late.fetch_sub(1, Ordering::SeqCst);
                    });
                    status(504, "Timeout", "injected: the request did not complete within the allowed duration")
                } else {
                    shared.lock().unwrap().answer(call)
                };
                respond_with(respond, (status, answer), log);
            }
        });
        (FakeCluster { state, pending, held, task }, Client::new(service, "default"))
    }

    /// How many requests are held on cue now.
    pub fn held(&self) -> usize {
        self.held.lock().unwrap().len()
    }

    /// Does the held requests now, in the order they came, and answers them.
    pub fn release_held(&self) {
        let held = std::mem::take(&mut *self.held.lock().unwrap());
        for (call, respond) in held {
            let log = call.path.ends_with("/log");
            let answer = self.lock().answer(call);
            respond_with(respond, answer, log);
        }
    }

    pub fn set_faults(&self, faults: Faults) {
        self.lock().faults = faults;
    }

    /// Waits until every late write has landed.
    pub async fn quiesce(&self) {
        while self.pending.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Everything Berth left for environments: labelled objects (by path), layouts in the
    /// mig-parted ConfigMap, and nodes that still carry Berth's labels, taint or a MIG
    /// layout other than disabled. (Tenants' queues are the tenants': see `tenant_queues`.)
    pub fn berth_leftovers(&self) -> Vec<String> {
        let mut left = self.environment_objects();
        left.extend(self.mig_layouts().into_iter().map(|layout| format!("mig-parted layout {layout}")));
        let state = self.lock();
        for name in state.nodes.keys() {
            let node = state.node_view(name).unwrap();
            let labels = &node["metadata"]["labels"];
            if labels.get("berth.dev/tenant").is_some() || labels.get("berth.dev/environment").is_some() {
                left.push(format!("node {name}: dedicated {labels}"));
            }
            if node.pointer("/spec/taints").is_some_and(|t| t != &json!([])) {
                left.push(format!("node {name}: taint {}", node["spec"]["taints"]));
            }
            if labels.get("nvidia.com/mig.config").is_some_and(|v| v != "all-disabled") {
                left.push(format!("node {name}: MIG layout {}", labels["nvidia.com/mig.config"]));
            }
        }
        left
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    /// The requests since the last call, as `METHOD /path` lines.
    pub fn take_lines(&self) -> Vec<String> {
        self.take_calls().iter().map(Call::line).collect()
    }

    pub fn take_calls(&self) -> Vec<Call> {
        std::mem::take(&mut self.lock().calls)
    }

    /// Berth's MIG layouts in the mig-parted ConfigMap: its entries and the layouts named
    /// by its writers' annotations, each once, in order.
    pub fn mig_layouts(&self) -> Vec<String> {
        let state = self.lock();
        let Some(map) = state.objects.get("/api/v1/namespaces/gpu-operator/configmaps/berth-mig-parted-config") else {
            return Vec::new();
        };
        let entries =
            map["data"].as_object().into_iter().flatten().map(|(k, _)| k.as_str()).filter(|k| *k != "config.yaml");
        let writers = map
            .pointer("/metadata/annotations")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(k, _)| k.strip_prefix("layouts.berth.dev/"));
        let mut layouts: Vec<String> = entries.chain(writers).map(str::to_owned).collect();
        layouts.sort();
        layouts.dedup();
        layouts
    }

    /// The tenants whose ClusterQueue exists, by slug, in order.
    pub fn tenant_queues(&self) -> Vec<String> {
        let state = self.lock();
        state
            .objects
            .iter()
            .filter(|(path, o)| {
                path.starts_with("/apis/kueue.x-k8s.io/v1beta1/clusterqueues/")
                    && o.pointer("/metadata/labels/berth.dev~1environment").is_none()
            })
            .filter_map(|(_, o)| {
                o.pointer("/metadata/labels/berth.dev~1tenant").and_then(Value::as_str).map(str::to_owned)
            })
            .collect()
    }

    /// The ResourceQuota of each tenant's namespace (labelled with a tenant and no
    /// environment), by namespace: its `spec.hard`.
    pub fn tenant_quotas(&self) -> Vec<(String, Value)> {
        let state = self.lock();
        state
            .objects
            .iter()
            .filter(|(path, o)| {
                path.ends_with("/resourcequotas/berth")
                    && o.pointer("/metadata/labels/berth.dev~1environment").is_none()
                    && o.pointer("/metadata/labels/berth.dev~1tenant").is_some()
            })
            .map(|(_, o)| {
                (o["metadata"]["namespace"].as_str().unwrap_or_default().to_owned(), o["spec"]["hard"].clone())
            })
            .collect()
    }

    /// Objects that carry an environment label, by path.
    pub fn environment_objects(&self) -> Vec<String> {
        let state = self.lock();
        state
            .objects
            .iter()
            .filter(|(_, o)| o.pointer("/metadata/labels/berth.dev~1environment").is_some())
            .map(|(path, _)| path.clone())
            .collect()
    }

    /// A node as a GET answers it.
    pub fn node(&self, name: &str) -> Value {
        self.lock().node_view(name).expect("node exists")
    }

    /// A comparable picture of the cluster: stored objects (without revisions) and nodes.
    pub fn snapshot(&self) -> Value {
        let state = self.lock();
        let mut objects = serde_json::Map::new();
        for (path, o) in &state.objects {
            let mut o = o.clone();
            if let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.remove("resourceVersion");
            }
            // Credentials are random; that one exists is what counts.
            if o.get("type") == Some(&json!("Opaque")) {
                o["data"] = json!("<random>");
            }
            objects.insert(path.clone(), o);
        }
        let nodes: serde_json::Map<String, Value> = NODES
            .iter()
            .map(|n| {
                let mut node = state.node_view(n).unwrap_or(Value::Null);
                if let Some(meta) = node.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.remove("resourceVersion");
                }
                (n.to_string(), node)
            })
            .collect();
        json!({ "objects": objects, "nodes": nodes })
    }
}

/// Sends `answer`; a pod's `log` is plain text, as the API server sends it.
fn respond_with(respond: Responder, (status, answer): (StatusCode, Value), log: bool) {
    let (content_type, body) = match answer {
        Value::String(text) if log && status == StatusCode::OK => ("text/plain", text.into_bytes()),
        answer => ("application/json", serde_json::to_vec(&answer).unwrap()),
    };
    let response =
        Response::builder().status(status).header("content-type", content_type).body(Body::from(body)).unwrap();
    respond.send_response(response);
}

fn status(code: u16, reason: &str, message: &str) -> (StatusCode, Value) {
    (
        StatusCode::from_u16(code).unwrap(),
        json!({ "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": code, "reason": reason, "message": message }),
    )
}

/// Splits `/api/v1/...` or `/apis/<group>/<version>/...` into its prefix and the segments.
fn segments(path: &str) -> (String, Vec<String>) {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let prefix_len = if parts.first() == Some(&"api") { 2 } else { 3 };
    (format!("/{}", parts[..prefix_len].join("/")), parts[prefix_len..].iter().map(|s| s.to_string()).collect())
}

fn matches_selector(object: &Value, selector: &str) -> bool {
    let labels = object.pointer("/metadata/labels").cloned().unwrap_or(json!({}));
    selector.split(',').filter(|t| !t.is_empty()).all(|term| match term.split_once('=') {
        Some((k, v)) => labels.get(k).and_then(Value::as_str) == Some(v),
        None => labels.get(term).is_some(),
    })
}

fn query_value(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| v.replace("%3D", "=").replace("%2C", ",").replace("%2F", "/"))
    })
}

impl State {
    fn answer(&mut self, call: Call) -> (StatusCode, Value) {
        if self.record {
            self.calls.push(call.clone());
        }
        if let Some(&code) = self.failing.get(&call.path) {
            return status(code, "Forbidden", "injected failure: secret internal detail");
        }
        let (_, segs) = segments(&call.path);
        let is_collection = segs.len() % 2 == 1;
        let is_node = segs.first().map(String::as_str) == Some("nodes") && segs.len() == 2;
        // A kubelet's stats summary through the node proxy.
        if call.method == "GET" && segs.len() == 5 && segs[0] == "nodes" && segs[2..] == ["proxy", "stats", "summary"] {
            let node = &segs[1];
            if !self.nodes.contains_key(node) {
                return status(404, "NotFound", "no such node");
            }
            let empty = json!({ "node": { "nodeName": node }, "pods": [] });
            return (StatusCode::OK, self.stats_summaries.get(node).cloned().unwrap_or(empty));
        }
        if call.method == "GET" && call.path.ends_with("/log") {
            let pod = &segs[segs.len() - 2];
            return match self.pod_logs.get(pod) {
                Some(text) => (StatusCode::OK, Value::String(text.clone())),
                None => status(404, "NotFound", "no such pod"),
            };
        }
        // Nothing is written into a namespace that does not exist (any more).
        let in_namespace = segs.len() >= 3 && segs[0] == "namespaces";
        if in_namespace && call.method != "GET" && call.method != "DELETE" {
            let namespace = format!("/api/v1/namespaces/{}", segs[1]);
            if !self.objects.contains_key(&namespace) {
                return status(404, "NotFound", &format!("namespaces \"{}\" not found", segs[1]));
            }
        }
        match call.method.as_str() {
            "PATCH" => {
                assert_eq!(call.content_type, "application/apply-patch+yaml", "{}: only server-side apply", call.path);
                assert!(
                    call.query.contains("fieldManager=berth") && call.query.contains("force=true"),
                    "{}: apply must use the one field manager, forced: {}",
                    call.path,
                    call.query
                );
                let body = call.body.clone().expect("apply body");
                assert_eq!(
                    body.pointer("/metadata/name").and_then(Value::as_str),
                    segs.last().map(String::as_str),
                    "applied name matches the path"
                );
                if is_node {
                    let name = &segs[1];
                    if !self.nodes.contains_key(name) {
                        return status(404, "NotFound", "no such node");
                    }
                    // A resourceVersion in an apply is a precondition.
                    let current = self.node_revisions.get(name).copied().unwrap_or(0).to_string();
                    if let Some(expected) = body.pointer("/metadata/resourceVersion").and_then(Value::as_str)
                        && expected != current
                    {
                        return status(409, "Conflict", "the object has been modified");
                    }
                    self.revision += 1;
                    self.node_revisions.insert(name.clone(), self.revision);
                    self.node_applied.insert(name.clone(), body);
                    return (StatusCode::OK, self.node_view(name).unwrap());
                }
                // Kueue refuses to change the ClusterQueue a LocalQueue feeds.
                if call.path.contains("/localqueues/")
                    && let Some(old) = self.objects.get(&call.path)
                    && old.pointer("/spec/clusterQueue") != body.pointer("/spec/clusterQueue")
                {
                    return status(422, "Invalid", "spec.clusterQueue: Invalid value: field is immutable");
                }
                self.revision += 1;
                let mut stored = body;
                stored["metadata"]["resourceVersion"] = json!(self.revision.to_string());
                self.objects.insert(call.path.clone(), stored);
                (StatusCode::OK, self.view(&call.path).unwrap())
            }
            "POST" => {
                let mut body = call.body.clone().expect("create body");
                let name = body.pointer("/metadata/name").and_then(Value::as_str).expect("name").to_owned();
                let path = format!("{}/{name}", call.path);
                if self.objects.contains_key(&path) {
                    return status(409, "AlreadyExists", "already exists");
                }
                if let Some(string_data) = body.as_object_mut().and_then(|o| o.remove("stringData")) {
                    let data: serde_json::Map<String, Value> = string_data
                        .as_object()
                        .unwrap()
                        .iter()
                        .map(|(k, v)| (k.clone(), json!(STANDARD.encode(v.as_str().unwrap()))))
                        .collect();
                    body["data"] = Value::Object(data);
                }
                self.revision += 1;
                body["metadata"]["resourceVersion"] = json!(self.revision.to_string());
                if body.get("kind") == Some(&json!("Job"))
                    && let Some(output) = self.job_outputs.get(&name).cloned()
                {
                    self.run_job_pod(&segs[1], &name, &body, output);
                }
                self.objects.insert(path.clone(), body);
                (StatusCode::CREATED, self.view(&path).unwrap())
            }
            "PUT" => {
                let mut body = call.body.clone().expect("replace body");
                let Some(current) = self.objects.get(&call.path) else {
                    return status(404, "NotFound", "not found");
                };
                if current.pointer("/metadata/resourceVersion") != body.pointer("/metadata/resourceVersion") {
                    return status(409, "Conflict", "the object has been modified");
                }
                self.revision += 1;
                body["metadata"]["resourceVersion"] = json!(self.revision.to_string());
                self.objects.insert(call.path.clone(), body);
                (StatusCode::OK, self.view(&call.path).unwrap())
            }
            "GET" if is_collection => {
                let selector = query_value(&call.query, "labelSelector").unwrap_or_default();
                // The one field selector Berth uses: pods on a node.
                let on_node = query_value(&call.query, "fieldSelector")
                    .and_then(|f| f.strip_prefix("spec.nodeName=").map(str::to_owned));
                let items: Vec<Value> = if segs == ["nodes"] {
                    self.nodes
                        .keys()
                        .filter_map(|n| self.node_view(n))
                        .filter(|o| matches_selector(o, &selector))
                        .collect()
                } else {
                    self.objects
                        .keys()
                        .filter(|p| {
                            p.starts_with(&format!("{}/", call.path)) && !p[call.path.len() + 1..].contains('/')
                        })
                        .filter_map(|p| self.view(p))
                        .filter(|o| matches_selector(o, &selector))
                        .filter(|o| on_node.as_deref().is_none_or(|n| o.pointer("/spec/nodeName") == Some(&json!(n))))
                        .collect()
                };
                (
                    StatusCode::OK,
                    json!({ "kind": "List", "apiVersion": "v1", "metadata": { "resourceVersion": "1" }, "items": items }),
                )
            }
            "GET" => {
                let found = if is_node { self.node_view(&segs[1]) } else { self.view(&call.path) };
                if is_node && self.bump_node_on_next_read.as_ref() == Some(&segs[1]) {
                    self.bump_node_on_next_read = None;
                    self.revision += 1;
                    self.node_revisions.insert(segs[1].clone(), self.revision);
                }
                match found {
                    Some(o) => (StatusCode::OK, o),
                    None => status(404, "NotFound", "not found"),
                }
            }
            "DELETE" => match self.objects.remove(&call.path) {
                Some(o) => {
                    // A Job's pods go with it (Berth deletes Jobs in the background).
                    if o.get("kind") == Some(&json!("Job")) {
                        let pod = format!("/api/v1/namespaces/{}/pods/{}-run", segs[1], segs[segs.len() - 1]);
                        self.objects.remove(&pod);
                    }
                    if segs.len() == 2 && segs[0] == "namespaces" {
                        let ns = &segs[1];
                        self.objects.retain(|p, _| !p.contains(&format!("/namespaces/{ns}/")));
                    }
                    (StatusCode::OK, o)
                }
                None => status(404, "NotFound", "not found"),
            },
            other => panic!("unexpected method {other}"),
        }
    }

    /// The one pod of a Job that has run to its end, printing `output`.
    fn run_job_pod(&mut self, namespace: &str, job: &str, body: &Value, output: String) {
        let pod = format!("{job}-run");
        let template = &body["spec"]["template"];
        let container = template.pointer("/spec/containers/0/name").cloned().unwrap_or(json!("main"));
        let object = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": pod, "namespace": namespace, "labels": template["metadata"]["labels"].clone(),
                          "creationTimestamp": "2026-11-27T10:00:00Z" },
            "spec": template["spec"].clone(),
            "status": { "phase": "Succeeded",
                        "containerStatuses": [{ "name": container, "state": { "terminated": { "exitCode": 0 } } }] },
        });
        self.objects.insert(format!("/api/v1/namespaces/{namespace}/pods/{pod}"), object);
        self.pod_logs.insert(pod, output);
    }

    /// An object as the API answers: with the status the cluster would have filled in.
    fn view(&self, path: &str) -> Option<Value> {
        let mut o = self.objects.get(path)?.clone();
        match o.get("kind").and_then(Value::as_str) {
            Some("StatefulSet" | "Deployment") => {
                let replicas = o.pointer("/spec/replicas").cloned().unwrap_or(json!(1));
                o["status"] = json!({ "replicas": replicas, "readyReplicas": replicas });
            }
            Some("Job")
                if self
                    .job_outputs
                    .contains_key(o.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default()) =>
            {
                o["status"] = json!({ "succeeded": 1 });
            }
            Some("Job") => o["status"] = self.job_status.clone().unwrap_or(json!({ "active": 1 })),
            Some("Secret") if o.get("type") == Some(&json!("kubernetes.io/service-account-token")) => {
                o["data"] = json!({ "token": STANDARD.encode("sa-token"), "ca.crt": STANDARD.encode("cluster-ca") });
            }
            _ => {}
        }
        Some(o)
    }

    fn node_view(&self, name: &str) -> Option<Value> {
        let mut node = self.nodes.get(name)?.clone();
        node["metadata"]["resourceVersion"] = json!(self.node_revisions.get(name).copied().unwrap_or(0).to_string());
        if let Some(applied) = self.node_applied.get(name) {
            if let Some(labels) = applied.pointer("/metadata/labels").and_then(Value::as_object) {
                for (k, v) in labels {
                    node["metadata"]["labels"][k] = v.clone();
                }
                if labels.contains_key("nvidia.com/mig.config") {
                    node["metadata"]["labels"]["nvidia.com/mig.config.state"] = json!(self.mig_state);
                }
            }
            if let Some(annotations) = applied.pointer("/metadata/annotations") {
                node["metadata"]["annotations"] = annotations.clone();
            }
            if let Some(taints) = applied.pointer("/spec/taints") {
                node["spec"] = json!({ "taints": taints });
            }
        }
        Some(node)
    }
}
