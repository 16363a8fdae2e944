use leptos::prelude::*;

use crate::error::AppError;
use crate::model::AuditView;

/// One page of the audit log, newest first, within the caller's reach: everything for
/// platform staff, their tenant for a tenant admin. Empty filters do not filter; `before` is
/// the id the previous page ended at.
#[server(endpoint = "audit_log")]
pub async fn audit_log(
    tenant: String,
    actor: String,
    action: String,
    outcome: String,
    before: String,
) -> Result<AuditView, AppError> {
    use berth_platform::audit::{AUDIT_PAGE, AuditFilter};
    let (platform, caller) = super::ssr::caller().await?;
    let filter = AuditFilter { tenant, actor, action, outcome, before_id: before.trim().parse().ok() };
    let rows = platform
        .audit_log(&caller, &filter, AUDIT_PAGE)
        .await
        .map_err(|e| AppError::from_platform(e, &caller.meta.request_id))?;
    Ok(views::audit(&rows, &filter, caller.principal.role.is_platform()))
}

#[cfg(feature = "ssr")]
mod views {
    use berth_platform::audit::{AUDIT_PAGE, AuditFilter, AuditRow};

    use crate::components::urlencode;
    use crate::model::{AuditRowView, AuditView};
    use crate::time::utc_seconds;

    pub fn audit(rows: &[AuditRow], filter: &AuditFilter, tenant_filter: bool) -> AuditView {
        let query = filter_query(filter);
        let full = i64::try_from(rows.len()).is_ok_and(|n| n >= AUDIT_PAGE);
        let with = |extra: &str| match (query.is_empty(), extra.is_empty()) {
            (true, _) => extra.to_owned(),
            (false, true) => query.clone(),
            (false, false) => format!("{query}&{extra}"),
        };
        let href = |path: &str, q: String| if q.is_empty() { path.to_owned() } else { format!("{path}?{q}") };
        AuditView {
            rows: rows.iter().map(row).collect(),
            tenant_filter,
            older_href: rows.last().filter(|_| full).map(|last| href("/audit", with(&format!("before={}", last.id)))),
            newest_href: filter.before_id.map(|_| href("/audit", with(""))),
            csv_href: href("/audit.csv", with("")),
        }
    }

    /// The filters that are set, as a query string the page and the CSV download both read.
    fn filter_query(filter: &AuditFilter) -> String {
        [("tenant", &filter.tenant), ("actor", &filter.actor), ("action", &filter.action), ("outcome", &filter.outcome)]
            .into_iter()
            .filter(|(_, value)| !value.trim().is_empty())
            .map(|(key, value)| format!("{key}={}", urlencode(value.trim())))
            .collect::<Vec<_>>()
            .join("&")
    }

    fn row(r: &AuditRow) -> AuditRowView {
        AuditRowView {
            id: r.id,
            time: utc_seconds(r.at),
            // No user: Berth itself, or someone not signed in (e.g. an unknown token).
            actor: r.actor.clone().unwrap_or_default(),
            tenant: r.tenant.clone().unwrap_or_default(),
            action: r.action.clone(),
            target: r.target.clone().unwrap_or_default(),
            target_name: r.target_name.clone().unwrap_or_default(),
            outcome: r.outcome.clone(),
            source: r.source.clone().unwrap_or_default(),
            request_id: r.request_id.clone().unwrap_or_default(),
            detail: r.detail.clone().unwrap_or_default(),
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn rows(n: i64) -> Vec<AuditRow> {
            (0..n)
                .map(|i| AuditRow {
                    id: 1000 - i,
                    at: 0,
                    actor: None,
                    tenant: None,
                    action: "session.sign_in".into(),
                    target: None,
                    target_name: None,
                    outcome: "success".into(),
                    source: None,
                    request_id: None,
                    detail: None,
                })
                .collect()
        }

        #[test]
        fn links_keep_the_filters() {
            let filter = AuditFilter { action: "token.".into(), actor: "a&b".into(), ..AuditFilter::default() };
            let view = audit(&rows(AUDIT_PAGE), &filter, true);
            assert_eq!(view.csv_href, "/audit.csv?actor=a%26b&action=token.");
            assert_eq!(
                view.older_href.as_deref(),
                Some(format!("/audit?actor=a%26b&action=token.&before={}", 1001 - AUDIT_PAGE).as_str())
            );
            assert_eq!(view.newest_href, None);
        }

        #[test]
        fn a_short_page_is_the_last() {
            let filter = AuditFilter { before_id: Some(7), ..AuditFilter::default() };
            let view = audit(&rows(3), &filter, false);
            assert_eq!(view.older_href, None);
            assert_eq!(view.newest_href.as_deref(), Some("/audit"));
            assert_eq!(view.csv_href, "/audit.csv");
            assert_eq!(view.rows[0].actor, "");
        }
    }
}
