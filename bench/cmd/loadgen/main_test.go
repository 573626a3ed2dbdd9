package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/bench/load"
)

func TestParse(t *testing.T) {
	t.Parallel()
	cfg, o, err := parse([]string{"--url", "http://127.0.0.1:1/p", "-c", "8", "-d", "2s", "--keys", "shared",
		"-H", "Content-Type: application/json", "-H", "X-A: 1", "--tag", "subject=x", "--body", "{}", "--format", "json"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Clients != 8 || cfg.Duration != 2*time.Second || cfg.Keys != load.KeyShared || o.format != "json" ||
		cfg.Header.Get("Content-Type") != "application/json" || cfg.Header.Get("X-A") != "1" ||
		cfg.Tags["subject"] != "x" || string(cfg.Body) != "{}" {
		t.Errorf("parsed %+v, options %+v", cfg, o)
	}
	cfg, o, err = parse([]string{"--idle", "1s", "--cpu", "pg=42", "--cpu", "me=self", "--cpu", "ours=42: rsb ", "--clk-tck", "250"}, io.Discard)
	if err != nil || o.idle != time.Second || len(cfg.CPU) != 3 || cfg.CPU[0] != (load.Process{Name: "pg", PID: 42}) ||
		cfg.CPU[2] != (load.Process{Name: "ours", PID: 42, Match: " rsb "}) ||
		cfg.CPU[1].PID != os.Getpid() || cfg.ClockTicks != 250 {
		t.Errorf("--idle: %+v, %+v, %v", cfg, o, err)
	}
	for _, args := range [][]string{
		{},
		{"--url", "x"},
		{"--url", "http://h/", "--keys", "some"},
		{"--url", "http://h/", "--format", "xml"},
		{"--url", "http://h/", "-H", "novalue"},
		{"--url", "http://h/", "--tag", "novalue"},
		{"--url", "http://h/", "--body", "a", "--body-file", "f"},
		{"--url", "http://h/", "--body-file", "/nonexistent/file"},
		{"--url", "http://h/", "-c", "-3"},
		{"--url", "http://h/", "extra"},
		{"--url", "http://h/", "--cpu", "x"},
		{"--url", "http://h/", "--cpu", "x=0"},
		{"--url", "http://h/", "--cpu", "x=me"},
		{"--url", "http://h/", "--cpu", "x=1", "--cpu", "x=2"},
		{"--idle", "1s"},
		{"--idle", "-1s", "--cpu", "x=1"},
	} {
		if _, _, err := parse(args, io.Discard); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}

func TestRunJSON(t *testing.T) {
	t.Parallel()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	defer ts.Close()
	var out, errOut strings.Builder
	if code := run(context.Background(), []string{"--url", ts.URL, "-n", "10", "-c", "2", "--format", "json"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var res load.Result
	if err := json.Unmarshal([]byte(out.String()), &res); err != nil || res.Status["201"] != 10 {
		t.Errorf("%v: %s", err, out.String())
	}
	if runtime.GOOS != "linux" {
		return // --idle reads /proc
	}
	out.Reset()
	if code := run(context.Background(), []string{"--idle", "10ms", "--cpu", "me=self", "--tag", "kind=idle", "--format", "json"}, &out, &errOut); code != 0 {
		t.Fatalf("--idle: exit %d: %s", code, errOut.String())
	}
	if err := json.Unmarshal([]byte(out.String()), &res); err != nil || res.CPU["me"].Processes < 1 || res.Tags["kind"] != "idle" {
		t.Errorf("--idle: %v: %s", err, out.String())
	}
	if code := run(context.Background(), []string{"--url", "x"}, io.Discard, io.Discard); code != 2 {
		t.Errorf("bad URL: exit %d, want 2", code)
	}
}
