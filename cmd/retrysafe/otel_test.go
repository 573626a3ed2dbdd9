package main

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/gateway/configfile"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// --otel is no key of the config file: given beside --config it is no override.
func TestOtelFlagIsNoOverride(t *testing.T) {
	fs, f, _ := newGatewayFlags()
	if err := fs.Parse([]string{"--otel", "--ttl", "1h"}); err != nil {
		t.Fatal(err)
	}
	if !f.otel {
		t.Fatal("--otel did not set the flag")
	}
	for _, o := range flagOverrides(fs) {
		if o.Key == "" || o.Source == "--otel" {
			t.Errorf("override %+v from --otel", o)
		}
	}
}

// Tracing is set up at start: a reload that turns the file's otel on or off says that
// it takes effect at a restart, and the running setup keeps the old value.
func TestReloadKeepsOtel(t *testing.T) {
	load := func(src string) *configfile.File {
		f, err := configfile.Parse("gw.yaml", []byte(src), configfile.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	const base = "upstreams:\n  api: http://127.0.0.1:3000\n"
	first := load(base)
	cfg := first.Gateway
	cfg.Idempotency.Store = memstore.New()
	cfg.Logger = slog.New(slog.DiscardHandler)
	gw, err := gateway.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Shutdown(context.Background()) })
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	running := reloadConfig(gw, func() (*configfile.File, error) { return load(base + "otel: true\n"), nil },
		gatewaySetup{cfg: cfg, file: first}, logger)
	if running.file.Otel {
		t.Error("the running setup took the reloaded otel")
	}
	if !strings.Contains(logs.String(), "only at a restart") || !strings.Contains(logs.String(), "otel") {
		t.Errorf("the reload did not say otel needs a restart:\n%s", logs.String())
	}
}
