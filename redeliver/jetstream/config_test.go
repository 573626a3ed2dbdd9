package jetstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	js "github.com/nats-io/nats.go/jetstream"

	"github.com/retrysafe/retrysafe/harness/natsserver"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/retry"
)

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	c, err := Config{Queue: "emitter.access"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Queue: "emitter.access", URL: nats.DefaultURL, Stream: "emitter_access", Consumer: "redeliver",
		DLQSubject: "emitter.access.dlq", DLQStream: "emitter_access_dlq", FailureBucket: "emitter_access_failures",
		FailureTTL: 24 * time.Hour, AckWait: 30 * time.Second,
		MaxDeliver: 22, MaxAckPending: 1000, Prefetch: 16, Replicas: 0, Duplicates: 2 * time.Minute,
		DLQDuplicates: time.Hour, SweepInterval: time.Minute,
	}
	got := c
	got.Policy, got.Logger, got.Clock = redeliver.Policy{}, nil, nil
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Errorf("defaults\n got %+v\nwant %+v", got, want)
	}
	if c.Policy.MaxAttempts != 5 || c.Policy.Header != "x-retry-count" || c.Logger == nil || c.Clock == nil {
		t.Errorf("policy %+v", c.Policy)
	}
	c, _ = Config{Queue: "q", Policy: redeliver.Policy{MaxAttempts: 2}, MaxDeliver: -5, AckWait: time.Millisecond}.withDefaults()
	if c.MaxDeliver != -1 || c.AckWait != 100*time.Millisecond {
		t.Errorf("MaxDeliver %d AckWait %v, want -1 (no limit) and the 100ms floor", c.MaxDeliver, c.AckWait)
	}
	c, _ = Config{Queue: "q", Stream: "orders@eu"}.withDefaults()
	if c.FailureBucket != "orders_eu_failures" {
		t.Errorf("FailureBucket %q: want the stream's name with what a bucket name cannot hold as '_'", c.FailureBucket)
	}
	c, _ = Config{Queue: "q", Policy: redeliver.Policy{MaxAttempts: 2, MaxDeliveries: 9}}.withDefaults()
	if c.MaxDeliver != 11 {
		t.Errorf("MaxDeliver %d, want MaxDeliveries+2", c.MaxDeliver)
	}
	c, _ = Config{Queue: "q", Policy: redeliver.Policy{MaxAttempts: 10}}.withDefaults()
	if c.MaxDeliver != 42 {
		t.Errorf("MaxDeliver %d, want the default MaxDeliveries (4×MaxAttempts) + 2", c.MaxDeliver)
	}
}

func TestConfigRejectsBadNames(t *testing.T) {
	t.Parallel()
	for _, c := range []Config{
		{},
		{Queue: "orders.*"},
		{Queue: "orders.>"},
		{Queue: "orders..eu"},
		{Queue: ".orders"},
		{Queue: "my orders"},
		{Queue: "orders\x00"},
		{Queue: "orders", Stream: "a.b"},
		{Queue: "orders", Consumer: "c/d"},
		{Queue: "orders", DLQStream: "x y"},
		{Queue: "orders", DLQSubject: "orders"},
		{Queue: "orders", DLQSubject: "orders.>"},
		{Queue: "orders", Stream: "S", DLQStream: "S"},
		{Queue: "orders", FailureBucket: "a.b"},
	} {
		if _, err := c.withDefaults(); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: err %v, want ErrConfig", c, err)
		}
		if _, err := NewSource(context.Background(), c); !errors.Is(err, ErrConfig) {
			t.Errorf("NewSource(%+v): err %v, want ErrConfig", c, err)
		}
	}
	if _, err := NewPublisher(nil); !errors.Is(err, ErrConfig) {
		t.Errorf("NewPublisher(nil) = %v", err)
	}
}

func TestStreamName(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"emitter.access": "emitter_access", "a/b\\c": "a_b_c", "plain": "plain"} {
		if got := streamName(in); got != want {
			t.Errorf("streamName(%q) = %q, want %q", in, got, want)
		}
	}
}

// Declaring twice, from two Sources at once, changes nothing.
func TestDeclareIsIdempotent(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, url string) {
		ctx := context.Background()
		cfg := newConfig(t, url)
		errs := make(chan error, 3)
		for range 3 {
			go func() { errs <- Declare(ctx, cfg) }()
		}
		for range 3 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		nc := connect(t, url)
		publish(t, nc, cfg, "d-1")
		if err := Declare(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		// The consumer's pending count can lag the update of the consumer on a loaded
		// machine (it read 0 once for the stored, unpulled message): it is awaited.
		eventually(t, 10*time.Second, "one stored message, unpulled, after a second Declare", func() bool {
			return queueState(t, nc, cfg) == state{work: 1, unpulled: 1}
		})
	})
}

// A producer's count header counts: the attempt is the larger of header+1 and
// NumDelivered, so a message that already had 2 attempts elsewhere gets one here.
func TestCountHeaderFromProducer(t *testing.T) {
	t.Parallel()
	cfg := newConfig(t, embeddedURL)
	rec := newRecorder()
	run(t, cfg, func(_ context.Context, m *redeliver.Message) error {
		rec.delivered(m)
		return errors.New("still failing")
	}, nil)
	nc := connect(t, embeddedURL)
	p, _ := NewPublisher(nc)
	if err := p.Publish(context.Background(), cfg.Queue, &redeliver.Message{ID: "h-1", Header: map[string]string{"x-retry-count": "2"}}); err != nil {
		t.Fatal(err)
	}
	dl := deadLetters(t, cfg)
	eventually(t, 10*time.Second, "the dead letter", func() bool {
		_, err := dl.Get(context.Background(), "h-1")
		return err == nil
	})
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if a := rec.attempts["h-1"]; len(a) != 1 || a[0] != 3 {
		t.Errorf("attempts %v, want [3]", a)
	}
}

// A message without Nats-Msg-Id gets "<stream>-<sequence>" as its id, kept in the DLQ.
func TestMessageWithoutID(t *testing.T) {
	t.Parallel()
	cfg := newConfig(t, embeddedURL)
	got := make(chan *redeliver.Message, 1)
	run(t, cfg, func(_ context.Context, m *redeliver.Message) error {
		got <- m
		return retry.Permanent(errors.New("no"))
	}, nil)
	nc := connect(t, embeddedURL)
	j, _ := js.New(nc)
	if _, err := j.Publish(context.Background(), cfg.Queue, []byte("x")); err != nil {
		t.Fatal(err)
	}
	var m *redeliver.Message
	select {
	case m = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery")
	}
	c, _ := cfg.withDefaults()
	if m.ID != c.Stream+"-1" || m.DeliveryCount != 1 || m.Published.IsZero() || len(m.Header) != 0 {
		t.Errorf("message %+v", m)
	}
	dl := deadLetters(t, cfg)
	eventually(t, 10*time.Second, "the dead letter under the same id", func() bool {
		_, err := dl.Get(context.Background(), m.ID)
		return err == nil
	})
}

// A directory given to natsserver.Start keeps the streams across a restart.
func TestEmbeddedKeepsItsStore(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	url, shutdown, err := natsserver.Start(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Queue: "persist.q", URL: url, Logger: quietLogger()}
	if err := Declare(ctx, cfg); err != nil {
		shutdown()
		t.Fatal(err)
	}
	nc, err := nats.Connect(url)
	if err != nil {
		shutdown()
		t.Fatal(err)
	}
	publish(t, nc, cfg, "kept-1")
	nc.Close()
	shutdown()
	if _, err := os.Stat(filepath.Join(dir, "jetstream")); err != nil {
		t.Fatalf("no store in %s: %v", dir, err)
	}

	url, shutdown, err = natsserver.Start(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(shutdown)
	cfg.URL = url
	nc2 := connect(t, url)
	if st := queueState(t, nc2, cfg); st.work != 1 {
		t.Errorf("after a restart: %+v, want the message kept", st)
	}
}

// No server at the URL: NewSource gives up when ctx ends, with an error.
func TestNoServer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := NewSource(ctx, Config{Queue: "q", URL: "nats://" + testenv.DeadAddr(t)})
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("NewSource without a server = %v, want a deadline error", err)
	}
}

// A JetStream API request of Declare lost with its connection (sent into a partition
// that then resets the connection; nats.go reconnects, but nobody answers the request)
// is sent again, so Declare completes long before its context ends, and the topology
// exists.
func TestDeclareResendsLostRequest(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, target string) {
		// sent is closed once a JetStream API request reached the stalled proxy.
		proxy, sent := proxyTo(t, target, []byte("$JS.API."))

		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cfg := newConfig(t, target) // its cleanup deletes the topology through target
		logs := newCapture()
		cfg.Logger = slog.New(logs)
		// The connection, made before the stall, reconnects by itself (as one Declare
		// dials does).
		nc, err := Dial(ctx, "nats://"+proxy.Addr(), t.Name())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		cfg.Conn = nc

		proxy.Stall()
		done := make(chan error, 1)
		go func() { done <- Declare(ctx, cfg) }()
		select {
		case <-sent:
		case err := <-done:
			t.Fatalf("Declare returned during the stall, before any API request: %v", err)
		}
		proxy.Restore() // resets the stalled connection: the request is lost with it
		if err := <-done; err != nil {
			t.Fatalf("Declare after its first API request was lost: %v", err)
		}
		if s := proxy.Stats(); s.Reset == 0 || nc.Stats().Reconnects == 0 {
			t.Errorf("proxy stats %+v, %d reconnections: want the stalled connection reset and a reconnection",
				s, nc.Stats().Reconnects)
		}
		if len(logs.find(slog.LevelWarn, "jetstream: sending a JetStream API request again")) == 0 {
			t.Error("no WARN for the request sent again")
		}

		c, _ := cfg.withDefaults()
		j, err := js.New(connect(t, target))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{c.Stream, c.DLQStream} {
			if _, err := j.Stream(ctx, s); err != nil {
				t.Errorf("stream %s: %v", s, err)
			}
		}
		if _, err := j.KeyValue(ctx, c.FailureBucket); err != nil {
			t.Errorf("bucket %s: %v", c.FailureBucket, err)
		}
		if _, err := j.Consumer(ctx, c.Stream, c.Consumer); err != nil {
			t.Errorf("consumer %s: %v", c.Consumer, err)
		}
	})
}

// A request JetStream refuses (here: a second work stream on the subject of the first) is
// not sent again: Declare returns the server's error at once, and logs no resend.
func TestDeclareConflictFailsAtOnce(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, url string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cfg := newConfig(t, url)
		if err := Declare(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		other := cfg
		other.Stream, other.DLQStream = cfg.Stream+"_other", cfg.Stream+"_other_dlq"
		logs := newCapture()
		other.Logger = slog.New(logs)
		err := Declare(ctx, other)
		var apiErr *js.APIError
		if !errors.As(err, &apiErr) {
			t.Fatalf("Declare of a stream on a taken subject = %v, want the server's API error", err)
		}
		if got := logs.find(slog.LevelWarn, "jetstream: sending a JetStream API request again"); len(got) != 0 {
			t.Errorf("a refused request was sent again: %v", got)
		}
	})
}

func TestUnanswered(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want bool
	}{
		{context.DeadlineExceeded, true},
		{fmt.Errorf("wrapped: %w", context.DeadlineExceeded), true},
		{nats.ErrTimeout, true},
		{nats.ErrNoResponders, true},
		{js.ErrJetStreamNotEnabled, true},
		{&js.APIError{Code: 503, ErrorCode: 10076, Description: "JetStream not enabled"}, true},
		{&js.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, true},
		{&js.APIError{Code: 500, ErrorCode: 10009, Description: "JetStream cluster can not handle request"}, true},
		{context.Canceled, false},
		{nats.ErrConnectionClosed, false},
		{js.ErrJetStreamNotEnabledForAccount, false},
		{js.ErrStreamNotFound, false},
		{&js.APIError{Code: 400, ErrorCode: 10065, Description: "subjects overlap with an existing stream"}, false},
		{&js.APIError{Code: 403, ErrorCode: 10003, Description: "bad request"}, false},
		{nats.ErrPermissionViolation, false},
	} {
		if got := unanswered(c.err); got != c.want {
			t.Errorf("unanswered(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
