-- The rule of 0019 (while a hard or hybrid tenant holds anything on a node, no other
-- tenant holds anything there), checked without visiting every reservation on the node.
--
-- Before, each reservation written joined every unreleased reservation overlapping it on
-- its node's GPUs to its environment and tenant, to learn whether that one was hard: on a
-- busy fleet most of a booking's INSERT, though a soft tenant's booking can only be barred
-- by a hard or hybrid tenant's reservation. Now every unreleased reservation says whether
-- its tenant is hard or hybrid (`hard`), and an index holds only those, so a soft tenant's
-- reservation looks at the few hard ones on its node; a hard tenant's still looks at all.

-- 1 while the reservation's tenant is hard or hybrid. Kept true for unreleased
-- reservations, the only ones the rule reads: set after each insert below, and on every
-- change of a tenant's isolation.
ALTER TABLE reservations ADD COLUMN hard INTEGER NOT NULL DEFAULT 0 CHECK (hard IN (0, 1));

UPDATE reservations SET hard = 1
WHERE released_at IS NULL
  AND environment_id IN (
      SELECT e.id FROM environments e JOIN tenants t ON t.id = e.tenant_id WHERE t.isolation <> 'soft');

CREATE INDEX reservations_hard_by_gpu_time ON reservations (gpu_id, starts_at)
WHERE released_at IS NULL AND hard = 1;

CREATE TRIGGER reservations_say_if_hard
AFTER INSERT ON reservations
WHEN NEW.released_at IS NULL AND coalesce((
    SELECT t.isolation FROM environments e JOIN tenants t ON t.id = e.tenant_id WHERE e.id = NEW.environment_id
), 'soft') <> 'soft'
BEGIN
    UPDATE reservations SET hard = 1 WHERE id = NEW.id;
END;

CREATE TRIGGER tenants_isolation_on_their_reservations
AFTER UPDATE OF isolation ON tenants
WHEN (OLD.isolation = 'soft') <> (NEW.isolation = 'soft')
BEGIN
    UPDATE reservations SET hard = (NEW.isolation <> 'soft')
    WHERE released_at IS NULL
      AND environment_id IN (SELECT id FROM environments WHERE tenant_id = NEW.id);
END;

-- The two triggers of 0019 again, each in two parts: a hard or hybrid newcomer may overlap
-- no other tenant's reservation on its node (staff's included: `IS NOT` treats no tenant as
-- one more); any newcomer may overlap no other tenant's hard reservation there.
DROP TRIGGER reservations_keep_hard_tenants_apart;
DROP TRIGGER reservations_keep_hard_tenants_apart_when_moved;

CREATE TRIGGER reservations_keep_hard_tenants_apart
BEFORE INSERT ON reservations
WHEN NEW.released_at IS NULL AND (
    (coalesce((
        SELECT t.isolation FROM environments ne JOIN tenants t ON t.id = ne.tenant_id WHERE ne.id = NEW.environment_id
     ), 'soft') <> 'soft'
     AND EXISTS (
        SELECT 1
        FROM gpus ng
        JOIN gpus g ON g.node_id = ng.node_id
        JOIN reservations r ON r.gpu_id = g.id AND r.released_at IS NULL
        JOIN environments e ON e.id = r.environment_id
        WHERE ng.id = NEW.gpu_id
          AND r.starts_at < NEW.ends_at
          AND NEW.starts_at < r.ends_at
          AND e.tenant_id IS NOT (SELECT tenant_id FROM environments WHERE id = NEW.environment_id)))
    OR EXISTS (
        SELECT 1
        FROM gpus ng
        JOIN gpus g ON g.node_id = ng.node_id
        JOIN reservations r ON r.gpu_id = g.id AND r.released_at IS NULL AND r.hard = 1
        JOIN environments e ON e.id = r.environment_id
        WHERE ng.id = NEW.gpu_id
          AND r.starts_at < NEW.ends_at
          AND NEW.starts_at < r.ends_at
          AND e.tenant_id IS NOT (SELECT tenant_id FROM environments WHERE id = NEW.environment_id))
)
BEGIN
    SELECT RAISE(ABORT, 'reservation shares a node with another tenant while one of them is hard-isolated');
END;

CREATE TRIGGER reservations_keep_hard_tenants_apart_when_moved
BEFORE UPDATE OF starts_at, ends_at ON reservations
WHEN NEW.released_at IS NULL AND (
    (NEW.hard = 1
     AND EXISTS (
        SELECT 1
        FROM gpus ng
        JOIN gpus g ON g.node_id = ng.node_id
        JOIN reservations r ON r.gpu_id = g.id AND r.released_at IS NULL AND r.id <> NEW.id
        JOIN environments e ON e.id = r.environment_id
        WHERE ng.id = NEW.gpu_id
          AND r.starts_at < NEW.ends_at
          AND NEW.starts_at < r.ends_at
          AND e.tenant_id IS NOT (SELECT tenant_id FROM environments WHERE id = NEW.environment_id)))
    OR EXISTS (
        SELECT 1
        FROM gpus ng
        JOIN gpus g ON g.node_id = ng.node_id
        JOIN reservations r ON r.gpu_id = g.id AND r.released_at IS NULL AND r.hard = 1 AND r.id <> NEW.id
        JOIN environments e ON e.id = r.environment_id
        WHERE ng.id = NEW.gpu_id
          AND r.starts_at < NEW.ends_at
          AND NEW.starts_at < r.ends_at
          AND e.tenant_id IS NOT (SELECT tenant_id FROM environments WHERE id = NEW.environment_id))
)
BEGIN
    SELECT RAISE(ABORT, 'reservation shares a node with another tenant while one of them is hard-isolated');
END;
