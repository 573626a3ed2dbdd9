-- The Express baseline's tables, in the schema its search_path names (bench/run.sh
-- creates the schema and applies this with psql).

-- The idempotency keys of the common hand-written handler: one row per (user_id, key),
-- the claim's unique constraint, with the request's hash, its state and the stored response.
CREATE TABLE idempotency_keys (
  key           text        NOT NULL,
  user_id       bigint      NOT NULL,
  request_hash  text        NOT NULL,
  status        text        NOT NULL DEFAULT 'in_progress', -- in_progress | done
  response_code int,
  response_body jsonb,
  created_at    timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (user_id, key)
);

-- The ledger: the same table as examples/payments (ledger/postgres.sql).
CREATE TABLE payments (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id         text        NOT NULL,
    idempotency_key text,
    amount          bigint      NOT NULL CHECK (amount > 0),
    currency        text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    created_at      timestamptz NOT NULL,
    UNIQUE (user_id, idempotency_key)
);
