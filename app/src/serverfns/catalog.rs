use leptos::prelude::*;

use crate::error::AppError;
use crate::model::ModelCapacity;

/// GPUs per model and how many are idle right now; public, like the catalog.
#[server(endpoint = "fleet_capacity")]
pub async fn fleet_capacity() -> Result<Vec<ModelCapacity>, AppError> {
    use super::ssr;
    let meta = ssr::request_meta().await;
    let platform = ssr::platform(&meta)?;
    let capacity = platform.capacity_by_model().await.map_err(|e| AppError::from_platform(e, &meta.request_id))?;
    Ok(capacity
        .into_iter()
        .map(|c| ModelCapacity { model: c.model.name().to_owned(), gpus: c.gpus, idle_gpus: c.idle_gpus })
        .collect())
}

/// Every catalog size's list price in force now (the rate card's); public, like the catalog.
#[server(endpoint = "size_prices")]
pub async fn size_prices() -> Result<Vec<berth_domain::rates::SizePrice>, AppError> {
    use super::ssr;
    let meta = ssr::request_meta().await;
    let platform = ssr::platform(&meta)?;
    platform.size_prices().await.map_err(|e| AppError::from_platform(e, &meta.request_id))
}
