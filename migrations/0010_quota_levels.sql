-- Quotas at every level: everyone's default per user (the row naming nobody), a tenant's,
-- a project's and a user's own. A booking must fit all that apply to it. Per-model limits
-- sit beside the general one as JSON: {"H100-80GB": 8}.
CREATE TABLE quotas_by_level (
    id                  INTEGER PRIMARY KEY,
    tenant_id           INTEGER UNIQUE REFERENCES tenants (id),
    project_id          INTEGER UNIQUE REFERENCES projects (id),
    user_id             INTEGER UNIQUE REFERENCES users (id),
    max_gpus            REAL    CHECK (max_gpus >= 0),
    max_gpus_by_model   TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(max_gpus_by_model)),
    gpu_hours_per_month REAL    CHECK (gpu_hours_per_month >= 0),
    max_booking_hours   INTEGER CHECK (max_booking_hours >= 1),
    max_overlapping     INTEGER CHECK (max_overlapping >= 1),
    allow_spot          INTEGER NOT NULL DEFAULT 0 CHECK (allow_spot IN (0, 1)),
    updated_at          INTEGER NOT NULL,
    CHECK ((tenant_id IS NOT NULL) + (project_id IS NOT NULL) + (user_id IS NOT NULL) <= 1)
);

INSERT INTO quotas_by_level (id, user_id, max_gpus, gpu_hours_per_month, max_booking_hours, max_overlapping,
                             allow_spot, updated_at)
SELECT id, user_id, max_gpus, gpu_hours_per_month, max_booking_hours, max_overlapping, allow_spot, updated_at
FROM quotas;

DROP TABLE quotas;
ALTER TABLE quotas_by_level RENAME TO quotas;

CREATE UNIQUE INDEX quotas_one_default ON quotas ((1))
    WHERE tenant_id IS NULL AND project_id IS NULL AND user_id IS NULL;

-- Bookings counted against a project's quota.
CREATE INDEX environments_by_project ON environments (project_id) WHERE project_id IS NOT NULL;
