-- Who chose a provider's issuer: the operator (configuration, demo data) or someone in the
-- UI. Only the operator's may be on a private address without --allow-private-issuers.
ALTER TABLE oidc_providers ADD COLUMN set_by_operator INTEGER NOT NULL DEFAULT 0 CHECK (set_by_operator IN (0, 1));
UPDATE oidc_providers SET set_by_operator = 1 WHERE tenant_id IS NULL;
