package history_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/console/history"
)

// outcomeValues returns the outcome label values defined in the Go files of dir: the
// constants of type Outcome (package idempotency), the constants named outcome…
// (package gateway), and string literals assigned to an outcome field, passed to
// setOutcome or converted to Outcome.
func outcomeValues(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var vals []string
	lit := func(e ast.Expr) {
		if bl, ok := e.(*ast.BasicLit); ok && bl.Kind == token.STRING {
			if v, err := strconv.Unquote(bl.Value); err == nil && v != "" {
				vals = append(vals, v)
			}
		}
	}
	isOutcome := func(e ast.Expr) bool {
		switch x := e.(type) {
		case *ast.Ident:
			return x.Name == "Outcome"
		case *ast.SelectorExpr:
			return x.Sel.Name == "Outcome"
		}
		return false
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.ValueSpec:
				for i, id := range x.Names {
					if i < len(x.Values) && (x.Type != nil && isOutcome(x.Type) || strings.HasPrefix(id.Name, "outcome")) {
						lit(x.Values[i])
					}
				}
			case *ast.AssignStmt:
				for i, l := range x.Lhs {
					if sel, ok := l.(*ast.SelectorExpr); ok && sel.Sel.Name == "outcome" && i < len(x.Rhs) {
						lit(x.Rhs[i])
					}
				}
			case *ast.CallExpr:
				fun := x.Fun
				if sel, ok := fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "setOutcome" || isOutcome(fun) {
					for _, a := range x.Args {
						lit(a)
					}
				}
			}
			return true
		})
	}
	return vals
}

// TestClassTableCoversTheGateway fails when the gateway or the idempotency middleware
// gains an outcome value that ClassOf does not map.
func TestClassTableCoversTheGateway(t *testing.T) {
	t.Parallel()
	var vals []string
	for _, dir := range []string{"../../idempotency", "../../gateway"} {
		if _, err := os.Stat(dir); err != nil {
			t.Fatal(err)
		}
		vals = append(vals, outcomeValues(t, dir)...)
	}
	// The scan must see the values it is meant to: both packages' kinds.
	for _, v := range []string{"executed", "replayed", "conflict", "store-error", "no-route", "budget-exhausted"} {
		if !slices.Contains(vals, v) {
			t.Fatalf("the scan of the sources did not find outcome %q (found %q)", v, vals)
		}
	}
	for _, v := range vals {
		if _, ok := history.ClassOf(v); !ok {
			t.Errorf("outcome %q of the gateway is not in ClassOf's table (nor the package doc's)", v)
		}
	}
}

// TestClassTableInDoc: every outcome value ClassOf knows is in the package doc's table,
// under its class.
func TestClassTableInDoc(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	// The table: a header line names its columns; a class name starts a row, and the
	// outcome values are in the second column of it and of the lines that follow, until
	// the next class.
	var lines []string
	for line := range strings.SplitSeq(string(src), "\n") {
		if l, ok := strings.CutPrefix(line, "//\t"); ok {
			lines = append(lines, l)
		}
	}
	var start, end int
	rows := map[string]history.Class{}
	var cur history.Class = -1
	for _, line := range lines {
		if strings.HasPrefix(line, "class ") {
			start, end = strings.Index(line, "outcome values"), strings.Index(line, "why")
			continue
		}
		if start <= 0 || end <= start {
			continue
		}
		for _, c := range history.Classes() {
			if strings.HasPrefix(line, c.String()+"  ") {
				cur = c
			}
		}
		if cur < 0 || len(line) <= start {
			continue
		}
		col := line[start:min(end, len(line))]
		for v := range strings.SplitSeq(col, ",") {
			if v = strings.TrimSpace(v); v != "" {
				rows[v] = cur
			}
		}
	}
	if len(rows) < 20 {
		t.Fatalf("read %d outcome values from the doc's table: %v", len(rows), rows)
	}
	var vals []string
	for _, dir := range []string{"../../idempotency", "../../gateway"} {
		vals = append(vals, outcomeValues(t, dir)...)
	}
	for _, v := range vals {
		c, _ := history.ClassOf(v)
		if got, ok := rows[v]; !ok || got != c {
			t.Errorf("outcome %q: the doc's table puts it under %v (listed %v), ClassOf under %v", v, got, ok, c)
		}
	}
}

func TestClassOfUnknown(t *testing.T) {
	t.Parallel()
	if c, ok := history.ClassOf("no-such-outcome"); ok || c != history.ClassOther {
		t.Errorf("ClassOf(unknown) = %v, %v; want other, false", c, ok)
	}
	seen := map[string]bool{}
	for _, c := range history.Classes() {
		if seen[c.String()] || seen[c.Color()] {
			t.Errorf("class %d: name %q or colour %s is another class's", c, c.String(), c.Color())
		}
		seen[c.String()], seen[c.Color()] = true, true
	}
}
