//! Command line and configuration: every flag can also be set as a `BERTH_...` variable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use berth_domain::booking::{BookingPolicy, DAY_MS, HOUR_MS, MINUTE_MS};
use berth_domain::fabric::{FabricConfig, GIB, IdentifierKind, NetworkSegment, Pool};
use berth_domain::fleet::FleetSpec;
use berth_domain::outbound::Reach;
use berth_platform::notifications::Delivery;
use berth_platform::notifications::email::Mailer;
use berth_platform::notifications::outbox::{Notifier, NotifierConfig};
use berth_platform::origins::EnvironmentOrigins;
use berth_platform::provisioning::backend::Backend;
use berth_platform::provisioning::backend::baremetal::{BareMetal, BareMetalConfig};
use berth_platform::provisioning::backend::kubernetes::manifests::{CheckImages, ClusterSettings};
use berth_platform::provisioning::backend::kubernetes::{Kubernetes, KubernetesConfig};
use berth_platform::provisioning::backend::simulated::{FaultRule, Simulated, SimulatedConfig};
use berth_platform::provisioning::reconciler::{Reconciler, ReconcilerConfig};
use berth_platform::provisioning::telemetry::{TelemetryConfig, TelemetryWorker};
use berth_platform::{Platform, store};
use clap::{Parser, Subcommand, ValueEnum};

use crate::client_address::TrustedProxies;
use crate::rate_limit::{RateLimit, RateLimits};

#[derive(Debug, Parser)]
#[command(name = "berth", version, about = "Berth: a self-service GPU cloud portal")]
pub struct Cli {
    /// Log filter, e.g. `info` or `berth=debug,tower_http=info`.
    #[arg(long, env = "BERTH_LOG", default_value = "info", global = true)]
    pub log_level: String,
    /// Log format: human-readable text or one JSON object per line.
    #[arg(long, env = "BERTH_LOG_FORMAT", value_enum, default_value = "text", global = true)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// An in-process fleet with realistic delays (and faults on request).
    Simulated,
    /// A Kubernetes cluster with the NVIDIA GPU Operator (and Kueue), reached through the
    /// kubeconfig or, inside a pod, its service account.
    Kubernetes,
    /// Bare-metal GPU nodes running `berth agent`, which fetch and apply their node's plan.
    Baremetal,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the portal, the JSON endpoints and the reconciler.
    /// (Boxed: it holds every serving flag, the other commands a few.)
    Serve(Box<ServeArgs>),
    /// Apply database migrations and exit.
    Migrate(DatabaseArgs),
    /// Run on a bare-metal GPU node: report its GPUs (NVML) to the portal, every interval.
    Agent(AgentArgs),
}

#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// The portal's URL, e.g. `https://berth.example.com`.
    #[arg(long, env = "BERTH_PORTAL")]
    pub portal: String,
    /// The node token a platform admin made for this node on the fleet page
    /// (`berth_node_…`). Prefer the variable: arguments show in `ps`.
    #[arg(long, env = "BERTH_NODE_TOKEN", hide_env_values = true)]
    pub token: String,
    /// How often to report: `30s`, `2m`, `1h`.
    #[arg(long, env = "BERTH_AGENT_INTERVAL", default_value = "30s", value_parser = parse_interval)]
    pub interval: Duration,
    /// How often to fetch and apply the node's plan (`--backend baremetal` portals).
    #[arg(long, env = "BERTH_AGENT_PLAN_INTERVAL", default_value = "5s", value_parser = parse_interval)]
    pub plan_interval: Duration,
    /// The interface hard and hybrid tenants' networks run over (VXLAN leaves through it,
    /// VLANs sit on it), e.g. `bond0`. Without it the node takes no tenant networks.
    #[arg(long, env = "BERTH_UNDERLAY_INTERFACE")]
    pub underlay_interface: Option<String>,
    /// The node's address on the underlay; defaults to the interface's first IPv4 address.
    #[arg(long, env = "BERTH_UNDERLAY_ADDRESS")]
    pub underlay_address: Option<std::net::Ipv4Addr>,
    /// More of the node's addresses tenants must not reach (the underlay address is
    /// always protected), e.g. a BMC or management VLAN address.
    #[arg(long, env = "BERTH_MANAGEMENT_ADDRESSES", value_delimiter = ',')]
    pub management_address: Vec<std::net::IpAddr>,
    /// Where workloads run: `auto` (podman when installed, else docker), `podman`, `docker`.
    #[arg(long, env = "BERTH_CONTAINER_RUNTIME", default_value = "auto")]
    pub container_runtime: String,
    /// The groups a dedicated cluster's SSH account joins, so it may open the GPUs' device
    /// files where they are not open to everyone (those the node lacks are skipped).
    #[arg(long, env = "BERTH_GPU_GROUPS", value_delimiter = ',', default_value = "video,render")]
    pub gpu_groups: Vec<String>,
    /// The node's own NVIDIA DCGM exporter, read for the use of MIG instances (NVML gives
    /// none per instance): its metrics URL, or `off`. A node in MIG mode without one
    /// reports no instance readings, and says so in the agent's log.
    #[arg(long, env = "BERTH_AGENT_DCGM_EXPORTER", default_value = "http://127.0.0.1:9400/metrics")]
    pub dcgm_exporter: String,
}

#[derive(Debug, clap::Args)]
pub struct DatabaseArgs {
    /// SQLite database URL; the file and its folder are created when missing.
    #[arg(long, env = "BERTH_DATABASE", default_value = "sqlite://data/berth.db")]
    pub database: String,
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    /// Address to listen on.
    #[arg(long, env = "BERTH_LISTEN", default_value = "127.0.0.1:3000")]
    pub listen: SocketAddr,
    /// The URL users reach Berth at (behind a TLS proxy: `https://berth.example.com`).
    /// Defaults to `http://<listen>`, which is allowed only on loopback. Sign-in callbacks
    /// and secure cookies follow from it.
    #[arg(long, env = "BERTH_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// The domain each notebook and inference endpoint is served under, on an origin of its
    /// own: `https://env.berth.example` serves environment <id> at
    /// `https://<id>.env.berth.example` (a wildcard DNS record and certificate for
    /// `*.env.berth.example`, pointing at Berth). Needed with an https public URL; on
    /// loopback it defaults to `http://localhost:<port>` (`http://<id>.localhost:<port>`).
    #[arg(long, env = "BERTH_ENVIRONMENTS_URL")]
    pub environments_url: Option<String>,
    /// Where GPUs come from.
    #[arg(long, env = "BERTH_BACKEND", value_enum, default_value = "simulated")]
    pub backend: BackendKind,
    /// The fleet description (sites, nodes, GPUs).
    #[arg(long, env = "BERTH_FLEET", default_value = "config/fleet.toml")]
    pub fleet: PathBuf,
    /// Folder with the built browser assets (`pkg/berth.js`, `pkg/berth.css`, ...).
    #[arg(long, env = "BERTH_SITE_ROOT", default_value = "target/site")]
    pub site_root: String,
    /// Seed demo environments at first start.
    #[arg(long, env = "BERTH_DEMO", default_value_t = false)]
    pub demo: bool,
    /// Simulated backend: multiplies its step delays (1 realistic, 0 instant).
    #[arg(long, env = "BERTH_SIM_SPEED", default_value_t = 1.0)]
    pub sim_speed: f64,
    /// Simulated backend: injected faults, e.g. `start_workload=fail@0.2,pull_image=hang,expose_endpoint=late@0.1`.
    #[arg(long, env = "BERTH_SIM_FAULTS", value_delimiter = ',')]
    pub sim_faults: Vec<FaultRule>,
    /// Simulated backend: where volumes are kept, a directory each. Defaults to `volumes/`
    /// beside the database file.
    #[arg(long, env = "BERTH_SIM_VOLUMES_DIR")]
    pub sim_volumes_dir: Option<PathBuf>,
    /// Kubernetes backend: the GPU Operator's namespace, where the mig-parted ConfigMap lives.
    #[arg(long, env = "BERTH_KUBE_GPU_OPERATOR_NAMESPACE", default_value = "gpu-operator")]
    pub kube_gpu_operator_namespace: String,
    /// Kubernetes backend: the mig-parted ConfigMap Berth writes (point the ClusterPolicy's
    /// `migManager.config.name` at it).
    #[arg(long, env = "BERTH_KUBE_MIG_CONFIG_MAP", default_value = "berth-mig-parted-config")]
    pub kube_mig_config_map: String,
    /// Kubernetes backend: the Kueue ResourceFlavor of Berth's ClusterQueues (the cluster must have it).
    #[arg(long, env = "BERTH_KUBE_QUEUE_FLAVOR", default_value = "default-flavor")]
    pub kube_queue_flavor: String,
    /// Kubernetes backend: the Kueue cohort of Berth's ClusterQueues (each tenant's and
    /// each staff environment's), in which they lend each other unused quota.
    #[arg(long, env = "BERTH_KUBE_COHORT", default_value = "berth")]
    pub kube_cohort: String,
    /// Kubernetes backend: prefix of member user names (the API server's OIDC username prefix).
    #[arg(long, env = "BERTH_KUBE_USER_PREFIX", default_value = "")]
    pub kube_user_prefix: String,
    /// Kubernetes backend: the namespace Berth runs in. Berth's proxy reaches notebooks and
    /// endpoints at their Services' cluster DNS names, so Berth runs inside the cluster; each
    /// environment's network policy lets this namespace in to the workload's port.
    #[arg(long, env = "BERTH_KUBE_BERTH_NAMESPACE", default_value = "berth")]
    pub kube_berth_namespace: String,
    /// Kubernetes backend: the cluster's DNS domain (`<service>.<namespace>.svc.<domain>`).
    #[arg(long, env = "BERTH_KUBE_CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub kube_cluster_domain: String,
    /// Kubernetes backend: the API server address for dedicated clusters' kubeconfigs
    /// (defaults to the address Berth uses).
    #[arg(long, env = "BERTH_KUBE_API_URL")]
    pub kube_api_url: Option<String>,
    /// Kubernetes backend: the StorageClass of volumes' claims (ReadWriteMany); the cluster's
    /// default when not given. Claims of volumes are never owned by an environment's objects.
    #[arg(long, env = "BERTH_KUBE_STORAGE_CLASS")]
    pub kube_storage_class: Option<String>,
    /// Kubernetes backend: where node health checks run as Jobs pinned to their node (Berth
    /// applies it, allowing privileged pods: the kernel log and InfiniBand ports need the host).
    #[arg(long, env = "BERTH_KUBE_CHECK_NAMESPACE", default_value = "berth-node-checks")]
    pub kube_check_namespace: String,
    /// Kubernetes backend: the images node health checks run in, as TOOL=IMAGE pairs
    /// separated by commas (`dcgm` has dcgmi and nv-hostengine, `cuda` nvidia-smi and dmesg,
    /// `nccl` all_reduce_perf, `infiniband` ibstat); tools not named keep their defaults.
    #[arg(long, env = "BERTH_KUBE_CHECK_IMAGES", default_value = "")]
    pub kube_check_images: String,
    /// Kubernetes backend: the Service of the NVIDIA DCGM exporter whose pods give GPU
    /// readings, as NAMESPACE/SERVICE[:PORT], or `off`. Each ready pod behind it is scraped
    /// directly (Berth runs in the cluster), with a 5-second timeout.
    #[arg(long, env = "BERTH_KUBE_DCGM_EXPORTER", default_value = "gpu-operator/nvidia-dcgm-exporter:9400")]
    pub kube_dcgm_exporter: String,
    /// Bare-metal backend: where the shared filesystem that keeps volumes (NFS, Lustre,
    /// CephFS) is mounted, the same path on every node and on Berth's host. Without it,
    /// volumes are recorded but nothing is mounted on bare metal.
    #[arg(long, env = "BERTH_BAREMETAL_VOLUMES_PATH")]
    pub baremetal_volumes_path: Option<PathBuf>,
    /// A provisioning step that runs longer than this many seconds has failed.
    #[arg(long, env = "BERTH_STEP_TIMEOUT", default_value_t = 120)]
    pub step_timeout: u64,
    /// How often to look for objects Berth owns on the backend that no live environment
    /// explains (orphans) and remove them, each written to the audit log: `5m`, `30s`, `1h`.
    #[arg(long, env = "BERTH_SWEEP_INTERVAL", default_value = "5m", value_parser = parse_interval)]
    pub sweep_interval: Duration,
    /// How often Berth reads the backend's GPU telemetry (the simulated fleet's, the DCGM
    /// exporter's on Kubernetes) and judges idle environments: `30s`, `1m`. Bare-metal
    /// nodes' agents send theirs with each report instead.
    #[arg(long, env = "BERTH_TELEMETRY_INTERVAL", default_value = "30s", value_parser = parse_interval)]
    pub telemetry_interval: Duration,
    /// Minutes a GPU stays free between two bookings, for scrubbing and health checks.
    #[arg(long, env = "BERTH_CLEANING_GAP", default_value_t = 15)]
    pub cleaning_gap: u32,
    /// Let tenants' identity providers (set on their Team page) be on loopback, link-local
    /// or private addresses. Off by default: otherwise a tenant admin could make Berth fetch
    /// from its own network. The operator's own provider (`--oidc-issuer`) may always be.
    #[arg(long, env = "BERTH_ALLOW_PRIVATE_ISSUERS", default_value_t = false)]
    pub allow_private_issuers: bool,
    /// The SMTP relay notification mail goes through: `smtp://host:25` (plain),
    /// `smtp://user:password@host:587?tls=required` (STARTTLS) or `smtps://user:password@host:465`.
    /// Without it, notifications are in-app and webhooks only, and the account page says so.
    #[arg(long, env = "BERTH_SMTP_URL", hide_env_values = true, requires = "smtp_from")]
    pub smtp_url: Option<String>,
    /// The sender of notification mail, e.g. `Berth <berth@example.com>`.
    #[arg(long, env = "BERTH_SMTP_FROM")]
    pub smtp_from: Option<String>,
    /// Let tenants' webhooks be on loopback, link-local or private addresses (and plain
    /// http on loopback). Off by default: otherwise a tenant admin could make Berth call
    /// into its own network.
    #[arg(long, env = "BERTH_WEBHOOK_ALLOW_PRIVATE", default_value_t = false)]
    pub webhook_allow_private: bool,
    /// Serve `/metrics` on this address only (e.g. `127.0.0.1:9464` or an internal
    /// interface), not on the main listener.
    #[arg(long, env = "BERTH_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Serve `/metrics` on the main listener to requests with `Authorization: Bearer <this>`.
    /// Without this or `--metrics-listen`, metrics are not served.
    #[arg(long, env = "BERTH_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,
    /// A platform-wide OpenID provider (besides the tenants' own): its issuer URL.
    #[arg(long, env = "BERTH_OIDC_ISSUER", requires = "oidc_client_id")]
    pub oidc_issuer: Option<String>,
    #[arg(long, env = "BERTH_OIDC_CLIENT_ID")]
    pub oidc_client_id: Option<String>,
    #[arg(long, env = "BERTH_OIDC_CLIENT_SECRET", hide_env_values = true)]
    pub oidc_client_secret: Option<String>,
    /// The sign-in button's label: "Sign in with <name>".
    #[arg(long, env = "BERTH_OIDC_NAME", default_value = "SSO")]
    pub oidc_name: String,
    /// Group mappings of the platform-wide provider, e.g.
    /// `berth-admins=platform_admin,auditors=platform_auditor,acme-ml=acme:member`.
    #[arg(long, env = "BERTH_OIDC_GROUPS", value_delimiter = ',')]
    pub oidc_groups: Vec<String>,
    /// What a booking is charged for: `use` (from provisioning until its GPUs are released,
    /// within its window; stopping early stops the charge) or `window` (its whole reserved
    /// window once it has begun, used or not). A booking cancelled before it began costs
    /// nothing either way.
    #[arg(long, env = "BERTH_CHARGE_FOR", default_value = "use", value_parser = ["use", "window"])]
    pub charge_for: String,
    /// How many days ahead a booking may end.
    #[arg(long, env = "BERTH_HORIZON_DAYS", default_value_t = 90, value_parser = clap::value_parser!(u32).range(1..=3650))]
    pub horizon_days: u32,
    /// Hard and hybrid tenants' network segment: a VLAN id or a VXLAN VNI each.
    #[arg(long, env = "BERTH_FABRIC_SEGMENT", default_value = "vlan", value_parser = ["vlan", "vxlan"])]
    pub fabric_segment: String,
    /// VLAN ids Berth may hand to tenants, `first-last` within 2-4094.
    #[arg(long, env = "BERTH_FABRIC_VLANS", default_value = "2-4094")]
    pub fabric_vlans: String,
    /// VXLAN VNIs Berth may hand to tenants, `first-last` within 1-16777215.
    #[arg(long, env = "BERTH_FABRIC_VNIS", default_value = "1-16777215")]
    pub fabric_vnis: String,
    /// InfiniBand P_Key bases Berth may hand to tenants, within 0x0001-0x7ffe (0x7fff is
    /// the default partition).
    #[arg(long, env = "BERTH_FABRIC_PKEYS", default_value = "0x0001-0x7ffe")]
    pub fabric_pkeys: String,
    /// NVLink partition ids Berth may hand to tenants: those your Fabric Manager or NMX
    /// defines, within 1-65535.
    #[arg(long, env = "BERTH_FABRIC_NVLINK_PARTITIONS", default_value = "1-65535")]
    pub fabric_nvlink_partitions: String,
    /// Hours a released fabric identifier waits before another tenant may get it, so
    /// switches, subnet managers and hosts have let go of it.
    #[arg(long, env = "BERTH_FABRIC_QUARANTINE_HOURS", default_value_t = 24, value_parser = clap::value_parser!(u32).range(0..=8760))]
    pub fabric_quarantine_hours: u32,
    /// Quota of a hard tenant's storage volume, in GiB.
    #[arg(long, env = "BERTH_FABRIC_VOLUME_GIB", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub fabric_volume_gib: u32,
    /// Requests to `/api/v1` per API token: `N/s`, `N/min` or `N/h` (a burst of N,
    /// refilled evenly over the period), or `off`. Over it: 429 with `Retry-After`.
    #[arg(long, env = "BERTH_API_RATE_LIMIT", default_value = "3000/min", value_parser = RateLimit::parse)]
    pub api_rate_limit: RateLimit,
    /// Requests to `/api/v1` per source address, whatever the token (behind a reverse
    /// proxy, see `--trusted-proxies`).
    #[arg(long, env = "BERTH_API_RATE_LIMIT_PER_ADDRESS", default_value = "12000/min", value_parser = RateLimit::parse)]
    pub api_rate_limit_per_address: RateLimit,
    /// Requests of node agents (`/api/v1/agent/*`) per node token.
    #[arg(long, env = "BERTH_AGENT_RATE_LIMIT", default_value = "3000/min", value_parser = RateLimit::parse)]
    pub agent_rate_limit: RateLimit,
    /// Requests of node agents per source address.
    #[arg(long, env = "BERTH_AGENT_RATE_LIMIT_PER_ADDRESS", default_value = "12000/min", value_parser = RateLimit::parse)]
    pub agent_rate_limit_per_address: RateLimit,
    /// Sign-in requests (password, one-time code, single sign-on find, start and callback)
    /// per source address. Failed passwords also lock out (see the README).
    #[arg(long, env = "BERTH_SIGN_IN_RATE_LIMIT", default_value = "120/min", value_parser = RateLimit::parse)]
    pub sign_in_rate_limit: RateLimit,
    /// Notebook and endpoint sign-ins on environments' origins (`/_berth/auth`) per source
    /// address.
    #[arg(long, env = "BERTH_ENVIRONMENT_SIGN_IN_RATE_LIMIT", default_value = "120/min", value_parser = RateLimit::parse)]
    pub environment_sign_in_rate_limit: RateLimit,
    /// Reverse proxies in front of Berth (addresses or networks, `10.0.0.0/8,192.0.2.10`):
    /// a request from one of them comes from the address its `X-Forwarded-For` names (the
    /// right-most that is not itself a trusted proxy), for the per-address limits, sign-in
    /// throttles and the audit log. Empty (the default): the header is ignored.
    #[arg(long, env = "BERTH_TRUSTED_PROXIES", default_value = "", value_parser = TrustedProxies::parse)]
    pub trusted_proxies: TrustedProxies,
}

/// `--interval`, `--plan-interval`, `--sweep-interval`: `30s`, `2m`, `1h` or plain seconds;
/// at least one second.
pub fn parse_interval(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let n: u64 = number.parse().map_err(|_| format!("\"{text}\" is not a duration like 30s, 2m or 1h"))?;
    let seconds = match unit {
        "" | "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        _ => return Err(format!("\"{text}\" is not a duration like 30s, 2m or 1h")),
    };
    if seconds == 0 {
        return Err("the interval must be at least 1s".to_owned());
    }
    Ok(Duration::from_secs(seconds))
}

pub fn init_logging(cli: &Cli) {
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(false).with_ansi(ansi);
    match cli.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

pub async fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Migrate(args) => {
            open_database(&args.database).await?;
            tracing::info!(database = %args.database, "migrations applied");
            Ok(())
        }
        Command::Serve(args) => serve(*args).await,
        Command::Agent(args) => agent(args).await,
    }
}

async fn agent(args: AgentArgs) -> Result<(), String> {
    let (probe, no_nvml) = berth_agent::open_probe();
    if let Some(message) = no_nvml {
        tracing::warn!("{message}");
    }
    let mut agent = berth_agent::Agent::new(&args.portal, &args.token, args.interval, probe)
        .map_err(|e| e.to_string())?
        .with_host(machine(&args).map_err(|e| e.to_string())?, args.plan_interval);
    if args.dcgm_exporter != "off" {
        let url = &args.dcgm_exporter;
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!("--dcgm-exporter: \"{url}\" is not an http(s) URL (or `off`)"));
        }
        let runner = Arc::new(berth_agent::node::commands::SystemRunner::new());
        agent = agent.with_mig_source(berth_agent::MigSource { exporter_url: url.clone(), runner });
    }
    tracing::info!(portal = %args.portal, interval = ?args.interval, "berth agent is reporting");
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(shutdown_signal(stop_tx));
    agent
        .run(async move {
            let _ = stop_rx.wait_for(|stop| *stop).await;
        })
        .await;
    Ok(())
}

/// This node as the agent applies plans to it, from the agent's flags.
fn machine(args: &AgentArgs) -> Result<Arc<dyn berth_agent::node::NodeHost>, berth_agent::NodeError> {
    use berth_agent::node::commands::{CommandRunner, SystemRunner};
    let runner: Arc<dyn CommandRunner> = Arc::new(SystemRunner::new());
    let network = match &args.underlay_interface {
        Some(interface) => {
            let address = match args.underlay_address {
                Some(address) => address,
                None => berth_agent::node::interface_address(runner.as_ref(), interface)?,
            };
            let underlay = berth_domain::host_network::Underlay { interface: interface.clone(), address };
            tracing::info!(%interface, %address, "tenant networks run over the underlay");
            Some(berth_agent::node::network::NodeNetwork { underlay, management: args.management_address.clone() })
        }
        None => None,
    };
    let runtime = berth_agent::node::workloads::Runtime::choose(&args.container_runtime, runner.as_ref())?;
    if runtime.is_none() {
        tracing::warn!("neither podman nor docker is installed: this node can take no workloads");
    }
    Ok(Arc::new(berth_agent::node::Machine::new(runner, network, runtime).with_gpu_groups(args.gpu_groups.clone())))
}

/// `volumes/` in the database file's folder (`None` for an in-memory database).
fn volumes_beside(database_url: &str) -> Option<PathBuf> {
    let options = <sqlx::sqlite::SqliteConnectOptions as std::str::FromStr>::from_str(database_url).ok()?;
    let file = options.get_filename();
    if file.as_os_str().is_empty() || file.as_os_str() == ":memory:" {
        return None;
    }
    Some(file.parent().map_or_else(|| PathBuf::from("volumes"), |dir| dir.join("volumes")))
}

/// Bare-metal volumes get a quota of their size where `path` is on XFS with project quotas
/// enforced or on CephFS; otherwise their size is measured, and the log says why.
async fn with_volume_quotas(metal: BareMetal, path: &std::path::Path) -> BareMetal {
    use berth_platform::provisioning::backend::volume_quotas::{SystemRunner, VolumeQuotas};
    match VolumeQuotas::detect(path, Arc::new(SystemRunner)).await {
        Ok(quotas) => {
            tracing::info!(path = %path.display(), mount = %quotas.mount().display(), kind = ?quotas.kind(), "bare-metal volumes get filesystem quotas of their size");
            metal.with_volume_quotas(quotas)
        }
        Err(why) => {
            tracing::info!(path = %path.display(), reason = %why, "bare-metal volumes have no filesystem quota: their size is measured");
            metal
        }
    }
}

async fn open_database(url: &str) -> Result<sqlx::SqlitePool, String> {
    let pool = store::connect(url).await.map_err(|e| format!("cannot open database {url}: {e}"))?;
    store::migrate(&pool).await.map_err(|e| format!("cannot migrate database {url}: {e}"))?;
    Ok(pool)
}

async fn serve(args: ServeArgs) -> Result<(), String> {
    let public = args.public()?;
    let origins = args.environment_origins(&public)?;
    let fleet_text = std::fs::read_to_string(&args.fleet)
        .map_err(|e| format!("cannot read the fleet description {}: {e}", args.fleet.display()))?;
    let fleet = FleetSpec::parse(&fleet_text).map_err(|e| format!("{}: {e}", args.fleet.display()))?;
    // The cluster first: an unreachable one should stop Berth before it touches anything.
    let kubernetes = match args.backend {
        BackendKind::Kubernetes => Some(Arc::new(
            Kubernetes::connect(KubernetesConfig {
                cluster: ClusterSettings {
                    gpu_operator_namespace: args.kube_gpu_operator_namespace.clone(),
                    mig_config_map: args.kube_mig_config_map.clone(),
                    queue_flavor: args.kube_queue_flavor.clone(),
                    cohort: args.kube_cohort.clone(),
                    user_prefix: args.kube_user_prefix.clone(),
                    berth_namespace: args.kube_berth_namespace.clone(),
                    cluster_domain: args.kube_cluster_domain.clone(),
                    storage_class: args.kube_storage_class.clone(),
                    check_namespace: args.kube_check_namespace.clone(),
                    check_images: CheckImages::default()
                        .with_overrides(&args.kube_check_images)
                        .map_err(|e| format!("--kube-check-images: {e}"))?,
                    ..ClusterSettings::default()
                },
                api_server_url: args.kube_api_url.clone(),
                dcgm_exporter: match args.kube_dcgm_exporter.as_str() {
                    "off" => None,
                    exporter => Some(exporter.parse().map_err(|e| format!("--kube-dcgm-exporter: {e}"))?),
                },
                ..KubernetesConfig::default()
            })
            .await
            .map_err(|e| format!("--backend kubernetes: {e}"))?,
        )),
        BackendKind::Simulated | BackendKind::Baremetal => None,
    };
    let pool = open_database(&args.db.database).await?;
    let policy = BookingPolicy {
        cleaning_gap_ms: i64::from(args.cleaning_gap) * MINUTE_MS,
        horizon_ms: i64::from(args.horizon_days) * DAY_MS,
        ..BookingPolicy::default()
    };
    let platform = Platform::new(pool.clone())
        .with_policy(policy)
        .with_charging(berth_domain::metering::ChargeBasis::parse(&args.charge_for).unwrap_or_default())
        .with_public_url(&public.url)
        .with_environment_origins(origins)
        .with_fabric(args.fabric()?)
        .with_private_issuers(args.allow_private_issuers)
        .with_repair_tiers(fleet.repair_tiers.clone())
        .with_expected_bandwidth(fleet.bandwidth_table())
        .with_notifications(args.delivery(&public)?);
    platform.sync_fleet(&fleet).await.map_err(|e| format!("cannot load the fleet: {e}"))?;
    let backend: Arc<dyn Backend> = match (args.backend, kubernetes) {
        (BackendKind::Kubernetes, Some(kubernetes)) => kubernetes,
        (BackendKind::Baremetal, _) => {
            let volumes_path = args.baremetal_volumes_path.clone();
            let metal = BareMetal::new(
                platform.clone(),
                BareMetalConfig { volumes_path: volumes_path.clone(), ..BareMetalConfig::default() },
            );
            Arc::new(match volumes_path {
                Some(path) => with_volume_quotas(metal, &path).await,
                None => metal,
            })
        }
        _ => Arc::new(Simulated::new(SimulatedConfig {
            speed: args.sim_speed.max(0.0),
            faults: args.sim_faults.clone(),
            volumes_dir: args.sim_volumes_dir.clone().or_else(|| volumes_beside(&args.db.database)),
        })),
    };
    // The proxy, logs and replicas ask the same backend the reconciler drives.
    let platform = platform.with_backend(backend.clone());
    let admin = platform.bootstrap_admin().await.map_err(|e| format!("cannot create the administrator: {e}"))?;
    if args.demo {
        platform.seed_demo().await.map_err(|e| format!("cannot seed demo data: {e}"))?;
    }
    if let (Some(issuer), Some(client_id)) = (&args.oidc_issuer, &args.oidc_client_id) {
        let groups = args
            .oidc_groups
            .iter()
            .map(|g| g.split_once('=').map(|(g, r)| (g.trim().to_owned(), r.trim().to_owned())))
            .collect::<Option<Vec<_>>>()
            .ok_or("--oidc-groups takes group=role or group=tenant:role, separated by commas")?;
        platform
            .configure_platform_sso(&args.oidc_name, issuer, client_id, args.oidc_client_secret.as_deref(), &groups)
            .await
            .map_err(|e| format!("cannot configure the platform's OpenID provider: {e}"))?;
    }

    // Checks cut short by the last stop left their nodes testing: they fail acceptance.
    platform.end_interrupted_checks().await.map_err(|e| format!("cannot end interrupted node checks: {e}"))?;
    let telemetry = TelemetryWorker::new(
        platform.clone(),
        backend.clone(),
        TelemetryConfig { interval: args.telemetry_interval, ..TelemetryConfig::default() },
    );
    let reconciler = Reconciler::new(
        platform.clone(),
        backend,
        ReconcilerConfig {
            step_timeout: Duration::from_secs(args.step_timeout),
            sweep_interval: args.sweep_interval,
            ..ReconcilerConfig::default()
        },
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut reconciler_stop = stop_rx.clone();
    let reconciler_task = tokio::spawn(reconciler.run(async move {
        let _ = reconciler_stop.wait_for(|stop| *stop).await;
    }));

    // Units released before usage sums existed are counted row by row until summed; sum
    // them in the background (releases from now on sum their own).
    let summing = platform.clone();
    tokio::spawn(async move {
        match summing.sum_released_usage().await {
            Ok(0) => {}
            Ok(units) => tracing::info!(units, "released usage summed"),
            Err(e) => tracing::error!(error = %e, "cannot sum released usage; reports count it row by row"),
        }
    });

    // Ended months are closed into statements as Berth starts and every hour after (a
    // month's statement appears within the hour after it ends).
    let closing = platform.clone();
    let mut closing_stop = stop_rx.clone();
    tokio::spawn(async move {
        loop {
            match closing.close_months().await {
                Ok(0) => {}
                Ok(statements) => tracing::info!(statements, "months closed into statements"),
                Err(e) => tracing::error!(error = %e, "cannot close months into statements; trying again in an hour"),
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(3600)) => {}
                _ = closing_stop.wait_for(|stop| *stop) => break,
            }
        }
    });

    let mut telemetry_stop = stop_rx.clone();
    let telemetry_task = tokio::spawn(telemetry.run(async move {
        let _ = telemetry_stop.wait_for(|stop| *stop).await;
    }));

    let notifier = Notifier::new(platform.clone(), NotifierConfig::default())
        .map_err(|e| format!("cannot start the notification worker: {e}"))?;
    let mut notifier_stop = stop_rx.clone();
    let notifier_task = tokio::spawn(notifier.run(async move {
        let _ = notifier_stop.wait_for(|stop| *stop).await;
    }));

    let environments = platform.environment_origin("<id>");
    let routers = crate::http::router(platform, pool, &args.site(&public)).await?;
    let router = routers.portal;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    if let Some(address) = args.metrics_listen {
        let metrics = tokio::net::TcpListener::bind(address)
            .await
            .map_err(|e| format!("cannot listen for metrics on {address}: {e}"))?;
        let mut metrics_stop = stop_rx.clone();
        tokio::spawn(async move {
            let stopped = async move {
                let _ = metrics_stop.wait_for(|stop| *stop).await;
            };
            if let Err(e) = axum::serve(metrics, routers.metrics).with_graceful_shutdown(stopped).await {
                tracing::error!(error = %e, "the metrics listener stopped");
            }
        });
    }
    tracing::info!(listen = %args.listen, gpus = fleet.gpu_count(), nodes = fleet.nodes.len(), "berth is serving");
    print_welcome(&args, &public, &environments, admin.as_ref());

    tokio::spawn(shutdown_signal(stop_tx));
    let mut server_stop = stop_rx;
    axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(async move {
            let _ = server_stop.wait_for(|stop| *stop).await;
        })
        .await
        .map_err(|e| format!("server error: {e}"))?;
    let _ = reconciler_task.await;
    let _ = notifier_task.await;
    let _ = telemetry_task.await;
    Ok(())
}

/// Waits for Ctrl-C or SIGTERM, then tells every task to stop.
async fn shutdown_signal(stop: tokio::sync::watch::Sender<bool>) {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = terminate => {}
    }
    tracing::info!("shutting down");
    let _ = stop.send(true);
}

#[allow(clippy::print_stdout)]
/// `environments`: how an environment's origin looks (`<id>` in place of its id).
fn print_welcome(
    args: &ServeArgs,
    public: &PublicUrl,
    environments: &str,
    admin: Option<&berth_platform::identity::accounts::BootstrapAdmin>,
) {
    let url = &public.url;
    println!();
    println!("  Berth is running at {url}");
    println!("  Database: {}   Fleet: {}", args.db.database, args.fleet.display());
    println!("  Notebooks and endpoints: {environments}");
    if args.smtp_url.is_none() {
        println!("  Notifications: in-app and webhooks; no email (set --smtp-url and --smtp-from)");
    }
    match admin {
        Some(admin) => {
            println!("  First start: sign in at {url}/login as {}", admin.email);
            println!("  One-time password: {}", admin.password);
            println!("  (shown only now; Berth keeps only its argon2id hash)");
            println!("  After the password, set up an authenticator app with the key Berth shows (TOTP).");
        }
        None => println!(
            "  Sign in at {url}/login as {} with the password printed at first start",
            berth_platform::identity::accounts::ADMIN_EMAIL
        ),
    }
    println!();
}

/// `http://<id>.localhost:3000`: how an environment's address looks, for the welcome text.
/// Where users reach Berth, and what follows from it for cookies and headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicUrl {
    /// Without a trailing slash.
    pub url: String,
    /// Served over TLS (directly or by a proxy in front): `Secure` cookies with the
    /// `__Host-` prefix, and HSTS.
    pub tls: bool,
}

impl PublicUrl {
    /// `host[:port]` of the URL.
    fn authority(&self) -> &str {
        let rest = self.url.split_once("://").map_or(self.url.as_str(), |(_, rest)| rest);
        rest.split('/').next().unwrap_or_default()
    }

    /// The host name, without a port.
    pub fn host_name(&self) -> &str {
        let authority = self.authority();
        match authority.rsplit_once(':') {
            Some((name, port)) if !name.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => authority,
        }
    }

    /// The port the URL names, if any.
    pub fn port(&self) -> Option<u16> {
        let authority = self.authority();
        authority.rsplit_once(':').and_then(|(_, port)| port.parse().ok())
    }
}

impl ServeArgs {
    /// What the router needs of these settings, served at `public`.
    pub fn site<'a>(&'a self, public: &PublicUrl) -> crate::http::Site<'a> {
        crate::http::Site {
            root: &self.site_root,
            listen: self.listen,
            tls: public.tls,
            metrics_token: self.metrics_token.as_deref(),
            rate_limits: self.rate_limits(),
            trusted_proxies: self.trusted_proxies.clone(),
        }
    }

    /// The `--*-rate-limit` flags.
    pub fn rate_limits(&self) -> RateLimits {
        RateLimits {
            api_per_token: self.api_rate_limit,
            api_per_address: self.api_rate_limit_per_address,
            agent_per_token: self.agent_rate_limit,
            agent_per_address: self.agent_rate_limit_per_address,
            sign_in_per_address: self.sign_in_rate_limit,
            environment_sign_in_per_address: self.environment_sign_in_rate_limit,
        }
    }

    /// The fabric pools and quarantine from the `--fabric-*` flags.
    pub fn fabric(&self) -> Result<FabricConfig, String> {
        let pool = |kind, text: &str| Pool::parse(kind, text).map_err(|e| e.to_string());
        Ok(FabricConfig {
            segment: NetworkSegment::parse(&self.fabric_segment).map_err(|e| e.to_string())?,
            vlans: pool(IdentifierKind::Vlan, &self.fabric_vlans)?,
            vnis: pool(IdentifierKind::Vni, &self.fabric_vnis)?,
            pkeys: pool(IdentifierKind::PKey, &self.fabric_pkeys)?,
            nvlink_partitions: pool(IdentifierKind::NvlinkPartition, &self.fabric_nvlink_partitions)?,
            quarantine_ms: i64::from(self.fabric_quarantine_hours) * HOUR_MS,
            volume_quota_bytes: i64::from(self.fabric_volume_gib) * GIB,
            ..FabricConfig::default()
        })
    }

    /// Where environments are served: `--environments-url`, or beside a loopback Berth
    /// `http://<id>.localhost:<port>` on the same listener. Never the portal's origin, and
    /// never a domain under which the portal's own host would pass for an environment.
    pub fn environment_origins(&self, public: &PublicUrl) -> Result<EnvironmentOrigins, String> {
        let origins = match &self.environments_url {
            Some(url) => EnvironmentOrigins::parse(url).map_err(|e| format!("--environments-url: {e}"))?,
            None if public.tls => {
                return Err(format!(
                    "set --environments-url, e.g. https://env.{}: each notebook and endpoint is served on an \
                     origin of its own (<id>.env.{}), which needs a wildcard DNS record and certificate \
                     (see the README)",
                    public.host_name(),
                    public.host_name()
                ));
            }
            None => EnvironmentOrigins::loopback(public.port()),
        };
        if public.tls && !origins.secure() {
            return Err("--environments-url must be https:// when Berth is served over TLS".to_owned());
        }
        if origins.environment_in_host(public.host_name()).is_some() {
            return Err(format!(
                "--environments-url {}: Berth's own host {} would be taken for an environment; \
                 give environments a domain of their own, e.g. env.{}",
                self.environments_url.as_deref().unwrap_or_default(),
                public.host_name(),
                public.host_name()
            ));
        }
        Ok(origins)
    }

    /// How notifications leave Berth: the SMTP relay, if any, and where webhooks may point.
    pub fn delivery(&self, public: &PublicUrl) -> Result<Delivery, String> {
        let mailer = match (&self.smtp_url, &self.smtp_from) {
            (Some(url), Some(from)) => Some(Mailer::new(url, from, &public.url)?),
            (Some(_), None) => return Err("--smtp-url needs --smtp-from, the sender of notification mail".into()),
            (None, _) => None,
        };
        let webhook_reach = if self.webhook_allow_private { Reach::Private } else { Reach::Public };
        Ok(Delivery { mailer, webhook_reach, ..Delivery::default() })
    }

    /// The public URL, refusing plain http anywhere but loopback: session cookies must
    /// not cross a network in the clear.
    pub fn public(&self) -> Result<PublicUrl, String> {
        let url = self.public_url.clone().unwrap_or_else(|| format!("http://{}", self.listen));
        let url = url.trim_end_matches('/').to_owned();
        if url.starts_with("https://") {
            return Ok(PublicUrl { url, tls: true });
        }
        let host = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("--public-url must start with https:// or http://, not {url}"))?;
        let host = host.split('/').next().unwrap_or_default();
        let name = host.rsplit_once(':').map_or(host, |(name, _)| name);
        let loopback =
            matches!(name, "localhost" | "[::1]") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
        // Users reach a loopback URL only from this machine (or a container's published
        // port), so the cookie never crosses a network in the clear.
        if loopback {
            Ok(PublicUrl { url, tls: false })
        } else {
            Err(format!(
                "plain http is allowed only on loopback; serve Berth behind TLS and set --public-url https://... (got {url})"
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve_args(extra: &[&str]) -> ServeArgs {
        let argv = ["berth", "serve"].into_iter().chain(extra.iter().copied());
        match Cli::try_parse_from(argv).expect("arguments").command {
            Command::Serve(args) => *args,
            Command::Migrate(_) | Command::Agent(_) => panic!("not the serve command"),
        }
    }

    #[test]
    fn fabric_flags_default_to_every_valid_value_and_a_day_of_quarantine() {
        assert_eq!(serve_args(&[]).fabric(), Ok(FabricConfig::default()));
        let narrowed = serve_args(&[
            "--fabric-segment",
            "vxlan",
            "--fabric-vnis",
            "10000-19999",
            "--fabric-pkeys",
            "0x0100-0x01ff",
            "--fabric-quarantine-hours",
            "2",
        ])
        .fabric()
        .expect("valid flags");
        assert_eq!(narrowed.segment, NetworkSegment::Vxlan);
        assert_eq!((narrowed.vnis.first, narrowed.vnis.last), (10_000, 19_999));
        assert_eq!((narrowed.pkeys.first, narrowed.pkeys.last), (0x100, 0x1ff));
        assert_eq!(narrowed.quarantine_ms, 2 * HOUR_MS);
    }

    #[test]
    fn environments_get_origins_of_their_own() {
        let local = serve_args(&["--listen", "127.0.0.1:4000"]);
        let origins = local.environment_origins(&local.public().expect("loopback")).expect("default");
        assert_eq!(origins.origin("e1"), "http://e1.localhost:4000", "beside a loopback Berth, on its listener");

        let behind_tls = serve_args(&["--public-url", "https://berth.example"]);
        let public = behind_tls.public().expect("https");
        let error = behind_tls.environment_origins(&public).expect_err("no default over TLS");
        assert!(error.contains("set --environments-url, e.g. https://env.berth.example"), "{error}");
        let set =
            serve_args(&["--public-url", "https://berth.example", "--environments-url", "https://env.berth.example"]);
        assert_eq!(set.environment_origins(&public).expect("set").origin("e1"), "https://e1.env.berth.example");

        let plain =
            serve_args(&["--public-url", "https://berth.example", "--environments-url", "http://localhost:3000"]);
        assert!(plain.environment_origins(&public).expect_err("mixed").contains("must be https://"));
        let swallowing =
            serve_args(&["--public-url", "https://berth.example.com", "--environments-url", "https://example.com"]);
        let public = swallowing.public().expect("https");
        let error = swallowing.environment_origins(&public).expect_err("the portal would be an environment");
        assert!(error.contains("Berth's own host berth.example.com would be taken for an environment"), "{error}");
    }

    #[test]
    fn fabric_pools_outside_what_the_protocol_allows_stop_the_start() {
        let error = serve_args(&["--fabric-vlans", "1-100"]).fabric().expect_err("VLAN 1 is reserved");
        assert!(error.contains("VLAN id pool 1-100 must lie within 2-4094"), "{error}");
        assert!(serve_args(&["--fabric-pkeys", "0x7000-0x7fff"]).fabric().is_err());
        assert!(Cli::try_parse_from(["berth", "serve", "--fabric-segment", "geneve"]).is_err());
    }

    #[test]
    fn intervals_read_like_durations() {
        assert_eq!(parse_interval("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_interval("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_interval("45"), Ok(Duration::from_secs(45)));
        assert!(parse_interval("0s").is_err());
        assert!(parse_interval("soon").is_err());
        assert!(parse_interval("5d").is_err());
    }
}
