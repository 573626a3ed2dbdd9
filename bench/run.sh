#!/usr/bin/env bash
# bench/run.sh: the POST /payments load benchmark (matrix, duplicate storm, replay vs
# first execution, pgbench ceilings), in one run on this machine.
#
#   bash bench/run.sh                 # about 14 minutes
#   ROUNDS=1 DURATION=3s bash bench/run.sh   # a quick look
#
# Subjects, each serving POST /payments on the same PostgreSQL, each in its own schema:
#   unprotected       examples/payments --no-idempotency (the baseline of every ratio)
#   payments-tx       examples/payments, transaction mode (the default)
#   payments-mw       examples/payments --tx=false (middleware mode)
#   gw-<store>        retrysafe gateway (memory, sqlite, postgres, redis store) in front
#                     of the unprotected server above
#   *-nobatch         payments-tx, gw-sqlite and gw-postgres with the stores' batching
#                     (group commit) turned off: what it gains (matrix only)
#   express           bench/baselines/express: the common hand-written Express +
#                     node-postgres idempotency handler (idempotency_keys table, unique
#                     (user_id, key), ON CONFLICT DO NOTHING claim, business write and
#                     completion in one transaction), one node process
#   express-cluster2  the same under node's cluster module, 2 workers
#   express-autocommit the same, one process, ledger insert and 'done' update as two
#                     autocommit statements (32 clients only)
# Phases (all recorded as JSON lines in $OUT/results.jsonl, then bench/cmd/benchreport
# writes $OUT/report.md):
#   1. matrix: every subject at 1, 8, 32 and 128 closed-loop clients, a new
#      Idempotency-Key per request, ROUNDS rounds, subjects interleaved in a rotating
#      order so that the shared machine's load falls on all of them alike; each round
#      ends with pgbench at the same concurrency (64 for 128): PostgreSQL's own ceiling
#      for the ledger insert, pgstore's claim statement, the whole SQL of a tx-mode
#      payment and of an Express payment;
#   2. storm: 1,000 concurrent requests with one key per subject; ledger rows counted;
#   3. replay vs first execution, back to back, at 1 and 32 clients.
# Everything it starts is stopped on exit, and its schemas, Redis keys and files are
# removed (the results in $OUT stay).
#
# Environment: RETRYSAFE_POSTGRES_URL, RETRYSAFE_REDIS_URL (the local defaults
# otherwise), DURATION (3s), WARMUP (1s), ROUNDS (3), CONCURRENCY ("1 8 32 128"),
# POOL (16: connections per pool, for every server alike), PGBENCH_DURATION (3),
# OUT (a new directory under /tmp), BASE_PORT (18500).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD

PG_URL=${RETRYSAFE_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}
REDIS_URL=${RETRYSAFE_REDIS_URL:-redis://127.0.0.1:6379/0}
DURATION=${DURATION:-3s}
WARMUP=${WARMUP:-1s}
ROUNDS=${ROUNDS:-3}
CONCURRENCY=${CONCURRENCY:-1 8 32 128}
POOL=${POOL:-16}
PGBENCH=${PGBENCH:-/usr/lib/postgresql/15/bin/pgbench}
PGBENCH_DURATION=${PGBENCH_DURATION:-3}
BASE_PORT=${BASE_PORT:-18500}
RUN=rsb$(date +%s)$$
OUT=${OUT:-/tmp/retrysafe-bench-$(date -u +%Y%m%dT%H%M%SZ)}
WORK=$(mktemp -d /tmp/retrysafe-bench-work.XXXXXX)
BIN=$WORK/bin
LOGS=$OUT/logs
RESULTS=$OUT/results.jsonl
BODY='{"amount":1250,"currency":"EUR"}'

mkdir -p "$OUT" "$LOGS" "$BIN"
: >"$RESULTS"

log() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "run.sh: $*"; exit 1; }

for tool in go node npm psql redis-cli jq curl ss "$PGBENCH"; do
	command -v "$tool" >/dev/null || die "$tool not found"
done

# url_with URL PARAMS: URL with &PARAMS (or ?PARAMS) appended.
url_with() { case $1 in *\?*) printf '%s&%s' "$1" "$2" ;; *) printf '%s?%s' "$1" "$2" ;; esac; }
# Every Go pool: POOL connections, idle ones closed after a second (the database is
# shared with other work, and the subjects take turns).
PG_POOLED=$(url_with "$PG_URL" "pool_max_conns=$POOL&pool_max_conn_idle_time=1s&pool_health_check_period=500ms")
psql_q() { psql "$PG_URL" -X -q -v ON_ERROR_STOP=1 "$@"; }

SCHEMAS=("${RUN}_up" "${RUN}_tx" "${RUN}_mw" "${RUN}_txn" "${RUN}_gw" "${RUN}_gwn" "${RUN}_ex" "${RUN}_exc" "${RUN}_exa" "${RUN}_pgb" "${RUN}_pgbx")
REDIS_PREFIX="$RUN:"
PIDS=()

cleanup() {
	local rc=$?
	set +e
	for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null; done
	for _ in $(seq 50); do
		local alive=0
		for pid in "${PIDS[@]}"; do kill -0 -- "-$pid" 2>/dev/null && alive=1; done
		[ $alive = 0 ] && break
		sleep 0.2
	done
	for pid in "${PIDS[@]}"; do kill -KILL -- "-$pid" 2>/dev/null; done
	for s in "${SCHEMAS[@]}"; do psql "$PG_URL" -X -q -c "DROP SCHEMA IF EXISTS \"$s\" CASCADE" >/dev/null 2>&1; done
	redis-cli -u "$REDIS_URL" --scan --pattern "${REDIS_PREFIX}*" 2>/dev/null | xargs -r -n 500 redis-cli -u "$REDIS_URL" del >/dev/null 2>&1
	rm -rf "$WORK"
	log "cleaned up (processes, schemas ${RUN}_*, Redis keys ${REDIS_PREFIX}*); results in $OUT"
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# start NAME CMD...: runs CMD in its own process group (so that its children stop with
# it), logging to $LOGS/NAME.log.
start() {
	local name=$1
	shift
	setsid "$@" >"$LOGS/$name.log" 2>&1 &
	PIDS+=($!)
}

# assign_port NAME: PORT[NAME] = the next port from BASE_PORT on that nothing listens on.
declare -A PORT SCHEMA
NEXT_PORT=$BASE_PORT
assign_port() {
	while ss -Htln "sport = :$NEXT_PORT" | grep -q .; do NEXT_PORT=$((NEXT_PORT + 1)); done
	PORT[$1]=$NEXT_PORT
	NEXT_PORT=$((NEXT_PORT + 1))
}

wait_http() { # NAME PORT
	for _ in $(seq 150); do
		curl -s -o /dev/null -m 1 "http://127.0.0.1:$2/" && return 0
		sleep 0.2
	done
	cat "$LOGS/$1.log" >&2
	die "$1 did not start on port $2"
}

loadavg() { cut -d' ' -f1 /proc/loadavg; }

# ---- build and set up -------------------------------------------------------------
log "building (go $(go env GOVERSION)), installing the Express baseline (npm)"
go build -o "$BIN/payments" ./examples/payments
go build -o "$BIN/retrysafe" ./cmd/retrysafe
# loadgen and benchreport belong to the bench module (bench/go.mod), so they are built
# from inside it; the subjects belong to the root module.
(cd bench && go build -o "$BIN/loadgen" ./cmd/loadgen && go build -o "$BIN/benchreport" ./cmd/benchreport)
bash bench/baselines/express/setup.sh >"$LOGS/npm.log" 2>&1 || { cat "$LOGS/npm.log" >&2; die "npm install failed"; }

{
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(uname -sr)"
	echo "go: $(go env GOVERSION); node: $(node --version); express: $(node -p 'require("./bench/baselines/express/node_modules/express/package.json").version'); pg: $(node -p 'require("./bench/baselines/express/node_modules/pg/package.json").version')"
	echo "postgres: $(psql "$PG_URL" -XAtc 'show server_version'), fsync $(psql "$PG_URL" -XAtc 'show fsync'), synchronous_commit $(psql "$PG_URL" -XAtc 'show synchronous_commit'), max_connections $(psql "$PG_URL" -XAtc 'show max_connections')"
	echo "redis: $(redis-cli -u "$REDIS_URL" info server | grep redis_version | tr -d '\r'), appendonly $(redis-cli -u "$REDIS_URL" config get appendonly | tail -1)"
	echo "settings: DURATION=$DURATION WARMUP=$WARMUP ROUNDS=$ROUNDS CONCURRENCY='$CONCURRENCY' POOL=$POOL PGBENCH_DURATION=$PGBENCH_DURATION"
	echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT/env.txt" >&2

# ---- start the subjects ------------------------------------------------------------
assign_port unprotected
SCHEMA[unprotected]=${RUN}_up
start unprotected "$BIN/payments" --addr "127.0.0.1:${PORT[unprotected]}" --store "$PG_POOLED" --schema "${RUN}_up" --no-idempotency
assign_port payments-tx
SCHEMA[payments-tx]=${RUN}_tx
start payments-tx "$BIN/payments" --addr "127.0.0.1:${PORT[payments-tx]}" --store "$PG_POOLED" --schema "${RUN}_tx"
assign_port payments-mw
SCHEMA[payments-mw]=${RUN}_mw
start payments-mw "$BIN/payments" --addr "127.0.0.1:${PORT[payments-mw]}" --store "$PG_POOLED" --schema "${RUN}_mw" --tx=false
assign_port payments-tx-nobatch
SCHEMA[payments-tx-nobatch]=${RUN}_txn
start payments-tx-nobatch "$BIN/payments" --addr "127.0.0.1:${PORT[payments-tx-nobatch]}" --store "$PG_POOLED" --schema "${RUN}_txn" --batch=false
wait_http unprotected "${PORT[unprotected]}"

# The gateways log at warn: their per-request info line (one slog line per request)
# is left out, as the servers behind them log nothing per request either.
declare -A GWSTORE=(
	[gw-memory]="memory:"
	[gw-sqlite]="sqlite:$WORK/gateway.db"
	[gw-postgres]="$(url_with "$PG_POOLED" "schema=${RUN}_gw")"
	[gw-redis]="$(url_with "$REDIS_URL" "prefix=$REDIS_PREFIX")"
	[gw-sqlite-nobatch]="sqlite:$WORK/gateway-nobatch.db?batch=false"
	[gw-postgres-nobatch]="$(url_with "$PG_POOLED" "schema=${RUN}_gwn&batch=false")"
)
for gw in gw-memory gw-sqlite gw-postgres gw-redis gw-sqlite-nobatch gw-postgres-nobatch; do
	assign_port $gw
	SCHEMA[$gw]=${RUN}_up # their ledger is the upstream's
	start "$gw" "$BIN/retrysafe" gateway --upstream "http://127.0.0.1:${PORT[unprotected]}" \
		--listen "127.0.0.1:${PORT[$gw]}" --admin off --store "${GWSTORE[$gw]}" --log-level warn
done

for ex in ex exc exa; do
	psql_q -c "CREATE SCHEMA \"${RUN}_$ex\""
	PGOPTIONS="-c search_path=${RUN}_$ex" psql_q -f bench/baselines/express/schema.sql
done
EXPRESS=(env NODE_ENV=production DATABASE_URL="$PG_URL" PG_POOL_MAX="$POOL")
SERVER_JS=bench/baselines/express/server.js
assign_port express
SCHEMA[express]=${RUN}_ex
start express "${EXPRESS[@]}" PG_SCHEMA="${RUN}_ex" PORT="${PORT[express]}" node "$SERVER_JS"
assign_port express-cluster2
SCHEMA[express-cluster2]=${RUN}_exc
start express-cluster2 "${EXPRESS[@]}" PG_SCHEMA="${RUN}_exc" PORT="${PORT[express-cluster2]}" CLUSTER_WORKERS=2 node "$SERVER_JS"
assign_port express-autocommit
SCHEMA[express-autocommit]=${RUN}_exa
start express-autocommit "${EXPRESS[@]}" PG_SCHEMA="${RUN}_exa" PORT="${PORT[express-autocommit]}" EXPRESS_TX=0 node "$SERVER_JS"

for s in payments-tx payments-mw payments-tx-nobatch gw-memory gw-sqlite gw-postgres gw-redis gw-sqlite-nobatch gw-postgres-nobatch \
	express express-cluster2 express-autocommit; do
	wait_http "$s" "${PORT[$s]}"
done
for pid in "${PIDS[@]}"; do
	kill -0 "$pid" 2>/dev/null || { tail -n 5 "$LOGS"/*.log >&2; die "a subject exited at start (pid $pid)"; }
done
log "all subjects up: $(for s in "${!PORT[@]}"; do printf '%s=:%s ' "$s" "${PORT[$s]}"; done)"

# lg NAME KIND CLIENTS ROUND ARGS...: one loadgen run against subject NAME, recorded.
lg() {
	local name=$1 kind=$2 clients=$3 round=$4
	shift 4
	local la
	la=$(loadavg)
	"$BIN/loadgen" --url "http://127.0.0.1:${PORT[$name]}/payments" -c "$clients" \
		-H 'Content-Type: application/json' --body "$BODY" --format json \
		--tag kind="$kind" --tag subject="$name" --tag clients="$clients" --tag round="$round" --tag loadavg="$la" \
		"$@" >"$WORK/last.json" 2>>"$LOGS/loadgen.log" || { log "loadgen failed for $name ($kind, $clients clients)"; return 0; }
	cat "$WORK/last.json" >>"$RESULTS"
	jq -r '"\(.tags.kind) \(.tags.subject) c=\(.clients) r=\(.tags.round): \(.throughput|floor) req/s, p50 \(.latency.p50_ms) p99 \(.latency.p99_ms) ms, status \(.status|tostring), errors \(.errors) (load \(.tags.loadavg))"' "$WORK/last.json" >&2
}

# ---- pgbench scripts (run inside the matrix rounds) ---------------------------------
# PostgreSQL's own ceiling: the SQL of one payment, without HTTP, Go or node. Their
# tables are in schemas of their own.
"$BIN/retrysafe" migrate --store "$(url_with "$PG_URL" "schema=${RUN}_pgb")" >/dev/null
sed -e "/pg_advisory_xact_lock/d" -e "s/{schema}/\"${RUN}_pgb\"/g" -e "s/{table}/\"${RUN}_pgb\".payments/g" \
	examples/payments/ledger/postgres.sql | psql_q
psql_q -c "CREATE SCHEMA \"${RUN}_pgbx\""
PGOPTIONS="-c search_path=${RUN}_pgbx" psql_q -f bench/baselines/express/schema.sql
S="\"${RUN}_pgb\""
T="$S.retrysafe_idempotency"
FP="'\\x0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef'::bytea"
RESP='{"id":1,"user":"1","idempotency_key":"k","amount":1250,"currency":"EUR","created_at":"2026-01-01T00:00:00Z"}'
RESPHEX=$(printf '%s' "$RESP" | od -An -tx1 | tr -d ' \n')
COLS="scope, key, fingerprint, state, token, created_at, lease_until, expires_at, status, header, body, body_omitted"
# pgstore's claim statement (idempotency/pgstore/pgstore.go), with its parameters as
# pgbench variables: the scope is the client, the key a random 63-bit number.
CLAIM="WITH existing AS (
	SELECT $COLS FROM $T WHERE scope = int4send(:client_id) AND key = int8send(:k)
), claimed AS (
	INSERT INTO $T (scope, key, fingerprint, state, token, created_at, lease_until, expires_at)
	SELECT int4send(:client_id), int8send(:k), $FP, 'in_progress', nextval('$S.retrysafe_idempotency_token_seq'),
		now(), now() + interval '30 seconds', now() + interval '24 hours'
	WHERE NOT EXISTS (SELECT FROM existing)
	ON CONFLICT (scope, key) DO NOTHING
	RETURNING $COLS
)
SELECT true AS claimed, false AS claimable, $COLS FROM claimed
UNION ALL
SELECT false, (r.expires_at <= now() OR (r.state = 'in_progress' AND r.lease_until <= now() AND r.fingerprint = $FP)), $COLS
FROM existing AS r"
LEDGER_INSERT="INSERT INTO $S.payments (user_id, idempotency_key, amount, currency, created_at)
VALUES (:client_id::text, :key, 1250, 'EUR', now()) ON CONFLICT (user_id, idempotency_key) DO NOTHING
RETURNING id, user_id, idempotency_key, amount, currency, created_at"
cat >"$WORK/insert.sql" <<EOF
-- The unprotected endpoint's SQL: one INSERT (autocommit).
${LEDGER_INSERT//:key/NULL};
EOF
cat >"$WORK/claim.sql" <<EOF
-- pgstore's claim (autocommit), a new key every time.
\\set k random(1, 999999999999999999)
$CLAIM;
EOF
cat >"$WORK/txmode.sql" <<EOF
-- One tx-mode payment: the claim, then BEGIN, ledger insert, completion, COMMIT.
\\set k random(1, 999999999999999999)
$CLAIM \\gset
BEGIN;
${LEDGER_INSERT//:key/:k::text};
UPDATE $T SET state = 'done', status = 201, header = '{"Content-Type":["application/json"]}'::jsonb,
	body = '\\x$RESPHEX'::bytea, body_omitted = false, completed_at = now(), expires_at = now() + interval '24 hours'
WHERE scope = int4send(:client_id) AND key = int8send(:k) AND token = :token AND state = 'in_progress';
COMMIT;
EOF
SX="\"${RUN}_pgbx\""
cat >"$WORK/express-tx.sql" <<EOF
-- One Express-baseline payment: the ON CONFLICT DO NOTHING claim, then BEGIN, ledger insert, 'done' update, COMMIT.
\\set k random(1, 999999999999999999)
INSERT INTO $SX.idempotency_keys (key, user_id, request_hash)
VALUES (:k::text, :client_id, 'c3ab8ff13720e8ad9047dd39466b3c8974e592c2fa383d4a3960714caef0c4f2')
ON CONFLICT (user_id, key) DO NOTHING RETURNING key;
BEGIN;
INSERT INTO $SX.payments (user_id, idempotency_key, amount, currency, created_at)
VALUES (:client_id::text, :k::text, 1250, 'EUR', now()) RETURNING id, user_id, idempotency_key, amount, currency, created_at;
UPDATE $SX.idempotency_keys SET status = 'done', response_code = 201, response_body = '$RESP'::jsonb
WHERE user_id = :client_id AND key = :k::text;
COMMIT;
EOF
cp "$WORK"/insert.sql "$WORK"/claim.sql "$WORK"/txmode.sql "$WORK"/express-tx.sql "$OUT/"
# pgb CLIENTS ROUND: the four scripts, in a rotating order, recorded. pgbench opens one
# connection per client, so the servers' idle connections are given a moment to close
# first (the cluster is shared: max_connections 100).
pgb() {
	local c=$1 round=$2 scripts=(insert claim txmode express-tx) i script tps lat j
	j=$((c < 2 ? 1 : 2))
	sleep 2
	for i in 0 1 2 3; do
		script=${scripts[$(((i + round) % 4))]}
		if "$PGBENCH" -n -M prepared -c "$c" -j "$j" -T "$PGBENCH_DURATION" -f "$WORK/$script.sql" "$PG_URL" >"$WORK/pgbench.out" 2>&1; then
			tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$WORK/pgbench.out")
			lat=$(sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' "$WORK/pgbench.out")
		else
			tps=0 lat=0
			log "pgbench $script at $c clients failed: $(tail -2 "$WORK/pgbench.out" | tr '\n' ' ')"
		fi
		printf '{"tags":{"kind":"pgbench","subject":"%s","clients":"%d","round":"%d"},"throughput":%s,"latency":{"mean_ms":%s}}\n' \
			"$script" "$c" "$round" "${tps:-0}" "${lat:-0}" >>"$RESULTS"
		log "pgbench $script c=$c r=$round: ${tps:-?} tps, mean ${lat:-?} ms"
	done
}

# ---- 1. matrix ---------------------------------------------------------------------
SUBJECTS=(unprotected payments-tx payments-mw payments-tx-nobatch gw-memory gw-sqlite gw-postgres gw-redis
	gw-sqlite-nobatch gw-postgres-nobatch express express-cluster2)
log "phase 1: matrix ($CONCURRENCY clients, $ROUNDS rounds, $DURATION after $WARMUP warm-up; pgbench ${PGBENCH_DURATION}s)"
ci=0
for c in $CONCURRENCY; do
	subjects=("${SUBJECTS[@]}")
	[ "$c" = 32 ] && subjects+=(express-autocommit)
	n=${#subjects[@]}
	for round in $(seq "$ROUNDS"); do
		for i in $(seq 0 $((n - 1))); do
			s=${subjects[$(((i + round + ci) % n))]}
			lg "$s" matrix "$c" "$round" -d "$DURATION" --warmup "$WARMUP" --users "$c" --auth-format 'Bearer 1%d'
		done
		# pgbench's clients are connections: 128 would pass max_connections, so 64.
		pgb "$((c > 64 ? 64 : c))" "$round"
	done
	ci=$((ci + 1))
done

# ---- 2. duplicate storm ------------------------------------------------------------
log "phase 2: duplicate storm (1,000 concurrent requests, one key, per subject)"
idx=0
for s in unprotected payments-tx payments-mw gw-memory gw-sqlite gw-postgres gw-redis express express-cluster2; do
	idx=$((idx + 1))
	user="9${idx}0" # one user per storm: its ledger rows are the storm's executions
	sleep 1
	lg "$s" storm 1000 1 -n 1000 --keys shared --key "storm-$RUN-$s" --users 1 --auth-format "Bearer 9${idx}%d" \
		--preconnect "http://127.0.0.1:${PORT[$s]}/payments"
	rows=$(psql "$PG_URL" -XAtc "SELECT count(*) FROM \"${SCHEMA[$s]}\".payments WHERE user_id = '$user'")
	printf '{"tags":{"kind":"storm-rows","subject":"%s"},"rows":%d}\n' "$s" "$rows" >>"$RESULTS"
	log "storm $s: $rows ledger row(s)"
done

# ---- 3. replay vs first execution --------------------------------------------------
log "phase 3: replay vs first execution"
idx=0
for c in 1 32; do
	for s in payments-tx payments-mw gw-memory gw-sqlite gw-postgres gw-redis express express-cluster2; do
		idx=$((idx + 1))
		lg "$s" first "$c" 1 -d 2s --warmup 500ms --users 1 --auth-format "Bearer 8${idx}%d"
		lg "$s" replay "$c" 1 -d 2s --warmup 500ms --keys shared --key "replay-$RUN-$s-$c" --users 1 --auth-format "Bearer 8${idx}%d"
	done
done

echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/env.txt" >&2
"$BIN/benchreport" "$RESULTS" >"$OUT/report.md"
cat "$OUT/env.txt" "$OUT/report.md"
