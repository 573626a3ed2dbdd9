package load

import (
	"context"
	"testing"

	"github.com/retrysafe/retrysafe/harness/dropserver"
)

// Each measured request reaches the server once: the default client does not resend a
// keyed request by itself when its reused connection closes after the request was read,
// which would hide the failure and fold two executions into one latency.
func TestRunNoHiddenResends(t *testing.T) {
	t.Parallel()
	srv := dropserver.New(t, false)
	res, err := Run(context.Background(), Config{URL: srv.URL() + "/payments", Clients: 1,
		Requests: 10, Keys: KeyUnique, Body: []byte(`{"amount":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	if got := int64(srv.Reads()); got != res.Requests || res.Requests != 10 || res.Errors == 0 {
		t.Errorf("the server read %d requests; measured %d (%d responses, %d errors), want 10 reads with errors for the dropped ones",
			got, res.Requests, res.Responses, res.Errors)
	}
}
