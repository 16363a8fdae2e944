-- Why a tenant's queue could not be brought in line, for platform admins on the tenants
-- page: the backend's words from the last failed sync, and since when syncs have been
-- failing. The next sync that succeeds clears both.
ALTER TABLE tenants ADD COLUMN queue_error TEXT;
ALTER TABLE tenants ADD COLUMN queue_failing_since INTEGER
    CHECK ((queue_error IS NULL) = (queue_failing_since IS NULL));
