// One real client library, with its own retry logic, sending N logical POSTs to BASE
// (the fault proxy in front of retrysafe gateway). Each logical request carries its
// logical id (LID) in its body, which the harness reads to count the upstream's
// executions and the proxy's attempts; one JSON line per logical request on stdout.
//
//   node client.js axios|stripe BASE N PREFIX CONCURRENCY
//
// axios: axios-retry with its defaults (3 retries, no delay, retryCondition
// isNetworkOrIdempotentRequestError: a network error for any method, a 5xx only for
// idempotent ones), a fixed Idempotency-Key per logical POST.
// stripe: stripe-node with maxNetworkRetries 3, stripe.customers.create; stripe-node
// makes the Idempotency-Key itself and keeps it across its retries.
'use strict';

const [, , which, base, nArg, prefix, concArg] = process.argv;
const n = Number(nArg);
const concurrency = Number(concArg || 1);

function describe(err) {
  return err && (err.code || err.type || err.name || String(err));
}

function axiosClient() {
  const axios = require('axios');
  const axiosRetry = require('axios-retry').default;
  const client = axios.create({ baseURL: base });
  axiosRetry(client); // the defaults
  return async (lid) => {
    const key = `${lid}-key`;
    try {
      const res = await client.post('/v1/payments', { lid, amount: 100, currency: 'EUR' },
        { headers: { 'Idempotency-Key': key } });
      return { lid, key, status: res.status, replayed: res.headers['idempotent-replayed'] === 'true' };
    } catch (err) {
      if (err.response) {
        return { lid, key, status: err.response.status };
      }
      return { lid, key, status: 0, error: describe(err) };
    }
  };
}

function stripeClient() {
  const Stripe = require('stripe');
  const url = new URL(base);
  const stripe = new Stripe('sk_test_retrysafe_bench', {
    host: url.hostname, port: Number(url.port), protocol: 'http', maxNetworkRetries: 3,
  });
  return async (lid) => {
    try {
      const c = await stripe.customers.create({ description: lid, metadata: { lid } });
      return { lid, key: c.lastResponse.idempotencyKey, status: c.lastResponse.statusCode, id: c.id };
    } catch (err) {
      return { lid, status: err.statusCode || 0, error: err.statusCode ? undefined : describe(err) };
    }
  };
}

async function main() {
  const send = { axios: axiosClient, stripe: stripeClient }[which];
  if (!send) {
    throw new Error(`unknown client ${which}: want axios or stripe`);
  }
  const one = send();
  let next = 0;
  const worker = async () => {
    for (let i = next++; i < n; i = next++) {
      const r = await one(`${prefix}-${i}`);
      process.stdout.write(JSON.stringify(r) + '\n');
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
}

// Exit once every logical request is answered: a connection the client library keeps
// open (stripe-node's keep-alive agent after a 409) would otherwise hold the process
// until the server closes it. Writes to a pipe are synchronous, so nothing is lost.
main().then(() => process.exit(0), (err) => {
  console.error(err);
  process.exit(1);
});
