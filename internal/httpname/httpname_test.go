package httpname

import "testing"

func TestValid(t *testing.T) {
	for s, want := range map[string]bool{
		"POST": true, "X-Tenant": true, "a!#$%&'*+-.^_`|~9": true,
		"": false, "X Tenant": false, "X:": false, "é": false, "a\x00": false, "(x)": false,
	} {
		if got := Valid(s); got != want {
			t.Errorf("Valid(%q) = %t, want %t", s, got, want)
		}
	}
}
