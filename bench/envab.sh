#!/usr/bin/env bash
# envab.sh: the gateway's own CPU per new key under several environments (GOGC,
# GOMEMLIMIT, GOMAXPROCS, ...) against the bare proxy's per proxied request, in
# interleaved rounds.
#
#   bash bench/envab.sh LABEL=ENV [LABEL=ENV ...]
#   bash bench/envab.sh default=- gogc100=GOGC=100 gogc400=GOGC=400
#
# ENV is one or more VAR=VALUE separated by commas, or - for none. Builds the gateway,
# bench/cmd/bareproxy, examples/payments and loadgen from this tree, starts
# examples/payments --no-idempotency on a schema of its own of PG_URL as the upstream,
# the bare proxy and one gateway (memory store) per label in front of it, then ROUNDS
# (6) rounds of DURATION (5s, after a 1 s warm-up) at CLIENTS (32) clients on each, in
# an order that rotates every round. Prints each window's req/s and the proxy's CPU per
# response (/proc, as run.sh measures it), then per label the median of the rounds'
# ratios to the bare proxy and the ratio of the sums. The machine's other work moves the
# windows: compare labels within one run only.
set -euo pipefail
PG_URL=${PG_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}
ROUNDS=${ROUNDS:-6} DURATION=${DURATION:-5s} CLIENTS=${CLIENTS:-32} BASE_PORT=${BASE_PORT:-18600}
[ $# -gt 0 ] || { sed -n '2,17p' "$0"; exit 2; }
for spec in "$@"; do
	[[ $spec == *=* && ${spec%%=*} =~ ^[a-z0-9_-]+$ && ${spec%%=*} != bare ]] ||
		{ echo "envab.sh: $spec: want LABEL=ENV, LABEL of a-z, 0-9, _ and - (not bare)" >&2; exit 2; }
done
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
schema=envab_$$
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	psql "$PG_URL" -Atqc "DROP SCHEMA IF EXISTS \"$schema\" CASCADE" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT
echo "building" >&2
(cd "$root" && go build -o "$work/retrysafe" ./cmd/retrysafe && go build -o "$work/payments" ./examples/payments)
(cd "$root/bench" && go build -o "$work/loadgen" ./cmd/loadgen && go build -o "$work/bareproxy" ./cmd/bareproxy)
sep='?'; [[ $PG_URL == *\?* ]] && sep='&'
up=http://127.0.0.1:$BASE_PORT
"$work/payments" --addr "127.0.0.1:$BASE_PORT" --store "$PG_URL${sep}pool_max_conns=16" --schema "$schema" \
	--no-idempotency >"$work/up.log" 2>&1 &
pids+=($!)
declare -A PID PORT
labels=(bare)
PORT[bare]=$((BASE_PORT + 1))
"$work/bareproxy" --listen "127.0.0.1:${PORT[bare]}" --upstream "$up" >"$work/bare.log" 2>&1 &
PID[bare]=$!; pids+=($!)
port=$((BASE_PORT + 2))
for spec in "$@"; do
	label=${spec%%=*} envs=${spec#*=}
	[ "$envs" = - ] && envs=
	PORT[$label]=$port
	env ${envs//,/ } "$work/retrysafe" gateway --upstream "$up" --listen "127.0.0.1:$port" --admin off \
		--store memory: --log-level warn >"$work/gw-$label.log" 2>&1 &
	PID[$label]=$!; pids+=($!)
	labels+=("$label")
	port=$((port + 1))
done
for l in "${labels[@]}"; do # until each answers, the upstream behind it too
	for _ in $(seq 100); do
		curl -fs -o /dev/null -X POST "http://127.0.0.1:${PORT[$l]}/payments" -H "Idempotency-Key: warm-$l" \
			-H 'Content-Type: application/json' -d '{"amount":1,"currency":"EUR"}' && continue 2
		sleep 0.1
	done
	echo "envab.sh: $l does not answer; its log:" >&2; cat "$work/gw-$l.log" "$work/bare.log" >&2 2>/dev/null || true; exit 1
done
n=${#labels[@]}
: >"$work/windows"
for r in $(seq 1 "$ROUNDS"); do
	for i in $(seq 0 $((n - 1))); do
		l=${labels[$(((i + r) % n))]}
		"$work/loadgen" --url "http://127.0.0.1:${PORT[$l]}/payments" -c "$CLIENTS" -H 'Content-Type: application/json' \
			--body '{"amount":1250,"currency":"EUR"}' --duration "$DURATION" --warmup 1s --cpu "proxy=${PID[$l]}" \
			--format json 2>>"$work/loadgen.log" |
			jq -r --arg l "$l" --arg r "$r" '"\($r) \($l) \(.throughput | floor) \(.cpu.proxy.us_per_request)"' | tee -a "$work/windows" |
			awk '{ printf "round %s %s: %s req/s, %.0f µs of the proxy'"'"'s CPU per response\n", $1, $2, $3, $4 }'
	done
done
awk '
	{ us[$1, $2] = $4; rounds[$1] = 1; if ($2 != "bare") labels[$2] = 1 }
	END {
		for (l in labels) {
			k = 0; sl = 0; sb = 0
			for (r in rounds) if ((r, l) in us && (r, "bare") in us && us[r, "bare"] > 0) {
				ratio[++k] = us[r, l] / us[r, "bare"]; sl += us[r, l]; sb += us[r, "bare"]
			}
			if (k == 0) continue
			for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (ratio[j] < ratio[i]) { t = ratio[i]; ratio[i] = ratio[j]; ratio[j] = t }
			med = k % 2 ? ratio[(k + 1) / 2] : (ratio[k / 2] + ratio[k / 2 + 1]) / 2
			printf "%s ÷ bare: median of %d rounds %.2f×, summed %.2f×\n", l, k, med, sl / sb
		}
	}' "$work/windows"
