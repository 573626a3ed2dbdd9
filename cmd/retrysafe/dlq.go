package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/redeliver/jetstream"
	"github.com/retrysafe/retrysafe/redeliver/rabbitmq"
)

// dlqHelp is the help of retrysafe dlq. It is built once, from the rabbitmq package's
// topology, so that the queues and buckets it names are the ones a consumer declares.
var dlqHelp = dlqHelpText()

func dlqHelpText() string {
	topo, err := rabbitmq.Config{Queue: "NAME"}.Topology()
	if err != nil {
		panic("retrysafe: the default RabbitMQ topology is invalid: " + err.Error())
	}
	buckets := make([]string, len(topo.Delays))
	for i, d := range topo.Delays {
		buckets[i] = shortDuration(d.Delay)
	}
	example := func(d time.Duration) string {
		return shortDuration(d) + " waits " + shortDuration(topo.Bucket(d).Delay)
	}
	return fmt.Sprintf(dlqHelpFormat, len(topo.Queues()), len(topo.Delays), strings.Join(buckets, " "),
		example(3*time.Second), example(4*time.Second), example(24*time.Hour))
}

// shortDuration formats d as time.Duration does, without the zero minutes and seconds
// of whole hours and minutes ("1m", not "1m0s").
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

const dlqHelpFormat = `usage: retrysafe dlq list   --broker URL --queue NAME [--limit N]
       retrysafe dlq show   --broker URL --queue NAME --id ID [--body]
       retrysafe dlq replay --broker URL --queue NAME (--id ID … | --yes)
       retrysafe dlq purge  --broker URL --queue NAME (--id ID … | --yes)

Inspect, replay and purge the dead letters of a redeliver work queue: the messages its
consumers gave up on. list and show leave them where they are (on RabbitMQ they are
taken and requeued in one go, see the rabbitmq package); replay republishes them to the
work queue, message id kept and attempt count reset, removing each from the DLQ once
the broker confirmed its copy; purge deletes them. show gives a dead letter's times by
name: first published (when its producer published it) and dead-lettered (when its
consumer moved it to the DLQ).

On RabbitMQ a consumer of work queue NAME declares, with the default delay buckets,
%d queues: NAME, NAME.dlq and %d delay queues NAME.delay.<ms>ms, one per bucket:
  %s
A retry waits in the bucket nearest its backoff delay on a logarithmic scale (between
buckets lo and hi: lo below √(lo·hi), else hi; the first bucket for shorter delays, the
last for longer ones): %s, %s, %s.
The consumer's rabbitmq.Config.Delays sets other buckets (ascending, whole
milliseconds); the queues then number len(Delays)+2.

flags:
  --broker URL   amqp://… or amqps://… (RabbitMQ: the DLQ is the queue NAME.dlq), or
                 nats://… or tls://… (JetStream: the DLQ stream of NAME, default names)
                 (also RETRYSAFE_BROKER)
  --queue NAME   the work queue (RabbitMQ) or subject (JetStream) (required)
  --id ID        show: the message id (required); replay, purge: a message id
                 (repeatable)
  --limit N      list: at most N dead letters (default 100; 0 for all)
  --body         show: print the message body after the headers
  --yes          replay, purge: all the dead letters, when no --id is given

Exit status: 0 on success, 1 when the DLQ or a dead letter does not exist (or the
broker failed), 2 for bad flags or a broker that cannot be reached.

examples:
  retrysafe dlq list --broker amqp://guest:guest@localhost:5672/ --queue emitter.access
  retrysafe dlq show --broker nats://127.0.0.1:4222 --queue emitter.access --id 42 --body
  retrysafe dlq replay --queue emitter.access --id 42 --id 43
  retrysafe dlq purge --queue emitter.access --yes
`

// dlqIDs is the repeatable --id flag.
type dlqIDs []string

func (l *dlqIDs) String() string     { return strings.Join(*l, ", ") }
func (l *dlqIDs) Set(v string) error { *l = append(*l, v); return nil }

type dlqFlags struct {
	broker, queue string
	ids           dlqIDs
	limit         int
	body, yes     bool
}

// dlqConnectTimeout bounds connecting to the broker (the backends otherwise retry for
// up to 30s).
const dlqConnectTimeout = 10 * time.Second

func runDLQ(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	action, status, ok := readAction(args, "dlq", []string{"list", "show", "replay", "purge"}, dlqHelp, stdout, stderr)
	if !ok {
		return status
	}
	cmd := "retrysafe dlq " + action
	var f dlqFlags
	fs := newFlagSet(cmd)
	fs.StringVar(&f.broker, "broker", "", "")
	fs.StringVar(&f.queue, "queue", "", "")
	switch action {
	case "list":
		fs.IntVar(&f.limit, "limit", 100, "")
	case "show":
		fs.Var(&f.ids, "id", "")
		fs.BoolVar(&f.body, "body", false, "")
	case "replay", "purge":
		fs.Var(&f.ids, "id", "")
		fs.BoolVar(&f.yes, "yes", false, "")
	}
	if ok, status := parse(fs, args[1:], dlqHelp, []string{"broker"}, false, stdout, stderr); !ok {
		return status
	}
	switch {
	case f.broker == "":
		return fail(stderr, cmd, errors.New("--broker is required (amqp://… or nats://…; or RETRYSAFE_BROKER)"), exitUsage)
	case f.queue == "":
		return fail(stderr, cmd, errors.New("--queue is required"), exitUsage)
	case action == "show" && len(f.ids) != 1:
		return fail(stderr, cmd, errors.New("--id is required, once"), exitUsage)
	case slices.Contains(f.ids, ""):
		return fail(stderr, cmd, errors.New("--id must not be empty"), exitUsage)
	case (action == "replay" || action == "purge") && len(f.ids) == 0 && !f.yes:
		return fail(stderr, cmd, fmt.Errorf("name the dead letters with --id, or add --yes to %s all of them", action), exitUsage)
	case (action == "replay" || action == "purge") && len(f.ids) > 0 && f.yes:
		return fail(stderr, cmd, errors.New("--id and --yes exclude each other: --yes means all"), exitUsage)
	case f.limit < 0:
		return fail(stderr, cmd, errors.New("--limit must not be negative"), exitUsage)
	}
	// Every message below goes through scrub, so that no broker password is printed.
	scrub := func(err error) error { return errors.New(redactBroker(err.Error(), f.broker)) }
	openCtx, cancel := context.WithTimeout(ctx, dlqConnectTimeout)
	dl, err := openDLQ(openCtx, f.broker, f.queue)
	cancel()
	switch {
	case errors.Is(err, redeliver.ErrNotFound):
		return fail(stderr, cmd, fmt.Errorf("no dead-letter queue for queue %q on %s (has a consumer of it run yet?)", f.queue, redactBroker(f.broker, f.broker)), exitFail)
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		return fail(stderr, cmd, fmt.Errorf("broker %s unreachable: no connection within %v", redactBroker(f.broker, f.broker), dlqConnectTimeout), exitUsage)
	case err != nil:
		return fail(stderr, cmd, scrub(err), exitUsage)
	}
	defer dl.Close()
	switch action {
	case "list":
		err = listDLQ(ctx, dl, f, stdout)
	case "show":
		err = showDLQ(ctx, dl, f, stdout)
	case "replay":
		err = replayDLQ(ctx, dl, f, stdout)
	case "purge":
		err = purgeDLQ(ctx, dl, f, stdout)
	}
	if err != nil {
		return fail(stderr, cmd, scrub(err), exitFail)
	}
	return exitOK
}

// openDLQ opens the dead letters of queue on the broker: RabbitMQ for amqp:// and
// amqps://, JetStream for nats:// and tls://.
func openDLQ(ctx context.Context, broker, queue string) (redeliver.DeadLetters, error) {
	scheme, _, ok := strings.Cut(broker, "://")
	if !ok {
		return nil, errors.New("--broker has no scheme: want amqp://, amqps://, nats:// or tls://")
	}
	switch strings.ToLower(scheme) {
	case "amqp", "amqps":
		return rabbitmq.OpenDeadLetters(ctx, rabbitmq.DeadLettersConfig{URL: broker, Queue: queue})
	case "nats", "tls":
		return jetstream.NewDeadLetters(ctx, jetstream.Config{URL: broker, Queue: queue})
	}
	return nil, fmt.Errorf("unknown broker scheme %q: want amqp://, amqps://, nats:// or tls://", scheme)
}

// redactBroker returns s with the password of every URL in broker (NATS accepts a
// comma-separated list) replaced by "xxxxx".
func redactBroker(s, broker string) string {
	for _, raw := range strings.Split(broker, ",") {
		raw = strings.TrimSpace(raw)
		u, err := url.Parse(raw)
		if err != nil {
			// Unparsable: hide whatever sits between "://" and the last "@".
			if _, rest, ok := strings.Cut(raw, "://"); ok {
				if i := strings.LastIndex(rest, "@"); i > 0 {
					s = strings.ReplaceAll(s, rest[:i], "xxxxx")
				}
			}
			continue
		}
		if u.User == nil {
			continue
		}
		s = strings.ReplaceAll(s, raw, u.Redacted())
		if p, set := u.User.Password(); set && p != "" {
			s = strings.ReplaceAll(s, u.User.String()+"@", u.User.Username()+":xxxxx@")
			s = strings.ReplaceAll(s, ":"+p+"@", ":xxxxx@")
		} else if u.User.Username() != "" {
			// A token alone (nats://TOKEN@host) is a secret too.
			s = strings.ReplaceAll(s, u.User.String()+"@", "xxxxx@")
		}
	}
	return s
}

func listDLQ(ctx context.Context, dl redeliver.DeadLetters, f dlqFlags, out io.Writer) error {
	list, err := dl.List(ctx, f.limit)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tATTEMPTS\tREASON\tLAST ERROR\tFIRST FAILURE\tLAST FAILURE\tSOURCE QUEUE")
	for _, d := range list {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", dash(oneLine(d.ID)), d.Info.Attempts,
			dash(string(d.Info.Reason)), dash(shorten(oneLine(d.Info.Err), 60)),
			stamp(d.Info.FirstFailure), stamp(d.Info.LastFailure), dash(d.Info.Queue))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if f.limit > 0 && len(list) == f.limit {
		fmt.Fprintf(out, "(%d dead letters; stopped at --limit %d)\n", len(list), f.limit)
	} else {
		fmt.Fprintf(out, "(%d dead letters)\n", len(list))
	}
	return nil
}

func showDLQ(ctx context.Context, dl redeliver.DeadLetters, f dlqFlags, out io.Writer) error {
	id := f.ids[0]
	d, err := dl.Get(ctx, id)
	if errors.Is(err, redeliver.ErrNotFound) {
		return fmt.Errorf("no dead letter with id %q in the DLQ of %q", id, f.queue)
	}
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "id:\t%s\n", d.ID)
	fmt.Fprintf(tw, "source queue:\t%s\n", dash(d.Info.Queue))
	fmt.Fprintf(tw, "reason:\t%s\n", dash(string(d.Info.Reason)))
	fmt.Fprintf(tw, "error class:\t%s\n", dash(string(d.Info.Class)))
	fmt.Fprintf(tw, "attempts:\t%d\n", d.Info.Attempts)
	fmt.Fprintf(tw, "first failure:\t%s\n", stamp(d.Info.FirstFailure))
	fmt.Fprintf(tw, "last failure:\t%s\n", stamp(d.Info.LastFailure))
	fmt.Fprintf(tw, "last error:\t%s\n", dash(oneLine(d.Info.Err)))
	fmt.Fprintf(tw, "first published:\t%s\n", stamp(d.Published))
	fmt.Fprintf(tw, "dead-lettered:\t%s\n", stamp(d.DeadLettered))
	if d.ContentType != "" {
		fmt.Fprintf(tw, "content type:\t%s\n", d.ContentType)
	}
	for _, name := range slices.Sorted(maps.Keys(d.Header)) {
		fmt.Fprintf(tw, "header:\t%s: %s\n", name, oneLine(d.Header[name]))
	}
	fmt.Fprintf(tw, "body:\t%d bytes\n", len(d.Body))
	if err := tw.Flush(); err != nil {
		return err
	}
	if f.body && len(d.Body) > 0 {
		fmt.Fprintln(out)
		_, _ = out.Write(d.Body)
		if !strings.HasSuffix(string(d.Body), "\n") {
			fmt.Fprintln(out)
		}
	}
	return nil
}

func replayDLQ(ctx context.Context, dl redeliver.DeadLetters, f dlqFlags, out io.Writer) error {
	n, err := dl.Replay(ctx, f.ids...)
	if n > 0 || err == nil {
		fmt.Fprintf(out, "replayed %s to %s\n", deadLetters(n), f.queue)
	}
	if err != nil {
		return err
	}
	return missing(n, f.ids, "replayed")
}

func purgeDLQ(ctx context.Context, dl redeliver.DeadLetters, f dlqFlags, out io.Writer) error {
	n, err := dl.Purge(ctx, f.ids...)
	if n > 0 || err == nil {
		fmt.Fprintf(out, "purged %s from the DLQ of %s\n", deadLetters(n), f.queue)
	}
	if err != nil {
		return err
	}
	return missing(n, f.ids, "purged")
}

// missing returns an error when fewer than the distinct ids asked for were found.
func missing(n int, ids []string, done string) error {
	want := len(slices.Compact(slices.Sorted(slices.Values(ids))))
	if want > 0 && n < want {
		return fmt.Errorf("%d of the %d ids were not in the DLQ (only %d %s)", want-n, want, n, done)
	}
	return nil
}

func deadLetters(n int) string {
	if n == 1 {
		return "1 dead letter"
	}
	return strconv.Itoa(n) + " dead letters"
}

// shorten cuts s to at most n runes, marking the cut with "…".
func shorten(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
