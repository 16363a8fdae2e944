-- Checks a bare-metal node's agent is asked to run (issue 16). The portal writes an order,
-- the agent takes it (`GET /api/v1/agent/checks`), runs the check's own command and
-- answers (`POST /api/v1/agent/checks/{id}`); the portal judges the output as it judges the
-- simulated fleet's. An order nobody answered in the check's time limit is closed with an
-- error, and a late answer changes nothing.
CREATE TABLE node_check_orders (
    id          INTEGER PRIMARY KEY,
    node_id     INTEGER NOT NULL REFERENCES nodes (id),
    kind        TEXT    NOT NULL CHECK (kind IN ('gpu_diagnostics', 'memory_errors', 'xid_events', 'nccl_bandwidth', 'infiniband')),
    level       TEXT    NOT NULL CHECK (level IN ('quick', 'medium', 'long')),
    gpus        INTEGER NOT NULL CHECK (gpus >= 0),
    ordered_at  INTEGER NOT NULL,
    -- When the agent took it: taken orders are not handed out again.
    taken_at    INTEGER,
    answered_at INTEGER,
    output      TEXT,
    error       TEXT,
    CHECK ((answered_at IS NULL) = (output IS NULL AND error IS NULL))
);
CREATE INDEX node_check_orders_open ON node_check_orders (node_id) WHERE answered_at IS NULL;
