-- `reservations_unreleased_by_gpu_time (gpu_id, starts_at)` answers every lookup by GPU
-- that `reservations_held (gpu_id)` did, over the same unreleased rows; the second index
-- only cost every booking's reservations one more B-tree insert (and every release one
-- more delete).
DROP INDEX reservations_held;
