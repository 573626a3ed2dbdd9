package headercodec

import (
	"errors"
	"net/http"
	"reflect"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	cases := []struct {
		name            string
		header, trailer http.Header
	}{
		{"nil both", nil, nil},
		{"empty both", http.Header{}, http.Header{}},
		{"multi-valued", http.Header{"Link": {"</a>; rel=a", "</b>; rel=b"}, "X-Empty": {""}}, nil},
		{"non-UTF-8 bytes", http.Header{"X-Bin": {"caf\xe9", "\xff\xfe"}}, http.Header{"X-Sum": {"\x80"}}},
		{"non-canonical names", http.Header{"x-lower": {"1"}, "X-Lower": {"2"}}, nil},
		{"no values", http.Header{"X-None": {}}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, tr, err := Decode(Encode(c.header, c.trailer))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(h, c.header) || !reflect.DeepEqual(tr, c.trailer) {
				t.Errorf("got %q / %q, want %q / %q", h, tr, c.header, c.trailer)
			}
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	good := Encode(http.Header{"A": {"b"}}, nil)
	for name, b := range map[string][]byte{
		"empty":          nil,
		"version":        {2, 0, 0},
		"truncated":      good[:len(good)-2],
		"trailing":       append(append([]byte{}, good...), 0),
		"huge count":     {1, 1, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"bad flag":       {1, 7, 0},
		"unsorted names": {1, 1, 2, 1, 'b', 0, 1, 'a', 0, 0},
	} {
		if _, _, err := Decode(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v, want ErrMalformed", name, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(Encode(http.Header{"Content-Type": {"application/json"}}, http.Header{"X-T": {"1", "\xff"}}))
	f.Add([]byte{1, 0, 0})
	f.Add([]byte{1, 1, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, tr, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		// What decodes re-encodes to the same bytes: the encoding is canonical.
		if again := Encode(h, tr); string(again) != string(b) {
			t.Fatalf("re-encoding differs:\n in %q\nout %q", b, again)
		}
	})
}
