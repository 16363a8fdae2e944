//! What can be booked: the catalog (offerings, sizes, prices) and its availability (how
//! many of each size fit now or from a start, else the earliest start).

use axum::Json;
use axum::extract::Query;
use berth_domain::catalog::{ImageRule, Offering};
use berth_domain::launch::AvailabilityAsk;
use berth_domain::metering::format_money;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::{ApiError, TokenCaller, fail, rfc3339, schema};

/// One offering of the catalog with its sizes.
#[derive(Serialize, ToSchema)]
pub struct OfferingBody {
    /// What a launch names (`offering`).
    #[schema(schema_with = schema::offering)]
    id: &'static str,
    title: &'static str,
    summary: &'static str,
    /// The longest booking, in hours.
    max_hours: u32,
    /// `catalog` (an image of the catalog), `catalog_or_custom` (or one the tenant allows)
    /// or `none` (the offering brings its own software).
    #[schema(example = "catalog")]
    image: &'static str,
    /// A launch must give a `command` (training jobs).
    needs_command: bool,
    sizes: Vec<SizeBody>,
}

/// One size of an offering and its price.
#[derive(Serialize, ToSchema)]
pub struct SizeBody {
    /// What a launch names (`size`), e.g. `h100-1g.10gb`.
    #[schema(schema_with = schema::size)]
    id: &'static str,
    /// e.g. "H100 80GB · 1g.10gb slice".
    label: &'static str,
    /// The GPU model, e.g. `H100-80GB`.
    gpu_model: &'static str,
    vcpus: u32,
    memory_gb: u32,
    /// US cents per hour for the whole size, at the rate card's list price in force now;
    /// `null` when the card has no price for it (it cannot be booked then).
    cents_per_hour: Option<i64>,
    /// `$3.20/h`, or `no price yet`.
    price: String,
}

#[derive(Serialize, ToSchema)]
pub struct CatalogBody {
    offerings: Vec<OfferingBody>,
}

/// The catalog: every offering, its sizes and their list prices in force now (the same
/// for everyone; a tenant's discount applies when it is charged).
#[utoipa::path(get, path = "/api/v1/catalog", tag = "catalog", responses((status = 200, body = CatalogBody)))]
pub(super) async fn catalog(TokenCaller(platform, caller): TokenCaller) -> Result<Json<CatalogBody>, ApiError> {
    let card = platform.rate_card().await.map_err(fail(&caller))?;
    let now = berth_platform::now_ms();
    let offerings = Offering::ALL
        .into_iter()
        .map(|o| OfferingBody {
            id: o.id(),
            title: o.title(),
            summary: o.summary(),
            max_hours: o.max_hours(),
            image: match o.image_rule() {
                ImageRule::CatalogOnly => "catalog",
                ImageRule::CatalogOrCustom => "catalog_or_custom",
                ImageRule::None => "none",
            },
            needs_command: o.needs_command(),
            sizes: o
                .sizes()
                .iter()
                .map(|s| {
                    let cents_per_hour = card.size_price_at(s.shape, now);
                    SizeBody {
                        id: s.id,
                        label: s.label,
                        gpu_model: s.gpu_model().name(),
                        vcpus: s.vcpus,
                        memory_gb: s.memory_gb,
                        cents_per_hour,
                        price: cents_per_hour
                            .map_or_else(|| "no price yet".to_owned(), |c| format!("{}/h", format_money(c))),
                    }
                })
                .collect(),
        })
        .collect();
    Ok(Json(CatalogBody { offerings }))
}

/// Which offering, for how long, from when.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AvailabilityQuery {
    /// `notebook`, `training`, `inference` or `cluster`.
    #[serde(default)]
    #[param(schema_with = schema::offering)]
    pub offering: String,
    /// Whole hours, 1 to the offering's longest; empty: 1.
    #[serde(default)]
    #[param(pattern = "^[0-9]{0,4}$")]
    pub hours: String,
    /// Empty for now, else a UTC date and time (`2026-11-26 14:00`) as a launch takes it.
    #[serde(default)]
    pub start: String,
    /// The project (its id) the booking would count against, as a launch takes it: its
    /// budget is counted as well as the tenant's. Empty: none.
    #[serde(default)]
    #[param(pattern = "^[0-9]{0,18}$")]
    pub project: String,
}

/// One size's availability.
#[derive(Serialize, ToSchema)]
pub struct SizeAvailabilityBody {
    #[schema(schema_with = schema::size)]
    size: &'static str,
    label: &'static str,
    gpu_model: &'static str,
    /// How many fit for the whole window from the start asked (or now).
    free: u32,
    /// The start asked (or now) when one fits; else the earliest start within the booking
    /// horizon; `null` when there is none. Within the caller's budgets: see `over_budget`.
    #[schema(format = DateTime)]
    earliest_start: Option<String>,
    /// Why the tenant's or the project's budget would refuse the size at its first fit;
    /// `earliest_start` is then the first fit in a month the budgets allow. `null`: within
    /// budget.
    over_budget: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct AvailabilityBody {
    #[schema(schema_with = schema::offering)]
    offering: &'static str,
    hours: u32,
    /// When the window asked starts (now when none was given).
    #[schema(format = DateTime)]
    from: String,
    sizes: Vec<SizeAvailabilityBody>,
}

/// For each size of an offering: how many fit for `hours` from `start` (now when empty) as
/// the caller could book them, and otherwise the earliest start.
#[utoipa::path(get, path = "/api/v1/availability", tag = "catalog", params(AvailabilityQuery),
    responses((status = 200, body = AvailabilityBody)))]
pub(super) async fn availability(
    TokenCaller(platform, caller): TokenCaller,
    Query(query): Query<AvailabilityQuery>,
) -> Result<Json<AvailabilityBody>, ApiError> {
    let ask =
        AvailabilityAsk::parse(&query.offering, &query.hours, &query.start).map_err(|r| fail(&caller)(r.into()))?;
    let from = ask.start.unwrap_or(0).max(berth_platform::now_ms());
    let sizes = platform
        .size_availability_within_budget(&caller, &query.project, ask.offering, ask.hours, ask.start)
        .await
        .map_err(fail(&caller))?;
    let sizes = sizes
        .into_iter()
        .map(|s| SizeAvailabilityBody {
            size: s.size.id,
            label: s.size.label,
            gpu_model: s.size.gpu_model().name(),
            free: s.free_now,
            earliest_start: s.earliest_start.map(rfc3339),
            over_budget: s.over_budget,
        })
        .collect();
    Ok(Json(AvailabilityBody { offering: ask.offering.id(), hours: ask.hours, from: rfc3339(from), sizes }))
}
