package retry

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

const maxWait = time.Duration(1<<63 - 1)

// maxSecondsWait is the wait a delta-seconds value saturates at: the largest whole number
// of seconds a Duration holds.
const maxSecondsWait = maxWait / time.Second * time.Second

// fuzzNow maps a fuzzed number to a plausible reading of the clock (1970 to about 3058).
func fuzzNow(unix int64) time.Time {
	if unix < 0 {
		unix = -(unix + 1)
	}
	return time.Unix(unix%(1<<35), 0)
}

func serverDelayOf(now time.Time, kv ...string) (time.Duration, bool) {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return ServerDelay(h, now)
}

// checkBounds holds for every answer of ServerDelay.
func checkBounds(t *testing.T, what string, d time.Duration, ok bool) {
	t.Helper()
	if d < 0 {
		t.Fatalf("%s: negative wait %v", what, d)
	}
	if !ok && d != 0 {
		t.Fatalf("%s: wait %v without ok", what, d)
	}
}

// wantSeconds is the wait of a delta-seconds value of n: n seconds, saturating.
func wantSeconds(n uint64) time.Duration {
	if n > uint64(maxSecondsWait/time.Second) {
		return maxSecondsWait
	}
	return time.Duration(n) * time.Second
}

// FuzzServerDelay: whatever the four headers hold, the wait is never negative, is zero
// when none is honoured, does not change with surrounding white space, and is the wait of
// the first header (in the documented order) that is honoured on its own.
func FuzzServerDelay(f *testing.F) {
	f.Add("120", "", "", "", int64(1_740_830_400))
	f.Add("soon", `"default";r=0;t=12`, "9", "1740830460", int64(1_740_830_400))
	f.Add("", "limit=100, remaining=0, reset=30", "", "", int64(0))
	f.Add("Sat, 01 Mar 2025 12:00:30 GMT", "", "", "", int64(1_740_830_400))
	f.Add("", "", "", "1.5", int64(1_740_830_400))
	f.Add("99999999999999999999", "", "", "", int64(1))
	f.Fuzz(func(t *testing.T, retryAfter, rateLimit, rateLimitReset, xReset string, nowUnix int64) {
		now := fuzzNow(nowUnix)
		names := []string{"Retry-After", "RateLimit", "RateLimit-Reset", "X-RateLimit-Reset"}
		vals := []string{retryAfter, rateLimit, rateLimitReset, xReset}
		var kv, padded []string
		for i, n := range names {
			kv = append(kv, n, vals[i])
			padded = append(padded, n, " \t"+vals[i]+"\t ")
		}
		d, ok := serverDelayOf(now, kv...)
		checkBounds(t, "all four", d, ok)
		if pd, pok := serverDelayOf(now, padded...); pd != d || pok != ok {
			t.Errorf("padded with white space: %v, %v; unpadded %v, %v", pd, pok, d, ok)
		}
		var first time.Duration
		firstOK := false
		for i, n := range names {
			od, ook := serverDelayOf(now, n, vals[i])
			checkBounds(t, n, od, ook)
			if ook && !firstOK {
				first, firstOK = od, true
			}
		}
		if d != first || ok != firstOK {
			t.Errorf("all four: %v, %v; the first honoured alone: %v, %v", d, ok, first, firstOK)
		}
	})
}

// FuzzRetryAfter: Retry-After alone. Delta seconds n (digits, any number of them) wait n
// seconds, saturating; an HTTP-date in any of its three forms waits until that time (zero
// when past); anything else is never a negative wait.
func FuzzRetryAfter(f *testing.F) {
	f.Add("120", uint64(120), int64(1_740_830_430), int64(1_740_830_400))
	f.Add("Sat, 01 Mar 2025 12:00:30 GMT", uint64(0), int64(0), int64(1_740_830_400))
	f.Add("Saturday, 01-Mar-25 12:01:00 GMT", uint64(1<<63), int64(253_402_300_799), int64(0))
	f.Add("-5", uint64(9_223_372_036), int64(-1), int64(1))
	f.Add("00000000000000000000000000000007", uint64(9_223_372_037), int64(1<<40), int64(1<<40))
	f.Fuzz(func(t *testing.T, raw string, n uint64, unix, nowUnix int64) {
		now := fuzzNow(nowUnix)
		d, ok := serverDelayOf(now, "Retry-After", raw)
		checkBounds(t, "Retry-After "+strconv.Quote(raw), d, ok)
		if v := strings.TrimSpace(raw); v != "" && strings.Trim(v, "0123456789") == "" {
			want := maxSecondsWait
			if u, err := strconv.ParseUint(v, 10, 64); err == nil {
				want = wantSeconds(u)
			}
			if d != want || !ok {
				t.Errorf("Retry-After %q = %v, %v; want %v", raw, d, ok, want)
			}
		}

		// n as delta seconds, with and without leading zeros; a larger n never waits less.
		s := strconv.FormatUint(n, 10)
		for _, v := range []string{s, "000" + s} {
			if d, ok := serverDelayOf(now, "Retry-After", v); d != wantSeconds(n) || !ok {
				t.Errorf("Retry-After %s = %v, %v; want %v", v, d, ok, wantSeconds(n))
			}
		}
		if n < 1<<63 {
			d1, _ := serverDelayOf(now, "Retry-After", s)
			d2, _ := serverDelayOf(now, "Retry-After", strconv.FormatUint(n+1, 10)+"0")
			if d2 < d1 {
				t.Errorf("Retry-After %d0 waits %v, less than %d's %v", n+1, d2, n, d1)
			}
		}

		// unix as an HTTP-date, in years 1970 to 9999 (RFC 850's two-digit year in 1969 to
		// 2068 only).
		const last = 253_402_300_799 // 9999-12-31T23:59:59Z
		if unix < 0 {
			unix = -(unix + 1)
		}
		at := time.Unix(unix%(last+1), 0).UTC()
		want := max(0, at.Sub(now))
		forms := []string{at.Format(http.TimeFormat), at.Format(time.ANSIC)}
		if y := at.Year(); y >= 1969 && y <= 2068 {
			forms = append(forms, at.Format(time.RFC850))
		}
		for _, v := range forms {
			if d, ok := serverDelayOf(now, "Retry-After", v); d != want || !ok {
				t.Errorf("Retry-After %q at %v = %v, %v; want %v", v, now, d, ok, want)
			}
		}
	})
}

// FuzzRateLimit: the RateLimit header in both draft forms. Whatever it holds, the wait is
// never negative; `limit=L, remaining=R, reset=N` and `"policy";r=R;t=N` (with any policy
// name a structured-field string can hold) both wait N seconds, saturating, like
// RateLimit-Reset: N and Retry-After: N.
func FuzzRateLimit(f *testing.F) {
	f.Add("limit=100, remaining=0, reset=30", uint64(30), uint64(0), "default")
	f.Add(`"default";r=0;t=12`, uint64(12), uint64(5), "burst")
	f.Add(`"a;t=1";r=0;t=30`, uint64(30), uint64(0), "a;t=1")
	f.Add(`"q\"t=1,";t=7`, uint64(1<<64-1), uint64(1), `q"t=1,`)
	f.Add("reset=soon, t=-1", uint64(0), uint64(0), "")
	f.Add(`"x;t=1;y";r=0;t=60`, uint64(60), uint64(0), "x;t=1;y")
	f.Fuzz(func(t *testing.T, raw string, n, remaining uint64, policy string) {
		now := time.Unix(1_740_830_400, 0)
		d, ok := serverDelayOf(now, "RateLimit", raw)
		checkBounds(t, "RateLimit "+strconv.Quote(raw), d, ok)

		// A structured-field string: printable ASCII, with " and \ escaped.
		var b strings.Builder
		for _, r := range policy {
			switch {
			case r == '"' || r == '\\':
				b.WriteString(`\` + string(r))
			case r >= 0x20 && r < 0x7f:
				b.WriteRune(r)
			}
		}
		s := strconv.FormatUint(n, 10)
		r := strconv.FormatUint(remaining, 10)
		want := wantSeconds(n)
		for _, v := range []string{
			"limit=100, remaining=" + r + ", reset=" + s,
			`"` + b.String() + `";r=` + r + ";t=" + s,
		} {
			if d, ok := serverDelayOf(now, "RateLimit", v); d != want || !ok {
				t.Errorf("RateLimit %s = %v, %v; want %v", v, d, ok, want)
			}
		}
		for _, name := range []string{"RateLimit-Reset", "Retry-After"} {
			if d, ok := serverDelayOf(now, name, s); d != want || !ok {
				t.Errorf("%s %s = %v, %v; want %v", name, s, d, ok, want)
			}
		}
	})
}

// FuzzRateLimitReset: RateLimit-Reset (delta seconds) and X-RateLimit-Reset (delta
// seconds with an optional fraction below 10⁹, epoch seconds from 10⁹ on). Whatever they
// hold the wait is never negative; a delta waits that long, saturating; an epoch waits
// until that time, saturating, and zero when it is past; a later epoch never waits less.
func FuzzRateLimitReset(f *testing.F) {
	f.Add("15", uint64(15), uint32(500), int64(1_740_830_400))
	f.Add("1.5", uint64(999_999_999), uint32(0), int64(1_740_830_400))
	f.Add("1740830460", uint64(1_740_830_460), uint32(250), int64(1_740_830_400))
	f.Add("1e10", uint64(10_000_000_000), uint32(0), int64(1_740_830_400))
	f.Add("Inf", uint64(1<<64-1), uint32(999_999_999), int64(0))
	f.Add("-0", uint64(1_000_000_000), uint32(1), int64(1<<35))
	f.Fuzz(func(t *testing.T, raw string, n uint64, frac uint32, nowUnix int64) {
		now := fuzzNow(nowUnix)
		for _, name := range []string{"RateLimit-Reset", "X-RateLimit-Reset"} {
			d, ok := serverDelayOf(now, name, raw)
			checkBounds(t, name+" "+strconv.Quote(raw), d, ok)
		}
		s := strconv.FormatUint(n, 10)
		if d, ok := serverDelayOf(now, "RateLimit-Reset", s); d != wantSeconds(n) || !ok {
			t.Errorf("RateLimit-Reset %s = %v, %v; want %v", s, d, ok, wantSeconds(n))
		}

		ns := frac % 1_000_000_000
		fs := strconv.FormatUint(uint64(ns)+1_000_000_000, 10)[1:] // nine digits
		x := s + "." + fs
		d, ok := serverDelayOf(now, "X-RateLimit-Reset", x)
		var want time.Duration
		if n < epochThreshold {
			want = time.Duration(n)*time.Second + time.Duration(ns)
			// The same as the other headers' delta seconds, without a fraction.
			for _, name := range []string{"X-RateLimit-Reset", "RateLimit-Reset", "Retry-After"} {
				if d, ok := serverDelayOf(now, name, s); d != wantSeconds(n) || !ok {
					t.Errorf("%s %s = %v, %v; want %v", name, s, d, ok, wantSeconds(n))
				}
			}
		} else {
			nowSec := uint64(now.Unix())
			switch diff := n - nowSec; {
			case n < nowSec:
				want = 0
			case diff > uint64(maxWait/time.Second) || time.Duration(diff)*time.Second > maxWait-time.Duration(ns):
				want = maxWait
			default:
				want = time.Duration(diff)*time.Second + time.Duration(ns)
			}
			if n < 1<<63 {
				later, _ := serverDelayOf(now, "X-RateLimit-Reset", strconv.FormatUint(n+1, 10)+"."+fs)
				if later < d {
					t.Errorf("X-RateLimit-Reset %d.%s waits %v, less than %s's %v", n+1, fs, later, x, d)
				}
			}
		}
		if d != want || !ok {
			t.Errorf("X-RateLimit-Reset %s at %v = %v, %v; want %v", x, now.Unix(), d, ok, want)
		}
	})
}
