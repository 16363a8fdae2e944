//! Tenants and what a tenant admin types in: short names, isolation modes, member emails,
//! SSO connection settings and API token requests.

use crate::Refusal;
use crate::outbound::{self, Reach, Unreachable};
use crate::policy::{Action, Role};

/// How strongly a tenant is kept apart from the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isolation {
    /// Namespaces, quotas and network policies on shared nodes.
    Soft,
    /// Dedicated nodes and fabric identifiers for the tenant's windows.
    Hard,
    /// Soft projects inside a hard tenant: toward other tenants as hard (its nodes and
    /// fabric identifiers are its own), while its projects share its nodes among themselves
    /// with namespaces and quotas only.
    Hybrid,
}

impl Isolation {
    pub const ALL: [Isolation; 3] = [Isolation::Soft, Isolation::Hard, Isolation::Hybrid];

    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Soft => "soft",
            Isolation::Hard => "hard",
            Isolation::Hybrid => "hybrid",
        }
    }

    pub fn parse(s: &str) -> Result<Isolation, Refusal> {
        Isolation::ALL.into_iter().find(|i| i.as_str() == s.trim()).ok_or_else(|| Refusal::InvalidIsolation(s.into()))
    }
}

/// Whether an environment of a tenant shares the tenant's space on the backend (on
/// Kubernetes its namespace, `berth-<slug>`, with one quota over what they all hold): a soft
/// tenant's, but for a dedicated cluster, which needs a space limited to its own nodes. The
/// one home of this rule; `tenant_queues::follow_holdings` says it again in SQL.
pub fn shares_tenant_space(offering: crate::catalog::Offering, isolation: Isolation) -> bool {
    isolation == Isolation::Soft && offering != crate::catalog::Offering::DedicatedCluster
}

/// What backends call platform staff's own environments where they need a tenant's name
/// (Kubernetes namespaces and labels), so no tenant may take it.
pub const STAFF_SLUG: &str = "platform-staff";

/// A short name for URLs and group mappings: 2 to 40 lower-case letters, digits or dashes,
/// starting with a letter, not [`STAFF_SLUG`], and not ending in a dash and 12 hex digits:
/// on Kubernetes a tenant's namespace is `berth-<slug>` and an environment's own
/// `berth-<slug>-<12 hex of its id>`, which such a slug could take.
pub fn validate_slug(slug: &str) -> Result<String, Refusal> {
    let slug = slug.trim();
    if slug.len() < 2 || slug.len() > 40 {
        return Err(Refusal::InvalidSlug("must be 2 to 40 characters"));
    }
    if !slug.starts_with(|c: char| c.is_ascii_lowercase()) {
        return Err(Refusal::InvalidSlug("must start with a lower-case letter"));
    }
    if !slug.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') {
        return Err(Refusal::InvalidSlug("may hold only lower-case letters, digits and dashes"));
    }
    if slug == STAFF_SLUG {
        return Err(Refusal::InvalidSlug("is reserved for platform staff's own environments"));
    }
    if slug.rsplit_once('-').is_some_and(|(_, end)| end.len() == 12 && end.chars().all(|c| c.is_ascii_hexdigit())) {
        return Err(Refusal::InvalidSlug("may not end in a dash and 12 hex digits (Berth names environments so)"));
    }
    Ok(slug.to_owned())
}

/// A display name: not blank, one line of printable characters, at most 80 of them.
pub fn validate_display_name(name: &str) -> Result<String, Refusal> {
    let name = name.trim();
    if name.chars().any(char::is_control) {
        return Err(Refusal::InvalidName("must be one line of printable characters"));
    }
    match name.chars().count() {
        0 => Err(Refusal::InvalidName("must not be empty")),
        81.. => Err(Refusal::InvalidName("must be at most 80 characters")),
        _ => Ok(name.to_owned()),
    }
}

/// A plausible email address (the provider or the invitee proves it).
pub fn validate_email(email: &str) -> Result<String, Refusal> {
    let email = email.trim();
    let plausible = email.len() <= 254
        && email.split_once('@').is_some_and(|(local, domain)| {
            !local.is_empty() && domain.contains('.') && !domain.starts_with('.') && !domain.ends_with('.')
        })
        && !email.chars().any(|c| c.is_whitespace() || c.is_control());
    if plausible { Ok(email.to_owned()) } else { Err(Refusal::InvalidEmail(email.into())) }
}

/// A role a tenant admin may give a member of their tenant.
pub fn parse_tenant_role(role: &str) -> Result<Role, Refusal> {
    let parsed = Role::parse(role.trim()).ok_or_else(|| Refusal::InvalidRole(role.into()))?;
    if Role::TENANT.contains(&parsed) { Ok(parsed) } else { Err(Refusal::NotATenantRole(parsed.label())) }
}

/// Shortest and longest passwords a local account may choose.
pub const PASSWORD_LENGTH: std::ops::RangeInclusive<usize> = 12..=256;

/// A new password for a local account, typed twice.
pub fn validate_new_password(password: &str, again: &str) -> Result<(), Refusal> {
    if !PASSWORD_LENGTH.contains(&password.chars().count()) {
        return Err(Refusal::WeakPassword("must be 12 to 256 characters long"));
    }
    if password.trim().is_empty() || password.chars().all(|c| password.starts_with(c)) {
        return Err(Refusal::WeakPassword("must not be one character repeated"));
    }
    if password != again {
        return Err(Refusal::WeakPassword("and its repetition differ"));
    }
    Ok(())
}

/// An issuer URL as OpenID Connect requires: https (plain http only on the loopback
/// interface, where the operator allows private providers), no query or fragment, and,
/// unless the operator allows private providers, a host that is not a private address.
pub fn validate_issuer(issuer: &str, reach: Reach) -> Result<String, Refusal> {
    let issuer = issuer.trim().trim_end_matches('/');
    let bad = || Refusal::InvalidIssuer(issuer.into());
    let Some((_, rest)) = issuer.split_once("://") else { return Err(bad()) };
    if rest.is_empty() || rest.contains(['?', '#', ' ']) {
        return Err(bad());
    }
    match outbound::check_url(issuer, reach) {
        Ok(()) => Ok(issuer.to_owned()),
        Err(Unreachable::Scheme) => Err(bad()),
        Err(Unreachable::PrivateAddress(host)) => Err(Refusal::PrivateIssuer(host)),
    }
}

/// The group-to-role lines a tenant admin writes, one `group = role` per line.
pub fn parse_group_roles(text: &str) -> Result<Vec<(String, Role)>, Refusal> {
    let mut mappings: Vec<(String, Role)> = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (group, role) = line.split_once('=').ok_or(Refusal::InvalidSso("each mapping line is group = role"))?;
        let (group, role) = (group.trim(), parse_tenant_role(role)?);
        if group.is_empty() {
            return Err(Refusal::InvalidSso("a mapping needs a group name before the ="));
        }
        if mappings.iter().any(|(g, _)| g == group) {
            return Err(Refusal::InvalidSso("each group may be mapped once"));
        }
        mappings.push((group.to_owned(), role));
    }
    Ok(mappings)
}

/// Space- or comma-separated email domains; empty allows any.
pub fn parse_domains(text: &str) -> Result<Vec<String>, Refusal> {
    text.split([' ', ',', '\n'])
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| {
            let d = d.trim_start_matches('@').to_ascii_lowercase();
            let ok = d.contains('.') && d.chars().all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-');
            if ok { Ok(d) } else { Err(Refusal::InvalidSso("email domains look like example.com")) }
        })
        .collect()
}

/// Whether `email` is in one of `domains` (any when empty).
pub fn email_in_domains(email: &str, domains: &[String]) -> bool {
    domains.is_empty()
        || email.rsplit_once('@').is_some_and(|(_, d)| domains.iter().any(|allowed| d.eq_ignore_ascii_case(allowed)))
}

/// The longest an API token may live.
pub const TOKEN_MAX_DAYS: i64 = 365;

/// What a user asks for when creating an API token, checked against their role: a name,
/// a lifetime in days, and the actions it may take (none chosen means all the role has).
pub fn validate_token_request(role: Role, name: &str, days: &str, actions: &[String]) -> Result<TokenRequest, Refusal> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > 60 {
        return Err(Refusal::InvalidToken("name must be 1 to 60 characters".into()));
    }
    if name.chars().any(char::is_control) {
        return Err(Refusal::InvalidToken("name must be one line of printable characters".into()));
    }
    let days: i64 = days.trim().parse().ok().filter(|d| (1..=TOKEN_MAX_DAYS).contains(d)).ok_or_else(|| {
        Refusal::InvalidToken(format!("lifetime must be a whole number of days from 1 to {TOKEN_MAX_DAYS}"))
    })?;
    let permitted: Vec<Action> = Action::ALL.into_iter().filter(|a| crate::policy::reach(role, *a).is_some()).collect();
    let mut chosen = Vec::new();
    for name in actions.iter().map(|a| a.trim()).filter(|a| !a.is_empty()) {
        let action =
            Action::parse(name).ok_or_else(|| Refusal::InvalidToken(format!("has no action called \"{name}\"")))?;
        if !permitted.contains(&action) {
            return Err(Refusal::InvalidToken(format!("cannot allow {name}: your role does not have it")));
        }
        if !chosen.contains(&action) {
            chosen.push(action);
        }
    }
    if chosen.is_empty() {
        chosen = permitted;
    }
    Ok(TokenRequest { name: name.to_owned(), days, actions: chosen })
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRequest {
    pub name: String,
    pub days: i64,
    pub actions: Vec<Action>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs() {
        assert_eq!(validate_slug(" acme-2 "), Ok("acme-2".into()));
        assert!(validate_slug("a").is_err());
        assert!(validate_slug("Acme").is_err());
        assert!(validate_slug("2acme").is_err());
        assert!(validate_slug("ac me").is_err());
        assert!(validate_slug("platform-staff").is_err(), "staff's name on Kubernetes");
        assert!(validate_slug("acme-0123456789ab").is_err(), "acme's environment's namespace on Kubernetes");
        assert!(validate_slug("platform-staff-0123456789ab").is_err());
        assert_eq!(validate_slug("acme-0123456789"), Ok("acme-0123456789".into()), "11 digits");
        assert_eq!(validate_slug("acme-0123456789xy"), Ok("acme-0123456789xy".into()));
    }

    #[test]
    fn names_are_one_printable_line() {
        assert_eq!(validate_display_name("  Acme Research "), Ok("Acme Research".into()));
        for bad in ["", "   ", "\0", "a\0b", "two\nlines", "bell\u{7}"] {
            assert!(validate_display_name(bad).is_err(), "{bad:?}");
            assert!(validate_token_request(Role::Member, bad, "30", &[]).is_err(), "{bad:?}");
        }
        assert!(validate_display_name(&"x".repeat(81)).is_err());
    }

    #[test]
    fn emails() {
        assert!(validate_email("ada@acme.example").is_ok());
        for bad in ["", "ada", "ada@", "@acme.example", "ada@acme", "a da@acme.example", "ada@.example"] {
            assert!(validate_email(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn issuers_are_public_https_unless_the_operator_allows_private_ones() {
        assert_eq!(
            validate_issuer("https://login.example.com/realms/acme/", Reach::Public),
            Ok("https://login.example.com/realms/acme".into())
        );
        assert_eq!(
            validate_issuer("http://127.0.0.1:9000", Reach::Public),
            Err(Refusal::PrivateIssuer("127.0.0.1".into()))
        );
        assert_eq!(
            validate_issuer("https://localhost:9000", Reach::Public),
            Err(Refusal::PrivateIssuer("localhost".into()))
        );
        assert!(validate_issuer("http://127.0.0.1:9000", Reach::Private).is_ok());
        for bad in
            ["http://idp.example.com", "https://idp.example.com/?x=1", "ftp://idp", "idp.example.com", "https://"]
        {
            assert!(matches!(validate_issuer(bad, Reach::Private), Err(Refusal::InvalidIssuer(_))), "{bad}");
        }
    }

    #[test]
    fn new_passwords_are_long_enough_and_typed_twice_alike() {
        assert_eq!(validate_new_password("correct horse battery", "correct horse battery"), Ok(()));
        assert!(validate_new_password("short", "short").is_err());
        assert!(validate_new_password("aaaaaaaaaaaaaaaa", "aaaaaaaaaaaaaaaa").is_err());
        assert!(validate_new_password("correct horse battery", "correct horse batterY").is_err());
        assert!(validate_new_password(&"x".repeat(300), &"x".repeat(300)).is_err());
    }

    #[test]
    fn group_mappings_name_tenant_roles_only() {
        let parsed = parse_group_roles("# comment\nml-admins = tenant_admin\nml = member\n").expect("parses");
        assert_eq!(parsed, vec![("ml-admins".into(), Role::TenantAdmin), ("ml".into(), Role::Member)]);
        assert_eq!(parse_group_roles("ops = platform_admin"), Err(Refusal::NotATenantRole("Platform admin")));
        assert!(parse_group_roles("ops").is_err());
        assert!(parse_group_roles("a = member\na = viewer").is_err());
    }

    #[test]
    fn domains() {
        let domains = parse_domains("acme.example, @Research.Acme.example").expect("parses");
        assert_eq!(domains, vec!["acme.example".to_owned(), "research.acme.example".to_owned()]);
        assert!(email_in_domains("ada@ACME.example", &domains));
        assert!(!email_in_domains("eve@evil.example", &domains));
        assert!(email_in_domains("anyone@anywhere.example", &[]));
        assert!(parse_domains("not a domain!").is_err());
    }

    #[test]
    fn tokens_never_exceed_the_role() {
        let request = validate_token_request(Role::Viewer, "ci", "30", &[]).expect("all the viewer has");
        assert!(request.actions.iter().all(|a| crate::policy::reach(Role::Viewer, *a).is_some()));
        assert!(!request.actions.contains(&Action::EnvironmentLaunch));
        let launch = ["environment.launch".to_owned()];
        assert!(validate_token_request(Role::Viewer, "ci", "30", &launch).is_err());
        assert_eq!(
            validate_token_request(Role::Member, "ci", "30", &launch).map(|r| r.actions),
            Ok(vec![Action::EnvironmentLaunch])
        );
        assert!(validate_token_request(Role::Member, "ci", "0", &[]).is_err());
        assert!(validate_token_request(Role::Member, "ci", "366", &[]).is_err());
        assert!(validate_token_request(Role::Member, " ", "30", &[]).is_err());
    }
}
