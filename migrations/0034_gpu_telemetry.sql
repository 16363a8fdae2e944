-- GPU telemetry and idle reclamation (issue 15).

-- Readings per booked GPU or MIG slice (a reservation), summed into buckets at two
-- resolutions: 60 s kept two hours, 300 s kept a day and an hour. A bucket keeps sums and
-- a count, so a reading is one upsert per resolution and averages are read, not stored.
CREATE TABLE gpu_samples (
    reservation_id   INTEGER NOT NULL REFERENCES reservations (id),
    resolution_s     INTEGER NOT NULL CHECK (resolution_s IN (60, 300)),
    -- The bucket's start, ms since the epoch, a whole multiple of the resolution.
    bucket           INTEGER NOT NULL CHECK (bucket % (resolution_s * 1000) = 0),
    readings         INTEGER NOT NULL CHECK (readings > 0),
    -- The first and last reading's times in the bucket: the idle rule counts from them.
    first_at         INTEGER NOT NULL,
    last_at          INTEGER NOT NULL CHECK (last_at >= first_at),
    utilization_sum  REAL    NOT NULL CHECK (utilization_sum >= 0),
    -- The bucket's highest utilization: a GPU busy for part of a bucket was busy in it.
    utilization_max  REAL    NOT NULL CHECK (utilization_max BETWEEN 0 AND 100),
    memory_used_sum  REAL    NOT NULL CHECK (memory_used_sum >= 0),
    memory_total_mib REAL    NOT NULL CHECK (memory_total_mib >= 0),
    power_sum        REAL    NOT NULL DEFAULT 0 CHECK (power_sum >= 0),
    power_readings   INTEGER NOT NULL DEFAULT 0 CHECK (power_readings >= 0),
    temperature_max  REAL,
    PRIMARY KEY (reservation_id, resolution_s, bucket)
) WITHOUT ROWID;
-- Pruning deletes by age.
CREATE INDEX gpu_samples_by_age ON gpu_samples (resolution_s, bucket);

-- GPU-seconds read and GPU-seconds busy (utilization times time) per UTC day, tenant and
-- GPU model: what the fleet and tenant efficiency figures read. GPU-equivalents, so a 3g
-- slice of an H100 counts 3/7.
CREATE TABLE gpu_use_days (
    day                 TEXT    NOT NULL CHECK (day GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]'),
    -- The environment's tenant; 0 for platform staff's own environments.
    tenant_id           INTEGER NOT NULL,
    model               TEXT    NOT NULL,
    sampled_gpu_seconds REAL    NOT NULL CHECK (sampled_gpu_seconds >= 0),
    busy_gpu_seconds    REAL    NOT NULL CHECK (busy_gpu_seconds >= 0 AND busy_gpu_seconds <= sampled_gpu_seconds + 1e-6),
    PRIMARY KEY (day, tenant_id, model)
) WITHOUT ROWID;

-- Idle policies per offering: the platform's (tenant_id NULL) and a tenant's stricter one.
CREATE TABLE idle_policies (
    id          INTEGER PRIMARY KEY,
    tenant_id   INTEGER REFERENCES tenants (id),
    offering    TEXT    NOT NULL CHECK (offering IN ('notebook', 'training', 'inference', 'cluster')),
    below_pct   REAL    NOT NULL CHECK (below_pct > 0 AND below_pct <= 100),
    idle_for_s  INTEGER NOT NULL CHECK (idle_for_s >= 10),
    grace_s     INTEGER NOT NULL CHECK (grace_s >= 0),
    max_keeps   INTEGER CHECK (max_keeps IS NULL OR max_keeps >= 0),
    updated_by  INTEGER REFERENCES users (id),
    updated_at  INTEGER NOT NULL
);
CREATE UNIQUE INDEX idle_policies_one_per_offering ON idle_policies (coalesce(tenant_id, 0), offering);

-- What the idle watcher knows of an environment beyond its readings. One row per
-- environment that was kept, warned, stopped or reached through the proxy.
CREATE TABLE idle_watch (
    environment_id TEXT    PRIMARY KEY REFERENCES environments (id),
    -- The owner's last "keep it", and how many this booking used.
    kept_at        INTEGER,
    keeps          INTEGER NOT NULL DEFAULT 0 CHECK (keeps >= 0),
    -- The last request the proxy passed to it (written at most once a minute).
    traffic_at     INTEGER,
    -- The standing warning: when the environment went idle and when it will be stopped.
    idle_since     INTEGER,
    stop_at        INTEGER,
    -- Set once, when the watcher stopped it.
    stopped_at     INTEGER,
    CHECK ((idle_since IS NULL) = (stop_at IS NULL))
) WITHOUT ROWID;
