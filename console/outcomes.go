package console

import (
	"bytes"
	"net/http"
	"strings"
)

type outcomesData struct {
	Have bool
}

func (c *Console) outcomesPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "outcomes", c.newPage(r, "outcomes", "Outcomes", &outcomesData{}))
}

type routesData struct {
	Have  bool
	Table string
	Rows  [][]string
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
		d.Have, d.Table = true, b.String()
		d.Rows = tableRows(d.Table)
	}
	c.render(w, r, http.StatusOK, "routes", c.newPage(r, "routes", "Routes", d))
}

// tableRows splits the text of a table written by a tabwriter with at least two spaces
// between its columns into its cells, a blank line ending a table; nil when a line does
// not split like the table's header.
func tableRows(s string) [][]string {
	var rows [][]string
	for _, line := range strings.Split(s, "\n") {
		if strings.TrimSpace(line) == "" {
			rows = append(rows, nil)
			continue
		}
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
