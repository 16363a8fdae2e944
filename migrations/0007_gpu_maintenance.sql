-- Maintenance on one GPU of a node instead of the whole node (NULL: the whole node).
ALTER TABLE maintenance_windows ADD COLUMN gpu_id INTEGER REFERENCES gpus (id);
