-- An inference endpoint's model, its server's arguments and environment variables
-- (`berth_domain::serving::Serving` as JSON; NULL for other offerings and older rows).
-- Values may be secrets (a token to fetch the model): pages and the API show names only.
ALTER TABLE environments ADD COLUMN serving TEXT;
