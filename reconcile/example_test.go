package reconcile_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/retrysafe/retrysafe/fence"
	"github.com/retrysafe/retrysafe/reconcile"
)

// One pass over in-memory state: the grants the database says users should have, and
// the grants an external system actually has.
func Example() {
	desired := map[string]string{"alice": "admin", "bob": "read", "carol": "write"}
	actual := map[string]string{"alice": "admin", "bob": "write", "dave": "read"}

	r, err := reconcile.New(reconcile.Config[string]{
		Desired: reconcile.ListerFunc[string](func(context.Context) (map[string]string, error) {
			return maps.Clone(desired), nil
		}),
		Actual: reconcile.ListerFunc[string](func(context.Context) (map[string]string, error) {
			return maps.Clone(actual), nil
		}),
		Repair: func(ctx context.Context, d reconcile.Drift[string]) error {
			fmt.Println("repair:", d.Kind, d.Key)
			if d.Kind == reconcile.Extra {
				delete(actual, d.Key)
			} else {
				actual[d.Key] = d.Desired
			}
			return nil
		},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	rep, err := r.RunOnce(context.Background())
	fmt.Printf("missing %d, extra %d, different %d, repaired %d, err %v\n",
		rep.Missing, rep.Extra, rep.Different, rep.Repaired, err)
	fmt.Println(maps.Equal(desired, actual))
	// Output:
	// repair: different bob
	// repair: missing carol
	// repair: extra dave
	// missing 1, extra 1, different 1, repaired 3, err <nil>
	// true
}

// Report only: find the drift, change nothing.
func Example_reportOnly() {
	desired := reconcile.ListerFunc[int](func(context.Context) (map[string]int, error) {
		return map[string]int{"a": 1, "b": 2}, nil
	})
	actual := reconcile.ListerFunc[int](func(context.Context) (map[string]int, error) {
		return map[string]int{"b": 3, "c": 4}, nil
	})
	r, err := reconcile.New(reconcile.Config[int]{Desired: desired, Actual: actual, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	rep, _ := r.RunOnce(context.Background())
	for _, it := range rep.Items {
		fmt.Printf("%s %s: desired %d, actual %d\n", it.Kind, it.Key, it.Desired, it.Actual)
	}
	// Output:
	// missing a: desired 1, actual 0
	// different b: desired 2, actual 3
	// extra c: desired 0, actual 4
}

func ExampleDiff() {
	type grant struct {
		Role    string
		Version int
	}
	desired := map[string]grant{"alice": {"admin", 3}, "bob": {"read", 1}}
	actual := map[string]grant{"alice": {"admin", 2}, "bob": {"read", 1}}
	sameVersion := func(d, a grant) bool { return d.Version == a.Version }
	for _, d := range reconcile.Diff(desired, actual, sameVersion) {
		fmt.Println(d.Kind, d.Key, d.Actual.Version, "->", d.Desired.Version)
	}
	// Output:
	// different alice 2 -> 3
}

// Every replica runs the loop; the lease makes only one of them reconcile at a time,
// and the repairs fence their writes with its token. Needs PostgreSQL: compiled, not
// run.
func ExampleReconciler_Run() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	leases, err := fence.New(fence.Config{Pool: pool})
	if err != nil {
		log.Fatal(err)
	}
	if err := leases.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	reg := prometheus.NewRegistry() // served on /metrics by the application

	var desiredGrants, externalGrants reconcile.Lister[string] // the application's listers
	r, err := reconcile.New(reconcile.Config[string]{
		Name:    "grants",
		Desired: desiredGrants,
		Actual:  externalGrants,
		Repair: func(ctx context.Context, d reconcile.Drift[string]) error {
			lease, _ := fence.FromContext(ctx)
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if err := lease.Check(ctx, tx); err != nil {
					return err // another replica took over: not retried
				}
				_, err := tx.Exec(ctx, "INSERT INTO grant_repairs (key, kind) VALUES ($1, $2)", d.Key, d.Kind.String())
				return err
			})
		},
		MaxRepairs: 100,
		Leases:     leases,
		Interval:   5 * time.Minute,
		Registerer: reg,
	})
	if err != nil {
		log.Fatal(err)
	}
	_ = r.Run(ctx) // until interrupted
}
