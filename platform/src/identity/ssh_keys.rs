//! The SSH public keys people keep on their account: added on `/account`, checked by
//! `domain::ssh_key`, and written by the bare-metal agents into the local account of every
//! dedicated cluster the person may act in (see `node_plans`). Adding or removing a key
//! reaches those nodes at their agents' next pass; both are audited.

use berth_domain::Refusal;
use berth_domain::policy::{Action, Target};
use berth_domain::ssh_key::{MAX_KEYS_PER_USER, SshPublicKey, checked_name};

use crate::audit::{self, Event, Outcome};
use crate::{Caller, Error, Platform, now_ms};

/// A key as the account page shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshKeyInfo {
    pub id: i64,
    pub name: String,
    /// `ssh-ed25519`, `ssh-rsa`, ...
    pub algorithm: String,
    pub bits: i64,
    pub fingerprint: String,
    pub created_at: i64,
}

impl Platform {
    /// The caller's own SSH keys, oldest first.
    pub async fn my_ssh_keys(&self, caller: &Caller) -> Result<Vec<SshKeyInfo>, Error> {
        let own = Target::Owned { tenant_id: caller.tenant_id(), owner_id: caller.user_id() };
        self.authorize(caller, Action::SshKeyRead, own).await?;
        let rows: Vec<(i64, String, String, i64, String, i64)> = sqlx::query_as(
            "SELECT id, name, algorithm, bits, fingerprint, created_at FROM ssh_keys WHERE user_id = ? AND removed_at IS NULL ORDER BY id",
        )
        .bind(caller.user_id())
        .fetch_all(&self.db)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(id, name, algorithm, bits, fingerprint, created_at)| SshKeyInfo {
                id,
                name,
                algorithm,
                bits,
                fingerprint,
                created_at,
            })
            .collect())
    }

    /// Adds `text` (an OpenSSH public key line) to the caller's keys, named `name` or, when
    /// that is empty, by the key's comment. A key opens a shell on nodes, so only a
    /// signed-in person adds one, never an API token.
    pub async fn add_ssh_key(&self, caller: &Caller, name: &str, text: &str) -> Result<SshKeyInfo, Error> {
        let own = Target::Owned { tenant_id: caller.tenant_id(), owner_id: caller.user_id() };
        if caller.principal.token_actions.is_some() {
            let mut conn = self.db.acquire().await?;
            let event =
                Event { action: "ssh_key.add", target: None, outcome: Outcome::Denied, detail: Some("by a token") };
            audit::record(&mut conn, &caller.actor(), event).await?;
            return Err(Error::Forbidden);
        }
        self.authorize(caller, Action::SshKeyManage, own).await?;
        let key = SshPublicKey::parse(text)?;
        let name = match checked_name(name)? {
            given if !given.is_empty() => given,
            _ if !key.comment.is_empty() => key.comment.clone(),
            _ => format!("{} key", key.algorithm.label()),
        };
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        let existing: Vec<(String, String)> =
            sqlx::query_as("SELECT name, public_key FROM ssh_keys WHERE user_id = ? AND removed_at IS NULL")
                .bind(caller.user_id())
                .fetch_all(&mut *tx)
                .await?;
        if let Some((same, _)) = existing.iter().find(|(_, k)| *k == key.key_text()) {
            return Err(Refusal::SshKeyInUse(same.clone()).into());
        }
        if existing.len() >= MAX_KEYS_PER_USER {
            return Err(Refusal::TooManySshKeys { max: MAX_KEYS_PER_USER }.into());
        }
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO ssh_keys (user_id, name, algorithm, public_key, bits, fingerprint, created_at)
             VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
        )
        .bind(caller.user_id())
        .bind(&name)
        .bind(key.algorithm.as_str())
        .bind(key.key_text())
        .bind(i64::from(key.bits))
        .bind(&key.fingerprint)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        let detail = format!("{} {} ({} bits)", key.algorithm.as_str(), key.fingerprint, key.bits);
        let event =
            Event { action: "ssh_key.add", target: Some(&name), outcome: Outcome::Success, detail: Some(&detail) };
        audit::record(&mut tx, &caller.actor(), event).await?;
        crate::provisioning::node_plans::refresh_access_plans(&mut tx, now).await?;
        tx.commit().await?;
        Ok(SshKeyInfo {
            id,
            name,
            algorithm: key.algorithm.as_str().to_owned(),
            bits: i64::from(key.bits),
            fingerprint: key.fingerprint,
            created_at: now,
        })
    }

    /// Removes one of the caller's keys (a tenant admin may remove their members'); the
    /// nodes drop it at their agents' next pass. Removing a removed key changes nothing.
    pub async fn remove_ssh_key(&self, caller: &Caller, id: i64) -> Result<(), Error> {
        let row: Option<(i64, Option<i64>, String, String)> = sqlx::query_as(
            "SELECT k.user_id, u.tenant_id, k.name, k.fingerprint FROM ssh_keys k JOIN users u ON u.id = k.user_id
             WHERE k.id = ?",
        )
        .bind(id)
        .fetch_optional(&self.db)
        .await?;
        let (owner_id, tenant_id, name, fingerprint) = row.ok_or(Error::NotFound)?;
        self.authorize(caller, Action::SshKeyManage, Target::Owned { tenant_id, owner_id }).await?;
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        let removed = sqlx::query("UPDATE ssh_keys SET removed_at = ? WHERE id = ? AND removed_at IS NULL")
            .bind(now)
            .bind(id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if removed == 0 {
            return Ok(());
        }
        let event = Event {
            action: "ssh_key.remove",
            target: Some(&name),
            outcome: Outcome::Success,
            detail: Some(&fingerprint),
        };
        audit::record(&mut tx, &crate::audit::Actor { tenant_id, ..caller.actor() }, event).await?;
        crate::provisioning::node_plans::refresh_access_plans(&mut tx, now).await?;
        tx.commit().await?;
        Ok(())
    }
}
