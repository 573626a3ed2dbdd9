// Package durfmt writes durations as people write them in flags and files: 24h, 1m30s,
// 5s, without the zero units of time.Duration's String (24h0m0s); and in logs, as
// milliseconds under a name that says so.
package durfmt

import (
	"log/slog"
	"strings"
	"time"
)

// Format writes d without zero units: 24h, 1m30s, 5s. time.ParseDuration reads it back
// as d.
func Format(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// Millis returns the log attribute key (named with its unit: latency_ms) holding d in
// milliseconds, to the microsecond, a number in every log format. A time.Duration
// attribute is a Go duration string in slog's text format and bare nanoseconds in its
// JSON, which a reader of the JSON takes for no unit, or the wrong one.
func Millis(key string, d time.Duration) slog.Attr {
	return slog.Float64(key, float64(d.Microseconds())/1000)
}
