package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/idempotency"
)

// attemptKey is the context key of a request's attempt id, which names the random
// streams of the store calls made for it.
type attemptKey struct{}

// scopeHeader carries a request's scope (the user), as an authentication layer in front
// would set it: the replicas scope keys by it and the upstream reads it.
const scopeHeader = "X-Sim-Scope"

// execution is one request the upstream executed: it did the work (every answer but
// 503, which says the work was not done).
type execution struct {
	N          int
	Scope, Key string
	Op, Amount int
	// Method and Path are the request's as the upstream received it (the path escaped).
	Method, Path string
	Token        int64
	Proc         *replica
	At           time.Duration
	Status       int
	// AnswerLost says why the owner never got the upstream's answer ("" when it did),
	// and AnswerLostAt when it learnt that it would not.
	AnswerLost   string
	AnswerLostAt time.Duration
}

// replica is one process in a replica slot: its store handle, its middleware (or
// gateway), and its requests. Killing it cuts its store handle, cancels its requests'
// contexts and drops every answer it would still send.
type replica struct {
	w       *world
	slot    int
	name    string
	started time.Duration
	h       *handle
	serve   http.Handler
	stop    func(context.Context) error
	ctx     context.Context
	kill    context.CancelFunc
	killed  chan struct{}
	running sync.WaitGroup // its requests being served

	mu     sync.Mutex
	dead   bool
	diedAt time.Duration
}

func (rep *replica) isDead() bool {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	return rep.dead
}

// begin counts a request the replica starts serving, unless it is dead.
func (rep *replica) begin() bool {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	if rep.dead {
		return false
	}
	rep.running.Add(1)
	return true
}

func (rep *replica) crash() {
	rep.mu.Lock()
	rep.dead, rep.diedAt = true, rep.w.now()
	close(rep.killed)
	rep.mu.Unlock()
	rep.h.disconnect()
	rep.kill()
	rep.w.event(rep.name, "process killed")
}

// slot is a replica slot and the process running in it (nil while it is down).
type slot struct {
	mu  sync.Mutex
	cur *replica
}

func (s *slot) current() *replica {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

func (w *world) newReplica(i, incarnation int) *replica {
	rp := w.plan.Replicas[i]
	name := fmt.Sprintf("r%d", i)
	if incarnation > 1 {
		name = fmt.Sprintf("r%d#%d", i, incarnation)
	}
	rep := &replica{w: w, slot: i, name: name, started: w.now(), killed: make(chan struct{})}
	rep.ctx, rep.kill = context.WithCancel(context.Background())
	rep.h = &handle{w: w, name: name, slot: i}
	mw := idempotency.Config{
		Store:        rep.h,
		Lease:        w.plan.Lease,
		TTL:          w.plan.TTL,
		StoreTimeout: w.plan.StoreTimeout,
		Scope:        idempotency.HeaderScope(scopeHeader),
		Logger:       slog.New(&logHandler{w: w, who: name, min: slog.LevelInfo}),
		OnOutcome: func(r *http.Request, o idempotency.Outcome) {
			w.event(name, "%s: %s", r.Header.Get("X-Sim-Attempt"), o)
		},
	}
	if rp.Wait {
		mw.Conflict, mw.WaitTimeout = idempotency.ConflictWait, w.plan.Lease
	}
	if rp.Gateway {
		mw.Scope = nil // the gateway's ScopeHeader
		mw.Logger = slog.New(&logHandler{w: w, who: name, min: slog.LevelWarn})
		var tr http.RoundTripper = &transport{rep: rep}
		closeIdle := func() {}
		if rp.Wire {
			wt := newWireTransport(rep)
			tr, closeIdle = wt, wt.t.CloseIdleConnections
		}
		g, err := gateway.New(gateway.Config{
			Upstream:        &url.URL{Scheme: "http", Host: "upstream.sim"},
			Idempotency:     mw,
			ScopeHeader:     scopeHeader,
			UpstreamTimeout: w.plan.UpstreamTimeout,
			Logger:          mw.Logger,
			Registerer:      prometheus.NewRegistry(),
			Transport:       tr,
		})
		if err != nil {
			panic(err) // the plan's settings are valid by construction
		}
		rep.serve = g
		rep.stop = func(ctx context.Context) error {
			err := g.Shutdown(ctx)
			closeIdle() // the idle keep-alive connections end, and their goroutines with them
			return err
		}
	} else {
		m, err := idempotency.New(mw)
		if err != nil {
			panic(err)
		}
		rep.serve, rep.stop = m.Handler(http.HandlerFunc(rep.app)), m.Shutdown
	}
	w.mu.Lock()
	w.facts.procs[name] = rep
	w.facts.order = append(w.facts.order, rep)
	w.mu.Unlock()
	w.event(name, "process started")
	return rep
}

// The upstream's body and answer.
type payment struct {
	Op     int    `json:"op"`
	Key    string `json:"key"`
	Amount int    `json:"amount"`
}

type receipt struct {
	Exec   int    `json:"exec"`
	Op     int    `json:"op"`
	Key    string `json:"key"`
	Amount int    `json:"amount"`
	Scope  string `json:"scope"`
	Path   string `json:"path"` // the path the upstream received, escaped
}

// upstreamRequest is what of a request the upstream reads besides its body: its method
// (run as POST whatever its case, as many frameworks do), its path as received
// (escaped: the upstream routes /payments/x%2Fy and /payments/x/y apart) and the headers
// a proxy must pass on.
type upstreamRequest struct {
	Method, Path string
	Header       http.Header
}

// Errors of the link between a replica and the upstream.
var (
	errNotSent = errors.New("sim: upstream unreachable: connection refused")
	errBroken  = errors.New("sim: upstream connection reset after the request was sent")
)

// callUpstream sends a payment to the upstream, which executes it when it arrives,
// unless it answers 503 (the work not done); the answer travels back, or is lost.
// sent is called once the request has left (from then on the upstream may act).
func (rep *replica) callUpstream(ctx context.Context, token int64, in upstreamRequest, body []byte, sent func()) (int, []byte, error) {
	w := rep.w
	var p payment
	if err := json.Unmarshal(body, &p); err != nil {
		return 0, nil, fmt.Errorf("sim: bad payment: %w", err)
	}
	scope := headerValue(in.Header, scopeHeader)
	there, took, refused, lost := rep.drawLink(scope, p.Key)
	if refused || rep.isDead() {
		_ = sleep(ctx, there)
		return 0, nil, errNotSent
	}
	sent()
	if err := sleep(ctx, there); err != nil {
		return 0, nil, err
	}
	w.received(rep, p, in)
	ex := w.execute(rep, token, scope, p, in)
	if err := sleep(ctx, took); err != nil {
		w.answerLost(ex, "the owner stopped waiting for the upstream")
		return 0, nil, err
	}
	if ex == nil {
		return http.StatusServiceUnavailable, nil, nil
	}
	switch {
	case rep.isDead():
		w.answerLost(ex, "its process was killed")
		return 0, nil, errBroken
	case lost:
		w.answerLost(ex, "lost on the way back")
		w.event(rep.name, "upstream answer of exec #%d lost", ex.N)
		return 0, nil, errBroken
	}
	b, _ := json.Marshal(receipt{Exec: ex.N, Op: p.Op, Key: p.Key, Amount: p.Amount, Scope: scope, Path: in.Path})
	return ex.Status, b, nil
}

// drawLink draws the fate of one request on the replica↔upstream link: its delay
// there, the upstream's latency, whether the upstream is unreachable, and whether its
// answer is lost on the way back.
func (rep *replica) drawLink(scope, key string) (there, took time.Duration, refused, lost bool) {
	w := rep.w
	w.draw("link/"+rep.name+"/"+sk(scope, key), func(r *rand.Rand) {
		there = dur(r, 100*time.Microsecond, 5*time.Millisecond)
		refused, lost = chance(r, 0.03), chance(r, 0.04)
		switch x := r.Float64(); {
		case x < 0.05 && !w.plan.Replicas[rep.slot].Gateway:
			took = dur(r, w.plan.TTL/2, 2*w.plan.TTL) // a handler that may run past the record's TTL
		case x < 0.15:
			took = dur(r, 300*time.Millisecond, 2*w.plan.Lease)
		default:
			took = dur(r, 5*time.Millisecond, 300*time.Millisecond)
		}
	})
	return there, took, refused, lost
}

// execute is the upstream acting on a payment: it executes it (nil: it answers 503,
// the work not done).
func (w *world) execute(rep *replica, token int64, scope string, p payment, in upstreamRequest) *execution {
	var status int
	w.draw("upstream/"+sk(scope, p.Key), func(r *rand.Rand) {
		switch x := r.Float64(); {
		case x < 0.10:
			status = http.StatusServiceUnavailable
		case x < 0.14:
			status = http.StatusInternalServerError
		case x < 0.18:
			status = http.StatusBadRequest
		default:
			status = http.StatusCreated
		}
	})
	if status == http.StatusServiceUnavailable {
		w.event("upstream", "%s token %d from %s: 503, not executed", sk(scope, p.Key), token, rep.name)
		return nil
	}
	w.mu.Lock()
	ex := &execution{N: len(w.facts.execs) + 1, Scope: scope, Key: p.Key, Op: p.Op, Amount: p.Amount, Method: in.Method, Path: in.Path,
		Token: token, Proc: rep, At: w.now(), Status: status}
	w.facts.execs = append(w.facts.execs, ex)
	w.mu.Unlock()
	w.event("upstream", "%s token %d from %s: EXECUTED #%d (o%d amount %d, %s %s), answers %d", sk(scope, p.Key), token, rep.name, ex.N, p.Op, p.Amount, in.Method, in.Path, status)
	return ex
}

// headerValue is h's value of name whatever the case of its map key, as the wire has no
// case: the gateway's transport may carry the key under a lower-case map key (so that
// http.Transport's own resend check does not see it), and sends it all the same.
func headerValue(h http.Header, name string) string {
	for k, vs := range h {
		if strings.EqualFold(k, name) && len(vs) > 0 && vs[0] != "" {
			return vs[0]
		}
	}
	return ""
}

// received checks the headers of a request that reached the upstream: every request the
// clients send is keyed and scoped and has a content type, so one without them lost them
// on the way (a proxy strips the headers a Connection header lists).
func (w *world) received(rep *replica, p payment, in upstreamRequest) {
	var lost []string
	for _, h := range []string{"Idempotency-Key", scopeHeader, "Content-Type"} {
		if headerValue(in.Header, h) == "" {
			lost = append(lost, h)
		}
	}
	if len(lost) == 0 {
		return
	}
	w.event("upstream", "o%d's request %s %s from %s arrived without %s", p.Op, in.Method, in.Path, rep.name, strings.Join(lost, ", "))
	w.mu.Lock()
	w.facts.stripped = append(w.facts.stripped, fmt.Sprintf("o%d's request (%s %s, key %s) reached the upstream from %s without %s", p.Op, in.Method, in.Path, p.Key, rep.name, strings.Join(lost, ", ")))
	w.mu.Unlock()
}

func (w *world) answerLost(ex *execution, why string) {
	if ex == nil {
		return
	}
	w.mu.Lock()
	if ex.AnswerLost == "" {
		ex.AnswerLost, ex.AnswerLostAt = why, time.Since(w.start)
	}
	w.mu.Unlock()
}

// app is the handler of a middleware replica: it calls the upstream, detached from
// the client as Detach advises, and tells the middleware what it knows of the outcome.
func (rep *replica) app(w http.ResponseWriter, r *http.Request) {
	c, _ := idempotency.ClaimFromContext(r.Context())
	var token int64
	if c != nil {
		token = c.Token
	}
	body, _ := io.ReadAll(r.Body)
	ctx, cancel := idempotency.Detach(r.Context())
	defer cancel()
	in := upstreamRequest{Method: r.Method, Path: r.URL.EscapedPath(), Header: r.Header}
	status, answer, err := rep.callUpstream(ctx, token, in, body, func() {})
	switch {
	case c == nil && err != nil: // passed through unclaimed: nothing to release or abandon
		idempotency.WriteProblem(w, idempotency.Problem{Type: "urn:sim:unknown", Title: "Upstream failed", Status: http.StatusBadGateway}, 1)
		return
	case errors.Is(err, errNotSent):
		c.Release()
		idempotency.WriteProblem(w, idempotency.Problem{Type: "urn:sim:unreachable", Title: "Upstream unreachable", Status: http.StatusBadGateway}, 1)
		return
	case err != nil:
		c.Abandon()
		idempotency.WriteProblem(w, idempotency.Problem{Type: "urn:sim:unknown", Title: "Upstream outcome unknown", Status: http.StatusBadGateway}, 1)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(answer)
}

// transport is a gateway replica's upstream: an http.RoundTripper over callUpstream,
// which tells the gateway (through its client trace) when the request was written.
type transport struct{ rep *replica }

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		_ = req.Body.Close()
	}
	var token int64
	if c, ok := idempotency.ClaimFromContext(req.Context()); ok {
		token = c.Token
	}
	sent := func() {
		if tr := httptrace.ContextClientTrace(req.Context()); tr != nil && tr.WroteHeaders != nil {
			tr.WroteHeaders()
		}
	}
	in := upstreamRequest{Method: req.Method, Path: req.URL.EscapedPath(), Header: req.Header}
	status, answer, err := t.rep.callUpstream(req.Context(), token, in, body, sent)
	if err != nil {
		return nil, err
	}
	h := http.Header{"Content-Type": {"application/json"}, "Content-Length": {strconv.Itoa(len(answer))}}
	return &http.Response{Status: http.StatusText(status), StatusCode: status, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(bytes.NewReader(answer)), ContentLength: int64(len(answer)), Request: req}, nil
}

// writer is the client's end of one attempt's connection; a slow reader takes a drawn
// time over every write, and a client that left makes writes fail.
type writer struct {
	ctx     context.Context
	slow    time.Duration
	h       http.Header
	status  int
	body    bytes.Buffer
	aborted bool
}

func (wr *writer) Header() http.Header { return wr.h }

func (wr *writer) WriteHeader(code int) {
	if wr.status == 0 && code >= 200 {
		wr.status = code
	}
}

func (wr *writer) Write(p []byte) (int, error) {
	if wr.status == 0 {
		wr.WriteHeader(http.StatusOK)
	}
	if err := sleep(wr.ctx, wr.slow); err != nil {
		return 0, err
	}
	return wr.body.Write(p)
}

func (wr *writer) Flush() {}

// seen is a final answer a client got.
type seen struct {
	Op       *Op
	Attempt  string
	Status   int
	Body     []byte
	Receipt  *receipt // nil: not the upstream's answer (a problem of the middleware)
	Problem  string   // the problem type of an answer that is not the upstream's
	Replayed bool
	At       time.Duration
}

// result is what an attempt got: final, or when to try again.
type result struct {
	final      bool
	retryAfter time.Duration
}

// client runs one operation as one client of it (op.Clients run it at once, each its
// own retrying client with the op's key and body): attempts until a final answer (2xx,
// 4xx but 409, or the replay of the upstream's 5xx) or the horizon, backing off between
// them.
func (w *world) client(ctx context.Context, op *Op, nth int, slots []*slot, wg *sync.WaitGroup) {
	defer wg.Done()
	name := fmt.Sprintf("o%d", op.ID)
	if nth > 0 {
		name += string(rune('a' + nth))
	}
	start := op.Start
	if nth > 0 {
		w.draw("client/"+name, func(r *rand.Rand) { start += dur(r, 0, w.plan.Lease/2) })
	}
	if sleep(ctx, start) != nil {
		return
	}
	backoff := 50 * time.Millisecond
	for n := 1; w.now() < w.plan.Horizon; n++ {
		if n == 1 && op.Hedge {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w.attempt(op, name, name+".1h", slots)
			}()
		}
		res := w.attempt(op, name, fmt.Sprintf("%s.%d", name, n), slots)
		if res.final {
			return
		}
		var pause time.Duration
		w.draw("client/"+name, func(r *rand.Rand) { pause = dur(r, backoff/2, backoff) })
		backoff = min(2*backoff, w.plan.Lease)
		if w.plan.Storm {
			backoff = min(backoff, time.Second) // a storm's clients keep at it
		}
		if res.retryAfter > 0 {
			pause = max(pause, min(res.retryAfter, 2*w.plan.Lease))
		}
		if sleep(ctx, pause) != nil {
			return
		}
	}
	w.event(name, "gave up: no final answer by the horizon")
	w.mu.Lock()
	w.facts.unfinished++
	w.mu.Unlock()
}

// attempt sends op once, as client name, to a replica the attempt's stream picks.
func (w *world) attempt(op *Op, name, id string, slots []*slot) result {
	var pick int
	var there, back time.Duration
	var lost, waitOut bool
	var slow time.Duration
	w.draw("client/"+id, func(r *rand.Rand) {
		pick = r.IntN(len(slots))
		if op.Connection != "" { // to gateways only: a middleware replica has no hop
			var gw []int
			for i, rp := range w.plan.Replicas {
				if rp.Gateway {
					gw = append(gw, i)
				}
			}
			pick = gw[pick%len(gw)]
		}
		slow = dur(r, w.plan.Lease/4, 2*w.plan.Lease)
		there, back = dur(r, 100*time.Microsecond, 10*time.Millisecond), dur(r, 100*time.Microsecond, 10*time.Millisecond)
		lost, waitOut = chance(r, 0.08), chance(r, 0.5)
	})
	rep := slots[pick].current()
	if rep == nil || !rep.begin() {
		w.event(name, "%s to r%d: connection refused (no process)", id, pick)
		return result{}
	}
	ctx, cancel := context.WithCancel(context.WithValue(rep.ctx, attemptKey{}, id))
	defer cancel()
	body := fmt.Sprintf(`{"op":%d,"key":%q,"amount":%d}`, op.bodyOp(), op.Key, op.Amount)
	req, _ := http.NewRequestWithContext(ctx, op.method(), "http://gateway.sim"+op.path(), strings.NewReader(body))
	req.Header.Set("Idempotency-Key", op.Key)
	req.Header.Set(scopeHeader, op.Scope)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Sim-Attempt", id)
	if op.Connection != "" {
		req.Header.Set("Connection", op.Connection)
	}
	wr := &writer{ctx: ctx, h: http.Header{}}
	if op.SlowReader {
		wr.slow = slow
	}
	how := ""
	if op.Method != "" || op.Path != "" {
		how = fmt.Sprintf(", %s %s", op.method(), op.path())
	}
	if op.Connection != "" {
		how += ", Connection: " + op.Connection
	}
	w.event(name, "%s sent to %s (%s %s, amount %d%s)", id, rep.name, op.Scope, op.Key, op.Amount, how)
	done := make(chan bool, 1)
	go func() {
		defer rep.running.Done()
		if sleep(ctx, there) != nil {
			done <- false
			return
		}
		done <- serveOne(rep.serve, wr, req)
	}()
	timeout := time.NewTimer(op.AttemptTimeout)
	defer timeout.Stop()
	select {
	case ok := <-done:
		if !ok {
			return result{}
		}
	case <-timeout.C:
		w.event(name, "%s: no answer within %s, gives up on the attempt", id, fmtD(op.AttemptTimeout))
		return result{}
	case <-rep.killed:
		w.event(name, "%s: connection reset (%s killed)", id, rep.name)
		return result{}
	}
	if wr.aborted {
		w.event(name, "%s: connection cut mid-answer", id)
		return result{}
	}
	if sleep(rep.ctx, back) != nil || lost {
		w.event(name, "%s: answer %d lost", id, wr.status)
		if waitOut && lost {
			<-timeout.C
		}
		return result{}
	}
	s := &seen{Op: op, Attempt: id, Status: wr.status, Body: wr.body.Bytes(), Replayed: wr.h.Get("Idempotent-Replayed") == "true", At: w.now()}
	var rc receipt
	if json.Unmarshal(s.Body, &rc) == nil && rc.Exec > 0 {
		s.Receipt = &rc
	}
	var prob struct {
		Type string `json:"type"`
	}
	if s.Receipt == nil && json.Unmarshal(s.Body, &prob) == nil {
		s.Problem = prob.Type
	}
	what := fmt.Sprintf("%s: got %d", id, s.Status)
	if s.Replayed {
		what += " replayed"
	}
	if s.Receipt != nil {
		what += fmt.Sprintf(" (exec #%d)", s.Receipt.Exec)
	}
	// A replayed 5xx of the upstream is final too: the request ran and failed, and no
	// retry will change its answer.
	final := s.Status/100 == 2 || s.Status/100 == 4 && s.Status != http.StatusConflict ||
		s.Status/100 == 5 && s.Replayed && s.Receipt != nil
	if !final {
		ra, _ := strconv.Atoi(wr.h.Get("Retry-After"))
		w.event(name, "%s, retries", what)
		return result{retryAfter: time.Duration(ra) * time.Second}
	}
	w.event(name, "%s, final", what)
	w.mu.Lock()
	w.facts.seen = append(w.facts.seen, s)
	w.mu.Unlock()
	return result{final: true}
}

// serveOne serves req as net/http would: a handler that aborts its answer
// (http.ErrAbortHandler) cuts the connection. It reports false for a cut one.
func serveOne(h http.Handler, wr *writer, req *http.Request) (ok bool) {
	defer func() {
		if p := recover(); p != nil {
			if p != http.ErrAbortHandler {
				panic(p)
			}
			wr.aborted = true
			ok = true
		}
	}()
	h.ServeHTTP(wr, req)
	return true
}
