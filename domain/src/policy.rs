//! Who may do what: roles, actions, the one table between them, and the one decision
//! every server function, API route and background action goes through.
//!
//! Deny by default. A role's entry says how far each allowed action reaches: only the
//! caller's own objects, everything in the caller's tenant, or everything. An API token
//! narrows its owner's permissions further to the actions it was created with.

use serde::{Deserialize, Serialize};

/// A person's standing in Berth. Platform roles belong to no tenant; tenant roles to
/// exactly one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Role {
    PlatformAdmin,
    PlatformAuditor,
    TenantAdmin,
    Member,
    Viewer,
}

impl Role {
    pub const ALL: [Role; 5] =
        [Role::PlatformAdmin, Role::PlatformAuditor, Role::TenantAdmin, Role::Member, Role::Viewer];
    /// The roles a tenant admin can hand out.
    pub const TENANT: [Role; 3] = [Role::TenantAdmin, Role::Member, Role::Viewer];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::PlatformAdmin => "platform_admin",
            Role::PlatformAuditor => "platform_auditor",
            Role::TenantAdmin => "tenant_admin",
            Role::Member => "member",
            Role::Viewer => "viewer",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }

    pub fn label(self) -> &'static str {
        match self {
            Role::PlatformAdmin => "Platform admin",
            Role::PlatformAuditor => "Platform auditor",
            Role::TenantAdmin => "Tenant admin",
            Role::Member => "Member",
            Role::Viewer => "Viewer",
        }
    }

    pub fn is_platform(self) -> bool {
        matches!(self, Role::PlatformAdmin | Role::PlatformAuditor)
    }
}

/// Everything a caller can ask Berth to do. Reads are separate actions from writes so a
/// viewer, an auditor or a read-only token can be given exactly the reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Action {
    CatalogRead,
    CalendarRead,
    EnvironmentRead,
    EnvironmentLaunch,
    /// Stop, cancel, change the end of a booking.
    EnvironmentChange,
    /// Act inside a running environment as its owner: open its notebook, see or replace its
    /// endpoint's API key. Only the owner and their tenant admins: a viewer may watch an
    /// environment, and platform staff run the fleet, not their tenants' code.
    EnvironmentConnect,
    FleetRead,
    FleetManage,
    QuotaRead,
    QuotaManage,
    TenantRead,
    TenantManage,
    MemberRead,
    MemberManage,
    ProjectRead,
    ProjectManage,
    SsoRead,
    SsoManage,
    TokenRead,
    /// Create and revoke API tokens (one's own; a tenant admin also revokes the tenant's).
    TokenManage,
    AuditRead,
    /// See the SSH public keys people keep for their dedicated clusters' nodes.
    SshKeyRead,
    /// Add and remove them (adding needs a signed-in person, like making a token).
    SshKeyManage,
    /// See GPU-hours, cost and budgets (a member: their own and their projects').
    UsageRead,
    /// Set and remove monthly budgets (a tenant's own only for platform admins).
    UsageManage,
    /// Run health checks on a node: platform admins on any node (disruptive levels only
    /// on nodes nobody holds), tenant admins on nodes their tenant's dedicated cluster
    /// holds (the target is that tenant). Members and viewers never.
    FleetCheck,
    /// See volumes (a member: their own and their projects').
    VolumeRead,
    /// Create, resize and delete volumes (a member: their own personal volumes and their
    /// projects' shared ones).
    VolumeManage,
    /// See one's own notifications (the bell, `/notifications`) and channel choices.
    NotificationRead,
    /// Mark one's notifications read, choose one's channels.
    NotificationManage,
    /// See a tenant's webhooks and their delivery log (tenant admins, platform admins).
    WebhookRead,
    /// Add and remove a tenant's webhooks.
    WebhookManage,
    /// See the image catalog: the platform's entries, and one's tenant's.
    ImageRead,
    /// Add and remove catalog entries and choose defaults: the platform's (platform
    /// admins) or a tenant's (its tenant admins). A tenant's rule for custom images is
    /// the platform's to set (`tenant.manage`).
    ImageManage,
    /// Change the catalog's prices, the rate card: prices per GPU model and unit, the spot
    /// discount, tenants' discounts (platform admins only; reading them is `catalog.read`).
    CatalogManage,
    /// Read closed monthly statements: a tenant's bill, for its admins and viewers (not
    /// members, whose usage reach is their own) and platform staff.
    StatementRead,
}

impl Action {
    pub const ALL: [Action; 36] = [
        Action::CatalogRead,
        Action::CalendarRead,
        Action::EnvironmentRead,
        Action::EnvironmentLaunch,
        Action::EnvironmentChange,
        Action::EnvironmentConnect,
        Action::FleetRead,
        Action::FleetManage,
        Action::QuotaRead,
        Action::QuotaManage,
        Action::TenantRead,
        Action::TenantManage,
        Action::MemberRead,
        Action::MemberManage,
        Action::ProjectRead,
        Action::ProjectManage,
        Action::SsoRead,
        Action::SsoManage,
        Action::TokenRead,
        Action::TokenManage,
        Action::AuditRead,
        Action::SshKeyRead,
        Action::SshKeyManage,
        Action::UsageRead,
        Action::UsageManage,
        Action::FleetCheck,
        Action::VolumeRead,
        Action::VolumeManage,
        Action::NotificationRead,
        Action::NotificationManage,
        Action::WebhookRead,
        Action::WebhookManage,
        Action::ImageRead,
        Action::ImageManage,
        Action::CatalogManage,
        Action::StatementRead,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Action::CatalogRead => "catalog.read",
            Action::CalendarRead => "calendar.read",
            Action::EnvironmentRead => "environment.read",
            Action::EnvironmentLaunch => "environment.launch",
            Action::EnvironmentChange => "environment.change",
            Action::EnvironmentConnect => "environment.connect",
            Action::FleetRead => "fleet.read",
            Action::FleetManage => "fleet.manage",
            Action::QuotaRead => "quota.read",
            Action::QuotaManage => "quota.manage",
            Action::TenantRead => "tenant.read",
            Action::TenantManage => "tenant.manage",
            Action::MemberRead => "member.read",
            Action::MemberManage => "member.manage",
            Action::ProjectRead => "project.read",
            Action::ProjectManage => "project.manage",
            Action::SsoRead => "sso.read",
            Action::SsoManage => "sso.manage",
            Action::TokenRead => "token.read",
            Action::TokenManage => "token.manage",
            Action::AuditRead => "audit.read",
            Action::SshKeyRead => "ssh_key.read",
            Action::SshKeyManage => "ssh_key.manage",
            Action::UsageRead => "usage.read",
            Action::UsageManage => "usage.manage",
            Action::FleetCheck => "fleet.check",
            Action::VolumeRead => "volume.read",
            Action::VolumeManage => "volume.manage",
            Action::NotificationRead => "notification.read",
            Action::NotificationManage => "notification.manage",
            Action::WebhookRead => "webhook.read",
            Action::WebhookManage => "webhook.manage",
            Action::ImageRead => "image.read",
            Action::ImageManage => "image.manage",
            Action::CatalogManage => "catalog.manage",
            Action::StatementRead => "statement.read",
        }
    }

    pub fn parse(s: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.as_str() == s)
    }

    /// The read of the same kind of object (`environment.change` -> `environment.read`):
    /// whether someone may know the object exists at all.
    pub fn read(self) -> Action {
        let area = self.as_str().split('.').next().unwrap_or_default();
        Action::parse(&format!("{area}.read")).unwrap_or(self)
    }

    /// Changes nothing: what an auditor may do everywhere.
    pub fn is_read(self) -> bool {
        self.as_str().ends_with(".read")
    }
}

/// How far an allowed action reaches. Ordered: a wider reach includes the narrower.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reach {
    /// Only objects the caller owns.
    Own,
    /// Anything in the caller's tenant.
    Tenant,
    /// Anything anywhere.
    All,
}

/// The permission table: for each role, the actions it may take and how far they reach.
/// Anything not listed is denied.
pub fn reach(role: Role, action: Action) -> Option<Reach> {
    use Action::*;
    match role {
        Role::PlatformAdmin => match action {
            // Their own environments only: a tenant's notebook runs the tenant's code.
            EnvironmentConnect => Some(Reach::Own),
            _ => Some(Reach::All),
        },
        Role::PlatformAuditor => action.is_read().then_some(Reach::All),
        Role::TenantAdmin => match action {
            CatalogRead => Some(Reach::All),
            // Their tenant's projects' and members' quotas, not the tenant's own limits
            // (those are set on the platform: see `platform::quotas`).
            FleetRead | FleetManage | TenantManage | CatalogManage => None,
            // Nodes their tenant's dedicated cluster holds: the target is that tenant.
            FleetCheck => Some(Reach::Tenant),
            // One's own inbox, even as an admin.
            NotificationRead | NotificationManage => Some(Reach::Own),
            _ => Some(Reach::Tenant),
        },
        Role::Member => match action {
            CatalogRead => Some(Reach::All),
            CalendarRead | EnvironmentLaunch | ProjectRead | MemberRead | QuotaRead | ImageRead => Some(Reach::Tenant),
            EnvironmentRead | EnvironmentChange | EnvironmentConnect | TokenRead | TokenManage | SshKeyRead
            | SshKeyManage | NotificationRead | NotificationManage => Some(Reach::Own),
            // Their own and their projects' (see `platform::capacity::metering`).
            UsageRead => Some(Reach::Own),
            // Their own and their projects' (see `platform::capacity::volumes`).
            VolumeRead | VolumeManage => Some(Reach::Own),
            _ => None,
        },
        Role::Viewer => match action {
            CatalogRead => Some(Reach::All),
            CalendarRead | EnvironmentRead | ProjectRead | MemberRead | QuotaRead | UsageRead | VolumeRead
            | ImageRead | StatementRead => Some(Reach::Tenant),
            // A viewer's keys open nothing until the viewer may act in an environment.
            TokenRead | TokenManage | SshKeyRead | SshKeyManage | NotificationRead | NotificationManage => {
                Some(Reach::Own)
            }
            _ => None,
        },
    }
}

/// The one who asks: a signed-in user, or an API token acting for one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub user_id: i64,
    /// `None` for platform roles.
    pub tenant_id: Option<i64>,
    pub role: Role,
    /// The actions an API token was created with; `None` for a browser session.
    pub token_actions: Option<Vec<Action>>,
}

/// What an action is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Platform-wide things: the fleet, the list of tenants.
    Platform,
    /// A tenant's things as a whole: its members, projects, SSO connection.
    Tenant(i64),
    /// One object with an owner inside a tenant (an environment, a token). Objects of
    /// platform staff have no tenant.
    Owned { tenant_id: Option<i64>, owner_id: i64 },
}

/// Why an action was refused. An object outside the caller's reach must look exactly like
/// one that does not exist, so callers turn `OutOfReach` on an object into "not found".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// The role (or the token) does not include the action at all.
    NotPermitted,
    /// The action is permitted, but not on this target.
    OutOfReach,
}

impl Principal {
    /// How far `action` reaches for this principal, if at all.
    pub fn reach(&self, action: Action) -> Option<Reach> {
        if let Some(allowed) = &self.token_actions
            && !allowed.contains(&action)
        {
            return None;
        }
        reach(self.role, action)
    }

    /// The one decision. Deny by default.
    pub fn authorize(&self, action: Action, target: Target) -> Result<(), Denied> {
        let reach = self.reach(action).ok_or(Denied::NotPermitted)?;
        let within = match (reach, target) {
            (Reach::All, _) => true,
            (_, Target::Platform) => false,
            (Reach::Tenant, Target::Tenant(t)) => self.tenant_id == Some(t),
            (Reach::Tenant, Target::Owned { tenant_id, owner_id }) => {
                tenant_id == self.tenant_id && (tenant_id.is_some() || owner_id == self.user_id)
            }
            (Reach::Own, Target::Tenant(t)) => self.tenant_id == Some(t),
            (Reach::Own, Target::Owned { tenant_id, owner_id }) => {
                owner_id == self.user_id && tenant_id == self.tenant_id
            }
        };
        if within { Ok(()) } else { Err(Denied::OutOfReach) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(role: Role, tenant_id: Option<i64>) -> Principal {
        Principal { user_id: 10, tenant_id, role, token_actions: None }
    }

    #[test]
    fn names_round_trip() {
        for role in Role::ALL {
            assert_eq!(Role::parse(role.as_str()), Some(role));
        }
        for action in Action::ALL {
            assert_eq!(Action::parse(action.as_str()), Some(action));
        }
        assert_eq!(Role::parse("root"), None);
    }

    #[test]
    fn every_action_has_a_read_of_its_kind() {
        assert_eq!(Action::EnvironmentChange.read(), Action::EnvironmentRead);
        assert_eq!(Action::EnvironmentLaunch.read(), Action::EnvironmentRead);
        assert_eq!(Action::TokenManage.read(), Action::TokenRead);
        for action in Action::ALL {
            assert!(action.read().is_read(), "{action:?}");
        }
    }

    #[test]
    fn auditors_read_everything_and_change_nothing() {
        let auditor = principal(Role::PlatformAuditor, None);
        for action in Action::ALL {
            let decision = auditor.authorize(action, Target::Tenant(3));
            assert_eq!(decision.is_ok(), action.is_read(), "{action:?}");
        }
    }

    #[test]
    fn tenant_roles_stop_at_their_tenant() {
        for role in Role::TENANT {
            let p = principal(role, Some(1));
            for action in Action::ALL {
                let other = p.authorize(action, Target::Owned { tenant_id: Some(2), owner_id: 10 });
                if action != Action::CatalogRead {
                    assert!(other.is_err(), "{role:?} {action:?} reached another tenant");
                }
                assert!(p.authorize(action, Target::Platform).is_err() || action == Action::CatalogRead);
            }
        }
    }

    #[test]
    fn members_act_on_their_own_environments_only() {
        let member = principal(Role::Member, Some(1));
        let own = Target::Owned { tenant_id: Some(1), owner_id: 10 };
        let colleague = Target::Owned { tenant_id: Some(1), owner_id: 11 };
        assert_eq!(member.authorize(Action::EnvironmentChange, own), Ok(()));
        assert_eq!(member.authorize(Action::EnvironmentChange, colleague), Err(Denied::OutOfReach));
        assert_eq!(member.authorize(Action::EnvironmentLaunch, Target::Tenant(1)), Ok(()));
        assert_eq!(member.authorize(Action::MemberManage, Target::Tenant(1)), Err(Denied::NotPermitted));
    }

    #[test]
    fn viewers_see_their_tenant_and_change_nothing_in_it() {
        let viewer = principal(Role::Viewer, Some(1));
        let colleague = Target::Owned { tenant_id: Some(1), owner_id: 11 };
        assert_eq!(viewer.authorize(Action::EnvironmentRead, colleague), Ok(()));
        assert_eq!(viewer.authorize(Action::VolumeRead, colleague), Ok(()));
        for action in
            // Their own keys and their own inbox are theirs to change.
            Action::ALL.into_iter().filter(|a| {
                !a.is_read() && !matches!(a, Action::TokenManage | Action::SshKeyManage | Action::NotificationManage)
            })
        {
            assert!(viewer.authorize(action, Target::Tenant(1)).is_err(), "{action:?}");
            assert!(viewer.authorize(action, colleague).is_err(), "{action:?}");
        }
    }

    #[test]
    fn everyone_keeps_their_own_inbox_and_only_admins_keep_webhooks() {
        for role in Role::TENANT {
            let p = principal(role, Some(1));
            let own = Target::Owned { tenant_id: Some(1), owner_id: 10 };
            let colleague = Target::Owned { tenant_id: Some(1), owner_id: 11 };
            assert_eq!(p.authorize(Action::NotificationRead, own), Ok(()), "{role:?}");
            assert_eq!(p.authorize(Action::NotificationManage, own), Ok(()), "{role:?}");
            assert!(p.authorize(Action::NotificationRead, colleague).is_err(), "{role:?}");
            let webhooks = p.authorize(Action::WebhookManage, Target::Tenant(1));
            assert_eq!(webhooks.is_ok(), role == Role::TenantAdmin, "{role:?}");
            assert!(p.authorize(Action::WebhookRead, Target::Tenant(2)).is_err());
        }
    }

    #[test]
    fn tenant_admins_run_their_tenant_but_not_the_platform() {
        let admin = principal(Role::TenantAdmin, Some(1));
        assert_eq!(admin.authorize(Action::MemberManage, Target::Tenant(1)), Ok(()));
        assert_eq!(
            admin.authorize(Action::EnvironmentChange, Target::Owned { tenant_id: Some(1), owner_id: 99 }),
            Ok(())
        );
        assert_eq!(admin.authorize(Action::MemberManage, Target::Tenant(2)), Err(Denied::OutOfReach));
        assert_eq!(admin.authorize(Action::TenantManage, Target::Tenant(1)), Err(Denied::NotPermitted));
        assert_eq!(admin.authorize(Action::FleetManage, Target::Platform), Err(Denied::NotPermitted));
    }

    #[test]
    fn only_the_owner_and_their_tenant_admin_connect_to_an_environment() {
        let own = Target::Owned { tenant_id: Some(1), owner_id: 10 };
        let colleague = Target::Owned { tenant_id: Some(1), owner_id: 11 };
        let elsewhere = Target::Owned { tenant_id: Some(2), owner_id: 12 };
        let connect = |role, tenant, target| principal(role, tenant).authorize(Action::EnvironmentConnect, target);
        assert_eq!(connect(Role::Member, Some(1), own), Ok(()));
        assert_eq!(connect(Role::Member, Some(1), colleague), Err(Denied::OutOfReach));
        assert_eq!(connect(Role::TenantAdmin, Some(1), colleague), Ok(()));
        assert_eq!(connect(Role::TenantAdmin, Some(1), elsewhere), Err(Denied::OutOfReach));
        assert_eq!(connect(Role::Viewer, Some(1), colleague), Err(Denied::NotPermitted));
        assert_eq!(connect(Role::PlatformAuditor, None, colleague), Err(Denied::NotPermitted));
        assert_eq!(connect(Role::PlatformAdmin, None, colleague), Err(Denied::OutOfReach));
        // Platform staff's own environments belong to no tenant.
        let staff_own = Target::Owned { tenant_id: None, owner_id: 10 };
        assert_eq!(connect(Role::PlatformAdmin, None, staff_own), Ok(()));
        assert_eq!(Action::EnvironmentConnect.read(), Action::EnvironmentRead);
    }

    #[test]
    fn a_token_narrows_its_owner() {
        let mut admin = principal(Role::PlatformAdmin, None);
        admin.token_actions = Some(vec![Action::EnvironmentRead]);
        assert_eq!(admin.authorize(Action::EnvironmentRead, Target::Tenant(4)), Ok(()));
        assert_eq!(admin.authorize(Action::EnvironmentLaunch, Target::Tenant(4)), Err(Denied::NotPermitted));
        // A token can never add what the role lacks.
        let mut viewer = principal(Role::Viewer, Some(1));
        viewer.token_actions = Some(vec![Action::EnvironmentLaunch]);
        assert_eq!(viewer.authorize(Action::EnvironmentLaunch, Target::Tenant(1)), Err(Denied::NotPermitted));
    }
}
