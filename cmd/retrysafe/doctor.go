package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
	"github.com/retrysafe/retrysafe/idempotency/pgstore"
	"github.com/retrysafe/retrysafe/idempotency/redisstore"
	"github.com/retrysafe/retrysafe/idempotency/sqlitestore"
	"github.com/retrysafe/retrysafe/redeliver/jetstream"
	"github.com/retrysafe/retrysafe/redeliver/rabbitmq"
	"github.com/retrysafe/retrysafe/storedsn"
)

const doctorIntro = `usage: retrysafe doctor [--store DSN] [--allow-store-risk CHECK,…]
       retrysafe doctor [--store DSN] [--amqp URL] [--nats URL] --queue NAME…

Says what the store's setup guarantees for the promise that a keyed request runs once,
and what the brokers' setups of the named queues keep of their messages when a node
crashes.
It opens the store (no schema is applied), reads the backend's settings — persistence,
replication, eviction, the file system — without writing anything, and prints one
line per finding, then a summary:

  LEVEL   CHECK   SETTING   — what can happen

  OK      the setting keeps the promise
  WARN    the setting narrows it, as the line says; the gateway starts, and logs the
          line as a warning at every start
  REFUSE  the setting breaks it; the gateway refuses to start (exit 2) unless
          --allow-store-risk names the check, which makes it a warning

What is read:
  PostgreSQL  whether the server is a standby; fsync; synchronous_commit (as the
              store's role has it); synchronous_standby_names and each standby's
              sync_state in pg_stat_replication — a role without pg_read_all_stats or
              pg_monitor cannot see that, and is told which role to grant; synchronous
              standbys named but not connected
  Redis       maxmemory-policy (anything but noeviction is refused); appendonly,
              appendfsync and save; the role (a replica is refused), the replicas and
              the store's wait=N, min-replicas-to-write; Sentinel, Cluster or Ring.
              Where CONFIG is disabled (managed Redis) INFO stands in, and what it cannot
              tell is said
  SQLite      synchronous and journal_mode; the file's file system: a network one (NFS,
              SMB, 9p…) is refused, FUSE and tmpfs are warned about
  memory      nothing survives the process
  RabbitMQ    each --queue: the work queue present (missing: refused); its type
              (classic: a warning saying what a node crash loses — acknowledgements,
              retry copies, the delivery count; quorum: OK); its DLQ and delay (retry)
              queues present. The type is learnt by redeclaring the existing queue as a
              consumer does, which changes nothing. The cluster's node count is not
              readable over AMQP and is said to be unchecked
  JetStream   each --queue (the subject): the work stream present (missing: refused);
              the replicas of the work stream, the DLQ stream and the failure bucket
              against the cluster's size the connection knows (one replica: a warning
              saying what a crash or a lost disk loses; three: OK); memory storage
              (warned); the consumer's MaxDeliver against 5 attempts and 20
              deliveries (the default policy's), and its AckWait

With --amqp or --nats the store is checked only when --store (or RETRYSAFE_STORE) is
given. Each --queue is checked on each broker given.

flags (each can also be set from the environment: RETRYSAFE_STORE, RETRYSAFE_ALLOW_STORE_RISK,
RETRYSAFE_AMQP, RETRYSAFE_NATS, RETRYSAFE_QUEUE):
`

const doctorOutro = `
exit status: 0 every finding is OK; 1 a warning and no refusal; 2 a refusal (one not
allowed), bad flags, or a store or broker that cannot be reached or read (one line on
stderr).

examples:
  retrysafe doctor --store 'postgres://retrysafe@db:5432/app?schema=retrysafe'
  retrysafe doctor --store 'redis://cache:6379/0?wait=1'
  retrysafe doctor --store sqlite:/var/lib/retrysafe/keys.db --allow-store-risk sqlite.filesystem
  retrysafe doctor --amqp amqp://app:secret@rabbit:5672/ --queue orders --queue emails
  retrysafe doctor --store postgres://app@db/app --nats nats://n1:4222,nats://n2:4222 --queue orders.created
`

// inspectTimeout bounds the reading of a store's settings.
const inspectTimeout = 10 * time.Second

// storeChecks are the checks the stores report (idempotency.Finding.Check), the names
// --allow-store-risk takes.
func storeChecks() []string {
	return []string{
		pgstore.CheckRecovery, pgstore.CheckFsync, pgstore.CheckSynchronousCommit, pgstore.CheckStandby, pgstore.CheckPrivileges,
		redisstore.CheckEviction, redisstore.CheckPersistence, redisstore.CheckRole, redisstore.CheckReplication,
		redisstore.CheckMinReplicas, redisstore.CheckTopology, redisstore.CheckConfig,
		sqlitestore.CheckSynchronous, sqlitestore.CheckJournalMode, sqlitestore.CheckFilesystem,
		memstore.CheckPersistence,
	}
}

// allowedRisks is the repeatable --allow-store-risk flag: checks, comma-separated,
// whose refusal becomes a warning.
type allowedRisks []string

func (a *allowedRisks) String() string { return strings.Join(*a, ",") }

func (a *allowedRisks) Set(v string) error {
	known := storeChecks()
	for _, c := range splitList(v) {
		if !slices.Contains(known, c) {
			return fmt.Errorf("unknown check %q (retrysafe doctor prints the checks; they are %s)", c, strings.Join(known, ", "))
		}
		if !slices.Contains(*a, c) {
			*a = append(*a, c)
		}
	}
	return nil
}

func (a allowedRisks) allows(check string) bool { return slices.Contains(a, check) }

// allowRiskDoc is --allow-store-risk's entry in the gateway's and doctor's --help.
func allowRiskDoc() flagDoc {
	return flagDoc{name: "allow-store-risk", arg: "CHECK,…",
		help: "checks whose refusal the operator accepts, comma-separated or repeated (" + redisstore.CheckEviction + ", " +
			sqlitestore.CheckFilesystem + ", " + pgstore.CheckRecovery + "…: the CHECK column of retrysafe doctor); each such finding becomes a warning, logged at every start",
		def: "-"}
}

// judged is a store's finding as the command takes it: a refusal that --allow-store-risk
// allows is a warning.
type judged struct {
	idempotency.Finding
	allowed bool // a refusal, allowed: reported as a warning
}

func (j judged) level() idempotency.FindingLevel {
	if j.allowed {
		return idempotency.FindingWarn
	}
	return j.Level
}

// inspectStore reads what the store's setup means (nil for a store that cannot say)
// and applies allowed to its refusals.
func inspectStore(ctx context.Context, s idempotency.Store, allowed allowedRisks) ([]judged, error) {
	in, ok := s.(idempotency.Inspector)
	if !ok {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, inspectTimeout)
	defer cancel()
	found, err := in.Inspect(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the store's settings: %w", err)
	}
	out := make([]judged, len(found))
	for i, f := range found {
		out[i] = judged{Finding: f, allowed: f.Level == idempotency.FindingRefuse && allowed.allows(f.Check)}
	}
	return out, nil
}

// tally counts the findings by the level the command gives them.
func tally(found []judged) (ok, warn, refuse int) {
	for _, f := range found {
		switch f.level() {
		case idempotency.FindingRefuse:
			refuse++
		case idempotency.FindingWarn:
			warn++
		default:
			ok++
		}
	}
	return ok, warn, refuse
}

// detail is a finding's detail, with the allowance of a refusal said.
func (j judged) detail() string {
	if j.allowed {
		return j.Detail + " (a refusal allowed by --allow-store-risk " + j.Check + ")"
	}
	return j.Detail
}

// doctorFlags are retrysafe doctor's flags.
type doctorFlags struct {
	dsn     string
	allowed allowedRisks
	amqp    string
	nats    string
	queues  queueList
}

// queueList is the repeatable --queue flag (a comma-separated list too, for
// RETRYSAFE_QUEUE).
type queueList []string

func (q *queueList) String() string { return strings.Join(*q, ",") }

func (q *queueList) Set(v string) error {
	for _, n := range splitList(v) {
		if !slices.Contains(*q, n) {
			*q = append(*q, n)
		}
	}
	return nil
}

// newDoctorFlags defines retrysafe doctor's flags and returns them with their
// documentation, from which --help is written.
func newDoctorFlags() (*flag.FlagSet, *doctorFlags, []flagDoc) {
	fs := newFlagSet("retrysafe doctor")
	f := &doctorFlags{}
	fs.StringVar(&f.dsn, "store", storedsn.Default, "")
	fs.Var(&f.allowed, "allow-store-risk", "")
	fs.StringVar(&f.amqp, "amqp", "", "")
	fs.StringVar(&f.nats, "nats", "", "")
	fs.Var(&f.queues, "queue", "")
	docs := []flagDoc{
		{name: "store", arg: "DSN", help: "sqlite:PATH, postgres://…, redis://…, memory: — as the gateway's --store (retrysafe gateway --help); an SQLite file that does not exist is created. With --amqp or --nats, checked only when given"},
		allowRiskDoc(),
		{name: "amqp", arg: "URL", help: "a RabbitMQ broker (amqp:// or amqps://) whose --queue topologies to check", def: "-"},
		{name: "nats", arg: "URL", help: "a NATS server or cluster (nats://…, comma-separated for several) whose --queue JetStream topologies to check", def: "-"},
		{name: "queue", arg: "NAME", help: "a work queue (RabbitMQ: the queue; JetStream: the subject), as the consumers' Config.Queue; repeated or comma-separated", def: "-"},
	}
	return fs, f, docs
}

// doctorHelp is retrysafe doctor --help.
func doctorHelp() string {
	fs, _, docs := newDoctorFlags()
	return doctorIntro + flagHelp(fs, docs) + doctorOutro
}

// brokerCheck is one queue to inspect on one broker.
type brokerCheck struct {
	title   string // "rabbitmq orders at amqp://…"
	inspect func(context.Context) ([]idempotency.Finding, error)
}

// brokerChecks returns the queues to inspect on the brokers the flags name.
func (f *doctorFlags) brokerChecks(logger *slog.Logger) []brokerCheck {
	var out []brokerCheck
	for _, q := range f.queues {
		if f.amqp != "" {
			cfg := rabbitmq.Config{URL: f.amqp, Queue: q, Logger: logger}
			out = append(out, brokerCheck{title: "rabbitmq queue " + q + " at " + redactBroker(f.amqp, f.amqp),
				inspect: func(ctx context.Context) ([]idempotency.Finding, error) { return rabbitmq.Inspect(ctx, cfg) }})
		}
		if f.nats != "" {
			cfg := jetstream.Config{URL: f.nats, Queue: q, Logger: logger}
			out = append(out, brokerCheck{title: "jetstream queue " + q + " at " + redactBroker(f.nats, f.nats),
				inspect: func(ctx context.Context) ([]idempotency.Finding, error) { return jetstream.Inspect(ctx, cfg) }})
		}
	}
	return out
}

func runDoctor(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const cmd = "retrysafe doctor"
	fs, f, _ := newDoctorFlags()
	if ok, status := parse(fs, args, doctorHelp(), nil, false, stdout, stderr); !ok {
		return status
	}
	brokers := f.amqp != "" || f.nats != ""
	switch {
	case brokers && len(f.queues) == 0:
		return fail(stderr, cmd, errors.New("--amqp and --nats need --queue NAME: the queues to check (see retrysafe doctor --help)"), exitUsage)
	case !brokers && len(f.queues) > 0:
		return fail(stderr, cmd, errors.New("--queue needs --amqp URL or --nats URL: the broker to check it on (see retrysafe doctor --help)"), exitUsage)
	}
	checkStore := !brokers
	fs.Visit(func(fl *flag.Flag) { checkStore = checkStore || fl.Name == "store" })
	// The doctor reports an evicting Redis instead of refusing to open it.
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var storeRefused bool
	var all []judged
	if checkStore {
		store, err := storedsn.OpenWith(ctx, f.dsn, storedsn.Options{Logger: logger, Eviction: redisstore.EvictionIgnore})
		if err != nil {
			return fail(stderr, cmd, err, exitUsage)
		}
		defer store.Close()
		found, err := inspectStore(ctx, store.Store, f.allowed)
		if err != nil {
			return fail(stderr, cmd, fmt.Errorf("%s: %w", store.Name, err), exitUsage)
		}
		fmt.Fprintf(stdout, "store %s\n", store.Name)
		writeFindings(stdout, found)
		_, _, refuse := tally(found)
		storeRefused = refuse > 0
		all = append(all, found...)
	}
	for _, b := range f.brokerChecks(logger) {
		ictx, cancel := context.WithTimeout(ctx, inspectTimeout)
		found, err := b.inspect(ictx)
		cancel()
		if err != nil {
			return fail(stderr, cmd, errors.New(redactBroker(redactBroker(fmt.Sprintf("%s: %v", b.title, err), f.amqp), f.nats)), exitUsage)
		}
		fmt.Fprintln(stdout, b.title)
		js := make([]judged, len(found))
		for i, fd := range found {
			js[i] = judged{Finding: fd}
		}
		writeFindings(stdout, js)
		all = append(all, js...)
	}
	ok, warn, refuse := tally(all)
	counts := fmt.Sprintf("%s, %s, %d ok", plural(refuse, "refusal"), plural(warn, "warning"), ok)
	var promise []string
	if checkStore {
		promise = append(promise, "a keyed request runs once")
	}
	if brokers {
		promise = append(promise, "the queues keep their messages, acknowledgements and counts through a broker node's crash")
	}
	switch {
	case refuse > 0:
		var why []string
		if storeRefused {
			why = append(why, "the gateway refuses to start on this store (allow a check with --allow-store-risk CHECK)")
		}
		if brokerRefused(all) {
			why = append(why, "a queue cannot be consumed as it stands (the REFUSE lines say why)")
		}
		fmt.Fprintf(stdout, "%s: %s; exit 2\n", counts, strings.Join(why, "; "))
		return exitUsage
	case warn > 0:
		fmt.Fprintf(stdout, "%s: %s, except as the warnings say; exit 1\n", counts, strings.Join(promise, ", and "))
		return exitFail
	}
	fmt.Fprintf(stdout, "%s: the setup keeps the promise that %s; exit 0\n", counts, strings.Join(promise, ", and that "))
	return exitOK
}

// brokerRefused reports whether a refusal among found is a broker's (a check named
// rabbitmq.… or jetstream.…).
func brokerRefused(found []judged) bool {
	for _, f := range found {
		if f.level() == idempotency.FindingRefuse && (strings.HasPrefix(f.Check, "rabbitmq.") || strings.HasPrefix(f.Check, "jetstream.")) {
			return true
		}
	}
	return false
}

// writeFindings writes one line per finding: LEVEL CHECK SETTING — DETAIL, the first
// three columns aligned (a setting longer than the column pushes its detail right).
func writeFindings(w io.Writer, found []judged) {
	const maxSetting = 44
	checkW, settingW := 0, 0
	for _, f := range found {
		checkW = max(checkW, utf8.RuneCountInString(f.Check))
		settingW = max(settingW, min(utf8.RuneCountInString(f.Setting), maxSetting))
	}
	pad := func(s string, n int) string { return s + strings.Repeat(" ", max(0, n-utf8.RuneCountInString(s))) }
	for _, f := range found {
		fmt.Fprintf(w, "%s  %s  %s  — %s\n", pad(strings.ToUpper(string(f.level())), len("REFUSE")),
			pad(f.Check, checkW), pad(f.Setting, settingW), f.detail())
	}
}

// checkStoreSetup runs the store's checks as the gateway starts: each warning (and each
// refusal allowed) is a WARN line of the log with its check, setting and detail; OK
// findings are debug lines. Refusals are written to stderr, one line each, and it
// returns false: the gateway then exits with exitUsage. logged are the checks already
// logged as warnings while the store was opened, not logged again.
func checkStoreSetup(ctx context.Context, cmd string, store *storedsn.Opened, allowed allowedRisks, logger *slog.Logger,
	stderr io.Writer, logged ...string,
) bool {
	found, err := inspectStore(ctx, store.Store, allowed)
	if err != nil {
		fail(stderr, cmd, fmt.Errorf("%s: %w", store.Name, err), exitUsage)
		return false
	}
	var refused []judged
	for _, f := range found {
		attrs := []any{"store", store.Name, "check", f.Check, "setting", f.Setting, "detail", f.detail()}
		switch f.level() {
		case idempotency.FindingRefuse:
			refused = append(refused, f)
		case idempotency.FindingWarn:
			if f.allowed && slices.Contains(logged, f.Check) {
				continue
			}
			logger.WarnContext(ctx, "store setting narrows the promise that a keyed request runs once", attrs...)
		default:
			logger.DebugContext(ctx, "store setting", attrs...)
		}
	}
	for _, f := range refused {
		fail(stderr, cmd, fmt.Errorf("store refused: %s %s: %s (retrysafe doctor --store … says more; to accept it, --allow-store-risk %s)",
			f.Check, f.Setting, f.Detail, f.Check), exitUsage)
	}
	return len(refused) == 0
}
