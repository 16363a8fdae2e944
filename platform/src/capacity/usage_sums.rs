//! Usage sums: a released unit's final charges added to `usage_sums` per charge basis,
//! UTC day and line (`SumKey`), in the transaction that releases it, so reports, budgets
//! and statements read a month in a few grouped rows instead of row by row (`metering`
//! reads them). A unit is counted by its sums or by its row, never both (`summed`).

use std::collections::{BTreeMap, BTreeSet};

use berth_domain::booking::DAY_MS;
use berth_domain::metering::{self, ChargeBasis, Month};
use berth_domain::rates::RateCard;
use sqlx::{FromRow, SqliteConnection};

use super::metering::{RELEASED_UNITS, SumKey, Unit, by_day};
use crate::capacity::rates::rate_card;
use crate::{Error, Platform};

/// The bases a released unit is summed on: both, so that `--charge-for` may change.
const BASES: [ChargeBasis; 2] = [ChargeBasis::Use, ChargeBasis::ReservedWindow];

/// A released unit as summing reads it.
#[derive(Debug, Clone, FromRow)]
struct ReleasedUnit {
    environment_id: String,
    reservation_id: i64,
    summed: bool,
    #[sqlx(flatten)]
    key: SumKey,
    #[sqlx(flatten)]
    unit: Unit,
}

/// What one unit adds to one day of one basis.
#[derive(Debug, Default)]
struct DayPart {
    ms: i64,
    day_microcents: i64,
    month_microcents: i64,
    month_list_microcents: i64,
    environments: i64,
}

/// The first millisecond of the UTC day `ms` falls in.
fn day_of(ms: i64) -> i64 {
    ms - ms.rem_euclid(DAY_MS)
}

/// Released units' charges on their way into `usage_sums`: added up per basis, day and
/// line in memory, then written once per row.
struct Summing<'a> {
    card: &'a RateCard,
    parts: BTreeMap<(&'static str, i64, SumKey), DayPart>,
    /// The units added, to be marked summed.
    units: Vec<i64>,
}

impl<'a> Summing<'a> {
    fn new(card: &'a RateCard) -> Summing<'a> {
        Summing { card, parts: BTreeMap::new(), units: Vec::new() }
    }

    /// Adds an environment's released units not summed yet (`units`: all its released
    /// units, summed or not).
    fn add_environment(&mut self, units: &[ReleasedUnit]) {
        // The months each basis already counts the environment in (its units share one
        // line: the environment's tenant, project, owner, offering, tier and size).
        let mut counted: BTreeSet<(&str, Month)> = BTreeSet::new();
        let months = |unit: &Unit, basis: ChargeBasis| {
            let span = unit.time().charged(basis, i64::MAX);
            span.map(|(from, to)| metering::split_by_month(from, to)).unwrap_or_default()
        };
        for released in units.iter().filter(|u| u.summed) {
            for basis in BASES {
                counted.extend(months(&released.unit, basis).into_iter().map(|(month, _, _)| (basis.as_str(), month)));
            }
        }
        for released in units.iter().filter(|u| !u.summed) {
            let unit = &released.unit;
            for basis in BASES {
                // Released: its charge on either basis is final.
                for (month, from, to) in months(unit, basis) {
                    let month_charge = unit.charges(self.card, from, to);
                    let first = self.part(basis, day_of(from), &released.key);
                    first.month_microcents += month_charge.net;
                    first.month_list_microcents += month_charge.list;
                    if counted.insert((basis.as_str(), month)) {
                        first.environments += 1;
                    }
                    let month_start = month.starts_at();
                    for (day, day_from, day_to) in by_day(month_start, from, to) {
                        let day_charge = unit.charge(self.card, day_from, day_to);
                        let part = self.part(basis, month_start + day as i64 * DAY_MS, &released.key);
                        part.ms += day_to - day_from;
                        part.day_microcents += day_charge;
                    }
                }
            }
            self.units.push(released.reservation_id);
        }
    }

    fn part(&mut self, basis: ChargeBasis, day: i64, key: &SumKey) -> &mut DayPart {
        self.parts.entry((basis.as_str(), day, key.clone())).or_default()
    }

    /// Writes the sums and marks the units summed, in the caller's transaction. Answers
    /// how many units.
    async fn write(self, conn: &mut SqliteConnection) -> Result<usize, Error> {
        for ((basis, day, key), part) in &self.parts {
            sqlx::query(
                "INSERT INTO usage_sums (basis, day, tenant_id, project_id, owner_id, offering, tier, gpu_model,
                     mig_profile, gpu_parts, gpu_part_of, ms, day_microcents, month_microcents, environments,
                     month_list_microcents)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)
                 ON CONFLICT (basis, coalesce(tenant_id, 0), day, coalesce(project_id, 0), owner_id, offering, tier,
                     gpu_model, coalesce(mig_profile, ''), gpu_parts, gpu_part_of)
                 DO UPDATE SET ms = ms + excluded.ms, day_microcents = day_microcents + excluded.day_microcents,
                     month_microcents = month_microcents + excluded.month_microcents,
                     environments = environments + excluded.environments,
                     month_list_microcents = month_list_microcents + excluded.month_list_microcents",
            )
            .bind(*basis)
            .bind(*day)
            .bind(key.tenant_id)
            .bind(key.project_id)
            .bind(key.owner_id)
            .bind(&key.offering)
            .bind(&key.tier)
            .bind(&key.gpu_model)
            .bind(&key.mig_profile)
            .bind(key.gpu_parts)
            .bind(key.gpu_part_of)
            .bind(part.ms)
            .bind(part.day_microcents)
            .bind(part.month_microcents)
            .bind(part.environments)
            .bind(part.month_list_microcents)
            .execute(&mut *conn)
            .await?;
        }
        if !self.units.is_empty() {
            sqlx::query("UPDATE usage_ledger SET summed = 1 WHERE reservation_id IN (SELECT value FROM json_each(?))")
                .bind(serde_json::to_string(&self.units).map_err(Error::internal)?)
                .execute(&mut *conn)
                .await?;
        }
        Ok(self.units.len())
    }
}

/// Adds the released units of `environments` not yet summed to `usage_sums` and marks
/// them summed, in the caller's transaction: the one that releases them, so that the sums
/// never drift from the ledger (a unit is counted by its sums or by its row, never both).
/// Answers how many units.
async fn sum_environments(conn: &mut SqliteConnection, environments: &[String]) -> Result<usize, Error> {
    let units: Vec<ReleasedUnit> = sqlx::query_as(RELEASED_UNITS)
        .bind(serde_json::to_string(environments).map_err(Error::internal)?)
        .fetch_all(&mut *conn)
        .await?;
    let card = rate_card(conn).await?;
    let mut summing = Summing::new(&card);
    for environment in units.chunk_by(|a, b| a.environment_id == b.environment_id) {
        summing.add_environment(environment);
    }
    summing.write(conn).await
}

/// Sums the released units of `environment_id` not summed yet: in the transaction that
/// releases them (see [`sum_environments`]).
pub(crate) async fn sum_released_units(conn: &mut SqliteConnection, environment_id: &str) -> Result<usize, Error> {
    sum_environments(conn, &[environment_id.to_owned()]).await
}

impl Platform {
    /// Sums the released units not summed yet (those released before sums existed): what
    /// `berth serve` does as it starts. In batches of environments, each batch one write
    /// transaction. Answers how many units it summed.
    pub async fn sum_released_usage(&self) -> Result<usize, Error> {
        let mut summed = 0;
        loop {
            let mut tx = self.begin_write().await?;
            let environments: Vec<String> = sqlx::query_scalar(
                "SELECT DISTINCT l.environment_id
                 FROM usage_ledger l INDEXED BY usage_ledger_unsummed JOIN reservations r ON r.id = l.reservation_id
                 WHERE l.summed = 0 AND r.released_at IS NOT NULL LIMIT 2000",
            )
            .fetch_all(&mut *tx)
            .await?;
            if environments.is_empty() {
                return Ok(summed);
            }
            summed += sum_environments(&mut tx, &environments).await?;
            tx.commit().await?;
        }
    }
}
