//! The platform's side of access control: every action goes through [`Platform::authorize`],
//! which asks `domain::policy` and writes every denial to the audit log.

use berth_domain::policy::{Action, Denied, Reach, Target};

use crate::audit::{self, Event, Outcome};
use crate::{Caller, Error, Platform};

impl Platform {
    /// Allows the action or says why not. A denial is audited. On an object the caller
    /// cannot even read, the answer is `NotFound`, exactly as for an id that does not exist.
    pub async fn authorize(&self, caller: &Caller, action: Action, target: Target) -> Result<(), Error> {
        let Err(denied) = caller.principal.authorize(action, target) else { return Ok(()) };
        let error = match target {
            Target::Owned { .. } if denied == Denied::OutOfReach => Error::NotFound,
            Target::Owned { .. } if caller.principal.authorize(action.read(), target).is_err() => Error::NotFound,
            _ => Error::Forbidden,
        };
        let detail = match target {
            Target::Platform => "platform".to_owned(),
            Target::Tenant(t) => format!("tenant {t}"),
            Target::Owned { tenant_id, owner_id } => {
                format!("object of user {owner_id} in tenant {}", tenant_id.map_or("-".into(), |t| t.to_string()))
            }
        };
        let mut conn = self.db.acquire().await?;
        let event = Event { action: action.as_str(), target: Some(&detail), outcome: Outcome::Denied, detail: None };
        audit::record(&mut conn, &caller.actor(), event).await?;
        Err(error)
    }

    /// Like `authorize` for actions whose target is the caller's own tenant (or the
    /// platform, for platform staff).
    pub async fn authorize_in_tenant(&self, caller: &Caller, action: Action) -> Result<(), Error> {
        let target = caller.tenant_id().map_or(Target::Platform, Target::Tenant);
        self.authorize(caller, action, target).await
    }
}

/// Whether the caller may take `action` in their own tenant (or on the platform, for
/// staff), asked without auditing a denial: for what a page offers, which is no attempt.
pub(crate) fn may_in_tenant(caller: &Caller, action: Action) -> bool {
    let target = caller.tenant_id().map_or(Target::Platform, Target::Tenant);
    caller.principal.authorize(action, target).is_ok()
}

/// The SQL condition (and its two parameters) that keeps a listing within the caller's
/// reach for `action`, on a table with `tenant_id` and an owner column.
pub(crate) struct Scope {
    pub all: bool,
    pub tenant_id: Option<i64>,
    pub owner_id: Option<i64>,
}

impl Scope {
    pub fn of(caller: &Caller, action: Action) -> Option<Scope> {
        let reach = caller.principal.reach(action)?;
        Some(match reach {
            Reach::All => Scope { all: true, tenant_id: None, owner_id: None },
            Reach::Tenant => Scope { all: false, tenant_id: caller.tenant_id(), owner_id: Some(caller.user_id()) },
            Reach::Own => Scope { all: false, tenant_id: None, owner_id: Some(caller.user_id()) },
        })
    }

    /// `(? OR tenant_id = ? OR owner = ?)` with the parameters bound in that order by
    /// [`Scope::bind`].
    pub fn condition(owner_column: &str) -> String {
        format!("(? OR tenant_id = ? OR {owner_column} = ?)")
    }

    pub fn bind<'q>(
        &self,
        query: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
    ) -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>> {
        query.bind(self.all).bind(self.tenant_id).bind(self.owner_id)
    }
}
