package configfile

import (
	"fmt"
	"io"
	"maps"
	"net/url"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/internal/bytesize"
	"github.com/retrysafe/retrysafe/internal/durfmt"
)

// WriteTable writes what the gateway will do, as `nginx -t` does: the upstreams, then
// one line per route with its effective policy, the packages' defaults filled in, in
// the file's order, the requests no route matches last. The gateway itself picks the
// most specific route that matches a request, whatever the order.
func (f *File) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if len(f.Upstreams) > 0 {
		fmt.Fprintln(tw, "UPSTREAM\tURL")
		for _, name := range slices.Sorted(maps.Keys(f.Upstreams)) {
			fmt.Fprintf(tw, "%s\t%s\n", name, f.Upstreams[name].Redacted())
		}
		fmt.Fprintln(tw)
	}
	fmt.Fprintln(tw, "ROUTE\tMODE\tUPSTREAM\tKEY\tSCOPE\tFINGERPRINT\tCONFLICT\tTTL\tLEASE\tLIMITS")
	gw := f.Gateway.Idempotency
	root := false
	for i, r := range f.Gateway.Routes {
		info := routeInfo{upstream: "-"}
		if i < len(f.routes) {
			info = f.routes[i]
		}
		name := r.Pattern
		if info.catchAll {
			name = "/ (catch-all)"
		}
		root = root || r.Pattern == "/"
		mw := r.Idempotency
		if method := patternMethod(r.Pattern); method != "" && len(mw.Methods) == 0 {
			mw.Methods = []string{method}
		}
		mw.MaxBodyMemory, mw.MaxWaiters = gw.MaxBodyMemory, gw.MaxWaiters
		cols, err := policyColumns(r.Off, mw, r.ScopeHeader, r.ScopeCookie, r.ScopeNone)
		if err != nil {
			return fmt.Errorf("configfile: route %q: %w", r.Pattern, err)
		}
		fmt.Fprintf(tw, "%s\t%s\n", name, strings.Join(slices.Insert(cols, 1, info.upstream), "\t"))
	}
	switch {
	case root:
	case f.Gateway.Upstream == nil:
		fmt.Fprintln(tw, "/ (catch-all)\t404: no route\t-\t-\t-\t-\t-\t-\t-\t-")
	default:
		cfg := f.Gateway
		cols, err := policyColumns(false, cfg.Idempotency, cfg.ScopeHeader, cfg.ScopeCookie, cfg.ScopeNone)
		if err != nil {
			return fmt.Errorf("configfile: the catch-all: %w", err)
		}
		fmt.Fprintf(tw, "/ (catch-all)\t%s\n", strings.Join(slices.Insert(cols, 1, labelOr(f.catchAll, cfg.Upstream)), "\t"))
	}
	return tw.Flush()
}

// labelOr returns label, or the redacted URL of u when the File has no name for it.
func labelOr(label string, u *url.URL) string {
	if label == "" {
		return u.Redacted()
	}
	return label
}

// policyColumns returns the columns of a policy but its route and upstream: MODE, KEY,
// SCOPE, FINGERPRINT, CONFLICT, TTL, LEASE, LIMITS.
func policyColumns(off bool, mw idempotency.Config, scopeHeader, scopeCookie string, scopeNone bool) ([]string, error) {
	if off {
		return []string{"off", "-", "-", "-", "-", "-", "-", "-"}, nil
	}
	mw, err := mw.Resolve()
	if err != nil {
		return nil, err
	}
	mode := "required"
	if mw.KeyOptional {
		mode = "optional"
	}
	mode += " " + strings.Join(mw.Methods, ",")
	if mw.FailOpen {
		mode += ", fail open"
	}
	key := "header " + mw.KeyHeader
	if mw.KeyPointer != "" {
		key = "pointer " + mw.KeyPointer
	}
	scope := "authorization"
	switch {
	case scopeHeader != "":
		scope = "header " + scopeHeader
	case scopeCookie != "":
		scope = "cookie " + scopeCookie
	case scopeNone:
		scope = "none"
	}
	fp := "full"
	if mw.CanonicalJSON || len(mw.FingerprintIgnore) > 0 {
		fp = "json"
	}
	if len(mw.FingerprintIgnore) > 0 {
		fp += ", ignore " + strings.Join(mw.FingerprintIgnore, ",")
	}
	conflict := string(mw.Conflict)
	if mw.Conflict == idempotency.ConflictWait {
		conflict += " " + durfmt.Format(mw.WaitTimeout)
	}
	limits := "body " + bytesize.Format(mw.MaxBody) + ", response " + bytesize.Format(mw.MaxResponse)
	return []string{mode, key, scope, fp, conflict, durfmt.Format(mw.TTL), durfmt.Format(mw.Lease), limits}, nil
}

// patternMethod returns the method a net/http pattern names, or "" for all.
func patternMethod(pattern string) string {
	if strings.HasPrefix(pattern, "/") {
		return ""
	}
	if i := strings.IndexAny(pattern, " \t"); i >= 0 {
		return pattern[:i]
	}
	return ""
}
