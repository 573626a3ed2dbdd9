package console

import (
	"bytes"
	"html/template"
	"net/http"
	"strings"
	"time"

	"github.com/retrysafe/retrysafe/console/history"
)

// outcomesData is the outcomes page: one chart per route, and the store's latencies.
type outcomesData struct {
	Have    bool
	Since   time.Time // the history's baseline
	Err     string    // the last sample's error
	Routes  []routeChart
	Latency []history.OpLatency
}

type routeChart struct {
	Route  string
	Total  uint64
	Chart  template.HTML
	Counts []classCount // the route's non-zero classes
}

type classCount struct {
	Name  string
	Count uint64
}

func (c *Console) outcomesPage(w http.ResponseWriter, r *http.Request) {
	d := &outcomesData{}
	if h := c.opt.History; h != nil {
		d.Have, d.Since = true, h.Since()
		if err := h.Err(); err != nil {
			d.Err = err.Error()
		}
		for _, ro := range h.Outcomes() {
			rc := routeChart{Route: ro.Route, Total: ro.Totals.Total()}
			if rc.Route == "" {
				rc.Route = "(no route)"
			}
			chart := history.OutcomeChart(ro)
			chart.Width, chart.Height = 1180, 220
			rc.Chart = history.Chart(chart)
			for _, class := range history.Classes() {
				if n := ro.Totals[class]; n > 0 {
					rc.Counts = append(rc.Counts, classCount{class.String(), n})
				}
			}
			d.Routes = append(d.Routes, rc)
		}
		d.Latency = h.StoreLatency()
	}
	c.render(w, r, http.StatusOK, "outcomes", c.newPage(r, "outcomes", "Outcomes", d))
}

type routesData struct {
	Have bool
	Rows [][]string
}

func (c *Console) routesPage(w http.ResponseWriter, r *http.Request) {
	d := &routesData{}
	if c.opt.RouteTable != nil {
		var b bytes.Buffer
		if err := c.opt.RouteTable(&b); err != nil {
			c.log.Error("console: writing the route table", "err", err)
			c.fail(w, r, http.StatusInternalServerError, "The route table could not be written: "+err.Error())
			return
		}
		d.Have, d.Rows = true, tableRows(b.String())
	}
	c.render(w, r, http.StatusOK, "routes", c.newPage(r, "routes", "Routes", d))
}

// tableRows splits the text of a table written by a tabwriter with at least two spaces
// between its columns into its cells; a blank line, which ends a table, is a nil row.
func tableRows(s string) [][]string {
	var rows [][]string
	for _, line := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		var cells []string
		for _, cell := range strings.Split(line, "  ") {
			if cell = strings.TrimSpace(cell); cell != "" {
				cells = append(cells, cell)
			}
		}
		rows = append(rows, cells)
	}
	return rows
}
