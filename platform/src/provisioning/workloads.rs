//! What a backend is asked to run for an environment: its [`Workload`], read from the
//! database. The reconciler builds one for every step; connection details, job logs and
//! endpoint scaling build the same one, so the backend always sees one description.

use berth_domain::policy::Role;
use berth_domain::tenancy::{self, Isolation};

use crate::capacity::environments::{
    ENVIRONMENT_COLUMNS, Environment, HeldUnit, UNIT_COLUMNS, UNIT_TABLES, UnitRow, environment_from_row, held_units,
};
use crate::provisioning::backend::{Holding, PlacedUnit, TenantScope, Workload};
use crate::{Error, Platform, now_ms};

impl HeldUnit {
    /// The unit as a backend is told of it, held by `environment_id`.
    pub(crate) fn placed(self, environment_id: &str) -> PlacedUnit {
        PlacedUnit {
            environment_id: environment_id.to_owned(),
            site: self.site,
            node: self.node,
            gpu_index: self.gpu_index,
            slice_start: self.slice_start,
            slice_size: self.slice_size,
            mig_profile: self.mig_profile,
        }
    }
}

impl Platform {
    /// The workload of `env` as its backend knows it (every unreleased unit).
    pub(crate) async fn workload(&self, env: &Environment) -> Result<Workload, Error> {
        let mut conn = self.db.acquire().await?;
        workload_of(&mut conn, env, |_| true).await
    }
}

/// The workload of `env` as a backend needs it: its unreleased units that `keep` keeps
/// (all of them but while an endpoint scales down), its tenant and MIG neighbours.
pub(crate) async fn workload_of(
    conn: &mut sqlx::SqliteConnection,
    env: &Environment,
    keep: impl Fn(&HeldUnit) -> bool,
) -> Result<Workload, Error> {
    let units = held_units(&mut *conn, &env.id)
        .await?
        .into_iter()
        .filter(|u| u.released_at.is_none() && keep(u))
        .map(|u| u.placed(&env.id))
        .collect();
    let tenant = tenant_scope(&mut *conn, env.tenant_id).await?;
    let (tenant_holdings, tenant_volumes) = match env.tenant_id {
        Some(tenant_id) if tenancy::shares_tenant_space(env.offering, tenant.isolation) => (
            tenant_holdings(&mut *conn, tenant_id, tenant.isolation, Some(&env.id)).await?,
            crate::capacity::volumes::tenant_volume_sizes(&mut *conn, tenant_id).await?,
        ),
        _ => (Vec::new(), Vec::new()),
    };
    Ok(Workload {
        environment_id: env.id.clone(),
        name: env.name.clone(),
        offering: env.offering,
        shape: env.size.shape,
        image: env.image.clone(),
        command: env.command.clone(),
        serving: env.serving.clone(),
        units,
        vcpus: env.size.vcpus,
        memory_gb: env.size.memory_gb,
        ends_at: env.ends_at,
        tenant,
        mig_neighbours: neighbours(&mut *conn, &env.id, Neighbours::MigSlices).await?,
        tenant_neighbours: neighbours(&mut *conn, &env.id, Neighbours::SameHardTenant).await?,
        tenant_holdings,
        volumes: crate::capacity::volumes::mounts_of(&mut *conn, &env.id).await?,
        tenant_volumes,
    })
}

/// What the environments sharing tenant `tenant_id`'s space (the tenant being of
/// `isolation`) hold now (but `except`): those provisioning, ready or tearing down, each
/// with its unreleased units, as its own workload is told of them. One that released its
/// capacity holds nothing any more.
pub(crate) async fn tenant_holdings(
    conn: &mut sqlx::SqliteConnection,
    tenant_id: i64,
    isolation: Isolation,
    except: Option<&str>,
) -> Result<Vec<Holding>, Error> {
    let rows = sqlx::query(&format!(
        "SELECT {ENVIRONMENT_COLUMNS} FROM environments
         WHERE tenant_id = ? AND state IN ('provisioning', 'ready', 'tearing_down') ORDER BY id"
    ))
    .bind(tenant_id)
    .fetch_all(&mut *conn)
    .await?;
    let mut holdings = Vec::new();
    for row in &rows {
        let env = environment_from_row(row)?;
        if Some(env.id.as_str()) == except || !tenancy::shares_tenant_space(env.offering, isolation) {
            continue;
        }
        let units: Vec<PlacedUnit> = held_units(&mut *conn, &env.id)
            .await?
            .into_iter()
            .filter(|u| u.released_at.is_none())
            .map(|u| u.placed(&env.id))
            .collect();
        if units.is_empty() {
            continue;
        }
        holdings.push(Holding {
            environment_id: env.id.clone(),
            offering: env.offering,
            shape: env.size.shape,
            vcpus: env.size.vcpus,
            memory_gb: env.size.memory_gb,
            units,
        });
    }
    Ok(holdings)
}

/// Which other environments' units on an environment's nodes a backend needs to know of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Neighbours {
    /// Their MIG slices: a node has one MIG layout for all of them.
    MigSlices,
    /// Everything of the same tenant, when it is hard or hybrid: its node stays dedicated
    /// to it while any of them holds it.
    SameHardTenant,
}

pub(crate) async fn tenant_scope(
    conn: &mut sqlx::SqliteConnection,
    tenant_id: Option<i64>,
) -> Result<TenantScope, Error> {
    let Some(tenant_id) = tenant_id else {
        return Ok(TenantScope { slug: None, isolation: Isolation::Soft, members: Vec::new() });
    };
    let (slug, isolation): (String, String) = sqlx::query_as("SELECT slug, isolation FROM tenants WHERE id = ?")
        .bind(tenant_id)
        .fetch_one(&mut *conn)
        .await?;
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT email, role FROM users WHERE tenant_id = ? AND status = 'active' ORDER BY email")
            .bind(tenant_id)
            .fetch_all(&mut *conn)
            .await?;
    Ok(TenantScope {
        slug: Some(slug),
        isolation: Isolation::parse(&isolation).map_err(|_| Error::internal("unknown isolation"))?,
        members: rows.into_iter().filter_map(|(email, role)| Some((email, Role::parse(&role)?))).collect(),
    })
}

/// Units of other environments on the nodes where this one holds units, from reservations
/// that have started and are not released (their instances and workloads exist now),
/// except those of environments whose workload teardown has stopped: what they hold is
/// about to go, and two of them finishing at once must each leave the other out, or the
/// last node state written would keep something nobody holds.
async fn neighbours(
    conn: &mut sqlx::SqliteConnection,
    environment_id: &str,
    which: Neighbours,
) -> Result<Vec<PlacedUnit>, Error> {
    let only = match which {
        Neighbours::MigSlices => "r.mig_profile IS NOT NULL",
        Neighbours::SameHardTenant => {
            "e.tenant_id = (SELECT tenant_id FROM environments WHERE id = ?1)
             AND (SELECT isolation FROM tenants WHERE id = e.tenant_id) IN ('hard', 'hybrid')"
        }
    };
    let rows: Vec<UnitRow> = sqlx::query_as(&format!(
        "SELECT {UNIT_COLUMNS} FROM {UNIT_TABLES} JOIN environments e ON e.id = r.environment_id
         WHERE r.environment_id <> ?1 AND r.released_at IS NULL AND r.starts_at <= ?2 AND {only}
           AND NOT EXISTS (SELECT 1 FROM environment_steps st WHERE st.environment_id = r.environment_id
                           AND st.phase = 'teardown' AND st.step = 'stop_workload' AND st.status = 'succeeded')
           AND n.id IN (SELECT g2.node_id FROM reservations r2 JOIN gpus g2 ON g2.id = r2.gpu_id
                        WHERE r2.environment_id = ?1)
         ORDER BY n.name, g.idx, r.slice_start"
    ))
    .bind(environment_id)
    .bind(now_ms())
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| PlacedUnit {
            // Stored model-independent (`3g`); backends get the model's name (`3g.40gb`).
            mig_profile: row.mig_profile_name(),
            environment_id: row.environment_id,
            site: row.site,
            node: row.node,
            gpu_index: row.idx,
            slice_start: row.slice_start,
            slice_size: row.slice_size,
        })
        .collect())
}
