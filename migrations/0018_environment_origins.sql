-- Signing in on an environment's own origin (`<id>.<environments domain>`), where Berth's
-- portal cookie never goes. The portal hands the browser a single-use ticket; the
-- environment's origin redeems it for a session of its own. Only SHA-256 hashes are kept.

-- A ticket lives about a minute and is deleted when redeemed (or tried anywhere).
CREATE TABLE environment_tickets (
    ticket_hash    TEXT    PRIMARY KEY,
    user_id        INTEGER NOT NULL REFERENCES users (id),
    environment_id TEXT    NOT NULL REFERENCES environments (id),
    created_at     INTEGER NOT NULL,
    expires_at     INTEGER NOT NULL,
    CHECK (expires_at > created_at)
);

-- A browser's session on one environment's origin, for one user.
CREATE TABLE environment_sessions (
    secret_hash    TEXT    PRIMARY KEY,
    user_id        INTEGER NOT NULL REFERENCES users (id),
    environment_id TEXT    NOT NULL REFERENCES environments (id),
    created_at     INTEGER NOT NULL,
    expires_at     INTEGER NOT NULL,
    CHECK (expires_at > created_at)
);
CREATE INDEX environment_sessions_by_environment ON environment_sessions (environment_id);
CREATE INDEX environment_sessions_by_user ON environment_sessions (user_id);
CREATE INDEX environment_tickets_by_user ON environment_tickets (user_id);

-- Every request is checked against the user's access anyway; these end what can no longer
-- be used, whichever code path changed the row.
CREATE TRIGGER environment_sessions_end_with_environment
AFTER UPDATE OF state, desired ON environments
WHEN NEW.state IN ('tearing_down', 'released', 'failed') OR NEW.desired = 'released'
BEGIN
    DELETE FROM environment_sessions WHERE environment_id = NEW.id;
    DELETE FROM environment_tickets WHERE environment_id = NEW.id;
END;

-- Suspended or removed, or another role or tenant: the access they opened with is gone.
CREATE TRIGGER environment_sessions_end_with_user
AFTER UPDATE OF status, role, tenant_id ON users
WHEN NEW.status <> 'active' OR NEW.role <> OLD.role OR NEW.tenant_id IS NOT OLD.tenant_id
BEGIN
    DELETE FROM environment_sessions WHERE user_id = NEW.id;
    DELETE FROM environment_tickets WHERE user_id = NEW.id;
END;

CREATE TRIGGER environment_sessions_end_with_tenant
AFTER UPDATE OF status ON tenants
WHEN NEW.status <> 'active'
BEGIN
    DELETE FROM environment_sessions WHERE user_id IN (SELECT id FROM users WHERE tenant_id = NEW.id);
    DELETE FROM environment_tickets WHERE user_id IN (SELECT id FROM users WHERE tenant_id = NEW.id);
END;
