//! Metering: the usage ledger (written by the transactions that change capacity) and usage
//! reports. Budgets (`budgets`) and the sums released units are added to (`usage_sums`)
//! read and write the same ledger.
//!
//! The ledger has a row per capacity unit (`usage_ledger`, one per reservation): the launch
//! and a replica's booking insert it with the reservation (`RECORD_UNITS`), the start of
//! provisioning sets when its GPUs were held (`hold_units`), and its release is the
//! reservation's. What a unit is charged follows `domain::metering` (`ChargeBasis`, exact
//! money) and the rate card (`domain::rates`: each piece of its time at the rates and
//! discounts in force then); this module only reads the rows and adds them up.

use std::collections::{BTreeMap, BTreeSet};

use berth_domain::Refusal;
use berth_domain::booking::DAY_MS;
use berth_domain::booking::Tier;
use berth_domain::metering::{self, ChargeBasis, Month, UnitTime, to_cents};
use berth_domain::policy::Action;
use berth_domain::rates::{Charge, Priced, RateCard, RateKey};
use chrono::NaiveDate;
use serde::{Deserialize, Serialize};
use sqlx::{FromRow, SqliteConnection};

use crate::access::Scope;
use crate::capacity::budgets::BudgetStatus;
use crate::capacity::rates::rate_card;
use crate::{Caller, Error, Platform, now_ms};

/// Ledger rows for the units of a replica an environment just reserved, in the booking's
/// transaction; binds, in this order, when they were booked, the environment and the
/// replica (unnumbered, so that it can follow the reservations' INSERT in one round trip:
/// `environments::insert_reservations`). Units reserved while the environment already
/// holds GPUs (an endpoint's extra replica) are held from their window's start, which is
/// then. A MIG profile is stored by its key, whose first character is its compute slices
/// ("3g", "1g+me"); a whole GPU or a share holds `slice_size` of 8 memory slices.
pub(crate) const RECORD_UNITS: &str = "INSERT INTO usage_ledger (reservation_id, environment_id, tenant_id,
         project_id, owner_id, offering, size_id, gpu_model, mig_profile, tier, gpu_parts, gpu_part_of,
         size_cents_per_hour, units_per_copy, booked_at, held_from)
     SELECT r.id, e.id, e.tenant_id, e.project_id, e.owner_id, e.offering, e.size_id, g.model, r.mig_profile, e.tier,
         CASE WHEN r.mig_profile IS NULL THEN r.slice_size ELSE CAST(substr(r.mig_profile, 1, 1) AS INTEGER) END,
         CASE WHEN r.mig_profile IS NULL THEN 8 ELSE 7 END,
         e.cents_per_hour, count(*) OVER (), ?,
         CASE WHEN e.held_at IS NOT NULL THEN max(e.held_at, r.starts_at) END
     FROM reservations r JOIN environments e ON e.id = r.environment_id JOIN gpus g ON g.id = r.gpu_id
     WHERE r.environment_id = ? AND r.replica = ? AND r.released_at IS NULL
       AND NOT EXISTS (SELECT 1 FROM usage_ledger l WHERE l.reservation_id = r.id)";

/// [`RECORD_UNITS`] alone, for units whose reservations were written otherwise.
pub(crate) async fn record_units(
    conn: &mut SqliteConnection,
    environment_id: &str,
    replica: i64,
    now: i64,
) -> Result<(), Error> {
    sqlx::query(RECORD_UNITS).bind(now).bind(environment_id).bind(replica).execute(&mut *conn).await?;
    Ok(())
}

/// The environment's GPUs are held from `now` (provisioning starts): its history and its
/// units' ledger rows say so, in the transaction that moves it to provisioning.
pub(crate) async fn hold_units(conn: &mut SqliteConnection, environment_id: &str, now: i64) -> Result<(), Error> {
    let first = sqlx::query("UPDATE environments SET held_at = ?2 WHERE id = ?1 AND held_at IS NULL")
        .bind(environment_id)
        .bind(now)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    if first == 1 {
        sqlx::query(
            "UPDATE usage_ledger SET held_from = ?2
             WHERE environment_id = ?1 AND held_from IS NULL
               AND reservation_id IN (SELECT id FROM reservations WHERE environment_id = ?1 AND released_at IS NULL)",
        )
        .bind(environment_id)
        .bind(now)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// One unit of the ledger with whom it counts for and what it was.
#[derive(Debug, Clone, FromRow)]
struct LedgerUnit {
    #[sqlx(flatten)]
    unit: Unit,
    #[sqlx(flatten)]
    line: LineOf,
}

/// Whom usage counts for and what it was: what a report's line is chosen by.
#[derive(Debug, Clone, FromRow)]
struct LineOf {
    /// Empty for sums (which are never by environment).
    environment_id: String,
    environment: String,
    tenant: Option<String>,
    project: Option<String>,
    owner: String,
    offering: String,
    gpu_model: String,
    mig_profile: Option<String>,
    tier: String,
    gpu_parts: i64,
    gpu_part_of: i64,
}

impl LineOf {
    fn gpu_hours(&self, ms: i64) -> f64 {
        gpu_hours(ms, self.gpu_parts, self.gpu_part_of)
    }
}

/// What a ledger unit (`l`, with its reservation `r`) is charged by: its line of the rate
/// card (a MIG slice by its profile, a share of a time-sliced GPU by its ways, else a whole
/// GPU: `RateKey::unit_key`), its tier and tenant (for discounts), and its times.
macro_rules! unit_columns {
    () => {
        "l.gpu_model, CASE WHEN l.mig_profile IS NOT NULL THEN 'mig:' || l.mig_profile
             WHEN l.gpu_parts < l.gpu_part_of THEN 'share:' || (l.gpu_part_of / l.gpu_parts) ELSE 'gpu' END AS rate_unit,
         l.tier, l.tenant_id, l.held_from, r.starts_at, r.ends_at, r.released_at"
    };
}
pub(super) const UNIT_COLUMNS: &str = unit_columns!();

const LEDGER_UNIT_COLUMNS: &str = concat!(
    "l.environment_id, e.name AS environment, t.name AS tenant, p.name AS project, u.email AS owner, l.offering,
     l.mig_profile, l.gpu_parts, l.gpu_part_of, ",
    unit_columns!()
);

const LEDGER_UNIT_TABLES: &str = "usage_ledger l JOIN reservations r ON r.id = l.reservation_id
    JOIN environments e ON e.id = l.environment_id
    LEFT JOIN tenants t ON t.id = l.tenant_id LEFT JOIN projects p ON p.id = l.project_id
    JOIN users u ON u.id = l.owner_id";

/// How a usage report groups its lines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum UsageBy {
    #[default]
    Project,
    Person,
    Offering,
    /// GPU model, and MIG profile for slices.
    Model,
    /// Guaranteed or spot.
    Tier,
    Tenant,
    Environment,
}

impl UsageBy {
    pub const ALL: [UsageBy; 7] = [
        UsageBy::Project,
        UsageBy::Person,
        UsageBy::Offering,
        UsageBy::Model,
        UsageBy::Tier,
        UsageBy::Tenant,
        UsageBy::Environment,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            UsageBy::Project => "project",
            UsageBy::Person => "person",
            UsageBy::Offering => "offering",
            UsageBy::Model => "model",
            UsageBy::Tier => "tier",
            UsageBy::Tenant => "tenant",
            UsageBy::Environment => "environment",
        }
    }

    pub fn parse(text: &str) -> Option<UsageBy> {
        UsageBy::ALL.into_iter().find(|b| b.as_str() == text.trim())
    }

    /// The heading of the column that names a line.
    pub fn title(self) -> &'static str {
        match self {
            UsageBy::Project => "Project",
            UsageBy::Person => "Person",
            UsageBy::Offering => "Offering",
            UsageBy::Model => "GPU model / MIG profile",
            UsageBy::Tier => "Tier",
            UsageBy::Tenant => "Tenant",
            UsageBy::Environment => "Environment",
        }
    }

    /// The line a unit counts in: its key and how the page names it.
    fn line_of(self, unit: &LineOf) -> (String, String) {
        let key = match self {
            UsageBy::Environment => return (unit.environment_id.clone(), unit.environment.clone()),
            UsageBy::Project => unit.project.clone().unwrap_or_else(|| "(no project)".into()),
            UsageBy::Person => unit.owner.clone(),
            UsageBy::Offering => berth_domain::catalog::Offering::parse(&unit.offering)
                .map_or_else(|| unit.offering.clone(), |o| o.title().to_owned()),
            UsageBy::Model => match &unit.mig_profile {
                Some(key) => format!("{} {}", unit.gpu_model, berth_domain::mig::profile_name(&unit.gpu_model, key)),
                None if unit.gpu_parts < unit.gpu_part_of => format!("{} shared", unit.gpu_model),
                None => unit.gpu_model.clone(),
            },
            UsageBy::Tier => unit.tier.clone(),
            UsageBy::Tenant => unit.tenant.clone().unwrap_or_else(|| "(platform staff)".into()),
        };
        (key.clone(), key)
    }
}

/// Reads a report's month ("2026-11", empty for this month) and grouping ("project", ...;
/// empty for projects) as a page or the API names them.
pub fn parse_report(month: &str, by: &str) -> Result<(Month, UsageBy), Error> {
    let month = match month.trim() {
        "" => metering::this_month(),
        text => Month::parse(text)
            .ok_or_else(|| Refusal::InvalidUsageReport(format!("\"{text}\" is not a month like 2026-11")))?,
    };
    let by = match by.trim() {
        "" => UsageBy::default(),
        text => UsageBy::parse(text).ok_or_else(|| {
            let choices = UsageBy::ALL.map(UsageBy::as_str).join(", ");
            Refusal::InvalidUsageReport(format!("lines cannot be by \"{text}\"; choose one of {choices}"))
        })?,
    };
    Ok((month, by))
}

/// One line of a report: a project, person, offering, model or tier in the month.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageLine {
    /// What the line is (an environment's id, a project's name).
    pub key: String,
    /// How the page names it (an environment's name; the key for the others).
    pub label: String,
    /// GPU-equivalent hours charged (a 3g slice of an H100 counts 3/7 an hour an hour).
    pub gpu_hours: f64,
    /// Its units' charges, rounded once to the cent.
    pub cents: i64,
    /// Environments with charged time in the month.
    pub environments: usize,
}

/// A line being added up: microcents until the end, rounded once.
struct LineSum {
    label: String,
    microcents: i64,
    gpu_hours: f64,
    /// Environments counted unit by unit.
    environments: BTreeSet<String>,
    /// Environments counted by sums (each once, see `usage_sums.environments`).
    summed_environments: i64,
    /// Microcents and GPU-hours per day of the month.
    daily: Vec<i64>,
    daily_gpu_hours: Vec<f64>,
}

/// A month's lines being added up, from ledger units and from sums alike.
struct Tally<'a> {
    by: UsageBy,
    month: Month,
    card: &'a RateCard,
    lines: BTreeMap<String, LineSum>,
}

impl<'a> Tally<'a> {
    fn new(by: UsageBy, month: Month, card: &'a RateCard) -> Tally<'a> {
        Tally { by, month, card, lines: BTreeMap::new() }
    }

    fn line(&mut self, of: &LineOf) -> &mut LineSum {
        let days = self.month.days() as usize;
        let (key, label) = self.by.line_of(of);
        self.lines.entry(key).or_insert_with(|| LineSum {
            label,
            microcents: 0,
            gpu_hours: 0.0,
            environments: BTreeSet::new(),
            summed_environments: 0,
            daily: vec![0; days],
            daily_gpu_hours: vec![0.0; days],
        })
    }

    /// A unit charged for `[from, to)` within the month; its environment is counted unless
    /// the sums already count it.
    fn add_unit(&mut self, unit: &LedgerUnit, (from, to): (i64, i64), count_environment: bool) {
        let (month_start, card) = (self.month.starts_at(), self.card);
        let line = self.line(&unit.line);
        line.microcents += unit.unit.charge(card, from, to);
        line.gpu_hours += unit.line.gpu_hours(to - from);
        if count_environment {
            line.environments.insert(unit.line.environment_id.clone());
        }
        for (day, day_from, day_to) in by_day(month_start, from, to) {
            if let (Some(cents), Some(hours)) = (line.daily.get_mut(day), line.daily_gpu_hours.get_mut(day)) {
                *cents += unit.unit.charge(card, day_from, day_to);
                *hours += unit.line.gpu_hours(day_to - day_from);
            }
        }
    }

    /// A day's sum of released units.
    fn add_sum(&mut self, sum: &DaySum) {
        let day = usize::try_from((sum.day - self.month.starts_at()) / DAY_MS).unwrap_or(usize::MAX);
        let line = self.line(&sum.line);
        line.microcents += sum.month_microcents;
        line.gpu_hours += sum.line.gpu_hours(sum.ms);
        line.summed_environments += sum.environments;
        if let (Some(cents), Some(hours)) = (line.daily.get_mut(day), line.daily_gpu_hours.get_mut(day)) {
            *cents += sum.day_microcents;
            *hours += sum.line.gpu_hours(sum.ms);
        }
    }

    /// The lines, costliest first, and per day and per week each line's cents and
    /// GPU-hours in that order. A day's or a week's cents are rounded once, like a line's.
    fn finish(self) -> Finished {
        let days = self.month.days() as usize;
        let mut sums: Vec<(UsageLine, Vec<i64>, Vec<f64>)> = self
            .lines
            .into_iter()
            .map(|(key, sum)| {
                let line = UsageLine {
                    key,
                    label: sum.label,
                    gpu_hours: sum.gpu_hours,
                    cents: to_cents(sum.microcents),
                    environments: sum.environments.len() + usize::try_from(sum.summed_environments).unwrap_or(0),
                };
                (line, sum.daily, sum.daily_gpu_hours)
            })
            .collect();
        sums.sort_by(|a, b| b.0.cents.cmp(&a.0.cents).then_with(|| a.0.key.cmp(&b.0.key)));
        let period = |first: usize, last: usize| UsagePeriod {
            first_day: self.month.date_of(first),
            last_day: self.month.date_of(last),
            cents: sums.iter().map(|(_, cents, _)| to_cents(cents[first..=last].iter().sum())).collect(),
            gpu_hours: sums.iter().map(|(_, _, hours)| hours[first..=last].iter().sum()).collect(),
        };
        let daily = (0..days).map(|day| period(day, day)).collect();
        let weekly = self.month.weeks().iter().map(|w| period(w.first_day, w.last_day)).collect();
        Finished { lines: sums.into_iter().map(|(line, _, _)| line).collect(), daily, weekly }
    }
}

/// A month's lines added up (`Tally::finish`).
struct Finished {
    lines: Vec<UsageLine>,
    daily: Vec<UsagePeriod>,
    weekly: Vec<UsagePeriod>,
}

/// A day or a week of a report: each line's cents and GPU-hours, in the lines' order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsagePeriod {
    pub first_day: NaiveDate,
    pub last_day: NaiveDate,
    pub cents: Vec<i64>,
    pub gpu_hours: Vec<f64>,
}

impl UsagePeriod {
    pub fn total_cents(&self) -> i64 {
        self.cents.iter().sum()
    }

    pub fn total_gpu_hours(&self) -> f64 {
        self.gpu_hours.iter().sum()
    }
}

/// What a usage page shows: a month of the ledger within the caller's reach.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageReport {
    pub month: Month,
    pub basis: ChargeBasis,
    pub by: UsageBy,
    /// Costliest first.
    pub lines: Vec<UsageLine>,
    /// The sum of the lines' cents: equal to them exactly.
    pub total_cents: i64,
    pub total_gpu_hours: f64,
    /// Each day of the month, and each week (Monday to Sunday, cut at the month's edges):
    /// each line's cents and GPU-hours, in `lines` order. The chart's bars.
    pub daily: Vec<UsagePeriod>,
    pub weekly: Vec<UsagePeriod>,
    pub budgets: Vec<BudgetStatus>,
    /// For platform staff looking at the whole platform: each GPU model's GPU-hours held
    /// (by anyone) against what the fleet had, per day.
    pub fleet: Vec<ModelUse>,
    /// Up to when time is counted (now, or the month's end for a past month).
    pub counted_to: i64,
}

/// How a report's download cuts the month: whole, or a row per line and week or day.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UsageCut {
    #[default]
    Month,
    Week,
    Day,
}

impl UsageCut {
    /// Reads `month`, `week` or `day` (empty: month).
    pub fn parse(text: &str) -> Result<UsageCut, Error> {
        match text.trim() {
            "" | "month" => Ok(UsageCut::Month),
            "week" => Ok(UsageCut::Week),
            "day" => Ok(UsageCut::Day),
            other => {
                Err(Refusal::InvalidUsageReport(format!("a report is per month, week or day, not \"{other}\"")).into())
            }
        }
    }
}

/// Dollars and cents as a CSV cell: `1234.50`.
pub(super) fn dollars(cents: i64) -> String {
    format!("{}.{:02}", cents / 100, cents % 100)
}

impl UsageReport {
    /// The report as CSV, amounts in dollars with cents: its lines and total for the month,
    /// or per week or day each line with use in it and the period's total.
    pub fn to_csv_cut(&self, cut: UsageCut) -> String {
        let periods = match cut {
            UsageCut::Month => return self.to_csv(),
            UsageCut::Week => &self.weekly,
            UsageCut::Day => &self.daily,
        };
        let mut out = String::from("month,group_by,from,to,key,name,gpu_hours,amount_usd\r\n");
        let (month, by) = (self.month.key(), self.by.as_str());
        for period in periods {
            let (from, to) = (period.first_day.to_string(), period.last_day.to_string());
            let used =
                self.lines.iter().enumerate().filter(|(i, _)| period.cents[*i] != 0 || period.gpu_hours[*i] > 0.0);
            let mut rows: Vec<[String; 4]> = used
                .map(|(i, l)| {
                    [l.key.clone(), l.label.clone(), format!("{:.4}", period.gpu_hours[i]), dollars(period.cents[i])]
                })
                .collect();
            rows.push([
                "total".into(),
                String::new(),
                format!("{:.4}", period.total_gpu_hours()),
                dollars(period.total_cents()),
            ]);
            for r in &rows {
                let cells = [month.as_str(), by, &from, &to].into_iter().chain(r.iter().map(String::as_str));
                crate::audit::csv_row(&mut out, cells);
            }
        }
        out
    }

    /// The report's lines and total as CSV (RFC 4180), amounts in dollars with cents.
    pub fn to_csv(&self) -> String {
        let mut out = String::from("month,group_by,key,name,gpu_hours,environments,amount_usd\r\n");
        let month = self.month.key();
        let rows = self.lines.iter().map(|l| {
            [
                l.key.clone(),
                l.label.clone(),
                format!("{:.4}", l.gpu_hours),
                l.environments.to_string(),
                dollars(l.cents),
            ]
        });
        let total = [
            "total".to_owned(),
            String::new(),
            format!("{:.4}", self.total_gpu_hours),
            String::new(),
            dollars(self.total_cents),
        ];
        let rows: Vec<[String; 5]> = rows.chain(std::iter::once(total)).collect();
        for r in &rows {
            crate::audit::csv_row(
                &mut out,
                [month.as_str(), self.by.as_str()].into_iter().chain(r.iter().map(String::as_str)),
            );
        }
        out
    }
}

/// What a tenant's project (empty: none; an empty tenant is platform staff) was charged so
/// far, all time.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageTotal {
    pub tenant: String,
    pub project: String,
    pub gpu_hours: f64,
    pub cents: i64,
}

/// One GPU model's allocation over a month: what was held against what there was.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelUse {
    pub model: String,
    /// GPUs of the model in service now (the fleet file's; history is not kept).
    pub gpus: i64,
    /// GPU-equivalent hours held for bookings on each day of the month.
    pub allocated_gpu_hours: Vec<f64>,
    /// GPU-hours the fleet had on each day (up to `counted_to` on today, none after).
    pub capacity_gpu_hours: Vec<f64>,
}

impl Platform {
    /// What bookings are charged for on this platform.
    pub fn charging(&self) -> ChargeBasis {
        self.charging
    }

    /// A month of usage within the caller's reach, grouped `by`: everything for platform
    /// staff (or one tenant's, with `tenant`), the tenant's for its admins and viewers, one's
    /// own and one's projects' for members.
    pub async fn usage_report(
        &self,
        caller: &Caller,
        month: Month,
        by: UsageBy,
        tenant: Option<&str>,
    ) -> Result<UsageReport, Error> {
        self.authorize_in_tenant(caller, Action::UsageRead).await?;
        // Members (reach `Own`) see their own and their projects' units.
        let mut scope = Scope::of(caller, Action::UsageRead).ok_or(Error::Forbidden)?;
        // One read snapshot: a unit summed meanwhile is counted by its sums or by its row,
        // never both, never neither.
        let mut snapshot = self.db.begin().await?;
        let conn = &mut *snapshot;
        if let Some(slug) = tenant.map(str::trim).filter(|s| !s.is_empty()) {
            let id: Option<i64> = sqlx::query_scalar("SELECT id FROM tenants WHERE slug = ?")
                .bind(slug)
                .fetch_optional(&mut *conn)
                .await?;
            let id = id.filter(|&id| scope.all || scope.tenant_id == Some(id)).ok_or(Error::NotFound)?;
            (scope.all, scope.tenant_id) = (false, Some(id));
        }
        let now = now_ms();
        let counted_to = now.min(month.span().1);
        let card = rate_card(conn).await?;
        let mut tally = Tally::new(by, month, &card);
        let mut fleet_hours = Vec::new();
        // Released units' charges are summed per day and line (on either basis, final);
        // but a line per environment needs the rows, and on the reserved-window basis a unit
        // released early is still charged as its window passes: both count row by row.
        if self.charging == ChargeBasis::Use && by != UsageBy::Environment {
            for sum in &month_sums(conn, &scope, month, by).await? {
                tally.add_sum(sum);
            }
            let units = month_units(conn, &scope, month, UnitsToRead::Unsummed).await?;
            let counted = summed_environments(conn, &units, month).await?;
            for unit in &units {
                let Some(span) = within(unit.unit.time().charged(self.charging, counted_to), month) else { continue };
                tally.add_unit(unit, span, !counted.contains(&unit.line.environment_id));
            }
            if scope.all {
                fleet_hours.extend(month_held_sums(conn, month).await?);
                fleet_hours.extend(held_hours(&units, month, counted_to));
            }
        } else {
            let units = month_units(conn, &scope, month, UnitsToRead::All).await?;
            for unit in &units {
                let Some(span) = within(unit.unit.time().charged(self.charging, counted_to), month) else { continue };
                tally.add_unit(unit, span, true);
            }
            if scope.all {
                fleet_hours.extend(held_hours(&units, month, counted_to));
            }
        }
        let Finished { lines, daily, weekly } = tally.finish();
        let budgets = self.budget_statuses(conn, &card, &scope, month, counted_to).await?;
        let fleet = if scope.all { fleet_use(conn, fleet_hours, month, counted_to).await? } else { Vec::new() };
        snapshot.commit().await?;
        Ok(UsageReport {
            month,
            basis: self.charging,
            by,
            total_cents: lines.iter().map(|l| l.cents).sum(),
            total_gpu_hours: lines.iter().map(|l| l.gpu_hours).sum(),
            lines,
            daily,
            weekly,
            budgets,
            fleet,
            counted_to,
        })
    }

    /// GPU-hours and cost charged so far, all time, per tenant and project: the operator's
    /// `/metrics` counters (not a person's report: no caller). Reads the whole ledger.
    pub async fn usage_totals(&self) -> Result<Vec<UsageTotal>, Error> {
        #[derive(FromRow)]
        struct Charged {
            #[sqlx(flatten)]
            unit: Unit,
            tenant: Option<String>,
            project: Option<String>,
            gpu_parts: i64,
            gpu_part_of: i64,
        }
        let mut conn = self.db.acquire().await?;
        let card = rate_card(&mut conn).await?;
        let rows: Vec<Charged> = sqlx::query_as(&format!(
            "SELECT t.slug AS tenant, p.name AS project, l.gpu_parts, l.gpu_part_of, {UNIT_COLUMNS}
             FROM usage_ledger l JOIN reservations r ON r.id = l.reservation_id
             LEFT JOIN tenants t ON t.id = l.tenant_id LEFT JOIN projects p ON p.id = l.project_id"
        ))
        .fetch_all(&mut *conn)
        .await?;
        let now = now_ms();
        let mut totals: BTreeMap<(String, String), (f64, i64)> = BTreeMap::new();
        for row in rows {
            let Some((from, to)) = row.unit.time().charged(self.charging, now) else { continue };
            let total = totals.entry((row.tenant.unwrap_or_default(), row.project.unwrap_or_default())).or_default();
            total.0 += gpu_hours(to - from, row.gpu_parts, row.gpu_part_of);
            total.1 += row.unit.charge(&card, from, to);
        }
        Ok(totals
            .into_iter()
            .map(|((tenant, project), (gpu_hours, microcents))| UsageTotal {
                tenant,
                project,
                gpu_hours,
                cents: to_cents(microcents),
            })
            .collect())
    }
}

/// What a unit is charged by and its times (`UNIT_COLUMNS`): what its charge is computed
/// from.
#[derive(Debug, Clone, FromRow)]
pub(super) struct Unit {
    gpu_model: String,
    rate_unit: String,
    tier: String,
    tenant_id: Option<i64>,
    held_from: Option<i64>,
    starts_at: i64,
    ends_at: i64,
    released_at: Option<i64>,
}

impl Unit {
    pub(super) fn time(&self) -> UnitTime {
        UnitTime {
            starts_at: self.starts_at,
            ends_at: self.ends_at,
            held_from: self.held_from,
            released_at: self.released_at,
        }
    }

    /// Its charge for `[from, to)` after discounts, in microcents. A unit of a model this
    /// Berth no longer knows has no line on the card, and costs nothing (logged).
    pub(super) fn charge(&self, card: &RateCard, from: i64, to: i64) -> i64 {
        self.charges(card, from, to).net
    }

    /// Its charge for `[from, to)` at list rates and after discounts.
    pub(super) fn charges(&self, card: &RateCard, from: i64, to: i64) -> Charge {
        let Some(key) = RateKey::parse(&self.gpu_model, &self.rate_unit) else {
            tracing::warn!(
                model = self.gpu_model,
                unit = self.rate_unit,
                "a ledger unit with no line on the rate card"
            );
            return Charge::default();
        };
        card.charge(Priced { key, spot: self.tier == Tier::Spot.as_str(), tenant: self.tenant_id }, from, to)
    }
}

/// `[from, to)` (within the month that starts at `month_start`) cut at UTC midnights: each
/// day's index in the month and its part of the span.
pub(super) fn by_day(month_start: i64, from: i64, to: i64) -> impl Iterator<Item = (usize, i64, i64)> {
    let mut at = from;
    std::iter::from_fn(move || {
        (at < to).then(|| {
            let day = (at - month_start) / DAY_MS;
            let end = (month_start + (day + 1) * DAY_MS).min(to);
            let part = (day as usize, at, end);
            at = end;
            part
        })
    })
}

/// GPU-equivalent hours of a unit holding `parts / part_of` of a GPU for `ms`.
pub(super) fn gpu_hours(ms: i64, parts: i64, part_of: i64) -> f64 {
    metering::hours(ms) * parts as f64 / part_of as f64
}

/// The part of `span` within `month`, if any.
pub(super) fn within(span: Option<(i64, i64)>, month: Month) -> Option<(i64, i64)> {
    let (month_start, month_end) = month.span();
    let (from, to) = span?;
    let (from, to) = (from.max(month_start), to.min(month_end));
    (from < to).then_some((from, to))
}

/// Each model's GPU-hours held per day of `month` (`held`: model, the day's first
/// millisecond, GPU-hours) against the GPU-hours its in-service GPUs had.
async fn fleet_use(
    conn: &mut SqliteConnection,
    held: Vec<(String, i64, f64)>,
    month: Month,
    counted_to: i64,
) -> Result<Vec<ModelUse>, Error> {
    let models: Vec<(String, i64)> =
        sqlx::query_as("SELECT model, count(*) FROM gpus WHERE in_service = 1 GROUP BY model ORDER BY model")
            .fetch_all(&mut *conn)
            .await?;
    let (month_start, _) = month.span();
    let days = month.days() as usize;
    let mut fleet: Vec<ModelUse> = models
        .into_iter()
        .map(|(model, gpus)| {
            let capacity = (0..days as i64)
                .map(|day| {
                    let (from, to) = (month_start + day * DAY_MS, month_start + (day + 1) * DAY_MS);
                    gpus as f64 * metering::hours((to.min(counted_to) - from).max(0))
                })
                .collect();
            ModelUse { model, gpus, allocated_gpu_hours: vec![0.0; days], capacity_gpu_hours: capacity }
        })
        .collect();
    for (gpu_model, day, hours) in held {
        let Some(model) = fleet.iter_mut().find(|m| m.model == gpu_model) else { continue };
        let Ok(day) = usize::try_from((day - month_start) / DAY_MS) else { continue };
        if let Some(slot) = model.allocated_gpu_hours.get_mut(day) {
            *slot += hours;
        }
    }
    Ok(fleet)
}

/// What `units` held in `month` up to `counted_to`, day by day (whatever the charge basis:
/// held is held): model, the day's first millisecond, GPU-hours.
fn held_hours(units: &[LedgerUnit], month: Month, counted_to: i64) -> Vec<(String, i64, f64)> {
    let month_start = month.starts_at();
    let mut held = Vec::new();
    for unit in units {
        let Some((from, to)) = within(unit.unit.time().charged(ChargeBasis::Use, counted_to), month) else { continue };
        for (day, day_from, day_to) in by_day(month_start, from, to) {
            let hours = unit.line.gpu_hours(day_to - day_from);
            held.push((unit.unit.gpu_model.clone(), month_start + day as i64 * DAY_MS, hours));
        }
    }
    held
}

/// A day's sums of released units on one line (`usage_sums`), with the line's names.
#[derive(Debug, Clone, FromRow)]
struct DaySum {
    /// The day's first millisecond.
    day: i64,
    #[sqlx(flatten)]
    line: LineOf,
    ms: i64,
    day_microcents: i64,
    month_microcents: i64,
    environments: i64,
}

/// What `usage_sums` keys a line by: whom a unit counts for and what it was (also a
/// statement's line, `statements`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, FromRow)]
pub(super) struct SumKey {
    pub(super) tenant_id: Option<i64>,
    pub(super) project_id: Option<i64>,
    pub(super) owner_id: i64,
    pub(super) offering: String,
    pub(super) tier: String,
    pub(super) gpu_model: String,
    pub(super) mig_profile: Option<String>,
    pub(super) gpu_parts: i64,
    pub(super) gpu_part_of: i64,
}

impl SumKey {
    /// The rate card's line (as `unit_columns!` names it in SQL).
    pub(super) fn rate_key(&self) -> Option<RateKey> {
        let unit = match &self.mig_profile {
            Some(profile) => format!("mig:{profile}"),
            None if self.gpu_parts < self.gpu_part_of => format!("share:{}", self.gpu_part_of / self.gpu_parts.max(1)),
            None => "gpu".to_owned(),
        };
        RateKey::parse(&self.gpu_model, &unit)
    }
}

/// The released units of environments whose ids are the JSON array `ids`, summed or not,
/// each environment's together.
pub(super) const RELEASED_UNITS: &str = concat!(
    "SELECT l.environment_id, l.reservation_id, l.summed, l.project_id, l.owner_id, l.offering, l.mig_profile,
        l.gpu_parts, l.gpu_part_of, ",
    unit_columns!(),
    " FROM usage_ledger l JOIN reservations r ON r.id = l.reservation_id
    WHERE l.environment_id IN (SELECT value FROM json_each(?1)) AND r.released_at IS NOT NULL
    ORDER BY l.environment_id, l.reservation_id"
);

/// The scope of a report as a condition on `usage_sums s` (parameters ?3 to ?5 as
/// [`month_units`] binds them). A tenant's admins and viewers see the tenant's sums: their
/// own units and their projects' are in it.
fn sums_in_scope(scope: &Scope) -> &'static str {
    if scope.all {
        "?3"
    } else if scope.tenant_id.is_some() {
        "coalesce(s.tenant_id, 0) = ?4"
    } else {
        "(s.owner_id = ?5 OR s.project_id IN (SELECT project_id FROM project_members WHERE user_id = ?5))"
    }
}

/// The day sums of released units within `scope` in `month` (on the use basis), added up
/// per day and line `by` (and share of a GPU, for GPU-hours) in SQL: a line's days, not
/// every tenant, project, person and size's.
async fn month_sums(
    conn: &mut SqliteConnection,
    scope: &Scope,
    month: Month,
    by: UsageBy,
) -> Result<Vec<DaySum>, Error> {
    // What names the line, what it is grouped by, and where its name is; the other
    // columns are blank. Grouped first, named after: the names are looked up per line.
    let (column, group, join) = match by {
        UsageBy::Project => ("p.name AS project", "s.project_id", "LEFT JOIN projects p ON p.id = g.project_id"),
        UsageBy::Person => ("u.email AS owner", "s.owner_id", "LEFT JOIN users u ON u.id = g.owner_id"),
        UsageBy::Offering => ("g.offering", "s.offering", ""),
        UsageBy::Model => ("g.gpu_model, g.mig_profile", "s.gpu_model, s.mig_profile", ""),
        UsageBy::Tier => ("g.tier", "s.tier", ""),
        UsageBy::Tenant | UsageBy::Environment => {
            ("t.name AS tenant", "s.tenant_id", "LEFT JOIN tenants t ON t.id = g.tenant_id")
        }
    };
    let blank = [
        ("tenant", "NULL AS tenant"),
        ("project", "NULL AS project"),
        ("owner", "'' AS owner"),
        ("offering", "'' AS offering"),
        ("gpu_model", "'' AS gpu_model"),
        ("mig_profile", "NULL AS mig_profile"),
        ("tier", "'' AS tier"),
    ];
    let blanks: Vec<&str> = blank.iter().filter(|(name, _)| !column.contains(name)).map(|(_, sql)| *sql).collect();
    let (month_start, month_end) = month.span();
    Ok(sqlx::query_as(&format!(
        "SELECT g.day, '' AS environment_id, '' AS environment, {column}, {}, g.gpu_parts, g.gpu_part_of, g.ms,
                g.day_microcents, g.month_microcents, g.environments
         FROM (SELECT s.day, {group}, s.gpu_parts, s.gpu_part_of, sum(s.ms) AS ms,
                      sum(s.day_microcents) AS day_microcents, sum(s.month_microcents) AS month_microcents,
                      sum(s.environments) AS environments
               FROM usage_sums s
               WHERE s.basis = 'use' AND s.day >= ?1 AND s.day < ?2 AND {}
               GROUP BY s.day, {group}, s.gpu_parts, s.gpu_part_of) g
         {join}",
        blanks.join(", "),
        sums_in_scope(scope)
    ))
    .bind(month_start)
    .bind(month_end)
    .bind(scope.all)
    .bind(scope.tenant_id)
    .bind(scope.owner_id)
    .fetch_all(&mut *conn)
    .await?)
}

/// Every tenant's GPU-hours held in `month`, from the sums of released units: model, the
/// day's first millisecond, GPU-hours (the fleet's allocation, for platform staff).
async fn month_held_sums(conn: &mut SqliteConnection, month: Month) -> Result<Vec<(String, i64, f64)>, Error> {
    let (month_start, month_end) = month.span();
    let rows: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT gpu_model, day, gpu_parts, gpu_part_of, sum(ms) FROM usage_sums
         WHERE basis = 'use' AND day >= ?1 AND day < ?2 GROUP BY gpu_model, day, gpu_parts, gpu_part_of",
    )
    .bind(month_start)
    .bind(month_end)
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows.into_iter().map(|(model, day, parts, part_of, ms)| (model, day, gpu_hours(ms, parts, part_of))).collect())
}

/// The ledger units within `scope` whose windows touch `month`, all of them or those not
/// summed yet.
async fn month_units(
    conn: &mut SqliteConnection,
    scope: &Scope,
    month: Month,
    which: UnitsToRead,
) -> Result<Vec<LedgerUnit>, Error> {
    let (month_start, month_end) = month.span();
    let (ledger, summed) = which.ledger();
    let tables = LEDGER_UNIT_TABLES.replacen("usage_ledger l", ledger, 1);
    Ok(sqlx::query_as(&format!(
        "SELECT {LEDGER_UNIT_COLUMNS} FROM {tables}
         WHERE {summed} AND r.starts_at < ?1 AND r.ends_at > ?2
           AND (?3 OR l.tenant_id = ?4
                OR l.owner_id = ?5
                OR l.project_id IN (SELECT project_id FROM project_members WHERE user_id = ?5))"
    ))
    .bind(month_end)
    .bind(month_start)
    .bind(scope.all)
    .bind(scope.tenant_id)
    .bind(scope.owner_id)
    .fetch_all(&mut *conn)
    .await?)
}

/// Of the environments of `units`, those the sums already count in `month` (on the use
/// basis): a summed unit of theirs was charged in it.
async fn summed_environments(
    conn: &mut SqliteConnection,
    units: &[LedgerUnit],
    month: Month,
) -> Result<BTreeSet<String>, Error> {
    let ids: BTreeSet<&str> = units.iter().map(|u| u.line.environment_id.as_str()).collect();
    if ids.is_empty() {
        return Ok(BTreeSet::new());
    }
    let (month_start, month_end) = month.span();
    #[derive(FromRow)]
    struct Summed {
        environment_id: String,
        #[sqlx(flatten)]
        unit: Unit,
    }
    let rows: Vec<Summed> = sqlx::query_as(&format!(
        "SELECT l.environment_id, {UNIT_COLUMNS}
         FROM usage_ledger l JOIN reservations r ON r.id = l.reservation_id
         WHERE l.environment_id IN (SELECT value FROM json_each(?1)) AND l.summed = 1
           AND r.starts_at < ?2 AND r.ends_at > ?3"
    ))
    .bind(serde_json::to_string(&ids).map_err(Error::internal)?)
    .bind(month_end)
    .bind(month_start)
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .filter(|row| within(row.unit.time().charged(ChargeBasis::Use, i64::MAX), month).is_some())
        .map(|row| row.environment_id)
        .collect())
}

/// Which of a month's ledger units a report or a budget reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum UnitsToRead {
    /// Every unit: on the reserved-window basis one released early is still charged as
    /// its window passes, so sums at release do not hold its charge (and lines by
    /// environment are not summed).
    All,
    /// Those not summed yet (the held, the booked, the just released); the sums hold the
    /// rest.
    Unsummed,
}

impl UnitsToRead {
    /// The ledger as a query names it (`l`) and the condition on it.
    pub(super) fn ledger(self) -> (&'static str, &'static str) {
        match self {
            UnitsToRead::All => ("usage_ledger l", "1"),
            UnitsToRead::Unsummed => ("usage_ledger l INDEXED BY usage_ledger_unsummed", "l.summed = 0"),
        }
    }
}
