//! Metering: the usage ledger (written by the transactions that change capacity), usage
//! reports, and monthly budgets checked inside a booking's writer turn like quotas.
//!
//! The ledger has a row per capacity unit (`usage_ledger`, one per reservation): the launch
//! and a replica's booking insert it beside the reservation (`record_units`), the start of
//! provisioning sets when its GPUs were held (`hold_units`), and its release is the
//! reservation's. What a unit is charged follows `domain::metering` (`ChargeBasis`, exact
//! money) and the rate card (`domain::rates`: each piece of its time at the rates and
//! discounts in force then); this module only reads the rows and adds them up.

use std::collections::{BTreeMap, BTreeSet};

use berth_domain::Refusal;
use berth_domain::booking::Tier;
use berth_domain::booking::{DAY_MS, Window};
use berth_domain::metering::{self, Budget, BudgetOf, ChargeBasis, Month, UnitTime, to_cents};
use berth_domain::notification::Notice;
use berth_domain::placement::Shape;
use berth_domain::policy::{Action, Reach, Target};
use berth_domain::rates::{Charge, Priced, RateCard, RateKey};
use chrono::NaiveDate;
use serde::{Deserialize, Serialize};
use sqlx::{FromRow, SqliteConnection};

use crate::access::Scope;
use crate::audit::{self, Event, Outcome};
use crate::capacity::quotas::Booker;
use crate::capacity::rates::rate_card;
use crate::{Caller, Error, Platform, now_ms};

/// Ledger rows for the units of `replica` an environment just reserved, in the booking's
/// transaction. Units reserved while the environment already holds GPUs (an endpoint's
/// extra replica) are held from their window's start, which is then.
pub(crate) async fn record_units(
    conn: &mut SqliteConnection,
    environment_id: &str,
    replica: i64,
    now: i64,
) -> Result<(), Error> {
    // A MIG profile is stored by its key, whose first character is its compute slices
    // ("3g", "1g+me"); a whole GPU or a share holds `slice_size` of 8 memory slices.
    sqlx::query(
        "INSERT INTO usage_ledger (reservation_id, environment_id, tenant_id, project_id, owner_id, offering, size_id,
             gpu_model, mig_profile, tier, gpu_parts, gpu_part_of, size_cents_per_hour, units_per_copy, booked_at,
             held_from)
         SELECT r.id, e.id, e.tenant_id, e.project_id, e.owner_id, e.offering, e.size_id, g.model, r.mig_profile,
             e.tier,
             CASE WHEN r.mig_profile IS NULL THEN r.slice_size ELSE CAST(substr(r.mig_profile, 1, 1) AS INTEGER) END,
             CASE WHEN r.mig_profile IS NULL THEN 8 ELSE 7 END,
             e.cents_per_hour, count(*) OVER (), ?3,
             CASE WHEN e.held_at IS NOT NULL THEN max(e.held_at, r.starts_at) END
         FROM reservations r JOIN environments e ON e.id = r.environment_id JOIN gpus g ON g.id = r.gpu_id
         WHERE r.environment_id = ?1 AND r.replica = ?2 AND r.released_at IS NULL
           AND NOT EXISTS (SELECT 1 FROM usage_ledger l WHERE l.reservation_id = r.id)",
    )
    .bind(environment_id)
    .bind(replica)
    .bind(now)
    .execute(&mut *conn)
    .await?;
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

/// A monthly budget and how far the month has gone into it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetStatus {
    pub id: i64,
    pub tenant_id: i64,
    pub project_id: Option<i64>,
    /// "Tenant Acme", "Project acme/vision"
    pub of: String,
    pub cents_per_month: i64,
    pub warn_only: bool,
    /// Charged so far this month.
    pub spent_cents: i64,
    /// Charged, plus what running and booked environments will cost by the month's end:
    /// what bookings are checked against.
    pub committed_cents: i64,
    /// The marks (50, 80, 100 percent) reached this month, as recorded.
    pub reached: Vec<u32>,
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

fn dollars(cents: i64) -> String {
    format!("{}.{:02}", cents / 100, cents % 100)
}

/// Writes CSV rows (RFC 4180; cells quoted and never read as formulas).
fn csv_rows<'a>(out: &mut String, rows: impl Iterator<Item = Vec<&'a str>>) {
    for row in rows {
        for (i, value) in row.into_iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            crate::audit::csv_cell(out, value);
        }
        out.push_str("\r\n");
    }
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
            csv_rows(
                &mut out,
                rows.iter().map(|r| {
                    [month.as_str(), by, &from, &to].into_iter().chain(r.iter().map(String::as_str)).collect()
                }),
            );
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
        csv_rows(
            &mut out,
            rows.iter()
                .map(|r| [month.as_str(), self.by.as_str()].into_iter().chain(r.iter().map(String::as_str)).collect()),
        );
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

/// A budget to set, as the form names it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct BudgetChange {
    /// `tenant` (by slug; platform staff) or `project` (`tenant-slug/name`, or the name in the
    /// caller's tenant).
    pub level: String,
    pub who: String,
    /// Dollars a month, as typed ("2,000").
    pub amount: String,
    pub warn_only: bool,
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

    /// The budgets a report shows: the tenant's and its projects' (a member's: their
    /// tenant's and their projects'), or every tenant's for platform staff.
    async fn budget_statuses(
        &self,
        conn: &mut SqliteConnection,
        card: &RateCard,
        scope: &Scope,
        month: Month,
        counted_to: i64,
    ) -> Result<Vec<BudgetStatus>, Error> {
        // A member's (reach `Own`): their tenant's own budget and their projects'.
        let member_tenant: Option<i64> = match (scope.tenant_id, scope.owner_id) {
            (None, Some(id)) if !scope.all => {
                sqlx::query_scalar("SELECT tenant_id FROM users WHERE id = ?").bind(id).fetch_one(&mut *conn).await?
            }
            _ => None,
        };
        let rows: Vec<BudgetRow> = sqlx::query_as(&format!(
            "SELECT {BUDGET_COLUMNS} FROM {BUDGET_TABLES}
             WHERE t.status <> 'deleted'
               AND (?1 OR b.tenant_id = ?2
                    OR (b.tenant_id = ?3 AND (b.project_id IS NULL
                        OR b.project_id IN (SELECT project_id FROM project_members WHERE user_id = ?4))))
             ORDER BY t.name, b.project_id IS NOT NULL, p.name"
        ))
        .bind(scope.all)
        .bind(scope.tenant_id)
        .bind(member_tenant)
        .bind(scope.owner_id)
        .fetch_all(&mut *conn)
        .await?;
        let mut statuses = Vec::with_capacity(rows.len());
        let mut summed = SummedMonths::new(card);
        for BudgetRow { id, tenant_id, project_id, cents_per_month, warn_only, tenant, slug, project } in rows {
            let spent_cents = self.month_spent(conn, &mut summed, tenant_id, project_id, month, counted_to).await?;
            let committed_cents = self.month_committed(conn, &mut summed, tenant_id, project_id, month).await?;
            let reached: Vec<u32> = sqlx::query_scalar(
                "SELECT threshold FROM budget_alerts WHERE budget_id = ? AND month = ? ORDER BY threshold",
            )
            .bind(id)
            .bind(month.key())
            .fetch_all(&mut *conn)
            .await?;
            let of = match project {
                Some(name) => format!("Project {slug}/{name}"),
                None => format!("Tenant {tenant}"),
            };
            statuses.push(BudgetStatus {
                id,
                tenant_id,
                project_id,
                of,
                cents_per_month,
                warn_only,
                spent_cents,
                committed_cents,
                reached,
            });
        }
        Ok(statuses)
    }

    /// Refuses a booking whose cost would take its project or tenant past a monthly budget,
    /// month by month of its window; inside the booking's transaction, after its quota
    /// check, so nothing is written when it is refused. Marks it makes a budget reach are
    /// recorded (once each per month) and audited.
    pub(crate) async fn check_budgets(
        &self,
        conn: &mut SqliteConnection,
        caller: &Caller,
        booker: Booker,
        cost: BookingCost,
    ) -> Result<(), Error> {
        let Some(tenant_id) = booker.tenant_id else { return Ok(()) };
        let marks = self.budget_marks(conn, booker, cost).await?;
        for BudgetMark { id, budget, month, pct } in marks {
            let recorded = sqlx::query(
                "INSERT INTO budget_alerts (budget_id, month, threshold, at) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
            )
            .bind(id)
            .bind(month.key())
            .bind(pct)
            .bind(now_ms())
            .execute(&mut *conn)
            .await?
            .rows_affected();
            if recorded == 1 {
                let target = budget.of.to_string();
                let detail = format!(
                    "{pct}% of {} in {} reached{}",
                    metering::format_money(budget.cents_per_month),
                    month.title(),
                    if budget.warn_only { " (warn only)" } else { "" }
                );
                let event = Event {
                    action: "budget.threshold",
                    target: Some(&target),
                    outcome: Outcome::Success,
                    detail: Some(&detail),
                };
                audit::record(&mut *conn, &caller.actor(), event).await?;
                // The tenant's admins hear of it, and for a project's budget the person
                // whose booking crossed the mark.
                let mut told = crate::notifications::tenant_admins(&mut *conn, tenant_id).await?;
                if matches!(budget.of, BudgetOf::Project(_)) {
                    told.push(caller.user_id());
                }
                let notice = Notice::budget_mark(&target, pct, &month.title());
                self.notify(conn, Some(tenant_id), &told, &notice).await?;
            }
        }
        Ok(())
    }

    /// The marks (50, 80, 100 percent) a booking of `cost` by `booker` would make its
    /// project's and tenant's budgets reach, month by month of its window; refused
    /// (`OverBudget`) when it would take one past its limit. Reads only: the launch form's
    /// hints ask it too.
    pub(crate) async fn budget_marks(
        &self,
        conn: &mut SqliteConnection,
        booker: Booker,
        cost: BookingCost,
    ) -> Result<Vec<BudgetMark>, Error> {
        let Some(tenant_id) = booker.tenant_id else { return Ok(Vec::new()) };
        let budgets: Vec<BudgetRow> = sqlx::query_as(&format!(
            "SELECT {BUDGET_COLUMNS} FROM {BUDGET_TABLES}
             WHERE b.tenant_id = ? AND (b.project_id IS NULL OR b.project_id IS ?)
             ORDER BY b.project_id IS NULL"
        ))
        .bind(tenant_id)
        .bind(booker.project_id)
        .fetch_all(&mut *conn)
        .await?;
        if budgets.is_empty() {
            return Ok(Vec::new());
        }
        let card = rate_card(conn).await?;
        let priced = Priced { key: cost.key, spot: cost.tier == Tier::Spot, tenant: Some(tenant_id) };
        let whole = |from: i64, to: i64| to_cents(cost.units * card.charge(priced, from, to).net);
        let total = whole(cost.window.starts_at, cost.window.ends_at);
        let mut marks = Vec::new();
        let mut summed = SummedMonths::new(&card);
        for BudgetRow { id, project_id, cents_per_month, warn_only, tenant, project, .. } in budgets {
            let of = match project {
                Some(name) => BudgetOf::Project(name),
                None => BudgetOf::Tenant(tenant),
            };
            let budget = Budget { of, cents_per_month, warn_only };
            for (month, from, to) in metering::split_by_month(cost.window.starts_at, cost.window.ends_at) {
                let committed = self.month_committed(conn, &mut summed, tenant_id, project_id, month).await?;
                let this = whole(from, to);
                budget.check(cost.what, month, committed, this, total, cost.hours)?;
                for pct in budget.crossed(committed, committed + this) {
                    marks.push(BudgetMark { id, budget: budget.clone(), month, pct });
                }
            }
        }
        Ok(marks)
    }

    /// Sets a tenant's budget (platform staff) or a project's (its tenant's admins too),
    /// replacing the one it had. Someone out of reach is answered like someone who does not
    /// exist.
    pub async fn set_budget(&self, caller: &Caller, change: &BudgetChange) -> Result<(), Error> {
        self.authorize_in_tenant(caller, Action::UsageManage).await?;
        let cents = metering::parse_money(&change.amount)?;
        let who = change.who.trim();
        let missing = |what: &str| Error::Refused(Refusal::InvalidBudget(format!("there is no {what} \"{who}\"")));
        let (tenant_id, project_id, label): (i64, Option<i64>, String) = match change.level.trim() {
            "tenant" => {
                // A tenant's own budget is set by the platform, like its quota.
                self.authorize(caller, Action::UsageManage, Target::Platform).await?;
                let id: Option<i64> =
                    sqlx::query_scalar("SELECT id FROM tenants WHERE slug = ? AND status <> 'deleted'")
                        .bind(who)
                        .fetch_optional(&self.db)
                        .await?;
                (id.ok_or_else(|| missing("tenant"))?, None, format!("tenant {who}"))
            }
            "project" => {
                let (slug, name) = match who.split_once('/') {
                    Some((slug, name)) => (Some(slug.trim()), name.trim()),
                    None => (None, who),
                };
                let found: Option<(i64, i64, String)> = sqlx::query_as(
                    "SELECT p.tenant_id, p.id, t.slug FROM projects p JOIN tenants t ON t.id = p.tenant_id
                     WHERE p.name = ? AND t.status <> 'deleted' AND (t.slug = ? OR (? IS NULL AND t.id = ?))",
                )
                .bind(name)
                .bind(slug)
                .bind(slug)
                .bind(caller.tenant_id())
                .fetch_optional(&self.db)
                .await?;
                let (tenant_id, project_id, slug) = found.ok_or_else(|| missing("project"))?;
                if self.authorize(caller, Action::UsageManage, Target::Tenant(tenant_id)).await.is_err() {
                    return Err(missing("project"));
                }
                (tenant_id, Some(project_id), format!("project {slug}/{name}"))
            }
            other => {
                return Err(Refusal::InvalidBudget(format!(
                    "\"{other}\" is not something a budget applies to; choose tenant or project"
                ))
                .into());
            }
        };
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO budgets (tenant_id, project_id, cents_per_month, warn_only, updated_at, updated_by)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (tenant_id, coalesce(project_id, 0)) DO UPDATE SET
                cents_per_month = excluded.cents_per_month, warn_only = excluded.warn_only,
                updated_at = excluded.updated_at, updated_by = excluded.updated_by",
        )
        .bind(tenant_id)
        .bind(project_id)
        .bind(cents)
        .bind(change.warn_only)
        .bind(now_ms())
        .bind(caller.user_id())
        .execute(&mut *tx)
        .await?;
        let detail =
            format!("{} a month{}", metering::format_money(cents), if change.warn_only { ", warn only" } else { "" });
        let event =
            Event { action: "budget.set", target: Some(&label), outcome: Outcome::Success, detail: Some(&detail) };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Removes a budget: its tenant or project is no longer limited by cost.
    pub async fn remove_budget(&self, caller: &Caller, id: i64) -> Result<(), Error> {
        self.authorize_in_tenant(caller, Action::UsageManage).await?;
        let row: Option<(i64, Option<i64>, String, Option<String>)> = sqlx::query_as(
            "SELECT b.tenant_id, b.project_id, t.slug, p.name FROM budgets b JOIN tenants t ON t.id = b.tenant_id
             LEFT JOIN projects p ON p.id = b.project_id WHERE b.id = ?",
        )
        .bind(id)
        .fetch_optional(&self.db)
        .await?;
        let (tenant_id, project_id, slug, project) = row.ok_or(Error::NotFound)?;
        // A tenant's own budget is the platform's; rows out of reach look missing.
        let target = if project_id.is_some() { Target::Tenant(tenant_id) } else { Target::Platform };
        if self.authorize(caller, Action::UsageManage, target).await.is_err() {
            return Err(Error::NotFound);
        }
        let mut tx = self.begin_write().await?;
        sqlx::query("DELETE FROM budget_alerts WHERE budget_id = ?").bind(id).execute(&mut *tx).await?;
        sqlx::query("DELETE FROM budgets WHERE id = ?").bind(id).execute(&mut *tx).await?;
        let label = match project {
            Some(name) => format!("project {slug}/{name}"),
            None => format!("tenant {slug}"),
        };
        let event = Event { action: "budget.remove", target: Some(&label), outcome: Outcome::Success, detail: None };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        Ok(())
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

    /// Whether the caller may set budgets at all, and tenants' own (for forms).
    pub fn budget_reach(&self, caller: &Caller) -> (bool, bool) {
        let reach = caller.principal.reach(Action::UsageManage);
        (reach.is_some(), reach == Some(Reach::All))
    }
}

/// A budget as stored, with its tenant's and project's names.
#[derive(Debug, Clone, FromRow)]
struct BudgetRow {
    id: i64,
    tenant_id: i64,
    project_id: Option<i64>,
    cents_per_month: i64,
    warn_only: bool,
    tenant: String,
    slug: String,
    project: Option<String>,
}

const BUDGET_COLUMNS: &str =
    "b.id, b.tenant_id, b.project_id, b.cents_per_month, b.warn_only, t.name AS tenant, t.slug, p.name AS project";
const BUDGET_TABLES: &str =
    "budgets b JOIN tenants t ON t.id = b.tenant_id LEFT JOIN projects p ON p.id = b.project_id";

/// What a booking (or the part an extension or a scale-up adds) would cost: `units` of a
/// line of the rate card for `window`, at the rates and discounts in force (and to come)
/// over it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BookingCost {
    /// "booking", "extension", "scale-up": how the refusal names it.
    pub what: &'static str,
    pub key: RateKey,
    /// Capacity units (reservations): GPUs, slices or shares.
    pub units: i64,
    pub tier: Tier,
    pub window: Window,
    pub hours: u32,
}

impl BookingCost {
    /// A new booking of one of a size: as many units as the size holds of its rate line.
    pub(crate) fn of_size(shape: Shape, tier: Tier, window: Window, hours: u32) -> BookingCost {
        let (key, units) = RateKey::of_shape(shape);
        BookingCost { what: "booking", key, units: i64::from(units), tier, window, hours }
    }
}

/// A mark (50, 80 or 100 percent) a booking makes a budget reach in a month.
pub(crate) struct BudgetMark {
    id: i64,
    budget: Budget,
    month: Month,
    pct: u32,
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
    fn charge(&self, card: &RateCard, from: i64, to: i64) -> i64 {
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
fn by_day(month_start: i64, from: i64, to: i64) -> impl Iterator<Item = (usize, i64, i64)> {
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

/// What `units` are charged in `month` for the spans `span` picks, rounded once to the cent.
fn month_cents(units: &[Unit], card: &RateCard, month: Month, span: impl Fn(UnitTime) -> Option<(i64, i64)>) -> i64 {
    to_cents(units.iter().filter_map(|u| within(span(u.time()), month).map(|(f, t)| u.charge(card, f, t))).sum())
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

/// The bases a released unit is summed on: both, so that `--charge-for` may change.
const BASES: [ChargeBasis; 2] = [ChargeBasis::Use, ChargeBasis::ReservedWindow];

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

/// The released units of environments whose ids are the JSON array `ids`, summed or not,
/// each environment's together.
const RELEASED_UNITS: &str = concat!(
    "SELECT l.environment_id, l.reservation_id, l.summed, l.project_id, l.owner_id, l.offering, l.mig_profile,
        l.gpu_parts, l.gpu_part_of, ",
    unit_columns!(),
    " FROM usage_ledger l JOIN reservations r ON r.id = l.reservation_id
    WHERE l.environment_id IN (SELECT value FROM json_each(?1)) AND r.released_at IS NOT NULL
    ORDER BY l.environment_id, l.reservation_id"
);

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
enum UnitsToRead {
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
    fn ledger(self) -> (&'static str, &'static str) {
        match self {
            UnitsToRead::All => ("usage_ledger l", "1"),
            UnitsToRead::Unsummed => ("usage_ledger l INDEXED BY usage_ledger_unsummed", "l.summed = 0"),
        }
    }
}

/// The units of a tenant (or one of its projects) whose windows touch `month`.
async fn budget_units(
    conn: &mut SqliteConnection,
    tenant_id: i64,
    project_id: Option<i64>,
    month: Month,
    which: UnitsToRead,
) -> Result<Vec<Unit>, Error> {
    let (ledger, summed) = which.ledger();
    let (month_start, month_end) = month.span();
    Ok(sqlx::query_as(&format!(
        "SELECT {UNIT_COLUMNS}
         FROM {ledger} JOIN reservations r ON r.id = l.reservation_id
         WHERE {summed} AND l.tenant_id = ?1 AND (?2 IS NULL OR l.project_id = ?2)
           AND r.starts_at < ?3 AND r.ends_at > ?4"
    ))
    .bind(tenant_id)
    .bind(project_id)
    .bind(month_end)
    .bind(month_start)
    .fetch_all(&mut *conn)
    .await?)
}

/// What budgets read of tenants' months: the rate card the open units are charged by, and
/// the microcents summed per project, each tenant's month on a basis read once (one grouped
/// read of its sums), however many of its budgets ask.
struct SummedMonths<'a> {
    card: &'a RateCard,
    sums: BTreeMap<(i64, &'static str, Month), BTreeMap<Option<i64>, i64>>,
}

impl<'a> SummedMonths<'a> {
    fn new(card: &'a RateCard) -> SummedMonths<'a> {
        SummedMonths { card, sums: BTreeMap::new() }
    }

    /// The microcents summed for a tenant (or one of its projects) in `month` on `basis`.
    async fn microcents(
        &mut self,
        conn: &mut SqliteConnection,
        basis: ChargeBasis,
        tenant_id: i64,
        project_id: Option<i64>,
        month: Month,
    ) -> Result<i64, Error> {
        let key = (tenant_id, basis.as_str(), month);
        if let std::collections::btree_map::Entry::Vacant(slot) = self.sums.entry(key) {
            let (month_start, month_end) = month.span();
            let rows: Vec<(Option<i64>, i64)> = sqlx::query_as(
                "SELECT project_id, sum(month_microcents) FROM usage_sums
                 WHERE basis = ?1 AND coalesce(tenant_id, 0) = ?2 AND day >= ?3 AND day < ?4
                 GROUP BY project_id",
            )
            .bind(basis.as_str())
            .bind(tenant_id)
            .bind(month_start)
            .bind(month_end)
            .fetch_all(&mut *conn)
            .await?;
            slot.insert(rows.into_iter().collect());
        }
        let projects = self.sums.get(&key).ok_or_else(|| Error::internal("summed month not read"))?;
        Ok(match project_id {
            Some(_) => projects.get(&project_id).copied().unwrap_or(0),
            None => projects.values().sum(),
        })
    }
}

impl Platform {
    /// What a tenant (or one of its projects) has committed in `month`, in cents: what
    /// bookings are checked against. Released units from their sums, the rest row by row;
    /// a few reads whatever the month's size.
    async fn month_committed(
        &self,
        conn: &mut SqliteConnection,
        summed: &mut SummedMonths<'_>,
        tenant_id: i64,
        project_id: Option<i64>,
        month: Month,
    ) -> Result<i64, Error> {
        let card = summed.card;
        let summed = summed.microcents(conn, self.charging, tenant_id, project_id, month).await?;
        let units = budget_units(conn, tenant_id, project_id, month, UnitsToRead::Unsummed).await?;
        let open: i64 = units
            .iter()
            .filter_map(|u| within(u.time().committed(self.charging), month).map(|(f, t)| u.charge(card, f, t)))
            .sum();
        Ok(to_cents(summed + open))
    }

    /// What a tenant (or one of its projects) was charged in `month` up to `counted_to`, in
    /// cents. On the reserved-window basis a unit released early is still charged as its
    /// window passes, so there every unit is read.
    async fn month_spent(
        &self,
        conn: &mut SqliteConnection,
        summed: &mut SummedMonths<'_>,
        tenant_id: i64,
        project_id: Option<i64>,
        month: Month,
        counted_to: i64,
    ) -> Result<i64, Error> {
        if self.charging == ChargeBasis::ReservedWindow {
            let units = budget_units(conn, tenant_id, project_id, month, UnitsToRead::All).await?;
            return Ok(month_cents(&units, summed.card, month, |u| u.charged(self.charging, counted_to)));
        }
        let card = summed.card;
        let summed = summed.microcents(conn, ChargeBasis::Use, tenant_id, project_id, month).await?;
        let units = budget_units(conn, tenant_id, project_id, month, UnitsToRead::Unsummed).await?;
        let open: i64 = units
            .iter()
            .filter_map(|u| {
                within(u.time().charged(ChargeBasis::Use, counted_to), month).map(|(f, t)| u.charge(card, f, t))
            })
            .sum();
        Ok(to_cents(summed + open))
    }

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
