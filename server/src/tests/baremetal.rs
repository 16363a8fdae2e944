//! `--backend baremetal` end to end: a served Berth whose reconciler drives the bare-metal
//! backend, and `berth agent` (the real agent loop, over HTTP with node tokens) on three
//! fake nodes that apply what their plans say. Each offering provisions and tears down;
//! an agent's error reaches the owner; every step repeated after itself (a reconciler
//! that crashed after it) changes nothing, and neither does a second pass over a
//! converged environment; a dedicated cluster's SSH account reaches exactly its nodes with
//! exactly its people's keys; a deleted tenant leaves nothing on any node.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{Method, StatusCode};
use berth_agent::node::NodeHost;
use berth_agent::node::commands::{CommandError, Failure};
use berth_agent::{Agent, GpuProbe, NodeError};
use berth_domain::agent::GpuReport;
use berth_domain::host_network::TenantSegment;
use berth_domain::launch::LaunchRequest;
use berth_domain::lifecycle::{EnvState, provision_plan, teardown_plan};
use berth_domain::node_checks::{AgentOrder, CheckAnswer, CheckKind, CheckLevel, NodeTask};
use berth_domain::node_health::NodeState;
use berth_domain::node_plan::{Device, NodePlan, WorkloadState, WorkloadStatus};
use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use berth_platform::capacity::environments::Environment;
use berth_platform::people::User;
use berth_platform::provisioning::backend::Backend;
use berth_platform::provisioning::backend::baremetal::{BareMetal, BareMetalConfig};
use berth_platform::provisioning::backend::volume_quotas::{
    CommandLine, CommandOutput, RunFuture, Runner, VolumeQuotas,
};
use berth_platform::provisioning::reconciler::{Reconciler, ReconcilerConfig};

use super::{Berth, meta};

/// Three nodes of eight H100s: room for a dedicated node next to shared ones.
const FLEET: &str = r#"
[[site]]
name = "metal-1"
[[site.pool]]
prefix = "h100"
model = "H100-80GB"
nodes = 3
gpus_per_node = 8
nvlink = true
"#;

const NODES: [&str; 3] = ["h100-01", "h100-02", "h100-03"];

/// A node that holds whatever plan it last applied, answers for its GPUs like NVML, and
/// fails when told to.
struct FakeNode {
    underlay: Ipv4Addr,
    applied: Mutex<NodePlan>,
    fail: Mutex<Option<NodeError>>,
    /// Containers that ended: environment -> exit code and the log they wrote.
    ended: Mutex<BTreeMap<String, (i64, Vec<String>)>>,
    /// The checks it ran, in order, and those that find a fault.
    checks_run: Mutex<Vec<(CheckKind, CheckLevel)>>,
    faulty: Mutex<Vec<CheckKind>>,
    /// The GPUs it reset, in order, and those a process holds (their reset fails).
    resets: Mutex<Vec<u32>>,
    busy_gpus: Mutex<Vec<u32>>,
    /// GPUs whose MIG mode is off with "on" pending a reset, which turns it on.
    mig_pending: Mutex<Vec<u32>>,
    mig_on: Mutex<Vec<u32>>,
}

impl FakeNode {
    fn new(n: u8) -> Arc<FakeNode> {
        Arc::new(FakeNode {
            underlay: Ipv4Addr::new(10, 0, 0, n),
            applied: Mutex::new(NodePlan::default()),
            fail: Mutex::new(None),
            ended: Mutex::new(BTreeMap::new()),
            checks_run: Mutex::new(Vec::new()),
            faulty: Mutex::new(Vec::new()),
            resets: Mutex::new(Vec::new()),
            busy_gpus: Mutex::new(Vec::new()),
            mig_pending: Mutex::new(Vec::new()),
            mig_on: Mutex::new(Vec::new()),
        })
    }

    /// What is on the node now (its generation aside).
    fn holds(&self) -> NodePlan {
        NodePlan { generation: 0, ..self.applied.lock().expect("applied").clone() }
    }
}

impl NodeHost for FakeNode {
    fn apply(&self, plan: &NodePlan) -> Result<Vec<WorkloadStatus>, NodeError> {
        if let Some(error) = self.fail.lock().expect("fail").clone() {
            return Err(error);
        }
        plan.validate().map_err(NodeError::InvalidPlan)?;
        *self.applied.lock().expect("applied") = plan.clone();
        let ended = self.ended.lock().expect("ended");
        Ok(plan
            .workloads
            .iter()
            .map(|w| match ended.get(&w.environment_id) {
                Some((code, log)) if w.run => WorkloadStatus {
                    environment_id: w.environment_id.clone(),
                    state: Some(WorkloadState::Exited),
                    exit_code: Some(*code),
                    error: None,
                    log_tail: log.clone(),
                },
                _ => WorkloadStatus {
                    environment_id: w.environment_id.clone(),
                    state: Some(if w.run { WorkloadState::Running } else { WorkloadState::Pulled }),
                    exit_code: None,
                    error: None,
                    log_tail: Vec::new(),
                },
            })
            .collect())
    }

    fn underlay_address(&self) -> Option<Ipv4Addr> {
        Some(self.underlay)
    }

    /// What the real tools print (`domain/fixtures/checks/`), a fault's output where told;
    /// a reset as `nvidia-smi -r` words it.
    fn run_order(&self, order: &AgentOrder) -> CheckAnswer {
        let (kind, level) = match order.task {
            NodeTask::Check { kind, level, .. } => (kind, level),
            NodeTask::ResetGpu { gpu } => {
                self.resets.lock().expect("resets").push(gpu);
                let bus = format!("GPU 00000000:{:02X}:00.0", 0x18 + gpu);
                let busy = self.busy_gpus.lock().expect("busy").contains(&gpu);
                let mut pending = self.mig_pending.lock().expect("pending");
                if !busy && pending.contains(&gpu) {
                    pending.retain(|g| *g != gpu);
                    self.mig_on.lock().expect("mig").push(gpu);
                }
                return CheckAnswer::printed(if busy {
                    format!(
                        "The following GPUs could not be reset:\n  {bus}: In use by another client\n\n1 device is \
                         currently being used by one or more other processes (e.g., Fabric Manager, CUDA application, \
                         graphics application such as an X server, or a monitoring application such as another \
                         instance of nvidia-smi). Please first kill all processes using the device and retry the \
                         command or reboot the system to make GPU reset take effect.\n"
                    )
                } else {
                    format!("{bus} was successfully reset.\nAll done.\n")
                });
            }
        };
        self.checks_run.lock().expect("checks").push((kind, level));
        let faulty = self.faulty.lock().expect("faulty").contains(&kind);
        let output = match (kind, faulty) {
            (CheckKind::GpuDiagnostics, false) => {
                include_str!("../../../domain/fixtures/checks/dcgmi-diag-r1-pass.json")
            }
            (CheckKind::GpuDiagnostics, true) => {
                include_str!("../../../domain/fixtures/checks/dcgmi-diag-r3-memory-fail.json")
            }
            (CheckKind::MemoryErrors, _) => {
                include_str!("../../../domain/fixtures/checks/nvidia-smi-q-health.recorded.txt")
            }
            (CheckKind::XidEvents, false) => "",
            (CheckKind::XidEvents, true) => include_str!("../../../domain/fixtures/checks/dmesg-xid.txt"),
            (CheckKind::NcclBandwidth, false) => {
                include_str!("../../../domain/fixtures/checks/all_reduce_perf-8xH100-nvlink.txt")
            }
            (CheckKind::NcclBandwidth, true) => {
                include_str!("../../../domain/fixtures/checks/all_reduce_perf-8xH100-weak-link.txt")
            }
            (CheckKind::Infiniband, _) => return CheckAnswer::failed("ibstat is not installed on this node".into()),
        };
        CheckAnswer::printed(output.to_owned())
    }
}

impl GpuProbe for FakeNode {
    fn gpus(&self) -> Result<Vec<GpuReport>, berth_agent::Error> {
        let (pending, on) = (self.mig_pending.lock().expect("pending"), self.mig_on.lock().expect("mig"));
        Ok((0..8)
            .map(|index| GpuReport {
                index,
                uuid: format!("GPU-{}-{index}", self.underlay),
                name: "NVIDIA H100 80GB HBM3".into(),
                memory_mib: 81_559,
                ecc_uncorrected: Some(0),
                temperature_c: Some(40),
                mig_enabled: on.contains(&u32::try_from(index).expect("small")),
                mig_pending: Some(
                    on.contains(&u32::try_from(index).expect("small"))
                        || pending.contains(&u32::try_from(index).expect("small")),
                ),
                ..GpuReport::default()
            })
            .collect())
    }
}

/// A served Berth on the bare-metal backend with an agent on each fake node.
struct Metal {
    berth: Berth,
    nodes: BTreeMap<&'static str, Arc<FakeNode>>,
    backend: Arc<BareMetal>,
    acme: User,
    globex: User,
    admin: User,
    /// Each node's agent token.
    tokens: BTreeMap<&'static str, String>,
    stop: tokio::sync::watch::Sender<bool>,
    /// Where the served Berth listens.
    url: String,
}

impl Metal {
    async fn start() -> Metal {
        Metal::start_with(None).await
    }

    /// With volumes kept under `volumes_path` (the shared filesystem's mount point).
    async fn start_with(volumes_path: Option<std::path::PathBuf>) -> Metal {
        Metal::start_with_quotas(volumes_path, None).await
    }

    /// With volumes kept under `volumes_path`, and project quotas on it where given.
    async fn start_with_quotas(volumes_path: Option<std::path::PathBuf>, quotas: Option<VolumeQuotas>) -> Metal {
        let _ = tracing_subscriber::fmt().with_test_writer().with_env_filter("info,sqlx=warn").try_init();
        let berth = Berth::start_with_fleet(None, FLEET).await;
        let p = &berth.platform;
        let acme_id = p.ensure_tenant("acme", "Acme", Isolation::Hard).await.expect("hard tenant");
        let globex_id = p.ensure_tenant("globex", "Globex", Isolation::Soft).await.expect("soft tenant");
        let acme = berth.person("ada@acme.example", Role::Member, Some(acme_id)).await;
        let globex = berth.person("gil@globex.example", Role::Member, Some(globex_id)).await;
        let admin = berth.person("root@example.com", Role::PlatformAdmin, None).await;
        let url = berth.serve_on_loopback().await;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let (mut nodes, mut tokens) = (BTreeMap::new(), BTreeMap::new());
        for (i, name) in NODES.into_iter().enumerate() {
            let node = FakeNode::new(u8::try_from(i + 1).expect("small"));
            let (_, secret) = p.create_node_token(&admin.caller(meta()), name).await.expect("node token");
            let agent = Agent::new(&url, &secret, Duration::from_secs(3600), node.clone())
                .expect("agent")
                .with_host(node.clone(), Duration::from_millis(20));
            let mut stopped = stopped.clone();
            tokio::spawn(async move {
                agent
                    .run(async move {
                        let _ = stopped.wait_for(|s| *s).await;
                    })
                    .await;
            });
            nodes.insert(name, node);
            tokens.insert(name, secret);
        }
        let metal =
            BareMetal::new(p.clone(), BareMetalConfig { poll_interval: Duration::from_millis(10), volumes_path });
        let backend = Arc::new(match quotas {
            Some(quotas) => metal.with_volume_quotas(quotas),
            None => metal,
        });
        Metal { berth, nodes, backend, acme, globex, admin, tokens, stop, url }
    }

    fn reconciler(&self) -> Reconciler {
        let config = ReconcilerConfig {
            tick: Duration::from_millis(20),
            step_timeout: Duration::from_secs(20),
            retry_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(200),
            ..ReconcilerConfig::default()
        };
        Reconciler::new(self.berth.platform.clone(), self.backend.clone(), config)
    }

    /// Runs a reconciler until the returned sender is told to stop.
    fn run_reconciler(&self) -> (tokio::sync::watch::Sender<bool>, tokio::task::JoinHandle<()>) {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let reconciler = self.reconciler();
        let task = tokio::spawn(reconciler.run(async move {
            let _ = stopped.wait_for(|s| *s).await;
        }));
        (stop, task)
    }

    async fn launch(&self, user: &User, offering: &str, size: &str, name: &str, image: &str, command: &str) -> String {
        let request = LaunchRequest {
            offering: offering.into(),
            size: size.into(),
            name: name.into(),
            hours: "2".into(),
            image: image.into(),
            command: command.into(),
            ..LaunchRequest::default()
        };
        self.berth.platform.launch(&user.caller(meta()), &request).await.expect("launch").id
    }

    async fn environment(&self, user: &User, id: &str) -> Environment {
        self.berth.platform.environment_of(&user.caller(meta()), id).await.expect("environment")
    }

    async fn wait_for(&self, user: &User, id: &str, state: EnvState) -> Environment {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let env = self.environment(user, id).await;
            if env.state == state {
                return env;
            }
            if tokio::time::Instant::now() >= deadline {
                let steps: Vec<(String, String, String, Option<String>)> = sqlx::query_as(
                    "SELECT phase, step, status, detail FROM environment_steps WHERE environment_id = ? ORDER BY phase, idx",
                )
                .bind(id)
                .fetch_all(self.berth.platform.db())
                .await
                .expect("steps");
                panic!("{id} is {} ({:?}), not {state}; steps: {steps:?}", env.state, env.failure_reason);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Until every node holds its latest plan.
    async fn settled(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let pending: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM node_plans WHERE reported_generation < generation OR reported_error IS NOT NULL",
            )
            .fetch_one(self.berth.platform.db())
            .await
            .expect("plans");
            if pending == 0 {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "{pending} nodes never applied their plan");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// What each node holds, and each node's plan generation.
    async fn snapshot(&self) -> (BTreeMap<&'static str, NodePlan>, Vec<(i64, i64)>) {
        let held = self.nodes.iter().map(|(name, node)| (*name, node.holds())).collect();
        let generations = sqlx::query_as("SELECT node_id, generation FROM node_plans ORDER BY node_id")
            .fetch_all(self.berth.platform.db())
            .await
            .expect("generations");
        (held, generations)
    }

    /// Nodes hold nothing of any environment, and no part is left in the database.
    async fn assert_nothing_left(&self) {
        self.settled().await;
        for (name, node) in &self.nodes {
            assert_eq!(node.holds(), NodePlan::default(), "{name} still holds something");
        }
        let parts: i64 = sqlx::query_scalar("SELECT count(*) FROM node_plan_parts")
            .fetch_one(self.berth.platform.db())
            .await
            .expect("parts");
        assert_eq!(parts, 0);
    }

    /// The node whose plan holds `id`'s workload, with it.
    fn node_running(&self, id: &str) -> (&'static str, NodePlan) {
        self.nodes
            .iter()
            .map(|(name, node)| (*name, node.holds()))
            .find(|(_, plan)| plan.workloads.iter().any(|w| w.environment_id == id))
            .unwrap_or_else(|| panic!("no node runs {id}"))
    }
}

impl Drop for Metal {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

#[tokio::test]
async fn each_offering_provisions_on_the_nodes_and_tears_down_leaving_nothing() {
    let metal = Metal::start().await;
    let (stop, reconciler) = metal.run_reconciler();
    let (acme, globex) = (&metal.acme, &metal.globex);

    let notebook = metal
        .launch(acme, "notebook", "h100-1g.10gb", "nb", "quay.io/jupyter/pytorch-notebook:cuda12-latest", "")
        .await;
    let inference = metal.launch(acme, "inference", "h100-3g.40gb", "serve", "ghcr.io/acme/llm:1", "").await;
    let training =
        metal.launch(globex, "training", "h100-1", "train", "ghcr.io/globex/train:2", "python train.py").await;
    let cluster = metal.launch(acme, "cluster", "h100-node-1", "dedicated", "", "").await;
    let ready_notebook = metal.wait_for(acme, &notebook, EnvState::Ready).await;
    metal.wait_for(acme, &inference, EnvState::Ready).await;
    metal.wait_for(globex, &training, EnvState::Ready).await;
    let ready_cluster = metal.wait_for(acme, &cluster, EnvState::Ready).await;
    metal.settled().await;

    // The notebook runs on its MIG slice with its token, published on its node.
    let (node, plan) = metal.node_running(&notebook);
    let workload = plan.workloads.iter().find(|w| w.environment_id == notebook).expect("notebook");
    assert!(workload.run && workload.image.starts_with("quay.io/jupyter/"));
    let [Device::Mig { gpu, instance }] = workload.devices[..] else { panic!("{:?}", workload.devices) };
    assert!(plan.mig.iter().any(|g| g.gpu == gpu && g.instances.contains(&instance)), "{:?}", plan.mig);
    // Berth's proxy reaches it at the port its node publishes, with its token.
    let workload_spec = metal.reconciler().workload_of(&notebook).await.expect("workload");
    let upstream = metal.backend.upstream(&workload_spec).await.expect("upstream");
    assert_eq!(upstream.base_url, format!("http://{node}:{}", workload.host_port.expect("port")));
    assert_eq!(
        upstream.headers,
        [("authorization".to_owned(), format!("token {}", workload.secret.clone().expect("token")))]
    );
    let connection = ready_notebook.connection.expect("connection");
    assert_eq!(connection.url, format!("http://{node}:{}/lab", workload.host_port.expect("port")));
    assert_eq!(connection.secret, workload.secret);
    // acme is hard: its network is on every node of its environments, each tunnelling
    // to the others; globex is soft and has none.
    let acme_nodes: Vec<&str> = metal
        .nodes
        .iter()
        .filter(|(_, n)| n.holds().networks.iter().any(|a| a.tenant == "acme"))
        .map(|(name, _)| *name)
        .collect();
    assert!(acme_nodes.contains(&node), "{acme_nodes:?}");
    let segment = metal.berth.platform.tenant_segment("acme").await.expect("segment").expect("a hard tenant's segment");
    for name in &acme_nodes {
        let held = metal.nodes[name].holds();
        let attachment = held.networks.iter().find(|a| a.tenant == "acme").expect("acme");
        assert_eq!(attachment.segment, segment);
        assert_eq!(attachment.peers.len(), acme_nodes.len() - 1, "{name}: {:?}", attachment.peers);
        assert!(held.networks.iter().all(|a| a.tenant != "globex"));
    }
    assert!(matches!(segment, TenantSegment::Vlan(_)), "the default segment is a VLAN");
    // acme's containers sit on its network too, each at an address of its own above the
    // nodes' addresses; globex's has none.
    let container_network = |id: &str| {
        let (_, plan) = metal.node_running(id);
        plan.workloads.iter().find(|w| w.environment_id == id).expect("workload").network.clone()
    };
    let (on_notebook, on_inference) =
        (container_network(&notebook).expect("on acme's network"), container_network(&inference).expect("too"));
    for network in [&on_notebook, &on_inference] {
        assert_eq!((network.tenant.as_str(), network.segment), ("acme", segment));
        assert!(u32::from(network.address) - u32::from(segment.subnet()) > 3, "{network:?}");
    }
    assert_ne!(on_notebook.address, on_inference.address);
    let clash = sqlx::query(
        "UPDATE node_plan_parts SET body = json_set(body, '$.network.address', ?)
         WHERE environment_id = ? AND kind = 'workload'",
    )
    .bind(on_notebook.address.to_string())
    .bind(&inference)
    .execute(metal.berth.platform.db())
    .await;
    assert!(
        clash.is_err_and(|e| e.to_string().contains("UNIQUE")),
        "the database refuses two containers at one address on a segment"
    );
    assert_eq!(container_network(&training), None);
    // The training job runs on a whole GPU with its command; the dedicated node runs
    // nothing but has acme's network, and its owner gets SSH to its account there.
    let (_, plan) = metal.node_running(&training);
    let job = plan.workloads.iter().find(|w| w.environment_id == training).expect("job");
    assert_eq!((job.command.as_deref(), job.devices.len()), (Some("python train.py"), 1));
    assert!(matches!(job.devices[0], Device::Gpu(_)));
    let account = berth_domain::node_access::account_name(&cluster);
    assert!(ready_cluster.connection.expect("connection").url.starts_with(&format!("ssh://{account}@h100-0")));

    for (user, id) in [(acme, &notebook), (acme, &inference), (globex, &training), (acme, &cluster)] {
        metal.berth.platform.stop(&user.caller(meta()), id).await.expect("stop");
    }
    for (user, id) in [(acme, &notebook), (acme, &inference), (globex, &training), (acme, &cluster)] {
        metal.wait_for(user, id, EnvState::Released).await;
    }
    metal.assert_nothing_left().await;
    let _ = stop.send(true);
    reconciler.await.expect("reconciler");
}

#[tokio::test]
async fn volumes_are_bind_mounted_from_the_shared_filesystem_and_removed_when_deleted() {
    let shared = std::env::temp_dir().join(format!("berth-shared-{}", uuid::Uuid::new_v4()));
    let metal = Metal::start_with(Some(shared.clone())).await;
    let (stop, reconciler) = metal.run_reconciler();
    let globex = &metal.globex;
    let notebook = metal
        .launch(globex, "notebook", "h100-1g.10gb", "nb", "quay.io/jupyter/pytorch-notebook:cuda12-latest", "")
        .await;
    metal.wait_for(globex, &notebook, EnvState::Ready).await;
    metal.settled().await;
    // The node's plan bind-mounts the home volume's directory on the shared filesystem.
    let home: i64 = sqlx::query_scalar("SELECT id FROM volumes WHERE is_home = 1")
        .fetch_one(metal.berth.platform.db())
        .await
        .expect("the home volume");
    let dir = shared.join(format!("berth-vol-{home}"));
    let (_, plan) = metal.node_running(&notebook);
    let workload = plan.workloads.iter().find(|w| w.environment_id == notebook).expect("notebook");
    assert_eq!(
        workload.volumes,
        [berth_domain::node_plan::NodeVolume {
            host_path: dir.display().to_string(),
            mount_path: "/home/jovyan/work".into()
        }]
    );
    let location: Option<String> = sqlx::query_scalar("SELECT location FROM volumes WHERE id = ?")
        .bind(home)
        .fetch_one(metal.berth.platform.db())
        .await
        .expect("location");
    assert_eq!(location, Some(dir.display().to_string()));
    // What the agent's `mkdir -p` made on the shared filesystem (the fake node runs nothing).
    std::fs::create_dir_all(&dir).expect("the volume's directory");
    std::fs::write(dir.join("notes.txt"), "kept").expect("a file");

    metal.berth.platform.stop(&globex.caller(meta()), &notebook).await.expect("stop");
    metal.wait_for(globex, &notebook, EnvState::Released).await;
    assert!(dir.join("notes.txt").exists(), "the volume outlives the environment");
    metal.berth.platform.delete_volume(&globex.caller(meta()), home).await.expect("delete");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while dir.exists() {
        assert!(tokio::time::Instant::now() < deadline, "the deleted volume's directory is still there");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop.send(true);
    reconciler.await.expect("reconciler");
    let _ = metal.stop.send(true);
    let _ = std::fs::remove_dir_all(&shared);
}

/// `findmnt` and `xfs_quota` as they answer on an XFS filesystem mounted with `prjquota`
/// (reconstructed from their documented formats, see `xfs_quota.rs`); every command line
/// kept.
struct XfsHost {
    mount: std::path::PathBuf,
    ran: std::sync::Mutex<Vec<String>>,
}

impl Runner for XfsHost {
    fn run<'a>(&'a self, command: &'a CommandLine) -> RunFuture<'a> {
        let line = command.to_string();
        self.ran.lock().expect("ran").push(line.clone());
        let script = command.args.get(2).cloned().unwrap_or_default();
        let stdout = if command.program == "findmnt" {
            format!("xfs {}\n", self.mount.display())
        } else if script == "state" {
            "Project quota state on /srv/berth (/dev/sdb1)\n  Accounting: ON\n  Enforcement: ON\n".to_owned()
        } else if let Some(rest) = script.strip_prefix("project -s -p ") {
            let id = rest.rsplit(' ').next().unwrap_or_default();
            format!(
                "Setting up project {id} (path {rest})...\nProcessed 1 (/etc/projects and cmdline) paths for project {id} with recursion depth infinite (-1).\n"
            )
        } else {
            String::new()
        };
        Box::pin(async move { Ok(CommandOutput { success: true, stdout, stderr: String::new() }) })
    }
}

#[tokio::test]
async fn volumes_on_xfs_get_a_project_quota_of_their_size_set_again_when_grown() {
    let shared = std::env::temp_dir().join(format!("berth-xfs-{}", uuid::Uuid::new_v4()));
    let host = Arc::new(XfsHost { mount: shared.clone(), ran: std::sync::Mutex::new(Vec::new()) });
    let quotas = VolumeQuotas::detect(&shared, host.clone()).await.expect("XFS with project quotas");
    let metal = Metal::start_with_quotas(Some(shared.clone()), Some(quotas)).await;
    assert!(metal.backend.volume_size_rule().contains("XFS project quota of its size"));
    let (stop, reconciler) = metal.run_reconciler();
    let globex = &metal.globex;
    let notebook = metal
        .launch(globex, "notebook", "h100-1g.10gb", "nb", "quay.io/jupyter/pytorch-notebook:cuda12-latest", "")
        .await;
    metal.wait_for(globex, &notebook, EnvState::Ready).await;
    let home: i64 = sqlx::query_scalar("SELECT id FROM volumes WHERE is_home = 1")
        .fetch_one(metal.berth.platform.db())
        .await
        .expect("the home volume");
    let dir = shared.join(format!("berth-vol-{home}"));
    assert!(dir.is_dir(), "Berth made the volume's directory before the node used it");
    let (project, m) = (1_000_000 + home, shared.display());
    let expected = vec![
        format!("findmnt -n -r -o FSTYPE,TARGET -T {m}"),
        format!("xfs_quota -x -c state {m}"),
        format!("xfs_quota -x -c 'project -s -p {} {project}' {m}", dir.display()),
        format!("xfs_quota -x -c 'limit -p bhard={} {project}' {m}", 10u64 << 30),
    ];
    assert_eq!(*host.ran.lock().expect("ran"), expected, "set once, before the start, at the home volume's 10 GiB");

    metal.berth.platform.resize_volume(&globex.caller(meta()), home, "12").await.expect("grown");
    let grown = format!("xfs_quota -x -c 'limit -p bhard={} {project}' {m}", 12u64 << 30);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !host.ran.lock().expect("ran").contains(&grown) {
        assert!(tokio::time::Instant::now() < deadline, "the grown volume's limit was not set");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(host.ran.lock().expect("ran").len(), expected.len() + 1, "only the limit changes");
    let _ = stop.send(true);
    reconciler.await.expect("reconciler");
    let _ = metal.stop.send(true);
    let _ = std::fs::remove_dir_all(&shared);
}

#[tokio::test]
async fn an_agents_error_fails_the_step_with_its_words_and_teardown_finishes_once_it_recovers() {
    let metal = Metal::start().await;
    for node in metal.nodes.values() {
        let missing = CommandError {
            command: "nvidia-smi --query-gpu=index,mig.mode.current --format=csv,noheader".into(),
            failure: Failure::NotInstalled { program: "nvidia-smi".into() },
        };
        *node.fail.lock().expect("fail") = Some(NodeError::Command(missing));
    }
    let (stop, reconciler) = metal.run_reconciler();
    let id =
        metal.launch(&metal.acme, "notebook", "h100-1g.10gb", "nb", "quay.io/jupyter/scipy-notebook:latest", "").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let failed = loop {
        let env = metal.environment(&metal.acme, &id).await;
        if env.failure_reason.is_some() {
            break env;
        }
        assert!(tokio::time::Instant::now() < deadline, "the step did not fail");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let reason = failed.failure_reason.expect("reason");
    assert!(
        reason.starts_with("Configure GPU partition failed: the agent on h100-0")
            && reason.ends_with("reports: nvidia-smi is not installed on this node"),
        "{reason}"
    );
    // Teardown keeps trying while the node cannot apply anything, and ends once it can.
    for node in metal.nodes.values() {
        *node.fail.lock().expect("fail") = None;
    }
    metal.wait_for(&metal.acme, &id, EnvState::Failed).await;
    metal.assert_nothing_left().await;
    let _ = stop.send(true);
    reconciler.await.expect("reconciler");
}

#[tokio::test]
async fn every_step_repeated_after_a_crash_changes_nothing_and_neither_does_a_second_pass() {
    let metal = Metal::start().await;
    let reconciler = metal.reconciler();
    let (acme, globex) = (&metal.acme, &metal.globex);
    let cases = [
        (acme, metal.launch(acme, "notebook", "h100-3g.40gb", "nb", "quay.io/jupyter/scipy-notebook:latest", "").await),
        (globex, metal.launch(globex, "training", "h100-1", "train", "ghcr.io/globex/train:2", "python t.py").await),
        (acme, metal.launch(acme, "inference", "h100-1g.10gb", "serve", "ghcr.io/acme/llm:1", "").await),
        (acme, metal.launch(acme, "cluster", "h100-node-1", "dedicated", "", "").await),
    ];
    for (user, id) in &cases {
        let env = metal.environment(user, id).await;
        let workload = reconciler.workload_of(id).await.expect("workload");
        let provision = provision_plan(env.offering, env.size.shape);
        for &step in &provision {
            metal.backend.run(&workload, step).await.unwrap_or_else(|e| panic!("{id}: {}: {e}", step.as_str()));
            metal.settled().await;
            let after = metal.snapshot().await;
            // The reconciler died before journaling the step: its successor runs it again.
            metal.backend.run(&workload, step).await.unwrap_or_else(|e| panic!("{id}: again {}: {e}", step.as_str()));
            metal.settled().await;
            assert_eq!(metal.snapshot().await, after, "{id}: repeating {} changed the nodes", step.as_str());
        }
        // A second reconcile of the converged environment: every step again, nothing moves.
        let converged = metal.snapshot().await;
        for &step in &provision {
            metal.backend.run(&workload, step).await.expect("second pass");
        }
        assert_eq!(metal.snapshot().await, converged, "{id}: a second pass changed the nodes");
    }
    for (user, id) in &cases {
        let env = metal.environment(user, id).await;
        let workload = reconciler.workload_of(id).await.expect("workload");
        for step in teardown_plan(env.size.shape) {
            metal.backend.run(&workload, step).await.unwrap_or_else(|e| panic!("{id}: {}: {e}", step.as_str()));
            metal.settled().await;
            let after = metal.snapshot().await;
            metal.backend.run(&workload, step).await.unwrap_or_else(|e| panic!("{id}: again {}: {e}", step.as_str()));
            metal.settled().await;
            assert_eq!(metal.snapshot().await, after, "{id}: repeating {} changed the nodes", step.as_str());
        }
    }
    metal.assert_nothing_left().await;
}

#[tokio::test]
async fn a_reconciler_killed_mid_provisioning_converges_after_restart() {
    let metal = Metal::start().await;
    let (stop, task) = metal.run_reconciler();
    let id =
        metal.launch(&metal.acme, "notebook", "h100-1g.10gb", "nb", "quay.io/jupyter/scipy-notebook:latest", "").await;
    // Killed as soon as the first step is journaled.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let done: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM environment_steps WHERE environment_id = ? AND status = 'succeeded'",
        )
        .bind(&id)
        .fetch_one(metal.berth.platform.db())
        .await
        .expect("steps");
        if done >= 1 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no step finished");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _ = stop.send(true);
    task.await.expect("reconciler");
    let (stop, task) = metal.run_reconciler();
    metal.wait_for(&metal.acme, &id, EnvState::Ready).await;
    metal.berth.platform.stop(&metal.acme.caller(meta()), &id).await.expect("stop");
    metal.wait_for(&metal.acme, &id, EnvState::Released).await;
    metal.assert_nothing_left().await;
    let _ = stop.send(true);
    task.await.expect("reconciler");
}

#[tokio::test]
async fn the_sweep_takes_a_part_no_live_environment_explains_off_its_node() {
    let metal = Metal::start().await;
    let (stop, task) = metal.run_reconciler();
    let id =
        metal.launch(&metal.acme, "notebook", "h100-1g.10gb", "nb", "quay.io/jupyter/scipy-notebook:latest", "").await;
    metal.wait_for(&metal.acme, &id, EnvState::Ready).await;
    metal.settled().await;
    let (node, running) = metal.node_running(&id);
    metal.berth.platform.stop(&metal.acme.caller(meta()), &id).await.expect("stop");
    metal.wait_for(&metal.acme, &id, EnvState::Released).await;
    let _ = stop.send(true);
    task.await.expect("reconciler");
    metal.assert_nothing_left().await;

    // A step whose write landed after teardown (its answer lost): the released notebook's
    // container is back in its node's plan, and the node runs it again.
    let workload = running.workloads.iter().find(|w| w.environment_id == id).expect("workload").clone();
    let writes = [(node.to_owned(), berth_platform::provisioning::node_plans::PartWrite::Workload(workload))];
    metal.berth.platform.write_node_parts(&id, &writes, false).await.expect("late write");
    metal.settled().await;
    assert_eq!(metal.node_running(&id).0, node);

    let report = metal.reconciler().sweep().await.expect("sweep");
    assert_eq!(report.removed.len(), 1, "{report:?}");
    assert_eq!(report.removed[0].name, format!("{node}/{id}"));
    metal.assert_nothing_left().await;
    let audited: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE action = 'orphan.remove'")
        .fetch_one(metal.berth.platform.db())
        .await
        .expect("audit");
    assert_eq!(audited, 1);
    // A second sweep finds nothing.
    assert!(metal.reconciler().sweep().await.expect("sweep").removed.is_empty());
}

#[tokio::test]
async fn a_training_job_that_exits_on_a_node_releases_its_gpus_and_keeps_its_log() {
    let metal = Metal::start().await;
    let (stop, task) = metal.run_reconciler();
    let globex = &metal.globex;
    let id = metal.launch(globex, "training", "h100-1", "train", "ghcr.io/globex/train:2", "python train.py").await;
    metal.wait_for(globex, &id, EnvState::Ready).await;
    let (node, _) = metal.node_running(&id);
    let log = vec!["epoch 1/1: loss 0.42".to_owned(), "Traceback: CUDA out of memory".to_owned()];
    metal.nodes[node].ended.lock().expect("ended").insert(id.clone(), (137, log.clone()));

    // The agent's next report says the container exited; the reconciler's next look ends it.
    let failed = metal.wait_for(globex, &id, EnvState::Failed).await;
    assert_eq!(
        failed.failure_reason.as_deref(),
        Some("the training job failed with exit code 137: exited with code 137")
    );
    let logs = metal.berth.platform.job_logs(&globex.caller(meta()), &id, 200).await.expect("kept log");
    assert_eq!(logs.lines, log);
    assert_eq!(
        logs.status,
        berth_platform::provisioning::backend::JobStatus::Failed {
            exit_code: Some(137),
            reason: "exited with code 137".into()
        }
    );
    metal.assert_nothing_left().await;
    let _ = stop.send(true);
    task.await.expect("reconciler");
}

/// SSH keys of ada (the owner), of acme's tenant admin, of bob (another acme member), of
/// gil (globex) and of a platform admin: only the first two may act in ada's cluster.
const ADA_KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKzNtyR4cmJGDog7LEjOcX9o3mjUze+WPw53Rf+R08s7 ada@laptop";
const ADMIN_KEY: &str = "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBM3LPjfmplX56nT4Pq0/ydNnPEtHzpGtNw/E8x2ug+Y9TAbEkQa9mMzvCcpz1JpaTSxlpgJICzFwO9o6AWHNsO0= admin@acme";
const BOB_KEY: &str = "ecdsa-sha2-nistp384 AAAAE2VjZHNhLXNoYTItbmlzdHAzODQAAAAIbmlzdHAzODQAAABhBPfdhckwhfmmLKpinKRtRJcMOkYJukx8SOkpFzuPiXSJjO8M0C0/6OgwuWxVuQ0whsp6UNhN14Mnzsy9cprsTarg2AXPvlhZ9DXJdp3PfKX+sKfv1lwiZPXqfUHM7YpUTQ== bob@acme";
const GIL_KEY: &str = "ecdsa-sha2-nistp521 AAAAE2VjZHNhLXNoYTItbmlzdHA1MjEAAAAIbmlzdHA1MjEAAACFBADakYzbedkdpcBgjBewtNmtviggPcchlwj+mbdQFrA8Bq/goXacYx53YOg2xP53L5bdTkLNlA2PIVRAwT/pewhgEgB5Jpca+CSkYKADBgBv/x2pLy+dCR1FykiLRm7vM8MWDGnNrx5GHUxFSnObfQ6/4I08ne2zBiu16WcffduRUZetGg== gil@globex";
const STAFF_KEY: &str = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQChu78UnMrqj8zQpeLcoF8xG+jm7e0BMAk9oCF1qwxPeUbrwJvne1SedJO4/HtCksY4fFM7lC24YngQBf5qjWCTyVNbX4OLZzkcF+Zi3XoGRfuPoIEzj+zjXDx3rRowa+CEJrCHOCdd/jYuoOaQGcBJQbLHmUkeCwMkzDwI/1KHLFRWv1hZMypAwy0OEur2TZqWx+1mbkgX7y6E61xeBb/uZLbZ9TdMMUodkj7UQWLqZ/LnpbEUSDx/dTDjF9hrF/rgRjl0nLu0GYK8M8nGYG7MfrkhdEG3MhH70sTDzhBCK6wtUXdsf9GmvG++HlJr6cXN1OQdOthbfgyRwIzewD6H root@staff";

#[tokio::test]
async fn a_dedicated_cluster_lets_in_its_owners_and_tenant_admins_keys_on_its_nodes_only() {
    let metal = Metal::start().await;
    let p = &metal.berth.platform;
    let acme_id = metal.acme.tenant_id.expect("acme");
    let admin = metal.berth.person("root@acme.example", Role::TenantAdmin, Some(acme_id)).await;
    let bob = metal.berth.person("bob@acme.example", Role::Member, Some(acme_id)).await;
    let staff = metal.berth.person("ops@example.com", Role::PlatformAdmin, None).await;
    for (user, key) in
        [(&metal.acme, ADA_KEY), (&admin, ADMIN_KEY), (&bob, BOB_KEY), (&metal.globex, GIL_KEY), (&staff, STAFF_KEY)]
    {
        p.add_ssh_key(&user.caller(meta()), "", key).await.expect("key");
    }
    let (stop, reconciler) = metal.run_reconciler();
    let cluster = metal.launch(&metal.acme, "cluster", "h100-node-2", "pair", "", "").await;
    let training =
        metal.launch(&metal.globex, "training", "h100-1", "train", "ghcr.io/globex/train:2", "python t.py").await;
    let ready = metal.wait_for(&metal.acme, &cluster, EnvState::Ready).await;
    metal.wait_for(&metal.globex, &training, EnvState::Ready).await;
    metal.settled().await;

    let account = berth_domain::node_access::account_name(&cluster);
    assert!(berth_domain::node_access::is_berth_account(&account), "{account}");
    let (training_node, _) = metal.node_running(&training);
    let cluster_nodes: Vec<&str> = NODES.into_iter().filter(|n| *n != training_node).collect();
    let expected = |keys: &[&str]| {
        vec![berth_domain::node_access::NodeAccount {
            name: account.clone(),
            environment_id: cluster.clone(),
            authorized_keys: keys.iter().map(|k| (*k).to_owned()).collect(),
        }]
    };
    for (name, node) in &metal.nodes {
        let held = node.holds().accounts;
        if cluster_nodes.contains(name) {
            assert_eq!(held, expected(&[ADA_KEY, ADMIN_KEY]), "{name}");
        } else {
            assert!(held.is_empty(), "{name} is not the cluster's, yet holds {held:?}");
        }
    }
    let connection = ready.connection.expect("connection");
    assert_eq!(connection.url, format!("ssh://{account}@{}", cluster_nodes[0]));
    assert_eq!(connection.example, format!("ssh {account}@{} / ssh {account}@{}", cluster_nodes[0], cluster_nodes[1]));

    // A key removed, or an admin who becomes a member, is off the nodes at the next pass;
    // a new key, or a member who becomes an admin, is on them.
    let keys = p.my_ssh_keys(&metal.acme.caller(meta())).await.expect("keys");
    p.remove_ssh_key(&metal.acme.caller(meta()), keys[0].id).await.expect("removed");
    p.change_member_role(&staff.caller(meta()), acme_id, bob.id, "tenant_admin").await.expect("promoted");
    p.change_member_role(&staff.caller(meta()), acme_id, admin.id, "member").await.expect("demoted");
    let again = ADA_KEY.replace("ada@laptop", "ada@desktop");
    p.add_ssh_key(&metal.acme.caller(meta()), "desktop", &again).await.expect("the same key again, named anew");
    metal.settled().await;
    let desktop = ADA_KEY.replace("ada@laptop", "desktop");
    for name in &cluster_nodes {
        assert_eq!(metal.nodes[name].holds().accounts, expected(&[&desktop, BOB_KEY]), "{name}");
    }
    // The demoted admin, removed from the tenant and invited back as an admin, is on them
    // again at once.
    p.remove_member(&staff.caller(meta()), acme_id, admin.id).await.expect("removed");
    p.invite_member(&staff.caller(meta()), acme_id, "root@acme.example", "tenant_admin").await.expect("invited back");
    metal.settled().await;
    for name in &cluster_nodes {
        assert_eq!(metal.nodes[name].holds().accounts, expected(&[&desktop, ADMIN_KEY, BOB_KEY]), "{name}");
    }
    let audited: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE action IN ('ssh_key.add', 'ssh_key.remove')")
            .fetch_one(p.db())
            .await
            .expect("audit");
    assert_eq!(audited, 7);

    for (user, id) in [(&metal.acme, &cluster), (&metal.globex, &training)] {
        p.stop(&user.caller(meta()), id).await.expect("stop");
        metal.wait_for(user, id, EnvState::Released).await;
    }
    metal.assert_nothing_left().await;
    let _ = stop.send(true);
    reconciler.await.expect("reconciler");
}

/// Until the environment's state in the database is `state` (its owner may no longer be
/// able to look: their tenant is gone).
async fn wait_in_database(metal: &Metal, id: &str, state: EnvState) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now: String = sqlx::query_scalar("SELECT state FROM environments WHERE id = ?")
            .bind(id)
            .fetch_one(metal.berth.platform.db())
            .await
            .expect("state");
        if now == state.as_str() {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{id} is {now}, not {state}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// As platform/tests/teardown.rs for the simulated and Kubernetes backends: a hard tenant
/// with one environment of each offering on the nodes, deleted by a platform admin.
#[tokio::test]
async fn a_deleted_tenant_leaves_nothing_on_its_nodes() {
    let metal = Metal::start().await;
    let p = &metal.berth.platform;
    let (ada, globex) = (&metal.acme, &metal.globex);
    let acme_id = ada.tenant_id.expect("acme");
    let staff = metal.berth.person("ops@example.com", Role::PlatformAdmin, None).await;
    p.add_ssh_key(&ada.caller(meta()), "", ADA_KEY).await.expect("key");
    let (stop, reconciler) = metal.run_reconciler();
    let mut ids = Vec::new();
    for (offering, size, image, command) in [
        ("notebook", "h100-1g.10gb", "quay.io/jupyter/scipy-notebook:latest", ""),
        ("training", "h100-1", "ghcr.io/acme/train:1", "python train.py"),
        ("inference", "h100-3g.40gb", "ghcr.io/acme/llm:1", ""),
        ("cluster", "h100-node-1", "", ""),
    ] {
        ids.push(metal.launch(ada, offering, size, &format!("my-{offering}"), image, command).await);
    }
    let neighbour = metal.launch(globex, "training", "h100-1", "next-door", "ghcr.io/globex/t:1", "sleep 1d").await;
    for id in &ids {
        metal.wait_for(ada, id, EnvState::Ready).await;
    }
    metal.wait_for(globex, &neighbour, EnvState::Ready).await;
    metal.settled().await;
    // Before: acme is on its nodes (network, containers on it, the cluster's account).
    let acme_on = |plan: &NodePlan| {
        plan.networks.iter().any(|a| a.tenant == "acme")
            || plan.workloads.iter().any(|w| ids.contains(&w.environment_id))
            || !plan.accounts.is_empty()
    };
    let held_before = metal.nodes.values().filter(|n| acme_on(&n.holds())).count();
    assert_eq!(held_before, 2, "acme holds two nodes: its dedicated one and its shared one");
    let leases: i64 =
        sqlx::query_scalar("SELECT count(*) FROM fabric_leases WHERE tenant_id = ? AND released_at IS NULL")
            .bind(acme_id)
            .fetch_one(p.db())
            .await
            .expect("leases");
    assert_eq!(leases, 4, "a hard tenant holds its identifiers");

    p.change_tenant(&staff.caller(meta()), acme_id, berth_platform::tenancy::tenants::TenantChange::Delete)
        .await
        .expect("deleted");
    for id in &ids {
        wait_in_database(&metal, id, EnvState::Released).await;
    }
    metal.settled().await;

    // No node holds anything of acme: no plan part, network, container or account; the
    // neighbour's job runs on.
    for (name, node) in &metal.nodes {
        let held = node.holds();
        assert!(!acme_on(&held), "{name} still holds something of acme: {held:?}");
        assert!(held.mig.is_empty(), "{name} keeps acme's MIG slices: {:?}", held.mig);
    }
    let parts: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM node_plan_parts p JOIN environments e ON e.id = p.environment_id WHERE e.tenant_id = ?",
    )
    .bind(acme_id)
    .fetch_one(p.db())
    .await
    .expect("parts");
    assert_eq!(parts, 0);
    assert_eq!(metal.node_running(&neighbour).1.workloads.len(), 1);
    // Its reservations are released, the neighbour keeps its GPU.
    let held = |sql: &'static str| async move {
        sqlx::query_scalar::<_, i64>(sql).bind(acme_id).fetch_one(p.db()).await.expect("reservations")
    };
    let unreleased = "SELECT count(*) FROM reservations r JOIN environments e ON e.id = r.environment_id
                      WHERE r.released_at IS NULL AND e.tenant_id = ?";
    assert_eq!(held(unreleased).await, 0, "the deleted tenant holds capacity");
    let neighbours = "SELECT count(*) FROM reservations r JOIN environments e ON e.id = r.environment_id
                      WHERE r.released_at IS NULL AND e.tenant_id <> ?";
    assert_eq!(held(neighbours).await, 1, "the neighbour keeps its GPU");
    // Its fabric identifiers are in quarantine, not free and not retired.
    let released: Vec<(Option<i64>, Option<i64>, Option<i64>)> =
        sqlx::query_as("SELECT released_at, quarantine_until, retired_at FROM fabric_leases WHERE tenant_id = ?")
            .bind(acme_id)
            .fetch_all(p.db())
            .await
            .expect("leases");
    let now = berth_platform::now_ms();
    assert_eq!(released.len(), 4);
    assert!(
        released.iter().all(|(at, until, retired)| at.is_some() && until.is_some_and(|u| u > now) && retired.is_none()),
        "in quarantine: {released:?}"
    );
    // Nothing of it is left for the sweep to find.
    let report = metal.reconciler().sweep().await.expect("sweep");
    assert!(report.removed.is_empty() && report.failed.is_empty(), "{report:?}");

    p.stop(&globex.caller(meta()), &neighbour).await.expect("stop");
    metal.wait_for(globex, &neighbour, EnvState::Released).await;
    metal.assert_nothing_left().await;
    let _ = stop.send(true);
    reconciler.await.expect("reconciler");
}

/// Health checks on bare metal: the node's own agent runs each check's command and the
/// portal judges what it printed, as it judges the simulated fleet's; a failure degrades
/// the node; a repair tier's command is not sent to the node (a person runs it), and
/// acceptance after the repair runs on the node again.
#[tokio::test]
async fn checks_run_on_the_node_by_its_agent_and_a_failure_takes_it_out_of_service() {
    let metal = Metal::start().await;
    let platform = metal.berth.platform.clone().with_backend(metal.backend.clone());
    let admin = metal.admin.caller(meta());

    let run = platform.run_node_checks(&admin, "h100-03", "quick").await.expect("checks");
    assert_eq!(run.passed, Some(true), "{run:?}");
    let kinds: Vec<&str> = run.results.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(kinds, ["gpu_diagnostics", "memory_errors", "xid_events"]);
    let diag = &run.results[0];
    assert_eq!(diag.command, "dcgmi diag -r 1 -j");
    assert_eq!(diag.raw_output, include_str!("../../../domain/fixtures/checks/dcgmi-diag-r1-pass.json"));
    assert_eq!(
        *metal.nodes["h100-03"].checks_run.lock().expect("checks"),
        [
            (CheckKind::GpuDiagnostics, CheckLevel::Quick),
            (CheckKind::MemoryErrors, CheckLevel::Quick),
            (CheckKind::XidEvents, CheckLevel::Quick)
        ]
    );
    assert!(metal.nodes["h100-01"].checks_run.lock().expect("checks").is_empty(), "only the node checked runs them");

    // An answer from another node's agent names no order of its own; its own node's second
    // answer changes nothing.
    let order: i64 = sqlx::query_scalar(
        "SELECT o.id FROM node_orders o JOIN nodes n ON n.id = o.node_id WHERE n.name = 'h100-03' ORDER BY o.id",
    )
    .fetch_one(platform.db())
    .await
    .expect("order");
    let path = format!("/api/v1/agent/checks/{order}");
    let body = r#"{"output": "{}"}"#;
    let reply = metal.berth.api(Method::POST, &path, body, Some(&metal.tokens["h100-01"])).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.body);
    let reply = metal.berth.api(Method::POST, &path, body, Some(&metal.tokens["h100-03"])).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let kept: String = sqlx::query_scalar("SELECT output FROM node_orders WHERE id = ?")
        .bind(order)
        .fetch_one(platform.db())
        .await
        .expect("output");
    assert_eq!(kept, diag.raw_output, "the first answer stands");

    // A node whose GPU memory test fails is degraded, with DCGM's words.
    metal.nodes["h100-02"].faulty.lock().expect("faulty").push(CheckKind::GpuDiagnostics);
    let run = platform.run_node_checks(&admin, "h100-02", "quick").await.expect("checks");
    assert_eq!(run.passed, Some(false));
    assert!(!run.results[0].passed && run.results[0].summary.contains("GPU Memory"), "{:?}", run.results[0]);
    let health = platform.node_health(&admin, "h100-02").await.expect("health");
    assert_eq!(health.status.state, NodeState::Degraded);

    // The first repair tier names a command; the agent runs none the portal sends, so the
    // tier waits for a person, and the page says what to run.
    let health =
        platform.change_node_state(&admin, "h100-02", "start_repair", "memory test failed").await.expect("repair");
    assert_eq!((health.status.state, health.tier_name.as_deref()), (NodeState::InRepair, Some("reset GPUs")));
    assert_eq!(health.tier_command_by_hand.as_deref(), Some("nvidia-smi --gpu-reset"));
    let before = metal.nodes["h100-02"].checks_run.lock().expect("checks").len();

    // The person reset the GPUs; acceptance runs on the node at the medium level, NCCL too.
    metal.nodes["h100-02"].faulty.lock().expect("faulty").clear();
    let health =
        platform.change_node_state(&admin, "h100-02", "repair_done", "GPUs reset by hand").await.expect("done");
    assert_eq!(health.status.state, NodeState::Testing, "acceptance runs in the background");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let health = loop {
        let health = platform.node_health(&admin, "h100-02").await.expect("health");
        if health.status.state != NodeState::Testing {
            break health;
        }
        assert!(tokio::time::Instant::now() < deadline, "acceptance never ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(health.status.state, NodeState::Available, "{:?}", health.changes.first());
    let ran: Vec<(CheckKind, CheckLevel)> =
        metal.nodes["h100-02"].checks_run.lock().expect("checks")[before..].to_vec();
    assert_eq!(
        ran,
        [
            (CheckKind::GpuDiagnostics, CheckLevel::Medium),
            (CheckKind::MemoryErrors, CheckLevel::Medium),
            (CheckKind::XidEvents, CheckLevel::Medium),
            (CheckKind::NcclBandwidth, CheckLevel::Medium)
        ]
    );
}

/// A GPU whose MIG mode waits for a reset is degraded; a platform admin resets it from
/// the portal, the node's agent runs `nvidia-smi -i <gpu> -r` (an order, as a check is),
/// and its next report brings the GPU back. A reset the tool refuses is refused with its
/// words, and every reset is audited.
#[tokio::test]
async fn a_gpu_waiting_for_a_reset_is_reset_by_its_nodes_agent_and_takes_bookings_again() {
    let metal = Metal::start().await;
    let platform = metal.berth.platform.clone().with_backend(metal.backend.clone());
    let admin = metal.admin.caller(meta());
    let node = &metal.nodes["h100-03"];
    node.mig_pending.lock().expect("pending").push(1);
    let agent = Agent::new(&metal.url, &metal.tokens["h100-03"], Duration::from_secs(3600), node.clone())
        .expect("agent")
        .with_host(node.clone(), Duration::from_millis(20));
    agent.report_once().await.expect("report");
    let gpu = |health: &berth_platform::provisioning::node_health::NodeHealth| health.gpu_states[1].clone();
    let before = gpu(&platform.node_health(&admin, "h100-03").await.expect("health"));
    assert_eq!((before.health.as_str(), before.mig_mode), ("degraded", Some(false)));
    assert!(before.note.as_deref().is_some_and(|n| n.contains("nvidia-smi -i 1 -r")), "{before:?}");

    let printed = platform.reset_gpu(&admin, "h100-03", 1).await.expect("reset");
    assert!(printed.contains("was successfully reset"), "{printed}");
    assert_eq!(*node.resets.lock().expect("resets"), [1], "the node's agent ran the reset of GPU 1");
    assert!(metal.nodes["h100-01"].resets.lock().expect("resets").is_empty());
    agent.report_once().await.expect("report");
    let after = gpu(&platform.node_health(&admin, "h100-03").await.expect("health"));
    assert_eq!((after.health.as_str(), after.mig_mode, after.note), ("healthy", Some(true), None));

    // A GPU a process holds is not reset: nvidia-smi says why, and so does Berth.
    node.busy_gpus.lock().expect("busy").push(2);
    let refused = platform.reset_gpu(&admin, "h100-03", 2).await.expect_err("busy");
    let berth_platform::Error::Refused(refusal) = refused else { panic!("{refused:?}") };
    assert!(
        refusal.to_string().starts_with(
            "GPU 2 of h100-03 was not reset: The following GPUs could not be reset: GPU 00000000:1A:00.0: In use by \
             another client"
        ),
        "{refusal}"
    );
    let audited: Vec<(String, String)> = sqlx::query_as(
        "SELECT outcome, detail FROM audit_events WHERE action = 'node.gpu_reset' AND target = 'node:h100-03' ORDER BY id",
    )
    .fetch_all(platform.db())
    .await
    .expect("audit");
    assert_eq!(audited[0], ("success".to_owned(), "GPU 1 reset".to_owned()));
    assert_eq!(audited[1].0, "failure");
    assert!(audited[1].1.starts_with("GPU 2 not reset: The following GPUs could not be reset"), "{:?}", audited[1]);
}

/// A running dedicated cluster whose node is retired moves to a healthy node: the new node
/// gets the cluster's SSH account and its tenant's network, the failed node keeps nothing
/// of it, its reservations there are released, and the page's SSH line names the new node.
#[tokio::test]
async fn a_cluster_losing_a_node_is_moved_with_its_account_and_network() {
    let metal = Metal::start().await;
    let p = &metal.berth.platform;
    p.add_ssh_key(&metal.acme.caller(meta()), "", ADA_KEY).await.expect("key");
    let (stop, reconciler) = metal.run_reconciler();
    let cluster = metal.launch(&metal.acme, "cluster", "h100-node-1", "solo", "", "").await;
    metal.wait_for(&metal.acme, &cluster, EnvState::Ready).await;
    metal.settled().await;
    let account = berth_domain::node_access::account_name(&cluster);
    let holding = || -> Vec<&'static str> {
        metal
            .nodes
            .iter()
            .filter(|(_, node)| node.holds().accounts.iter().any(|a| a.name == account))
            .map(|(n, _)| *n)
            .collect()
    };
    let failed = holding()[0];
    assert!(!metal.nodes[failed].holds().networks.is_empty(), "a hard tenant's cluster has its network");

    p.change_node_state(&metal.admin.caller(meta()), failed, "retire", "fan failure").await.expect("retired");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let moved: Option<(Option<i64>, Option<String>)> =
            sqlx::query_as("SELECT moved_at, problem FROM cluster_node_replacements WHERE environment_id = ?")
                .bind(&cluster)
                .fetch_optional(p.db())
                .await
                .expect("replacement");
        if moved.as_ref().is_some_and(|(at, _)| at.is_some()) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never moved: {moved:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    metal.settled().await;
    let now = holding();
    assert_eq!(now.len(), 1, "{now:?}");
    let replacement = now[0];
    assert_ne!(replacement, failed);
    assert!(!metal.nodes[replacement].holds().networks.is_empty(), "the tenant's network is on the new node");
    let left = metal.nodes[failed].holds();
    assert!(left.accounts.is_empty() && left.networks.is_empty(), "{failed} keeps {left:?}");
    let on_failed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM reservations r JOIN gpus g ON g.id = r.gpu_id JOIN nodes n ON n.id = g.node_id
         WHERE r.environment_id = ? AND n.name = ? AND r.released_at IS NULL",
    )
    .bind(&cluster)
    .bind(failed)
    .fetch_one(p.db())
    .await
    .expect("reservations");
    assert_eq!(on_failed, 0, "the failed node's GPUs are released");
    let env = metal.environment(&metal.acme, &cluster).await;
    assert_eq!(env.state, EnvState::Ready);
    assert_eq!(env.connection.expect("connection").example, format!("ssh {account}@{replacement}"));
    let _ = stop.send(true);
    reconciler.await.expect("reconciler");
}
