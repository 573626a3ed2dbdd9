package configfile

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"slices"
	"strconv"

	"go.yaml.in/yaml/v3"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/idempotency"
)

// DefaultConflict is the conflict policy of a policy that sets none, here and in
// retrysafe gateway's --conflict: a duplicate of a request in progress waits for its
// answer (bounded by wait_timeout and the waiter ceilings, then 409 with Retry-After).
// Many clients retry a lost answer (a network error) at once and take a 409 as final,
// so that an answer lost on the way back would otherwise end as an error for a request
// that ran. The packages' zero value (idempotency.Config, gateway.Config) stays
// idempotency.ConflictReject, the 409 of the IETF draft.
const DefaultConflict = idempotency.ConflictWait

// Sentinel errors, wrapped by the Err of some Errors. Match them with errors.Is.
var (
	// ErrUnknownField: a key the file format does not have, at any depth.
	ErrUnknownField = errors.New("unknown field")
	// ErrDuplicateKey: a key written twice in one mapping.
	ErrDuplicateKey = errors.New("duplicate key")
	// ErrUnsetEnv: ${NAME} names an environment variable that is not set.
	ErrUnsetEnv = errors.New("environment variable not set")
)

// Options are what Load and Parse take besides the file. The zero value is ready to
// use.
type Options struct {
	// LookupEnv looks up the variables that ${NAME} in the store and upstream URLs
	// names; a variable it reports unset is an error, one set to "" expands to "".
	// Default os.LookupEnv.
	LookupEnv func(name string) (string, bool)

	// AllowUnsetEnv makes a variable that is not set no error: each use of one is
	// listed in File.UnsetEnv instead, and the checks that need the value it would
	// have given are left out (the store DSN's; an upstream URL is then only a
	// placeholder). For checking a file away from where it runs, whose secrets are
	// not there: a File with UnsetEnv is for reading, not for running. Default false:
	// an unset variable is an error, as a gateway must not start without it.
	AllowUnsetEnv bool

	// Overrides set keys as if the file held them, replacing what it holds: a command
	// line's flags over its file. They are applied in order, before the file is read,
	// and an error in one names its Source rather than a line. Default none.
	Overrides []Override

	// CheckStore, when set, checks the store DSN (after ${NAME} expansion) without
	// connecting to anything; its error is reported at the store's line. Default nil:
	// the DSN is not checked, as this package does not know the stores.
	CheckStore func(dsn string) error
}

// Override sets one key as if the file held it.
//
// Key is a dotted path of mapping keys: "listen", "store", "log.format",
// "max_body_memory", "upstreams.api", "defaults.ttl", "defaults.key.pointer",
// "defaults.scope" (with Value "none" or "authorization"), "defaults.scope.cookie",
// "defaults.fingerprint.ignore", "defaults.upstream" (a name or a URL). A key inside a
// scalar replaces it with a mapping, and one inside key: or scope: replaces what the
// file has there, as these hold exactly one source each (setting defaults.key.pointer
// drops the file's key.header). The values of methods and fingerprint.ignore are
// comma-separated lists. Routes cannot be overridden; an override of a defaults key
// reaches the routes that do not set that key themselves.
//
// Value is taken as it is: ${NAME} is not expanded in it (a shell has done that).
type Override struct {
	Key, Value string
	// Source names the override in errors, such as the flag that made it ("--ttl").
	Source string
}

// Error is one error in a file, or in an Override.
type Error struct {
	File   string // the file's name, as given to Load or Parse
	Line   int    // 1-based; 0 for an error about the whole file, or about an Override
	Source string // the Override's Source, for an error in its value; then Line is 0
	Path   string // the key the error is about ("routes[2].ttl"); "" when Err names it
	Err    error
}

// Error returns "FILE:LINE: PATH: message", or "SOURCE: PATH: message" for an
// Override.
func (e *Error) Error() string {
	loc := e.File
	switch {
	case e.Source != "":
		loc = e.Source
	case e.Line > 0:
		loc += ":" + strconv.Itoa(e.Line)
	}
	msg := "<nil>"
	if e.Err != nil {
		msg = e.Err.Error()
	}
	if e.Path != "" {
		msg = e.Path + ": " + msg
	}
	return loc + ": " + msg
}

func (e *Error) Unwrap() error { return e.Err }

// File is a gateway configuration file, read and checked.
type File struct {
	Path string // the name it was loaded as

	// Listen, Admin and Store are the proxy's address, the admin address ("off" when
	// disabled) and the store's DSN (with ${NAME} expanded); "" when not set, for the
	// caller's defaults.
	Listen, Admin, Store string

	// LogFormat (text or json) and LogLevel (debug, info, warn, error); "" when not set.
	LogFormat, LogLevel string

	// Otel turns OpenTelemetry tracing on, as retrysafe gateway's --otel does; the
	// exporter's endpoint and the rest come from the OTEL_ environment. False when not
	// set (the environment alone can still turn tracing on).
	Otel bool

	// Console is the operator console's mode on the admin listener (on, off or
	// read-only), as retrysafe gateway's --console; "" when not set.
	Console string
	// AdminToken is the token the console and /metrics ask for, as --admin-token, with
	// ${NAME} expanded (so that the file need not hold the secret); "" when not set.
	AdminToken string

	// TLS is the certificate and key the proxy listener serves HTTPS with, and the
	// admin listener too unless AdminTLS is set, as --tls-cert and --tls-key; zero
	// when not set (plain HTTP).
	TLS TLSFiles
	// AdminTLS is the admin listener's own certificate and key, as --admin-tls-cert
	// and --admin-tls-key; zero when not set.
	AdminTLS TLSFiles

	// Gateway is the gateway the file describes, but for Idempotency.Store and Logger,
	// which are the caller's: its own fields are the catch-all policy (Upstream nil
	// when there is none), and Routes the file's routes, in the file's order, with the
	// defaults they inherit filled in, followed, when the defaults have mode off, by a
	// route "/" that forwards the requests no other route matches. It has passed
	// gateway.Config.Resolve. Zero fields have the packages' defaults.
	Gateway gateway.Config

	// Upstreams are the named upstreams of the file, checked by gateway.ParseUpstream.
	Upstreams map[string]*url.URL

	// UnsetEnv lists, with Options.AllowUnsetEnv, each use of a variable that is not
	// set, in the order of their lines: an *Error at the value's line, naming the
	// variable and wrapping ErrUnsetEnv. Nil without AllowUnsetEnv (each is then an
	// error of Load), and when the file has errors: Load's error lists them too.
	UnsetEnv []*Error

	routes       []routeInfo // beside Gateway.Routes
	catchAll     string      // the upstream of the catch-all of the Config's own fields, "" for none
	declaredHere int         // the routes the file declares
}

// TLSFiles names a certificate's PEM file (the leaf first, then any intermediates) and
// its private key's. The file holds both or neither; the files themselves are read by
// the caller, which reads them again on SIGHUP.
type TLSFiles struct {
	Cert, Key string
}

// routeInfo is what the table shows of a route beside its gateway.Route.
type routeInfo struct {
	upstream string // the upstream's name, or its redacted URL when given as one
	catchAll bool   // the route "/" made for defaults with mode off
}

// RouteCount returns the number of routes the file declares.
func (f *File) RouteCount() int { return f.declaredHere }

// Load reads and checks the file at path; see Parse.
func Load(path string, opt Options) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = fmt.Errorf("cannot read it: %w", pe.Err)
		}
		return nil, &Error{File: path, Err: err}
	}
	return Parse(path, data, opt)
}

// Parse reads and checks a configuration file whose contents are data, named name in
// errors. The error reports every problem found, as *Error values joined with
// errors.Join: those of Overrides first, then in the order of their lines. Those of
// gateway.Config.Resolve wrap its own (a route's is a *gateway.RouteError), with the
// Go field names in their messages written as the file's keys.
func Parse(name string, data []byte, opt Options) (*File, error) {
	if opt.LookupEnv == nil {
		opt.LookupEnv = os.LookupEnv
	}
	opt.Overrides = slices.Clone(opt.Overrides)
	for i, o := range opt.Overrides {
		opt.Overrides[i].Source = cmp.Or(o.Source, "override "+o.Key)
	}
	p := &parser{file: name, opt: opt, synthetic: map[*yaml.Node]string{}, reported: map[string]bool{}}
	f := p.parse(data)
	if len(p.errs) > 0 {
		p.errs = append(p.errs, p.unset...) // the file fails: its unset variables with its errors
		slices.SortStableFunc(p.errs, func(a, b *Error) int { return cmp.Compare(a.Line, b.Line) })
		errs := make([]error, len(p.errs))
		for i, e := range p.errs {
			errs[i] = e
		}
		return nil, errors.Join(errs...)
	}
	f.Path = name
	f.UnsetEnv = p.unset
	return f, nil
}
