-- Schema of the SQLite idempotency store. Migrate applies it with every occurrence of
-- retrysafe_idempotency replaced by Config.Table; every statement is idempotent. On a
-- table made by an earlier schema, Migrate first adds the columns it lacks (headers,
-- abandoned, route) with ALTER TABLE ADD COLUMN, so that both end up with the same
-- columns in the same order.

-- One row per (scope, key). Times are unix milliseconds of the store's clock. Once the
-- record is done: status, headers (the response's header and trailer, encoded by
-- internal/headercodec, byte for byte), body (its bytes) and body_omitted; all NULL
-- while it is in progress. header is the header as JSON text, the encoding of the first
-- schema, which no release had: this store reads it when headers is NULL (a record
-- written before the migration, or by a binary of that schema) and does not write it.
-- abandoned is 1 while the owner has given the request up (Store.Abandon).
-- route is what the record was claimed under, for operators (NULL: none, or claimed
-- before the column existed). claim_id is the ID of the claim that holds the record
-- (ClaimRequest.ID), by which a claim sent again recognises its own record. headers, abandoned and route come last, where ALTER TABLE
-- puts them: a lost claim that is no replay reads none of them, so it never reads past
-- body's first bytes.
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
    headers      BLOB,
    abandoned    INTEGER NOT NULL DEFAULT 0,
    route        TEXT,
    claim_id     TEXT,
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

-- An earlier binary (after a rollback, or one still running beside this one) claims and
-- completes records setting header but not headers or abandoned. This store sets header
-- and headers in the same statements, always to a NULL headers or a new one; a write
-- that sets header and leaves headers as it was, non-NULL, or leaves an abandoned flag,
-- is the earlier binary's: clear both, so that the record it wrote is read from header
-- and is not abandoned, instead of showing the previous record's headers and flag.
CREATE TRIGGER IF NOT EXISTS "retrysafe_idempotency_earlier_write"
AFTER UPDATE OF header ON "retrysafe_idempotency"
FOR EACH ROW WHEN NEW.headers IS OLD.headers AND (NEW.headers IS NOT NULL OR NEW.abandoned <> 0)
BEGIN
    UPDATE "retrysafe_idempotency" SET headers = NULL, abandoned = 0
    WHERE scope = NEW.scope AND key = NEW.key;
END;
