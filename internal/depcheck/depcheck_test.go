// Package depcheck holds the test that keeps the core packages free of third-party
// dependencies, so that a user of idempotency, retry or deadline never compiles pgx.
package depcheck

import (
	"os/exec"
	"strings"
	"testing"
)

// stdlibOnly are the packages that may import only the standard library, each other,
// and the module's internal packages — which go list -deps then checks in turn, so a
// third-party import behind one of those fails as well.
var stdlibOnly = []string{
	"github.com/retrysafe/retrysafe/idempotency",
	"github.com/retrysafe/retrysafe/deadline",
	"github.com/retrysafe/retrysafe/retry",
}

func TestCorePackagesImportOnlyTheStandardLibrary(t *testing.T) {
	args := append([]string{"list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}"}, stdlibOnly...)
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	allowed := map[string]bool{}
	for _, p := range stdlibOnly {
		allowed[p] = true
	}
	for _, p := range strings.Fields(string(out)) {
		if !allowed[p] && !strings.HasPrefix(p, "github.com/retrysafe/retrysafe/internal/") {
			t.Errorf("a core package depends on %s (only the standard library is allowed)", p)
		}
	}
}
