//! What pages show, as plain serialisable values. Everything time-dependent is computed
//! on the server, so the server render and the hydrated page agree.

use serde::{Deserialize, Serialize};

mod telemetry;
mod usage;
pub use telemetry::*;
pub use usage::*;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionUser {
    pub email: String,
    pub display_name: String,
    /// The role's label, e.g. "Tenant admin".
    pub role: String,
    /// `None` for platform staff.
    pub tenant_id: Option<i64>,
    pub tenant_name: Option<String>,
    /// What the navigation offers; the server checks every action again.
    pub can_manage_fleet: bool,
    pub can_read_fleet: bool,
    pub can_read_tenants: bool,
    pub can_read_audit: bool,
    pub can_set_quotas: bool,
    /// May book capacity (members, tenant admins, platform admins for themselves); viewers
    /// and auditors see no launch controls.
    pub can_launch: bool,
}

/// The environments page: a listing, and the filter's choices for those who may see more
/// than their own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvironmentListView {
    pub environments: Vec<EnvironmentSummary>,
    /// The caller sees others' environments (tenant admins, viewers, platform staff).
    pub wider: bool,
    /// Platform staff: environments of every tenant.
    pub all_tenants: bool,
    /// The filter as applied: `me`, `any` or a person's id; a project's and a tenant's id
    /// or empty; `active`, `finished` or `any`.
    pub person: String,
    pub project: String,
    pub tenant: String,
    pub state: String,
    pub people: Vec<ProjectOption>,
    pub projects: Vec<ProjectOption>,
    pub tenants: Vec<ProjectOption>,
}

/// The bell in the navigation bar: unread notifications, and the newest one's title.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BellView {
    pub unread: i64,
    pub latest: Option<String>,
}

/// One notification in `/notifications`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotificationView {
    pub id: i64,
    pub kind: String,
    pub title: String,
    pub body: String,
    /// A path on the portal.
    pub link: String,
    pub when: String,
    pub read: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotificationsView {
    pub unread: i64,
    pub items: Vec<NotificationView>,
}

/// One kind's channels on the account page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotificationChoiceView {
    pub kind: String,
    pub label: String,
    pub in_app: bool,
    pub email: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotificationSettingsView {
    /// Whether the operator set up SMTP; without it no mail is sent.
    pub email_configured: bool,
    pub choices: Vec<NotificationChoiceView>,
}

/// A tenant webhook on the Team page (never its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookView {
    pub id: i64,
    pub url: String,
    pub format: String,
    pub kinds: Vec<String>,
    pub created: String,
}

/// One try of a webhook call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookDeliveryView {
    pub webhook_id: i64,
    pub title: String,
    pub attempt: i64,
    pub when: String,
    pub status: Option<i64>,
    pub error: Option<String>,
}

/// A new webhook's signing secret, shown once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewWebhookView {
    pub id: i64,
    pub url: String,
    pub secret: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhooksView {
    pub tenant_id: i64,
    pub can_manage: bool,
    pub webhooks: Vec<WebhookView>,
    pub deliveries: Vec<WebhookDeliveryView>,
    /// Every kind a webhook may take: (name, label).
    pub kinds: Vec<(String, String)>,
    pub new_secret: Option<NewWebhookView>,
}

/// A project one may book in, for the launch form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProjectOption {
    pub id: i64,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelCapacity {
    pub model: String,
    pub gpus: i64,
    pub idle_gpus: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvironmentSummary {
    pub id: String,
    pub name: String,
    /// Whose it is, its project's and tenant's names (empty where there is none).
    pub owner: String,
    pub project: String,
    pub tenant: String,
    pub offering: String,
    pub size: String,
    /// `requested`, `provisioning`, ... (for styling and tests).
    pub state: String,
    pub state_label: String,
    pub price: String,
    pub created: String,
    /// "ends in 1 h 58 min", "ended 14:05 UTC", ...
    pub window: String,
    pub stoppable: bool,
    /// Preemptible: a guaranteed booking may reclaim it.
    pub spot: bool,
    /// Booked or running and not stopping: its end can still move.
    pub resizable: bool,
    pub finished: bool,
    /// The window's end as a time field's value, to prefill the change-end form.
    pub ends_input: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionView {
    pub url: String,
    pub secret_label: Option<String>,
    pub secret: Option<String>,
    pub example: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepView {
    pub phase: String,
    pub label: String,
    /// `pending`, `running`, `succeeded` or `failed`.
    pub status: String,
    pub attempts: i64,
    pub timing: String,
    pub detail: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitView {
    pub location: String,
    pub model: String,
    pub what: String,
    pub released: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvironmentView {
    pub summary: EnvironmentSummary,
    pub image: Option<String>,
    pub command: Option<String>,
    /// An inference endpoint's model, the arguments its server gets, and the names of its
    /// variables (their values are never sent back).
    pub model: Option<String>,
    pub args: Option<String>,
    pub env_names: Option<String>,
    pub failure_reason: Option<String>,
    pub connection: Option<ConnectionView>,
    pub steps: Vec<StepView>,
    pub units: Vec<UnitView>,
    pub timeline: Vec<(String, String)>,
    /// A ready notebook the caller may open: the portal's route that signs the browser in on
    /// the notebook's own origin (`/environments/<id>/open`).
    pub open_url: Option<String>,
    /// Where that notebook is served, e.g. `https://<id>.env.berth.example/`.
    pub notebook_url: Option<String>,
    /// An inference endpoint's URL, key and replicas.
    pub endpoint: Option<EndpointView>,
    /// A running training job's log and status.
    pub logs: Option<JobLogsView>,
    /// Its volumes, by mount path.
    pub volumes: Vec<VolumeAttachmentView>,
    /// A dedicated cluster's failed nodes and what replaced them, in words, oldest first
    /// ("big-02 failed 27 Nov 10:02 UTC: …; big-03 replaces it, moved 27 Nov 10:03 UTC").
    pub node_changes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointView {
    /// Where programs call it, on its own origin: `https://<id>.env.berth.example/v1`.
    pub url: String,
    pub example: String,
    /// Whether the caller may see and replace the key.
    pub may_connect: bool,
    /// `pending` (not made yet), `unrevealed` (waiting to be shown once) or `shown`.
    pub key_state: String,
    /// "Shown 14:05 UTC" once shown.
    pub key_note: Option<String>,
    /// The key itself, only in the render right after a plain form revealed or replaced it.
    pub shown_key: Option<String>,
    pub replicas: u32,
    pub replicas_applied: u32,
    pub max_replicas: u32,
    /// Why applying the replica count failed last time.
    pub scale_error: Option<String>,
    /// The caller may change the replica count now (ready, and allowed to).
    pub can_scale: bool,
}

/// A training job's log and how it stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobLogsView {
    /// `pending`, `running`, `succeeded`, `failed`, or `unavailable` (the backend did not say).
    pub state: String,
    /// "Running", "Succeeded (exit code 0)", "Failed (exit code 3): ...".
    pub label: String,
    pub lines: Vec<String>,
}

/// The availability calendar: a heatmap of free capacity per size over time, with the
/// caller's own bookings drawn on the same columns. Hundreds of cells are sent with the
/// page for hydration, so a cell carries only its count and tone: its link and title are
/// made from its row and column when it is drawn (`pages/calendar.rs`, `grid_html`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CalendarView {
    /// `day`, `week` or `month`.
    pub view: String,
    pub title: String,
    pub prev_href: String,
    pub next_href: String,
    pub today_href: String,
    /// Each column's label ("Thu 26 06h").
    pub columns: Vec<String>,
    /// Each column's start as the launch form's start field takes it; empty for a column
    /// that has begun (the form then starts now).
    pub starts: Vec<String>,
    pub rows: Vec<CalendarRow>,
    pub bookings: Vec<CalendarBooking>,
    /// "15 min 0 s": free time kept between bookings of a GPU.
    pub cleaning_gap: String,
    /// Hours per column.
    pub bucket_hours: u32,
}

impl CalendarView {
    /// The launch form for `row`'s size from the start of `first` for `columns` columns
    /// (at most as many hours as the offering allows).
    pub fn launch_href(&self, row: &CalendarRow, first: usize, columns: usize) -> String {
        let start = self.starts.get(first).map(String::as_str).unwrap_or_default();
        format!("{}&start={start}&hours={}", row.launch, self.hours(row, columns))
    }

    /// How long a booking of `columns` columns of `row` is, in hours.
    pub fn hours(&self, row: &CalendarRow, columns: usize) -> u32 {
        (u32::try_from(columns).unwrap_or(1).saturating_mul(self.bucket_hours)).clamp(1, row.max_hours)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CalendarRow {
    pub model: String,
    pub label: String,
    pub capacity: u32,
    /// The launch form for this size, without start and hours.
    pub launch: String,
    /// The longest booking of the offering the row books.
    pub max_hours: u32,
    pub cells: Vec<CalendarCell>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CalendarCell {
    pub free: u32,
    pub tone: Tone,
}

/// How a calendar cell is drawn: over, nothing free, under a quarter free, or more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tone {
    Past,
    None,
    Low,
    Plenty,
}

impl Tone {
    /// The cell's `data-tone`.
    pub fn as_str(self) -> &'static str {
        match self {
            Tone::Past => "past",
            Tone::None => "none",
            Tone::Low => "low",
            Tone::Plenty => "plenty",
        }
    }

    /// Whether a cell of this tone links to the launch form.
    pub fn bookable(self) -> bool {
        matches!(self, Tone::Low | Tone::Plenty)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CalendarBooking {
    pub name: String,
    pub href: String,
    pub size: String,
    pub when: String,
    /// First column the booking covers, and how many.
    pub first: usize,
    pub span: usize,
}

/// The platform admin's view of the fleet: every node and GPU over a range of days, with
/// bookings (MIG slices drawn inside their GPU) and maintenance windows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetView {
    pub title: String,
    pub prev_href: String,
    pub next_href: String,
    pub columns: Vec<String>,
    pub nodes: Vec<FleetNode>,
    pub windows: Vec<MaintenanceView>,
    /// Every node's name, for the maintenance and health forms.
    pub node_names: Vec<String>,
    pub pager: FleetPager,
}

/// Which page of the fleet's nodes the chart shows, and the filter that chose them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetPager {
    /// "Nodes 17-32 of 1,250"
    pub shown: String,
    pub page: usize,
    pub pages: usize,
    pub prev_href: Option<String>,
    pub next_href: Option<String>,
    /// The range and filter, for the filter form to keep.
    pub from: String,
    pub days: i64,
    pub sites: Vec<String>,
    /// Empty for every site.
    pub site: String,
    pub search: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetNode {
    pub name: String,
    pub site: String,
    pub model: String,
    /// "NVLink fra1-b200-nvl01 · IB fra1-b200-su01"; empty without either.
    pub fabric: String,
    pub maintenance: Vec<Bar>,
    pub gpus: Vec<FleetGpu>,
    /// Its lifecycle state (`new`, `testing`, `available`, …) and its label ("In repair
    /// (tier 2)").
    pub state: String,
    pub state_label: String,
    /// Why, who and when of the last change; empty when it never changed.
    pub state_note: String,
    /// `/admin/nodes/<name>`: its state history, checks and actions.
    pub href: String,
}

/// One node's health page: state, history, check runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeHealthView {
    pub node: String,
    /// "fra-1 · H100-80GB · 8 GPUs".
    pub about: String,
    pub state: String,
    pub state_label: String,
    /// "Takes new bookings" or why it does not.
    pub bookings_note: String,
    pub changes: Vec<NodeChangeView>,
    pub runs: Vec<CheckRunView>,
    /// XID errors its agent reported in the last 7 days, newest first, in words.
    pub xid_errors: Vec<String>,
    /// The actions the lifecycle allows now: (event, label).
    pub actions: Vec<(String, String)>,
    /// Each GPU by index.
    pub gpus: Vec<NodeGpuView>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeGpuView {
    pub index: u32,
    /// `healthy`, `degraded` or `failed` (a badge's state).
    pub health: String,
    /// "Healthy", or the health and why: "Degraded: MIG mode is off until a GPU reset …".
    pub summary: String,
    /// "on", "off", or "not reported".
    pub mig_mode: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeChangeView {
    pub when: String,
    /// "available → draining".
    pub change: String,
    pub reason: String,
    /// The person, or "Berth".
    pub by: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckRunView {
    pub id: i64,
    /// "Acceptance, level medium, by root@example.com, 2026-11-26 07:30 UTC".
    pub title: String,
    /// `passed`, `failed` or `running`.
    pub outcome: String,
    pub results: Vec<CheckResultView>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckResultView {
    pub check: String,
    pub passed: bool,
    /// "477.5 GB/s" or "".
    pub measured: String,
    pub threshold: String,
    pub summary: String,
    pub command: String,
    pub raw_output: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetGpu {
    pub label: String,
    /// `healthy`, `degraded` or `failed`, and why.
    pub health: String,
    pub health_note: String,
    pub bars: Vec<Bar>,
    /// "73% busy": its latest utilization while held, beside what is allocated on it.
    pub busy: Option<String>,
}

/// A block on the chart, placed in thousandths of a percent of the row (whole numbers: the
/// page writes them without formatting a float, and its hydration data carries no more).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bar {
    pub left: u32,
    pub width: u32,
    pub top: u32,
    pub height: u32,
    pub label: String,
    pub title: String,
    pub href: String,
    /// `booking`, `running`, `slice` or `maintenance`.
    pub tone: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MaintenanceView {
    pub id: i64,
    pub node: String,
    pub when: String,
    pub reason: String,
    /// Bookings in the window, to rebook: (name, owner, link).
    pub affected: Vec<(String, String, String)>,
}

/// A quota row as the quotas page shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaView {
    pub id: i64,
    /// `everyone`, `tenant:<id>`, `project:<id>` or `user:<id>`: stable for tests and links.
    pub key: String,
    /// "Everyone", "Tenant", "Project" or "User".
    pub level: String,
    /// "Everyone (default per user)", "Tenant Acme", "Project acme/vision" or an email.
    pub who: String,
    pub max_gpus: String,
    /// "H100-80GB = 8, A100-80GB = 16"; empty when no model has its own limit.
    pub by_model: String,
    pub gpu_hours_per_month: String,
    pub max_booking_hours: String,
    pub max_overlapping: String,
    pub allow_spot: String,
    pub removable: bool,
}

/// The quotas page: the rows in reach, and which levels the viewer may set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotasView {
    pub rows: Vec<QuotaView>,
    /// Projects' and members' quotas (tenant admins) or any (platform admins).
    pub can_set: bool,
    /// Everyone's default and tenants' quotas: platform admins only.
    pub can_set_platform_levels: bool,
}

/// How much of one size is free, shown on the launch form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizeHint {
    pub size_id: String,
    /// "12 free now" or "none free now; earliest start Tue 24 Nov 14:15 UTC".
    pub text: String,
    pub free_now: bool,
    /// "$3.20/h": the list price in force at the start; `None`: no price, not bookable.
    pub price: Option<String>,
    /// "$11.20 for 4 h": the booking's cost at the rates over its window, after the
    /// caller's tenant's discount ("after your 12.5% discount" is said in `discount`).
    pub cost: Option<String>,
    pub discount: Option<String>,
}

/// A "Sign in with ..." button.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignInOptionView {
    pub slug: String,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantView {
    pub id: i64,
    pub slug: String,
    pub name: String,
    pub isolation: String,
    pub status: String,
    pub members: i64,
    pub active_environments: i64,
    /// "Its queue and namespace on the cluster are out of date since …", when syncs of the tenant's
    /// queue on the backend have been failing.
    pub queue_failure: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberView {
    pub user_id: i64,
    pub email: String,
    pub name: String,
    /// `tenant_admin`, `member` or `viewer`.
    pub role: String,
    pub role_label: String,
    pub status: String,
    pub linked: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProjectView {
    pub id: i64,
    pub name: String,
    pub members: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SsoView {
    pub display_name: String,
    pub issuer: String,
    pub client_id: String,
    pub has_secret: bool,
    pub groups_claim: String,
    pub allowed_domains: String,
    pub group_roles: String,
    pub enabled: bool,
    /// The redirect URI to register at the provider.
    pub redirect_uri: String,
    /// The organization's short name people may type on the sign-in page, and the link
    /// that signs them in at once, once the connection is saved.
    pub organization: Option<String>,
    pub sign_in_link: Option<String>,
}

/// A tenant's page: its members, projects and SSO connection, and what the viewer may do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantPageView {
    pub tenant: TenantView,
    pub members: Vec<MemberView>,
    pub projects: Vec<ProjectView>,
    /// `None` when the viewer may not see it.
    pub sso: Option<SsoView>,
    pub can_manage_members: bool,
    pub can_manage_projects: bool,
    pub can_manage_sso: bool,
    /// Every member's API tokens, for tenant admins and platform staff; `None` otherwise.
    pub tokens: Option<Vec<TokenView>>,
    pub can_manage_tokens: bool,
    /// Whether the Team page links to the tenant's webhooks.
    pub can_read_webhooks: bool,
    pub me: i64,
}

/// The one-time code step of a local administrator's sign-in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecondFactorView {
    /// Set only while setting up an authenticator: the base32 secret and its otpauth URI,
    /// and that URI as a QR code (an `image/svg+xml` data URL) for the app's camera.
    pub secret: Option<String>,
    pub uri: Option<String>,
    pub qr: Option<String>,
}

/// The personal API tokens page: the caller's tokens, the actions their role lets a token
/// take, and a just-created token's secret (shown once).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountView {
    pub tokens: Vec<TokenView>,
    pub actions: Vec<ActionChoice>,
    /// Set only on the render right after a plain (pre-WASM) form post created a token.
    pub new_token: Option<NewTokenView>,
    pub max_days: i64,
    /// The caller's SSH public keys, for their dedicated clusters' nodes.
    pub ssh_keys: Vec<SshKeyView>,
    /// A local account (signs in with a password here, not with single sign-on).
    pub local_account: bool,
    /// A platform admin, who may reset another local administrator's authenticator.
    pub resets_authenticators: bool,
}

/// One of the caller's SSH keys as the account page lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SshKeyView {
    pub id: i64,
    pub name: String,
    /// `ED25519 256`, `RSA 4096`: kind and size, as `ssh-keygen -l` says them.
    pub kind: String,
    /// `SHA256:…`, to compare with `ssh-keygen -lf ~/.ssh/id_ed25519.pub`.
    pub fingerprint: String,
    pub added: String,
}

/// One action a token may be limited to: `token.manage`, "Revoke API tokens".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionChoice {
    pub name: String,
    pub label: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenView {
    pub id: i64,
    /// The owner's email (the tenant page lists everyone's).
    pub owner: String,
    pub name: String,
    /// "All your role allows" or the actions' labels.
    pub actions: String,
    /// The action names, one per line, for the tooltip.
    pub action_names: String,
    pub created: String,
    pub expires: String,
    pub last_used: String,
    /// `active`, `expired` or `revoked`.
    pub status: String,
}

/// A token right after creation, with its secret; Berth keeps only a hash of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewTokenView {
    pub name: String,
    pub secret: String,
    pub expires: String,
    /// A ready-to-paste request with the secret, against this Berth.
    pub example: String,
}

/// One page of the audit log with the links around it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditView {
    pub rows: Vec<AuditRowView>,
    /// Platform staff may filter by tenant; a tenant admin sees only their own.
    pub tenant_filter: bool,
    /// The next page (older rows), when this one is full.
    pub older_href: Option<String>,
    /// Back to the newest rows, when this page is not the first.
    pub newest_href: Option<String>,
    pub csv_href: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRowView {
    pub id: i64,
    pub time: String,
    pub actor: String,
    pub tenant: String,
    pub action: String,
    pub target: String,
    /// What the target is called where it is an id (an environment's name), else empty.
    pub target_name: String,
    /// `success`, `failure` or `denied`.
    pub outcome: String,
    pub source: String,
    pub request_id: String,
    pub detail: String,
}

/// The fabric page: every hard and hybrid tenant's isolation identifiers, those in
/// quarantine, pool usage and the OpenSM partitions.conf. Platform staff only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricView {
    /// "VLAN" or "VXLAN".
    pub segment: String,
    /// "1 d 0 h": how long a released identifier waits.
    pub quarantine: String,
    pub tenants: Vec<FabricTenantView>,
    pub quarantined: Vec<QuarantinedView>,
    pub pools: Vec<PoolView>,
    pub partitions_conf: String,
    /// May set port GUIDs (platform admins; auditors only read).
    pub can_manage: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricTenantView {
    pub id: i64,
    pub slug: String,
    pub name: String,
    pub isolation: String,
    /// "VLAN 100", "VNI 5000"; empty when not held.
    pub segment: String,
    /// "0x0002 (full member 0x8002)"
    pub pkey: String,
    pub nvlink: String,
    /// "berth-v000001 · 1024 GiB"
    pub volume: String,
    pub port_guids: Vec<String>,
    pub has_pkey: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuarantinedView {
    /// "VLAN id 100", "InfiniBand P_Key 0x0002"
    pub identifier: String,
    pub tenant: String,
    pub released: String,
    pub free_at: String,
    /// "in 23 h 59 min"
    pub free_in: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolView {
    pub what: String,
    pub range: String,
    pub size: String,
    pub held: i64,
    pub quarantined: i64,
    pub free: String,
}

/// The fleet page, read in one server function: the chart and the agents of its nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetPageView {
    pub chart: FleetView,
    pub agents: NodeAgentsView,
}

/// The fleet page's node agents: each node's last report and working tokens, and a node
/// token just made (its secret, once).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAgentsView {
    pub nodes: Vec<NodeAgentView>,
    pub new_token: Option<NewNodeTokenView>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAgentView {
    pub node: String,
    pub site: String,
    /// "2026-11-23 14:05 UTC", or "never".
    pub last_report: String,
    /// "0.1.0", or empty before the first report.
    pub agent_version: String,
    /// (id, "made 2026-11-23 14:00 UTC, last used 2026-11-23 14:05 UTC").
    pub tokens: Vec<(i64, String)>,
}

/// A node token right after creation; Berth keeps only a hash of the secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewNodeTokenView {
    pub node: String,
    pub secret: String,
    /// The command to run on the node, against this Berth.
    pub command: String,
}

/// The volumes page: the volumes in reach, the projects one may share a new one with, and
/// whether one may create and change volumes at all (viewers may not).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumesView {
    pub volumes: Vec<VolumeView>,
    pub projects: Vec<ProjectOption>,
    pub can_manage: bool,
    /// How a volume's size holds on this Berth's storage, in a sentence.
    pub size_rule: Option<String>,
}

/// One volume as its page shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeView {
    pub id: i64,
    pub name: String,
    /// "Home", "Personal" or "Project vision".
    pub scope: String,
    pub owner: String,
    pub size_gib: u32,
    /// "1.2 MiB, measured 2026-11-26 13:40 UTC" (the last figure and when it was taken), or
    /// "not measured".
    pub used: String,
    pub mount_path: String,
    /// Where the backend keeps it, or "made at its first attach".
    pub location: String,
    pub created: String,
    pub attachments: Vec<VolumeAttachmentView>,
}

/// A volume attached to an environment, since when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeAttachmentView {
    pub volume: String,
    pub environment_id: String,
    pub environment_name: String,
    pub mount_path: String,
    pub since: String,
    /// `None` while attached.
    pub until: Option<String>,
}

/// A volume the launch form offers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeOption {
    /// 0 for a home volume not made yet.
    pub id: i64,
    pub name: String,
    pub mount_path: String,
    pub size_gib: u32,
    pub is_home: bool,
    /// A shared volume's project (attachable to bookings in it only).
    pub project_id: Option<i64>,
    pub project: Option<String>,
}

/// The storage limits on the quotas page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageQuotasView {
    pub rows: Vec<StorageQuotaView>,
    pub can_set: bool,
    /// Tenants' limits and home sizes: platform admins only.
    pub can_set_tenants: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageQuotaView {
    pub id: i64,
    pub who: String,
    pub max: String,
    pub used_gib: i64,
    pub home: String,
}

/// The images page: the platform's catalog, the tenants' the caller may see, and what the
/// caller may change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImagesView {
    pub platform: Vec<ImageView>,
    pub tenants: Vec<TenantImagesView>,
    pub may_manage_platform: bool,
    pub may_set_custom_images: bool,
}

/// One catalog entry as the images page shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageView {
    pub id: i64,
    pub name: String,
    pub reference: String,
    /// Named by digest, not by a tag that may move.
    pub pinned: bool,
    pub description: String,
    pub cuda: String,
    pub framework: String,
    /// Offering titles, "Jupyter notebook, Training job".
    pub suits: String,
    /// `(offering id, title)` of the offerings it suits but is not the default for.
    pub may_default: Vec<(String, String)>,
    /// Titles of the offerings it is the default for.
    pub default_for: String,
    pub may_manage: bool,
}

/// One tenant's own entries and its rule for custom images.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantImagesView {
    pub tenant_id: i64,
    pub tenant: String,
    /// `catalog`, `any` or `registries`, as the rule's form sends it.
    pub custom_mode: String,
    pub registries: String,
    /// The rule in words.
    pub custom: String,
    pub images: Vec<ImageView>,
    pub may_manage: bool,
}

/// What the launch form offers for an image: the catalog's entries for the offering (the
/// default first), and whether one may name another, in words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageOffer {
    pub options: Vec<ImageOption>,
    /// `None`: catalog images only.
    pub custom: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageOption {
    pub reference: String,
    pub label: String,
}
