//! The spot tier: bookings beyond a user's quota that a guaranteed booking takes back when
//! it needs their capacity.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use berth_domain::booking::{Tier, Timeline, Window, utc_short};
use berth_domain::notification::Notice;
use berth_domain::placement::{Hold, Occupant, Shape};

use crate::audit::{self, Actor, Event, Outcome};
use crate::store::WriteTx;
use crate::{Error, Platform};

impl Platform {
    /// Placement for a guaranteed booking that found no free capacity: placed as if no spot
    /// booking existed, with the spot bookings in its way to reclaim: those on its GPUs and
    /// those on its nodes that `occupant` may not share a node with. `None` when that does
    /// not fit either, or for a spot booking (spot never reclaims spot).
    pub(crate) fn place_reclaiming_spot(
        &self,
        nearby: &Timeline,
        shape: Shape,
        window: Window,
        now: i64,
        tier: Tier,
        occupant: Occupant,
    ) -> Option<(Vec<Hold>, Vec<Arc<str>>)> {
        if tier == Tier::Spot {
            return None;
        }
        let gpus = nearby.set();
        let assignments = self.timeline_of(gpus, now, Some(window), false).place(shape, window, occupant).ok()?;
        let gap = self.policy.cleaning_gap_ms;
        let node_of: HashMap<i64, i64> = gpus.gpus().iter().map(|g| (g.id, g.node_id)).collect();
        let nodes: BTreeSet<i64> = assignments.iter().filter_map(|a| node_of.get(&a.gpu_id).copied()).collect();
        let victims: BTreeSet<Arc<str>> = self
            .book_bookings(gpus.gpus(), now, None, Some(window.widened(gap)))
            .into_iter()
            .filter(|b| {
                let held = b.booking.hold;
                let on_its_gpus = assignments.iter().any(|a| a.gpu_id == held.gpu_id && a.slices.overlaps(held.slices));
                let on_its_nodes = b.booking.occupant.excludes(occupant)
                    && node_of.get(&held.gpu_id).is_some_and(|n| nodes.contains(n));
                b.spot && b.booking.window.conflicts(window, gap) && (on_its_gpus || on_its_nodes)
            })
            .map(|b| b.environment_id)
            .collect();
        Some((assignments, victims.into_iter().collect()))
    }

    /// Ends each reclaimed spot booking: its window is cut to end where the guaranteed one
    /// begins, and it is marked so the reconciler tears it down at once and its owner reads
    /// why. Returns each victim's new end, for the booking book.
    pub(crate) async fn reclaim(
        &self,
        tx: &mut WriteTx,
        victims: &[Arc<str>],
        window: Window,
        now: i64,
    ) -> Result<Vec<(Arc<str>, i64)>, Error> {
        let mut ends = Vec::new();
        for victim in victims {
            let reason = format!("Reclaimed {}: a guaranteed booking needed this spot capacity", utc_short(now));
            // A spot booking starts when it is made, so it began before the guaranteed one:
            // cut at that start, its windows no longer overlap.
            sqlx::query(
                "UPDATE reservations SET ends_at = max(starts_at + 1, min(ends_at, ?)) WHERE environment_id = ? AND released_at IS NULL",
            )
            .bind(window.starts_at)
            .bind(&**victim)
            .execute(&mut **tx)
            .await?;
            let (ends_at, tenant_id, owner_id, name): (i64, Option<i64>, i64, String) = sqlx::query_as(
                "UPDATE environments SET failure_reason = coalesce(failure_reason, ?),
                     ends_at = max(starts_at + 1, min(ends_at, ?))
                 WHERE id = ? AND tier = 'spot' RETURNING ends_at, tenant_id, owner_id, name",
            )
            .bind(&reason)
            .bind(window.starts_at)
            .bind(&**victim)
            .fetch_one(&mut **tx)
            .await?;
            let event = Event {
                action: "environment.reclaimed",
                target: Some(victim),
                outcome: Outcome::Success,
                detail: Some(&reason),
            };
            audit::record(tx, &Actor::background(tenant_id), event).await?;
            let notice = Notice::spot_reclaimed(victim, &name, ends_at);
            self.notify(tx, tenant_id, &[owner_id], &notice).await?;
            ends.push((victim.clone(), ends_at));
        }
        Ok(ends)
    }
}
