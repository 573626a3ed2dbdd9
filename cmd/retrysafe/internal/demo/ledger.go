package demo

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"
)

// payment is one ledger row, and the body of a 201.
type payment struct {
	ID     int64  `json:"id"`
	User   string `json:"user"`
	Key    string `json:"key"`
	Amount int64  `json:"amount"`
}

// ledger is the demo's payments upstream: POST /payments records a payment and answers
// 201 with it. It is deliberately NOT idempotency-aware — every request it receives
// records a new row, whatever its Idempotency-Key — so that exactly-once comes from the
// gateway in front of it or not at all. It records the key only so the checker can
// count the rows of each logical payment.
//
// A fraction of the payments (slowRate) take slow to make, longer than the clients'
// AttemptTimeout: the client gives the attempt up and retries while the gateway still
// waits for the upstream, and is answered 409 (in flight) until the payment is done.
type ledger struct {
	slowRate float64
	slow     time.Duration

	mu   sync.Mutex
	rng  *rand.Rand // guarded by mu
	rows []payment
}

func newLedger(seed uint64, slowRate float64, slow time.Duration) *ledger {
	return &ledger{slowRate: slowRate, slow: slow, rng: rand.New(rand.NewPCG(seed, 0x736c6f77))} // "slow"
}

type paymentRequest struct {
	Amount int64 `json:"amount"`
}

func (l *ledger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/payments" {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	var in paymentRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&in); err != nil || in.Amount <= 0 {
		http.Error(w, "want {\"amount\": <positive integer>}", http.StatusBadRequest)
		return
	}
	user := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	l.mu.Lock()
	slow := l.rng.Float64() < l.slowRate
	l.mu.Unlock()
	if slow {
		t := time.NewTimer(l.slow)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			http.Error(w, "canceled", http.StatusServiceUnavailable)
			return
		}
	}
	l.mu.Lock()
	p := payment{ID: int64(len(l.rows) + 1), User: user, Key: r.Header.Get("Idempotency-Key"), Amount: in.Amount}
	l.rows = append(l.rows, p)
	l.mu.Unlock()

	body, _ := json.Marshal(p) // strings and integers always marshal
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/payments/%d", p.ID))
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(body)
}

// snapshot returns a copy of the rows.
func (l *ledger) snapshot() []payment {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]payment(nil), l.rows...)
}
