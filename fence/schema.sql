-- retrysafe leases with fencing tokens (package fence).
--
-- {schema}, {table} and {sequence} are replaced by quoted identifiers; {table} and
-- {sequence} are schema-qualified. Every statement is idempotent, and Migrate runs them
-- in one transaction under an advisory lock, so that replicas starting together can all
-- migrate.

SELECT pg_advisory_xact_lock(hashtext('retrysafe.fence.migrate'));

CREATE SCHEMA IF NOT EXISTS {schema};

-- The fencing tokens of every acquisition, of every lease in the table. Never reset it
-- (nor restore it to an older value): a token must never be issued twice, or a stale
-- holder could write through a newer one. CACHE 1 (the default, spelled out): with a
-- larger cache each connection would draw from its own block, and a later acquisition
-- could get a smaller token.
CREATE SEQUENCE IF NOT EXISTS {sequence} AS bigint CACHE 1;

CREATE TABLE IF NOT EXISTS {table} (
    name        text        PRIMARY KEY,
    -- NULL when the lease is free (released); a lease is also free once expires_at has
    -- passed by the database's clock.
    holder      text,
    -- The token of the latest acquisition. Kept on release, so the row records the
    -- last token issued for the name.
    token       bigint      NOT NULL,
    acquired_at timestamptz NOT NULL,
    -- The end of the lease by the database's clock: the last acquisition or renewal
    -- plus its TTL, or the release time once released.
    expires_at  timestamptz NOT NULL
);
