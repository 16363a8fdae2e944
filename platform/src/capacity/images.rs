//! The image catalog as records (`0032_image_catalog.sql`): the platform's entries, each
//! tenant's own, the defaults per offering, and each tenant's rule for custom images. The
//! launch reads what its caller may run (`image_choice`) and `domain::image` decides.

use berth_domain::Refusal;
use berth_domain::catalog::Offering;
use berth_domain::image::{self, CatalogImage, CustomImages, ImageChoice, ImageForm, ImageRef};
use berth_domain::policy::{Action, Target};
use serde::Serialize;
use sqlx::SqliteConnection;

use crate::audit::{self, Event, Outcome};
use crate::{Caller, Error, Platform, now_ms};

/// The images page: the platform's catalog and the tenants' the caller may see, and what
/// the caller may change there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImageCatalog {
    pub platform: Vec<CatalogImage>,
    pub tenants: Vec<TenantImages>,
    /// Platform admins: add, remove and choose defaults in the platform's catalog.
    pub may_manage_platform: bool,
    /// Platform admins: each tenant's rule for custom images.
    pub may_set_custom_images: bool,
}

/// One tenant's own entries and its rule for custom images.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TenantImages {
    pub tenant_id: i64,
    pub tenant: String,
    pub custom: CustomImages,
    pub images: Vec<CatalogImage>,
    pub may_manage: bool,
}

/// One entry and the catalog it is in, as a change answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CatalogEntry {
    /// The tenant's slug; `None` for the platform's catalog.
    pub tenant: Option<String>,
    pub image: CatalogImage,
}

/// A tenant's rule for custom images, as a change answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TenantRule {
    pub tenant_id: i64,
    pub tenant: String,
    pub custom: CustomImages,
}

const IMAGE_COLUMNS: &str = "i.id, i.tenant_id, i.name, i.reference, i.description, i.cuda, i.framework, i.offerings,
     coalesce((SELECT group_concat(d.offering) FROM image_defaults d WHERE d.image_id = i.id), '')";

type ImageRow = (i64, Option<i64>, String, String, String, String, String, String, String);

fn from_row(row: ImageRow) -> CatalogImage {
    let (id, tenant_id, name, reference, description, cuda, framework, offerings, defaults) = row;
    CatalogImage {
        id,
        tenant_id,
        name,
        reference,
        description,
        cuda,
        framework,
        offerings: image::offerings_from_stored(&offerings),
        default_for: image::offerings_from_stored(&defaults),
    }
}

/// Entries of the platform's catalog (`tenant = None`) or of a tenant's, by name.
async fn entries(conn: &mut SqliteConnection, tenant_id: Option<i64>) -> Result<Vec<CatalogImage>, Error> {
    let rows: Vec<ImageRow> = sqlx::query_as(&format!(
        "SELECT {IMAGE_COLUMNS} FROM images i WHERE i.tenant_id IS ? ORDER BY i.name COLLATE NOCASE"
    ))
    .bind(tenant_id)
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(from_row).collect())
}

async fn tenant_rule(conn: &mut SqliteConnection, tenant_id: i64) -> Result<(String, CustomImages), Error> {
    let (slug, custom): (String, String) = sqlx::query_as("SELECT slug, custom_images FROM tenants WHERE id = ?")
        .bind(tenant_id)
        .fetch_optional(conn)
        .await?
        .ok_or(Error::NotFound)?;
    Ok((slug, CustomImages::from_stored(&custom)))
}

impl Platform {
    /// What the launch form offers the caller: [`Platform::image_choice`], for those who
    /// may read the catalog.
    pub async fn launch_images(&self, caller: &Caller) -> Result<ImageChoice, Error> {
        self.authorize_in_tenant(caller, Action::ImageRead).await?;
        self.image_choice(caller).await
    }

    /// What the caller may run: their tenant's entries, then the platform's, and their
    /// tenant's rule for custom images (platform staff may run any image). Asked by the
    /// launch, which has its own authorization.
    pub(crate) async fn image_choice(&self, caller: &Caller) -> Result<ImageChoice, Error> {
        let mut conn = self.db.acquire().await?;
        let (tenant, custom, mut catalog) = match caller.tenant_id() {
            Some(tenant_id) => {
                let (slug, custom) = tenant_rule(&mut conn, tenant_id).await?;
                (Some(slug), custom, entries(&mut conn, Some(tenant_id)).await?)
            }
            None => (None, CustomImages::AnyRegistry, Vec::new()),
        };
        catalog.extend(entries(&mut conn, None).await?);
        Ok(ImageChoice { tenant, catalog, custom })
    }

    /// The images page: the platform's catalog for everyone; a tenant's own entries for its
    /// people; every tenant's for platform staff.
    pub async fn image_catalog(&self, caller: &Caller) -> Result<ImageCatalog, Error> {
        self.authorize_in_tenant(caller, Action::ImageRead).await?;
        let mut conn = self.db.acquire().await?;
        let tenant_ids: Vec<i64> = match caller.tenant_id() {
            Some(id) => vec![id],
            None => {
                sqlx::query_scalar("SELECT id FROM tenants WHERE status <> 'deleted' ORDER BY slug")
                    .fetch_all(&mut *conn)
                    .await?
            }
        };
        let mut tenants = Vec::with_capacity(tenant_ids.len());
        for tenant_id in tenant_ids {
            let (tenant, custom) = tenant_rule(&mut conn, tenant_id).await?;
            let images = entries(&mut conn, Some(tenant_id)).await?;
            let may_manage = caller.principal.authorize(Action::ImageManage, Target::Tenant(tenant_id)).is_ok();
            tenants.push(TenantImages { tenant_id, tenant, custom, images, may_manage });
        }
        Ok(ImageCatalog {
            platform: entries(&mut conn, None).await?,
            tenants,
            may_manage_platform: caller.principal.authorize(Action::ImageManage, Target::Platform).is_ok(),
            may_set_custom_images: caller.principal.authorize(Action::TenantManage, Target::Platform).is_ok(),
        })
    }

    /// Adds an entry to the platform's catalog (`tenant_id = None`) or a tenant's. A tenant
    /// admin's entry must come from a registry the tenant's rule allows: the catalog is no
    /// way around it.
    pub async fn add_image(
        &self,
        caller: &Caller,
        tenant_id: Option<i64>,
        form: &ImageForm,
    ) -> Result<CatalogEntry, Error> {
        self.authorize(caller, Action::ImageManage, tenant_id.map_or(Target::Platform, Target::Tenant)).await?;
        let entry = image::validate(form)?;
        let mut tx = self.begin_write().await?;
        let mut tenant = None;
        if let Some(tenant_id) = tenant_id {
            crate::capacity::environments::ensure_tenant_active(&mut tx, tenant_id).await?;
            let (slug, custom) = tenant_rule(&mut tx, tenant_id).await?;
            let registry = ImageRef::parse(&entry.reference)?.registry;
            let allowed = match &custom {
                CustomImages::Registries(hosts) => hosts.iter().any(|h| h.eq_ignore_ascii_case(registry)),
                _ => true,
            };
            if caller.tenant_id().is_some() && !allowed {
                return Err(Refusal::InvalidCatalogImage(format!(
                    "{registry} is not a registry tenant {slug} allows ({})",
                    custom.describe()
                ))
                .into());
            }
            tenant = Some(slug);
        }
        let taken: Option<String> = sqlx::query_scalar(
            "SELECT CASE WHEN name = ?2 THEN 'name' ELSE 'image' END FROM images
             WHERE tenant_id IS ?1 AND (name = ?2 OR reference = ?3) LIMIT 1",
        )
        .bind(tenant_id)
        .bind(&entry.name)
        .bind(&entry.reference)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(what) = taken {
            return Err(Refusal::InvalidCatalogImage(match what.as_str() {
                "name" => format!("this catalog already has an image called \"{}\"", entry.name),
                _ => format!("this catalog already lists {}", entry.reference),
            })
            .into());
        }
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO images (tenant_id, name, reference, description, cuda, framework, offerings, created_at, created_by)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
        )
        .bind(tenant_id)
        .bind(&entry.name)
        .bind(&entry.reference)
        .bind(&entry.description)
        .bind(&entry.cuda)
        .bind(&entry.framework)
        .bind(image::offerings_stored(&entry.offerings))
        .bind(now_ms())
        .bind(caller.user_id())
        .fetch_one(&mut *tx)
        .await?;
        for offering in &entry.default_for {
            make_default(&mut tx, tenant_id, id, *offering).await?;
        }
        let target = format!("image:{id}");
        let detail = format!(
            "{} ({}) for {} in {}",
            entry.name,
            entry.reference,
            image::offerings_stored(&entry.offerings),
            tenant_id.map_or("the platform's catalog".into(), |t| format!("tenant {t}'s catalog"))
        );
        let event =
            Event { action: "image.add", target: Some(&target), outcome: Outcome::Success, detail: Some(&detail) };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        let mut conn = self.db.acquire().await?;
        let image = entries(&mut conn, tenant_id).await?.into_iter().find(|i| i.id == id).ok_or(Error::NotFound)?;
        Ok(CatalogEntry { tenant, image })
    }

    /// Removes an entry. Environments that run it keep their image: each keeps the reference
    /// it was launched with.
    pub async fn remove_image(&self, caller: &Caller, id: i64) -> Result<(), Error> {
        let (tenant_id, name) = self.image_to_change(caller, id).await?;
        let mut tx = self.begin_write().await?;
        let removed = sqlx::query("DELETE FROM images WHERE id = ?").bind(id).execute(&mut *tx).await?;
        if removed.rows_affected() == 0 {
            return Err(Error::NotFound);
        }
        let target = format!("image:{id}");
        let detail = format!(
            "{name} from {}",
            tenant_id.map_or("the platform's catalog".into(), |t| format!("tenant {t}'s catalog"))
        );
        let event =
            Event { action: "image.remove", target: Some(&target), outcome: Outcome::Success, detail: Some(&detail) };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Makes an entry its catalog's default for an offering it suits; answers the entry as
    /// it is now.
    pub async fn set_default_image(&self, caller: &Caller, id: i64, offering: &str) -> Result<CatalogEntry, Error> {
        let (tenant_id, name) = self.image_to_change(caller, id).await?;
        let offering = Offering::parse(offering.trim()).ok_or_else(|| Refusal::UnknownOffering(offering.to_owned()))?;
        let mut tx = self.begin_write().await?;
        let offerings: String = sqlx::query_scalar("SELECT offerings FROM images WHERE id = ?")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(Error::NotFound)?;
        if !image::offerings_from_stored(&offerings).contains(&offering) {
            return Err(Refusal::InvalidCatalogImage(format!(
                "{name} does not suit {}, so it cannot be their default",
                offering.title().to_lowercase()
            ))
            .into());
        }
        make_default(&mut tx, tenant_id, id, offering).await?;
        let target = format!("image:{id}");
        let detail = format!("{name} for {}", offering.id());
        let event =
            Event { action: "image.default", target: Some(&target), outcome: Outcome::Success, detail: Some(&detail) };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        let mut conn = self.db.acquire().await?;
        let tenant = match tenant_id {
            Some(tenant_id) => Some(tenant_rule(&mut conn, tenant_id).await?.0),
            None => None,
        };
        let image = entries(&mut conn, tenant_id).await?.into_iter().find(|i| i.id == id).ok_or(Error::NotFound)?;
        Ok(CatalogEntry { tenant, image })
    }

    /// Sets which images besides the catalog's a tenant's people may run (platform admins).
    pub async fn set_custom_images(
        &self,
        caller: &Caller,
        tenant_id: i64,
        mode: &str,
        registries: &str,
    ) -> Result<TenantRule, Error> {
        self.authorize(caller, Action::TenantManage, Target::Tenant(tenant_id)).await?;
        let custom = CustomImages::parse(mode, registries)?;
        let mut tx = self.begin_write().await?;
        let tenant: String = sqlx::query_scalar(
            "UPDATE tenants SET custom_images = ? WHERE id = ? AND status <> 'deleted' RETURNING slug",
        )
        .bind(custom.stored())
        .bind(tenant_id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(Error::NotFound)?;
        let target = format!("tenant:{tenant_id}");
        let detail = custom.describe();
        let event = Event {
            action: "tenant.custom_images",
            target: Some(&target),
            outcome: Outcome::Success,
            detail: Some(&detail),
        };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        Ok(TenantRule { tenant_id, tenant, custom })
    }

    /// An entry's catalog and name, once the caller may change that catalog. An entry of
    /// another tenant's catalog is not found, as if it did not exist.
    async fn image_to_change(&self, caller: &Caller, id: i64) -> Result<(Option<i64>, String), Error> {
        self.authorize_in_tenant(caller, Action::ImageManage).await?;
        let mut conn = self.db.acquire().await?;
        let (tenant_id, name): (Option<i64>, String) =
            sqlx::query_as("SELECT tenant_id, name FROM images WHERE id = ?")
                .bind(id)
                .fetch_optional(&mut *conn)
                .await?
                .ok_or(Error::NotFound)?;
        drop(conn);
        if let (Some(theirs), Some(ours)) = (tenant_id, caller.tenant_id())
            && theirs != ours
        {
            return Err(Error::NotFound);
        }
        self.authorize(caller, Action::ImageManage, tenant_id.map_or(Target::Platform, Target::Tenant)).await?;
        Ok((tenant_id, name))
    }
}

/// The catalog's one default for the offering becomes `id` (the table's key keeps it one).
async fn make_default(
    tx: &mut SqliteConnection,
    tenant_id: Option<i64>,
    id: i64,
    offering: Offering,
) -> Result<(), Error> {
    sqlx::query("INSERT OR REPLACE INTO image_defaults (scope, offering, image_id) VALUES (?, ?, ?)")
        .bind(tenant_id.unwrap_or(0))
        .bind(offering.id())
        .bind(id)
        .execute(tx)
        .await?;
    Ok(())
}
