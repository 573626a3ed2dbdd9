package pgstore_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
)

// TestClientGoneWhileTheClaimWaits: a client that gives up while its claim waits for a
// pool connection (every connection busy) is reported as gone, not as a store failure:
// no ERROR is logged and the outcome is not store-error, because the store is fine.
func TestClientGoneWhileTheClaimWaits(t *testing.T) {
	t.Parallel()
	pool := newPool(t, testenv.PostgresURL(t), func(c *pgxpool.Config) { c.MaxConns = 1 })
	st, _ := newStore(t, pool)
	busy, err := pool.Acquire(t.Context()) // the pool's only connection, held
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Release()

	var (
		mu       sync.Mutex
		logs     bytes.Buffer
		outcomes []idempotency.Outcome
	)
	mw, err := idempotency.New(idempotency.Config{Store: st,
		Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil)),
		OnOutcome: func(_ *http.Request, o idempotency.Outcome) {
			mu.Lock()
			outcomes = append(outcomes, o)
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Shutdown(context.Background())
	ran := false
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran = true }))
	ctx, leave := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, leave) // the client gives up while the claim waits
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/pay", strings.NewReader("{}"))
	r.Header.Set("Idempotency-Key", testenv.Name("gone"))
	h.ServeHTTP(httptest.NewRecorder(), r)

	mu.Lock()
	defer mu.Unlock()
	if ran || len(outcomes) != 1 || outcomes[0] != idempotency.OutcomeClientGone {
		t.Errorf("ran %v, outcomes %v; want only client-gone", ran, outcomes)
	}
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("a client that left was logged as a store failure:\n%s", logs.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
