//! Monthly budgets: what tenants and their projects may spend, checked in a booking's
//! writer turn like quotas (`check_budgets`, read alone by the launch form's hints through
//! `budget_marks`), the marks they reach (50, 80, 100%, audited and notified), and what a
//! month has spent and committed, read from the usage ledger and its sums (`metering`).

use std::collections::BTreeMap;

use berth_domain::Refusal;
use berth_domain::booking::{Tier, Window};
use berth_domain::metering::{self, Budget, BudgetOf, ChargeBasis, Month, UnitTime, to_cents};
use berth_domain::notification::Notice;
use berth_domain::placement::Shape;
use berth_domain::policy::{Action, Reach, Target};
use berth_domain::rates::{Priced, RateCard, RateKey};
use serde::{Deserialize, Serialize};
use sqlx::{FromRow, SqliteConnection};

use super::metering::{UNIT_COLUMNS, Unit, UnitsToRead, within};
use crate::access::Scope;
use crate::audit::{self, Event, Outcome};
use crate::capacity::quotas::Booker;
use crate::{Caller, Error, Platform, now_ms};

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
    /// The budgets a report shows: the tenant's and its projects' (a member's: their
    /// tenant's and their projects'), or every tenant's for platform staff.
    pub(super) async fn budget_statuses(
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
        card: &RateCard,
    ) -> Result<(), Error> {
        let Some(tenant_id) = booker.tenant_id else { return Ok(()) };
        let marks = self.budget_marks(conn, booker, cost, card).await?;
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
        card: &RateCard,
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
        let priced = Priced { key: cost.key, spot: cost.tier == Tier::Spot, tenant: Some(tenant_id) };
        let whole = |from: i64, to: i64| to_cents(cost.units * card.charge(priced, from, to).net);
        let total = whole(cost.window.starts_at, cost.window.ends_at);
        let mut marks = Vec::new();
        let mut summed = SummedMonths::new(card);
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

/// What `units` are charged in `month` for the spans `span` picks, rounded once to the cent.
fn month_cents(units: &[Unit], card: &RateCard, month: Month, span: impl Fn(UnitTime) -> Option<(i64, i64)>) -> i64 {
    to_cents(units.iter().filter_map(|u| within(span(u.time()), month).map(|(f, t)| u.charge(card, f, t))).sum())
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
}
