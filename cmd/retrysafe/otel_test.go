package main

import (
	"testing"
)

// --otel is no key of the config file: given beside --config it is no override.
func TestOtelFlagIsNoOverride(t *testing.T) {
	fs, f, _ := newGatewayFlags()
	if err := fs.Parse([]string{"--otel", "--ttl", "1h"}); err != nil {
		t.Fatal(err)
	}
	if !f.otel {
		t.Fatal("--otel did not set the flag")
	}
	for _, o := range flagOverrides(fs) {
		if o.Key == "" || o.Source == "--otel" {
			t.Errorf("override %+v from --otel", o)
		}
	}
}
