//! The rate card as records (`0035_rate_card.sql`): prices per GPU model and unit, the spot
//! discount and tenants' discounts, each from when it takes effect. `domain::rates` says
//! what a unit is charged; this module reads the card, shows it, and changes it (platform
//! admins, audited). Changes take effect now or at a coming midnight; only changes still
//! to come may be withdrawn, so nothing charged is ever charged again differently.

use berth_domain::Refusal;
use berth_domain::catalog::Offering;
use berth_domain::metering::format_money;
use berth_domain::policy::{Action, Reach, Target};
use berth_domain::rates::{self, DiscountOf, RateCard, RateKey};
pub use berth_domain::rates::{CardChange, CardEdit, DiscountLine, PriceLine, PriceList, SizePrice};
use sqlx::SqliteConnection;

use crate::audit::{self, Event, Outcome};
use crate::{Caller, Error, Platform, now_ms};

/// The card as stored now, changes to come included.
pub(crate) async fn rate_card(conn: &mut SqliteConnection) -> Result<RateCard, Error> {
    let mut card = RateCard::default();
    let prices: Vec<(String, String, i64, i64)> =
        sqlx::query_as("SELECT gpu_model, unit, cents_per_hour, effective_from FROM rates")
            .fetch_all(&mut *conn)
            .await?;
    for (model, unit, cents, from) in prices {
        match RateKey::parse(&model, &unit) {
            Some(key) => card.set_price(key, from, cents),
            None => tracing::warn!(model, unit, "a rate for a unit this Berth does not know is left out"),
        }
    }
    let discounts: Vec<(Option<i64>, i64, i64)> =
        sqlx::query_as("SELECT tenant_id, basis_points, effective_from FROM discounts").fetch_all(&mut *conn).await?;
    for (tenant, points, from) in discounts {
        card.set_discount(tenant.map_or(DiscountOf::Spot, DiscountOf::Tenant), from, points);
    }
    Ok(card)
}

/// Rows of `(id, effective_from, value)` as changes.
fn to_changes(rows: Vec<(i64, i64, i64)>, now: i64) -> Vec<CardChange> {
    rows.into_iter()
        .map(|(id, effective_from, value)| CardChange { id, effective_from, value, to_come: effective_from > now })
        .collect()
}

fn in_force(changes: &[CardChange]) -> Option<i64> {
    changes.iter().rev().find(|c| !c.to_come).map(|c| c.value)
}

impl Platform {
    /// The card as it stands, for charging and pricing.
    pub async fn rate_card(&self) -> Result<RateCard, Error> {
        let mut conn = self.db.acquire().await?;
        rate_card(&mut conn).await
    }

    /// Every catalog size's price now (what the catalog and the launch form show).
    pub async fn size_prices(&self) -> Result<Vec<SizePrice>, Error> {
        let card = self.rate_card().await?;
        let now = now_ms();
        Ok(Offering::ALL
            .iter()
            .flat_map(|o| o.sizes().iter().map(move |s| (o, s)))
            .map(|(offering, size)| SizePrice {
                offering: offering.id().to_owned(),
                size: size.id.to_owned(),
                cents_per_hour: card.size_price_at(size.shape, now),
            })
            .collect())
    }

    /// The prices page: every line of the card with its changes, the spot discount, and
    /// tenants' discounts for platform staff. Anyone who may see the catalog sees the
    /// prices (they are the catalog's); tenants' discounts are the platform's business.
    pub async fn price_list(&self, caller: &Caller) -> Result<PriceList, Error> {
        self.authorize(caller, Action::CatalogRead, Target::Platform).await?;
        let staff = caller.principal.reach(Action::TenantRead) == Some(Reach::All);
        let may_manage = caller.principal.reach(Action::CatalogManage) == Some(Reach::All);
        let now = now_ms();
        let mut conn = self.db.acquire().await?;
        let mut keys = RateKey::of_catalog();
        let stored: Vec<(String, String)> =
            sqlx::query_as("SELECT DISTINCT gpu_model, unit FROM rates").fetch_all(&mut *conn).await?;
        keys.extend(stored.iter().filter_map(|(m, u)| RateKey::parse(m, u)));
        keys.sort();
        keys.dedup();
        let mut lines = Vec::with_capacity(keys.len());
        for key in keys {
            let rows = sqlx::query_as(
                "SELECT id, effective_from, cents_per_hour FROM rates WHERE gpu_model = ? AND unit = ?
                 ORDER BY effective_from",
            )
            .bind(key.model.name())
            .bind(key.unit_key())
            .fetch_all(&mut *conn)
            .await?;
            let changes = to_changes(rows, now);
            let sizes = Offering::ALL
                .iter()
                .flat_map(|o| o.sizes().iter().map(move |s| (o, s)))
                .filter(|(_, s)| RateKey::of_shape(s.shape).0 == key)
                .map(|(o, s)| format!("{} {}", o.title(), s.label))
                .collect();
            lines.push(PriceLine {
                id: key.id(),
                label: key.label(),
                per: key.per().to_owned(),
                cents_per_hour: in_force(&changes),
                changes,
                sizes,
            });
        }
        let rows = sqlx::query_as(
            "SELECT id, effective_from, basis_points FROM discounts WHERE tenant_id IS NULL ORDER BY effective_from",
        )
        .fetch_all(&mut *conn)
        .await?;
        let spot_changes = to_changes(rows, now);
        let spot =
            DiscountLine { tenant: None, basis_points: in_force(&spot_changes).unwrap_or(0), changes: spot_changes };
        let (mut tenants, mut tenant_choices) = (Vec::new(), Vec::new());
        if staff {
            tenant_choices = sqlx::query_as("SELECT slug, name FROM tenants WHERE status <> 'deleted' ORDER BY name")
                .fetch_all(&mut *conn)
                .await?;
            let with: Vec<(i64, String)> = sqlx::query_as(
                "SELECT DISTINCT t.id, t.slug FROM discounts d JOIN tenants t ON t.id = d.tenant_id ORDER BY t.slug",
            )
            .fetch_all(&mut *conn)
            .await?;
            for (id, slug) in with {
                let rows = sqlx::query_as(
                    "SELECT id, effective_from, basis_points FROM discounts WHERE tenant_id = ? ORDER BY effective_from",
                )
                .bind(id)
                .fetch_all(&mut *conn)
                .await?;
                let changes = to_changes(rows, now);
                tenants.push(DiscountLine {
                    tenant: Some(slug),
                    basis_points: in_force(&changes).unwrap_or(0),
                    changes,
                });
            }
        }
        Ok(PriceList { lines, spot, tenants, tenant_choices, may_manage, now })
    }

    /// Changes the card from now or a coming midnight (platform admins; audited). A second
    /// change at the same time replaces a change still to come; one in force is kept.
    pub async fn change_card(&self, caller: &Caller, edit: &CardEdit) -> Result<(), Error> {
        self.authorize(caller, Action::CatalogManage, Target::Platform).await?;
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        let (action, target, detail) = match edit {
            CardEdit::Price { line, price, effective } => {
                let key = RateKey::parse_id(line).ok_or_else(|| {
                    Refusal::InvalidPrice(format!("there is no line \"{}\" on the rate card", line.trim()))
                })?;
                let cents = rates::parse_price(price)?;
                let from = rates::parse_effective(effective, now)?;
                sqlx::query(
                    "DELETE FROM rates WHERE gpu_model = ? AND unit = ? AND effective_from = ? AND effective_from > ?",
                )
                .bind(key.model.name())
                .bind(key.unit_key())
                .bind(from)
                .bind(now)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO rates (gpu_model, unit, cents_per_hour, effective_from, set_at, set_by)
                     VALUES (?, ?, ?, ?, ?, ?)",
                )
                .bind(key.model.name())
                .bind(key.unit_key())
                .bind(cents)
                .bind(from)
                .bind(now)
                .bind(caller.user_id())
                .execute(&mut *tx)
                .await?;
                let detail = format!("{} per {} from {}", format_money(cents), key.per(), when(from, now));
                ("price.set", key.id(), detail)
            }
            CardEdit::Discount { tenant, percent, effective } => {
                let points = rates::parse_percent(percent)?;
                let from = rates::parse_effective(effective, now)?;
                let tenant = tenant.trim();
                let tenant_id: Option<i64> = if tenant.is_empty() {
                    None
                } else {
                    let id = sqlx::query_scalar("SELECT id FROM tenants WHERE slug = ? AND status <> 'deleted'")
                        .bind(tenant)
                        .fetch_optional(&mut *tx)
                        .await?
                        .ok_or_else(|| Refusal::InvalidPrice(format!("there is no tenant \"{tenant}\"")))?;
                    Some(id)
                };
                sqlx::query("DELETE FROM discounts WHERE tenant_id IS ? AND effective_from = ? AND effective_from > ?")
                    .bind(tenant_id)
                    .bind(from)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(
                    "INSERT INTO discounts (tenant_id, basis_points, effective_from, set_at, set_by) VALUES (?, ?, ?, ?, ?)",
                )
                .bind(tenant_id)
                .bind(points)
                .bind(from)
                .bind(now)
                .bind(caller.user_id())
                .execute(&mut *tx)
                .await?;
                let target = if tenant.is_empty() { "spot".to_owned() } else { format!("tenant:{tenant}") };
                ("discount.set", target, format!("{} off from {}", rates::format_percent(points), when(from, now)))
            }
        };
        let event = Event { action, target: Some(&target), outcome: Outcome::Success, detail: Some(&detail) };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Withdraws a change still to come (`discount`: of a discount, else of a price).
    /// One in force stays: it has been charged.
    pub async fn withdraw_card_change(&self, caller: &Caller, discount: bool, id: i64) -> Result<(), Error> {
        self.authorize(caller, Action::CatalogManage, Target::Platform).await?;
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        let table = if discount { "discounts" } else { "rates" };
        let from: i64 = sqlx::query_scalar(&format!("SELECT effective_from FROM {table} WHERE id = ?"))
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(Error::NotFound)?;
        if from <= now {
            return Err(Refusal::InvalidPrice(
                "this change is in force and has been charged; add a new one from now instead".into(),
            )
            .into());
        }
        sqlx::query(&format!("DELETE FROM {table} WHERE id = ?")).bind(id).execute(&mut *tx).await?;
        let target = format!("{table}:{id}");
        let detail = format!("the change from {} withdrawn", when(from, now));
        let event =
            Event { action: "price.withdraw", target: Some(&target), outcome: Outcome::Success, detail: Some(&detail) };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        Ok(())
    }
}

/// "now" or "2026-12-01 (UTC)": when a change takes effect, for the audit log.
fn when(from: i64, now: i64) -> String {
    if from == now {
        return "now".into();
    }
    chrono::DateTime::from_timestamp_millis(from)
        .map_or_else(|| from.to_string(), |t| t.format("%Y-%m-%d (UTC)").to_string())
}
