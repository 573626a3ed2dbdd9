package pgstore

import (
	"reflect"
	"testing"
)

// synchronous_standby_names in each form the server accepts.
func TestParseSyncNames(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]syncSpec{
		"":                          {},
		"s1":                        {"FIRST", 1, []string{"s1"}},
		"s1, s2":                    {"FIRST", 1, []string{"s1", "s2"}},
		" s1 ,s2 ":                  {"FIRST", 1, []string{"s1", "s2"}},
		"*":                         {"FIRST", 1, []string{"*"}},
		"2 (s1, s2, s3)":            {"FIRST", 2, []string{"s1", "s2", "s3"}},
		"FIRST 2 (s1, s2)":          {"FIRST", 2, []string{"s1", "s2"}},
		"first 1 (s1)":              {"FIRST", 1, []string{"s1"}},
		"ANY 2 (s1, s2, s3)":        {"ANY", 2, []string{"s1", "s2", "s3"}},
		`ANY 1 ("Big One", "a""b")`: {"ANY", 1, []string{"Big One", `a"b`}},
		`"s,1", s2`:                 {"FIRST", 1, []string{"s,1", "s2"}},
		"any":                       {"FIRST", 1, []string{"any"}},
	} {
		got, ok := parseSyncNames(in)
		if !ok || !reflect.DeepEqual(got, want) {
			t.Errorf("parseSyncNames(%q) = %+v, %v; want %+v", in, got, ok, want)
		}
	}
	for _, in := range []string{"ANY 0 (s1)", "ANY x (s1)", `"open`, "s1,", "s1,,s2", `"a" b`} {
		if got, ok := parseSyncNames(in); ok {
			t.Errorf("parseSyncNames(%q) = %+v, want not ok", in, got)
		}
	}
}
