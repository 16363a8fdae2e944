//! Idle reclamation: when a booked environment whose GPUs do nothing is warned and then
//! stopped, so its capacity goes back to the calendar.
//!
//! A platform admin sets an [`IdlePolicy`] per offering; a tenant admin may set a stricter
//! one for the tenant ([`IdlePolicy::check_within`]), and the two combine into the one
//! that applies ([`IdlePolicy::strictest`]). Each pass of the watcher gives [`decide`]
//! what it knows of one environment and acts on the answer.

use crate::Refusal;
use crate::booking::utc_short;
use crate::catalog::Offering;

/// How idleness is judged for one offering.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IdlePolicy {
    /// A GPU is idle while its utilization stays under this (percent).
    pub below_pct: f64,
    /// How long every GPU of the environment must stay idle (and its proxy see no
    /// traffic) before its owner is warned, in seconds.
    pub idle_for_s: i64,
    /// How long after the warning it is stopped unless the owner keeps it, in seconds.
    pub grace_s: i64,
    /// How many times an owner may choose "keep it" in one booking; `None` is no limit.
    pub max_keeps: Option<i64>,
}

/// The shortest idle time a policy may set. Activity is known to the minute (the sample
/// store's fine buckets), so a GPU counts as busy until the end of the minute it was
/// busy in: short times judge late rather than early.
pub const MIN_IDLE_S: i64 = 10;
/// The longest idle time a policy may set: the readings it is judged on are kept a day
/// and an hour (`telemetry::COARSE_KEPT_MS`), so a longer one could never be reached.
pub const MAX_IDLE_S: i64 = 24 * 3600;
/// The longest grace a policy may set (a week).
pub const MAX_DURATION_S: i64 = 7 * 24 * 3600;
/// A source that sent nothing for this long says nothing about idleness: without fresh
/// readings nobody is warned or stopped.
pub const STALE_AFTER_MS: i64 = 5 * 60_000;

impl IdlePolicy {
    /// A policy from a form's fields: a percentage, two durations (`90s`, `15m`, `1h`,
    /// `1h30m`; a bare number is minutes) and an optional keep limit (empty: no limit).
    pub fn parse(below_pct: &str, idle_for: &str, grace: &str, max_keeps: &str) -> Result<IdlePolicy, Refusal> {
        let below_pct = below_pct
            .trim()
            .trim_end_matches('%')
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|p| *p > 0.0 && *p <= 100.0)
            .ok_or_else(|| {
                Refusal::InvalidIdlePolicy("the threshold is a percentage above 0 and at most 100".into())
            })?;
        let idle_for_s =
            parse_duration(idle_for).filter(|s| (MIN_IDLE_S..=MAX_IDLE_S).contains(s)).ok_or_else(|| {
                Refusal::InvalidIdlePolicy(format!(
                    "\"{}\" is not an idle time between {MIN_IDLE_S}s and 24h (write 90s, 15m, 1h or 1h30m)",
                    idle_for.trim()
                ))
            })?;
        let grace_s = parse_duration(grace).filter(|s| (0..=MAX_DURATION_S).contains(s)).ok_or_else(|| {
            Refusal::InvalidIdlePolicy(format!(
                "\"{}\" is not a grace between 0 and 7 days (write 0, 90s, 15m or 1h)",
                grace.trim()
            ))
        })?;
        let max_keeps = match max_keeps.trim() {
            "" => None,
            text => Some(text.parse::<i64>().ok().filter(|k| (0..=1000).contains(k)).ok_or_else(|| {
                Refusal::InvalidIdlePolicy(format!(
                    "\"{text}\" is not a number of keeps (0 to 1000, or empty for no limit)"
                ))
            })?),
        };
        Ok(IdlePolicy { below_pct, idle_for_s, grace_s, max_keeps })
    }

    /// A tenant's policy may only be stricter than the platform's: a threshold at least as
    /// high, an idle time and a grace at most as long, no more keeps.
    pub fn check_within(&self, platform: &IdlePolicy) -> Result<(), Refusal> {
        let mut looser = Vec::new();
        if self.below_pct < platform.below_pct {
            looser.push(format!("a threshold under the platform's {}%", platform.below_pct));
        }
        if self.idle_for_s > platform.idle_for_s {
            looser.push(format!("an idle time over the platform's {}", duration_text(platform.idle_for_s)));
        }
        if self.grace_s > platform.grace_s {
            looser.push(format!("a grace over the platform's {}", duration_text(platform.grace_s)));
        }
        if let Some(limit) = platform.max_keeps
            && self.max_keeps.is_none_or(|k| k > limit)
        {
            looser.push(format!("more keeps than the platform's {limit}"));
        }
        if looser.is_empty() {
            Ok(())
        } else {
            Err(Refusal::InvalidIdlePolicy(format!(
                "a tenant's idle policy may only be stricter than the platform's; this one has {}",
                looser.join(", ")
            )))
        }
    }

    /// The policy that applies when both the platform and a tenant set one: the stricter
    /// of each part (a platform policy loosened after the tenant set theirs is still held).
    pub fn strictest(platform: Option<IdlePolicy>, tenant: Option<IdlePolicy>) -> Option<IdlePolicy> {
        match (platform, tenant) {
            (Some(p), Some(t)) => Some(IdlePolicy {
                below_pct: p.below_pct.max(t.below_pct),
                idle_for_s: p.idle_for_s.min(t.idle_for_s),
                grace_s: p.grace_s.min(t.grace_s),
                max_keeps: match (p.max_keeps, t.max_keeps) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                },
            }),
            (p, t) => p.or(t),
        }
    }

    /// The policy in a sentence, for the environment page and the policy page.
    pub fn describe(&self) -> String {
        let keeps = match self.max_keeps {
            None => "as often as its owner chooses \"keep it\"".to_owned(),
            Some(0) => "with no way to keep it".to_owned(),
            Some(1) => "unless its owner keeps it (once per booking)".to_owned(),
            Some(n) => format!("unless its owner keeps it (up to {n} times per booking)"),
        };
        format!(
            "GPUs under {}% for {} with no traffic: warned, then stopped {} later, {keeps}",
            self.below_pct,
            duration_text(self.idle_for_s),
            duration_text(self.grace_s)
        )
    }
}

/// `90s`, `15m`, `1h`, `1h30m`, `2h 15m`; a bare number is minutes. `None` when it is none
/// of those.
pub fn parse_duration(text: &str) -> Option<i64> {
    let text = text.trim().to_ascii_lowercase();
    if text.is_empty() {
        return None;
    }
    if let Ok(minutes) = text.parse::<i64>() {
        return minutes.checked_mul(60).filter(|s| *s >= 0);
    }
    let mut total: i64 = 0;
    let mut number = String::new();
    let mut units_seen = 0;
    for c in text.chars() {
        match c {
            '0'..='9' => number.push(c),
            's' | 'm' | 'h' | 'd' => {
                let n: i64 = number.parse().ok()?;
                let unit = match c {
                    's' => 1,
                    'm' => 60,
                    'h' => 3600,
                    _ => 86_400,
                };
                total = total.checked_add(n.checked_mul(unit)?)?;
                number.clear();
                units_seen += 1;
            }
            ' ' => {}
            _ => return None,
        }
    }
    (number.is_empty() && units_seen > 0).then_some(total)
}

/// A duration in words as a policy form would take it back: `1h 30m`, `20s`, `0s`.
pub fn duration_text(seconds: i64) -> String {
    let (h, m, s) = (seconds / 3600, seconds % 3600 / 60, seconds % 60);
    let parts: Vec<String> = [(h, "h"), (m, "m"), (s, "s")]
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect();
    if parts.is_empty() { "0s".to_owned() } else { parts.join(" ") }
}

/// What the watcher knows of one ready environment, all times in ms since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleFacts {
    /// When someone last did something with it: it became ready, its owner kept it, its
    /// proxy saw traffic, or one of its GPUs was at or over the threshold (the end of that
    /// sample's bucket). The latest of these.
    pub active_at: i64,
    /// Its first reading since `active_at`'s cause, if any: idleness counts only over time
    /// the readings cover.
    pub first_reading_at: Option<i64>,
    /// Its latest reading.
    pub last_reading_at: Option<i64>,
    /// When it is to be stopped, if its owner was warned and has not acted since.
    pub stop_at: Option<i64>,
}

/// What the watcher does with one environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleAction {
    Nothing,
    /// Warn the owner: it is stopped at `stop_at` unless kept. `idle_since` is when it went idle.
    Warn {
        idle_since: i64,
        stop_at: i64,
    },
    /// It was warned and is in use again: the warning no longer holds.
    Withdraw,
    Stop,
}

/// The rule: an environment is idle from the later of its last activity and its first
/// reading; after `idle_for` of that its owner is warned, and after the grace it is stopped.
/// Without a reading in the last [`STALE_AFTER_MS`] nothing new happens (missing telemetry
/// is not idleness), and a warning never turns into a stop on stale readings.
pub fn decide(policy: &IdlePolicy, facts: &IdleFacts, now: i64) -> IdleAction {
    let fresh = facts.last_reading_at.is_some_and(|at| now - at <= STALE_AFTER_MS);
    let idle_since = facts.first_reading_at.map(|first| first.max(facts.active_at));
    let idle_enough = idle_since.is_some_and(|since| now - since >= policy.idle_for_s * 1000);
    match (facts.stop_at, idle_enough, fresh) {
        (Some(_), false, _) => IdleAction::Withdraw,
        (Some(stop_at), true, true) if now >= stop_at => IdleAction::Stop,
        (None, true, true) => match idle_since {
            Some(idle_since) => IdleAction::Warn { idle_since, stop_at: now + policy.grace_s * 1000 },
            None => IdleAction::Nothing,
        },
        _ => IdleAction::Nothing,
    }
}

/// Whether an owner may keep an environment once more after `keeps_used` keeps.
pub fn may_keep(policy: &IdlePolicy, keeps_used: i64) -> Result<(), Refusal> {
    match policy.max_keeps {
        Some(limit) if keeps_used >= limit => Err(Refusal::KeepsUsedUp(format!(
            "the idle policy allows {} in one booking, and {} used",
            if limit == 1 { "one keep".to_owned() } else { format!("{limit} keeps") },
            if keeps_used == 1 { "it is".to_owned() } else { format!("{keeps_used} are") }
        ))),
        _ => Ok(()),
    }
}

/// The warning's words on the environment page and in the notification.
/// What the end of the grace does to an idle environment. A notebook (or a job, under a
/// policy) is stopped and its capacity released. An inference endpoint is never stopped
/// for idleness: it gives back its replicas beyond its minimum of one, and one at its
/// minimum has nothing to give back, so it is not warned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reclaim {
    Stop,
    /// From this many replicas to one.
    ScaleDown {
        replicas: u32,
    },
}

impl Reclaim {
    /// What idleness would take from an environment of `offering` running `replicas`.
    pub fn of(offering: Offering, replicas: u32) -> Option<Reclaim> {
        match offering {
            Offering::InferenceEndpoint if replicas > 1 => Some(Reclaim::ScaleDown { replicas }),
            Offering::InferenceEndpoint => None,
            _ => Some(Reclaim::Stop),
        }
    }

    /// "stopped", "scaled down to 1 replica": what the warning says will happen.
    pub fn outcome(self) -> &'static str {
        match self {
            Reclaim::Stop => "stopped",
            Reclaim::ScaleDown { .. } => "scaled down to 1 replica",
        }
    }
}

pub fn warning_text(name: &str, idle_since: i64, stop_at: i64, reclaim: Reclaim) -> String {
    format!(
        "{name}'s GPUs have been idle since {}. It will be {} at {} unless you keep it.",
        utc_short(idle_since),
        reclaim.outcome(),
        utc_short(stop_at)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;

    #[test]
    fn an_endpoint_is_scaled_down_never_stopped_and_left_alone_at_one_replica() {
        assert_eq!(Reclaim::of(Offering::Notebook, 1), Some(Reclaim::Stop));
        assert_eq!(Reclaim::of(Offering::TrainingJob, 1), Some(Reclaim::Stop));
        assert_eq!(Reclaim::of(Offering::InferenceEndpoint, 3), Some(Reclaim::ScaleDown { replicas: 3 }));
        assert_eq!(Reclaim::of(Offering::InferenceEndpoint, 1), None);
        let text = warning_text("llm", 0, 60_000, Reclaim::ScaleDown { replicas: 3 });
        assert!(
            text.ends_with("It will be scaled down to 1 replica at Thu 1 Jan 00:01 UTC unless you keep it."),
            "{text}"
        );
    }

    fn policy() -> IdlePolicy {
        IdlePolicy { below_pct: 5.0, idle_for_s: 3600, grace_s: 900, max_keeps: Some(2) }
    }

    fn facts(active_at: i64, first: i64, last: i64, stop_at: Option<i64>) -> IdleFacts {
        IdleFacts { active_at, first_reading_at: Some(first), last_reading_at: Some(last), stop_at }
    }

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(parse_duration("90s"), Some(90));
        assert_eq!(parse_duration("15m"), Some(900));
        assert_eq!(parse_duration("1h30m"), Some(5400));
        assert_eq!(parse_duration("2h 15m"), Some(8100));
        assert_eq!(parse_duration("60"), Some(3600));
        assert_eq!(parse_duration("0"), Some(0));
        for bad in ["", "m", "1x", "1h30", "-5", "1.5h"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
        assert_eq!(duration_text(5400), "1h 30m");
        assert_eq!(duration_text(20), "20s");
        assert_eq!(duration_text(0), "0s");
        assert_eq!(parse_duration(&duration_text(3725)), Some(3725));
    }

    #[test]
    fn a_policy_form_is_checked_and_explained() {
        let p = IdlePolicy::parse("5%", "60m", "15m", "2").unwrap();
        assert_eq!(p, policy());
        assert!(IdlePolicy::parse("0", "60m", "15m", "").unwrap_err().to_string().contains("percentage"));
        assert!(IdlePolicy::parse("5", "5s", "15m", "").unwrap_err().to_string().contains("idle time between"));
        assert!(IdlePolicy::parse("5", "25h", "15m", "").unwrap_err().to_string().contains("and 24h"));
        assert!(IdlePolicy::parse("5", "1h", "soon", "").unwrap_err().to_string().contains("grace"));
        assert!(IdlePolicy::parse("5", "1h", "0", "many").unwrap_err().to_string().contains("keeps"));
        assert_eq!(IdlePolicy::parse("5", "1h", "0", "").unwrap().max_keeps, None);
        assert!(policy().describe().contains("under 5% for 1h"));
    }

    #[test]
    fn a_tenant_may_only_be_stricter() {
        let stricter = IdlePolicy { below_pct: 10.0, idle_for_s: 1800, grace_s: 600, max_keeps: Some(1) };
        assert!(stricter.check_within(&policy()).is_ok());
        let looser = IdlePolicy { below_pct: 1.0, idle_for_s: 7200, grace_s: 600, max_keeps: None };
        let text = looser.check_within(&policy()).unwrap_err().to_string();
        assert!(text.contains("threshold under") && text.contains("idle time over") && text.contains("more keeps"));
        let both = IdlePolicy::strictest(Some(policy()), Some(looser)).unwrap();
        assert_eq!(both, IdlePolicy { below_pct: 5.0, idle_for_s: 3600, grace_s: 600, max_keeps: Some(2) });
        assert_eq!(IdlePolicy::strictest(None, Some(looser)), Some(looser));
        assert_eq!(IdlePolicy::strictest(None, None), None);
    }

    #[test]
    fn warned_after_the_idle_time_and_stopped_after_the_grace() {
        let p = policy();
        let t0 = 1_000 * MIN;
        // Idle for 59 minutes: nothing yet.
        assert_eq!(decide(&p, &facts(t0, t0, t0 + 59 * MIN, None), t0 + 59 * MIN), IdleAction::Nothing);
        // An hour: warned, stopped 15 minutes later.
        let now = t0 + 60 * MIN;
        assert_eq!(
            decide(&p, &facts(t0, t0, now, None), now),
            IdleAction::Warn { idle_since: t0, stop_at: now + 15 * MIN }
        );
        let stop_at = now + 15 * MIN;
        assert_eq!(decide(&p, &facts(t0, t0, now + 14 * MIN, Some(stop_at)), now + 14 * MIN), IdleAction::Nothing);
        assert_eq!(decide(&p, &facts(t0, t0, stop_at, Some(stop_at)), stop_at), IdleAction::Stop);
    }

    #[test]
    fn activity_or_a_keep_withdraws_the_warning() {
        let p = policy();
        let t0 = 1_000 * MIN;
        let stop_at = t0 + 75 * MIN;
        // Busy (or kept) at minute 70: the warning goes.
        assert_eq!(
            decide(&p, &facts(t0 + 70 * MIN, t0, t0 + 71 * MIN, Some(stop_at)), t0 + 71 * MIN),
            IdleAction::Withdraw
        );
    }

    #[test]
    fn missing_or_stale_readings_are_not_idleness() {
        let p = policy();
        let t0 = 1_000 * MIN;
        let none = IdleFacts { active_at: t0, first_reading_at: None, last_reading_at: None, stop_at: None };
        assert_eq!(decide(&p, &none, t0 + 600 * MIN), IdleAction::Nothing);
        // Readings began 10 minutes ago: idle counts from then, not from readiness.
        assert_eq!(decide(&p, &facts(t0, t0 + 590 * MIN, t0 + 600 * MIN, None), t0 + 600 * MIN), IdleAction::Nothing);
        // The last reading is 6 minutes old: no warning, and a warned one is not stopped.
        let now = t0 + 200 * MIN;
        assert_eq!(decide(&p, &facts(t0, t0, now - 6 * MIN, None), now), IdleAction::Nothing);
        assert_eq!(decide(&p, &facts(t0, t0, now - 6 * MIN, Some(now - MIN)), now), IdleAction::Nothing);
    }

    #[test]
    fn keeps_are_limited_by_the_policy() {
        assert!(may_keep(&policy(), 1).is_ok());
        assert!(
            may_keep(&policy(), 2).unwrap_err().to_string().contains("allows 2 keeps in one booking, and 2 are used")
        );
        assert!(may_keep(&IdlePolicy { max_keeps: None, ..policy() }, 99).is_ok());
    }
}
