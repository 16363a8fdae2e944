//! Sign-in throttling: too many failed sign-ins for one account from one address, or from
//! one address at all, lock further attempts from that address for a while. Unknown emails
//! are counted like known ones, so the lockout says nothing about which accounts exist.
//!
//! Never by account alone: then anyone could lock the break-glass administrator out by
//! failing five times from anywhere. Spreading guesses over many addresses gets a password
//! at most, and local administrators have a second factor besides. Locks live in memory:
//! they end with the window, or when Berth restarts.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::lock;

/// Failures allowed per account from one source address within the window.
pub const MAX_FAILURES_PER_ACCOUNT: u32 = 5;
/// Failures allowed per source address within the window, whichever accounts (several
/// people behind one NAT).
pub const MAX_FAILURES_PER_SOURCE: u32 = 20;
/// The window failures are counted in, and how long a lock lasts.
pub const WINDOW_MS: i64 = 15 * 60 * 1000;

#[derive(Debug, Clone, Copy, Default)]
struct Record {
    failures: u32,
    since: i64,
}

#[derive(Debug, Default)]
pub struct Throttle {
    records: Mutex<HashMap<String, Record>>,
}

impl Throttle {
    fn account_key(email: &str, source: Option<&str>) -> String {
        format!("account:{}|from:{}", email.trim().to_lowercase(), source.unwrap_or("-"))
    }

    fn keys(email: &str, source: Option<&str>) -> [(String, u32); 2] {
        [
            (Throttle::account_key(email, source), MAX_FAILURES_PER_ACCOUNT),
            (format!("source:{}", source.unwrap_or("-")), MAX_FAILURES_PER_SOURCE),
        ]
    }

    /// Whether a sign-in for `email` from `source` may be tried now.
    pub fn allows(&self, email: &str, source: Option<&str>, now: i64) -> bool {
        let records = lock(&self.records);
        Throttle::keys(email, source)
            .iter()
            .all(|(key, max)| records.get(key).is_none_or(|r| now - r.since > WINDOW_MS || r.failures < *max))
    }

    pub fn failed(&self, email: &str, source: Option<&str>, now: i64) {
        let mut records = lock(&self.records);
        // Old entries go, so the map stays as small as the recent failures.
        records.retain(|_, r| now - r.since <= WINDOW_MS);
        for (key, _) in Throttle::keys(email, source) {
            let record = records.entry(key).or_insert(Record { failures: 0, since: now });
            record.failures += 1;
        }
    }

    /// A success clears the account's count from that address (not the address's: one
    /// right password must not reset a guessing run against other accounts).
    pub fn succeeded(&self, email: &str, source: Option<&str>) {
        lock(&self.records).remove(&Throttle::account_key(email, source));
    }
}

/// A budget of anonymous requests per source address: for requests that cost Berth work
/// before anyone is known (a single sign-on start may fetch the provider's discovery
/// document and keeps a pending login).
#[derive(Debug)]
pub struct Rate {
    max: u32,
    window_ms: i64,
    records: Mutex<HashMap<String, Record>>,
}

impl Rate {
    pub fn new(max: u32, window_ms: i64) -> Rate {
        Rate { max, window_ms, records: Mutex::default() }
    }

    /// Counts one request from `source`; false when its budget for this window is spent.
    pub fn take(&self, source: Option<&str>, now: i64) -> bool {
        let mut records = lock(&self.records);
        records.retain(|_, r| now - r.since <= self.window_ms);
        let record = records.entry(source.unwrap_or("-").to_owned()).or_insert(Record { failures: 0, since: now });
        record.failures += 1;
        record.failures <= self.max
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_rate_allows_its_budget_per_address_per_window() {
        let rate = Rate::new(3, 60_000);
        for _ in 0..3 {
            assert!(rate.take(Some("10.0.0.1"), 0));
        }
        assert!(!rate.take(Some("10.0.0.1"), 1));
        assert!(rate.take(Some("10.0.0.2"), 1), "another address has its own");
        assert!(rate.take(Some("10.0.0.1"), 60_001), "a new window");
    }

    use super::*;

    #[test]
    fn an_account_locks_from_one_address_only_and_unlocks_after_the_window() {
        let throttle = Throttle::default();
        for _ in 0..MAX_FAILURES_PER_ACCOUNT {
            assert!(throttle.allows("Ada@example.com", Some("10.0.0.1"), 0));
            throttle.failed("ada@example.com", Some("10.0.0.1"), 0);
        }
        assert!(!throttle.allows("ada@example.com", Some("10.0.0.1"), 1), "locked from the failing address");
        assert!(throttle.allows("ada@example.com", Some("10.0.0.2"), 1), "the owner elsewhere is not locked out");
        assert!(throttle.allows("bob@example.com", Some("10.0.0.1"), 1), "others are not");
        assert!(throttle.allows("ada@example.com", Some("10.0.0.1"), WINDOW_MS + 1));
    }

    #[test]
    fn an_address_locks_after_failures_across_many_emails() {
        let throttle = Throttle::default();
        for i in 0..MAX_FAILURES_PER_SOURCE {
            throttle.failed(&format!("user{i}@example.com"), Some("10.0.0.9"), 0);
        }
        assert!(!throttle.allows("fresh@example.com", Some("10.0.0.9"), 1));
        assert!(throttle.allows("fresh@example.com", Some("10.0.0.8"), 1));
    }

    #[test]
    fn success_clears_the_email() {
        let throttle = Throttle::default();
        for _ in 0..MAX_FAILURES_PER_ACCOUNT - 1 {
            throttle.failed("ada@example.com", None, 0);
        }
        throttle.succeeded("ada@example.com", None);
        throttle.failed("ada@example.com", None, 0);
        assert!(throttle.allows("ada@example.com", None, 0));
    }
}
