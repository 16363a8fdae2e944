-- Hard and hybrid tenants get nodes of their own: while such a tenant holds anything on a
-- node, no other tenant (nor platform staff, whose environments have no tenant) holds
-- anything there. The booking transaction places by that rule with the cleaning gap
-- between tenants; the database holds the rule without the gap (it does not know the
-- operator's policy), whatever code path writes a reservation, moves one or changes a
-- tenant's isolation.

-- A new or moved reservation may not overlap, on any GPU of its node, an unreleased
-- reservation of another tenant (or of staff: `IS NOT` treats no tenant as one more)
-- while either of the two is hard or hybrid.
CREATE TRIGGER reservations_keep_hard_tenants_apart
BEFORE INSERT ON reservations
WHEN NEW.released_at IS NULL AND EXISTS (
    SELECT 1
    FROM environments ne
    JOIN gpus ng ON ng.id = NEW.gpu_id
    JOIN gpus g ON g.node_id = ng.node_id
    JOIN reservations r ON r.gpu_id = g.id AND r.released_at IS NULL
    JOIN environments e ON e.id = r.environment_id
    WHERE ne.id = NEW.environment_id
      AND r.starts_at < NEW.ends_at
      AND NEW.starts_at < r.ends_at
      AND e.tenant_id IS NOT ne.tenant_id
      AND (coalesce((SELECT isolation FROM tenants WHERE id = ne.tenant_id), 'soft') <> 'soft'
           OR coalesce((SELECT isolation FROM tenants WHERE id = e.tenant_id), 'soft') <> 'soft')
)
BEGIN
    SELECT RAISE(ABORT, 'reservation shares a node with another tenant while one of them is hard-isolated');
END;

CREATE TRIGGER reservations_keep_hard_tenants_apart_when_moved
BEFORE UPDATE OF starts_at, ends_at ON reservations
WHEN NEW.released_at IS NULL AND EXISTS (
    SELECT 1
    FROM environments ne
    JOIN gpus ng ON ng.id = NEW.gpu_id
    JOIN gpus g ON g.node_id = ng.node_id
    JOIN reservations r ON r.gpu_id = g.id AND r.released_at IS NULL AND r.id <> NEW.id
    JOIN environments e ON e.id = r.environment_id
    WHERE ne.id = NEW.environment_id
      AND r.starts_at < NEW.ends_at
      AND NEW.starts_at < r.ends_at
      AND e.tenant_id IS NOT ne.tenant_id
      AND (coalesce((SELECT isolation FROM tenants WHERE id = ne.tenant_id), 'soft') <> 'soft'
           OR coalesce((SELECT isolation FROM tenants WHERE id = e.tenant_id), 'soft') <> 'soft')
)
BEGIN
    SELECT RAISE(ABORT, 'reservation shares a node with another tenant while one of them is hard-isolated');
END;

-- A soft tenant sharing nodes with others cannot turn hard or hybrid until it no longer does.
CREATE TRIGGER tenants_turn_hard_only_on_nodes_of_their_own
BEFORE UPDATE OF isolation ON tenants
WHEN OLD.isolation = 'soft' AND NEW.isolation <> 'soft' AND EXISTS (
    SELECT 1
    FROM reservations a
    JOIN environments ea ON ea.id = a.environment_id
    JOIN gpus ga ON ga.id = a.gpu_id
    JOIN gpus gb ON gb.node_id = ga.node_id
    JOIN reservations b ON b.gpu_id = gb.id AND b.released_at IS NULL
    JOIN environments eb ON eb.id = b.environment_id
    WHERE ea.tenant_id = NEW.id
      AND a.released_at IS NULL
      AND eb.tenant_id IS NOT NEW.id
      AND a.starts_at < b.ends_at
      AND b.starts_at < a.ends_at
)
BEGIN
    SELECT RAISE(ABORT, 'the tenant shares nodes with other tenants');
END;
