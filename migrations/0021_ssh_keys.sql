-- SSH access to bare-metal dedicated clusters: the public keys people keep on their
-- account, and the access part of a node's plan (the cluster's local account there);
-- and hard tenants' containers on their tenant networks, each at an address of its own.

-- One person's SSH public key, checked by domain::ssh_key (algorithm, wire blob, size).
-- A removed key stays (for the audit trail) with its removal time. The same key twice
-- for one person is refused; two people may share one key (the same person with two
-- accounts), each row granting only what its owner may do.
CREATE TABLE ssh_keys (
    id          INTEGER PRIMARY KEY,
    user_id     INTEGER NOT NULL REFERENCES users (id),
    -- What the person calls it (the key's comment unless they named it).
    name        TEXT    NOT NULL CHECK (length(name) <= 100),
    algorithm   TEXT    NOT NULL CHECK (algorithm IN
                    ('ssh-ed25519', 'ecdsa-sha2-nistp256', 'ecdsa-sha2-nistp384', 'ecdsa-sha2-nistp521', 'ssh-rsa')),
    -- `<algorithm> <base64>`, without options or comment: what makes two keys the same key.
    public_key  TEXT    NOT NULL CHECK (public_key LIKE algorithm || ' %'
                    AND instr(public_key, char(10)) = 0 AND instr(public_key, char(13)) = 0),
    bits        INTEGER NOT NULL CHECK (bits >= 256 AND (algorithm <> 'ssh-rsa' OR bits >= 2048)),
    -- `SHA256:…` as ssh-keygen -l prints it.
    fingerprint TEXT    NOT NULL CHECK (fingerprint LIKE 'SHA256:%'),
    created_at  INTEGER NOT NULL,
    removed_at  INTEGER CHECK (removed_at IS NULL OR removed_at >= created_at)
);
CREATE UNIQUE INDEX ssh_keys_once_per_user ON ssh_keys (user_id, public_key) WHERE removed_at IS NULL;

-- node_plan_parts gains the kind 'access'. SQLite cannot change a CHECK in place; nothing
-- references this table, so it is rebuilt and its rows copied.
CREATE TABLE node_plan_parts_new (
    node_id        INTEGER NOT NULL REFERENCES nodes (id),
    environment_id TEXT    NOT NULL REFERENCES environments (id),
    kind           TEXT    NOT NULL CHECK (kind IN ('mig', 'network', 'workload', 'access')),
    body           TEXT    NOT NULL CHECK (json_valid(body)),
    PRIMARY KEY (node_id, environment_id, kind)
);
INSERT INTO node_plan_parts_new (node_id, environment_id, kind, body)
SELECT node_id, environment_id, kind, body FROM node_plan_parts;
DROP TABLE node_plan_parts;
ALTER TABLE node_plan_parts_new RENAME TO node_plan_parts;
CREATE INDEX node_plan_parts_by_environment ON node_plan_parts (environment_id);

-- A hard or hybrid tenant's container has an address of its own on its tenant's segment
-- (domain::host_network::container_address): no two workloads on one segment share one.
CREATE UNIQUE INDEX node_plan_parts_container_addresses ON node_plan_parts (
    json_extract(body, '$.network.segment.kind'),
    json_extract(body, '$.network.segment.id'),
    json_extract(body, '$.network.address')
) WHERE kind = 'workload' AND json_extract(body, '$.network') IS NOT NULL;
