//! Sign-in throttling: too many failed password sign-ins for one email, or from one
//! address, lock further attempts for a while. Unknown emails are counted like known ones,
//! so the lockout says nothing about which accounts exist.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::lock;

/// Failures allowed per email within the window before it locks.
pub const MAX_FAILURES_PER_EMAIL: u32 = 5;
/// Failures allowed per source address within the window (several people behind one NAT).
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
    fn keys(email: &str, source: Option<&str>) -> [(String, u32); 2] {
        [
            (format!("email:{}", email.trim().to_lowercase()), MAX_FAILURES_PER_EMAIL),
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

    /// A success clears the email's count (not the address's: one right password must not
    /// reset a guessing run against other accounts).
    pub fn succeeded(&self, email: &str) {
        lock(&self.records).remove(&format!("email:{}", email.trim().to_lowercase()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_email_locks_after_repeated_failures_and_unlocks_after_the_window() {
        let throttle = Throttle::default();
        for _ in 0..MAX_FAILURES_PER_EMAIL {
            assert!(throttle.allows("Ada@example.com", Some("10.0.0.1"), 0));
            throttle.failed("ada@example.com", Some("10.0.0.1"), 0);
        }
        assert!(!throttle.allows("ada@example.com", Some("10.0.0.2"), 1), "locked whatever the address");
        assert!(throttle.allows("bob@example.com", Some("10.0.0.2"), 1), "others are not");
        assert!(throttle.allows("ada@example.com", Some("10.0.0.2"), WINDOW_MS + 1));
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
        for _ in 0..MAX_FAILURES_PER_EMAIL - 1 {
            throttle.failed("ada@example.com", None, 0);
        }
        throttle.succeeded("ada@example.com");
        throttle.failed("ada@example.com", None, 0);
        assert!(throttle.allows("ada@example.com", None, 0));
    }
}
