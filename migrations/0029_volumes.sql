-- Volumes: storage that outlives a booking. A volume is personal (project_id NULL) or
-- shared with a project; each person has at most one home volume. A deleted volume stays
-- as a tombstone (deleted_at) so its history and audit rows keep their meaning; the
-- backend's storage goes after it (storage_removed_at).
CREATE TABLE volumes (
    id                 INTEGER PRIMARY KEY,
    -- NULL for platform staff's own volumes, like their environments.
    tenant_id          INTEGER REFERENCES tenants (id),
    project_id         INTEGER REFERENCES projects (id),
    owner_id           INTEGER NOT NULL REFERENCES users (id),
    -- A DNS label (domain::volume::validate_name); "home" only for the home volume.
    name               TEXT    NOT NULL CHECK (length(name) BETWEEN 1 AND 63
                                               AND name NOT GLOB '*[^a-z0-9-]*'
                                               AND name GLOB '[a-z]*' AND name NOT GLOB '*-'),
    is_home            INTEGER NOT NULL DEFAULT 0 CHECK (is_home IN (0, 1)),
    size_gib           INTEGER NOT NULL CHECK (size_gib BETWEEN 1 AND 65536),
    -- Where the backend keeps it (a directory, a claim), once it was first made there.
    location           TEXT,
    -- Bytes in use as last measured, where the backend can measure it.
    used_bytes         INTEGER CHECK (used_bytes >= 0),
    measured_at        INTEGER,
    created_at         INTEGER NOT NULL,
    deleted_at         INTEGER,
    storage_removed_at INTEGER,
    CHECK (is_home = 0 OR (project_id IS NULL AND name = 'home')),
    CHECK (is_home = 1 OR name <> 'home'),
    CHECK (deleted_at IS NULL OR deleted_at >= created_at),
    CHECK (storage_removed_at IS NULL OR deleted_at IS NOT NULL)
);

-- Names are unique in their scope among live volumes: a project's, or one person's own.
CREATE UNIQUE INDEX volumes_name_per_project ON volumes (project_id, name)
    WHERE project_id IS NOT NULL AND deleted_at IS NULL;
CREATE UNIQUE INDEX volumes_name_per_owner ON volumes (owner_id, name)
    WHERE project_id IS NULL AND deleted_at IS NULL;
CREATE INDEX volumes_by_tenant ON volumes (tenant_id) WHERE deleted_at IS NULL;

-- A volume's tenant is its owner's (and its project's).
CREATE TRIGGER volumes_stay_in_their_tenant
BEFORE INSERT ON volumes
WHEN NEW.tenant_id IS NOT (SELECT tenant_id FROM users WHERE id = NEW.owner_id)
  OR (NEW.project_id IS NOT NULL
      AND NEW.tenant_id IS NOT (SELECT tenant_id FROM projects WHERE id = NEW.project_id))
BEGIN
    SELECT RAISE(ABORT, 'a volume belongs to its owner''s tenant and its project''s');
END;

CREATE TRIGGER volumes_keep_their_owner
BEFORE UPDATE OF tenant_id, project_id, owner_id, name, is_home ON volumes
WHEN NEW.tenant_id IS NOT OLD.tenant_id OR NEW.project_id IS NOT OLD.project_id
  OR NEW.owner_id IS NOT OLD.owner_id OR NEW.name IS NOT OLD.name OR NEW.is_home IS NOT OLD.is_home
BEGIN
    SELECT RAISE(ABORT, 'a volume keeps its tenant, project, owner and name');
END;

-- Only grown: shrinking could cut off files already written.
CREATE TRIGGER volumes_only_grow
BEFORE UPDATE OF size_gib ON volumes
WHEN NEW.size_gib < OLD.size_gib OR OLD.deleted_at IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'a volume only grows, and a deleted one not at all');
END;

CREATE TRIGGER volumes_delete_once
BEFORE UPDATE OF deleted_at ON volumes
WHEN OLD.deleted_at IS NOT NULL AND NEW.deleted_at IS NOT OLD.deleted_at
BEGIN
    SELECT RAISE(ABORT, 'a volume is deleted once');
END;

CREATE TRIGGER volumes_no_delete
BEFORE DELETE ON volumes
BEGIN
    SELECT RAISE(ABORT, 'volumes are kept as tombstones; set deleted_at');
END;

CREATE TABLE volume_attachments (
    id             INTEGER PRIMARY KEY,
    volume_id      INTEGER NOT NULL REFERENCES volumes (id),
    environment_id TEXT    NOT NULL REFERENCES environments (id),
    mount_path     TEXT    NOT NULL CHECK (mount_path GLOB '/*'),
    attached_at    INTEGER NOT NULL,
    detached_at    INTEGER,
    CHECK (detached_at IS NULL OR detached_at >= attached_at),
    UNIQUE (volume_id, environment_id)
);

CREATE UNIQUE INDEX volume_attachments_one_per_path ON volume_attachments (environment_id, mount_path)
    WHERE detached_at IS NULL;
CREATE INDEX volume_attachments_attached ON volume_attachments (volume_id) WHERE detached_at IS NULL;

-- Never another tenant's, never a deleted volume; the environment's tenant is the volume's.
CREATE TRIGGER volume_attachments_same_tenant
BEFORE INSERT ON volume_attachments
WHEN (SELECT tenant_id FROM volumes WHERE id = NEW.volume_id)
     IS NOT (SELECT tenant_id FROM environments WHERE id = NEW.environment_id)
BEGIN
    SELECT RAISE(ABORT, 'a volume is attached only to its own tenant''s environments');
END;

CREATE TRIGGER volume_attachments_live_volume
BEFORE INSERT ON volume_attachments
WHEN (SELECT deleted_at FROM volumes WHERE id = NEW.volume_id) IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'a deleted volume cannot be attached');
END;

CREATE TRIGGER volume_attachments_detach_once
BEFORE UPDATE ON volume_attachments
WHEN OLD.detached_at IS NOT NULL OR NEW.volume_id IS NOT OLD.volume_id
  OR NEW.environment_id IS NOT OLD.environment_id OR NEW.mount_path IS NOT OLD.mount_path
  OR NEW.attached_at IS NOT OLD.attached_at
BEGIN
    SELECT RAISE(ABORT, 'an attachment only ends, once');
END;

CREATE TRIGGER volume_attachments_no_delete
BEFORE DELETE ON volume_attachments
BEGIN
    SELECT RAISE(ABORT, 'attachments are history; set detached_at');
END;

-- No delete while attached.
CREATE TRIGGER volumes_no_delete_while_attached
BEFORE UPDATE OF deleted_at ON volumes
WHEN NEW.deleted_at IS NOT NULL
 AND EXISTS (SELECT 1 FROM volume_attachments WHERE volume_id = NEW.id AND detached_at IS NULL)
BEGIN
    SELECT RAISE(ABORT, 'a volume is deleted only when nothing has it attached');
END;

-- Storage limits beside the GPU quotas: GiB of live volumes per tenant and per project,
-- and for a tenant the size of its people's home volumes.
CREATE TABLE storage_quotas (
    id              INTEGER PRIMARY KEY,
    tenant_id       INTEGER UNIQUE REFERENCES tenants (id),
    project_id      INTEGER UNIQUE REFERENCES projects (id),
    max_gib         INTEGER CHECK (max_gib >= 0),
    home_gib        INTEGER CHECK (home_gib BETWEEN 1 AND 65536),
    updated_at      INTEGER NOT NULL,
    CHECK ((tenant_id IS NOT NULL) + (project_id IS NOT NULL) = 1),
    CHECK (home_gib IS NULL OR tenant_id IS NOT NULL)
);

-- A released or failed environment holds no volume: its release detaches them.
CREATE TRIGGER environments_end_with_volumes_detached
BEFORE UPDATE OF state ON environments
WHEN NEW.state IN ('released', 'failed')
 AND EXISTS (SELECT 1 FROM volume_attachments WHERE environment_id = NEW.id AND detached_at IS NULL)
BEGIN
    SELECT RAISE(ABORT, 'an environment ends only after its volumes are detached');
END;
