//! The availability calendar's frame: how much it shows at once and from which day. The
//! calendar page and `GET /api/v1/calendar` both read their question here.

use chrono::NaiveDate;

use crate::booking::{DAY_MS, HOUR_MS};

/// What the availability calendar shows at once: a day in hours, a week in 6-hour blocks,
/// 30 days in days.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CalendarSpan {
    Day,
    Week,
    Month,
}

impl CalendarSpan {
    pub const ALL: [CalendarSpan; 3] = [CalendarSpan::Day, CalendarSpan::Week, CalendarSpan::Month];

    pub fn parse(s: &str) -> Option<CalendarSpan> {
        CalendarSpan::ALL.into_iter().find(|span| span.id() == s.trim())
    }

    pub fn id(self) -> &'static str {
        match self {
            CalendarSpan::Day => "day",
            CalendarSpan::Week => "week",
            CalendarSpan::Month => "month",
        }
    }

    /// Bucket length and count.
    pub fn buckets(self) -> (i64, usize) {
        match self {
            CalendarSpan::Day => (HOUR_MS, 24),
            CalendarSpan::Week => (6 * HOUR_MS, 28),
            CalendarSpan::Month => (DAY_MS, 30),
        }
    }

    pub fn days(self) -> i64 {
        match self {
            CalendarSpan::Day => 1,
            CalendarSpan::Week => 7,
            CalendarSpan::Month => 30,
        }
    }
}

/// The start (UTC midnight, in ms) of the day `text` names (`2026-11-30`), if it names one.
pub fn day_start(text: &str) -> Option<i64> {
    let day = NaiveDate::parse_from_str(text.trim(), "%Y-%m-%d").ok()?;
    Some(day.and_hms_opt(0, 0, 0)?.and_utc().timestamp_millis())
}

/// The start of the UTC day `now` falls in.
pub fn today(now: i64) -> i64 {
    now - now.rem_euclid(DAY_MS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_day_is_read_strictly_and_today_is_its_midnight() {
        assert_eq!(day_start("2026-11-24"), Some(1_795_478_400_000));
        assert_eq!(day_start(" 2026-11-24 "), Some(1_795_478_400_000));
        for bad in ["", "tomorrow", "2026-13-01", "2026-11-24T00:00"] {
            assert_eq!(day_start(bad), None, "{bad}");
        }
        assert_eq!(today(1_795_478_400_000 + 5 * HOUR_MS), 1_795_478_400_000);
        assert_eq!(CalendarSpan::parse("month").map(CalendarSpan::buckets), Some((DAY_MS, 30)));
        assert_eq!(CalendarSpan::parse("year"), None);
    }
}
