-- Usage sums: a released unit's charges added up per day and line, so that a month's report
-- and a booking's budget check read a few sums instead of every ledger row of the month.
--
-- A ledger unit is either summed (its charges are in usage_sums) or not (it is counted row
-- by row): the transaction that releases a unit sums it and marks it, so every unit counts
-- exactly once whichever way it is read. Units released before this migration are summed
-- by the platform when `berth serve` starts (`sum_released_usage`); until then they are
-- counted row by row, so nothing is ever missing.
ALTER TABLE usage_ledger ADD COLUMN summed INTEGER NOT NULL DEFAULT 0 CHECK (summed IN (0, 1));

-- The units counted row by row: those still held or booked, a few per GPU.
CREATE INDEX usage_ledger_unsummed ON usage_ledger (tenant_id) WHERE summed = 0;

-- Summed once, and only once its reservation is released (its charges are final then).
CREATE TRIGGER usage_ledger_summed_once
BEFORE UPDATE OF summed ON usage_ledger
WHEN OLD.summed = 1 OR (SELECT released_at FROM reservations WHERE id = NEW.reservation_id) IS NULL
BEGIN
    SELECT RAISE(ABORT, 'a ledger unit is summed once, after its release');
END;

-- A summed unit's reservation is final: its window and release cannot change under its sums.
CREATE TRIGGER reservations_summed_are_final
BEFORE UPDATE OF starts_at, ends_at, released_at ON reservations
WHEN EXISTS (SELECT 1 FROM usage_ledger WHERE reservation_id = OLD.id AND summed = 1)
BEGIN
    SELECT RAISE(ABORT, 'a summed unit''s reservation cannot change');
END;

-- Per charge basis ('use', 'window': a released unit's final charge on each basis, so that
-- the operator's `--charge-for` can change), day (its first millisecond, UTC) and line (whom
-- the units count for and what they were, as on the ledger):
-- - ms: the charged milliseconds on the day, all units together;
-- - day_microcents: each unit's charge for its milliseconds on the day, each rounded down
--   (`unit_charge`), added: the day's bar in a chart;
-- - month_microcents: each unit's charge for all its time in the day's month, rounded down
--   once, put on the first day it is charged in the month: a month's lines and budgets add
--   these up, so they equal a unit-by-unit sum exactly;
-- - environments: environments first counted in the month by a unit charged from this day.
CREATE TABLE usage_sums (
    basis            TEXT    NOT NULL CHECK (basis IN ('use', 'window')),
    day              INTEGER NOT NULL CHECK (day % 86400000 = 0),
    tenant_id        INTEGER REFERENCES tenants (id),
    project_id       INTEGER REFERENCES projects (id),
    owner_id         INTEGER NOT NULL REFERENCES users (id),
    offering         TEXT    NOT NULL,
    tier             TEXT    NOT NULL,
    gpu_model        TEXT    NOT NULL,
    mig_profile      TEXT,
    gpu_parts        INTEGER NOT NULL,
    gpu_part_of      INTEGER NOT NULL,
    ms               INTEGER NOT NULL CHECK (ms >= 0),
    day_microcents   INTEGER NOT NULL CHECK (day_microcents >= 0),
    month_microcents INTEGER NOT NULL CHECK (month_microcents >= 0),
    environments     INTEGER NOT NULL CHECK (environments >= 0)
);
-- One row per basis, tenant, day and line; a tenant's month (its report, its budgets) is a
-- range of it.
CREATE UNIQUE INDEX usage_sums_line ON usage_sums (
    basis, coalesce(tenant_id, 0), day, coalesce(project_id, 0), owner_id, offering, tier, gpu_model,
    coalesce(mig_profile, ''), gpu_parts, gpu_part_of
);
-- Every tenant's month, for platform staff and the fleet's allocation.
CREATE INDEX usage_sums_by_day ON usage_sums (basis, day);

CREATE TRIGGER usage_sums_no_delete BEFORE DELETE ON usage_sums
BEGIN
    SELECT RAISE(ABORT, 'usage sums are only added to');
END;
