use leptos::prelude::*;

use crate::error::AppError;
use crate::model::CalendarView;

/// Free capacity per size over a day (hours), a week (6-hour blocks) or a month (days)
/// from `from` (`YYYY-MM-DD`, UTC; empty for today), with the caller's bookings.
#[server(endpoint = "calendar")]
pub async fn calendar(view: String, from: String) -> Result<CalendarView, AppError> {
    let (platform, caller) = super::ssr::caller().await?;
    let fail = |e| AppError::from_platform(e, &caller.meta.request_id);
    let now = berth_platform::now_ms();
    let span = build::span(&view);
    let from = crate::time::day_start(&from, now);
    let (bucket_ms, buckets) = span.buckets();
    // Counted as the caller could book: a hard tenant's users see nodes free of others.
    let availability = platform.calendar(&caller, from, bucket_ms, buckets).await.map_err(fail)?;
    let mine =
        platform.environments_of_owner_between(&caller, from, from + bucket_ms * buckets as i64).await.map_err(fail)?;
    let gap = platform.policy().cleaning_gap_ms;
    Ok(build::calendar(span, from, now, &availability, &mine, gap))
}

/// Per size of `offering`: how many fit for `hours` from `start` (now when empty), else the
/// earliest start. Public, like the catalog; for a signed-in user counted for their tenant,
/// and within their budgets and those of `project` (its id; empty: none).
#[server(endpoint = "size_hints")]
pub async fn size_hints(
    offering: String,
    hours: String,
    start: String,
    project: String,
) -> Result<Vec<crate::model::SizeHint>, AppError> {
    use berth_domain::booking::utc_short;
    use berth_domain::catalog::Offering;
    let meta = super::ssr::request_meta().await;
    let platform = super::ssr::platform(&meta)?;
    let fail = |e| AppError::from_platform(e, &meta.request_id);
    let Some(offering) = Offering::parse(&offering) else { return Ok(Vec::new()) };
    let hours = hours.trim().parse::<u32>().ok().filter(|h| (1..=offering.max_hours()).contains(h)).unwrap_or(4);
    let user = super::ssr::signed_in_user(&platform, &meta).await?;
    let tenant = user.as_ref().and_then(|u| u.tenant_id);
    // A start still being typed (or in the past) is taken as now; the launch checks it.
    let now = berth_platform::now_ms();
    let start = berth_domain::booking::parse_start(&start).ok().flatten().filter(|s| *s > now);
    let sizes = match user {
        Some(user) => {
            let caller = user.caller(meta.clone());
            platform.size_availability_within_budget(&caller, &project, offering, hours, start).await.map_err(fail)?
        }
        None => platform.size_availability(None, offering, hours, start).await.map_err(fail)?,
    };
    let when = start.map_or_else(|| "now".to_owned(), |s| format!("from {}", utc_short(s)));
    // Prices and the booking's cost by the rate card over the window, the tenant's discount
    // included.
    let card = platform.rate_card().await.map_err(fail)?;
    let from = start.unwrap_or(now);
    let to = from + i64::from(hours) * berth_domain::booking::HOUR_MS;
    let money = berth_domain::metering::format_money;
    let discount = tenant
        .map(|t| card.discount_at(berth_domain::rates::DiscountOf::Tenant(t), from))
        .filter(|points| *points > 0)
        .map(|points| format!("after your team's {} discount", berth_domain::rates::format_percent(points)));
    Ok(sizes
        .into_iter()
        .map(|s| crate::model::SizeHint {
            size_id: s.size.id.to_owned(),
            price: card.size_price_at(s.size.shape, from).map(|c| format!("{}/h", money(c))),
            cost: card
                .size_cost(s.size.shape, false, tenant, from, to)
                .map(|c| format!("{} for {hours} h", money(c.net))),
            discount: discount.clone(),
            text: match (s.free_now, s.earliest_start, &s.over_budget) {
                (_, Some(t), Some(why)) => {
                    format!("over budget {when}: {why}; earliest start within budget: {}", utc_short(t))
                }
                (_, None, Some(why)) => {
                    format!("over budget {when}: {why}; no start within the booking horizon fits the budget")
                }
                (0, Some(t), None) => format!("none free {when}; earliest start for {hours} h: {}", utc_short(t)),
                (0, None, None) => format!("none free for {hours} h within the booking horizon"),
                (n, _, None) => format!("{n} free {when} for {hours} h"),
            },
            free_now: s.free_now > 0 && s.over_budget.is_none(),
        })
        .collect())
}

#[cfg(feature = "ssr")]
mod build {
    use berth_domain::booking::{DAY_MS, HOUR_MS};
    use berth_domain::catalog::{Offering, Size};
    use berth_domain::placement::Shape;
    use berth_platform::capacity::booking::Availability;
    use berth_platform::capacity::environments::Environment;
    use chrono::{DateTime, Datelike, Timelike};

    use crate::model::{CalendarBooking, CalendarCell, CalendarRow, CalendarView, Tone};
    use crate::time::{date, input_value};

    /// The calendar's span; one the page does not know shows a week.
    pub use berth_domain::calendar::CalendarSpan as Span;

    pub fn span(s: &str) -> Span {
        Span::parse(s).unwrap_or(Span::Week)
    }

    /// A column's label: the hour of a day, the day and hour of a week, the day of a month.
    fn column_label(span: Span, ms: i64) -> String {
        // Written out rather than through a format pattern, which chrono parses on every call.
        let Some(t) = DateTime::from_timestamp_millis(ms) else { return String::new() };
        match span {
            Span::Day => format!("{:02}:00", t.hour()),
            Span::Week => format!("{} {} {:02}h", t.weekday(), t.day(), t.hour()),
            Span::Month => format!("{} {}", t.weekday(), t.day()),
        }
    }

    /// The size a calendar cell books: the first offering selling this shape.
    fn size_for(shape: Shape) -> Option<(Offering, &'static Size)> {
        Offering::ALL.into_iter().find_map(|o| o.sizes().iter().find(|s| s.shape == shape).map(|s| (o, s)))
    }

    fn href(span: Span, from: i64) -> String {
        format!("/calendar?view={}&from={}", span.id(), date(from))
    }

    pub fn calendar(
        span: Span,
        from: i64,
        now: i64,
        a: &Availability,
        mine: &[Environment],
        gap_ms: i64,
    ) -> CalendarView {
        let (bucket_ms, buckets) = span.buckets();
        let columns = (0..buckets).map(|i| column_label(span, from + i as i64 * bucket_ms)).collect();
        let starts = (0..buckets)
            .map(|i| {
                let start = from + i as i64 * bucket_ms;
                if start <= now { String::new() } else { input_value(start) }
            })
            .collect();
        let rows = a
            .rows
            .iter()
            .filter_map(|row| {
                let (offering, size) = size_for(row.shape)?;
                let cells = row
                    .free
                    .iter()
                    .enumerate()
                    .map(|(i, &free)| {
                        let end = from + (i as i64 + 1) * bucket_ms;
                        let tone = if end <= now {
                            Tone::Past
                        } else if free == 0 {
                            Tone::None
                        } else if free * 4 < row.capacity {
                            Tone::Low
                        } else {
                            Tone::Plenty
                        };
                        CalendarCell { free, tone }
                    })
                    .collect();
                Some(CalendarRow {
                    model: row.shape.model().name().to_owned(),
                    label: size.label.to_owned(),
                    capacity: row.capacity,
                    launch: format!("/launch/{}?size={}", offering.id(), size.id),
                    max_hours: offering.max_hours(),
                    cells,
                })
            })
            .collect();
        let end = from + buckets as i64 * bucket_ms;
        let bookings = mine
            .iter()
            .filter(|e| !e.state.is_final() && e.starts_at < end && e.ends_at > from)
            .map(|e| {
                let first = ((e.starts_at.max(from) - from) / bucket_ms) as usize;
                let last = ((e.ends_at.min(end) - 1 - from) / bucket_ms) as usize;
                CalendarBooking {
                    name: e.name.clone(),
                    href: format!("/environments/{}", e.id),
                    size: e.size.label.to_owned(),
                    when: format!(
                        "{} to {}",
                        input_value(e.starts_at).replace('T', " "),
                        input_value(e.ends_at).replace('T', " ")
                    ),
                    first,
                    span: last + 1 - first,
                }
            })
            .collect();
        let step = span.days() * DAY_MS;
        let title = match span {
            Span::Day => date(from),
            _ => format!("{} to {}", date(from), date(end - DAY_MS)),
        };
        CalendarView {
            view: span.id().to_owned(),
            title,
            prev_href: href(span, from - step),
            next_href: href(span, from + step),
            today_href: href(span, now),
            columns,
            starts,
            rows,
            bookings,
            cleaning_gap: format!("{} min", gap_ms / 60_000),
            bucket_hours: u32::try_from(bucket_ms / HOUR_MS).unwrap_or(1),
        }
    }

    #[cfg(test)]
    mod tests {
        use berth_platform::capacity::booking::AvailabilityRow;

        use super::*;

        /// The links a cell shows are made from its row and column when drawn; they must
        /// read as they did when each cell carried its own.
        #[test]
        fn cells_link_to_the_launch_form_of_their_size_and_hour() {
            let size = Offering::Notebook.size("h100-1g.10gb").expect("size");
            let from = crate::time::day_start("2026-11-27", 0);
            let now = from + 2 * HOUR_MS + HOUR_MS / 2;
            let mut free = vec![8; 24];
            (free[3], free[4]) = (0, 1);
            let a = Availability {
                from,
                bucket_ms: HOUR_MS,
                rows: vec![AvailabilityRow { shape: size.shape, capacity: 8, free }],
            };
            let view = calendar(Span::Day, from, now, &a, &[], 15 * 60_000);
            let row = &view.rows[0];
            let tones: Vec<&str> = row.cells[..6].iter().map(|c| c.tone.as_str()).collect();
            assert_eq!(tones, ["past", "past", "plenty", "none", "low", "plenty"]);
            // Only free cells ahead are links (`pages/calendar.rs`); the hour under way
            // books from now: the form's start stays empty.
            assert!(!row.cells[1].tone.bookable() && !row.cells[3].tone.bookable());
            assert_eq!(view.launch_href(row, 2, 1), "/launch/notebook?size=h100-1g.10gb&start=&hours=1");
            assert_eq!(
                view.launch_href(row, 4, 1),
                "/launch/notebook?size=h100-1g.10gb&start=2026-11-27T04:00&hours=1"
            );
            assert_eq!(view.columns[4], "04:00");
            // Column labels of each span: 2026-11-27 is a Friday.
            assert_eq!(column_label(Span::Week, from + 6 * HOUR_MS), "Fri 27 06h");
            assert_eq!(column_label(Span::Month, from + 3 * DAY_MS), "Mon 30");
            // A dragged stretch of three hours from 05:00.
            assert_eq!(
                view.launch_href(row, 5, 3),
                "/launch/notebook?size=h100-1g.10gb&start=2026-11-27T05:00&hours=3"
            );
        }
    }
}
