//! The append-only audit log (the table refuses updates and deletes).

use sqlx::SqliteConnection;

use crate::store::Statements;
use crate::{Caller, Error, RequestMeta, now_ms};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure,
    Denied,
}

impl Outcome {
    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Failure => "failure",
            Outcome::Denied => "denied",
        }
    }
}

/// What happened, to what, and how it went.
pub struct Event<'a> {
    pub action: &'a str,
    pub target: Option<&'a str>,
    pub outcome: Outcome,
    /// Never a secret.
    pub detail: Option<&'a str>,
}

/// Who acted, in which tenant, and from where.
#[derive(Clone, Copy)]
pub struct Actor<'a> {
    pub user_id: Option<i64>,
    pub tenant_id: Option<i64>,
    pub meta: &'a RequestMeta,
}

impl Actor<'_> {
    /// Berth itself (the reconciler, start-up), acting for a tenant or none.
    pub fn background(tenant_id: Option<i64>) -> Actor<'static> {
        static BACKGROUND: std::sync::LazyLock<RequestMeta> = std::sync::LazyLock::new(RequestMeta::background);
        Actor { user_id: None, tenant_id, meta: &BACKGROUND }
    }
}

impl Caller {
    pub fn actor(&self) -> Actor<'_> {
        Actor { user_id: Some(self.user_id()), tenant_id: self.tenant_id(), meta: &self.meta }
    }
}

/// Writes one audit row on the caller's connection, so it commits (or not) together with
/// the change it records.
pub async fn record(conn: &mut SqliteConnection, actor: &Actor<'_>, event: Event<'_>) -> Result<(), Error> {
    let mut insert = Statements::new();
    push(&mut insert, actor, event);
    insert.execute(conn).await
}

/// The audit row of [`record`] added to `statements`, to go with the statements of the
/// change it records in one round trip.
pub(crate) fn push<'q>(statements: &mut Statements<'q>, actor: &Actor<'q>, event: Event<'q>) {
    statements
        .push(
            "INSERT INTO audit_events (at, actor_id, tenant_id, action, target, outcome, source, request_id, detail)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?);",
        )
        .bind(now_ms())
        .bind(actor.user_id)
        .bind(actor.tenant_id)
        .bind(event.action)
        .bind(event.target)
        .bind(event.outcome.as_str())
        .bind(actor.meta.source.as_deref())
        .bind(actor.meta.request_id.as_str())
        .bind(event.detail);
}

/// One row of the audit log as the audit pages show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRow {
    pub id: i64,
    pub at: i64,
    pub actor: Option<String>,
    pub tenant: Option<String>,
    pub action: String,
    pub target: Option<String>,
    /// What the target is called where the target is an id: an environment's name.
    pub target_name: Option<String>,
    pub outcome: String,
    pub source: Option<String>,
    pub request_id: Option<String>,
    pub detail: Option<String>,
}

/// What the audit page filters on; empty fields do not filter. Read from query strings
/// as they are (`?tenant=&actor=&action=&outcome=&before=`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(default)]
pub struct AuditFilter {
    /// Tenant slug; platform staff only (a tenant admin always sees their own tenant).
    pub tenant: String,
    /// Part of the actor's email.
    pub actor: String,
    /// Start of the action name, e.g. `session.` or `environment.launch`.
    pub action: String,
    /// `success`, `failure` or `denied`.
    pub outcome: String,
    /// Only rows before this id (the next page).
    #[serde(rename = "before")]
    pub before_id: Option<i64>,
}

/// How many rows one audit page shows.
pub const AUDIT_PAGE: i64 = 100;

impl crate::Platform {
    /// The audit log, newest first, within the caller's reach: everything for platform
    /// staff, their own tenant's rows for a tenant admin.
    pub async fn audit_log(&self, caller: &Caller, filter: &AuditFilter, limit: i64) -> Result<Vec<AuditRow>, Error> {
        use berth_domain::policy::Action;
        self.authorize_in_tenant(caller, Action::AuditRead).await?;
        let scope = crate::access::Scope::of(caller, Action::AuditRead).ok_or(Error::Forbidden)?;
        let like = |s: &str| format!("%{}%", s.trim().replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_"));
        let prefix = |s: &str| format!("{}%", s.trim().replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_"));
        let rows = sqlx::query(
            "SELECT a.id, a.at, u.email AS actor, t.slug AS tenant, a.action, a.target, e.name AS target_name,
                    a.outcome, a.source, a.request_id, a.detail
             FROM audit_events a LEFT JOIN users u ON u.id = a.actor_id LEFT JOIN tenants t ON t.id = a.tenant_id
             LEFT JOIN environments e ON e.id = a.target AND (a.action LIKE 'environment.%' OR a.action LIKE 'endpoint.%')
             WHERE (? OR a.tenant_id = ?)
               AND (? = '' OR t.slug = ?)
               AND (? = '' OR u.email LIKE ? ESCAPE '\\')
               AND (? = '' OR a.action LIKE ? ESCAPE '\\')
               AND (? = '' OR a.outcome = ?)
               AND (? IS NULL OR a.id < ?)
             ORDER BY a.id DESC LIMIT ?",
        )
        .bind(scope.all)
        .bind(scope.tenant_id)
        .bind(filter.tenant.trim())
        .bind(filter.tenant.trim())
        .bind(filter.actor.trim())
        .bind(like(&filter.actor))
        .bind(filter.action.trim())
        .bind(prefix(&filter.action))
        .bind(filter.outcome.trim())
        .bind(filter.outcome.trim())
        .bind(filter.before_id)
        .bind(filter.before_id)
        .bind(limit.clamp(1, 100_000))
        .fetch_all(&self.db)
        .await?;
        use sqlx::Row;
        rows.iter()
            .map(|row| {
                Ok(AuditRow {
                    id: row.try_get("id")?,
                    at: row.try_get("at")?,
                    actor: row.try_get("actor")?,
                    tenant: row.try_get("tenant")?,
                    action: row.try_get("action")?,
                    target: row.try_get("target")?,
                    target_name: row.try_get("target_name")?,
                    outcome: row.try_get("outcome")?,
                    source: row.try_get("source")?,
                    request_id: row.try_get("request_id")?,
                    detail: row.try_get("detail")?,
                })
            })
            .collect()
    }
}

/// One CSV cell (RFC 4180). A cell that a spreadsheet would run as a formula is prefixed
/// with a quote.
pub(crate) fn csv_cell(out: &mut String, value: &str) {
    let value =
        if value.starts_with(['=', '+', '-', '@', '\t', '\r']) { format!("'{value}") } else { value.to_owned() };
    if value.contains([',', '"', '\n', '\r']) {
        out.push('"');
        out.push_str(&value.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(&value);
    }
}

/// One CSV row of `cells` (see [`csv_cell`]), ended by CRLF.
pub(crate) fn csv_row<'a>(out: &mut String, cells: impl IntoIterator<Item = &'a str>) {
    for (i, value) in cells.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        csv_cell(out, value);
    }
    out.push_str("\r\n");
}

/// The rows as CSV (RFC 4180), times in UTC. Cells that a spreadsheet would run as a
/// formula are prefixed with a quote.
pub fn to_csv(rows: &[AuditRow]) -> String {
    let mut out =
        String::from("id,time_utc,actor,tenant,action,target,target_name,outcome,source,request_id,detail\r\n");
    for row in rows {
        let time = chrono::DateTime::from_timestamp_millis(row.at)
            .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
            .unwrap_or_default();
        let cells = [
            row.id.to_string(),
            time,
            row.actor.clone().unwrap_or_default(),
            row.tenant.clone().unwrap_or_default(),
            row.action.clone(),
            row.target.clone().unwrap_or_default(),
            row.target_name.clone().unwrap_or_default(),
            row.outcome.clone(),
            row.source.clone().unwrap_or_default(),
            row.request_id.clone().unwrap_or_default(),
            row.detail.clone().unwrap_or_default(),
        ];
        csv_row(&mut out, cells.iter().map(String::as_str));
    }
    out
}
