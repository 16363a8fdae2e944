//! A person as every wing reads them: who they are, their role and tenant, and whether
//! they may act now. Accounts, single sign-on and tokens make and change people; node
//! access and environment sessions only read them.

use berth_domain::policy::{Principal, Role};
use sqlx::FromRow;
use sqlx::sqlite::SqliteRow;

use crate::{Caller, Error, Platform, RequestMeta};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub id: i64,
    pub email: String,
    pub display_name: String,
    pub role: Role,
    /// `None` for platform staff.
    pub tenant_id: Option<i64>,
    pub tenant_name: Option<String>,
}

/// The columns `user_from_row` reads, for queries over `users u`.
pub(crate) const USER_COLUMNS: &str = "u.id, u.email, u.display_name, u.role, u.tenant_id,
    (SELECT t.name FROM tenants t WHERE t.id = u.tenant_id) AS tenant_name";

pub(crate) fn user_from_row(row: &SqliteRow) -> Result<User, Error> {
    UserRow::from_row(row)?.try_into()
}

/// A person's row as [`USER_COLUMNS`] reads it.
#[derive(sqlx::FromRow)]
struct UserRow {
    id: i64,
    email: String,
    display_name: String,
    role: String,
    tenant_id: Option<i64>,
    tenant_name: Option<String>,
}

impl TryFrom<UserRow> for User {
    type Error = Error;

    fn try_from(row: UserRow) -> Result<User, Error> {
        let role = Role::parse(&row.role).ok_or_else(|| Error::internal(format!("unknown role {}", row.role)))?;
        Ok(User {
            id: row.id,
            email: row.email,
            display_name: row.display_name,
            role,
            tenant_id: row.tenant_id,
            tenant_name: row.tenant_name,
        })
    }
}

/// Only active users of active tenants (or platform staff) may act; anyone else's
/// sessions and tokens stop working at once.
pub(crate) const USER_IS_ACTIVE: &str = "u.status = 'active'
    AND (u.tenant_id IS NULL OR EXISTS (SELECT 1 FROM tenants t WHERE t.id = u.tenant_id AND t.status = 'active'))";

impl User {
    pub fn is_admin(&self) -> bool {
        self.role == Role::PlatformAdmin
    }

    /// The user acting from a browser session.
    pub fn principal(&self) -> Principal {
        Principal { user_id: self.id, tenant_id: self.tenant_id, role: self.role, token_actions: None }
    }

    pub fn caller(&self, meta: RequestMeta) -> Caller {
        Caller { principal: self.principal(), meta }
    }
}

impl Platform {
    /// The user behind a session or token, if they may still act (active, in an active
    /// tenant); anyone else is `NotFound`.
    pub async fn active_user(&self, id: i64) -> Result<User, Error> {
        let row = sqlx::query(&format!("SELECT {USER_COLUMNS} FROM users u WHERE u.id = ? AND {USER_IS_ACTIVE}"))
            .bind(id)
            .fetch_optional(&self.db)
            .await?
            .ok_or(Error::NotFound)?;
        user_from_row(&row)
    }
}
