-- How owners reach and run what they booked: inference endpoints' API keys and replicas.

-- An endpoint's API key. Only its SHA-256 is kept for checking requests; the key itself
-- waits in `unrevealed` from provisioning until its owner has seen it once, then is gone.
CREATE TABLE endpoint_keys (
    environment_id TEXT    PRIMARY KEY REFERENCES environments (id),
    key_hash       TEXT    NOT NULL UNIQUE,
    unrevealed     TEXT,
    created_at     INTEGER NOT NULL,
    revealed_at    INTEGER,
    CHECK (unrevealed IS NULL OR revealed_at IS NULL)
);

-- Replicas the owner asked for, and how many the backend last confirmed running. Each
-- replica holds its own reservations (numbered from 0), so scaling books capacity.
ALTER TABLE environments ADD COLUMN replicas INTEGER NOT NULL DEFAULT 1 CHECK (replicas BETWEEN 1 AND 8);
ALTER TABLE environments ADD COLUMN replicas_applied INTEGER NOT NULL DEFAULT 1;
-- Why the last attempt to apply `replicas` failed, for the owner; NULL once it worked.
ALTER TABLE environments ADD COLUMN scale_error TEXT;
ALTER TABLE reservations ADD COLUMN replica INTEGER NOT NULL DEFAULT 0 CHECK (replica >= 0);
