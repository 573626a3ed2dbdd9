package durfmt

import (
	"log/slog"
	"testing"
	"time"
)

func TestFormat(t *testing.T) {
	for d, want := range map[time.Duration]string{
		24 * time.Hour: "24h", 90 * time.Second: "1m30s", 5 * time.Second: "5s", time.Hour + time.Second: "1h0m1s",
		1500 * time.Millisecond: "1.5s", 0: "0s", 30 * time.Minute: "30m",
	} {
		got := Format(d)
		if got != want {
			t.Errorf("Format(%v) = %q, want %q", d, got, want)
		}
		if back, err := time.ParseDuration(got); err != nil || back != d {
			t.Errorf("%q reads back as %v, %v", got, back, err)
		}
	}
}

func TestMillis(t *testing.T) {
	for d, want := range map[time.Duration]float64{
		1500 * time.Microsecond: 1.5, 2 * time.Second: 2000, 1234567 * time.Nanosecond: 1.234, 0: 0,
	} {
		a := Millis("latency_ms", d)
		if a.Key != "latency_ms" || a.Value.Kind() != slog.KindFloat64 || a.Value.Float64() != want {
			t.Errorf("Millis(%v) = %v, want latency_ms=%v", d, a, want)
		}
	}
}
