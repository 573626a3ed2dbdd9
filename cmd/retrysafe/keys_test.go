package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// TestKeysListRoute: keys list shows each record's route ("-" for none) and --route
// lists only the records of that route; keys show names the route.
func TestKeysListRoute(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	for key, route := range map[string]string{"pay-1": "POST /payments", "pay-2": "POST /payments", "ref-1": "POST /refunds", "old-1": ""} {
		if _, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Route: route}); err != nil {
			t.Fatal(err)
		}
	}
	list := func(f keysFlags) string {
		t.Helper()
		var out strings.Builder
		if err := listKeys(ctx, s, f, false, &out); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	out := list(keysFlags{})
	if !strings.Contains(out, "ROUTE") || !strings.Contains(out, "(4 records)") {
		t.Errorf("keys list:\n%s", out)
	}
	for line := range strings.Lines(out) {
		for key, route := range map[string]string{"pay-1": "POST /payments", "ref-1": "POST /refunds", "old-1": "-"} {
			if strings.Contains(line, key) && !strings.Contains(line, "  "+route+"  ") {
				t.Errorf("the line of %s does not show its route %q: %s", key, route, line)
			}
		}
	}
	out = list(keysFlags{route: "POST /payments"})
	if !strings.Contains(out, "pay-1") || !strings.Contains(out, "pay-2") || strings.Contains(out, "ref-1") ||
		strings.Contains(out, "old-1") || !strings.Contains(out, "(2 records)") {
		t.Errorf("keys list --route 'POST /payments':\n%s", out)
	}
	var show strings.Builder
	if err := showKey(ctx, s, keysFlags{key: "ref-1"}, &show); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(show.String(), "route:") || !strings.Contains(show.String(), "POST /refunds") {
		t.Errorf("keys show:\n%s", show.String())
	}
}
