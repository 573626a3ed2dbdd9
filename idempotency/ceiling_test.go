package idempotency_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// runCounter counts a handler's runs by key.
type runCounter struct {
	mu   sync.Mutex
	runs map[string]int
}

func (c *runCounter) add(r *http.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runs == nil {
		c.runs = map[string]int{}
	}
	c.runs[r.Header.Get("Idempotency-Key")]++
}

func (c *runCounter) of(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs[key]
}

// wantNoBodyMemory fails t unless mw holds no body bytes: every request's and answer's
// share of the ceiling was given back.
func wantNoBodyMemory(t *testing.T, mw *idempotency.Middleware) {
	t.Helper()
	if n := mw.BodyMemory(); n != 0 {
		t.Errorf("BodyMemory() = %d after the requests, want 0", n)
	}
}

// TestAnswersCountAgainstTheCeiling: an answer being received counts against the
// ceiling on bodies in memory, so that a new request past it is refused (503 with
// Retry-After) before anything is claimed; the answer itself, larger than the ceiling,
// is never cut: it is finished, stored and sent whole.
func TestAnswersCountAgainstTheCeiling(t *testing.T) {
	t.Parallel()
	store := memstore.New()
	mw, err := idempotency.New(idempotency.Config{Store: store, MaxBody: 100, MaxBodyMemory: 100, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, mw) })
	var runs runCounter
	half := strings.Repeat("a", 90)
	halfway, fullway, release := make(chan struct{}, 1), make(chan struct{}, 1), make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseOnce)
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.add(r)
		if r.Header.Get("Idempotency-Key") != "answer" {
			w.WriteHeader(http.StatusCreated)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, half) // 90 bytes held: 10 left below the ceiling
		halfway <- struct{}{}
		_, _ = io.WriteString(w, half) // 180 held: past the ceiling, and not cut
		fullway <- struct{}{}
		<-release
	}))
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- post(h, "answer", "") }()

	<-halfway
	w := post(h, "second", strings.Repeat("b", 30))
	wantProblem(t, w, http.StatusServiceUnavailable, idempotency.ProblemOverloaded)
	if w.Header().Get("Retry-After") == "" {
		t.Error("no Retry-After on the 503")
	}
	if _, err := store.Get(context.Background(), "", "second"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("a request refused past the ceiling claimed its key: %v", err)
	}
	<-fullway
	// Past the ceiling, a request without a body is refused too: its answer would need
	// memory.
	wantProblem(t, post(h, "third", ""), http.StatusServiceUnavailable, idempotency.ProblemOverloaded)
	if n := mw.BodyMemory(); n < 180 {
		t.Errorf("BodyMemory() = %d with 180 bytes of an answer held, want at least 180", n)
	}
	releaseOnce()

	w = <-done
	if w.Code != http.StatusCreated || w.Body.String() != half+half {
		t.Fatalf("the answer past the ceiling: %d, %d bytes; want 201 and 180 bytes", w.Code, w.Body.Len())
	}
	if rec, err := store.Get(context.Background(), "", "answer"); err != nil || string(rec.Response.Body) != half+half {
		t.Fatalf("the answer stored: %+v, %v; want its 180 bytes", rec, err)
	}
	wantNoBodyMemory(t, mw)
	if runs.of("second") != 0 || runs.of("third") != 0 {
		t.Errorf("refused requests ran: %d, %d", runs.of("second"), runs.of("third"))
	}
	wantStatus(t, post(h, "second", strings.Repeat("b", 30)), http.StatusCreated)
	if runs.of("answer") != 1 || runs.of("second") != 1 {
		t.Errorf("runs %v, want one each", runs.runs)
	}
	wantNoBodyMemory(t, mw)
}

// TestDropBody: a handler that drops its request body (Claim.DropBody) lets go of its
// bytes, and its answer counts against the room they leave: a request and an answer of
// its size hold the request's size of the ceiling, not twice it, so that the next
// request still fits.
func TestDropBody(t *testing.T) {
	t.Parallel()
	mw, err := idempotency.New(idempotency.Config{Store: memstore.New(), MaxBody: 100, MaxBodyMemory: 100, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, mw) })
	answered, release := make(chan struct{}, 1), make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseOnce)
	var checks []string
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") != "echo" {
			w.WriteHeader(http.StatusCreated)
			return
		}
		body, _ := io.ReadAll(r.Body)
		c, _ := idempotency.ClaimFromContext(r.Context())
		c.DropBody()
		if n, _ := r.Body.Read(make([]byte, 1)); n != 0 {
			checks = append(checks, "r.Body still reads after DropBody")
		}
		if _, err := r.GetBody(); err == nil {
			checks = append(checks, "GetBody works after DropBody")
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
		answered <- struct{}{}
		<-release
	}))
	echo := strings.Repeat("e", 40)
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- post(h, "echo", echo) }()
	<-answered
	if n := mw.BodyMemory(); n != 40 {
		t.Errorf("BodyMemory() = %d with a 40-byte request dropped and its 40-byte answer held, want 40", n)
	}
	// 40 held, 50 more fit under 100 (with both the request and its answer counted,
	// 80 + 50 would not).
	wantStatus(t, post(h, "next", strings.Repeat("n", 50)), http.StatusCreated)
	releaseOnce()
	if w := <-done; w.Code != http.StatusCreated || w.Body.String() != echo {
		t.Fatalf("echo: %d %q", w.Code, w.Body)
	}
	if checks != nil {
		t.Error(checks)
	}
	wantNoBodyMemory(t, mw)
}

// TestBodyMemoryReturnsToZero: whatever becomes of a request — stored, replayed,
// released, panicked, aborted, its client gone, its answer past MaxResponse, refused,
// forwarded unprotected — its share of the ceiling, and its answer's, is given back.
func TestBodyMemoryReturnsToZero(t *testing.T) {
	t.Parallel()
	answer := strings.Repeat("x", 200)
	type step struct {
		key, body string
		gone      bool // the client leaves while the handler runs
	}
	cases := []struct {
		name  string
		cfg   func(*idempotency.Config)
		h     func(w http.ResponseWriter, r *http.Request)
		steps []step
	}{
		{"stored, then replayed", nil, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, answer)
		}, []step{{key: "k", body: "{}"}, {key: "k", body: "{}"}}},
		{"released (503)", nil, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, answer)
		}, []step{{key: "k", body: "{}"}}},
		{"panic after part of the answer", nil, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, answer)
			panic("handler broke")
		}, []step{{key: "k", body: "{}"}}},
		{"aborted", nil, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, answer)
			c, _ := idempotency.ClaimFromContext(r.Context())
			c.Abort()
		}, []step{{key: "k", body: "{}"}}},
		{"client gone", nil, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, answer[:100])
			r.Context().Value(leaveKey{}).(context.CancelFunc)()
			<-r.Context().Done()
			_, _ = io.WriteString(w, answer[100:])
		}, []step{{key: "k", body: "{}", gone: true}}},
		{"client gone, no answer", nil, func(w http.ResponseWriter, r *http.Request) {
			r.Context().Value(leaveKey{}).(context.CancelFunc)()
			<-r.Context().Done()
		}, []step{{key: "k", body: "{}", gone: true}}},
		{"past MaxResponse while written", func(c *idempotency.Config) { c.MaxResponse = 100 }, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, answer[:80])
			_, _ = io.WriteString(w, answer)
		}, []step{{key: "k", body: "{}"}}},
		{"announced past MaxResponse", func(c *idempotency.Config) { c.MaxResponse = 100 }, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", fmt.Sprint(len(answer)))
			_, _ = io.WriteString(w, answer)
		}, []step{{key: "k", body: "{}"}}},
		{"request body dropped", nil, func(w http.ResponseWriter, r *http.Request) {
			c, _ := idempotency.ClaimFromContext(r.Context())
			c.DropBody()
			_, _ = io.WriteString(w, answer)
		}, []step{{key: "k", body: strings.Repeat("b", 300)}}},
		{"refused past the ceiling", func(c *idempotency.Config) { c.MaxBody, c.MaxBodyMemory = 100, 100 }, nil,
			[]step{{key: "k", body: strings.Repeat("b", 150)}, {key: "k2", body: strings.Repeat("b", 100)}}},
		{"forwarded unprotected (no key, optional)", func(c *idempotency.Config) { c.KeyOptional = true }, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, answer)
		}, []step{{body: "{}"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cfg := idempotency.Config{Store: memstore.New(), Logger: slog.New(slog.DiscardHandler)}
			if c.cfg != nil {
				c.cfg(&cfg)
			}
			mw, err := idempotency.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { shutdown(t, mw) })
			hf := c.h
			if hf == nil {
				hf = func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }
			}
			h := mw.Handler(http.HandlerFunc(hf))
			for _, s := range c.steps {
				r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(s.body))
				if s.key != "" {
					r.Header.Set("Idempotency-Key", s.key)
				}
				if s.gone {
					ctx, leave := context.WithCancel(context.Background())
					defer leave()
					r = r.WithContext(context.WithValue(ctx, leaveKey{}, leave))
				}
				func() {
					defer func() { _ = recover() }() // the handler's panic goes on to the server
					h.ServeHTTP(httptest.NewRecorder(), r)
				}()
				wantNoBodyMemory(t, mw)
			}
		})
	}
}

// leaveKey holds, in a request's context, the function that ends it: the client
// leaving.
type leaveKey struct{}

// TestHeldAnswerCountsUntilStored: an answer the store could not take is held in
// memory, and counts against the ceiling, until it is stored.
func TestHeldAnswerCountsUntilStored(t *testing.T) {
	t.Parallel()
	var down atomic.Bool
	store := memstore.New()
	mw, err := idempotency.New(idempotency.Config{Store: outage{store, &down}, MaxBody: 100, MaxBodyMemory: 100,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	answer := strings.Repeat("x", 150)
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		down.Store(true) // the store is lost while the handler works
		_, _ = io.WriteString(w, answer)
	}))
	if w := post(h, "held", "{}"); w.Code != http.StatusOK || w.Body.String() != answer {
		t.Fatalf("the answer: %d %d bytes", w.Code, w.Body.Len())
	}
	if n := mw.BodyMemory(); n != int64(len(answer)) {
		t.Errorf("BodyMemory() = %d with a 150-byte answer held for the store, want 150", n)
	}
	down.Store(false)
	wantProblem(t, post(h, "next", "{}"), http.StatusServiceUnavailable, idempotency.ProblemOverloaded)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := mw.Shutdown(ctx); err != nil { // waits for the held answer to be stored
		t.Fatal(err)
	}
	if rec, err := store.Get(context.Background(), "", "held"); err != nil || string(rec.Response.Body) != answer {
		t.Fatalf("held answer after the store came back: %+v, %v", rec, err)
	}
	wantNoBodyMemory(t, mw)
}

// readCounting is a listener whose connections count the bytes the server reads from
// each client, by the client's address.
type readCounting struct {
	net.Listener
	mu   sync.Mutex
	read map[string]int64
}

func (l *readCounting) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countedConn{Conn: c, l: l}, nil
}

func (l *readCounting) of(client net.Addr) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.read[client.String()]
}

type countedConn struct {
	net.Conn
	l *readCounting
}

func (c *countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.l.mu.Lock()
	c.l.read[c.RemoteAddr().String()] += int64(n)
	c.l.mu.Unlock()
	return n, err
}

// TestRefusedBodyIsRead: a request refused past the ceiling has its body read to the
// end (and thrown away) before its 503, so that a client still sending it gets the 503,
// not a reset (a server that closes with bytes unread resets the connection), and its
// connection serves the next request; a Go client gets the 503, not an error; a client
// that asked to be told first (Expect: 100-continue) is not asked for its body.
func TestRefusedBodyIsRead(t *testing.T) {
	t.Parallel()
	mw, err := idempotency.New(idempotency.Config{Store: memstore.New(), MaxBody: 1 << 20, MaxBodyMemory: 1 << 20,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, mw) })
	entered, release := make(chan struct{}), make(chan struct{})
	srv := httptest.NewUnstartedServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == "hold" {
			close(entered)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
	})))
	counting := &readCounting{Listener: srv.Listener, read: map[string]int64{}}
	srv.Listener = counting
	srv.Start()
	t.Cleanup(srv.Close)
	releaseOnce := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseOnce) // before srv.Close, which waits for the handler
	held := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader(strings.Repeat("h", 1<<20)))
		req.Header.Set("Idempotency-Key", "hold")
		res, err := srv.Client().Do(req)
		if err == nil {
			res.Body.Close()
		}
		held <- err
	}()
	<-entered // the ceiling is full

	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	body := strings.Repeat("r", 1<<20)
	head := fmt.Sprintf("POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: refused\r\nContent-Length: %d\r\n\r\n", len(body))
	sent := make(chan error, 1)
	go func() {
		_, err := io.WriteString(c, head+body)
		sent <- err
	}()
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer to a request refused past the ceiling: %v", err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("Retry-After") == "" || res.Close {
		t.Fatalf("refused: %d, Retry-After %q, closing %v; want 503 with Retry-After on an open connection", res.StatusCode, res.Header.Get("Retry-After"), res.Close)
	}
	if err := <-sent; err != nil {
		t.Fatalf("sending the refused body: %v", err)
	}
	if n := counting.of(c.LocalAddr()); n < int64(len(head)+len(body)) {
		t.Errorf("the server read %d bytes of a %d-byte request it refused, want all", n, len(head)+len(body))
	}
	// The same connection serves the next request.
	if _, err := io.WriteString(c, "GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if res, err = http.ReadResponse(br, nil); err != nil {
		t.Fatalf("the connection of a refused request was closed: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		t.Errorf("next request on the connection: %d", res.StatusCode)
	}

	// A Go client, still sending its body when the 503 comes, gets the 503.
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader(body))
	req.Header.Set("Idempotency-Key", "go-client")
	res, err = srv.Client().Do(req)
	if err != nil {
		t.Fatalf("a Go client refused past the ceiling: %v, want the 503", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("a Go client refused past the ceiling: %d, want 503", res.StatusCode)
	}

	// Expect: 100-continue: the 503 comes at once, without a 100 Continue and without
	// the body.
	c2, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	_ = c2.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := fmt.Fprintf(c2, "POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: asked\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", len(body)); err != nil {
		t.Fatal(err)
	}
	res, err = http.ReadResponse(bufio.NewReader(c2), nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("refused with Expect: 100-continue: %d, want 503 at once", res.StatusCode)
	}
	releaseOnce()
	if err := <-held; err != nil {
		t.Errorf("the request holding the ceiling: %v", err)
	}
	wantNoBodyMemory(t, mw)
}
