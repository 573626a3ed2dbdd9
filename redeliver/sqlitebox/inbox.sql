-- retrysafe inbox (package redeliver/sqlitebox): the message ids a consumer has
-- processed. {table} and {index} are replaced by quoted identifiers. Idempotent.

CREATE TABLE IF NOT EXISTS {table} (
    queue        TEXT    NOT NULL, -- the queue the message came from (Message.Queue)
    message_id   TEXT    NOT NULL, -- Message.ID
    processed_at INTEGER NOT NULL, -- unix milliseconds
    expires_at   INTEGER NOT NULL, -- unix milliseconds, after which DeleteExpired removes the row
    PRIMARY KEY (queue, message_id)
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS {index} ON {table} (expires_at);
