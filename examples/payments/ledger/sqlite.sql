-- The payments ledger on SQLite, in the same file as the idempotency records. Every
-- statement is idempotent. created_at is unix microseconds.

CREATE TABLE IF NOT EXISTS payments (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id         TEXT    NOT NULL,
    -- The key the payment was made under; NULL when made unprotected (NULLs never
    -- conflict). See postgres.sql.
    idempotency_key TEXT,
    amount          INTEGER NOT NULL CHECK (amount > 0),
    currency        TEXT    NOT NULL CHECK (currency GLOB '[A-Z][A-Z][A-Z]'),
    created_at      INTEGER NOT NULL,
    UNIQUE (user_id, idempotency_key)
);
