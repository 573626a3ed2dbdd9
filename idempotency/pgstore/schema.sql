-- retrysafe idempotency records (package pgstore).
--
-- {schema}, {table}, {sequence} and {index} are replaced by quoted identifiers; {table}
-- and {sequence} are schema-qualified, {index} is not. Every statement is idempotent,
-- and Migrate runs them in one transaction under an advisory lock, so that replicas
-- starting together can all migrate.

SELECT pg_advisory_xact_lock(hashtext('retrysafe.idempotency.migrate'));

-- ALTER TABLE waits for every open transaction that touched the table, and while it
-- waits every claim queues behind it. It gives up instead, so that the store's writes
-- go on; Migrate tries again.
SET LOCAL lock_timeout = '200ms';

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
    -- The header and trailer, encoded by internal/headercodec (byte for byte), when
    -- header holds the JSON null this store writes beside it.
    headers      bytea,
    -- http.Header as JSON: what stores of the schema without headers wrote (values as
    -- text), and read. This store writes JSON null here, which those stores read as no
    -- header, and reads this column whenever it holds anything else.
    header       jsonb,
    body         bytea,
    body_omitted boolean     NOT NULL DEFAULT false,
    abandoned    boolean     NOT NULL DEFAULT false, -- the owner gave up (Store.Abandon)
    route        text,                           -- claimed under, for operators; NULL: none
    -- The claim that holds the record (ClaimRequest.ID) with the token it holds it under,
    -- '<token>:<ID>'; NULL: a claim without an ID.
    claim_id     text,
    -- A done record's expiry, which the completion writes here rather than into the
    -- indexed expires_at, so that its update can be HOT; NULL: expires_at is the expiry.
    kept_until   timestamptz,
    PRIMARY KEY (scope, key)
)
-- Each page keeps half its room free, for its records' completions: a completed row is
-- about twice the size of its claim, and a HOT update needs its new version on the
-- same page.
WITH (fillfactor = 50);

-- Tables created without the headers, abandoned, route, claim_id and kept_until columns get them in place:
-- adding a column that is NULL or has a constant default rewrites nothing. Each step runs only
-- when needed, because ALTER TABLE and CREATE INDEX lock the table even when they turn
-- out to have nothing to do, and would wait for (and hold up) every open transaction
-- that writes records.
DO $migrate$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_attribute
                   WHERE attrelid = '{table}'::regclass AND attname = 'headers' AND NOT attisdropped) THEN
        ALTER TABLE {table} ADD COLUMN IF NOT EXISTS headers bytea;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_attribute
                   WHERE attrelid = '{table}'::regclass AND attname = 'abandoned' AND NOT attisdropped) THEN
        ALTER TABLE {table} ADD COLUMN IF NOT EXISTS abandoned boolean NOT NULL DEFAULT false;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_attribute
                   WHERE attrelid = '{table}'::regclass AND attname = 'route' AND NOT attisdropped) THEN
        ALTER TABLE {table} ADD COLUMN IF NOT EXISTS route text;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_attribute
                   WHERE attrelid = '{table}'::regclass AND attname = 'claim_id' AND NOT attisdropped) THEN
        ALTER TABLE {table} ADD COLUMN IF NOT EXISTS claim_id text;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_attribute
                   WHERE attrelid = '{table}'::regclass AND attname = 'kept_until' AND NOT attisdropped) THEN
        ALTER TABLE {table} ADD COLUMN IF NOT EXISTS kept_until timestamptz;
    END IF;
    -- The room for HOT completions, on the pages written from now on (existing pages
    -- keep theirs; they empty as their records expire). This lock (SHARE UPDATE
    -- EXCLUSIVE) lets reads and writes go on. A fillfactor an operator set is left.
    IF NOT EXISTS (SELECT FROM pg_class, unnest(reloptions) AS o
                   WHERE oid = '{table}'::regclass AND o LIKE 'fillfactor=%') THEN
        ALTER TABLE {table} SET (fillfactor = 50);
    END IF;
    -- The janitor's scan.
    IF to_regclass('{schema}.{index}') IS NULL THEN
        CREATE INDEX IF NOT EXISTS {index} ON {table} (expires_at);
    END IF;
END
$migrate$;
