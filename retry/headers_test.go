package retry

import (
	"net/http"
	"strconv"
	"testing"
	"time"
)

func TestServerDelay(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	epoch := func(d time.Duration) string { return strconv.FormatInt(now.Add(d).Unix(), 10) }
	date := func(d time.Duration) string { return now.Add(d).Format(http.TimeFormat) }
	tests := []struct {
		name   string
		header map[string]string
		want   time.Duration
		ok     bool
	}{
		{"none", nil, 0, false},
		{"Retry-After delta", map[string]string{"Retry-After": "120"}, 120 * time.Second, true},
		{"Retry-After zero", map[string]string{"Retry-After": "0"}, 0, true},
		{"Retry-After padded", map[string]string{"Retry-After": " 7 "}, 7 * time.Second, true},
		{"Retry-After HTTP-date", map[string]string{"Retry-After": date(30 * time.Second)}, 30 * time.Second, true},
		{"Retry-After RFC 850 date", map[string]string{"Retry-After": now.Add(time.Minute).Format(time.RFC850)}, time.Minute, true},
		{"Retry-After date in the past", map[string]string{"Retry-After": date(-time.Hour)}, 0, true},
		{"Retry-After negative", map[string]string{"Retry-After": "-5"}, 0, false},
		{"Retry-After garbage", map[string]string{"Retry-After": "soon"}, 0, false},
		{"Retry-After fraction", map[string]string{"Retry-After": "1.5"}, 0, false},
		{"Retry-After huge", map[string]string{"Retry-After": "9223372036854775807"}, time.Duration(1<<63 - 1).Truncate(time.Second), true},
		{"Retry-After overflow saturates", map[string]string{"Retry-After": "99999999999999999999"}, time.Duration(1<<63 - 1).Truncate(time.Second), true},
		{"Retry-After signed", map[string]string{"Retry-After": "+5"}, 0, false},
		{"Retry-After far-future date saturates", map[string]string{"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"}, time.Duration(1<<63 - 1), true},
		{"RateLimit draft dictionary", map[string]string{"RateLimit": "limit=100, remaining=0, reset=30"}, 30 * time.Second, true},
		{"RateLimit draft structured", map[string]string{"RateLimit": `"default";r=0;t=12`}, 12 * time.Second, true},
		{"RateLimit policy name holding separators", map[string]string{"RateLimit": `"x;t=1, reset=2";r=0;t=60`}, time.Minute, true},
		{"RateLimit policy name with an escaped quote", map[string]string{"RateLimit": `"a\";t=1";r=0;t=60`}, time.Minute, true},
		{"RateLimit overflow saturates", map[string]string{"RateLimit": "t=99999999999999999999"}, time.Duration(1<<63 - 1).Truncate(time.Second), true},
		{"RateLimit without reset", map[string]string{"RateLimit": "limit=100, remaining=0"}, 0, false},
		{"RateLimit garbage reset", map[string]string{"RateLimit": "reset=soon"}, 0, false},
		{"RateLimit-Reset", map[string]string{"RateLimit-Reset": "15"}, 15 * time.Second, true},
		{"RateLimit-Reset overflow saturates", map[string]string{"RateLimit-Reset": "18446744073709551616"}, time.Duration(1<<63 - 1).Truncate(time.Second), true},
		{"RateLimit-Reset garbage", map[string]string{"RateLimit-Reset": "x"}, 0, false},
		{"X-RateLimit-Reset delta", map[string]string{"X-RateLimit-Reset": "40"}, 40 * time.Second, true},
		{"X-RateLimit-Reset fractional delta", map[string]string{"X-RateLimit-Reset": "1.5"}, 1500 * time.Millisecond, true},
		{"X-RateLimit-Reset epoch", map[string]string{"X-RateLimit-Reset": epoch(50 * time.Second)}, 50 * time.Second, true},
		{"X-RateLimit-Reset epoch in the past", map[string]string{"X-RateLimit-Reset": epoch(-time.Minute)}, 0, true},
		{"X-RateLimit-Reset below the epoch threshold is a delta", map[string]string{"X-RateLimit-Reset": "999999999"}, 999999999 * time.Second, true},
		{"X-RateLimit-Reset fractional epoch, exact", map[string]string{"X-RateLimit-Reset": epoch(time.Minute) + ".25"}, time.Minute + 250*time.Millisecond, true},
		{"X-RateLimit-Reset epoch after 2262", map[string]string{"X-RateLimit-Reset": "10000000000"}, time.Unix(10_000_000_000, 0).Sub(now), true},
		{"X-RateLimit-Reset huge epoch saturates", map[string]string{"X-RateLimit-Reset": "99999999999999999999999"}, time.Duration(1<<63 - 1), true},
		{"X-RateLimit-Reset infinity", map[string]string{"X-RateLimit-Reset": "Inf"}, 0, false},
		{"X-RateLimit-Reset exponent", map[string]string{"X-RateLimit-Reset": "1e10"}, 0, false},
		{"X-RateLimit-Reset hexadecimal", map[string]string{"X-RateLimit-Reset": "0x10"}, 0, false},
		{"X-RateLimit-Reset lone dot", map[string]string{"X-RateLimit-Reset": "."}, 0, false},
		{"X-RateLimit-Reset garbage", map[string]string{"X-RateLimit-Reset": "abc"}, 0, false},
		{"X-RateLimit-Reset negative", map[string]string{"X-RateLimit-Reset": "-3"}, 0, false},
		{"Retry-After wins", map[string]string{"Retry-After": "3", "RateLimit": "reset=30", "X-RateLimit-Reset": "60"}, 3 * time.Second, true},
		{"garbage Retry-After falls through", map[string]string{"Retry-After": "soon", "RateLimit-Reset": "9"}, 9 * time.Second, true},
		{"RateLimit before RateLimit-Reset", map[string]string{"RateLimit": "t=4", "RateLimit-Reset": "9"}, 4 * time.Second, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := http.Header{}
			for k, v := range tc.header {
				h.Set(k, v)
			}
			d, ok := ServerDelay(h, now)
			if d != tc.want || ok != tc.ok {
				t.Errorf("ServerDelay(%v) = %v, %v; want %v, %v", tc.header, d, ok, tc.want, tc.ok)
			}
		})
	}
}

// A reset centuries away is a wait too long to honour, not a reset already past: the
// Transport gives up on the 429 at once instead of retrying it without a wait.
func TestTransportFarResetGivesUp(t *testing.T) {
	t.Parallel()
	srv := newScript(t, func(n int, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-RateLimit-Reset", "10000000000") // the year 2286
		w.WriteHeader(http.StatusTooManyRequests)
	})
	clock := newFakeClock()
	tr := &Transport{Base: newBase(t), Policy: testPolicy(clock), NoBudget: true}
	resp, err := tr.RoundTrip(newRequest(t, t.Context(), http.MethodGet, srv.URL, ""))
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	if resp.StatusCode != http.StatusTooManyRequests || srv.Executions() != 1 || len(clock.Waits()) != 0 {
		t.Errorf("status %d after %d executions and waits %v, want the 429 after 1 and no wait",
			resp.StatusCode, srv.Executions(), clock.Waits())
	}
}
