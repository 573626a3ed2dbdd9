package sim

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// colors of the strategies' lines.
func color(s Strategy) string {
	switch s {
	case NoBackoff:
		return "#d62728"
	case Exponential:
		return "#ff7f0e"
	case FullJitter:
		return "#2ca02c"
	case EqualJitter:
		return "#1f77b4"
	case DecorrelatedJitter:
		return "#9467bd"
	}
	return "#7f7f7f"
}

// SVG geometry: two panels side by side, a title above, the legend below.
const (
	svgWidth   = 1000
	svgHeight  = 500
	panelW     = 500
	plotLeft   = 80 // inside a panel
	plotRight  = 20
	plotTop    = 90
	plotBottom = 110
)

// WriteSVG draws the result as an SVG chart: the calls (work) against the clients on
// the left, the completion time on the right, one line per strategy, with axes and a
// legend.
func (r *Result) WriteSVG(w io.Writer) error {
	var b bytes.Buffer
	c := r.Config
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="13">`+"\n",
		svgWidth, svgHeight, svgWidth, svgHeight)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", svgWidth, svgHeight)
	text(&b, svgWidth/2, 28, "middle", 17, "bold", "Exponential backoff and jitter: N clients updating one OCC row")
	text(&b, svgWidth/2, 50, "middle", 12, "normal", fmt.Sprintf(
		"base %s, cap %s, network delay |Normal(%s, %s)|, mean of %d runs per point, seed %d (retrysafe sim)",
		c.Base, c.Cap, c.Delay, c.DelayStdDev, c.Runs, c.Seed))
	r.panel(&b, 0, "Work: calls (writes) per run", "calls", false, func(p Point) float64 { return p.Calls })
	// Plain exponential backoff takes ten times longer than the others: a log scale
	// keeps them apart.
	r.panel(&b, panelW, "Time until every client succeeded", "milliseconds (log scale)", true,
		func(p Point) float64 { return ms(p.Time) })

	// Legend, centred below the panels.
	const item = 150
	x := float64(svgWidth)/2 - float64(item*len(c.Strategies))/2
	y := float64(svgHeight - 30)
	for i, s := range c.Strategies {
		lx := x + float64(i*item)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="3"/>`+"\n", lx, y, lx+28, y, color(s))
		fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"/>`+"\n", lx+14, y, color(s))
		text(&b, lx+36, y+4.5, "start", 13, "normal", legendName(s))
	}
	b.WriteString("</svg>\n")
	_, err := w.Write(b.Bytes())
	return err
}

func legendName(s Strategy) string {
	switch s {
	case NoBackoff:
		return "no backoff"
	case Exponential:
		return "exponential"
	}
	return s.String() + " jitter"
}

// panel draws one chart at horizontal offset x0.
func (r *Result) panel(b *bytes.Buffer, x0 float64, title, ylabel string, logY bool, value func(Point) float64) {
	c := r.Config
	left, top := x0+plotLeft, float64(plotTop)
	width := float64(panelW - plotLeft - plotRight)
	height := float64(svgHeight - plotTop - plotBottom)
	xmin, xmax := float64(c.Clients[0]), float64(c.Clients[0])
	for _, n := range c.Clients {
		xmin, xmax = math.Min(xmin, float64(n)), math.Max(xmax, float64(n))
	}
	if xmax == xmin {
		xmin, xmax = xmin-1, xmax+1
	}
	ymin, ymax := math.Inf(1), 0.0
	for _, p := range r.Points {
		v := value(p)
		ymax = math.Max(ymax, v)
		if v > 0 {
			ymin = math.Min(ymin, v)
		}
	}
	var ticks []tick
	var py func(float64) float64
	if logY && ymax > 0 {
		lo := math.Floor(math.Log10(ymin))
		hi := math.Max(lo+1, math.Ceil(math.Log10(ymax)))
		py = func(v float64) float64 {
			v = math.Max(v, math.Pow(10, lo))
			return top + height - (math.Log10(v)-lo)/(hi-lo)*height
		}
		for e := lo; e <= hi; e++ {
			for _, m := range []float64{1, 2, 5} {
				if v := m * math.Pow(10, e); e < hi || m == 1 {
					ticks = append(ticks, tick{v, m == 1 || hi-lo <= 3})
				}
			}
		}
	} else {
		step := niceStep(ymax)
		ytop := math.Max(step, math.Ceil(ymax/step)*step)
		py = func(v float64) float64 { return top + height - v/ytop*height }
		for i := 0.0; i*step <= ytop+step/2; i++ {
			ticks = append(ticks, tick{i * step, true})
		}
	}
	px := func(v float64) float64 { return left + (v-xmin)/(xmax-xmin)*width }

	text(b, left+width/2, top-14, "middle", 14, "bold", title)
	// Grid and y ticks.
	for _, t := range ticks {
		y := py(t.v)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e0e0e0"/>`+"\n", left, y, left+width, y)
		if t.label {
			text(b, left-8, y+4, "end", 12, "normal", tickLabel(t.v))
		}
	}
	// X ticks: the simulated client counts.
	for _, n := range c.Clients {
		x := px(float64(n))
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", x, top+height, x, top+height+5)
		text(b, x, top+height+19, "middle", 12, "normal", strconv.Itoa(n))
	}
	// Axes.
	fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", left, top, left, top+height)
	fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", left, top+height, left+width, top+height)
	text(b, left+width/2, top+height+40, "middle", 13, "normal", "clients")
	fmt.Fprintf(b, `<text transform="translate(%.1f %.1f) rotate(-90)" text-anchor="middle" font-size="13">%s</text>`+"\n",
		x0+18, top+height/2, escape(ylabel))
	// One line per strategy.
	for _, s := range c.Strategies {
		var pts []string
		for _, n := range c.Clients {
			p, _ := r.Point(n, s)
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(float64(n)), py(value(p))))
		}
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="2.5" stroke-linejoin="round" points="%s"><title>%s</title></polyline>`+"\n",
			color(s), strings.Join(pts, " "), escape(legendName(s)))
		for _, pt := range pts {
			xy := strings.SplitN(pt, ",", 2)
			fmt.Fprintf(b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`+"\n", xy[0], xy[1], color(s))
		}
	}
}

type tick struct {
	v     float64
	label bool
}

// niceStep is a round tick step (1, 2 or 5 × 10ᵏ) giving about five ticks up to top.
func niceStep(top float64) float64 {
	if top <= 0 || math.IsNaN(top) || math.IsInf(top, 0) {
		return 1
	}
	raw := top / 5
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*mag {
			return m * mag
		}
	}
	return 10 * mag
}

func tickLabel(v float64) string {
	if v == math.Trunc(v) {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

func text(b *bytes.Buffer, x, y float64, anchor string, size int, weight, s string) {
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="%s" font-size="%d" font-weight="%s">%s</text>`+"\n",
		x, y, anchor, size, weight, escape(s))
}

func escape(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s)) // a strings.Builder never fails
	return b.String()
}
