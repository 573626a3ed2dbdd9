package listcursor_test

import (
	"errors"
	"testing"

	"github.com/retrysafe/retrysafe/idempotency"
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

// rows are the rows of a page query over keys, in order.
type rows struct {
	keys []string
	i    int
}

func (r *rows) Next() bool { r.i++; return r.i <= len(r.keys) }
func (r *rows) Err() error { return nil }

func TestPage(t *testing.T) {
	scan := func(r *rows) (*idempotency.Record, error) {
		return &idempotency.Record{Scope: "s", Key: r.keys[r.i-1]}, nil
	}
	page, err := listcursor.Page(&rows{keys: []string{"a", "b", "c"}}, 2, scan)
	if err != nil || len(page.Records) != 2 || page.Records[1].Key != "b" || page.Next != listcursor.Encode("s", "b") {
		t.Errorf("a page of 2 of 3 = %+v, %v", page, err)
	}
	page, err = listcursor.Page(&rows{keys: []string{"a", "b"}}, 2, scan)
	if err != nil || len(page.Records) != 2 || page.Next != "" {
		t.Errorf("the last page = %+v, %v", page, err)
	}
}
