package sqlname_test

import (
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/internal/sqlname"
)

func TestValid(t *testing.T) {
	for _, c := range []struct {
		name        string
		ok, anyCase bool
	}{
		{"retrysafe_idempotency", true, true},
		{"a1", true, true},
		{"_x", true, true},
		{"", false, false},
		{"1a", false, false},
		{"Bad", false, true},
		{"A_1", false, true},
		{"a-b", false, false},
		{`a"b`, false, false},
		{"a b", false, false},
		{"é", false, false},
		{"\u212a", false, false}, // the Kelvin sign, whose lower case is "k"
		{strings.Repeat("a", 48), true, true},
		{strings.Repeat("a", 49), false, false},
	} {
		if got := sqlname.Valid(c.name, 48); got != c.ok {
			t.Errorf("Valid(%q, 48) = %v, want %v", c.name, got, c.ok)
		}
		if got := sqlname.ValidAnyCase(c.name, 48); got != c.anyCase {
			t.Errorf("ValidAnyCase(%q, 48) = %v, want %v", c.name, got, c.anyCase)
		}
	}
}
