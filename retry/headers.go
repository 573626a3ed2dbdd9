package retry

import (
	"math"
	"net/http"
	"strings"
	"time"
)

// epochThreshold tells an X-RateLimit-Reset in epoch seconds from one in delta seconds:
// no server asks a client to wait 30 years, and no reset lies before 2001.
const epochThreshold = 1_000_000_000

// maxEpoch bounds the epoch seconds given to time.Unix, which overflows on values near
// math.MaxInt64. A reset that late (about the year 36800) is a wait longer than any
// time.Duration, which saturates anyway.
const maxEpoch = 1 << 40

// ServerDelay returns the wait a response asks for, read at the time now, from (in this
// order) Retry-After (delta-seconds or an HTTP-date), the IETF draft's RateLimit header
// (its t= or reset= parameter, delta seconds) or RateLimit-Reset, and X-RateLimit-Reset
// (delta seconds, or epoch seconds when the value is at least 10⁹). A time in the past
// is a zero wait that counts as asked (ok true). Unparsable values are ignored.
//
// Delta seconds are digits only (RFC 9110's 1*DIGIT: no sign, no exponent); those of
// X-RateLimit-Reset may have a decimal fraction, kept to the nanosecond. The wait is
// never negative, and a value too large for a time.Duration (delta seconds of any
// length, a date or an epoch centuries away) is the largest one, not an overflow or a
// value ignored: the server asked for a very long wait, and Policy.MaxServerDelay
// decides whether to wait that long.
func ServerDelay(h http.Header, now time.Time) (time.Duration, bool) {
	if v := strings.TrimSpace(h.Get("Retry-After")); v != "" {
		if secs, ok := deltaSeconds(v); ok {
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
		if secs, ok := deltaSeconds(v); ok {
			return seconds(secs), true
		}
	}
	if v := strings.TrimSpace(h.Get("X-RateLimit-Reset")); v != "" {
		if secs, nanos, ok := decimalSeconds(v); ok {
			if secs >= epochThreshold {
				return max(0, time.Unix(min(secs, maxEpoch), nanos).Sub(now)), true
			}
			return time.Duration(secs)*time.Second + time.Duration(nanos), true
		}
	}
	return 0, false
}

// rateLimitReset reads the reset parameter of a RateLimit header in either draft form:
// `limit=100, remaining=0, reset=30` or `"default";r=0;t=30`. A quoted string (the
// policy name, a structured-field string) may hold the separators , and ; and is
// skipped whole.
func rateLimitReset(v string) (int64, bool) {
	start, quoted := 0, false
	for i := 0; i <= len(v); i++ {
		if i < len(v) {
			switch c := v[i]; {
			case quoted && c == '\\':
				i++ // an escaped character
				continue
			case c == '"':
				quoted = !quoted
				continue
			case quoted || (c != ',' && c != ';'):
				continue
			}
		}
		item := v[start:min(i, len(v))]
		start = i + 1
		name, val, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || (name != "t" && name != "reset") {
			continue
		}
		if secs, ok := deltaSeconds(strings.TrimSpace(val)); ok {
			return secs, true
		}
	}
	return 0, false
}

// deltaSeconds parses 1*DIGIT, saturating at math.MaxInt64.
func deltaSeconds(v string) (int64, bool) {
	if v == "" {
		return 0, false
	}
	var n int64
	for i := 0; i < len(v); i++ {
		d := int64(v[i]) - '0'
		if d < 0 || d > 9 {
			return 0, false
		}
		if n > (math.MaxInt64-d)/10 {
			n = math.MaxInt64
		} else {
			n = n*10 + d
		}
	}
	return n, true
}

// decimalSeconds parses digits with an optional decimal fraction (at least one digit in
// all) into whole seconds, saturating at math.MaxInt64, and nanoseconds (further digits
// are dropped).
func decimalSeconds(v string) (secs, nanos int64, ok bool) {
	whole, frac, _ := strings.Cut(v, ".")
	if whole == "" && frac == "" {
		return 0, 0, false
	}
	if whole != "" {
		if secs, ok = deltaSeconds(whole); !ok {
			return 0, 0, false
		}
	}
	if frac != "" {
		if _, ok := deltaSeconds(frac); !ok {
			return 0, 0, false
		}
		for i := range 9 {
			nanos *= 10
			if i < len(frac) {
				nanos += int64(frac[i] - '0')
			}
		}
	}
	return secs, nanos, true
}

func seconds(s int64) time.Duration {
	const maxSecs = int64(1<<63-1) / int64(time.Second)
	return time.Duration(min(s, maxSecs)) * time.Second
}
