// Package depcheck holds the tests that keep dependencies where they belong: the core
// packages free of third-party code, so that a user of idempotency, retry or deadline
// never compiles pgx; the retrysafe binary free of the embedded NATS server, which only
// the tests start; and the root go.mod free of the libraries only the bench module
// compares against, so that a user of this module never downloads them.
package depcheck

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// moduleRoot is the root module's directory, relative to this package's directory (the
// working directory of its tests).
const moduleRoot = "../.."

// stdlibOnly are the packages that may import only the standard library, each other and
// this module's internal packages. go list -deps lists every package they reach, so a
// third-party import anywhere below an internal package fails the test as well.
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
			t.Errorf("a core package depends on %s (only the standard library and this module's internal packages are allowed)", p)
		}
	}
}

// The binary connects to NATS as a client; the server (harness/natsserver) is for tests
// and benchmarks, and linking it would add megabytes and a server nobody runs.
func TestBinaryLinksNoNATSServer(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "./cmd/retrysafe")
	cmd.Dir = moduleRoot
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 {
		t.Fatal("go list -deps ./cmd/retrysafe listed nothing")
	}
	for _, p := range deps {
		if strings.HasPrefix(p, "github.com/nats-io/nats-server") {
			t.Errorf("cmd/retrysafe depends on %s (the NATS server belongs to the tests only)", p)
		}
		if p == "testing" || p == "net/http/httptest" {
			t.Errorf("cmd/retrysafe depends on %s (test code has no place in the binary)", p)
		}
	}
}

// benchOnly are the modules that only the bench module may require: the retry clients its
// benchmarks compare against. The root go.mod requiring them would make every user of
// this module download them.
var benchOnly = []string{
	"github.com/hashicorp/go-retryablehttp",
	"github.com/failsafe-go/failsafe-go",
}

func TestRootModuleRequiresNoBenchmarkOnlyModule(t *testing.T) {
	cmd := exec.Command("go", "mod", "edit", "-json", "go.mod")
	cmd.Dir = moduleRoot
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod edit -json go.mod: %v\n%s", err, out)
	}
	var mod struct {
		Module  struct{ Path string }
		Require []struct{ Path string }
	}
	if err := json.Unmarshal(out, &mod); err != nil {
		t.Fatalf("go mod edit -json go.mod: %v", err)
	}
	if mod.Module.Path != "github.com/retrysafe/retrysafe" {
		t.Fatalf("%s/go.mod is module %q, not the root module", moduleRoot, mod.Module.Path)
	}
	for _, r := range mod.Require {
		for _, b := range benchOnly {
			if r.Path == b {
				t.Errorf("the root go.mod requires %s (only bench/go.mod may)", r.Path)
			}
		}
	}
}
