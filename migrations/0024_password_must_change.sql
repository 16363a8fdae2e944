-- A password someone else chose or saw (the first-start administrator's, printed in the
-- log) must be replaced at the next sign-in. Nobody could change a password before this
-- migration, so the first-start administrator's is still the printed one.
ALTER TABLE users ADD COLUMN password_must_change INTEGER NOT NULL DEFAULT 0 CHECK (password_must_change IN (0, 1));
UPDATE users SET password_must_change = 1
WHERE email = 'admin@berth.local' AND role = 'platform_admin' AND password_hash IS NOT NULL;
