//! The authorization matrix: every server function and every route of the router (the API,
//! the browser routes, an environment's origin), called as each role of `Role::ALL` on their
//! own tenant's object, another tenant's object and an id that does not exist.
//!
//! The table below says only which `Action` a route needs and what it acts on; whether a
//! call may succeed is asked of `berth_domain::policy` itself. The test fails on a route
//! the table does not list (server_fn's registry and `crate::served` say what is served),
//! on any success the policy does not allow (or a refusal it does
//! not call for), on a denial that left no audit row, on another tenant's object answering
//! differently from a missing one, on tenant B's data showing up in anything tenant A's
//! people can read, and on anything but 401 for a caller with no session and no token.

use std::collections::{BTreeSet, HashMap};

use berth_app::error::AppError;
use berth_domain::policy::{Action, Principal, Role, Target};
use berth_domain::tenancy::Isolation;
use berth_platform::people::User;
use http::{Method, StatusCode};

use super::{Berth, Reply, encode, in_hours};

/// How a route is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Via {
    /// A server function, with the browser session's cookie.
    ServerFn,
    /// A server function that starts or ends the session itself; the session tests call it.
    SessionFn,
    /// The JSON API, with the user's bearer token.
    Api(Method),
    /// A plain browser GET with the session cookie.
    Page,
    /// "Open JupyterLab" on the portal, with the session cookie: a redirect to the
    /// environment's own origin carrying a ticket.
    Open,
    /// Berth's proxy on an environment's own origin, signed in there the way a browser is:
    /// the portal's open route, then its ticket redeemed. The test environments are not
    /// ready, so a caller who may open one is told so (503).
    Proxy,
    /// The JSON API for `berth agent`, with a node token: every person's token is refused.
    NodeAgent(Method),
    /// A plain browser GET, with the session cookie, that sends anyone on elsewhere: to the
    /// identity provider or back to sign-in, to the open route.
    Redirect,
    /// A Leptos page, with the session cookie: rendered for anyone (signed out, it offers
    /// sign-in). What it shows comes from the server functions this table checks, so a page
    /// is held only to never failing (5xx) and never showing another tenant's things, for
    /// whatever object its path names.
    Shell,
}

/// What a route's action is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Aim {
    /// The caller's tenant as a whole (the platform for platform staff).
    CallersTenant,
    /// The caller's own things (their tokens).
    CallersOwn,
    /// The fleet, quotas: platform-wide.
    Platform,
    /// A maintenance window by id: a platform object.
    Maintenance,
    /// An environment by id, owned by a member of a tenant.
    Environment,
    /// A tenant by id.
    Tenant,
    /// An API token by id, owned by a member of a tenant.
    Token,
    /// A node token by id: a platform object.
    NodeToken,
    /// An SSH key by id, owned by a member of a tenant.
    SshKey,
    /// A volume by id: the home volume of a tenant's member, attached to their
    /// environment (so that a delete the policy allows is refused as attached, 422).
    Volume,
    /// A node by name that nobody holds: a platform object (tenant admins' checks on nodes
    /// their dedicated cluster holds are in `platform/tests/node_health.rs`).
    Node,
}

/// Whose object a call names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Case {
    /// The caller's own tenant's (tenant A's for platform staff), or no object at all.
    OwnTenant,
    OtherTenant,
    Missing,
}

impl Aim {
    fn cases(self) -> &'static [Case] {
        match self {
            Aim::CallersTenant | Aim::CallersOwn | Aim::Platform => &[Case::OwnTenant],
            Aim::Maintenance | Aim::NodeToken | Aim::Node => &[Case::OwnTenant, Case::Missing],
            Aim::Environment | Aim::Tenant | Aim::Token | Aim::SshKey | Aim::Volume => {
                &[Case::OwnTenant, Case::OtherTenant, Case::Missing]
            }
        }
    }
}

struct Route {
    via: Via,
    path: &'static str,
    /// The action the route needs and what it is about; `None` for what anyone may call.
    needs: Option<(Action, Aim)>,
    /// Form (server functions) or JSON (API); `{id}`, `{owner}`, `{n}`, `{end}`, `{later}`
    /// and `{later_end}` are filled in, and in the path `{slug}`, `{offering}`, `{user}` (the
    /// owner, or a missing user), `{project}` and `{webhook}` (missing ones) and `{*rest}` too.
    body: &'static str,
    /// The body names a member or project that never exists: a call the policy allows
    /// answers 404 after the access check.
    names_missing: bool,
}

const LAUNCH_FORM: &str =
    "request[offering]=notebook&request[size]=h100-1g.10gb&request[name]=browser-{n}&request[hours]=2";
/// An SSH key anyone may add once (a person's token may not: the matrix calls server
/// functions with the session).
const ADD_KEY_FORM: &str = "name=matrix-{n}&public_key=ssh-ed25519+AAAAC3NzaC1lZDI1NTE5AAAAIKzNtyR4cmJGDog7LEjOcX9o3mjUze%2BWPw53Rf%2BR08s7+ada%40laptop";
/// The spare keys of tenant A's and tenant B's members.
const SPARE_KEYS: [&str; 2] = [
    "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBM3LPjfmplX56nT4Pq0/ydNnPEtHzpGtNw/E8x2ug+Y9TAbEkQa9mMzvCcpz1JpaTSxlpgJICzFwO9o6AWHNsO0= a",
    "ecdsa-sha2-nistp384 AAAAE2VjZHNhLXNoYTItbmlzdHAzODQAAAAIbmlzdHAzODQAAABhBPfdhckwhfmmLKpinKRtRJcMOkYJukx8SOkpFzuPiXSJjO8M0C0/6OgwuWxVuQ0whsp6UNhN14Mnzsy9cprsTarg2AXPvlhZ9DXJdp3PfKX+sKfv1lwiZPXqfUHM7YpUTQ== b",
];

/// A catalog entry each allowed call adds anew.
const ADD_IMAGE_FORM: &str = "tenant=&image[name]=matrix-{n}&image[offerings][0]=training\
     &image[reference]=ghcr.io%2Fmatrix%2Fimage-{n}%40sha256%3A0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// The same through the API: the caller's own catalog (the platform's for staff).
const ADD_IMAGE_JSON: &str = r#"{"name": "api-{n}", "offerings": ["training"],
    "reference": "ghcr.io/matrix/api-{n}@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}"#;

const LAUNCH_JSON: &str = r#"{"offering": "notebook", "size": "h100-1g.10gb", "name": "api-{n}", "hours": "2"}"#;

/// Every route. Reads come first and moving an end before stopping, so that allowed
/// calls find their object in a state where they can succeed.
fn routes() -> Vec<Route> {
    use Action::*;
    use Method as M;
    let sf = |path, needs, body| Route { via: Via::ServerFn, path, needs, body, names_missing: false };
    let sf_missing = |path, needs, body| Route { via: Via::ServerFn, path, needs, body, names_missing: true };
    let api = |method, path, needs, body| Route { via: Via::Api(method), path, needs, body, names_missing: false };
    let api_missing =
        |method, path, needs, body| Route { via: Via::Api(method), path, needs, body, names_missing: true };
    // The session tests call these; the bodies are for the malformed-arguments test.
    let session = |path, body| Route { via: Via::SessionFn, path, needs: None, body, names_missing: false };
    let redirect = |path| Route { via: Via::Redirect, path, needs: None, body: "", names_missing: false };
    let tenant = |action| Some((action, Aim::Tenant));
    let environment = Some((EnvironmentRead, Aim::Environment));
    let change = Some((EnvironmentChange, Aim::Environment));
    let launch = Some((EnvironmentLaunch, Aim::CallersTenant));
    let connect = Some((EnvironmentConnect, Aim::Environment));
    let proxy = |path| Route { via: Via::Proxy, path, needs: connect, body: "", names_missing: false };
    let open = |path| Route { via: Via::Open, path, needs: connect, body: "", names_missing: false };
    let anyone = |path| Route { via: Via::Page, path, needs: None, body: "", names_missing: false };
    // A page's `needs` only names what its path is about; no answer is judged by it.
    let page = |path, about: Option<Aim>| Route {
        via: Via::Shell,
        path,
        needs: about.map(|aim| (EnvironmentRead, aim)),
        body: "",
        names_missing: false,
    };
    vec![
        anyone("/healthz"),
        anyone("/readyz"),
        anyone("/api/v1/openapi.json"),
        anyone("/api/docs"),
        page("/", None),
        page("/catalog", None),
        page("/launch/{offering}", None),
        page("/environments", None),
        page("/environments/{id}", Some(Aim::Environment)),
        page("/calendar", None),
        page("/account", None),
        page("/audit", None),
        page("/admin/fleet", None),
        page("/admin/nodes/{id}", Some(Aim::Node)),
        page("/admin/fabric", None),
        page("/admin/quotas", None),
        page("/idle-policies", None),
        page("/prices", None),
        page("/usage/statements", None),
        page("/usage/statements/{id}", None),
        page("/admin/prices", None),
        page("/usage", None),
        page("/admin/tenants", None),
        page("/tenants/{id}", Some(Aim::Tenant)),
        page("/tenants/{id}/webhooks", Some(Aim::Tenant)),
        page("/notifications", None),
        page("/login", None),
        page("/login/code", None),
        page("/login/password", None),
        session("/api/sign_in", "email=nobody%40example.com&password=wrong&next=%2F"),
        session("/api/sign_out", ""),
        session("/api/second_factor", ""),
        session("/api/verify_code", "code=000000&next=%2F"),
        // A person's own credentials, outside the role table: the store tests check who
        // may (the holder of the password; another platform admin for an authenticator).
        session("/api/choose_password", "password=a+long+enough+one&again=a+long+enough+one&next=%2F"),
        session("/api/change_password", "current=wrong&password=a+long+enough+one&again=a+long+enough+one"),
        session("/api/reset_second_factor", "email=nobody%40example.com"),
        // Before `save_sso` gives tenant A a provider this one would try to reach.
        redirect(berth_app::SSO_FIND_PATH),
        redirect("/auth/oidc/{slug}/start"),
        redirect(berth_platform::identity::sso::CALLBACK_PATH),
        redirect("/env/{id}"),
        redirect("/env/{id}/{*rest}"),
        sf("/api/current_user", None, ""),
        sf("/api/notification_bell", None, ""),
        sf("/api/sign_in_options", None, ""),
        sf("/api/fleet_capacity", None, ""),
        sf("/api/size_prices", None, ""),
        sf("/api/size_hints", None, "offering=notebook&hours=2&start=&project="),
        // What a refused plain form post typed, from the caller's own session (none signed out).
        sf("/api/launch_draft", None, "offering=notebook"),
        api(M::GET, "/api/v1/me", None, ""),
        // The catalog and its availability are public on the portal too (`size_hints`); with
        // no offering, a caller is told so (422).
        api(M::GET, "/api/v1/catalog", None, ""),
        api(M::GET, "/api/v1/availability", None, ""),
        sf("/api/environments_listing", Some((EnvironmentRead, Aim::CallersTenant)), ""),
        // The platform checks environment.read here (the caller's bookings); every role
        // that has calendar.read has that too.
        sf("/api/calendar", Some((CalendarRead, Aim::CallersTenant)), "view=week&from="),
        api(M::GET, "/api/v1/environments", Some((EnvironmentRead, Aim::CallersTenant)), ""),
        sf("/api/environment", environment, "id={id}"),
        sf("/api/environment_gpu_use", environment, "id={id}"),
        sf("/api/idle_policies", Some((QuotaRead, Aim::CallersTenant)), ""),
        sf("/api/rate_card_page", Some((CatalogRead, Aim::Platform)), ""),
        // The price and the discount they had: the other routes' calls cost the same.
        sf("/api/set_price", Some((CatalogManage, Aim::Platform)), "line=H100-80GB%2Fgpu&price=3.20&effective="),
        sf("/api/set_discount", Some((CatalogManage, Aim::Platform)), "tenant=&percent=0&effective="),
        sf_missing("/api/withdraw_price_change", Some((CatalogManage, Aim::Platform)), "kind=price&id=999999"),
        sf("/api/gpu_efficiency", Some((UsageRead, Aim::CallersTenant)), ""),
        sf(
            "/api/set_idle_policy",
            Some((QuotaManage, Aim::Platform)),
            "tenant=&offering=notebook&below_pct=5&idle_for=1h&grace=15m&max_keeps=",
        ),
        api(M::GET, "/api/v1/idle-policies", Some((QuotaRead, Aim::CallersTenant)), ""),
        // The same policy as the platform's above: a tenant's may equal it.
        api(
            M::PUT,
            "/api/v1/tenants/{id}/idle-policies/{offering}",
            tenant(QuotaManage),
            r#"{"below_pct": 5, "idle_for": "1h", "grace": "15m"}"#,
        ),
        api(M::DELETE, "/api/v1/tenants/{id}/idle-policies/{offering}", tenant(QuotaManage), ""),
        api(
            M::PUT,
            "/api/v1/idle-policies/{offering}",
            Some((QuotaManage, Aim::Platform)),
            r#"{"below_pct": "5%", "idle_for": "1h", "grace": "15m", "max_keeps": 2}"#,
        ),
        api(M::DELETE, "/api/v1/idle-policies/{offering}", Some((QuotaManage, Aim::Platform)), ""),
        api(M::GET, "/api/v1/environments/{id}/idle", environment, ""),
        api(M::GET, "/api/v1/environments/{id}/gpu-use", environment, ""),
        // The matrix's environment is a notebook: a caller the policy allows is told it has
        // no job log (422).
        Route {
            via: Via::Page,
            path: "/environments/{id}/log.txt",
            needs: environment,
            body: "",
            names_missing: false,
        },
        api(M::GET, "/api/v1/environments/{id}", environment, ""),
        // A notebook: a caller the policy allows is told it has no job log (422).
        api(M::GET, "/api/v1/environments/{id}/logs", environment, ""),
        api(M::GET, "/api/v1/tenants", Some((TenantRead, Aim::CallersTenant)), ""),
        api(M::GET, "/api/v1/tenants/{id}/members", Some((MemberRead, Aim::Tenant)), ""),
        api(M::GET, "/api/v1/tokens", Some((TokenRead, Aim::CallersOwn)), ""),
        sf("/api/notifications", Some((NotificationRead, Aim::CallersOwn)), ""),
        api(M::GET, "/api/v1/notifications", Some((NotificationRead, Aim::CallersOwn)), ""),
        sf("/api/notification_settings", Some((NotificationRead, Aim::CallersOwn)), ""),
        sf("/api/tenant_webhooks", tenant(WebhookRead), "tenant_id={id}"),
        api(M::GET, "/api/v1/audit", Some((AuditRead, Aim::CallersTenant)), ""),
        Route {
            via: Via::Page,
            path: "/audit.csv",
            needs: Some((AuditRead, Aim::CallersTenant)),
            body: "",
            names_missing: false,
        },
        Route {
            via: Via::Page,
            path: "/usage.csv",
            needs: Some((UsageRead, Aim::CallersTenant)),
            body: "",
            names_missing: false,
        },
        Route {
            via: Via::Page,
            path: "/usage.json",
            needs: Some((UsageRead, Aim::CallersTenant)),
            body: "",
            names_missing: false,
        },
        sf("/api/usage_page", Some((UsageRead, Aim::CallersTenant)), "month=&by=project&tenant=&per="),
        sf("/api/statements", Some((StatementRead, Aim::CallersTenant)), ""),
        sf_missing("/api/statement", Some((StatementRead, Aim::CallersTenant)), "id=999999"),
        api(M::GET, "/api/v1/statements", Some((StatementRead, Aim::CallersTenant)), ""),
        api_missing(M::GET, "/api/v1/statements/{id}", Some((StatementRead, Aim::CallersTenant)), ""),
        Route {
            via: Via::Page,
            path: "/usage/statements/{id}/csv",
            needs: Some((StatementRead, Aim::CallersTenant)),
            body: "",
            names_missing: true,
        },
        api(M::GET, "/api/v1/usage", Some((UsageRead, Aim::CallersTenant)), ""),
        sf("/api/audit_log", Some((AuditRead, Aim::CallersTenant)), "tenant=&actor=&action=&outcome=&before="),
        sf("/api/account", Some((TokenRead, Aim::CallersOwn)), ""),
        sf("/api/tenants_overview", Some((TenantRead, Aim::CallersTenant)), ""),
        sf("/api/tenant_detail", tenant(MemberRead), "id={id}"),
        sf("/api/fleet_page", Some((FleetRead, Aim::Platform)), "from=&days=7&site=&search=&page="),
        sf("/api/fabric_overview", Some((FleetRead, Aim::Platform)), ""),
        sf("/api/quotas", Some((QuotaRead, Aim::CallersTenant)), ""),
        // Where one may book: a role that may not launch is answered no projects, not denied
        // (the launch page asks on every visit; looking is not trying).
        sf("/api/bookable_projects", Some((EnvironmentRead, Aim::CallersTenant)), ""),
        page("/volumes", None),
        page("/images", None),
        page("/admin/images", None),
        sf("/api/images", Some((ImageRead, Aim::CallersTenant)), ""),
        api(M::GET, "/api/v1/images", Some((ImageRead, Aim::CallersTenant)), ""),
        sf("/api/launch_images", Some((ImageRead, Aim::CallersTenant)), "offering=training"),
        // Empty `tenant`: the caller's own catalog (the platform's for staff).
        sf("/api/add_image", Some((ImageManage, Aim::CallersTenant)), ADD_IMAGE_FORM),
        sf_missing("/api/set_default_image", Some((ImageManage, Aim::CallersTenant)), "id=999999&offering=training"),
        sf_missing("/api/remove_image", Some((ImageManage, Aim::CallersTenant)), "id=999999"),
        sf("/api/set_custom_images", tenant(TenantManage), "tenant_id={id}&mode=any&registries="),
        api(M::POST, "/api/v1/images", Some((ImageManage, Aim::CallersTenant)), ADD_IMAGE_JSON),
        api_missing(M::PUT, "/api/v1/images/{id}/defaults/{offering}", Some((ImageManage, Aim::CallersTenant)), ""),
        api_missing(M::DELETE, "/api/v1/images/{id}", Some((ImageManage, Aim::CallersTenant)), ""),
        api(M::PUT, "/api/v1/tenants/{id}/custom-images", tenant(TenantManage), r#"{"rule": "any"}"#),
        sf("/api/volumes", Some((VolumeRead, Aim::CallersTenant)), ""),
        api(M::GET, "/api/v1/volumes", Some((VolumeRead, Aim::CallersTenant)), ""),
        api(M::GET, "/api/v1/volumes/{id}", Some((VolumeRead, Aim::Volume)), ""),
        sf("/api/attachable_volumes", Some((EnvironmentRead, Aim::CallersTenant)), ""),
        sf("/api/create_volume", Some((VolumeManage, Aim::CallersTenant)), "name=matrix-{n}&size_gib=1&project="),
        api(
            M::POST,
            "/api/v1/volumes",
            Some((VolumeManage, Aim::CallersTenant)),
            r#"{"name": "api-{n}", "size_gib": 1}"#,
        ),
        // `1{n}` grows with every call: each allowed resize grows the volume.
        sf("/api/resize_volume", Some((VolumeManage, Aim::Volume)), "id={id}&size_gib=1{n}"),
        api(M::PATCH, "/api/v1/volumes/{id}", Some((VolumeManage, Aim::Volume)), r#"{"size_gib": "1{n}"}"#),
        // Attached to its environment: an allowed delete is refused (422) and keeps it.
        sf("/api/delete_volume", Some((VolumeManage, Aim::Volume)), "id={id}"),
        api(M::DELETE, "/api/v1/volumes/{id}", Some((VolumeManage, Aim::Volume)), ""),
        sf("/api/storage_quotas", Some((QuotaRead, Aim::CallersTenant)), ""),
        // A tenant's storage limit is the platform's to set.
        sf(
            "/api/set_storage_quota",
            Some((QuotaManage, Aim::Platform)),
            "level=tenant&who=tenant-a&max_gib=&home_gib=",
        ),
        sf("/api/change_end", change, "id={id}&end={end}"),
        api(M::POST, "/api/v1/environments/{id}/end", change, r#"{"ends_at": "{end}"}"#),
        sf("/api/set_replicas", change, "id={id}&replicas=2"),
        sf("/api/reveal_api_key", connect, "id={id}"),
        sf("/api/replace_api_key", connect, "id={id}"),
        // A notebook: a caller the policy allows is told it has no replicas or key (422).
        api(M::GET, "/api/v1/environments/{id}/endpoint", environment, ""),
        api(M::GET, "/api/v1/environments/{id}/node-replacements", environment, ""),
        api(M::PUT, "/api/v1/environments/{id}/replicas", change, r#"{"replicas": 2}"#),
        api(M::POST, "/api/v1/environments/{id}/api-key", connect, ""),
        api(M::POST, "/api/v1/environments/{id}/api-key/replace", connect, ""),
        open("/environments/{id}/open"),
        proxy("/"),
        proxy("/{*rest}"),
        sf("/api/keep_environment", change, "id={id}"),
        // Not ready yet: a caller the policy allows is told it cannot be kept (422).
        api(M::POST, "/api/v1/environments/{id}/keep", change, ""),
        sf("/api/stop_environment", change, "id={id}"),
        api(M::POST, "/api/v1/environments/{id}/stop", change, ""),
        sf("/api/launch", launch, LAUNCH_FORM),
        api(M::POST, "/api/v1/environments", launch, LAUNCH_JSON),
        api(M::POST, "/api/v1/tokens/{id}/revoke", Some((TokenManage, Aim::Token)), ""),
        sf("/api/revoke_token", Some((TokenManage, Aim::Token)), "id={id}"),
        sf("/api/revoke_tenant_token", Some((TokenManage, Aim::Token)), "tenant_id=0&id={id}"),
        sf("/api/create_token", Some((TokenManage, Aim::CallersOwn)), "name=matrix-{n}&days=30"),
        api(M::GET, "/api/v1/ssh-keys", Some((SshKeyRead, Aim::CallersOwn)), ""),
        sf("/api/remove_ssh_key", Some((SshKeyManage, Aim::SshKey)), "id={id}"),
        api(M::DELETE, "/api/v1/ssh-keys/{id}", Some((SshKeyManage, Aim::SshKey)), ""),
        sf("/api/add_ssh_key", Some((SshKeyManage, Aim::CallersOwn)), ADD_KEY_FORM),
        sf("/api/invite_member", tenant(MemberManage), "tenant_id={id}&email=invitee-{n}%40example.com&role=viewer"),
        sf("/api/change_member_role", tenant(MemberManage), "tenant_id={id}&user_id={owner}&role=member"),
        sf_missing("/api/remove_member", tenant(MemberManage), "tenant_id={id}&user_id=999999"),
        api(M::GET, "/api/v1/tenants/{id}/projects", tenant(ProjectRead), ""),
        api(M::POST, "/api/v1/tenants/{id}/projects", tenant(ProjectManage), r#"{"name": "api-project-{n}"}"#),
        api_missing(
            M::POST,
            "/api/v1/tenants/{id}/projects/{project}/members",
            tenant(ProjectManage),
            r#"{"email": "nobody@example.com"}"#,
        ),
        api(
            M::POST,
            "/api/v1/tenants/{id}/members",
            tenant(MemberManage),
            r#"{"email": "api-invitee-{n}@example.com", "role": "viewer"}"#,
        ),
        api(M::PATCH, "/api/v1/tenants/{id}/members/{user}", tenant(MemberManage), r#"{"role": "member"}"#),
        api_missing(M::DELETE, "/api/v1/tenants/{id}/members/{user}", tenant(MemberManage), ""),
        sf("/api/create_project", tenant(ProjectManage), "tenant_id={id}&name=project-{n}"),
        sf_missing(
            "/api/add_project_member",
            tenant(ProjectManage),
            "tenant_id={id}&project_id=999999&email=nobody%40example.com",
        ),
        sf(
            "/api/save_sso",
            tenant(SsoManage),
            "tenant_id={id}&display_name=Corp&issuer=https%3A%2F%2Fidp.example.com&client_id=berth&client_secret=s\
             &groups_claim=groups&allowed_domains=&group_roles=ml+%3D+member&enabled=yes",
        ),
        sf("/api/set_tenant_isolation", tenant(TenantManage), "id={id}&isolation=soft"),
        sf("/api/change_tenant", tenant(TenantManage), "id={id}&change=resume"),
        api(M::PATCH, "/api/v1/tenants/{id}", tenant(TenantManage), r#"{"status": "active", "isolation": null}"#),
        // Deleting names a tenant nothing has: the matrix's tenants stay for the other routes.
        api_missing(M::DELETE, "/api/v1/tenants/{id}", Some((TenantManage, Aim::Platform)), ""),
        api(
            M::POST,
            "/api/v1/tenants",
            Some((TenantManage, Aim::Platform)),
            r#"{"slug": "api-t-{n}", "name": "API tenant {n}", "isolation": "soft"}"#,
        ),
        sf(
            "/api/create_tenant",
            Some((TenantManage, Aim::Platform)),
            "slug=t-{n}&name=T+{n}&isolation=soft&first_admin=",
        ),
        sf(
            "/api/schedule_maintenance",
            Some((FleetManage, Aim::Platform)),
            "node=l40s-01&gpu=&start={later}&end={later_end}&reason=matrix",
        ),
        api(
            M::POST,
            "/api/v1/maintenance",
            Some((FleetManage, Aim::Platform)),
            r#"{"node": "l40s-01", "start": "{later}", "end": "{later_end}", "reason": "matrix"}"#,
        ),
        sf("/api/set_gpu_health", Some((FleetManage, Aim::Platform)), "node=l40s-01&gpu=1&health=healthy&note="),
        api(
            M::PUT,
            "/api/v1/nodes/{id}/gpus/{gpu}/health",
            Some((FleetManage, Aim::Node)),
            r#"{"health": "healthy", "note": ""}"#,
        ),
        // No tenant 999999: a call the policy allows answers 404 after the access check.
        sf_missing(
            "/api/set_port_guids",
            Some((FleetManage, Aim::Platform)),
            "tenant_id=999999&guids=0x0002c9030001e3f1",
        ),
        sf("/api/cancel_maintenance", Some((FleetManage, Aim::Maintenance)), "id={id}"),
        // After `cancel_maintenance` above: the window is cancelled already, so a caller the
        // policy allows is told it is not found (404).
        api_missing(M::DELETE, "/api/v1/maintenance/{id}", Some((FleetManage, Aim::Maintenance)), ""),
        api(M::GET, "/api/v1/nodes", Some((FleetRead, Aim::Platform)), ""),
        sf("/api/create_node_token", Some((FleetManage, Aim::Platform)), "node=l40s-01"),
        sf("/api/revoke_node_token", Some((FleetManage, Aim::NodeToken)), "id={id}"),
        sf("/api/node_health", Some((FleetRead, Aim::Node)), "node={id}"),
        api(M::GET, "/api/v1/nodes/{id}/health", Some((FleetRead, Aim::Node)), ""),
        // This Berth runs no backend: a check the policy allows is refused (422) after the
        // access check, and writes nothing.
        sf("/api/run_node_checks", Some((FleetCheck, Aim::Node)), "node={id}&level=quick"),
        api(M::POST, "/api/v1/nodes/{id}/checks", Some((FleetCheck, Aim::Node)), r#"{"level": "quick"}"#),
        // An available node cannot return to service: allowed calls are refused by the
        // lifecycle (422), so the node stays as the other rows expect it.
        sf("/api/change_node_state", Some((FleetManage, Aim::Node)), "node={id}&event=return_to_service&reason=matrix"),
        api(
            M::POST,
            "/api/v1/nodes/{id}/state",
            Some((FleetManage, Aim::Node)),
            r#"{"event": "return_to_service", "reason": "matrix"}"#,
        ),
        // No backend here either: a reset the policy allows is refused (422) after the access
        // check, and writes nothing.
        sf("/api/reset_gpu", Some((FleetManage, Aim::Node)), "node={id}&gpu={gpu}"),
        api(M::POST, "/api/v1/nodes/{id}/gpus/{gpu}/reset", Some((FleetManage, Aim::Node)), ""),
        api(M::POST, "/api/v1/nodes/{id}/tokens", Some((FleetManage, Aim::Node)), ""),
        api(M::DELETE, "/api/v1/node-tokens/{id}", Some((FleetManage, Aim::NodeToken)), ""),
        Route {
            via: Via::NodeAgent(M::POST),
            path: "/api/v1/agent/report",
            needs: None,
            body: r#"{"agent_version": "matrix", "gpus": []}"#,
            names_missing: false,
        },
        Route { via: Via::NodeAgent(M::GET), path: "/api/v1/agent/plan", needs: None, body: "", names_missing: false },
        Route {
            via: Via::NodeAgent(M::POST),
            path: "/api/v1/agent/plan",
            needs: None,
            body: r#"{"generation": 0}"#,
            names_missing: false,
        },
        Route {
            via: Via::NodeAgent(M::GET),
            path: "/api/v1/agent/checks",
            needs: None,
            body: "",
            names_missing: false,
        },
        Route {
            via: Via::NodeAgent(M::POST),
            path: "/api/v1/agent/checks/{id}",
            needs: None,
            body: r#"{"output": "matrix"}"#,
            names_missing: true,
        },
        sf(
            "/api/set_quota",
            Some((QuotaManage, Aim::Platform)),
            "level=everyone&who=&max_gpus=&by_model=&gpu_hours_per_month=&max_booking_hours=&max_overlapping=",
        ),
        sf_missing("/api/remove_quota", Some((QuotaManage, Aim::CallersTenant)), "id=999999"),
        api(M::GET, "/api/v1/prices", Some((CatalogRead, Aim::Platform)), ""),
        // The price and the discount they had: the other routes' calls cost the same.
        api(
            M::POST,
            "/api/v1/prices",
            Some((CatalogManage, Aim::Platform)),
            r#"{"line": "H100-80GB/gpu", "price": "3.20"}"#,
        ),
        api(M::POST, "/api/v1/discounts", Some((CatalogManage, Aim::Platform)), r#"{"percent": "0"}"#),
        api_missing(M::DELETE, "/api/v1/prices/{id}", Some((CatalogManage, Aim::Platform)), ""),
        api_missing(M::DELETE, "/api/v1/discounts/{id}", Some((CatalogManage, Aim::Platform)), ""),
        api(M::GET, "/api/v1/quotas", Some((QuotaRead, Aim::CallersTenant)), ""),
        api(M::PUT, "/api/v1/quotas", Some((QuotaManage, Aim::Platform)), r#"{"level": "everyone", "who": ""}"#),
        api_missing(M::DELETE, "/api/v1/quotas/{id}", Some((QuotaManage, Aim::CallersTenant)), ""),
        api(M::GET, "/api/v1/budgets", Some((UsageRead, Aim::CallersTenant)), ""),
        // No project of that name: a caller the policy allows is told so (422).
        api(
            M::PUT,
            "/api/v1/budgets",
            Some((UsageManage, Aim::CallersTenant)),
            r#"{"level": "project", "who": "matrix-{n}", "amount": 100}"#,
        ),
        api_missing(M::DELETE, "/api/v1/budgets/{id}", Some((UsageManage, Aim::CallersTenant)), ""),
        // No project of that name: a caller the policy allows is told so (422).
        sf("/api/set_budget", Some((UsageManage, Aim::CallersTenant)), "level=project&who=matrix-{n}&amount=100"),
        sf_missing("/api/remove_budget", Some((UsageManage, Aim::CallersTenant)), "id=999999"),
        sf("/api/mark_notifications_read", Some((NotificationManage, Aim::CallersOwn)), ""),
        api(M::POST, "/api/v1/notifications/read", Some((NotificationManage, Aim::CallersOwn)), "{}"),
        sf(
            "/api/save_notification_settings",
            Some((NotificationManage, Aim::CallersOwn)),
            "in_app[]=environment.ready&email[]=environment.failed",
        ),
        sf(
            "/api/add_webhook",
            tenant(WebhookManage),
            "tenant_id={id}&url=https%3A%2F%2Fhooks.example.com%2F{n}&format=json&kinds[]=environment.ready",
        ),
        // No webhook 999999: a call the policy allows answers 404 after the access check.
        sf_missing("/api/remove_webhook", tenant(WebhookManage), "tenant_id={id}&id=999999"),
        api(M::GET, "/api/v1/notification-settings", Some((NotificationRead, Aim::CallersOwn)), ""),
        api(
            M::PUT,
            "/api/v1/notification-settings",
            Some((NotificationManage, Aim::CallersOwn)),
            r#"{"in_app": ["environment.ready"], "email": ["environment.failed"]}"#,
        ),
        api(M::GET, "/api/v1/tenants/{id}/webhooks", tenant(WebhookRead), ""),
        api(
            M::POST,
            "/api/v1/tenants/{id}/webhooks",
            tenant(WebhookManage),
            r#"{"url": "https://hooks.example.com/api-{n}", "format": "json", "kinds": ["environment.ready"]}"#,
        ),
        api_missing(M::DELETE, "/api/v1/tenants/{id}/webhooks/{webhook}", tenant(WebhookManage), ""),
        api(M::GET, "/api/v1/tenants/{id}/sso", tenant(SsoRead), ""),
        api(
            M::PUT,
            "/api/v1/tenants/{id}/sso",
            tenant(SsoManage),
            r#"{"display_name": "Corp", "issuer": "https://idp.example.com", "client_id": "berth",
                "client_secret": "s", "group_roles": {"ml": "member"}}"#,
        ),
        api(M::GET, "/api/v1/tenants/{id}/tokens", tenant(TokenRead), ""),
        api(M::GET, "/api/v1/storage-quotas", Some((QuotaRead, Aim::CallersTenant)), ""),
        // A tenant's storage limit is the platform's to set.
        api(
            M::PUT,
            "/api/v1/storage-quotas",
            Some((QuotaManage, Aim::Platform)),
            r#"{"level": "tenant", "who": "tenant-a", "max_gib": null}"#,
        ),
        api(M::GET, "/api/v1/fabric", Some((FleetRead, Aim::Platform)), ""),
        api(M::GET, "/api/v1/calendar", Some((CalendarRead, Aim::CallersTenant)), ""),
        api(M::GET, "/api/v1/capacity", None, ""),
        api(M::GET, "/api/v1/gpu-efficiency", Some((UsageRead, Aim::CallersTenant)), ""),
        api(M::GET, "/api/v1/node-agents", Some((FleetRead, Aim::Platform)), ""),
        // No tenant 999999: a call the policy allows answers 404 after the access check.
        api_missing(M::PUT, "/api/v1/tenants/{id}/port-guids", Some((FleetManage, Aim::Platform)), r#"{"guids": []}"#),
    ]
}

/// One signed-in person with a session and an API token carrying all of their role's actions.
struct Person {
    label: String,
    user: User,
    cookie: String,
    token: String,
    token_actions: Vec<Action>,
}

impl Person {
    /// Who the policy sees for a call through `via`.
    fn principal(&self, via: &Via) -> Principal {
        match via {
            Via::Api(_) => Principal { token_actions: Some(self.token_actions.clone()), ..self.user.principal() },
            _ => self.user.principal(),
        }
    }
}

/// The objects the calls name, of tenant A (index 0) and tenant B (index 1).
struct Objects {
    tenants: [i64; 2],
    /// The member who owns each tenant's environment and spare token.
    owners: [i64; 2],
    environments: [String; 2],
    spare_tokens: [i64; 2],
    spare_ssh_keys: [i64; 2],
    /// Each tenant's member's home volume, made by their environment's launch.
    volumes: [i64; 2],
    maintenance: i64,
    node_token: i64,
    /// Strings only tenant B's data contains: its slug, people and environment.
    tenant_b_marks: Vec<String>,
}

impl Objects {
    fn id(&self, aim: Aim, case: Case) -> String {
        let i = usize::from(case == Case::OtherTenant);
        match (aim, case) {
            (Aim::Environment, Case::Missing) => "00000000-0000-4000-8000-000000000000".to_owned(),
            (_, Case::Missing) => "999999".to_owned(),
            (Aim::Environment, _) => self.environments[i].clone(),
            (Aim::Tenant, _) => self.tenants[i].to_string(),
            (Aim::Token, _) => self.spare_tokens[i].to_string(),
            (Aim::SshKey, _) => self.spare_ssh_keys[i].to_string(),
            (Aim::Volume, _) => self.volumes[i].to_string(),
            (Aim::Maintenance, _) => self.maintenance.to_string(),
            (Aim::NodeToken, _) => self.node_token.to_string(),
            (Aim::Node, _) => "l40s-01".to_owned(),
            (Aim::CallersTenant | Aim::CallersOwn | Aim::Platform, _) => String::new(),
        }
    }

    /// What the policy decides on; `None` when the object does not exist.
    fn target(&self, aim: Aim, case: Case, who: &Principal) -> Option<Target> {
        let i = usize::from(case == Case::OtherTenant);
        let owned = Target::Owned { tenant_id: Some(self.tenants[i]), owner_id: self.owners[i] };
        match (aim, case) {
            (_, Case::Missing) => None,
            (Aim::CallersTenant, _) => Some(who.tenant_id.map_or(Target::Platform, Target::Tenant)),
            (Aim::CallersOwn, _) => Some(Target::Owned { tenant_id: who.tenant_id, owner_id: who.user_id }),
            (Aim::Platform | Aim::Maintenance | Aim::NodeToken | Aim::Node, _) => Some(Target::Platform),
            (Aim::Environment | Aim::Token | Aim::SshKey | Aim::Volume, _) => Some(owned),
            (Aim::Tenant, _) => Some(Target::Tenant(self.tenants[i])),
        }
    }
}

/// What the policy says about one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Allowed,
    Denied,
    /// The id names nothing.
    Missing,
}

/// Why the answer breaks the policy, if it does.
fn judge(expect: Expect, reply: &Reply, new_denials: i64, route: &Route) -> Option<String> {
    let (status, names_missing) = (reply.status, route.names_missing);
    if route.via == Via::Shell {
        return status.is_server_error().then(|| format!("the page failed: {status} {}", reply.body));
    }
    let refused = matches!(status, StatusCode::FORBIDDEN | StatusCode::NOT_FOUND);
    match expect {
        Expect::Allowed if names_missing && status == StatusCode::NOT_FOUND && new_denials == 0 => None,
        // The open route's answer: on to the environment's own origin with a ticket.
        Expect::Allowed
            if route.via == Via::Open
                && status == StatusCode::SEE_OTHER
                && reply.header("location").is_some_and(|l| l.contains(".localhost:3000/_berth/auth?ticket="))
                && new_denials == 0 =>
        {
            None
        }
        // On to the identity provider, sign-in or the open route: the same for everyone.
        Expect::Allowed if route.via == Via::Redirect && status.is_redirection() && new_denials == 0 => None,
        // The proxy's rule refusal: the environment is not ready yet.
        Expect::Allowed if route.via == Via::Proxy && status == StatusCode::SERVICE_UNAVAILABLE && new_denials == 0 => {
            None
        }
        // A rule may still refuse (422: already stopping, no capacity); access may not.
        Expect::Allowed if !(status.is_success() || status == StatusCode::UNPROCESSABLE_ENTITY) => {
            Some(format!("refused although the policy allows it: {status} {}", reply.body))
        }
        Expect::Allowed if new_denials != 0 => Some(format!("allowed, yet {new_denials} denials were audited")),
        Expect::Denied if status.is_success() => Some(format!("UNAUTHORIZED SUCCESS: {status} {}", reply.body)),
        Expect::Denied if !refused => Some(format!("denied with {status} instead of 403/404: {}", reply.body)),
        Expect::Denied if new_denials == 0 => Some("denied without an audit row".to_owned()),
        Expect::Missing if !refused => {
            Some(format!("a missing id answered {status} instead of 403/404: {}", reply.body))
        }
        _ => None,
    }
}

/// Two tenants with a tenant admin, a member and a viewer each, plus platform staff; an
/// environment and a spare token of each tenant's member, and a maintenance window. The
/// five people of tenant A and the platform sign in and get a token each.
async fn seed(berth: &Berth) -> (Objects, Vec<Person>) {
    let p = &berth.platform;
    let tenant_a = p.ensure_tenant("tenant-a", "Tenant A", Isolation::Soft).await.expect("tenant A");
    let tenant_b = p.ensure_tenant("tenant-b", "Tenant B", Isolation::Soft).await.expect("tenant B");
    // The callers: every role there is, platform staff and each tenant role in tenant A.
    // Tenant B has its tenant roles too, the people tenant A's must never see.
    let mut users = Vec::new();
    let mut people_b = Vec::new();
    for role in Role::ALL {
        let name = role.label().to_lowercase();
        let (label, tenant) = if role.is_platform() { (name, None) } else { (format!("{name} of A"), Some(tenant_a)) };
        let email = format!("{}@example.com", label.replace(' ', "."));
        users.push((label, berth.person(&email, role, tenant).await));
        if !role.is_platform() {
            people_b.push(berth.person(&format!("{}.b@example.com", role.as_str()), role, Some(tenant_b)).await);
        }
    }
    let with_role = |people: &[User], role| people.iter().find(|u| u.role == role).cloned().expect("every role");
    let people_a: Vec<User> = users.iter().map(|(_, user)| user.clone()).collect();
    let (member_a, admin) = (with_role(&people_a, Role::Member), with_role(&people_a, Role::PlatformAdmin));
    let member_b = with_role(&people_b, Role::Member);

    let (spare_a, _) = berth.token(&member_a, &[]).await;
    let (spare_b, _) = berth.token(&member_b, &[]).await;
    let mut spare_ssh_keys = [0; 2];
    let mut fingerprint_b = String::new();
    for (i, member) in [&member_a, &member_b].into_iter().enumerate() {
        let key = p.add_ssh_key(&member.caller(super::meta()), "spare", SPARE_KEYS[i]).await.expect("spare key");
        spare_ssh_keys[i] = key.id;
        fingerprint_b = key.fingerprint;
    }
    let (window, _) = p
        .schedule_maintenance(&admin.caller(super::meta()), "l40s-01", Some(0), &in_days(30), &in_days(31), "seed")
        .await
        .expect("maintenance window");
    let (node_token, _) = p.create_node_token(&admin.caller(super::meta()), "l40s-01").await.expect("node token");
    let environments = [berth.launch(&member_a, "env-a").await, berth.launch(&member_b, "env-b").await];
    let mut volumes = [0; 2];
    for (i, member) in [&member_a, &member_b].into_iter().enumerate() {
        volumes[i] = sqlx::query_scalar("SELECT id FROM volumes WHERE owner_id = ? AND is_home = 1")
            .bind(member.id)
            .fetch_one(p.db())
            .await
            .expect("the launch made a home volume");
    }
    let tenant_b_marks =
        vec!["tenant-b".to_owned(), ".b@example.com".to_owned(), environments[1].clone(), fingerprint_b];
    let objects = Objects {
        tenants: [tenant_a, tenant_b],
        owners: [member_a.id, member_b.id],
        environments,
        spare_tokens: [spare_a.id, spare_b.id],
        spare_ssh_keys,
        volumes,
        maintenance: window.id,
        node_token: node_token.id,
        tenant_b_marks,
    };

    let mut people = Vec::new();
    for (label, user) in users {
        let cookie = berth.sign_in(&user.email, None).await;
        // Auditors cannot make tokens. This one made its token while a platform admin, so
        // the token lists every action and only the role holds it back now.
        let maker = match user.role {
            Role::PlatformAuditor => User { role: Role::PlatformAdmin, ..user.clone() },
            _ => user.clone(),
        };
        let (info, token) = berth.token(&maker, &[]).await;
        people.push(Person { label, user, cookie, token, token_actions: info.actions });
    }
    (objects, people)
}

/// Fails unless the table lists exactly the server functions in server_fn's registry and
/// the routes the real router was built with (`crate::served`: health probes, the API, the
/// browser routes, the pages and an environment's origin).
fn assert_lists_every_route(table: &[Route], served: &crate::served::Served) {
    let registered: BTreeSet<(String, String)> = leptos::server_fn::axum::server_fn_paths()
        .map(|(path, method)| (method.to_string(), path.to_owned()))
        .collect();
    let listed: BTreeSet<(String, String)> = table
        .iter()
        .filter(|r| matches!(r.via, Via::ServerFn | Via::SessionFn))
        .map(|r| ("POST".to_owned(), r.path.to_owned()))
        .collect();
    assert_eq!(registered, listed, "server functions registered (left) and in the matrix (right)");
    let served: BTreeSet<(String, String)> =
        served.iter().map(|(method, path)| ((*method).to_owned(), path.clone())).collect();
    let mut listed: BTreeSet<(String, String)> = table
        .iter()
        .filter_map(|r| match &r.via {
            Via::ServerFn | Via::SessionFn => None,
            Via::Api(method) | Via::NodeAgent(method) => Some((method.to_string(), r.path.to_owned())),
            Via::Page | Via::Open | Via::Redirect | Via::Shell => Some(("GET".to_owned(), r.path.to_owned())),
            // The proxy forwards every method.
            Via::Proxy => Some(("ANY".to_owned(), r.path.to_owned())),
        })
        .collect();
    // Every proxied call redeems the portal's ticket on the way.
    if table.iter().any(|r| r.via == Via::Proxy) {
        listed.insert(("GET".to_owned(), crate::proxy::AUTH_PATH.to_owned()));
    }
    assert_eq!(served, listed, "routes the router serves (left) and in the matrix (right)");
}

/// A UTC time `days` from now.
fn in_days(days: i64) -> String {
    in_hours(24 * days)
}

/// `text` of `route` (its path or body) about object `id` and member `owner`; `n` makes
/// names unique.
fn fill(route: &Route, text: &str, id: &str, owner: &str, n: usize) -> String {
    // Form values are percent-encoded; JSON takes them as they are.
    let form = matches!(route.via, Via::ServerFn | Via::SessionFn);
    let value = |v: String| if form { encode(&v) } else { v };
    // A route anyone may call still needs something in its path; one that names something
    // missing names an id nothing has.
    let id = match (id.is_empty(), route.names_missing) {
        (true, true) => "999999",
        (true, false) => "anything",
        (false, _) => id,
    };
    // A member in a path: the object's owner, or nobody for a route that names one missing.
    let user = if route.names_missing { "999999" } else { owner };
    text.replace("{id}", id)
        .replace("{user}", user)
        .replace("{project}", "999999")
        .replace("{webhook}", "999999")
        .replace("{slug}", "tenant-a")
        .replace("{offering}", "notebook")
        .replace("{*rest}", "lab")
        .replace("{owner}", owner)
        .replace("{gpu}", "0")
        .replace("{n}", &n.to_string())
        .replace("{end}", &value(in_hours(3)))
        .replace("{later_end}", &value(in_days(41)))
        .replace("{later}", &value(in_days(40)))
}

/// Calls `route` as `person` (nobody when `None`) about object `id`; `n` makes names unique.
async fn call(berth: &Berth, route: &Route, person: Option<&Person>, id: &str, owner: &str, n: usize) -> Reply {
    let (path, body) = (fill(route, route.path, id, owner, n), fill(route, route.body, id, owner, n));
    let cookie = person.map(|p| p.cookie.as_str());
    match &route.via {
        Via::ServerFn => berth.call(&path, &body, cookie).await,
        Via::Api(method) | Via::NodeAgent(method) => {
            berth.api(method.clone(), &path, &body, person.map(|p| p.token.as_str())).await
        }
        Via::Page | Via::Open | Via::Redirect | Via::Shell => berth.get(&path, cookie).await,
        Via::Proxy => {
            let opened = berth.get(&format!("/environments/{id}/open"), cookie).await;
            let Some(location) = opened.header("location").filter(|_| opened.status == StatusCode::SEE_OTHER) else {
                return opened;
            };
            let redeem = location.split_once(".localhost:3000").map(|(_, rest)| rest).unwrap_or_default().to_owned();
            let on = format!("{id}.localhost:3000");
            let signed_in = berth.get_on(&on, &redeem, None).await;
            let Some(env_cookie) = signed_in.cookie() else { return signed_in };
            berth.get_on(&on, &path, Some(&env_cookie)).await
        }
        Via::SessionFn => unreachable!("the session tests call these"),
    }
}

#[tokio::test]
async fn every_route_answers_every_role_as_the_policy_says() {
    let berth = Berth::start(None).await;
    let (objects, people) = seed(&berth).await;
    let table = routes();
    assert_lists_every_route(&table, &berth.served);

    let mut failures = Vec::new();
    let mut calls = 0;
    for route in table.iter().filter(|r| r.via != Via::SessionFn) {
        for person in &people {
            // A person's token is no node token, whatever their role.
            if matches!(route.via, Via::NodeAgent(_)) {
                calls += 1;
                let reply = call(&berth, route, Some(person), "", "0", calls).await;
                if reply.status != StatusCode::UNAUTHORIZED {
                    failures
                        .push(format!("{} as {} answered {}: {}", route.path, person.label, reply.status, reply.body));
                }
                continue;
            }
            let principal = person.principal(&route.via);
            let aim = route.needs.map(|(_, aim)| aim);
            let mut answers: HashMap<Case, Reply> = HashMap::new();
            for &case in aim.map_or(&[Case::OwnTenant][..], Aim::cases) {
                calls += 1;
                let expect = match route.needs {
                    None => Expect::Allowed,
                    Some((action, aim)) => match objects.target(aim, case, &principal) {
                        None => Expect::Missing,
                        Some(target) if principal.authorize(action, target).is_ok() => Expect::Allowed,
                        Some(_) => Expect::Denied,
                    },
                };
                let id = aim.map(|aim| objects.id(aim, case)).unwrap_or_default();
                let before = berth.denials_by(person.user.id).await;
                let owner = objects.owners[usize::from(case == Case::OtherTenant)].to_string();
                let reply = call(&berth, route, Some(person), &id, &owner, calls).await;
                let new_denials = berth.denials_by(person.user.id).await - before;
                if let Some(why) = judge(expect, &reply, new_denials, route) {
                    failures.push(format!("{} as {} on {case:?} ({expect:?}): {why}", route.path, person.label));
                }
                // Nothing tenant A's people can reach (lists, the audit log) shows tenant B.
                if principal.tenant_id == Some(objects.tenants[0])
                    && let Some(mark) = objects.tenant_b_marks.iter().find(|m| reply.body.contains(m.as_str()))
                {
                    failures.push(format!("{} as {} on {case:?} shows tenant B's {mark}", route.path, person.label));
                }
                answers.insert(case, reply);
            }
            // Another tenant's object the caller may not even see must look exactly missing.
            if let Some((action, aim)) = route.needs
                && route.via != Via::Shell
                && let (Some(other), Some(missing)) = (answers.get(&Case::OtherTenant), answers.get(&Case::Missing))
                && let Some(target) = objects.target(aim, Case::OtherTenant, &principal)
                && principal.authorize(action.read(), target).is_err()
            {
                let (other, missing) = (
                    (other.status, other.body_without_request_id()),
                    (missing.status, missing.body_without_request_id()),
                );
                if other != missing {
                    failures.push(format!(
                        "{} as {}: another tenant's object answers {other:?}, a missing one {missing:?}",
                        route.path, person.label
                    ));
                }
            }
        }
    }
    // Nobody signed in, no token: everything that needs a permission asks for a sign-in.
    let needs_credentials =
        |r: &&Route| (r.needs.is_some() && r.via != Via::Shell) || matches!(r.via, Via::NodeAgent(_));
    for route in table.iter().filter(needs_credentials).filter(|r| r.via != Via::SessionFn) {
        calls += 1;
        let id = route.needs.map(|(_, aim)| objects.id(aim, Case::OwnTenant)).unwrap_or_default();
        let reply = call(&berth, route, None, &id, "0", calls).await;
        if reply.status != StatusCode::UNAUTHORIZED {
            failures.push(format!("{} without credentials answered {}: {}", route.path, reply.status, reply.body));
        }
    }
    // Signed out, every page still answers, and shows nobody's things.
    for route in table.iter().filter(|r| r.via == Via::Shell) {
        calls += 1;
        let id = route.needs.map(|(_, aim)| objects.id(aim, Case::OwnTenant)).unwrap_or_default();
        let reply = call(&berth, route, None, &id, "0", calls).await;
        if let Some(why) = judge(Expect::Allowed, &reply, 0, route) {
            failures.push(format!("{} without credentials: {why}", route.path));
        }
        if let Some(mark) = objects.tenant_b_marks.iter().find(|m| reply.body.contains(m.as_str())) {
            failures.push(format!("{} without credentials shows tenant B's {mark}", route.path));
        }
    }
    assert!(failures.is_empty(), "{} of {calls} calls broke the policy:\n{}", failures.len(), failures.join("\n"));
}

/// Bodies that do not decode into the arguments `form` carries, or decode into values of the
/// wrong kind: the whole body garbled, each field left out, given a value of the wrong type,
/// given a map for a value or given twice, and JSON where a form is expected. With their
/// content types.
fn malformed(form: &str) -> Vec<(&'static str, Vec<u8>)> {
    const FORM: &str = "application/x-www-form-urlencoded";
    const JSON: &str = "application/json";
    let mut bodies: Vec<(&str, Vec<u8>)> = Vec::new();
    for garbage in ["", "%", "%zz=%", "&&==&", "[]]=x", "a[=1", "=x", "\u{0}\u{1}\u{7f}"] {
        bodies.push((FORM, garbage.into()));
    }
    bodies.push((FORM, vec![0xff, 0xfe, b'=', 0x80]));
    for garbage in ["{}", "null", "[1, 2]", r#"{"id": 1}"#, "{", "not json"] {
        bodies.push((JSON, garbage.into()));
    }
    let fields: Vec<(String, String)> = form
        .split('&')
        .filter(|f| !f.is_empty())
        .map(|f| f.split_once('=').unwrap_or((f, "")))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let shapes: Vec<String> = fields.iter().map(|(k, _)| format!("{k:?}: [{{}}]")).collect();
    bodies.push((JSON, format!("{{{}}}", shapes.join(", ")).into()));
    let encoded = |fields: &[(String, String)]| {
        fields.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&").into_bytes()
    };
    for i in 0..fields.len() {
        let mut without = fields.clone();
        let (key, value) = without.remove(i);
        bodies.push((FORM, encoded(&without)));
        for wrong in ["not-a-number", "", "-1", "99999999999999999999999", "1.5", "true", "%FF", "%00"] {
            let mut changed = fields.clone();
            changed[i].1 = wrong.to_owned();
            bodies.push((FORM, encoded(&changed)));
        }
        let mut nested = fields.clone();
        nested[i].0 = format!("{key}[x]");
        bodies.push((FORM, encoded(&nested)));
        let mut twice = fields.clone();
        twice.push((key, format!("{value}x")));
        bodies.push((FORM, encoded(&twice)));
    }
    bodies
}

/// Malformed arguments are the caller's mistake, whoever calls: every server function in
/// server_fn's registry answers them 4xx, 400 with a plain message where they do not decode,
/// and never 5xx.
#[tokio::test]
async fn every_server_function_answers_malformed_arguments_4xx() {
    let berth = Berth::start(None).await;
    let (objects, people) = seed(&berth).await;
    let table = routes();
    assert_lists_every_route(&table, &berth.served);
    // The session's own functions last: signing out ends the session the others are called with.
    let mut functions: Vec<&Route> = table.iter().filter(|r| matches!(r.via, Via::ServerFn | Via::SessionFn)).collect();
    functions.sort_by_key(|r| (r.via == Via::SessionFn, r.path == "/api/sign_out"));
    let person = |role| people.iter().find(|p: &&Person| p.user.role == role);
    // Who calls, and whether as a plain HTML form post (no WASM yet, no Referer to go back to).
    let callers = [
        (person(Role::TenantAdmin), false),
        (person(Role::PlatformAdmin), false),
        (None, false),
        (person(Role::Member), true),
    ];

    let mut failures = Vec::new();
    let (mut calls, mut undecodable) = (0, 0);
    for route in functions {
        let id = route.needs.map(|(_, aim)| objects.id(aim, Case::OwnTenant)).unwrap_or_default();
        let form = fill(route, route.body, &id, &objects.owners[0].to_string(), 0);
        for (content_type, body) in malformed(&form) {
            for (caller, plain_form_post) in &callers {
                calls += 1;
                // As a browser sends it: its own page's post.
                let mut request = http::Request::post(route.path)
                    .header(http::header::CONTENT_TYPE, content_type)
                    .header("sec-fetch-site", "same-origin");
                if let Some(person) = caller {
                    request = request.header(http::header::COOKIE, &person.cookie);
                }
                if *plain_form_post {
                    request = request.header(http::header::ACCEPT, "text/html");
                }
                let reply = berth.send(request.body(axum::body::Body::from(body.clone())).expect("request")).await;
                let who = caller.map_or("nobody", |p| p.label.as_str());
                let who = if *plain_form_post { format!("{who} (a plain form post)") } else { who.to_owned() };
                let sent = String::from_utf8_lossy(&body);
                let call = format!("{} {content_type} {sent:?} as {who}", route.path);
                if reply.status.is_server_error() {
                    failures.push(format!("{call}: {} {}", reply.status, reply.body));
                } else if reply.status == StatusCode::BAD_REQUEST {
                    match serde_json::from_str(&reply.body) {
                        Ok(AppError::Malformed(_)) => undecodable += 1,
                        _ => failures.push(format!("{call}: 400 without a plain message: {}", reply.body)),
                    }
                }
            }
        }
    }
    assert!(undecodable > calls / 4, "only {undecodable} of {calls} malformed calls were found undecodable");
    assert!(
        failures.is_empty(),
        "{} of {calls} malformed calls were not refused 4xx:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A token carries only the actions it was made with, and a revoked one stops at once.
#[tokio::test]
async fn narrowed_and_revoked_tokens() {
    let berth = Berth::start(None).await;
    let p = &berth.platform;
    let tenant = p.ensure_tenant("tenant-a", "Tenant A", Isolation::Soft).await.expect("tenant");
    let member = berth.person("member@example.com", Role::Member, Some(tenant)).await;
    let env = berth.launch(&member, "mine").await;

    let (_, reader) = berth.token(&member, &["environment.read"]).await;
    let read = berth.api(Method::GET, &format!("/api/v1/environments/{env}"), "", Some(&reader)).await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.body);
    let denials = berth.denials_by(member.id).await;
    let launch = berth.api(Method::POST, "/api/v1/environments", &LAUNCH_JSON.replace("{n}", "1"), Some(&reader)).await;
    assert_eq!(launch.status, StatusCode::FORBIDDEN, "a read-only token launched: {}", launch.body);
    let stop = berth.api(Method::POST, &format!("/api/v1/environments/{env}/stop"), "", Some(&reader)).await;
    assert_eq!(stop.status, StatusCode::FORBIDDEN, "a read-only token stopped: {}", stop.body);
    assert_eq!(berth.denials_by(member.id).await - denials, 2, "both refusals are audited");
    let still: String = sqlx::query_scalar("SELECT desired FROM environments WHERE id = ?")
        .bind(&env)
        .fetch_one(p.db())
        .await
        .expect("environment");
    assert_eq!(still, "running");
    let envs: i64 = sqlx::query_scalar("SELECT count(*) FROM environments").fetch_one(p.db()).await.expect("count");
    assert_eq!(envs, 1, "nothing was launched");

    let (info, secret) = berth.token(&member, &[]).await;
    assert_eq!(berth.api(Method::GET, "/api/v1/me", "", Some(&secret)).await.status, StatusCode::OK);
    p.revoke_token(&member.caller(super::meta()), info.id).await.expect("revoke");
    let after = berth.api(Method::GET, "/api/v1/me", "", Some(&secret)).await;
    assert_eq!(after.status, StatusCode::UNAUTHORIZED, "a revoked token still works: {}", after.body);
    assert_eq!(after.header("www-authenticate"), Some("Bearer"));
    let stop = berth.api(Method::POST, &format!("/api/v1/environments/{env}/stop"), "", Some(&secret)).await;
    assert_eq!(stop.status, StatusCode::UNAUTHORIZED);
}
