//! The rate card: prices per GPU model and unit, the spot discount and tenants' discounts,
//! each from when it takes effect (`platform::capacity::rates`). Everyone reads the prices;
//! platform admins change them (`catalog.manage`) and see tenants' discounts.

use axum::Json;
use axum::extract::Path;
use berth_domain::rates::{CardChange, CardEdit, DiscountLine, PriceList};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{ApiError, Body, TokenCaller, fail, rfc3339};

/// One change of the card: a price or a discount from a time.
#[derive(Serialize, ToSchema)]
pub struct CardChangeBody {
    /// What `DELETE` names to withdraw it while it is still to come.
    id: i64,
    /// When it takes effect (`1970-01-01T00:00:00.000Z`: the card a Berth began with).
    #[schema(format = DateTime)]
    effective_from: String,
    /// US cents per unit-hour for a price; basis points (1/100 of a percent) off for a
    /// discount.
    value: i64,
    /// It takes effect later (and may still be withdrawn).
    to_come: bool,
}

/// A line of the card: a kind of unit on a GPU model.
#[derive(Serialize, ToSchema)]
pub struct PriceLineBody {
    /// What a change names (`line`): `H100-80GB/gpu`, `H100-80GB/mig:3g`, `L40S/share:4`.
    #[schema(example = "H100-80GB/gpu")]
    line: String,
    /// "H100-80GB, whole GPU".
    label: String,
    /// What the price is for an hour of: `GPU-hour`, `slice-hour`, `share-hour`.
    per: String,
    /// In force now; `null` when the line has none yet (its sizes cannot be booked).
    cents_per_hour: Option<i64>,
    changes: Vec<CardChangeBody>,
    /// The catalog sizes priced by it.
    sizes: Vec<String>,
}

/// The spot discount (`tenant` null) or a tenant's.
#[derive(Serialize, ToSchema)]
pub struct DiscountBody {
    /// The tenant's slug; `null` for the spot discount.
    tenant: Option<String>,
    /// In force now, in basis points.
    basis_points: i64,
    changes: Vec<CardChangeBody>,
}

#[derive(Serialize, ToSchema)]
pub struct RateCardBody {
    lines: Vec<PriceLineBody>,
    spot: DiscountBody,
    /// Tenants' discounts: for platform staff only (empty for everyone else).
    tenants: Vec<DiscountBody>,
}

fn changes(changes: Vec<CardChange>) -> Vec<CardChangeBody> {
    changes
        .into_iter()
        .map(|c| CardChangeBody {
            id: c.id,
            effective_from: rfc3339(c.effective_from),
            value: c.value,
            to_come: c.to_come,
        })
        .collect()
}

fn discount(d: DiscountLine) -> DiscountBody {
    DiscountBody { tenant: d.tenant, basis_points: d.basis_points, changes: changes(d.changes) }
}

fn card_body(list: PriceList) -> RateCardBody {
    RateCardBody {
        lines: list
            .lines
            .into_iter()
            .map(|l| PriceLineBody {
                line: l.id,
                label: l.label,
                per: l.per,
                cents_per_hour: l.cents_per_hour,
                changes: changes(l.changes),
                sizes: l.sizes,
            })
            .collect(),
        spot: discount(list.spot),
        tenants: list.tenants.into_iter().map(discount).collect(),
    }
}

/// The rate card: every line's price in force and its changes, the discounts.
#[utoipa::path(get, path = "/api/v1/prices", tag = "prices", responses((status = 200, body = RateCardBody)))]
pub(super) async fn prices(TokenCaller(platform, caller): TokenCaller) -> Result<Json<RateCardBody>, ApiError> {
    let list = platform.price_list(&caller).await.map_err(fail(&caller))?;
    Ok(Json(card_body(list)))
}

/// A new price for a line of the card.
#[derive(Deserialize, ToSchema)]
pub struct NewPrice {
    #[schema(example = "H100-80GB/gpu")]
    line: String,
    /// Dollars per unit-hour, e.g. `3.20`.
    #[schema(example = "3.20")]
    price: String,
    /// Empty: now; else a coming day (`2026-12-01`), from its midnight, UTC.
    #[serde(default)]
    #[schema(example = "")]
    effective: String,
}

/// Prices a line from now or from a coming midnight (platform admins); a second change for
/// the same time replaces one still to come. Answers the card.
#[utoipa::path(post, path = "/api/v1/prices", tag = "prices", request_body = NewPrice,
    responses((status = 200, body = RateCardBody)))]
pub(super) async fn set_price(
    TokenCaller(platform, caller): TokenCaller,
    Body(asked): Body<NewPrice>,
) -> Result<Json<RateCardBody>, ApiError> {
    let edit = CardEdit::Price { line: asked.line, price: asked.price, effective: asked.effective };
    platform.change_card(&caller, &edit).await.map_err(fail(&caller))?;
    prices(TokenCaller(platform, caller)).await
}

/// A discount: the spot discount (no `tenant`) or a tenant's.
#[derive(Deserialize, ToSchema)]
pub struct NewDiscount {
    /// The tenant's slug; empty or absent for the spot discount.
    #[serde(default)]
    tenant: String,
    /// Percent off, e.g. `12.5`.
    #[schema(example = "12.5")]
    percent: String,
    /// Empty: now; else a coming day (`2026-12-01`), from its midnight, UTC.
    #[serde(default)]
    #[schema(example = "")]
    effective: String,
}

/// Sets a discount from now or from a coming midnight (platform admins). Answers the card.
#[utoipa::path(post, path = "/api/v1/discounts", tag = "prices", request_body = NewDiscount,
    responses((status = 200, body = RateCardBody)))]
pub(super) async fn set_discount(
    TokenCaller(platform, caller): TokenCaller,
    Body(asked): Body<NewDiscount>,
) -> Result<Json<RateCardBody>, ApiError> {
    let edit = CardEdit::Discount { tenant: asked.tenant, percent: asked.percent, effective: asked.effective };
    platform.change_card(&caller, &edit).await.map_err(fail(&caller))?;
    prices(TokenCaller(platform, caller)).await
}

/// Withdraws a price change still to come (one in force has been charged and stays).
#[utoipa::path(delete, path = "/api/v1/prices/{id}", tag = "prices",
    params(("id" = i64, Path, description = "The change's id")),
    responses((status = 200, body = RateCardBody)))]
pub(super) async fn withdraw_price(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<i64>,
) -> Result<Json<RateCardBody>, ApiError> {
    platform.withdraw_card_change(&caller, false, id).await.map_err(fail(&caller))?;
    prices(TokenCaller(platform, caller)).await
}

/// Withdraws a discount change still to come.
#[utoipa::path(delete, path = "/api/v1/discounts/{id}", tag = "prices",
    params(("id" = i64, Path, description = "The change's id")),
    responses((status = 200, body = RateCardBody)))]
pub(super) async fn withdraw_discount(
    TokenCaller(platform, caller): TokenCaller,
    Path(id): Path<i64>,
) -> Result<Json<RateCardBody>, ApiError> {
    platform.withdraw_card_change(&caller, true, id).await.map_err(fail(&caller))?;
    prices(TokenCaller(platform, caller)).await
}
