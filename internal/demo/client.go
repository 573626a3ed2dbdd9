package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/retrysafe/retrysafe/retry"
)

// counters are the clients' shared counts, read live by the progress line.
type counters struct {
	payments, attempts, resends, replays, conflicts atomic.Int64
}

// observer is the RoundTripper below retry.Transport: it sees every attempt, so it
// counts them, and the replays and 409s among their responses (Transport retries 409s,
// so the caller above it would never see them). It also tells the client which key
// AutoKey gave its payment, through the keyProbe in the request's context.
type observer struct {
	base http.RoundTripper
	cnt  *counters
}

func (o *observer) RoundTrip(req *http.Request) (*http.Response, error) {
	o.cnt.attempts.Add(1)
	if p, ok := req.Context().Value(probeKey{}).(*keyProbe); ok {
		p.key.Store(req.Header.Get(retry.IdempotencyKeyHeader))
	}
	resp, err := o.base.RoundTrip(req)
	if err == nil {
		if resp.StatusCode == http.StatusConflict {
			o.cnt.conflicts.Add(1)
		}
		if resp.Header.Get("Idempotent-Replayed") == "true" {
			o.cnt.replays.Add(1)
		}
	}
	return resp, err
}

type probeKey struct{}

// keyProbe receives the Idempotency-Key the attempts of one payment carried.
type keyProbe struct{ key atomic.Value }

func (p *keyProbe) get() string {
	k, _ := p.key.Load().(string)
	return k
}

// record is what a client saw of one logical payment.
type record struct {
	user, key string
	status    int   // the final answer's status; 0 when there was none
	id        int64 // the payment id the final 2xx named
	bodyKey   string
}

func (r record) succeeded() bool { return r.status >= 200 && r.status < 300 }

type client struct {
	hc   *http.Client
	url  string
	user string
	rng  *rand.Rand
	cnt  *counters
}

// pay makes one logical payment and returns what the client saw of it. retry.Transport
// retries each attempt that fails before the response is returned; an error after that
// (a reset while the body is read), or a Transport that gave up, makes the client send
// the payment again with the same key, until a final answer or ctx's end.
func (c *client) pay(ctx context.Context) record {
	c.cnt.payments.Add(1)
	body := fmt.Sprintf(`{"amount": %d}`, 100+c.rng.IntN(99900))
	probe := &keyProbe{}
	pctx := context.WithValue(ctx, probeKey{}, probe)
	rec := record{user: c.user}
	for send := 0; ; send++ {
		if send > 0 {
			c.cnt.resends.Add(1)
			t := time.NewTimer(time.Duration(min(send, 10)) * 10 * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
				rec.key = probe.get()
				return rec // unfinished
			case <-t.C:
			}
		}
		req, err := http.NewRequestWithContext(pctx, http.MethodPost, c.url, strings.NewReader(body))
		if err != nil {
			return rec // a malformed URL: not reachable with the demo's own address
		}
		req.Header.Set("Authorization", "Bearer "+c.user)
		req.Header.Set("Content-Type", "application/json")
		if k := probe.get(); k != "" {
			req.Header.Set(retry.IdempotencyKeyHeader, k) // the same payment: the same key
		}
		resp, err := c.hc.Do(req)
		rec.key = probe.get()
		if err != nil {
			if ctx.Err() != nil {
				return rec
			}
			continue
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			continue // cut mid-body: the payment's outcome is unknown, send it again
		}
		rec.status = resp.StatusCode
		if rec.succeeded() {
			var p payment
			if json.Unmarshal(b, &p) == nil {
				rec.id, rec.bodyKey = p.ID, p.Key
			}
		}
		return rec
	}
}

// check compares the ledger with what the clients saw, and fills res's counts.
func check(res *Result, records []record, rows []payment) {
	type id struct{ user, key string }
	byKey := map[id][]payment{}
	for _, p := range rows {
		byKey[id{p.User, p.Key}] = append(byKey[id{p.User, p.Key}], p)
	}
	known := map[id]bool{}
	for _, r := range records {
		res.LogicalPayments++
		switch {
		case r.status == 0:
			res.Unfinished++
		case r.succeeded():
			res.Succeeded++
		default:
			res.Failed++
		}
		if r.key == "" {
			continue // never sent
		}
		k := id{r.user, r.key}
		known[k] = true
		if !r.succeeded() {
			continue
		}
		ps := byKey[k]
		if len(ps) == 0 {
			res.Lost++
			continue
		}
		named := false
		for _, p := range ps {
			named = named || p.ID == r.id
		}
		if !named || r.bodyKey != r.key {
			res.Mismatched++
		}
	}
	res.PaymentsRecorded = len(rows)
	for k, ps := range byKey {
		if len(ps) > 1 {
			res.Duplicates++
		}
		if !known[k] {
			res.Phantoms += len(ps)
		}
	}
}
