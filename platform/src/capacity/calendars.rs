//! Calendars computed lately, shared by every request asking the same one.
//!
//! The availability calendar is the portal's busiest page, and its heatmap (every catalog
//! shape in every column, over every GPU of each model) costs the same for each of the
//! people who ask on the same day: at 10,000 GPUs and 50 clients, 50 heatmaps a second
//! held the server to 134 pages/s. A calendar is kept per (who asks, range, columns) and
//! handed to every request until what it was made from changes (a generation that every
//! change of the booking book or the fleet advances, after the change) or it is
//! [`FRESH_FOR_MS`] old (`now` moves on: a booking past its end holds its GPU until now).
//! Requests that miss the same calendar wait for one of them to make it, not each their
//! own; different calendars are made side by side.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use berth_domain::placement::Occupant;

use super::booking::Availability;

/// How long a calendar is handed out when nothing changed: the columns count from `now`.
pub const FRESH_FOR_MS: i64 = 2_000;

/// Who asks, from when, in which columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct CalendarKey {
    pub occupant: Occupant,
    pub from: i64,
    pub bucket_ms: i64,
    pub buckets: usize,
}

#[derive(Debug)]
struct Kept {
    generation: u64,
    made_at: i64,
    calendar: Arc<Availability>,
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

    /// The calendar for `key` made at the current generation within [`FRESH_FOR_MS`].
    pub(crate) fn get(&self, key: &CalendarKey, now: i64) -> Option<Arc<Availability>> {
        let current = self.generation();
        let kept = self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        kept.get(key).filter(|k| k.generation == current && now - k.made_at < FRESH_FOR_MS).map(|k| k.calendar.clone())
    }

    /// Keeps a calendar made at `generation`; drops those no longer handed out.
    pub(crate) fn keep(&self, key: CalendarKey, generation: u64, now: i64, calendar: Arc<Availability>) {
        let current = self.generation();
        let mut kept = self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        kept.retain(|_, k| k.generation == current && now - k.made_at < FRESH_FOR_MS);
        if generation == current {
            kept.insert(key, Kept { generation, made_at: now, calendar });
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
    fn a_calendar_is_handed_out_until_a_change_or_for_two_seconds() {
        let calendars = Calendars::default();
        let made_at = calendars.generation();
        calendars.keep(key(), made_at, 1_000, calendar());
        assert!(calendars.get(&key(), 1_000 + FRESH_FOR_MS - 1).is_some());
        assert!(calendars.get(&key(), 1_000 + FRESH_FOR_MS).is_none(), "now has moved on");
        assert!(calendars.get(&CalendarKey { occupant: Occupant::Dedicated(7), ..key() }, 1_000).is_none());
        calendars.changed();
        assert!(calendars.get(&key(), 1_001).is_none(), "the book changed");
    }

    #[test]
    fn a_calendar_made_before_a_change_is_not_kept() {
        let calendars = Calendars::default();
        let made_at = calendars.generation();
        // A booking lands while the calendar is being made.
        calendars.changed();
        calendars.keep(key(), made_at, 1_000, calendar());
        assert!(calendars.get(&key(), 1_000).is_none());
    }
}
