// Package docs_test checks that the README and the documents under docs/ say what the
// code does: the quick start runs word for word and prints what it shows, the outputs
// shown of the commands are what those commands print, and every relative link leads
// to a file (and a heading) that exists.
//
// The marks, HTML comments the Markdown renderers do not show:
//
//   - <!-- quickstart --> before a ```sh block: the blocks so marked run in order in one
//     bash process, with the retrysafe and payments binaries built from this tree on
//     PATH. A ```text block right after one is what that block prints (stdout and
//     stderr together, as a terminal shows them); no such block means it prints
//     nothing.
//   - <!-- output: COMMAND --> before a ```text block: COMMAND runs in bash from the
//     repository's root, and the block is what it prints.
//   - <!-- output, counts vary: COMMAND --> the same for a command whose counts vary
//     from run to run (the demo): a number shown as 0 must be 0, any other number
//     stands for a number, runs of spaces for any run of spaces (columns move with the
//     numbers' widths), and the block is what the output ends with.
//
// In a shown output, a line "…" stands for any lines, and "…" within a line for any
// text. Besides, in the quick start's outputs only what must differ from run to run
// is normalised: HTTP dates, RFC 3339 times and durations (47ms). The quick start
// shows the default ports, 3000, 8080 and 9090; the test runs it on free ports (the
// gateway's from RETRYSAFE_LISTEN and RETRYSAFE_ADMIN, which its defaults stand for)
// and writes the ports back in what it compares, so that a busy machine's port 8080
// does not fail it.
//
// go test ./docs -update rewrites the shown outputs from a run, keeping a line with
// "…" where it still matches.
package docs_test

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the outputs the documents show from what the commands print")

// root is the repository's root, relative to this package's directory.
const root = ".."

// documents are the Markdown files checked, relative to root.
func documents(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md"}
	for _, f := range files {
		rel, err := filepath.Rel(root, f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, rel)
	}
	return out
}

// block is a fenced code block of a document.
type block struct {
	mark  string // the <!-- … --> comment on the line before its fence, "" for none
	lang  string // the fence's info string
	start int    // index of its first content line
	end   int    // index of its closing fence
	lines []string
}

var markRE = regexp.MustCompile(`^<!--\s*(.*?)\s*-->$`)

// blocks returns the fenced blocks of lines.
func blocks(lines []string) []block {
	var out []block
	for i := 0; i < len(lines); i++ {
		if !strings.HasPrefix(lines[i], "```") {
			continue
		}
		b := block{lang: strings.TrimSpace(strings.TrimPrefix(lines[i], "```")), start: i + 1}
		if i > 0 {
			if m := markRE.FindStringSubmatch(lines[i-1]); m != nil {
				b.mark = m[1]
			}
		}
		j := i + 1
		for j < len(lines) && !strings.HasPrefix(lines[j], "```") {
			j++
		}
		b.end = j
		b.lines = lines[i+1 : min(j, len(lines))]
		out = append(out, b)
		i = j
	}
	return out
}

// following returns the index in bs of the ```text block right after bs[i] (nothing but
// blank lines between), or -1.
func following(lines []string, bs []block, i int) int {
	if i+1 >= len(bs) || bs[i+1].lang != "text" || bs[i+1].mark != "" {
		return -1
	}
	for _, l := range lines[bs[i].end+1 : bs[i+1].start-1] {
		if strings.TrimSpace(l) != "" {
			return -1
		}
	}
	return i + 1
}

func readLines(t *testing.T, rel string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(string(data), "\n")
}

// TestDocs builds the binaries once and runs the quick start and the shown outputs.
func TestDocs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries and runs the demo")
	}
	bin := t.TempDir()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build the binaries: %v", err)
	}
	build := exec.Command(goTool, "build", "-o", bin+string(filepath.Separator), "./cmd/retrysafe", "./examples/payments")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	t.Run("quickstart", func(t *testing.T) { testQuickstart(t, bin) })
	t.Run("outputs", func(t *testing.T) {
		for _, doc := range documents(t) {
			testOutputs(t, bin, doc)
		}
	})
}

// environ is the test's environment without RETRYSAFE_ variables (which would change
// the commands' defaults), with bin first on PATH, TMPDIR set to tmp, and extra.
func environ(bin, tmp string, extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "RETRYSAFE_") || strings.HasPrefix(kv, "PATH=") || strings.HasPrefix(kv, "TMPDIR=") ||
			strings.HasPrefix(kv, "GOMEMLIMIT=") || strings.HasPrefix(kv, "OTEL_") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "TMPDIR="+tmp)
	return append(env, extra...)
}

// runBash runs script in bash, stdout and stderr into one buffer as a terminal shows
// them, in its own process group, which is killed afterwards (the quick start's
// background processes with it).
func runBash(t *testing.T, dir, script string, env []string, timeout time.Duration) string {
	t.Helper()
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir, cmd.Env = dir, env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	defer func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) }()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("bash: %v", err)
		}
	case <-time.After(timeout):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-done
		t.Fatalf("the script did not finish within %s; it printed:\n%s", timeout, out.String())
	}
	return out.String()
}

// freePort returns a port nothing listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

func testQuickstart(t *testing.T, bin string) {
	const doc = "README.md"
	lines := readLines(t, doc)
	bs := blocks(lines)
	ports := map[string]string{"3000": freePort(t), "8080": freePort(t), "9090": freePort(t)}
	var script strings.Builder
	type step struct{ sh, text int } // indexes in bs; text -1 for none
	var steps []step
	for i, b := range bs {
		if b.mark != "quickstart" {
			continue
		}
		if b.lang != "sh" {
			t.Fatalf("%s:%d: a quickstart block must be ```sh, not %q", doc, b.start, b.lang)
		}
		steps = append(steps, step{i, following(lines, bs, i)})
		fmt.Fprintf(&script, "printf '\\036%d\\n'\n", len(steps)-1)
		body := strings.Join(b.lines, "\n")
		for readme, free := range ports {
			body = strings.ReplaceAll(body, "127.0.0.1:"+readme, "127.0.0.1:"+free)
		}
		script.WriteString(body + "\n")
	}
	if len(steps) == 0 {
		t.Fatalf("%s has no <!-- quickstart --> block", doc)
	}
	fmt.Fprintf(&script, "printf '\\036%d\\n'\n", len(steps))
	tmp := t.TempDir()
	out := runBash(t, tmp, script.String(), environ(bin, tmp,
		"RETRYSAFE_LISTEN=127.0.0.1:"+ports["8080"], "RETRYSAFE_ADMIN=127.0.0.1:"+ports["9090"]), 2*time.Minute)
	for readme, free := range ports {
		out = strings.ReplaceAll(out, ":"+free, ":"+readme)
	}
	out = strings.ReplaceAll(out, "\r\n", "\n")
	var edits []edit
	for i, s := range steps {
		start := strings.Index(out, fmt.Sprintf("\x1e%d\n", i))
		end := strings.Index(out, fmt.Sprintf("\x1e%d\n", i+1))
		if start < 0 || end < start {
			t.Fatalf("the quick start stopped in its block %d (%s:%d); it printed:\n%s", i+1, doc, bs[s.sh].start, out)
		}
		got := splitOutput(out[start+len(fmt.Sprintf("\x1e%d\n", i)) : end])
		var want []string
		where := fmt.Sprintf("%s:%d", doc, bs[s.sh].start)
		if s.text >= 0 {
			want, where = bs[s.text].lines, fmt.Sprintf("%s:%d", doc, bs[s.text].start)
		}
		if !match(want, got, normaliseRun) {
			if *update && s.text >= 0 {
				edits = append(edits, edit{bs[s.text], merge(want, got, normaliseRun)})
				continue
			}
			t.Errorf("%s: the quick start's block %d printed\n%s\nwhich is not what %s shows:\n%s",
				doc, i+1, indent(got), where, indent(want))
		}
	}
	apply(t, doc, lines, edits)
}

func testOutputs(t *testing.T, bin, doc string) {
	lines := readLines(t, doc)
	bs := blocks(lines)
	var edits []edit
	for _, b := range bs {
		counts := false
		command, ok := strings.CutPrefix(b.mark, "output:")
		if !ok {
			command, counts = strings.CutPrefix(b.mark, "output, counts vary:")
		}
		if !ok && !counts {
			continue
		}
		if b.lang != "text" {
			t.Errorf("%s:%d: an output block must be ```text, not %q", doc, b.start, b.lang)
			continue
		}
		command = strings.TrimSpace(command)
		tmp := t.TempDir()
		got := splitOutput(strings.ReplaceAll(runBash(t, root, command, environ(bin, tmp), 2*time.Minute), "\r", "\n"))
		want := b.lines
		norm := normaliseNone
		if counts {
			want = append([]string{"…"}, want...)
			norm = normaliseCounts
		}
		if match(want, got, norm) {
			continue
		}
		if *update {
			merged := merge(want, got, norm)
			if counts {
				merged = tail(merged, len(b.lines))
			}
			edits = append(edits, edit{b, merged})
			continue
		}
		t.Errorf("%s:%d: %s printed\n%s\nwhich is not what the document shows:\n%s", doc, b.start, command, indent(got), indent(b.lines))
	}
	apply(t, doc, lines, edits)
}

func tail(lines []string, n int) []string {
	// A progress line ends with spaces; the table is what the document shows.
	for len(lines) > 0 && strings.TrimSpace(lines[len(lines)-1]) == "" {
		lines = lines[:len(lines)-1]
	}
	return lines[max(0, len(lines)-n):]
}

// splitOutput splits an output into lines, without the newline that ends the last.
func splitOutput(s string) []string {
	s = strings.TrimSuffix(s, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func indent(lines []string) string {
	var b strings.Builder
	for _, l := range lines {
		b.WriteString("    " + l + "\n")
	}
	return b.String()
}

// A normaliser turns a shown line into a pattern (a regular expression, anchored by
// the caller) and an output line into what the pattern is matched against.
type normaliser struct {
	pattern func(shown string) string
	text    func(printed string) string
}

var (
	httpDate = regexp.MustCompile(`[A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT`)
	rfc3339  = regexp.MustCompile(`\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})`)
	duration = regexp.MustCompile(`\b\d+(\.\d+)?(ns|µs|us|ms|s|m|h)\b`)
	number   = regexp.MustCompile(`\d+(\.\d+)?`)
	spaces   = regexp.MustCompile(` +`)
)

// wildcards quotes s as a regular expression in which "…" matches any text.
func wildcards(s string, quote func(string) string) string {
	parts := strings.Split(s, "…")
	for i, p := range parts {
		parts[i] = quote(p)
	}
	return strings.Join(parts, ".*")
}

var normaliseNone = normaliser{
	pattern: func(s string) string { return wildcards(s, regexp.QuoteMeta) },
	text:    func(s string) string { return s },
}

// normaliseRun replaces what differs from run to run: dates, times and durations.
var normaliseRun = normaliser{
	pattern: func(s string) string { return wildcards(runValues(s), regexp.QuoteMeta) },
	text:    runValues,
}

func runValues(s string) string {
	s = httpDate.ReplaceAllString(s, "<http-date>")
	s = rfc3339.ReplaceAllString(s, "<time>")
	return duration.ReplaceAllString(s, "<duration>")
}

// normaliseCounts: a 0 is 0, another number any number, a run of spaces any run.
var normaliseCounts = normaliser{
	pattern: func(s string) string {
		return wildcards(strings.TrimSpace(s), func(p string) string {
			var b strings.Builder
			last := 0
			for _, m := range number.FindAllStringIndex(p, -1) {
				b.WriteString(regexp.QuoteMeta(p[last:m[0]]))
				if p[m[0]:m[1]] == "0" {
					b.WriteString("0")
				} else {
					b.WriteString(`\d+(\.\d+)?`)
				}
				last = m[1]
			}
			b.WriteString(regexp.QuoteMeta(p[last:]))
			return spaces.ReplaceAllString(b.String(), " +")
		})
	},
	text: strings.TrimSpace,
}

// lineMatches reports whether the printed line matches the shown one.
func lineMatches(shown, printed string, n normaliser) bool {
	re, err := regexp.Compile("^" + n.pattern(shown) + "$")
	if err != nil {
		return false
	}
	return re.MatchString(n.text(printed))
}

// match reports whether got is what want shows; a line "…" of want matches any lines.
func match(want, got []string, n normaliser) bool {
	if len(want) == 0 {
		return len(got) == 0
	}
	if want[0] == "…" {
		for k := 0; k <= len(got); k++ {
			if match(want[1:], got[k:], n) {
				return true
			}
		}
		return false
	}
	return len(got) > 0 && lineMatches(want[0], got[0], n) && match(want[1:], got[1:], n)
}

// merge returns got, with each line that a line of want with a "…" matches written as
// that line, so that -update keeps the wildcards written by hand.
func merge(want, got []string, n normaliser) []string {
	out := slices.Clone(got)
	for i, g := range got {
		for _, w := range want {
			if strings.Contains(w, "…") && w != "…" && lineMatches(w, g, n) {
				out[i] = w
				break
			}
		}
	}
	return out
}

// edit replaces a block's lines.
type edit struct {
	b     block
	lines []string
}

// apply writes the edits (with -update) into doc, whose lines are lines.
func apply(t *testing.T, doc string, lines []string, edits []edit) {
	t.Helper()
	if len(edits) == 0 {
		return
	}
	for i := len(edits) - 1; i >= 0; i-- {
		e := edits[i]
		lines = slices.Concat(lines[:e.b.start], e.lines, lines[e.b.end:])
	}
	if err := os.WriteFile(filepath.Join(root, doc), []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %d outputs rewritten", doc, len(edits))
}

var (
	linkRE    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	headingRE = regexp.MustCompile(`^#{1,6} (.*)$`)
	slugDrop  = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
	schemeRE  = regexp.MustCompile(`^[a-z][a-z0-9+.-]*:`)
)

// slug is the anchor GitHub gives a heading.
func slug(heading string) string {
	return strings.ReplaceAll(slugDrop.ReplaceAllString(strings.ToLower(strings.TrimSpace(heading)), ""), " ", "-")
}

// anchors returns the anchors of the headings of a Markdown file's lines.
func anchors(lines []string) map[string]bool {
	out := map[string]bool{}
	fence := false
	for _, l := range lines {
		if strings.HasPrefix(l, "```") {
			fence = !fence
		}
		if m := headingRE.FindStringSubmatch(l); m != nil && !fence {
			out[slug(m[1])] = true
		}
	}
	return out
}

// TestLinks: every relative link of the documents leads to a file of the tree, and a
// link with #anchor to a heading of its Markdown file.
func TestLinks(t *testing.T) {
	for _, doc := range documents(t) {
		lines := readLines(t, doc)
		fence := false
		for n, l := range lines {
			if strings.HasPrefix(l, "```") {
				fence = !fence
			}
			if fence {
				continue
			}
			for _, m := range linkRE.FindAllStringSubmatch(l, -1) {
				target := m[1]
				if schemeRE.MatchString(target) {
					continue // https:, mailto:
				}
				path, anchor, _ := strings.Cut(target, "#")
				file := filepath.Join(root, filepath.Dir(doc), path)
				if path == "" {
					file = filepath.Join(root, doc)
				}
				if _, err := os.Stat(file); err != nil {
					t.Errorf("%s:%d: link %s: %v", doc, n+1, target, err)
					continue
				}
				if anchor == "" || !strings.HasSuffix(file, ".md") {
					continue
				}
				data, err := os.ReadFile(file)
				if err != nil {
					t.Fatal(err)
				}
				if !anchors(strings.Split(string(data), "\n"))[anchor] {
					t.Errorf("%s:%d: link %s: no heading with the anchor #%s", doc, n+1, target, anchor)
				}
			}
		}
	}
}

// TestReadmeSize: the README stays an introduction; the rest goes to docs/.
func TestReadmeSize(t *testing.T) {
	info, err := os.Stat(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if info.Size() > 15<<10 {
		t.Errorf("README.md is %d bytes, over 15 KiB: move the detail to docs/", info.Size())
	}
}
