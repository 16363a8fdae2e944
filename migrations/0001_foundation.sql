-- Berth's foundation schema. Times are unix milliseconds (UTC) in INTEGER columns so
-- comparisons are plain and the SQL stays portable to PostgreSQL.

CREATE TABLE users (
    id            INTEGER PRIMARY KEY,
    email         TEXT    NOT NULL UNIQUE COLLATE NOCASE,
    display_name  TEXT    NOT NULL,
    -- argon2id PHC string; NULL for accounts that cannot sign in with a password.
    password_hash TEXT,
    role          TEXT    NOT NULL CHECK (role IN ('platform_admin', 'member')),
    created_at    INTEGER NOT NULL
);

CREATE TABLE sites (
    id   INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);

CREATE TABLE nodes (
    id            INTEGER PRIMARY KEY,
    site_id       INTEGER NOT NULL REFERENCES sites (id),
    name          TEXT    NOT NULL UNIQUE,
    gpu_model     TEXT    NOT NULL,
    nvlink_domain TEXT,
    -- 0 when the node left the fleet description; its history stays.
    in_service    INTEGER NOT NULL DEFAULT 1 CHECK (in_service IN (0, 1))
);

CREATE TABLE gpus (
    id          INTEGER PRIMARY KEY,
    node_id     INTEGER NOT NULL REFERENCES nodes (id),
    idx         INTEGER NOT NULL CHECK (idx >= 0),
    model       TEXT    NOT NULL,
    mig_enabled INTEGER NOT NULL CHECK (mig_enabled IN (0, 1)),
    in_service  INTEGER NOT NULL DEFAULT 1 CHECK (in_service IN (0, 1)),
    UNIQUE (node_id, idx)
);

CREATE TABLE environments (
    id               TEXT    PRIMARY KEY,
    owner_id         INTEGER NOT NULL REFERENCES users (id),
    name             TEXT    NOT NULL,
    offering         TEXT    NOT NULL CHECK (offering IN ('notebook', 'training', 'inference', 'cluster')),
    size_id          TEXT    NOT NULL,
    image            TEXT,
    command          TEXT,
    cents_per_hour   INTEGER NOT NULL CHECK (cents_per_hour >= 0),
    state            TEXT    NOT NULL CHECK (state IN ('requested', 'provisioning', 'ready', 'tearing_down', 'released', 'failed')),
    desired          TEXT    NOT NULL CHECK (desired IN ('running', 'released')),
    failure_reason   TEXT,
    -- JSON object of connection details, set when the endpoint is exposed.
    connection       TEXT,
    created_at       INTEGER NOT NULL,
    starts_at        INTEGER NOT NULL,
    ends_at          INTEGER NOT NULL,
    state_changed_at INTEGER NOT NULL,
    ready_at         INTEGER,
    finished_at      INTEGER,
    CHECK (ends_at > starts_at),
    CHECK ((state IN ('released', 'failed')) = (finished_at IS NOT NULL)),
    CHECK (state <> 'failed' OR failure_reason IS NOT NULL)
);
CREATE INDEX environments_by_owner ON environments (owner_id, created_at);
CREATE INDEX environments_unfinished ON environments (state) WHERE state NOT IN ('released', 'failed');

-- The step journal: one row per step of a phase, rewritten as attempts repeat.
CREATE TABLE environment_steps (
    id             INTEGER PRIMARY KEY,
    environment_id TEXT    NOT NULL REFERENCES environments (id),
    phase          TEXT    NOT NULL CHECK (phase IN ('provision', 'teardown')),
    idx            INTEGER NOT NULL CHECK (idx >= 0),
    step           TEXT    NOT NULL,
    status         TEXT    NOT NULL CHECK (status IN ('running', 'succeeded', 'failed')),
    attempts       INTEGER NOT NULL CHECK (attempts >= 1),
    started_at     INTEGER NOT NULL,
    finished_at    INTEGER,
    detail         TEXT,
    UNIQUE (environment_id, phase, idx)
);

-- Capacity held by an environment: a run of memory slices (0..8 = whole GPU) of one
-- GPU for a window, until released. Released exactly once (released_at set once).
CREATE TABLE reservations (
    id             INTEGER PRIMARY KEY,
    environment_id TEXT    NOT NULL REFERENCES environments (id),
    gpu_id         INTEGER NOT NULL REFERENCES gpus (id),
    slice_start    INTEGER NOT NULL CHECK (slice_start BETWEEN 0 AND 7),
    slice_size     INTEGER NOT NULL CHECK (slice_size BETWEEN 1 AND 8 AND slice_start + slice_size <= 8),
    mig_profile    TEXT,
    starts_at      INTEGER NOT NULL,
    ends_at        INTEGER NOT NULL,
    released_at    INTEGER,
    CHECK (ends_at > starts_at),
    CHECK (mig_profile IS NOT NULL OR (slice_start = 0 AND slice_size = 8))
);
CREATE INDEX reservations_held ON reservations (gpu_id) WHERE released_at IS NULL;
CREATE INDEX reservations_by_environment ON reservations (environment_id);

-- The database itself refuses two unreleased reservations on overlapping slices of one
-- GPU in overlapping windows, whatever code path writes them.
CREATE TRIGGER reservations_never_overlap
BEFORE INSERT ON reservations
WHEN EXISTS (
    SELECT 1 FROM reservations r
    WHERE r.gpu_id = NEW.gpu_id
      AND r.released_at IS NULL
      AND r.slice_start < NEW.slice_start + NEW.slice_size
      AND NEW.slice_start < r.slice_start + r.slice_size
      AND r.starts_at < NEW.ends_at
      AND NEW.starts_at < r.ends_at
)
BEGIN
    SELECT RAISE(ABORT, 'reservation overlaps a held reservation');
END;

CREATE TRIGGER reservations_release_once
BEFORE UPDATE OF released_at ON reservations
WHEN OLD.released_at IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'reservation already released');
END;

-- Append-only record of who did what.
CREATE TABLE audit_events (
    id         INTEGER PRIMARY KEY,
    at         INTEGER NOT NULL,
    actor_id   INTEGER REFERENCES users (id),
    action     TEXT    NOT NULL,
    target     TEXT,
    outcome    TEXT    NOT NULL CHECK (outcome IN ('success', 'failure', 'denied')),
    source     TEXT,
    request_id TEXT,
    detail     TEXT
);
CREATE INDEX audit_events_by_time ON audit_events (at);

CREATE TRIGGER audit_events_no_update BEFORE UPDATE ON audit_events
BEGIN
    SELECT RAISE(ABORT, 'audit events are append-only');
END;
CREATE TRIGGER audit_events_no_delete BEFORE DELETE ON audit_events
BEGIN
    SELECT RAISE(ABORT, 'audit events are append-only');
END;
