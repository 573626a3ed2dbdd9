// Package payclient is the payments client that the demo and the chaos suite drive
// against the gateway: retry.Transport with AutoKey above an Observer that counts every
// attempt and learns which Idempotency-Key AutoKey gave a payment, and a Client that
// sends one logical payment again, with that same key, whenever its outcome is unknown
// (Transport gave up, the body broke off after the response was returned, or the answer
// is not final).
package payclient

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/retrysafe/retrysafe/retry"
)

// Counts are the clients' shared counts, safe to read while they run.
type Counts struct {
	Payments  atomic.Int64 // logical payments begun
	Attempts  atomic.Int64 // HTTP attempts, retry.Transport's and re-sends' alike
	Resends   atomic.Int64 // the Client's own re-sends of a payment
	Replays   atomic.Int64 // responses marked Idempotent-Replayed: true
	Conflicts atomic.Int64 // 409 responses (Transport retries them: the caller never sees them)
	// ServerErrors counts 5xx responses, TransportErrors attempts that got none.
	ServerErrors, TransportErrors atomic.Int64
}

// Observer is the RoundTripper below retry.Transport: it sees every attempt, so it
// counts them and what came back, and it tells the Client which key AutoKey gave its
// payment. With Targets it is also a round-robin load balancer: each attempt goes to
// the next host in turn.
type Observer struct {
	Base    http.RoundTripper
	Counts  *Counts
	Targets []string // host:port; none: each attempt goes where its URL says
	next    atomic.Uint64
}

// RoundTrip implements http.RoundTripper.
func (o *Observer) RoundTrip(req *http.Request) (*http.Response, error) {
	o.Counts.Attempts.Add(1)
	if p, ok := req.Context().Value(probeKey{}).(*keyProbe); ok {
		p.key.Store(requestKey(req.Header))
	}
	out := req
	if len(o.Targets) > 0 {
		target := o.Targets[int(o.next.Add(1)%uint64(len(o.Targets)))]
		out = req.Clone(req.Context())
		out.URL.Host, out.Host = target, target
	}
	resp, err := o.Base.RoundTrip(out)
	switch {
	case err != nil:
		o.Counts.TransportErrors.Add(1)
	case resp.StatusCode == http.StatusConflict:
		o.Counts.Conflicts.Add(1)
	case resp.StatusCode >= 500:
		o.Counts.ServerErrors.Add(1)
	}
	if err == nil && resp.Header.Get("Idempotent-Replayed") == "true" {
		o.Counts.Replays.Add(1)
	}
	return resp, err
}

// requestKey returns the Idempotency-Key of an attempt. Below retry.Transport, which
// sends every attempt through retry.SendOnce, it is under the lower-case map key
// "idempotency-key", where Header.Get does not look.
func requestKey(h http.Header) string {
	if k := h.Get(retry.IdempotencyKeyHeader); k != "" {
		return k
	}
	if v := h[strings.ToLower(retry.IdempotencyKeyHeader)]; len(v) > 0 {
		return v[0]
	}
	return ""
}

type probeKey struct{}

// keyProbe receives the Idempotency-Key the attempts of one payment carried.
type keyProbe struct{ key atomic.Value }

func (p *keyProbe) get() string {
	k, _ := p.key.Load().(string)
	return k
}

// FinalStatus reports whether status is an answer no retry can change: a 2xx, or a 4xx
// other than 408, 409, 425 and 429.
func FinalStatus(status int) bool {
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

// Client makes logical payments: POSTs of a JSON body to URL as User. HC's transport is
// meant to be a retry.Transport with AutoKey above an Observer counting into Counts.
type Client struct {
	HC     *http.Client
	URL    string
	User   string // sent as "Authorization: Bearer <User>"
	Counts *Counts
	// Backoff is the step of the wait before a re-send: the n-th waits min(n, 10)×Backoff.
	Backoff time.Duration
	// Patience bounds one logical payment: past it the payment is unfinished. 0: only
	// the context bounds it.
	Patience time.Duration
	// Final reports whether a status is an answer to keep; a response it rejects is sent
	// again. nil: every response that is read whole is kept.
	Final func(status int) bool
}

// Outcome is what the client saw of one logical payment.
type Outcome struct {
	// Key is the Idempotency-Key every attempt carried (AutoKey gave it to the first);
	// "" when no attempt was ever sent.
	Key string
	// Status is the final answer's status; 0 when there was none (unfinished).
	Status int
	Body   []byte // the final answer's body
}

// Pay makes one logical payment and returns what the client saw of it. retry.Transport
// retries each attempt that fails before its response is returned; when it gives up, or
// the body breaks off once the response was returned, or Final rejects the answer, the
// client sends the payment again itself with the same key, until a final answer, the
// payment's Patience or ctx's end.
func (c *Client) Pay(ctx context.Context, body string) Outcome {
	c.Counts.Payments.Add(1)
	var o Outcome
	probe := &keyProbe{}
	if c.Patience > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.Patience)
		defer cancel()
	}
	pctx := context.WithValue(ctx, probeKey{}, probe)
	for send := 0; ; send++ {
		if send > 0 {
			c.Counts.Resends.Add(1)
			t := time.NewTimer(time.Duration(min(send, 10)) * c.Backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				o.Key = probe.get()
				return o // unfinished
			case <-t.C:
			}
		}
		req, err := http.NewRequestWithContext(pctx, http.MethodPost, c.URL, strings.NewReader(body))
		if err != nil {
			o.Key = probe.get()
			return o // a malformed URL: not reachable with the callers' own addresses
		}
		req.Header.Set("Authorization", "Bearer "+c.User)
		req.Header.Set("Content-Type", "application/json")
		if k := probe.get(); k != "" {
			req.Header.Set(retry.IdempotencyKeyHeader, k) // the same payment: the same key
		}
		resp, err := c.HC.Do(req)
		o.Key = probe.get()
		if err != nil {
			if ctx.Err() != nil {
				return o
			}
			continue
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || (c.Final != nil && !c.Final(resp.StatusCode)) {
			continue // cut mid-body, or not an answer: the outcome is unknown, send it again
		}
		o.Status, o.Body = resp.StatusCode, b
		return o
	}
}
