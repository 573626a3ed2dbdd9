-- The payments ledger on PostgreSQL. {schema} and {table} are replaced by quoted
-- identifiers ({table} schema-qualified). Every statement is idempotent, and the advisory
-- lock lets several replicas migrate at once.

SELECT pg_advisory_xact_lock(hashtext('retrysafe.examples.payments.migrate'));

CREATE SCHEMA IF NOT EXISTS {schema};

CREATE TABLE IF NOT EXISTS {table} (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id         text        NOT NULL,
    -- The key the payment was made under; NULL when made unprotected. UNIQUE makes the
    -- business write itself idempotent: a retry that runs again (after a lease expired)
    -- finds the payment instead of paying twice. NULLs never conflict.
    idempotency_key text,
    amount          bigint      NOT NULL CHECK (amount > 0),
    currency        text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    created_at      timestamptz NOT NULL,
    UNIQUE (user_id, idempotency_key)
);
