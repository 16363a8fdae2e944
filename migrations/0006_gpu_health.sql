-- GPU health as operators (and, later, node agents) report it. Only healthy GPUs take new
-- bookings; what runs on a degraded or failed GPU is listed for its owners to rebook.
ALTER TABLE gpus ADD COLUMN health TEXT NOT NULL DEFAULT 'healthy' CHECK (health IN ('healthy', 'degraded', 'failed'));
ALTER TABLE gpus ADD COLUMN health_note TEXT;
