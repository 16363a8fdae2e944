-- A node's agent is also ordered GPU resets (issue 16): `nvidia-smi -i <gpu> -r` on an idle
-- GPU applies a MIG mode change that waits for one. A reset has a GPU and no level; a
-- check has a level and no GPU. SQLite cannot change a CHECK in place: the table is
-- rebuilt with its rows (ids kept, so an agent's open order answers the same id).
CREATE TABLE node_orders (
    id          INTEGER PRIMARY KEY,
    node_id     INTEGER NOT NULL REFERENCES nodes (id),
    kind        TEXT    NOT NULL CHECK (kind IN ('gpu_diagnostics', 'memory_errors', 'xid_events', 'nccl_bandwidth', 'infiniband', 'gpu_reset')),
    level       TEXT    CHECK (level IN ('quick', 'medium', 'long')),
    gpus        INTEGER NOT NULL CHECK (gpus >= 0),
    -- The GPU a reset is for.
    gpu         INTEGER CHECK (gpu >= 0),
    ordered_at  INTEGER NOT NULL,
    -- When the agent took it: taken orders are not handed out again.
    taken_at    INTEGER,
    answered_at INTEGER,
    output      TEXT,
    error       TEXT,
    CHECK ((answered_at IS NULL) = (output IS NULL AND error IS NULL)),
    CHECK ((kind = 'gpu_reset') = (gpu IS NOT NULL)),
    CHECK ((kind = 'gpu_reset') = (level IS NULL))
);
INSERT INTO node_orders (id, node_id, kind, level, gpus, ordered_at, taken_at, answered_at, output, error)
    SELECT id, node_id, kind, level, gpus, ordered_at, taken_at, answered_at, output, error FROM node_check_orders;
DROP TABLE node_check_orders;
CREATE INDEX node_orders_open ON node_orders (node_id) WHERE answered_at IS NULL;
