//! Times and durations in words. Always UTC, so the server's render and the browser's
//! hydration produce the same text.

/// "2026-11-22 18:41 UTC"
pub fn utc(ms: i64) -> String {
    minute(ms, ' ', " UTC", "%Y-%m-%d %H:%M UTC")
}

/// "2026-11-22 18:41:07 UTC", for logs where the minute is not precise enough.
pub fn utc_seconds(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_default()
}

/// "2026-11-22T18:41": a time in a link's query (`?start=`), read as UTC.
pub fn input_value(ms: i64) -> String {
    minute(ms, 'T', "", "%Y-%m-%dT%H:%M")
}

/// "2026-11-22 18:41": a time field's value, in the one format every page shows times in
/// (see `components::form::UTC_TIME_PATTERN`).
pub fn field_value(ms: i64) -> String {
    minute(ms, ' ', "", "%Y-%m-%d %H:%M")
}

/// The date and minute of `ms`, `between` them and `after`, as chrono writes `pattern`;
/// empty out of chrono's range. Written out rather than through `format`, which parses its
/// pattern on every call: a fleet chart writes a few hundred of these per page and the
/// calendar one per column. Years past four digits are left to `format`, which signs them.
fn minute(ms: i64, between: char, after: &str, pattern: &str) -> String {
    use chrono::{Datelike, Timelike};
    let Some(t) = chrono::DateTime::from_timestamp_millis(ms) else { return String::new() };
    if !(0..=9999).contains(&t.year()) {
        return t.format(pattern).to_string();
    }
    let (y, mo, d, h, mi) = (t.year(), t.month(), t.day(), t.hour(), t.minute());
    format!("{y:04}-{mo:02}-{d:02}{between}{h:02}:{mi:02}{after}")
}

/// "2026-11-22"
pub fn date(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map(|t| t.format("%Y-%m-%d").to_string()).unwrap_or_default()
}

/// Midnight UTC of `date` (`YYYY-MM-DD`), or of today when it is empty or unreadable: where
/// the calendar and the fleet chart start.
pub fn day_start(date: &str, now: i64) -> i64 {
    berth_domain::calendar::day_start(date).unwrap_or_else(|| berth_domain::calendar::today(now))
}

/// "850 ms", "12 s", "4 min 5 s", "1 h 58 min", "3 d 2 h"
pub fn duration_words(ms: i64) -> String {
    let ms = ms.max(0);
    let s = ms / 1000;
    match s {
        _ if ms < 1000 => format!("{ms} ms"),
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min {} s", s / 60, s % 60),
        3600..86_400 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_naturally() {
        assert_eq!(duration_words(850), "850 ms");
        assert_eq!(duration_words(12_400), "12 s");
        assert_eq!(duration_words(245_000), "4 min 5 s");
        assert_eq!(duration_words(7_080_000), "1 h 58 min");
        assert_eq!(duration_words(266_400_000), "3 d 2 h");
        assert_eq!(duration_words(-5), "0 ms");
    }

    #[test]
    fn minutes_are_written_as_chrono_formats_them() {
        let day = 86_400_000_i64;
        for ms in [0, 1, 59_999, 60_000, day - 1, 1_764_000_000_000, 253_402_300_799_999, -1, -day * 800_000]
            .into_iter()
            .chain((0..400).map(|i| i * 7_919 * day / 13 + i * 61_001))
        {
            let expected =
                chrono::DateTime::from_timestamp_millis(ms).unwrap().format("%Y-%m-%d %H:%M UTC").to_string();
            assert_eq!(utc(ms), expected, "{ms}");
        }
        for ms in [0, 1_764_000_000_000, -1, -day * 800_000].into_iter().chain((0..400).map(|i| i * 7_919 * day / 13)) {
            let t = chrono::DateTime::from_timestamp_millis(ms).unwrap();
            assert_eq!(input_value(ms), t.format("%Y-%m-%dT%H:%M").to_string(), "{ms}");
            assert_eq!(field_value(ms), t.format("%Y-%m-%d %H:%M").to_string(), "{ms}");
        }
        assert_eq!(utc(253_402_300_800_000), "+10000-01-01 00:00 UTC");
        assert_eq!(input_value(253_402_300_800_000), "+10000-01-01T00:00");
        assert_eq!(utc(i64::MAX), "");
    }

    #[test]
    fn times_are_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc_seconds(1_795_442_407_500), "2026-11-23 14:00:07 UTC");
        assert_eq!(input_value(1_795_442_400_000), "2026-11-23T14:00");
        assert_eq!(field_value(1_795_442_400_000), "2026-11-23 14:00");
    }

    #[test]
    fn ranges_start_at_midnight_utc_or_today() {
        let now = 1_795_442_400_000; // 2026-11-23 14:00 UTC
        assert_eq!(day_start("2026-11-24", now), 1_795_478_400_000);
        assert_eq!(day_start("", now), 1_795_392_000_000);
        assert_eq!(day_start("someday", now), 1_795_392_000_000);
        assert_eq!(date(day_start("2026-11-24", now)), "2026-11-24");
    }
}
