package deadline

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
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

// ProblemBudgetExhausted is the problem type of the 504 the middleware answers when the
// caller's budget is spent.
const ProblemBudgetExhausted = "urn:retrysafe:problem:budget-exhausted"

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
// when it is earlier.
//
// The header's value is a decimal integer of milliseconds. A malformed value (a unit, a
// fraction, a sign other than a leading minus, anything but digits) is ignored, logged at
// debug, and the server's budget applies: a bad header must not fail a request. When the
// header appears more than once, or as a comma-separated list, the smallest well-formed
// value counts. A value too large to represent is larger than any server budget.
//
// A caller whose budget is spent, a value of 0 or a negative integer (an upstream that
// subtracts its elapsed time may overdraw), or a request whose context deadline has
// already passed, is answered 504 Gateway Timeout with an RFC 9457
// application/problem+json body of type ProblemBudgetExhausted, and the handler never
// runs: the caller has stopped waiting, so any work started now would be wasted at
// best, and at worst a side effect no one sees the result of. 504 is what a gateway
// answers when the time to answer ran out, and what gRPC's DEADLINE_EXCEEDED maps to.
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
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			logger := cfg.Logger
			if logger == nil {
				logger = slog.Default()
			}
			limit := budget
			ms, found, bad := parseBudget(r.Header.Values(header))
			if bad != "" {
				logger.DebugContext(r.Context(), "deadline: malformed budget header ignored",
					"header", header, "value", bad)
			}
			if found {
				if ms <= 0 {
					logger.DebugContext(r.Context(), "deadline: caller's budget spent, answered 504",
						"header", header, "ms", ms)
					writeExhausted(w, "the caller's budget ("+header+": "+strconv.FormatInt(ms, 10)+") is spent")
					return
				}
				if ms < math.MaxInt64/int64(time.Millisecond) && time.Duration(ms)*time.Millisecond < limit {
					limit = time.Duration(ms) * time.Millisecond
				}
			}
			ctx, cancel := context.WithTimeout(r.Context(), limit)
			defer cancel()
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				logger.DebugContext(r.Context(), "deadline: request deadline already passed, answered 504")
				writeExhausted(w, "the request's deadline has already passed")
				return
			}
			next.ServeHTTP(w, r.WithContext(ctx))
		})
	}
}

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

// problem is an RFC 9457 problem details object.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

func writeExhausted(w http.ResponseWriter, detail string) {
	body, _ := json.Marshal(problem{ // strings and an int always marshal
		Type:   ProblemBudgetExhausted,
		Title:  "Request budget exhausted",
		Status: http.StatusGatewayTimeout,
		Detail: detail,
	})
	body = append(body, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusGatewayTimeout)
	_, _ = w.Write(body)
}
