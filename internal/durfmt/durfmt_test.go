package durfmt

import (
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
