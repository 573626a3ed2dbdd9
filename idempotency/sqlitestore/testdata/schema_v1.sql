-- Schema of the SQLite idempotency store. Migrate applies it with every occurrence of
-- retrysafe_idempotency replaced by Config.Table; every statement is idempotent.

-- One row per (scope, key). Times are unix milliseconds. header is the stored response's
-- http.Header as JSON text, body its bytes; both are NULL while the record is in progress.
CREATE TABLE IF NOT EXISTS "retrysafe_idempotency" (
    scope        TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    fingerprint  TEXT    NOT NULL,
    state        TEXT    NOT NULL CHECK (state IN ('in_progress', 'done')),
    token        INTEGER NOT NULL,
    created_at   INTEGER NOT NULL,
    lease_until  INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL,
    status       INTEGER,
    header       TEXT,
    body         BLOB,
    body_omitted INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, key)
);

-- The janitor's index.
CREATE INDEX IF NOT EXISTS "retrysafe_idempotency_expires_at" ON "retrysafe_idempotency" (expires_at);

-- The last fencing token issued, for every key: each claim and takeover increments it in
-- the claim's transaction, so tokens only grow and are never reused.
CREATE TABLE IF NOT EXISTS "retrysafe_idempotency_token" (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    last INTEGER NOT NULL
);
INSERT OR IGNORE INTO "retrysafe_idempotency_token" (id, last) VALUES (1, 0);
