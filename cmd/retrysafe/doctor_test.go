package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
	"github.com/retrysafe/retrysafe/storedsn"
)

// inspecting is a store whose Inspect returns findings, or err.
type inspecting struct {
	idempotency.Store
	findings []idempotency.Finding
	err      error
}

func (s inspecting) Inspect(context.Context) ([]idempotency.Finding, error) { return s.findings, s.err }

// checkStoreSetup, as the gateway starts: every refusal not allowed is a line of its own
// on stderr, and the start fails; warnings and allowed refusals are WARN lines with
// their check, setting and detail, except those already logged; OK findings are debug
// lines; a store that cannot be read fails the start.
func TestCheckStoreSetup(t *testing.T) {
	t.Parallel()
	mem := memstore.New()
	t.Cleanup(func() { _ = mem.Close() })
	f := func(level idempotency.FindingLevel, check, setting string) idempotency.Finding {
		return idempotency.Finding{Level: level, Check: check, Setting: setting, Detail: "what can happen with " + setting}
	}
	store := &storedsn.Opened{Name: "fake:", Store: inspecting{Store: mem, findings: []idempotency.Finding{
		f(idempotency.FindingRefuse, "redis.role", "role=slave"),
		f(idempotency.FindingOK, "redis.topology", "one server"),
		f(idempotency.FindingWarn, "redis.persistence", "appendonly=no"),
		f(idempotency.FindingRefuse, "sqlite.filesystem", "on nfs"),
		f(idempotency.FindingRefuse, "redis.eviction", "maxmemory-policy=allkeys-lru"),
		f(idempotency.FindingRefuse, "sqlite.journal_mode", "journal_mode=off"),
	}}}
	run := func(allowed allowedRisks, logged ...string) (bool, string, []map[string]any) {
		var log, stderr bytes.Buffer
		logger := slog.New(slog.NewJSONHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))
		ok := checkStoreSetup(context.Background(), "retrysafe gateway", store, allowed, logger, &stderr, logged...)
		var lines []map[string]any
		for line := range strings.SplitSeq(strings.TrimSpace(log.String()), "\n") {
			if line == "" {
				continue
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatalf("log line %q: %v", line, err)
			}
			lines = append(lines, m)
		}
		return ok, stderr.String(), lines
	}

	ok, stderr, logged := run(allowedRisks{"redis.eviction", "sqlite.journal_mode"}, "redis.eviction")
	if ok {
		t.Error("started despite two refusals")
	}
	want := "retrysafe gateway: store refused: redis.role role=slave: what can happen with role=slave (retrysafe doctor --store … says more; to accept it, --allow-store-risk redis.role)\n" +
		"retrysafe gateway: store refused: sqlite.filesystem on nfs: what can happen with on nfs (retrysafe doctor --store … says more; to accept it, --allow-store-risk sqlite.filesystem)\n"
	if stderr != want {
		t.Errorf("stderr:\n%s\nwant:\n%s", stderr, want)
	}
	var warns, debugs []string
	for _, m := range logged {
		switch m["level"] {
		case "WARN":
			warns = append(warns, m["check"].(string)+" "+m["setting"].(string)+": "+m["detail"].(string))
		case "DEBUG":
			debugs = append(debugs, m["check"].(string))
		default:
			t.Errorf("log line %v", m)
		}
		if m["store"] != "fake:" {
			t.Errorf("log line without the store: %v", m)
		}
	}
	wantWarns := []string{"redis.persistence appendonly=no: what can happen with appendonly=no",
		"sqlite.journal_mode journal_mode=off: what can happen with journal_mode=off (a refusal allowed by --allow-store-risk sqlite.journal_mode)"}
	if strings.Join(warns, "\n") != strings.Join(wantWarns, "\n") {
		t.Errorf("warnings:\n%s\nwant:\n%s", strings.Join(warns, "\n"), strings.Join(wantWarns, "\n"))
	}
	if strings.Join(debugs, ",") != "redis.topology" {
		t.Errorf("debug lines for %v, want redis.topology", debugs)
	}

	if ok, stderr, _ := run(allowedRisks{"redis.role", "sqlite.filesystem", "redis.eviction", "sqlite.journal_mode"}); !ok || stderr != "" {
		t.Errorf("every refusal allowed: started %v, stderr %q", ok, stderr)
	}

	store.Store = inspecting{Store: mem, err: errors.New("connection reset")}
	if ok, stderr, _ := run(nil); ok || stderr != "retrysafe gateway: fake:: reading the store's settings: connection reset\n" {
		t.Errorf("unreadable store: started %v, stderr %q", ok, stderr)
	}
}

// --allow-store-risk takes known checks, comma-separated or repeated, once each.
func TestAllowedRisks(t *testing.T) {
	t.Parallel()
	var a allowedRisks
	for _, v := range []string{"redis.eviction, sqlite.filesystem", "redis.eviction", "postgres.recovery"} {
		if err := a.Set(v); err != nil {
			t.Fatal(err)
		}
	}
	if a.String() != "redis.eviction,sqlite.filesystem,postgres.recovery" || !a.allows("sqlite.filesystem") || a.allows("redis.role") {
		t.Errorf("allowed %q", a.String())
	}
	if err := a.Set("redis.evictoin"); err == nil || !strings.Contains(err.Error(), `unknown check "redis.evictoin"`) {
		t.Errorf("a misspelt check: %v", err)
	}
}
