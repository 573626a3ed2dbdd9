package history_test

import (
	"encoding/xml"
	"errors"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/console/history"
)

// svgRect is a bar segment of a parsed chart.
type svgRect struct {
	x, y, w, h float64
	fill       string
	title      string
}

// parsedChart is what a test reads of a chart's SVG.
type parsedChart struct {
	root  xml.StartElement
	title string // the svg's own <title>
	bars  []svgRect
	texts []string // every text node, in order
	attrs []xml.Attr
}

func attr(e xml.StartElement, name string) string {
	for _, a := range e.Attr {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

// parseChart parses svg as XML, failing the test when it is not well formed.
func parseChart(t *testing.T, svg string) parsedChart {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(svg))
	var p parsedChart
	var stack []xml.StartElement
	var bar *svgRect
	depth := 0
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the chart is not XML: %v\n%s", err, svg)
		}
		switch x := tok.(type) {
		case xml.StartElement:
			x = x.Copy()
			if depth == 0 {
				p.root = x
			}
			depth++
			p.attrs = append(p.attrs, x.Attr...)
			inBars := len(stack) > 0 && stack[len(stack)-1].Name.Local == "g" && attr(stack[len(stack)-1], "class") == "bars"
			if x.Name.Local == "rect" && inBars {
				f := func(n string) float64 {
					v, err := strconv.ParseFloat(attr(x, n), 64)
					if err != nil {
						t.Fatalf("rect %s=%q: %v", n, attr(x, n), err)
					}
					return v
				}
				p.bars = append(p.bars, svgRect{x: f("x"), y: f("y"), w: f("width"), h: f("height"), fill: attr(x, "fill")})
				bar = &p.bars[len(p.bars)-1]
			}
			stack = append(stack, x)
		case xml.EndElement:
			depth--
			stack = stack[:len(stack)-1]
			if x.Name.Local == "rect" {
				bar = nil
			}
		case xml.CharData:
			s := string(x)
			p.texts = append(p.texts, s)
			if len(stack) >= 1 && stack[len(stack)-1].Name.Local == "title" {
				switch {
				case len(stack) == 2:
					p.title = s
				case bar != nil:
					bar.title = s
				}
			}
		}
	}
	if p.root.Name.Local != "svg" || depth != 0 {
		t.Fatalf("root %q, depth %d at the end", p.root.Name.Local, depth)
	}
	return p
}

func minutes(from time.Time, n int) []time.Time {
	ts := make([]time.Time, n)
	for i := range ts {
		ts[i] = from.Add(time.Duration(i) * time.Minute)
	}
	return ts
}

func TestChartBars(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 12, 1, 17, 0, 0, 0, time.UTC)
	c := history.ChartData{
		Title:   "POST /payments",
		Buckets: minutes(start, 61),
		Series: []history.ChartSeries{
			{Name: "executed", Color: "#2e7d32", Counts: make([]uint64, 61)},
			{Name: "replayed", Color: "#1565c0", Counts: make([]uint64, 61)},
			{Name: "409 in flight", Color: "#f9a825", Counts: []uint64{0, 0, 7}}, // short: the rest are zero
		},
	}
	c.Series[0].Counts[0], c.Series[0].Counts[2], c.Series[0].Counts[60] = 10, 3, 40
	c.Series[1].Counts[2], c.Series[1].Counts[30] = 20, 1
	out := string(history.Chart(c))
	p := parseChart(t, out)

	// One rect per non-zero (bucket, series), bucket by bucket, bottom up.
	type seg struct {
		bucket int
		series string
		n      uint64
	}
	var want []seg
	for i := range c.Buckets {
		for _, s := range c.Series {
			if i < len(s.Counts) && s.Counts[i] > 0 {
				want = append(want, seg{i, s.Name, s.Counts[i]})
			}
		}
	}
	if len(p.bars) != len(want) {
		t.Fatalf("%d bar rects, want %d\n%s", len(p.bars), len(want), out)
	}
	ratio := p.bars[0].h / float64(want[0].n)
	var baseline float64
	for i, b := range p.bars {
		w := want[i]
		if math.Abs(b.h-ratio*float64(w.n)) > 0.01 {
			t.Errorf("bar %d (%v): height %.2f, want %.2f (proportional to its count)", i, w, b.h, ratio*float64(w.n))
		}
		wantTitle := start.Add(time.Duration(w.bucket)*time.Minute).Format("15:04") + " " + w.series + ": " + strconv.FormatUint(w.n, 10)
		if b.title != wantTitle {
			t.Errorf("bar %d: title %q, want %q", i, b.title, wantTitle)
		}
		if i == 0 {
			baseline = b.y + b.h
		}
		// Stacked: a bucket's first segment sits on the baseline, the next on it.
		if i == 0 || want[i-1].bucket != w.bucket {
			if math.Abs(b.y+b.h-baseline) > 0.01 {
				t.Errorf("bar %d: bottom at %.2f, baseline %.2f", i, b.y+b.h, baseline)
			}
		} else if prev := p.bars[i-1]; math.Abs(b.y+b.h-prev.y) > 0.01 || b.x != prev.x {
			t.Errorf("bar %d is not stacked on bar %d: %+v on %+v", i, i-1, b, prev)
		}
	}
	// The tallest bar (bucket 60, 40) reaches the top; the scale's label says 40.
	if !slices.Contains(p.texts, "40") || !slices.Contains(p.texts, "0") {
		t.Errorf("no axis labels 40 and 0 in %q", p.texts)
	}
	for _, l := range []string{"17:00", "17:15", "17:30", "17:45", "18:00"} {
		if !slices.Contains(p.texts, l) {
			t.Errorf("no time label %s in %q", l, p.texts)
		}
	}
	if slices.Contains(p.texts, "17:01") {
		t.Error("a time label for every bucket: want a few")
	}
	for _, s := range c.Series {
		if !slices.Contains(p.texts, s.Name) {
			t.Errorf("legend lacks %q", s.Name)
		}
	}
	if p.title != c.Title || attr(p.root, "role") != "img" ||
		attr(p.root, "aria-label") != "POST /payments: 53 executed, 21 replayed, 7 409 in flight" {
		t.Errorf("title %q, role %q, aria-label %q", p.title, attr(p.root, "role"), attr(p.root, "aria-label"))
	}
	if again := string(history.Chart(c)); again != out {
		t.Error("two charts of the same data differ")
	}
}

func TestChartEscapesAndIsSelfContained(t *testing.T) {
	t.Parallel()
	title := `<script>alert("x")</script> & 'co'`
	c := history.ChartData{
		Title:   title,
		Buckets: minutes(time.Date(2026, 12, 1, 17, 0, 0, 0, time.UTC), 3),
		Series: []history.ChartSeries{
			{Name: `<b onmouseover="x">`, Color: `red" onload="alert(1)`, Counts: []uint64{1, 2, 3}},
			{Name: "ok", Color: "#ABC", Counts: []uint64{1}},
		},
	}
	out := string(history.Chart(c))
	p := parseChart(t, out)
	lower := strings.ToLower(out)
	for _, bad := range []string{"<script", "<b ", "onload", "onmouseover=", "style=", "href", "<image", "<foreignobject", "url("} {
		if strings.Contains(lower, bad) && !(bad == "onmouseover=" && strings.Contains(out, "onmouseover=&#34;")) {
			t.Errorf("the SVG contains %q:\n%s", bad, out)
		}
	}
	if strings.Count(out, "http://") != 1 || !strings.Contains(out, `xmlns="http://www.w3.org/2000/svg"`) {
		t.Errorf("a URL other than the SVG namespace:\n%s", out)
	}
	if p.title != title || !slices.Contains(p.texts, title) || !slices.Contains(p.texts, `<b onmouseover="x">`) {
		t.Errorf("the title and the series name are not kept as text: %q", p.texts)
	}
	for _, a := range p.attrs {
		if strings.HasPrefix(strings.ToLower(a.Name.Local), "on") || a.Name.Local == "style" {
			t.Errorf("attribute %s=%q", a.Name.Local, a.Value)
		}
	}
	var fills []string
	for _, b := range p.bars {
		fills = append(fills, b.fill)
	}
	if want := []string{"#9e9e9e", "#ABC", "#9e9e9e", "#9e9e9e"}; !slices.Equal(fills, want) {
		t.Errorf("fills %q, want %q (an invalid colour is grey)", fills, want)
	}
}

func TestChartEmptyAndDegenerate(t *testing.T) {
	t.Parallel()
	for _, c := range []history.ChartData{
		{},
		{Title: "idle", Buckets: minutes(time.Date(2026, 12, 1, 17, 0, 0, 0, time.UTC), 61), Series: []history.ChartSeries{{Name: "executed", Color: "#000"}}},
		{Title: "tiny", Width: -5, Height: 1, Buckets: minutes(time.Date(2026, 12, 1, 17, 0, 0, 0, time.UTC), 1),
			Series: []history.ChartSeries{{Name: "x", Color: "#000", Counts: []uint64{5, 6}}}},
		{Title: "huge", Width: 1 << 30, Height: 1 << 30, Buckets: []time.Time{{}, {}}, // equal times
			Series: []history.ChartSeries{{Name: "x", Color: "#000", Counts: []uint64{1, 1}}}},
	} {
		p := parseChart(t, string(history.Chart(c)))
		w, _ := strconv.Atoi(attr(p.root, "width"))
		h, _ := strconv.Atoi(attr(p.root, "height"))
		if w < 200 || w > 4000 || h < 100 || h > 4000 {
			t.Errorf("%q: size %dx%d out of bounds", c.Title, w, h)
		}
		var sum uint64
		for _, s := range c.Series {
			for i, n := range s.Counts {
				if i < len(c.Buckets) {
					sum += n
				}
			}
		}
		if sum == 0 {
			if len(p.bars) != 0 || !slices.Contains(p.texts, "no requests") || !strings.HasSuffix(attr(p.root, "aria-label"), "no requests") {
				t.Errorf("%q: an empty chart has %d bars, texts %q", c.Title, len(p.bars), p.texts)
			}
			continue
		}
		for _, b := range p.bars {
			if b.h <= 0 || b.w <= 0 || math.IsNaN(b.y) || b.x < 0 || b.x+b.w > float64(w)+0.01 {
				t.Errorf("%q: bar %+v outside a %dx%d chart", c.Title, b, w, h)
			}
		}
	}
}

func TestOutcomeChart(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 12, 1, 17, 0, 0, 0, time.UTC)
	ro := history.RouteOutcomes{Route: "", Buckets: []history.BucketCounts{{Start: start}, {Start: start.Add(time.Minute)}}}
	ro.Buckets[1].Counts[history.ClassStoreError] = 4
	ro.Buckets[1].Counts[history.ClassExecuted] = 2
	c := history.OutcomeChart(ro)
	if c.Title != "(no route)" || len(c.Series) != history.NumClasses || !slices.Equal(c.Buckets, []time.Time{start, start.Add(time.Minute)}) {
		t.Fatalf("chart %+v", c)
	}
	for i, s := range c.Series {
		class := history.Class(i)
		if s.Name != class.String() || s.Color != class.Color() || s.Counts[1] != ro.Buckets[1].Counts[class] {
			t.Errorf("series %d: %+v, want class %v", i, s, class)
		}
	}
	p := parseChart(t, string(history.Chart(c)))
	if len(p.bars) != 2 || p.bars[0].fill != history.ClassExecuted.Color() || p.bars[1].fill != history.ClassStoreError.Color() {
		t.Errorf("bars %+v: want executed below store error", p.bars)
	}
}
