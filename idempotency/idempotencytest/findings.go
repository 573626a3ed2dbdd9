package idempotencytest

import (
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/idempotency"
)

// WantFinding is a finding a test expects among those a store's Inspect returns: its
// level and check, and words its setting and its detail hold.
type WantFinding struct {
	Level   idempotency.FindingLevel
	Check   string
	Setting string // a part of the Setting
	Detail  string // a part of the Detail
}

// CheckFindings fails t unless each of wants is among found, and reports every warning
// or refusal in found that no want names: a store must say what a setup risks, and
// nothing more. what names the setup in the messages.
func CheckFindings(t *testing.T, what string, found []idempotency.Finding, wants ...WantFinding) {
	t.Helper()
	matched := make([]bool, len(found))
	for _, w := range wants {
		ok := false
		for i, f := range found {
			if f.Level == w.Level && f.Check == w.Check && strings.Contains(f.Setting, w.Setting) && strings.Contains(f.Detail, w.Detail) {
				ok, matched[i] = true, true
			}
		}
		if !ok {
			t.Errorf("%s: no %s %s finding with %q and %q", what, w.Level, w.Check, w.Setting, w.Detail)
		}
	}
	for i, f := range found {
		if !matched[i] && f.Level != idempotency.FindingOK {
			t.Errorf("%s: unexpected %+v", what, f)
		}
	}
	if t.Failed() {
		for _, f := range found {
			t.Logf("%s: found %+v", what, f)
		}
	}
}
