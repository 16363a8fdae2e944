//! The rate card's page (`/admin/prices`): the prices in force and to come, the spot
//! discount and tenants' discounts; platform admins change them.

use berth_domain::rates::PriceList;
use leptos::prelude::*;

use crate::error::AppError;

/// The rate card as the caller may see it.
#[server(endpoint = "rate_card_page")]
pub async fn rate_card_page() -> Result<PriceList, AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform.price_list(&caller).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))
}

/// A new price for a line of the card (`line`: "H100-80GB/gpu"), from now (`effective`
/// empty) or from a coming day's midnight, UTC (`2026-12-01`).
#[server(endpoint = "set_price")]
pub async fn set_price(line: String, price: String, effective: String) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let edit = berth_domain::rates::CardEdit::Price { line, price, effective };
    platform.change_card(&caller, &edit).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/admin/prices?saved=price");
    Ok(())
}

/// A discount in percent: the spot discount (`tenant` empty) or a tenant's (its slug).
#[server(endpoint = "set_discount")]
pub async fn set_discount(tenant: String, percent: String, effective: String) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let edit = berth_domain::rates::CardEdit::Discount { tenant, percent, effective };
    platform.change_card(&caller, &edit).await.map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/admin/prices?saved=discount");
    Ok(())
}

/// Withdraws a change still to come (`kind`: `price` or `discount`).
#[server(endpoint = "withdraw_price_change")]
pub async fn withdraw_price_change(kind: String, id: i64) -> Result<(), AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    platform
        .withdraw_card_change(&caller, kind == "discount", id)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    leptos_axum::redirect("/admin/prices?saved=price-withdrawn");
    Ok(())
}
