package history

import (
	"html"
	"html/template"
	"strconv"
	"strings"
	"time"
)

// The defaults of ChartData's size, in pixels, and its bounds.
const (
	DefaultChartWidth  = 640
	DefaultChartHeight = 200
	minChartWidth      = 200
	minChartHeight     = 100
	maxChartSide       = 4000
)

// ChartData is what Chart draws: one stacked bar per bucket of time.
type ChartData struct {
	// Title names the chart: its visible heading, its <title> and the start of its
	// aria-label.
	Title string
	// Buckets are the bars' start times, oldest first, evenly spaced. Their labels are
	// written in the times' own location.
	Buckets []time.Time
	// Series are stacked in this order, the first at the bottom; the legend lists them
	// in the same order.
	Series []ChartSeries
	// Width and Height are the chart's size in pixels. Default DefaultChartWidth and
	// DefaultChartHeight; bounded to 200–4000 by 100–4000.
	Width, Height int
}

// ChartSeries is one layer of a stacked bar chart.
type ChartSeries struct {
	Name string
	// Color fills the series' bars, as #rgb or #rrggbb; anything else is drawn grey.
	Color string
	// Counts holds one count per bucket: a missing one is zero, extra ones are ignored.
	Counts []uint64
}

// OutcomeChart returns the stacked bar chart of r: one bar per bucket, one series per
// class in Class order, with the classes' names and colours.
func OutcomeChart(r RouteOutcomes) ChartData {
	title := r.Route
	if title == "" {
		title = "(no route)"
	}
	c := ChartData{Title: title, Buckets: make([]time.Time, len(r.Buckets))}
	for i, b := range r.Buckets {
		c.Buckets[i] = b.Start
	}
	for _, class := range Classes() {
		s := ChartSeries{Name: class.String(), Color: class.Color(), Counts: make([]uint64, len(r.Buckets))}
		for i, b := range r.Buckets {
			s.Counts[i] = b.Counts[class]
		}
		c.Series = append(c.Series, s)
	}
	return c
}

// validColor reports whether s is #rgb or #rrggbb.
func validColor(s string) bool {
	if len(s) != 4 && len(s) != 7 || s[0] != '#' {
		return false
	}
	for _, r := range s[1:] {
		if !('0' <= r && r <= '9' || 'a' <= r && r <= 'f' || 'A' <= r && r <= 'F') {
			return false
		}
	}
	return true
}

// appendNum appends a coordinate with at most two decimals.
func appendNum(dst []byte, v float64) []byte {
	dst = strconv.AppendFloat(dst, v, 'f', 2, 64)
	for dst[len(dst)-1] == '0' {
		dst = dst[:len(dst)-1]
	}
	if dst[len(dst)-1] == '.' {
		dst = dst[:len(dst)-1]
	}
	return dst
}

// num formats a coordinate with at most two decimals.
func num(v float64) string { return string(appendNum(nil, v)) }

func writeNum(b *strings.Builder, v float64) {
	var buf [32]byte
	b.Write(appendNum(buf[:0], v))
}

func writeUint(b *strings.Builder, v uint64) {
	var buf [20]byte
	b.Write(strconv.AppendUint(buf[:0], v, 10))
}

func esc(s string) string { return html.EscapeString(s) }

// timeLabel formats a bucket's start for the axis and tooltips.
func timeLabel(t time.Time, step time.Duration) string {
	if step < time.Minute || t.Second() != 0 {
		return t.Format("15:04:05")
	}
	return t.Format("15:04")
}

// labelStep returns the time between two axis labels: a round duration that gives about
// five labels over span, and at least one bucket.
func labelStep(span, bucket time.Duration) time.Duration {
	for _, s := range []time.Duration{time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second,
		30 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute,
		30 * time.Minute, time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour} {
		if s >= bucket && s*6 >= span {
			return s
		}
	}
	return max(bucket, span/5)
}

// Chart draws c as an inline SVG stacked bar chart: a bar per bucket stacked by series,
// the largest bar's count on the vertical axis, a few times on the horizontal one, and a
// legend. Every text is escaped, so a title or series name is shown, never interpreted.
// The SVG has no script, no external resource and no style attribute (colours are
// presentation attributes, allowed by a strict Content-Security-Policy); its aria-label
// and <title> describe it, and each bar segment has a <title> with its time, series and
// count. The output depends only on c.
func Chart(c ChartData) template.HTML {
	w, h := c.Width, c.Height
	if w <= 0 {
		w = DefaultChartWidth
	}
	if h <= 0 {
		h = DefaultChartHeight
	}
	w, h = min(max(w, minChartWidth), maxChartSide), min(max(h, minChartHeight), maxChartSide)
	n := len(c.Buckets)

	totals := make([]uint64, n) // by bucket
	sums := make([]uint64, len(c.Series))
	for si, s := range c.Series {
		for i := range min(n, len(s.Counts)) {
			totals[i] += s.Counts[i]
			sums[si] += s.Counts[i]
		}
	}
	var peak uint64
	for _, t := range totals {
		peak = max(peak, t)
	}

	// The legend's rows, laid out from the bottom; a character is about 6.5 pixels.
	const rowH, sw = 14.0, 10.0
	type item struct {
		x, row float64
		s      ChartSeries
	}
	var items []item
	x, row := 6.0, 0.0
	for _, s := range c.Series {
		iw := sw + 4 + 6.5*float64(len([]rune(s.Name))) + 14
		if x > 6 && x+iw > float64(w) {
			x, row = 6, row+1
		}
		items = append(items, item{x, row, s})
		x += iw
	}
	rows := row + 1
	if len(items) == 0 {
		rows = 0
	}

	left, right, top := 44.0, float64(w)-8, 26.0
	bottom := float64(h) - 20 - rows*rowH // the time labels and the legend below
	if bottom < top+20 {
		bottom = top + 20
	}
	plotH := bottom - top

	var b strings.Builder
	b.Grow(min(1024+120*n*max(len(c.Series), 1), 1<<20))
	summary := esc(c.Title) + ": "
	var parts []string
	for si, s := range c.Series {
		if sums[si] > 0 {
			parts = append(parts, strconv.FormatUint(sums[si], 10)+" "+esc(s.Name))
		}
	}
	if len(parts) == 0 {
		summary += "no requests"
	} else {
		summary += strings.Join(parts, ", ")
	}
	b.WriteString(`<svg xmlns="http://www.w3.org/2000/svg" width="` + strconv.Itoa(w) + `" height="` + strconv.Itoa(h) +
		`" viewBox="0 0 ` + strconv.Itoa(w) + ` ` + strconv.Itoa(h) + `" role="img" aria-label="` + summary +
		`" font-family="sans-serif" font-size="11">`)
	b.WriteString(`<title>` + esc(c.Title) + `</title>`)
	b.WriteString(`<text x="6" y="14" font-size="12" font-weight="bold" fill="#222">` + esc(c.Title) + `</text>`)

	// Axes: the baseline, the top line at the peak, their counts.
	b.WriteString(`<g class="axis" fill="#555" stroke="none">`)
	b.WriteString(`<line x1="` + num(left) + `" y1="` + num(bottom) + `" x2="` + num(right) + `" y2="` + num(bottom) + `" stroke="#888"/>`)
	b.WriteString(`<line x1="` + num(left) + `" y1="` + num(top) + `" x2="` + num(right) + `" y2="` + num(top) + `" stroke="#ddd" stroke-dasharray="3 3"/>`)
	b.WriteString(`<text x="` + num(left-4) + `" y="` + num(top+4) + `" text-anchor="end">` + strconv.FormatUint(peak, 10) + `</text>`)
	b.WriteString(`<text x="` + num(left-4) + `" y="` + num(bottom) + `" text-anchor="end">0</text>`)

	bw := 0.0
	var bucket time.Duration
	if n > 0 {
		bw = (right - left) / float64(n)
		bucket = time.Minute
		if n > 1 {
			bucket = c.Buckets[1].Sub(c.Buckets[0])
		}
		if bucket <= 0 {
			bucket = time.Minute
		}
		step := labelStep(time.Duration(n)*bucket, bucket)
		for i, t := range c.Buckets {
			if !t.Truncate(step).Equal(t) {
				continue
			}
			lx := left + float64(i)*bw
			anchor := "middle"
			switch {
			case lx-left < 16:
				anchor = "start"
			case right-lx < 16:
				anchor = "end"
			}
			b.WriteString(`<line x1="` + num(lx) + `" y1="` + num(bottom) + `" x2="` + num(lx) + `" y2="` + num(bottom+3) + `" stroke="#888"/>`)
			b.WriteString(`<text x="` + num(lx) + `" y="` + num(bottom+14) + `" text-anchor="` + anchor + `">` + esc(timeLabel(t, step)) + `</text>`)
		}
	}
	if peak == 0 {
		b.WriteString(`<text x="` + num((left+right)/2) + `" y="` + num((top+bottom)/2) + `" text-anchor="middle">no requests</text>`)
	}
	b.WriteString(`</g>`)

	// Bars: one rect per non-zero (bucket, series), stacked in series order.
	b.WriteString(`<g class="bars" stroke="none">`)
	if peak > 0 {
		scale := plotH / float64(peak)
		gap := 0.0
		if bw > 4 {
			gap = 1
		}
		labels := make([]string, n) // the tooltips' times, one per bucket
		for i, t := range c.Buckets {
			labels[i] = esc(timeLabel(t, bucket))
		}
		fills := make([]string, len(c.Series))
		names := make([]string, len(c.Series))
		for si, s := range c.Series {
			fills[si], names[si] = s.Color, esc(s.Name)
			if !validColor(s.Color) {
				fills[si] = "#9e9e9e"
			}
		}
		for i := range n {
			y := bottom
			for si, s := range c.Series {
				if i >= len(s.Counts) || s.Counts[i] == 0 {
					continue
				}
				v := s.Counts[i]
				hh := float64(v) * scale
				y -= hh
				b.WriteString(`<rect x="`)
				writeNum(&b, left+float64(i)*bw+gap/2)
				b.WriteString(`" y="`)
				writeNum(&b, y)
				b.WriteString(`" width="`)
				writeNum(&b, bw-gap)
				b.WriteString(`" height="`)
				writeNum(&b, hh)
				b.WriteString(`" fill="`)
				b.WriteString(fills[si]) // validated: # and hex digits
				b.WriteString(`"><title>`)
				b.WriteString(labels[i])
				b.WriteByte(' ')
				b.WriteString(names[si])
				b.WriteString(`: `)
				writeUint(&b, v)
				b.WriteString(`</title></rect>`)
			}
		}
	}
	b.WriteString(`</g>`)

	// Legend.
	b.WriteString(`<g class="legend" fill="#333">`)
	for _, it := range items {
		ly := float64(h) - 6 - (rows-1-it.row)*rowH
		fill := it.s.Color
		if !validColor(fill) {
			fill = "#9e9e9e"
		}
		b.WriteString(`<rect x="` + num(it.x) + `" y="` + num(ly-sw+1) + `" width="` + num(sw) + `" height="` + num(sw) + `" fill="` + esc(fill) + `"/>`)
		b.WriteString(`<text x="` + num(it.x+sw+4) + `" y="` + num(ly) + `">` + esc(it.s.Name) + `</text>`)
	}
	b.WriteString(`</g></svg>`)
	return template.HTML(b.String()) //nolint:gosec // every text above is escaped
}
