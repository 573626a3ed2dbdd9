// API stable: 2026-11-30T13:18Z

package redeliver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/retrysafe/retrysafe/retry"
)

// DefaultHeader is the default name of the header that carries the attempt count.
const DefaultHeader = "x-retry-count"

// Headers a message gains from this package. HeaderFirstFailure travels with every
// retried copy; a dead-lettered message gains all of them (see DeadInfo.Header). They do
// not start with "x-", which RabbitMQ reserves for itself.
const (
	HeaderReason       = "redeliver-reason"        // why it was dead-lettered: a Reason
	HeaderError        = "redeliver-error"         // the last error's text (at most MaxErrorLen bytes)
	HeaderErrorClass   = "redeliver-error-class"   // the last error's Class
	HeaderAttempts     = "redeliver-attempts"      // attempts made, decimal
	HeaderFirstFailure = "redeliver-first-failure" // RFC 3339 with nanoseconds, UTC
	HeaderLastFailure  = "redeliver-last-failure"  // RFC 3339 with nanoseconds, UTC
	HeaderQueue        = "redeliver-queue"         // the queue (or stream) it came from
)

// MaxErrorLen bounds the error text copied into HeaderError.
const MaxErrorLen = 1024

// Errors.
var (
	// ErrDecode marks a message the handler cannot decode: no retry can fix it, so it goes
	// straight to the dead-letter queue. Wrap it (fmt.Errorf("…: %w", redeliver.ErrDecode))
	// or use Decode.
	ErrDecode = errors.New("redeliver: cannot decode message")
	// ErrNotFound: DeadLetters.Get found no dead letter with that id.
	ErrNotFound = errors.New("redeliver: not found")
	// ErrClosed: the Source or DeadLetters was closed.
	ErrClosed = errors.New("redeliver: closed")
	// ErrDuplicate: Publisher.Publish stored nothing, because the broker already holds
	// a message with the same id, published within its deduplication window (JetStream;
	// RabbitMQ never deduplicates, see each backend's Publisher). The message is not
	// lost: the earlier copy is it. A caller resending after an unknown outcome (an
	// outbox relay after a lost confirm) counts it as delivered; a caller that reused an
	// id for another message learns that this one was dropped.
	ErrDuplicate = errors.New("redeliver: duplicate message id")
)

// Decode marks err as a decode failure (it then matches ErrDecode and still unwraps to
// err). Decode(nil) is nil.
func Decode(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrDecode, err)
}

// DecodeJSON unmarshals m's body into v; a failure matches ErrDecode.
func DecodeJSON(m *Message, v any) error {
	if err := json.Unmarshal(m.Body, v); err != nil {
		return Decode(err)
	}
	return nil
}

// Message is one delivery of a message, as the handler sees it.
type Message struct {
	// ID is the message's id (AMQP message-id, JetStream Nats-Msg-Id). It is kept across
	// retries, dead-lettering and replay, and is what Inbox deduplicates on. Empty when
	// the publisher set none.
	ID string
	// Queue is the queue (RabbitMQ) or stream/consumer (JetStream) it was received from.
	Queue string
	// Body is the payload.
	Body []byte
	// ContentType is the body's media type, when the publisher set one.
	ContentType string
	// Header holds the application headers as strings (numbers in decimal). Never nil
	// for a received message.
	Header map[string]string
	// Attempt is this delivery's number, 1 for the first: the count header + 1 on a
	// Source whose retries rewrite the header (HeaderCounter: RabbitMQ); the larger of
	// the count header + 1 and FailedAttempts + 1 on a Source that records failed
	// attempts itself (AttemptKeeper: JetStream); else the larger of the count header +
	// 1 and DeliveryCount. It is at least one more than an attempt the Consumer saw fail
	// without the broker learning it (its Retry failed). The Consumer sets it; a Source
	// leaves it 0.
	//
	// Handlers read the attempt here, and the first failure in FirstFailure, not in the
	// headers: they are the same on every backend, while the count header is only
	// rewritten where a retry republishes the message (RabbitMQ). JetStream redelivers
	// the stored message unchanged, so there the count header keeps what the producer
	// set and the Source's failure record does the counting.
	Attempt int
	// FailedAttempts is the number of this message's attempts whose failure a handler
	// reported, as a Source that records them apart from the message (AttemptKeeper:
	// JetStream) has them; 0 on other Sources, and before the first failure. Set by
	// the Source.
	FailedAttempts int
	// FirstFailure is when this message's first failed attempt failed: zero while no
	// attempt has failed (attempt 1, and after a replay), then the same time on every
	// later delivery. It is also zero when the failure was never recorded: an attempt
	// that died with its process (a crash, a kill) counts as an attempt but records no
	// failure. A Source sets it where the broker keeps it apart from the message
	// (JetStream); the Consumer fills it from HeaderFirstFailure otherwise (the header
	// travels on RabbitMQ's retry copies).
	FirstFailure time.Time
	// DeliveryCount is the broker's own count of deliveries of this message, the first
	// included (RabbitMQ quorum queue x-delivery-count + 1, JetStream NumDelivered); 0
	// when the broker keeps none. Set by the Source.
	DeliveryCount int
	// Published is when the message was first published, when the broker or the
	// publisher says; else zero. It is kept across retries and dead-lettering: RabbitMQ
	// reads the timestamp property (second precision; this package's Publisher sets
	// it, the copies keep it), JetStream the time the work stream stored the message.
	Published time.Time
	// Received is when this delivery was received.
	Received time.Time
}

// Handler processes one message. Return nil to acknowledge it; an error to retry it
// (unless the Policy's classifier says the error is permanent, as for retry.Permanent
// errors and ErrDecode). The context ends at the per-message timeout or when the
// Consumer's shutdown grace is over. A handler must be safe for concurrent use.
type Handler func(ctx context.Context, m *Message) error

// Class is the kind of a handler's failure, the error_class label of the metrics.
type Class string

// The classes DefaultClassify returns. ClassPermanent and ClassDecode are dead-lettered
// at once; every other class, a caller's own included, is retried.
const (
	ClassTransient Class = "transient" // an error worth retrying
	ClassTimeout   Class = "timeout"   // the per-message timeout ended the handler
	ClassPanic     Class = "panic"     // the handler panicked (recovered, retried)
	ClassPermanent Class = "permanent" // retry.Permanent, or an error retry.Retryable rejects
	ClassDecode    Class = "decode"    // ErrDecode
)

// Retryable reports whether a failure of class c is worth another attempt.
func (c Class) Retryable() bool { return c != ClassPermanent && c != ClassDecode }

// DefaultClassify classifies a handler's error: ErrDecode → ClassDecode; an error that
// retry.Retryable rejects (retry.Permanent, retry.ErrAuth, retry.ErrInvalid,
// retry.ErrNotFound …) → ClassPermanent; context.DeadlineExceeded → ClassTimeout;
// anything else → ClassTransient.
func DefaultClassify(err error) Class {
	switch {
	case errors.Is(err, ErrDecode):
		return ClassDecode
	case errors.Is(err, context.DeadlineExceeded):
		return ClassTimeout
	case !retry.Retryable(err):
		return ClassPermanent
	}
	return ClassTransient
}

// Reason says why a message was dead-lettered (HeaderReason).
type Reason string

// Reasons.
const (
	ReasonMaxAttempts Reason = "max-attempts" // every attempt failed transiently
	ReasonPermanent   Reason = "permanent"    // a permanent error (ClassPermanent)
	ReasonDecode      Reason = "decode"       // a decode failure (ClassDecode)
	// ReasonMaxDeliver: the broker delivered one copy of the message more than
	// Policy.MaxDeliveries times without any handler settling it (a HeaderCounter or
	// AttemptKeeper Source): a handler that crashes its process or never returns.
	ReasonMaxDeliver Reason = "max-deliver"
)

// ClassUnknown is the error class of a message dead-lettered for ReasonMaxDeliver: no
// handler reported an error.
const ClassUnknown Class = "unknown"

// Policy says how often and how soon a failed message is tried again. The zero value of
// each field means the default documented on it.
type Policy struct {
	// MaxAttempts is the most deliveries a message gets, the first included; after the
	// last one fails it is dead-lettered. Default 5.
	MaxAttempts int
	// Backoff computes the wait before attempt n+1 as Backoff.Backoff(n-1, 0). Only its
	// Base, Cap, Jitter and Rand are used. Default: full jitter from Base 1s, Cap 5m
	// (zero Base and Cap are these defaults, not retry's). A handler error that carries a
	// wait (retry.After, a *retry.StatusError with Retry-After) uses that wait instead,
	// capped at Cap.
	Backoff retry.Policy
	// Classify maps a handler's error to a Class. Default DefaultClassify. A panic is
	// always ClassPanic and a timeout of the handler's context always ClassTimeout.
	Classify func(error) Class
	// Timeout bounds each handler call. Default 5m (a long job's handler timeout);
	// negative means none.
	Timeout time.Duration
	// Header is the name of the header that carries the attempt count: the number of
	// failed attempts so far, in decimal (RabbitMQ: an integer). Default "x-retry-count".
	Header string
	// MaxDeliveries bounds the deliveries of one copy of a message, by the broker's own
	// count (Message.DeliveryCount), on a Source that counts attempts in the header
	// (HeaderCounter: RabbitMQ) or in a record of its own (AttemptKeeper: JetStream).
	// There a delivery is not an attempt: a broker restart or
	// a lost connection hands back every unsettled delivery, the prefetched ones no
	// handler saw included, and the broker counts each. So attempts are counted only
	// where a handler reported a failure, and this much higher bound is what stops a
	// message whose handler crashes the process or never returns (no failure is ever
	// recorded for it): a delivery beyond it is dead-lettered without running the
	// handler, with ReasonMaxDeliver. Default: 4×MaxAttempts, at least 20. Unused by
	// other Sources (they count attempts in the delivery count).
	MaxDeliveries int
}

// Defaults of Policy.
const (
	DefaultMaxAttempts = 5
	DefaultBase        = time.Second
	DefaultCap         = 5 * time.Minute
	DefaultTimeout     = 5 * time.Minute
	// DefaultMinMaxDeliveries is the least default Policy.MaxDeliveries.
	DefaultMinMaxDeliveries = 20
)

// WithDefaults returns p with its zero fields set to their defaults. Backends call it to
// learn the header name.
func (p Policy) WithDefaults() Policy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if p.Backoff.Base <= 0 {
		p.Backoff.Base = DefaultBase
	}
	if p.Backoff.Cap <= 0 {
		p.Backoff.Cap = DefaultCap
	}
	p.Backoff.MaxAttempts = -1
	if p.Classify == nil {
		p.Classify = DefaultClassify
	}
	if p.Timeout == 0 {
		p.Timeout = DefaultTimeout
	}
	if p.Header == "" {
		p.Header = DefaultHeader
	}
	if p.MaxDeliveries <= 0 {
		p.MaxDeliveries = max(4*p.MaxAttempts, DefaultMinMaxDeliveries)
	}
	return p
}

// Delay returns the wait before the delivery after attempt (1-based) failed with err.
func (p Policy) Delay(attempt int, err error) time.Duration {
	p = p.WithDefaults()
	var ra interface{ RetryAfter() (time.Duration, bool) }
	if errors.As(err, &ra) {
		if d, ok := ra.RetryAfter(); ok {
			return min(max(d, 0), p.Backoff.Cap)
		}
	}
	return p.Backoff.Backoff(attempt-1, 0)
}

// AttemptOf returns the attempt number of a delivery: the larger of the count header + 1
// and the broker's delivery count, at least 1. A count header that is not a
// non-negative integer counts as absent.
func AttemptOf(header map[string]string, name string, deliveryCount int) int {
	n := 1
	if v, ok := header[name]; ok {
		if c, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && c >= 0 && c < 1<<30 {
			n = c + 1
		}
	}
	return max(n, deliveryCount, 1)
}

// A Source is a backend's stream of deliveries from one queue: the part of a broker the
// Consumer drives. The Consumer calls Receive from one goroutine at a time, and settles
// each Delivery exactly once (Ack, Retry, DeadLetter or Release), possibly from another
// goroutine and possibly after Close began.
type Source interface {
	// Receive returns the next delivery, blocking until one is available or ctx ends
	// (then it returns ctx's error). A Source reconnects by itself when the broker goes
	// away; Receive returns any other error only when the Source can deliver no more
	// (ErrClosed after Close), and the Consumer then stops.
	Receive(ctx context.Context) (Delivery, error)
	// Close stops the flow of new deliveries and hands back those received by the
	// backend but not yet returned by Receive (prefetched). Deliveries already returned
	// remain settleable until ctx ends. Close is called once, after the Consumer has
	// settled every delivery or given up waiting.
	Close(ctx context.Context) error
}

// A Delivery is one received message and the operations that settle it. Each returns
// only when the broker has the outcome (a confirm for a publish); the Consumer calls
// exactly one of Ack, Retry, DeadLetter and Release, once. An error means the outcome is
// unknown: the broker redelivers the message later (at-least-once), and the Consumer
// only logs and counts it.
type Delivery interface {
	// Message returns the message. The Consumer sets its Attempt field.
	Message() *Message
	// Ack settles the message as processed.
	Ack(ctx context.Context) error
	// Retry arranges for the message to be delivered again after at least r.Delay, with
	// r.Header set on it, then settles this delivery. RabbitMQ publishes a copy to a
	// delay queue, waits for the confirm, then acks; JetStream may NakWithDelay instead,
	// ignoring r.Header, if its Message.DeliveryCount still advances the attempt.
	Retry(ctx context.Context, r RetryInfo) error
	// DeadLetter moves the message, its body and headers kept and d.Header() added, to
	// the dead-letter queue (confirmed), then settles this delivery.
	DeadLetter(ctx context.Context, d DeadInfo) error
	// Release hands the message back unprocessed, to be delivered again as soon as
	// possible without counting an attempt where the broker allows it (shutdown).
	Release(ctx context.Context) error
	// InProgress tells the broker the handler is still working, so that it does not
	// redeliver the message meanwhile (JetStream's InProgress); a no-op where the broker
	// needs nothing (RabbitMQ).
	InProgress(ctx context.Context) error
}

// HeaderCounter is an optional interface of a Source whose Delivery.Retry republishes
// the message with the count header advanced (RabbitMQ). There the header counts
// exactly the attempts whose failure a handler reported, while the broker's delivery
// count also counts deliveries no handler saw. When CountsInHeader reports true the
// Consumer takes Message.Attempt from the header alone and checks
// Message.DeliveryCount only against Policy.MaxDeliveries.
type HeaderCounter interface {
	CountsInHeader() bool
}

// AttemptKeeper is an optional interface of a Source whose Delivery.Retry cannot
// rewrite the message (JetStream redelivers the stored message unchanged), so the
// Source records each message's failed attempts apart from it, in Delivery.Retry, and
// returns the count as Message.FailedAttempts on the next deliveries. The broker's
// delivery count also counts deliveries no handler saw (pulled ahead and handed back by
// a restart or a failover), and it can go back to 1 when a broker loses a consumer's
// state. When KeepsAttempts reports true the Consumer takes Message.Attempt from the
// count header and Message.FailedAttempts, never from the delivery count, and checks
// Message.DeliveryCount only against Policy.MaxDeliveries.
type AttemptKeeper interface {
	KeepsAttempts() bool
}

// Heartbeater is an optional interface of a Source: the interval at which the Consumer
// calls Delivery.InProgress while a handler runs (a third of JetStream's AckWait, say).
// Config.Heartbeat overrides it.
type Heartbeater interface {
	Heartbeat() time.Duration
}

// RetryInfo is what Delivery.Retry needs.
type RetryInfo struct {
	// FirstFailure is the message's first failure (Message.FirstFailure, or this
	// attempt's failure when it is the first one), also in Header as
	// HeaderFirstFailure. A backend whose retries cannot carry headers keeps it
	// elsewhere and sets Message.FirstFailure from there on the next delivery.
	FirstFailure time.Time
	// Delay is the wait before the next delivery. A backend may round it to one of a
	// bounded set of delays (RabbitMQ's delay queues: the nearest on a log scale).
	Delay time.Duration
	// Attempt is the attempt that failed (1-based): the value the count header now has.
	Attempt int
	// CountHeader is the name of the attempt count header (Policy.Header).
	CountHeader string
	// Header holds the headers to set on the copy: CountHeader (Attempt in decimal) and
	// HeaderFirstFailure (FirstFailure). A backend writes CountHeader as an integer where headers are
	// typed (AMQP) and the others as strings.
	Header map[string]string
	// Err is the error the attempt failed with, and Class its class.
	Err   error
	Class Class
}

// DeadInfo describes why a message is dead-lettered; Header gives its headers.
type DeadInfo struct {
	Reason       Reason
	Class        Class
	Err          string // the last error's text
	Attempts     int    // attempts made
	FirstFailure time.Time
	LastFailure  time.Time
	Queue        string // the source queue
	// CountHeader is the name of the attempt count header, which Header sets to
	// Attempts (Policy.Header; empty leaves it alone).
	CountHeader string
}

// Header returns the headers a dead-lettered message gains: HeaderReason, HeaderError,
// HeaderErrorClass, HeaderAttempts, HeaderFirstFailure, HeaderLastFailure, HeaderQueue,
// and CountHeader = Attempts.
func (d DeadInfo) Header() map[string]string {
	errText := d.Err
	if len(errText) > MaxErrorLen {
		errText = truncate(errText, MaxErrorLen)
	}
	h := map[string]string{
		HeaderReason:       string(d.Reason),
		HeaderError:        errText,
		HeaderErrorClass:   string(d.Class),
		HeaderAttempts:     strconv.Itoa(d.Attempts),
		HeaderFirstFailure: formatTime(d.FirstFailure),
		HeaderLastFailure:  formatTime(d.LastFailure),
		HeaderQueue:        d.Queue,
	}
	if d.CountHeader != "" {
		h[d.CountHeader] = strconv.Itoa(d.Attempts)
	}
	return h
}

// ParseDeadInfo reads a dead-lettered message's headers back (the inverse of
// DeadInfo.Header); fields whose header is missing or malformed stay zero.
func ParseDeadInfo(h map[string]string) DeadInfo {
	d := DeadInfo{
		Reason: Reason(h[HeaderReason]),
		Class:  Class(h[HeaderErrorClass]),
		Err:    h[HeaderError],
		Queue:  h[HeaderQueue],
	}
	d.Attempts, _ = strconv.Atoi(h[HeaderAttempts])
	d.FirstFailure = parseTime(h[HeaderFirstFailure])
	d.LastFailure = parseTime(h[HeaderLastFailure])
	return d
}

// ResetHeader returns a copy of h for a replay: without countHeader and without the
// headers this package adds, so the message starts again at attempt 1.
func ResetHeader(h map[string]string, countHeader string) map[string]string {
	out := make(map[string]string, len(h))
	for k, v := range h {
		if IsRedeliverHeader(k) || (countHeader != "" && k == countHeader) {
			continue
		}
		out[k] = v
	}
	return out
}

// IsRedeliverHeader reports whether name is one of the headers this package adds.
func IsRedeliverHeader(name string) bool {
	switch name {
	case HeaderReason, HeaderError, HeaderErrorClass, HeaderAttempts, HeaderFirstFailure,
		HeaderLastFailure, HeaderQueue:
		return true
	}
	return false
}

// Publisher sends messages to a broker with a confirm: the producer side, used by
// Outbox and by DeadLetters.Replay.
type Publisher interface {
	// Publish sends m (ID, Body, ContentType, Header; the rest is ignored) to queue
	// (RabbitMQ: through the default exchange; JetStream: the subject) and returns nil
	// once the broker confirmed that it stored it. An error matching ErrDuplicate means
	// the broker stored nothing because it already holds a message with m.ID from
	// within its deduplication window; any other error means it may or may not have
	// been stored.
	Publish(ctx context.Context, queue string, m *Message) error
}

// DeadLetter is a message in a dead-letter queue. Its Published is when the message
// was first published (not when it was dead-lettered), as on a delivery.
type DeadLetter struct {
	Message          // Header includes the dead-letter headers
	Info    DeadInfo // parsed from Header
	// DeadLettered is when the message was moved to the dead-letter queue (JetStream:
	// the DLQ stream's store time; RabbitMQ: the dead-lettering consumer's clock, in a
	// header); zero when unknown.
	DeadLettered time.Time
}

// DeadLetters are the operations on one dead-letter queue, for the retrysafe dlq
// command. Each backend implements them.
type DeadLetters interface {
	// List returns up to limit dead letters (limit <= 0: all), oldest first where the
	// broker keeps an order, without removing them.
	List(ctx context.Context, limit int) ([]DeadLetter, error)
	// Get returns the dead letter with the message id, or an error matching ErrNotFound.
	Get(ctx context.Context, id string) (*DeadLetter, error)
	// Replay republishes the dead letters with the given ids (none: all of them) to their
	// work queue, id kept and attempt count reset (ResetHeader), each confirmed before
	// its dead-letter copy is removed. It returns how many it replayed.
	Replay(ctx context.Context, ids ...string) (int, error)
	// Purge removes the dead letters with the given ids (none: all of them) and returns
	// how many it removed.
	Purge(ctx context.Context, ids ...string) (int, error)
	// Close releases the connection.
	Close() error
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func parseTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}
	}
	return t
}

// truncate cuts s to at most n bytes on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !isRuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }
