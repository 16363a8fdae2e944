//! An environment as its page shows it: the environment, the journal of its provisioning
//! and teardown steps (written by the reconciler), the capacity it holds or held, and what
//! the caller may do inside it.

use berth_domain::lifecycle::{Phase, Step};
use sqlx::Row;

use crate::capacity::environments::{Environment, HeldUnit, held_units};
use crate::provisioning::connect::EndpointState;
use crate::{Caller, Error, Platform};

/// One row of the step journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepRecord {
    pub phase: Phase,
    pub index: i64,
    pub step: Step,
    pub status: String,
    pub attempts: i64,
    pub started_at: i64,
    pub finished_at: Option<i64>,
    pub detail: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvironmentDetail {
    pub environment: Environment,
    pub steps: Vec<StepRecord>,
    pub units: Vec<HeldUnit>,
    /// Whether the caller may act inside it (open the notebook, see the endpoint's key).
    pub may_connect: bool,
    /// An inference endpoint's key and replicas.
    pub endpoint: Option<EndpointState>,
    /// The volumes it has and had attached, by mount path.
    pub volumes: Vec<crate::capacity::volumes::Attachment>,
    /// A dedicated cluster's failed nodes and what replaced them, oldest first.
    pub node_replacements: Vec<crate::provisioning::cluster_nodes::NodeReplacement>,
}

impl Platform {
    /// One environment with its step journal and the capacity it holds or held.
    pub async fn environment_detail(&self, caller: &Caller, id: &str) -> Result<EnvironmentDetail, Error> {
        let environment = self.environment_of(caller, id).await?;
        // What the environment holds and did, read in one read transaction so it is one
        // moment: a cluster moved off a failed node shows its new node and the old one's units
        // released, never one without the other. (The environment's own row is read just
        // before, with the caller's authorization.)
        let mut conn = self.db.begin().await?;
        let steps = sqlx::query(
            "SELECT phase, idx, step, status, attempts, started_at, finished_at, detail
             FROM environment_steps WHERE environment_id = ? ORDER BY phase = 'teardown', idx",
        )
        .bind(id)
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(|row| {
            let phase: String = row.try_get("phase")?;
            let step: String = row.try_get("step")?;
            Ok(StepRecord {
                phase: Phase::parse(&phase).ok_or_else(|| Error::internal("unknown phase"))?,
                index: row.try_get("idx")?,
                step: Step::parse(&step).ok_or_else(|| Error::internal("unknown step"))?,
                status: row.try_get("status")?,
                attempts: row.try_get("attempts")?,
                started_at: row.try_get("started_at")?,
                finished_at: row.try_get("finished_at")?,
                detail: row.try_get("detail")?,
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
        let units = held_units(&mut conn, id).await?;
        let endpoint = crate::provisioning::connect::endpoint_state(&mut conn, &environment).await?;
        let may_connect = self.may_connect(caller, &environment);
        let volumes = crate::capacity::volumes::attachments_of_environment(&mut conn, id).await?;
        let node_replacements = self.node_replacements(&mut conn, id).await?;
        conn.commit().await?;
        Ok(EnvironmentDetail { environment, steps, units, may_connect, endpoint, volumes, node_replacements })
    }
}
