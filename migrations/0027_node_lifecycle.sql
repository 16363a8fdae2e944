-- A node's health lifecycle (domain::node_health): its state, every change of it (who,
-- why, when) and the checks it was put through, with their raw outputs.
--
-- Nodes already here were taking bookings before this migration: they start available.
-- A node the fleet file adds later starts available too, unless its pool says
-- `acceptance = true` (then it starts new; see capacity::fleet::sync_fleet).
ALTER TABLE nodes ADD COLUMN state TEXT NOT NULL DEFAULT 'available'
    CHECK (state IN ('new', 'testing', 'available', 'degraded', 'draining', 'in_repair', 'retired'));
-- The repair tier in progress while in_repair; else the last tier tried since the node was
-- last available (0: none). Each incident climbs the tiers; after the last, retired.
ALTER TABLE nodes ADD COLUMN repair_tier INTEGER NOT NULL DEFAULT 0 CHECK (repair_tier >= 0);
-- Only an available node has no incident: leaving repair resets the climb.
CREATE TRIGGER nodes_available_have_no_repair_tier
BEFORE UPDATE OF state, repair_tier ON nodes
WHEN NEW.state = 'available' AND NEW.repair_tier <> 0
BEGIN
    SELECT RAISE(ABORT, 'an available node has no repair tier');
END;

-- Every change of a node's state. Append-only, like the audit log; the node's current
-- state is the last row's to_state (node_state_changes_follow_the_node holds it).
CREATE TABLE node_state_changes (
    id          INTEGER PRIMARY KEY,
    node_id     INTEGER NOT NULL REFERENCES nodes (id),
    from_state  TEXT    NOT NULL,
    to_state    TEXT    NOT NULL,
    repair_tier INTEGER NOT NULL,
    -- domain::node_health::NodeEvent::as_str
    event       TEXT    NOT NULL,
    reason      TEXT    NOT NULL CHECK (length(reason) BETWEEN 1 AND 500),
    -- The person who acted; NULL when Berth did (a check's verdict, an agent's report).
    changed_by  INTEGER REFERENCES users (id),
    changed_at  INTEGER NOT NULL
);
CREATE INDEX node_state_changes_by_node ON node_state_changes (node_id, id);

-- A change row is written with the node's update in one transaction, and must describe it.
CREATE TRIGGER node_state_changes_follow_the_node
BEFORE INSERT ON node_state_changes
WHEN (SELECT state FROM nodes WHERE id = NEW.node_id) IS NOT NEW.to_state
BEGIN
    SELECT RAISE(ABORT, 'a node state change must match the node''s state');
END;
CREATE TRIGGER node_state_changes_no_update BEFORE UPDATE ON node_state_changes
BEGIN
    SELECT RAISE(ABORT, 'node state changes are append-only');
END;
CREATE TRIGGER node_state_changes_no_delete BEFORE DELETE ON node_state_changes
BEGIN
    SELECT RAISE(ABORT, 'node state changes are append-only');
END;

-- One run of checks on a node (acceptance, or a check on demand), and each check's result.
CREATE TABLE node_check_runs (
    id           INTEGER PRIMARY KEY,
    node_id      INTEGER NOT NULL REFERENCES nodes (id),
    level        TEXT    NOT NULL CHECK (level IN ('quick', 'medium', 'long')),
    -- acceptance: its verdict moves the node (testing -> available or degraded);
    -- on_demand: a failure degrades an available node, a pass changes nothing.
    purpose      TEXT    NOT NULL CHECK (purpose IN ('acceptance', 'on_demand')),
    requested_by INTEGER REFERENCES users (id),
    started_at   INTEGER NOT NULL,
    finished_at  INTEGER,
    passed       INTEGER CHECK (passed IN (0, 1)),
    CHECK ((finished_at IS NULL) = (passed IS NULL))
);
CREATE INDEX node_check_runs_by_node ON node_check_runs (node_id, id);

CREATE TABLE node_check_results (
    id         INTEGER PRIMARY KEY,
    run_id     INTEGER NOT NULL REFERENCES node_check_runs (id),
    -- domain::node_checks::CheckKind::as_str
    kind       TEXT    NOT NULL,
    passed     INTEGER NOT NULL CHECK (passed IN (0, 1)),
    measured   REAL,
    threshold  REAL,
    unit       TEXT    NOT NULL,
    summary    TEXT    NOT NULL,
    command    TEXT    NOT NULL,
    -- What the command printed, kept for whoever must judge the verdict (capped by the
    -- platform at 64 KiB).
    raw_output TEXT    NOT NULL,
    UNIQUE (run_id, kind)
);
