// Package walvfstest counts the write system calls of the test process, for the tests
// that check how many writes a SQLite commit makes.
package walvfstest

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// WriteCalls is the number of write system calls (write, pwrite and the like) the
// process has made, from /proc/self/io; it skips t where there is no such file.
func WriteCalls(t testing.TB) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		t.Skipf("no /proc/self/io to count write calls with: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "syscw: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no syscw in /proc/self/io: %q", b)
	return 0
}
