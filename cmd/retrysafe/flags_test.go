package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/gateway/configfile"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/internal/durfmt"
)

func TestParseSize(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{
		"0": 0, "1048576": 1 << 20, "1MiB": 1 << 20, "4MiB": 4 << 20, "512KiB": 512 << 10, "512kib": 512 << 10,
		"1 MiB": 1 << 20, "2K": 2048, "1GiB": 1 << 30, "1MB": 1000000, "10KB": 10000, "7B": 7,
	} {
		got, err := parseSize(in)
		if err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "-1", "1.5MiB", "1XB", "99999999999999999999", "9999999999GiB"} {
		if n, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) = %d, want an error", in, n)
		}
	}
	for n, want := range map[int64]string{1 << 20: "1MiB", 4 << 20: "4MiB", 512 << 10: "512KiB", 1000: "1000", 1 << 30: "1GiB"} {
		b := byteSize(n)
		if got := b.String(); got != want {
			t.Errorf("byteSize(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestEnvName(t *testing.T) {
	t.Parallel()
	for flag, want := range map[string]string{"upstream": "RETRYSAFE_UPSTREAM", "max-body": "RETRYSAFE_MAX_BODY", "scope-header": "RETRYSAFE_SCOPE_HEADER"} {
		if got := envName(flag); got != want {
			t.Errorf("envName(%q) = %q", flag, got)
		}
	}
}

// TestEnvAndFlags: flags win over the environment; the environment fills in the rest.
func TestEnvAndFlags(t *testing.T) {
	t.Setenv("RETRYSAFE_MAX_BODY", "2MiB")
	t.Setenv("RETRYSAFE_LOG_FORMAT", "xml") // overridden by the flag below
	t.Setenv("RETRYSAFE_UPSTREAM", "ftp://wrong")
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"gateway", "--log-format", "json", "--store", "bogus:"}, &stdout, &stderr)
	// The upstream from the environment is checked (and refused) before the store.
	if code != exitUsage || !strings.Contains(stderr.String(), "ftp://wrong") {
		t.Fatalf("%d %q", code, stderr.String())
	}
}

// The gateway's --help lists every flag it defines, and no other, with the defaults the
// flags really have — which are the packages' own: the help is written from the flag
// set, and the flag set from idempotency's and gateway's defaults.
func TestGatewayHelpIsTheFlags(t *testing.T) {
	fs, _, docs := newGatewayFlags()
	documented := map[string]bool{}
	for _, d := range docs {
		if fs.Lookup(d.name) == nil {
			t.Errorf("--help documents --%s, which is not a flag", d.name)
		}
		documented[d.name] = true
	}
	fs.VisitAll(func(f *flag.Flag) {
		if !documented[f.Name] {
			t.Errorf("--%s is a flag that --help does not document", f.Name)
		}
	})
	help := strings.Join(strings.Fields(gatewayHelp()), " ") // as read, across the wrapping
	for flagName, want := range map[string]string{
		"ttl":              durfmt.Format(idempotency.DefaultTTL),
		"lease":            durfmt.Format(idempotency.DefaultLease),
		"body-timeout":     durfmt.Format(idempotency.DefaultBodyTimeout),
		"upstream-timeout": durfmt.Format(gateway.DefaultUpstreamTimeout),
		"methods":          strings.Join(idempotency.DefaultMethods(), ","),
	} {
		if got := formatDefault(fs.Lookup(flagName).DefValue); got != want {
			t.Errorf("--%s defaults to %s, the package's default is %s", flagName, got, want)
		}
	}
	for _, want := range []string{
		"(default " + durfmt.Format(idempotency.DefaultTTL) + ")",
		"(default " + (*byteSize)(ptr(int64(idempotency.DefaultMaxBody))).String() + ")",
		"(default " + (*byteSize)(ptr(int64(idempotency.DefaultMaxResponse))).String() + ")",
		"(default " + (*byteSize)(ptr(int64(idempotency.DefaultMaxBodyMemory))).String() + ")",
		"upstream timeout + " + durfmt.Format(gateway.DefaultShutdownGrace),
	} {
		if !strings.Contains(help, want) {
			t.Errorf("--help lacks %q", want)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// The packages' errors about their Config are shown in the flags' names.
func TestFlagErrorNamesTheFlags(t *testing.T) {
	_, _, docs := newGatewayFlags()
	err := flagError(errors.New("gateway: idempotency: Config.MaxBodyMemory (1) is smaller than Config.MaxBody (2); Config.Idempotency.Methods"), docs)
	if want := "--max-body-memory (1) is smaller than --max-body (2); --methods"; err.Error() != want {
		t.Errorf("flagError = %q, want %q", err, want)
	}
}

// The gateway's conflict policy defaults to wait, from the flags and from a file alike,
// bounded by --max-waiters, which a file's max_waiters takes from the flag.
func TestGatewayConflictDefaults(t *testing.T) {
	setup := func(args ...string) (gatewaySetup, error) {
		fs, f, docs := newGatewayFlags()
		if err := fs.Parse(append([]string{"--upstream", "http://127.0.0.1:1"}, args...)); err != nil {
			t.Fatal(err)
		}
		return flagSetup(f, docs, io.Discard)
	}
	s, err := setup()
	if err != nil {
		t.Fatal(err)
	}
	if mw := s.cfg.Idempotency; mw.Conflict != idempotency.ConflictWait || mw.WaitTimeout != idempotency.DefaultWaitTimeout ||
		mw.MaxWaiters != idempotency.DefaultMaxWaiters {
		t.Errorf("defaults: conflict %q, wait timeout %s, max waiters %d; want wait, %s, %d", mw.Conflict, mw.WaitTimeout,
			mw.MaxWaiters, idempotency.DefaultWaitTimeout, idempotency.DefaultMaxWaiters)
	}
	if s, err = setup("--conflict", "reject", "--max-waiters", "7"); err != nil {
		t.Fatal(err)
	}
	if mw := s.cfg.Idempotency; mw.Conflict != idempotency.ConflictReject || mw.MaxWaiters != 7 {
		t.Errorf("--conflict reject --max-waiters 7: %q, %d", mw.Conflict, mw.MaxWaiters)
	}
	if _, err := setup("--max-waiters", "0"); err == nil || !strings.Contains(err.Error(), "--max-waiters") {
		t.Errorf("--max-waiters 0: %v, want an error naming it", err)
	}

	fs, _, _ := newGatewayFlags()
	if err := fs.Parse([]string{"--max-waiters", "5"}); err != nil {
		t.Fatal(err)
	}
	file, err := configfile.Parse("gw.yaml", []byte("upstreams: {api: 'http://127.0.0.1:1'}\n"), configfile.Options{Overrides: flagOverrides(fs)})
	if err != nil {
		t.Fatal(err)
	}
	if mw := file.Gateway.Idempotency; mw.MaxWaiters != 5 || mw.Conflict != idempotency.ConflictWait {
		t.Errorf("a file beside --max-waiters 5: max waiters %d, conflict %q; want 5, wait", mw.MaxWaiters, mw.Conflict)
	}
}
