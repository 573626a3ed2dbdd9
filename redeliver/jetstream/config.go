package jetstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	js "github.com/nats-io/nats.go/jetstream"

	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/retry"
)

// ErrConfig is returned (wrapped) for a Config that cannot work: a missing or invalid
// queue name, names that are not valid JetStream names.
var ErrConfig = errors.New("jetstream: invalid config")

// Config names a work queue on a NATS server and says how to consume it. The zero value
// of every field but Queue means the default documented on it. The same Config serves
// NewSource and NewDeadLetters.
type Config struct {
	// Queue is the work queue: the subject messages are published to (say
	// "emitter.access"), from which the other names derive. Required; a literal subject
	// (no wildcards, no white space, no empty tokens).
	Queue string

	// URL is the NATS server to connect to. Default nats://127.0.0.1:4222. Ignored when
	// Conn is set.
	URL string
	// Conn, when set, is the connection to use instead of dialling URL. It is left open
	// by Close. A connection dialled from URL reconnects forever and is closed by Close.
	Conn *nats.Conn

	// Stream is the work stream (work-queue retention, so an acknowledged or terminated
	// message is removed). Default: Queue with every '.' and other character a stream
	// name cannot hold replaced by '_' ("emitter_access").
	Stream string
	// Consumer is the durable pull consumer's name. Default "redeliver". Every Source
	// of one queue shares it, so they split the messages among themselves.
	Consumer string
	// DLQSubject is the subject dead letters are published to. Default Queue + ".dlq".
	DLQSubject string
	// DLQStream is the dead-letter stream (limits retention: kept until replayed or
	// purged). Default Stream + "_dlq".
	DLQStream string
	// FailureBucket is the key-value bucket in which the Sources record the first
	// failure of each message they retry, keyed by its work stream sequence, for
	// Message.FirstFailure: a retry (NakWithDelay) redelivers the stored message
	// unchanged, so the time cannot travel in a header as it does on RabbitMQ. Default
	// Stream + "_failures", with every character a bucket name cannot hold (anything
	// but letters, digits, '_' and '-') replaced by '_'.
	FailureBucket string
	// FailureTTL is how long the bucket keeps a record. A Source deletes a message's
	// record once it acknowledges or dead-letters the message, so the TTL only bounds
	// the records whose deletion was lost (a crash in between). It must exceed the
	// longest time from a message's first failure to its last attempt: a record that
	// expires earlier leaves the later deliveries without a FirstFailure. Default 24h.
	FailureTTL time.Duration

	// Policy is the Consumer's redeliver.Policy. Only MaxDeliveries (for the MaxDeliver
	// default), MaxAttempts (its default's base) and Header (the count header a replay
	// resets) are read. Default: the zero Policy's defaults (5 attempts, 20 deliveries,
	// "x-retry-count").
	Policy redeliver.Policy

	// AckWait is how long the server waits for an outcome before it redelivers a
	// message (a crashed consumer's messages come back after it). The Source sends
	// InProgress every AckWait/3 while a handler runs (Heartbeater), so a slow handler
	// keeps its message. Default 30s; at least 100ms.
	AckWait time.Duration
	// MaxDeliver is the consumer's MaxDeliver: the server's backstop, which stops
	// redelivering a message after that many deliveries even if no consumer ever settles
	// it. A message that reaches it is moved to the DLQ by the Source (see the package
	// documentation, "Orphans"). Default Policy.MaxDeliveries + 2: one delivery for the
	// Consumer to dead-letter a message delivered more often than the policy allows (a
	// process that crashes on it, with ReasonMaxDeliver), one spare. A delivery is not
	// an attempt (the failure bucket counts those), so it must stay well above
	// MaxAttempts: failovers and restarts hand back prefetched messages, each
	// redelivery counted. Negative: no limit.
	MaxDeliver int
	// MaxAckPending is the most messages delivered and not yet settled, messages waiting
	// for a delayed redelivery included. Default 1000 (the server's default).
	MaxAckPending int
	// Prefetch is how many messages the Source pulls ahead of Receive. A prefetched
	// message's AckWait is already running, so keep Prefetch × handler time well under
	// AckWait. Default 16.
	Prefetch int
	// Replicas is the replica count of the work stream (and so of the consumer), the
	// DLQ stream and the failure bucket. Default: 3 when the server is part of a
	// cluster of at least three servers, else 1, and then NewSource and Declare log a
	// WARN saying what one replica loses on a node crash. The cluster's size is what the
	// connection knows of it: the servers it was given and those the cluster announced
	// (a cluster whose servers do not advertise themselves, no_advertise, and a URL
	// naming one of them look like a single server: set Replicas). A stream that exists
	// with another count is updated to it (the server scales it).
	Replicas int
	// MemoryStorage keeps both streams in memory instead of on disk (tests, benchmarks).
	// Default false: file storage.
	MemoryStorage bool
	// Duplicates is the work stream's deduplication window: a publish whose Nats-Msg-Id
	// (Message.ID, through Publisher) the stream stored within it is dropped, and
	// Publisher.Publish returns redeliver.ErrDuplicate. Declare and NewSource set it on
	// the stream, an existing one included. Default 2m (the server's default).
	Duplicates time.Duration
	// DLQDuplicates is the DLQ stream's deduplication window: a message dead-lettered
	// again within it (the Term after a dead-lettering was lost and the message came back)
	// is stored once. Default 1h.
	DLQDuplicates time.Duration
	// SweepInterval is how often the Source looks for orphans: messages the server no
	// longer delivers that no Source settled (they reached MaxDeliver while no Source
	// heard the server's advisory, or a crash of the stream's server lost their removal;
	// see Source.Sweep). Default 1m; negative: only when the Source starts. The advisory
	// itself is always followed.
	SweepInterval time.Duration
	// Logger receives the backend's logs. Default slog.Default().
	Logger *slog.Logger
	// Clock is the time source of received times and of the failure times of rescued
	// orphans. Nil means time.Now.
	Clock func() time.Time
}

// Defaults of Config.
const (
	DefaultConsumer      = "redeliver"
	DefaultAckWait       = 30 * time.Second
	DefaultMaxAckPending = 1000
	DefaultPrefetch      = 16
	DefaultDuplicates    = 2 * time.Minute
	DefaultDLQDuplicates = time.Hour
	DefaultFailureTTL    = 24 * time.Hour
	DefaultSweepInterval = time.Minute
	minAckWait           = 100 * time.Millisecond
)

// withDefaults checks c and fills its zero fields.
func (c Config) withDefaults() (Config, error) {
	if err := checkSubject(c.Queue); err != nil {
		return c, fmt.Errorf("%w: Queue: %w", ErrConfig, err)
	}
	if c.URL == "" {
		c.URL = nats.DefaultURL
	}
	if c.Stream == "" {
		c.Stream = streamName(c.Queue)
	}
	if c.Consumer == "" {
		c.Consumer = DefaultConsumer
	}
	if c.DLQSubject == "" {
		c.DLQSubject = c.Queue + ".dlq"
	}
	if c.DLQStream == "" {
		c.DLQStream = c.Stream + "_dlq"
	}
	if c.FailureBucket == "" {
		c.FailureBucket = bucketName(c.Stream + "_failures")
	}
	if err := checkBucket(c.FailureBucket); err != nil {
		return c, fmt.Errorf("%w: FailureBucket: %w", ErrConfig, err)
	}
	for _, n := range []struct{ field, name string }{
		{"Stream", c.Stream}, {"Consumer", c.Consumer}, {"DLQStream", c.DLQStream},
	} {
		if err := checkName(n.name); err != nil {
			return c, fmt.Errorf("%w: %s: %w", ErrConfig, n.field, err)
		}
	}
	if err := checkSubject(c.DLQSubject); err != nil {
		return c, fmt.Errorf("%w: DLQSubject: %w", ErrConfig, err)
	}
	if c.DLQSubject == c.Queue || c.Stream == c.DLQStream {
		return c, fmt.Errorf("%w: the DLQ must differ from the work queue", ErrConfig)
	}
	c.Policy = c.Policy.WithDefaults()
	if c.AckWait == 0 {
		c.AckWait = DefaultAckWait
	}
	c.AckWait = max(c.AckWait, minAckWait)
	switch {
	case c.MaxDeliver == 0:
		c.MaxDeliver = c.Policy.MaxDeliveries + 2
	case c.MaxDeliver < 0:
		c.MaxDeliver = -1
	}
	if c.MaxAckPending <= 0 {
		c.MaxAckPending = DefaultMaxAckPending
	}
	if c.Prefetch <= 0 {
		c.Prefetch = DefaultPrefetch
	}
	if c.Replicas < 0 {
		c.Replicas = 0 // chosen by chooseReplicas once connected
	}
	if c.Duplicates <= 0 {
		c.Duplicates = DefaultDuplicates
	}
	if c.DLQDuplicates <= 0 {
		c.DLQDuplicates = DefaultDLQDuplicates
	}
	if c.FailureTTL <= 0 {
		c.FailureTTL = DefaultFailureTTL
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = DefaultSweepInterval
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	return c, nil
}

// checkSubject accepts a literal NATS subject.
func checkSubject(s string) error {
	if s == "" {
		return errors.New("empty")
	}
	for _, tok := range strings.Split(s, ".") {
		if tok == "" {
			return fmt.Errorf("%q has an empty token", s)
		}
		if tok == "*" || tok == ">" {
			return fmt.Errorf("%q has a wildcard", s)
		}
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f {
			return fmt.Errorf("%q has white space or a control character", s)
		}
	}
	return nil
}

// checkName accepts a stream or consumer name.
func checkName(s string) error { return checkChars(s, 255, "a JetStream name", nameRune) }

func nameRune(r rune) bool {
	return r > ' ' && r != 0x7f && !strings.ContainsRune(".*>/\\", r)
}

// bucketRune reports whether a key-value bucket name may hold r.
func bucketRune(r rune) bool {
	return r == '_' || r == '-' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9')
}

// checkBucket accepts a key-value bucket name.
func checkBucket(s string) error { return checkChars(s, 250, "a bucket name", bucketRune) }

// checkChars accepts a name of 1 to max bytes whose every character ok allows.
func checkChars(s string, max int, what string, ok func(rune) bool) error {
	if s == "" {
		return errors.New("empty")
	}
	if len(s) > max {
		return fmt.Errorf("%q is longer than %d bytes", s, max)
	}
	for _, r := range s {
		if !ok(r) {
			return fmt.Errorf("%q has a character %s cannot hold (%q)", s, what, r)
		}
	}
	return nil
}

// bucketName derives a bucket name from a stream name.
func bucketName(s string) string {
	return strings.Map(func(r rune) rune {
		if bucketRune(r) {
			return r
		}
		return '_'
	}, s)
}

// streamName derives a stream name from a subject.
func streamName(subject string) string {
	return strings.Map(func(r rune) rune {
		if nameRune(r) {
			return r
		}
		return '_'
	}, subject)
}

// session is a Config with its defaults applied, the connection it names and a
// JetStream context on that connection.
type session struct {
	cfg Config
	nc  *nats.Conn
	own bool // nc was dialled for the session: close closes it
	js  js.JetStream
}

// open applies cfg's defaults and connects: on cfg.Conn, or on a connection of its own
// to cfg.URL.
func (cfg Config) open(ctx context.Context) (*session, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &session{cfg: c, nc: c.Conn}
	if s.nc == nil {
		s.nc, err = Dial(ctx, c.URL, "retrysafe redeliver "+c.Queue, LogConnection(c.Logger.With(slog.String("queue", c.Queue))))
		if err != nil {
			return nil, err
		}
		s.own = true
	}
	if s.js, err = js.New(s.nc); err != nil {
		s.close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return s, nil
}

// clusterReplicas is the replica count chosen by default in a cluster large enough.
const clusterReplicas = 3

// chooseReplicas sets the session's replica count when the Config leaves it to the
// default: clusterReplicas when the connection knows of at least that many servers of
// its cluster, else 1 with a WARN saying what that loses.
func (s *session) chooseReplicas() {
	if s.cfg.Replicas > 0 {
		return
	}
	cluster, servers := clusterSize(s.nc)
	if servers >= clusterReplicas {
		s.cfg.Replicas = clusterReplicas
		return
	}
	s.cfg.Replicas = 1
	s.cfg.Logger.Warn("jetstream: the work stream, the DLQ stream and the failure bucket have one replica "+
		"(no cluster of three servers seen): "+oneReplicaLoss+". Set Config.Replicas "+
		"to 3 on a cluster of three or more JetStream servers",
		slog.String("queue", s.cfg.Queue), slog.String("cluster", cluster), slog.Int("servers_known", servers))
}

// oneReplicaLoss says what a stream of one replica loses.
const oneReplicaLoss = "while their server is down the queue stops; a crash of it " +
	"(kill -9, power loss) can lose the consumer's last acknowledgements and delivery counts, so completed " +
	"messages run again and counts restart; losing its disk loses every message"

// clusterSize returns the name of the cluster the connection's server is part of and
// the number of its servers the connection knows of: the servers it was given and those
// the cluster announced. A server outside a cluster is ("", 1).
func clusterSize(nc *nats.Conn) (cluster string, servers int) {
	cluster = nc.ConnectedClusterName()
	if cluster == "" {
		return "", 1
	}
	return cluster, knownServers(nc)
}

// knownServers counts the distinct servers in the connection's pool: those it was given
// and those its cluster announced.
func knownServers(nc *nats.Conn) int {
	seen := map[string]bool{}
	for _, u := range nc.Servers() {
		if pu, err := url.Parse(u); err == nil {
			seen[pu.Host] = true
		}
	}
	return len(seen)
}

// close closes the session's connection when it is its own.
func (s *session) close() {
	if s.own {
		s.nc.Close()
	}
}

// Dial connects to the NATS server at url (default nats://127.0.0.1:4222; a
// comma-separated list names the servers of a cluster) with a connection that reconnects
// forever. When no server answers at first it tries again until ctx ends, or for 30s
// when ctx has no deadline. name identifies the client in the server's monitoring; opts
// are applied after Dial's own (LogConnection, say).
func Dial(ctx context.Context, url, name string, opts ...nats.Option) (*nats.Conn, error) {
	if url == "" {
		url = nats.DefaultURL
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	wait := 100 * time.Millisecond
	for {
		nc, err := nats.Connect(url, append([]nats.Option{
			nats.Name(name),
			nats.MaxReconnects(-1),
			nats.ReconnectWait(250 * time.Millisecond),
			nats.Timeout(2 * time.Second),
		}, opts...)...)
		if err == nil {
			return nc, nil
		}
		if !errors.Is(err, nats.ErrNoServers) {
			return nil, fmt.Errorf("jetstream: connecting to %s: %w", url, err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("jetstream: connecting to %s: %w (%w)", url, err, ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// LogConnection logs a connection's losses and recoveries to log: a WARN "jetstream:
// connection lost, reconnecting" when it drops (with the error), an INFO "jetstream:
// reconnected" naming the server it is now connected to, and a WARN when it is closed
// for good by an error, so an operator sees an outage and its end (a Close asked for is
// a DEBUG line: a command's output stays its own). A Source
// or DeadLetters that dials its own connection installs it with Config.Logger; a
// connection given as Config.Conn keeps the handlers it was made with, so pass
// LogConnection to nats.Connect (or Dial) to have its outages in the log.
func LogConnection(log *slog.Logger) nats.Option {
	return func(o *nats.Options) error {
		o.DisconnectedErrCB = func(nc *nats.Conn, err error) {
			if nc.IsClosed() {
				return // Close, reported by ClosedCB
			}
			log.Warn("jetstream: connection lost, reconnecting", slog.Any("error", err))
		}
		o.ReconnectedCB = func(nc *nats.Conn) {
			log.Info("jetstream: reconnected", slog.String("server", nc.ConnectedServerName()),
				slog.String("url", nc.ConnectedUrlRedacted()))
		}
		o.ClosedCB = func(nc *nats.Conn) {
			if err := nc.LastError(); err != nil {
				log.Warn("jetstream: connection closed", slog.Any("error", err))
				return
			}
			log.Debug("jetstream: connection closed") // asked for: the queue's business, not the operator's
		}
		return nil
	}
}

// streamConfigs returns the work and DLQ streams' configurations.
func (c Config) streamConfigs() (work, dlq js.StreamConfig) {
	storage := js.FileStorage
	if c.MemoryStorage {
		storage = js.MemoryStorage
	}
	work = js.StreamConfig{
		Name:        c.Stream,
		Description: "retrysafe redeliver work queue " + c.Queue,
		Subjects:    []string{c.Queue},
		Retention:   js.WorkQueuePolicy,
		Storage:     storage,
		Replicas:    c.Replicas,
		Duplicates:  c.Duplicates,
	}
	dlq = js.StreamConfig{
		Name:        c.DLQStream,
		Description: "retrysafe redeliver dead letters of " + c.Queue,
		Subjects:    []string{c.DLQSubject},
		Retention:   js.LimitsPolicy,
		Storage:     storage,
		Replicas:    c.Replicas,
		Duplicates:  c.DLQDuplicates,
	}
	return work, dlq
}

// consumerConfig returns the durable consumer's configuration.
func (c Config) consumerConfig() js.ConsumerConfig {
	return js.ConsumerConfig{
		Durable:       c.Consumer,
		Description:   "retrysafe redeliver consumer of " + c.Queue,
		DeliverPolicy: js.DeliverAllPolicy,
		AckPolicy:     js.AckExplicitPolicy,
		AckWait:       c.AckWait,
		MaxDeliver:    c.MaxDeliver,
		FilterSubject: c.Queue,
		MaxAckPending: c.MaxAckPending,
		ReplayPolicy:  js.ReplayInstantPolicy,
		Replicas:      0, // the stream's
	}
}

// Declare creates or updates the work stream, the DLQ stream, the failure bucket and
// the durable consumer of cfg, idempotently: running it again, from any number of
// processes, changes nothing. NewSource calls it; call it yourself to create the
// topology before the first publish (a message published before the work stream exists
// is not stored).
//
// Each JetStream API request waits at most 5s for its answer, and is sent again, after
// a capped, jittered backoff, when none came or when the answer says JetStream cannot
// serve it yet (no responders, JetStream not available, no cluster leader), until ctx
// ends (without a deadline, for 10s per request): a request or its answer lost on the
// way (a connection reset and re-established, a leader elected meanwhile) is never
// answered, and would otherwise hold Declare until ctx ends. Every resend is logged as a
// WARN. Other errors (an invalid or conflicting configuration, a permission denied) are
// returned at once.
func Declare(ctx context.Context, cfg Config) error {
	s, err := cfg.open(ctx)
	if err != nil {
		return err
	}
	defer s.close()
	s.chooseReplicas()
	_, _, err = s.cfg.declare(ctx, s.js)
	return err
}

// DeleteTopology deletes the work stream, the DLQ stream (their messages included) and
// the failure bucket of cfg; those that do not exist are skipped. It is meant for tests
// and for decommissioning a queue. Its requests are sent again as Declare's are (a
// deletion sent twice finds nothing the second time, which is skipped).
func DeleteTopology(ctx context.Context, cfg Config) error {
	s, err := cfg.open(ctx)
	if err != nil {
		return err
	}
	defer s.close()
	c, j := s.cfg, s.js
	var errs []error
	for _, s := range []string{c.Stream, c.DLQStream} {
		err := c.callAPI(ctx, "deleting stream "+s, func(ctx context.Context) error {
			return j.DeleteStream(ctx, s)
		})
		if err != nil && !errors.Is(err, js.ErrStreamNotFound) {
			errs = append(errs, fmt.Errorf("jetstream: deleting stream %s: %w", s, err))
		}
	}
	err = c.callAPI(ctx, "deleting bucket "+c.FailureBucket, func(ctx context.Context) error {
		return j.DeleteKeyValue(ctx, c.FailureBucket)
	})
	if err != nil && !errors.Is(err, js.ErrBucketNotFound) {
		errs = append(errs, fmt.Errorf("jetstream: deleting bucket %s: %w", c.FailureBucket, err))
	}
	return errors.Join(errs...)
}

// apiAttempt is how long a JetStream API request of declaring or deleting the topology
// waits for its answer before it is sent again (nats.go's default timeout of a request).
const apiAttempt = 5 * time.Second

// apiPolicy spaces the attempts of a JetStream API request: full jitter from 100ms,
// capped at 2s, for as long as the context lasts; each resend is logged as a WARN naming
// what.
func (c Config) apiPolicy(what string) retry.Policy {
	return retry.Policy{
		MaxAttempts: -1,
		Base:        100 * time.Millisecond,
		Cap:         2 * time.Second,
		Jitter:      retry.JitterFull,
		MinAttempt:  -1, // only a wait that would outlive the deadline stops the loop
		Retryable:   unanswered,
		OnRetry: func(a retry.Attempt) {
			c.Logger.Warn("jetstream: sending a JetStream API request again",
				slog.String("queue", c.Queue), slog.String("request", what), slog.Int("failed_attempt", a.N),
				slog.Duration("wait", a.Wait), slog.Any("error", a.Err))
		},
	}
}

// callAPI runs call, a JetStream API request that may safely be sent more than once
// (creating or updating a stream, a bucket or a consumer to a given configuration, reading
// a stream, deleting one), each attempt bounded by apiAttempt, until it succeeds, fails
// otherwise than unanswered says worth another attempt, or ctx ends (without a deadline,
// after 10s). Each resend is logged as a WARN naming what (say "declaring stream S").
// The error returned wraps the last attempt's, and ctx's once it ended.
func (c Config) callAPI(ctx context.Context, what string, call func(context.Context) error) error {
	ctx, cancel := withTimeout(ctx)
	defer cancel()
	err := retry.Do(ctx, c.apiPolicy(what), func(ctx context.Context) error {
		actx, acancel := context.WithTimeout(ctx, apiAttempt)
		defer acancel()
		err := call(actx)
		if err != nil && ctx.Err() != nil {
			// The caller's time is up, not the attempt's.
			if !errors.Is(err, ctx.Err()) {
				err = fmt.Errorf("%w (%w)", err, context.Cause(ctx))
			}
			return retry.Permanent(err)
		}
		return err
	})
	if errors.Is(err, retry.ErrDeadline) && !errors.Is(err, context.DeadlineExceeded) {
		// The next attempt could not have started before ctx's deadline.
		err = fmt.Errorf("%w: %w", err, context.DeadlineExceeded)
	}
	return err
}

// JetStream API error codes of a cluster that cannot act on a request for now.
const (
	jsErrCodeClusterNotAvailable js.ErrorCode = 10008 // JetStream system temporarily unavailable
	jsErrCodeClusterNotLeader    js.ErrorCode = 10009 // JetStream cluster can not handle request (no leader)
)

// unanswered reports whether err says that a JetStream API request got no answer, or
// one saying that JetStream cannot serve it yet, so that sending it again may succeed:
// its deadline passed (the request or the answer was lost: a connection reset and
// re-established, a leader change), no server subscribes to the API (no responders;
// nats.go reports it as JetStream not enabled for a bucket: a server starting, or one
// without JetStream), or the cluster has no leader to act on it. A context error here
// is an attempt's own deadline: callAPI stops when the caller's context ends.
func unanswered(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, js.ErrJetStreamNotEnabled) {
		return true
	}
	var apiErr *js.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jsErrCodeClusterNotAvailable, jsErrCodeClusterNotLeader:
			return true
		}
	}
	return false
}

// failureConfig returns the failure bucket's configuration.
func (c Config) failureConfig() js.KeyValueConfig {
	storage := js.FileStorage
	if c.MemoryStorage {
		storage = js.MemoryStorage
	}
	return js.KeyValueConfig{
		Bucket:      c.FailureBucket,
		Description: "retrysafe redeliver first failures of " + c.Queue,
		History:     1,
		TTL:         c.FailureTTL,
		Storage:     storage,
		Replicas:    c.Replicas,
	}
}

// declare creates or updates the topology and returns the work consumer and the
// failure bucket. Each request is sent again while it goes unanswered (callAPI):
// creating or updating a stream, a bucket or a consumer to a given configuration is
// idempotent, so a request the server executed but whose answer was lost does no harm
// the second time.
func (c Config) declare(ctx context.Context, j js.JetStream) (js.Consumer, js.KeyValue, error) {
	work, dlq := c.streamConfigs()
	for _, sc := range []js.StreamConfig{work, dlq} {
		if err := c.createOrUpdateStream(ctx, j, sc); err != nil {
			return nil, nil, err
		}
	}
	var kv js.KeyValue
	err := c.callAPI(ctx, "declaring bucket "+c.FailureBucket, func(ctx context.Context) error {
		var err error
		kv, err = j.CreateOrUpdateKeyValue(ctx, c.failureConfig())
		if errors.Is(err, js.ErrStreamNameAlreadyInUse) {
			// Another process created it between our update and our create: update again.
			kv, err = j.CreateOrUpdateKeyValue(ctx, c.failureConfig())
		}
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("jetstream: declaring bucket %s: %w", c.FailureBucket, err)
	}
	var cons js.Consumer
	err = c.callAPI(ctx, "declaring consumer "+c.Consumer, func(ctx context.Context) error {
		var err error
		cons, err = j.CreateOrUpdateConsumer(ctx, c.Stream, c.consumerConfig())
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("jetstream: declaring consumer %s on %s: %w", c.Consumer, c.Stream, err)
	}
	return cons, kv, nil
}

// createOrUpdateStream declares the stream sc, sending the request again while it goes
// unanswered (see declare).
func (c Config) createOrUpdateStream(ctx context.Context, j js.JetStream, sc js.StreamConfig) error {
	err := c.callAPI(ctx, "declaring stream "+sc.Name, func(ctx context.Context) error {
		_, err := j.CreateOrUpdateStream(ctx, sc)
		if errors.Is(err, js.ErrStreamNameAlreadyInUse) {
			// Another process created it between our update and our create: update again.
			_, err = j.CreateOrUpdateStream(ctx, sc)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("jetstream: declaring stream %s: %w", sc.Name, err)
	}
	return nil
}
