package console

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// previewLimit is the most of a body a page shows: the text's first bytes, or a hex
// dump of a binary body's first hexLimit bytes.
const (
	previewLimit = 4 << 10
	hexLimit     = 512
)

// bodyPreview is what a page shows of a stored body. html/template escapes Text.
type bodyPreview struct {
	Size      int
	Omitted   bool // not stored: larger than the gateway's response limit
	Binary    bool // not valid UTF-8 text: Text is a hex dump
	Truncated bool
	Text      string
}

func preview(body []byte, omitted bool) bodyPreview {
	p := bodyPreview{Size: len(body), Omitted: omitted}
	if omitted || len(body) == 0 {
		return p
	}
	if !isText(body) {
		p.Binary = true
		b := body
		if len(b) > hexLimit {
			b, p.Truncated = b[:hexLimit], true
		}
		p.Text = hex.Dump(b)
		return p
	}
	b := body
	if len(b) > previewLimit {
		n := previewLimit
		for n > 0 && !utf8.RuneStart(b[n]) {
			n--
		}
		b, p.Truncated = b[:n], true
	}
	p.Text = string(b)
	return p
}

// isText reports whether b reads as text: valid UTF-8 (a cut at the end of a long body
// allowed) without control characters but tab, newline and carriage return.
func isText(b []byte) bool {
	if len(b) > previewLimit+utf8.UTFMax {
		b = b[:previewLimit]
	}
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n <= 1 {
			return len(b) < utf8.UTFMax && !utf8.FullRune(b)
		}
		if unicode.IsControl(r) && r != '\t' && r != '\n' && r != '\r' {
			return false
		}
		b = b[n:]
	}
	return true
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// ago is how long before now t was, for a list: "3m ago".
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	if d < 0 {
		return "in " + short(-d)
	}
	return short(d) + " ago"
}

// until is how long after now t is: "in 20s", or "3m ago" when it passed.
func until(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := t.Sub(now)
	if d <= 0 {
		return short(-d) + " ago"
	}
	return "in " + short(d)
}

// short rounds d to its largest unit or two: 45s, 3m20s, 5h10m, 2d3h.
func short(d time.Duration) string {
	switch {
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < time.Minute:
		return strconv.Itoa(int(d.Seconds())) + "s"
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
}

// showScope shows the anonymous scope as "" (as retrysafe keys does).
func showScope(s string) string {
	if s == "" {
		return `""`
	}
	return s
}

func quote(s string) string { return strconv.Quote(s) }

func formatBytes(n int) string {
	switch {
	case n < 1<<10:
		return strconv.Itoa(n) + " B"
	case n < 1<<20:
		return strconv.FormatFloat(float64(n)/(1<<10), 'f', 1, 64) + " KiB"
	}
	return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + " MiB"
}

// oneLine collapses white space, for error texts shown in a table cell.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
