package idempotency_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// keyed sends one keyed POST through mw to h, under ctx.
func keyed(t *testing.T, ctx context.Context, mw *idempotency.Middleware, key string, h http.Handler) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/pay", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	mw.Handler(h).ServeHTTP(w, r)
	return w
}

func newCtxMiddleware(t *testing.T, cfg idempotency.Config) *idempotency.Middleware {
	t.Helper()
	cfg.Store, cfg.Logger = memstore.New(), slog.New(slog.DiscardHandler)
	mw, err := idempotency.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mw.Shutdown(context.Background()) })
	return mw
}

// The handler's context ends when the request is over, whichever of its methods a
// goroutine the handler left behind calls first, and Err, Done and context.Cause agree.
func TestHandlerContextEndsWithTheRequest(t *testing.T) {
	t.Parallel()
	mw := newCtxMiddleware(t, idempotency.Config{})
	for _, first := range []string{"Err", "Done", "Cause", "Value"} {
		var kept context.Context
		w := keyed(t, context.Background(), mw, "k-"+first, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := r.Context().Err(); err != nil {
				t.Errorf("%s: the handler's context has ended while it runs: %v", first, err)
			}
			if _, ok := idempotency.ClaimFromContext(r.Context()); !ok {
				t.Errorf("%s: no claim in the handler's context", first)
			}
			kept = r.Context()
			w.WriteHeader(http.StatusCreated)
		}))
		if w.Code != http.StatusCreated {
			t.Fatalf("%s: status %d", first, w.Code)
		}
		switch first {
		case "Err":
			if err := kept.Err(); !errors.Is(err, context.Canceled) {
				t.Errorf("Err after the request: %v, want context.Canceled", err)
			}
		case "Done":
			select {
			case <-kept.Done():
			default:
				t.Errorf("Done after the request: not closed")
			}
		case "Cause":
			if err := context.Cause(kept); !errors.Is(err, context.Canceled) {
				t.Errorf("Cause after the request: %v, want context.Canceled", err)
			}
		case "Value":
			if _, ok := idempotency.ClaimFromContext(kept); !ok {
				t.Errorf("no claim in the context after the request")
			}
		}
		select {
		case <-kept.Done():
		default:
			t.Errorf("%s first: Done after the request is not closed", first)
		}
		if err := kept.Err(); !errors.Is(err, context.Canceled) {
			t.Errorf("%s first: Err after the request: %v", first, err)
		}
		if err := context.Cause(kept); !errors.Is(err, context.Canceled) {
			t.Errorf("%s first: Cause after the request: %v", first, err)
		}
	}
}

// The request's own end reaches the handler's context, whether or not the handler has
// asked for Done before it.
func TestHandlerContextFollowsTheRequest(t *testing.T) {
	t.Parallel()
	mw := newCtxMiddleware(t, idempotency.Config{})
	for _, doneFirst := range []bool{false, true} {
		cause := errors.New("client went away")
		ctx, cancel := context.WithCancelCause(context.Background())
		keyed(t, ctx, mw, "follow-"+map[bool]string{false: "err", true: "done"}[doneFirst], http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hctx := r.Context()
			var done <-chan struct{}
			if doneFirst {
				done = hctx.Done()
			}
			cancel(cause)
			if err := hctx.Err(); !errors.Is(err, context.Canceled) {
				t.Errorf("done first %v: Err after the request's end: %v", doneFirst, err)
			}
			if got := context.Cause(hctx); !errors.Is(got, cause) {
				t.Errorf("done first %v: Cause %v, want the request's", doneFirst, got)
			}
			if done == nil {
				done = hctx.Done()
			}
			<-done // closed by the request's end; a context that missed it hangs here
			w.WriteHeader(http.StatusServiceUnavailable)
		}))
	}
}

// A lost lease ends the handler's context with ErrLeaseLost as its cause, for a handler
// that only polls Err and never asked for Done.
func TestHandlerContextLeaseLostWithoutDone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		mw, err := idempotency.New(idempotency.Config{Store: store, Logger: slog.New(slog.DiscardHandler), Lease: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = mw.Shutdown(context.Background()) }()
		var cause error
		keyed(t, context.Background(), mw, "lost", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c, _ := idempotency.ClaimFromContext(r.Context())
			// The record goes: the next renewal finds the lease lost.
			if err := store.Delete(r.Context(), c.Scope, c.Key); err != nil {
				t.Error(err)
			}
			// The bubble's clock: the renewal is due at 10s; a minute without the end
			// is a context that missed it.
			for i := 0; i < 60 && r.Context().Err() == nil; i++ {
				time.Sleep(time.Second)
			}
			cause = context.Cause(r.Context())
			w.WriteHeader(http.StatusOK)
		}))
		if !errors.Is(cause, idempotency.ErrLeaseLost) {
			t.Fatalf("cause %v, want ErrLeaseLost", cause)
		}
	})
}

// claimHandler records how the middleware called it, and answers 201; with release
// set, ServeClaimed releases the key instead.
type claimHandler struct {
	release bool
	served  []string // "http" or "claimed", in order
	claims  []*idempotency.Claim
	inCtx   []bool // ServeClaimed: whether the request's context held a claim
	ctxs    []context.Context
}

func (h *claimHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.served = append(h.served, "http")
	w.WriteHeader(http.StatusCreated)
}

func (h *claimHandler) ServeClaimed(w http.ResponseWriter, r *http.Request, c *idempotency.Claim) {
	h.served = append(h.served, "claimed")
	h.claims = append(h.claims, c)
	_, in := idempotency.ClaimFromContext(r.Context())
	h.inCtx = append(h.inCtx, in)
	h.ctxs = append(h.ctxs, r.Context())
	if h.release {
		c.Release()
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusCreated)
}

// A ClaimHandler is handed the claim of a request that won its key, with the request's
// own context, and the claim it is handed is the one the middleware settles: a release
// lets the retry run, a stored answer is replayed. A request the middleware passes
// through goes to ServeHTTP.
func TestClaimHandlerIsHandedTheClaim(t *testing.T) {
	t.Parallel()
	mw := newCtxMiddleware(t, idempotency.Config{})
	type ctxKey struct{}
	base := context.WithValue(context.Background(), ctxKey{}, "caller's")

	h := &claimHandler{release: true}
	if w := keyed(t, base, mw, "k-released", h); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("released: status %d, want 503", w.Code)
	}
	h.release = false
	if w := keyed(t, base, mw, "k-released", h); w.Code != http.StatusCreated {
		t.Fatalf("the retry of a released key: status %d, want 201", w.Code)
	}
	if w := keyed(t, base, mw, "k-released", h); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the retry after the answer was stored: status %d, replayed %q; want a replayed 201",
			w.Code, w.Header().Get("Idempotent-Replayed"))
	}
	if want := []string{"claimed", "claimed"}; !slices.Equal(h.served, want) {
		t.Fatalf("handler called %v, want %v", h.served, want)
	}
	for i, c := range h.claims {
		if c == nil || c.Key != "k-released" || c.Token <= 0 {
			t.Errorf("call %d: claim %+v, want key k-released with a token", i, c)
		}
		if h.inCtx[i] {
			t.Errorf("call %d: the request's context holds a claim; a ClaimHandler is handed it instead", i)
		}
		if v := h.ctxs[i].Value(ctxKey{}); v != "caller's" {
			t.Errorf("call %d: the request's context lost the caller's value: %v", i, v)
		}
	}
	if h.claims[0].Token == h.claims[1].Token {
		t.Errorf("the retry ran under the released claim's token %d", h.claims[0].Token)
	}

	// A method that takes no key passes through to ServeHTTP.
	r := httptest.NewRequestWithContext(base, http.MethodGet, "/pay", nil)
	w := httptest.NewRecorder()
	mw.Handler(h).ServeHTTP(w, r)
	if w.Code != http.StatusCreated || h.served[len(h.served)-1] != "http" {
		t.Fatalf("GET: status %d, handler called %v; want 201 through ServeHTTP", w.Code, h.served)
	}
}
