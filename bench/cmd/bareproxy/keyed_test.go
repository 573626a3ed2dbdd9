package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// startKeyed runs the keyed proxy in front of up and returns its base URL.
func startKeyed(t *testing.T, up *httptest.Server) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--keyed", "--listen", "127.0.0.1:0", "--upstream", up.URL}, io.Discard, ready)
	}()
	addr := <-ready
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return "http://" + addr
}

// post sends a keyed POST and returns the status and the body, the body after
// "replayed " when the answer says it is a replay.
func post(t *testing.T, url, key, auth, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/payments", strings.NewReader(body))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.Header.Get("Idempotent-Replayed") == "true" {
		return resp.StatusCode, "replayed " + string(b)
	}
	return resp.StatusCode, string(b)
}

func TestKeyedRunsOnce(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	var status atomic.Int64
	status.Store(http.StatusCreated)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		n := runs.Add(1)
		w.Header().Set("X-Run", string(rune('0'+n)))
		w.WriteHeader(int(status.Load()))
		_, _ = w.Write(b)
	}))
	defer up.Close()
	url := startKeyed(t, up)

	if code, body := post(t, url, "k1", "Bearer a", `{"a":1}`); code != 201 || body != `{"a":1}` {
		t.Fatalf("first: %d %q", code, body)
	}
	if code, body := post(t, url, "k1", "Bearer a", `{"a":1}`); code != 201 || body != `replayed {"a":1}` || runs.Load() != 1 {
		t.Errorf("retry: %d %q, the upstream ran %d times, want a replay and 1", code, body, runs.Load())
	}
	if code, _ := post(t, url, "k1", "Bearer a", `{"a":2}`); code != http.StatusUnprocessableEntity || runs.Load() != 1 {
		t.Errorf("reused key: %d, runs %d, want 422 and 1", code, runs.Load())
	}
	// Another caller's key of the same name is its own.
	if code, _ := post(t, url, "k1", "Bearer b", `{"a":2}`); code != 201 || runs.Load() != 2 {
		t.Errorf("another scope: %d, runs %d, want 201 and 2", code, runs.Load())
	}
	// An unkeyed request goes through every time.
	post(t, url, "", "", `{}`)
	post(t, url, "", "", `{}`)
	if runs.Load() != 4 {
		t.Errorf("unkeyed: runs %d, want 4", runs.Load())
	}
	// A failure releases the key: its retry runs again.
	status.Store(http.StatusServiceUnavailable)
	if code, _ := post(t, url, "k2", "Bearer a", `{}`); code != 503 {
		t.Errorf("failure: %d", code)
	}
	status.Store(http.StatusCreated)
	if code, _ := post(t, url, "k2", "Bearer a", `{}`); code != 201 || runs.Load() != 6 {
		t.Errorf("retry after a failure: %d, runs %d, want 201 and 6", code, runs.Load())
	}
}

func TestKeyedInFlight(t *testing.T) {
	t.Parallel()
	arrived, release := make(chan struct{}), make(chan struct{})
	var runs atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Only the first request waits: a duplicate that reaches the upstream is
		// answered at once, and counted.
		if runs.Add(1) == 1 {
			close(arrived)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer up.Close()
	url := startKeyed(t, up)
	first := make(chan int, 1)
	go func() {
		code, _ := post(t, url, "k", "", `{}`)
		first <- code
	}()
	<-arrived
	if code, _ := post(t, url, "k", "", `{}`); code != http.StatusConflict || runs.Load() != 1 {
		t.Errorf("duplicate in flight: %d, runs %d, want 409 and 1", code, runs.Load())
	}
	close(release)
	if code := <-first; code != 201 {
		t.Errorf("first: %d", code)
	}
}

func TestKeyedBodyTooLarge(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs.Add(1) }))
	defer up.Close()
	url := startKeyed(t, up)
	if code, _ := post(t, url, "k", "", strings.Repeat("x", maxKeyedBody+1)); code != http.StatusRequestEntityTooLarge || runs.Load() != 0 {
		t.Errorf("%d, runs %d, want 413 and 0", code, runs.Load())
	}
}
