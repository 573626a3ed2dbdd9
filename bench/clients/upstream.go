package clients

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Release says why a held first execution went on.
type Release string

const (
	ReleaseRetryAnswered Release = "retry answered" // the gateway answered the retry (reject: 409)
	ReleaseRetryWaiting  Release = "retry waiting"  // the gateway has a duplicate waiting (wait)
	ReleaseBound         Release = "bound"          // neither came within HoldBound
)

// HoldBound is the longest a first execution is held for its retry. It is shorter than
// the gateway's default --wait-timeout (10s), so that a waiting retry is never turned
// into a 409 by the hold itself.
const HoldBound = 5 * time.Second

// Upstream is the API behind the gateway: it never deduplicates, counts its
// executions per logical id and per Idempotency-Key, and answers a Stripe-shaped JSON
// object (201 for /v1/payments, 200 for Stripe's /v1/customers).
type Upstream struct {
	srv *httptest.Server
	// hold is called on a logical id's first execution, attempt being the proxy's
	// AttemptHeader (-1 without one), and returns once it may answer, and why.
	hold func(lid string, attempt int) Release

	mu       sync.Mutex
	execs    map[string]int
	keys     map[string]map[string]bool // lid → the keys its executions came with
	released map[Release]int
	seq      int
}

// NewUpstream starts the upstream on a loopback port.
func NewUpstream(hold func(lid string, attempt int) Release) *Upstream {
	u := &Upstream{hold: hold, execs: map[string]int{}, keys: map[string]map[string]bool{}, released: map[Release]int{}}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	return u
}

func (u *Upstream) URL() string { return u.srv.URL }
func (u *Upstream) Close()      { u.srv.Close() }

func (u *Upstream) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	lid := string(lidPattern.Find(body))
	u.mu.Lock()
	u.seq++
	seq := u.seq
	u.execs[lid]++
	first := u.execs[lid] == 1
	if u.keys[lid] == nil {
		u.keys[lid] = map[string]bool{}
	}
	u.keys[lid][r.Header.Get("Idempotency-Key")] = true
	u.mu.Unlock()
	if first && lid != "" && u.hold != nil {
		attempt, err := strconv.Atoi(r.Header.Get(AttemptHeader))
		if err != nil {
			attempt = -1
		}
		why := u.hold(lid, attempt)
		if why != "" {
			u.mu.Lock()
			u.released[why]++
			u.mu.Unlock()
		}
	}
	status, object, prefix := http.StatusCreated, "payment", "pay"
	if strings.HasPrefix(r.URL.Path, "/v1/customers") {
		status, object, prefix = http.StatusOK, "customer", "cus"
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", fmt.Sprintf("req_%d", seq))
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"id": fmt.Sprintf("%s_%06d", prefix, seq), "object": object, "created": time.Now().Unix(),
		"livemode": false, "description": lid, "metadata": map[string]string{"lid": lid},
	})
}

// Executions returns the executions per logical id, the keys they came with, and why
// the held first executions went on.
func (u *Upstream) Executions() (map[string]int, map[string]int, map[Release]int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	execs, keys, released := map[string]int{}, map[string]int{}, map[Release]int{}
	for lid, n := range u.execs {
		execs[lid] = n
		keys[lid] = len(u.keys[lid])
	}
	for k, v := range u.released {
		released[k] = v
	}
	return execs, keys, released
}
