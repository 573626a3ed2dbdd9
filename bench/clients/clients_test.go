package clients

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/retrysafe/retrysafe/harness/testenv"
)

// binDir holds the gateway binary the tests build.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "retrysafe-clients-bin-")
	if err != nil {
		panic(err)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// tools finds the clients: node and npm (the node clients' packages then installed
// with npm ci), a Python that imports requests.
var tools = sync.OnceValues(func() (env, error) {
	ctx := context.Background()
	root, err := Root(".")
	if err != nil {
		return env{}, err
	}
	e := env{root: root, python: Python(ctx)}
	if e.nodeMissing = NodeMissing(); e.nodeMissing == "" {
		if err := InstallNode(ctx, root); err != nil {
			return env{}, err
		}
	}
	return e, nil
})

// gatewayBinary builds the gateway once, for the tests whose clients are there.
var gatewayBinary = sync.OnceValues(func() (string, error) {
	e, err := tools()
	if err != nil {
		return "", err
	}
	return BuildGateway(context.Background(), e.root, binDir)
})

type env struct {
	root, python string
	nodeMissing  string
}

// need skips (or, with RETRYSAFE_REQUIRE_SERVICES=1, fails) a test whose client is
// missing.
func (e env) need(t *testing.T, client string) {
	t.Helper()
	var missing string
	switch {
	case client == "requests" && e.python == "":
		missing = "no python3 that imports requests (Debian: apt-get install python3-requests)"
	case client != "requests" && e.nodeMissing != "":
		missing = e.nodeMissing + " not found (Debian: apt-get install nodejs npm)"
	}
	if missing == "" {
		return
	}
	if testenv.Required() {
		t.Fatal(missing + " [RETRYSAFE_REQUIRE_SERVICES=1]")
	}
	t.Skip(missing)
}

func run(t *testing.T, client string, gateway ...string) Result {
	t.Helper()
	e, err := tools()
	if err != nil {
		t.Fatal(err)
	}
	e.need(t, client)
	bin, err := gatewayBinary()
	if err != nil {
		t.Fatal(err)
	}
	r, err := Run(t.Context(), Options{Client: client, Binary: bin, Root: e.root, Python: e.python, Gateway: gateway, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	Table(&b, []Result{r})
	t.Logf("\n%s", b.String())
	return r
}

// TestRealClientsDefaults: axios with axios-retry's defaults, stripe-node and Python
// requests with urllib3's Retry, 100 logical POSTs each through a proxy that loses
// about 30% of the answers, into retrysafe gateway with its default flags: no logical
// request runs twice, none is lost, none ends with a 409.
func TestRealClientsDefaults(t *testing.T) {
	for _, client := range Clients {
		t.Run(client, func(t *testing.T) {
			r := run(t, client)
			if r.AnswersLost == 0 || r.Attempts <= r.Logical {
				t.Errorf("the proxy lost %d answers over %d attempts: the run tested no retry", r.AnswersLost, r.Attempts)
			}
			if r.Duplicates != 0 || r.Lost != 0 || r.Conflicts409() != 0 {
				t.Errorf("%s: %d duplicates, %d lost, %d final 409s; want none (final statuses %v)",
					client, r.Duplicates, r.Lost, r.Conflicts409(), r.Final)
			}
			if ok := r.Final[200] + r.Final[201]; ok != r.Logical {
				t.Errorf("%s: %d successes of %d: %v", client, ok, r.Logical, r.Final)
			}
		})
	}
}

// TestRealClientsReject: the same run under --conflict reject, the IETF draft's 409:
// axios retries a lost answer at once, meets its first attempt still in flight, gets
// 409 and does not retry it — a request that ran ends as an error. (Nothing runs
// twice either way.)
func TestRealClientsReject(t *testing.T) {
	r := run(t, "axios", "--conflict", "reject")
	if r.Duplicates != 0 {
		t.Errorf("%d duplicates", r.Duplicates)
	}
	if r.Conflicts409() == 0 {
		t.Errorf("no final 409 under --conflict reject (%d answers lost, held: %v): the harness no longer shows what the default fixes",
			r.AnswersLost, r.Held)
	}
}
