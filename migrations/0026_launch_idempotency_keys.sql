-- `Idempotency-Key` on the API's launches: a retried request with the same key, from the
-- same person, gets the booking the first one made instead of a second booking. The row
-- is written in the launch's own savepoint, with the environment it names, so a key is
-- never kept for a launch that was not booked, nor a booking made without its key; the
-- primary key refuses a second booking under one key even if two writers raced.
CREATE TABLE launch_idempotency_keys (
    user_id         INTEGER NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    idempotency_key TEXT    NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    -- SHA-256 of the launch request as the server read it: the same key with another
    -- request is refused, not answered with this booking.
    request_sha256  TEXT    NOT NULL CHECK (length(request_sha256) = 64),
    environment_id  TEXT    NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    created_at      INTEGER NOT NULL,
    -- After this the key is forgotten (and may be used again).
    expires_at      INTEGER NOT NULL CHECK (expires_at > created_at),
    PRIMARY KEY (user_id, idempotency_key)
) WITHOUT ROWID;
CREATE INDEX launch_idempotency_keys_by_expiry ON launch_idempotency_keys (expires_at);
