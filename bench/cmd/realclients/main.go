// Command realclients runs the real-client harness of package clients and prints its
// figures as a Markdown table: per client, the gateway with its default flags and with
// --conflict reject.
//
//	cd bench && go run ./cmd/realclients [-n 100] [-seed 1] [-loss 0.3] [-clients axios,stripe,requests]
//
// It builds cmd/retrysafe from the repository it runs in (or takes -binary), installs
// the node clients with npm ci, and needs a python3 that imports requests.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"

	"github.com/retrysafe/retrysafe/bench/clients"
)

func main() {
	n := flag.Int("n", 100, "logical POSTs per client")
	seed := flag.Uint64("seed", 1, "which answers the proxy loses")
	loss := flag.Float64("loss", 0.3, "share of the answers the proxy loses")
	conc := flag.Int("concurrency", 4, "logical requests each client has in flight")
	list := flag.String("clients", strings.Join(clients.Clients, ","), "clients to run")
	modes := flag.String("gateway", "defaults;--conflict reject", "the gateway's flag sets to compare, ';'-separated (defaults: none)")
	bin := flag.String("binary", "", "the retrysafe binary (default: go build ./cmd/retrysafe)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *n, *seed, *loss, *conc, strings.Split(*list, ","), strings.Split(*modes, ";"), *bin); err != nil {
		fmt.Fprintln(os.Stderr, "realclients:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, n int, seed uint64, loss float64, conc int, names, modes []string, bin string) error {
	root, err := clients.Root(".")
	if err != nil {
		return err
	}
	if bin == "" {
		dir, err := os.MkdirTemp("", "realclients-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if bin, err = clients.BuildGateway(ctx, root, dir); err != nil {
			return err
		}
	}
	python := clients.Python(ctx)
	if missing := clients.NodeMissing(); missing == "" {
		if err := clients.InstallNode(ctx, root); err != nil {
			return err
		}
	}
	var results []clients.Result
	for _, name := range names {
		for _, mode := range modes {
			var flags []string
			if mode = strings.TrimSpace(mode); mode != "defaults" {
				flags = strings.Fields(mode)
			}
			r, err := clients.Run(ctx, clients.Options{Client: name, Binary: bin, Root: root, Python: python,
				Gateway: flags, Logical: n, Seed: seed, LossRate: loss, Concurrency: conc})
			if err != nil {
				return err
			}
			results = append(results, r)
			fmt.Fprintf(os.Stderr, "%s, %s: done in %.1fs\n", name, r.Gateway, r.Duration.Seconds())
		}
	}
	clients.Table(os.Stdout, results)
	return nil
}
