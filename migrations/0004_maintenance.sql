-- Maintenance windows: a node taken out of booking for a time. Bookings cannot be placed on
-- its GPUs during the window; those already there are listed for their owners to rebook.
CREATE TABLE maintenance_windows (
    id           INTEGER PRIMARY KEY,
    node_id      INTEGER NOT NULL REFERENCES nodes (id),
    starts_at    INTEGER NOT NULL,
    ends_at      INTEGER NOT NULL,
    reason       TEXT    NOT NULL CHECK (length(reason) BETWEEN 1 AND 200),
    created_by   INTEGER REFERENCES users (id),
    created_at   INTEGER NOT NULL,
    cancelled_at INTEGER,
    CHECK (ends_at > starts_at)
);
CREATE INDEX maintenance_windows_by_node ON maintenance_windows (node_id, starts_at);
