// Package ledger is a POST /payments endpoint that a retried request never pays twice,
// as a reusable http.Handler for the payments example, its tests and the benchmarks.
//
// A Server keeps a ledger table of payments (id, user, idempotency key, amount,
// currency, created_at) next to the idempotency records, in PostgreSQL (NewPostgres) or
// SQLite (OpenSQLite), and serves:
//
//	POST /payments       {"amount": 1250, "currency": "EUR"} → 201 with the payment
//	GET  /payments/{id}  one of the caller's payments, or 404
//	GET  /payments       {"count": n}, the number of the caller's payments
//
// The caller is named by "Authorization: Bearer <user>" (a demo stand-in for real
// authentication; no header is the user "anonymous"). The user is the idempotency scope:
// two users never share a key.
//
// POST /payments runs in one of three modes:
//
//   - ModeTx (the default): the idempotency middleware claims the key, and the ledger
//     insert and the completion of the key commit in one transaction (the store's
//     WithTx). "Payment recorded, response not stored" cannot happen.
//   - ModeMiddleware: the middleware claims the key; the ledger insert commits on its
//     own and the middleware stores the response afterwards. A crash between the two
//     leaves the key in progress until its lease ends; the retry that takes it over then
//     finds the payment by its idempotency key (the ledger's UNIQUE (user_id,
//     idempotency_key)) instead of paying twice.
//   - ModeUnprotected: no idempotency at all: the baseline the benchmarks and the tests
//     measure the other modes against. A retried POST pays again.
package ledger

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
)

// Mode selects how POST /payments is protected.
type Mode int

const (
	// ModeTx: middleware, with the ledger insert and the key's completion in one
	// transaction. The default.
	ModeTx Mode = iota
	// ModeMiddleware: middleware; the ledger insert commits in its own transaction and
	// the middleware stores the response after it.
	ModeMiddleware
	// ModeUnprotected: no idempotency (the baseline).
	ModeUnprotected
)

// String returns the mode's name: "tx", "middleware" or "unprotected".
func (m Mode) String() string {
	switch m {
	case ModeTx:
		return "tx"
	case ModeMiddleware:
		return "middleware"
	case ModeUnprotected:
		return "unprotected"
	default:
		return "Mode(" + strconv.Itoa(int(m)) + ")"
	}
}

// Config is the part of a Server's configuration common to both databases. The zero
// value is the default of every field.
type Config struct {
	// Mode is how POST /payments is protected. Default ModeTx.
	Mode Mode

	// Idempotency configures the middleware (Lease, TTL, CanonicalJSON, OnOutcome...).
	// The constructor sets Store (the database's store) and Scope (the user); Logger
	// defaults to the field below. Ignored in ModeUnprotected.
	Idempotency idempotency.Config

	// Clock stamps payments and is the idempotency store's clock. Default nil: time.Now
	// for payments, and the store's own clock (PostgreSQL's, for a PostgreSQL ledger
	// served by several processes). Set it only in tests.
	Clock func() time.Time

	// Logger receives failures. Default slog.Default().
	Logger *slog.Logger
}

// Payment is one row of the ledger.
type Payment struct {
	ID   int64  `json:"id"`
	User string `json:"user"`
	// IdempotencyKey is the key the payment was made under; empty when it was made
	// unprotected.
	IdempotencyKey string    `json:"idempotency_key,omitempty"`
	Amount         int64     `json:"amount"`
	Currency       string    `json:"currency"`
	CreatedAt      time.Time `json:"created_at"`
}

// errNotFound is returned by a backend when no payment matches.
var errNotFound = errors.New("ledger: payment not found")

// backend is the ledger on one database, with the idempotency store that lives there.
type backend interface {
	// create inserts p unless the user already has a payment with p's idempotency key,
	// which it returns instead (existed true).
	create(ctx context.Context, p Payment) (got Payment, existed bool, err error)
	// createTx does what create does in the store's WithTx, so the key is completed
	// with respond's answer in the same transaction.
	createTx(ctx context.Context, p Payment, respond func(want, got Payment, existed bool) idempotency.Response) (idempotency.Response, error)
	get(ctx context.Context, user string, id int64) (Payment, error)
	count(ctx context.Context, user string) (int64, error)
	// commitUnknown reports whether err says the commit's outcome is unknown.
	commitUnknown(err error) bool
}

// Server serves the payments API. Make one with NewPostgres or OpenSQLite; it is safe for
// concurrent use.
type Server struct {
	mode    Mode
	db      backend
	store   idempotency.Store
	clock   func() time.Time
	logger  *slog.Logger
	create  http.Handler // POST /payments without the middleware (tests reach it)
	handler http.Handler
	mw      *idempotency.Middleware // nil in ModeUnprotected
	close   func() error
}

// newServer wires the routes; store is nil in ModeUnprotected.
func newServer(cfg Config, db backend, store idempotency.Store, closer func() error) (*Server, error) {
	if cfg.Mode < ModeTx || cfg.Mode > ModeUnprotected {
		return nil, fmt.Errorf("ledger: unknown mode %d", int(cfg.Mode))
	}
	s := &Server{mode: cfg.Mode, db: db, store: store, clock: cfg.Clock, logger: cfg.Logger, close: closer}
	if s.clock == nil {
		s.clock = time.Now
	}
	if s.logger == nil {
		s.logger = slog.Default()
	}
	s.create = http.HandlerFunc(s.servePost)
	post := s.create
	if cfg.Mode != ModeUnprotected {
		ic := cfg.Idempotency
		ic.Store = store
		ic.Scope = func(r *http.Request) string {
			u, _ := User(r) // authenticate has rejected a malformed header already
			return u
		}
		if ic.Logger == nil {
			ic.Logger = s.logger
		}
		mw, err := idempotency.New(ic)
		if err != nil {
			return nil, fmt.Errorf("ledger: %w", err)
		}
		s.mw = mw
		post = mw.Handler(post)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", post)
	mux.HandleFunc("GET /payments/{id}", s.serveGet)
	mux.HandleFunc("GET /payments", s.serveCount)
	s.handler = authenticate(mux)
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// Mode returns the server's mode.
func (s *Server) Mode() Mode { return s.mode }

// Store returns the idempotency store the server uses, or nil in ModeUnprotected.
func (s *Server) Store() idempotency.Store { return s.store }

// Count returns the number of payments of user in the ledger; user "" counts every
// user's.
func (s *Server) Count(ctx context.Context, user string) (int64, error) {
	return s.db.count(ctx, user)
}

// Shutdown stops the middleware's background work, storing until ctx ends the answers
// the store could not take (see idempotency.Middleware.Shutdown). Call it after the
// HTTP server has stopped, before Close.
func (s *Server) Shutdown(ctx context.Context) error {
	if s.mw == nil {
		return nil
	}
	return s.mw.Shutdown(ctx)
}

// Close releases what the constructor opened (a PostgreSQL pool passed in stays open).
// It stops the middleware's background work without waiting for answers not yet
// stored; call Shutdown first to give them time.
func (s *Server) Close() error {
	if s.mw != nil {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = s.mw.Shutdown(ctx)
	}
	if s.close == nil {
		return nil
	}
	return s.close()
}

// Problem types of the payments API, besides the middleware's.
const (
	ProblemUnauthorized  = "urn:retrysafe:example:payments:unauthorized"
	ProblemMalformed     = "urn:retrysafe:example:payments:malformed-json"
	ProblemInvalid       = "urn:retrysafe:example:payments:invalid-payment"
	ProblemNotFound      = "urn:retrysafe:example:payments:not-found"
	ProblemKeyReused     = "urn:retrysafe:example:payments:key-reused"
	ProblemTakenOver     = "urn:retrysafe:example:payments:taken-over"
	ProblemCommitUnknown = "urn:retrysafe:example:payments:commit-unknown"
	ProblemInternal      = "urn:retrysafe:example:payments:internal"
)

const (
	maxUserLen       = 64      // longest user name
	maxBody    int64 = 1 << 20 // largest request body read in ModeUnprotected (the middleware limits the others)
)

// User returns the caller named by "Authorization: Bearer <user>", where user is 1–64
// letters, digits, '.', '_' or '-'; no Authorization header is the user "anonymous". It
// is the example's stand-in for real authentication.
func User(r *http.Request) (string, error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return "anonymous", nil
	}
	scheme, user, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", errors.New(`the Authorization header must be "Bearer <user>"`)
	}
	if user == "" || len(user) > maxUserLen {
		return "", fmt.Errorf("the user must be 1 to %d characters", maxUserLen)
	}
	for _, c := range []byte(user) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return "", errors.New("the user may hold only letters, digits, '.', '_' and '-'")
		}
	}
	return user, nil
}

// authenticate rejects a malformed Authorization header before anything else runs.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := User(r); err != nil {
			idempotency.WriteProblem(w, idempotency.Problem{Type: ProblemUnauthorized, Title: "Unauthorized",
				Status: http.StatusUnauthorized, Detail: err.Error() + "."}, 0)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// paymentRequest is the body of POST /payments.
type paymentRequest struct {
	Amount   *int64  `json:"amount"`
	Currency *string `json:"currency"`
}

// decode reads and validates the body; a non-nil problem is the answer.
func decode(w http.ResponseWriter, r *http.Request) (amount int64, currency string, prob *idempotency.Problem) {
	var in paymentRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	err := dec.Decode(&in)
	if err == nil && dec.Decode(&struct{}{}) != io.EOF {
		err = errors.New("the body holds more than one JSON value")
	}
	var typeErr *json.UnmarshalTypeError
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return 0, "", &idempotency.Problem{Type: idempotency.ProblemBodyTooLarge, Title: "Request body too large",
			Status: http.StatusRequestEntityTooLarge, Detail: fmt.Sprintf("The request body is larger than %d bytes.", maxBody)}
	case errors.As(err, &typeErr) && typeErr.Field == "amount":
		return 0, "", &idempotency.Problem{Type: ProblemInvalid, Title: "Invalid payment", Status: http.StatusUnprocessableEntity,
			Detail: "amount must be a positive integer (in the currency's minor unit)."}
	case errors.As(err, &typeErr) && typeErr.Field == "currency":
		return 0, "", &idempotency.Problem{Type: ProblemInvalid, Title: "Invalid payment", Status: http.StatusUnprocessableEntity,
			Detail: "currency must be three letters (an ISO 4217 code such as EUR)."}
	case err != nil:
		return 0, "", &idempotency.Problem{Type: ProblemMalformed, Title: "Malformed JSON", Status: http.StatusBadRequest,
			Detail: `The body must be one JSON object such as {"amount": 1250, "currency": "EUR"}: ` + err.Error() + "."}
	}
	var bad []string
	if in.Amount == nil || *in.Amount <= 0 {
		bad = append(bad, "amount must be a positive integer (in the currency's minor unit)")
	}
	if in.Currency == nil || !isCurrency(*in.Currency) {
		bad = append(bad, "currency must be three letters (an ISO 4217 code such as EUR)")
	}
	if len(bad) > 0 {
		return 0, "", &idempotency.Problem{Type: ProblemInvalid, Title: "Invalid payment", Status: http.StatusUnprocessableEntity,
			Detail: strings.Join(bad, "; ") + "."}
	}
	return *in.Amount, strings.ToUpper(*in.Currency), nil
}

func isCurrency(s string) bool {
	if len(s) != 3 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

func (s *Server) servePost(w http.ResponseWriter, r *http.Request) {
	user, err := User(r)
	if err != nil { // reached only when a test calls the handler directly
		idempotency.WriteProblem(w, idempotency.Problem{Type: ProblemUnauthorized, Title: "Unauthorized", Status: http.StatusUnauthorized, Detail: err.Error() + "."}, 0)
		return
	}
	amount, currency, prob := decode(w, r)
	if prob != nil {
		idempotency.WriteProblem(w, *prob, 0)
		return
	}
	ctx := r.Context()
	want := Payment{User: user, Amount: amount, Currency: currency, CreatedAt: s.clock().UTC().Truncate(time.Microsecond)}
	claim, claimed := idempotency.ClaimFromContext(ctx)
	if claimed {
		want.IdempotencyKey = claim.Key
	}

	if s.mode == ModeTx {
		resp, err := s.db.createTx(ctx, want, respond)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		write(w, resp)
		return
	}
	got, existed, err := s.db.create(ctx, want)
	if err != nil {
		if claimed {
			claim.Release() // the insert rolled back: a retry must run again
		}
		s.fail(w, r, err)
		return
	}
	write(w, respond(want, got, existed))
}

// fail answers a failed ledger write. In ModeTx the store's WithTx has released the key
// (the work was not done); in ModeMiddleware the caller has.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, idempotency.ErrLeaseLost):
		s.logger.WarnContext(r.Context(), "payments: key taken over; payment rolled back", "err", err)
		idempotency.WriteProblem(w, idempotency.Problem{Type: ProblemTakenOver, Title: "Request taken over", Status: http.StatusConflict,
			Detail: "Another request with this Idempotency-Key took it over; this one was rolled back. Retry with the same key to get the result."}, 1)
	case s.db.commitUnknown(err):
		// The store has released the key, which is safe (see pgstore.Store.WithTx): the
		// release waits for the transaction's row lock, and changes nothing if it
		// committed, so a retry replays the payment or makes it.
		s.logger.ErrorContext(r.Context(), "payments: commit outcome unknown", "err", err)
		idempotency.WriteProblem(w, idempotency.Problem{Type: ProblemCommitUnknown, Title: "Outcome unknown", Status: http.StatusServiceUnavailable,
			Detail: "The database connection failed while committing. Retry with the same Idempotency-Key."}, 1)
	default:
		s.logger.ErrorContext(r.Context(), "payments: ledger write failed", "err", err)
		idempotency.WriteProblem(w, idempotency.Problem{Type: ProblemInternal, Title: "Payment not recorded", Status: http.StatusInternalServerError,
			Detail: "The payment was not recorded. Retry with the same Idempotency-Key."}, 0)
	}
}

// respond is the answer to a payment request want whose ledger row is got.
func respond(want, got Payment, existed bool) idempotency.Response {
	if existed && (got.Amount != want.Amount || got.Currency != want.Currency) {
		// Only reachable after the key's record expired: the key was reused long after.
		return problemResponse(idempotency.Problem{Type: ProblemKeyReused, Title: "Idempotency-Key reused",
			Status: http.StatusUnprocessableEntity, Detail: "This Idempotency-Key already made another payment. Use a new key for a new payment."})
	}
	body, _ := json.Marshal(got) // a struct of strings, ints and a time always marshals
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("Location", "/payments/"+strconv.FormatInt(got.ID, 10))
	return idempotency.Response{Status: http.StatusCreated, Header: h, Body: append(body, '\n')}
}

func problemResponse(p idempotency.Problem) idempotency.Response {
	rec := &headerRecorder{header: http.Header{}}
	idempotency.WriteProblem(rec, p, 0)
	return idempotency.Response{Status: rec.status, Header: rec.header, Body: rec.body.Bytes()}
}

// headerRecorder is the minimal ResponseWriter problemResponse needs.
type headerRecorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (h *headerRecorder) Header() http.Header         { return h.header }
func (h *headerRecorder) WriteHeader(code int)        { h.status = code }
func (h *headerRecorder) Write(p []byte) (int, error) { return h.body.Write(p) }

// write sends resp.
func write(w http.ResponseWriter, resp idempotency.Response) {
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

func (s *Server) serveGet(w http.ResponseWriter, r *http.Request) {
	user, _ := User(r)
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	var p Payment
	if err == nil {
		p, err = s.db.get(r.Context(), user, id)
	}
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, p)
	case errors.Is(err, errNotFound), errors.Is(err, strconv.ErrSyntax), errors.Is(err, strconv.ErrRange):
		idempotency.WriteProblem(w, idempotency.Problem{Type: ProblemNotFound, Title: "Payment not found", Status: http.StatusNotFound,
			Detail: "You have no payment with id " + strconv.Quote(r.PathValue("id")) + "."}, 0)
	default:
		s.logger.ErrorContext(r.Context(), "payments: read failed", "err", err)
		idempotency.WriteProblem(w, idempotency.Problem{Type: ProblemInternal, Title: "Ledger unavailable", Status: http.StatusInternalServerError}, 0)
	}
}

func (s *Server) serveCount(w http.ResponseWriter, r *http.Request) {
	user, _ := User(r)
	n, err := s.db.count(r.Context(), user)
	if err != nil {
		s.logger.ErrorContext(r.Context(), "payments: count failed", "err", err)
		idempotency.WriteProblem(w, idempotency.Problem{Type: ProblemInternal, Title: "Ledger unavailable", Status: http.StatusInternalServerError}, 0)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int64{"count": n})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "encoding failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
