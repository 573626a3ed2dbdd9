package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A sample of the handler's own work, one inside its ReverseProxy, one in the kernel
// under the transport's writer, and a collector's assist inside the handler.
const gwScript = `    500000 
	           1000 runtime.mapaccess2_fast64
	           2000 example.com/gw.(*Store).find
	           2500 example.com/gw.(*Store).Claim
	           3000 net/http.serverHandler.ServeHTTP
	           4000 net/http.(*conn).serve

    500000 
	           1000 net/http.Header.Clone
	           2000 net/http/httputil.(*ReverseProxy).ServeHTTP
	           3000 net/http.serverHandler.ServeHTTP

    1000000 
	ffffffff82243649 pvm_irq_enable
	ffffffff81000130 entry_SYSCALL_64_after_hwframe
	           de6e internal/runtime/syscall/linux.Syscall6
	           5000 net/http.(*persistConn).writeLoop

    500000 
	           1000 runtime.memclrNoHeapPointers
	           2000 runtime.gcAssistAlloc
	           3000 runtime.mallocgc
	           4000 net/http.serverHandler.ServeHTTP

`

const bareScript = `    500000 
	           1000 net/http.Header.Clone
	           2000 net/http/httputil.(*ReverseProxy).ServeHTTP
	           3000 net/http.serverHandler.ServeHTTP

    500000 
	ffffffff82243649 pvm_irq_enable
	           5000 net/http.(*persistConn).writeLoop

`

func TestSplit(t *testing.T) {
	dir := t.TempDir()
	gw, bare := filepath.Join(dir, "gw.txt"), filepath.Join(dir, "bare.txt")
	if err := os.WriteFile(gw, []byte(gwScript), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bare, []byte(bareScript), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	// 10 requests each: gw's 2.5 ms of samples are 250 µs per request, bare's 1 ms 100.
	if err := run([]string{"-top", "3", "-own", "example.com/gw.", "gw=" + gw + ":10", "bare=" + bare + ":10"}, &out, &errOut); err != nil {
		t.Fatalf("run: %v (%s)", err, errOut.String())
	}
	got := out.String()
	for _, want := range []string{
		"handler: the rest 50.0 0.0",
		"handler: httputil.ReverseProxy 50.0 50.0",
		"transport: writing requests (kernel) 100.0 50.0",
		"garbage collector 50.0 0.0",
		"total 250.0 100.0",
		"gw − bare: +150.0 µs per request (2.50×);",
		"+50.00 [kernel] pvm_irq_enable",
		"+50.00 runtime.mapaccess2_fast64",
		"+50.00 runtime.memclrNoHeapPointers",
		"gw: 50.0 µs per request under its own functions (example.com/gw.…), by the innermost:\n50.00 (*Store).find\n",
	} {
		if !strings.Contains(squeeze(got), want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "Header.Clone") {
		t.Errorf("a leaf that costs both the same is listed among the top differences:\n%s", got)
	}
}

// squeeze makes every run of spaces one space, so that the test does not depend on
// the columns' widths.
func squeeze(s string) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		b.WriteString(strings.Join(strings.Fields(line), " ") + "\n")
	}
	return b.String()
}

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.txt")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	garbage := filepath.Join(dir, "garbage.txt")
	if err := os.WriteFile(garbage, []byte("not a period\n\tffff x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "no subject"},
		{[]string{"gw"}, "want NAME=FILE"},
		{[]string{"gw=" + empty + ":0"}, "positive integer"},
		{[]string{"gw=" + empty + ":10"}, "no samples"},
		{[]string{"gw=" + garbage + ":10"}, "is not a sample's period"},
		{[]string{"gw=" + filepath.Join(dir, "missing") + ":10"}, "no such file"},
		{[]string{"-base", "x", "gw=" + garbage + ":10"}, "period"},
	} {
		var out, errOut bytes.Buffer
		err := run(c.args, &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("run(%q) = %v, want an error with %q", c.args, err, c.want)
		}
	}
}
