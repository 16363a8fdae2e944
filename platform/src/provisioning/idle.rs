//! Idle reclamation: the policies (`idle_policies`, `0034`), the watcher's pass, and an
//! owner's "keep it".
//!
//! The rules are `berth_domain::idle`'s. Here: what the watcher knows of each ready
//! environment (its readings in `gpu_samples`, its `idle_watch` row, the proxy's traffic),
//! and each act (warn, withdraw, stop, keep) in one write transaction with its audit row
//! and its notification. Policies are quotas of a kind: platform admins set the
//! platform's (`quota.manage` on the platform), tenant admins their tenant's stricter ones
//! (`quota.manage` on the tenant); whoever reads quotas reads them.

use std::collections::HashMap;

use berth_domain::Refusal;
use berth_domain::catalog::Offering;
use berth_domain::idle::{self, IdleAction, IdleFacts, IdlePolicy, Reclaim};
use berth_domain::lifecycle::{Desired, EnvState};
use berth_domain::notification::Notice;
use berth_domain::policy::{Action, Target};
use sqlx::{Row, SqliteConnection};

use crate::audit::{self, Actor, Event, Outcome};
use crate::{Caller, Error, Platform, now_ms};

/// One policy as set: the platform's (`tenant` `None`) or a tenant's.
#[derive(Debug, Clone, PartialEq)]
pub struct SetIdlePolicy {
    /// The tenant's id and slug, for a tenant's policy.
    pub tenant: Option<(i64, String)>,
    pub offering: Offering,
    pub policy: IdlePolicy,
    pub updated_at: i64,
}

/// The policy page: every policy the caller may read, and where they may set one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IdlePolicies {
    pub policies: Vec<SetIdlePolicy>,
    /// Whether the caller sets the platform's policies.
    pub manages_platform: bool,
    /// The tenants whose policies the caller sets (their own, for a tenant admin).
    pub manages_tenants: Vec<(i64, String)>,
}

/// An environment's standing with the idle watcher, for its page.
#[derive(Debug, Clone, PartialEq)]
pub struct IdleStatus {
    /// The policy that applies, in words; `None` when none does.
    pub policy: Option<String>,
    /// The standing warning: idle since, stopped (or scaled down) at.
    pub warning: Option<(i64, i64)>,
    /// What idleness would do to it: "stopped", "scaled down to 1 replica"; `None` for an
    /// endpoint at its one replica, which idleness leaves alone.
    pub outcome: Option<&'static str>,
    pub keeps_used: i64,
    /// Keeps left in this booking; `None` is no limit.
    pub keeps_left: Option<i64>,
    /// When the watcher stopped it for idleness.
    pub stopped_at: Option<i64>,
    /// Whether the caller may choose "keep it" now: a policy applies, keeps are left, the
    /// environment is ready, and the caller may change it.
    pub may_keep: bool,
}

impl Platform {
    /// Every idle policy the caller may read: the platform's, and the tenants' in reach.
    pub async fn idle_policies(&self, caller: &Caller) -> Result<IdlePolicies, Error> {
        self.authorize_in_tenant(caller, Action::QuotaRead).await?;
        let all = caller.principal.reach(Action::QuotaRead) == Some(berth_domain::policy::Reach::All);
        let rows = sqlx::query(
            "SELECT p.tenant_id, t.slug, p.offering, p.below_pct, p.idle_for_s, p.grace_s, p.max_keeps, p.updated_at
             FROM idle_policies p LEFT JOIN tenants t ON t.id = p.tenant_id
             WHERE p.tenant_id IS NULL OR ?1 OR p.tenant_id = ?2
             ORDER BY p.tenant_id IS NOT NULL, t.slug, p.offering",
        )
        .bind(all)
        .bind(caller.tenant_id())
        .fetch_all(&self.db)
        .await?;
        let policies = rows.iter().map(set_policy_from_row).collect::<Result<Vec<_>, Error>>()?;
        let manages_platform = caller.principal.authorize(Action::QuotaManage, Target::Platform).is_ok();
        let manages_tenants = if manages_platform {
            sqlx::query_as("SELECT id, slug FROM tenants WHERE status <> 'deleted' ORDER BY slug")
                .fetch_all(&self.db)
                .await?
        } else {
            match caller.tenant_id() {
                Some(t) if caller.principal.authorize(Action::QuotaManage, Target::Tenant(t)).is_ok() => {
                    sqlx::query_as("SELECT id, slug FROM tenants WHERE id = ?").bind(t).fetch_all(&self.db).await?
                }
                _ => Vec::new(),
            }
        };
        Ok(IdlePolicies { policies, manages_platform, manages_tenants })
    }

    /// Sets (or with `policy` `None`, removes) the platform's policy for an offering, or a
    /// tenant's. A tenant's must be stricter than the platform's where the platform has
    /// one (`IdlePolicy::check_within`). Audited.
    pub async fn set_idle_policy(
        &self,
        caller: &Caller,
        tenant_id: Option<i64>,
        offering: Offering,
        policy: Option<IdlePolicy>,
    ) -> Result<(), Error> {
        let target = tenant_id.map_or(Target::Platform, Target::Tenant);
        self.authorize(caller, Action::QuotaManage, target).await?;
        let mut tx = self.begin_write().await?;
        let slug: Option<String> = match tenant_id {
            Some(t) => Some(
                sqlx::query_scalar("SELECT slug FROM tenants WHERE id = ? AND status <> 'deleted'")
                    .bind(t)
                    .fetch_optional(&mut *tx)
                    .await?
                    .ok_or(Error::NotFound)?,
            ),
            None => None,
        };
        if let (Some(_), Some(policy)) = (tenant_id, &policy)
            && let Some(platform) = policy_of(&mut tx, None, offering).await?
        {
            policy.check_within(&platform)?;
        }
        sqlx::query("DELETE FROM idle_policies WHERE coalesce(tenant_id, 0) = coalesce(?, 0) AND offering = ?")
            .bind(tenant_id)
            .bind(offering.id())
            .execute(&mut *tx)
            .await?;
        if let Some(p) = &policy {
            sqlx::query(
                "INSERT INTO idle_policies (tenant_id, offering, below_pct, idle_for_s, grace_s, max_keeps, updated_by,
                     updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(tenant_id)
            .bind(offering.id())
            .bind(p.below_pct)
            .bind(p.idle_for_s)
            .bind(p.grace_s)
            .bind(p.max_keeps)
            .bind(caller.user_id())
            .bind(now_ms())
            .execute(&mut *tx)
            .await?;
        }
        let whose = slug.map_or_else(|| "platform".to_owned(), |s| format!("tenant:{s}"));
        let target = format!("{whose}/{}", offering.id());
        let detail = policy.map_or_else(|| "removed".to_owned(), |p| p.describe());
        let event = Event {
            action: "idle_policy.set",
            target: Some(&target),
            outcome: Outcome::Success,
            detail: Some(&detail),
        };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Where environment `id` stands with the idle watcher, for whoever may see it.
    pub async fn idle_status(&self, caller: &Caller, id: &str) -> Result<IdleStatus, Error> {
        let env = self.environment_for(caller, id, Action::EnvironmentRead).await?;
        let mut conn = self.db.acquire().await?;
        let policy = applying_policy(&mut conn, env.tenant_id, env.offering).await?;
        let watch = watch_of(&mut conn, id).await?;
        let replicas: i64 =
            sqlx::query_scalar("SELECT replicas FROM environments WHERE id = ?").bind(id).fetch_one(&mut *conn).await?;
        let reclaim = Reclaim::of(env.offering, u32::try_from(replicas).unwrap_or(1));
        let keeps_left = policy.and_then(|p| p.max_keeps).map(|limit| (limit - watch.keeps).max(0));
        let target = Target::Owned { tenant_id: env.tenant_id, owner_id: env.owner_id };
        let may_keep = policy.is_some()
            && keeps_left != Some(0)
            && env.state == EnvState::Ready
            && env.desired == Desired::Running
            && caller.principal.authorize(Action::EnvironmentChange, target).is_ok();
        Ok(IdleStatus {
            policy: policy.map(|p| p.describe()),
            warning: watch.idle_since.zip(watch.stop_at),
            outcome: reclaim.map(Reclaim::outcome),
            keeps_used: watch.keeps,
            keeps_left,
            stopped_at: watch.stopped_at,
            may_keep,
        })
    }

    /// "Keep it": the owner (or their tenant admin) says a ready environment is in use.
    /// Its idle clock starts again and a standing warning is withdrawn; the policy may
    /// limit how often. Audited.
    pub async fn keep_environment(&self, caller: &Caller, id: &str) -> Result<IdleStatus, Error> {
        let env = self.environment_for(caller, id, Action::EnvironmentChange).await?;
        let mut tx = self.begin_write().await?;
        let state: String = sqlx::query_scalar("SELECT state FROM environments WHERE id = ? AND desired = 'running'")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
            .unwrap_or_default();
        if state != "ready" {
            return Err(Refusal::NotKeepable(env.name).into());
        }
        let watch = watch_of(&mut tx, id).await?;
        if let Some(policy) = applying_policy(&mut tx, env.tenant_id, env.offering).await? {
            idle::may_keep(&policy, watch.keeps)?;
        }
        let now = now_ms();
        sqlx::query(
            "INSERT INTO idle_watch (environment_id, kept_at, keeps) VALUES (?1, ?2, 1)
             ON CONFLICT (environment_id) DO UPDATE SET kept_at = ?2, keeps = keeps + 1, idle_since = NULL,
                 stop_at = NULL",
        )
        .bind(id)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let detail = format!("keep {} (its idle clock starts again)", watch.keeps + 1);
        let event =
            Event { action: "environment.keep", target: Some(id), outcome: Outcome::Success, detail: Some(&detail) };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        self.idle_status(caller, id).await
    }

    /// The proxy passed a request to environment `id`: it is in use. Kept in memory until
    /// the watcher's next pass writes it down.
    pub fn note_traffic(&self, id: &str) {
        self.traffic.note(id, now_ms());
    }

    /// One pass of the idle watcher: the proxy's traffic written down, then each ready
    /// environment under a policy judged by `domain::idle::decide`, and each verdict acted
    /// on in its own write transaction (re-checked there, so a stop or keep meanwhile
    /// wins). Answers how many were stopped (or, endpoints, scaled down to one replica).
    pub async fn watch_idle(&self, now: i64) -> Result<usize, Error> {
        let traffic = self.traffic.take();
        if !traffic.is_empty() {
            let mut tx = self.begin_write().await?;
            for (id, at) in &traffic {
                sqlx::query(
                    "INSERT INTO idle_watch (environment_id, traffic_at)
                     SELECT id, ?2 FROM environments WHERE id = ?1
                     ON CONFLICT (environment_id) DO UPDATE SET traffic_at = max(coalesce(traffic_at, 0), ?2)",
                )
                .bind(id)
                .bind(at)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
        }
        let policies = all_policies(&self.db).await?;
        if policies.is_empty() {
            return Ok(0);
        }
        let ready = sqlx::query(
            "SELECT e.id, e.name, e.owner_id, e.tenant_id, e.offering, e.replicas,
                    coalesce(e.ready_at, e.state_changed_at) AS ready_at, w.kept_at, w.traffic_at, w.stop_at
             FROM environments e LEFT JOIN idle_watch w ON w.environment_id = e.id
             WHERE e.state = 'ready' AND e.desired = 'running'",
        )
        .fetch_all(&self.db)
        .await?;
        let mut stopped = 0;
        for row in &ready {
            let id: String = row.try_get("id")?;
            let tenant_id: Option<i64> = row.try_get("tenant_id")?;
            let offering: String = row.try_get("offering")?;
            let Some(offering) = Offering::parse(&offering) else { continue };
            let replicas = u32::try_from(row.try_get::<i64, _>("replicas")?).unwrap_or(1);
            // An endpoint at its one replica has nothing to give back.
            let Some(reclaim) = Reclaim::of(offering, replicas) else { continue };
            let platform = policies.get(&(None, offering)).copied();
            let tenant = tenant_id.and_then(|t| policies.get(&(Some(t), offering)).copied());
            let Some(policy) = IdlePolicy::strictest(platform, tenant) else { continue };
            let mut conn = self.db.acquire().await?;
            let readings = readings_of(&mut conn, &id, policy.below_pct).await?;
            drop(conn);
            let active_at = [
                row.try_get::<Option<i64>, _>("ready_at")?,
                row.try_get("kept_at")?,
                row.try_get("traffic_at")?,
                readings.busy_until,
            ]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(0);
            let facts = IdleFacts {
                active_at,
                first_reading_at: readings.first,
                last_reading_at: readings.last,
                stop_at: row.try_get("stop_at")?,
            };
            let action = idle::decide(&policy, &facts, now);
            if action == IdleAction::Nothing {
                continue;
            }
            let name: String = row.try_get("name")?;
            let owner: i64 = row.try_get("owner_id")?;
            let acted = Acting { id: &id, name: &name, owner, tenant_id, policy: &policy, facts: &facts, reclaim };
            if self.act_on_idleness(&acted, action, now).await? {
                stopped += 1;
            }
        }
        if stopped > 0 {
            self.wake_reconciler();
        }
        Ok(stopped)
    }

    /// Acts on one verdict, if what it was decided on still holds (the environment is
    /// ready and wanted, and its watch row is as read). Answers whether it stopped it or
    /// scaled it down.
    async fn act_on_idleness(&self, e: &Acting<'_>, action: IdleAction, now: i64) -> Result<bool, Error> {
        let mut tx = self.begin_write().await?;
        let still: Option<Option<i64>> = sqlx::query_scalar(
            "SELECT w.stop_at FROM environments e LEFT JOIN idle_watch w ON w.environment_id = e.id
             WHERE e.id = ? AND e.state = 'ready' AND e.desired = 'running'",
        )
        .bind(e.id)
        .fetch_optional(&mut *tx)
        .await?;
        if still != Some(e.facts.stop_at) {
            return Ok(false);
        }
        let stopped = match action {
            IdleAction::Nothing => return Ok(false),
            IdleAction::Warn { idle_since, stop_at } => {
                sqlx::query(
                    "INSERT INTO idle_watch (environment_id, idle_since, stop_at) VALUES (?1, ?2, ?3)
                     ON CONFLICT (environment_id) DO UPDATE SET idle_since = ?2, stop_at = ?3",
                )
                .bind(e.id)
                .bind(idle_since)
                .bind(stop_at)
                .execute(&mut *tx)
                .await?;
                let detail = idle::warning_text(e.name, idle_since, stop_at, e.reclaim);
                let notice = Notice::idle_warning(e.id, e.name, idle_since, stop_at, e.reclaim);
                self.record_idle_step(&mut tx, e, "environment.idle_warning", &detail, &notice).await?;
                false
            }
            IdleAction::Withdraw => {
                sqlx::query("UPDATE idle_watch SET idle_since = NULL, stop_at = NULL WHERE environment_id = ?")
                    .bind(e.id)
                    .execute(&mut *tx)
                    .await?;
                false
            }
            IdleAction::Stop => match e.reclaim {
                Reclaim::ScaleDown { replicas } => {
                    // Down to one replica: the reconciler stops the others and gives their
                    // GPUs back (as a scale-down from the page does). Its idle clock starts
                    // again; a new warning comes only if it scales up and idles again.
                    sqlx::query(
                        "UPDATE environments SET replicas = 1, scale_error = NULL WHERE id = ? AND replicas > 1",
                    )
                    .bind(e.id)
                    .execute(&mut *tx)
                    .await?;
                    sqlx::query("UPDATE idle_watch SET idle_since = NULL, stop_at = NULL WHERE environment_id = ?")
                        .bind(e.id)
                        .execute(&mut *tx)
                        .await?;
                    let detail = format!("replicas {replicas} -> 1 for idleness: {}", e.policy.describe());
                    let notice = Notice::idle_scaled_down(e.id, e.name, replicas, &e.policy.describe());
                    self.record_idle_step(&mut tx, e, "endpoint.idle_scale_down", &detail, &notice).await?;
                    // Counted with the stops: the reconciler has capacity to give back.
                    true
                }
                Reclaim::Stop => {
                    sqlx::query("UPDATE environments SET desired = 'released' WHERE id = ?")
                        .bind(e.id)
                        .execute(&mut *tx)
                        .await?;
                    sqlx::query(
                        "UPDATE idle_watch SET idle_since = NULL, stop_at = NULL, stopped_at = ? WHERE environment_id = ?",
                    )
                    .bind(now)
                    .bind(e.id)
                    .execute(&mut *tx)
                    .await?;
                    let detail = format!("stopped for idleness: {}", e.policy.describe());
                    let notice = Notice::idle_stopped(e.id, e.name, &e.policy.describe());
                    self.record_idle_step(&mut tx, e, "environment.idle_stop", &detail, &notice).await?;
                    true
                }
            },
        };
        tx.commit().await?;
        Ok(stopped)
    }

    /// Audits what the watcher did to `e` (`action`, in words `detail`) and tells its owner.
    async fn record_idle_step(
        &self,
        conn: &mut SqliteConnection,
        e: &Acting<'_>,
        action: &str,
        detail: &str,
        notice: &Notice,
    ) -> Result<(), Error> {
        let event = Event { action, target: Some(e.id), outcome: Outcome::Success, detail: Some(detail) };
        audit::record(&mut *conn, &Actor::background(e.tenant_id), event).await?;
        self.notify(conn, e.tenant_id, &[e.owner], notice).await
    }

    /// Environments stopped for idleness, per tenant slug (`""` for staff's own), for `/metrics`.
    pub async fn idle_stops(&self) -> Result<Vec<(String, u64)>, Error> {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT coalesce(t.slug, ''), count(*) FROM idle_watch w JOIN environments e ON e.id = w.environment_id
             LEFT JOIN tenants t ON t.id = e.tenant_id WHERE w.stopped_at IS NOT NULL GROUP BY 1 ORDER BY 1",
        )
        .fetch_all(&self.db)
        .await?;
        Ok(rows.into_iter().map(|(t, n)| (t, u64::try_from(n).unwrap_or(0))).collect())
    }
}

/// One environment the watcher acts on, as it read it.
struct Acting<'a> {
    id: &'a str,
    name: &'a str,
    owner: i64,
    tenant_id: Option<i64>,
    policy: &'a IdlePolicy,
    facts: &'a IdleFacts,
    /// What the end of the grace does to it.
    reclaim: Reclaim,
}

#[derive(Default)]
struct Watch {
    keeps: i64,
    idle_since: Option<i64>,
    stop_at: Option<i64>,
    stopped_at: Option<i64>,
}

async fn watch_of(conn: &mut SqliteConnection, id: &str) -> Result<Watch, Error> {
    let row = sqlx::query("SELECT keeps, idle_since, stop_at, stopped_at FROM idle_watch WHERE environment_id = ?")
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?;
    Ok(match row {
        Some(r) => Watch {
            keeps: r.try_get("keeps")?,
            idle_since: r.try_get("idle_since")?,
            stop_at: r.try_get("stop_at")?,
            stopped_at: r.try_get("stopped_at")?,
        },
        None => Watch::default(),
    })
}

/// What an environment's readings say: the end of the last bucket in which one of its
/// GPUs reached `below_pct` (busy until the end of that minute, to be safe), and its first
/// and last readings' times.
struct Readings {
    busy_until: Option<i64>,
    first: Option<i64>,
    last: Option<i64>,
}

async fn readings_of(conn: &mut SqliteConnection, id: &str, below_pct: f64) -> Result<Readings, Error> {
    let row = sqlx::query(
        "SELECT max(CASE WHEN s.utilization_max >= ?2 THEN s.bucket + s.resolution_s * 1000 END) AS busy_until,
                min(s.first_at) AS first, max(s.last_at) AS last
         FROM reservations r JOIN gpu_samples s ON s.reservation_id = r.id
         WHERE r.environment_id = ?1 AND r.released_at IS NULL",
    )
    .bind(id)
    .bind(below_pct)
    .fetch_one(&mut *conn)
    .await?;
    Ok(Readings { busy_until: row.try_get("busy_until")?, first: row.try_get("first")?, last: row.try_get("last")? })
}

fn set_policy_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<SetIdlePolicy, Error> {
    let offering: String = row.try_get("offering")?;
    let tenant_id: Option<i64> = row.try_get("tenant_id")?;
    let slug: Option<String> = row.try_get("slug")?;
    Ok(SetIdlePolicy {
        tenant: tenant_id.zip(slug),
        offering: Offering::parse(&offering)
            .ok_or_else(|| Error::internal(format!("an idle policy for an unknown offering {offering}")))?,
        policy: policy_from_row(row)?,
        updated_at: row.try_get("updated_at")?,
    })
}

fn policy_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<IdlePolicy, Error> {
    Ok(IdlePolicy {
        below_pct: row.try_get("below_pct")?,
        idle_for_s: row.try_get("idle_for_s")?,
        grace_s: row.try_get("grace_s")?,
        max_keeps: row.try_get("max_keeps")?,
    })
}

/// The platform's (`tenant_id` `None`) or a tenant's own policy for an offering.
async fn policy_of(
    conn: &mut SqliteConnection,
    tenant_id: Option<i64>,
    offering: Offering,
) -> Result<Option<IdlePolicy>, Error> {
    let row = sqlx::query(
        "SELECT below_pct, idle_for_s, grace_s, max_keeps FROM idle_policies
         WHERE coalesce(tenant_id, 0) = coalesce(?, 0) AND offering = ?",
    )
    .bind(tenant_id)
    .bind(offering.id())
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(policy_from_row).transpose()
}

/// The policy that applies to a tenant's environments of an offering.
async fn applying_policy(
    conn: &mut SqliteConnection,
    tenant_id: Option<i64>,
    offering: Offering,
) -> Result<Option<IdlePolicy>, Error> {
    let platform = policy_of(conn, None, offering).await?;
    let tenant = match tenant_id {
        Some(t) => policy_of(conn, Some(t), offering).await?,
        None => None,
    };
    Ok(IdlePolicy::strictest(platform, tenant))
}

async fn all_policies(db: &sqlx::SqlitePool) -> Result<HashMap<(Option<i64>, Offering), IdlePolicy>, Error> {
    let rows = sqlx::query("SELECT tenant_id, offering, below_pct, idle_for_s, grace_s, max_keeps FROM idle_policies")
        .fetch_all(db)
        .await?;
    let mut policies = HashMap::new();
    for row in &rows {
        let offering: String = row.try_get("offering")?;
        if let Some(offering) = Offering::parse(&offering) {
            policies.insert((row.try_get("tenant_id")?, offering), policy_from_row(row)?);
        }
    }
    Ok(policies)
}
