package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	t.Parallel()
	o, err := parse(nil, io.Discard)
	if err != nil || o.addr != "127.0.0.1:8081" || o.store != "sqlite:payments.db" || !o.tx || o.noIdempotency {
		t.Errorf("defaults: %+v, %v", o, err)
	}
	if _, err := parse([]string{"--no-idempotency"}, io.Discard); err != nil {
		t.Errorf("--no-idempotency: %v", err)
	}
	if _, err := parse([]string{"--no-idempotency", "--tx"}, io.Discard); err == nil {
		t.Error("--no-idempotency --tx: no error")
	}
	if _, err := parse([]string{"extra"}, io.Discard); err == nil {
		t.Error("a positional argument: no error")
	}
	var help strings.Builder
	if _, err := parse([]string{"--help"}, &help); !errors.Is(err, flag.ErrHelp) || !strings.Contains(help.String(), "curl") {
		t.Errorf("--help: %v\n%s", err, help.String())
	}
}

func TestRunRejectsUnknownStore(t *testing.T) {
	t.Parallel()
	err := run(context.Background(), []string{"--store", "mysql://x"}, io.Discard, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "--store") {
		t.Errorf("unknown store: %v", err)
	}
}
