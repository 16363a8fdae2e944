-- Notifications (platform::notifications, domain::notification). Every row here is
-- written in the same transaction as the event it reports, so an event that committed is
-- never left untold and an event rolled back tells nothing.

-- The bell and /notifications: one row per person and event. Writing it is delivering it.
CREATE TABLE notifications (
    id         INTEGER PRIMARY KEY,
    user_id    INTEGER NOT NULL REFERENCES users (id),
    -- domain::notification::Kind::as_str
    kind       TEXT    NOT NULL,
    title      TEXT    NOT NULL CHECK (length(title) BETWEEN 1 AND 300),
    body       TEXT    NOT NULL,
    -- A path on the portal.
    link       TEXT    NOT NULL CHECK (link LIKE '/%'),
    created_at INTEGER NOT NULL,
    read_at    INTEGER
);
CREATE INDEX notifications_by_user ON notifications (user_id, id);
CREATE INDEX notifications_unread ON notifications (user_id) WHERE read_at IS NULL;

-- A tenant's webhooks, managed by its admins. The secret signs each delivery (HMAC needs
-- it in the clear); it is shown once, when the webhook is made.
CREATE TABLE tenant_webhooks (
    id         INTEGER PRIMARY KEY,
    tenant_id  INTEGER NOT NULL REFERENCES tenants (id),
    url        TEXT    NOT NULL CHECK (length(url) BETWEEN 8 AND 2000),
    format     TEXT    NOT NULL CHECK (format IN ('slack', 'json')),
    -- Comma-separated domain::notification::Kind names.
    kinds      TEXT    NOT NULL,
    secret     TEXT    NOT NULL,
    created_by INTEGER REFERENCES users (id),
    created_at INTEGER NOT NULL,
    removed_at INTEGER
);
CREATE INDEX tenant_webhooks_by_tenant ON tenant_webhooks (tenant_id) WHERE removed_at IS NULL;

-- What must leave Berth: an email to a person or a call of a tenant's webhook. A worker
-- claims due rows with a lease (attempts counted at the claim), sends, and marks the row
-- delivered, or due again after domain::notification::retry_after_ms, in one transaction.
-- A worker that dies after its claim leaves the lease to expire; the next one sends.
CREATE TABLE notification_outbox (
    id              INTEGER PRIMARY KEY,
    channel         TEXT    NOT NULL CHECK (channel IN ('email', 'webhook')),
    -- The person mailed (email) or NULL (webhook).
    user_id         INTEGER REFERENCES users (id),
    -- The address at the time of the event.
    recipient       TEXT,
    webhook_id      INTEGER REFERENCES tenant_webhooks (id),
    kind            TEXT    NOT NULL,
    title           TEXT    NOT NULL,
    body            TEXT    NOT NULL,
    link            TEXT    NOT NULL,
    created_at      INTEGER NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at INTEGER NOT NULL,
    lease_until     INTEGER,
    delivered_at    INTEGER,
    gave_up_at      INTEGER,
    last_error      TEXT,
    CHECK ((channel = 'email') = (user_id IS NOT NULL AND recipient IS NOT NULL AND webhook_id IS NULL)),
    CHECK ((channel = 'webhook') = (webhook_id IS NOT NULL AND user_id IS NULL)),
    CHECK (delivered_at IS NULL OR gave_up_at IS NULL)
);
CREATE INDEX notification_outbox_due ON notification_outbox (next_attempt_at)
    WHERE delivered_at IS NULL AND gave_up_at IS NULL;

-- Delivered once: a delivered row stays delivered.
CREATE TRIGGER notification_outbox_delivered_once
BEFORE UPDATE OF delivered_at, gave_up_at ON notification_outbox
WHEN OLD.delivered_at IS NOT NULL OR OLD.gave_up_at IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'a notification is delivered or given up once');
END;

-- Each try of a webhook, for its tenant's admins: the status the receiver answered, or
-- why there was none.
CREATE TABLE webhook_deliveries (
    id          INTEGER PRIMARY KEY,
    webhook_id  INTEGER NOT NULL REFERENCES tenant_webhooks (id),
    outbox_id   INTEGER NOT NULL REFERENCES notification_outbox (id),
    attempt     INTEGER NOT NULL,
    at          INTEGER NOT NULL,
    status_code INTEGER,
    error       TEXT,
    CHECK (status_code IS NOT NULL OR error IS NOT NULL)
);
CREATE INDEX webhook_deliveries_by_webhook ON webhook_deliveries (webhook_id, id);

-- Each person's channels per kind; a kind without a row gets the defaults (in-app and
-- email on).
CREATE TABLE notification_preferences (
    user_id INTEGER NOT NULL REFERENCES users (id),
    kind    TEXT    NOT NULL,
    in_app  INTEGER NOT NULL CHECK (in_app IN (0, 1)),
    email   INTEGER NOT NULL CHECK (email IN (0, 1)),
    PRIMARY KEY (user_id, kind)
);

-- The 30- and 10-minute warnings before a window ends: each at most once per environment
-- and mark.
CREATE TABLE window_end_warnings (
    environment_id TEXT    NOT NULL REFERENCES environments (id),
    minutes_before INTEGER NOT NULL CHECK (minutes_before IN (30, 10)),
    -- The end warned about: a window moved later is warned about again.
    ends_at        INTEGER NOT NULL,
    sent_at        INTEGER NOT NULL,
    PRIMARY KEY (environment_id, minutes_before, ends_at)
);
