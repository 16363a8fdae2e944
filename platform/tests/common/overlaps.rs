//! The independent double-booking checker of the tests and of the booking benchmark: it
//! reads reservations and fabric leases as plain rows and finds, in Rust, the pairs that may
//! not both hold what they hold. It shares nothing with the booking code nor with the
//! database's triggers, which are what it checks: a booking the product let through and the
//! trigger stopped shows as a `trigger_abort`, one that both let through shows here.

use std::collections::{HashMap, HashSet};

use berth_platform::Error;
use sqlx::SqlitePool;

/// One unreleased reservation, as the table holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldSlices {
    pub id: i64,
    pub environment_id: String,
    pub gpu_id: i64,
    /// Memory slices (or time-sliced shares) `[slice_start, slice_end)` of the GPU's eight.
    pub slice_start: i64,
    pub slice_end: i64,
    pub starts_at: i64,
    pub ends_at: i64,
}

/// Pairs of unreleased reservations that may not both hold their GPU: they share a memory
/// slice, and their windows overlap or come closer than `gap_ms` (the cleaning gap the
/// product keeps between bookings of a unit). A spot booking reclaimed by a guaranteed one is
/// cut to end where that one starts (no gap: the reclaim ends it at once); it still may not
/// overlap.
pub async fn double_bookings(pool: &SqlitePool, gap_ms: i64) -> Vec<(HeldSlices, HeldSlices)> {
    let rows: Vec<(i64, String, i64, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT id, environment_id, gpu_id, slice_start, slice_size, starts_at, ends_at
           FROM reservations WHERE released_at IS NULL",
    )
    .fetch_all(pool)
    .await
    .expect("reservations");
    let reclaimed: HashSet<String> = sqlx::query_scalar(
        "SELECT target FROM audit_events WHERE action = 'environment.reclaimed' AND target IS NOT NULL",
    )
    .fetch_all(pool)
    .await
    .expect("reclaims")
    .into_iter()
    .collect();
    let mut by_gpu: HashMap<i64, Vec<HeldSlices>> = HashMap::new();
    for (id, environment_id, gpu_id, slice_start, slice_size, starts_at, ends_at) in rows {
        let held = HeldSlices {
            id,
            environment_id,
            gpu_id,
            slice_start,
            slice_end: slice_start + slice_size,
            starts_at,
            ends_at,
        };
        by_gpu.entry(gpu_id).or_default().push(held);
    }
    let mut pairs = Vec::new();
    for held in by_gpu.values_mut() {
        held.sort_by_key(|h| (h.starts_at, h.id));
        for (i, a) in held.iter().enumerate() {
            // Sorted by start: once one starts a gap after `a` ends, so do all after it.
            for b in held[i + 1..].iter().take_while(|b| b.starts_at < a.ends_at + gap_ms) {
                let shares_a_slice = a.slice_start < b.slice_end && b.slice_start < a.slice_end;
                let at_once = a.starts_at < b.ends_at && b.starts_at < a.ends_at;
                let cut_by_reclaim = reclaimed.contains(&a.environment_id) && a.ends_at <= b.starts_at;
                if shares_a_slice && (at_once || !cut_by_reclaim) {
                    pairs.push((a.clone(), b.clone()));
                }
            }
        }
    }
    pairs
}

/// How many pairs `double_bookings` finds with the default policy's cleaning gap.
pub async fn overlapping_reservations(pool: &SqlitePool) -> i64 {
    let gap = berth_domain::booking::BookingPolicy::default().cleaning_gap_ms;
    let pairs = double_bookings(pool, gap).await;
    if let Some((a, b)) = pairs.first() {
        eprintln!("double booking ({} pairs), the first: {a:?} and {b:?}", pairs.len());
    }
    pairs.len() as i64
}

/// Leases of one kind and value whose lives overlap: both held, or one handed out again
/// before the other's quarantine ended (a lease still held has no quarantine end yet).
pub async fn overlapping_leases(pool: &SqlitePool) -> i64 {
    let rows: Vec<(i64, String, i64, i64, Option<i64>)> =
        sqlx::query_as("SELECT id, kind, value, held_at, quarantine_until FROM fabric_leases")
            .fetch_all(pool)
            .await
            .expect("fabric leases");
    let mut by_identifier: HashMap<(String, i64), Vec<(i64, i64)>> = HashMap::new();
    for (_, kind, value, held_at, quarantine_until) in rows {
        by_identifier.entry((kind, value)).or_default().push((held_at, quarantine_until.unwrap_or(i64::MAX)));
    }
    let mut pairs = 0;
    for lives in by_identifier.values() {
        for (i, a) in lives.iter().enumerate() {
            pairs += lives[i + 1..].iter().filter(|b| a.0 < b.1 && b.0 < a.1).count() as i64;
        }
    }
    pairs
}

/// The message of a database trigger's `RAISE(ABORT, ...)` behind `error`, if that is what it
/// is. Berth's own refusals are `Error::Refused`; an abort means a write reached the database
/// breaking an invariant the product should have refused itself: a bug even though the
/// trigger kept it out.
pub fn trigger_abort(error: &Error) -> Option<String> {
    let Error::Internal(cause) = error else { return None };
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(cause.as_ref());
    while let Some(e) = next {
        if let Some(sqlx::Error::Database(db)) = e.downcast_ref::<sqlx::Error>() {
            // SQLITE_CONSTRAINT_TRIGGER (19 | 7 << 8): what RAISE(ABORT, ...) returns.
            if db.code().as_deref() == Some("1811") {
                return Some(db.message().to_owned());
            }
        }
        next = e.source();
    }
    None
}
