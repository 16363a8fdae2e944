-- Each tenant's queue on the backend (Kubernetes: its Kueue ClusterQueue) mirrors its
-- quota. `queue_version` grows with every change the queue must follow (the tenant's
-- quota set or removed, the fleet changed, the tenant deleted, the periodic re-apply), in
-- the transaction of that change; the reconciler brings the backend in line (applies the
-- queue, or removes a deleted tenant's) and records in `queue_synced` the version it did
-- that for. A tenant whose `queue_synced` is behind has work waiting.
ALTER TABLE tenants ADD COLUMN queue_version INTEGER NOT NULL DEFAULT 1 CHECK (queue_version >= 1);
ALTER TABLE tenants ADD COLUMN queue_synced INTEGER NOT NULL DEFAULT 0
    CHECK (queue_synced >= 0 AND queue_synced <= queue_version);

-- Tenants deleted before queues existed never had one.
UPDATE tenants SET queue_synced = queue_version WHERE status = 'deleted';

CREATE INDEX tenants_queue_behind ON tenants (id) WHERE queue_synced < queue_version;
