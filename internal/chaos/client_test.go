//go:build linux

package chaos

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

// clientStats are the clients' shared counts.
type clientStats struct {
	payments, attempts, resends, replays, conflicts, serverErrors, transportErrors atomic.Int64
}

// balancer is the RoundTripper below retry.Transport: it sends each attempt to the next
// fault proxy in turn (a round-robin load balancer in front of the replicas), counts
// the attempts and what came back, and tells the payment which key AutoKey gave it,
// through the keyProbe in the request's context. (internal/demo's observer, plus the
// round-robin.)
type balancer struct {
	base    http.RoundTripper
	targets []string // host:port of the fault proxies
	next    atomic.Uint64
	st      *clientStats
}

func (b *balancer) RoundTrip(req *http.Request) (*http.Response, error) {
	b.st.attempts.Add(1)
	if p, ok := req.Context().Value(probeKey{}).(*keyProbe); ok {
		p.key.Store(req.Header.Get(retry.IdempotencyKeyHeader))
	}
	target := b.targets[int(b.next.Add(1)%uint64(len(b.targets)))]
	out := req.Clone(req.Context())
	out.URL.Host, out.Host = target, target
	resp, err := b.base.RoundTrip(out)
	switch {
	case err != nil:
		b.st.transportErrors.Add(1)
	case resp.StatusCode == http.StatusConflict:
		b.st.conflicts.Add(1)
	case resp.StatusCode >= 500:
		b.st.serverErrors.Add(1)
	}
	if err == nil && resp.Header.Get("Idempotent-Replayed") == "true" {
		b.st.replays.Add(1)
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

// final reports whether status is an answer no retry can change: a 2xx, or a 4xx
// other than 408, 409, 425 and 429.
func final(status int) bool {
	switch {
	case status >= 200 && status < 300:
		return true
	case status == http.StatusRequestTimeout, status == http.StatusConflict, status == http.StatusTooEarly,
		status == http.StatusTooManyRequests:
		return false
	default:
		return status >= 400 && status < 500
	}
}

// client makes logical payments one after the other.
type client struct {
	hc   *http.Client
	url  string // any of the proxies: the balancer picks the host per attempt
	user string
	rng  *rand.Rand
	st   *clientStats
	// patience bounds one logical payment: past it the payment is unfinished.
	patience time.Duration
}

// pay makes one logical payment, named ref, and returns what the client saw of it.
// retry.Transport retries each attempt that fails before its response is returned
// (same key: AutoKey's). When it gives up, or the body breaks off once the response was
// returned, or the answer is not final (a 5xx or a 409 it stopped retrying), the
// client sends the payment again itself with the same key, until a final answer, the
// payment's patience or ctx's end.
func (c *client) pay(ctx context.Context, ref string) Payment {
	c.st.payments.Add(1)
	p := Payment{User: c.user, Ref: ref, Amount: 100 + c.rng.Int64N(99900)}
	body := fmt.Sprintf(`{"ref":%q,"amount":%d}`, ref, p.Amount)
	probe := &keyProbe{}
	ctx, cancel := context.WithTimeout(ctx, c.patience)
	defer cancel()
	pctx := context.WithValue(ctx, probeKey{}, probe)
	for send := 0; ; send++ {
		if send > 0 {
			c.st.resends.Add(1)
			t := time.NewTimer(time.Duration(min(send, 10)) * 20 * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
				p.Key = probe.get()
				return p // unfinished
			case <-t.C:
			}
		}
		req, err := http.NewRequestWithContext(pctx, http.MethodPost, c.url, strings.NewReader(body))
		if err != nil {
			p.Key = probe.get()
			return p // a malformed URL: not reachable with the suite's own addresses
		}
		req.Header.Set("Authorization", "Bearer "+c.user)
		req.Header.Set("Content-Type", "application/json")
		if k := probe.get(); k != "" {
			req.Header.Set(retry.IdempotencyKeyHeader, k) // the same payment: the same key
		}
		resp, err := c.hc.Do(req)
		p.Key = probe.get()
		if err != nil {
			if ctx.Err() != nil {
				return p
			}
			continue
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || !final(resp.StatusCode) {
			continue // cut mid-body, or not an answer: the outcome is unknown, send it again
		}
		p.Status = resp.StatusCode
		if p.Succeeded() {
			if err := json.Unmarshal(b, &p.Answer); err != nil {
				p.Answer = Row{} // a 2xx that names no payment: Check reports it mismatched
			}
		}
		return p
	}
}
