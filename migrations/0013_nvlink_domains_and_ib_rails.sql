-- Multi-node NVLink domains already live in nodes.nvlink_domain (a name shared by the
-- nodes of one domain). InfiniBand: the scalable unit a node sits in, and the rail each
-- GPU is cabled to; NULL where there is no InfiniBand.
ALTER TABLE nodes ADD COLUMN ib_unit TEXT;
ALTER TABLE gpus ADD COLUMN ib_rail INTEGER CHECK (ib_rail >= 0);
