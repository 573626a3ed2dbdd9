package idempotency

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Outcome is what the middleware did with one request, for logs and metrics.
type Outcome string

// Outcomes reported to Config.OnOutcome.
const (
	OutcomePassThrough Outcome = "pass-through" // unkeyed method, or optional key absent
	OutcomeExecuted    Outcome = "executed"     // claimed, ran the handler, stored the response
	OutcomeReplayed    Outcome = "replayed"     // answered from the stored response
	OutcomeConflict    Outcome = "conflict"     // 409: in flight elsewhere
	OutcomeMismatch    Outcome = "mismatch"     // 422: key reused with another request
	OutcomeMissingKey  Outcome = "missing-key"  // 400: required key absent
	OutcomeInvalidKey  Outcome = "invalid-key"  // 400: malformed key
	OutcomeTooLarge    Outcome = "too-large"    // 413: request body over the limit
	OutcomeBadBody     Outcome = "bad-body"     // 400: request body could not be read
	OutcomeReleased    Outcome = "released"     // ran, but the work was not done: key released
	OutcomeAbandoned   Outcome = "abandoned"    // ran, outcome unknown: key left to its lease
	OutcomeStoreError  Outcome = "store-error"  // 503: the store failed (fail closed)
	OutcomeFailedOpen  Outcome = "failed-open"  // store failed, handler ran unprotected
	OutcomeLeaseLost   Outcome = "lease-lost"   // ran, but another request took the key over
)

// Config configures the middleware. The zero value of every field but Store means the
// default documented on it.
type Config struct {
	// Store keeps the records. Required.
	Store Store

	// Methods are the methods that need a key. Default: POST and PATCH. Other methods
	// never touch the store.
	Methods []string

	// KeyOptional lets keyed methods without an Idempotency-Key through unprotected.
	// Default false: a missing key is answered 400.
	KeyOptional bool

	// Scope returns the scope of a request: the user, tenant or credential its keys
	// belong to. Two scopes never share a record. Default: the SHA-256 of the
	// Authorization header (an empty header is the one anonymous scope).
	Scope func(*http.Request) string

	// Lease is how long an in-progress claim is honoured before another request may take
	// it over (its owner is presumed crashed). The middleware renews the lease every
	// Lease/3 while the handler runs. Default 30s.
	Lease time.Duration

	// TTL is how long a record is kept. Default 24h.
	TTL time.Duration

	// MaxBody is the largest request body accepted; larger gets 413 before anything is
	// stored. Default 1 MiB.
	MaxBody int64

	// MaxResponse is the largest response body stored. A larger response is sent to the
	// client and its record completed without the body (the work was done); a replay
	// then says Idempotent-Body-Omitted: true. Default 4 MiB.
	MaxResponse int64

	// CanonicalJSON fingerprints JSON bodies by their content, so key order and white
	// space do not make a retry a mismatch. Default false (the body's bytes).
	CanonicalJSON bool

	// Release reports whether a response says the work was not done, so the key is
	// released and a retry executes again. Default: 429 and 503.
	Release func(status int) bool

	// FailOpen runs the handler unprotected when the store fails. Default false: answer
	// 503 with Retry-After and never run the handler.
	FailOpen bool

	// StoreTimeout bounds each store call. Default 5s.
	StoreTimeout time.Duration

	// Clock returns the current time. Default time.Now.
	Clock func() time.Time

	// Logger receives store failures and lost leases. Default slog.Default().
	Logger *slog.Logger

	// OnOutcome, when set, is called once per request with what the middleware did.
	OnOutcome func(r *http.Request, o Outcome)
}

type middleware struct {
	cfg     Config
	methods map[string]bool
}

// New returns the middleware, or an error when cfg is unusable.
func New(cfg Config) (func(http.Handler) http.Handler, error) {
	if cfg.Store == nil {
		return nil, errors.New("idempotency: Config.Store is nil")
	}
	for _, d := range []struct {
		name string
		v    int64
	}{{"Lease", int64(cfg.Lease)}, {"TTL", int64(cfg.TTL)}, {"MaxBody", cfg.MaxBody},
		{"MaxResponse", cfg.MaxResponse}, {"StoreTimeout", int64(cfg.StoreTimeout)}} {
		if d.v < 0 {
			return nil, fmt.Errorf("idempotency: Config.%s is negative", d.name)
		}
	}
	if len(cfg.Methods) == 0 {
		cfg.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	if cfg.Scope == nil {
		cfg.Scope = AuthorizationScope
	}
	cfg.Lease = orDefault(cfg.Lease, 30*time.Second)
	cfg.TTL = orDefault(cfg.TTL, 24*time.Hour)
	cfg.MaxBody = orDefault(cfg.MaxBody, 1<<20)
	cfg.MaxResponse = orDefault(cfg.MaxResponse, 4<<20)
	cfg.StoreTimeout = orDefault(cfg.StoreTimeout, 5*time.Second)
	if cfg.TTL <= cfg.Lease {
		return nil, fmt.Errorf("idempotency: Config.TTL (%s) must be longer than Config.Lease (%s)", cfg.TTL, cfg.Lease)
	}
	if cfg.Release == nil {
		cfg.Release = func(s int) bool { return s == http.StatusTooManyRequests || s == http.StatusServiceUnavailable }
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m := &middleware{cfg: cfg, methods: map[string]bool{}}
	for _, meth := range cfg.Methods {
		m.methods[strings.ToUpper(meth)] = true
	}
	return m.wrap, nil
}

func orDefault[T int64 | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// AuthorizationScope is the default scope: the SHA-256 of the Authorization header, or
// "" (one anonymous scope) when there is none.
func AuthorizationScope(r *http.Request) string {
	a := r.Header.Get("Authorization")
	if a == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(a))
	return hex.EncodeToString(sum[:])
}

func (m *middleware) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
	})
}

func (m *middleware) outcome(r *http.Request, o Outcome) {
	if m.cfg.OnOutcome != nil {
		m.cfg.OnOutcome(r, o)
	}
}

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if !m.methods[r.Method] {
		m.outcome(r, OutcomePassThrough)
		next.ServeHTTP(w, r)
		return
	}
	values := r.Header.Values("Idempotency-Key")
	if len(values) == 0 {
		if m.cfg.KeyOptional {
			m.outcome(r, OutcomePassThrough)
			next.ServeHTTP(w, r)
			return
		}
		m.outcome(r, OutcomeMissingKey)
		WriteProblem(w, Problem{Type: ProblemMissingKey, Title: "Idempotency-Key required", Status: http.StatusBadRequest,
			Detail: r.Method + " requests to this endpoint need an Idempotency-Key header: a unique value (such as a UUID) generated once per operation and sent again on every retry."}, 0)
		return
	}
	key, err := ParseKey(values[0])
	if err == nil && len(values) > 1 {
		err = errKeyMany
	}
	if err != nil {
		m.outcome(r, OutcomeInvalidKey)
		WriteProblem(w, Problem{Type: ProblemInvalidKey, Title: "Invalid Idempotency-Key", Status: http.StatusBadRequest, Detail: err.Error() + "."}, 0)
		return
	}

	body, err := m.readBody(w, r)
	if err != nil {
		if errors.Is(err, errTooLarge) {
			m.outcome(r, OutcomeTooLarge)
			WriteProblem(w, Problem{Type: ProblemBodyTooLarge, Title: "Request body too large", Status: http.StatusRequestEntityTooLarge,
				Detail: fmt.Sprintf("The request body is larger than %d bytes.", m.cfg.MaxBody)}, 0)
			return
		}
		m.outcome(r, OutcomeBadBody)
		WriteProblem(w, Problem{Type: ProblemBodyUnreadable, Title: "Request body could not be read", Status: http.StatusBadRequest, Detail: err.Error()}, 0)
		return
	}

	scope := m.cfg.Scope(r)
	fp := Fingerprint(r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Content-Type"), body, m.cfg.CanonicalJSON)
	now := m.cfg.Clock()
	sctx, cancel := context.WithTimeout(r.Context(), m.cfg.StoreTimeout)
	res, err := m.cfg.Store.Claim(sctx, ClaimRequest{Scope: scope, Key: key, Fingerprint: fp, Now: now,
		LeaseUntil: now.Add(m.cfg.Lease), ExpiresAt: now.Add(m.cfg.TTL)})
	cancel()
	if err != nil {
		m.cfg.Logger.ErrorContext(r.Context(), "idempotency: claim failed", "key", key, "err", err, "fail_open", m.cfg.FailOpen)
		if m.cfg.FailOpen {
			m.outcome(r, OutcomeFailedOpen)
			setBody(r, body)
			next.ServeHTTP(w, r)
			return
		}
		m.outcome(r, OutcomeStoreError)
		WriteProblem(w, Problem{Type: ProblemStoreUnavailable, Title: "Idempotency store unavailable", Status: http.StatusServiceUnavailable,
			Detail: "The request was not executed. Retry it with the same Idempotency-Key."}, 1)
		return
	}
	if !res.Claimed {
		m.existing(w, r, res.Existing, fp)
		return
	}
	setBody(r, body)
	m.execute(w, r, next, NewClaim(scope, key, fp, res.Token, m.cfg.TTL, m.cfg.Clock))
}

var errTooLarge = errors.New("request body too large")

func (m *middleware) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.ContentLength > m.cfg.MaxBody {
		return nil, errTooLarge
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, m.cfg.MaxBody))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return nil, errTooLarge
	}
	return body, err
}

func setBody(r *http.Request, body []byte) {
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
}

func (m *middleware) existing(w http.ResponseWriter, r *http.Request, rec *Record, fp string) {
	switch {
	case rec.Fingerprint != fp:
		m.outcome(r, OutcomeMismatch)
		WriteProblem(w, Problem{Type: ProblemMismatch, Title: "Idempotency-Key reused", Status: http.StatusUnprocessableEntity,
			Detail: "This Idempotency-Key was already used with a different request (method, path, query or body). Use a new key for a new operation."}, 0)
	case rec.State == StateDone && rec.Response != nil:
		m.outcome(r, OutcomeReplayed)
		Replay(w, rec.Response)
	default:
		m.outcome(r, OutcomeConflict)
		WriteProblem(w, Problem{Type: ProblemInFlight, Title: "Request in flight", Status: http.StatusConflict,
			Detail: "A request with this Idempotency-Key is still being processed. Retry later with the same key to get its result."}, 1)
	}
}

// execute runs the handler as the owner of the claim, then stores or releases the key.
func (m *middleware) execute(w http.ResponseWriter, r *http.Request, next http.Handler, c *Claim) {
	hctx, cancel := context.WithCancelCause(NewContext(r.Context(), c))
	defer cancel(nil)
	stop := m.heartbeat(hctx, cancel, c)
	rec := &recorder{ResponseWriter: w, limit: m.cfg.MaxResponse}

	panicked := true
	defer func() {
		stop()
		if panicked {
			// A panic says the work was not done (or not finished): release the key so a
			// retry runs again, then let the panic go on to the server. A handler that
			// declared the outcome unknown (Abandon) keeps the key to its lease.
			if c.abandoned() {
				m.outcome(r, OutcomeAbandoned)
				return
			}
			m.release(r, c, "handler panicked")
			m.outcome(r, OutcomeReleased)
		}
	}()
	next.ServeHTTP(rec, r.WithContext(hctx))
	panicked = false
	stop()

	completed, release := c.flags()
	switch {
	case completed: // in the handler's transaction; a renewal racing its commit is moot
		m.outcome(r, OutcomeExecuted)
	case errors.Is(context.Cause(hctx), ErrLeaseLost):
		m.outcome(r, OutcomeLeaseLost)
	case c.abandoned():
		m.outcome(r, OutcomeAbandoned)
	case release, rec.wrote() && m.cfg.Release(rec.status),
		!rec.wrote() && r.Context().Err() != nil: // client gone and the handler gave up
		m.release(r, c, "work not done")
		m.outcome(r, OutcomeReleased)
	default:
		switch err := m.complete(r, c, rec.response()); {
		case err == nil:
			m.outcome(r, OutcomeExecuted)
		case errors.Is(err, ErrLeaseLost):
			m.outcome(r, OutcomeLeaseLost)
		default:
			m.outcome(r, OutcomeStoreError)
		}
	}
}

// heartbeat renews the lease every Lease/3 while the handler runs. When the lease is
// lost it cancels the handler's context with ErrLeaseLost. The returned stop waits for
// a renewal in progress, so no renewal races the completion.
func (m *middleware) heartbeat(ctx context.Context, cancel context.CancelCauseFunc, c *Claim) (stop func()) {
	// A timer, not a goroutine and a ticker: most handlers finish long before the first
	// renewal is due, and then the heartbeat cost one timer.
	var (
		mu      sync.Mutex
		stopped bool
		t       *time.Timer
		renewal sync.WaitGroup // a renewal in flight
	)
	renew := func() {
		mu.Lock()
		if stopped {
			mu.Unlock()
			return
		}
		renewal.Add(1)
		mu.Unlock()
		defer renewal.Done()
		sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.StoreTimeout)
		err := m.cfg.Store.Extend(sctx, c.Scope, c.Key, c.Token, m.cfg.Clock().Add(m.cfg.Lease))
		scancel()
		if errors.Is(err, ErrLeaseLost) {
			m.cfg.Logger.WarnContext(ctx, "idempotency: lease lost while the handler ran", "key", c.Key)
			cancel(ErrLeaseLost)
			return
		}
		if err != nil {
			m.cfg.Logger.WarnContext(ctx, "idempotency: lease renewal failed", "key", c.Key, "err", err)
		}
		mu.Lock()
		if !stopped {
			t.Reset(m.cfg.Lease / 3)
		}
		mu.Unlock()
	}
	mu.Lock()
	t = time.AfterFunc(m.cfg.Lease/3, renew)
	mu.Unlock()
	return func() {
		mu.Lock()
		if stopped {
			mu.Unlock()
			return
		}
		stopped = true
		t.Stop()
		mu.Unlock()
		renewal.Wait() // a renewal in flight ends before the request is finished
	}
}

// storeCtx is the context of the calls that finish a request: they must run even when the
// client has gone, or a completed request would be left in progress and run again.
func (m *middleware) storeCtx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(r.Context()), m.cfg.StoreTimeout)
}

// complete stores the response, retrying transient store errors within StoreTimeout.
func (m *middleware) complete(r *http.Request, c *Claim, resp Response) error {
	ctx, cancel := m.storeCtx(r)
	defer cancel()
	comp := c.Completion(resp)
	var err error
	for attempt := 0; ; attempt++ {
		err = m.cfg.Store.Complete(ctx, comp)
		if err == nil {
			return nil
		}
		if errors.Is(err, ErrLeaseLost) {
			if attempt > 0 {
				// An earlier attempt may have succeeded with its answer lost.
				if rec, gerr := m.cfg.Store.Get(ctx, c.Scope, c.Key); gerr == nil && rec.State == StateDone && rec.Token == c.Token {
					return nil
				}
			}
			m.cfg.Logger.WarnContext(r.Context(), "idempotency: response not stored, the key was taken over", "key", c.Key)
			return err
		}
		wait := time.Duration(50<<min(attempt, 4)) * time.Millisecond
		select {
		case <-ctx.Done():
			m.cfg.Logger.ErrorContext(r.Context(), "idempotency: response not stored; the key stays in progress until its lease ends",
				"key", c.Key, "err", err)
			return err
		case <-time.After(wait):
		}
	}
}

func (m *middleware) release(r *http.Request, c *Claim, why string) {
	ctx, cancel := m.storeCtx(r)
	defer cancel()
	if err := m.cfg.Store.Release(ctx, c.Scope, c.Key, c.Token); err != nil && !errors.Is(err, ErrLeaseLost) {
		m.cfg.Logger.ErrorContext(r.Context(), "idempotency: release failed; the key stays in progress until its lease ends",
			"key", c.Key, "why", why, "err", err)
	}
}
