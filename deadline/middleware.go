package deadline

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/retrysafe/retrysafe/internal/lazyctx"
	"github.com/retrysafe/retrysafe/internal/problem"
)

// DefaultHeader is the header that carries a budget between hops: the whole
// milliseconds the caller has left, a decimal integer, as in
//
//	Request-Budget-Ms: 450
//
// Why this name: it has no X- prefix (RFC 6648); it names what it carries, the
// remaining budget of the whole request rather than a per-hop timeout; and its unit is in
// the name, so no one guesses seconds. It deliberately is not grpc-timeout (gRPC's own
// format, with unit suffixes, acted on by gRPC servers) nor Envoy's
// x-envoy-expected-rq-timeout-ms (which Envoy sets on its own): a budget of
// ours never collides with a proxy's. The value is relative (time left, not an instant),
// so the hosts' clocks never need to agree.
const DefaultHeader = "Request-Budget-Ms"

// DefaultBudget is the server's own budget for a request when Config.Budget is zero.
const DefaultBudget = 30 * time.Second

// ExhaustedHeader is the response header with which Middleware says that the caller's
// budget is spent:
//
//	Request-Budget-Exhausted: ?1
//
// (a structured-field boolean, RFC 9651). A client must not resend a request answered
// with it: its caller has stopped waiting, and another attempt would reach a server with
// no time to do the work. Package retry's Transport treats such an answer as final (its
// BudgetExhaustedHeader is this header). Middleware sets it, and removes it, on every
// answer it passes (see Middleware), so a handler that relays an upstream's answer never
// relays the upstream's verdict instead of its own.
const ExhaustedHeader = "Request-Budget-Exhausted"

// ProblemBudgetExhausted is the problem type of the 504 the middleware answers when the
// caller's budget is spent: on arrival, or before the handler answered. Such a 504
// carries ExhaustedHeader.
const ProblemBudgetExhausted = "urn:retrysafe:problem:budget-exhausted"

// ProblemServerBudgetExhausted is the problem type of the 504 the middleware answers when
// the server's own limit for the request (Config.Budget, or a deadline already on the
// request's context) ran out before the handler answered, while the caller may still
// have time: it does not carry ExhaustedHeader, and a client may retry it.
const ProblemServerBudgetExhausted = "urn:retrysafe:problem:server-budget-exhausted"

// maxLogged bounds how much of a malformed header value is logged.
const maxLogged = 64

// Config configures Middleware. The zero value of every field means the default
// documented on it; the zero Config is usable.
type Config struct {
	// Header is the header the caller's remaining budget is read from, in whole
	// milliseconds. Default DefaultHeader (Request-Budget-Ms). Use the same name on
	// Transport.
	Header string

	// Budget is the longest this server lets a request run, whatever its caller asks: a
	// request's deadline is the smaller of the caller's budget and Budget, counted from
	// the moment the middleware sees it. A request without the header (or with a
	// malformed one) gets Budget. Default DefaultBudget (30s); zero or negative means the
	// default, so a server always has a budget.
	Budget time.Duration

	// Logger receives, at debug level, malformed budget headers (they are ignored, not
	// answered with an error) and the requests answered 504. Default slog.Default().
	Logger *slog.Logger
}

// Middleware returns an inbound middleware that gives every request a context deadline:
// the smaller of the caller's remaining budget (the Config.Header header) and the
// server's own (Config.Budget). An existing deadline on the request's context is kept
// when it is earlier. When the caller's budget is what ends the request, the context's
// cause (context.Cause) matches ErrExhausted and names the header.
//
// The context reports what context.WithDeadlineCause's would, but makes its timer, its
// channel and its link into the request's context only when something calls its Done
// (a select on it, a context derived with a cancellation of its own), or once its
// deadline has passed: a handler that only polls Err sees the deadline as soon as it
// has passed, with its cause. Most requests end before their deadline, and one that no
// code waits on pays for none of that.
//
// The header's value is a decimal integer of milliseconds. A malformed value (a unit, a
// fraction, a sign other than a leading minus, anything but digits) is ignored, logged at
// debug, and the server's budget applies: a bad header must not fail a request. When the
// header appears more than once, or as a comma-separated list, the smallest well-formed
// value counts. A value too large to represent is larger than any server budget.
//
// A caller whose budget is spent, a value of 0 or a negative integer (an upstream that
// subtracts its elapsed time may overdraw), is answered 504 Gateway Timeout with an RFC
// 9457 application/problem+json body of type ProblemBudgetExhausted and ExhaustedHeader,
// and the handler never runs: the caller has stopped waiting, so any work started now
// would be wasted at best, and at worst a side effect no one sees the result of. 504 is
// what a gateway answers when the time to answer ran out, and what gRPC's
// DEADLINE_EXCEEDED maps to. A request whose context deadline has already passed is
// answered the same way, with type ProblemServerBudgetExhausted.
//
// A handler that returns without writing anything once its deadline has passed — it
// gave up on ctx.Done(), as it should — is answered 504 too, never an empty 200 a caller
// would take for a success: of type ProblemBudgetExhausted, with ExhaustedHeader, when
// the caller's budget ran out; of type ProblemServerBudgetExhausted when the server's
// own limit did.
//
// The caller's budget is spent, too, when a call the handler makes with the request's
// context through Transport found it so: Transport refused to send for lack of time, or
// the next hop answered with ExhaustedHeader (its own budget, which was the rest of
// ours, ran out). A handler that then returns without writing is answered the 504 above.
// Whenever the caller's budget is spent, any failure the handler answers (a status of
// 400 or more) gets ExhaustedHeader, so the verdict travels up the stack to the first
// caller and no hop above resends; any other answer goes without it.
//
// The ResponseWriter the handler gets keeps http.Flusher and http.Hijacker, and unwraps
// (Unwrap) to the server's, so http.ResponseController reaches all the rest.
//
// The middleware does not stop a handler that overruns its deadline: handlers must
// honour their context (and pass it to every call they make). Wrap the handler in
// http.TimeoutHandler as well if an answer must be sent at the deadline regardless.
func Middleware(cfg Config) func(http.Handler) http.Handler {
	header := cfg.Header
	if header == "" {
		header = DefaultHeader
	}
	budget := cfg.Budget
	if budget <= 0 {
		budget = DefaultBudget
	}
	// The cause of every deadline the server's budget sets is the same: made once.
	serverCause := fmt.Errorf("%w: the server's budget for the request (%v) ran out", ErrExhausted, budget)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			logger := cfg.Logger
			if logger == nil {
				logger = slog.Default()
			}
			start := time.Now()
			limit := budget
			ms, found, bad := parseBudget(r.Header.Values(header))
			if bad != "" {
				logger.DebugContext(r.Context(), "deadline: malformed budget header ignored",
					"header", header, "value", bad)
			}
			callers := false // the caller's budget sets the deadline
			if found {
				if ms <= 0 {
					logger.DebugContext(r.Context(), "deadline: caller's budget spent, answered 504",
						"header", header, "ms", ms)
					writeProblem(w, callerSpent, "the caller's budget ("+header+": "+strconv.FormatInt(ms, 10)+") is spent")
					return
				}
				if ms < math.MaxInt64/int64(time.Millisecond) && time.Duration(ms)*time.Millisecond <= limit {
					limit = time.Duration(ms) * time.Millisecond
					callers = true
				}
			}
			dl := start.Add(limit)
			if pd, ok := r.Context().Deadline(); ok && pd.Before(dl) {
				callers = false
			}
			// The request's context, its writer and the caller's budget's state, in one
			// allocation. The context's own cancellation (its timer, its link into the
			// server's context) is made only if something waits on it or the deadline
			// passes: most requests end long before their deadline (lazyctx).
			hs := &hop{}
			cause := serverCause
			if callers {
				hs.st = hopState{spentBy: callersBudget{header: header, ms: ms}}
				hs.st.cause = &hs.st.spentBy
				cause = hs.st.cause
				hs.ctx.st = &hs.st
			}
			hs.ctx.Init(r.Context(), dl, cause)
			ctx := &hs.ctx
			defer ctx.End(nil)
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				logger.DebugContext(r.Context(), "deadline: request deadline already passed, answered 504")
				writeProblem(w, serverSpent, "the request's deadline has already passed")
				return
			}
			st := ctx.st
			if st != nil {
				st.deadline, _ = ctx.Deadline()
			}
			hs.w = budgetWriter{ResponseWriter: w, ctx: ctx, st: st}
			bw := &hs.w
			next.ServeHTTP(bw, r.WithContext(ctx))
			if bw.wrote {
				return
			}
			switch {
			case st.spent(ctx):
				logger.DebugContext(r.Context(), "deadline: caller's budget spent, handler wrote nothing, answered 504",
					"header", header, "ms", ms)
				writeProblem(w, callerSpent, "the caller's budget ("+header+": "+strconv.FormatInt(ms, 10)+
					") was spent before the handler answered")
			case errors.Is(ctx.Err(), context.DeadlineExceeded):
				logger.DebugContext(r.Context(), "deadline: server's budget spent, handler wrote nothing, answered 504",
					"budget", limit)
				writeProblem(w, serverSpent, "the request's deadline passed before the handler answered")
			}
		})
	}
}

// hop is the middleware's state of one request, in one allocation.
type hop struct {
	ctx budgetContext
	w   budgetWriter
	st  hopState // used when the caller's budget sets the deadline
}

// budgetContext is the request's context under its budget: it carries the caller's
// budget's state (hopKey), when that budget sets the deadline.
type budgetContext struct {
	lazyctx.Context
	st *hopState // nil: the server's budget sets the deadline
}

func (c *budgetContext) Value(key any) any {
	if c.st != nil && key == (hopKey{}) {
		return c.st
	}
	return c.Context.Value(key)
}

// hopState is what a request's context carries when the caller's budget sets its
// deadline, so Transport can tell the middleware that a call made under that deadline
// found the budget spent.
type hopState struct {
	cause    error // the context's cause once the caller's budget runs out: &spentBy
	spentBy  callersBudget
	deadline time.Time // the context's deadline
	outbound atomic.Bool
}

// callersBudget is the cause of a request's context ended by its caller's budget. It
// matches ErrExhausted, and its message is made only when asked for: most requests end
// before their deadline and never need it.
type callersBudget struct {
	header string
	ms     int64
}

func (e *callersBudget) Error() string {
	return ErrExhausted.Error() + ": the caller's budget (" + e.header + ": " + strconv.FormatInt(e.ms, 10) + ") ran out"
}

func (e *callersBudget) Unwrap() error { return ErrExhausted }

type hopKey struct{}

// spent reports whether the caller's budget is spent: ctx (the request's) has reached
// its deadline, or a call made under it found no time left. A nil hopState (the server's
// budget sets the deadline) never is.
func (st *hopState) spent(ctx context.Context) bool {
	if st == nil {
		return false
	}
	return st.outbound.Load() || (ctx.Err() != nil && context.Cause(ctx) == st.cause)
}

// noteSpent tells the middleware above ctx, if any, that a call made with ctx found the
// caller's budget spent. Only a call bounded by the request's own deadline counts: one
// bounded by a shorter deadline of the handler's (a Ladder step, Reserve) ran out of the
// handler's share, not of the caller's budget.
func noteSpent(ctx context.Context) {
	st, _ := ctx.Value(hopKey{}).(*hopState)
	if st == nil {
		return
	}
	if dl, ok := ctx.Deadline(); ok && dl.Equal(st.deadline) {
		st.outbound.Store(true)
	}
}

// budgetWriter is the ResponseWriter the handler gets: it knows whether the handler sent
// anything, and sets or removes ExhaustedHeader on the answer the handler sends.
type budgetWriter struct {
	http.ResponseWriter
	ctx   context.Context // the request's
	st    *hopState       // nil: the server's budget sets the deadline
	wrote bool            // a final status went out, or the connection was taken over
}

func (w *budgetWriter) WriteHeader(code int) {
	if !w.wrote && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.mark(code)
		w.wrote = true
	}
	w.ResponseWriter.WriteHeader(code)
}

// mark sets ExhaustedHeader on a failure answered once the caller's budget is spent, and
// removes it from any other answer: the header is this server's verdict.
func (w *budgetWriter) mark(code int) {
	h := w.Header()
	if code >= 400 && w.st.spent(w.ctx) {
		h.Set(ExhaustedHeader, "?1")
		return
	}
	delete(h, ExhaustedHeader) // Del, without canonicalizing a name that is canonical
}

func (w *budgetWriter) Write(p []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(p)
}

// Flush implements http.Flusher; FlushError is what http.ResponseController calls.
func (w *budgetWriter) Flush() { _ = w.FlushError() }

// FlushError flushes, as http.ResponseController's Flush does, and returns its error.
func (w *budgetWriter) FlushError() error {
	if !w.wrote {
		w.mark(http.StatusOK) // flushing first sends a 200
	}
	err := http.NewResponseController(w.ResponseWriter).Flush()
	if err == nil {
		w.wrote = true
	}
	return err
}

// Hijack implements http.Hijacker, through http.ResponseController: after it, the
// middleware writes nothing. Where the server's ResponseWriter cannot hijack (HTTP/2),
// the error matches http.ErrNotSupported.
func (w *budgetWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		w.wrote = true
	}
	return conn, rw, err
}

// Unwrap returns the server's ResponseWriter, for http.ResponseController.
func (w *budgetWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// parseBudget reads the values of the budget header. It returns the smallest
// well-formed value in milliseconds and found = true, or found = false when there is
// none. A negative value is returned as 0 (spent), one too large for an int64 as
// math.MaxInt64. bad is the first malformed element, truncated, for the log; empty list
// elements are skipped, as RFC 9110 §5.6.1 asks.
func parseBudget(values []string) (ms int64, found bool, bad string) {
	for _, v := range values {
		for elem := range strings.SplitSeq(v, ",") {
			elem = strings.Trim(elem, " \t")
			if elem == "" {
				continue
			}
			n, ok := parseMillis(elem)
			if !ok {
				if bad == "" {
					bad = truncate(elem, maxLogged)
				}
				continue
			}
			if !found || n < ms {
				ms, found = n, true
			}
		}
	}
	return ms, found, bad
}

// parseMillis parses an optional leading minus and one or more ASCII digits. Negative
// values become 0; values out of range saturate.
func parseMillis(s string) (int64, bool) {
	digits := strings.TrimPrefix(s, "-")
	if digits == "" {
		return 0, false
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, false
		}
	}
	if len(digits) < len(s) { // negative: spent, however large
		return 0, true
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil { // only a range error is possible here
		return math.MaxInt64, true
	}
	return n, true
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// The two 504s the middleware answers.
var (
	callerSpent = problem.Details{Type: ProblemBudgetExhausted, Title: "Request budget exhausted", Status: http.StatusGatewayTimeout}
	serverSpent = problem.Details{Type: ProblemServerBudgetExhausted, Title: "Server budget exhausted", Status: http.StatusGatewayTimeout}
)

// writeProblem answers p with detail; a ProblemBudgetExhausted carries ExhaustedHeader.
func writeProblem(w http.ResponseWriter, p problem.Details, detail string) {
	p.Detail = detail
	if p.Type == ProblemBudgetExhausted {
		w.Header().Set(ExhaustedHeader, "?1")
	} else {
		w.Header().Del(ExhaustedHeader)
	}
	problem.Write(w, p, 0)
}
