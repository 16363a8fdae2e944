-- A launch refuses a name its owner already uses for a live environment, in the writer
-- turn: `environments_by_owner (owner_id, created_at)` answered that by reading every
-- environment the owner ever had, so a launch slowed with its owner's history. This index
-- holds only live environments, by owner and name.
CREATE INDEX environments_live_by_owner_name ON environments (owner_id, name)
WHERE state NOT IN ('released', 'failed');
