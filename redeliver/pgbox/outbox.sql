-- retrysafe outbox (package redeliver/pgbox): messages written in a business transaction,
-- waiting for the relay to publish them.
--
-- {schema}, {table} and {index} are replaced by quoted identifiers; {table} is
-- schema-qualified. Every statement is idempotent; Migrate runs them in one transaction
-- under an advisory lock, so replicas starting together can all migrate.

SELECT pg_advisory_xact_lock(hashtext('retrysafe.redeliver.outbox.migrate'));

CREATE SCHEMA IF NOT EXISTS {schema};

CREATE TABLE IF NOT EXISTS {table} (
    id              bigserial   PRIMARY KEY, -- relay order
    queue           text        NOT NULL,    -- where to publish it
    message_id      text        NOT NULL,    -- kept by the broker, for the consumer's inbox
    content_type    text        NOT NULL DEFAULT '',
    header          jsonb       NOT NULL DEFAULT '{}', -- a JSON object of strings
    body            bytea       NOT NULL,
    created_at      timestamptz NOT NULL,
    attempts        integer     NOT NULL DEFAULT 0,    -- failed publishes so far
    next_attempt_at timestamptz NOT NULL,              -- not relayed before this
    last_error      text                               -- the last failed publish's error
);

-- The relay's scan.
CREATE INDEX IF NOT EXISTS {index} ON {table} (next_attempt_at, id);
