package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/retrysafe/retrysafe/gateway/configfile"
	"github.com/retrysafe/retrysafe/storedsn"
)

const configHelp = `usage: retrysafe config check FILE

Reads a gateway configuration file and checks all that can be checked without
connecting to anything: every key and value, the routes' patterns (two that conflict
are an error), the rules between the settings (the TTL longer than the lease and the
upstream timeout, …), the upstream URLs and the form of the store's DSN. ${NAME} in
the store, the upstream URLs and admin_token is read from the environment.

The file (YAML) holds the upstreams, the defaults and the routes, each route with its
own policy: examples/gateway.yaml is one, and every key with its default is in
go doc github.com/retrysafe/retrysafe/gateway/configfile.

On success it prints "FILE: ok (N routes, M upstreams)" and the route table, each
route with its effective policy (the defaults filled in), and exits 0. Otherwise it
prints every error found, one per line as FILE:LINE: message, on stderr, and exits 1.
Bad arguments: exit 2.

A variable that is not set where the check runs (a secret kept elsewhere) is no
error: each use of one is printed on stderr, as FILE:LINE: KEY: ${NAME}: environment
variable not set, what needs its value is left unchecked, and the file passes. The
gateway itself refuses to start without it.

flags:
  --strict   an unset variable fails the check: its lines, and exit 2

examples:
  retrysafe config check examples/gateway.yaml
  # a file with store: ${RETRYSAFE_STORE}, its password kept out of it
  RETRYSAFE_STORE='postgres://retrysafe:pw@db/app' retrysafe config check gateway.yaml
  # where it runs, with its environment: every variable must be set
  retrysafe config check --strict /etc/retrysafe/gateway.yaml
`

func runConfig(_ context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "retrysafe config: want a subcommand: check (see retrysafe config --help)")
		return exitUsage
	}
	switch args[0] {
	case "check":
		return runConfigCheck(args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, configHelp)
		return exitOK
	}
	fmt.Fprintf(stderr, "retrysafe config: unknown subcommand %q: want check (see retrysafe config --help)\n", args[0])
	return exitUsage
}

func runConfigCheck(args []string, stdout, stderr io.Writer) int {
	const cmd = "retrysafe config check"
	fs := newFlagSet(cmd)
	strict := fs.Bool("strict", false, "")
	// No flag of this command is read from the environment: --strict is asked for
	// where the gateway's environment is, by whoever checks it there.
	if ok, status := parse(fs, args, configHelp, []string{}, true, stdout, stderr); !ok {
		return status
	}
	if fs.NArg() != 1 {
		fmt.Fprintf(stderr, "%s: want one FILE, not %d arguments (see %s --help)\n", cmd, fs.NArg(), cmd)
		return exitUsage
	}
	path := fs.Arg(0)
	f, err := configfile.Load(path, configfile.Options{CheckStore: checkStoreDSN, AllowUnsetEnv: true})
	if err != nil {
		for _, e := range joined(err) {
			fmt.Fprintln(stderr, oneLine(e))
		}
		return exitFail
	}
	for _, e := range f.UnsetEnv {
		fmt.Fprintln(stderr, oneLine(e))
	}
	if *strict && len(f.UnsetEnv) > 0 {
		return exitUsage
	}
	fmt.Fprintf(stdout, "%s: ok (%s, %s)", path, plural(f.RouteCount(), "route"), plural(len(f.Upstreams), "upstream"))
	if n := len(f.UnsetEnv); n > 0 {
		fmt.Fprintf(stdout, ", but for %s of an unset variable, which the gateway needs to start", plural(n, "use"))
	}
	fmt.Fprintln(stdout)
	if err := f.WriteTable(stdout); err != nil {
		return fail(stderr, cmd, err, exitFail)
	}
	return exitOK
}

// joined returns the errors err joins (errors.Join), or err alone.
func joined(err error) []error {
	var j interface{ Unwrap() []error }
	if errors.As(err, &j) {
		return j.Unwrap()
	}
	return []error{err}
}

// checkStoreDSN checks a store DSN as --store would take it, without opening the store.
func checkStoreDSN(dsn string) error {
	if err := storedsn.Check(dsn); err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), "storedsn: "))
	}
	return nil
}

// plural writes n and noun, with an s unless n is 1.
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
