package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
	"github.com/retrysafe/retrysafe/idempotency/pgstore"
	"github.com/retrysafe/retrysafe/idempotency/redisstore"
	"github.com/retrysafe/retrysafe/idempotency/sqlitestore"
)

const (
	gwClients = 32  // concurrent clients
	gwBurst   = 512 // requests per target per round
)

var gwResponse = []byte(`{"id":"pay_1","amount":1250,"currency":"EUR","status":"succeeded"}` + "\n")

// gwUpstream answers every request 201 with a small JSON body, as a payments API's POST
// does, after reading the request's body.
func gwUpstream(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(gwResponse)
}

// BenchmarkGateway measures the gateway (package gateway, as `retrysafe gateway` runs it)
// in front of an upstream, on each store, against calling the upstream directly. Every
// hop is real TCP on loopback. Each op is one round in which every target, in rotating
// order, serves a burst of 512 POSTs with new keys from 32 concurrent clients, so load
// from the rest of the machine falls on every target alike. The targets: direct (the
// upstream alone), proxy (a bare httputil.ReverseProxy in front of it: the extra hop
// without the idempotency layer), and the gateway on memory, sqlite, postgres and
// redis. It reports per target req/s, the median and 99th percentile latency, and the
// throughput ratio to direct.
//
//	cd bench && go test -run '^$' -bench BenchmarkGateway -benchtime 20x
func BenchmarkGateway(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(gwUpstream))
	b.Cleanup(up.Close)
	upURL, _ := url.Parse(up.URL)
	logger := slog.New(slog.DiscardHandler)

	type target struct {
		name   string
		url    string
		client *http.Client
		busy   time.Duration
		n      int
		lat    []time.Duration
	}
	newTarget := func(name, base string) *target {
		tr := &http.Transport{MaxIdleConns: 2 * gwClients, MaxIdleConnsPerHost: 2 * gwClients}
		b.Cleanup(tr.CloseIdleConnections)
		return &target{name: name, url: base, client: &http.Client{Transport: tr}}
	}
	// proxy is a bare httputil.ReverseProxy: the cost of the extra hop alone, without
	// the idempotency layer.
	proxy := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(upURL); pr.SetXForwarded() },
		Transport: &http.Transport{MaxIdleConns: 2 * gwClients, MaxIdleConnsPerHost: 2 * gwClients},
	})
	b.Cleanup(proxy.Close)
	targets := []*target{newTarget("direct", up.URL), newTarget("proxy", proxy.URL)}
	for _, s := range []struct {
		name string
		open func(b *testing.B) idempotency.Store
	}{
		{"memory", func(*testing.B) idempotency.Store { return memstore.New() }},
		{"sqlite", gwSQLite},
		{"postgres", gwPostgres},
		{"redis", gwRedis},
	} {
		gw, err := gateway.New(gateway.Config{
			Upstream: upURL,
			Logger:   logger,
			Idempotency: idempotency.Config{
				Store: s.open(b),
			},
		})
		if err != nil {
			b.Fatal(err)
		}
		front := httptest.NewServer(gw)
		b.Cleanup(front.Close)
		targets = append(targets, newTarget(s.name, front.URL))
	}

	prefix := testenv.Name("gwbench")
	var seq atomic.Int64
	body := `{"amount":1250,"currency":"EUR"}`
	run := func(t *target) error {
		var next atomic.Int64
		errs := make(chan error, gwClients)
		lat := make([][]time.Duration, gwClients)
		start := time.Now()
		var wg sync.WaitGroup
		for c := range gwClients {
			wg.Go(func() {
				for next.Add(1) <= gwBurst {
					key := prefix + "-" + strconv.FormatInt(seq.Add(1), 10)
					t0 := time.Now()
					if err := gwPost(t.client, t.url+"/payments", key, body); err != nil {
						errs <- fmt.Errorf("%s: %w", t.name, err)
						return
					}
					lat[c] = append(lat[c], time.Since(t0))
				}
			})
		}
		wg.Wait()
		t.busy += time.Since(start)
		t.n += gwBurst
		for _, l := range lat {
			t.lat = append(t.lat, l...)
		}
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
		slices.Sort(t.lat)
		q := func(p float64) float64 {
			return float64(t.lat[int(p*float64(len(t.lat)-1))]) / float64(time.Millisecond)
		}
		b.ReportMetric(rate(t), t.name+"-req/s")
		b.ReportMetric(q(0.50), t.name+"-p50-ms")
		b.ReportMetric(q(0.99), t.name+"-p99-ms")
		if t.name != "direct" {
			b.ReportMetric(rate(t)/rate(targets[0]), t.name+"/direct")
		}
	}
}

func gwPost(client *http.Client, url, key, body string) error {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	res, err := client.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if _, err := io.Copy(io.Discard, res.Body); err != nil {
		return err
	}
	if res.StatusCode != http.StatusCreated || res.Header.Get("Idempotent-Replayed") != "" {
		return fmt.Errorf("key %s: status %d, replayed %q", key, res.StatusCode, res.Header.Get("Idempotent-Replayed"))
	}
	return nil
}

func gwSQLite(b *testing.B) idempotency.Store {
	s, err := sqlitestore.Open(context.Background(), sqlitestore.Config{Path: filepath.Join(b.TempDir(), "gw.db")})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

func gwPostgres(b *testing.B) idempotency.Store {
	ctx := context.Background()
	schema := testenv.Schema(b, "gwbench") // before the pool: dropped after it is closed
	pool := testenv.PostgresPool(b, gwClients)
	s, err := pgstore.New(pgstore.Config{Pool: pool, Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	return s
}

func gwRedis(b *testing.B) idempotency.Store {
	opt, err := redis.ParseURL(testenv.RedisURL(b))
	if err != nil {
		b.Fatal(err)
	}
	opt.PoolSize = gwClients
	client := redis.NewClient(opt)
	prefix := testenv.Name("gwbench") + ":"
	b.Cleanup(func() {
		ctx := context.Background()
		iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
			if len(keys) == 1000 {
				client.Del(ctx, keys...)
				keys = keys[:0]
			}
		}
		if len(keys) > 0 {
			client.Del(ctx, keys...)
		}
		_ = client.Close()
	})
	s, err := redisstore.New(redisstore.Config{Client: client, Prefix: prefix})
	if err != nil {
		b.Fatal(err)
	}
	return s
}
