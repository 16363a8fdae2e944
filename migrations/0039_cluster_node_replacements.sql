-- A running dedicated cluster that loses a node (issue 16): Berth books a healthy node of
-- the same model and site for the rest of the window, has the backend move the cluster onto
-- it, and only then releases the failed node's reservations. One row per cluster and failed
-- node: what its page and its owner are told.
CREATE TABLE cluster_node_replacements (
    id                  INTEGER PRIMARY KEY,
    environment_id      TEXT    NOT NULL REFERENCES environments (id),
    failed_node_id      INTEGER NOT NULL REFERENCES nodes (id),
    -- Why the node failed: its state change's reason.
    reason              TEXT    NOT NULL,
    decided_at          INTEGER NOT NULL,
    -- The node booked in its place; NULL while none is free (Berth keeps looking).
    replacement_node_id INTEGER REFERENCES nodes (id),
    replaced_at         INTEGER,
    -- While none is free: the first time one is, if within the window.
    next_free_at        INTEGER,
    -- Why it cannot be moved (the backend cannot, or its last try failed).
    problem             TEXT,
    -- The backend moved the cluster and the failed node's reservations were released.
    moved_at            INTEGER,
    UNIQUE (environment_id, failed_node_id),
    CHECK ((replacement_node_id IS NULL) = (replaced_at IS NULL)),
    CHECK (moved_at IS NULL OR replacement_node_id IS NOT NULL),
    CHECK (replacement_node_id IS NULL OR replacement_node_id <> failed_node_id)
);
CREATE INDEX cluster_node_replacements_unmoved ON cluster_node_replacements (environment_id) WHERE moved_at IS NULL;
