-- Fixture: the table as deployments that predate the headers and abandoned columns
-- have it (response headers in jsonb). TestMigrateFromJSONBHeader creates it, writes
-- records the way that schema's store did, and checks that Migrate upgrades it in place.
--
-- retrysafe idempotency records (package pgstore).
--
-- {schema}, {table}, {sequence} and {index} are replaced by quoted identifiers; {table}
-- and {sequence} are schema-qualified. Every statement is idempotent, and Migrate runs
-- them in one transaction under an advisory lock, so that replicas starting together
-- can all migrate.

SELECT pg_advisory_xact_lock(hashtext('retrysafe.idempotency.migrate'));

CREATE SCHEMA IF NOT EXISTS {schema};

-- Fencing tokens of every claim and takeover. Never reset it: a token must not be
-- issued twice, or a stale owner could write through a newer claim.
CREATE SEQUENCE IF NOT EXISTS {sequence} AS bigint;

CREATE TABLE IF NOT EXISTS {table} (
    -- scope, key and fingerprint are Go strings kept byte for byte (NUL and non-UTF-8
    -- bytes included); they sort as Go sorts strings.
    scope        bytea       NOT NULL,
    key          bytea       NOT NULL,
    fingerprint  bytea       NOT NULL,
    state        text        NOT NULL CHECK (state IN ('in_progress', 'done')),
    token        bigint      NOT NULL,
    attempts     integer     NOT NULL DEFAULT 1, -- 1 + the takeovers of this claim
    created_at   timestamptz NOT NULL,
    lease_until  timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    completed_at timestamptz,                    -- set when done
    status       integer,                        -- the stored response, when done
    header       jsonb,                          -- http.Header as JSON; NULL for a nil header
    body         bytea,
    body_omitted boolean     NOT NULL DEFAULT false,
    PRIMARY KEY (scope, key)
);

-- The janitor's scan.
CREATE INDEX IF NOT EXISTS {index} ON {table} (expires_at);
