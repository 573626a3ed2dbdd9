package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/retrysafe/retrysafe/internal/dueq"
	"github.com/retrysafe/retrysafe/internal/httpname"
)

// Outcome is what the middleware did with one request, for logs and metrics.
type Outcome string

// Outcomes reported to Config.OnOutcome.
const (
	OutcomePassThrough   Outcome = "pass-through"      // unkeyed method, or optional key absent
	OutcomeExecuted      Outcome = "executed"          // claimed, ran the handler, stored the response
	OutcomeStoredLater   Outcome = "stored-later"      // ran; the store was unreachable, the response is held and stored when it answers
	OutcomeDoneAborted   Outcome = "done-aborted"      // stored, then the handler panicked: the client's connection was cut, a retry gets the replay
	OutcomeReplayed      Outcome = "replayed"          // answered from the stored response
	OutcomeConflict      Outcome = "conflict"          // 409: in flight elsewhere
	OutcomeMismatch      Outcome = "mismatch"          // 422: key reused with another request
	OutcomeMissingKey    Outcome = "missing-key"       // 400: required key absent
	OutcomeInvalidKey    Outcome = "invalid-key"       // 400: malformed key
	OutcomeInvalidMethod Outcome = "invalid-method"    // 400: a keyed method in another case (post)
	OutcomeTooLarge      Outcome = "too-large"         // 413: request body over the limit
	OutcomeBadBody       Outcome = "bad-body"          // 400: request body could not be read
	OutcomeBodyTimeout   Outcome = "body-timeout"      // 408: request body not received within BodyTimeout
	OutcomeOverloaded    Outcome = "overloaded"        // 503: bodies in memory (requests' and answers') at MaxBodyMemory
	OutcomeDeadline      Outcome = "deadline-exceeded" // 504: the request's deadline passed before it could run
	OutcomeClientGone    Outcome = "client-gone"       // the client left before any answer; nothing stored
	OutcomeReleased      Outcome = "released"          // ran, but the work was not done: key released
	OutcomeAbandoned     Outcome = "abandoned"         // ran, outcome unknown: key left to its lease
	OutcomeStoreError    Outcome = "store-error"       // 503: the store failed (fail closed)
	OutcomeNotDurable    Outcome = "store-not-durable" // 503: the store cannot make writes durable now (fail closed)
	OutcomeFailedOpen    Outcome = "failed-open"       // store failed, handler ran unprotected
	OutcomeLeaseLost     Outcome = "lease-lost"        // ran, but another request took the key over
)

// The defaults of Config, declared once: the gateway and the command line read them
// from here.
const (
	DefaultLease         = 30 * time.Second
	DefaultTTL           = 24 * time.Hour
	DefaultMaxBody       = 1 << 20
	DefaultMaxResponse   = 4 << 20
	DefaultStoreTimeout  = 5 * time.Second
	DefaultBodyTimeout   = 30 * time.Second
	DefaultMaxBodyMemory = 256 << 20
)

// DefaultKeyHeader is the header a key is read from by default.
const DefaultKeyHeader = "Idempotency-Key"

// DefaultMethods are the methods that need a key by default.
func DefaultMethods() []string { return []string{http.MethodPost, http.MethodPatch} }

// Config configures the middleware. The zero value of every field but Store means the
// default documented on it.
type Config struct {
	// Store keeps the records. Required.
	Store Store

	// Route is what the records of this middleware are filed under, for operators'
	// tools (Record.Route, ListFilter.Route): the gateway sets each route's pattern.
	// It decides nothing: a key is one record whatever its route. Default "": none.
	Route string

	// Methods are the methods that need a key, in upper case (they are upper-cased).
	// Default: POST and PATCH. Other methods never touch the store. Method names are
	// case-sensitive (RFC 9110); a request whose method is a keyed method in another
	// case (post) is answered 400, since many servers would treat it as the keyed
	// method.
	Methods []string

	// KeyHeader names the request header the key is read from. Default
	// DefaultKeyHeader (Idempotency-Key); another name suits senders that key their
	// requests their own way (X-GitHub-Delivery).
	KeyHeader string

	// KeyPointer, when set, reads the key from the request's JSON body at this JSON
	// pointer (RFC 6901), such as "/id" of a Stripe event, instead of from KeyHeader:
	// inbound webhooks carry their sender's event id in the body, and their senders
	// retry with it. The value is a string or a number of 1 to 255 visible ASCII
	// characters. A body that is not JSON, or has no such member, has no key (400, or
	// passed through with KeyOptional). Default "": the key is in KeyHeader.
	KeyPointer string

	// FingerprintIgnore lists JSON pointers to object members removed from a JSON body
	// before it is fingerprinted (the rest canonically, as with CanonicalJSON): fields
	// a sender changes on every retry, such as a delivery timestamp, so that its
	// retries are replays, not 422s. Default none.
	FingerprintIgnore []string

	// KeyOptional lets keyed methods without an Idempotency-Key through unprotected.
	// Default false: a missing key is answered 400.
	KeyOptional bool

	// Scope returns the scope of a request: the user, tenant or credential its keys
	// belong to. Two scopes never share a record. Default: the SHA-256 of the
	// Authorization header (an empty header is the one anonymous scope).
	Scope func(*http.Request) string

	// Lease is how long an in-progress claim is honoured before another request may take
	// it over (its owner is presumed crashed). The middleware renews the lease every
	// Lease/3 while the handler runs. Default DefaultLease (30s).
	Lease time.Duration

	// TTL is how long a record is kept. Longer than Lease. Default DefaultTTL (24h).
	TTL time.Duration

	// MaxBody is the largest request body accepted; larger gets 413 before anything is
	// stored. Default DefaultMaxBody (1 MiB).
	MaxBody int64

	// BodyTimeout bounds the reading of a request body (within the request's deadline,
	// when it has one): a body not received in time gets 408 before anything is
	// claimed. It needs a writer that supports http.ResponseController's
	// SetReadDeadline, as net/http's does. Default DefaultBodyTimeout (30s).
	BodyTimeout time.Duration

	// MaxBodyMemory is the ceiling on the body bytes all keyed requests together hold in
	// memory, both ways, through this middleware and those made from it with With: the
	// request bodies (read to be fingerprinted), the answers kept until they are stored
	// and sent (up to MaxResponse each), those held because the store could not take them
	// yet, and the stored answers being replayed. A new request whose body would pass
	// it, or that arrives while it is passed, gets 503 with Retry-After before anything
	// is claimed. An answer being received is never cut: it is finished and sent whole
	// even past the ceiling, and keeps new requests out until it is sent. A handler that
	// needs its request body no more (the gateway, once the upstream has it) can drop it
	// (Claim.DropBody), so that its bytes are room for the answer: a request and its
	// answer then count the larger of the two, not both. One ceiling for both ways, since
	// it is the process's memory it protects. Default DefaultMaxBodyMemory (256 MiB).
	MaxBodyMemory int64

	// MaxResponse is the largest response body stored. A larger response is sent to the
	// client and its record completed without the body (the work was done); a replay
	// then says Idempotent-Body-Omitted: true. Responses up to this size are held until
	// stored and then sent whole, so a client never sees an answer its retry might not
	// get again. Default DefaultMaxResponse (4 MiB).
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

	// Conflict is what a request does when it finds its key in progress with the same
	// request: ConflictReject (409 with Retry-After) or ConflictWait (wait for the answer,
	// and replay it). Default (the zero value) ConflictReject, the IETF draft's answer;
	// retrysafe gateway defaults to ConflictWait.
	Conflict Conflict

	// WaitTimeout bounds a ConflictWait wait, within the request's deadline; at the bound
	// the request is answered 409 with Retry-After. Default DefaultWaitTimeout (10s).
	WaitTimeout time.Duration

	// MaxWaiters and MaxWaitersPerKey bound the ConflictWait waiters of this process, in
	// all and for one key; past them a duplicate is answered 409 with Retry-After at
	// once. A waiter holds its request's body (counted in MaxBodyMemory), its
	// goroutine and two timers, and claims again from the store (with backoff, at most
	// every second) while its key's owner is in another process. Middlewares made with With share one MaxWaiters, over all
	// their waiters, and each checks its own MaxWaitersPerKey against all the key's.
	// Defaults DefaultMaxWaiters (1024) and DefaultMaxWaitersPerKey (128).
	MaxWaiters, MaxWaitersPerKey int

	// StoreTimeout bounds each store call (but those of an Immediate store, which do not
	// wait). Default DefaultStoreTimeout (5s).
	StoreTimeout time.Duration

	// Logger receives store failures and lost leases. Default slog.Default().
	Logger *slog.Logger

	// OnOutcome, when set, is called once per request with what the middleware did: the
	// Outcome that Serve returns, or, when the handler panicked, the one of the cleanup
	// the middleware did before the panic went on.
	OnOutcome func(r *http.Request, o Outcome)

	// OnStoreCall, when set, is called after every store call the middleware makes, with
	// the operation (one of the StoreOp constants), how long it took and its error, so
	// that a caller can time the store without wrapping it.
	OnStoreCall func(op StoreOp, took time.Duration, err error)
}

// StoreOp names a store operation in Config.OnStoreCall.
type StoreOp string

// The store operations the middleware makes.
const (
	StoreClaim    StoreOp = "claim"
	StoreExtend   StoreOp = "extend"
	StoreComplete StoreOp = "complete"
	StoreRelease  StoreOp = "release"
	StoreAbandon  StoreOp = "abandon"
	StoreGet      StoreOp = "get"
	StorePing     StoreOp = "ping"
)

// ErrAborted is returned by Serve when the handler aborted its response (Claim.Abort):
// its body broke off, so the client must not take what it received for a whole
// answer. The caller must cut the client's connection; under net/http that is
// panic(http.ErrAbortHandler), which is what Handler does.
var ErrAborted = errors.New("idempotency: the response was aborted; the client's connection must be cut")

// Middleware is the Idempotency-Key middleware. Make one with New (and, for other
// policies over the same store, more with With), wrap handlers with Handler, and call
// Shutdown when the server has stopped: it stores the responses the store could not take
// when their requests finished, and stops the store probe.
type Middleware struct {
	cfg       Config
	methods   map[string]bool
	immediate bool // cfg.Store is Immediate: its calls get no StoreTimeout

	keyPointer pointer                // Config.KeyPointer, parsed; nil: the key is in a header
	ignore     []pointer              // Config.FingerprintIgnore, parsed
	beats      dueq.Queue[*execution] // the running handlers' lease renewals (heartbeat.go)

	*shared
}

// shared is what the process knows and holds of one store, common to every middleware
// over it (New's and those made from it by With), whatever their policies: what one of
// them learns or holds must hold for all, or the guarantees break. The store's health
// decides takeovers (a middleware that missed the outage another saw would take over a
// key whose live owner is still trying to store its answer); a held response must answer
// a retry whichever route it arrives at; the waiters of a key are woken by its owner in
// any of them (one key is one record); and MaxBodyMemory and MaxWaiters bound the
// process, not a route.
type shared struct {
	health  *health
	bodies  bodyBudget
	waiting waiters // requests waiting for keys in progress (ConflictWait)

	prober     *Middleware // the one New made: the probe's pings are its store calls
	probeOnce  sync.Once
	probeCtx   context.Context
	probeStop  context.CancelFunc
	flushCtx   context.Context // ends when Shutdown gives up on held responses
	flushStop  context.CancelFunc
	bg         sync.WaitGroup // the probe and the flushes of held responses
	unstored   atomic.Int64   // held responses given up on at shutdown
	shutdownMu sync.Mutex

	mu      sync.Mutex
	pending map[scopeKey]*pending

	claimIDs claimIDs
}

// New returns the middleware, or an error when cfg is unusable.
func New(cfg Config) (*Middleware, error) {
	if cfg.Store == nil {
		return nil, errors.New("idempotency: Config.Store is nil")
	}
	cfg, err := cfg.Resolve()
	if err != nil {
		return nil, err
	}
	sh := &shared{health: newHealth(cfg.Lease), claimIDs: newClaimIDs()}
	sh.bodies.max = cfg.MaxBodyMemory
	sh.probeCtx, sh.probeStop = context.WithCancel(context.Background())
	sh.flushCtx, sh.flushStop = context.WithCancel(context.Background())
	m := newMiddleware(cfg, sh)
	sh.prober = m
	return m, nil
}

// With returns a middleware with cfg's policy over m's store, sharing with m (and with
// every middleware m shares it with) what the process knows and holds of that store: its
// health, which decides takeovers; the store probe; the responses held because the store
// could not take them, which answer a retry through any of them; the waiters of a key,
// woken by its owner in any of them; and the bounds MaxBodyMemory and MaxWaiters. It is
// for several policies over one store, such as a gateway's routes, and for their rebuild
// when a configuration is reloaded: in one process, make every middleware over a store
// from the first with With, not another with New.
//
// cfg.Store must be nil or m's Store (the same value, ==): state over one store is not
// shared with another. cfg.MaxBodyMemory and cfg.MaxWaiters bound every middleware
// sharing the state, so they must be zero or equal to m's, and the result has m's.
// Everything else is cfg's own, with the defaults and checks of New: Route, Methods, the key and
// scope, Lease, TTL, the limits, the conflict policy and MaxWaitersPerKey, Logger,
// OnOutcome and OnStoreCall (zero means the default, not m's).
//
// A middleware with another Lease makes the whole group more cautious, never less, for
// as long as the group lives: after the store was seen failing, takeovers are held back
// for the group's longest lease (the time its slowest-renewing owner needs to renew);
// a store call counts as slow, and contact as lost, by its shortest lease, and the probe
// pings every third of it. The probe's pings are store calls of the middleware New made
// (its StoreTimeout and OnStoreCall). Shutdown on any middleware of the group is the
// group's.
func (m *Middleware) With(cfg Config) (*Middleware, error) {
	switch {
	case cfg.Store != nil && !sameStore(cfg.Store, m.cfg.Store):
		return nil, errors.New("idempotency: With: Config.Store is not the middleware's Store (leave it nil to share it)")
	case cfg.MaxBodyMemory != 0 && cfg.MaxBodyMemory != m.cfg.MaxBodyMemory:
		return nil, fmt.Errorf("idempotency: With: Config.MaxBodyMemory (%d) is not the middleware's (%d): it bounds every middleware sharing the store", cfg.MaxBodyMemory, m.cfg.MaxBodyMemory)
	case cfg.MaxWaiters != 0 && cfg.MaxWaiters != m.cfg.MaxWaiters:
		return nil, fmt.Errorf("idempotency: With: Config.MaxWaiters (%d) is not the middleware's (%d): it bounds every middleware sharing the store", cfg.MaxWaiters, m.cfg.MaxWaiters)
	}
	cfg.Store, cfg.MaxBodyMemory, cfg.MaxWaiters = m.cfg.Store, m.cfg.MaxBodyMemory, m.cfg.MaxWaiters
	cfg, err := cfg.Resolve()
	if err != nil {
		return nil, err
	}
	m.health.widen(cfg.Lease)
	return newMiddleware(cfg, m.shared), nil
}

// sameStore reports whether a and b are the same store; a store whose value cannot be
// compared is not the same as any.
func sameStore(a, b Store) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return a == b
}

// newMiddleware returns the middleware of the resolved cfg over sh.
func newMiddleware(cfg Config, sh *shared) *Middleware {
	m := &Middleware{cfg: cfg, methods: map[string]bool{}, shared: sh}
	m.beats.Init(cfg.Lease/3, (*execution).renew)
	_, m.immediate = cfg.Store.(Immediate)
	for _, meth := range cfg.Methods {
		m.methods[meth] = true
	}
	if cfg.KeyPointer != "" {
		m.keyPointer, _ = parsePointer(cfg.KeyPointer) // checked by Resolve
	}
	for _, ig := range cfg.FingerprintIgnore {
		p, _ := parsePointer(ig)
		m.ignore = append(m.ignore, p)
	}
	return m
}

// Resolve returns cfg with the defaults applied, or the error New would return for it
// (but for a missing Store): the one place the middleware's options are checked and
// defaulted, which the gateway and the command line use too.
func (cfg Config) Resolve() (Config, error) {
	for _, d := range []struct {
		name string
		v    int64
	}{{"Lease", int64(cfg.Lease)}, {"TTL", int64(cfg.TTL)}, {"MaxBody", cfg.MaxBody},
		{"BodyTimeout", int64(cfg.BodyTimeout)}, {"MaxBodyMemory", cfg.MaxBodyMemory},
		{"MaxResponse", cfg.MaxResponse}, {"StoreTimeout", int64(cfg.StoreTimeout)}} {
		if d.v < 0 {
			return cfg, fmt.Errorf("idempotency: Config.%s is negative", d.name)
		}
	}
	methods := cfg.Methods
	if len(methods) == 0 {
		methods = DefaultMethods()
	}
	cfg.Methods = make([]string, 0, len(methods))
	for _, meth := range methods {
		if !httpname.Valid(meth) {
			return cfg, fmt.Errorf("idempotency: Config.Methods: %q is not a method", meth)
		}
		if meth = asciiUpper(meth); !slices.Contains(cfg.Methods, meth) {
			cfg.Methods = append(cfg.Methods, meth)
		}
	}
	if cfg.Scope == nil {
		cfg.Scope = AuthorizationScope
	}
	if cfg.KeyHeader == "" {
		cfg.KeyHeader = DefaultKeyHeader
	}
	if !httpname.Valid(cfg.KeyHeader) {
		return cfg, fmt.Errorf("idempotency: Config.KeyHeader %q is not a header name", cfg.KeyHeader)
	}
	if cfg.KeyPointer != "" {
		if p, err := parsePointer(cfg.KeyPointer); err != nil || len(p) == 0 {
			return cfg, fmt.Errorf("idempotency: Config.KeyPointer %q must name a member of the body (/id)", cfg.KeyPointer)
		}
	}
	for _, ig := range cfg.FingerprintIgnore {
		if p, err := parsePointer(ig); err != nil || len(p) == 0 {
			return cfg, fmt.Errorf("idempotency: Config.FingerprintIgnore: %q must name a member of the body (/timestamp)", ig)
		}
	}
	conflict, err := ParseConflict(string(cfg.Conflict))
	if err != nil {
		return cfg, err
	}
	cfg.Conflict = conflict
	if cfg.WaitTimeout < 0 || cfg.MaxWaiters < 0 || cfg.MaxWaitersPerKey < 0 {
		return cfg, errors.New("idempotency: Config.WaitTimeout, MaxWaiters and MaxWaitersPerKey must not be negative")
	}
	cfg.WaitTimeout = orDefault(cfg.WaitTimeout, DefaultWaitTimeout)
	cfg.MaxWaiters = orDefault(cfg.MaxWaiters, DefaultMaxWaiters)
	cfg.MaxWaitersPerKey = orDefault(cfg.MaxWaitersPerKey, DefaultMaxWaitersPerKey)
	cfg.Lease = orDefault(cfg.Lease, DefaultLease)
	cfg.TTL = orDefault(cfg.TTL, DefaultTTL)
	cfg.MaxBody = orDefault(cfg.MaxBody, DefaultMaxBody)
	cfg.BodyTimeout = orDefault(cfg.BodyTimeout, DefaultBodyTimeout)
	cfg.MaxBodyMemory = orDefault(cfg.MaxBodyMemory, DefaultMaxBodyMemory)
	cfg.MaxResponse = orDefault(cfg.MaxResponse, DefaultMaxResponse)
	cfg.StoreTimeout = orDefault(cfg.StoreTimeout, DefaultStoreTimeout)
	if cfg.TTL <= cfg.Lease {
		return cfg, fmt.Errorf("idempotency: Config.TTL (%s) must be longer than Config.Lease (%s)", cfg.TTL, cfg.Lease)
	}
	if cfg.MaxBodyMemory < cfg.MaxBody {
		return cfg, fmt.Errorf("idempotency: Config.MaxBodyMemory (%d) is smaller than Config.MaxBody (%d)", cfg.MaxBodyMemory, cfg.MaxBody)
	}
	if cfg.Release == nil {
		cfg.Release = func(s int) bool { return s == http.StatusTooManyRequests || s == http.StatusServiceUnavailable }
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg, nil
}

func orDefault[T int | int64 | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// Handler returns next wrapped in the middleware: Serve, and a cut connection when the
// handler aborted its response.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := m.Serve(w, r, next); errors.Is(err, ErrAborted) {
			panic(http.ErrAbortHandler)
		}
	})
}

// Config returns the middleware's configuration with its defaults applied.
func (m *Middleware) Config() Config { return m.cfg }

// Serve handles one request: a request that needs no key goes to next as it is; a keyed
// one is claimed, and next runs only as the owner of its key, or it is answered from the
// store (a replay, 409, 422) or refused (400, 408, 413, 503, 504). It returns what it
// did, which it also reports to Config.OnOutcome. The error is ErrAborted when the
// handler aborted its response (nothing more of it was sent: the caller must cut the
// client's connection), nil otherwise. A handler that panics has the key released (or
// kept, if it was stored or abandoned) and the panic goes on.
func (m *Middleware) Serve(w http.ResponseWriter, r *http.Request, next http.Handler) (Outcome, error) {
	o, err := m.serve(w, r, next)
	m.report(r, o)
	return o, err
}

// Shutdown stops the store probe and waits, until ctx ends, for the responses held
// because the store could not take them to be stored. Call it after the server has
// stopped serving. It logs each held response it could not store (their keys stay in
// progress until their leases end, and a retry then runs the request again) and
// returns an error saying how many there were.
//
// The probe and the held responses are those of every middleware sharing m's store state
// (New's and those made with With): Shutdown on any of them is the group's, so call it
// once, when nothing serves through any of them any more.
func (m *Middleware) Shutdown(ctx context.Context) error {
	m.shutdownMu.Lock()
	defer m.shutdownMu.Unlock()
	m.probeOnce.Do(func() {}) // no probe starts after this
	m.probeStop()
	done := make(chan struct{})
	go func() {
		m.bg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		m.flushStop()
		<-done
	}
	if n := m.unstored.Load(); n > 0 {
		return fmt.Errorf("idempotency: %d responses not stored before shutdown: %w", n, ctx.Err())
	}
	return nil
}

// HeaderScope returns a scope that is the value of the named header, as set by the
// authentication layer in front (which must overwrite any value a client sends: the
// header is trusted as it is).
func HeaderScope(name string) func(*http.Request) string {
	return func(r *http.Request) string { return r.Header.Get(name) }
}

// CookieScope returns a scope that is the SHA-256 of the named cookie's value, for an
// endpoint whose callers authenticate with a session cookie rather than an
// Authorization header; a request without the cookie is the one anonymous scope "".
func CookieScope(name string) func(*http.Request) string {
	return func(r *http.Request) string {
		c, err := r.Cookie(name)
		if err != nil || c.Value == "" {
			return ""
		}
		return sha256Hex(c.Value)
	}
}

// NoScope puts every request in one scope: for senders authenticated another way (a
// webhook's signature) whose keys are unique across them.
func NoScope(*http.Request) string { return "" }

// AuthorizationScope is the default scope: the SHA-256 of the Authorization header, or
// "" (one anonymous scope) when there is none.
func AuthorizationScope(r *http.Request) string {
	a := r.Header.Get("Authorization")
	if a == "" {
		return ""
	}
	return sha256Hex(a)
}

// sha256Hex returns the SHA-256 of s in hexadecimal, in one allocation: the string's.
func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	var digits [2 * sha256.Size]byte
	hex.Encode(digits[:], sum[:])
	return string(digits[:])
}

func (m *Middleware) report(r *http.Request, o Outcome) {
	if m.cfg.OnOutcome != nil {
		m.cfg.OnOutcome(r, o)
	}
}

// startProbe starts the store probe on the first keyed request of any middleware of the
// group (a store that cannot be pinged learns only from requests). Its pings are store
// calls of the middleware New made, so that they go to one StoreTimeout and one
// OnStoreCall whichever route's request started the probe. The probe pings at once.
func (m *Middleware) startProbe() {
	m.probeOnce.Do(func() {
		p, ok := m.cfg.Store.(Pinger)
		if !ok {
			return
		}
		m.bg.Add(1)
		go func() {
			defer m.bg.Done()
			m.prober.probe(m.probeCtx, p)
		}()
	})
}

// storeCall runs one store operation bounded by StoreTimeout (unless the store is
// Immediate), reports it to OnStoreCall, and records what it says of the store's health.
// A call cut short by ctx (the client left) says nothing of the store's health.
func (m *Middleware) storeCall(ctx context.Context, op StoreOp, f func(context.Context) error) error {
	start := time.Now()
	var err error
	if m.immediate {
		err = f(ctx)
	} else {
		sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
		err = f(sctx)
		cancel()
	}
	// One reading for the hook and the health both, of the monotonic clock only (Since),
	// at half the cost of time.Now.
	end := start.Add(time.Since(start))
	if m.cfg.OnStoreCall != nil {
		m.cfg.OnStoreCall(op, end.Sub(start), err)
	}
	if ctx.Err() == nil {
		m.health.observe(start, end, err)
	}
	m.noteDurability(op, err)
	return err
}

// asciiUpper returns s in upper case, ASCII letters only (methods are tokens).
func asciiUpper(s string) string {
	for i := 0; i < len(s); i++ {
		if 'a' <= s[i] && s[i] <= 'z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if 'a' <= b[j] && b[j] <= 'z' {
					b[j] -= 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

// serve is Serve without the report. Each of its answers is one Outcome.
func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) (Outcome, error) {
	if !m.methods[r.Method] {
		if upper := asciiUpper(r.Method); upper != r.Method && m.methods[upper] {
			WriteProblem(w, Problem{Type: ProblemInvalidMethod, Title: "Method not in canonical case", Status: http.StatusBadRequest,
				Detail: fmt.Sprintf("Method names are case-sensitive: send %s, not %s. Many servers would run %s as %s, so it is refused rather than forwarded without its Idempotency-Key check.", upper, r.Method, r.Method, upper)}, 0)
			return OutcomeInvalidMethod, nil
		}
		next.ServeHTTP(w, r)
		return OutcomePassThrough, nil
	}
	if p := rpcProtocolOf(r); p != rpcNone {
		w = &rpcWriter{ResponseWriter: w, proto: p, contentType: r.Header.Get("Content-Type")}
	}
	var key string
	if m.keyPointer == nil {
		values := r.Header.Values(m.cfg.KeyHeader)
		if len(values) == 0 {
			return m.noKey(w, r, next, nil)
		}
		k, err := ParseKey(values[0])
		if err == nil && len(values) > 1 {
			err = errKeyMany
		}
		if err != nil {
			return m.invalidKey(w, err), nil
		}
		key = k
	}
	body, reserved, err := m.readBody(w, r)
	defer m.bodies.give(reserved)
	// One return below the defer (see execute).
	return m.serveBody(w, r, next, key, body, err)
}

// serveBody is serve once the body is read (err: why it could not be).
func (m *Middleware) serveBody(w http.ResponseWriter, r *http.Request, next http.Handler, key string, body []byte, err error) (Outcome, error) {
	if err == nil {
		err = r.Context().Err()
	}
	if err != nil {
		return m.refuse(w, r, err), nil
	}
	if m.keyPointer != nil {
		k, err := bodyKey(body, m.keyPointer)
		switch {
		case errors.Is(err, errBodyKeyMissing):
			return m.noKey(w, r, next, body)
		case err != nil:
			return m.invalidKey(w, err), nil
		}
		key = k
	}

	m.startProbe()
	scope := m.cfg.Scope(r)
	fp := fingerprint(r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Get("Content-Type"), body, m.cfg.CanonicalJSON, m.ignore)
	if p := m.pendingFor(scope, key); p != nil {
		return m.answerHeld(w, p, fp), nil
	}
	if m.health.notDurable() {
		return m.notDurable(w), nil
	}
	req := ClaimRequest{Scope: scope, Key: key, Fingerprint: fp, Lease: m.cfg.Lease, TTL: m.cfg.TTL, Route: m.cfg.Route,
		NoTakeover: true, ID: m.claimIDs.next()}
	res, wait, err := m.claim(r.Context(), req)
	if err == nil && m.mustWait(res, fp, m.cfg.WaitTimeout) {
		var held *pending
		if res, wait, held, err = m.await(r.Context(), req, res, wait); held != nil {
			return m.answerHeld(w, held, fp), nil
		}
	}
	if err != nil {
		// The claim may have been applied with its answer lost: release it, so that the
		// key is not left in progress for a lease with nobody working on it.
		m.unclaim(req)
		if r.Context().Err() != nil { // the client left, or the deadline passed: not the store's fault
			return m.refuse(w, r, r.Context().Err()), nil
		}
		m.cfg.Logger.ErrorContext(r.Context(), "idempotency: claim failed", "key", key, "err", err, "fail_open", m.cfg.FailOpen)
		if m.cfg.FailOpen {
			setBody(r, body)
			next.ServeHTTP(w, r)
			return OutcomeFailedOpen, nil
		}
		if errors.Is(err, ErrNotDurable) {
			return m.notDurable(w), nil
		}
		WriteProblem(w, Problem{Type: ProblemStoreUnavailable, Title: "Idempotency store unavailable", Status: http.StatusServiceUnavailable,
			Detail: "The request was not executed. Retry it with the same Idempotency-Key."}, 1)
		return OutcomeStoreError, nil
	}
	if !res.Claimed {
		return m.existing(w, res, fp, wait), nil
	}
	rb := setBody(r, body)
	return m.execute(w, r, rb, next, scope, key, fp, res.Token)
}

// claim claims req's key. A key whose owner's lease ran out is taken over only by a
// second claim, bound to the store's clock as the first one read it: the first never
// takes over (NoTakeover), and the second may only within a third of a lease of the
// instant the first was decided at (TakeoverBy), so that a claim the network or a client
// library delivers late takes nothing over on old knowledge, and only when this process
// has seen the store answer for a whole lease since it last failed (health), so that an
// owner cut off by an outage has had the time to renew, and for a whole lease since its
// first claim (health.settling), so that a process started after an outage it never saw
// does not take over the key of an owner that could not renew through it. The third is
// of the shortest lease of the middlewares sharing the store's health, as health judges
// slowness by it: the knowledge a takeover is decided on is no older than the probe
// keeps it. wait is how long takeovers are still held back.
func (m *Middleware) claim(ctx context.Context, req ClaimRequest) (res ClaimResult, wait time.Duration, err error) {
	call := func() error {
		return m.storeCall(ctx, StoreClaim, func(sctx context.Context) (err error) {
			res, err = m.cfg.Store.Claim(sctx, req)
			return err
		})
	}
	start := time.Now()
	if err := call(); err != nil {
		return res, 0, err
	}
	if res.Claimed {
		m.health.heard(res.Now) // the first word from the store starts settling's count
		return res, 0, nil
	}
	wait = max(m.health.takeoverWait(), m.health.settling(res.Now))
	fresh := m.health.shortestLease() / 3
	rec := res.Existing
	if wait > 0 || time.Since(start) >= fresh || rec.State != StateInProgress || rec.LeaseUntil.After(res.Now) ||
		rec.Fingerprint != req.Fingerprint && rec.ExpiresAt.After(res.Now) {
		return res, wait, nil
	}
	req.NoTakeover, req.TakeoverBy = false, res.Now.Add(fresh)
	err = call()
	return res, 0, err
}

// noKey answers a keyed request that has no key: 400, or, with KeyOptional, it goes to
// next unprotected (with its body, when it was read to look for the key).
func (m *Middleware) noKey(w http.ResponseWriter, r *http.Request, next http.Handler, body []byte) (Outcome, error) {
	if m.cfg.KeyOptional {
		if body != nil {
			setBody(r, body)
		}
		next.ServeHTTP(w, r)
		return OutcomePassThrough, nil
	}
	p := Problem{Type: ProblemMissingKey, Title: "Idempotency-Key required", Status: http.StatusBadRequest,
		Detail: r.Method + " requests to this endpoint need an " + m.cfg.KeyHeader + " header: a unique value (such as a UUID) generated once per operation and sent again on every retry."}
	switch {
	case m.keyPointer != nil:
		p.Title = "Key missing from the body"
		p.Detail = r.Method + " requests to this endpoint are keyed by the member of their JSON body at " + m.cfg.KeyPointer +
			" (a JSON pointer), which this body lacks or is not JSON with: the request was not executed."
	case m.senderKeyed():
		p.Title = m.cfg.KeyHeader + " required"
		p.Detail = r.Method + " requests to this endpoint are keyed by their " + m.cfg.KeyHeader +
			" header, which this request lacks: the request was not executed."
	}
	WriteProblem(w, p, 0)
	return OutcomeMissingKey, nil
}

// senderKeyed reports whether requests are keyed the way their sender keys them (a
// webhook's event id in the body, or its delivery header such as X-GitHub-Delivery)
// rather than with an Idempotency-Key their client makes: the answers to a request
// without its key, or with a malformed one, then name where the key was expected and
// give no advice on making keys, which such a sender does not take.
func (m *Middleware) senderKeyed() bool {
	return m.keyPointer != nil || http.CanonicalHeaderKey(m.cfg.KeyHeader) != DefaultKeyHeader
}

// invalidKey answers a request whose key is malformed. ParseKey's errors name the
// default header; a key read from another names that one, so that the sender can tell
// which header to fix.
func (m *Middleware) invalidKey(w http.ResponseWriter, err error) Outcome {
	detail := err.Error()
	if m.keyPointer == nil && m.cfg.KeyHeader != DefaultKeyHeader {
		detail = strings.ReplaceAll(detail, DefaultKeyHeader, m.cfg.KeyHeader)
	}
	title := "Invalid Idempotency-Key"
	switch {
	case m.keyPointer != nil:
		title, detail = "Invalid key in the body", "At "+m.cfg.KeyPointer+": "+detail
	case m.senderKeyed():
		title = "Invalid " + m.cfg.KeyHeader
	}
	WriteProblem(w, Problem{Type: ProblemInvalidKey, Title: title, Status: http.StatusBadRequest, Detail: detail + "."}, 0)
	return OutcomeInvalidKey
}

// refuse answers a request that could not be claimed for a reason of its own: its
// body, its deadline or its client.
func (m *Middleware) refuse(w http.ResponseWriter, r *http.Request, err error) Outcome {
	switch {
	case errors.Is(err, errTooLarge):
		WriteProblem(w, Problem{Type: ProblemBodyTooLarge, Title: "Request body too large", Status: http.StatusRequestEntityTooLarge,
			Detail: fmt.Sprintf("The request body is larger than %d bytes.", m.cfg.MaxBody)}, 0)
		return OutcomeTooLarge
	case errors.Is(err, errOverloaded):
		m.discardBody(w, r)
		WriteProblem(w, Problem{Type: ProblemOverloaded, Title: "Too many bodies in memory", Status: http.StatusServiceUnavailable,
			Detail: "The request was not executed: the server holds as many request and response bodies in memory as it allows. Retry it with the same Idempotency-Key."}, 1)
		return OutcomeOverloaded
	case errors.Is(err, errBodyTimeout):
		w.Header().Set("Connection", "close")
		WriteProblem(w, Problem{Type: ProblemBodyTimeout, Title: "Request body timeout", Status: http.StatusRequestTimeout,
			Detail: fmt.Sprintf("The request body did not arrive within %s; the request was not executed. Retry it with the same Idempotency-Key.", m.cfg.BodyTimeout)}, 0)
		return OutcomeBodyTimeout
	case errors.Is(err, errDeadline), errors.Is(err, context.DeadlineExceeded):
		WriteProblem(w, Problem{Type: ProblemDeadlineExceeded, Title: "Request deadline exceeded", Status: http.StatusGatewayTimeout,
			Detail: "The request's deadline passed before it could be executed; it was not executed."}, 0)
		return OutcomeDeadline
	case r.Context().Err() != nil: // the client left: nobody reads an answer
		return OutcomeClientGone
	default:
		WriteProblem(w, Problem{Type: ProblemBodyUnreadable, Title: "Request body could not be read", Status: http.StatusBadRequest, Detail: err.Error()}, 0)
		return OutcomeBadBody
	}
}

// answerHeld answers a retry from a response this process holds for its key.
func (m *Middleware) answerHeld(w http.ResponseWriter, p *pending, fp string) Outcome {
	if p.claim.Fingerprint != fp {
		return mismatch(w)
	}
	Replay(w, &p.resp)
	return OutcomeReplayed
}

// notDurable answers a request that cannot be claimed because the store cannot make
// writes durable now: a claim it acknowledged could be lost by a failover, and the
// request then run again.
func (m *Middleware) notDurable(w http.ResponseWriter) Outcome {
	WriteProblem(w, Problem{Type: ProblemStoreNotDurable, Title: "Idempotency store cannot make writes durable", Status: http.StatusServiceUnavailable,
		Detail: "The request was not executed: the store cannot confirm writes as durable now (its synchronous standby or replicas do not acknowledge them, or it may evict records). Retry it with the same Idempotency-Key."}, 1)
	return OutcomeNotDurable
}

func mismatch(w http.ResponseWriter) Outcome {
	WriteProblem(w, Problem{Type: ProblemMismatch, Title: "Idempotency-Key reused", Status: http.StatusUnprocessableEntity,
		Detail: "This Idempotency-Key was already used with a different request (method, path, query or body). Use a new key for a new operation."}, 0)
	return OutcomeMismatch
}

// existing answers a request that lost its claim to res.Existing. wait is how long
// takeovers were held back (see health).
func (m *Middleware) existing(w http.ResponseWriter, res ClaimResult, fp string, wait time.Duration) Outcome {
	rec := res.Existing
	switch {
	case rec.Fingerprint != fp:
		return mismatch(w)
	case rec.State == StateDone && rec.Response != nil:
		m.replay(w, rec.Response)
		return OutcomeReplayed
	}
	// While the owner works, it may finish any moment: retry soon. When the owner is
	// known to be gone (abandoned), or its lease ran out and takeovers are held back, the
	// key cannot move before that time.
	after := time.Second
	switch left := rec.LeaseUntil.Sub(res.Now); {
	case rec.Abandoned && left > 0:
		after = left
	case left <= 0 && wait > 0:
		after = wait
	}
	WriteProblem(w, Problem{Type: ProblemInFlight, Title: "Request in flight", Status: http.StatusConflict,
		Detail: "A request with this Idempotency-Key is still being processed. Retry later with the same key to get its result."},
		int(math.Ceil(after.Seconds())))
	return OutcomeConflict
}
