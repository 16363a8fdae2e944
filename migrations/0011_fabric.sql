-- Fabric isolation identifiers of hard and hybrid tenants (see domain::fabric): a network
-- segment (VLAN id or VXLAN VNI), an InfiniBand P_Key, an NVLink partition and a storage
-- volume each, from pools, quarantined after release before anyone gets them again.

-- One identifier handed to one tenant. A lease is held (released_at NULL), then in
-- quarantine (released, retired_at NULL), then retired: its value is free again and the
-- row stays as history. Rows are never deleted.
CREATE TABLE fabric_leases (
    id               INTEGER PRIMARY KEY,
    kind             TEXT    NOT NULL CHECK (kind IN ('vlan', 'vni', 'pkey', 'nvlink', 'volume')),
    value            INTEGER NOT NULL,
    tenant_id        INTEGER NOT NULL REFERENCES tenants (id),
    held_at          INTEGER NOT NULL,
    released_at      INTEGER,
    -- When the value may be handed out again: released_at plus the quarantine.
    quarantine_until INTEGER,
    retired_at       INTEGER,
    -- What each protocol allows at all (the pools the operator sets lie inside): VLAN 1
    -- and 4095 are reserved, VNI 0 means none, P_Key 0x7FFF is the default partition.
    CHECK (CASE kind
        WHEN 'vlan'   THEN value BETWEEN 2 AND 4094
        WHEN 'vni'    THEN value BETWEEN 1 AND 16777215
        WHEN 'pkey'   THEN value BETWEEN 1 AND 32766
        WHEN 'nvlink' THEN value BETWEEN 1 AND 65535
        WHEN 'volume' THEN value BETWEEN 1 AND 999999
    END),
    CHECK ((released_at IS NULL) = (quarantine_until IS NULL)),
    CHECK (released_at IS NULL OR (released_at >= held_at AND quarantine_until >= released_at)),
    -- Retiring (freeing the value) before the quarantine is over is refused.
    CHECK (retired_at IS NULL OR (released_at IS NOT NULL AND retired_at >= quarantine_until))
);

-- The database itself refuses a double hand-out: while a value is held or in quarantine
-- no other lease of its kind may carry it.
CREATE UNIQUE INDEX fabric_leases_one_holder ON fabric_leases (kind, value) WHERE retired_at IS NULL;
-- A tenant holds at most one identifier of each kind.
CREATE UNIQUE INDEX fabric_leases_one_per_tenant ON fabric_leases (tenant_id, kind) WHERE released_at IS NULL;

-- Released exactly once: a second release would move the quarantine and hide the first.
CREATE TRIGGER fabric_leases_release_once
BEFORE UPDATE OF released_at, quarantine_until ON fabric_leases
WHEN OLD.released_at IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'fabric identifier already released');
END;

CREATE TRIGGER fabric_leases_retire_once
BEFORE UPDATE OF retired_at ON fabric_leases
WHEN OLD.retired_at IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'fabric identifier already retired');
END;

CREATE TRIGGER fabric_leases_keep_their_identifier
BEFORE UPDATE OF kind, value, tenant_id, held_at ON fabric_leases
BEGIN
    SELECT RAISE(ABORT, 'a fabric lease keeps its identifier, tenant and start');
END;

CREATE TRIGGER fabric_leases_no_delete
BEFORE DELETE ON fabric_leases
BEGIN
    SELECT RAISE(ABORT, 'fabric leases are kept as history');
END;

-- A tenant's storage volume: the lease of kind 'volume' (its value names the volume) and
-- the quota it was made with.
CREATE TABLE storage_volumes (
    lease_id    INTEGER PRIMARY KEY REFERENCES fabric_leases (id),
    quota_bytes INTEGER NOT NULL CHECK (quota_bytes > 0)
);
CREATE TRIGGER storage_volumes_are_volume_leases
BEFORE INSERT ON storage_volumes
WHEN (SELECT kind FROM fabric_leases WHERE id = NEW.lease_id) IS NOT 'volume'
BEGIN
    SELECT RAISE(ABORT, 'a storage volume needs a volume lease');
END;

-- The InfiniBand ports (HCA port GUIDs) in a tenant's partition. A port belongs to at most
-- one tenant: a port in two partitions would join them.
CREATE TABLE tenant_port_guids (
    guid      TEXT    PRIMARY KEY CHECK (
        length(guid) = 18
        AND guid GLOB '0x[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]'
        AND guid <> '0x0000000000000000'
    ),
    tenant_id INTEGER NOT NULL REFERENCES tenants (id),
    added_at  INTEGER NOT NULL
);
CREATE INDEX tenant_port_guids_by_tenant ON tenant_port_guids (tenant_id);

-- Ports join only a tenant that holds a P_Key, and leave before it is released, so every
-- listed port is in exactly one live partition.
CREATE TRIGGER tenant_port_guids_need_a_pkey
BEFORE INSERT ON tenant_port_guids
WHEN NOT EXISTS (
    SELECT 1 FROM fabric_leases WHERE tenant_id = NEW.tenant_id AND kind = 'pkey' AND released_at IS NULL
)
BEGIN
    SELECT RAISE(ABORT, 'port GUIDs belong to a tenant that holds a P_Key');
END;
CREATE TRIGGER fabric_leases_pkey_released_without_ports
BEFORE UPDATE OF released_at ON fabric_leases
WHEN NEW.kind = 'pkey' AND NEW.released_at IS NOT NULL
 AND EXISTS (SELECT 1 FROM tenant_port_guids WHERE tenant_id = NEW.tenant_id)
BEGIN
    SELECT RAISE(ABORT, 'remove the tenant''s port GUIDs before releasing its P_Key');
END;
