// The common hand-written Express + PostgreSQL idempotency handler, as a benchmark
// peer: POST /payments on Express + node-postgres with an idempotency_keys table keyed
// by a unique (user_id, key). The claim is INSERT ... ON CONFLICT DO NOTHING RETURNING
// key; a lost claim goes to replayOrConflict (replay when done with the same hash, 409
// while in progress, 422 for another payload); a won claim runs executePayment, which
// writes the ledger and marks the key done with the stored response -- the business
// write and the completion in one transaction, as the usual advice goes. EXPRESS_TX=0
// writes them as two autocommit statements instead.
//
// Written plainly, the way such a handler usually is: no tuning either way. A benchmark
// baseline (bench/run.sh), not a product: the gaps of that design are kept (a key whose
// payment failed stays in progress; no expiry job).
//
// Environment:
//   PORT             listen port on 127.0.0.1 (default 3000)
//   DATABASE_URL     PostgreSQL URL (default postgres://postgres@127.0.0.1:5432/test)
//   PG_SCHEMA        schema of the tables (search_path; default public)
//   PG_POOL_MAX      pg.Pool size per process (default 16, as the Go servers' pools in bench/run.sh)
//   CLUSTER_WORKERS  1: a single process, the usual deployment (default); N > 1: node's
//                    cluster module with N worker processes sharing the port
//   EXPRESS_TX       1 (default): ledger insert and 'done' update in one transaction
"use strict";

const cluster = require("node:cluster");
const crypto = require("node:crypto");
const express = require("express");
const { Pool } = require("pg");

const port = Number(process.env.PORT || 3000);
const workers = Number(process.env.CLUSTER_WORKERS || 1);
const useTx = (process.env.EXPRESS_TX || "1") !== "0";

if (workers > 1 && cluster.isPrimary) {
  for (let i = 0; i < workers; i++) cluster.fork();
  let stopping = false;
  cluster.on("exit", (w, code, signal) => {
    if (!stopping) {
      console.error(`worker ${w.process.pid} exited (${signal || code}); stopping`);
      stopping = true;
      for (const id in cluster.workers) cluster.workers[id].kill();
      process.exitCode = 1;
    }
  });
  const stop = () => {
    stopping = true;
    for (const id in cluster.workers) cluster.workers[id].kill();
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
} else {
  serve();
}

function serve() {
  const pool = new Pool({
    connectionString: process.env.DATABASE_URL || "postgres://postgres@127.0.0.1:5432/test",
    max: Number(process.env.PG_POOL_MAX || 16),
    idleTimeoutMillis: 1000, // give idle connections back quickly: the database is shared
    options: `-c search_path=${process.env.PG_SCHEMA || "public"}`,
  });
  pool.on("error", (err) => console.error("pg pool:", err.message));

  const sha256 = (s) => crypto.createHash("sha256").update(s).digest("hex");

  const app = express();
  app.use(express.json());

  // Authentication stand-in: "Authorization: Bearer <numeric user id>".
  app.use((req, res, next) => {
    const m = /^Bearer ([1-9][0-9]{0,17})$/.exec(req.get("Authorization") || "");
    if (!m) return res.status(401).json({ error: "Authorization: Bearer <user id> required" });
    req.user = { id: m[1] };
    next();
  });

  app.post("/payments", async (req, res) => {
    const key = req.get("Idempotency-Key");
    if (!key) return res.status(400).json({ error: "Idempotency-Key required" });
    const { amount, currency } = req.body || {};
    if (!Number.isSafeInteger(amount) || amount <= 0 || typeof currency !== "string" || !/^[A-Za-z]{3}$/.test(currency)) {
      return res.status(422).json({ error: "amount must be a positive integer, currency three letters" });
    }
    const hash = sha256(JSON.stringify(req.body));

    const claim = await pool.query(
      `INSERT INTO idempotency_keys (key, user_id, request_hash)
       VALUES ($1, $2, $3) ON CONFLICT (user_id, key) DO NOTHING RETURNING key`,
      [key, req.user.id, hash]
    );

    if (claim.rowCount === 0) return replayOrConflict(req.user.id, key, hash, res);

    const result = await executePayment(req.body, req.user, key); // stores result, status='done'
    res.status(201).json(result);
  });

  app.get("/payments", async (req, res) => {
    const { rows } = await pool.query("SELECT count(*)::int AS count FROM payments WHERE user_id = $1", [req.user.id]);
    res.json({ count: rows[0].count });
  });

  // The three outcomes of a lost claim: replay, 409 in progress, 422 another payload.
  async function replayOrConflict(userId, key, hash, res) {
    const { rows } = await pool.query(
      `SELECT request_hash, status, response_code, response_body
       FROM idempotency_keys WHERE user_id = $1 AND key = $2`,
      [userId, key]
    );
    const row = rows[0];
    if (!row || row.request_hash !== hash) {
      if (!row) return res.status(409).set("Retry-After", "1").json({ error: "request in progress, retry" });
      return res.status(422).json({ error: "Idempotency-Key reused with another payload" });
    }
    if (row.status !== "done") {
      return res.status(409).set("Retry-After", "1").json({ error: "request in progress, retry" });
    }
    res.set("Idempotent-Replayed", "true");
    return res.status(row.response_code).json(row.response_body);
  }

  const insertPayment = `INSERT INTO payments (user_id, idempotency_key, amount, currency, created_at)
    VALUES ($1, $2, $3, $4, now())
    RETURNING id, user_id, idempotency_key, amount, currency, created_at`;
  const markDone = `UPDATE idempotency_keys SET status = 'done', response_code = 201, response_body = $3
    WHERE user_id = $1 AND key = $2`;

  function toPayment(row) {
    return {
      id: Number(row.id), // pg returns bigint as a string
      user: row.user_id,
      idempotency_key: row.idempotency_key,
      amount: Number(row.amount),
      currency: row.currency,
      created_at: row.created_at,
    };
  }

  async function executePayment(body, user, key) {
    const args = [String(user.id), key, body.amount, body.currency.toUpperCase()];
    if (!useTx) {
      const { rows } = await pool.query(insertPayment, args);
      const result = toPayment(rows[0]);
      await pool.query(markDone, [user.id, key, result]);
      return result;
    }
    const client = await pool.connect();
    try {
      await client.query("BEGIN");
      const { rows } = await client.query(insertPayment, args);
      const result = toPayment(rows[0]);
      await client.query(markDone, [user.id, key, result]);
      await client.query("COMMIT");
      return result;
    } catch (err) {
      await client.query("ROLLBACK").catch(() => {});
      throw err;
    } finally {
      client.release();
    }
  }

  const server = app.listen(port, "127.0.0.1", () => {
    console.log(`express baseline pid ${process.pid} on 127.0.0.1:${port} (tx ${useTx}, pool ${pool.options.max})`);
  });
  const stop = () => server.close(() => pool.end().then(() => process.exit(0)));
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}
