-- Bare-metal nodes (`berth serve --backend baremetal`): what each environment's provisioning
-- steps ask of a node, the plan the node's agent fetches (built from those parts), and what
-- the agent last applied.

-- The node's address on its underlay network, as its agent reports it: the tenants' other
-- nodes send their VXLAN traffic there.
ALTER TABLE nodes ADD COLUMN underlay_address TEXT;

-- One environment's part of a node's plan: its MIG instances there, its tenant's network
-- attachment, or its workload. A step sets or deletes parts; teardown deletes them all.
CREATE TABLE node_plan_parts (
    node_id        INTEGER NOT NULL REFERENCES nodes (id),
    environment_id TEXT    NOT NULL REFERENCES environments (id),
    kind           TEXT    NOT NULL CHECK (kind IN ('mig', 'network', 'workload')),
    body           TEXT    NOT NULL CHECK (json_valid(body)),
    PRIMARY KEY (node_id, environment_id, kind)
);
CREATE INDEX node_plan_parts_by_environment ON node_plan_parts (environment_id);

-- A node's plan (domain::node_plan::NodePlan as JSON), bumped to a new generation whenever
-- its parts change what it says, and the agent's last report on it.
CREATE TABLE node_plans (
    node_id             INTEGER PRIMARY KEY REFERENCES nodes (id),
    generation          INTEGER NOT NULL CHECK (generation >= 1),
    plan                TEXT    NOT NULL CHECK (json_valid(plan)),
    changed_at          INTEGER NOT NULL,
    -- The generation the agent last worked on, and what stopped it (NULL: applied).
    reported_generation INTEGER NOT NULL DEFAULT 0 CHECK (reported_generation BETWEEN 0 AND generation),
    reported_error      TEXT,
    reported_at         INTEGER,
    -- The agent's last word on each workload (domain::node_plan::WorkloadStatus list).
    workloads           TEXT    NOT NULL DEFAULT '[]' CHECK (json_valid(workloads))
);

-- A step waits for "applied generation >= the one it wrote": a generation that went back
-- would let it succeed on an older plan.
CREATE TRIGGER node_plans_generation_grows
BEFORE UPDATE OF generation ON node_plans
WHEN NEW.generation < OLD.generation
BEGIN
    SELECT RAISE(ABORT, 'a node plan''s generation only grows');
END;
