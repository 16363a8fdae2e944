//! Demo data for `make run`: two tenants, and a member of the first whose environments
//! already occupy part of the fleet, so the catalog and placement have something to show on
//! a first visit.

use berth_domain::booking::HOUR_MS;
use berth_domain::launch::LaunchRequest;

use berth_domain::policy::{Principal, Role};
use berth_domain::tenancy::Isolation;

use crate::{Caller, Error, Platform, RequestMeta};

pub const DEMO_EMAIL: &str = "dana.demo@berth.local";

/// Where `make idp` runs the local OpenID provider the end-to-end tests use.
pub const DEMO_ISSUER: &str = "http://127.0.0.1:9400";

impl Platform {
    /// Seeds the demo once; does nothing when the demo user already exists.
    pub async fn seed_demo(&self) -> Result<(), Error> {
        let exists: i64 = sqlx::query_scalar("SELECT count(*) FROM users WHERE email = ?")
            .bind(DEMO_EMAIL)
            .fetch_one(&self.db)
            .await?;
        if exists > 0 {
            return Ok(());
        }
        let meta = RequestMeta { request_id: "demo-seed".into(), source: None };
        let acme = self.ensure_tenant("acme", "Acme Research", Isolation::Soft).await?;
        let globex = self.ensure_tenant("globex", "Globex AI", Isolation::Hard).await?;
        // Globex runs its own images only from the registries it trusts.
        sqlx::query("UPDATE tenants SET custom_images = 'nvcr.io ghcr.io' WHERE id = ?")
            .bind(globex)
            .execute(&self.db)
            .await?;
        self.connect_demo_sso(acme).await?;
        // Notebooks left idle for an hour are warned, then stopped 15 minutes later
        // (training jobs are never stopped for idleness).
        sqlx::query(
            "INSERT INTO idle_policies (tenant_id, offering, below_pct, idle_for_s, grace_s, max_keeps, updated_at)
             VALUES (NULL, 'notebook', 5, 3600, 900, 2, ?)",
        )
        .bind(crate::now_ms())
        .execute(&self.db)
        .await?;
        let user_id: i64 = sqlx::query_scalar(
            "INSERT INTO users (email, display_name, password_hash, role, tenant_id, created_at)
             VALUES (?, 'Dana Demo', NULL, 'member', ?, ?) RETURNING id",
        )
        .bind(DEMO_EMAIL)
        .bind(acme)
        .bind(crate::now_ms())
        .fetch_one(&self.db)
        .await?;
        self.seed_demo_quotas(acme, user_id).await?;
        self.seed_demo_history(acme, user_id).await?;
        let dana = Caller {
            principal: Principal { user_id, tenant_id: Some(acme), role: Role::Member, token_actions: None },
            meta,
        };
        // Three running now, and two booked ahead so the calendar has something to show.
        let launches = [
            ("notebook", "h100-3g.40gb", "llm-finetune-nb", "", "", 0, 12),
            ("inference", "l40s-1", "sd-xl-endpoint", "ghcr.io/acme/sdxl-server:2.1", "", 0, 12),
            (
                "training",
                "a100-8",
                "resnet-sweep",
                "nvcr.io/nvidia/pytorch:24.05-py3",
                // A simulated epoch takes 1.5 s: the sweep runs for about an hour.
                "python sweep.py --trials 32 --epochs 2400",
                0,
                12,
            ),
            ("cluster", "h100-node-2", "pretrain-7b", "", "", 26, 72),
            ("training", "h100-4", "eval-suite", "nvcr.io/nvidia/pytorch:24.05-py3", "python eval.py", 50, 8),
        ];
        let now = crate::now_ms();
        for (offering, size, name, image, command, in_hours, hours) in launches {
            // Whole hours, so the bookings line up with the calendar's columns.
            let start = if in_hours == 0 {
                String::new()
            } else {
                let at = (now / HOUR_MS + in_hours) * HOUR_MS;
                chrono::DateTime::from_timestamp_millis(at).map(|t| t.to_rfc3339()).unwrap_or_default()
            };
            let request = LaunchRequest {
                offering: offering.into(),
                size: size.into(),
                name: name.into(),
                hours: hours.to_string(),
                start,
                image: image.into(),
                command: command.into(),
                ..LaunchRequest::default()
            };
            // A fleet file without these models simply gets fewer demo environments.
            match self.launch(&dana, &request).await {
                Ok(_) | Err(Error::Refused(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Acme may hold 32 GPU-equivalents of each model and burst beyond as spot; its
    /// project "vision", which Dana belongs to, 4.
    async fn seed_demo_quotas(&self, acme: i64, dana: i64) -> Result<(), Error> {
        let now = crate::now_ms();
        let mut tx = self.begin_write().await?;
        let vision: i64 = sqlx::query_scalar(
            "INSERT INTO projects (tenant_id, name, created_at) VALUES (?, 'vision', ?) RETURNING id",
        )
        .bind(acme)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        sqlx::query("INSERT INTO project_members (project_id, user_id) VALUES (?, ?)")
            .bind(vision)
            .bind(dana)
            .execute(&mut *tx)
            .await?;
        sqlx::query("INSERT INTO quotas (tenant_id, max_gpus, allow_spot, updated_at) VALUES (?, 32, 1, ?)")
            .bind(acme)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        sqlx::query("INSERT INTO quotas (project_id, max_gpus, updated_at) VALUES (?, 4, ?)")
            .bind(vision)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Last month's work, so that usage, its charts and a closed statement have something
    /// to show: Dana's training jobs and notebooks, released, written as the ledger would
    /// have them (`berth serve` sums them and closes the month as it starts).
    async fn seed_demo_history(&self, acme: i64, dana: i64) -> Result<(), Error> {
        let month = berth_domain::metering::Month::of(crate::now_ms()).previous();
        let vision: i64 = sqlx::query_scalar("SELECT id FROM projects WHERE tenant_id = ? AND name = 'vision'")
            .bind(acme)
            .fetch_one(&self.db)
            .await?;
        let h100s: Vec<i64> =
            sqlx::query_scalar("SELECT id FROM gpus WHERE model = 'H100-80GB' AND time_slices = 1 ORDER BY id LIMIT 4")
                .fetch_all(&self.db)
                .await?;
        if h100s.len() < 4 {
            return Ok(());
        }
        let mut tx = self.begin_write().await?;
        // (name, size, GPUs, project, day of the month, hours)
        let jobs = [
            ("bert-pretrain", "h100-4", 4, Some(vision), 3, 10),
            ("data-explore", "h100-1", 1, None, 5, 6),
            ("vit-finetune", "h100-4", 4, Some(vision), 11, 14),
            ("ablation-a", "h100-1", 1, Some(vision), 17, 8),
            ("report-figures", "h100-1", 1, None, 24, 3),
        ];
        for (n, (name, size, gpus, project, day, hours)) in jobs.into_iter().enumerate() {
            let id = format!("demo-history-{n}");
            let starts_at = month.starts_at() + (day - 1) * berth_domain::booking::DAY_MS + 9 * HOUR_MS;
            let ends_at = starts_at + hours * HOUR_MS;
            let offering = if size == "h100-4" { "training" } else { "notebook" };
            sqlx::query(
                "INSERT INTO environments (id, owner_id, tenant_id, project_id, name, offering, size_id, cents_per_hour,
                     state, desired, created_at, starts_at, ends_at, state_changed_at, held_at, ready_at, finished_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'released', 'released', ?9, ?9, ?10, ?10, ?9, ?9, ?10)",
            )
            .bind(&id)
            .bind(dana)
            .bind(acme)
            .bind(project)
            .bind(name)
            .bind(offering)
            .bind(size)
            .bind(320 * gpus)
            .bind(starts_at)
            .bind(ends_at)
            .execute(&mut *tx)
            .await?;
            for gpu in &h100s[..usize::try_from(gpus).unwrap_or(1)] {
                sqlx::query(
                    "INSERT INTO reservations (environment_id, gpu_id, slice_start, slice_size, starts_at, ends_at)
                     VALUES (?, ?, 0, 8, ?, ?)",
                )
                .bind(&id)
                .bind(gpu)
                .bind(starts_at)
                .bind(ends_at)
                .execute(&mut *tx)
                .await?;
            }
            // Recorded as the booking would have, then released at its end.
            crate::capacity::metering::record_units(&mut tx, &id, 0, starts_at).await?;
            sqlx::query("UPDATE reservations SET released_at = ends_at WHERE environment_id = ?")
                .bind(&id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Acme signs in through the local test provider (`make idp`), so SSO can be tried on a
    /// laptop: its groups `acme-admins`, `acme-ml` and `acme-viewers` give the three roles.
    async fn connect_demo_sso(&self, acme: i64) -> Result<(), Error> {
        let mut tx = self.begin_write().await?;
        let provider: i64 = sqlx::query_scalar(
            "INSERT INTO oidc_providers (tenant_id, slug, display_name, issuer, client_id, client_secret, created_at,
                 set_by_operator, allowed_domains)
             VALUES (?, 'acme', 'Acme SSO (local test provider)', ?, 'acme-berth', 'acme-secret', ?, 1, 'acme.example')
             RETURNING id",
        )
        .bind(acme)
        .bind(DEMO_ISSUER)
        .bind(crate::now_ms())
        .fetch_one(&mut *tx)
        .await?;
        for (group, role) in [("acme-admins", "tenant_admin"), ("acme-ml", "member"), ("acme-viewers", "viewer")] {
            sqlx::query("INSERT INTO oidc_group_roles (provider_id, group_name, role, tenant_id) VALUES (?, ?, ?, ?)")
                .bind(provider)
                .bind(group)
                .bind(role)
                .bind(acme)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}
