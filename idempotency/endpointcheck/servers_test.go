package endpointcheck

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// The tests draw their keys from keyBytes, so they know which key each case sends:
// key i (from 0) is "retrysafe-check-" and 16 bytes of i+1 in hex. The concurrent case
// uses key 1, which lets the servers below hold its execution until the duplicates have
// been answered, with no timing involved.
func keyBytes() io.Reader {
	var b []byte
	for i := 1; i <= 3; i++ {
		b = append(b, bytes.Repeat([]byte{byte(i)}, 16)...)
	}
	return bytes.NewReader(b)
}

func testKey(i int) string {
	return "retrysafe-check-" + hex.EncodeToString(bytes.Repeat([]byte{byte(i + 1)}, 16))
}

// hotKey is the concurrent case's key.
func hotKey() string { return testKey(1) }

const testConcurrency = 20

// signal is a broadcast: wait returns when cond holds (checked under mu) or after
// timeout.
type signal struct {
	mu sync.Mutex
	ch chan struct{}
}

func newSignal() *signal { return &signal{ch: make(chan struct{})} }

// changed wakes the waiters; call it with mu held.
func (s *signal) changed() {
	close(s.ch)
	s.ch = make(chan struct{})
}

// wait waits, with mu held, until cond() holds or timeout has passed.
func (s *signal) wait(cond func() bool, timeout time.Duration) {
	deadline := time.After(timeout)
	for !cond() {
		ch := s.ch
		s.mu.Unlock()
		select {
		case <-ch:
		case <-deadline:
			s.mu.Lock()
			return
		}
		s.mu.Lock()
	}
}

// fakeOpts break the reference fake server in one way each.
type fakeOpts struct {
	ignoreKeys      bool // executes every request, key or not
	sharedScope     bool // one key space for every credential: replays across them
	ignoreBody      bool // the fingerprint leaves out the body: another body gets a 200 replay
	acceptMalformed bool // takes any key value, the empty one included
	noRetryAfter    bool // 409 without Retry-After
	textErrors      bool // errors are text/plain
	racy            bool // check-then-act: no in-flight state, duplicates all execute
	constant        bool // every execution answers the same body
}

// fake is a small idempotent server. With zero fakeOpts it follows the contract: 400
// for a missing or malformed key, keys scoped by Authorization, fingerprint over path
// and body, 409 with Retry-After in flight, 422 on a mismatch, replays marked with
// Idempotent-Replayed, problem+json errors.
type fake struct {
	opts fakeOpts
	*signal
	records    map[string]*record
	executions int
	answered   map[string]int // non-executing answers per key
	checked    map[string]int // racy: checks per key
}

type record struct {
	fp     string
	done   bool
	status int
	body   []byte
}

func newFake(t *testing.T, opts fakeOpts) (*fake, *httptest.Server) {
	f := &fake{opts: opts, signal: newSignal(), records: map[string]*record{}, answered: map[string]int{}, checked: map[string]int{}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv
}

func (f *fake) Executions() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.executions
}

func (f *fake) problem(w http.ResponseWriter, status int, title string) {
	if status == http.StatusConflict && !f.opts.noRetryAfter {
		w.Header().Set("Retry-After", "1")
	}
	if f.opts.textErrors {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(status)
		fmt.Fprintln(w, title)
		return
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": "about:blank", "title": title, "status": status})
}

// execute does the work: it numbers the execution. Call it with mu held.
func (f *fake) execute(path string) (int, []byte) {
	f.executions++
	f.changed()
	if f.opts.constant {
		return http.StatusOK, []byte(`{"ok":true}` + "\n")
	}
	return http.StatusCreated, []byte(fmt.Sprintf(`{"id":%d,"path":%q}`+"\n", f.executions, path))
}

func writeBody(w http.ResponseWriter, status int, body []byte, replayed bool) {
	w.Header().Set("Content-Type", "application/json")
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func validKey(k string) bool {
	if k == "" || len(k) > 255 {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

func (f *fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	values := r.Header.Values("Idempotency-Key")
	if f.opts.ignoreKeys {
		status, b := f.execute(r.URL.Path)
		writeBody(w, status, b, false)
		return
	}
	if len(values) == 0 {
		f.problem(w, http.StatusBadRequest, "Idempotency-Key required")
		return
	}
	key := values[0]
	if !f.opts.acceptMalformed && !validKey(key) {
		f.problem(w, http.StatusBadRequest, "invalid Idempotency-Key")
		return
	}
	scope := r.Header.Get("Authorization")
	if f.opts.sharedScope {
		scope = ""
	}
	fp := r.Method + " " + r.URL.Path
	if !f.opts.ignoreBody {
		fp += " " + string(body)
	}
	id := scope + "\x00" + key
	answered := func() {
		f.answered[key]++
		f.changed()
	}
	rec := f.records[id]
	if f.opts.racy {
		f.checked[key]++
		f.changed()
	}
	switch {
	case rec != nil && rec.fp != fp:
		f.problem(w, http.StatusUnprocessableEntity, "Idempotency-Key reused")
		answered()
		return
	case rec != nil && rec.done:
		writeBody(w, rec.status, rec.body, true)
		answered()
		return
	case rec != nil:
		f.problem(w, http.StatusConflict, "in flight")
		answered()
		return
	}
	if f.opts.racy {
		// Check, then act: every duplicate has checked (and found nothing) before the
		// first records its result.
		if key == hotKey() {
			f.wait(func() bool { return f.checked[key] >= testConcurrency }, 5*time.Second)
		}
	} else {
		rec = &record{fp: fp}
		f.records[id] = rec
		if key == hotKey() {
			// Stay in flight until every duplicate has been answered (409s).
			f.wait(func() bool { return f.answered[key] >= testConcurrency-1 }, 5*time.Second)
		}
	}
	status, b := f.execute(r.URL.Path)
	if f.opts.racy {
		rec = &record{fp: fp}
		f.records[id] = rec
	}
	rec.done, rec.status, rec.body = true, status, b
	writeBody(w, status, b, false)
}

// countingTransport counts, per Idempotency-Key, the responses the client got, and
// wakes the waiters on each.
type countingTransport struct {
	base http.RoundTripper
	*signal
	responses map[string]int
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	res, err := c.base.RoundTrip(r)
	c.mu.Lock()
	c.responses[r.Header.Get("Idempotency-Key")]++
	c.changed()
	c.mu.Unlock()
	return res, err
}

// upstream is the service behind the gateway: it numbers its executions. It holds the
// concurrent key's execution until the client has had the other duplicates' answers.
type upstream struct {
	*signal
	client     *countingTransport
	executions int
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	key := r.Header.Get("Idempotency-Key")
	if key == hotKey() {
		u.client.mu.Lock()
		u.client.wait(func() bool { return u.client.responses[hotKey()] >= testConcurrency-1 }, 5*time.Second)
		u.client.mu.Unlock()
	}
	u.mu.Lock()
	u.executions++
	n := u.executions
	u.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%d,"path":%q,"auth":%q}`+"\n", n, r.URL.Path, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
}

func (u *upstream) Executions() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.executions
}
