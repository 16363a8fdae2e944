//! Metering: what a booking is charged for, money in exact units, calendar months and
//! budgets.
//!
//! Money is integer: US cents for prices and budgets, microcents (a millionth of a cent)
//! for one capacity unit's charge, so that sums stay exact. The rounding, in one place:
//! - a unit's charge for a span of time is its share of the size's hourly price times the
//!   milliseconds, in whole microcents, rounded down (`unit_charge`);
//! - an amount shown or compared (a line, a project's month, a booking's cost) is the sum of
//!   its units' microcents rounded half up to a cent (`to_cents`);
//! - a total is the sum of its lines' cents, never rounded again, so it equals them exactly.

use chrono::{DateTime, Datelike, Months, NaiveDate, Utc};
use serde::{Deserialize, Serialize};

use crate::Refusal;
use crate::booking::HOUR_MS;

/// Microcents in one cent.
pub const MICROCENTS_PER_CENT: i64 = 1_000_000;

/// What a booking is charged for: a platform setting (`berth serve --charge-for`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChargeBasis {
    /// From when its GPUs are held for it (provisioning starts) until they are released,
    /// within its window: stopping early stops the charge, a booking cancelled before it
    /// started costs nothing. What public clouds do, and the default.
    #[default]
    Use,
    /// The whole reserved window once it has begun, whether used or not (OpenStack
    /// Blazar's reservations): for fleets that sell reserved capacity. A booking cancelled
    /// before its window begins costs nothing.
    ReservedWindow,
}

impl ChargeBasis {
    pub fn as_str(self) -> &'static str {
        match self {
            ChargeBasis::Use => "use",
            ChargeBasis::ReservedWindow => "window",
        }
    }

    pub fn parse(text: &str) -> Option<ChargeBasis> {
        match text {
            "use" => Some(ChargeBasis::Use),
            "window" => Some(ChargeBasis::ReservedWindow),
            _ => None,
        }
    }

    /// What a booking is charged for, in words for pages.
    pub fn describe(self) -> &'static str {
        match self {
            ChargeBasis::Use => "the time its GPUs are held, from provisioning until they are released",
            ChargeBasis::ReservedWindow => "its whole reserved window once the window has begun",
        }
    }
}

/// One capacity unit's time as the ledger knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitTime {
    /// The reservation's window.
    pub starts_at: i64,
    pub ends_at: i64,
    /// When its GPUs were held for it (provisioning start); `None` if it never started.
    pub held_from: Option<i64>,
    pub released_at: Option<i64>,
}

impl UnitTime {
    /// The span charged up to `now`, if any.
    pub fn charged(self, basis: ChargeBasis, now: i64) -> Option<(i64, i64)> {
        let (from, to) = match basis {
            ChargeBasis::Use => {
                let held = self.held_from?;
                (held.max(self.starts_at), self.released_at.unwrap_or(now).min(self.ends_at))
            }
            ChargeBasis::ReservedWindow => {
                if self.released_at.is_some_and(|r| r <= self.starts_at) {
                    return None;
                }
                (self.starts_at, self.ends_at.min(now))
            }
        };
        (from < to).then_some((from, to))
    }

    /// The span it is expected to be charged in the end, as budgets count it: what was
    /// charged, and for a unit still held or booked, the rest of its window.
    pub fn committed(self, basis: ChargeBasis) -> Option<(i64, i64)> {
        match self.released_at {
            Some(_) => self.charged(basis, i64::MAX),
            None => {
                let from = match basis {
                    ChargeBasis::Use => self.held_from.unwrap_or(self.starts_at).max(self.starts_at),
                    ChargeBasis::ReservedWindow => self.starts_at,
                };
                (from < self.ends_at).then_some((from, self.ends_at))
            }
        }
    }
}

/// What one unit is charged for `ms` milliseconds: its share (`1 / units_per_copy`) of a size
/// priced `size_cents_per_hour`, in microcents, rounded down.
pub fn unit_charge(ms: i64, size_cents_per_hour: i64, units_per_copy: i64) -> i64 {
    // cents/h * ms * 1e6 / 3.6e6 = cents/h * ms * 5 / 18; in i128 so that no price or span
    // overflows on the way.
    let microcents = i128::from(ms) * i128::from(size_cents_per_hour) * 5 / (18 * i128::from(units_per_copy.max(1)));
    i64::try_from(microcents).unwrap_or(i64::MAX)
}

/// Microcents to cents, rounded half up.
pub fn to_cents(microcents: i64) -> i64 {
    (microcents + MICROCENTS_PER_CENT / 2).div_euclid(MICROCENTS_PER_CENT)
}

/// "$2,000.00", "-$3.20"
pub fn format_money(cents: i64) -> String {
    let sign = if cents < 0 { "-" } else { "" };
    let cents = cents.unsigned_abs();
    let dollars = (cents / 100).to_string();
    let mut grouped = String::new();
    for (i, digit) in dollars.chars().enumerate() {
        if i > 0 && (dollars.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    format!("{sign}${grouped}.{:02}", cents % 100)
}

/// Reads an amount of dollars a person typed ("2000", "2,000.50", "$300"): cents, or why not.
pub fn parse_money(text: &str) -> Result<i64, Refusal> {
    let bad = || Refusal::InvalidBudget(format!("\"{}\" is not an amount like 2000 or 2,000.50", text.trim()));
    let clean: String = text.trim().trim_start_matches('$').chars().filter(|c| *c != ',').collect();
    let (whole, fraction) = clean.split_once('.').unwrap_or((&clean, ""));
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) || whole.len() > 12 {
        return Err(bad());
    }
    if fraction.len() > 2 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let cents: i64 = format!("{fraction:0<2}").parse().map_err(|_| bad())?;
    Ok(whole.parse::<i64>().map_err(|_| bad())? * 100 + cents)
}

/// A calendar month, UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Month {
    pub year: i32,
    /// 1..=12
    pub month: u32,
}

impl Month {
    /// The month `ms` falls in.
    pub fn of(ms: i64) -> Month {
        let t = DateTime::from_timestamp_millis(ms).unwrap_or_default();
        Month { year: t.year(), month: t.month() }
    }

    /// Reads "2026-11", as URLs and downloads name a month.
    pub fn parse(text: &str) -> Option<Month> {
        let (year, month) = text.trim().split_once('-')?;
        let month = Month { year: year.parse().ok()?, month: month.parse().ok()? };
        ((1..=12).contains(&month.month) && (1970..=9999).contains(&month.year)).then_some(month)
    }

    /// "2026-11"
    pub fn key(self) -> String {
        format!("{:04}-{:02}", self.year, self.month)
    }

    fn first_day(self) -> NaiveDate {
        NaiveDate::from_ymd_opt(self.year, self.month, 1).unwrap_or_default()
    }

    /// Its first millisecond.
    pub fn starts_at(self) -> i64 {
        self.first_day().and_hms_opt(0, 0, 0).unwrap_or_default().and_utc().timestamp_millis()
    }

    pub fn next(self) -> Month {
        let d = self.first_day().checked_add_months(Months::new(1)).unwrap_or_default();
        Month { year: d.year(), month: d.month() }
    }

    pub fn previous(self) -> Month {
        let d = self.first_day().checked_sub_months(Months::new(1)).unwrap_or_default();
        Month { year: d.year(), month: d.month() }
    }

    /// Its first millisecond and the next month's.
    pub fn span(self) -> (i64, i64) {
        (self.starts_at(), self.next().starts_at())
    }

    pub fn days(self) -> u32 {
        ((self.next().starts_at() - self.starts_at()) / crate::booking::DAY_MS) as u32
    }

    /// The month's weeks, Monday to Sunday (UTC), cut at the month's edges: each one's ISO
    /// week number and its first and last day in the month (0-based).
    pub fn weeks(self) -> Vec<MonthWeek> {
        let mut weeks: Vec<MonthWeek> = Vec::new();
        for day in 0..self.days() as usize {
            let iso_week = self.date_of(day).iso_week().week();
            match weeks.last_mut() {
                Some(week) if week.iso_week == iso_week => week.last_day = day,
                _ => weeks.push(MonthWeek { iso_week, first_day: day, last_day: day }),
            }
        }
        weeks
    }

    /// The date of its `day` (0-based).
    pub fn date_of(self, day: usize) -> NaiveDate {
        self.first_day() + chrono::Days::new(day as u64)
    }

    /// "November"
    pub fn name(self) -> String {
        self.first_day().format("%B").to_string()
    }

    /// "November 2026"
    pub fn title(self) -> String {
        self.first_day().format("%B %Y").to_string()
    }
}

/// A week of a month (`Month::weeks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MonthWeek {
    /// ISO 8601 week number (1..=53).
    pub iso_week: u32,
    /// Its first and last day in the month, 0-based.
    pub first_day: usize,
    pub last_day: usize,
}

/// `[from, to)` cut at month boundaries: each month it touches, with its part.
pub fn split_by_month(from: i64, to: i64) -> Vec<(Month, i64, i64)> {
    let mut parts = Vec::new();
    let mut at = from;
    while at < to {
        let month = Month::of(at);
        let end = month.next().starts_at().min(to);
        parts.push((month, at, end));
        at = end;
    }
    parts
}

/// Whose budget a check is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BudgetOf {
    /// The project's name.
    Project(String),
    /// The tenant's name.
    Tenant(String),
}

impl std::fmt::Display for BudgetOf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BudgetOf::Project(name) => write!(f, "project {name}"),
            BudgetOf::Tenant(name) => write!(f, "tenant {name}"),
        }
    }
}

/// A monthly budget as a booking is checked against it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    pub of: BudgetOf,
    pub cents_per_month: i64,
    /// Crossing it is recorded and shown, but does not refuse bookings.
    pub warn_only: bool,
}

/// The shares of a budget (percent) whose crossing is recorded.
pub const THRESHOLDS: [u32; 3] = [50, 80, 100];

impl Budget {
    /// The thresholds a month's committed spend crosses going from `before` to `after`
    /// cents (a budget of 0 is crossed by any spend).
    pub fn crossed(&self, before: i64, after: i64) -> Vec<u32> {
        let reached = |spend: i64, pct: u32| {
            spend > 0 && i128::from(spend) * 100 >= i128::from(self.cents_per_month) * i128::from(pct)
        };
        THRESHOLDS.into_iter().filter(|&pct| !reached(before, pct) && reached(after, pct)).collect()
    }

    /// Whether `what` ("booking", "extension") costing `cost` cents in `month` (of `total`
    /// cents for `hours` hours in all) fits beside the `committed` cents already spent or
    /// booked there.
    pub fn check(
        &self,
        what: &str,
        month: Month,
        committed: i64,
        cost: i64,
        total: i64,
        hours: u32,
    ) -> Result<(), Refusal> {
        if self.warn_only || committed + cost <= self.cents_per_month {
            return Ok(());
        }
        let total_text = format_money(total);
        let this = if cost == total {
            format!("this {what} costs {total_text} for {hours} h")
        } else {
            format!("this {what} costs {total_text} for {hours} h, {} of it in {}", format_money(cost), month.name())
        };
        Err(Refusal::OverBudget(format!(
            "{this}; {} has {} of {} left in {}",
            self.of,
            format_money((self.cents_per_month - committed).max(0)),
            format_money(self.cents_per_month),
            month.name()
        )))
    }
}

/// Hours in `ms`, for reports (GPU-hours are figures, not money: a float is fine).
pub fn hours(ms: i64) -> f64 {
    ms as f64 / HOUR_MS as f64
}

/// Whole hours in `ms`, a started hour counting as one (as refusals say a duration).
pub fn started_hours(ms: i64) -> u32 {
    u32::try_from((ms.max(0) + HOUR_MS - 1) / HOUR_MS).unwrap_or(u32::MAX)
}

/// The month it is now, for pages that default to it.
pub fn this_month() -> Month {
    Month::of(Utc::now().timestamp_millis())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const H: i64 = HOUR_MS;

    fn at(text: &str) -> i64 {
        crate::booking::parse_start(text).unwrap().unwrap()
    }

    #[test]
    fn money_is_written_with_thousands_and_cents() {
        assert_eq!(format_money(200_000), "$2,000.00");
        assert_eq!(format_money(41_280), "$412.80");
        assert_eq!(format_money(5), "$0.05");
        assert_eq!(format_money(123_456_789), "$1,234,567.89");
        assert_eq!(format_money(-320), "-$3.20");
    }

    #[test]
    fn amounts_are_read_as_people_type_them() {
        assert_eq!(parse_money("2000"), Ok(200_000));
        assert_eq!(parse_money(" $2,000.5 "), Ok(200_050));
        assert_eq!(parse_money("0.07"), Ok(7));
        for bad in ["", "-5", "1.234", "abc", "1e3", "$", "12.x"] {
            assert!(parse_money(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_hour_of_a_size_costs_its_price() {
        assert_eq!(to_cents(unit_charge(H, 320, 1)), 320);
        // One GPU of a four-GPU size for an hour: a quarter of its price.
        assert_eq!(to_cents(unit_charge(H, 1280, 4)), 320);
        // A slice at 55 cents for 20 minutes: 18.33 cents, shown as 18.
        assert_eq!(unit_charge(20 * 60_000, 55, 1), 18_333_333);
        assert_eq!(to_cents(unit_charge(20 * 60_000, 55, 1)), 18);
    }

    #[test]
    fn use_is_charged_from_holding_to_release_within_the_window() {
        let unit = UnitTime { starts_at: 10 * H, ends_at: 18 * H, held_from: Some(10 * H + 5), released_at: None };
        assert_eq!(unit.charged(ChargeBasis::Use, 12 * H), Some((10 * H + 5, 12 * H)));
        assert_eq!(unit.charged(ChargeBasis::ReservedWindow, 12 * H), Some((10 * H, 12 * H)));
        assert_eq!(unit.committed(ChargeBasis::Use), Some((10 * H + 5, 18 * H)));
        let stopped = UnitTime { released_at: Some(13 * H), ..unit };
        assert_eq!(stopped.charged(ChargeBasis::Use, 20 * H), Some((10 * H + 5, 13 * H)));
        assert_eq!(stopped.charged(ChargeBasis::ReservedWindow, 20 * H), Some((10 * H, 18 * H)));
        // Teardown past the window's end is not charged.
        let late = UnitTime { released_at: Some(18 * H + 60_000), ..unit };
        assert_eq!(late.charged(ChargeBasis::Use, 20 * H), Some((10 * H + 5, 18 * H)));
        // Cancelled before it began: nothing, on either basis.
        let cancelled = UnitTime { held_from: None, released_at: Some(9 * H), ..unit };
        assert_eq!(cancelled.charged(ChargeBasis::Use, 20 * H), None);
        assert_eq!(cancelled.charged(ChargeBasis::ReservedWindow, 20 * H), None);
        assert_eq!(cancelled.committed(ChargeBasis::Use), None);
        // Booked for later: nothing yet, its window committed.
        let future = UnitTime { held_from: None, released_at: None, ..unit };
        assert_eq!(future.charged(ChargeBasis::Use, 9 * H), None);
        assert_eq!(future.committed(ChargeBasis::Use), Some((10 * H, 18 * H)));
    }

    #[test]
    fn weeks_run_monday_to_sunday_cut_at_the_month() {
        // November 2026 begins on a Sunday and ends on a Monday.
        let november = Month { year: 2026, month: 11 };
        let weeks = november.weeks();
        assert_eq!(weeks.len(), 6);
        assert_eq!(weeks[0], MonthWeek { iso_week: 44, first_day: 0, last_day: 0 });
        assert_eq!(weeks[1], MonthWeek { iso_week: 45, first_day: 1, last_day: 7 });
        assert_eq!(weeks[5], MonthWeek { iso_week: 49, first_day: 29, last_day: 29 });
        assert_eq!(november.date_of(1).to_string(), "2026-11-02");
        // Every day is in exactly one week, in order; a January's first days can be in the
        // previous year's week 53.
        for month in [november, Month { year: 2027, month: 1 }, Month { year: 2024, month: 2 }] {
            let days: Vec<usize> = month.weeks().iter().flat_map(|w| w.first_day..=w.last_day).collect();
            assert_eq!(days, (0..month.days() as usize).collect::<Vec<_>>());
        }
        assert_eq!(Month { year: 2027, month: 1 }.weeks()[0].iso_week, 53);
    }

    #[test]
    fn months_are_calendar_months_in_utc() {
        let m = Month::of(at("2026-11-30T23:59"));
        assert_eq!((m.year, m.month, m.days()), (2026, 11, 30));
        assert_eq!((m.key(), m.title()), ("2026-11".to_owned(), "November 2026".to_owned()));
        assert_eq!(m.next(), Month { year: 2026, month: 12 });
        assert_eq!(m.next().next(), Month { year: 2027, month: 1 });
        assert_eq!(Month { year: 2027, month: 1 }.previous(), Month { year: 2026, month: 12 });
        assert_eq!(Month { year: 2028, month: 2 }.days(), 29);
        assert_eq!(Month::parse("2026-02"), Some(Month { year: 2026, month: 2 }));
        assert_eq!(Month::parse("2026-13"), None);
        assert_eq!(Month::parse("soon"), None);
    }

    #[test]
    fn a_booking_across_months_counts_in_each_by_its_hours_there() {
        let parts = split_by_month(at("2026-11-30T20:00"), at("2026-12-01T04:00"));
        let hours: Vec<(String, f64)> = parts.iter().map(|(m, f, t)| (m.key(), super::hours(t - f))).collect();
        assert_eq!(hours, vec![("2026-11".to_owned(), 4.0), ("2026-12".to_owned(), 4.0)]);
    }

    #[test]
    fn the_refusal_says_cost_whose_budget_and_what_is_left() {
        let budget = Budget { of: BudgetOf::Project("vision".into()), cents_per_month: 200_000, warn_only: false };
        let november = Month { year: 2026, month: 11 };
        let refusal = budget.check("booking", november, 170_000, 41_280, 41_280, 8).unwrap_err();
        assert_eq!(
            refusal.to_string(),
            "budget: this booking costs $412.80 for 8 h; project vision has $300.00 of $2,000.00 left in November"
        );
        assert!(budget.check("booking", november, 150_000, 41_280, 41_280, 8).is_ok());
        let warn = Budget { warn_only: true, ..budget.clone() };
        assert!(warn.check("booking", november, 170_000, 41_280, 41_280, 8).is_ok());
        let split = budget.check("booking", november, 199_000, 20_640, 41_280, 8).unwrap_err();
        assert!(split.to_string().contains("costs $412.80 for 8 h, $206.40 of it in November"), "{split}");
    }

    #[test]
    fn thresholds_are_crossed_once_each() {
        let budget = Budget { of: BudgetOf::Tenant("Acme".into()), cents_per_month: 1_000, warn_only: true };
        assert_eq!(budget.crossed(0, 400), Vec::<u32>::new());
        assert_eq!(budget.crossed(400, 850), vec![50, 80]);
        assert_eq!(budget.crossed(850, 1_000), vec![100]);
        assert_eq!(budget.crossed(1_000, 2_000), Vec::<u32>::new());
        let zero = Budget { cents_per_month: 0, ..budget };
        assert_eq!(zero.crossed(0, 0), Vec::<u32>::new());
        assert_eq!(zero.crossed(0, 1), vec![50, 80, 100]);
    }

    proptest! {
        /// However a span is cut (at months, price changes, stops and restarts), its pieces'
        /// charges add up to the whole's less under a microcent a piece, and the month parts
        /// cover it exactly, in order.
        #[test]
        fn cutting_a_span_loses_under_a_microcent_a_piece(
            start in 1_700_000_000_000i64..1_900_000_000_000,
            len in 1i64..(400 * H),
            cuts in proptest::collection::vec(0.0f64..1.0, 0..6),
            cents in 1i64..100_000,
            units in 1i64..17,
        ) {
            let end = start + len;
            let mut points: Vec<i64> = cuts.iter().map(|c| start + (c * len as f64) as i64).collect();
            points.extend([start, end]);
            points.sort();
            let pieces: i64 = points.windows(2).map(|w| unit_charge(w[1] - w[0], cents, units)).sum();
            let whole = unit_charge(len, cents, units);
            prop_assert!(whole >= pieces && whole - pieces < points.len() as i64);
            let parts = split_by_month(start, end);
            prop_assert_eq!(parts.first().map(|p| p.1), Some(start));
            prop_assert_eq!(parts.last().map(|p| p.2), Some(end));
            for pair in parts.windows(2) {
                prop_assert_eq!(pair[0].2, pair[1].1);
                prop_assert_eq!(pair[1].0, pair[0].0.next());
                prop_assert_eq!(pair[1].1, pair[1].0.starts_at());
            }
        }

        /// Rounding each line once to the cent is off its microcents by at most half a cent.
        #[test]
        fn lines_round_to_the_nearest_cent(line in 0i64..10_000_000_000_000) {
            prop_assert!((to_cents(line) * MICROCENTS_PER_CENT - line).abs() <= MICROCENTS_PER_CENT / 2);
        }
    }
}
