-- The rate card (`domain::rates`): the price of an hour of each kind of unit on each GPU
-- model, the spot discount and tenants' discounts, each from the time it takes effect. A
-- unit is charged, piece by piece of its charged time, what was in force then.
--
-- Rows are never changed: a change is a new row from a later time. Rows from the past
-- are never removed either (the platform removes only changes still to come), so what was
-- charged stays what it was.

CREATE TABLE rates (
    id             INTEGER PRIMARY KEY,
    -- `GpuModel::name` and `RateKey::unit_key` (`gpu`, `mig:3g`, `share:4`).
    gpu_model      TEXT    NOT NULL,
    unit           TEXT    NOT NULL,
    cents_per_hour INTEGER NOT NULL CHECK (cents_per_hour BETWEEN 0 AND 10000000),
    effective_from INTEGER NOT NULL,
    set_at         INTEGER NOT NULL,
    set_by         INTEGER REFERENCES users (id)
);
CREATE UNIQUE INDEX rates_one_per_time ON rates (gpu_model, unit, effective_from);

-- The spot discount (tenant_id NULL) and tenants' discounts, in basis points.
CREATE TABLE discounts (
    id             INTEGER PRIMARY KEY,
    tenant_id      INTEGER REFERENCES tenants (id),
    basis_points   INTEGER NOT NULL CHECK (basis_points BETWEEN 0 AND 10000),
    effective_from INTEGER NOT NULL,
    set_at         INTEGER NOT NULL,
    set_by         INTEGER REFERENCES users (id)
);
CREATE UNIQUE INDEX discounts_one_per_time ON discounts (coalesce(tenant_id, 0), effective_from);

CREATE TRIGGER rates_are_kept BEFORE UPDATE ON rates
BEGIN
    SELECT RAISE(ABORT, 'a rate is never changed; add one from a later time');
END;
CREATE TRIGGER discounts_are_kept BEFORE UPDATE ON discounts
BEGIN
    SELECT RAISE(ABORT, 'a discount is never changed; add one from a later time');
END;

-- The card every Berth starts with (`rates::default_rates`), in force from the beginning:
-- the catalog's prices until now, so units booked before the card are charged as before,
-- except a dedicated cluster's node, which now costs its GPUs at the GPU rate ($25.60 an
-- hour for 8 x H100 instead of $26.40, $16.80 for 8 x A100 instead of $17.60).
INSERT INTO rates (gpu_model, unit, cents_per_hour, effective_from, set_at) VALUES
    ('H100-80GB', 'gpu', 320, 0, 0),
    ('A100-80GB', 'gpu', 210, 0, 0),
    ('L40S', 'gpu', 110, 0, 0),
    ('H100-80GB', 'mig:1g', 55, 0, 0),
    ('H100-80GB', 'mig:3g', 155, 0, 0),
    ('A100-80GB', 'mig:3g', 100, 0, 0),
    ('L40S', 'share:4', 30, 0, 0);
