//! Monthly statements (`0036_statements.sql`): once a month has ended, each tenant's usage
//! in it (and platform staff's own bookings, under no tenant) is closed into a statement
//! with line items per project, person, size and tier: hours, the rate, the amount at list
//! prices, the discount and the total. Written once, in one transaction, and frozen by the
//! database: later price changes, renames and deletions never rewrite it.
//!
//! The figures are the usage report's (`metering`): released units from their sums, the
//! rest row by row, each charged by the rate card; a closed month's charges are final
//! (the card never changes the past, and a unit still held is charged in the month only
//! up to the month's end).

use std::collections::BTreeMap;

use berth_domain::metering::{self, ChargeBasis, Month, format_money, to_cents};
use berth_domain::notification::Notice;
use berth_domain::policy::{Action, Reach};
use berth_domain::rates::{RateCard, RateKey};
use serde::{Deserialize, Serialize};
use sqlx::FromRow;

use super::metering::{SumKey, UNIT_COLUMNS, Unit, dollars, gpu_hours, within};
use super::rates::rate_card;
use crate::{Caller, Error, Platform, now_ms};

/// A closed month of a tenant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Statement {
    pub id: i64,
    pub tenant_id: Option<i64>,
    /// The tenant's name when it closed ("Platform staff" for staff's own bookings).
    pub tenant: String,
    pub month: Month,
    /// `use` or `window`: what bookings were charged for.
    pub basis: String,
    pub closed_at: i64,
    pub list_cents: i64,
    pub discount_cents: i64,
    pub total_cents: i64,
    pub lines: Vec<StatementLine>,
}

/// One line item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, FromRow)]
pub struct StatementLine {
    pub project: Option<String>,
    pub person: String,
    pub offering: String,
    /// The rate card's line: "H100-80GB, MIG 3g.40gb".
    pub size: String,
    pub tier: String,
    /// Hours of the size's unit (a GPU, a slice, a share).
    pub unit_hours: f64,
    pub gpu_hours: f64,
    /// "$3.20 per GPU-hour"; "$3.20, then $4.00 per GPU-hour" where the price changed.
    pub rate: String,
    pub list_cents: i64,
    pub discount_cents: i64,
    pub total_cents: i64,
}

/// A statement as the list shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, FromRow)]
pub struct StatementSummary {
    pub id: i64,
    pub tenant: String,
    pub month: String,
    pub closed_at: i64,
    pub total_cents: i64,
}

impl Statement {
    /// The statement as CSV: a row per line, then the totals.
    pub fn to_csv(&self) -> String {
        let field = |text: &str| {
            // Quoted, and never read as a formula by a spreadsheet.
            let text = if text.starts_with(['=', '+', '-', '@']) { format!("'{text}") } else { text.to_owned() };
            format!("\"{}\"", text.replace('"', "\"\""))
        };
        let mut csv = String::from(
            "tenant,month,project,person,offering,size,tier,unit_hours,gpu_hours,rate,amount,discount,total\n",
        );
        for l in &self.lines {
            csv.push_str(&format!(
                "{},{},{},{},{},{},{},{:.4},{:.4},{},{},{},{}\n",
                field(&self.tenant),
                self.month.key(),
                field(l.project.as_deref().unwrap_or("")),
                field(&l.person),
                l.offering,
                field(&l.size),
                l.tier,
                l.unit_hours,
                l.gpu_hours,
                field(&l.rate),
                dollars(l.list_cents),
                dollars(l.discount_cents),
                dollars(l.total_cents),
            ));
        }
        csv.push_str(&format!(
            "{},{},,,,,,,,total,{},{},{}\n",
            field(&self.tenant),
            self.month.key(),
            dollars(self.list_cents),
            dollars(self.discount_cents),
            dollars(self.total_cents)
        ));
        csv
    }
}

/// A line being added up: charged milliseconds, microcents at list and after discounts.
#[derive(Debug, Default)]
struct Tally {
    ms: i64,
    list: i64,
    net: i64,
}

#[derive(FromRow)]
struct SummedLine {
    #[sqlx(flatten)]
    key: SumKey,
    ms: i64,
    list: i64,
    net: i64,
}

#[derive(FromRow)]
struct RowUnit {
    #[sqlx(flatten)]
    key: SumKey,
    #[sqlx(flatten)]
    unit: Unit,
}

/// "$3.20 per GPU-hour", "$3.20, then $4.00 per GPU-hour".
fn rate_text(card: &RateCard, key: Option<RateKey>, month: Month) -> String {
    let Some(key) = key else { return "not on the rate card".into() };
    let (from, to) = month.span();
    let prices: Vec<String> = card.prices_within(key, from, to).into_iter().map(format_money).collect();
    format!("{} per {}", prices.join(", then "), key.per())
}

impl Platform {
    /// Closes every ended month that has usage and no statement yet, for every tenant and
    /// for platform staff's own bookings, oldest first, each in its own write transaction.
    /// Run by `berth serve` at start and every hour. Answers how many it closed.
    pub async fn close_months(&self) -> Result<usize, Error> {
        let last = Month::of(now_ms()).previous();
        let firsts: Vec<(Option<i64>, i64)> = sqlx::query_as(
            "SELECT l.tenant_id, min(r.starts_at) FROM usage_ledger l JOIN reservations r ON r.id = l.reservation_id
             GROUP BY l.tenant_id",
        )
        .fetch_all(&self.db)
        .await?;
        let mut closed = 0;
        for (tenant_id, first) in firsts {
            let mut month = Month::of(first);
            while month <= last {
                if self.close_month(tenant_id, month).await? {
                    closed += 1;
                }
                month = month.next();
            }
        }
        Ok(closed)
    }

    /// Closes one tenant's `month` (ended) into a statement, unless it has one. Answers
    /// whether it wrote one.
    pub async fn close_month(&self, tenant_id: Option<i64>, month: Month) -> Result<bool, Error> {
        let now = now_ms();
        let (month_start, month_end) = month.span();
        if month_end > now {
            return Ok(false);
        }
        let mut tx = self.begin_write().await?;
        let exists: i64 = sqlx::query_scalar("SELECT count(*) FROM statements WHERE tenant_id IS ? AND month = ?")
            .bind(tenant_id)
            .bind(month.key())
            .fetch_one(&mut *tx)
            .await?;
        if exists > 0 {
            return Ok(false);
        }
        let card = rate_card(&mut tx).await?;
        let mut lines: BTreeMap<SumKey, Tally> = BTreeMap::new();
        let basis = self.charging;
        // On the use basis released units are summed (and final); on the reserved-window
        // basis every unit is read, as the usage report does.
        let (ledger, summed) = match basis {
            ChargeBasis::Use => {
                let sums: Vec<SummedLine> = sqlx::query_as(
                    "SELECT tenant_id, project_id, owner_id, offering, tier, gpu_model, mig_profile, gpu_parts,
                            gpu_part_of, sum(ms) AS ms, sum(month_list_microcents) AS list, sum(month_microcents) AS net
                     FROM usage_sums WHERE basis = 'use' AND tenant_id IS ?1 AND day >= ?2 AND day < ?3
                     GROUP BY project_id, owner_id, offering, tier, gpu_model, mig_profile, gpu_parts, gpu_part_of",
                )
                .bind(tenant_id)
                .bind(month_start)
                .bind(month_end)
                .fetch_all(&mut *tx)
                .await?;
                for sum in sums {
                    let line = lines.entry(sum.key).or_default();
                    (line.ms, line.list, line.net) = (line.ms + sum.ms, line.list + sum.list, line.net + sum.net);
                }
                ("usage_ledger l INDEXED BY usage_ledger_unsummed", "l.summed = 0")
            }
            ChargeBasis::ReservedWindow => ("usage_ledger l", "1"),
        };
        let units: Vec<RowUnit> = sqlx::query_as(&format!(
            "SELECT l.project_id, l.owner_id, l.offering, l.mig_profile, l.gpu_parts, l.gpu_part_of, {UNIT_COLUMNS}
             FROM {ledger} JOIN reservations r ON r.id = l.reservation_id
             WHERE {summed} AND l.tenant_id IS ?1 AND r.starts_at < ?2 AND r.ends_at > ?3"
        ))
        .bind(tenant_id)
        .bind(month_end)
        .bind(month_start)
        .fetch_all(&mut *tx)
        .await?;
        for row in units {
            let Some((from, to)) = within(row.unit.time().charged(basis, now), month) else { continue };
            let charge = row.unit.charges(&card, from, to);
            let line = lines.entry(row.key).or_default();
            (line.ms, line.list, line.net) = (line.ms + to - from, line.list + charge.list, line.net + charge.net);
        }

        let tenant: String = match tenant_id {
            Some(id) => {
                sqlx::query_scalar("SELECT name FROM tenants WHERE id = ?").bind(id).fetch_one(&mut *tx).await?
            }
            None => "Platform staff".to_owned(),
        };
        let mut items = Vec::with_capacity(lines.len());
        for (key, tally) in lines.into_iter().filter(|(_, t)| t.ms > 0) {
            let project: Option<String> = match key.project_id {
                Some(id) => {
                    sqlx::query_scalar("SELECT name FROM projects WHERE id = ?")
                        .bind(id)
                        .fetch_optional(&mut *tx)
                        .await?
                }
                None => None,
            };
            let person: String = sqlx::query_scalar("SELECT email FROM users WHERE id = ?")
                .bind(key.owner_id)
                .fetch_one(&mut *tx)
                .await?;
            let rate_key = key.rate_key();
            let (list_cents, total_cents) = (to_cents(tally.list), to_cents(tally.net));
            items.push(StatementLine {
                project,
                person,
                size: rate_key.map_or_else(|| key.gpu_model.clone(), |k| k.label()),
                offering: key.offering.clone(),
                tier: key.tier.clone(),
                unit_hours: metering::hours(tally.ms),
                gpu_hours: gpu_hours(tally.ms, key.gpu_parts, key.gpu_part_of),
                rate: rate_text(&card, rate_key, month),
                list_cents,
                discount_cents: list_cents - total_cents,
                total_cents,
            });
        }
        items.sort_by(|a, b| {
            (&a.project, &a.person, &a.size, &a.tier, &a.offering).cmp(&(
                &b.project,
                &b.person,
                &b.size,
                &b.tier,
                &b.offering,
            ))
        });
        // Totals are the sums of the lines' cents, never rounded again.
        let list: i64 = items.iter().map(|l| l.list_cents).sum();
        let total: i64 = items.iter().map(|l| l.total_cents).sum();
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO statements (tenant_id, month, basis, closed_at, tenant, list_cents, discount_cents, total_cents)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
        )
        .bind(tenant_id)
        .bind(month.key())
        .bind(basis.as_str())
        .bind(now)
        .bind(&tenant)
        .bind(list)
        .bind(list - total)
        .bind(total)
        .fetch_one(&mut *tx)
        .await?;
        for (position, line) in items.iter().enumerate() {
            sqlx::query(
                "INSERT INTO statement_lines (statement_id, position, project, person, offering, size, tier, unit_hours,
                     gpu_hours, rate, list_cents, discount_cents, total_cents)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(id)
            .bind(i64::try_from(position).unwrap_or(i64::MAX))
            .bind(&line.project)
            .bind(&line.person)
            .bind(&line.offering)
            .bind(&line.size)
            .bind(&line.tier)
            .bind(line.unit_hours)
            .bind(line.gpu_hours)
            .bind(&line.rate)
            .bind(line.list_cents)
            .bind(line.discount_cents)
            .bind(line.total_cents)
            .execute(&mut *tx)
            .await?;
        }
        // The tenant's admins (and its webhooks) hear of it with the statement.
        if let Some(tenant_id) = tenant_id {
            let admins = crate::notifications::tenant_admins(&mut tx, tenant_id).await?;
            let notice = Notice::statement_ready(&tenant, &month.title(), &format_money(total), id);
            self.notify(&mut tx, Some(tenant_id), &admins, &notice).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// The statements the caller may see, newest first: every one for platform staff, the
    /// tenant's for its admins and viewers (a statement is the tenant's bill, not a
    /// member's).
    pub async fn statements(&self, caller: &Caller) -> Result<Vec<StatementSummary>, Error> {
        let tenant = self.statement_reach(caller).await?;
        Ok(sqlx::query_as(
            "SELECT id, tenant, month, closed_at, total_cents FROM statements
             WHERE ?1 IS NULL OR tenant_id = ?1 ORDER BY month DESC, tenant",
        )
        .bind(tenant)
        .fetch_all(&self.db)
        .await?)
    }

    /// One statement with its lines; one out of reach is not found.
    pub async fn statement(&self, caller: &Caller, id: i64) -> Result<Statement, Error> {
        let tenant = self.statement_reach(caller).await?;
        #[derive(FromRow)]
        struct Head {
            tenant_id: Option<i64>,
            tenant: String,
            month: String,
            basis: String,
            closed_at: i64,
            list_cents: i64,
            discount_cents: i64,
            total_cents: i64,
        }
        let head: Option<Head> = sqlx::query_as(
            "SELECT tenant_id, tenant, month, basis, closed_at, list_cents, discount_cents, total_cents
             FROM statements WHERE id = ?1 AND (?2 IS NULL OR tenant_id = ?2)",
        )
        .bind(id)
        .bind(tenant)
        .fetch_optional(&self.db)
        .await?;
        let Head { tenant_id, tenant, month, basis, closed_at, list_cents, discount_cents, total_cents } =
            head.ok_or(Error::NotFound)?;
        let lines = sqlx::query_as(
            "SELECT project, person, offering, size, tier, unit_hours, gpu_hours, rate, list_cents, discount_cents,
                    total_cents
             FROM statement_lines WHERE statement_id = ? ORDER BY position",
        )
        .bind(id)
        .fetch_all(&self.db)
        .await?;
        let month = Month::parse(&month).ok_or_else(|| Error::internal("a stored statement's month"))?;
        Ok(Statement { id, tenant_id, tenant, month, basis, closed_at, list_cents, discount_cents, total_cents, lines })
    }

    /// Whose statements the caller may read: `None` for all (platform staff), else their
    /// tenant's (tenant admins and viewers). Members may not (`statement.read`).
    async fn statement_reach(&self, caller: &Caller) -> Result<Option<i64>, Error> {
        self.authorize_in_tenant(caller, Action::StatementRead).await?;
        match caller.principal.reach(Action::StatementRead) {
            Some(Reach::All) => Ok(None),
            Some(Reach::Tenant) => caller.tenant_id().map(Some).ok_or(Error::Forbidden),
            _ => Err(Error::Forbidden),
        }
    }
}
