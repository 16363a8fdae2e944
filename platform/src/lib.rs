//! Everything in Berth with I/O: the SQLite store, accounts, launching and stopping
//! environments, the reconciler that drives them, and the provisioning backends.
//!
//! Callers hold a [`Platform`] and call one method per user action; every method returns
//! this layer's one error type, [`Error`].

pub mod access;
pub mod audit;
pub mod capacity;
pub mod demo;
mod error;
pub mod identity;
pub mod metrics;
pub mod notifications;
pub mod origins;
pub mod people;
pub mod provisioning;
pub mod store;
pub mod tenancy;

use std::collections::HashMap;
use std::sync::Arc;

use berth_domain::booking::BookingPolicy;
use berth_domain::fabric::FabricConfig;
use berth_domain::gpu::GpuModel;
use berth_domain::policy::Principal;
use sqlx::SqlitePool;
use tokio::sync::Notify;

pub use error::Error;

use crate::capacity::book;
use crate::identity::{oidc, sso, throttle};
use crate::provisioning::{connect, jobs};

/// The handle the web layer and the reconciler share.
#[derive(Clone)]
pub struct Platform {
    db: SqlitePool,
    /// Woken whenever an environment's desired state changes, so the reconciler acts
    /// at once instead of at its next tick.
    wake: Arc<Notify>,
    policy: BookingPolicy,
    /// What bookings are charged for; see `capacity::metering`.
    charging: berth_domain::metering::ChargeBasis,
    /// Pools and quarantine of fabric isolation identifiers.
    fabric: Arc<FabricConfig>,
    /// Whose turn it is to write; see `store::WriteTx`.
    writer: Arc<tokio::sync::Mutex<()>>,
    /// Launches waiting to be decided in a writer turn; see `capacity::group_commit`.
    launches: Arc<capacity::group_commit::LaunchQueue>,
    /// In-service GPUs per model, read once: the fleet changes only through `sync_fleet`,
    /// and every booking and calendar query needs it.
    fleet: Arc<std::sync::RwLock<HashMap<GpuModel, Arc<berth_domain::booking::GpuSet>>>>,
    /// Every unreleased reservation, once loaded; see `book::BookingBook`.
    book: Arc<std::sync::RwLock<Option<book::BookingBook>>>,
    /// Calendars made lately, until the book or the fleet changes; see `capacity::calendars`.
    calendars: Arc<capacity::calendars::Calendars>,
    /// Where users reach Berth, without a trailing slash (for sign-in callbacks).
    public_url: Arc<str>,
    /// Discovered OpenID providers; see `sso`.
    oidc_clients: Arc<sso::ClientCache>,
    /// Failed password sign-ins, for lockouts.
    throttle: Arc<throttle::Throttle>,
    /// Single sign-on starts, and lookups of a person's provider, per source address; see
    /// `sso`.
    sign_in_starts: Arc<throttle::Rate>,
    sign_in_finds: Arc<throttle::Rate>,
    /// Whether identity providers chosen in the UI may be on private addresses (the
    /// operator's `--allow-private-issuers`); see `provider_http`.
    issuer_reach: oidc::Reach,
    /// The backend behind the proxy, logs and replicas; see `connect`.
    access: Arc<connect::AccessState>,
    /// Running training jobs being watched for their end; see `jobs`.
    jobs: Arc<jobs::JobWatch>,
    /// Where each environment is served, on an origin of its own; see `origins`.
    environments: Arc<origins::EnvironmentOrigins>,
    /// The repair ladder a degraded node climbs (`domain::node_health::RepairTier`).
    repair_tiers: Arc<[berth_domain::node_health::RepairTier]>,
    /// Expected NCCL bus bandwidth per model and interconnect, with the site's overrides.
    bandwidth: Arc<berth_domain::node_checks::BandwidthTable>,
    /// How notifications leave Berth (SMTP, webhooks' reach) and their counts; see
    /// `notifications`.
    delivery: Arc<notifications::Delivery>,
    /// Requests the proxy passed to environments, until the idle watcher writes them down.
    traffic: Arc<provisioning::telemetry::Traffic>,
    /// Launches and reconciler steps counted for `/metrics`; see `metrics`.
    metrics: Arc<metrics::Metrics>,
}

impl Platform {
    pub fn new(db: SqlitePool) -> Platform {
        Platform {
            db,
            wake: Arc::new(Notify::new()),
            policy: BookingPolicy::default(),
            charging: Default::default(),
            fabric: Default::default(),
            writer: Default::default(),
            launches: Default::default(),
            fleet: Default::default(),
            book: Default::default(),
            calendars: Default::default(),
            public_url: "http://127.0.0.1:3000".into(),
            oidc_clients: Default::default(),
            throttle: Default::default(),
            sign_in_starts: Arc::new(throttle::Rate::new(sso::STARTS_PER_MINUTE, 60_000)),
            sign_in_finds: Arc::new(throttle::Rate::new(sso::FINDS_PER_MINUTE, 60_000)),
            issuer_reach: oidc::Reach::Public,
            access: Default::default(),
            jobs: Default::default(),
            environments: Default::default(),
            repair_tiers: berth_domain::node_health::default_repair_tiers().into(),
            bandwidth: Default::default(),
            delivery: Default::default(),
            traffic: Default::default(),
            metrics: Default::default(),
        }
    }

    /// What the platform counted for `/metrics`.
    pub fn metrics(&self) -> &metrics::Metrics {
        &self.metrics
    }

    /// The same platform reached at `url` (e.g. `https://berth.example.com`).
    pub fn with_public_url(self, url: &str) -> Platform {
        Platform { public_url: url.trim_end_matches('/').into(), ..self }
    }

    /// The same platform serving environments at `origins` (e.g. `https://<id>.env.berth.example`).
    pub fn with_environment_origins(self, origins: origins::EnvironmentOrigins) -> Platform {
        Platform { environments: Arc::new(origins), ..self }
    }

    /// Where environments are served.
    pub fn environment_origins(&self) -> &origins::EnvironmentOrigins {
        &self.environments
    }

    /// Environment `id`'s own origin, e.g. `https://<id>.env.berth.example`, no trailing slash.
    pub fn environment_origin(&self, id: &str) -> String {
        self.environments.origin(id)
    }

    /// The same platform letting tenants' identity providers be on loopback and private
    /// addresses: for an operator whose providers are on the private network (and tests).
    pub fn with_private_issuers(self, allowed: bool) -> Platform {
        let issuer_reach = if allowed { oidc::Reach::Private } else { oidc::Reach::Public };
        Platform { issuer_reach, ..self }
    }

    /// The same platform with the operator's booking rules.
    pub fn with_policy(self, policy: BookingPolicy) -> Platform {
        Platform { policy, ..self }
    }

    /// The same platform charging bookings for `basis` (the operator's `--charge-for`).
    pub fn with_charging(self, charging: berth_domain::metering::ChargeBasis) -> Platform {
        Platform { charging, ..self }
    }

    /// The same platform with the operator's fabric pools and quarantine.
    /// The repair tiers a degraded node climbs, in order; none: a failing node is retired.
    pub fn with_repair_tiers(self, tiers: Vec<berth_domain::node_health::RepairTier>) -> Platform {
        Platform { repair_tiers: tiers.into(), ..self }
    }

    pub fn with_expected_bandwidth(self, table: berth_domain::node_checks::BandwidthTable) -> Platform {
        Platform { bandwidth: Arc::new(table), ..self }
    }

    pub fn with_fabric(self, fabric: FabricConfig) -> Platform {
        Platform { fabric: Arc::new(fabric), ..self }
    }

    pub fn policy(&self) -> &BookingPolicy {
        &self.policy
    }

    /// Where users reach Berth, without a trailing slash (e.g. for API examples).
    pub fn public_url(&self) -> &str {
        &self.public_url
    }

    pub fn db(&self) -> &SqlitePool {
        &self.db
    }

    /// A write transaction, in turn with every other writer of this process.
    pub(crate) async fn begin_write(&self) -> Result<store::WriteTx, Error> {
        // A COMMIT dropped in flight may have landed without the in-memory copies
        // following: both are then loaded again at their next use.
        let (book, fleet) = (self.book.clone(), self.fleet.clone());
        let forget_copies = Box::new(move || {
            *write(&book) = None;
            write(&fleet).clear();
        });
        store::begin_write(&self.db, &self.writer, forget_copies).await
    }

    fn wake_reconciler(&self) {
        self.wake.notify_one();
    }
}

/// Where a request came from, for logs and the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestMeta {
    pub request_id: String,
    pub source: Option<String>,
}

impl RequestMeta {
    /// For work the reconciler does on its own.
    pub fn background() -> RequestMeta {
        RequestMeta { request_id: "reconciler".into(), source: None }
    }
}

/// A signed-in user (or an API token acting for one) making a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub principal: Principal,
    pub meta: RequestMeta,
}

impl Caller {
    pub fn user_id(&self) -> i64 {
        self.principal.user_id
    }

    pub fn tenant_id(&self) -> Option<i64> {
        self.principal.tenant_id
    }
}

/// Locks a mutex over plain in-memory bookkeeping. A panic elsewhere cannot leave such
/// data inconsistent, so a poisoned lock is simply taken over.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `lock` for a read of in-memory copies behind an `RwLock`.
pub(crate) fn read<T>(m: &std::sync::RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `lock` for a write of in-memory copies behind an `RwLock`.
pub(crate) fn write<T>(m: &std::sync::RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// 256 random bits, hex: the secret part of tokens, keys, tickets and session ids.
pub(crate) fn random_secret() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// The hex SHA-256 of a high-entropy value (token secrets, SSO bindings): enough to keep
/// it out of the database, where a password would need argon2.
pub(crate) fn sha256_hex(value: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(value.as_bytes()))
}

/// Unix milliseconds now; every time Berth stores is in this form.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
