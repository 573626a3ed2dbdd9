package endpointcheck

import (
	"testing"

	"github.com/retrysafe/retrysafe/harness/dropserver"
)

// Every request of the battery reaches the endpoint once: the client does not resend a
// keyed request by itself when its reused connection closes after the request was read,
// which would count as an execution the battery never asked for.
func TestNoHiddenResends(t *testing.T) {
	srv := dropserver.New(t, false)
	cfg := baseConfig(srv.URL() + "/payments")
	cfg.Concurrency = 2
	rep := run(t, cfg)
	if got := srv.Reads(); got != rep.Requests {
		t.Errorf("the endpoint read %d requests, the battery sent %d", got, rep.Requests)
	}
}
