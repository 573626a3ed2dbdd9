package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/retrysafe/retrysafe/internal/bytesize"
	"github.com/retrysafe/retrysafe/internal/durfmt"
)

// newFlagSet returns a flag set that reports nothing by itself: parse does.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// envName is the environment variable a flag can also be set from:
// RETRYSAFE_ and the flag's name, upper case, dashes as underscores.
func envName(flagName string) string {
	return "RETRYSAFE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parse sets the flags named in fromEnv (all of them when fromEnv is nil) from their
// environment variables, then parses args, whose values win. It prints help on -h and
// --help (status exitOK) and one line for any error (status exitUsage); ok is false in
// both cases. Positional arguments are an error unless allowArgs.
func parse(fs *flag.FlagSet, args []string, help string, fromEnv []string, allowArgs bool, stdout, stderr io.Writer) (ok bool, status int) {
	env := func(name string) bool {
		if fromEnv == nil {
			return true
		}
		for _, n := range fromEnv {
			if n == name {
				return true
			}
		}
		return false
	}
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if envErr != nil || !env(f.Name) {
			return
		}
		if v, set := os.LookupEnv(envName(f.Name)); set {
			if err := fs.Set(f.Name, v); err != nil {
				envErr = fmt.Errorf("%s=%q: %w", envName(f.Name), v, err)
			}
		}
	})
	if envErr != nil {
		fmt.Fprintf(stderr, "%s: %v\n", fs.Name(), oneLine(envErr))
		return false, exitUsage
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, help)
			return false, exitOK
		}
		fmt.Fprintf(stderr, "%s: %s (see %s --help)\n", fs.Name(), oneLine(err), fs.Name())
		return false, exitUsage
	}
	if fs.NArg() > 0 && !allowArgs {
		fmt.Fprintf(stderr, "%s: unexpected argument %q (see %s --help)\n", fs.Name(), fs.Arg(0), fs.Name())
		return false, exitUsage
	}
	return true, exitOK
}

// fail prints err on one line, prefixed with the command, and returns status.
func fail(stderr io.Writer, cmd string, err error, status int) int {
	fmt.Fprintf(stderr, "%s: %s\n", cmd, oneLine(err))
	return status
}

// oneLine collapses an error message onto one line.
func oneLine(v any) string {
	var s string
	switch v := v.(type) {
	case error:
		s = v.Error()
	default:
		s = fmt.Sprint(v)
	}
	return strings.Join(strings.Fields(s), " ")
}

// byteSize is a flag value of bytes, read and written by package bytesize: an integer
// with an optional unit, B, KiB, MiB, GiB (powers of 1024; K, M and G alone are the
// same), or KB, MB, GB (powers of 1000), as sizes are in the configuration file.
type byteSize int64

// parseSize reads a size as the flags do.
func parseSize(s string) (int64, error) { return bytesize.Parse(s) }

func (b *byteSize) Set(s string) error {
	n, err := bytesize.Parse(s)
	if err != nil {
		return err
	}
	*b = byteSize(n)
	return nil
}

func (b *byteSize) String() string { return bytesize.Format(int64(*b)) }

// flagDoc is one flag's entry in a command's --help. The default shown is the flag's
// own default value (flag.Flag.DefValue), so the help cannot drift from what the flag
// does; def replaces it where the default is computed, or is "-" for none.
type flagDoc struct {
	name, arg, help string
	// field is the Config field the flag sets: the packages' errors name the field, and
	// flagError shows the flag instead.
	field string
	def   string
}

// flagHelp writes the flags of docs, one entry each, the help wrapped beside the name.
func flagHelp(fs *flag.FlagSet, docs []flagDoc) string {
	const indent, width = 27, 88
	var b strings.Builder
	for _, d := range docs {
		head := "  --" + d.name
		if d.arg != "" {
			head += " " + d.arg
		}
		text := d.help
		var def string
		if fl := fs.Lookup(d.name); fl != nil {
			def = flagDefault(fl.DefValue, d.def)
		}
		if def != "" {
			if text != "" {
				text += " "
			}
			text += "(default " + def + ")"
		}
		line := head
		if len(line) >= indent-1 {
			b.WriteString(line + "\n")
			line = ""
		}
		line += strings.Repeat(" ", indent-len(line))
		col := indent
		for i, w := range strings.Fields(text) {
			if i > 0 && col+1+len(w) > width {
				b.WriteString(line + "\n")
				line, col = strings.Repeat(" ", indent), indent
			} else if i > 0 {
				line += " "
				col++
			}
			line += w
			col += len(w)
		}
		b.WriteString(strings.TrimRight(line, " ") + "\n")
	}
	return b.String()
}

// formatDefault shows a flag's default value: durations without their zero units (24h,
// not 24h0m0s), empty strings as nothing.
func formatDefault(v string) string {
	if d, err := time.ParseDuration(v); err == nil && strings.ContainsAny(v, "hms") {
		return durfmt.Format(d)
	}
	return v
}

// flagError rewrites an error of the packages' Config checks in the command line's
// terms: "idempotency: Config.TTL (1s) must be longer than Config.Lease (30s)" becomes
// "--ttl (1s) must be longer than --lease (30s)".
func flagError(err error, docs []flagDoc) error {
	msg := err.Error()
	for _, prefix := range []string{"gateway: ", "idempotency: "} {
		msg = strings.TrimPrefix(msg, prefix)
	}
	type rename struct{ from, to string }
	var renames []rename
	for _, d := range docs {
		if d.field != "" {
			renames = append(renames, rename{"Config.Idempotency." + d.field, "--" + d.name}, rename{"Config." + d.field, "--" + d.name})
		}
	}
	// Longer names first, so that Config.MaxBodyMemory is not read as Config.MaxBody.
	slices.SortFunc(renames, func(a, b rename) int { return len(b.from) - len(a.from) })
	for _, r := range renames {
		msg = strings.ReplaceAll(msg, r.from, r.to)
	}
	return errors.New(msg)
}
