//! How owners reach what they booked: who may open a notebook through Berth's proxy (on the
//! notebook's own origin, see `environment_sessions`), which key opens an inference
//! endpoint, where the proxy sends their requests, the endpoints' API keys, and training
//! jobs' logs.
//!
//! An endpoint's API key is made when the endpoint is first exposed and shown to its owner
//! once (like Run:ai's application secrets and OpenAI's keys): only its SHA-256 is kept for
//! checking requests, and the key itself waits in the database only until its owner has
//! seen it. A lost key is replaced, never shown again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use berth_domain::Refusal;
use berth_domain::catalog::Offering;
use berth_domain::lifecycle::{Desired, EnvState};
use berth_domain::node_plan::{KEPT_LOG_LINES, kept_log};
use berth_domain::policy::{Action, Target};
use sqlx::SqliteConnection;
use subtle::ConstantTimeEq;

use crate::audit::{self, Event, Outcome};
use crate::capacity::environments::{Environment, environment_in};
use crate::provisioning::backend::{Backend, JobLogs, Upstream};
use crate::{Caller, Error, Platform, lock, now_ms, random_secret, sha256_hex};

/// The prefix that makes a leaked endpoint key easy to recognise.
pub const ENDPOINT_KEY_PREFIX: &str = "berth_ep_";

/// How long the proxy trusts an upstream address before asking the backend again (a
/// notebook's Service and credential outlive it; a restarted one is asked for at once).
const UPSTREAM_TTL_MS: i64 = 30_000;

/// Lines of a training log the environment page shows.
pub const LOG_TAIL: usize = 200;

/// The backend the proxy and the environment page ask, and what they remember.
#[derive(Default)]
pub(crate) struct AccessState {
    backend: Option<Arc<dyn Backend>>,
    /// Environment -> upstream and when it was looked up.
    upstreams: Mutex<HashMap<String, (Upstream, i64)>>,
    /// Environments whose last change while running failed (an endpoint's scaling, a
    /// cluster's move off a failed node) -> not to be tried again before this time.
    pub(crate) retry_after: Mutex<HashMap<String, i64>>,
    /// Environments whose running change is being applied now (see `running_changes`).
    pub(crate) changing: Mutex<std::collections::HashSet<String>>,
}

/// An endpoint's key as its owner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyState {
    /// The endpoint has not been exposed yet.
    NotYetMade,
    /// Made and waiting to be shown once.
    Unrevealed,
    /// Shown (or replaced) at this time; only its hash is left.
    Shown { at: i64 },
}

/// An inference endpoint's key and replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointState {
    pub key: KeyState,
    /// What the owner asked for.
    pub replicas: u32,
    /// What the backend last confirmed running.
    pub replicas_applied: u32,
    /// Why the last attempt to apply `replicas` failed.
    pub scale_error: Option<String>,
}

impl Platform {
    /// The same platform with the backend the proxy and the environment page ask (the
    /// reconciler's own).
    pub fn with_backend(self, backend: Arc<dyn Backend>) -> Platform {
        Platform { access: Arc::new(AccessState { backend: Some(backend), ..AccessState::default() }), ..self }
    }

    pub(crate) fn backend(&self) -> Result<Arc<dyn Backend>, Error> {
        self.access.backend.clone().ok_or_else(|| Error::internal("this Berth runs without a provisioning backend"))
    }

    /// Whether the caller may act inside the environment (open it, see its key). Asked
    /// without auditing: pages use it to decide what to offer.
    pub fn may_connect(&self, caller: &Caller, env: &Environment) -> bool {
        let target = Target::Owned { tenant_id: env.tenant_id, owner_id: env.owner_id };
        caller.principal.authorize(Action::EnvironmentConnect, target).is_ok()
    }

    /// Where the proxy sends a request to notebook `id` from a caller signed in on its
    /// origin: only for its owner and their tenant admin, and only once it is ready. Anyone
    /// else gets `NotFound` (or `Forbidden`, which the proxy answers the same). Opening the
    /// notebook was audited when the portal gave the ticket; its many requests are not.
    pub async fn notebook_upstream(&self, caller: &Caller, id: &str) -> Result<Upstream, Error> {
        let env = self.environment_for(caller, id, Action::EnvironmentConnect).await?;
        match env.offering {
            Offering::Notebook => {}
            // An endpoint is opened with its key, not a session.
            Offering::InferenceEndpoint => return Err(Refusal::ApiKeyRequired.into()),
            Offering::TrainingJob | Offering::DedicatedCluster => return Err(Error::NotFound),
        }
        ready(&env)?;
        self.upstream_for(&env).await
    }

    /// Where the proxy sends a request to endpoint `id` that carries `key`. A wrong key, a
    /// key of another endpoint and an id that names nothing all answer `Unauthenticated`.
    pub async fn endpoint_upstream(&self, id: &str, key: &str) -> Result<Upstream, Error> {
        let mut conn = self.db.acquire().await?;
        let stored: Option<String> = sqlx::query_scalar("SELECT key_hash FROM endpoint_keys WHERE environment_id = ?")
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?;
        // Compared in constant time, so the answer's timing says nothing about the hash.
        let given = sha256_hex(key);
        let matches = stored.is_some_and(|h| bool::from(h.as_bytes().ct_eq(given.as_bytes())));
        if !matches {
            return Err(Error::Unauthenticated);
        }
        let env = environment_in(&mut conn, id).await?;
        drop(conn);
        ready(&env)?;
        self.upstream_for(&env).await
    }

    /// Forgets the upstream of `id`, e.g. after it did not answer: the next request asks
    /// the backend again.
    pub fn forget_upstream(&self, id: &str) {
        lock(&self.access.upstreams).remove(id);
    }

    async fn upstream_for(&self, env: &Environment) -> Result<Upstream, Error> {
        let now = now_ms();
        if let Some((upstream, at)) = lock(&self.access.upstreams).get(&env.id)
            && now - at < UPSTREAM_TTL_MS
        {
            return Ok(upstream.clone());
        }
        let backend = self.backend()?;
        let workload = self.workload(env).await?;
        let upstream = backend.upstream(&workload).await.map_err(|e| Refusal::WorkloadUnreachable(e.0))?;
        lock(&self.access.upstreams).insert(env.id.clone(), (upstream.clone(), now));
        Ok(upstream)
    }

    /// Shows endpoint `id`'s key to its owner (or their tenant admin), once. Audited.
    pub async fn reveal_endpoint_key(&self, caller: &Caller, id: &str) -> Result<String, Error> {
        let env = self.environment_for(caller, id, Action::EnvironmentConnect).await?;
        has_key(&env)?;
        let mut tx = self.begin_write().await?;
        let unrevealed: Option<Option<String>> =
            sqlx::query_scalar("SELECT unrevealed FROM endpoint_keys WHERE environment_id = ?")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
        let key = match unrevealed {
            None => return Err(Refusal::ApiKeyNotYetMade.into()),
            Some(None) => return Err(Refusal::ApiKeyAlreadyShown.into()),
            Some(Some(key)) => key,
        };
        sqlx::query("UPDATE endpoint_keys SET unrevealed = NULL, revealed_at = ? WHERE environment_id = ?")
            .bind(now_ms())
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let event = Event { action: "endpoint.key_reveal", target: Some(id), outcome: Outcome::Success, detail: None };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        Ok(key)
    }

    /// Gives endpoint `id` a new key and returns it (shown this once); the old key stops
    /// working at once. Audited.
    pub async fn replace_endpoint_key(&self, caller: &Caller, id: &str) -> Result<String, Error> {
        let env = self.environment_for(caller, id, Action::EnvironmentConnect).await?;
        has_key(&env)?;
        if env.state.is_final() || env.desired == Desired::Released {
            return Err(Refusal::NotScalable(if env.state.is_final() { env.state.as_str() } else { "stopping" }).into());
        }
        let key = new_key();
        let mut tx = self.begin_write().await?;
        let replaced = sqlx::query(
            "UPDATE endpoint_keys SET key_hash = ?, unrevealed = NULL, created_at = ?, revealed_at = ?
             WHERE environment_id = ?",
        )
        .bind(sha256_hex(&key))
        .bind(now_ms())
        .bind(now_ms())
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if replaced == 0 {
            return Err(Refusal::ApiKeyNotYetMade.into());
        }
        let event = Event { action: "endpoint.key_replace", target: Some(id), outcome: Outcome::Success, detail: None };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        Ok(key)
    }

    /// The end of training job `id`'s log (its last `tail` lines, at most what Berth keeps:
    /// `KEPT_LOG_LINES` lines and `KEPT_LOG_BYTES`) and its status, for whoever may see the
    /// job. The page shows `LOG_TAIL`.
    pub async fn job_logs(&self, caller: &Caller, id: &str, tail: usize) -> Result<JobLogs, Error> {
        let tail = tail.min(KEPT_LOG_LINES);
        let mut logs = self.job_log_lines(caller, id, tail.max(1)).await?;
        logs.lines = kept_log(logs.lines);
        logs.lines.drain(..logs.lines.len().saturating_sub(tail));
        Ok(logs)
    }

    /// As much of training job `id`'s log as Berth keeps (`node_plan::kept_log`), as text,
    /// for the page's download.
    pub async fn job_log_text(&self, caller: &Caller, id: &str) -> Result<String, Error> {
        let logs = self.job_log_lines(caller, id, KEPT_LOG_LINES).await?;
        let mut text = kept_log(logs.lines).join("\n");
        text.push('\n');
        Ok(text)
    }

    async fn job_log_lines(&self, caller: &Caller, id: &str, tail: usize) -> Result<JobLogs, Error> {
        let env = self.environment_for(caller, id, Action::EnvironmentRead).await?;
        if env.offering != Offering::TrainingJob {
            return Err(Refusal::NoJobLogs(env.offering.title()).into());
        }
        // Kept when the job ended or was stopped: its pods or containers may be gone.
        if let Some(kept) = self.kept_job_log(id).await? {
            return Ok(kept);
        }
        ready(&env)?;
        let backend = self.backend()?;
        let workload = self.workload(&env).await?;
        backend.job_logs(&workload, tail).await.map_err(|e| Refusal::WorkloadUnreachable(e.0).into())
    }
}

fn ready(env: &Environment) -> Result<(), Error> {
    match env.state {
        EnvState::Ready if env.desired == Desired::Running => Ok(()),
        EnvState::Ready => Err(Refusal::NotReady("stopping").into()),
        state => Err(Refusal::NotReady(state.as_str()).into()),
    }
}

fn has_key(env: &Environment) -> Result<(), Error> {
    match env.offering {
        Offering::InferenceEndpoint => Ok(()),
        other => Err(Refusal::NoApiKey(other.title()).into()),
    }
}

fn new_key() -> String {
    format!("{ENDPOINT_KEY_PREFIX}{}", random_secret())
}

/// Makes endpoint `environment_id`'s key unless it has one: called when the endpoint is
/// exposed, in the transaction that records the step.
pub(crate) async fn issue_endpoint_key(conn: &mut SqliteConnection, environment_id: &str) -> Result<(), Error> {
    let key = new_key();
    sqlx::query(
        "INSERT INTO endpoint_keys (environment_id, key_hash, unrevealed, created_at) VALUES (?, ?, ?, ?)
         ON CONFLICT (environment_id) DO NOTHING",
    )
    .bind(environment_id)
    .bind(sha256_hex(&key))
    .bind(&key)
    .bind(now_ms())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// An inference endpoint's key and replicas; `None` for other offerings.
pub(crate) async fn endpoint_state(
    conn: &mut SqliteConnection,
    env: &Environment,
) -> Result<Option<EndpointState>, Error> {
    if env.offering != Offering::InferenceEndpoint {
        return Ok(None);
    }
    let (replicas, replicas_applied, scale_error): (i64, i64, Option<String>) =
        sqlx::query_as("SELECT replicas, replicas_applied, scale_error FROM environments WHERE id = ?")
            .bind(&env.id)
            .fetch_one(&mut *conn)
            .await?;
    let key: Option<(bool, Option<i64>)> =
        sqlx::query_as("SELECT unrevealed IS NOT NULL, revealed_at FROM endpoint_keys WHERE environment_id = ?")
            .bind(&env.id)
            .fetch_optional(&mut *conn)
            .await?;
    let key = match key {
        None => KeyState::NotYetMade,
        Some((true, _)) => KeyState::Unrevealed,
        Some((false, at)) => KeyState::Shown { at: at.unwrap_or(0) },
    };
    let count = |n: i64| u32::try_from(n).unwrap_or(1);
    Ok(Some(EndpointState { key, replicas: count(replicas), replicas_applied: count(replicas_applied), scale_error }))
}
