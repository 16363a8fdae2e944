-- The spot tier: bookings beyond a user's quota, allowed per quota row, that a guaranteed
-- booking reclaims when it needs their capacity.
ALTER TABLE quotas ADD COLUMN allow_spot INTEGER NOT NULL DEFAULT 0 CHECK (allow_spot IN (0, 1));
ALTER TABLE environments ADD COLUMN tier TEXT NOT NULL DEFAULT 'guaranteed' CHECK (tier IN ('guaranteed', 'spot'));
