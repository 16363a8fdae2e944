-- Node agents (`berth agent`): the tokens they report with, and what they last reported.

-- A node token lets one node's agent report for that node, nothing else. Only a SHA-256 of
-- the secret is kept; the secret is shown once at creation.
CREATE TABLE node_tokens (
    id           INTEGER PRIMARY KEY,
    node_id      INTEGER NOT NULL REFERENCES nodes (id),
    secret_hash  TEXT    NOT NULL UNIQUE,
    created_by   INTEGER NOT NULL REFERENCES users (id),
    created_at   INTEGER NOT NULL,
    revoked_at   INTEGER,
    last_used_at INTEGER
);
CREATE INDEX node_tokens_by_node ON node_tokens (node_id);

ALTER TABLE nodes ADD COLUMN agent_seen_at INTEGER;
ALTER TABLE nodes ADD COLUMN agent_version TEXT;

-- The agent's last readings of each GPU (NULL: never reported, or not supported).
ALTER TABLE gpus ADD COLUMN uuid TEXT;
ALTER TABLE gpus ADD COLUMN memory_mib INTEGER;
ALTER TABLE gpus ADD COLUMN mig_mode INTEGER CHECK (mig_mode IN (0, 1));
ALTER TABLE gpus ADD COLUMN mig_instances INTEGER;
ALTER TABLE gpus ADD COLUMN ecc_uncorrected INTEGER;
ALTER TABLE gpus ADD COLUMN temperature_c INTEGER;
ALTER TABLE gpus ADD COLUMN power_w INTEGER;
ALTER TABLE gpus ADD COLUMN utilization_pct INTEGER;
-- Who recorded the current health: an admin's degraded or failed is not overruled by the
-- agent (see domain::agent::next_health). Every GPU starts as the admin's healthy.
ALTER TABLE gpus ADD COLUMN health_by TEXT NOT NULL DEFAULT 'admin' CHECK (health_by IN ('admin', 'agent'));
