package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReport(t *testing.T) {
	t.Parallel()
	lines := `{"tags":{"kind":"matrix","subject":"unprotected","clients":"32","round":"1","loadavg":"3.5"},"throughput":1000,"latency":{"p50_ms":1,"p99_ms":2},"status":{"201":5000}}
{"tags":{"kind":"matrix","subject":"payments-tx","clients":"32","round":"1"},"throughput":900,"latency":{"p50_ms":1,"p99_ms":2},"status":{"201":4000,"500":3},"errors":1}
{"tags":{"kind":"matrix","subject":"gw-postgres","clients":"32","round":"1"},"throughput":400,"latency":{"p50_ms":3,"p99_ms":9},"status":{"201":2000}}
{"tags":{"kind":"matrix","subject":"express","clients":"32","round":"1"},"throughput":500,"latency":{"p50_ms":3,"p99_ms":5},"status":{"201":2000}}
{"tags":{"kind":"matrix","subject":"express-cluster2","clients":"32","round":"1"},"throughput":450,"latency":{"p50_ms":3,"p99_ms":5},"status":{"201":2000}}
{"tags":{"kind":"storm","subject":"payments-tx","clients":"1000"},"responses":1000,"status":{"201":1,"201 replayed":900,"409":99},"by_status":{"201":{"count":1,"max_ms":50}}}
{"tags":{"kind":"storm-rows","subject":"payments-tx"},"rows":1}
{"tags":{"kind":"first","subject":"payments-tx","clients":"1"},"throughput":100}
{"tags":{"kind":"replay","subject":"payments-tx","clients":"1"},"throughput":300,"responses":10,"replayed":10}
{"tags":{"kind":"replay","subject":"gw-redis","clients":"1"},"throughput":300}
{"tags":{"kind":"pgbench","subject":"insert","clients":"32","round":"1"},"throughput":2000,"latency":{"mean_ms":1}}
{"tags":{"kind":"pgbench","subject":"txmode","clients":"32","round":"1"},"throughput":500,"latency":{"mean_ms":4}}
{"tags":{"kind":"pgbench","subject":"claim","clients":"32","round":"1"},"throughput":0}
{"tags":{"kind":"unknown"}}
{}
`
	path := filepath.Join(t.TempDir(), "r.jsonl")
	if err := os.WriteFile(path, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	recs, err := read(path)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := report(&b, recs); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"| payments-tx | 900 (0.90) |",
		"| gateway, PostgreSQL store ≥ 0.50× unprotected | 0.40×",
		"| payments, transaction mode ≥ 0.80× unprotected | 0.90×",
		"| 32 | payments-tx | 900 | 500 / 450 | **yes** |",
		"| payments-tx | 1 | 1000 | 1× 50.0 | 99 | — | 900 |",
		"| 1 | payments-tx | 100 |",
		"| txmode | 500 (0.25×, 4.00 ms) |",
		"| claim | failed |",
		"| 32 | payments-tx | 900 | 0.90 | 1.00 | 2.00 | 4 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	for _, bad := range []string{"not json\n", ""} {
		p := filepath.Join(t.TempDir(), "bad.jsonl")
		if err := os.WriteFile(p, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := read(p); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
