-- Monthly statements: each tenant's month (and platform staff's own bookings, tenant_id
-- NULL) closed once the month has ended, with its line items, frozen: later price changes,
-- renames and deletions never rewrite them.

-- What released units cost at list rates in a month (`month_microcents` is after discounts):
-- a statement's discount is the difference. Sums written before discounts existed cost
-- their list price.
ALTER TABLE usage_sums ADD COLUMN month_list_microcents INTEGER NOT NULL DEFAULT 0 CHECK (month_list_microcents >= 0);
UPDATE usage_sums SET month_list_microcents = month_microcents;

CREATE TABLE statements (
    id             INTEGER PRIMARY KEY,
    tenant_id      INTEGER REFERENCES tenants (id),
    -- "2026-11" (UTC).
    month          TEXT    NOT NULL CHECK (month GLOB '[0-9][0-9][0-9][0-9]-[0-1][0-9]'),
    -- What bookings were charged for when it closed (`use` or `window`).
    basis          TEXT    NOT NULL CHECK (basis IN ('use', 'window')),
    closed_at      INTEGER NOT NULL,
    -- The tenant's name then.
    tenant         TEXT    NOT NULL,
    list_cents     INTEGER NOT NULL CHECK (list_cents >= 0),
    discount_cents INTEGER NOT NULL CHECK (discount_cents >= 0),
    total_cents    INTEGER NOT NULL CHECK (total_cents = list_cents - discount_cents)
);
CREATE UNIQUE INDEX statements_one_per_month ON statements (coalesce(tenant_id, 0), month);

-- A statement's line items: per project, person and size (the rate card's line) and tier.
CREATE TABLE statement_lines (
    statement_id   INTEGER NOT NULL REFERENCES statements (id),
    position       INTEGER NOT NULL,
    project        TEXT,
    person         TEXT    NOT NULL,
    offering       TEXT    NOT NULL,
    -- "H100-80GB, MIG 3g.40gb"
    size           TEXT    NOT NULL,
    tier           TEXT    NOT NULL,
    -- Hours of the size's unit (a GPU, a slice, a share), and GPU-equivalent hours.
    unit_hours     REAL    NOT NULL CHECK (unit_hours >= 0),
    gpu_hours      REAL    NOT NULL CHECK (gpu_hours >= 0),
    -- "$3.20 per GPU-hour", or the prices in force over the month where it changed.
    rate           TEXT    NOT NULL,
    list_cents     INTEGER NOT NULL CHECK (list_cents >= 0),
    discount_cents INTEGER NOT NULL CHECK (discount_cents >= 0),
    total_cents    INTEGER NOT NULL CHECK (total_cents = list_cents - discount_cents),
    PRIMARY KEY (statement_id, position)
);

CREATE TRIGGER statements_are_frozen BEFORE UPDATE ON statements
BEGIN
    SELECT RAISE(ABORT, 'a closed statement is never changed');
END;
CREATE TRIGGER statements_are_kept BEFORE DELETE ON statements
BEGIN
    SELECT RAISE(ABORT, 'a closed statement is kept');
END;
CREATE TRIGGER statement_lines_are_frozen BEFORE UPDATE ON statement_lines
BEGIN
    SELECT RAISE(ABORT, 'a closed statement is never changed');
END;
CREATE TRIGGER statement_lines_are_kept BEFORE DELETE ON statement_lines
BEGIN
    SELECT RAISE(ABORT, 'a closed statement is kept');
END;
