package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestProxies(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Path", r.URL.Path)
		w.Header().Set("X-Key", r.Header.Get("Idempotency-Key"))
		w.Header().Set("X-Forwarded", r.Header.Get("X-Forwarded-For"))
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(b)
	}))
	defer up.Close()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--upstream", up.URL}, io.Discard, ready) }()
	addr := <-ready
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/payments", strings.NewReader(`{"a":1}`))
	req.Header.Set("Idempotency-Key", "k1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 || string(body) != `{"a":1}` || resp.Header.Get("X-Path") != "/payments" ||
		resp.Header.Get("X-Key") != "k1" || resp.Header.Get("X-Forwarded") != "127.0.0.1" {
		t.Errorf("%d %q %v", resp.StatusCode, body, resp.Header)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

func TestFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{}, {"--upstream", "ftp://x"}, {"--upstream", "http://x", "extra"}, {"--nope"}} {
		if err := run(context.Background(), args, io.Discard, nil); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}
