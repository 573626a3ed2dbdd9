package pgddl_test

import (
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/internal/pgddl"
)

func TestValidName(t *testing.T) {
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"retrysafe_idempotency", true},
		{"a1", true},
		{"_x", true},
		{"", false},
		{"1a", false},
		{"Bad", false},
		{"a-b", false},
		{`a"b`, false},
		{"a b", false},
		{strings.Repeat("a", 48), true},
		{strings.Repeat("a", 49), false},
	} {
		if got := pgddl.ValidName(c.name, 48); got != c.ok {
			t.Errorf("ValidName(%q, 48) = %v, want %v", c.name, got, c.ok)
		}
	}
}
