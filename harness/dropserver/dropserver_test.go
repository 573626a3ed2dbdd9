package dropserver

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestTransportResendsThroughIt: the trap the server sets. Through a plain
// http.Transport, a keyed POST dropped on a reused connection is read twice (the
// Transport resent it by itself); an unkeyed one once.
func TestTransportResendsThroughIt(t *testing.T) {
	for _, reset := range []bool{false, true} {
		s := New(t, reset)
		client := &http.Client{Transport: &http.Transport{}}
		post := func(key string) {
			req, _ := http.NewRequest(http.MethodPost, s.URL(), strings.NewReader(`{}`))
			if key != "" {
				req.Header.Set("Idempotency-Key", key)
			}
			if res, err := client.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, res.Body) // read whole: the connection is reused
				res.Body.Close()
			}
		}
		post("warm") // first on the connection: answered
		post("k")    // second: read, dropped, resent on a new connection, answered there
		if n := s.ReadsOf("k"); n != 2 {
			t.Errorf("reset=%v: the keyed POST was read %d times, want 2 (resent by the Transport)", reset, n)
		}
		post("") // the second request on the connection k was resent on: dropped, not resent
		post("") // on a fresh connection: answered
		if n := s.ReadsOf(""); n != 2 {
			t.Errorf("reset=%v: unkeyed POSTs read %d times, want 2 (never resent)", reset, n)
		}
		client.CloseIdleConnections()
	}
}
