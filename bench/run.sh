#!/usr/bin/env bash
# bench/run.sh: the POST /payments load benchmark in one run on this machine: every
# subject's req/s, p50, p99 and CPU per request of each process involved, at several
# concurrencies and body sizes, with the duplicate storm, replay vs first execution
# and pgbench's ceilings beside them.
#
#   bash bench/run.sh                                    # everything, about 20 minutes
#   ROUNDS=1 DURATION=3s bash bench/run.sh               # a quick look at everything
#   SUBJECTS="direct nginx bareproxy gw-memory" ROUNDS=2 CONCURRENCY=32 bash bench/run.sh
#                                                        # a fast A/B of the gateway's own
#                                                        # cost: about 3 minutes
# At the end it prints the report's path and a one-screen summary (the goal figures).
#
# Subjects (SUBJECTS picks some; direct, the baseline of every ratio, is always in),
# each serving POST /payments on the same PostgreSQL, each in its own schema:
#   direct            examples/payments --no-idempotency: the unprotected upstream
#   nginx             Debian's nginx as a bare reverse proxy in front of direct
#                     (installed with apt-get when missing): worker_processes auto (one
#                     per core: 2 here), keep-alive to the upstream, no access log
#                     ($OUT/nginx.conf)
#   bareproxy         bench/cmd/bareproxy: httputil.ReverseProxy with the gateway's
#                     transport, no idempotency, in front of direct
#   bareproxy-keyed   bareproxy --keyed: the same proxy keeping the Idempotency-Key
#                     contract in the plainest way (body in memory, SHA-256, a map
#                     under a mutex, the answer kept; no durability, expiry, lease,
#                     deadline or metrics): what the contract's own work costs
#   payments-tx       examples/payments, transaction mode (the default)
#   payments-mw       examples/payments --tx=false (middleware mode)
#   gw-<store>        retrysafe gateway (memory, sqlite, postgres, redis store) in front
#                     of direct
#   caddy             Caddy (caddy/cmd/caddy, the Caddy module's build) as a bare
#                     reverse_proxy in front of direct, no access log, admin off
#   caddy-<store>     the same Caddy with the idempotency directive (sqlite, postgres
#                     store) before reverse_proxy: the Caddy module's cost
#   *-nobatch         payments-tx, gw-sqlite and gw-postgres with the stores' batching
#                     (group commit) off: what it gains (matrix, 8 clients and more)
#   gw-<store>-base   the same gateway built from the commit BASE_REV names (memory,
#                     sqlite, postgres store): a change and the code before it, measured
#                     in the same interleaved rounds (matrix)
#   express           bench/baselines/express: the common hand-written Express +
#                     node-postgres idempotency handler, one node process
#   express-cluster2  the same under node's cluster module, 2 workers
#   express-autocommit the same, insert and 'done' update autocommitted (32 clients)
# Phases (PHASES picks some; default all of them, or "matrix bodies replay" when
# SUBJECTS is set), all recorded as JSON lines in $OUT/results.jsonl, from which
# bench/cmd/benchreport writes $OUT/report.md:
#   matrix   every subject at CONCURRENCY closed-loop clients, a new Idempotency-Key
#            per request, ROUNDS rounds, subjects in a rotating order inside each round
#            so that the shared machine's load falls on all of them alike;
#   bodies   the proxies and gateways (and direct) with 1 KiB and 64 KiB answers
#            (BODIES, the upstream's --pad) at BODY_CLIENTS clients, ROUNDS rounds;
#   replay   replay vs first execution, back to back, at 1 and 32 clients;
#   storm    1,000 concurrent requests with one key per subject; ledger rows counted;
#   pgbench  inside each matrix round: PostgreSQL's own ceiling (and CPU per
#            transaction) for the ledger insert, pgstore's claim statement, the whole
#            SQL of a tx-mode payment and of an Express payment.
#   paced    (only when PHASES names it) direct, the bare proxies, Caddy and the gateways
#            (memory, SQLite, PostgreSQL, and their -base builds) at PACED_CLIENTS (32)
#            clients paced to PACED_RATE (1000) requests a second in all (loadgen
#            --rate), ROUNDS rounds in rotating order: each serves the same load, so their
#            CPU per request is compared at one rate, where the matrix's closed loop gives
#            whichever is faster in a window more requests per wake-up. PACED_RATE must be
#            below every subject's throughput; the report flags one that fell behind;
#   pair     (only when PHASES names it) the pairs of PAIRS whose two subjects are
#            selected, each pair's two loaded at the same time, both by PAIR_CLIENTS (32)
#            clients paced to PAIR_RATE (800) requests a second each, ROUNDS rounds of
#            DURATION, the pairs in rotating order: the two share every window of the
#            machine's state, so the ratio of their CPU per request moves a few percent
#            from round to round where windows taken one after another move it by a
#            third. PAIRS (SUBJECT:PARTNER ...) defaults to bareproxy-keyed, caddy,
#            gw-memory and gw-memory-base each with bareproxy, and gw-sqlite with
#            gw-memory. PAIR_RATE must be below what both can serve at once;
#   split    (only when PHASES names it; needs perf and bareproxy) where in each
#            process the CPU of a new key goes: bareproxy, bareproxy-keyed and each
#            gateway selected (gw-<store>, not -base), SPLIT_CLIENTS (32) clients,
#            ROUNDS rounds of DURATION, each recorded with `perf record -g` at SPLIT_HZ
#            (1000) samples a second and split by bench/cmd/perfsplit into the handler (its
#            ReverseProxy apart), the server's and the transport's goroutines, the
#            collector and the scheduler, user and kernel, per request, with the leaf
#            functions that differ most from bareproxy's: $OUT/split.txt, also at the
#            summary's end; the samples as perf script printed them in $OUT/split/.
# CPU per request: utime+stime (+ the reaped children's) from /proc/PID/stat of each
# process tree involved — the subject's proxy (nginx master and workers, bareproxy or
# gateway), the app server (the upstream, or the subject itself), PostgreSQL, the Redis
# server (gw-redis), the load generator — over each measured window, divided by the
# responses. Everything of the run connects to PostgreSQL as a role of its own, created
# for the run and dropped at its end, so that its backends (their process title names
# the role) are counted apart from other work on the shared cluster; the whole cluster
# is reported beside them, less its idle rate, which every round measures first for
# IDLE (the same for Redis).
# Everything it starts is stopped on exit, and its schemas, Redis keys and files are
# removed (the results in $OUT stay).
#
# OWN_PG=on or OWN_PG=off: the run starts a PostgreSQL cluster of its own (initdb in a
# temporary directory, fsync and synchronous_commit on, autovacuum on or off as given,
# shared_buffers 256MB, max_connections 200, the rest PostgreSQL's defaults) on a free
# port, runs everything on it, and removes it at the end. Nothing else runs on that
# cluster, so its whole CPU (the postmaster and every child: the backends, checkpointer,
# WAL writer, background writer, autovacuum launcher and workers) is what the run costs
# PostgreSQL: the `pg cluster` column needs no other work to be steady. PG_BIN names its
# binaries (default the newest /usr/lib/postgresql/*/bin); as root they run as the
# postgres user.
#
# Environment: RETRYSAFE_POSTGRES_URL, RETRYSAFE_REDIS_URL (the local defaults
# otherwise), OWN_PG, SUBJECTS, PHASES, DURATION (3s), WARMUP (1s), ROUNDS (3), CONCURRENCY
# ("1 8 32 128"), BODIES ("1024 65536"), BODY_CLIENTS (32), PACED_CLIENTS (32),
# PACED_RATE (1000), PAIRS, PAIR_CLIENTS (32), PAIR_RATE (800), POOL (16: connections per
# pool, for every server alike), PGBENCH_DURATION (3), IDLE (1s), REV (build the
# subjects from this commit, not the working tree), BASE_REV (the commit the -base
# subjects are built from), OUT (a new directory under /tmp), BASE_PORT (18500).
set -euo pipefail
# The whole script is one group, which bash reads to its end before running any of
# it: a file edited or checked out while a run is going cannot change that run.
{

cd "$(dirname "$0")/.."
ROOT=$PWD

PG_URL=${RETRYSAFE_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}
REDIS_URL=${RETRYSAFE_REDIS_URL:-redis://127.0.0.1:6379/0}
DURATION=${DURATION:-3s}
WARMUP=${WARMUP:-1s}
ROUNDS=${ROUNDS:-3}
CONCURRENCY=${CONCURRENCY:-1 8 32 128}
BODIES=${BODIES:-1024 65536}
BODY_CLIENTS=${BODY_CLIENTS:-32}
PACED_CLIENTS=${PACED_CLIENTS:-32}
PACED_RATE=${PACED_RATE:-1000}
PAIR_CLIENTS=${PAIR_CLIENTS:-32}
PAIR_RATE=${PAIR_RATE:-800}
PAIRS=${PAIRS:-bareproxy-keyed:bareproxy caddy:bareproxy gw-memory:bareproxy gw-memory-base:bareproxy gw-sqlite:gw-memory}
POOL=${POOL:-16}
PGBENCH=${PGBENCH:-/usr/lib/postgresql/15/bin/pgbench}
PGBENCH_DURATION=${PGBENCH_DURATION:-3}
IDLE=${IDLE:-1s}
BASE_PORT=${BASE_PORT:-18500}
RUN=rsb$(date +%s)$$
OUT=${OUT:-/tmp/retrysafe-bench-$(date -u +%Y%m%dT%H%M%SZ)}
WORK= # made once cleanup can remove it
OWN_PGDIR= # OWN_PG's cluster, made once cleanup can stop it
case ${OWN_PG:-} in '' | on | off) ;; *) echo "OWN_PG=${OWN_PG}: want on or off" >&2; exit 2 ;; esac
LOGS=$OUT/logs
RESULTS=$OUT/results.jsonl
BODY='{"amount":1250,"currency":"EUR"}'
STARTED=$(date +%s)

mkdir -p "$OUT" "$LOGS"
: >"$RESULTS"

log() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "run.sh: $*"; exit 1; }

# ---- what to run -------------------------------------------------------------------
ALL_SUBJECTS=(direct nginx bareproxy bareproxy-keyed payments-tx payments-mw payments-tx-nobatch gw-memory gw-sqlite gw-postgres gw-redis
	gw-sqlite-nobatch gw-postgres-nobatch gw-memory-base gw-sqlite-base gw-postgres-base caddy caddy-sqlite caddy-postgres
	express express-cluster2 express-autocommit)
if [ -n "${SUBJECTS:-}" ]; then
	SEL=(direct)
	for s in $SUBJECTS; do
		[[ " ${ALL_SUBJECTS[*]} " == *" $s "* ]] || die "SUBJECTS: unknown subject $s (known: ${ALL_SUBJECTS[*]})"
		[[ " ${SEL[*]} " == *" $s "* ]] || SEL+=("$s")
	done
	PHASES=${PHASES:-matrix bodies replay}
else
	SEL=("${ALL_SUBJECTS[@]}")
	PHASES=${PHASES:-matrix bodies replay storm pgbench}
fi
for p in $PHASES; do
	case $p in matrix | bodies | replay | storm | pgbench | paced | pair | split) ;; *) die "PHASES: unknown phase $p" ;; esac
done
if [[ " $PHASES " == *" pair "* ]]; then
	PAIRED="" # the pairs of PAIRS whose two subjects are selected
	for p in $PAIRS; do
		[[ $p == ?*:?* ]] || die "PAIRS: $p is not SUBJECT:PARTNER"
		[[ " ${SEL[*]} " == *" ${p%%:*} "* && " ${SEL[*]} " == *" ${p#*:} "* ]] && PAIRED+="$p "
	done
	[ -n "$PAIRED" ] || die "PHASES: pair has no pair of PAIRS ($PAIRS) whose two subjects are both in SUBJECTS"
fi
if [[ " $PHASES " == *" split "* ]]; then
	[[ " ${SEL[*]} " == *" bareproxy "* ]] || die "PHASES: split compares the proxies with bareproxy: add it to SUBJECTS"
	command -v perf >/dev/null || die "PHASES: split needs perf (Debian: apt-get install linux-perf)"
fi
want() { [[ " ${SEL[*]} " == *" $1 "* ]]; }
phase() { [[ " $PHASES " == *" $1 "* ]]; }
# in_sel NAMES...: the names that are selected, in the order given.
in_sel() {
	for s in "$@"; do want "$s" && printf "%s " "$s"; done
	return 0
}
any_express() { want express || want express-cluster2 || want express-autocommit; }
any_caddy() { want caddy || want caddy-sqlite || want caddy-postgres; }

# Body sizes: the pads the upstream is started with. 0 is the default answer (~120
# bytes); the others only for the body phase's subjects.
BODY_SUBJECTS=$(in_sel direct nginx bareproxy gw-memory gw-sqlite gw-postgres gw-redis)
PADS=(0)
if phase bodies; then
	for b in $BODIES; do PADS+=("$b"); done
fi
padlabel() { # BYTES: 0, 1k, 64k, or the bytes
	if [ "$1" -ge 1024 ] && [ $(($1 % 1024)) = 0 ]; then printf '%dk' $(($1 / 1024)); else printf '%d' "$1"; fi
}
inst() { # SUBJECT PAD: the name of that subject's instance for that body size
	if [ "$2" = 0 ]; then printf '%s' "$1"; else printf '%s@%s' "$1" "$(padlabel "$2")"; fi
}

tools=(go psql redis-cli jq curl ss getconf)
any_express && tools+=(node npm)
phase pgbench && tools+=("$PGBENCH")
for tool in "${tools[@]}"; do
	command -v "$tool" >/dev/null || die "$tool not found"
done
if want nginx && ! command -v nginx >/dev/null; then
	log "nginx not found: installing Debian's nginx (apt-get install -y nginx)"
	DEBIAN_FRONTEND=noninteractive apt-get install -y nginx >"$LOGS/apt.log" 2>&1 ||
		{ apt-get update >>"$LOGS/apt.log" 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y nginx >>"$LOGS/apt.log" 2>&1; } ||
		{ tail -5 "$LOGS/apt.log" >&2; die "could not install nginx"; }
fi
CLK_TCK=$(getconf CLK_TCK)

# url_with URL PARAMS: URL with &PARAMS (or ?PARAMS) appended.
url_with() { case $1 in *\?*) printf '%s&%s' "$1" "$2" ;; *) printf '%s?%s' "$1" "$2" ;; esac; }
SCHEMAS=("${RUN}_tx" "${RUN}_mw" "${RUN}_txn" "${RUN}_gwn" "${RUN}_ex" "${RUN}_exc" "${RUN}_exa" "${RUN}_pgb" "${RUN}_pgbx")
for pad in "${PADS[@]}"; do SCHEMAS+=("${RUN}_up$(padlabel "$pad")" "${RUN}_gw$(padlabel "$pad")"); done
REDIS_PREFIX="$RUN:"
PIDS=()
ROLE= # set below, once cleanup can drop it

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
	[ -n "$ROLE" ] && psql "$PG_URL" -X -q -c "DROP OWNED BY \"$ROLE\"" -c "DROP ROLE IF EXISTS \"$ROLE\"" >/dev/null 2>&1
	redis-cli -u "$REDIS_URL" --scan --pattern "${REDIS_PREFIX}*" 2>/dev/null | xargs -r -n 500 redis-cli -u "$REDIS_URL" del >/dev/null 2>&1
	[ -n "$WORK" ] && rm -rf "$WORK"
	if [ -n "$OWN_PGDIR" ]; then
		as_pg "$PG_BIN/pg_ctl" -D "$OWN_PGDIR/data" -m fast -w stop >/dev/null 2>&1
		rm -rf "$OWN_PGDIR"
	fi
	log "cleaned up (processes, schemas ${RUN}_*, role ${ROLE:-(none)}, Redis keys ${REDIS_PREFIX}*); results in $OUT"
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP
WORK=$(mktemp -d /tmp/retrysafe-bench-work.XXXXXX)
BIN=$WORK/bin
mkdir -p "$BIN"

# as_pg CMD...: runs CMD as the postgres user when the run is root's (PostgreSQL
# refuses to run as root), as is otherwise.
as_pg() {
	if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
if [ -n "${OWN_PG:-}" ]; then
	PG_BIN=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
	[ -x "$PG_BIN/initdb" ] || die "OWN_PG: no initdb in PG_BIN=${PG_BIN:-(none found)}"
	PGBENCH=$PG_BIN/pgbench
	OWN_PGDIR=$(mktemp -d /tmp/retrysafe-bench-pg.XXXXXX)
	[ "$(id -u)" = 0 ] && chown postgres: "$OWN_PGDIR"
	as_pg "$PG_BIN/initdb" -D "$OWN_PGDIR/data" -U postgres --auth=trust -E UTF8 >"$LOGS/initdb.log" 2>&1 ||
		{ tail -5 "$LOGS/initdb.log" >&2; die "OWN_PG: initdb failed"; }
	own_port=$BASE_PORT
	while ss -Htln "sport = :$own_port" | grep -q .; do own_port=$((own_port + 1)); done
	BASE_PORT=$((own_port + 1))
	as_pg "$PG_BIN/pg_ctl" -D "$OWN_PGDIR/data" -l "$OWN_PGDIR/postgres.log" -w -t 60 \
		-o "-p $own_port -c listen_addresses=127.0.0.1 -c unix_socket_directories=$OWN_PGDIR -c fsync=on -c synchronous_commit=on -c autovacuum=$OWN_PG -c shared_buffers=256MB -c max_connections=200" \
		start >"$LOGS/pg_ctl.log" 2>&1 || { tail -20 "$OWN_PGDIR/postgres.log" >&2; die "OWN_PG: the cluster did not start"; }
	PG_URL="postgres://postgres@127.0.0.1:$own_port/postgres?sslmode=disable"
	log "OWN_PG: a cluster of the run's own on port $own_port (autovacuum $OWN_PG, $($PG_BIN/postgres --version))"
fi

# The run's own PostgreSQL role: everything of the run connects as it, so that its
# backends (whose process title names the role) are told apart from other work on the
# shared cluster, and owns everything the run creates. Without the right to create a
# role (or trust authentication for it), the run connects as PG_URL's user and only
# the whole cluster's CPU, less its idle rate, is reported.
RUN_URL=$PG_URL
DBNAME=$(psql "$PG_URL" -XAtc 'select current_database()')
ROLE=$RUN
if psql "$PG_URL" -X -q -v ON_ERROR_STOP=1 -c "CREATE ROLE \"$ROLE\" LOGIN" -c "GRANT CREATE ON DATABASE \"$DBNAME\" TO \"$ROLE\"" 2>"$LOGS/role.log"; then
	RUN_URL=$(printf '%s' "$PG_URL" | sed -E "s#^(postgres(ql)?://)([^@/]*@)?#\1$ROLE@#")
	[ "$(psql "$RUN_URL" -XAtc 'select current_user' 2>>"$LOGS/role.log")" = "$ROLE" ] || RUN_URL=$PG_URL
fi
if [ "$RUN_URL" = "$PG_URL" ]; then
	log "could not connect as a role of the run's own ($(tail -1 "$LOGS/role.log")): PostgreSQL's CPU is the whole cluster's less its idle rate"
	psql "$PG_URL" -X -q -c "DROP ROLE IF EXISTS \"$ROLE\"" >/dev/null 2>&1 || true
	ROLE=
fi
# Every Go pool: POOL connections, idle ones closed after a second (the database is
# shared with other work, and the subjects take turns).
PG_POOLED=$(url_with "$RUN_URL" "pool_max_conns=$POOL&pool_max_conn_idle_time=1s&pool_health_check_period=500ms")
psql_q() { PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning" psql "$RUN_URL" -X -q -v ON_ERROR_STOP=1 "$@"; }

# start NAME CMD...: runs CMD in its own process group (so that its children stop with
# it), logging to $LOGS/NAME.log; LASTPID is its pid (setsid execs, so it is CMD's).
start() {
	local name=$1
	shift
	setsid "$@" >"$LOGS/$name.log" 2>&1 &
	LASTPID=$!
	PIDS+=("$LASTPID")
}

# assign_port NAME: PORT[NAME] = the next port from BASE_PORT on that nothing listens on.
declare -A PORT SCHEMA PAD CPUARGS
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

# ---- the shared servers' processes, for their CPU -----------------------------------
# PostgreSQL: the postmaster (its backends are its children); Redis: the server. Only
# when they run on this machine; otherwise their column stays empty.
PG_PID=
pgdata=$(psql "$PG_URL" -XAtc 'show data_directory' 2>/dev/null || true)
if [ -n "$pgdata" ] && [ -r "$pgdata/postmaster.pid" ]; then
	PG_PID=$(head -1 "$pgdata/postmaster.pid")
	[ -r "/proc/$PG_PID/stat" ] || PG_PID=
fi
[ -n "$PG_PID" ] || log "PostgreSQL's postmaster is not readable on this machine: no postgres CPU columns"
REDIS_PID=$(redis-cli -u "$REDIS_URL" info server 2>/dev/null | tr -d '\r' | sed -n 's/^process_id:\([0-9]*\)$/\1/p')
if [ -z "$REDIS_PID" ] || ! grep -q redis "/proc/$REDIS_PID/comm" 2>/dev/null; then
	REDIS_PID=
	log "the Redis server is not on this machine: no redis CPU column"
fi
# postgres: the run's own backends (its role's); pgcluster: the whole cluster (its
# background writers included, and other work on it, hence its idle rate). Without a
# role of its own, postgres is the whole cluster, less its idle rate. On OWN_PG's
# cluster nothing else runs: its background work (checkpoints, autovacuum) is the run's,
# and the whole cluster is counted with no idle rate taken away (such work caused by
# one subject may fall in the next one's window; the rotating order spreads it).
SHARED_CPU=()
PG_CPU=()
if [ -n "$PG_PID" ] && [ -n "$ROLE" ]; then
	PG_CPU=(--cpu "postgres=$PG_PID:: $ROLE " --cpu "pgcluster=$PG_PID")
	[ -n "${OWN_PG:-}" ] || SHARED_CPU+=(--cpu "pgcluster=$PG_PID")
elif [ -n "$PG_PID" ]; then
	PG_CPU=(--cpu "postgres=$PG_PID")
	SHARED_CPU+=(--cpu "postgres=$PG_PID")
fi
[ -n "$REDIS_PID" ] && SHARED_CPU+=(--cpu "redis=$REDIS_PID")

# ---- build and set up -------------------------------------------------------------
log "building (go $(go env GOVERSION))"
# REV: the subjects (payments, the gateway) are built from that commit's files
# (git archive, into the work directory), so that two runs compare two commits
# whatever the shared working tree holds; without it, from the working tree as it is.
# The harness (loadgen, benchreport, bareproxy, the baselines) is always this tree's.
SRC=$ROOT
if [ -n "${REV:-}" ]; then
	SRC=$WORK/src
	mkdir -p "$SRC"
	git -C "$ROOT" archive --format=tar "$REV" | tar -x -C "$SRC" || die "REV=$REV: git archive failed"
	log "building the subjects from $REV = $(git -C "$ROOT" rev-parse --short "$REV")"
fi
(cd "$SRC" && go build -o "$BIN/payments" ./examples/payments && go build -o "$BIN/retrysafe" ./cmd/retrysafe)
if want gw-memory-base || want gw-sqlite-base || want gw-postgres-base; then
	[ -n "${BASE_REV:-}" ] || die "the -base subjects need BASE_REV, the commit to build them from"
	mkdir -p "$WORK/base"
	git -C "$ROOT" archive --format=tar "$BASE_REV" | tar -x -C "$WORK/base" || die "BASE_REV=$BASE_REV: git archive failed"
	log "building the -base subjects from $BASE_REV = $(git -C "$ROOT" rev-parse --short "$BASE_REV")"
	(cd "$WORK/base" && go build -o "$BIN/retrysafe-base" ./cmd/retrysafe)
fi
# loadgen, benchreport, bareproxy and perfsplit belong to the bench module (bench/go.mod),
# so they are built from inside it; the subjects belong to the root module.
(cd bench && go build -o "$BIN/loadgen" ./cmd/loadgen && go build -o "$BIN/benchreport" ./cmd/benchreport &&
	go build -o "$BIN/bareproxy" ./cmd/bareproxy && go build -o "$BIN/perfsplit" ./cmd/perfsplit)
# Caddy with the idempotency module: the caddy module (caddy/go.mod) of the subjects'
# source, taking its root module from the same tree (its replace directive).
if any_caddy; then
	log "building Caddy with the idempotency module"
	(cd "$SRC/caddy" && go build -o "$BIN/caddy" ./cmd/caddy)
fi
if any_express; then
	log "installing the Express baseline (npm)"
	bash bench/baselines/express/setup.sh >"$LOGS/npm.log" 2>&1 || { cat "$LOGS/npm.log" >&2; die "npm install failed"; }
fi

{
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	if [ -n "${REV:-}" ]; then
		echo "subjects built from: $(git log -1 --format='%h %s' "$REV" | cut -c1-100) (REV=$REV, committed files only)"
	else
		echo "subjects built from: the working tree at $(git log -1 --format='%h %s' 2>/dev/null | cut -c1-100)$(git diff --quiet HEAD 2>/dev/null || echo ' (plus uncommitted changes)')"
	fi
	echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(uname -sr), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
	echo "go: $(go env GOVERSION)"
	if any_express; then
		echo "node: $(node --version); express: $(node -p 'require("./bench/baselines/express/node_modules/express/package.json").version'); pg: $(node -p 'require("./bench/baselines/express/node_modules/pg/package.json").version')"
	fi
	want nginx && echo "nginx: $(nginx -v 2>&1 | sed 's/.*: //'), worker_processes auto ($(nproc) workers)"
	echo "postgres: $(psql "$PG_URL" -XAtc 'show server_version'), fsync $(psql "$PG_URL" -XAtc 'show fsync'), synchronous_commit $(psql "$PG_URL" -XAtc 'show synchronous_commit'), autovacuum $(psql "$PG_URL" -XAtc 'show autovacuum'), max_connections $(psql "$PG_URL" -XAtc 'show max_connections'), postmaster pid ${PG_PID:-not local}"
	echo "redis: $(redis-cli -u "$REDIS_URL" info server | grep redis_version | tr -d '\r'), appendonly $(redis-cli -u "$REDIS_URL" config get appendonly | tail -1), pid ${REDIS_PID:-not local}"
	echo "subjects: ${SEL[*]}"
	echo "settings: PHASES='$PHASES' DURATION=$DURATION WARMUP=$WARMUP ROUNDS=$ROUNDS CONCURRENCY='$CONCURRENCY' BODIES='$BODIES' BODY_CLIENTS=$BODY_CLIENTS POOL=$POOL PGBENCH_DURATION=$PGBENCH_DURATION IDLE=$IDLE CLK_TCK=$CLK_TCK"
	echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT/env.txt" >&2

# ---- start the subjects ------------------------------------------------------------
# The upstream (direct), one per body size.
declare -A UPPID
for pad in "${PADS[@]}"; do
	i=$(inst direct "$pad")
	assign_port "$i"
	SCHEMA[$i]=${RUN}_up$(padlabel "$pad")
	PAD[$i]=$pad
	start "$i" "$BIN/payments" --addr "127.0.0.1:${PORT[$i]}" --store "$PG_POOLED" --schema "${SCHEMA[$i]}" --no-idempotency --pad "$pad"
	UPPID[$pad]=$LASTPID
	CPUARGS[$i]="--cpu app=$LASTPID"
	wait_http "$i" "${PORT[$i]}"
done

# subject_pads SUBJECT: the body sizes SUBJECT runs with.
subject_pads() {
	if [[ " $BODY_SUBJECTS " == *" $1 "* ]]; then printf '%s ' "${PADS[@]}"; else printf '0'; fi
}

# A proxy subject's instance for each of its body sizes: its port, its upstream's
# schema (for the storm's ledger rows) and its CPU arguments (the proxy, the upstream).
proxied() { # SUBJECT PAD PID
	local i
	i=$(inst "$1" "$2")
	SCHEMA[$i]=${SCHEMA[$(inst direct "$2")]}
	PAD[$i]=$2
	CPUARGS[$i]="--cpu proxy=$3 --cpu app=${UPPID[$2]}"
}

if want nginx; then
	# One nginx for every body size, a server block each. Keep-alive both ways (64
	# idle connections per worker to the upstream, HTTP/1.1), no access log, and
	# buffers that hold a 64 KiB answer in memory (never a temporary file), as the
	# gateway holds it; everything under its own prefix in the work directory.
	NGX=$WORK/nginx
	mkdir -p "$NGX/tmp"
	chmod o+x "$WORK" && chmod -R o+rwx "$NGX"
	{
		echo "worker_processes auto;"
		echo "daemon off;"
		echo "pid $NGX/nginx.pid;"
		echo "error_log $LOGS/nginx-error.log warn;"
		echo "events { worker_connections 4096; }"
		echo "http {"
		echo "  access_log off;"
		echo "  keepalive_requests 1000000;"
		echo "  keepalive_timeout 120s;"
		echo "  client_body_temp_path $NGX/tmp/body; proxy_temp_path $NGX/tmp/proxy; fastcgi_temp_path $NGX/tmp/fastcgi;"
		echo "  uwsgi_temp_path $NGX/tmp/uwsgi; scgi_temp_path $NGX/tmp/scgi;"
		echo "  proxy_buffers 32 4k; proxy_max_temp_file_size 0;"
		for pad in $(subject_pads nginx); do
			i=$(inst nginx "$pad")
			assign_port "$i"
			echo "  upstream up_$pad { server 127.0.0.1:${PORT[$(inst direct "$pad")]}; keepalive 64; keepalive_requests 1000000; }"
			echo "  server {"
			echo "    listen 127.0.0.1:${PORT[$i]};"
			echo "    location / { proxy_pass http://up_$pad; proxy_http_version 1.1; proxy_set_header Connection \"\"; }"
			echo "  }"
		done
		echo "}"
	} >"$NGX/nginx.conf"
	cp "$NGX/nginx.conf" "$OUT/nginx.conf"
	nginx -t -p "$NGX" -e "$LOGS/nginx-error.log" -c "$NGX/nginx.conf" >"$LOGS/nginx-t.log" 2>&1 ||
		{ cat "$LOGS/nginx-t.log" >&2; die "nginx refused its configuration"; }
	start nginx nginx -p "$NGX" -e "$LOGS/nginx-error.log" -c "$NGX/nginx.conf"
	for pad in $(subject_pads nginx); do proxied nginx "$pad" "$LASTPID"; done
fi

if want bareproxy; then
	for pad in $(subject_pads bareproxy); do
		i=$(inst bareproxy "$pad")
		assign_port "$i"
		start "$i" "$BIN/bareproxy" --listen "127.0.0.1:${PORT[$i]}" --upstream "http://127.0.0.1:${PORT[$(inst direct "$pad")]}"
		proxied bareproxy "$pad" "$LASTPID"
	done
fi
if want bareproxy-keyed; then
	i=bareproxy-keyed
	assign_port "$i"
	start "$i" "$BIN/bareproxy" --keyed --listen "127.0.0.1:${PORT[$i]}" --upstream "http://127.0.0.1:${PORT[direct]}"
	proxied bareproxy-keyed 0 "$LASTPID"
fi

# The gateways log at warn: their per-request info line (one slog line per request)
# is left out, as the servers behind them log nothing per request either.
gwstore() { # SUBJECT PAD: the --store of that gateway
	local l
	l=$(padlabel "$2")
	case $1 in
	gw-memory) printf 'memory:' ;;
	gw-sqlite) printf 'sqlite:%s' "$WORK/gateway-$l.db" ;;
	gw-postgres) url_with "$PG_POOLED" "schema=${RUN}_gw$l" ;;
	gw-redis) url_with "$REDIS_URL" "prefix=${REDIS_PREFIX}$l:" ;;
	gw-sqlite-nobatch) printf 'sqlite:%s?batch=false' "$WORK/gateway-nobatch.db" ;;
	gw-postgres-nobatch) url_with "$PG_POOLED" "schema=${RUN}_gwn&batch=false" ;;
	gw-memory-base) printf 'memory:' ;;
	gw-sqlite-base) printf 'sqlite:%s' "$WORK/gateway-base.db" ;;
	gw-postgres-base) url_with "$PG_POOLED" "schema=${RUN}_gwb" ;;
	esac
}
for gw in gw-memory gw-sqlite gw-postgres gw-redis gw-sqlite-nobatch gw-postgres-nobatch gw-memory-base gw-sqlite-base gw-postgres-base; do
	want $gw || continue
	gwbin=$BIN/retrysafe
	[[ $gw == *-base ]] && gwbin=$BIN/retrysafe-base
	for pad in $(subject_pads $gw); do
		i=$(inst $gw "$pad")
		assign_port "$i"
		start "$i" "$gwbin" gateway --upstream "http://127.0.0.1:${PORT[$(inst direct "$pad")]}" \
			--listen "127.0.0.1:${PORT[$i]}" --admin off --store "$(gwstore $gw "$pad")" --log-level warn
		proxied $gw "$pad" "$LASTPID"
	done
done

# Caddy: one process per subject, its Caddyfile in the work directory (and $OUT).
# Admin endpoint and automatic HTTPS off, no access log (Caddy logs none unless asked),
# reverse_proxy with its defaults (keep-alive to the upstream).
caddystore() { # SUBJECT PAD: the idempotency store of that Caddy
	local l
	l=$(padlabel "$2")
	case $1 in
	caddy-sqlite) printf 'sqlite:%s' "$WORK/caddy-$l.db" ;;
	caddy-postgres) url_with "$PG_POOLED" "schema=${RUN}_cd$l" ;;
	esac
}
for cs in caddy caddy-sqlite caddy-postgres; do
	want $cs || continue
	for pad in $(subject_pads $cs); do
		i=$(inst $cs "$pad")
		assign_port "$i"
		{
			echo "{"
			echo "	admin off"
			echo "	auto_https off"
			echo "	order idempotency before reverse_proxy"
			echo "}"
			echo "http://127.0.0.1:${PORT[$i]} {"
			if [ "$cs" != caddy ]; then
				echo "	idempotency {"
				echo "		store $(caddystore $cs "$pad")"
				echo "	}"
			fi
			echo "	reverse_proxy 127.0.0.1:${PORT[$(inst direct "$pad")]}"
			echo "}"
		} >"$WORK/$i.Caddyfile"
		cp "$WORK/$i.Caddyfile" "$OUT/$i.Caddyfile"
		start "$i" "$BIN/caddy" run --config "$WORK/$i.Caddyfile" --adapter caddyfile
		proxied $cs "$pad" "$LASTPID"
	done
done

# own NAME SCHEMA CMD...: a subject that is its own app server, on PORT[NAME]
# (assigned before, so that CMD can name it).
own() {
	local name=$1 schema=$2
	shift 2
	SCHEMA[$name]=$schema
	PAD[$name]=0
	start "$name" "$@"
	CPUARGS[$name]="--cpu app=$LASTPID"
}
for spec in "payments-tx tx" "payments-mw mw --tx=false" "payments-tx-nobatch txn --batch=false"; do
	read -r name sfx flag <<<"$spec"
	want "$name" || continue
	assign_port "$name"
	own "$name" "${RUN}_$sfx" "$BIN/payments" --addr "127.0.0.1:${PORT[$name]}" --store "$PG_POOLED" --schema "${RUN}_$sfx" ${flag:+"$flag"}
done

if any_express; then
	EXPRESS=(env NODE_ENV=production DATABASE_URL="$RUN_URL" PG_POOL_MAX="$POOL")
	SERVER_JS=bench/baselines/express/server.js
	for pair in express:ex express-cluster2:exc express-autocommit:exa; do
		name=${pair%%:*} sfx=${pair#*:}
		want "$name" || continue
		psql_q -c "CREATE SCHEMA \"${RUN}_$sfx\""
		PGOPTIONS="-c search_path=${RUN}_$sfx" psql_q -f bench/baselines/express/schema.sql
		case $name in
		express) extra=() ;;
		express-cluster2) extra=(CLUSTER_WORKERS=2) ;;
		express-autocommit) extra=(EXPRESS_TX=0) ;;
		esac
		assign_port "$name"
		own "$name" "${RUN}_$sfx" "${EXPRESS[@]}" PG_SCHEMA="${RUN}_$sfx" PORT="${PORT[$name]}" "${extra[@]}" node "$SERVER_JS"
	done
fi

for i in "${!PORT[@]}"; do
	[[ $i == direct* ]] && continue
	name=$i
	[[ $i == nginx* ]] && name=nginx
	wait_http "$name" "${PORT[$i]}"
done
for pid in "${PIDS[@]}"; do
	kill -0 "$pid" 2>/dev/null || { tail -n 5 "$LOGS"/*.log >&2; die "a subject exited at start (pid $pid)"; }
done
log "all subjects up: $(for s in "${!PORT[@]}"; do printf '%s=:%s ' "$s" "${PORT[$s]}"; done)"

# lg INSTANCE KIND CLIENTS ROUND ARGS...: one loadgen run against INSTANCE, recorded
# with the CPU of its processes (and of PostgreSQL, Redis for gw-redis, and loadgen).
lg() {
	local i=$1 kind=$2 clients=$3 round=$4
	shift 4
	local subject=${i%@*} la cpu
	la=$(loadavg)
	cpu=(${CPUARGS[$i]} --cpu loadgen=self)
	cpu+=("${PG_CPU[@]}")
	[ -n "$REDIS_PID" ] && [ "$subject" = gw-redis ] && cpu+=(--cpu "redis=$REDIS_PID")
	local bg0
	bg0=$(pgbg)
	"$BIN/loadgen" --url "http://127.0.0.1:${PORT[$i]}/payments" -c "$clients" \
		-H 'Content-Type: application/json' --body "$BODY" --format json --clk-tck "$CLK_TCK" "${cpu[@]}" \
		--tag kind="$kind" --tag subject="$subject" --tag body="${PAD[$i]}" --tag clients="$clients" --tag round="$round" \
		--tag loadavg="$la" "$@" >"$WORK/last.json" 2>>"$LOGS/loadgen.log" || { log "loadgen failed for $i ($kind, $clients clients)"; return 0; }
	if [ -n "$bg0" ]; then # what the cluster's background work did during the run (warm-up included)
		jq -c --argjson a "$bg0" --argjson b "$(pgbg)" \
			'. + {pg_background: ($a | with_entries(.value = $b[.key] - .value))}' "$WORK/last.json" >"$WORK/last.bg.json" &&
			mv "$WORK/last.bg.json" "$WORK/last.json"
	fi
	cat "$WORK/last.json" >>"$RESULTS"
	jq -r '"\(.tags.kind) \(.tags.subject) body=\(.tags.body) c=\(.clients) r=\(.tags.round): \(.throughput|floor) req/s, p50 \(.latency.p50_ms) p99 \(.latency.p99_ms) ms, status \(.status|tostring), errors \(.errors); CPU µs/req \([.cpu // {} | to_entries[] | "\(.key) \(.value.us_per_request // 0 | floor)"] | join(", ")) (load \(.tags.loadavg))\(if .pg_background then "; pg background \(.pg_background | tostring)" else "" end)"' "$WORK/last.json" >&2
}

# pgbg: on OWN_PG's cluster, its counters of background work as a JSON object:
# checkpoints begun, autovacuum and autoanalyze runs finished on any table, full-page
# images written to the WAL. A window in which one ran costs more than the requests'
# own statements; the report's per-round figures can be matched against them. With
# them the next transaction ID (xids): every writing transaction takes one, so a
# window's count is its writes' commits exactly (the statistics views' commit counts
# reach the view up to a second late). The upstream's INSERT is one; a store's batch
# of claims or of completions is one, so the store's share per new key says how large
# its batches were.
pgbg() {
	[ -n "${OWN_PG:-}" ] || return 0
	psql "$PG_URL" -XAtqc "SELECT json_build_object('checkpoints', checkpoints_timed + checkpoints_req,
		'autovacuums', (SELECT coalesce(sum(autovacuum_count), 0) FROM pg_stat_all_tables),
		'autoanalyzes', (SELECT coalesce(sum(autoanalyze_count), 0) FROM pg_stat_all_tables),
		'wal_fpi', (SELECT wal_fpi FROM pg_stat_wal),
		'xids', pg_snapshot_xmax(pg_current_snapshot())::text::bigint) FROM pg_stat_bgwriter" 2>>"$LOGS/pgbg.log" || true
}

# idle LABEL: the shared servers' CPU over IDLE with nothing of ours sending (the idle
# connections of our pools close after a second; wait for that first), recorded. The
# report subtracts the last idle rate from the windows measured after it.
idle() {
	[ ${#SHARED_CPU[@]} -gt 0 ] || return 0
	sleep 1
	"$BIN/loadgen" --idle "$IDLE" --clk-tck "$CLK_TCK" "${SHARED_CPU[@]}" --tag kind=idle --tag at="$1" --format json \
		>"$WORK/idle.json" 2>>"$LOGS/loadgen.log" || { log "idle measurement failed"; return 0; }
	cat "$WORK/idle.json" >>"$RESULTS"
	jq -r '.cpu_window_s as $w | "idle \(.tags.at): \([.cpu | to_entries[] | "\(.key) \(.value.seconds / $w * 1000 | floor)"] | join(", ")) ms of CPU per second"' \
		"$WORK/idle.json" >&2
}

# ---- pgbench scripts (run inside the matrix rounds) ---------------------------------
# PostgreSQL's own ceiling: the SQL of one payment, without HTTP, Go or node. Their
# tables are in schemas of their own.
if phase pgbench; then
	"$BIN/retrysafe" migrate --store "$(url_with "$RUN_URL" "schema=${RUN}_pgb")" >/dev/null
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
fi
# pgb CLIENTS ROUND: the four scripts, in a rotating order, recorded, each with
# PostgreSQL's CPU per transaction: that of the run's backends (pgbench connects as the
# run's role) over the middle of the pgbench run — from a second after its start, when
# its connections are open, to half a second before its end, before they close — as
# CPU per second divided by transactions per second. pgbench opens one connection per
# client, so the servers' idle connections are given a moment to close first (the
# cluster is shared: max_connections 100).
pgb() {
	local c=$1 round=$2 scripts=(insert claim txmode express-tx) i script tps lat j cpupid cpu win
	local mid=$(((PGBENCH_DURATION * 1000 - 1500)))
	j=$((c < 2 ? 1 : 2))
	sleep 2
	for i in 0 1 2 3; do
		script=${scripts[$(((i + round) % 4))]}
		"$PGBENCH" -n -M prepared -c "$c" -j "$j" -T "$PGBENCH_DURATION" -f "$WORK/$script.sql" "$RUN_URL" >"$WORK/pgbench.out" 2>&1 &
		local pgbpid=$!
		cpupid=
		if [ -n "$PG_PID" ] && [ -n "$ROLE" ] && [ "$mid" -gt 0 ]; then
			(sleep 1 && exec "$BIN/loadgen" --idle "${mid}ms" --clk-tck "$CLK_TCK" --cpu "postgres=$PG_PID:: $ROLE " --format json) \
				>"$WORK/pgbcpu.json" 2>>"$LOGS/loadgen.log" &
			cpupid=$!
		fi
		if wait "$pgbpid"; then
			tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$WORK/pgbench.out")
			lat=$(sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' "$WORK/pgbench.out")
		else
			tps=0 lat=0
			log "pgbench $script at $c clients failed: $(tail -2 "$WORK/pgbench.out" | tr '\n' ' ')"
		fi
		cpu='{}' win=0
		if [ -n "$cpupid" ] && wait "$cpupid"; then
			cpu=$(jq -c '.cpu' "$WORK/pgbcpu.json")
			win=$(jq '.cpu_window_s' "$WORK/pgbcpu.json")
		fi
		# responses: the transactions of the CPU window, at the run's rate.
		printf '{"tags":{"kind":"pgbench","subject":"%s","clients":"%d","round":"%d"},"throughput":%s,"responses":%s,"latency":{"mean_ms":%s},"cpu":%s,"cpu_window_s":%s}\n' \
			"$script" "$c" "$round" "${tps:-0}" "$(jq -n "${tps:-0} * $win | floor")" "${lat:-0}" "$cpu" "$win" >>"$RESULTS"
		log "pgbench $script c=$c r=$round: ${tps:-?} tps, mean ${lat:-?} ms$(jq -r --argjson t "${tps:-0}" --argjson w "$win" \
			'if $t > 0 and $w > 0 and .postgres then ", postgres \(.postgres.seconds / $w / $t * 1e6 | floor) µs/tx" else "" end' <<<"$cpu")"
	done
}

# rotate ROUND OFFSET NAMES...: NAMES in a rotating order.
rotate() {
	local round=$1 off=$2
	shift 2
	local names=("$@") n=$# k
	for k in $(seq 0 $((n - 1))); do printf '%s ' "${names[$(((k + round + off) % n))]}"; done
}

# ---- 1. matrix ---------------------------------------------------------------------
if phase matrix; then
	MATRIX=$(in_sel direct nginx bareproxy bareproxy-keyed payments-tx payments-mw payments-tx-nobatch gw-memory gw-sqlite gw-postgres gw-redis \
		gw-sqlite-nobatch gw-postgres-nobatch gw-memory-base gw-sqlite-base gw-postgres-base caddy caddy-sqlite caddy-postgres express express-cluster2)
	log "phase matrix: $CONCURRENCY clients, $ROUNDS rounds, $DURATION after $WARMUP warm-up$(phase pgbench && echo "; pgbench ${PGBENCH_DURATION}s")"
	ci=0
	for c in $CONCURRENCY; do
		subjects=()
		for s in $MATRIX; do
			# Batching changes nothing at 1 client (a batch of one runs the single statement).
			[[ $s == *-nobatch && $c == 1 ]] && continue
			subjects+=("$s")
		done
		[ "$c" = 32 ] && want express-autocommit && subjects+=(express-autocommit)
		for round in $(seq "$ROUNDS"); do
			idle "matrix c=$c r=$round"
			for s in $(rotate "$round" "$ci" "${subjects[@]}"); do
				lg "$s" matrix "$c" "$round" -d "$DURATION" --warmup "$WARMUP" --users "$c" --auth-format 'Bearer 1%d'
			done
			# pgbench's clients are connections: 128 would pass max_connections, so 64.
			phase pgbench && pgb "$((c > 64 ? 64 : c))" "$round"
		done
		ci=$((ci + 1))
	done
fi

# ---- 2. body sizes -----------------------------------------------------------------
if phase bodies; then
	log "phase bodies: $BODIES-byte answers at $BODY_CLIENTS clients, $ROUNDS rounds"
	for pad in "${PADS[@]}"; do
		[ "$pad" = 0 ] && continue
		names=()
		for s in $BODY_SUBJECTS; do names+=("$(inst "$s" "$pad")"); done
		for round in $(seq "$ROUNDS"); do
			idle "bodies $pad r=$round"
			for i in $(rotate "$round" 0 "${names[@]}"); do
				lg "$i" bodies "$BODY_CLIENTS" "$round" -d "$DURATION" --warmup "$WARMUP" --users "$BODY_CLIENTS" --auth-format 'Bearer 2%d'
			done
		done
	done
fi

# ---- 3. replay vs first execution --------------------------------------------------
if phase replay; then
	log "phase replay: replay vs first execution"
	idx=0
	for c in 1 32; do
		idle "replay c=$c"
		for s in $(in_sel bareproxy-keyed payments-tx payments-mw gw-memory gw-sqlite gw-postgres gw-redis caddy-sqlite caddy-postgres express express-cluster2); do
			idx=$((idx + 1))
			lg "$s" first "$c" 1 -d 2s --warmup 500ms --users 1 --auth-format "Bearer 8${idx}%d"
			lg "$s" replay "$c" 1 -d 2s --warmup 500ms --keys shared --key "replay-$RUN-$s-$c" --users 1 --auth-format "Bearer 8${idx}%d"
		done
	done
fi

# ---- 4. duplicate storm ------------------------------------------------------------
# ---- paced: the same load on every subject ------------------------------------------
if phase paced; then
	PACED=$(in_sel direct bareproxy bareproxy-keyed caddy gw-memory gw-sqlite gw-postgres gw-memory-base gw-sqlite-base gw-postgres-base)
	log "phase paced: $PACED_RATE requests a second at $PACED_CLIENTS clients, $ROUNDS rounds, $DURATION after $WARMUP warm-up"
	for round in $(seq "$ROUNDS"); do
		idle "paced r=$round"
		for s in $(rotate "$round" 0 $PACED); do
			lg "$s" paced "$PACED_CLIENTS" "$round" -d "$DURATION" --warmup "$WARMUP" --rate "$PACED_RATE" \
				--users "$PACED_CLIENTS" --auth-format 'Bearer 3%d'
		done
	done
fi

# ---- pair: two subjects loaded at the same time ----------------------------------------
# lg_pair SUBJECT PARTNER ROUND: the two, each by its own load generator at PAIR_RATE, at
# the same time; each result holds its proxy's own CPU only (the upstream and PostgreSQL
# serve both) and names the pair (tag pair: SUBJECT:PARTNER) and the other (partner).
lg_pair() {
	local s=$1 partner=$2 round=$3 la pids=() i
	la=$(loadavg)
	for i in "$s" "$partner"; do
		local other=$partner
		[ "$i" = "$partner" ] && other=$s
		"$BIN/loadgen" --url "http://127.0.0.1:${PORT[$i]}/payments" -c "$PAIR_CLIENTS" --rate "$PAIR_RATE" \
			-H 'Content-Type: application/json' --body "$BODY" --format json --clk-tck "$CLK_TCK" ${CPUARGS[$i]%% --cpu app=*} \
			--users "$PAIR_CLIENTS" --auth-format 'Bearer 4%d' -d "$DURATION" --warmup "$WARMUP" \
			--tag kind=pair --tag subject="$i" --tag partner="$other" --tag pair="$s:$partner" --tag body=0 \
			--tag clients="$PAIR_CLIENTS" --tag round="$round" --tag loadavg="$la" \
			>"$WORK/pair-$i.json" 2>>"$LOGS/loadgen.log" &
		pids+=($!)
	done
	local failed=0
	for i in "${pids[@]}"; do wait "$i" || failed=1; done
	if [ "$failed" = 1 ]; then
		log "loadgen failed in the pair $s, $partner (round $round)"
		return 0
	fi
	for i in "$s" "$partner"; do
		cat "$WORK/pair-$i.json" >>"$RESULTS"
		jq -r '"pair \(.tags.pair) r=\(.tags.round): \(.tags.subject) \(.throughput|floor) req/s, p99 \(.latency.p99_ms) ms, errors \(.errors); CPU µs/req \(.cpu.proxy.us_per_request // 0 | floor) (load \(.tags.loadavg))"' "$WORK/pair-$i.json" >&2
	done
}

if phase pair; then
	log "phase pair: $PAIRED each two at the same time, $PAIR_RATE requests a second each at $PAIR_CLIENTS clients, $ROUNDS rounds, $DURATION after $WARMUP warm-up"
	for round in $(seq "$ROUNDS"); do
		for p in $(rotate "$round" 0 $PAIRED); do
			lg_pair "${p%%:*}" "${p#*:}" "$round"
		done
	done
fi

if phase storm; then
	log "phase storm: 1,000 concurrent requests, one key, per subject"
	idx=0
	for s in $(in_sel direct payments-tx payments-mw gw-memory gw-sqlite gw-postgres gw-redis express express-cluster2); do
		idx=$((idx + 1))
		user="9${idx}0" # one user per storm: its ledger rows are the storm's executions
		sleep 1
		lg "$s" storm 1000 1 -n 1000 --keys shared --key "storm-$RUN-$s" --users 1 --auth-format "Bearer 9${idx}%d" \
			--preconnect "http://127.0.0.1:${PORT[$s]}/payments"
		rows=$(psql "$PG_URL" -XAtc "SELECT count(*) FROM \"${SCHEMA[$s]}\".payments WHERE user_id = '$user'")
		printf '{"tags":{"kind":"storm-rows","subject":"%s"},"rows":%d}\n' "$s" "$rows" >>"$RESULTS"
		log "storm $s: $rows ledger row(s)"
	done
fi

# ---- 5. where the CPU goes ---------------------------------------------------------
if phase split; then
	SPLIT=$(in_sel gw-memory gw-sqlite gw-postgres gw-redis bareproxy-keyed bareproxy)
	SPLIT_CLIENTS=${SPLIT_CLIENTS:-32}
	log "phase split: perf record of $SPLIT at $SPLIT_CLIENTS clients, $ROUNDS rounds"
	declare -A SPLITFILES SPLITREQS
	# secs D: a Go duration of seconds or milliseconds (3s, 500ms) in seconds, for sleep.
	secs() { case $1 in *ms) awk "BEGIN { print ${1%ms} / 1000 }" ;; *s) printf '%s' "${1%s}" ;; *) printf '%s' "$1" ;; esac; }
	for round in $(seq "$ROUNDS"); do
		for s in $(rotate "$round" 0 $SPLIT); do
			pid=${CPUARGS[$s]#--cpu proxy=}
			pid=${pid%% *}
			mkdir -p "$OUT/split"
			data=$OUT/split/$s-$round.data
			# perf records the load's measured window: it starts once the warm-up is over.
			lg "$s" split "$SPLIT_CLIENTS" "$round" -d "$DURATION" --warmup "$WARMUP" --users "$SPLIT_CLIENTS" --auth-format 'Bearer 7%d' &
			lgpid=$!
			sleep "$(secs "$WARMUP")"
			perf record -q -F "${SPLIT_HZ:-1000}" -g -p "$pid" -o "$data" -- sleep "$(secs "$DURATION")" 2>>"$LOGS/perf.log" || log "perf record failed for $s"
			wait "$lgpid"
			perf script -i "$data" -F period,ip,sym >"$data.txt" 2>>"$LOGS/perf.log" && rm -f "$data"
			n=$(tail -1 "$RESULTS" | jq -r 'select(.tags.kind == "split") | .responses')
			SPLITFILES[$s]+=${SPLITFILES[$s]:+,}$data.txt
			SPLITREQS[$s]=$((${SPLITREQS[$s]:-0} + ${n:-0}))
		done
	done
	args=()
	for s in $SPLIT; do args+=("$s=${SPLITFILES[$s]}:${SPLITREQS[$s]}"); done
	"$BIN/perfsplit" --base bareproxy "${args[@]}" >"$OUT/split.txt" 2>>"$LOGS/perf.log" || log "perfsplit failed: $(tail -1 "$LOGS/perf.log")"
fi

echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg); run took $((($(date +%s) - STARTED) / 60)) min $((($(date +%s) - STARTED) % 60)) s" | tee -a "$OUT/env.txt" >&2
"$BIN/benchreport" "$RESULTS" >"$OUT/report.md"
"$BIN/benchreport" -summary "$RESULTS" >"$OUT/summary.md"
{
	echo
	cat "$OUT/env.txt"
	echo
	cat "$OUT/summary.md"
	if [ -s "$OUT/split.txt" ]; then
		echo
		echo "where the CPU of a new key goes, per request ($OUT/split.txt):"
		cat "$OUT/split.txt"
	fi
	echo
	echo "full report: $OUT/report.md (results: $RESULTS, logs: $LOGS)"
} >&2
exit 0
}
