//! Calendars computed lately, shared by every request asking the same one.
//!
//! The availability calendar is the portal's busiest page, and its heatmap (every catalog
//! shape in every column, over every GPU of each model) costs the same for each of the
//! people who ask on the same day: at 10,000 GPUs and 50 clients, 50 heatmaps a second
//! held the server to 134 pages/s. A calendar is kept per (who asks, range, columns) and
//! handed to every request until what it was made from changes (a generation that every
//! change of the booking book or the fleet advances, after the change) or time alone would
//! change it ([`CalendarKey::fresh_until`]). Requests that miss the same calendar wait for
//! one of them to make it, not each their own; different calendars are made side by side.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use berth_domain::placement::Occupant;

use super::booking::Availability;

/// At most this many calendars are kept, the oldest dropped first: anyone may ask for any
/// range, and a calendar nothing changes would otherwise stay until the next booking.
const MOST_KEPT: usize = 256;

/// Who asks, from when, in which columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct CalendarKey {
    pub occupant: Occupant,
    pub from: i64,
    pub bucket_ms: i64,
    pub buckets: usize,
}

impl CalendarKey {
    /// Until when (exclusive) a calendar made at `now` stays true while no booking and
    /// nothing in the fleet changes. Time changes it in one way only: a booking past its end
    /// holds its GPU until now, so, widened by the cleaning gap `gap_ms`, it reaches a column
    /// once now passes that column's start less the gap. A calendar of columns all begun
    /// stays true; one wholly ahead, until its first column is that near.
    pub(crate) fn fresh_until(&self, now: i64, gap_ms: i64) -> i64 {
        (0..self.buckets)
            .map(|b| self.from + b as i64 * self.bucket_ms - gap_ms)
            .find(|&reached| reached >= now)
            .unwrap_or(i64::MAX)
    }
}

#[derive(Debug)]
struct Kept {
    generation: u64,
    made_at: i64,
    fresh_until: i64,
    calendar: Arc<Availability>,
}

impl Kept {
    fn holds(&self, generation: u64, now: i64) -> bool {
        self.generation == generation && now < self.fresh_until
    }
}

#[derive(Debug, Default)]
pub(crate) struct Calendars {
    /// Advanced after every change of what calendars are made from.
    generation: AtomicU64,
    kept: Mutex<HashMap<CalendarKey, Kept>>,
    /// Per calendar, held while it is made, so that requests missing it together make it
    /// once. An entry nobody holds or waits for is dropped when a calendar is kept.
    making: Mutex<HashMap<CalendarKey, Arc<tokio::sync::Mutex<()>>>>,
}

impl Calendars {
    /// Called after the booking book or the fleet changed: calendars made before are not
    /// handed out any more.
    pub(crate) fn changed(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The generation to make a calendar at: read before what it is made from.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The calendar for `key` made at the current generation and still true at `now`.
    pub(crate) fn get(&self, key: &CalendarKey, now: i64) -> Option<Arc<Availability>> {
        let current = self.generation();
        let kept = self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        kept.get(key).filter(|k| k.holds(current, now)).map(|k| k.calendar.clone())
    }

    /// Keeps a calendar made at `generation` and `now`, true until `fresh_until`; drops those
    /// no longer handed out, and the oldest beyond [`MOST_KEPT`].
    pub(crate) fn keep(
        &self,
        key: CalendarKey,
        generation: u64,
        now: i64,
        fresh_until: i64,
        calendar: Arc<Availability>,
    ) {
        let current = self.generation();
        let mut kept = self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        kept.retain(|_, k| k.holds(current, now));
        if generation == current {
            while kept.len() >= MOST_KEPT {
                let Some(oldest) = kept.iter().min_by_key(|(_, k)| k.made_at).map(|(key, _)| *key) else { break };
                kept.remove(&oldest);
            }
            kept.insert(key, Kept { generation, made_at: now, fresh_until, calendar });
        }
        drop(kept);
        // The maker of `key` still holds its lock (one reference here, one in its guard).
        let mut making = self.making.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        making.retain(|k, lock| *k == key || Arc::strong_count(lock) > 1);
    }

    /// The turn to make the calendar for `key`: requests for it wait for each other.
    pub(crate) async fn making(&self, key: &CalendarKey) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut making = self.making.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            making.entry(*key).or_default().clone()
        };
        lock.lock_owned().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> CalendarKey {
        CalendarKey { occupant: Occupant::Sharing, from: 0, bucket_ms: 3_600_000, buckets: 24 }
    }

    fn calendar() -> Arc<Availability> {
        Arc::new(Availability { from: 0, bucket_ms: 3_600_000, rows: Vec::new() })
    }

    #[test]
    fn a_calendar_is_handed_out_until_a_change_or_until_time_would_change_it() {
        let calendars = Calendars::default();
        let made_at = calendars.generation();
        calendars.keep(key(), made_at, 1_000, 5_000, calendar());
        assert!(calendars.get(&key(), 4_999).is_some());
        assert!(calendars.get(&key(), 5_000).is_none(), "now has moved on");
        assert!(calendars.get(&CalendarKey { occupant: Occupant::Dedicated(7), ..key() }, 1_000).is_none());
        calendars.keep(key(), made_at, 1_000, 5_000, calendar());
        calendars.changed();
        assert!(calendars.get(&key(), 1_001).is_none(), "the book changed");
    }

    #[test]
    fn a_calendar_made_before_a_change_is_not_kept() {
        let calendars = Calendars::default();
        let made_at = calendars.generation();
        // A booking lands while the calendar is being made.
        calendars.changed();
        calendars.keep(key(), made_at, 1_000, i64::MAX, calendar());
        assert!(calendars.get(&key(), 1_000).is_none());
    }

    /// A booking past its end reaches a column once now passes its start less the gap.
    #[test]
    fn time_changes_a_calendar_only_when_now_nears_a_column_it_has_not_reached() {
        let hour = 3_600_000;
        let gap = 15 * 60_000;
        let day = CalendarKey { from: 10 * hour, bucket_ms: hour, buckets: 24, ..key() };
        // Made in the fourth column: true until 15 min before the fifth begins.
        assert_eq!(day.fresh_until(13 * hour + 5, gap), 14 * hour - gap);
        // Made 10 min before the fifth: within the gap already, so until the sixth's turn.
        assert_eq!(day.fresh_until(14 * hour - 10 * 60_000, gap), 15 * hour - gap);
        // Wholly ahead: until its first column is that near.
        assert_eq!(day.fresh_until(hour, gap), 10 * hour - gap);
        // Every column begun: nothing time does changes it.
        assert_eq!(day.fresh_until(34 * hour, gap), i64::MAX);
    }

    #[test]
    fn the_oldest_calendars_go_beyond_the_most_kept() {
        let calendars = Calendars::default();
        let generation = calendars.generation();
        for i in 0..MOST_KEPT as i64 + 10 {
            calendars.keep(CalendarKey { from: i, ..key() }, generation, i, i64::MAX, calendar());
        }
        let at = MOST_KEPT as i64 + 10;
        assert!(calendars.get(&CalendarKey { from: 0, ..key() }, at).is_none(), "the oldest went");
        assert!(calendars.get(&CalendarKey { from: at - 1, ..key() }, at).is_some(), "the newest stays");
        let kept = (0..at).filter(|&i| calendars.get(&CalendarKey { from: i, ..key() }, at).is_some()).count();
        assert_eq!(kept, MOST_KEPT);
    }
}
