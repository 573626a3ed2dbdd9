-- retrysafe inbox (package redeliver/pgbox): the message ids a consumer has processed.
--
-- {schema}, {table} and {index} are replaced by quoted identifiers; {table} is
-- schema-qualified. Every statement is idempotent; Migrate runs them in one transaction
-- under an advisory lock, so replicas starting together can all migrate.

SELECT pg_advisory_xact_lock(hashtext('retrysafe.redeliver.inbox.migrate'));

CREATE SCHEMA IF NOT EXISTS {schema};

CREATE TABLE IF NOT EXISTS {table} (
    queue        text        NOT NULL, -- the queue the message came from (Message.Queue)
    message_id   text        NOT NULL, -- Message.ID
    processed_at timestamptz NOT NULL, -- when the handler's transaction committed it
    expires_at   timestamptz NOT NULL, -- DeleteExpired removes the row after this
    PRIMARY KEY (queue, message_id)
);

-- DeleteExpired's scan.
CREATE INDEX IF NOT EXISTS {index} ON {table} (expires_at);
