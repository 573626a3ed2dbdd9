package main

// End-to-end tests of "one execution per key" on every link, through the built binary
// with default flags where the case allows: the gateway's own resends to the upstream,
// store outages, slow clients, and inputs that could slip around the contract. The
// upstreams here never deduplicate: each counts every request it executes.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/dropserver"
	"github.com/retrysafe/retrysafe/harness/tcpproxy"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
)

// TestE2ENoResendByTheGateway: a keyed request the upstream read on a reused keep-alive
// connection and never answered is forwarded once, never resent by the gateway's HTTP
// client on its own: its outcome is unknown, so the key is kept to its lease.
func TestE2ENoResendByTheGateway(t *testing.T) {
	t.Parallel()
	for _, s := range storeDSNs {
		for _, reset := range []bool{false, true} {
			for _, body := range []string{`{"amount":100}`, ""} {
				if s.name != "sqlite" && (reset || body == "") {
					continue // the whole matrix on the default store, one case on the others
				}
				name := fmt.Sprintf("%s/reset=%v/body=%d", s.name, reset, len(body))
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					up := dropserver.New(t, reset)
					gw := startGateway(t, nil, "--store", s.dsn(t), "--upstream", up.URL())
					ctx := context.Background()
					warm, k := testenv.Name("warm"), testenv.Name("once")
					if r := post(ctx, gw.addr, "/pay", warm, body); r.status != 201 {
						t.Fatalf("first request on the connection: %v", r)
					}
					r := post(ctx, gw.addr, "/pay", k, body) // the second on the same connection
					if n := up.ReadsOf(k); n != 1 {
						t.Fatalf("the upstream executed the request %d times (the gateway resent it); the client got %v", n, r)
					}
					if r.status != 502 || r.problem() != "urn:retrysafe:problem:upstream-failed" {
						t.Errorf("client got %v, want 502 upstream-failed (outcome unknown)", r)
					}
					if again := post(ctx, gw.addr, "/pay", k, body); again.status != 409 || up.ReadsOf(k) != 1 {
						t.Errorf("retry within the lease: %v, %d executions; want 409 and 1", again, up.ReadsOf(k))
					}
				})
			}
		}
	}
}

// sqliteDSN is the default kind of store, in a file of the test's own.
func sqliteDSN(t *testing.T) string { return storeDSNs[0].dsn(t) }

// TestE2ENonCanonicalMethod: "post" is no way around the key rules.
func TestE2ENonCanonicalMethod(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	gw := startGateway(t, nil, "--store", sqliteDSN(t), "--upstream", up.URL)
	for _, key := range []string{"", testenv.Name("lower")} {
		for range 2 {
			req, err := http.NewRequest("post", gw.addr+"/pay", strings.NewReader(`{}`))
			if err != nil {
				t.Fatal(err)
			}
			if key != "" {
				req.Header.Set("Idempotency-Key", key)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode != 400 {
				t.Errorf("post with key %q: %d, want 400", key, res.StatusCode)
			}
		}
	}
	if n := up.calls.Load(); n != 0 {
		t.Errorf("the upstream executed %d lowercase posts, want 0", n)
	}
}

// proxiedStore returns a store DSN of kind ("postgres" or "redis") whose connections go
// through a TCP proxy the test can cut, and the direct DSN of the same store.
func proxiedStore(t *testing.T, kind string) (proxied, direct string, p *tcpproxy.Proxy) {
	t.Helper()
	switch kind {
	case "postgres":
		direct = postgresDSN(t)
	case "redis":
		direct = redisDSN(t)
	default:
		t.Fatalf("no proxied store %q", kind)
	}
	proxied, p = proxyTo(t, direct)
	return proxied, direct, p
}

// proxyTo returns the DSN of the store at direct through a TCP proxy of its own (a
// replica's link to the store, which the test may cut), and the proxy.
func proxyTo(t *testing.T, direct string) (string, *tcpproxy.Proxy) {
	t.Helper()
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	p, err := tcpproxy.New(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	u.Host = p.Addr()
	return u.String(), p
}

// leaseRanOut reports whether key is in progress with its lease run out, on the clock
// of the store at dsn (read with `retrysafe keys list`, which says so).
func leaseRanOut(t *testing.T, dsn, key string) bool {
	t.Helper()
	out, code := runBinary(t, "keys", "list", "--store", dsn, "--key", key)
	if code != 0 {
		t.Fatalf("keys list: %d %s", code, out)
	}
	for line := range strings.Lines(out) {
		if strings.Contains(line, key) && strings.Contains(line, "in_progress") && strings.Contains(line, "expired") {
			return true
		}
	}
	return false
}

// keyState returns the state of key in the store at dsn ("in_progress", "done" or
// "missing"), read with `retrysafe keys show`.
func keyState(t *testing.T, dsn, key string) string {
	t.Helper()
	out, code := runBinary(t, "keys", "show", "--store", dsn, "--key", key)
	switch {
	case code != 0 && strings.Contains(out, "not found"):
		return "missing"
	case code != 0:
		t.Fatalf("keys show: %d %s", code, out)
	case strings.Contains(out, "in_progress"):
		return "in_progress"
	case strings.Contains(out, "done"):
		return "done"
	}
	t.Fatalf("keys show: %s", out)
	return ""
}

// TestE2EStoreOutageAtCompletion: the store cannot be reached when the answer is to be
// stored, and stays away until the key's lease has run out on it. The client gets its
// answer; the gateway keeps it, with its lease, and stores it when the store is back;
// the retry after the outage is a replay, not a second execution.
func TestE2EStoreOutageAtCompletion(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	for _, kind := range []string{"postgres", "redis"} {
		// A cut refuses at once; a stall holds every store call until its timeout.
		for _, stall := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stall=%v", kind, stall), func(t *testing.T) {
				t.Parallel()
				proxied, direct, store := proxiedStore(t, kind)
				up := newUpstream(t)
				gw := startGateway(t, nil, "--store", proxied, "--upstream", up.URL, "--lease", lease.String())
				ctx := context.Background()
				k := testenv.Name("outage")
				first := make(chan reply, 1)
				go func() { first <- post(ctx, gw.addr, "/held-once", k, `{"amount":1}`) }()
				await(t, "the request upstream", 10*time.Second, up.arrived(k))
				if stall {
					store.Stall()
				} else {
					store.Cut()
				}
				up.release(k)
				if r := <-first; r.status != 201 {
					t.Fatalf("first: %v", r)
				}
				// A retry during the outage is not executed.
				if r := post(ctx, gw.addr, "/held-once", k, `{"amount":1}`); up.callsFor(k) != 1 ||
					!(r.status == 201 && r.header.Get("Idempotent-Replayed") == "true" || r.status == 503) {
					t.Fatalf("retry during the outage: %v, %d executions", r, up.callsFor(k))
				}
				// The store stays away until the owner's lease has run out on its clock: a
				// store deciding by the lease alone would now let the retry run again.
				waitFor(t, "the lease to run out on the store", 4*lease, func() bool { return leaseRanOut(t, direct, k) })
				store.Restore()
				r := post(ctx, gw.addr, "/held-once", k, `{"amount":1}`)
				if up.callsFor(k) != 1 {
					t.Fatalf("the retry after the outage executed again (%d executions): %v", up.callsFor(k), r)
				}
				if r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" {
					t.Errorf("retry after the outage: %v, want the replayed 201", r)
				}
				// Stored within a few seconds of the store's return.
				waitFor(t, "the answer stored", 5*time.Second, func() bool { return keyState(t, direct, k) == "done" })
			})
		}
	}
}

// TestE2EStoreOutageDuringUpstreamCall: two replicas on one store, which goes away from
// the owner, replica A, while the upstream works, until the key's lease has run out on
// it. A's heartbeats fail; a retry on replica B must not take the key over beside the
// live owner. B either shares A's link and saw the outage (the retry comes once the store
// is back), or was not running: started while A is still cut off, over a link of its own
// that never failed, it has heard nothing of the store's past, so it holds takeovers back
// for a lease from its first claim (A's link returns after the retry).
func TestE2EStoreOutageDuringUpstreamCall(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	for _, kind := range []string{"postgres", "redis"} {
		for _, later := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/B started after=%v", kind, later), func(t *testing.T) {
				t.Parallel()
				proxied, direct, linkA := proxiedStore(t, kind)
				up := newUpstream(t)
				// reject: the retry beside the live owner is answered 409 at once, while
				// the owner's request is held (waiting, it would wait for it).
				args := []string{"--upstream", up.URL, "--lease", lease.String(), "--conflict", "reject"}
				a := startGateway(t, nil, append(args, "--store", proxied)...)
				var b *proc
				if !later {
					b = startGateway(t, nil, append(args, "--store", proxied)...)
				}
				ctx := context.Background()
				k := testenv.Name("long")
				first := make(chan reply, 1)
				go func() { first <- post(ctx, a.addr, "/held-once", k, `{}`) }()
				await(t, "the request upstream", 10*time.Second, up.arrived(k))
				linkA.Cut()
				waitFor(t, "the lease to run out on the store", 4*lease, func() bool { return leaseRanOut(t, direct, k) })
				if !later {
					linkA.Restore()
					leftToItsOwner(ctx, t, up, b, k, first, "the other replica", func() {})
					return
				}
				linkB, _ := proxyTo(t, direct)
				b = startGateway(t, nil, append(args, "--store", linkB)...)
				leftToItsOwner(ctx, t, up, b, k, first, "a replica just started", linkA.Restore)
			})
		}
	}
}

// leftToItsOwner checks that a retry of k on replica b (who) is not executed while the
// owner's request, whose answer first will carry, is still held upstream: b answers 409.
// Then it calls back (the owner's link returns, if it was away), lets the owner finish,
// and checks that b replays the owner's answer, the upstream having executed k once.
func leftToItsOwner(ctx context.Context, t *testing.T, up *upstream, b *proc, k string, first <-chan reply, who string, back func()) {
	t.Helper()
	r := post(ctx, b.addr, "/held-once", k, `{}`)
	if up.callsFor(k) != 1 {
		t.Fatalf("%s took the key over beside its live owner (%d executions): %v", who, up.callsFor(k), r)
	}
	if r.status != 409 {
		t.Errorf("retry on %s: %v, want 409", who, r)
	}
	back()
	up.release(k)
	if r := <-first; r.status != 201 {
		t.Fatalf("owner: %v", r)
	}
	waitFor(t, "the replay on "+who, 10*time.Second, func() bool {
		r = post(ctx, b.addr, "/held-once", k, `{}`)
		return r.status != 409
	})
	if r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" || up.callsFor(k) != 1 {
		t.Fatalf("after the owner finished: %v, %d executions", r, up.callsFor(k))
	}
}

// TestE2ESIGTERMStoresHeldAnswers: a gateway told to stop while it holds an answer the
// store could not take stores it when the store comes back within the shutdown
// timeout, and otherwise says which key it could not store.
func TestE2ESIGTERMStoresHeldAnswers(t *testing.T) {
	t.Parallel()
	for _, back := range []bool{true, false} {
		t.Run(fmt.Sprintf("store back=%v", back), func(t *testing.T) {
			t.Parallel()
			proxied, direct, store := proxiedStore(t, "postgres")
			up := newUpstream(t)
			gw := startGateway(t, nil, "--store", proxied, "--upstream", up.URL, "--lease", "2s", "--shutdown-timeout", "4s")
			ctx := context.Background()
			k := testenv.Name("drain")
			first := make(chan reply, 1)
			go func() { first <- post(ctx, gw.addr, "/held-once", k, `{}`) }()
			await(t, "the request upstream", 10*time.Second, up.arrived(k))
			store.Cut()
			up.release(k)
			if r := <-first; r.status != 201 {
				t.Fatalf("first: %v", r)
			}
			if err := gw.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if back {
				// The store comes back once the gateway is shutting down: it has stopped
				// accepting, and holds the answer still.
				addr := strings.TrimPrefix(gw.addr, "http://")
				waitFor(t, "the gateway to stop accepting", 10*time.Second, func() bool { return refusing(addr) })
				store.Restore()
				if code := gw.wait(15 * time.Second); code != 0 {
					t.Errorf("exit status %d, want 0", code)
				}
				if s := keyState(t, direct, k); s != "done" {
					t.Errorf("after the drain the key is %s, want done", s)
				}
				return
			}
			if code := gw.wait(15 * time.Second); code == 0 {
				t.Errorf("exit status 0 with an answer not stored")
			}
			if log := gw.log(); !strings.Contains(log, "not stored before shutdown") || !strings.Contains(log, k) {
				t.Errorf("the log does not name the key it could not store:\n%s", log)
			}
		})
	}
}

// TestE2ESlowReader: a client that reads a large answer slowly gets all of it, and the
// key is completed when the upstream's answer is complete, not when the client has
// read it: the upstream timeout does not cut the client off, and no retry executes again.
func TestE2ESlowReader(t *testing.T) {
	t.Parallel()
	for _, s := range storeDSNs {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			slowReader(t, s.dsn(t))
		})
	}
}

func slowReader(t *testing.T, dsn string) {
	// The answer must come from the upstream well within the upstream timeout (6 MiB
	// takes about a second through a gateway built with the race detector), and reach
	// the client over a read that outlasts the timeout by seconds: far more than the
	// kernel's socket buffers hold, so that the gateway is still writing it when the
	// timeout would have fired.
	const (
		size            = 6 << 20
		upstreamTimeout = 5 * time.Second
		readFor         = upstreamTimeout + 3*time.Second
	)
	up := newUpstream(t)
	gw := startGateway(t, nil, "--store", dsn, "--upstream", up.URL, "--upstream-timeout", upstreamTimeout.String(),
		"--lease", upstreamTimeout.String(), "--max-response", "16MiB")
	k := testenv.Name("slow")
	host := strings.TrimPrefix(gw.addr, "http://")
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 8192) })
	}}
	c, err := d.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /big?bytes=%d HTTP/1.1\r\nHost: %s\r\nIdempotency-Key: %s\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", size, host, k)
	start := time.Now()
	res, err := http.ReadResponse(bufio.NewReaderSize(c, 4096), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.Copy(io.Discard, &pacedReader{r: res.Body, rate: int(size / readFor.Seconds())})
	res.Body.Close()
	if err != nil || got != size || res.StatusCode != 201 {
		t.Fatalf("slow read: status %d, %d of %d bytes in %s, err %v", res.StatusCode, got, size, time.Since(start), err)
	}
	// The answer is held until it is stored, so the key is done by the time the client
	// has it all: not left in progress, to be taken over when its lease ends.
	if s := keyState(t, dsn, k); s != "done" {
		t.Errorf("the key is %s once the answer was read, want done", s)
	}
	if r := post(context.Background(), gw.addr, fmt.Sprintf("/big?bytes=%d", size), k, `{}`); r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" || len(r.body) != size {
		t.Errorf("retry: %d replayed=%q %d bytes", r.status, r.header.Get("Idempotent-Replayed"), len(r.body))
	}
	if n := up.callsFor(k); n != 1 {
		t.Errorf("the upstream executed the request %d times, want 1", n)
	}
}

// pacedReader reads at about rate bytes a second.
type pacedReader struct {
	r     io.Reader
	rate  int
	start time.Time
	n     int
}

func (p *pacedReader) Read(b []byte) (int, error) {
	if p.start.IsZero() {
		p.start = time.Now()
	}
	if due := p.start.Add(time.Duration(p.n) * time.Second / time.Duration(p.rate)); time.Until(due) > 0 {
		// Pacing, not synchronisation: the gateway is a real process whose upstream
		// timeout runs on the real clock, and the read must outlast it.
		time.Sleep(time.Until(due))
	}
	n, err := p.r.Read(b[:min(len(b), 32<<10)])
	p.n += n
	return n, err
}

// TestE2EConnectionHeaderCannotStripTheKey: a client cannot make the key, or the header
// its scope was computed from, hop-by-hop.
func TestE2EConnectionHeaderCannotStripTheKey(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	gw := startGateway(t, nil, "--store", sqliteDSN(t), "--upstream", up.URL)
	for _, hop := range []string{"Idempotency-Key", "idempotency-key", "Authorization", "keep-alive, Authorization"} {
		k := testenv.Name("hop")
		req, err := http.NewRequest(http.MethodPost, gw.addr+"/pay", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Idempotency-Key", k)
		req.Header.Set("Authorization", "Bearer alice")
		req.Header.Set("Connection", hop)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 400 || up.callsFor(k) != 0 || up.callsFor("") != 0 {
			t.Errorf("Connection: %s: %d %s, %d upstream calls with the key, %d without; want 400 and none",
				hop, res.StatusCode, b, up.callsFor(k), up.callsFor(""))
		}
	}
}

// TestE2ERecordCannotExpireWhileRunning: settings under which a record could expire
// while its request still runs are refused at start.
func TestE2ERecordCannotExpireWhileRunning(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--lease", "2s", "--ttl", "3s", "--upstream-timeout", "20s"},
		{"--ttl", "20s", "--upstream-timeout", "30s"},
	} {
		out, code := runBinary(t, append([]string{"gateway", "--upstream", "http://127.0.0.1:1", "--store", "memory:"}, args...)...)
		if code != 2 || strings.Count(strings.TrimSpace(out), "\n") != 0 || !strings.Contains(out, "--ttl") {
			t.Errorf("%v: exit %d, output %q; want exit 2 and one line about --ttl", args, code, out)
		}
	}
}

// TestE2EEscapedPath: the fingerprint covers the path as it is sent upstream, so
// /pay/x%2Fy and /pay/x/y are two requests.
func TestE2EEscapedPath(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	gw := startGateway(t, nil, "--store", sqliteDSN(t), "--upstream", up.URL)
	ctx := context.Background()
	k := testenv.Name("path")
	if r := post(ctx, gw.addr, "/pay/x%2Fy", k, `{}`); r.status != 201 {
		t.Fatalf("first: %v", r)
	}
	if r := post(ctx, gw.addr, "/pay/x/y", k, `{}`); r.status != 422 || r.problem() != idempotency.ProblemMismatch {
		t.Errorf("same key on /pay/x/y: %v, want 422 (not the answer of /pay/x%%2Fy)", r)
	}
}

// rawRequest writes head, then body one byte every gap, on a new connection, and
// returns the response (or an error when there is none).
func rawRequest(addr, head, body string, gap time.Duration) (*http.Response, string, error) {
	c, err := net.Dial("tcp", strings.TrimPrefix(addr, "http://"))
	if err != nil {
		return nil, "", err
	}
	defer c.Close()
	go func() {
		if _, err := io.WriteString(c, head); err != nil {
			return
		}
		for i := range len(body) {
			// Pacing, not synchronisation: the gateway is a real process whose body
			// timeout and budgets run on the real clock, and the body must outlast them.
			time.Sleep(gap)
			if _, err := c.Write([]byte{body[i]}); err != nil {
				return
			}
		}
	}()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return nil, "", err
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return res, string(b), nil
}

// TestE2EBodyMemoryAndTime: request bodies held in memory have a ceiling, and a body
// that does not arrive in time is cut with 408; neither claims anything.
func TestE2EBodyMemoryAndTime(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	gw := startGateway(t, nil, "--store", sqliteDSN(t), "--upstream", up.URL, "--max-body", "1MiB",
		"--max-body-memory", "3MiB", "--body-timeout", "1s")
	ctx := context.Background()
	t.Run("ceiling", func(t *testing.T) {
		body := strings.Repeat("x", 1<<20)
		var keys []string
		replies := make(chan reply, 5)
		for i := range 5 {
			k := testenv.Name(fmt.Sprintf("mem%d", i))
			keys = append(keys, k)
			go func() { replies <- post(ctx, gw.addr, "/held-once", k, body) }()
		}
		waitFor(t, "three requests upstream", 10*time.Second, func() bool {
			n := 0
			for _, k := range keys {
				n += up.callsFor(k)
			}
			return n >= 3
		})
		var overloaded int
		for range 2 {
			r := <-replies
			if r.status != 503 || r.problem() != idempotency.ProblemOverloaded || r.header.Get("Retry-After") == "" {
				t.Errorf("a request past the ceiling: %v, want 503 overloaded with Retry-After", r)
			}
			overloaded++
		}
		for _, k := range keys {
			up.release(k)
		}
		for range 3 {
			if r := <-replies; r.status != 201 {
				t.Errorf("a request within the ceiling: %v", r)
			}
		}
		n := 0
		for _, k := range keys {
			n += up.callsFor(k)
		}
		if n != 3 || overloaded != 2 {
			t.Errorf("%d forwarded, %d refused; want 3 and 2", n, overloaded)
		}
	})
	t.Run("slow body", func(t *testing.T) {
		k := testenv.Name("trickle")
		head := fmt.Sprintf("POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Length: 40\r\n\r\n", k)
		start := time.Now()
		res, body, err := rawRequest(gw.addr, head, strings.Repeat("x", 40), 200*time.Millisecond)
		if err != nil {
			t.Fatalf("no answer to a body sent at 5 bytes/s (after %s): %v", time.Since(start), err)
		}
		if res.StatusCode != 408 || !strings.Contains(body, idempotency.ProblemBodyTimeout) {
			t.Errorf("slow body: %d %s, want 408 body-timeout", res.StatusCode, body)
		}
		if up.callsFor(k) != 0 {
			t.Errorf("a request whose body never arrived was forwarded")
		}
	})
}

// TestE2ETruthfulErrors: an upload slower than the caller's budget is a 504 of its own
// kind, not a store failure; a 409 for a key whose owner gave up says when its lease
// ends.
func TestE2ETruthfulErrors(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	// reject: the 409 of a key whose owner gave up comes at once (waiting, a retry
	// would wait for the 6s lease to end, as it is within the wait's bound).
	gw := startGateway(t, nil, "--store", sqliteDSN(t), "--upstream", up.URL, "--lease", "6s", "--upstream-timeout", "1s",
		"--conflict", "reject")
	t.Run("budget spent on the upload", func(t *testing.T) {
		k := testenv.Name("budget")
		head := fmt.Sprintf("POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nRequest-Budget-Ms: 500\r\nContent-Length: 10\r\n\r\n", k)
		res, body, err := rawRequest(gw.addr, head, strings.Repeat("x", 10), 150*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != 504 || !strings.Contains(body, idempotency.ProblemDeadlineExceeded) {
			t.Errorf("upload slower than the budget: %d %s, want 504 deadline-exceeded", res.StatusCode, body)
		}
		if log := gw.log(); strings.Contains(log, "claim failed") {
			t.Errorf("a slow client was logged as a store failure:\n%s", log)
		}
	})
	t.Run("409 after a 504", func(t *testing.T) {
		k := testenv.Name("gone")
		if r := post(context.Background(), gw.addr, "/slow-once?ms=30000", k, `{}`); r.status != 504 {
			t.Fatalf("first: %v", r)
		}
		r := post(context.Background(), gw.addr, "/slow-once?ms=30000", k, `{}`)
		ra, _ := strconv.Atoi(r.header.Get("Retry-After"))
		if r.status != 409 || ra < 3 || ra > 6 {
			t.Errorf("retry after the 504: %v; want 409 with Retry-After the rest of the 6s lease", r)
		}
	})
}

// TestE2EFidelity: a replay gives back what the first answer carried, header bytes and
// trailers included, on every store; keys follow the structured-field grammar.
func TestE2EFidelity(t *testing.T) {
	t.Parallel()
	for _, s := range storeDSNs {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t)
			gw := startGateway(t, nil, "--store", s.dsn(t), "--upstream", up.URL)
			k := testenv.Name("odd")
			get := func() (*http.Response, string) {
				req, err := http.NewRequest(http.MethodPost, gw.addr+"/odd", strings.NewReader(`{}`))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Idempotency-Key", k)
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(res.Body) // trailers arrive after the body
				res.Body.Close()
				return res, string(b)
			}
			first, firstBody := get()
			again, againBody := get()
			if again.Header.Get("Idempotent-Replayed") != "true" || againBody != firstBody || up.callsFor(k) != 1 {
				t.Fatalf("replay: %v %q, %d executions", again.Header, againBody, up.callsFor(k))
			}
			for _, h := range []string{"X-Latin1", "X-Bytes"} {
				if got, want := again.Header.Values(h), first.Header.Values(h); strings.Join(got, "|") != strings.Join(want, "|") || len(want) == 0 {
					t.Errorf("header %s: replay %q, first %q", h, got, want)
				}
			}
			if got, want := again.Trailer.Get("X-Checksum"), first.Trailer.Get("X-Checksum"); got != want || want == "" {
				t.Errorf("trailer X-Checksum: replay %q, first %q", got, want)
			}
		})
	}
	t.Run("key grammar", func(t *testing.T) {
		t.Parallel()
		up := newUpstream(t)
		gw := startGateway(t, nil, "--store", sqliteDSN(t), "--upstream", up.URL)
		for _, bad := range []string{`"`, `a,b`, `"a", "b"`, `"a";p=1`, `"a\q"`, `a"b`} {
			if r := post(context.Background(), gw.addr, "/pay", bad, `{}`); r.status != 400 || r.problem() != idempotency.ProblemInvalidKey {
				t.Errorf("key %s: %v, want 400 invalid-key", bad, r)
			}
		}
		k := testenv.Name("sf")
		post(context.Background(), gw.addr, "/pay", `"`+k+`"`, `{}`)
		if r := post(context.Background(), gw.addr, "/pay", k, `{}`); r.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("the bare form of a quoted key is not the same key: %v", r)
		}
	})
}

// TestE2EConflictDefault: with the default flags a duplicate of a request in flight
// waits for its answer and gets it replayed; past --max-waiters, and at --wait-timeout,
// a duplicate gets 409 with Retry-After.
func TestE2EConflictDefault(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	gw := startGateway(t, nil, "--store", sqliteDSN(t), "--upstream", up.URL, "--max-waiters", "1")
	short := startGateway(t, nil, "--store", sqliteDSN(t), "--upstream", up.URL, "--wait-timeout", "1s")
	ctx := context.Background()

	k := testenv.Name("wait")
	first, dup := make(chan reply, 1), make(chan reply, 1)
	go func() { first <- post(ctx, gw.addr, "/held-once", k, `{}`) }()
	await(t, "the first request upstream", 10*time.Second, up.arrived(k))
	go func() { dup <- post(ctx, gw.addr, "/held-once", k, `{}`) }()
	waitFor(t, "the duplicate waiting", 10*time.Second, func() bool { return waiting(t, gw) == 1 })
	over := post(ctx, gw.addr, "/held-once", k, `{}`) // past --max-waiters 1
	if over.status != 409 || over.header.Get("Retry-After") == "" || over.problem() != idempotency.ProblemInFlight {
		t.Errorf("past --max-waiters: %v, want 409 in-flight with Retry-After", over)
	}
	up.release(k)
	r, d := <-first, <-dup
	if r.status != 201 || d.status != 201 || d.header.Get("Idempotent-Replayed") != "true" || d.body != r.body {
		t.Errorf("first %v; the waiting duplicate %v, want the first's answer replayed", r, d)
	}
	if n := up.callsFor(k); n != 1 {
		t.Errorf("%d executions, want 1", n)
	}

	k = testenv.Name("bound")
	go func() { first <- post(ctx, short.addr, "/held-once", k, `{}`) }()
	await(t, "the first request upstream", 10*time.Second, up.arrived(k))
	if r := post(ctx, short.addr, "/held-once", k, `{}`); r.status != 409 || r.header.Get("Retry-After") == "" {
		t.Errorf("at --wait-timeout: %v, want 409 with Retry-After", r)
	}
	up.release(k)
	if r := <-first; r.status != 201 || up.callsFor(k) != 1 {
		t.Errorf("first: %v, %d executions", r, up.callsFor(k))
	}
}

// waiting is the gateway's retrysafe_gateway_requests_waiting.
func waiting(t *testing.T, p *proc) int {
	t.Helper()
	res, err := http.Get(p.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "retrysafe_gateway_requests_waiting "); ok {
			n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("requests_waiting %q: %v", v, err)
			}
			return int(n)
		}
	}
	t.Fatalf("no retrysafe_gateway_requests_waiting in /metrics:\n%s", b)
	return 0
}

// TestE2EWaitReplicas: with the default --conflict wait, 50 duplicates of a request that takes the
// upstream a second, sent through two replicas sharing one PostgreSQL or Redis store
// while it runs, all wait for it and get its answer: one execution, 51 successes, no
// client sees an error. The other replica's duplicates learn of its end from the store.
func TestE2EWaitReplicas(t *testing.T) {
	t.Parallel()
	for _, s := range []struct {
		name string
		dsn  func(t *testing.T) string
	}{{"postgres", postgresDSN}, {"redis", redisDSN}} {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			dsn := s.dsn(t)
			up := newUpstream(t)
			a := startGateway(t, nil, "--store", dsn, "--upstream", up.URL)
			b := startGateway(t, nil, "--store", dsn, "--upstream", up.URL, "--conflict", "wait")
			k := testenv.Name("wait")
			const duplicates = 50
			answers := make(chan reply, duplicates+1)
			var wg sync.WaitGroup
			wg.Go(func() { answers <- post(context.Background(), a.addr, "/slow-once?ms=1000", k, `{"n":1}`) })
			await(t, "the first request at the upstream", 20*time.Second, up.arrived(k))
			for i := range duplicates {
				base := a.addr
				if i%2 == 1 {
					base = b.addr
				}
				wg.Go(func() { answers <- post(context.Background(), base, "/slow-once?ms=1000", k, `{"n":1}`) })
			}
			wg.Wait()
			close(answers)
			if n := up.callsFor(k); n != 1 {
				t.Errorf("forwarded %d times, want 1", n)
			}
			var first string
			replayed := 0
			for r := range answers {
				if r.err != nil || r.status != http.StatusCreated {
					t.Errorf("a client saw %v, want 201", r)
					continue
				}
				if first == "" {
					first = r.body
				} else if r.body != first {
					t.Errorf("answers differ: %q and %q", first, r.body)
				}
				if r.header.Get("Idempotent-Replayed") == "true" {
					replayed++
				}
			}
			if replayed != duplicates {
				t.Errorf("%d answers replayed, want %d", replayed, duplicates)
			}
		})
	}
}

// send posts body to base+path with the header pairs given.
func send(t *testing.T, base, path, body string, header ...string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return reply{status: res.StatusCode, header: res.Header, body: string(b), err: err}
}

// TestE2EWebhookKeyInTheBody: a webhook route keyed by the event id in its body, whose
// sender retries with an altered delivery timestamp that the fingerprint ignores,
// executes once on every store: the retries get the replay. The upstream counts the
// executions (it never deduplicates): the event's key header is one the upstream sees
// only through the body, so every forward is an execution.
func TestE2EWebhookKeyInTheBody(t *testing.T) {
	t.Parallel()
	for _, s := range storeDSNs {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t)
			gw := startGateway(t, nil, "--store", s.dsn(t), "--upstream", up.URL,
				"--key-pointer", "/id", "--fingerprint-ignore", "/created", "--scope-none")
			id := testenv.Name("evt")
			var first reply
			for i := range 4 { // the first delivery and three retries
				body := fmt.Sprintf(`{"id":%q,"type":"charge.succeeded","created":%d}`, id, 1700000000+i)
				r := send(t, gw.addr, "/webhooks/stripe", body, "Stripe-Signature", fmt.Sprintf("t=%d", i))
				if r.err != nil || r.status != http.StatusCreated {
					t.Fatalf("delivery %d: %v", i, r)
				}
				if i == 0 {
					first = r
				} else if r.header.Get("Idempotent-Replayed") != "true" || r.body != first.body {
					t.Errorf("retry %d: %v, want the replay of %q", i, r, first.body)
				}
			}
			// The upstream sees no Idempotency-Key: count its calls for the empty key.
			if n := up.callsFor(""); n != 1 {
				t.Errorf("the upstream executed the event %d times, want 1", n)
			}
		})
	}
}

// TestE2ECookieScope: with --scope-cookie, two sessions using one key are two
// operations, and each session's retry is its own replay.
func TestE2ECookieScope(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	gw := startGateway(t, nil, "--store", sqliteDSN(t), "--upstream", up.URL, "--scope-cookie", "session")
	key := testenv.Name("ck")
	a := send(t, gw.addr, "/orders", `{}`, "Idempotency-Key", key, "Cookie", "session=alice")
	b := send(t, gw.addr, "/orders", `{}`, "Idempotency-Key", key, "Cookie", "session=bob")
	again := send(t, gw.addr, "/orders", `{}`, "Idempotency-Key", key, "Cookie", "session=alice")
	if a.status != 201 || b.status != 201 || b.header.Get("Idempotent-Replayed") == "true" {
		t.Fatalf("alice %v, bob %v: want two executions", a, b)
	}
	if again.header.Get("Idempotent-Replayed") != "true" || again.body != a.body {
		t.Errorf("alice's retry: %v, want the replay of %q", again, a.body)
	}
	if n := up.callsFor(key); n != 2 {
		t.Errorf("the upstream executed %d times, want 2 (one per session)", n)
	}
	// A Connection header naming Cookie would strip the scope on its way: refused.
	if r := send(t, gw.addr, "/orders", `{}`, "Idempotency-Key", key, "Cookie", "session=alice", "Connection", "Cookie"); r.status != http.StatusBadRequest {
		t.Errorf("Connection: Cookie: %v, want 400", r)
	}
}
