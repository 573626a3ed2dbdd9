package gateway

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/retrysafe/retrysafe/idempotency"
)

// tracedStore is the store as the middlewares of a traced gateway call it: each call
// made for a traced request is a span under that request's server span. Calls made
// for no request (the store probe's pings, the held answers stored after an outage,
// the janitor, whose calls go to the store itself) are not traced: they would be
// traces of their own, one per ping. The wrapper keeps the store's Immediate and
// Pinger, the optional interfaces the middleware asks for (the janitor, the readiness
// probe and the admin endpoints use the Config's store itself).
type tracedStore struct {
	idempotency.Store
	t *tracing
}

// wrapStore returns s with its calls traced, and its Immediate and Pinger kept.
func (t *tracing) wrapStore(s idempotency.Store) idempotency.Store {
	ts := &tracedStore{Store: s, t: t}
	p, ping := s.(idempotency.Pinger)
	_, immediate := s.(idempotency.Immediate)
	switch {
	case ping && immediate:
		return &tracedImmediatePinger{ts, p}
	case ping:
		return &tracedPinger{ts, p}
	case immediate:
		return &tracedImmediate{ts}
	}
	return ts
}

type tracedPinger struct {
	*tracedStore
	p idempotency.Pinger
}

func (s *tracedPinger) Ping(ctx context.Context) error { return s.p.Ping(ctx) }

type tracedImmediate struct{ *tracedStore }

func (*tracedImmediate) Immediate() {}

type tracedImmediatePinger struct {
	*tracedStore
	p idempotency.Pinger
}

func (s *tracedImmediatePinger) Ping(ctx context.Context) error { return s.p.Ping(ctx) }
func (*tracedImmediatePinger) Immediate()                       {}

// begin starts the span of store operation op on the key of scope and key, when ctx is
// a traced request's; nil otherwise.
func (s *tracedStore) begin(ctx context.Context, op idempotency.StoreOp, scope, key string, more ...attribute.KeyValue) (trace.Span, *reqTrace) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return nil, nil
	}
	tracer := s.t.tracer
	if tracer == nil { // WrapStore's: the request's server's own
		tracer = parent.TracerProvider().Tracer(TracerName)
	}
	tr := reqTraceFrom(ctx)
	var hash string
	switch {
	case tr == nil:
		hash = KeyHash(scope, key)
	case op == idempotency.StoreClaim:
		hash = KeyHash(scope, key)
		tr.setKey(hash)
	default: // the request's own key, hashed at its claim
		if hash = tr.key(); hash == "" {
			hash = KeyHash(scope, key)
		}
	}
	attrs := append(make([]attribute.KeyValue, 0, 3+len(more)), s.t.store, AttrStoreOp.String(string(op)), AttrKeyHash.String(hash))
	_, span := tracer.Start(ctx, "store."+string(op), trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(append(attrs, more...)...))
	return span, tr
}

// endStoreSpan ends a store span: an error other than an answer (not found, lease lost)
// marks it failed, with the error's class.
func endStoreSpan(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.SetAttributes(attribute.String("error.type", errorType(err)))
		if !errors.Is(err, idempotency.ErrNotFound) && !errors.Is(err, idempotency.ErrLeaseLost) {
			span.SetStatus(codes.Error, "store call failed")
		}
	}
	span.End()
}

func (s *tracedStore) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	span, tr := s.begin(ctx, idempotency.StoreClaim, req.Scope, req.Key)
	res, err := s.Store.Claim(ctx, req)
	if span != nil && err == nil {
		span.SetAttributes(AttrClaim.String(claimResult(res)))
	}
	endStoreSpan(span, err)
	if tr != nil {
		tr.claimed(time.Now())
	}
	return res, err
}

// claimResult names what a claim found: claimed, took-over, or the state of the record
// that kept it (in-progress, done).
func claimResult(res idempotency.ClaimResult) string {
	switch {
	case res.TookOver:
		return "took-over"
	case res.Claimed:
		return "claimed"
	case res.Existing != nil && res.Existing.State == idempotency.StateDone:
		return "done"
	}
	return "in-progress"
}

func (s *tracedStore) Extend(ctx context.Context, scope, key string, token int64, lease time.Duration) error {
	span, _ := s.begin(ctx, idempotency.StoreExtend, scope, key)
	err := s.Store.Extend(ctx, scope, key, token, lease)
	endStoreSpan(span, err)
	return err
}

func (s *tracedStore) Abandon(ctx context.Context, scope, key string, token int64) error {
	span, _ := s.begin(ctx, idempotency.StoreAbandon, scope, key)
	err := s.Store.Abandon(ctx, scope, key, token)
	endStoreSpan(span, err)
	return err
}

func (s *tracedStore) Complete(ctx context.Context, c idempotency.Completion) error {
	span, _ := s.begin(ctx, idempotency.StoreComplete, c.Scope, c.Key, attribute.Int("http.response.status_code", c.Response.Status))
	err := s.Store.Complete(ctx, c)
	endStoreSpan(span, err)
	return err
}

func (s *tracedStore) Release(ctx context.Context, scope, key string, token int64) error {
	span, _ := s.begin(ctx, idempotency.StoreRelease, scope, key)
	err := s.Store.Release(ctx, scope, key, token)
	endStoreSpan(span, err)
	return err
}

func (s *tracedStore) Get(ctx context.Context, scope, key string) (*idempotency.Record, error) {
	span, _ := s.begin(ctx, idempotency.StoreGet, scope, key)
	rec, err := s.Store.Get(ctx, scope, key)
	endStoreSpan(span, err)
	return rec, err
}

func (s *tracedStore) Delete(ctx context.Context, scope, key string) error {
	span, _ := s.begin(ctx, "delete", scope, key)
	err := s.Store.Delete(ctx, scope, key)
	endStoreSpan(span, err)
	return err
}
