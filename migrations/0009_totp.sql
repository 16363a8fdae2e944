-- A second factor for local platform administrators: a TOTP secret (RFC 6238, base32),
-- and the last time step a code was accepted for, so a code works only once.
ALTER TABLE users ADD COLUMN totp_secret TEXT;
ALTER TABLE users ADD COLUMN totp_last_step INTEGER;
