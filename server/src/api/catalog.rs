//! What can be booked: the catalog (offerings, sizes, prices) and its availability (how
//! many of each size fit now or from a start, else the earliest start).

use axum::Json;
use axum::extract::Query;
use berth_domain::Refusal;
use berth_domain::calendar::{self, CalendarSpan};
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

/// Which calendar: a span from a day.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CalendarQuery {
    /// `day` (24 hours), `week` (28 blocks of 6 hours) or `month` (30 days); empty: week.
    #[serde(default)]
    #[param(schema_with = schema::calendar_span)]
    span: String,
    /// The first day, `2026-11-30` (UTC); empty: today.
    #[serde(default)]
    #[param(pattern = "^([0-9]{4}-[0-9]{2}-[0-9]{2})?$")]
    from: String,
}

/// One row of the calendar: a shape the catalog sells and how many of it are free in each
/// bucket.
#[derive(Serialize, ToSchema)]
pub struct CalendarRowBody {
    /// e.g. "a H100-80GB 1g.10gb slice", "2 x H100-80GB".
    shape: String,
    gpu_model: &'static str,
    /// The catalog's sizes of this shape (a launch's `size`).
    #[schema(schema_with = schema::sizes)]
    sizes: Vec<&'static str>,
    /// How many fit on an empty fleet.
    capacity: u32,
    /// How many are free in each bucket, as the caller's tenant could book them.
    free: Vec<u32>,
}

#[derive(Serialize, ToSchema)]
pub struct CalendarBody {
    #[schema(format = DateTime)]
    from: String,
    bucket_seconds: i64,
    /// Each bucket's start.
    buckets: Vec<String>,
    rows: Vec<CalendarRowBody>,
}

/// The availability calendar's buckets (the calendar page's heatmap): free capacity of
/// every shape the catalog sells, over a day, a week or 30 days, counted as the caller's
/// tenant could book it.
#[utoipa::path(get, path = "/api/v1/calendar", tag = "catalog", params(CalendarQuery),
    responses((status = 200, body = CalendarBody)))]
pub(super) async fn calendar(
    TokenCaller(platform, caller): TokenCaller,
    Query(query): Query<CalendarQuery>,
) -> Result<Json<CalendarBody>, ApiError> {
    let refused = |why: String| fail(&caller)(Refusal::InvalidListFilter(why).into());
    let span = match query.span.trim() {
        "" => CalendarSpan::Week,
        text => CalendarSpan::parse(text)
            .ok_or_else(|| refused(format!("span must be day, week or month, not \"{text}\"")))?,
    };
    let from = match query.from.trim() {
        "" => calendar::today(berth_platform::now_ms()),
        text => calendar::day_start(text)
            .ok_or_else(|| refused(format!("from must be a day like 2026-11-30, not \"{text}\"")))?,
    };
    let (bucket_ms, buckets) = span.buckets();
    let availability = platform.calendar(&caller, from, bucket_ms, buckets).await.map_err(fail(&caller))?;
    let rows = availability
        .rows
        .into_iter()
        .map(|row| CalendarRowBody {
            shape: row.shape.describe(),
            gpu_model: row.shape.model().name(),
            sizes: Offering::ALL
                .iter()
                .flat_map(|o| o.sizes())
                .filter(|size| size.shape == row.shape)
                .map(|size| size.id)
                .collect(),
            capacity: row.capacity,
            free: row.free,
        })
        .collect();
    Ok(Json(CalendarBody {
        from: rfc3339(from),
        bucket_seconds: bucket_ms / 1000,
        buckets: (0..buckets).map(|i| rfc3339(from + i as i64 * bucket_ms)).collect(),
        rows,
    }))
}

/// A GPU model's GPUs and how many are idle now.
#[derive(Serialize, ToSchema)]
pub struct ModelCapacityBody {
    gpu_model: &'static str,
    gpus: i64,
    /// With nothing on them, on nodes that take bookings.
    idle_gpus: i64,
}

#[derive(Serialize, ToSchema)]
pub struct CapacityBody {
    models: Vec<ModelCapacityBody>,
}

/// GPUs per model and how many are idle right now (the catalog page's figures; the same
/// for everyone).
#[utoipa::path(get, path = "/api/v1/capacity", tag = "catalog", responses((status = 200, body = CapacityBody)))]
pub(super) async fn capacity(TokenCaller(platform, caller): TokenCaller) -> Result<Json<CapacityBody>, ApiError> {
    let models = platform.capacity_by_model().await.map_err(fail(&caller))?;
    let models = models
        .into_iter()
        .map(|c| ModelCapacityBody { gpu_model: c.model.name(), gpus: c.gpus, idle_gpus: c.idle_gpus })
        .collect();
    Ok(Json(CapacityBody { models }))
}
