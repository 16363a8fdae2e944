//! Demo data for `make run`: a second user whose environments already occupy part of the
//! fleet, so the catalog and placement have something to show on a first visit.

use berth_domain::launch::LaunchRequest;

use crate::{Caller, Error, Platform, RequestMeta};

pub const DEMO_EMAIL: &str = "dana.demo@berth.local";

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
        let user_id: i64 = sqlx::query_scalar(
            "INSERT INTO users (email, display_name, password_hash, role, created_at)
             VALUES (?, 'Dana Demo', NULL, 'member', ?) RETURNING id",
        )
        .bind(DEMO_EMAIL)
        .bind(crate::now_ms())
        .fetch_one(&self.db)
        .await?;
        let dana =
            Caller { user_id, is_admin: false, meta: RequestMeta { request_id: "demo-seed".into(), source: None } };
        let launches = [
            ("notebook", "h100-3g.40gb", "llm-finetune-nb", "", ""),
            ("inference", "l40s-1", "sd-xl-endpoint", "ghcr.io/acme/sdxl-server:2.1", ""),
            ("training", "a100-8", "resnet-sweep", "nvcr.io/nvidia/pytorch:24.05-py3", "python sweep.py --trials 32"),
        ];
        for (offering, size, name, image, command) in launches {
            let request = LaunchRequest {
                offering: offering.into(),
                size: size.into(),
                name: name.into(),
                hours: "12".into(),
                image: image.into(),
                command: command.into(),
            };
            // A fleet file without these models simply gets fewer demo environments.
            match self.launch(&dana, &request).await {
                Ok(_) | Err(Error::Refused(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}
