package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
)

// fakeClock is a settable clock for the lease cases.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// db is one backend under test: how to make a Server on it, and how to make its ledger
// reject payments in currency XXX (a CHECK constraint the handler does not know about),
// so that a test can make the ledger insert fail after the key was claimed.
type db struct {
	name   string
	open   func(t *testing.T, cfg Config) *Server
	reject func(t *testing.T, s *Server, on bool)
}

func backends() []db {
	return []db{
		{name: "sqlite", open: openSQLite, reject: rejectSQLite},
		{name: "postgres", open: openPostgres, reject: rejectPostgres},
	}
}

// testLogger sends the server's logs to the test's output (shown with -v or on failure).
func testLogger(t *testing.T, cfg *Config) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
}

func openSQLite(t *testing.T, cfg Config) *Server {
	t.Helper()
	testLogger(t, &cfg)
	s, err := OpenSQLite(context.Background(), SQLiteConfig{Config: cfg, Path: filepath.Join(t.TempDir(), "payments.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

func rejectSQLite(t *testing.T, s *Server, on bool) {
	t.Helper()
	q := `DROP TRIGGER reject_xxx`
	if on {
		q = `CREATE TRIGGER reject_xxx BEFORE INSERT ON payments WHEN NEW.currency = 'XXX'
			BEGIN SELECT RAISE(ABORT, 'currency XXX rejected'); END`
	}
	if _, err := s.db.(*sqliteBackend).write.ExecContext(context.Background(), q); err != nil {
		t.Fatal(err)
	}
}

func openPostgres(t *testing.T, cfg Config) *Server {
	t.Helper()
	testLogger(t, &cfg)
	ctx := context.Background()
	schema := testenv.Schema(t, "ledger") // before the pool: dropped after it is closed
	pool := testenv.PostgresPool(t, 0)
	s, err := NewPostgres(ctx, PostgresConfig{Config: cfg, Pool: pool, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func rejectPostgres(t *testing.T, s *Server, on bool) {
	t.Helper()
	b := s.db.(*pgBackend)
	q := `ALTER TABLE ` + b.table + ` DROP CONSTRAINT reject_xxx`
	if on {
		q = `ALTER TABLE ` + b.table + ` ADD CONSTRAINT reject_xxx CHECK (currency <> 'XXX')`
	}
	if _, err := b.pool.Exec(context.Background(), q); err != nil {
		t.Fatal(err)
	}
}

func post(h http.Handler, user, key, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	if user != "" {
		r.Header.Set("Authorization", "Bearer "+user)
	}
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func get(h http.Handler, user, path string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, path, nil)
	r.Header.Set("Authorization", "Bearer "+user)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func count(t *testing.T, s *Server, user string) int64 {
	t.Helper()
	n, err := s.Count(context.Background(), user)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func decodePayment(t *testing.T, w *httptest.ResponseRecorder) Payment {
	t.Helper()
	var p Payment
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("body %q: %v", w.Body, err)
	}
	return p
}

// protected are the modes that must never pay twice.
var protected = []Mode{ModeTx, ModeMiddleware}

func TestReplay(t *testing.T) {
	t.Parallel()
	for _, b := range backends() {
		for _, mode := range protected {
			t.Run(b.name+"/"+mode.String(), func(t *testing.T) {
				t.Parallel()
				s := b.open(t, Config{Mode: mode})
				const body = `{"amount": 1250, "currency": "eur"}`
				first := post(s, "alice", "key-1", body)
				if first.Code != http.StatusCreated || first.Header().Get("Idempotent-Replayed") != "" {
					t.Fatalf("first POST: %d %v %s", first.Code, first.Header(), first.Body)
				}
				p := decodePayment(t, first)
				if p.ID == 0 || p.User != "alice" || p.IdempotencyKey != "key-1" || p.Amount != 1250 || p.Currency != "EUR" || p.CreatedAt.IsZero() {
					t.Errorf("payment %+v", p)
				}
				if loc := first.Header().Get("Location"); loc != "/payments/"+jsonNumber(p.ID) {
					t.Errorf("Location %q", loc)
				}

				again := post(s, "alice", "key-1", body)
				if again.Code != http.StatusCreated || again.Header().Get("Idempotent-Replayed") != "true" {
					t.Fatalf("retry: %d %v %s", again.Code, again.Header(), again.Body)
				}
				if again.Body.String() != first.Body.String() {
					t.Errorf("replayed body %s, first %s", again.Body, first.Body)
				}
				if n := count(t, s, ""); n != 1 {
					t.Errorf("ledger has %d rows, want 1", n)
				}

				// The same key is another user's own key.
				if w := post(s, "bob", "key-1", body); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
					t.Errorf("bob's POST with alice's key: %d %v", w.Code, w.Header())
				}
				if n := count(t, s, ""); n != 2 {
					t.Errorf("ledger has %d rows, want 2", n)
				}

				if w := get(s, "alice", "/payments/"+jsonNumber(p.ID)); w.Code != http.StatusOK || decodePayment(t, w) != p {
					t.Errorf("GET own payment: %d %s", w.Code, w.Body)
				}
				if w := get(s, "bob", "/payments/"+jsonNumber(p.ID)); w.Code != http.StatusNotFound {
					t.Errorf("GET another user's payment: %d %s", w.Code, w.Body)
				}
				if w := get(s, "alice", "/payments"); w.Code != http.StatusOK || strings.TrimSpace(w.Body.String()) != `{"count":1}` {
					t.Errorf("GET /payments: %d %s", w.Code, w.Body)
				}
			})
		}
	}
}

func jsonNumber(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	for _, b := range backends() {
		for _, mode := range protected {
			t.Run(b.name+"/"+mode.String(), func(t *testing.T) {
				t.Parallel()
				s := b.open(t, Config{Mode: mode})
				const n = 50
				codes := make([]*httptest.ResponseRecorder, n)
				var wg sync.WaitGroup
				start := make(chan struct{})
				for i := range n {
					wg.Go(func() {
						<-start
						codes[i] = post(s, "alice", "dup", `{"amount": 500, "currency": "USD"}`)
					})
				}
				close(start)
				wg.Wait()
				executed := 0
				for _, w := range codes {
					switch {
					case w.Code == http.StatusCreated && w.Header().Get("Idempotent-Replayed") == "":
						executed++
					case w.Code == http.StatusCreated, w.Code == http.StatusConflict:
					default:
						t.Errorf("duplicate answered %d %s", w.Code, w.Body)
					}
				}
				if executed != 1 {
					t.Errorf("%d requests executed, want 1", executed)
				}
				if rows := count(t, s, ""); rows != 1 {
					t.Errorf("ledger has %d rows, want 1", rows)
				}
			})
		}
	}
}

func TestUnprotectedPaysTwice(t *testing.T) {
	t.Parallel()
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			s := b.open(t, Config{Mode: ModeUnprotected})
			if s.Store() != nil {
				t.Error("unprotected server has a store")
			}
			for range 2 {
				if w := post(s, "alice", "k", `{"amount": 1, "currency": "EUR"}`); w.Code != http.StatusCreated {
					t.Fatalf("POST: %d %s", w.Code, w.Body)
				}
			}
			if n := count(t, s, "alice"); n != 2 {
				t.Errorf("ledger has %d rows, want 2 (the bug the middleware fixes)", n)
			}
		})
	}
}

func TestBadRequests(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, user, key, body string
		status                int
		problem               string
	}{
		{"zero amount", "alice", "k1", `{"amount": 0, "currency": "EUR"}`, 422, ProblemInvalid},
		{"negative amount", "alice", "k2", `{"amount": -5, "currency": "EUR"}`, 422, ProblemInvalid},
		{"missing amount", "alice", "k3", `{"currency": "EUR"}`, 422, ProblemInvalid},
		{"fractional amount", "alice", "k4", `{"amount": 1.5, "currency": "EUR"}`, 422, ProblemInvalid},
		{"string amount", "alice", "k5", `{"amount": "10", "currency": "EUR"}`, 422, ProblemInvalid},
		{"short currency", "alice", "k6", `{"amount": 10, "currency": "EU"}`, 422, ProblemInvalid},
		{"digit currency", "alice", "k7", `{"amount": 10, "currency": "EU1"}`, 422, ProblemInvalid},
		{"missing currency", "alice", "k8", `{"amount": 10}`, 422, ProblemInvalid},
		{"not JSON", "alice", "k9", `amount=10`, 400, ProblemMalformed},
		{"two values", "alice", "k10", `{"amount": 10, "currency": "EUR"} {}`, 400, ProblemMalformed},
		{"truncated", "alice", "k11", `{"amount": 10`, 400, ProblemMalformed},
		{"array", "alice", "k13", `[1, 2]`, 400, ProblemMalformed},
		{"null", "alice", "k14", `null`, 422, ProblemInvalid},
		{"huge amount", "alice", "k15", `{"amount": 1e40, "currency": "EUR"}`, 422, ProblemInvalid},
		{"numeric currency", "alice", "k16", `{"amount": 1, "currency": 978}`, 422, ProblemInvalid},
		{"no key", "alice", "", `{"amount": 10, "currency": "EUR"}`, 400, idempotency.ProblemMissingKey},
		{"bad user", "al ice", "k12", `{"amount": 10, "currency": "EUR"}`, 401, ProblemUnauthorized},
	}
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			s := b.open(t, Config{})
			for _, c := range cases {
				w := post(s, c.user, c.key, c.body)
				var p idempotency.Problem
				if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || w.Code != c.status || p.Type != c.problem ||
					w.Header().Get("Content-Type") != "application/problem+json" {
					t.Errorf("%s: %d %s %q, want %d %s", c.name, w.Code, w.Header().Get("Content-Type"), w.Body, c.status, c.problem)
				}
			}
			if n := count(t, s, ""); n != 0 {
				t.Errorf("ledger has %d rows, want 0", n)
			}
		})
	}
}

func TestMismatch(t *testing.T) {
	t.Parallel()
	for _, b := range backends() {
		for _, mode := range protected {
			t.Run(b.name+"/"+mode.String(), func(t *testing.T) {
				t.Parallel()
				s := b.open(t, Config{Mode: mode})
				if w := post(s, "alice", "k", `{"amount": 100, "currency": "EUR"}`); w.Code != http.StatusCreated {
					t.Fatalf("POST: %d %s", w.Code, w.Body)
				}
				w := post(s, "alice", "k", `{"amount": 999, "currency": "EUR"}`)
				var p idempotency.Problem
				_ = json.Unmarshal(w.Body.Bytes(), &p)
				if w.Code != http.StatusUnprocessableEntity || p.Type != idempotency.ProblemMismatch {
					t.Errorf("other body, same key: %d %s", w.Code, w.Body)
				}
				if n := count(t, s, ""); n != 1 {
					t.Errorf("ledger has %d rows, want 1", n)
				}
			})
		}
	}
}

// A ledger insert that fails after the key was claimed releases the key: nothing is
// stored, and the retry executes again.
func TestFailedInsertReleasesKey(t *testing.T) {
	t.Parallel()
	for _, b := range backends() {
		for _, mode := range protected {
			t.Run(b.name+"/"+mode.String(), func(t *testing.T) {
				t.Parallel()
				s := b.open(t, Config{Mode: mode})
				ctx := context.Background()
				const body = `{"amount": 700, "currency": "XXX"}`
				b.reject(t, s, true)
				if w := post(s, "alice", "k", body); w.Code != http.StatusInternalServerError {
					t.Fatalf("POST into a rejecting ledger: %d %s", w.Code, w.Body)
				}
				if rec, err := s.Store().Get(ctx, "alice", "k"); !errors.Is(err, idempotency.ErrNotFound) {
					t.Fatalf("after the failed insert the store holds %+v (err %v), want no record", rec, err)
				}
				if n := count(t, s, ""); n != 0 {
					t.Fatalf("ledger has %d rows, want 0", n)
				}

				b.reject(t, s, false)
				w := post(s, "alice", "k", body)
				if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
					t.Fatalf("retry: %d %v %s, want an execution", w.Code, w.Header(), w.Body)
				}
				rec, err := s.Store().Get(ctx, "alice", "k")
				if err != nil || rec.State != idempotency.StateDone || rec.Response.Status != http.StatusCreated {
					t.Errorf("record after the retry: %+v, %v", rec, err)
				}
				if n := count(t, s, ""); n != 1 {
					t.Errorf("ledger has %d rows, want 1", n)
				}
			})
		}
	}
}

// An owner whose key was taken over (its lease ran out) cannot complete it through
// WithTx, and its ledger write rolls back with the completion.
func TestStaleOwnerRollsBack(t *testing.T) {
	t.Parallel()
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			clock := &fakeClock{t: time.Now().UTC()}
			s := b.open(t, Config{Mode: ModeTx, Clock: clock.Now})
			ctx := context.Background()
			store := s.Store()
			const body = `{"amount": 4200, "currency": "GBP"}`
			fp := idempotency.Fingerprint(http.MethodPost, "/payments", "", "application/json", []byte(body), false)
			claimAt := func() idempotency.ClaimResult {
				t.Helper()
				res, err := store.Claim(ctx, idempotency.ClaimRequest{Scope: "alice", Key: "k", Fingerprint: fp,
					Lease: time.Second, TTL: time.Hour})
				if err != nil || !res.Claimed {
					t.Fatalf("claim: %+v, %v", res, err)
				}
				return res
			}
			old := claimAt()
			clock.Advance(2 * time.Second) // past the old owner's lease
			taken := claimAt()
			if !taken.TookOver || taken.Token <= old.Token {
				t.Fatalf("takeover: %+v after token %d", taken, old.Token)
			}

			// The old owner finishes late: its payment and its completion must not commit.
			run := func(token int64) *httptest.ResponseRecorder {
				c := idempotency.NewClaim("alice", "k", fp, token, time.Hour)
				r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
				r.Header.Set("Authorization", "Bearer alice")
				r.Header.Set("Content-Type", "application/json")
				r = r.WithContext(idempotency.NewContext(r.Context(), c))
				w := httptest.NewRecorder()
				s.create.ServeHTTP(w, r) // the handler the middleware would run
				return w
			}
			if w := run(old.Token); w.Code != http.StatusConflict {
				t.Errorf("stale owner: %d %s, want 409", w.Code, w.Body)
			}
			if n := count(t, s, ""); n != 0 {
				t.Fatalf("ledger has %d rows from the stale owner, want 0", n)
			}
			rec, err := store.Get(ctx, "alice", "k")
			if err != nil || rec.State != idempotency.StateInProgress || rec.Token != taken.Token {
				t.Fatalf("record after the stale completion: %+v, %v", rec, err)
			}

			// The new owner completes.
			if w := run(taken.Token); w.Code != http.StatusCreated {
				t.Fatalf("new owner: %d %s", w.Code, w.Body)
			}
			rec, err = store.Get(ctx, "alice", "k")
			if err != nil || rec.State != idempotency.StateDone || rec.Token != taken.Token || rec.Response.Status != http.StatusCreated {
				t.Errorf("record after the new owner: %+v, %v", rec, err)
			}
			if n := count(t, s, ""); n != 1 {
				t.Errorf("ledger has %d rows, want 1", n)
			}
		})
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	if _, err := OpenSQLite(context.Background(), SQLiteConfig{}); err == nil {
		t.Error("OpenSQLite without a path: no error")
	}
	if _, err := NewPostgres(context.Background(), PostgresConfig{}); err == nil {
		t.Error("NewPostgres without a pool: no error")
	}
	if _, err := OpenSQLite(context.Background(), SQLiteConfig{Config: Config{Mode: 7}, Path: filepath.Join(t.TempDir(), "x.db")}); err == nil {
		t.Error("unknown mode: no error")
	}
	for m, want := range map[Mode]string{ModeTx: "tx", ModeMiddleware: "middleware", ModeUnprotected: "unprotected", 9: "Mode(9)"} {
		if m.String() != want {
			t.Errorf("Mode(%d).String() = %q", int(m), m.String())
		}
	}
}
