//! Volumes as records: storage that outlives a booking, its storage quotas, and its
//! attachments to environments. A volume is attached in the launch's own write
//! transaction (`attach_for_launch`, called by `decide_launch`) and detached when the
//! environment releases its capacity (`detach_all`, called by the reconciler). The
//! backend's side (making the storage, measuring it, removing a deleted volume's) is
//! `provisioning::volume_storage`, which acts on what these rows say.

use berth_domain::Refusal;
use berth_domain::catalog::Offering;
use berth_domain::placement::Occupant;
use berth_domain::policy::{Action, Role, Target};
use berth_domain::volume::{self, BookingFacts, StorageLimit, VolumeFacts, VolumeScope};
use serde::{Deserialize, Serialize};
use sqlx::SqliteConnection;

use crate::access::Scope;
use crate::audit::{self, Event, Outcome};
use crate::{Caller, Error, Platform, now_ms};

/// One volume as its page and the API show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Volume {
    pub id: i64,
    pub tenant_id: Option<i64>,
    pub project_id: Option<i64>,
    /// The project's name for a shared volume.
    pub project: Option<String>,
    pub owner_id: i64,
    pub owner_email: String,
    pub name: String,
    pub is_home: bool,
    pub size_gib: u32,
    /// Where the backend keeps it, once it was first attached.
    pub location: Option<String>,
    /// Bytes in use as last measured; `None` where the backend cannot measure it (or has
    /// not yet: on Kubernetes, until a running pod mounts its claim).
    pub used_bytes: Option<i64>,
    /// When `used_bytes` was measured (ms). On Kubernetes a volume no running pod mounts is
    /// not measured, so its figure may be older than the last sweep.
    pub measured_at: Option<i64>,
    pub mount_path: String,
    pub created_at: i64,
    /// The environments it is attached to now.
    pub attachments: Vec<Attachment>,
}

/// A volume attached to an environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Attachment {
    pub volume_id: i64,
    pub volume_name: String,
    pub environment_id: String,
    pub environment_name: String,
    pub mount_path: String,
    pub attached_at: i64,
    pub detached_at: Option<i64>,
}

/// What the create form and the API send, as typed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRequest {
    pub name: String,
    /// Whole GiB.
    pub size_gib: String,
    /// The id of the project to share it with; empty for a personal volume.
    #[serde(default)]
    pub project: String,
}

/// A storage limit row as an admin sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StorageQuotaRow {
    pub id: i64,
    /// "Tenant Acme", "Project acme/vision".
    pub who: String,
    pub max_gib: Option<i64>,
    /// In use by its live volumes.
    pub used_gib: i64,
    /// Tenants only: the size of their people's home volumes.
    pub home_gib: Option<i64>,
}

/// A `storage_quotas` row with the names of whom it limits.
#[derive(sqlx::FromRow)]
struct StorageQuotaDbRow {
    id: i64,
    tenant_id: Option<i64>,
    project_id: Option<i64>,
    max_gib: Option<i64>,
    home_gib: Option<i64>,
    tenant: Option<String>,
    project_tenant: Option<String>,
    project: Option<String>,
}

/// What a backend is told of a volume attached to its workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeMount {
    pub volume_id: i64,
    pub name: String,
    pub size_gib: u32,
    pub mount_path: String,
    /// A shared volume's project id (a personal volume's is `None`).
    pub project_id: Option<i64>,
    pub owner_id: i64,
}

impl VolumeMount {
    /// The name the backend keeps it under, the same on every backend: never the volume's
    /// own name, which another scope may reuse once this one is deleted.
    pub fn storage_name(&self) -> String {
        storage_name(self.volume_id)
    }
}

/// `berth-vol-<id>`: a volume's name on a backend.
pub fn storage_name(volume_id: i64) -> String {
    format!("berth-vol-{volume_id}")
}

const VOLUME_COLUMNS: &str = "v.id, v.tenant_id, v.project_id, p.name AS project, v.owner_id, u.email AS owner_email,
     v.name, v.is_home, v.size_gib, v.location, v.used_bytes, v.measured_at, v.created_at";
const VOLUME_TABLES: &str = "volumes v JOIN users u ON u.id = v.owner_id LEFT JOIN projects p ON p.id = v.project_id";

#[derive(sqlx::FromRow)]
struct VolumeRow {
    id: i64,
    tenant_id: Option<i64>,
    project_id: Option<i64>,
    project: Option<String>,
    owner_id: i64,
    owner_email: String,
    name: String,
    is_home: bool,
    size_gib: i64,
    location: Option<String>,
    used_bytes: Option<i64>,
    measured_at: Option<i64>,
    created_at: i64,
}

impl VolumeRow {
    fn into_volume(self, attachments: Vec<Attachment>) -> Volume {
        Volume {
            mount_path: volume::mount_path(&self.name, self.is_home),
            id: self.id,
            tenant_id: self.tenant_id,
            project_id: self.project_id,
            project: self.project,
            owner_id: self.owner_id,
            owner_email: self.owner_email,
            name: self.name,
            is_home: self.is_home,
            size_gib: u32::try_from(self.size_gib).unwrap_or(u32::MAX),
            location: self.location,
            used_bytes: self.used_bytes,
            measured_at: self.measured_at,
            created_at: self.created_at,
            attachments,
        }
    }

    fn facts(&self) -> VolumeFacts {
        VolumeFacts {
            name: self.name.clone(),
            tenant_id: self.tenant_id,
            owner_id: self.owner_id,
            scope: self.project_id.map_or(VolumeScope::Personal, VolumeScope::Project),
            is_home: self.is_home,
        }
    }
}

/// A live volume `v` the caller reaches for a read: (1) everything, (2) their tenant, (3)
/// their user id, own volumes and their projects' alike.
const IN_REACH: &str = "(?1 OR v.tenant_id = ?2 OR v.owner_id = ?3
    OR (v.project_id IS NOT NULL AND v.tenant_id IS ?4
        AND EXISTS (SELECT 1 FROM project_members m WHERE m.project_id = v.project_id AND m.user_id = ?3)))";

impl Platform {
    /// The live volumes in the caller's reach: a member's own and their projects', a
    /// tenant admin's or viewer's whole tenant, everything for platform staff.
    pub async fn volumes(&self, caller: &Caller) -> Result<Vec<Volume>, Error> {
        self.authorize_in_tenant(caller, Action::VolumeRead).await?;
        let scope = Scope::of(caller, Action::VolumeRead).ok_or(Error::Forbidden)?;
        let mut conn = self.db.acquire().await?;
        let rows: Vec<VolumeRow> = sqlx::query_as(&format!(
            "SELECT {VOLUME_COLUMNS} FROM {VOLUME_TABLES} WHERE v.deleted_at IS NULL AND {IN_REACH}
             ORDER BY v.is_home DESC, v.project_id IS NOT NULL, p.name, v.name, u.email"
        ))
        .bind(scope.all)
        .bind(scope.tenant_id)
        .bind(caller.user_id())
        .bind(caller.tenant_id())
        .fetch_all(&mut *conn)
        .await?;
        let mut volumes = Vec::with_capacity(rows.len());
        for row in rows {
            let attachments = attachments_of(&mut conn, row.id).await?;
            volumes.push(row.into_volume(attachments));
        }
        Ok(volumes)
    }

    /// One live volume in the caller's reach.
    pub async fn volume(&self, caller: &Caller, id: i64) -> Result<Volume, Error> {
        let mut conn = self.db.acquire().await?;
        let row = self.volume_for(&mut conn, caller, id, Action::VolumeRead).await?;
        let attachments = attachments_of(&mut conn, id).await?;
        Ok(row.into_volume(attachments))
    }

    /// Makes a volume: personal, or shared with a project the caller may book in. Its GiB
    /// count against the tenant's storage quota (and the project's); a refusal says whose
    /// limit and what is left. The storage itself is made when it is first attached.
    pub async fn create_volume(&self, caller: &Caller, request: &VolumeRequest) -> Result<Volume, Error> {
        self.authorize_in_tenant(caller, Action::VolumeManage).await?;
        let name = volume::validate_name(&request.name)?;
        let size_gib = volume::parse_size(&request.size_gib)?;
        let mut tx = self.begin_write().await?;
        let project_id = self.project_to_book_in(&mut tx, caller, &request.project).await?;
        if let Some(tenant_id) = caller.tenant_id() {
            crate::capacity::environments::ensure_tenant_active(&mut tx, tenant_id).await?;
        }
        let taken: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM volumes WHERE deleted_at IS NULL AND name = ?1
                 AND ((?2 IS NOT NULL AND project_id = ?2) OR (?2 IS NULL AND project_id IS NULL AND owner_id = ?3)))",
        )
        .bind(&name)
        .bind(project_id)
        .bind(caller.user_id())
        .fetch_one(&mut *tx)
        .await?;
        if taken {
            return Err(Refusal::VolumeNameInUse(name).into());
        }
        check_storage(&mut tx, caller.tenant_id(), project_id, u64::from(size_gib)).await?;
        let now = now_ms();
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO volumes (tenant_id, project_id, owner_id, name, size_gib, created_at)
             VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
        )
        .bind(caller.tenant_id())
        .bind(project_id)
        .bind(caller.user_id())
        .bind(&name)
        .bind(i64::from(size_gib))
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        let target = format!("volume:{id}");
        let detail = match project_id {
            Some(project) => format!("{name}, {size_gib} GiB, shared with project {project}"),
            None => format!("{name}, {size_gib} GiB, personal"),
        };
        let event =
            Event { action: "volume.create", target: Some(&target), outcome: Outcome::Success, detail: Some(&detail) };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        self.volume(caller, id).await
    }

    /// Grows a volume within its storage quotas. The backend follows at the next attach
    /// (a Kubernetes claim is applied with the new size).
    pub async fn resize_volume(&self, caller: &Caller, id: i64, size_gib: &str) -> Result<Volume, Error> {
        let row = self.volume_to_change(caller, id).await?;
        let mut tx = self.begin_write().await?;
        // Read again under the turn: a resize or delete in between counts.
        let current: i64 = sqlx::query_scalar("SELECT size_gib FROM volumes WHERE id = ? AND deleted_at IS NULL")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(Error::NotFound)?;
        let current = u32::try_from(current).unwrap_or(u32::MAX);
        let size = volume::check_resize(current, size_gib)?;
        check_storage(&mut tx, row.tenant_id, row.project_id, u64::from(size - current)).await?;
        sqlx::query("UPDATE volumes SET size_gib = ? WHERE id = ?")
            .bind(i64::from(size))
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let target = format!("volume:{id}");
        let detail = format!("{} from {current} GiB to {size} GiB", row.name);
        let event =
            Event { action: "volume.resize", target: Some(&target), outcome: Outcome::Success, detail: Some(&detail) };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        self.volume(caller, id).await
    }

    /// Deletes a volume nothing has attached (the database refuses it otherwise too); the
    /// backend's storage goes after it (`provisioning::volume_storage`).
    pub async fn delete_volume(&self, caller: &Caller, id: i64) -> Result<(), Error> {
        let row = self.volume_to_change(caller, id).await?;
        let mut tx = self.begin_write().await?;
        let attached: Option<String> = sqlx::query_scalar(
            "SELECT e.name FROM volume_attachments a JOIN environments e ON e.id = a.environment_id
             WHERE a.volume_id = ? AND a.detached_at IS NULL ORDER BY a.attached_at LIMIT 1",
        )
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(environment) = attached {
            return Err(Refusal::VolumeAttached { name: row.name, environment }.into());
        }
        let deleted = sqlx::query("UPDATE volumes SET deleted_at = ? WHERE id = ? AND deleted_at IS NULL")
            .bind(now_ms())
            .bind(id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if deleted == 0 {
            return Err(Error::NotFound);
        }
        let target = format!("volume:{id}");
        let detail = format!("{}, {} GiB", row.name, row.size_gib);
        let event =
            Event { action: "volume.delete", target: Some(&target), outcome: Outcome::Success, detail: Some(&detail) };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        self.wake_reconciler();
        Ok(())
    }

    /// The volumes an environment has (and had) attached.
    pub async fn environment_volumes(&self, caller: &Caller, environment_id: &str) -> Result<Vec<Attachment>, Error> {
        self.environment_of(caller, environment_id).await?;
        let mut conn = self.db.acquire().await?;
        attachments_of_environment(&mut conn, environment_id).await
    }

    /// The volumes the caller may attach, for the launch form: their home (even before it
    /// exists: its size is the tenant's setting), their own personal volumes, and the
    /// volumes of every project they may book in (each attachable to a booking in its
    /// project only).
    pub async fn attachable_volumes(&self, caller: &Caller) -> Result<Vec<Volume>, Error> {
        // Like `projects_to_book_in`: the launch form asks on every visit; a role that may
        // not launch gets none, and no denial in the audit log.
        if !crate::access::may_in_tenant(caller, Action::EnvironmentLaunch) {
            return Ok(Vec::new());
        }
        let mut conn = self.db.acquire().await?;
        let rows: Vec<VolumeRow> = sqlx::query_as(&format!(
            "SELECT {VOLUME_COLUMNS} FROM {VOLUME_TABLES}
             WHERE v.deleted_at IS NULL AND v.tenant_id IS ?1
               AND ((v.project_id IS NULL AND v.owner_id = ?2)
                    OR v.project_id IN (SELECT p.id FROM projects p WHERE p.tenant_id = ?1
                        AND (?3 OR EXISTS (SELECT 1 FROM project_members m WHERE m.project_id = p.id AND m.user_id = ?2))))
             ORDER BY v.is_home DESC, v.project_id IS NOT NULL, p.name, v.name"
        ))
        .bind(caller.tenant_id())
        .bind(caller.user_id())
        .bind(caller.principal.role == Role::TenantAdmin)
        .fetch_all(&mut *conn)
        .await?;
        let mut volumes = Vec::with_capacity(rows.len() + 1);
        for row in rows {
            let attachments = attachments_of(&mut conn, row.id).await?;
            volumes.push(row.into_volume(attachments));
        }
        if !volumes.iter().any(|v| v.is_home) {
            let size_gib = home_gib(&mut conn, caller.tenant_id()).await?;
            volumes.insert(
                0,
                Volume {
                    id: 0,
                    tenant_id: caller.tenant_id(),
                    project_id: None,
                    project: None,
                    owner_id: caller.user_id(),
                    owner_email: String::new(),
                    name: volume::HOME_NAME.to_owned(),
                    is_home: true,
                    size_gib,
                    location: None,
                    used_bytes: None,
                    measured_at: None,
                    mount_path: volume::HOME_MOUNT.to_owned(),
                    created_at: 0,
                    attachments: Vec::new(),
                },
            );
        }
        Ok(volumes)
    }

    /// Storage limits in the caller's reach (as for GPU quotas), with what is in use.
    pub async fn storage_quotas(&self, caller: &Caller) -> Result<Vec<StorageQuotaRow>, Error> {
        self.authorize_in_tenant(caller, Action::QuotaRead).await?;
        let scope = Scope::of(caller, Action::QuotaRead).ok_or(Error::Forbidden)?;
        let rows: Vec<StorageQuotaDbRow> = sqlx::query_as(
            "SELECT q.id, q.tenant_id, q.project_id, q.max_gib, q.home_gib, t.name AS tenant, pt.slug AS project_tenant,
                    p.name AS project
             FROM storage_quotas q
             LEFT JOIN tenants t ON t.id = q.tenant_id
             LEFT JOIN projects p ON p.id = q.project_id LEFT JOIN tenants pt ON pt.id = p.tenant_id
             WHERE ?1 OR coalesce(q.tenant_id, p.tenant_id) = ?2
             ORDER BY q.tenant_id IS NULL, t.name, pt.slug, p.name",
        )
        .bind(scope.all)
        .bind(scope.tenant_id)
        .fetch_all(&self.db)
        .await?;
        let mut conn = self.db.acquire().await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let StorageQuotaDbRow { id, tenant_id, project_id, max_gib, home_gib, tenant, project_tenant, project } =
                row;
            let (who, used) = match (tenant_id, project_id) {
                (Some(t), _) => {
                    (format!("Tenant {}", tenant.unwrap_or_default()), used_gib(&mut conn, "tenant_id", t).await?)
                }
                (_, Some(p)) => (
                    format!("Project {}/{}", project_tenant.unwrap_or_default(), project.unwrap_or_default()),
                    used_gib(&mut conn, "project_id", p).await?,
                ),
                _ => continue,
            };
            out.push(StorageQuotaRow { id, who, max_gib, used_gib: i64::try_from(used).unwrap_or(i64::MAX), home_gib });
        }
        Ok(out)
    }

    /// Sets a storage limit: `level` is `tenant` (by slug; the platform's to set, like a
    /// tenant's GPU quota) or `project` (`tenant-slug/name`, or the name in the caller's
    /// tenant). `max_gib` empty is no limit; `home_gib` (tenants only) empty is the default.
    pub async fn set_storage_quota(
        &self,
        caller: &Caller,
        level: &str,
        who: &str,
        max_gib: &str,
        home_gib: &str,
    ) -> Result<(), Error> {
        let who = who.trim();
        let invalid = |text: String| Error::Refused(Refusal::InvalidQuota(text));
        let number = |text: &str, what: &str, least: i64| -> Result<Option<i64>, Error> {
            match text.trim() {
                "" => Ok(None),
                t => t
                    .parse::<i64>()
                    .ok()
                    .filter(|&n| n >= least && n <= i64::from(volume::MAX_VOLUME_GIB) * 1024)
                    .map(Some)
                    .ok_or_else(|| invalid(format!("{what} must be a whole number of GiB, {least} or more, or empty"))),
            }
        };
        let max_gib = number(max_gib, "storage", 0)?;
        let home = number(home_gib, "home volume size", 1)?;
        if home.is_some_and(|h| h > i64::from(volume::MAX_VOLUME_GIB)) {
            return Err(invalid(format!("home volume size must be at most {} GiB", volume::MAX_VOLUME_GIB)));
        }
        let (tenant_id, project_id, target) = match level.trim() {
            "tenant" => {
                let id: Option<i64> =
                    sqlx::query_scalar("SELECT id FROM tenants WHERE slug = ? AND status != 'deleted'")
                        .bind(who)
                        .fetch_optional(&self.db)
                        .await?;
                let id = id.ok_or_else(|| invalid(format!("there is no tenant \"{who}\"")))?;
                (Some(id), None, Target::Platform)
            }
            "project" => {
                if !home_gib.trim().is_empty() {
                    return Err(invalid("a home volume size is a tenant's setting, not a project's".into()));
                }
                let (slug, name) = match who.split_once('/') {
                    Some((slug, name)) => (Some(slug.trim()), name.trim()),
                    None => (None, who),
                };
                let found: Option<(i64, i64)> = sqlx::query_as(
                    "SELECT p.id, p.tenant_id FROM projects p JOIN tenants t ON t.id = p.tenant_id
                     WHERE p.name = ? AND (t.slug = ? OR (? IS NULL AND t.id = ?))",
                )
                .bind(name)
                .bind(slug)
                .bind(slug)
                .bind(caller.tenant_id())
                .fetch_optional(&self.db)
                .await?;
                let (id, tenant) = found.ok_or_else(|| invalid(format!("there is no project \"{who}\"")))?;
                (None, Some(id), Target::Tenant(tenant))
            }
            other => {
                return Err(invalid(format!("\"{other}\" is not a storage quota level; choose tenant or project")));
            }
        };
        if let Err(error) = self.authorize(caller, Action::QuotaManage, target).await {
            return Err(match (error, project_id) {
                (Error::NotFound | Error::Forbidden, Some(_)) => invalid(format!("there is no project \"{who}\"")),
                (error, _) => error,
            });
        }
        let mut tx = self.begin_write().await?;
        sqlx::query("DELETE FROM storage_quotas WHERE tenant_id IS ? AND project_id IS ?")
            .bind(tenant_id)
            .bind(project_id)
            .execute(&mut *tx)
            .await?;
        if max_gib.is_some() || home.is_some() {
            sqlx::query(
                "INSERT INTO storage_quotas (tenant_id, project_id, max_gib, home_gib, updated_at) VALUES (?, ?, ?, ?, ?)",
            )
            .bind(tenant_id)
            .bind(project_id)
            .bind(max_gib)
            .bind(home)
            .bind(now_ms())
            .execute(&mut *tx)
            .await?;
        }
        let target = match (tenant_id, project_id) {
            (Some(t), _) => format!("tenant:{t}"),
            (_, p) => format!("project:{}", p.unwrap_or_default()),
        };
        let detail = format!(
            "storage {}, home volumes {}",
            max_gib.map_or("unlimited".to_owned(), |g| format!("{g} GiB")),
            home.map_or("default".to_owned(), |g| format!("{g} GiB"))
        );
        let event =
            Event { action: "quota.set", target: Some(&target), outcome: Outcome::Success, detail: Some(&detail) };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        Ok(())
    }

    /// A live volume the caller may change, checked before the writer turn (a denial is
    /// audited on a connection of its own, which must not wait for the turn).
    async fn volume_to_change(&self, caller: &Caller, id: i64) -> Result<VolumeRow, Error> {
        let mut conn = self.db.acquire().await?;
        self.volume_for(&mut conn, caller, id, Action::VolumeManage).await
    }

    /// A live volume for `action`: out of reach looks like missing. A member reaches their
    /// own volumes and those of the projects they belong to.
    async fn volume_for(
        &self,
        conn: &mut SqliteConnection,
        caller: &Caller,
        id: i64,
        action: Action,
    ) -> Result<VolumeRow, Error> {
        let row: VolumeRow = sqlx::query_as(&format!(
            "SELECT {VOLUME_COLUMNS} FROM {VOLUME_TABLES} WHERE v.id = ? AND v.deleted_at IS NULL"
        ))
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or(Error::NotFound)?;
        let target = Target::Owned { tenant_id: row.tenant_id, owner_id: row.owner_id };
        if caller.principal.authorize(action, target).is_ok() {
            return Ok(row);
        }
        // A project's members share its volumes as they share its bookings' quota.
        if let Some(project) = row.project_id
            && caller.principal.reach(action).is_some()
            && caller.principal.role == Role::Member
            && caller.tenant_id() == row.tenant_id
        {
            let member: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM project_members WHERE project_id = ? AND user_id = ?)",
            )
            .bind(project)
            .bind(caller.user_id())
            .fetch_one(&mut *conn)
            .await?;
            if member {
                return Ok(row);
            }
        }
        self.authorize(caller, action, target).await?;
        Ok(row)
    }
}

/// Attaches a launch's volumes inside its own write transaction: the owner's home volume
/// for a notebook (made now on their first launch, its size the tenant's setting), and
/// the volumes asked for, each checked by `domain::volume::may_attach`. `occupant` is who
/// the launch books as, its tenant's isolation as the launch read it.
#[allow(clippy::too_many_arguments)] // the launch's own facts, passed on as they are
pub(crate) async fn attach_for_launch(
    conn: &mut SqliteConnection,
    environment_id: &str,
    offering: Offering,
    booking: BookingFacts,
    occupant: Occupant,
    asked: &[i64],
    now: i64,
    actor: &audit::Actor<'_>,
) -> Result<(), Error> {
    let takes_volumes = matches!(offering, Offering::Notebook | Offering::TrainingJob);
    if !takes_volumes {
        if !asked.is_empty() {
            return Err(Refusal::NoVolumes(offering.title()).into());
        }
        return Ok(());
    }
    let mut rows: Vec<VolumeRow> = Vec::new();
    if offering == Offering::Notebook {
        rows.push(home_volume(conn, booking, now, actor).await?);
    }
    for &id in asked {
        let row: Option<VolumeRow> = sqlx::query_as(&format!(
            "SELECT {VOLUME_COLUMNS} FROM {VOLUME_TABLES} WHERE v.id = ? AND v.deleted_at IS NULL"
        ))
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?;
        let row = row.ok_or_else(|| Refusal::UnknownVolume(id.to_string()))?;
        volume::may_attach(&row.facts(), booking)?;
        if !rows.iter().any(|r| r.id == row.id) {
            rows.push(row);
        }
    }
    // Environments of a hard or hybrid tenant, and platform staff's, have namespaces of
    // their own on Kubernetes, where a volume is bound to one environment's claim at a
    // time (see ARCHITECTURE.md): such a volume is attached to one live environment only.
    // A second notebook starts without the home volume; a volume asked for is refused.
    let shares_space = booking.tenant_id.is_some() && !occupant.is_dedicated();
    if !shares_space {
        let mut kept = Vec::with_capacity(rows.len());
        for row in rows {
            let elsewhere: Option<String> = sqlx::query_scalar(
                "SELECT e.name FROM volume_attachments a JOIN environments e ON e.id = a.environment_id
                 WHERE a.volume_id = ? AND a.detached_at IS NULL LIMIT 1",
            )
            .bind(row.id)
            .fetch_optional(&mut *conn)
            .await?;
            match elsewhere {
                None => kept.push(row),
                Some(_) if row.is_home => {}
                Some(environment) => return Err(Refusal::VolumeInUse { name: row.name, environment }.into()),
            }
        }
        rows = kept;
    }
    for row in &rows {
        volume::check_within_size(&row.name, u32::try_from(row.size_gib).unwrap_or(u32::MAX), row.used_bytes)?;
    }
    let facts: Vec<VolumeFacts> = rows.iter().map(VolumeRow::facts).collect();
    let paths = volume::mounts(&facts)?;
    for (row, path) in rows.iter().zip(paths) {
        sqlx::query(
            "INSERT INTO volume_attachments (volume_id, environment_id, mount_path, attached_at) VALUES (?, ?, ?, ?)",
        )
        .bind(row.id)
        .bind(environment_id)
        .bind(&path)
        .bind(now)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// The owner's home volume, made now if they have none yet (counted against the tenant's
/// storage quota like any other).
async fn home_volume(
    conn: &mut SqliteConnection,
    booking: BookingFacts,
    now: i64,
    actor: &audit::Actor<'_>,
) -> Result<VolumeRow, Error> {
    let existing: Option<VolumeRow> = sqlx::query_as(&format!(
        "SELECT {VOLUME_COLUMNS} FROM {VOLUME_TABLES} WHERE v.owner_id = ? AND v.is_home = 1 AND v.deleted_at IS NULL"
    ))
    .bind(booking.owner_id)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(row) = existing {
        return Ok(row);
    }
    let size_gib = home_gib(conn, booking.tenant_id).await?;
    check_storage(conn, booking.tenant_id, None, u64::from(size_gib)).await?;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO volumes (tenant_id, project_id, owner_id, name, is_home, size_gib, created_at)
         VALUES (?, NULL, ?, 'home', 1, ?, ?) RETURNING id",
    )
    .bind(booking.tenant_id)
    .bind(booking.owner_id)
    .bind(i64::from(size_gib))
    .bind(now)
    .fetch_one(&mut *conn)
    .await?;
    let target = format!("volume:{id}");
    let detail = format!("home, {size_gib} GiB, made on the first launch");
    let event =
        Event { action: "volume.create", target: Some(&target), outcome: Outcome::Success, detail: Some(&detail) };
    audit::record(conn, actor, event).await?;
    let row: VolumeRow = sqlx::query_as(&format!("SELECT {VOLUME_COLUMNS} FROM {VOLUME_TABLES} WHERE v.id = ?"))
        .bind(id)
        .fetch_one(&mut *conn)
        .await?;
    Ok(row)
}

/// The size of a tenant's people's home volumes.
async fn home_gib(conn: &mut SqliteConnection, tenant_id: Option<i64>) -> Result<u32, Error> {
    let set: Option<i64> = sqlx::query_scalar("SELECT home_gib FROM storage_quotas WHERE tenant_id = ?")
        .bind(tenant_id)
        .fetch_optional(&mut *conn)
        .await?
        .flatten();
    Ok(set.and_then(|g| u32::try_from(g).ok()).unwrap_or(volume::DEFAULT_HOME_GIB))
}

/// Ends every attachment of an environment: called when it releases its capacity, in the
/// same transaction, so a released environment never holds a volume.
pub(crate) async fn detach_all(conn: &mut SqliteConnection, environment_id: &str, now: i64) -> Result<(), Error> {
    sqlx::query("UPDATE volume_attachments SET detached_at = ? WHERE environment_id = ? AND detached_at IS NULL")
        .bind(now)
        .bind(environment_id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The volumes attached to an environment now, as its backend mounts them.
pub(crate) async fn mounts_of(conn: &mut SqliteConnection, environment_id: &str) -> Result<Vec<VolumeMount>, Error> {
    let rows: Vec<(i64, String, i64, String, Option<i64>, i64)> = sqlx::query_as(
        "SELECT v.id, v.name, v.size_gib, a.mount_path, v.project_id, v.owner_id
         FROM volume_attachments a JOIN volumes v ON v.id = a.volume_id
         WHERE a.environment_id = ? AND a.detached_at IS NULL ORDER BY a.mount_path",
    )
    .bind(environment_id)
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(volume_id, name, size_gib, mount_path, project_id, owner_id)| VolumeMount {
            volume_id,
            name,
            size_gib: u32::try_from(size_gib).unwrap_or(u32::MAX),
            mount_path,
            project_id,
            owner_id,
        })
        .collect())
}

/// The sizes (GiB) of a tenant's live volumes, by id.
pub(crate) async fn tenant_volume_sizes(conn: &mut SqliteConnection, tenant_id: i64) -> Result<Vec<u32>, Error> {
    let sizes: Vec<i64> =
        sqlx::query_scalar("SELECT size_gib FROM volumes WHERE tenant_id = ? AND deleted_at IS NULL ORDER BY id")
            .bind(tenant_id)
            .fetch_all(&mut *conn)
            .await?;
    Ok(sizes.into_iter().map(|g| u32::try_from(g).unwrap_or(u32::MAX)).collect())
}

/// Refuses `asked_gib` more in the tenant (and the project) beyond their storage limits.
async fn check_storage(
    conn: &mut SqliteConnection,
    tenant_id: Option<i64>,
    project_id: Option<i64>,
    asked_gib: u64,
) -> Result<(), Error> {
    let mut limits = Vec::new();
    if let Some(project) = project_id {
        let row: Option<(Option<i64>, String)> = sqlx::query_as(
            "SELECT q.max_gib, p.name FROM storage_quotas q JOIN projects p ON p.id = q.project_id WHERE q.project_id = ?",
        )
        .bind(project)
        .fetch_optional(&mut *conn)
        .await?;
        if let Some((Some(max), name)) = row {
            let used = used_gib(conn, "project_id", project).await?;
            limits.push(StorageLimit {
                whose: format!("project {name}"),
                limit_gib: max.max(0) as u64,
                used_gib: used,
            });
        }
    }
    if let Some(tenant) = tenant_id {
        let row: Option<(Option<i64>, String)> = sqlx::query_as(
            "SELECT q.max_gib, t.slug FROM storage_quotas q JOIN tenants t ON t.id = q.tenant_id WHERE q.tenant_id = ?",
        )
        .bind(tenant)
        .fetch_optional(&mut *conn)
        .await?;
        if let Some((Some(max), slug)) = row {
            let used = used_gib(conn, "tenant_id", tenant).await?;
            limits.push(StorageLimit { whose: format!("tenant {slug}"), limit_gib: max.max(0) as u64, used_gib: used });
        }
    }
    Ok(volume::check_storage_quota(&limits, asked_gib)?)
}

/// GiB of live volumes whose `column` (`tenant_id` or `project_id`) is `id`.
async fn used_gib(conn: &mut SqliteConnection, column: &'static str, id: i64) -> Result<u64, Error> {
    let used: i64 = sqlx::query_scalar(&format!(
        "SELECT coalesce(sum(size_gib), 0) FROM volumes WHERE {column} = ? AND deleted_at IS NULL"
    ))
    .bind(id)
    .fetch_one(&mut *conn)
    .await?;
    Ok(used.max(0) as u64)
}

const ATTACHMENT_COLUMNS: &str = "a.volume_id, v.name AS volume_name, a.environment_id, e.name AS environment_name,
     a.mount_path, a.attached_at, a.detached_at";
const ATTACHMENT_TABLES: &str =
    "volume_attachments a JOIN volumes v ON v.id = a.volume_id JOIN environments e ON e.id = a.environment_id";

#[derive(sqlx::FromRow)]
struct AttachmentRow {
    volume_id: i64,
    volume_name: String,
    environment_id: String,
    environment_name: String,
    mount_path: String,
    attached_at: i64,
    detached_at: Option<i64>,
}

impl From<AttachmentRow> for Attachment {
    fn from(row: AttachmentRow) -> Attachment {
        Attachment {
            volume_id: row.volume_id,
            volume_name: row.volume_name,
            environment_id: row.environment_id,
            environment_name: row.environment_name,
            mount_path: row.mount_path,
            attached_at: row.attached_at,
            detached_at: row.detached_at,
        }
    }
}

/// The volumes an environment has and had attached, by mount path (its page's list).
pub(crate) async fn attachments_of_environment(
    conn: &mut SqliteConnection,
    environment_id: &str,
) -> Result<Vec<Attachment>, Error> {
    let rows: Vec<AttachmentRow> = sqlx::query_as(&format!(
        "SELECT {ATTACHMENT_COLUMNS} FROM {ATTACHMENT_TABLES} WHERE a.environment_id = ? ORDER BY a.mount_path"
    ))
    .bind(environment_id)
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows.into_iter().map(Attachment::from).collect())
}

/// A volume's live attachments.
async fn attachments_of(conn: &mut SqliteConnection, volume_id: i64) -> Result<Vec<Attachment>, Error> {
    let rows: Vec<AttachmentRow> = sqlx::query_as(&format!(
        "SELECT {ATTACHMENT_COLUMNS} FROM {ATTACHMENT_TABLES}
         WHERE a.volume_id = ? AND a.detached_at IS NULL ORDER BY a.attached_at"
    ))
    .bind(volume_id)
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows.into_iter().map(Attachment::from).collect())
}
