package payclient

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/retry"
)

// A body cut off after retry.Transport returned the response makes the Client send the
// payment again itself, with the key AutoKey gave the first attempt.
func TestPayResendsACutBodyWithTheSameKey(t *testing.T) {
	var mu sync.Mutex
	var keys []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get(retry.IdempotencyKeyHeader))
		n := len(keys)
		mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer alice" {
			t.Errorf("Authorization = %q", r.Header.Get("Authorization"))
		}
		if n == 1 { // promise a longer body than is sent, then drop the connection
			w.Header().Set("Content-Length", "100")
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte(`{"id":`))
			w.(http.Flusher).Flush()
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"id":7}`))
	}))
	defer srv.Close()

	var cnt Counts
	c := &Client{
		HC: &http.Client{Transport: &retry.Transport{
			Base: &Observer{Base: http.DefaultTransport, Counts: &cnt}, AutoKey: true, NoBudget: true,
			Policy: retry.Policy{MaxAttempts: 3, Base: time.Millisecond, Cap: time.Millisecond},
		}},
		URL: srv.URL, User: "alice", Counts: &cnt, Backoff: time.Millisecond, Final: FinalStatus,
	}
	o := c.Pay(context.Background(), `{"amount":1}`)
	if o.Status != http.StatusCreated || string(o.Body) != `{"id":7}` {
		t.Fatalf("outcome %d %q, want 201 {\"id\":7}", o.Status, o.Body)
	}
	if len(keys) != 2 || keys[0] == "" || keys[1] != keys[0] || o.Key != keys[0] {
		t.Fatalf("keys sent %q, outcome key %q: want two attempts under one AutoKey key", keys, o.Key)
	}
	if got := [...]int64{cnt.Payments.Load(), cnt.Attempts.Load(), cnt.Resends.Load(), cnt.Replays.Load()}; got != [...]int64{1, 2, 1, 1} {
		t.Fatalf("payments, attempts, resends, replays = %v, want [1 2 1 1]", got)
	}
}

func TestFinalStatus(t *testing.T) {
	for status, want := range map[int]bool{200: true, 201: true, 400: true, 422: true,
		408: false, 409: false, 425: false, 429: false, 500: false, 503: false, 302: false} {
		if FinalStatus(status) != want {
			t.Errorf("FinalStatus(%d) = %v, want %v", status, !want, want)
		}
	}
}
