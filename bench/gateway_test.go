package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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
					if err := gwPost(t.client, t.url+"/payments", key, body, false); err != nil {
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

// gwPost posts one keyed request and reads its answer, which must be a 201, and a
// first execution (not a replay) unless replayOK.
func gwPost(client *http.Client, url, key, body string, replayOK bool) error {
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
	if res.StatusCode != http.StatusCreated || !replayOK && res.Header.Get("Idempotent-Replayed") != "" {
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

// gwCPUBurst is the requests each subject serves per mode per round of
// BenchmarkGatewayProcessCPU: enough for its CPU, counted in clock ticks of 10 ms, to be
// read to a few percent in each burst.
const gwCPUBurst = 10000

// BenchmarkGatewayProcessCPU measures the CPU that a proxy process spends per request:
// the gateway (the retrysafe binary, memory store), a bare httputil.ReverseProxy
// (cmd/bareproxy: the gateway's transport and server settings, nothing else) and, when
// it is on the PATH, nginx, each a process of its own in front of the same
// upstream, over loopback, with 32 concurrent keep-alive clients. The upstream and the
// clients run in the benchmark's process, so the subject's CPU (user + system, from
// /proc/PID/stat) is its own alone, whatever else the machine runs. Each op is one
// round in which every subject, in rotating order, serves a burst of new-key requests
// (every request a new Idempotency-Key: claim, forward, complete) and a burst of
// replays (one key, answered from the store). The bare proxy and nginx forward both
// kinds. It reports each subject's CPU µs per request over the whole run, and the
// gateway's against nginx's and the bare proxy's forwarded request.
//
// GWCPU_GATEWAY names the gateway binaries, as name=path pairs separated by commas
// (an A/B of two builds in one interleaved run); unset, it builds ../cmd/retrysafe.
// GWCPU_MODES=new-key (or replay) measures one kind of request only, as for a profile
// of the gateway's process (perf record -p PID).
//
//	cd bench && go test -run '^$' -bench BenchmarkGatewayProcessCPU -benchtime 5x
func BenchmarkGatewayProcessCPU(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(gwUpstream))
	b.Cleanup(up.Close)

	type subject struct {
		name string
		url  string
		pid  int
	}
	var subjects []*subject
	start := func(name string, cmd *exec.Cmd, addr string) {
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		b.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		})
		if err := waitListening(addr); err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		subjects = append(subjects, &subject{name: name, url: "http://" + addr, pid: cmd.Process.Pid})
	}

	gateways := os.Getenv("GWCPU_GATEWAY")
	if gateways == "" {
		bin := filepath.Join(b.TempDir(), "retrysafe")
		build := exec.Command("go", "build", "-o", bin, "./cmd/retrysafe")
		build.Dir = ".."
		if out, err := build.CombinedOutput(); err != nil {
			b.Fatalf("go build: %v\n%s", err, out)
		}
		gateways = "gateway=" + bin
	}
	for pair := range strings.SplitSeq(gateways, ",") {
		name, bin, ok := strings.Cut(pair, "=")
		if !ok {
			b.Fatalf("GWCPU_GATEWAY: %q is not name=path", pair)
		}
		addr := freeAddr(b)
		start(name, exec.Command(bin, "gateway", "--upstream", up.URL, "--listen", addr, "--admin", "off",
			"--store", "memory:", "--log-level", "warn"), addr)
	}
	bareBin := filepath.Join(b.TempDir(), "bareproxy")
	if out, err := exec.Command("go", "build", "-o", bareBin, "./cmd/bareproxy").CombinedOutput(); err != nil {
		b.Fatalf("go build ./cmd/bareproxy: %v\n%s", err, out)
	}
	addr := freeAddr(b)
	start("bare", exec.Command(bareBin, "--listen", addr, "--upstream", up.URL), addr)
	if nginx, err := exec.LookPath("nginx"); err == nil {
		addr := freeAddr(b)
		dir := b.TempDir()
		conf := filepath.Join(dir, "nginx.conf")
		if err := os.WriteFile(conf, []byte(nginxConf(dir, addr, strings.TrimPrefix(up.URL, "http://"))), 0o644); err != nil {
			b.Fatal(err)
		}
		start("nginx", exec.Command(nginx, "-p", dir, "-c", conf), addr)
	} else {
		b.Log("nginx is not on the PATH: measured without it")
	}

	client := &http.Client{Transport: &http.Transport{MaxIdleConns: 2 * gwClients, MaxIdleConnsPerHost: 2 * gwClients}}
	b.Cleanup(client.CloseIdleConnections)
	prefix := testenv.Name("gwcpu")
	var seq atomic.Int64
	body := `{"amount":1250,"currency":"EUR"}`
	// Each subject's replayed key, completed once before the measurement.
	for _, s := range subjects {
		if err := gwPost(client, s.url+"/payments", prefix+"-replay", body, false); err != nil {
			b.Fatal(err)
		}
	}
	modes := []string{"new-key", "replay"}
	if m := os.Getenv("GWCPU_MODES"); m != "" {
		modes = strings.Split(m, ",")
	}
	type tally struct {
		ticks int64
		n     int
	}
	cpu := map[string]*tally{}
	burst := func(s *subject, mode string) error {
		var next atomic.Int64
		errs := make(chan error, gwClients)
		before, err := procTicks(s.pid)
		if err != nil {
			return err
		}
		var wg sync.WaitGroup
		for range gwClients {
			wg.Go(func() {
				for next.Add(1) <= gwCPUBurst {
					key := prefix + "-replay"
					if mode == "new-key" {
						key = prefix + "-" + strconv.FormatInt(seq.Add(1), 10)
					}
					if err := gwPost(client, s.url+"/payments", key, body, true); err != nil {
						errs <- fmt.Errorf("%s %s: %w", s.name, mode, err)
						return
					}
				}
			})
		}
		wg.Wait()
		after, err := procTicks(s.pid)
		if err != nil {
			return err
		}
		t := cpu[s.name+"/"+mode]
		if t == nil {
			t = &tally{}
			cpu[s.name+"/"+mode] = t
		}
		t.ticks += after - before
		t.n += gwCPUBurst
		close(errs)
		return <-errs
	}
	round := 0
	for b.Loop() {
		for i := range subjects {
			s := subjects[(round+i)%len(subjects)]
			for j := range modes {
				if err := burst(s, modes[(round+j)%len(modes)]); err != nil {
					b.Fatal(err)
				}
			}
		}
		round++
	}
	usPerReq := func(name string) float64 {
		t := cpu[name]
		if t == nil || t.n == 0 {
			return 0
		}
		return float64(t.ticks) * 1e6 / clockTicks / float64(t.n)
	}
	for _, s := range subjects {
		for _, mode := range modes {
			b.ReportMetric(usPerReq(s.name+"/"+mode), s.name+"-"+mode+"-cpu-µs/req")
		}
	}
	for _, s := range subjects {
		if s.name == "bare" || s.name == "nginx" {
			continue
		}
		for _, mode := range modes {
			us := usPerReq(s.name + "/" + mode)
			if n := usPerReq("nginx/new-key"); n > 0 {
				b.ReportMetric(us/n, s.name+"-"+mode+"/nginx")
			}
			b.ReportMetric(us/usPerReq("bare/new-key"), s.name+"-"+mode+"/bare")
		}
	}
}

// nginxConf is a minimal nginx reverse proxy on addr in front of upstream (host:port),
// as the gateway is run: one process, no access log, HTTP/1.1 keep-alive connections to
// the upstream, the X-Forwarded headers set, request bodies buffered.
func nginxConf(dir, addr, upstream string) string {
	return `daemon off;
master_process off;
worker_processes 1;
pid ` + dir + `/nginx.pid;
error_log ` + dir + `/error.log warn;
events { worker_connections 1024; }
http {
	access_log off;
	client_body_temp_path ` + dir + `/body;
	proxy_temp_path ` + dir + `/proxy;
	fastcgi_temp_path ` + dir + `/fastcgi;
	uwsgi_temp_path ` + dir + `/uwsgi;
	scgi_temp_path ` + dir + `/scgi;
	keepalive_requests 1000000;
	upstream up {
		server ` + upstream + `;
		keepalive 64;
		keepalive_requests 1000000;
	}
	server {
		listen ` + addr + `;
		location / {
			proxy_pass http://up;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
			proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
			proxy_set_header X-Forwarded-Host $host;
			proxy_set_header X-Forwarded-Proto $scheme;
		}
	}
}
`
}

// clockTicks is USER_HZ, the unit of the CPU times in /proc/PID/stat.
const clockTicks = 100

// procTicks returns the user + system CPU time of process pid, all its threads, in
// clock ticks.
func procTicks(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: the fields are after its ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	// utime and stime are fields 14 and 15 of stat(5); f[0] is field 3.
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return ut + st, nil
}

// freeAddr returns a loopback address whose port nothing listened on a moment ago.
func freeAddr(b *testing.B) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// waitListening waits until addr accepts connections, for up to 30 s.
func waitListening(addr string) error {
	var err error
	for range 300 {
		var c net.Conn
		if c, err = net.DialTimeout("tcp", addr, time.Second); err == nil {
			return c.Close()
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s does not accept connections: %w", addr, err)
}
