package endpointcheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// net/http's idle helpers outlive a test by a moment.
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
	)
}

var (
	alice = "Bearer alice"
	bob   = "Bearer bob"
	body  = []byte(`{"amount":100,"currency":"EUR"}`)
)

// baseConfig is the configuration every test starts from: predictable keys, two
// credentials, a body.
func baseConfig(u string) Config {
	return Config{URL: u, Body: body, Auth: []string{alice, bob}, Concurrency: testConcurrency, Rand: keyBytes(),
		Timeout: 10 * time.Second}
}

func run(t *testing.T, cfg Config) *Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := Check(ctx, cfg)
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	return rep
}

// verdicts maps each case to its verdict.
func verdicts(rep *Report) map[string]Verdict {
	m := map[string]Verdict{}
	for _, r := range rep.Results {
		m[r.ID] = r.Verdict
	}
	return m
}

func allCases() []string {
	return []string{CaseMissingKey, CaseReplay, CaseReplayMarker, CaseConcurrent, CaseOtherBody, CaseOtherRoute,
		CaseScopes, CaseKeyEmpty, CaseKeyLong, CaseKeyControl, CaseRetryAfter, CaseProblemJSON}
}

// expect checks every case's verdict: want lists those that are not Pass.
func expect(t *testing.T, rep *Report, want map[string]Verdict) {
	t.Helper()
	got := verdicts(rep)
	if len(got) != len(allCases()) {
		t.Errorf("%d results, want %d", len(got), len(allCases()))
	}
	for _, id := range allCases() {
		w, ok := want[id]
		if !ok {
			w = Pass
		}
		if got[id] != w {
			r, _ := rep.Result(id)
			t.Errorf("%s: verdict %s, want %s (observed: %s)", id, got[id], w, r.Observed)
		}
	}
	if t.Failed() {
		var buf bytes.Buffer
		_ = rep.WriteText(&buf)
		t.Logf("report:\n%s", buf.String())
	}
}

func TestGatewayPassesEverything(t *testing.T) {
	t.Parallel()
	client := &countingTransport{base: http.DefaultTransport.(*http.Transport).Clone(), signal: newSignal(), responses: map[string]int{}}
	defer client.base.(*http.Transport).CloseIdleConnections()
	up := &upstream{signal: newSignal(), client: client}
	upSrv := httptest.NewServer(up)
	defer upSrv.Close()
	upURL, _ := url.Parse(upSrv.URL)
	store := memstore.New()
	defer store.Close()
	gw, err := gateway.New(gateway.Config{Upstream: upURL, Logger: slog.New(slog.DiscardHandler), Idempotency: idempotency.Config{Store: store}})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Shutdown(context.Background()) // stops its store probe, after the server below
	gwSrv := httptest.NewServer(gw)
	defer gwSrv.Close()

	cfg := baseConfig(gwSrv.URL + "/payments")
	cfg.Transport = client
	rep := run(t, cfg)
	expect(t, rep, nil)
	if rep.Failed() {
		t.Error("Failed() = true")
	}
	// One execution per valid key and credential: key 0, key 1 (concurrent), key 2 under
	// alice and under bob. Nothing else reached the upstream.
	if n := up.Executions(); n != 4 {
		t.Errorf("the upstream executed %d times, want 4", n)
	}
	if want := 1 + 2 + testConcurrency + 1 + 1 + 2 + 3; rep.Requests != want {
		t.Errorf("Requests = %d, want %d", rep.Requests, want)
	}
	r, _ := rep.Result(CaseConcurrent)
	if !strings.Contains(r.Observed, "1× 201") || !strings.Contains(r.Observed, "19× 409") {
		t.Errorf("concurrent observed %q, want one 201 and 19 409s", r.Observed)
	}
}

func TestReferenceFakePassesEverything(t *testing.T) {
	t.Parallel()
	f, srv := newFake(t, fakeOpts{})
	rep := run(t, baseConfig(srv.URL+"/payments"))
	expect(t, rep, nil)
	if n := f.Executions(); n != 4 {
		t.Errorf("%d executions, want 4", n)
	}
}

// TestBrokenServers runs the check against servers broken in one way each: the cases
// that catch that way fail, and the others do not.
func TestBrokenServers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		opts   fakeOpts
		want   map[string]Verdict
		failed bool
	}{
		{
			name: "ignores keys", opts: fakeOpts{ignoreKeys: true}, failed: true,
			want: map[string]Verdict{
				CaseMissingKey: NotApplicable, CaseReplay: Fail, CaseReplayMarker: NotApplicable, CaseConcurrent: Fail,
				CaseOtherBody: Fail, CaseKeyEmpty: Fail, CaseKeyLong: Fail, CaseKeyControl: Fail,
				CaseRetryAfter: NotApplicable, CaseProblemJSON: NotApplicable,
			},
		},
		{name: "replays across credentials", opts: fakeOpts{sharedScope: true}, failed: true,
			want: map[string]Verdict{CaseScopes: Fail}},
		{name: "200 on another body", opts: fakeOpts{ignoreBody: true}, failed: true,
			want: map[string]Verdict{CaseOtherBody: Fail}},
		{name: "accepts malformed keys", opts: fakeOpts{acceptMalformed: true}, failed: true,
			want: map[string]Verdict{CaseKeyEmpty: Fail, CaseKeyLong: Fail, CaseKeyControl: Fail}},
		{name: "409 without Retry-After", opts: fakeOpts{noRetryAfter: true}, failed: true,
			want: map[string]Verdict{CaseRetryAfter: Fail}},
		{name: "text/plain errors", opts: fakeOpts{textErrors: true}, failed: false,
			want: map[string]Verdict{CaseProblemJSON: Fail}},
		{name: "check-then-act race", opts: fakeOpts{racy: true}, failed: true,
			want: map[string]Verdict{CaseConcurrent: Fail, CaseRetryAfter: NotApplicable}},
		{
			// Every execution looks the same and nothing marks a replay: counting
			// executions is impossible, and the check says so instead of passing.
			name: "indistinguishable executions", opts: fakeOpts{ignoreKeys: true, constant: true}, failed: true,
			want: map[string]Verdict{
				CaseMissingKey: NotApplicable, CaseReplay: NotApplicable, CaseReplayMarker: Fail, CaseConcurrent: NotApplicable,
				CaseOtherBody: Fail, CaseOtherRoute: Fail, CaseScopes: NotApplicable, CaseKeyEmpty: Fail, CaseKeyLong: Fail,
				CaseKeyControl: Fail, CaseRetryAfter: NotApplicable, CaseProblemJSON: NotApplicable,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, srv := newFake(t, tt.opts)
			rep := run(t, baseConfig(srv.URL+"/payments"))
			expect(t, rep, tt.want)
			if rep.Failed() != tt.failed {
				t.Errorf("Failed() = %v, want %v", rep.Failed(), tt.failed)
			}
		})
	}
}

func TestOneCredentialScopesNotApplicable(t *testing.T) {
	t.Parallel()
	_, srv := newFake(t, fakeOpts{})
	cfg := baseConfig(srv.URL + "/payments")
	cfg.Auth = cfg.Auth[:1]
	rep := run(t, cfg)
	expect(t, rep, map[string]Verdict{CaseScopes: NotApplicable})
	if want := 1 + 2 + testConcurrency + 1 + 1 + 3; rep.Requests != want {
		t.Errorf("Requests = %d, want %d", rep.Requests, want)
	}
	if n, err := Requests(cfg); err != nil || n != rep.Requests {
		t.Errorf("Requests(cfg) = %d, %v; Check sent %d", n, err, rep.Requests)
	}
}

func TestQuotedKeys(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if v := r.Header.Values("Idempotency-Key"); len(v) > 0 && len(seen) < 2 {
			seen = append(seen, v[0])
		}
		w.WriteHeader(http.StatusBadRequest)
	}))
	defer srv.Close()
	cfg := baseConfig(srv.URL)
	cfg.QuotedKeys = true
	cfg.Concurrency = 2
	run(t, cfg)
	mu.Lock()
	defer mu.Unlock()
	if len(seen) == 0 || seen[0] != `"`+testKey(0)+`"` {
		t.Errorf("keys sent %q, want the first quoted", seen)
	}
}

// A sequential replay answered 409 (the result not yet recorded) is sent again after
// the 409's Retry-After, and the 409 is part of the observation.
func TestSequentialReplaySettlesAfter409(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	calls := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		k := r.Header.Get("Idempotency-Key")
		calls[k]++
		switch {
		case k == testKey(0) && calls[k] == 2:
			w.Header().Set("Retry-After", "2")
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusConflict)
		case k == testKey(0) && calls[k] > 2:
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"id":1}`)
		default:
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"id":1}`)
		}
	}))
	defer srv.Close()
	var waits []time.Duration
	cfg := baseConfig(srv.URL)
	cfg.Auth = nil
	cfg.Concurrency = 2
	cfg.Sleep = func(_ context.Context, d time.Duration) error {
		waits = append(waits, d)
		return nil
	}
	rep := run(t, cfg)
	r, _ := rep.Result(CaseReplay)
	if r.Verdict != Pass || !strings.Contains(r.Observed, "after 1× 409") {
		t.Errorf("replay: %s %q", r.Verdict, r.Observed)
	}
	if len(waits) != 1 || waits[0] != 2*time.Second {
		t.Errorf("waits %v, want [2s]", waits)
	}
	if r, _ := rep.Result(CaseRetryAfter); r.Verdict != Pass {
		t.Errorf("retry-after: %s %q", r.Verdict, r.Observed)
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	for _, cfg := range []Config{
		{},
		{URL: "ftp://example.com/x"},
		{URL: "http:///nohost"},
		{URL: "http://x/", Method: "PO ST"},
		{URL: "http://x/", Concurrency: 1},
		{URL: "http://x/", Timeout: -time.Second},
		{URL: "http://x/", Auth: []string{"a", "b", "c"}},
		{URL: "http://x/", Auth: []string{"a", "a"}},
		{URL: "http://x/", Auth: []string{"a\nb"}},
		{URL: "http://x/p", OtherRoute: "/p"},
		{URL: "http://x/p", OtherRoute: "ftp://y/"},
		{URL: "http://x/", Header: http.Header{"Bad Name": {"v"}}},
		{URL: "http://x/", Header: http.Header{"X": {"a\r\nb"}}},
		{URL: "%zz"},
	} {
		if _, err := Check(context.Background(), cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("Check(%+v) = %v, want ErrConfig", cfg, err)
		}
		if _, err := Requests(cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("Requests(%+v) = %v, want ErrConfig", cfg, err)
		}
	}
}

func TestUnreachable(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	u := srv.URL
	srv.Close()
	_, err := Check(context.Background(), Config{URL: u, Timeout: 2 * time.Second})
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("err = %v, want ErrUnreachable", err)
	}
}

func TestCanceled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, srv := newFake(t, fakeOpts{})
	if _, err := Check(ctx, Config{URL: srv.URL}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestSiblingURL(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ url, other, want string }{
		{"http://h/payments", "", "http://h/payments/__retrysafe_check"},
		{"http://h/payments/", "", "http://h/payments/__retrysafe_check"},
		{"http://h", "", "http://h/__retrysafe_check"},
		{"http://h/v1/payments?x=1", "", "http://h/v1/payments/__retrysafe_check?x=1"},
		{"http://h/v1/payments", "/v1/refunds", "http://h/v1/refunds"},
		{"http://h/v1/payments", "refunds", "http://h/v1/refunds"},
		{"http://h/v1/payments", "https://other/x", "https://other/x"},
	} {
		u, err := parseURL(tt.url)
		if err != nil {
			t.Fatal(err)
		}
		got, err := siblingURL(u, tt.other)
		if err != nil || got.String() != tt.want {
			t.Errorf("siblingURL(%q, %q) = %v, %v; want %s", tt.url, tt.other, got, err, tt.want)
		}
	}
}

func TestOtherBody(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"", `{"a":1}`, ` {"a":1} `, `[1,2]`, "plain text", `{"retrysafe_check":"other body"}`} {
		out := otherBody([]byte(in))
		if bytes.Equal(out, []byte(in)) {
			t.Errorf("otherBody(%q) = the same", in)
		}
		if strings.HasPrefix(strings.TrimSpace(in), "{") && !json.Valid(out) {
			t.Errorf("otherBody(%q) = %q, not JSON", in, out)
		}
	}
}

func TestLoopback(t *testing.T) {
	t.Parallel()
	for u, want := range map[string]bool{
		"http://127.0.0.1:8080/x": true, "http://127.1.2.3/": true, "http://[::1]:80/": true,
		"http://localhost/": true, "http://LOCALHOST.:9/": true, "http://api.localhost/": true,
		"https://api.example.com/": false, "http://10.0.0.1/": false, "http://localhost.example.com/": false,
		"http://[::ffff:127.0.0.1]/": true, "%zz": false,
	} {
		if got := Loopback(u); got != want {
			t.Errorf("Loopback(%q) = %v, want %v", u, got, want)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"3": 3 * time.Second, " 0 ": 0, now.Add(10 * time.Second).Format(http.TimeFormat): 10 * time.Second,
	} {
		if d, ok := retryAfter(http.Header{"Retry-After": {v}}, now); !ok || d != want {
			t.Errorf("retryAfter(%q) = %v, %v; want %v", v, d, ok, want)
		}
	}
	for _, v := range []string{"", "-1", "soon"} {
		if _, ok := retryAfter(http.Header{"Retry-After": {v}}, now); ok {
			t.Errorf("retryAfter(%q) ok", v)
		}
	}
}

func TestReportOutput(t *testing.T) {
	t.Parallel()
	_, srv := newFake(t, fakeOpts{sharedScope: true})
	rep := run(t, baseConfig(srv.URL+"/payments"))
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CASE", "same key, two credentials", "FAIL", "NOT safe", "/payments/__retrysafe_check"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text output lacks %q:\n%s", want, text.String())
		}
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Failed   bool     `json:"failed"`
		Requests int      `json:"requests"`
		Results  []Result `json:"results"`
	}
	if err := json.Unmarshal(js.Bytes(), &got); err != nil {
		t.Fatalf("JSON output: %v\n%s", err, js.String())
	}
	if !got.Failed || got.Requests != rep.Requests || len(got.Results) != len(allCases()) {
		t.Errorf("JSON output: failed %v, requests %d, %d results", got.Failed, got.Requests, len(got.Results))
	}
}
