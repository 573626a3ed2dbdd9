package retry

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// epochThreshold tells an X-RateLimit-Reset in epoch seconds from one in delta seconds:
// no server asks a client to wait 30 years, and no reset lies before 2001.
const epochThreshold = 1_000_000_000

// ServerDelay returns the wait a response asks for, read at the time now, from (in this
// order) Retry-After (delta-seconds or an HTTP-date), the IETF draft's RateLimit header
// (its t= or reset= parameter, delta seconds) or RateLimit-Reset, and X-RateLimit-Reset
// (delta seconds, or epoch seconds when the value is at least 10⁹). A time in the past
// is a zero wait that counts as asked (ok true). Unparsable values are ignored.
func ServerDelay(h http.Header, now time.Time) (time.Duration, bool) {
	if v := strings.TrimSpace(h.Get("Retry-After")); v != "" {
		if secs, err := strconv.ParseInt(v, 10, 64); err == nil && secs >= 0 {
			return seconds(secs), true
		}
		if t, err := http.ParseTime(v); err == nil {
			return max(0, t.Sub(now)), true
		}
	}
	if v := h.Get("RateLimit"); v != "" {
		if secs, ok := rateLimitReset(v); ok {
			return seconds(secs), true
		}
	}
	if v := strings.TrimSpace(h.Get("RateLimit-Reset")); v != "" {
		if secs, err := strconv.ParseInt(v, 10, 64); err == nil && secs >= 0 {
			return seconds(secs), true
		}
	}
	if v := strings.TrimSpace(h.Get("X-RateLimit-Reset")); v != "" {
		if f, err := strconv.ParseFloat(v, 64); err == nil && f >= 0 {
			if f >= epochThreshold {
				return max(0, time.Unix(0, int64(f*1e9)).Sub(now)), true
			}
			return time.Duration(f * float64(time.Second)), true
		}
	}
	return 0, false
}

// rateLimitReset reads the reset parameter of a RateLimit header in either draft form:
// `limit=100, remaining=0, reset=30` or `"default";r=0;t=30`.
func rateLimitReset(v string) (int64, bool) {
	for _, item := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ';' }) {
		name, val, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || (name != "t" && name != "reset") {
			continue
		}
		if secs, err := strconv.ParseInt(strings.TrimSpace(val), 10, 64); err == nil && secs >= 0 {
			return secs, true
		}
	}
	return 0, false
}

func seconds(s int64) time.Duration {
	const maxSecs = int64(1<<63-1) / int64(time.Second)
	return time.Duration(min(s, maxSecs)) * time.Second
}
