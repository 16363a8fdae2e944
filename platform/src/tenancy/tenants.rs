//! Tenants, their members and projects: what platform admins and tenant admins manage.
//!
//! Every change checks the caller's reach first (a tenant admin reaches only their own
//! tenant), runs in one write transaction and is audited with it.

use berth_domain::Refusal;
use berth_domain::notification::Notice;
use berth_domain::placement::Occupant;
use berth_domain::policy::{Action, Role, Target};
use berth_domain::tenancy::{self, Isolation};
use sqlx::{Row, SqliteConnection};

use crate::audit::{self, Actor, Event, Outcome};
use crate::tenancy::fabric;
use crate::{Caller, Error, Platform, now_ms};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    pub id: i64,
    pub slug: String,
    pub name: String,
    pub isolation: Isolation,
    pub status: String,
    pub members: i64,
    pub active_environments: i64,
    /// Syncs of the tenant's queue on the backend (Kubernetes: its Kueue ClusterQueue)
    /// have been failing: the backend's words from the last one, and since when.
    pub queue_failure: Option<QueueFailure>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueFailure {
    pub error: String,
    /// Milliseconds since the epoch.
    pub since: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub user_id: i64,
    pub email: String,
    pub display_name: String,
    pub role: Role,
    pub status: String,
    /// Signed in through a provider at least once.
    pub linked: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Project {
    pub id: i64,
    pub name: String,
    pub members: Vec<String>,
}

/// What a platform admin can do to a tenant as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TenantChange {
    Suspend,
    Resume,
    /// Stops its environments (the reconciler tears them down), ends its sessions and
    /// tokens, releases its fabric identifiers into quarantine; its history stays.
    Delete,
}

const TENANT_COLUMNS: &str = "t.id, t.slug, t.name, t.isolation, t.status, t.queue_error, t.queue_failing_since,
    (SELECT count(*) FROM users u WHERE u.tenant_id = t.id AND u.status <> 'removed') AS members,
    (SELECT count(*) FROM environments e WHERE e.tenant_id = t.id AND e.state NOT IN ('released', 'failed')) AS active";

fn tenant_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<Tenant, Error> {
    let isolation: String = row.try_get("isolation")?;
    Ok(Tenant {
        id: row.try_get("id")?,
        slug: row.try_get("slug")?,
        name: row.try_get("name")?,
        isolation: Isolation::parse(&isolation).map_err(|_| Error::internal("unknown isolation"))?,
        status: row.try_get("status")?,
        members: row.try_get("members")?,
        active_environments: row.try_get("active")?,
        queue_failure: match (row.try_get("queue_error")?, row.try_get("queue_failing_since")?) {
            (Some(error), Some(since)) => Some(QueueFailure { error, since }),
            _ => None,
        },
    })
}

impl Platform {
    /// Creates a tenant without asking anyone (first start, demo data, tests); returns the
    /// existing one's id when the slug is taken.
    pub async fn ensure_tenant(&self, slug: &str, name: &str, isolation: Isolation) -> Result<i64, Error> {
        let mut tx = self.begin_write().await?;
        if let Some(id) =
            sqlx::query_scalar("SELECT id FROM tenants WHERE slug = ?").bind(slug).fetch_optional(&mut *tx).await?
        {
            return Ok(id);
        }
        let id = insert_tenant(&mut tx, slug, name, isolation).await?;
        let event = Event { action: "tenant.create", target: Some(slug), outcome: Outcome::Success, detail: None };
        audit::record(&mut tx, &Actor::background(Some(id)), event).await?;
        fabric::settle(&mut tx, &self.fabric, id, isolation, &Actor::background(Some(id))).await?;
        tx.commit().await?;
        Ok(id)
    }

    /// Tenants the caller can see: all for platform staff, their own for a tenant admin.
    pub async fn tenants(&self, caller: &Caller) -> Result<Vec<Tenant>, Error> {
        self.authorize_in_tenant(caller, Action::TenantRead).await?;
        let all = caller.tenant_id().is_none();
        let rows = sqlx::query(&format!(
            "SELECT {TENANT_COLUMNS} FROM tenants t WHERE t.status <> 'deleted' AND (? OR t.id = ?) ORDER BY t.name"
        ))
        .bind(all)
        .bind(caller.tenant_id())
        .fetch_all(&self.db)
        .await?;
        rows.iter().map(tenant_from_row).collect()
    }

    /// One tenant, if the caller may see it.
    pub async fn tenant(&self, caller: &Caller, id: i64) -> Result<Tenant, Error> {
        self.authorize_object_in(caller, Action::TenantRead, id).await?;
        self.tenant_row(id).await
    }

    /// The tenant whose members the caller may see (a member's view of their own tenant,
    /// without the platform's tenant list).
    pub async fn tenant_for_members(&self, caller: &Caller, id: i64) -> Result<Tenant, Error> {
        self.authorize_object_in(caller, Action::MemberRead, id).await?;
        self.tenant_row(id).await
    }

    async fn tenant_row(&self, id: i64) -> Result<Tenant, Error> {
        let row =
            sqlx::query(&format!("SELECT {TENANT_COLUMNS} FROM tenants t WHERE t.id = ? AND t.status <> 'deleted'"))
                .bind(id)
                .fetch_optional(&self.db)
                .await?
                .ok_or(Error::NotFound)?;
        tenant_from_row(&row)
    }

    /// A new tenant, optionally with its first tenant admin (who signs in through SSO or
    /// is given a password by `berth admin`).
    pub async fn create_tenant(
        &self,
        caller: &Caller,
        slug: &str,
        name: &str,
        isolation: &str,
        first_admin: &str,
    ) -> Result<Tenant, Error> {
        self.authorize(caller, Action::TenantManage, Target::Platform).await?;
        let slug = tenancy::validate_slug(slug)?;
        let name = tenancy::validate_display_name(name)?;
        let isolation = Isolation::parse(isolation)?;
        let first_admin = (!first_admin.trim().is_empty()).then(|| tenancy::validate_email(first_admin)).transpose()?;
        let mut tx = self.begin_write().await?;
        let taken: i64 =
            sqlx::query_scalar("SELECT count(*) FROM tenants WHERE slug = ?").bind(&slug).fetch_one(&mut *tx).await?;
        if taken > 0 {
            return Err(Refusal::SlugInUse(slug).into());
        }
        let id = insert_tenant(&mut tx, &slug, &name, isolation).await?;
        let detail = format!("{name}, {} isolation", isolation.as_str());
        let event =
            Event { action: "tenant.create", target: Some(&slug), outcome: Outcome::Success, detail: Some(&detail) };
        audit::record(&mut tx, &Actor { tenant_id: Some(id), ..caller.actor() }, event).await?;
        // In the same transaction: an exhausted pool leaves no tenant behind.
        fabric::settle(&mut tx, &self.fabric, id, isolation, &Actor { tenant_id: Some(id), ..caller.actor() }).await?;
        if let Some(email) = first_admin {
            let invitee = invite(&mut tx, caller, id, &email, Role::TenantAdmin).await?;
            let notice = Notice::tenant_invitation(id, &name, Role::TenantAdmin.label());
            self.notify(&mut tx, Some(id), &[invitee], &notice).await?;
        }
        tx.commit().await?;
        // A new tenant's queue is behind from the start: the reconciler makes it.
        self.wake_reconciler();
        self.tenant(caller, id).await
    }

    /// Suspends, resumes or deletes a tenant. Suspended and deleted tenants' users can no
    /// longer act (their sessions and tokens stop at once); deleting also stops every
    /// environment of the tenant, which the reconciler then tears down.
    pub async fn change_tenant(&self, caller: &Caller, id: i64, change: TenantChange) -> Result<(), Error> {
        self.authorize(caller, Action::TenantManage, Target::Platform).await?;
        let mut tx = self.begin_write().await?;
        let status: String = sqlx::query_scalar("SELECT status FROM tenants WHERE id = ? AND status <> 'deleted'")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(Error::NotFound)?;
        let (new_status, action) = match change {
            TenantChange::Suspend => ("suspended", "tenant.suspend"),
            TenantChange::Resume => ("active", "tenant.resume"),
            TenantChange::Delete => ("deleted", "tenant.delete"),
        };
        if status == new_status {
            return Ok(());
        }
        sqlx::query("UPDATE tenants SET status = ? WHERE id = ?").bind(new_status).bind(id).execute(&mut *tx).await?;
        let mut detail = None;
        if change == TenantChange::Delete {
            // Every live environment is stopped like its owner would stop it, each audited;
            // the reconciler tears them down. Those already stopping keep going as they are.
            let stopped: Vec<String> = sqlx::query_scalar(
                "UPDATE environments SET desired = 'released'
                 WHERE tenant_id = ? AND state NOT IN ('released', 'failed') AND desired <> 'released' RETURNING id",
            )
            .bind(id)
            .fetch_all(&mut *tx)
            .await?;
            for environment in &stopped {
                let event = Event {
                    action: "environment.stop",
                    target: Some(environment),
                    outcome: Outcome::Success,
                    detail: Some("its tenant was deleted"),
                };
                audit::record(&mut tx, &Actor { tenant_id: Some(id), ..caller.actor() }, event).await?;
            }
            let stopped = stopped.len();
            sqlx::query("UPDATE api_tokens SET revoked_at = ? WHERE revoked_at IS NULL AND user_id IN (SELECT id FROM users WHERE tenant_id = ?)")
                .bind(now_ms())
                .bind(id)
                .execute(&mut *tx)
                .await?;
            detail = Some(format!("{stopped} environments stopped"));
            fabric::release(&mut tx, &self.fabric, id, &Actor { tenant_id: Some(id), ..caller.actor() }).await?;
            // Its queue goes too (Kueue keeps a queue in use until its workloads are gone).
            crate::capacity::quotas::follow(&mut tx, Some(id)).await?;
        }
        let target = format!("tenant:{id}");
        let event = Event { action, target: Some(&target), outcome: Outcome::Success, detail: detail.as_deref() };
        audit::record(&mut tx, &Actor { tenant_id: Some(id), ..caller.actor() }, event).await?;
        // A suspended or deleted tenant's people lose their shells on its nodes at once.
        crate::provisioning::node_plans::refresh_access_plans(&mut tx, now_ms()).await?;
        tx.commit().await?;
        if change == TenantChange::Delete {
            self.wake_reconciler();
        }
        Ok(())
    }

    pub async fn set_tenant_isolation(&self, caller: &Caller, id: i64, isolation: &str) -> Result<(), Error> {
        self.authorize(caller, Action::TenantManage, Target::Platform).await?;
        let isolation = Isolation::parse(isolation)?;
        let mut tx = self.begin_write().await?;
        if isolation != Isolation::Soft {
            self.ensure_nodes_of_its_own(&mut tx, id, isolation).await?;
        }
        let changed = sqlx::query("UPDATE tenants SET isolation = ? WHERE id = ? AND status <> 'deleted'")
            .bind(isolation.as_str())
            .bind(id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if changed == 0 {
            return Err(Error::NotFound);
        }
        let target = format!("tenant:{id}");
        let event = Event {
            action: "tenant.isolation",
            target: Some(&target),
            outcome: Outcome::Success,
            detail: Some(isolation.as_str()),
        };
        audit::record(&mut tx, &Actor { tenant_id: Some(id), ..caller.actor() }, event).await?;
        fabric::settle(&mut tx, &self.fabric, id, isolation, &Actor { tenant_id: Some(id), ..caller.actor() }).await?;
        // A soft tenant's space on the backend is applied with its queue; a hard one has none.
        crate::capacity::quotas::follow(&mut tx, Some(id)).await?;
        let occupant = Occupant::of(Some(id), isolation);
        tx.commit_and(|| self.with_book(|book| book.set_occupant(id, occupant))).await?;
        Ok(())
    }

    /// A tenant turning hard or hybrid must not share a node with another tenant at any
    /// time it holds one (cleaning gap included): it would be on nodes that are not its own.
    async fn ensure_nodes_of_its_own(
        &self,
        conn: &mut SqliteConnection,
        id: i64,
        isolation: Isolation,
    ) -> Result<(), Error> {
        let (shared, until): (i64, Option<i64>) = sqlx::query_as(
            "SELECT count(DISTINCT a.environment_id), max(min(a.ends_at, b.ends_at))
             FROM reservations a
             JOIN environments ea ON ea.id = a.environment_id
             JOIN gpus ga ON ga.id = a.gpu_id
             JOIN gpus gb ON gb.node_id = ga.node_id
             JOIN reservations b ON b.gpu_id = gb.id AND b.released_at IS NULL
             JOIN environments eb ON eb.id = b.environment_id
             WHERE ea.tenant_id = ?1 AND a.released_at IS NULL AND eb.tenant_id IS NOT ?1
               AND a.starts_at < b.ends_at + ?2 AND b.starts_at < a.ends_at + ?2",
        )
        .bind(id)
        .bind(self.policy.cleaning_gap_ms)
        .fetch_one(&mut *conn)
        .await?;
        match until {
            Some(until) if shared > 0 => Err(Refusal::IsolationBlocked {
                isolation: isolation.as_str(),
                detail: format!(
                    "{shared} of its environments share a node with another tenant's until {}; stop them or change the isolation after that",
                    berth_domain::booking::utc_short(until)
                ),
            }
            .into()),
            _ => Ok(()),
        }
    }

    /// The tenant's members, by email.
    pub async fn members(&self, caller: &Caller, tenant_id: i64) -> Result<Vec<Member>, Error> {
        self.authorize_object_in(caller, Action::MemberRead, tenant_id).await?;
        let rows = sqlx::query(
            "SELECT u.id, u.email, u.display_name, u.role, u.status,
                    EXISTS (SELECT 1 FROM user_identities i WHERE i.user_id = u.id) AS linked
             FROM users u WHERE u.tenant_id = ? AND u.status <> 'removed' ORDER BY u.email",
        )
        .bind(tenant_id)
        .fetch_all(&self.db)
        .await?;
        rows.iter()
            .map(|row| {
                let role: String = row.try_get("role")?;
                Ok(Member {
                    user_id: row.try_get("id")?,
                    email: row.try_get("email")?,
                    display_name: row.try_get("display_name")?,
                    role: Role::parse(&role).ok_or_else(|| Error::internal("unknown role"))?,
                    status: row.try_get("status")?,
                    linked: row.try_get("linked")?,
                })
            })
            .collect()
    }

    /// Adds someone to the tenant by email with a role. They sign in through the tenant's
    /// provider; the account is linked at their first sign-in with that verified email.
    /// Answers their user id.
    pub async fn invite_member(&self, caller: &Caller, tenant_id: i64, email: &str, role: &str) -> Result<i64, Error> {
        self.authorize_object_in(caller, Action::MemberManage, tenant_id).await?;
        let email = tenancy::validate_email(email)?;
        let role = tenancy::parse_tenant_role(role)?;
        let mut tx = self.begin_write().await?;
        active_tenant(&mut tx, tenant_id).await?;
        let invitee = invite(&mut tx, caller, tenant_id, &email, role).await?;
        // Told in the invitation's own transaction (by email where it is set up).
        let tenant: String =
            sqlx::query_scalar("SELECT name FROM tenants WHERE id = ?").bind(tenant_id).fetch_one(&mut *tx).await?;
        let notice = Notice::tenant_invitation(tenant_id, &tenant, role.label());
        self.notify(&mut tx, Some(tenant_id), &[invitee], &notice).await?;
        tx.commit().await?;
        Ok(invitee)
    }

    /// Gives a member another role. Nobody changes their own, and a tenant keeps at least
    /// one tenant admin.
    pub async fn change_member_role(
        &self,
        caller: &Caller,
        tenant_id: i64,
        user_id: i64,
        role: &str,
    ) -> Result<(), Error> {
        self.authorize_object_in(caller, Action::MemberManage, tenant_id).await?;
        let role = tenancy::parse_tenant_role(role)?;
        if user_id == caller.user_id() {
            return Err(Refusal::OwnMembership.into());
        }
        let mut tx = self.begin_write().await?;
        let (email, old) = member_in(&mut tx, tenant_id, user_id).await?;
        if old == Role::TenantAdmin && role != Role::TenantAdmin {
            ensure_another_admin(&mut tx, tenant_id, user_id).await?;
        }
        sqlx::query("UPDATE users SET role = ? WHERE id = ?")
            .bind(role.as_str())
            .bind(user_id)
            .execute(&mut *tx)
            .await?;
        let detail = format!("{} -> {}", old.as_str(), role.as_str());
        let event =
            Event { action: "member.role", target: Some(&email), outcome: Outcome::Success, detail: Some(&detail) };
        audit::record(&mut tx, &Actor { tenant_id: Some(tenant_id), ..caller.actor() }, event).await?;
        members_changed(&mut tx, &[tenant_id]).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Takes a member out of the tenant: they can no longer sign in, their sessions and
    /// tokens stop at once, their running environments are stopped.
    pub async fn remove_member(&self, caller: &Caller, tenant_id: i64, user_id: i64) -> Result<(), Error> {
        self.authorize_object_in(caller, Action::MemberManage, tenant_id).await?;
        if user_id == caller.user_id() {
            return Err(Refusal::OwnMembership.into());
        }
        let mut tx = self.begin_write().await?;
        let (email, role) = member_in(&mut tx, tenant_id, user_id).await?;
        if role == Role::TenantAdmin {
            ensure_another_admin(&mut tx, tenant_id, user_id).await?;
        }
        sqlx::query("UPDATE users SET status = 'removed' WHERE id = ?").bind(user_id).execute(&mut *tx).await?;
        sqlx::query("DELETE FROM user_identities WHERE user_id = ?").bind(user_id).execute(&mut *tx).await?;
        sqlx::query("DELETE FROM project_members WHERE user_id = ?").bind(user_id).execute(&mut *tx).await?;
        sqlx::query("UPDATE api_tokens SET revoked_at = ? WHERE user_id = ? AND revoked_at IS NULL")
            .bind(now_ms())
            .bind(user_id)
            .execute(&mut *tx)
            .await?;
        let stopped = sqlx::query(
            "UPDATE environments SET desired = 'released' WHERE owner_id = ? AND state NOT IN ('released', 'failed')",
        )
        .bind(user_id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let detail = format!("{stopped} environments stopped");
        let event =
            Event { action: "member.remove", target: Some(&email), outcome: Outcome::Success, detail: Some(&detail) };
        audit::record(&mut tx, &Actor { tenant_id: Some(tenant_id), ..caller.actor() }, event).await?;
        members_changed(&mut tx, &[tenant_id]).await?;
        tx.commit().await?;
        self.wake_reconciler();
        Ok(())
    }

    pub async fn projects(&self, caller: &Caller, tenant_id: i64) -> Result<Vec<Project>, Error> {
        self.authorize_object_in(caller, Action::ProjectRead, tenant_id).await?;
        let rows: Vec<(i64, String, Option<String>)> = sqlx::query_as(
            "SELECT p.id, p.name, u.email FROM projects p
             LEFT JOIN project_members pm ON pm.project_id = p.id LEFT JOIN users u ON u.id = pm.user_id
             WHERE p.tenant_id = ? ORDER BY p.name, u.email",
        )
        .bind(tenant_id)
        .fetch_all(&self.db)
        .await?;
        let mut projects: Vec<Project> = Vec::new();
        for (id, name, email) in rows {
            if projects.last().is_none_or(|p| p.id != id) {
                projects.push(Project { id, name, members: Vec::new() });
            }
            if let (Some(email), Some(project)) = (email, projects.last_mut()) {
                project.members.push(email);
            }
        }
        Ok(projects)
    }

    /// Makes a project in the tenant; answers its id.
    pub async fn create_project(&self, caller: &Caller, tenant_id: i64, name: &str) -> Result<i64, Error> {
        self.authorize_object_in(caller, Action::ProjectManage, tenant_id).await?;
        let name = tenancy::validate_display_name(name)?;
        let mut tx = self.begin_write().await?;
        active_tenant(&mut tx, tenant_id).await?;
        let taken: i64 = sqlx::query_scalar("SELECT count(*) FROM projects WHERE tenant_id = ? AND name = ?")
            .bind(tenant_id)
            .bind(&name)
            .fetch_one(&mut *tx)
            .await?;
        if taken > 0 {
            return Err(Refusal::SlugInUse(name).into());
        }
        let id: i64 =
            sqlx::query_scalar("INSERT INTO projects (tenant_id, name, created_at) VALUES (?, ?, ?) RETURNING id")
                .bind(tenant_id)
                .bind(&name)
                .bind(now_ms())
                .fetch_one(&mut *tx)
                .await?;
        let event = Event { action: "project.create", target: Some(&name), outcome: Outcome::Success, detail: None };
        audit::record(&mut tx, &Actor { tenant_id: Some(tenant_id), ..caller.actor() }, event).await?;
        tx.commit().await?;
        Ok(id)
    }

    /// Adds a member of the tenant (by email) to one of its projects.
    pub async fn add_project_member(
        &self,
        caller: &Caller,
        tenant_id: i64,
        project_id: i64,
        email: &str,
    ) -> Result<(), Error> {
        self.authorize_object_in(caller, Action::ProjectManage, tenant_id).await?;
        let email = email.trim();
        let mut tx = self.begin_write().await?;
        let project: String = sqlx::query_scalar("SELECT name FROM projects WHERE id = ? AND tenant_id = ?")
            .bind(project_id)
            .bind(tenant_id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(Error::NotFound)?;
        let user_id: i64 =
            sqlx::query_scalar("SELECT id FROM users WHERE email = ? AND tenant_id = ? AND status <> 'removed'")
                .bind(email)
                .bind(tenant_id)
                .fetch_optional(&mut *tx)
                .await?
                .ok_or_else(|| Refusal::UnknownUser(email.to_owned()))?;
        sqlx::query("INSERT OR IGNORE INTO project_members (project_id, user_id) VALUES (?, ?)")
            .bind(project_id)
            .bind(user_id)
            .execute(&mut *tx)
            .await?;
        let detail = format!("added {email}");
        let event = Event {
            action: "project.member",
            target: Some(&project),
            outcome: Outcome::Success,
            detail: Some(&detail),
        };
        audit::record(&mut tx, &Actor { tenant_id: Some(tenant_id), ..caller.actor() }, event).await?;
        tx.commit().await?;
        Ok(())
    }

    /// `authorize` for an action on a tenant as a whole. Another tenant looks exactly
    /// like one that does not exist, and one that does not exist (or was deleted) is not
    /// found even by platform staff, who reach every tenant id.
    pub(crate) async fn authorize_object_in(
        &self,
        caller: &Caller,
        action: Action,
        tenant_id: i64,
    ) -> Result<(), Error> {
        match self.authorize(caller, action, Target::Tenant(tenant_id)).await {
            Err(Error::Forbidden) if caller.tenant_id().is_some_and(|t| t != tenant_id) => Err(Error::NotFound),
            Ok(()) => {
                let exists: bool =
                    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM tenants WHERE id = ? AND status <> 'deleted')")
                        .bind(tenant_id)
                        .fetch_one(&self.db)
                        .await?;
                if exists { Ok(()) } else { Err(Error::NotFound) }
            }
            other => other,
        }
    }
}

async fn insert_tenant(
    conn: &mut SqliteConnection,
    slug: &str,
    name: &str,
    isolation: Isolation,
) -> Result<i64, Error> {
    Ok(sqlx::query_scalar(
        "INSERT INTO tenants (slug, name, isolation, status, created_at) VALUES (?, ?, ?, 'active', ?) RETURNING id",
    )
    .bind(slug)
    .bind(name)
    .bind(isolation.as_str())
    .bind(now_ms())
    .fetch_one(conn)
    .await?)
}

/// The members of `tenants` or their roles changed, in this transaction: whose keys open
/// their dedicated clusters' nodes, and what their members may do in their space on the
/// backend (applied with their queues), follow.
pub(crate) async fn members_changed(conn: &mut SqliteConnection, tenants: &[i64]) -> Result<(), Error> {
    crate::provisioning::node_plans::refresh_access_plans(&mut *conn, now_ms()).await?;
    for &tenant_id in tenants {
        crate::capacity::quotas::follow(&mut *conn, Some(tenant_id)).await?;
    }
    Ok(())
}

async fn active_tenant(conn: &mut SqliteConnection, tenant_id: i64) -> Result<(), Error> {
    let status: String = sqlx::query_scalar("SELECT status FROM tenants WHERE id = ? AND status <> 'deleted'")
        .bind(tenant_id)
        .fetch_optional(conn)
        .await?
        .ok_or(Error::NotFound)?;
    if status == "active" { Ok(()) } else { Err(Refusal::TenantNotActive("suspended").into()) }
}

async fn invite(
    conn: &mut SqliteConnection,
    caller: &Caller,
    tenant_id: i64,
    email: &str,
    role: Role,
) -> Result<i64, Error> {
    let existing: Option<(i64, Option<i64>, String)> =
        sqlx::query_as("SELECT id, tenant_id, status FROM users WHERE email = ?")
            .bind(email)
            .fetch_optional(&mut *conn)
            .await?;
    let invitee = match existing {
        // Someone removed from this tenant may be invited back.
        Some((id, Some(t), status)) if t == tenant_id && status == "removed" => {
            sqlx::query("UPDATE users SET status = 'active', role = ? WHERE id = ?")
                .bind(role.as_str())
                .bind(id)
                .execute(&mut *conn)
                .await?;
            id
        }
        Some(_) => return Err(Refusal::EmailInUse(email.to_owned()).into()),
        None => {
            let name = email.split('@').next().unwrap_or(email);
            sqlx::query_scalar(
                "INSERT INTO users (email, display_name, password_hash, role, tenant_id, created_at) VALUES (?, ?, NULL, ?, ?, ?)
                 RETURNING id",
            )
            .bind(email)
            .bind(name)
            .bind(role.as_str())
            .bind(tenant_id)
            .bind(now_ms())
            .fetch_one(&mut *conn)
            .await?
        }
    };
    members_changed(&mut *conn, &[tenant_id]).await?;
    let event =
        Event { action: "member.invite", target: Some(email), outcome: Outcome::Success, detail: Some(role.as_str()) };
    audit::record(conn, &Actor { tenant_id: Some(tenant_id), ..caller.actor() }, event).await?;
    Ok(invitee)
}

async fn member_in(conn: &mut SqliteConnection, tenant_id: i64, user_id: i64) -> Result<(String, Role), Error> {
    let (email, role): (String, String) =
        sqlx::query_as("SELECT email, role FROM users WHERE id = ? AND tenant_id = ? AND status <> 'removed'")
            .bind(user_id)
            .bind(tenant_id)
            .fetch_optional(&mut *conn)
            .await?
            .ok_or(Error::NotFound)?;
    Ok((email, Role::parse(&role).ok_or_else(|| Error::internal("unknown role"))?))
}

async fn ensure_another_admin(conn: &mut SqliteConnection, tenant_id: i64, except: i64) -> Result<(), Error> {
    let others: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM users WHERE tenant_id = ? AND role = 'tenant_admin' AND status = 'active' AND id <> ?",
    )
    .bind(tenant_id)
    .bind(except)
    .fetch_one(conn)
    .await?;
    if others > 0 { Ok(()) } else { Err(Refusal::LastTenantAdmin.into()) }
}
