package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/redisstore"
	"github.com/retrysafe/retrysafe/storedsn"
)

const migrateHelp = `usage: retrysafe migrate --store DSN

Applies the store's schema (tables, index, sequence), idempotently; the gateway also does
it as it starts. Redis and memory stores have no schema. On PostgreSQL, nothing is
created when the schema is complete, so run this as the schema's owner and the gateway
as a role with only USAGE on the schema, SELECT, INSERT, UPDATE and DELETE on the table
and USAGE on its sequence.

flags:
  --store DSN    sqlite:PATH (default sqlite:retrysafe.db), postgres://…[?schema=NAME],
                 redis://…, memory: (also RETRYSAFE_STORE)

examples:
  retrysafe migrate --store 'postgres://admin@db:5432/app?schema=retrysafe'
  retrysafe migrate --store sqlite:/var/lib/retrysafe/keys.db
`

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const cmd = "retrysafe migrate"
	fs := newFlagSet(cmd)
	dsn := fs.String("store", storedsn.Default, "")
	if ok, status := parse(fs, args, migrateHelp, []string{"store"}, false, stdout, stderr); !ok {
		return status
	}
	store, err := storedsn.OpenWith(ctx, *dsn, storedsn.Options{Eviction: redisstore.EvictionIgnore})
	if err != nil {
		return fail(stderr, cmd, err, exitUsage)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		return fail(stderr, cmd, err, exitFail)
	}
	fmt.Fprintf(stdout, "%s: schema applied\n", store.Name)
	return exitOK
}

const keysHelp = `usage: retrysafe keys list   [--store DSN] [--scope S] [--route R] [--state in_progress|done] [--key K]
                             [--limit N]
       retrysafe keys show   [--store DSN] [--scope S] --key K [--body]
       retrysafe keys delete [--store DSN] [--scope S] --key K

Find and evict idempotency records. A key lives in a scope: the value of the gateway's
--scope-header, or the SHA-256 (hex) of the request's Authorization header, or "" (no
Authorization) — list shows them, and the gateway route each record was claimed under
(its pattern; "-" for none, or a record written before the store kept routes).
Deleting a record in progress makes its owner's late answer be dropped and the next
retry execute again; deleting a done record makes the next retry execute again. Use it
for keys stuck after an incident, or to let a client reuse a key on purpose.

flags:
  --store DSN     sqlite:PATH (default sqlite:retrysafe.db), postgres://…[?schema=NAME],
                  redis://…[?prefix=P] (also RETRYSAFE_STORE)
  --scope S       the scope (default "": requests without Authorization); list: all
                  scopes unless given
  --route R       list: only the records of this gateway route, its pattern exactly as
                  retrysafe config check prints it ("POST /payments", "/" for the
                  catch-all; default all routes)
  --state STATE   list: in_progress or done (default both)
  --key K         list: only this key; show, delete: the key (required)
  --limit N       list: at most N records (default 1000; 0 for all)
  --body          show: print the stored response body after the record

examples:
  retrysafe keys list --state in_progress
  retrysafe keys list --route 'POST /payments' --state in_progress
  retrysafe keys list --store 'postgres://ops@db/app?schema=retrysafe' --scope alice
  retrysafe keys show --key 3f1c9a7e-payment --scope alice --body
  retrysafe keys delete --key 3f1c9a7e-payment --scope alice
`

type keysFlags struct {
	store, scope, state, key, route string
	limit                           int
	body                            bool
}

func runKeys(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	action, status, ok := readAction(args, "keys", []string{"list", "show", "delete"}, keysHelp, stdout, stderr)
	if !ok {
		return status
	}
	cmd := "retrysafe keys " + action
	var f keysFlags
	fs := newFlagSet(cmd)
	fs.StringVar(&f.store, "store", storedsn.Default, "")
	fs.StringVar(&f.scope, "scope", "", "")
	fs.StringVar(&f.key, "key", "", "")
	if action == "list" {
		fs.StringVar(&f.state, "state", "", "")
		fs.StringVar(&f.route, "route", "", "")
		fs.IntVar(&f.limit, "limit", 1000, "")
	}
	if action == "show" {
		fs.BoolVar(&f.body, "body", false, "")
	}
	if ok, status := parse(fs, args[1:], keysHelp, []string{"store"}, false, stdout, stderr); !ok {
		return status
	}
	scopeSet := false
	fs.Visit(func(fl *flag.Flag) {
		if fl.Name == "scope" {
			scopeSet = true
		}
	})
	switch {
	case action != "list" && f.key == "":
		return fail(stderr, cmd, errors.New("--key is required"), exitUsage)
	case f.state != "" && f.state != string(idempotency.StateInProgress) && f.state != string(idempotency.StateDone):
		return fail(stderr, cmd, fmt.Errorf("--state %q: want in_progress or done", f.state), exitUsage)
	case f.limit < 0:
		return fail(stderr, cmd, errors.New("--limit must not be negative"), exitUsage)
	}
	store, err := storedsn.OpenWith(ctx, f.store, storedsn.Options{Eviction: redisstore.EvictionIgnore})
	if err != nil {
		return fail(stderr, cmd, err, exitUsage)
	}
	defer store.Close()
	switch action {
	case "list":
		err = listKeys(ctx, store.Store, f, scopeSet, stdout)
	case "show":
		err = showKey(ctx, store.Store, f, stdout)
	case "delete":
		err = deleteKey(ctx, store.Store, f, stdout)
	}
	if err != nil {
		return fail(stderr, cmd, err, exitFail)
	}
	return exitOK
}

func listKeys(ctx context.Context, s idempotency.Store, f keysFlags, scopeSet bool, out io.Writer) error {
	l, ok := s.(idempotency.Lister)
	if !ok {
		return errors.New("this store cannot list its records")
	}
	filter := idempotency.ListFilter{State: idempotency.State(f.state), Route: f.route, Limit: 500}
	if scopeSet {
		// An empty filter scope means every scope: the anonymous scope "" is picked out
		// below.
		filter.Scope = f.scope
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCOPE\tKEY\tROUTE\tSTATE\tSTATUS\tCREATED\tEXPIRES\tLEASE")
	now := time.Now()
	n := 0
	for {
		page, err := l.List(ctx, filter)
		if err != nil {
			return err
		}
		for _, r := range page.Records {
			if scopeSet && r.Scope != f.scope || f.key != "" && r.Key != f.key || f.route != "" && r.Route != f.route {
				continue
			}
			if f.limit > 0 && n == f.limit {
				_ = tw.Flush()
				fmt.Fprintf(out, "(stopped at --limit %d)\n", f.limit)
				return nil
			}
			n++
			status, lease := "-", "-"
			if r.Response != nil {
				status = strconv.Itoa(r.Response.Status)
			}
			if r.State == idempotency.StateInProgress {
				if left := r.LeaseUntil.Sub(now); left > 0 {
					lease = left.Round(time.Second).String() + " left"
				} else {
					lease = "expired"
				}
				if r.Abandoned {
					lease += ", abandoned"
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", showScope(r.Scope), r.Key, showRoute(r.Route), r.State, status,
				stamp(r.CreatedAt), stamp(r.ExpiresAt), lease)
		}
		if page.Next == "" {
			break
		}
		filter.After = page.Next
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "(%d records)\n", n)
	return nil
}

// getKey returns the record of the --key in the --scope, or an error that names them
// when there is none.
func getKey(ctx context.Context, s idempotency.Store, f keysFlags) (*idempotency.Record, error) {
	r, err := s.Get(ctx, f.scope, f.key)
	if errors.Is(err, idempotency.ErrNotFound) {
		return nil, fmt.Errorf("no record for key %q in scope %s", f.key, showScope(f.scope))
	}
	return r, err
}

func showKey(ctx context.Context, s idempotency.Store, f keysFlags, out io.Writer) error {
	r, err := getKey(ctx, s, f)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "scope:\t%s\n", showScope(r.Scope))
	fmt.Fprintf(tw, "key:\t%s\n", r.Key)
	fmt.Fprintf(tw, "route:\t%s\n", showRoute(r.Route))
	fmt.Fprintf(tw, "state:\t%s\n", r.State)
	fmt.Fprintf(tw, "fingerprint:\t%s\n", r.Fingerprint)
	fmt.Fprintf(tw, "token:\t%d\n", r.Token)
	if r.Attempts > 0 { // stores that count them
		fmt.Fprintf(tw, "attempts:\t%d (1 + takeovers)\n", r.Attempts)
	}
	fmt.Fprintf(tw, "created:\t%s\n", stamp(r.CreatedAt))
	if r.State == idempotency.StateInProgress {
		fmt.Fprintf(tw, "lease until:\t%s\n", stamp(r.LeaseUntil))
		if r.Abandoned {
			fmt.Fprintf(tw, "owner:\tgave up, outcome unknown (the key is taken over when its lease ends)\n")
		}
	}
	fmt.Fprintf(tw, "expires:\t%s\n", stamp(r.ExpiresAt))
	if resp := r.Response; resp != nil {
		fmt.Fprintf(tw, "status:\t%d\n", resp.Status)
		for _, name := range slices.Sorted(maps.Keys(resp.Header)) {
			for _, v := range resp.Header[name] {
				fmt.Fprintf(tw, "header:\t%s: %q\n", name, v)
			}
		}
		for _, name := range slices.Sorted(maps.Keys(resp.Trailer)) {
			for _, v := range resp.Trailer[name] {
				fmt.Fprintf(tw, "trailer:\t%s: %q\n", name, v)
			}
		}
		if resp.BodyOmitted {
			fmt.Fprintf(tw, "body:\tnot stored (larger than the gateway's --max-response)\n")
		} else {
			fmt.Fprintf(tw, "body:\t%d bytes\n", len(resp.Body))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if f.body && r.Response != nil && len(r.Response.Body) > 0 {
		fmt.Fprintln(out)
		_, _ = out.Write(r.Response.Body)
		if !strings.HasSuffix(string(r.Response.Body), "\n") {
			fmt.Fprintln(out)
		}
	}
	return nil
}

func deleteKey(ctx context.Context, s idempotency.Store, f keysFlags, out io.Writer) error {
	r, err := getKey(ctx, s, f)
	if err != nil {
		return err
	}
	if err := s.Delete(ctx, f.scope, f.key); err != nil {
		return err
	}
	fmt.Fprintf(out, "deleted key %q in scope %s (it was %s)\n", f.key, showScope(f.scope), r.State)
	return nil
}

// showRoute shows a record's route: "-" for none (claimed without one, or before the
// store kept routes).
func showRoute(r string) string {
	if r == "" {
		return "-"
	}
	return r
}

func showScope(s string) string {
	if s == "" {
		return `""`
	}
	return s
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// readAction reads the action of a command that has several (retrysafe keys, retrysafe
// dlq): args[0], which must be one of actions. ok is true when it is; otherwise status
// is the exit status, after help was printed on stdout (asked for) or the want on
// stderr (no action, or an unknown one).
func readAction(args []string, command string, actions []string, help string, stdout, stderr io.Writer) (action string, status int, ok bool) {
	want := "want " + strings.Join(actions[:len(actions)-1], ", ") + " or " + actions[len(actions)-1] +
		" (see retrysafe " + command + " --help)"
	if len(args) == 0 {
		fmt.Fprintf(stderr, "retrysafe %s: %s\n", command, want)
		return "", exitUsage, false
	}
	switch action = args[0]; {
	case action == "-h", action == "-help", action == "--help", action == "help":
		fmt.Fprint(stdout, help)
		return "", exitOK, false
	case !slices.Contains(actions, action):
		fmt.Fprintf(stderr, "retrysafe %s: unknown action %q: %s\n", command, action, want)
		return "", exitUsage, false
	}
	return action, exitOK, true
}
