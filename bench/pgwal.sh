#!/usr/bin/env bash
# pgwal.sh: what each gateway build costs PostgreSQL per new key, in WAL (bytes, records,
# full-page images) and CPU, and how many of its completions were HOT updates.
#
#   bash bench/pgwal.sh LABEL=RETRYSAFE_BINARY [LABEL=RETRYSAFE_BINARY ...]
#
# Each build in turn, ROUNDS times (2) in rotating order: examples/payments
# --no-idempotency (built here) as the upstream, the build's gateway in front of it on a
# fresh schema of PG_URL, DURATION (15s) of new keys from CLIENTS (32) loadgen clients,
# then pg_stat_wal's growth and the table's n_tup_hot_upd / n_tup_upd. CPU is the whole
# cluster's (the postmaster's process tree), so run it on a server nobody else uses.
# pg_stat_wal needs PostgreSQL 14 or later.
set -euo pipefail
PG_URL=${PG_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}
ROUNDS=${ROUNDS:-2} DURATION=${DURATION:-15s} CLIENTS=${CLIENTS:-32}
[ $# -gt 0 ] || { sed -n '2,13p' "$0"; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
(cd "$root" && go build -o "$work/payments" ./examples/payments)
(cd "$root/bench" && go build -o "$work/loadgen" ./cmd/loadgen)
sep='?'; [[ $PG_URL == *\?* ]] && sep='&'
dsn="$PG_URL${sep}pool_max_conns=16"
q() { psql "$PG_URL" -Atqc "$1"; }
postmaster=$(q "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'" | xargs -r ps -o ppid= -p | tr -d ' ')
for round in $(seq 1 "$ROUNDS"); do
	for spec in "$@"; do
		label=${spec%%=*} bin=${spec#*=}
		schema="pgwal_${label//[^a-z0-9]/_}_$$_$round"
		"$work/payments" --addr 127.0.0.1:18181 --store "$dsn" --schema "${schema}_up" --no-idempotency >"$work/up.log" 2>&1 &
		up=$!; pids+=("$up")
		"$bin" gateway --upstream http://127.0.0.1:18181 --listen 127.0.0.1:18180 --admin off \
			--store "$dsn&schema=$schema" --log-level warn >"$work/gw.log" 2>&1 &
		gw=$!; pids+=("$gw")
		for _ in $(seq 100); do # until the gateway and the upstream answer
			curl -fs -o /dev/null -X POST http://127.0.0.1:18180/payments -H 'Idempotency-Key: warm' \
				-H 'Content-Type: application/json' -d '{"amount":1,"currency":"EUR"}' && break
			sleep 0.1
		done
		w0=$(q "SELECT wal_bytes || ' ' || wal_records || ' ' || wal_fpi FROM pg_stat_wal")
		"$work/loadgen" --url http://127.0.0.1:18180/payments -c "$CLIENTS" -H 'Content-Type: application/json' \
			--body '{"amount":1250,"currency":"EUR"}' --duration "$DURATION" --warmup 1s --cpu "pg=$postmaster" >"$work/load.out" 2>&1
		w1=$(q "SELECT wal_bytes || ' ' || wal_records || ' ' || wal_fpi FROM pg_stat_wal")
		kill "$gw" "$up"; wait "$gw" "$up" 2>/dev/null || true
		read -r b0 r0 f0 <<<"$w0"; read -r b1 r1 f1 <<<"$w1"
		n=$(grep -oE '[0-9]+ responses' "$work/load.out" | head -1 | cut -d' ' -f1)
		hot=$(q "SELECT n_tup_hot_upd || ' of ' || n_tup_upd FROM pg_stat_user_tables WHERE schemaname = '$schema'")
		awk -v l="$label" -v r="$round" -v n="$n" -v b=$((b1 - b0)) -v rec=$((r1 - r0)) -v f=$((f1 - f0)) -v hot="$hot" \
			-v cpu="$(grep -oE 'cpu pg +[0-9.]+ s, [0-9.]+' "$work/load.out" | awk '{print $NF}')" \
			-v rps="$(grep -oE '[0-9.]+ req/s' "$work/load.out" | head -1)" \
			'BEGIN { printf "%s round %d: %s; WAL %.0f B, %.2f records, %.3f full-page images per request; PostgreSQL %s µs per request; HOT updates %s\n", l, r, rps, b/n, rec/n, f/n, cpu, hot }'
		q "DROP SCHEMA \"$schema\" CASCADE; DROP SCHEMA \"${schema}_up\" CASCADE" 2>/dev/null || true
	done
done
