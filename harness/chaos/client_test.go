//go:build linux

package chaos

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/retrysafe/retrysafe/harness/payclient"
	"github.com/retrysafe/retrysafe/retry"
)

// client makes logical payments one after the other through a payclient.Client, whose
// Observer sends each attempt to the next fault proxy in turn (a round-robin load
// balancer in front of the replicas). The payclient.Client sends a payment again itself,
// with the same key, when retry.Transport gives up, when the body breaks off once the
// response was returned, or when the answer is not final (a 5xx or a 409 Transport
// stopped retrying: payclient.FinalStatus), until a final answer, the payment's
// patience or ctx's end.
type client struct {
	pc   *payclient.Client // URL: any of the proxies, the Observer picks the host per attempt
	rng  *rand.Rand
	slow bool    // reads the first large answer of each payment slowly (its transport's bodyWatch does)
	pad  float64 // probability that a payment asks for a large answer
}

// pay makes one logical payment, named ref, and returns what the client saw of it.
func (c *client) pay(ctx context.Context, ref string) Payment {
	p := Payment{User: c.pc.User, Ref: ref, Amount: 100 + c.rng.Int64N(99900), SlowReader: c.slow}
	u, n := c.rng.Float64(), c.rng.IntN(padMax-padMin)
	if u < c.pad {
		p.Pad = padMin + n
	}
	body := fmt.Sprintf(`{"ref":%q,"amount":%d}`, ref, p.Amount)
	if p.Pad > 0 {
		body = fmt.Sprintf(`{"ref":%q,"amount":%d,"pad":%d}`, ref, p.Amount, p.Pad)
	}
	o := c.pc.Pay(ctx, body)
	p.Key, p.Status = o.Key, o.Status
	if p.Succeeded() {
		if err := json.Unmarshal(o.Body, &p.Answer); err != nil {
			p.Answer = Row{} // a 2xx that names no payment: Check reports it mismatched
		}
	}
	return p
}

// clientTransport is the clients' stack of RoundTrippers:
//
//	retry.Transport (AutoKey; every attempt through retry.SendOnce)
//	  payclient.Observer  counts, learns the key, picks the replica's address
//	    bodyWatch         records broken bodies; throttles a slow reader's
//	      base
func clientTransport(base http.RoundTripper, st *payclient.Counts, targets []string, slow *slowRead, cuts *cutLog) http.RoundTripper {
	return &retry.Transport{
		Base:    &payclient.Observer{Base: &bodyWatch{base: base, slow: slow, cuts: cuts}, Counts: st, Targets: targets},
		AutoKey: true,
		// Many attempts and short waits, no budget: the clients want a final answer. The
		// server's Retry-After (409, 503) is honoured.
		Policy:         retry.Policy{MaxAttempts: 40, Base: 10 * time.Millisecond, Cap: 250 * time.Millisecond},
		NoBudget:       true,
		AttemptTimeout: attemptTimeout,
	}
}

// requestKey returns an attempt's Idempotency-Key. Below retry.Transport it is under
// the lower-case map key "idempotency-key", where retry.SendOnce moves it so that
// http.Transport does not resend the request by itself, and Header.Get does not look.
func requestKey(h http.Header) string {
	if k := h.Get(retry.IdempotencyKeyHeader); k != "" {
		return k
	}
	if v := h[strings.ToLower(retry.IdempotencyKeyHeader)]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// slowRead is how a slow reader reads the first large answer (over 64 KiB) of each
// payment: at most Chunk bytes every Every for the first For after the response arrived,
// then at full speed. For is longer than the gateways' upstream timeout, and a large
// answer does not fit in the narrow connection's buffers, so the gateway is still
// writing it when its upstream timeout passes. Later answers of the payment (after the
// first was cut off, by the gateway or by a replica's death) are read at full speed, as
// from a link that recovered: a payment whose every answer is read slowly could outlast
// any patience while replicas are killed every few seconds.
type slowRead struct {
	For   time.Duration
	Chunk int
	Every time.Duration
}

// narrowDialer dials the way a client on a slow, narrow link connects: a small receive
// buffer, and a small maximum segment size announced in its SYN. The peer's send buffer
// grows with the segment size, so on loopback (64 KiB segments) a gateway could hand a
// 1 MB answer to its kernel at once and never notice a slow reader; with 1 KiB segments
// its write blocks as it would towards a slow client on a real network.
func narrowDialer() *net.Dialer {
	return &net.Dialer{Timeout: 2 * time.Second, Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 16<<10); serr != nil {
				return
			}
			serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_MAXSEG, 1024)
		})
		return cmp.Or(err, serr)
	}}
}

// cutLog records the response bodies that broke off while a client read them, by key.
type cutLog struct {
	mu       sync.Mutex
	cuts     map[string][]BodyCut
	slowKeys map[string]bool // keys whose first large answer was read slowly
	slow     int64           // large answers read slowly
}

// slowFirst reports whether key's large answer is its first (and records it): a slow
// reader reads only that one slowly.
func (l *cutLog) slowFirst(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.slowKeys[key] {
		return false
	}
	if l.slowKeys == nil {
		l.slowKeys = map[string]bool{}
	}
	l.slowKeys[key] = true
	l.slow++
	return true
}

func (l *cutLog) add(key string, c BodyCut) {
	l.mu.Lock()
	if l.cuts == nil {
		l.cuts = map[string][]BodyCut{}
	}
	l.cuts[key] = append(l.cuts[key], c)
	l.mu.Unlock()
}

// Cuts returns a copy of the record, and how many large answers were read slowly.
func (l *cutLog) Cuts() (map[string][]BodyCut, int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string][]BodyCut, len(l.cuts))
	n := 0
	for k, cs := range l.cuts {
		out[k] = append([]BodyCut(nil), cs...)
		n += len(cs)
	}
	return out, l.slow
}

// bodyWatch wraps each response body: it records a body that breaks off (with the key
// of its request), and with slow set it reads the first large answer of each key
// slowly.
type bodyWatch struct {
	base http.RoundTripper
	slow *slowRead
	cuts *cutLog
}

func (b *bodyWatch) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := b.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	w := &watchedBody{rc: resp.Body, key: requestKey(req.Header), start: time.Now(), cuts: b.cuts}
	if b.slow != nil && resp.ContentLength > 64<<10 && b.cuts.slowFirst(w.key) {
		w.slow = b.slow
	}
	resp.Body = w
	return resp, nil
}

type watchedBody struct {
	rc    io.ReadCloser
	key   string
	start time.Time
	slow  *slowRead // nil: read at full speed
	cuts  *cutLog

	read int64
	last time.Time
	cut  bool // a break was recorded
}

func (w *watchedBody) Read(p []byte) (int, error) {
	slow := w.slow != nil && time.Since(w.start) < w.slow.For
	if slow {
		if len(p) > w.slow.Chunk {
			p = p[:w.slow.Chunk]
		}
		if !w.last.IsZero() {
			// Pacing, not synchronisation: the gateways are real processes whose
			// timeouts run on the real clock, and a slow reader must be slow on it.
			time.Sleep(time.Until(w.last.Add(w.slow.Every)))
		}
		w.last = time.Now()
	}
	n, err := w.rc.Read(p)
	w.read += int64(n)
	if err != nil && !errors.Is(err, io.EOF) && !w.cut {
		w.cut = true
		w.cuts.add(w.key, BodyCut{At: time.Now(), Read: w.read, Err: err.Error(), Slow: w.slow != nil})
	}
	return n, err
}

func (w *watchedBody) Close() error { return w.rc.Close() }
