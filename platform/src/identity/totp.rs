//! The second factor of local platform administrators: time-based one-time passwords
//! (RFC 6238: HMAC-SHA1, 30-second steps, 6 digits), as every authenticator app speaks.
//! A code is accepted one step either side (clock drift) and only once.

use data_encoding::BASE32_NOPAD;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha1::Sha1;

use crate::audit::{self, Event, Outcome};
use crate::people::{USER_COLUMNS, User, user_from_row};
use crate::{Error, Platform, RequestMeta, now_ms};
use berth_domain::Refusal;

const STEP_MS: i64 = 30_000;
const DIGITS: u32 = 6;

/// A fresh secret (160 bits, base32) for an authenticator app.
pub fn new_secret() -> String {
    let mut bytes = [0u8; 20];
    rand::rng().fill_bytes(&mut bytes);
    BASE32_NOPAD.encode(&bytes)
}

/// The `otpauth://` URI an authenticator app reads (usually as a QR code).
pub fn otpauth_uri(email: &str, secret: &str) -> String {
    let label: String = email
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    format!("otpauth://totp/Berth:{label}?secret={secret}&issuer=Berth&algorithm=SHA1&digits=6&period=30")
}

/// The code for time step `step`.
pub fn code_at(secret: &str, step: i64) -> Option<String> {
    let key = BASE32_NOPAD.decode(secret.as_bytes()).ok()?;
    let mut mac = Hmac::<Sha1>::new_from_slice(&key).ok()?;
    mac.update(&step.to_be_bytes());
    let digest = mac.finalize().into_bytes();
    let offset = usize::from(digest[19] & 0x0f);
    let binary =
        u32::from_be_bytes([digest[offset] & 0x7f, digest[offset + 1], digest[offset + 2], digest[offset + 3]]);
    Some(format!("{:06}", binary % 10u32.pow(DIGITS)))
}

/// The time step `code` is right for, within one step of `now`, if any.
pub fn matching_step(secret: &str, code: &str, now_ms: i64) -> Option<i64> {
    let code: String = code.chars().filter(|c| !c.is_whitespace()).collect();
    let now = now_ms / STEP_MS;
    [now, now - 1, now + 1].into_iter().find(|step| code_at(secret, *step).is_some_and(|c| c == code))
}

impl Platform {
    /// Whether a user must give a second factor after their password: platform admins with
    /// a local password always do.
    pub fn needs_second_factor(&self, user: &User) -> bool {
        user.is_admin()
    }

    /// Whether the user has an authenticator set up already.
    pub async fn has_totp(&self, user_id: i64) -> Result<bool, Error> {
        let secret: Option<String> =
            sqlx::query_scalar("SELECT totp_secret FROM users WHERE id = ?").bind(user_id).fetch_one(&self.db).await?;
        Ok(secret.is_some())
    }

    /// Finishes a sign-in whose password was right: checks the code against the stored
    /// secret, or, at the first sign-in, against `enrolling` (which is then stored). Each
    /// code works once. Both outcomes are audited and failures count towards the lockout.
    pub async fn complete_second_factor(
        &self,
        user_id: i64,
        code: &str,
        enrolling: Option<&str>,
        meta: &RequestMeta,
    ) -> Result<User, Error> {
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        let row = sqlx::query(&format!(
            "SELECT {USER_COLUMNS}, u.totp_secret, u.totp_last_step FROM users u WHERE u.id = ? AND u.status = 'active'"
        ))
        .bind(user_id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(Error::Unauthenticated)?;
        let user = user_from_row(&row)?;
        if !self.throttle.allows(&user.email, meta.source.as_deref(), now) {
            return Err(Refusal::TooManyAttempts { minutes: crate::identity::throttle::WINDOW_MS / 60_000 }.into());
        }
        let stored: Option<String> = sqlx::Row::try_get(&row, "totp_secret")?;
        let last_step: Option<i64> = sqlx::Row::try_get(&row, "totp_last_step")?;
        let secret = stored.as_deref().or(enrolling).ok_or(Error::Unauthenticated)?;
        let step = matching_step(secret, code, now).filter(|step| last_step.is_none_or(|last| *step > last));
        let Some(step) = step else {
            drop(tx);
            self.throttle.failed(&user.email, meta.source.as_deref(), now);
            let mut conn = self.db.acquire().await?;
            let event = Event {
                action: "session.sign_in",
                target: Some(&user.email),
                outcome: Outcome::Failure,
                detail: Some("wrong or reused one-time code"),
            };
            audit::record(&mut conn, &user.caller(meta.clone()).actor(), event).await?;
            return Err(Refusal::WrongCode.into());
        };
        sqlx::query("UPDATE users SET totp_secret = ?, totp_last_step = ? WHERE id = ?")
            .bind(secret)
            .bind(step)
            .bind(user_id)
            .execute(&mut *tx)
            .await?;
        let detail = if stored.is_some() { "password and one-time code" } else { "password; authenticator set up" };
        let event = Event {
            action: "session.sign_in",
            target: Some(&user.email),
            outcome: Outcome::Success,
            detail: Some(detail),
        };
        audit::record(&mut tx, &user.caller(meta.clone()).actor(), event).await?;
        tx.commit().await?;
        self.throttle.succeeded(&user.email, meta.source.as_deref());
        Ok(user)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 6238 appendix B, SHA-1 column (its 20-byte ASCII secret, 8 digits there; the
    /// last 6 digits are the 6-digit code).
    #[test]
    fn matches_the_rfc_test_vectors() {
        let secret = BASE32_NOPAD.encode(b"12345678901234567890");
        for (time, code) in
            [(59, "287082"), (1_111_111_109, "081804"), (1_234_567_890, "005924"), (2_000_000_000, "279037")]
        {
            assert_eq!(code_at(&secret, time / 30).as_deref(), Some(code), "t={time}");
        }
    }

    #[test]
    fn accepts_one_step_of_drift_and_nothing_more() {
        let secret = new_secret();
        let now = 1_700_000_000_000;
        let step = now / STEP_MS;
        for (offset, ok) in [(-2, false), (-1, true), (0, true), (1, true), (2, false)] {
            let code = code_at(&secret, step + offset).expect("code");
            assert_eq!(matching_step(&secret, &code, now).is_some(), ok, "offset {offset}");
        }
        assert_eq!(matching_step(&secret, "not a code", now), None);
    }
}
