-- The development tier: GPUs time-sliced into 2, 4 or 8 shares, which serve nothing else.
-- A share is a reservation of 8 / ways slice positions at a multiple of that width, so the
-- overlap triggers keep two bookings off one share exactly as they keep them off one MIG
-- slice, and a whole-GPU hold (maintenance) covers every share.
ALTER TABLE gpus ADD COLUMN time_slices INTEGER NOT NULL DEFAULT 1 CHECK (time_slices IN (1, 2, 4, 8));

-- The reservations table again, with its CHECK widened to shares; SQLite cannot alter a
-- CHECK in place. Indexes and triggers are recreated as they were.
CREATE TABLE reservations_v2 (
    id             INTEGER PRIMARY KEY,
    environment_id TEXT    NOT NULL REFERENCES environments (id),
    gpu_id         INTEGER NOT NULL REFERENCES gpus (id),
    slice_start    INTEGER NOT NULL CHECK (slice_start BETWEEN 0 AND 7),
    slice_size     INTEGER NOT NULL CHECK (slice_size BETWEEN 1 AND 8 AND slice_start + slice_size <= 8),
    mig_profile    TEXT,
    starts_at      INTEGER NOT NULL,
    ends_at        INTEGER NOT NULL,
    released_at    INTEGER,
    CHECK (ends_at > starts_at),
    -- A MIG instance, the whole GPU, or one share of a time-sliced GPU.
    CHECK (mig_profile IS NOT NULL
           OR (slice_start = 0 AND slice_size = 8)
           OR (slice_size IN (1, 2, 4) AND slice_start % slice_size = 0))
);
INSERT INTO reservations_v2 SELECT id, environment_id, gpu_id, slice_start, slice_size, mig_profile, starts_at,
    ends_at, released_at FROM reservations;
DROP TABLE reservations;
ALTER TABLE reservations_v2 RENAME TO reservations;

CREATE INDEX reservations_held ON reservations (gpu_id) WHERE released_at IS NULL;
CREATE INDEX reservations_by_environment ON reservations (environment_id);
CREATE INDEX reservations_unreleased_by_gpu_time ON reservations (gpu_id, starts_at) WHERE released_at IS NULL;
CREATE INDEX reservations_unreleased_by_start ON reservations (starts_at) WHERE released_at IS NULL;
CREATE INDEX reservations_unreleased_by_end ON reservations (ends_at) WHERE released_at IS NULL;

CREATE TRIGGER reservations_never_overlap
BEFORE INSERT ON reservations
WHEN EXISTS (
    SELECT 1 FROM reservations r
    WHERE r.gpu_id = NEW.gpu_id
      AND r.released_at IS NULL
      AND r.slice_start < NEW.slice_start + NEW.slice_size
      AND NEW.slice_start < r.slice_start + r.slice_size
      AND r.starts_at < NEW.ends_at
      AND NEW.starts_at < r.ends_at
)
BEGIN
    SELECT RAISE(ABORT, 'reservation overlaps a held reservation');
END;

CREATE TRIGGER reservations_release_once
BEFORE UPDATE OF released_at ON reservations
WHEN OLD.released_at IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'reservation already released');
END;

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

-- A share only on a GPU time-sliced that many ways; whole GPUs and MIG slices only on
-- GPUs that are not time-sliced.
CREATE TRIGGER reservations_fit_the_gpu
BEFORE INSERT ON reservations
WHEN NOT EXISTS (
    SELECT 1 FROM gpus g
    WHERE g.id = NEW.gpu_id
      AND CASE WHEN NEW.mig_profile IS NULL AND NEW.slice_size < 8 THEN g.time_slices * NEW.slice_size = 8
               ELSE g.time_slices = 1 END
)
BEGIN
    SELECT RAISE(ABORT, 'reservation does not fit how its GPU is shared');
END;
