//! Maintenance windows, and the schedule of every node and GPU that platform admins see.

use std::collections::{BTreeMap, HashMap};

use berth_domain::Refusal;
use berth_domain::booking::{self, Window, utc_short};
use berth_domain::mig::profile_name;
use berth_domain::notification::Notice;
use berth_domain::policy::{Action, Target};
use sqlx::{Row, SqliteConnection};

use crate::audit::{self, Event, Outcome};
use crate::{Caller, Error, Platform, now_ms};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaintenanceWindow {
    pub id: i64,
    pub site: String,
    pub node: String,
    /// One GPU of the node, or `None` for all of it.
    pub gpu_index: Option<i64>,
    pub starts_at: i64,
    pub ends_at: i64,
    pub reason: String,
}

/// A booking that overlaps a new maintenance window: its owner should rebook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AffectedBooking {
    pub environment_id: String,
    pub name: String,
    pub owner_email: String,
    pub starts_at: i64,
    pub ends_at: i64,
}

/// One node over a range of time: its GPUs with what is booked on each, and its
/// maintenance windows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSchedule {
    pub site: String,
    pub node: String,
    pub model: String,
    /// The node's NVLink domain when it spans several nodes.
    pub nvlink_domain: Option<String>,
    /// Its InfiniBand scalable unit, if it has InfiniBand.
    pub ib_unit: Option<String>,
    pub gpus: Vec<GpuSchedule>,
    pub maintenance: Vec<MaintenanceWindow>,
    /// Its lifecycle state (`domain::node_health::NodeState::as_str`) and repair tier.
    pub state: String,
    pub repair_tier: i64,
    /// The last state change: why, by whom (`None`: Berth itself or the fleet file), when.
    pub state_reason: Option<String>,
    pub state_by: Option<String>,
    pub state_at: Option<i64>,
    /// When its agent last reported, if ever, and the agent's version.
    pub agent_seen_at: Option<i64>,
    pub agent_version: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSchedule {
    pub index: i64,
    pub mig_capable: bool,
    /// The InfiniBand rail it is cabled to.
    pub ib_rail: Option<i64>,
    /// 1, or how many ways it is time-sliced for development shares.
    pub time_slices: i64,
    /// `healthy`, `degraded` or `failed`.
    pub health: String,
    pub health_note: Option<String>,
    pub bookings: Vec<ScheduledBooking>,
    /// Its latest utilization reading (percent; the mean of its slices' or shares'), while
    /// a booking holds it and its readings arrive; `None` otherwise.
    pub utilization_pct: Option<u32>,
}

/// Read by `schedule_of` from a JSON array of its fields, in this order.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct ScheduledBooking {
    pub environment_id: String,
    pub name: String,
    pub owner_email: String,
    pub state: String,
    pub slice_start: i64,
    pub slice_size: i64,
    /// The MIG profile's name on this GPU (`3g.40gb`), or `None` for the whole GPU.
    pub mig_profile: Option<String>,
    pub starts_at: i64,
    pub ends_at: i64,
}

/// Nodes on one page of the fleet chart: 128 GPU rows of eight-GPU nodes.
pub const NODES_PER_PAGE: usize = 16;

/// Which nodes the fleet chart shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFilter {
    /// One site, or all of them.
    pub site: Option<String>,
    /// Part of a node's name; empty for every node.
    pub search: String,
    /// From 1; a page past the last shows the last.
    pub page: usize,
}

/// One page of the fleet chart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetSchedule {
    /// By site and name.
    pub nodes: Vec<NodeSchedule>,
    pub page: usize,
    pub pages: usize,
    /// Nodes the filter matches, on every page.
    pub total_nodes: usize,
    /// Every site with nodes in service, for the filter.
    pub sites: Vec<String>,
    /// Every node in service, by site and name, for the maintenance and health forms.
    pub node_names: Vec<String>,
}

/// The nodes `filter` picks for its page, by site and name, and what the page's filter
/// and forms offer of the whole fleet.
pub(crate) struct NodePage {
    pub node_ids: Vec<i64>,
    /// The page shown: the asked one, within 1..=pages.
    pub page: usize,
    pub pages: usize,
    pub total_nodes: usize,
    /// As in `FleetSchedule`.
    pub sites: Vec<String>,
    pub node_names: Vec<String>,
}

/// Reads every node in service once, by site and name, and picks `filter`'s page from
/// them: the page's filter lists every site and its forms every node, so that one read
/// also counts and pages the nodes (`instr` and `=` in SQL are `contains` and `==` here).
pub(crate) async fn nodes_on_page(conn: &mut SqliteConnection, filter: &NodeFilter) -> Result<NodePage, Error> {
    let site = filter.site.as_deref().map(str::trim).filter(|s| !s.is_empty());
    let search = filter.search.trim();
    let in_service: Vec<(i64, String, String)> = sqlx::query_as(
        "SELECT n.id, s.name, n.name FROM nodes n JOIN sites s ON s.id = n.site_id WHERE n.in_service = 1
         ORDER BY s.name, n.name",
    )
    .fetch_all(&mut *conn)
    .await?;
    let matching: Vec<i64> = in_service
        .iter()
        .filter(|(_, s, n)| site.is_none_or(|site| s == site) && n.contains(search))
        .map(|(id, _, _)| *id)
        .collect();
    let total_nodes = matching.len();
    let pages = total_nodes.div_ceil(NODES_PER_PAGE).max(1);
    let page = filter.page.clamp(1, pages);
    let node_ids = matching.into_iter().skip((page - 1) * NODES_PER_PAGE).take(NODES_PER_PAGE).collect();
    let mut sites: Vec<String> = in_service.iter().map(|(_, site, _)| site.clone()).collect();
    sites.dedup();
    let node_names = in_service.into_iter().map(|(_, _, node)| node).collect();
    Ok(NodePage { node_ids, page, pages, total_nodes, sites, node_names })
}

/// The booking book's name for a maintenance window's hold.
pub(crate) fn hold_id(id: i64) -> String {
    format!("maintenance:{id}")
}

impl Platform {
    /// Takes `node` (or only its GPU `gpu`) out of booking from `start` (empty: now) to
    /// `end`. New bookings on those GPUs in that window are refused; bookings already there
    /// are returned so their owners can be asked to rebook. Platform admins only.
    #[allow(clippy::too_many_arguments)]
    pub async fn schedule_maintenance(
        &self,
        caller: &Caller,
        node: &str,
        gpu: Option<i64>,
        start: &str,
        end: &str,
        reason: &str,
    ) -> Result<(MaintenanceWindow, Vec<AffectedBooking>), Error> {
        self.authorize(caller, Action::FleetManage, Target::Platform).await?;
        let now = now_ms();
        let reason = reason.trim();
        if reason.is_empty() {
            return Err(Refusal::InvalidReason("is required, so users know why").into());
        }
        if reason.chars().count() > 200 {
            return Err(Refusal::InvalidReason("must be at most 200 characters").into());
        }
        if reason.chars().any(char::is_control) {
            return Err(Refusal::InvalidReason("must be one line of printable characters").into());
        }
        let starts_at = booking::start_at(booking::parse_start(start)?, now, &self.policy)?;
        let ends_at = booking::parse_end(end)?;
        if ends_at <= starts_at {
            return Err(Refusal::EndNotAfterStart.into());
        }
        let mut tx = self.begin_write().await?;
        let found: Option<(i64, String)> = sqlx::query_as(
            "SELECT n.id, s.name FROM nodes n JOIN sites s ON s.id = n.site_id WHERE n.name = ? AND n.in_service = 1",
        )
        .bind(node)
        .fetch_optional(&mut *tx)
        .await?;
        let (node_id, site) = found.ok_or_else(|| Refusal::UnknownNode(node.to_owned()))?;
        let gpu_id: Option<i64> = match gpu {
            None => None,
            Some(index) => Some(
                sqlx::query_scalar("SELECT id FROM gpus WHERE node_id = ? AND idx = ? AND in_service = 1")
                    .bind(node_id)
                    .bind(index)
                    .fetch_optional(&mut *tx)
                    .await?
                    .ok_or_else(|| Refusal::UnknownGpu { node: node.to_owned(), index })?,
            ),
        };
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO maintenance_windows (node_id, gpu_id, starts_at, ends_at, reason, created_by, created_at)
             VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
        )
        .bind(node_id)
        .bind(gpu_id)
        .bind(starts_at)
        .bind(ends_at)
        .bind(reason)
        .bind(caller.user_id())
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        let gpus: Vec<i64> = match gpu_id {
            Some(id) => vec![id],
            None => {
                sqlx::query_scalar("SELECT id FROM gpus WHERE node_id = ?").bind(node_id).fetch_all(&mut *tx).await?
            }
        };
        let affected = bookings_on(&mut tx, &gpus, Window { starts_at, ends_at }).await?;
        let target = match gpu {
            Some(index) => format!("gpu:{node}/{index}"),
            None => format!("node:{node}"),
        };
        let detail = format!(
            "{} to {}: {reason}; {} bookings overlap",
            utc_short(starts_at),
            utc_short(ends_at),
            affected.len()
        );
        let event = Event {
            action: "maintenance.schedule",
            target: Some(&target),
            outcome: Outcome::Success,
            detail: Some(&detail),
        };
        audit::record(&mut tx, &caller.actor(), event).await?;
        // Each owner of an affected booking hears of it once, with all their bookings.
        let mut owners: BTreeMap<(i64, Option<i64>), Vec<String>> = Default::default();
        for booking in &affected {
            let (owner_id, tenant_id): (i64, Option<i64>) =
                sqlx::query_as("SELECT owner_id, tenant_id FROM environments WHERE id = ?")
                    .bind(&booking.environment_id)
                    .fetch_one(&mut *tx)
                    .await?;
            owners.entry((owner_id, tenant_id)).or_default().push(booking.name.clone());
        }
        for ((owner_id, tenant_id), names) in owners {
            let notice = Notice::maintenance(node, starts_at, ends_at, &names);
            self.notify(&mut tx, tenant_id, &[owner_id], &notice).await?;
        }
        let window = Window { starts_at, ends_at };
        tx.commit_and(|| self.with_book(|book| book.add_maintenance(&hold_id(id), &gpus, window))).await?;
        let scheduled = MaintenanceWindow {
            id,
            site,
            node: node.to_owned(),
            gpu_index: gpu,
            starts_at,
            ends_at,
            reason: reason.to_owned(),
        };
        Ok((scheduled, affected))
    }

    /// Records GPU `index` of `node` as `health` (`healthy`, `degraded` or `failed`) with a
    /// note. Only healthy GPUs take new bookings; the bookings still on this one are
    /// returned so their owners can be asked to rebook. Platform admins only.
    pub async fn set_gpu_health(
        &self,
        caller: &Caller,
        node: &str,
        index: i64,
        health: &str,
        note: &str,
    ) -> Result<Vec<AffectedBooking>, Error> {
        self.authorize(caller, Action::FleetManage, Target::Platform).await?;
        if !matches!(health, "healthy" | "degraded" | "failed") {
            return Err(Refusal::InvalidHealth(health.to_owned()).into());
        }
        let note = note.trim();
        if note.chars().count() > 200 {
            return Err(Refusal::InvalidReason("must be at most 200 characters").into());
        }
        let mut tx = self.begin_write().await?;
        let gpu_id: i64 = sqlx::query_scalar(
            "SELECT g.id FROM gpus g JOIN nodes n ON n.id = g.node_id WHERE n.name = ? AND g.idx = ? AND g.in_service = 1",
        )
        .bind(node)
        .bind(index)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| Refusal::UnknownGpu { node: node.to_owned(), index })?;
        // Marked as the admin's, so the node's agent does not overrule a degraded or failed.
        sqlx::query("UPDATE gpus SET health = ?, health_note = ?, health_by = 'admin' WHERE id = ?")
            .bind(health)
            .bind((!note.is_empty()).then_some(note))
            .bind(gpu_id)
            .execute(&mut *tx)
            .await?;
        let affected =
            bookings_on(&mut tx, &[gpu_id], Window { starts_at: i64::MIN / 2, ends_at: i64::MAX / 2 }).await?;
        let target = format!("gpu:{node}/{index}");
        let detail = if note.is_empty() { health.to_owned() } else { format!("{health}: {note}") };
        let event =
            Event { action: "gpu.health", target: Some(&target), outcome: Outcome::Success, detail: Some(&detail) };
        audit::record(&mut tx, &caller.actor(), event).await?;
        // Placement reads the fleet from memory: read it again with this GPU's new health.
        tx.commit_and(|| self.forget_fleet()).await?;
        Ok(affected)
    }

    /// Ends a maintenance window early (or calls it off). Platform admins only.
    pub async fn cancel_maintenance(&self, caller: &Caller, id: i64) -> Result<(), Error> {
        self.authorize(caller, Action::FleetManage, Target::Platform).await?;
        let mut tx = self.begin_write().await?;
        let changed =
            sqlx::query("UPDATE maintenance_windows SET cancelled_at = ? WHERE id = ? AND cancelled_at IS NULL")
                .bind(now_ms())
                .bind(id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        if changed == 0 {
            return Err(Error::NotFound);
        }
        let target = format!("maintenance:{id}");
        let event =
            Event { action: "maintenance.cancel", target: Some(&target), outcome: Outcome::Success, detail: None };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit_and(|| self.with_book(|book| book.release(&hold_id(id)))).await?;
        Ok(())
    }

    /// One page of the nodes in service that `filter` picks, with their GPUs, what is
    /// booked on each and their maintenance windows, between `from` and `to`. Platform
    /// admins only. Paged because a fleet of thousands of GPUs is one chart nobody reads
    /// (and one page nobody waits for).
    pub async fn fleet_schedule(
        &self,
        caller: &Caller,
        from: i64,
        to: i64,
        filter: &NodeFilter,
    ) -> Result<FleetSchedule, Error> {
        self.authorize(caller, Action::FleetRead, Target::Platform).await?;
        let mut conn = self.db.acquire().await?;
        let page = nodes_on_page(&mut conn, filter).await?;
        schedule_of(&mut conn, page, from, to).await
    }
}

/// What the fleet chart shows of the nodes on `page` between `from` and `to`.
pub(crate) async fn schedule_of(
    conn: &mut SqliteConnection,
    page: NodePage,
    from: i64,
    to: i64,
) -> Result<FleetSchedule, Error> {
    let now = now_ms();
    let NodePage { node_ids, page, pages, total_nodes, sites, node_names } = page;
    let node_ids = serde_json::to_string(&node_ids).map_err(Error::internal)?;
    // One row per node, with its GPUs (each with how busy it is), what is booked on them and
    // its maintenance windows in three JSON arrays, rather than a row per GPU, booking and
    // window in queries of their own: sqlx hands each row and each answer over from its
    // worker thread as a message of its own and copies every value, and the chart is read
    // on every view. How busy: each held GPU's latest minute of readings (the telemetry
    // store's fine buckets of the last two minutes), the mean of its slices' or shares'.
    let fine = berth_domain::telemetry::FINE;
    let rows = sqlx::query(
        "SELECT n.id, s.name, n.name, n.gpu_model, CASE WHEN n.nvlink_domain != n.name THEN n.nvlink_domain END,
                n.ib_unit, n.state, n.repair_tier, c.reason, cu.email, c.changed_at, n.agent_seen_at, n.agent_version,
                (SELECT json_group_array(json_array(g.id, g.idx, g.mig_enabled, g.health, g.health_note, g.ib_rail,
                                                    g.time_slices,
                                                    (SELECT avg(sa.utilization_sum / sa.readings)
                                                     FROM reservations r JOIN gpu_samples sa ON sa.reservation_id = r.id
                                                         AND sa.resolution_s = ?5
                                                         AND sa.bucket = (SELECT max(l.bucket) FROM gpu_samples l
                                                                          WHERE l.reservation_id = r.id
                                                                            AND l.resolution_s = ?5 AND l.bucket >= ?6)
                                                     WHERE r.gpu_id = g.id AND r.released_at IS NULL))
                                         ORDER BY g.idx)
                 FROM gpus g WHERE g.node_id = n.id AND g.in_service = 1),
                (SELECT json_group_array(json_array(r.gpu_id, g.model,
                                                    json_array(e.id, e.name, u.email, e.state, r.slice_start, r.slice_size,
                                                               r.mig_profile, r.starts_at, max(r.ends_at, ?2)))
                                         ORDER BY r.starts_at)
                 FROM gpus g JOIN reservations r ON r.gpu_id = g.id JOIN environments e ON e.id = r.environment_id
                 JOIN users u ON u.id = e.owner_id
                 WHERE g.node_id = n.id AND r.released_at IS NULL AND r.starts_at < ?4 AND max(r.ends_at, ?2) > ?3),
                (SELECT json_group_array(json_array(m.id, (SELECT g.idx FROM gpus g WHERE g.id = m.gpu_id),
                                                    m.starts_at, m.ends_at, m.reason)
                                         ORDER BY m.starts_at, m.id)
                 FROM maintenance_windows m
                 WHERE m.node_id = n.id AND m.cancelled_at IS NULL AND m.starts_at < ?4 AND m.ends_at > ?3)
         FROM nodes n JOIN sites s ON s.id = n.site_id
         LEFT JOIN node_state_changes c ON c.id = (SELECT max(id) FROM node_state_changes WHERE node_id = n.id)
         LEFT JOIN users cu ON cu.id = c.changed_by
         WHERE n.id IN (SELECT value FROM json_each(?1)) ORDER BY s.name, n.name",
    )
    .bind(&node_ids)
    .bind(now)
    .bind(from)
    .bind(to)
    .bind(fine.seconds)
    .bind(fine.bucket_of(now) - 2 * fine.seconds * 1000)
    .fetch_all(&mut *conn)
    .await?;
    // (id, index, MIG mode, health, its note, InfiniBand rail, time slices, utilization)
    type GpuRow = (i64, i64, i64, String, Option<String>, Option<i64>, i64, Option<f64>);
    // (GPU, its model, the booking with its MIG profile's key for a name)
    type BookingRow = (i64, String, ScheduledBooking);
    // (id, the one GPU's index or none for the whole node, start, end, reason)
    type WindowRow = (i64, Option<i64>, i64, i64, String);
    let mut nodes = Vec::with_capacity(rows.len());
    for row in &rows {
        let gpu_rows: Vec<GpuRow> = serde_json::from_str(row.try_get(13)?).map_err(Error::internal)?;
        let mut gpu_at: HashMap<i64, usize> = HashMap::with_capacity(gpu_rows.len());
        let mut gpus = Vec::with_capacity(gpu_rows.len());
        for (id, index, mig, health, health_note, ib_rail, time_slices, busy) in gpu_rows {
            gpu_at.insert(id, gpus.len());
            gpus.push(GpuSchedule {
                index,
                mig_capable: mig != 0,
                ib_rail,
                time_slices,
                health,
                health_note,
                bookings: Vec::new(),
                utilization_pct: busy.map(|pct| pct.round().clamp(0.0, 100.0) as u32),
            });
        }
        let bookings: Vec<BookingRow> = serde_json::from_str(row.try_get(14)?).map_err(Error::internal)?;
        for (gpu, model, mut booking) in bookings {
            // A GPU out of service is not drawn, nor what is still booked on it.
            let Some(&i) = gpu_at.get(&gpu) else { continue };
            booking.mig_profile = booking.mig_profile.map(|key| profile_name(&model, &key));
            gpus[i].bookings.push(booking);
        }
        let (site, node): (String, String) = (row.try_get(1)?, row.try_get(2)?);
        let windows: Vec<WindowRow> = serde_json::from_str(row.try_get(15)?).map_err(Error::internal)?;
        let maintenance = windows
            .into_iter()
            .map(|(id, gpu_index, starts_at, ends_at, reason)| MaintenanceWindow {
                id,
                site: site.clone(),
                node: node.clone(),
                gpu_index,
                starts_at,
                ends_at,
                reason,
            })
            .collect();
        nodes.push(NodeSchedule {
            site,
            node,
            model: row.try_get(3)?,
            nvlink_domain: row.try_get(4)?,
            ib_unit: row.try_get(5)?,
            gpus,
            maintenance,
            state: row.try_get(6)?,
            repair_tier: row.try_get(7)?,
            state_reason: row.try_get(8)?,
            state_by: row.try_get(9)?,
            state_at: row.try_get(10)?,
            agent_seen_at: row.try_get(11)?,
            agent_version: row.try_get(12)?,
        });
    }
    Ok(FleetSchedule { nodes, page, pages, total_nodes, sites, node_names })
}

/// The environments holding any of `gpus` during `window`, for their owners to rebook.
async fn bookings_on(conn: &mut SqliteConnection, gpus: &[i64], window: Window) -> Result<Vec<AffectedBooking>, Error> {
    let ids = serde_json::to_string(gpus).map_err(Error::internal)?;
    sqlx::query(
        "SELECT DISTINCT e.id, e.name, u.email, e.starts_at, e.ends_at
         FROM reservations r JOIN environments e ON e.id = r.environment_id JOIN users u ON u.id = e.owner_id
         WHERE r.gpu_id IN (SELECT value FROM json_each(?)) AND r.released_at IS NULL AND r.starts_at < ? AND r.ends_at > ?
         ORDER BY e.starts_at",
    )
    .bind(ids)
    .bind(window.ends_at)
    .bind(window.starts_at)
    .fetch_all(&mut *conn)
    .await?
    .iter()
    .map(|row| {
        Ok(AffectedBooking {
            environment_id: row.try_get(0)?,
            name: row.try_get(1)?,
            owner_email: row.try_get(2)?,
            starts_at: row.try_get(3)?,
            ends_at: row.try_get(4)?,
        })
    })
    .collect()
}
