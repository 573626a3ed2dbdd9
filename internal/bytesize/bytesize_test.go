package bytesize

import "testing"

func TestParseSize(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{
		"0": 0, "1048576": 1 << 20, "1MiB": 1 << 20, "4MiB": 4 << 20, "512KiB": 512 << 10, "512kib": 512 << 10,
		"1 MiB": 1 << 20, " 2K ": 2048, "1GiB": 1 << 30, "1MB": 1000000, "10KB": 10000, "7B": 7, "3GB": 3e9,
		"1M": 1 << 20, "1g": 1 << 30,
	} {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", " ", "MiB", "-1", "+1", "1.5MiB", "1XB", "1 Mi B", "99999999999999999999", "9999999999GiB", "4611686018427387905"} {
		if n, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) = %d, want an error", in, n)
		}
	}
	if n, err := Parse("4611686018427387904"); err != nil || n != 1<<62 {
		t.Errorf("Parse(1<<62) = %d, %v", n, err)
	}
}

func TestFormatSize(t *testing.T) {
	t.Parallel()
	for n, want := range map[int64]string{
		0: "0", 1 << 20: "1MiB", 4 << 20: "4MiB", 512 << 10: "512KiB", 1000: "1000", 1 << 30: "1GiB",
		3 << 30: "3GiB", 1536 << 10: "1536KiB", 1025: "1025",
	} {
		if got := Format(n); got != want {
			t.Errorf("Format(%d) = %q, want %q", n, got, want)
		}
		if back, err := Parse(Format(n)); err != nil || back != n {
			t.Errorf("Parse(Format(%d)) = %d, %v", n, back, err)
		}
	}
}
