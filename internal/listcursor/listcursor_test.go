package listcursor_test

import (
	"errors"
	"testing"

	"github.com/retrysafe/retrysafe/internal/listcursor"
)

func TestRoundTrip(t *testing.T) {
	for _, c := range [][2]string{{"", ""}, {"tenant", "key"}, {"a.b", "c.d"}, {"\x00\xff", "é\n"}} {
		cur := listcursor.Encode(c[0], c[1])
		scope, key, err := listcursor.Decode(cur)
		if err != nil || scope != c[0] || key != c[1] {
			t.Errorf("Decode(Encode(%q, %q)) = %q, %q, %v", c[0], c[1], scope, key, err)
		}
	}
}

func TestInvalid(t *testing.T) {
	for _, cur := range []string{"", "abc", "a.b.c", "!.a", "a.!"} {
		if _, _, err := listcursor.Decode(cur); !errors.Is(err, listcursor.ErrInvalid) {
			t.Errorf("Decode(%q) = %v, want ErrInvalid", cur, err)
		}
	}
}
