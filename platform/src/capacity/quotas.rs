//! Quotas at four levels (everyone's default per user, a tenant's, a project's and a
//! user's own) and the check every booking passes in its own transaction.

use std::collections::BTreeMap;
use std::sync::Arc;

use berth_domain::Refusal;
use berth_domain::booking::{self, Quota, QuotaScope, Tier, Usage, Window};
use berth_domain::gpu::GpuModel;
use berth_domain::mig::{MEMORY_SLICES, MigProfile, SliceRange};
use berth_domain::placement::Hold;
use berth_domain::policy::{Action, Target};
use sqlx::{Row, SqliteConnection};

use crate::access::Scope;
use crate::audit::{self, Event, Outcome};
use crate::{Caller, Error, Platform, now_ms};

/// What a booking asks of its quotas: GPU-equivalents of a model for a window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct QuotaAsk {
    pub model: GpuModel,
    pub window: Window,
    pub gpus: f64,
    pub tier: Tier,
}

/// Whom a booking counts against: its owner, the owner's tenant and the project it was
/// booked in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Booker {
    pub user_id: i64,
    pub tenant_id: Option<i64>,
    pub project_id: Option<i64>,
}

impl Booker {
    /// Maintenance windows: counted against nobody.
    pub(crate) const NOBODY: Booker = Booker { user_id: 0, tenant_id: None, project_id: None };

    pub(crate) fn counts_for(&self, holder: Holder) -> bool {
        match holder {
            Holder::User(id) => self.user_id == id,
            Holder::Project(id) => self.project_id == Some(id),
            Holder::Tenant(id) => self.tenant_id == Some(id),
        }
    }
}

/// One level whose bookings add up against a quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holder {
    User(i64),
    Project(i64),
    Tenant(i64),
}

impl Holder {
    /// The `environments` column that says whose a booking is at this level, and the id.
    fn column(self) -> (&'static str, i64) {
        match self {
            Holder::User(id) => ("owner_id", id),
            Holder::Project(id) => ("project_id", id),
            Holder::Tenant(id) => ("tenant_id", id),
        }
    }
}

/// Whose limits a quota row sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaSubject {
    /// Every user without a row of their own.
    Everyone,
    /// A tenant's bookings together.
    Tenant(i64),
    /// The bookings made in a project together.
    Project(i64),
    User(i64),
}

/// A quota row as an admin sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaRow {
    pub id: i64,
    pub subject: QuotaSubject,
    /// "Everyone (default per user)", "Tenant Acme", "Project acme/vision", an email.
    pub who: String,
    pub quota: Quota,
}

const QUOTA_COLUMNS: &str =
    "q.id, q.tenant_id, q.project_id, q.user_id, q.max_gpus, q.max_gpus_by_model, q.gpu_hours_per_month,
     q.max_booking_hours, q.max_overlapping, q.allow_spot";

impl Platform {
    /// The limits of `user_id` as a user: their own row, else everyone's default, else none.
    pub async fn quota_of(&self, user_id: i64) -> Result<Quota, Error> {
        let mut conn = self.db.acquire().await?;
        let booker = Booker { user_id, tenant_id: None, project_id: None };
        let levels = quota_levels(&mut conn, booker).await?;
        Ok(levels.into_iter().find(|l| l.scope == QuotaScope::User).map(|l| l.quota).unwrap_or_default())
    }

    /// The quota rows in the caller's reach: all of them for platform staff; everyone's
    /// default and their tenant's, its projects' and its members' rows for the others.
    /// Everyone's default first, then tenants, projects and users.
    pub async fn quotas(&self, caller: &Caller) -> Result<Vec<QuotaRow>, Error> {
        self.authorize_in_tenant(caller, Action::QuotaRead).await?;
        let scope = Scope::of(caller, Action::QuotaRead).ok_or(Error::Forbidden)?;
        let rows = sqlx::query(&format!(
            "SELECT {QUOTA_COLUMNS}, t.name AS tenant_name, pt.slug AS project_tenant, p.name AS project_name, u.email
             FROM quotas q
             LEFT JOIN tenants t ON t.id = q.tenant_id
             LEFT JOIN projects p ON p.id = q.project_id LEFT JOIN tenants pt ON pt.id = p.tenant_id
             LEFT JOIN users u ON u.id = q.user_id
             WHERE ?1 OR coalesce(q.tenant_id, p.tenant_id, u.tenant_id) = ?2
                OR (q.tenant_id IS NULL AND q.project_id IS NULL AND q.user_id IS NULL)
             ORDER BY q.user_id IS NOT NULL OR q.project_id IS NOT NULL OR q.tenant_id IS NOT NULL,
                      q.tenant_id IS NULL, q.project_id IS NULL, t.name, pt.slug, p.name, u.email"
        ))
        .bind(scope.all)
        .bind(scope.tenant_id)
        .fetch_all(&self.db)
        .await?;
        rows.iter()
            .map(|row| {
                let subject = subject_from_row(row)?;
                let who = match subject {
                    QuotaSubject::Everyone => "Everyone (default per user)".to_owned(),
                    QuotaSubject::Tenant(_) => format!("Tenant {}", row.try_get::<String, _>("tenant_name")?),
                    QuotaSubject::Project(_) => format!(
                        "Project {}/{}",
                        row.try_get::<String, _>("project_tenant")?,
                        row.try_get::<String, _>("project_name")?
                    ),
                    QuotaSubject::User(_) => row.try_get("email")?,
                };
                Ok(QuotaRow { id: row.try_get("id")?, subject, who, quota: quota_from_row(row)? })
            })
            .collect()
    }

    /// Sets a quota named as in the admin form: `level` is `everyone`, `tenant` (by slug),
    /// `project` (`tenant-slug/name`, or just the name in the caller's tenant) or `user`
    /// (by email). Someone out of reach is answered like someone who does not exist.
    /// Answers the row's id.
    pub async fn set_quota_for(&self, caller: &Caller, level: &str, who: &str, quota: &Quota) -> Result<i64, Error> {
        let who = who.trim();
        let not_found = |what: &str| Error::Refused(Refusal::InvalidQuota(format!("there is no {what} \"{who}\"")));
        let found: Option<QuotaSubject> = match level.trim() {
            "" | "everyone" => Some(QuotaSubject::Everyone),
            "tenant" => sqlx::query_scalar("SELECT id FROM tenants WHERE slug = ? AND status != 'deleted'")
                .bind(who)
                .fetch_optional(&self.db)
                .await?
                .map(QuotaSubject::Tenant),
            "project" => {
                let (slug, name) = match who.split_once('/') {
                    Some((slug, name)) => (Some(slug.trim()), name.trim()),
                    None => (None, who),
                };
                sqlx::query_scalar(
                    "SELECT p.id FROM projects p JOIN tenants t ON t.id = p.tenant_id
                     WHERE p.name = ? AND (t.slug = ? OR (? IS NULL AND t.id = ?))",
                )
                .bind(name)
                .bind(slug)
                .bind(slug)
                .bind(caller.tenant_id())
                .fetch_optional(&self.db)
                .await?
                .map(QuotaSubject::Project)
            }
            "user" => sqlx::query_scalar("SELECT id FROM users WHERE email = ?")
                .bind(who)
                .fetch_optional(&self.db)
                .await?
                .map(QuotaSubject::User),
            other => {
                return Err(Refusal::InvalidQuota(format!(
                    "\"{other}\" is not a quota level; choose everyone, tenant, project or user"
                ))
                .into());
            }
        };
        let what = if level.trim() == "user" { "user with the email" } else { level.trim() };
        let subject = found.ok_or_else(|| not_found(what))?;
        match self.set_quota(caller, subject, quota).await {
            Err(Error::Forbidden | Error::NotFound) if subject != QuotaSubject::Everyone => Err(not_found(what)),
            other => other,
        }
    }

    /// Sets the limits of `subject`, replacing its row. Everyone's default and tenants'
    /// limits are the platform's to set; tenant admins set their projects' and members'.
    /// Answers the row's id.
    pub async fn set_quota(&self, caller: &Caller, subject: QuotaSubject, quota: &Quota) -> Result<i64, Error> {
        let target = self.quota_target(subject).await?;
        self.authorize(caller, Action::QuotaManage, target).await?;
        let (tenant_id, project_id, user_id) = subject_columns(subject);
        let by_model = serde_json::to_string(&quota.max_gpus_by_model).map_err(Error::internal)?;
        let mut tx = self.begin_write().await?;
        sqlx::query("DELETE FROM quotas WHERE tenant_id IS ? AND project_id IS ? AND user_id IS ?")
            .bind(tenant_id)
            .bind(project_id)
            .bind(user_id)
            .execute(&mut *tx)
            .await?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO quotas (tenant_id, project_id, user_id, max_gpus, max_gpus_by_model, gpu_hours_per_month,
                 max_booking_hours, max_overlapping, allow_spot, updated_at)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
        )
        .bind(tenant_id)
        .bind(project_id)
        .bind(user_id)
        .bind(quota.max_gpus)
        .bind(by_model)
        .bind(quota.gpu_hours_per_month)
        .bind(quota.max_booking_hours)
        .bind(quota.max_overlapping)
        .bind(quota.allow_spot)
        .bind(now_ms())
        .fetch_one(&mut *tx)
        .await?;
        let target = subject_label(subject);
        let detail = format!("{quota:?}");
        let event =
            Event { action: "quota.set", target: Some(&target), outcome: Outcome::Success, detail: Some(&detail) };
        audit::record(&mut tx, &caller.actor(), event).await?;
        follow_quota(&mut tx, subject).await?;
        tx.commit().await?;
        self.wake_reconciler();
        Ok(id)
    }

    /// Removes a quota row: the user falls back to everyone's default, a project or
    /// tenant is no longer limited as a whole.
    pub async fn remove_quota(&self, caller: &Caller, id: i64) -> Result<(), Error> {
        self.authorize_in_tenant(caller, Action::QuotaManage).await?;
        let row = sqlx::query(&format!("SELECT {QUOTA_COLUMNS} FROM quotas q WHERE q.id = ?"))
            .bind(id)
            .fetch_optional(&self.db)
            .await?
            .ok_or(Error::NotFound)?;
        let subject = subject_from_row(&row)?;
        let target = self.quota_target(subject).await?;
        // Rows out of the caller's reach look missing.
        if self.authorize(caller, Action::QuotaManage, target).await.is_err() {
            return Err(Error::NotFound);
        }
        let mut tx = self.begin_write().await?;
        sqlx::query("DELETE FROM quotas WHERE id = ?").bind(id).execute(&mut *tx).await?;
        let target = subject_label(subject);
        let event = Event { action: "quota.remove", target: Some(&target), outcome: Outcome::Success, detail: None };
        audit::record(&mut tx, &caller.actor(), event).await?;
        follow_quota(&mut tx, subject).await?;
        tx.commit().await?;
        self.wake_reconciler();
        Ok(())
    }

    /// What a quota row of `subject` belongs to, for the policy.
    async fn quota_target(&self, subject: QuotaSubject) -> Result<Target, Error> {
        let tenant: Option<i64> = match subject {
            QuotaSubject::Everyone | QuotaSubject::Tenant(_) => None,
            QuotaSubject::Project(id) => sqlx::query_scalar("SELECT tenant_id FROM projects WHERE id = ?")
                .bind(id)
                .fetch_optional(&self.db)
                .await?
                .ok_or(Error::NotFound)?,
            QuotaSubject::User(id) => sqlx::query_scalar("SELECT tenant_id FROM users WHERE id = ?")
                .bind(id)
                .fetch_optional(&self.db)
                .await?
                .ok_or(Error::NotFound)?,
        };
        Ok(tenant.map_or(Target::Platform, Target::Tenant))
    }

    /// Refuses a booking that would pass any quota it counts against: the owner's own (or
    /// everyone's default), the project's and the tenant's. Spot bookings go beyond the
    /// GPU limits when the tenant's quota allows it (the owner's own quota, for users of a
    /// tenant without one). `except` leaves out an environment being changed.
    pub(crate) async fn check_quota(
        &self,
        conn: &mut SqliteConnection,
        booker: Booker,
        ask: QuotaAsk,
        except: Option<&str>,
    ) -> Result<(), Error> {
        let levels = quota_levels(conn, booker).await?;
        if levels.iter().all(|l| l.quota.is_unlimited()) {
            return Ok(());
        }
        if ask.tier == Tier::Spot {
            let decides = |h: fn(&Holder) -> bool| levels.iter().find(|l| h(&l.holder));
            let decider =
                decides(|h| matches!(h, Holder::Tenant(_))).or_else(|| decides(|h| matches!(h, Holder::User(_))));
            if !decider.is_some_and(|l| l.quota.allow_spot) {
                return Err(Refusal::SpotNotAllowed.into());
            }
        }
        for level in levels.iter().filter(|l| !l.quota.is_unlimited()) {
            let usage = self.usage(conn, level.holder, ask, except).await?;
            booking::check_quota(&level.quota, &level.scope, &usage, ask.model, ask.window, ask.gpus, ask.tier)?;
        }
        Ok(())
    }

    /// What `holder` already has during and around the asked window.
    async fn usage(
        &self,
        conn: &mut SqliteConnection,
        holder: Holder,
        ask: QuotaAsk,
        except: Option<&str>,
    ) -> Result<Usage, Error> {
        let QuotaAsk { model, window, .. } = ask;
        let now = now_ms();
        self.load_book(conn).await?;
        let gpus = self.gpus_of_model(conn, model).await?;
        let mut by_env: BTreeMap<Arc<str>, (Window, Vec<Hold>)> = BTreeMap::new();
        // Spot bookings are beyond the quota: they do not use it up.
        for b in self.book_bookings(gpus.gpus(), now, Some(holder), Some(window)).into_iter().filter(|b| !b.spot) {
            if Some(&*b.environment_id) != except {
                by_env.entry(b.environment_id).or_insert((b.booking.window, Vec::new())).1.push(b.booking.hold);
            }
        }
        let same_model = by_env.values().map(|(w, holds)| (*w, booking::gpu_equivalents(holds))).collect();
        let (column, id) = holder.column();
        let overlapping: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM environments WHERE {column} = ? AND state NOT IN ('released', 'failed')
               AND desired = 'running' AND starts_at < ? AND ends_at > ? AND id IS NOT ?"
        ))
        .bind(id)
        .bind(window.ends_at)
        .bind(window.starts_at)
        .bind(except)
        .fetch_one(&mut *conn)
        .await?;
        let gpu_hours_this_month = gpu_hours_in_month(conn, holder, window.starts_at, except).await?;
        Ok(Usage { same_model, overlapping: u32::try_from(overlapping).unwrap_or(u32::MAX), gpu_hours_this_month })
    }
}

/// Tenant `tenant_id`'s own quota row, if it has one.
pub(crate) async fn tenant_quota(conn: &mut SqliteConnection, tenant_id: i64) -> Result<Option<Quota>, Error> {
    let row = sqlx::query(&format!("SELECT {QUOTA_COLUMNS} FROM quotas q WHERE q.tenant_id = ?"))
        .bind(tenant_id)
        .fetch_optional(&mut *conn)
        .await?;
    row.as_ref().map(quota_from_row).transpose()
}

/// One quota that applies to a booking.
struct QuotaLevel {
    holder: Holder,
    scope: QuotaScope,
    quota: Quota,
}

/// The quotas a booking by `booker` must fit: the owner's own row or everyone's default,
/// the project's and the tenant's rows where they exist.
async fn quota_levels(conn: &mut SqliteConnection, booker: Booker) -> Result<Vec<QuotaLevel>, Error> {
    let rows = sqlx::query(&format!(
        "SELECT {QUOTA_COLUMNS}, t.name AS tenant_name, p.name AS project_name FROM quotas q
         LEFT JOIN tenants t ON t.id = q.tenant_id LEFT JOIN projects p ON p.id = q.project_id
         WHERE q.user_id = ?1 OR q.project_id = ?2 OR q.tenant_id = ?3
            OR (q.tenant_id IS NULL AND q.project_id IS NULL AND q.user_id IS NULL)
         ORDER BY q.user_id IS NULL"
    ))
    .bind(booker.user_id)
    .bind(booker.project_id)
    .bind(booker.tenant_id)
    .fetch_all(&mut *conn)
    .await?;
    let mut levels = Vec::new();
    let mut own_found = false;
    for row in &rows {
        let (holder, scope) = match subject_from_row(row)? {
            // The user's own row sorts first and replaces everyone's default.
            QuotaSubject::User(_) | QuotaSubject::Everyone if own_found => continue,
            QuotaSubject::User(_) | QuotaSubject::Everyone => {
                own_found = true;
                (Holder::User(booker.user_id), QuotaScope::User)
            }
            QuotaSubject::Project(id) => (Holder::Project(id), QuotaScope::Project(row.try_get("project_name")?)),
            QuotaSubject::Tenant(id) => (Holder::Tenant(id), QuotaScope::Tenant(row.try_get("tenant_name")?)),
        };
        levels.push(QuotaLevel { holder, scope, quota: quota_from_row(row)? });
    }
    Ok(levels)
}

fn subject_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<QuotaSubject, Error> {
    let tenant: Option<i64> = row.try_get("tenant_id")?;
    let project: Option<i64> = row.try_get("project_id")?;
    let user: Option<i64> = row.try_get("user_id")?;
    Ok(match (tenant, project, user) {
        (Some(id), _, _) => QuotaSubject::Tenant(id),
        (_, Some(id), _) => QuotaSubject::Project(id),
        (_, _, Some(id)) => QuotaSubject::User(id),
        _ => QuotaSubject::Everyone,
    })
}

/// The row's `(tenant_id, project_id, user_id)`.
fn subject_columns(subject: QuotaSubject) -> (Option<i64>, Option<i64>, Option<i64>) {
    match subject {
        QuotaSubject::Everyone => (None, None, None),
        QuotaSubject::Tenant(id) => (Some(id), None, None),
        QuotaSubject::Project(id) => (None, Some(id), None),
        QuotaSubject::User(id) => (None, None, Some(id)),
    }
}

/// How the audit log names a quota row.
fn subject_label(subject: QuotaSubject) -> String {
    match subject {
        QuotaSubject::Everyone => "default".to_owned(),
        QuotaSubject::Tenant(id) => format!("tenant:{id}"),
        QuotaSubject::Project(id) => format!("project:{id}"),
        QuotaSubject::User(id) => format!("user:{id}"),
    }
}

/// A `quotas` row's limit columns, by name.
fn quota_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<Quota, Error> {
    let hours: Option<i64> = row.try_get("max_booking_hours")?;
    let overlapping: Option<i64> = row.try_get("max_overlapping")?;
    let by_model: String = row.try_get("max_gpus_by_model")?;
    Ok(Quota {
        max_gpus: row.try_get("max_gpus")?,
        max_gpus_by_model: serde_json::from_str(&by_model).map_err(Error::internal)?,
        gpu_hours_per_month: row.try_get("gpu_hours_per_month")?,
        max_booking_hours: hours.and_then(|h| u32::try_from(h).ok()),
        max_overlapping: overlapping.and_then(|n| u32::try_from(n).ok()),
        allow_spot: row.try_get("allow_spot")?,
    })
}

/// GPU-equivalent hours of `holder`'s bookings inside the UTC calendar month of `at`
/// (the parts of windows that fall in it); failed and stopped bookings count for the time
/// they held capacity.
async fn gpu_hours_in_month(
    conn: &mut SqliteConnection,
    holder: Holder,
    at: i64,
    except: Option<&str>,
) -> Result<f64, Error> {
    use chrono::Datelike;
    let Some(t) = chrono::DateTime::from_timestamp_millis(at) else { return Ok(0.0) };
    let first = t.date_naive().with_day(1).and_then(|d| d.and_hms_opt(0, 0, 0)).map(|d| d.and_utc());
    let next = first.and_then(|f| f.checked_add_months(chrono::Months::new(1)));
    let (Some(first), Some(next)) = (first, next) else { return Ok(0.0) };
    let (month_start, month_end) = (first.timestamp_millis(), next.timestamp_millis());
    let (column, id) = holder.column();
    let rows: Vec<(i64, i64, Option<String>, i64)> = sqlx::query_as(&format!(
        "SELECT max(r.starts_at, ?1), min(coalesce(r.released_at, r.ends_at), r.ends_at, ?2), r.mig_profile, r.slice_size
         FROM reservations r JOIN environments e ON e.id = r.environment_id
         WHERE e.{column} = ?3 AND r.starts_at < ?2 AND coalesce(r.released_at, r.ends_at) > ?1 AND e.id IS NOT ?4"
    ))
    .bind(month_start)
    .bind(month_end)
    .bind(id)
    .bind(except)
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(from, to, profile, slice_size)| {
            let hold = Hold {
                gpu_id: 0,
                slices: SliceRange { start: 0, size: u8::try_from(slice_size).unwrap_or(MEMORY_SLICES) },
                profile: profile.as_deref().and_then(MigProfile::from_key),
            };
            hold.gpu_equivalents() * (to - from).max(0) as f64 / booking::HOUR_MS as f64
        })
        .sum())
}

// A tenant's queue on the backend mirrors its quota (see `tenant_queues`). Whatever it must
// follow raises the tenant's `queue_version` in the transaction of that change; the
// reconciler applies the queue after the commit.

/// The queue of a tenant whose quota changed must follow; a quota of anyone else
/// (everyone's default, a project's, a user's) leaves tenants' queues as they are.
pub(crate) async fn follow_quota(conn: &mut SqliteConnection, subject: QuotaSubject) -> Result<(), Error> {
    if let QuotaSubject::Tenant(id) = subject {
        follow(conn, Some(id)).await?;
    }
    Ok(())
}

/// Marks the queue of tenant `id` (of every tenant not deleted, for `None`) as having to
/// follow a change; the reconciler applies it after the commit.
pub(crate) async fn follow(conn: &mut SqliteConnection, id: Option<i64>) -> Result<(), Error> {
    sqlx::query(
        "UPDATE tenants SET queue_version = queue_version + 1 WHERE (?1 IS NULL AND status <> 'deleted') OR id = ?1",
    )
    .bind(id)
    .execute(conn)
    .await?;
    Ok(())
}

/// Marks the space of environment `environment_id`'s tenant as having to follow what the
/// environment holds (it started, was scaled, or released its capacity), when the
/// environment shares its tenant's space (see `berth_domain::tenancy::shares_tenant_space`).
pub(crate) async fn follow_holdings(conn: &mut SqliteConnection, environment_id: &str) -> Result<(), Error> {
    sqlx::query(
        "UPDATE tenants SET queue_version = queue_version + 1
         WHERE isolation = 'soft' AND id = (SELECT tenant_id FROM environments WHERE id = ?1 AND offering <> 'cluster')",
    )
    .bind(environment_id)
    .execute(conn)
    .await?;
    Ok(())
}
