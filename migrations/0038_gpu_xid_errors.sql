-- XID errors the node agents report (issue 15: XIDs in the samples; issue 16: a fatal one
-- degrades its node). One row per error as the agent saw it, kept 30 days: the node page
-- lists a node's, and an environment's page the ones raised on its GPUs while it held them.
CREATE TABLE gpu_xid_errors (
    id      INTEGER PRIMARY KEY,
    gpu_id  INTEGER NOT NULL REFERENCES gpus (id),
    code    INTEGER NOT NULL CHECK (code >= 0),
    -- When the report carrying it arrived (ms since the epoch): the agent reports what NVML
    -- raised since its previous report, so the error is at most one interval older.
    seen_at INTEGER NOT NULL
);
CREATE INDEX gpu_xid_errors_by_gpu ON gpu_xid_errors (gpu_id, seen_at);
CREATE INDEX gpu_xid_errors_by_age ON gpu_xid_errors (seen_at);
