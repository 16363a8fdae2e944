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
    let span = build::Span::parse(&view);
    let from = crate::time::day_start(&from, now);
    let (bucket_ms, buckets) = span.buckets();
    // Counted as the caller could book: a hard tenant's users see nodes free of others.
    let availability = platform.availability(caller.tenant_id(), from, bucket_ms, buckets).await.map_err(fail)?;
    let mine = platform.environments_of_owner(&caller).await.map_err(fail)?;
    let gap = platform.policy().cleaning_gap_ms;
    Ok(build::calendar(span, from, now, &availability, &mine, gap))
}

/// Per size of `offering`: how many fit for `hours` from now, else the earliest start.
/// Public, like the catalog; counted for the signed-in user's tenant when there is one.
#[server(endpoint = "size_hints")]
pub async fn size_hints(offering: String, hours: String) -> Result<Vec<crate::model::SizeHint>, AppError> {
    use berth_domain::catalog::Offering;
    let meta = super::ssr::request_meta().await;
    let platform = super::ssr::platform(&meta)?;
    let Some(offering) = Offering::parse(&offering) else { return Ok(Vec::new()) };
    let hours = hours.trim().parse::<u32>().ok().filter(|h| (1..=offering.max_hours()).contains(h)).unwrap_or(4);
    let tenant = super::ssr::signed_in_user(&platform, &meta).await?.and_then(|u| u.tenant_id);
    let sizes = platform
        .size_availability(tenant, offering, hours)
        .await
        .map_err(|e| AppError::from_platform(e, &meta.request_id))?;
    Ok(sizes
        .into_iter()
        .map(|s| crate::model::SizeHint {
            size_id: s.size.id.to_owned(),
            text: match (s.free_now, s.earliest_start) {
                (0, Some(t)) => {
                    format!("none free now; earliest start for {hours} h: {}", berth_domain::booking::utc_short(t))
                }
                (0, None) => format!("none free for {hours} h within the booking horizon"),
                (n, _) => format!("{n} free now for {hours} h"),
            },
            free_now: s.free_now > 0,
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
    use chrono::DateTime;

    use crate::model::{CalendarBooking, CalendarCell, CalendarRow, CalendarView};
    use crate::time::{date, input_value};

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Span {
        Day,
        Week,
        Month,
    }

    impl Span {
        pub fn parse(s: &str) -> Span {
            match s {
                "day" => Span::Day,
                "month" => Span::Month,
                _ => Span::Week,
            }
        }

        fn id(self) -> &'static str {
            match self {
                Span::Day => "day",
                Span::Week => "week",
                Span::Month => "month",
            }
        }

        /// Bucket length and count.
        pub fn buckets(self) -> (i64, usize) {
            match self {
                Span::Day => (HOUR_MS, 24),
                Span::Week => (6 * HOUR_MS, 28),
                Span::Month => (DAY_MS, 30),
            }
        }

        fn days(self) -> i64 {
            match self {
                Span::Day => 1,
                Span::Week => 7,
                Span::Month => 30,
            }
        }
    }

    /// Midnight UTC of `date` (`YYYY-MM-DD`), or of today when it is empty or unreadable.
    fn column_label(span: Span, ms: i64) -> String {
        let format = match span {
            Span::Day => "%H:00",
            Span::Week => "%a %-d %Hh",
            Span::Month => "%a %-d",
        };
        DateTime::from_timestamp_millis(ms).map(|t| t.format(format).to_string()).unwrap_or_default()
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
                        let start = from + i as i64 * bucket_ms;
                        let end = start + bucket_ms;
                        let tone = if end <= now {
                            "past"
                        } else if free == 0 {
                            "none"
                        } else if free * 4 < row.capacity {
                            "low"
                        } else {
                            "plenty"
                        };
                        let hours = (bucket_ms / HOUR_MS).clamp(1, i64::from(offering.max_hours()));
                        let start_value = if start <= now { String::new() } else { input_value(start) };
                        let href = if matches!(tone, "past" | "none") {
                            String::new()
                        } else {
                            format!("/launch/{}?size={}&start={start_value}&hours={hours}", offering.id(), size.id)
                        };
                        let title = format!(
                            "{}: {free} of {} free from {}",
                            size.label,
                            row.capacity,
                            column_label(span, start)
                        );
                        CalendarCell { free, tone: tone.to_owned(), href, start: start_value, title }
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
            rows,
            bookings,
            cleaning_gap: format!("{} min", gap_ms / 60_000),
            bucket_hours: u32::try_from(bucket_ms / HOUR_MS).unwrap_or(1),
        }
    }
}
