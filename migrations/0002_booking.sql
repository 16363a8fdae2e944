-- Advance booking and quotas.

-- Bookings on a GPU in time order, for availability and earliest-fit queries.
CREATE INDEX reservations_unreleased_by_gpu_time ON reservations (gpu_id, starts_at) WHERE released_at IS NULL;
CREATE INDEX environments_by_window ON environments (starts_at) WHERE state NOT IN ('released', 'failed');

-- Moving a reservation's window (extending or shortening a booking) is held to the same
-- rule as inserting one: never two unreleased reservations on overlapping slices of one
-- GPU in overlapping windows.
CREATE TRIGGER reservations_never_overlap_when_moved
BEFORE UPDATE OF starts_at, ends_at ON reservations
WHEN NEW.released_at IS NULL AND EXISTS (
    SELECT 1 FROM reservations r
    WHERE r.gpu_id = NEW.gpu_id
      AND r.id <> NEW.id
      AND r.released_at IS NULL
      AND r.slice_start < NEW.slice_start + NEW.slice_size
      AND NEW.slice_start < r.slice_start + r.slice_size
      AND r.starts_at < NEW.ends_at
      AND NEW.starts_at < r.ends_at
)
BEGIN
    SELECT RAISE(ABORT, 'reservation overlaps a held reservation');
END;

-- Per-user limits; the row without a user is everyone's default. NULL is "no limit".
-- (Tenant and project levels come with tenants.)
CREATE TABLE quotas (
    id                  INTEGER PRIMARY KEY,
    user_id             INTEGER UNIQUE REFERENCES users (id),
    max_gpus            REAL    CHECK (max_gpus >= 0),
    gpu_hours_per_month REAL    CHECK (gpu_hours_per_month >= 0),
    max_booking_hours   INTEGER CHECK (max_booking_hours >= 1),
    max_overlapping     INTEGER CHECK (max_overlapping >= 1),
    updated_at          INTEGER NOT NULL
);
CREATE UNIQUE INDEX quotas_one_default ON quotas ((user_id IS NULL)) WHERE user_id IS NULL;
