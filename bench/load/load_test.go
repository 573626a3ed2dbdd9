package load

import (
	"context"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestBuckets(t *testing.T) {
	t.Parallel()
	prevHi := int64(-1)
	for i := 0; i < numBuckets; i++ {
		lo, hi := bucketRange(i)
		if int64(lo) != prevHi+1 || hi < lo {
			t.Fatalf("bucket %d: [%d, %d] after %d", i, lo, hi, prevHi)
		}
		if bucketOf(lo) != i || bucketOf(hi) != i {
			t.Fatalf("bucket %d: [%d, %d] maps to %d, %d", i, lo, hi, bucketOf(lo), bucketOf(hi))
		}
		if lo > 0 && float64(hi-lo)/float64(lo) > 1.0/subCount {
			t.Fatalf("bucket %d: [%d, %d] wider than 1/%d", i, lo, hi, subCount)
		}
		prevHi = int64(hi)
		if hi == ^uint64(0)>>1 {
			break
		}
	}
	if prevHi != int64(^uint64(0)>>1) {
		t.Errorf("buckets end at %d, want MaxInt64", prevHi)
	}
}

func TestHistogramQuantiles(t *testing.T) {
	t.Parallel()
	h := NewHistogram()
	if h.Quantile(0.5) != 0 || h.Max() != 0 || h.Mean() != 0 || h.Min() != 0 {
		t.Fatal("empty histogram: not all zero")
	}
	// 1..10000 µs in random order: the q-quantile is q*10000 µs.
	vals := make([]time.Duration, 10000)
	for i := range vals {
		vals[i] = time.Duration(i+1) * time.Microsecond
	}
	rand.Shuffle(len(vals), func(i, j int) { vals[i], vals[j] = vals[j], vals[i] })
	for _, v := range vals {
		h.Record(v)
	}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 5000 * time.Microsecond}, {0.9, 9000 * time.Microsecond}, {0.99, 9900 * time.Microsecond},
		{0.999, 9990 * time.Microsecond}, {0.0001, time.Microsecond}, {1, 10000 * time.Microsecond}} {
		got := h.Quantile(tc.q)
		if got < tc.want || float64(got-tc.want) > float64(tc.want)/subCount {
			t.Errorf("Quantile(%v) = %v, want %v (+0.8%%)", tc.q, got, tc.want)
		}
	}
	if h.Count() != 10000 || h.Min() != time.Microsecond || h.Max() != 10*time.Millisecond {
		t.Errorf("count %d min %v max %v", h.Count(), h.Min(), h.Max())
	}
	if m := h.Mean(); m != 5000500*time.Nanosecond {
		t.Errorf("mean %v, want 5.0005ms", m)
	}
	// Out-of-range q is clamped, NaN is the minimum; negative durations count as 0.
	if h.Quantile(-1) != time.Microsecond || h.Quantile(2) != 10*time.Millisecond {
		t.Error("q outside [0,1] not clamped")
	}
	h2 := NewHistogram()
	h2.Record(-time.Second)
	h2.Record(3 * time.Hour)
	if h2.Min() != 0 || h2.Max() != 3*time.Hour || h2.Quantile(0.5) != 0 {
		t.Errorf("h2: min %v max %v p50 %v", h2.Min(), h2.Max(), h2.Quantile(0.5))
	}
	// Merge: the union of the samples.
	h.Merge(h2)
	if h.Count() != 10002 || h.Min() != 0 || h.Max() != 3*time.Hour {
		t.Errorf("merged: count %d min %v max %v", h.Count(), h.Min(), h.Max())
	}
}

func TestHistogramSkewed(t *testing.T) {
	t.Parallel()
	// 990 fast answers and 10 slow ones: p99 is the last fast one, p99.9 a slow one.
	h := NewHistogram()
	for i := 0; i < 990; i++ {
		h.Record(time.Millisecond)
	}
	for i := 0; i < 10; i++ {
		h.Record(time.Second)
	}
	if p := h.Quantile(0.99); p < time.Millisecond || p > time.Millisecond*1008/1000 {
		t.Errorf("p99 %v, want 1ms", p)
	}
	if p := h.Quantile(0.995); p != time.Second {
		t.Errorf("p99.5 %v, want 1s (capped at max)", p)
	}
	if s := h.Summary(); s.Count != 1000 || s.MaxMS != 1000 || s.MinMS != 1 || s.P50MS < 1 || s.P50MS > 1.008 {
		t.Errorf("summary %+v", s)
	}
}

func TestHistogramConcurrent(t *testing.T) {
	t.Parallel()
	h := NewHistogram()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				h.Record(time.Duration(g*1000+i) * time.Microsecond)
			}
		}()
	}
	wg.Wait()
	if h.Count() != 8000 || h.Min() != 0 || h.Max() != 7999*time.Microsecond {
		t.Errorf("count %d min %v max %v", h.Count(), h.Min(), h.Max())
	}
}

// idemServer answers like an idempotency endpoint: 201 for a new (user, key), a
// replay of it afterwards, and 400 without a key.
type idemServer struct {
	mu    sync.Mutex
	seen  map[string]bool
	users map[string]bool
	calls int
}

func (s *idemServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	s.users[r.Header.Get("Authorization")] = true
	switch {
	case key == "":
		w.WriteHeader(http.StatusBadRequest)
	case s.seen[r.Header.Get("Authorization")+"\x00"+key]:
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
	default:
		s.seen[r.Header.Get("Authorization")+"\x00"+key] = true
		w.WriteHeader(http.StatusCreated)
	}
	_, _ = w.Write([]byte(`{"ok":true}`))
}

func newIdemServer(t *testing.T) (*idemServer, *httptest.Server) {
	s := &idemServer{seen: map[string]bool{}, users: map[string]bool{}}
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return s, ts
}

func TestRunCountsRequests(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		keys      KeyMode
		users     int
		want      map[string]int64
		wantUsers int
	}{
		{"unique", KeyUnique, 4, map[string]int64{"201": 500}, 4},
		{"shared", KeyShared, 0, map[string]int64{"201": 1, "201 replayed": 499}, 1},
		{"none", KeyNone, 0, map[string]int64{"400": 500}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv, ts := newIdemServer(t)
			res, err := Run(ctx, Config{URL: ts.URL + "/payments", Clients: 8, Requests: 500, Keys: tc.keys,
				Users: tc.users, AuthFormat: "Bearer %d", Body: []byte(`{"amount":1}`),
				Header: http.Header{"Content-Type": {"application/json"}}, Tags: map[string]string{"case": tc.name}})
			if err != nil {
				t.Fatal(err)
			}
			if res.Requests != 500 || res.Responses != 500 || res.Errors != 0 || srv.calls != 500 {
				t.Errorf("requests %d responses %d errors %d, server calls %d; want 500", res.Requests, res.Responses, res.Errors, srv.calls)
			}
			if !mapsEqual(res.Status, tc.want) {
				t.Errorf("status %v, want %v", res.Status, tc.want)
			}
			if len(srv.users) != tc.wantUsers {
				t.Errorf("%d users seen, want %d", len(srv.users), tc.wantUsers)
			}
			if tc.keys == KeyUnique && len(srv.seen) != 500 {
				t.Errorf("%d distinct keys, want 500", len(srv.seen))
			}
			var n int64
			for k, s := range res.ByStatus {
				if s.Count != res.Status[k] {
					t.Errorf("class %s: %d latencies, %d responses", k, s.Count, res.Status[k])
				}
				n += s.Count
			}
			if n != res.Latency.Count || res.Latency.Count != 500 || res.Throughput <= 0 || res.Tags["case"] != tc.name {
				t.Errorf("latency count %d (classes %d), throughput %v, tags %v", res.Latency.Count, n, res.Throughput, res.Tags)
			}
			if res.Latency.P50MS > res.Latency.P99MS || res.Latency.P99MS > res.Latency.MaxMS {
				t.Errorf("quantiles out of order: %+v", res.Latency)
			}
			var b strings.Builder
			if err := res.WriteText(&b); err != nil || !strings.Contains(b.String(), "500 requests") {
				t.Errorf("text: %v\n%s", err, b.String())
			}
		})
	}
}

func TestRunDurationAndErrors(t *testing.T) {
	t.Parallel()
	_, ts := newIdemServer(t)
	res, err := Run(context.Background(), Config{URL: ts.URL, Clients: 4, Duration: 200 * time.Millisecond, Warmup: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Responses == 0 || res.ElapsedS < 0.2 || res.ElapsedS > 2 || res.Status["201"] != res.Responses {
		t.Errorf("responses %d elapsed %.3f status %v", res.Responses, res.ElapsedS, res.Status)
	}

	// Nothing listens: every request is an error, counted, with a sample.
	dead := httptest.NewServer(http.NotFoundHandler())
	url := dead.URL
	dead.Close()
	res, err = Run(context.Background(), Config{URL: url, Clients: 2, Requests: 20})
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors != 20 || res.Responses != 0 || len(res.ErrorSamples) == 0 {
		t.Errorf("errors %d responses %d samples %v", res.Errors, res.Responses, res.ErrorSamples)
	}
	// A failed preconnect fails the run.
	if _, err := Run(context.Background(), Config{URL: url, Preconnect: url, Requests: 1}); err == nil {
		t.Error("preconnect to a closed port: no error")
	}
}

func TestRunStormStartsTogether(t *testing.T) {
	t.Parallel()
	// Every client preconnects, then all send at once: the server sees them all in
	// flight before answering any.
	const n = 50
	var mu sync.Mutex
	inFlight, peak := 0, 0
	release := make(chan struct{})
	var once sync.Once
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			return
		}
		mu.Lock()
		inFlight++
		peak = max(peak, inFlight)
		if inFlight == n {
			once.Do(func() { close(release) })
		}
		mu.Unlock()
		select {
		case <-release:
		case <-time.After(5 * time.Second):
		}
		w.WriteHeader(http.StatusConflict)
	}))
	defer ts.Close()
	res, err := Run(context.Background(), Config{URL: ts.URL, Clients: n, Requests: n, Keys: KeyShared, Key: "k", Preconnect: ts.URL})
	if err != nil {
		t.Fatal(err)
	}
	if peak != n || res.Status["409"] != n {
		t.Errorf("peak in flight %d, status %v; want %d", peak, res.Status, n)
	}
}

// A paced run sends the requests due at Rate from its start, no more however fast the
// server answers: at 200 a second, those due in the warm-up's 100 ms and the 300 ms
// measured after it are 20 and 60, each sent even when the clients fall behind.
func TestRunPaced(t *testing.T) {
	t.Parallel()
	srv, ts := newIdemServer(t)
	res, err := Run(context.Background(), Config{URL: ts.URL, Clients: 4, Rate: 200,
		Warmup: 100 * time.Millisecond, Duration: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv.mu.Lock()
	calls := srv.calls
	srv.mu.Unlock()
	if res.Requests != 60 || res.Responses != 60 || calls != 80 || res.Rate != 200 {
		t.Errorf("measured %d requests (%d responses), the server %d, rate %v; want 60, 80 and 200",
			res.Requests, res.Responses, calls, res.Rate)
	}
}

func TestConfigRejectsBadInput(t *testing.T) {
	t.Parallel()
	for _, cfg := range []Config{
		{},
		{URL: "not a url"},
		{URL: "ftp://x/"},
		{URL: "http://x/", Method: "GE T"},
		{URL: "http://x/", Clients: -1},
		{URL: "http://x/", Clients: MaxClients + 1},
		{URL: "http://x/", Duration: -time.Second},
		{URL: "http://x/", Requests: -1},
		{URL: "http://x/", Rate: -1},
		{URL: "http://x/", Rate: math.Inf(1)},
		{URL: "http://x/", Rate: math.NaN()},
		{URL: "http://x/", Rate: 1e-9},
		{URL: "http://x/", Rate: 1e10},
		{URL: "http://x/", Users: 2, AuthFormat: "Bearer %s"},
		{URL: "http://x/", Users: 2, AuthFormat: "Bearer %d %d"},
		{URL: "http://x/", Users: 2, AuthFormat: "Bearer\n%d"},
		{URL: "http://x/", Keys: KeyShared, Key: "bad\x00key"},
		{URL: "http://x/", Keys: 7},
		{URL: "http://x/", Header: http.Header{"Bad Name": {"v"}}},
		{URL: "http://x/", Header: http.Header{"X": {"a\r\nb"}}},
		{URL: "http://x/", Preconnect: "::"},
	} {
		if _, err := Run(context.Background(), cfg); err == nil || cfg.Validate() == nil {
			t.Errorf("%+v: no error", cfg)
		}
	}
	for _, s := range []string{"unique", "SHARED", "none"} {
		if _, err := ParseKeyMode(s); err != nil {
			t.Errorf("ParseKeyMode(%q): %v", s, err)
		}
	}
	if _, err := ParseKeyMode("some"); err == nil {
		t.Error("ParseKeyMode(some): no error")
	}
}

func mapsEqual(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	ka := make([]string, 0, len(a))
	for k := range a {
		ka = append(ka, k)
	}
	slices.Sort(ka)
	for _, k := range ka {
		if a[k] != b[k] {
			return false
		}
	}
	return true
}
