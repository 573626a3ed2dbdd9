package bench

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/examples/payments/ledger"
	"github.com/retrysafe/retrysafe/harness/testenv"
)

const (
	// clients is the number of concurrent HTTP clients.
	clients = 32
	// pgMaxConns leaves a connection for every client plus the middleware's extra
	// calls (a lease renewal while the handler holds one).
	pgMaxConns = 40
)

// BenchmarkPayments measures POST /payments of the payments example over real HTTP
// (loopback) with 32 concurrent clients, each request a new payment under a new
// Idempotency-Key, in each mode: unprotected (the baseline), middleware (the ledger
// insert in its own transaction, then the completion) and tx-mode (the ledger insert and
// the completion in one transaction), on PostgreSQL and then on SQLite. It reports
// requests per second; compare modes of the same run.
func BenchmarkPayments(b *testing.B) {
	cases := []struct {
		name string
		open func(b *testing.B, cfg ledger.Config) *ledger.Server
		mode ledger.Mode
	}{
		{"unprotected", openPostgres, ledger.ModeUnprotected},
		{"middleware", openPostgres, ledger.ModeMiddleware},
		{"tx-mode", openPostgres, ledger.ModeTx},
		{"sqlite-unprotected", openSQLite, ledger.ModeUnprotected},
		{"sqlite-middleware", openSQLite, ledger.ModeMiddleware},
		{"sqlite-tx", openSQLite, ledger.ModeTx},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
			srv := c.open(b, ledger.Config{Mode: c.mode, Logger: logger})
			ts := httptest.NewServer(srv)
			b.Cleanup(ts.Close)
			tr := &http.Transport{MaxIdleConns: 2 * clients, MaxIdleConnsPerHost: 2 * clients}
			b.Cleanup(tr.CloseIdleConnections)
			client := &http.Client{Transport: tr}
			prefix := testenv.Name("bench")
			var seq atomic.Int64

			b.SetParallelism((clients + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := pay(client, ts.URL, prefix+"-"+strconv.FormatInt(seq.Add(1), 10)); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
		})
	}
}

// pay POSTs one payment and checks it was made.
func pay(client *http.Client, url, key string) error {
	req, err := http.NewRequest(http.MethodPost, url+"/payments", strings.NewReader(paymentBody))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer bench")
	req.Header.Set("Idempotency-Key", key)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusCreated {
		return &statusError{resp.StatusCode, string(body)}
	}
	return nil
}

type statusError struct {
	status int
	body   string
}

func (e *statusError) Error() string {
	return "POST /payments: " + strconv.Itoa(e.status) + " " + e.body
}

// openPostgres makes a server in a new schema, dropped when the benchmark ends.
func openPostgres(b *testing.B, cfg ledger.Config) *ledger.Server {
	b.Helper()
	ctx := context.Background()
	schema := testenv.Schema(b, "bench") // before the pool: dropped after it is closed
	pool := testenv.PostgresPool(b, pgMaxConns)
	srv, err := ledger.NewPostgres(ctx, ledger.PostgresConfig{Config: cfg, Pool: pool, Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	return srv
}

// openSQLite makes a server on a new file in a temporary directory.
func openSQLite(b *testing.B, cfg ledger.Config) *ledger.Server {
	b.Helper()
	srv, err := ledger.OpenSQLite(context.Background(), ledger.SQLiteConfig{Config: cfg, Path: filepath.Join(b.TempDir(), "payments.db")})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := srv.Close(); err != nil {
			b.Error(err)
		}
	})
	return srv
}

// BenchmarkPaymentsInterleaved measures the same three modes as BenchmarkPayments, but
// in rounds: each op is one round in which every mode, in rotating order, serves a burst
// of 512 new payments from 32 concurrent clients. Load from the rest of the machine then
// falls on every mode alike, and the ratios it reports (middleware/unprotected,
// tx/unprotected) are the figures to quote; req/s of each mode is reported beside them.
func BenchmarkPaymentsInterleaved(b *testing.B) {
	const burst = 512
	for _, db := range []struct {
		name string
		open func(b *testing.B, cfg ledger.Config) *ledger.Server
	}{{"postgres", openPostgres}, {"sqlite", openSQLite}} {
		b.Run(db.name, func(b *testing.B) {
			type target struct {
				mode   ledger.Mode
				url    string
				client *http.Client
				busy   time.Duration
				n      int
			}
			logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
			var targets []*target
			for _, mode := range []ledger.Mode{ledger.ModeUnprotected, ledger.ModeMiddleware, ledger.ModeTx} {
				ts := httptest.NewServer(db.open(b, ledger.Config{Mode: mode, Logger: logger}))
				b.Cleanup(ts.Close)
				tr := &http.Transport{MaxIdleConns: 2 * clients, MaxIdleConnsPerHost: 2 * clients}
				b.Cleanup(tr.CloseIdleConnections)
				targets = append(targets, &target{mode: mode, url: ts.URL, client: &http.Client{Transport: tr}})
			}
			prefix := testenv.Name("bench")
			var seq atomic.Int64
			run := func(t *target) error {
				var next atomic.Int64
				errs := make(chan error, clients)
				start := time.Now()
				var wg sync.WaitGroup
				for range clients {
					wg.Go(func() {
						for next.Add(1) <= burst {
							if err := pay(t.client, t.url, prefix+"-"+strconv.FormatInt(seq.Add(1), 10)); err != nil {
								errs <- err
								return
							}
						}
					})
				}
				wg.Wait()
				t.busy += time.Since(start)
				t.n += burst
				close(errs)
				return <-errs
			}
			round := 0
			for b.Loop() {
				for i := range targets {
					if err := run(targets[(round+i)%len(targets)]); err != nil {
						b.Fatal(err)
					}
				}
				round++
			}
			rate := func(t *target) float64 { return float64(t.n) / t.busy.Seconds() }
			for _, t := range targets {
				b.ReportMetric(rate(t), t.mode.String()+"-req/s")
			}
			b.ReportMetric(rate(targets[1])/rate(targets[0]), "middleware/unprotected")
			b.ReportMetric(rate(targets[2])/rate(targets[0]), "tx/unprotected")
		})
	}
}
