-- Metering: a usage ledger beside the reservations, monthly budgets and their alerts.

-- When an environment's GPUs were first held for it: the start of provisioning. Part of the
-- environment's history (the ledger's own copy is per unit).
ALTER TABLE environments ADD COLUMN held_at INTEGER;

-- The usage ledger: one row per capacity unit (reservation), written by the transactions
-- that change capacity: the booking inserts it, the start of provisioning sets `held_from`;
-- the unit's window and release stay on its reservation, which the ledger joins. What the
-- ledger keeps is what must not change afterwards: whom it counts for (tenant, project and
-- person at booking time), what it was (offering, size, model, profile, tier), its share of
-- a GPU and its price.
CREATE TABLE usage_ledger (
    reservation_id      INTEGER PRIMARY KEY REFERENCES reservations (id),
    environment_id      TEXT    NOT NULL REFERENCES environments (id),
    tenant_id           INTEGER REFERENCES tenants (id),
    project_id          INTEGER REFERENCES projects (id),
    owner_id            INTEGER NOT NULL REFERENCES users (id),
    offering            TEXT    NOT NULL,
    size_id             TEXT    NOT NULL,
    gpu_model           TEXT    NOT NULL,
    mig_profile         TEXT,
    tier                TEXT    NOT NULL CHECK (tier IN ('guaranteed', 'spot')),
    -- The unit's share of one GPU, gpu_parts / gpu_part_of: a 3g slice of an H100 is 3/7,
    -- a quarter share 2/8, a whole GPU 8/8.
    gpu_parts           INTEGER NOT NULL CHECK (gpu_parts > 0),
    gpu_part_of         INTEGER NOT NULL CHECK (gpu_part_of >= gpu_parts),
    -- The size's price when booked, and how many units one copy of the size holds: a unit
    -- costs size_cents_per_hour / units_per_copy an hour.
    size_cents_per_hour INTEGER NOT NULL CHECK (size_cents_per_hour >= 0),
    units_per_copy      INTEGER NOT NULL CHECK (units_per_copy >= 1),
    booked_at           INTEGER NOT NULL,
    -- When its GPUs were held for it; NULL while booked and not started (or never started).
    held_from           INTEGER
);
CREATE INDEX usage_ledger_by_tenant ON usage_ledger (tenant_id, booked_at);
CREATE INDEX usage_ledger_by_environment ON usage_ledger (environment_id);

-- What the ledger says once held stays said.
CREATE TRIGGER usage_ledger_held_once
BEFORE UPDATE OF held_from ON usage_ledger
WHEN OLD.held_from IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'a ledger unit is held once');
END;
CREATE TRIGGER usage_ledger_no_delete BEFORE DELETE ON usage_ledger
BEGIN
    SELECT RAISE(ABORT, 'the usage ledger is append-only');
END;

-- Reservations booked before the ledger existed: counted from their window's start if
-- their environment got that far.
INSERT INTO usage_ledger (reservation_id, environment_id, tenant_id, project_id, owner_id, offering, size_id,
                          gpu_model, mig_profile, tier, gpu_parts, gpu_part_of, size_cents_per_hour, units_per_copy,
                          booked_at, held_from)
SELECT r.id, e.id, e.tenant_id, e.project_id, e.owner_id, e.offering, e.size_id, g.model, r.mig_profile, e.tier,
       CASE WHEN r.mig_profile IS NULL THEN r.slice_size ELSE CAST(substr(r.mig_profile, 1, 1) AS INTEGER) END,
       CASE WHEN r.mig_profile IS NULL THEN 8 ELSE 7 END,
       e.cents_per_hour,
       (SELECT count(*) FROM reservations o WHERE o.environment_id = e.id AND o.replica = r.replica),
       e.created_at,
       CASE WHEN e.state IN ('requested') OR (e.ready_at IS NULL AND e.state IN ('released', 'failed'))
            THEN NULL ELSE r.starts_at END
FROM reservations r JOIN environments e ON e.id = r.environment_id JOIN gpus g ON g.id = r.gpu_id;

UPDATE environments SET held_at = starts_at WHERE state <> 'requested' AND NOT (ready_at IS NULL AND state IN ('released', 'failed'));

-- Monthly budgets: a tenant's (project_id NULL) or one of its projects'.
CREATE TABLE budgets (
    id              INTEGER PRIMARY KEY,
    tenant_id       INTEGER NOT NULL REFERENCES tenants (id),
    project_id      INTEGER REFERENCES projects (id),
    cents_per_month INTEGER NOT NULL CHECK (cents_per_month >= 0),
    -- 1: crossing it is shown and recorded, bookings are not refused.
    warn_only       INTEGER NOT NULL DEFAULT 0 CHECK (warn_only IN (0, 1)),
    updated_at      INTEGER NOT NULL,
    updated_by      INTEGER REFERENCES users (id)
);
CREATE UNIQUE INDEX budgets_one_per_subject ON budgets (tenant_id, coalesce(project_id, 0));

-- A budget's 50%, 80% and 100% marks reached in a month, each recorded once.
CREATE TABLE budget_alerts (
    budget_id INTEGER NOT NULL REFERENCES budgets (id),
    month     TEXT    NOT NULL,
    threshold INTEGER NOT NULL CHECK (threshold IN (50, 80, 100)),
    at        INTEGER NOT NULL,
    PRIMARY KEY (budget_id, month, threshold)
);
