-- Tenants, projects and roles; single sign-on with OpenID Connect; API tokens.

CREATE TABLE tenants (
    id         INTEGER PRIMARY KEY,
    -- Short name in URLs and group mappings: lower-case letters, digits and dashes.
    slug       TEXT    NOT NULL UNIQUE CHECK (length(slug) BETWEEN 2 AND 40 AND slug NOT GLOB '*[^a-z0-9-]*'),
    name       TEXT    NOT NULL CHECK (length(trim(name)) > 0),
    isolation  TEXT    NOT NULL CHECK (isolation IN ('soft', 'hard', 'hybrid')),
    -- A deleted tenant stays as a tombstone so its history and audit rows keep their meaning.
    status     TEXT    NOT NULL CHECK (status IN ('active', 'suspended', 'deleted')),
    created_at INTEGER NOT NULL
);

-- Accounts that existed before tenants (members of the foundation) land in this one.
INSERT INTO tenants (slug, name, isolation, status, created_at)
SELECT 'default', 'Default', 'soft', 'active', CAST(strftime('%s', 'now') AS INTEGER) * 1000
WHERE EXISTS (SELECT 1 FROM users WHERE role <> 'platform_admin');

-- Roles widen from the foundation's two to five. SQLite cannot change a CHECK in place,
-- and rebuilding `users` would trip the foreign keys that point at it, so the column is
-- renamed, re-added with the new CHECK, copied and the old one dropped.
ALTER TABLE users RENAME COLUMN role TO foundation_role;
ALTER TABLE users ADD COLUMN role TEXT NOT NULL DEFAULT 'member'
    CHECK (role IN ('platform_admin', 'platform_auditor', 'tenant_admin', 'member', 'viewer'));
UPDATE users SET role = foundation_role;
ALTER TABLE users DROP COLUMN foundation_role;

-- Platform staff belong to no tenant; everyone else to exactly one.
ALTER TABLE users ADD COLUMN tenant_id INTEGER REFERENCES tenants (id);
ALTER TABLE users ADD COLUMN status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'suspended', 'removed'));
UPDATE users SET tenant_id = (SELECT id FROM tenants WHERE slug = 'default') WHERE role <> 'platform_admin';
CREATE INDEX users_by_tenant ON users (tenant_id);
CREATE TRIGGER users_tenant_matches_role_on_insert
BEFORE INSERT ON users
WHEN (NEW.tenant_id IS NULL) <> (NEW.role IN ('platform_admin', 'platform_auditor'))
BEGIN
    SELECT RAISE(ABORT, 'platform roles have no tenant; tenant roles need one');
END;
CREATE TRIGGER users_tenant_matches_role_on_update
BEFORE UPDATE OF role, tenant_id ON users
WHEN (NEW.tenant_id IS NULL) <> (NEW.role IN ('platform_admin', 'platform_auditor'))
BEGIN
    SELECT RAISE(ABORT, 'platform roles have no tenant; tenant roles need one');
END;

-- Who a provider says someone is: the pair (issuer, subject), never an email alone.
CREATE TABLE user_identities (
    issuer     TEXT    NOT NULL,
    subject    TEXT    NOT NULL,
    user_id    INTEGER NOT NULL REFERENCES users (id),
    created_at INTEGER NOT NULL,
    PRIMARY KEY (issuer, subject)
);

CREATE TABLE projects (
    id         INTEGER PRIMARY KEY,
    tenant_id  INTEGER NOT NULL REFERENCES tenants (id),
    name       TEXT    NOT NULL CHECK (length(trim(name)) > 0),
    created_at INTEGER NOT NULL,
    UNIQUE (tenant_id, name)
);

CREATE TABLE project_members (
    project_id INTEGER NOT NULL REFERENCES projects (id),
    user_id    INTEGER NOT NULL REFERENCES users (id),
    PRIMARY KEY (project_id, user_id)
);

ALTER TABLE environments ADD COLUMN tenant_id INTEGER REFERENCES tenants (id);
ALTER TABLE environments ADD COLUMN project_id INTEGER REFERENCES projects (id);
UPDATE environments SET tenant_id = (SELECT tenant_id FROM users WHERE users.id = environments.owner_id);
CREATE INDEX environments_by_tenant ON environments (tenant_id, created_at);

-- An OpenID provider: one per tenant (its users can only land in that tenant), or
-- platform-wide (tenant_id NULL; its group mappings name the tenant).
CREATE TABLE oidc_providers (
    id              INTEGER PRIMARY KEY,
    tenant_id       INTEGER REFERENCES tenants (id),
    -- In the sign-in URL: /auth/oidc/<slug>/start
    slug            TEXT    NOT NULL UNIQUE CHECK (length(slug) BETWEEN 2 AND 40 AND slug NOT GLOB '*[^a-z0-9-]*'),
    display_name    TEXT    NOT NULL,
    issuer          TEXT    NOT NULL,
    client_id       TEXT    NOT NULL,
    client_secret   TEXT,
    groups_claim    TEXT    NOT NULL DEFAULT 'groups',
    -- Space-separated email domains allowed to sign in; empty allows any.
    allowed_domains TEXT    NOT NULL DEFAULT '',
    enabled         INTEGER NOT NULL DEFAULT 1 CHECK (enabled IN (0, 1)),
    created_at      INTEGER NOT NULL
);

-- Which role a group of a provider gives, and in which tenant. A tenant's provider maps
-- only into its own tenant (held by the trigger below); platform roles have no tenant.
CREATE TABLE oidc_group_roles (
    provider_id INTEGER NOT NULL REFERENCES oidc_providers (id) ON DELETE CASCADE,
    group_name  TEXT    NOT NULL CHECK (length(group_name) > 0),
    role        TEXT    NOT NULL CHECK (role IN ('platform_admin', 'platform_auditor', 'tenant_admin', 'member', 'viewer')),
    tenant_id   INTEGER REFERENCES tenants (id),
    PRIMARY KEY (provider_id, group_name),
    CHECK ((tenant_id IS NULL) = (role IN ('platform_admin', 'platform_auditor')))
);
CREATE TRIGGER oidc_group_roles_stay_in_tenant
BEFORE INSERT ON oidc_group_roles
WHEN (SELECT tenant_id FROM oidc_providers WHERE id = NEW.provider_id) IS NOT NULL
 AND (NEW.tenant_id IS NULL OR NEW.tenant_id <> (SELECT tenant_id FROM oidc_providers WHERE id = NEW.provider_id))
BEGIN
    SELECT RAISE(ABORT, 'a tenant''s provider maps only into its own tenant');
END;

-- A sign-in in progress, keyed by its single-use `state`; bound to the browser session
-- that started it. Deleted when the callback comes back (or when it is stale).
CREATE TABLE oidc_logins (
    state         TEXT    PRIMARY KEY,
    provider_id   INTEGER NOT NULL REFERENCES oidc_providers (id) ON DELETE CASCADE,
    nonce         TEXT    NOT NULL,
    pkce_verifier TEXT    NOT NULL,
    -- SHA-256 of a random value kept in the starting browser's session.
    binding       TEXT    NOT NULL,
    next          TEXT    NOT NULL,
    created_at    INTEGER NOT NULL
);

-- Personal API tokens: only a SHA-256 of the secret is kept; shown once at creation.
CREATE TABLE api_tokens (
    id           INTEGER PRIMARY KEY,
    user_id      INTEGER NOT NULL REFERENCES users (id),
    name         TEXT    NOT NULL CHECK (length(trim(name)) > 0),
    secret_hash  TEXT    NOT NULL UNIQUE,
    -- Space-separated actions (domain::policy::Action), a subset of the owner's role.
    actions      TEXT    NOT NULL,
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL,
    revoked_at   INTEGER,
    last_used_at INTEGER,
    CHECK (expires_at > created_at)
);
CREATE INDEX api_tokens_by_user ON api_tokens (user_id);

ALTER TABLE audit_events ADD COLUMN tenant_id INTEGER;
CREATE INDEX audit_events_by_tenant ON audit_events (tenant_id, at);
