//! Notifications: what Berth tells people, through which channels, and the rules of
//! delivering it (the retry schedule, webhook signatures and payloads, which window-end
//! warnings are due). Pure: the outbox, the SMTP client and the HTTP client are in
//! `platform::notifications`.

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::booking::utc_short;

/// What a notification is about. Each person chooses channels per kind; each tenant
/// webhook chooses the kinds it receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Kind {
    EnvironmentReady,
    EnvironmentFailed,
    /// 30 or 10 minutes before a booking's window ends.
    WindowEnding,
    /// A guaranteed booking took a spot booking's capacity.
    SpotReclaimed,
    /// Someone was added to a tenant.
    TenantInvitation,
    /// A maintenance window covers GPUs a person has booked.
    Maintenance,
    /// A node changed its lifecycle state (platform admins).
    NodeHealth,
    /// A node that runs one's environments became degraded (a failed check, a fatal XID).
    NodeDegraded,
    /// A budget crossed 50, 80 or 100%.
    BudgetMark,
    /// An environment's GPUs stayed idle: it will be stopped unless its owner keeps it.
    IdleWarning,
    /// An environment was stopped for idleness.
    IdleStopped,
    /// A month closed into the tenant's statement (tenant admins).
    StatementReady,
}

impl Kind {
    pub const ALL: [Kind; 12] = [
        Kind::EnvironmentReady,
        Kind::EnvironmentFailed,
        Kind::WindowEnding,
        Kind::SpotReclaimed,
        Kind::TenantInvitation,
        Kind::Maintenance,
        Kind::NodeHealth,
        Kind::NodeDegraded,
        Kind::BudgetMark,
        Kind::IdleWarning,
        Kind::IdleStopped,
        Kind::StatementReady,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::EnvironmentReady => "environment.ready",
            Kind::EnvironmentFailed => "environment.failed",
            Kind::WindowEnding => "environment.window_ending",
            Kind::SpotReclaimed => "environment.reclaimed",
            Kind::TenantInvitation => "tenant.invitation",
            Kind::Maintenance => "fleet.maintenance",
            Kind::NodeHealth => "fleet.node_health",
            Kind::NodeDegraded => "environment.node_degraded",
            Kind::BudgetMark => "usage.budget_mark",
            Kind::IdleWarning => "environment.idle_warning",
            Kind::IdleStopped => "environment.idle_stopped",
            Kind::StatementReady => "usage.statement_ready",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// How the account page and the webhook form name it.
    pub fn label(self) -> &'static str {
        match self {
            Kind::EnvironmentReady => "Environment ready",
            Kind::EnvironmentFailed => "Environment failed",
            Kind::WindowEnding => "Booking ends soon (30 and 10 minutes before)",
            Kind::SpotReclaimed => "Spot booking reclaimed",
            Kind::TenantInvitation => "Added to a tenant",
            Kind::Maintenance => "Maintenance affecting my bookings",
            Kind::NodeHealth => "Node health changes (platform admins)",
            Kind::NodeDegraded => "A node running my environments became unhealthy",
            Kind::BudgetMark => "Budget reached 50, 80 or 100%",
            Kind::IdleWarning => "Environment idle: it will be stopped unless kept",
            Kind::IdleStopped => "Environment stopped (or an endpoint scaled down) for idleness",
            Kind::StatementReady => "Monthly statement ready (tenant admins)",
        }
    }

    /// Parses a comma-separated list of kinds (a webhook's form field); unknown names are
    /// a refusal that names them.
    pub fn parse_list(s: &str) -> Result<Vec<Kind>, String> {
        let mut kinds = Vec::new();
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let kind = Kind::parse(name).ok_or_else(|| format!("unknown notification kind {name:?}"))?;
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        Ok(kinds)
    }
}

/// Where a notification goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Channel {
    /// The bell and `/notifications`.
    InApp,
    Email,
    /// A tenant's webhook (chosen by the tenant's admins, not by each person).
    Webhook,
}

impl Channel {
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::InApp => "in_app",
            Channel::Email => "email",
            Channel::Webhook => "webhook",
        }
    }

    pub fn parse(s: &str) -> Option<Channel> {
        [Channel::InApp, Channel::Email, Channel::Webhook].into_iter().find(|c| c.as_str() == s)
    }
}

/// One notification's content: the same for every channel. `link` is a path on the
/// portal (`/environments/<id>`); mail and webhooks make it absolute with the portal's
/// public URL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    pub kind: Kind,
    pub title: String,
    pub body: String,
    pub link: String,
}

/// The minutes before a window's end at which its owner is warned, latest first.
pub const WINDOW_MARKS: [u32; 2] = [30, 10];

const MINUTE_MS: i64 = 60_000;

/// The window-end warnings due now for a booking ending at `ends_at`, given the marks
/// already recorded (`sent`). Answers the marks to record (every due one, so a later tick
/// never sends an older warning after a newer one) and the one to send: the nearest to
/// the end. Nothing once the window is over.
pub fn due_window_marks(ends_at: i64, now: i64, sent: &[u32]) -> Option<(u32, Vec<u32>)> {
    if now >= ends_at {
        return None;
    }
    let due: Vec<u32> =
        WINDOW_MARKS.into_iter().filter(|m| now >= ends_at - i64::from(*m) * MINUTE_MS && !sent.contains(m)).collect();
    let nearest = due.iter().copied().min()?;
    // A mark later than one already sent is not news.
    if sent.iter().any(|s| *s < nearest) {
        return None;
    }
    Some((nearest, due))
}

/// How many times an email or a webhook delivery is tried before it is given up.
pub const MAX_ATTEMPTS: u32 = 8;

/// How long to wait after the `attempts`-th failed try (1-based): 30 s doubling, at most
/// an hour; `None` after the last try. Eight tries span about an hour and a half.
pub fn retry_after_ms(attempts: u32) -> Option<i64> {
    if attempts == 0 || attempts >= MAX_ATTEMPTS {
        return None;
    }
    let doubled = 30_000i64.saturating_mul(1i64 << (attempts - 1).min(20));
    Some(doubled.min(3_600_000))
}

/// The header carrying a webhook's signature: `t=<unix seconds>,v1=<hex HMAC-SHA256>`
/// (as Stripe signs), the HMAC over `<unix seconds>.<body>` with the webhook's secret.
pub const SIGNATURE_HEADER: &str = "Berth-Signature";
/// The header naming a delivery: a receiver that sees it twice has the same message twice.
pub const DELIVERY_HEADER: &str = "Berth-Delivery";

/// The value of [`SIGNATURE_HEADER`] for `body` sent at `timestamp` (unix seconds).
pub fn sign(secret: &str, timestamp: i64, body: &str) -> String {
    format!("t={timestamp},v1={}", hmac_hex(secret, timestamp, body))
}

fn hmac_hex(secret: &str, timestamp: i64, body: &str) -> String {
    // HMAC takes a key of any length, so this cannot fail.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret.as_bytes()) {
        Ok(mac) => mac,
        Err(_) => return String::new(),
    };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body.as_bytes());
    data_encoding::HEXLOWER.encode(&mac.finalize().into_bytes())
}

/// Why a signature header is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadSignature {
    Malformed,
    /// Older (or newer) than the tolerance: perhaps replayed.
    Stale,
    Mismatch,
}

/// What a receiver does with [`SIGNATURE_HEADER`]: checks the HMAC (in constant time) and
/// that the timestamp is within `tolerance_s` of `now_s`.
pub fn verify(secret: &str, header: &str, body: &str, now_s: i64, tolerance_s: i64) -> Result<(), BadSignature> {
    let mut timestamp = None;
    let mut signature = None;
    for part in header.split(',') {
        match part.split_once('=') {
            Some(("t", t)) => timestamp = t.parse::<i64>().ok(),
            Some(("v1", v)) => signature = Some(v),
            _ => {}
        }
    }
    let (Some(timestamp), Some(signature)) = (timestamp, signature) else { return Err(BadSignature::Malformed) };
    if (now_s - timestamp).abs() > tolerance_s {
        return Err(BadSignature::Stale);
    }
    let given = data_encoding::HEXLOWER.decode(signature.as_bytes()).map_err(|_| BadSignature::Malformed)?;
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).map_err(|_| BadSignature::Malformed)?;
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body.as_bytes());
    mac.verify_slice(&given).map_err(|_| BadSignature::Mismatch)
}

/// A webhook's payload format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WebhookFormat {
    /// `{"text": "..."}`, which Slack's (and Mattermost's, Teams' workflow) incoming
    /// webhooks accept.
    Slack,
    /// `{"id", "kind", "title", "body", "link", "at"}`.
    Json,
}

impl WebhookFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            WebhookFormat::Slack => "slack",
            WebhookFormat::Json => "json",
        }
    }

    pub fn parse(s: &str) -> Option<WebhookFormat> {
        match s {
            "slack" => Some(WebhookFormat::Slack),
            "json" => Some(WebhookFormat::Json),
            _ => None,
        }
    }
}

/// `link` made absolute on the portal reached at `public_url` (no trailing slash).
pub fn absolute_link(public_url: &str, link: &str) -> String {
    if link.starts_with("http://") || link.starts_with("https://") {
        link.to_owned()
    } else {
        format!("{}{link}", public_url.trim_end_matches('/'))
    }
}

/// The body a webhook receives for delivery `id` of `notice`, created at `at` (unix ms).
pub fn webhook_payload(format: WebhookFormat, id: i64, notice: &Notice, at: i64, public_url: &str) -> String {
    let link = absolute_link(public_url, &notice.link);
    let value = match format {
        // Slack's link syntax: <url|text>.
        WebhookFormat::Slack => serde_json::json!({
            "text": format!("*{}*\n{}\n<{link}|Open in Berth>", notice.title, notice.body),
        }),
        WebhookFormat::Json => serde_json::json!({
            "id": id,
            "kind": notice.kind.as_str(),
            "title": notice.title,
            "body": notice.body,
            "link": link,
            "at": at,
        }),
    };
    value.to_string()
}

/// An email's subject and plain-text body.
pub fn email(notice: &Notice, public_url: &str) -> (String, String) {
    let link = absolute_link(public_url, &notice.link);
    let subject = format!("[Berth] {}", notice.title);
    let body = format!(
        "{}\n\n{}\n\n{link}\n\n-- \nBerth. Choose which notifications you receive by email on your account page: {}/account\n",
        notice.title,
        notice.body,
        public_url.trim_end_matches('/')
    );
    (subject, body)
}

/// Texts of each event, in one place.
impl Notice {
    pub fn environment_ready(id: &str, name: &str) -> Notice {
        Notice {
            kind: Kind::EnvironmentReady,
            title: format!("{name} is ready"),
            body: format!("Your environment {name} is ready to use."),
            link: format!("/environments/{id}"),
        }
    }

    pub fn environment_failed(id: &str, name: &str, reason: Option<&str>) -> Notice {
        let why = reason.map_or(String::new(), |r| format!(": {r}"));
        Notice {
            kind: Kind::EnvironmentFailed,
            title: format!("{name} failed"),
            body: format!("Your environment {name} failed{why}. Its capacity is released."),
            link: format!("/environments/{id}"),
        }
    }

    /// `minutes` before the end: the link opens the environment page at its change-end
    /// form.
    pub fn window_ending(id: &str, name: &str, minutes: u32, ends_at: i64) -> Notice {
        Notice {
            kind: Kind::WindowEnding,
            title: format!("{name} ends in {minutes} minutes"),
            body: format!(
                "The booking of {name} ends at {}. Save your work, or change its end if the calendar allows.",
                utc_short(ends_at)
            ),
            link: format!("/environments/{id}#change-end"),
        }
    }

    pub fn idle_warning(id: &str, name: &str, idle_since: i64, stop_at: i64, reclaim: crate::idle::Reclaim) -> Notice {
        Notice {
            kind: Kind::IdleWarning,
            title: format!("{name} is idle and will be {}", reclaim.outcome()),
            body: crate::idle::warning_text(name, idle_since, stop_at, reclaim),
            link: format!("/environments/{id}#idle"),
        }
    }

    pub fn idle_stopped(id: &str, name: &str, policy: &str) -> Notice {
        Notice {
            kind: Kind::IdleStopped,
            title: format!("{name} was stopped for idleness"),
            body: format!("{name} was stopped and its GPUs released: {policy}. Your volumes keep your files."),
            link: format!("/environments/{id}"),
        }
    }

    /// An idle endpoint gave back its replicas beyond one (of the idle-stop kind: the
    /// same choice of channels).
    pub fn idle_scaled_down(id: &str, name: &str, replicas: u32, policy: &str) -> Notice {
        Notice {
            kind: Kind::IdleStopped,
            title: format!("{name} was scaled down for idleness"),
            body: format!("{name} went from {replicas} replicas to 1 and released the others' GPUs: {policy}."),
            link: format!("/environments/{id}"),
        }
    }

    pub fn spot_reclaimed(id: &str, name: &str, ends_at: i64) -> Notice {
        Notice {
            kind: Kind::SpotReclaimed,
            title: format!("{name} was reclaimed"),
            body: format!("A guaranteed booking needs the spot capacity of {name}: it ends at {}.", utc_short(ends_at)),
            link: format!("/environments/{id}"),
        }
    }

    pub fn tenant_invitation(tenant_id: i64, tenant: &str, role: &str) -> Notice {
        Notice {
            kind: Kind::TenantInvitation,
            title: format!("You were added to {tenant}"),
            body: format!("You are now {role} in the tenant {tenant} on Berth."),
            link: format!("/tenants/{tenant_id}"),
        }
    }

    pub fn maintenance(node: &str, starts_at: i64, ends_at: i64, environments: &[String]) -> Notice {
        Notice {
            kind: Kind::Maintenance,
            title: format!("Maintenance on {node} affects your bookings"),
            body: format!(
                "{node} is in maintenance from {} to {}; it holds your bookings {}.",
                utc_short(starts_at),
                utc_short(ends_at),
                environments.join(", ")
            ),
            link: "/environments".to_owned(),
        }
    }

    pub fn node_health(node: &str, from: &str, to: &str, reason: &str) -> Notice {
        Notice {
            kind: Kind::NodeHealth,
            title: format!("Node {node} is {to}"),
            body: format!("Node {node} went from {from} to {to}: {reason}"),
            link: format!("/admin/nodes/{node}"),
        }
    }

    /// To the owner of `environments` (id, name) on `node`, which just became degraded.
    pub fn node_degraded(node: &str, reason: &str, environments: &[(String, String)]) -> Notice {
        let names: Vec<&str> = environments.iter().map(|(_, name)| name.as_str()).collect();
        Notice {
            kind: Kind::NodeDegraded,
            title: format!("{} runs on a node that became unhealthy", names.join(", ")),
            body: format!(
                "Node {node}, which runs {}, is degraded: {reason}. What runs there keeps running, but may fail; \
                 save your work. The node takes no new bookings until it is repaired.",
                names.join(", ")
            ),
            link: match environments {
                [(id, _)] => format!("/environments/{id}"),
                _ => "/environments".to_owned(),
            },
        }
    }

    /// To a dedicated cluster's owner: `failed` left it; `replacement` took its place, or
    /// `instead` says why none did and when one may.
    pub fn cluster_node_lost(
        id: &str,
        name: &str,
        failed: &str,
        reason: &str,
        replacement: Option<&str>,
        instead: &str,
    ) -> Notice {
        let (title, then) = match replacement {
            Some(node) => (
                format!("{name}: {node} replaces {failed}"),
                format!("{node} replaces it for the rest of the booking, with the cluster's network and accounts."),
            ),
            None => (
                format!("{name} lost {failed}"),
                format!("No node replaces it yet: {instead}. The cluster keeps running on its other nodes."),
            ),
        };
        Notice {
            kind: Kind::NodeDegraded,
            title,
            body: format!("Node {failed} of dedicated cluster {name} failed: {reason}. {then}"),
            link: format!("/environments/{id}"),
        }
    }

    pub fn budget_mark(whose: &str, percent: u32, month: &str) -> Notice {
        Notice {
            kind: Kind::BudgetMark,
            title: format!("{whose} reached {percent}% of its budget"),
            body: format!("The bookings of {whose} for {month} reached {percent}% of its monthly budget."),
            link: "/usage".to_owned(),
        }
    }

    /// A tenant's month closed into statement `id`.
    pub fn statement_ready(tenant: &str, month: &str, total: &str, id: i64) -> Notice {
        Notice {
            kind: Kind::StatementReady,
            title: format!("{tenant}'s statement for {month} is ready"),
            body: format!("{month} is closed: {tenant}'s statement totals {total}. It will not change."),
            link: format!("/usage/statements/{id}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;

    #[test]
    fn kinds_round_trip_and_lists_parse() {
        for kind in Kind::ALL {
            assert_eq!(Kind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(
            Kind::parse_list("environment.ready, environment.failed,environment.ready"),
            Ok(vec![Kind::EnvironmentReady, Kind::EnvironmentFailed])
        );
        assert!(Kind::parse_list("environment.ready,nope").unwrap_err().contains("nope"));
    }

    #[test]
    fn window_marks_are_due_once_each_and_never_out_of_order() {
        let end = 1_000 * MIN;
        assert_eq!(due_window_marks(end, end - 31 * MIN, &[]), None);
        assert_eq!(due_window_marks(end, end - 30 * MIN, &[]), Some((30, vec![30])));
        assert_eq!(due_window_marks(end, end - 20 * MIN, &[30]), None);
        assert_eq!(due_window_marks(end, end - 10 * MIN, &[30]), Some((10, vec![10])));
        assert_eq!(due_window_marks(end, end - 5 * MIN, &[30, 10]), None);
        // A booking first seen 12 minutes before its end gets the 30-minute warning once,
        // and the 10-minute one later.
        assert_eq!(due_window_marks(end, end - 12 * MIN, &[]), Some((30, vec![30])));
        // Seen only 5 minutes before its end: one warning (10), both marks recorded.
        assert_eq!(due_window_marks(end, end - 5 * MIN, &[]), Some((10, vec![30, 10])));
        assert_eq!(due_window_marks(end, end, &[]), None);
    }

    #[test]
    fn retries_back_off_then_give_up() {
        assert_eq!(retry_after_ms(1), Some(30_000));
        assert_eq!(retry_after_ms(2), Some(60_000));
        assert_eq!(retry_after_ms(3), Some(120_000));
        assert_eq!(retry_after_ms(7), Some(1_920_000));
        assert_eq!(retry_after_ms(MAX_ATTEMPTS), None);
        let mut previous = 0;
        for attempt in 1..MAX_ATTEMPTS {
            let wait = retry_after_ms(attempt).unwrap();
            assert!(wait >= previous && wait <= 3_600_000);
            previous = wait;
        }
    }

    #[test]
    fn signatures_verify_and_refuse_tampering_and_replays() {
        let header = sign("s3cret", 1_700_000_000, r#"{"text":"hi"}"#);
        assert!(header.starts_with("t=1700000000,v1="));
        assert_eq!(verify("s3cret", &header, r#"{"text":"hi"}"#, 1_700_000_100, 300), Ok(()));
        assert_eq!(verify("s3cret", &header, r#"{"text":"ho"}"#, 1_700_000_100, 300), Err(BadSignature::Mismatch));
        assert_eq!(verify("other", &header, r#"{"text":"hi"}"#, 1_700_000_100, 300), Err(BadSignature::Mismatch));
        assert_eq!(verify("s3cret", &header, r#"{"text":"hi"}"#, 1_700_001_000, 300), Err(BadSignature::Stale));
        assert_eq!(verify("s3cret", "v1=00", "", 0, 300), Err(BadSignature::Malformed));
    }

    #[test]
    fn signature_matches_an_independent_hmac() {
        // python3 -c 'import hmac,hashlib;print(hmac.new(b"key",b"1.x",hashlib.sha256).hexdigest())'
        assert_eq!(sign("key", 1, "x"), "t=1,v1=fc4913c41a7bf793267e2a384f3261c9436ec2cd097bd745e7b0d99113f510ec");
    }

    #[test]
    fn payloads_and_mail_carry_absolute_links() {
        let notice = Notice::window_ending("e1", "nb", 30, 0);
        assert_eq!(notice.link, "/environments/e1#change-end");
        let slack = webhook_payload(WebhookFormat::Slack, 7, &notice, 0, "https://berth.example/");
        let slack: serde_json::Value = serde_json::from_str(&slack).unwrap();
        assert!(slack["text"].as_str().unwrap().contains("<https://berth.example/environments/e1#change-end|"));
        let json = webhook_payload(WebhookFormat::Json, 7, &notice, 5, "https://berth.example");
        let json: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(json["kind"], "environment.window_ending");
        assert_eq!(json["id"], 7);
        assert_eq!(json["link"], "https://berth.example/environments/e1#change-end");
        let (subject, body) = email(&notice, "https://berth.example");
        assert_eq!(subject, "[Berth] nb ends in 30 minutes");
        assert!(body.contains("https://berth.example/environments/e1#change-end"));
    }
}
