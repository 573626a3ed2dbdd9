// Package durfmt writes durations as people write them in flags and files: 24h, 1m30s,
// 5s, without the zero units of time.Duration's String (24h0m0s).
package durfmt

import (
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
