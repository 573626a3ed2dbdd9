package jetstream

import (
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	js "github.com/nats-io/nats.go/jetstream"

	"github.com/retrysafe/retrysafe/redeliver"
)

// HeaderID carries a message's id on the copies this package publishes itself: a dead
// letter and a replayed message, whose Nats-Msg-Id must differ from the original's (each
// stream deduplicates on Nats-Msg-Id, and a replay within the work stream's window would
// otherwise be dropped as a duplicate). A received message's id is this header when
// present, else its Nats-Msg-Id, else "<stream>-<sequence>".
const HeaderID = "redeliver-msg-id"

// HeaderPublished carries a message's first publish time (RFC 3339 with nanoseconds,
// UTC) on the copies this package publishes itself: a dead letter and a replayed
// message, whose own store time is the copy's. A received message's Published is this
// header when present, else the time the work stream stored it; a dead letter's is the
// header alone (its store time is DeadLetter.DeadLettered).
const HeaderPublished = "redeliver-published"

// HeaderSwept counts how often a sweep published a message again because the server
// no longer delivered it and no Source had settled it (see Source.Sweep).
const HeaderSwept = "redeliver-swept"

// HeaderFailed carries, on a copy the sweep publishes again (HeaderSwept), the failure
// record of the orphan it replaces: its failed attempts and first failure, as
// "<attempts> <RFC 3339 time>". The copy's attempts go on from there.
const HeaderFailed = "redeliver-failed"

// HeaderContentType carries Message.ContentType (NATS messages have no content type of
// their own).
const HeaderContentType = "Content-Type"

// ReasonMaxDeliver is the reason (redeliver.HeaderReason) of an orphan: a message the
// server stopped redelivering at the consumer's MaxDeliver without any Source settling
// it (see the package documentation). The Source moved it to the DLQ itself.
const ReasonMaxDeliver redeliver.Reason = "max-deliver"

// ClassUnknown is the error class of an orphan: no handler reported an error.
const ClassUnknown redeliver.Class = "unknown"

// natsHeader reports whether name is one of the headers JetStream reads or sets itself
// (Nats-Msg-Id, Nats-Expected-*, Nats-Stream …): never copied to a republished message.
func natsHeader(name string) bool {
	return len(name) >= 5 && strings.EqualFold(name[:5], "nats-")
}

// messageID returns a stored message's id.
func messageID(h nats.Header, stream string, seq uint64) string {
	if v := h.Get(HeaderID); v != "" {
		return v
	}
	if v := h.Get(js.MsgIDHeader); v != "" {
		return v
	}
	return stream + "-" + strconv.FormatUint(seq, 10)
}

// appHeader returns the application headers of h, first value of each: without
// JetStream's own, HeaderID, HeaderPublished and HeaderContentType (the Message has
// fields for them). Never nil.
func appHeader(h nats.Header) map[string]string {
	out := make(map[string]string, len(h))
	for k, v := range h {
		if natsHeader(k) || k == HeaderID || k == HeaderPublished || k == HeaderSwept || k == HeaderFailed || k == HeaderContentType || len(v) == 0 {
			continue
		}
		out[k] = v[0]
	}
	return out
}

// copyHeader returns a copy of h without JetStream's own headers and without those drop
// rejects (nil: none).
func copyHeader(h nats.Header, drop func(string) bool) nats.Header {
	out := make(nats.Header, len(h)+8)
	for k, v := range h {
		if natsHeader(k) || (drop != nil && drop(k)) {
			continue
		}
		out[k] = slices.Clone(v)
	}
	return out
}

// deadMsg builds the dead letter of a stored message: its body and headers, its id in
// HeaderID, its first publish in HeaderPublished and the dead-letter headers.
func deadMsg(subject, id string, published time.Time, h nats.Header, body []byte, info redeliver.DeadInfo) *nats.Msg {
	// The failure record a swept copy carried is in info (attempts, first failure).
	out := &nats.Msg{Subject: subject, Header: copyHeader(h, func(k string) bool { return k == HeaderFailed }), Data: body}
	out.Header.Set(HeaderID, id)
	if !published.IsZero() {
		out.Header.Set(HeaderPublished, published.UTC().Format(time.RFC3339Nano))
	}
	for k, v := range info.Header() {
		out.Header.Set(k, v)
	}
	return out
}

// deadKey is a dead letter's Nats-Msg-Id in the DLQ stream: the message id and the work
// stream's sequence, so the same stored message is dead-lettered once however often it
// is delivered (a lost Term), while a replayed copy (a new sequence) that fails again is
// a new dead letter.
func deadKey(id, stream string, seq uint64) string {
	return id + "@" + stream + ":" + strconv.FormatUint(seq, 10)
}

// replayKey is a replayed copy's Nats-Msg-Id in the work stream: a second replay of the
// same dead letter (a crash between the publish and the delete) is dropped as a
// duplicate within the work stream's window.
func replayKey(id, dlqStream string, seq uint64) string {
	return id + "@replay:" + dlqStream + ":" + strconv.FormatUint(seq, 10)
}

// sweepKey is the Nats-Msg-Id of an orphan's copy in the work stream: the same stored
// message published again twice (a crash between the publish and the delete) is stored
// once within the work stream's window.
func sweepKey(id, stream string, seq uint64) string {
	return id + "@swept:" + stream + ":" + strconv.FormatUint(seq, 10)
}

// publishedAt returns the first publish time a stored message's HeaderPublished
// carries, zero when it has none.
func publishedAt(h nats.Header) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, h.Get(HeaderPublished))
	return t
}

// toDeadLetter converts a stored dead letter: Published from HeaderPublished (the
// stored copy's own time is the move to the DLQ, DeadLettered).
func toDeadLetter(raw *js.RawStreamMsg, stream, queue string) redeliver.DeadLetter {
	h := appHeader(raw.Header)
	info := redeliver.ParseDeadInfo(h)
	if info.Queue == "" {
		info.Queue = queue
	}
	return redeliver.DeadLetter{
		Message: redeliver.Message{
			ID:          messageID(raw.Header, stream, raw.Sequence),
			Queue:       info.Queue,
			Body:        raw.Data,
			ContentType: raw.Header.Get(HeaderContentType),
			Header:      h,
			Published:   publishedAt(raw.Header),
		},
		Info:         info,
		DeadLettered: raw.Time,
	}
}

// failureKey is a message's key in the failure bucket: its work stream sequence, which
// stays the same across redeliveries and differs for a replayed copy.
func failureKey(seq uint64) string { return strconv.FormatUint(seq, 10) }

// failure is a message's failure record: how many of its attempts failed, and when the
// first one did.
type failure struct {
	attempts int // -1: not known (a record written before records counted attempts)
	first    time.Time
}

// String encodes the record as the bucket and HeaderFailed hold it: "<attempts> <first>".
func (f failure) String() string {
	return strconv.Itoa(f.attempts) + " " + f.first.UTC().Format(time.RFC3339Nano)
}

// parseFailure decodes a failure record. A bare time (an older record's form) has
// attempts -1.
func parseFailure(v string) (failure, bool) {
	n, at, ok := strings.Cut(v, " ")
	if !ok {
		first, err := time.Parse(time.RFC3339Nano, v)
		return failure{attempts: -1, first: first}, err == nil
	}
	attempts, err := strconv.Atoi(n)
	if err != nil || attempts < 0 || attempts >= 1<<30 {
		return failure{}, false
	}
	first, err := time.Parse(time.RFC3339Nano, at)
	return failure{attempts: attempts, first: first}, err == nil
}
