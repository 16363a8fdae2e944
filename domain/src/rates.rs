//! The rate card: what a GPU-hour costs, per GPU model and kind of unit (a whole GPU, a MIG
//! profile, a time-sliced share), the spot discount and each tenant's discount, every one
//! with the time it takes effect.
//!
//! A capacity unit (one reservation: a GPU, a slice or a share) is charged, for each piece of
//! its charged time, the rate in force then, less the discounts in force then. So a price
//! change mid-booking charges the hours before it at the old rate and the hours after at
//! the new one. Changes take effect now or at a coming midnight (UTC), never in the past:
//! what was charged is never charged again differently.
//!
//! Money follows `metering`'s rule: a unit's charge for a span is computed exactly over
//! its pieces and rounded down once to a microcent; discounts are whole basis points
//! (1/100 of a percent), applied one after the other (spot, then the tenant's).

use std::collections::BTreeMap;

use chrono::NaiveDate;
use serde::{Deserialize, Serialize};

use crate::Refusal;
use crate::booking::DAY_MS;
use crate::catalog::Offering;
use crate::gpu::GpuModel;
use crate::metering::to_cents;
use crate::mig::MigProfile;
use crate::placement::Shape;

/// GPUs in one node as the catalog sells it whole: its node sizes' labels say 8 x.
pub const CATALOG_GPUS_PER_NODE: u32 = 8;

/// Basis points in 100%.
pub const WHOLE: i64 = 10_000;

/// The most a rate may be: $100,000 an hour.
const MAX_CENTS_PER_HOUR: i64 = 10_000_000;

/// How far ahead a change may be scheduled.
const MAX_DAYS_AHEAD: i64 = 2 * 366;

/// What a rate prices one hour of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum RateUnit {
    /// A whole GPU (also each GPU of a whole node).
    Gpu,
    /// One MIG instance of this profile.
    Mig(MigProfile),
    /// One share of a GPU time-sliced this many ways.
    Share(u8),
}

/// A line of the rate card: a kind of unit on a GPU model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RateKey {
    pub model: GpuModel,
    pub unit: RateUnit,
}

impl RateKey {
    /// What a size is priced by, and how many of it the size holds.
    pub fn of_shape(shape: Shape) -> (RateKey, u32) {
        match shape {
            Shape::MigSlice { model, profile } => (RateKey { model, unit: RateUnit::Mig(profile) }, 1),
            Shape::Gpus { model, count } => (RateKey { model, unit: RateUnit::Gpu }, count),
            Shape::Nodes { model, count } => (RateKey { model, unit: RateUnit::Gpu }, count * CATALOG_GPUS_PER_NODE),
            Shape::Share { model, ways } => (RateKey { model, unit: RateUnit::Share(ways) }, 1),
        }
    }

    /// The unit as stored: `gpu`, `mig:3g`, `share:4` (a MIG profile by its model-free key).
    pub fn unit_key(&self) -> String {
        match self.unit {
            RateUnit::Gpu => "gpu".to_owned(),
            RateUnit::Mig(profile) => format!("mig:{}", profile.key()),
            RateUnit::Share(ways) => format!("share:{ways}"),
        }
    }

    /// "H100-80GB/mig:3g": how forms and the API name a line.
    pub fn id(&self) -> String {
        format!("{}/{}", self.model.name(), self.unit_key())
    }

    /// Reads a stored model and unit.
    pub fn parse(model: &str, unit: &str) -> Option<RateKey> {
        let model = GpuModel::parse(model)?;
        let unit = match unit.split_once(':') {
            None if unit == "gpu" => RateUnit::Gpu,
            Some(("mig", key)) => RateUnit::Mig(MigProfile::from_key(key).filter(|p| p.name(model).is_some())?),
            Some(("share", ways)) => RateUnit::Share(ways.parse().ok().filter(|w| (2..=8).contains(w))?),
            _ => return None,
        };
        Some(RateKey { model, unit })
    }

    /// Reads an id ("H100-80GB/gpu").
    pub fn parse_id(id: &str) -> Option<RateKey> {
        let (model, unit) = id.trim().split_once('/')?;
        RateKey::parse(model, unit)
    }

    /// "H100-80GB, whole GPU", "H100-80GB, MIG 3g.40gb", "L40S, 1/4 share"
    pub fn label(&self) -> String {
        match self.unit {
            RateUnit::Gpu => format!("{}, whole GPU", self.model),
            RateUnit::Mig(profile) => {
                format!("{}, MIG {}", self.model, profile.name(self.model).unwrap_or_else(|| profile.key().to_owned()))
            }
            RateUnit::Share(ways) => format!("{}, 1/{ways} share", self.model),
        }
    }

    /// What one hour of it is called on a price: "GPU-hour", "slice-hour", "share-hour".
    pub fn per(&self) -> &'static str {
        match self.unit {
            RateUnit::Gpu => "GPU-hour",
            RateUnit::Mig(_) => "slice-hour",
            RateUnit::Share(_) => "share-hour",
        }
    }

    /// Every line the catalog's sizes are priced by, in order.
    pub fn of_catalog() -> Vec<RateKey> {
        let mut keys: Vec<RateKey> =
            Offering::ALL.iter().flat_map(|o| o.sizes()).map(|s| RateKey::of_shape(s.shape).0).collect();
        keys.sort();
        keys.dedup();
        keys
    }
}

/// The card a new Berth starts with (in force from the beginning of time): US cents per
/// unit-hour. Platform admins change it under Prices.
pub fn default_rates() -> Vec<(RateKey, i64)> {
    use GpuModel::*;
    let gpu = |model| RateKey { model, unit: RateUnit::Gpu };
    let mig = |model, profile| RateKey { model, unit: RateUnit::Mig(profile) };
    vec![
        (gpu(H100_80GB), 320),
        (gpu(A100_80GB), 210),
        (gpu(L40S), 110),
        (mig(H100_80GB, MigProfile::G1), 55),
        (mig(H100_80GB, MigProfile::G3), 155),
        (mig(A100_80GB, MigProfile::G3), 100),
        (RateKey { model: L40S, unit: RateUnit::Share(4) }, 30),
    ]
}

/// Whose discount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DiscountOf {
    /// Every spot (preemptible) unit.
    Spot,
    /// Every unit of this tenant.
    Tenant(i64),
}

/// What a unit is charged by: its line of the card, whether it is spot, and its tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Priced {
    pub key: RateKey,
    pub spot: bool,
    pub tenant: Option<i64>,
}

/// A charge at list rates and after discounts: in microcents for a unit's span, in cents
/// for a booking's (`size_cost`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Charge {
    pub list: i64,
    pub net: i64,
}

/// Values that change at given times: `(from, value)`, sorted by `from`.
type Schedule<T> = Vec<(i64, T)>;

fn in_force<T: Copy>(schedule: &Schedule<T>, at: i64) -> Option<T> {
    let after = schedule.partition_point(|(from, _)| *from <= at);
    after.checked_sub(1).map(|i| schedule[i].1)
}

fn insert<T>(schedule: &mut Schedule<T>, from: i64, value: T) {
    let at = schedule.partition_point(|(f, _)| *f <= from);
    if at > 0 && schedule[at - 1].0 == from {
        schedule[at - 1].1 = value;
    } else {
        schedule.insert(at, (from, value));
    }
}

/// The rate card as of now, with the changes scheduled.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RateCard {
    prices: BTreeMap<RateKey, Schedule<i64>>,
    spot: Schedule<i64>,
    tenants: BTreeMap<i64, Schedule<i64>>,
}

impl RateCard {
    /// The card of a new Berth.
    pub fn with_defaults() -> RateCard {
        let mut card = RateCard::default();
        for (key, cents) in default_rates() {
            card.set_price(key, 0, cents);
        }
        card
    }

    /// `key` costs `cents_per_hour` from `from` (replacing a change at that same time).
    pub fn set_price(&mut self, key: RateKey, from: i64, cents_per_hour: i64) {
        insert(self.prices.entry(key).or_default(), from, cents_per_hour);
    }

    /// `of` gets `basis_points` off from `from`.
    pub fn set_discount(&mut self, of: DiscountOf, from: i64, basis_points: i64) {
        let schedule = match of {
            DiscountOf::Spot => &mut self.spot,
            DiscountOf::Tenant(tenant) => self.tenants.entry(tenant).or_default(),
        };
        insert(schedule, from, basis_points);
    }

    /// Cents per unit-hour of `key` at `at`, if it has a price then.
    pub fn price_at(&self, key: RateKey, at: i64) -> Option<i64> {
        in_force(self.prices.get(&key)?, at)
    }

    /// The prices of `key` in force at some time in `[from, to)`, in order, each once.
    pub fn prices_within(&self, key: RateKey, from: i64, to: i64) -> Vec<i64> {
        let Some(schedule) = self.prices.get(&key) else { return Vec::new() };
        let mut prices: Vec<i64> = in_force(schedule, from).into_iter().collect();
        prices.extend(schedule.iter().filter(|(at, _)| *at > from && *at < to).map(|(_, cents)| *cents));
        prices.dedup();
        prices
    }

    /// Cents per hour of a whole size at `at`, at list rates.
    pub fn size_price_at(&self, shape: Shape, at: i64) -> Option<i64> {
        let (key, units) = RateKey::of_shape(shape);
        Some(self.price_at(key, at)? * i64::from(units))
    }

    /// What a whole size costs for `[from, to)` for a tenant, at list rates and after the
    /// discounts, in cents (rounded once); `None` when it has no price at `from`.
    pub fn size_cost(&self, shape: Shape, spot: bool, tenant: Option<i64>, from: i64, to: i64) -> Option<Charge> {
        let (key, units) = RateKey::of_shape(shape);
        self.price_at(key, from)?;
        let unit = self.charge(Priced { key, spot, tenant }, from, to);
        let units = i64::from(units);
        Some(Charge { list: to_cents(units * unit.list), net: to_cents(units * unit.net) })
    }

    /// Basis points off for `of` at `at`.
    pub fn discount_at(&self, of: DiscountOf, at: i64) -> i64 {
        let schedule = match of {
            DiscountOf::Spot => Some(&self.spot),
            DiscountOf::Tenant(tenant) => self.tenants.get(&tenant),
        };
        schedule.and_then(|s| in_force(s, at)).unwrap_or(0)
    }

    /// Every line with a price, with its schedule (oldest first).
    pub fn prices(&self) -> impl Iterator<Item = (RateKey, &[(i64, i64)])> {
        self.prices.iter().map(|(key, schedule)| (*key, schedule.as_slice()))
    }

    /// Every discount's schedule.
    pub fn discounts(&self) -> impl Iterator<Item = (DiscountOf, &[(i64, i64)])> {
        std::iter::once((DiscountOf::Spot, self.spot.as_slice()))
            .filter(|(_, s)| !s.is_empty())
            .chain(self.tenants.iter().map(|(tenant, s)| (DiscountOf::Tenant(*tenant), s.as_slice())))
    }

    /// What one unit is charged for `[from, to)`: cut where a price or discount changes,
    /// each piece at what was in force then, added exactly and rounded down once. A piece
    /// before its line had any price costs nothing (a booking needs a price in force when
    /// it is made, so none has such a piece).
    pub fn charge(&self, unit: Priced, from: i64, to: i64) -> Charge {
        if from >= to {
            return Charge::default();
        }
        let empty = Schedule::new();
        let prices = self.prices.get(&unit.key).unwrap_or(&empty);
        let spot = if unit.spot { &self.spot } else { &empty };
        let tenant = unit.tenant.and_then(|t| self.tenants.get(&t)).unwrap_or(&empty);
        // The next time after `at` that one of the three schedules changes.
        let next_change = |at: i64| {
            [prices, spot, tenant]
                .into_iter()
                .filter_map(|s| s.get(s.partition_point(|(f, _)| *f <= at)).map(|(f, _)| *f))
                .min()
        };
        // cents/h * ms * 1e6 microcents / 3.6e6 ms = cents/h * ms * 5 / 18.
        let (mut list, mut net) = (0_i128, 0_i128);
        let mut at = from;
        while at < to {
            let end = next_change(at).map_or(to, |change| change.min(to));
            let price = i128::from(in_force(prices, at).unwrap_or(0));
            let kept = |s: &Schedule<i64>| i128::from(WHOLE - in_force(s, at).unwrap_or(0).clamp(0, WHOLE));
            let piece = i128::from(end - at) * price * 5;
            list += piece;
            net += piece * kept(spot) * kept(tenant);
            at = end;
        }
        let whole = i128::from(WHOLE);
        let cap = |x: i128| i64::try_from(x).unwrap_or(i64::MAX);
        Charge { list: cap(list / 18), net: cap(net / (18 * whole * whole)) }
    }
}

// What the prices page and the catalog show of the card (made by the platform).

/// One change of the card as the prices page lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CardChange {
    pub id: i64,
    pub effective_from: i64,
    /// Cents per unit-hour, or basis points off.
    pub value: i64,
    /// It takes effect later: it may still be withdrawn.
    pub to_come: bool,
}

/// A line of the card: its price now and its changes (oldest first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PriceLine {
    /// `RateKey::id`: "H100-80GB/mig:3g".
    pub id: String,
    pub label: String,
    /// "GPU-hour", "slice-hour", "share-hour".
    pub per: String,
    pub cents_per_hour: Option<i64>,
    pub changes: Vec<CardChange>,
    /// Catalog sizes priced by it ("Training 4 x H100 80GB, NVLink").
    pub sizes: Vec<String>,
}

/// A discount and its changes: the spot discount, or a tenant's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiscountLine {
    /// `None` for the spot discount.
    pub tenant: Option<String>,
    pub basis_points: i64,
    pub changes: Vec<CardChange>,
}

/// The prices page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PriceList {
    pub lines: Vec<PriceLine>,
    pub spot: DiscountLine,
    /// Tenants' discounts (platform staff only).
    pub tenants: Vec<DiscountLine>,
    /// Tenants a discount may be given to (slug, name).
    pub tenant_choices: Vec<(String, String)>,
    pub may_manage: bool,
    pub now: i64,
}

/// What a catalog size costs now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizePrice {
    pub offering: String,
    pub size: String,
    /// Cents per hour of the whole size at list rates; `None`: no price, so not bookable.
    pub cents_per_hour: Option<i64>,
}

/// A change a platform admin asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CardEdit {
    /// `line`: a `RateKey::id`; `price`: dollars an hour as typed.
    Price { line: String, price: String, effective: String },
    /// `tenant`: a slug, or empty for the spot discount; `percent` as typed.
    Discount { tenant: String, percent: String, effective: String },
}

/// When a change took or takes effect, for pages: "2026-12-01 00:00 UTC", or "the start"
/// for the card a Berth began with.
pub fn effective_text(from: i64) -> String {
    if from == 0 {
        return "the start".into();
    }
    chrono::DateTime::from_timestamp_millis(from)
        .map_or_else(|| from.to_string(), |t| t.format("%Y-%m-%d %H:%M UTC").to_string())
}

/// "12.5%" from basis points.
pub fn format_percent(basis_points: i64) -> String {
    let (whole, rest) = (basis_points / 100, basis_points % 100);
    match rest {
        0 => format!("{whole}%"),
        r if r % 10 == 0 => format!("{whole}.{}%", r / 10),
        r => format!("{whole}.{r:02}%"),
    }
}

/// Reads a price a person typed ("3.20", "$3.20"): cents per unit-hour.
pub fn parse_price(text: &str) -> Result<i64, Refusal> {
    let cents = crate::metering::parse_money(text)
        .map_err(|_| Refusal::InvalidPrice(format!("\"{}\" is not an hourly price like 3.20", text.trim())))?;
    if cents > MAX_CENTS_PER_HOUR {
        return Err(Refusal::InvalidPrice("a price may be at most $100,000.00 an hour".into()));
    }
    Ok(cents)
}

/// Reads a discount a person typed ("15", "12.5%"): basis points, 0 to 100%.
pub fn parse_percent(text: &str) -> Result<i64, Refusal> {
    let bad = || Refusal::InvalidPrice(format!("\"{}\" is not a discount like 15 or 12.5 (percent)", text.trim()));
    let clean = text.trim().trim_end_matches('%').trim();
    let (whole, fraction) = clean.split_once('.').unwrap_or((clean, ""));
    if whole.is_empty() || whole.len() > 3 || fraction.len() > 2 {
        return Err(bad());
    }
    if !whole.bytes().chain(fraction.bytes()).all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let points =
        whole.parse::<i64>().map_err(|_| bad())? * 100 + format!("{fraction:0<2}").parse::<i64>().map_err(|_| bad())?;
    if points > WHOLE {
        return Err(Refusal::InvalidPrice("a discount may be at most 100%".into()));
    }
    Ok(points)
}

/// When a change takes effect: `""` or `now` is now; a date (`2026-12-01`) is its midnight,
/// UTC, which must be after now: the past is never charged again at another rate.
pub fn parse_effective(text: &str, now: i64) -> Result<i64, Refusal> {
    let text = text.trim();
    if text.is_empty() || text.eq_ignore_ascii_case("now") {
        return Ok(now);
    }
    let date = NaiveDate::parse_from_str(text, "%Y-%m-%d").map_err(|_| {
        Refusal::InvalidPrice(format!("\"{text}\" is not a date like 2026-12-01 (or leave it empty for now)"))
    })?;
    let at = date.and_hms_opt(0, 0, 0).unwrap_or_default().and_utc().timestamp_millis();
    if at <= now {
        return Err(Refusal::InvalidPrice(format!(
            "{text} has begun; a change takes effect now or at the start of a coming day (UTC), so nothing charged is charged again"
        )));
    }
    if at > now + MAX_DAYS_AHEAD * DAY_MS {
        return Err(Refusal::InvalidPrice("a change may be scheduled at most two years ahead".into()));
    }
    Ok(at)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::booking::HOUR_MS;
    use crate::catalog::Offering;
    use crate::metering::unit_charge;

    const H100: RateKey = RateKey { model: GpuModel::H100_80GB, unit: RateUnit::Gpu };
    const DAY: i64 = DAY_MS;

    fn whole_gpu(spot: bool, tenant: Option<i64>) -> Priced {
        Priced { key: H100, spot, tenant }
    }

    #[test]
    fn every_catalog_size_has_a_default_price() {
        let card = RateCard::with_defaults();
        for offering in Offering::ALL {
            for size in offering.sizes() {
                assert!(card.size_price_at(size.shape, 0).is_some(), "{} {} has no price", offering.id(), size.id);
            }
        }
        assert_eq!(RateKey::of_catalog().len(), default_rates().len(), "no default for a line no size uses");
    }

    /// Prices never contradict each other: of two sizes of one model, in any offerings, the
    /// one with at least as many GPUs, vCPUs and memory never costs less on the default card
    /// (a dedicated node is not cheaper than a training job on the same node).
    #[test]
    fn more_of_everything_never_costs_less() {
        let card = RateCard::with_defaults();
        let gpus = |shape: Shape| shape.gpu_equivalents().unwrap_or_else(|| f64::from(RateKey::of_shape(shape).1));
        let all: Vec<(Offering, &crate::catalog::Size)> =
            Offering::ALL.iter().flat_map(|&o| o.sizes().iter().map(move |s| (o, s))).collect();
        for (oa, a) in &all {
            for (ob, b) in &all {
                let dominates = a.gpu_model() == b.gpu_model()
                    && gpus(a.shape) >= gpus(b.shape)
                    && a.vcpus >= b.vcpus
                    && a.memory_gb >= b.memory_gb;
                let (pa, pb) = (card.size_price_at(a.shape, 0), card.size_price_at(b.shape, 0));
                assert!(
                    !dominates || pa >= pb,
                    "{} {} ({pa:?}) costs less than {} {} ({pb:?})",
                    oa.id(),
                    a.id,
                    ob.id(),
                    b.id
                );
            }
        }
    }

    #[test]
    fn keys_read_back_from_what_is_stored() {
        for key in RateKey::of_catalog() {
            assert_eq!(RateKey::parse(key.model.name(), &key.unit_key()), Some(key));
            assert_eq!(RateKey::parse_id(&key.id()), Some(key));
        }
        assert_eq!(RateKey::parse("H100-80GB", "share:1"), None, "a share of one way is a GPU");
        assert_eq!(RateKey::parse("L40S", "mig:3g"), None, "an L40S has no MIG");
        assert_eq!(RateKey::parse("B300", "gpu"), None);
        assert_eq!(H100.label(), "H100-80GB, whole GPU");
    }

    #[test]
    fn a_node_costs_its_gpus() {
        let card = RateCard::with_defaults();
        let node = Shape::Nodes { model: GpuModel::H100_80GB, count: 2 };
        assert_eq!(card.size_price_at(node, 0), Some(2 * 8 * 320));
    }

    #[test]
    fn the_default_card_charges_what_the_old_prices_did() {
        // A whole GPU for an hour at $3.20 is 320 cents, as `unit_charge` computes it.
        let card = RateCard::with_defaults();
        let charge = card.charge(whole_gpu(false, None), 0, HOUR_MS);
        assert_eq!(charge, Charge { list: 320_000_000, net: 320_000_000 });
        assert_eq!(charge.list, unit_charge(HOUR_MS, 320, 1));
    }

    #[test]
    fn a_price_change_mid_booking_charges_each_part_at_its_rate() {
        let mut card = RateCard::with_defaults();
        card.set_price(H100, DAY, 400);
        // 23:00 to 01:00: an hour at $3.20, an hour at $4.00.
        let charge = card.charge(whole_gpu(false, None), DAY - HOUR_MS, DAY + HOUR_MS);
        assert_eq!(charge.list, 720_000_000);
        assert_eq!(card.price_at(H100, DAY - 1), Some(320));
        assert_eq!(card.price_at(H100, DAY), Some(400));
    }

    #[test]
    fn discounts_apply_one_after_the_other_while_in_force() {
        let mut card = RateCard::with_defaults();
        card.set_discount(DiscountOf::Spot, 0, 6_000); // 60% off spot
        card.set_discount(DiscountOf::Tenant(7), HOUR_MS, 1_000); // 10% off tenant 7 after an hour
        let charge = card.charge(whole_gpu(true, Some(7)), 0, 2 * HOUR_MS);
        // First hour: 320 * 0.4 = 128 cents; second: 320 * 0.4 * 0.9 = 115.2 cents.
        assert_eq!(charge, Charge { list: 640_000_000, net: 243_200_000 });
        let other = card.charge(whole_gpu(false, Some(8)), 0, 2 * HOUR_MS);
        assert_eq!(other.net, other.list, "no discount for a guaranteed unit of another tenant");
    }

    #[test]
    fn a_piece_without_a_price_costs_nothing() {
        let mut card = RateCard::default();
        card.set_price(H100, HOUR_MS, 100);
        assert_eq!(card.charge(whole_gpu(false, None), 0, 2 * HOUR_MS).list, 100_000_000);
        assert_eq!(card.price_at(H100, 0), None);
    }

    #[test]
    fn typed_prices_discounts_and_dates() {
        assert_eq!(parse_price("$3.20"), Ok(320));
        assert!(parse_price("three").is_err());
        assert!(parse_price("100000.01").is_err());
        assert_eq!(parse_percent("12.5%"), Ok(1_250));
        assert_eq!(parse_percent("100"), Ok(10_000));
        assert!(parse_percent("100.01").is_err());
        assert!(parse_percent("-5").is_err());
        assert_eq!(format_percent(1_250), "12.5%");
        assert_eq!(format_percent(1_205), "12.05%");
        assert_eq!(format_percent(6_000), "60%");
        let now = 20_000 * DAY + 5 * HOUR_MS; // 2024-10-04 05:00 UTC
        assert_eq!(parse_effective("", now), Ok(now));
        assert_eq!(parse_effective("2024-10-05", now), Ok(20_001 * DAY));
        let past = parse_effective("2024-10-04", now).unwrap_err().to_string();
        assert!(past.contains("has begun"), "{past}");
        assert!(parse_effective("05/10/2024", now).is_err());
        assert!(parse_effective("2030-01-01", now).is_err(), "more than two years ahead");
    }

    proptest! {
        /// Cutting a span anywhere loses under a microcent per piece at list and net, and
        /// the charge never exceeds the list.
        #[test]
        fn cutting_a_span_loses_under_a_microcent_a_piece(
            cut in 1_i64..(3 * DAY),
            change in 0_i64..(3 * DAY),
            price in 0_i64..100_000,
            spot in 0_i64..=WHOLE,
            tenant in 0_i64..=WHOLE,
        ) {
            let mut card = RateCard::with_defaults();
            card.set_price(H100, change, price);
            card.set_discount(DiscountOf::Spot, change / 2, spot);
            card.set_discount(DiscountOf::Tenant(1), change / 3, tenant);
            let unit = whole_gpu(true, Some(1));
            let whole = card.charge(unit, 0, 3 * DAY);
            let (a, b) = (card.charge(unit, 0, cut), card.charge(unit, cut, 3 * DAY));
            prop_assert!(whole.list - (a.list + b.list) <= 1 && whole.list >= a.list + b.list);
            prop_assert!(whole.net - (a.net + b.net) <= 1 && whole.net >= a.net + b.net);
            prop_assert!(whole.net <= whole.list);
        }
    }
}
