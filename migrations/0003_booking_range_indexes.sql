-- Bookings overlapping a range of time: by start (windows are at most two weeks long),
-- and by end for those held past it while their teardown runs.
CREATE INDEX reservations_unreleased_by_start ON reservations (starts_at) WHERE released_at IS NULL;
CREATE INDEX reservations_unreleased_by_end ON reservations (ends_at) WHERE released_at IS NULL;
