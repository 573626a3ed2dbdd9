// Command perfsplit splits the CPU time of proxies under the same load by where in the
// process it went, per request, from `perf script -F period,ip,sym` output: the
// handler (the ReverseProxy's part of it apart), the server's reading and finishing of
// requests, the transport's goroutines, the garbage collector and the scheduler, each
// in user space and in the kernel. Beside the split it lists the leaf functions whose
// time per request differs most between each subject and the base, and each subject's
// own functions (--own: the innermost frame of those packages on a sample's stack,
// with what it called outside them) by their time per request.
//
// A subject is NAME=FILE:REQUESTS: the perf script output of one process over a
// window, and the responses it served in that window. Several files of one subject (a
// run's rounds) are added up when given as NAME=FILE1,FILE2:REQUESTS with REQUESTS
// their sum.
//
//	perf record -F 2000 -g -p $PID -o gw.data -- sleep 5   # while a load runs
//	perf script -i gw.data -F period,ip,sym > gw.txt
//	perfsplit gw=gw.txt:41000 bare=bare.txt:43000
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(os.Stderr, "perfsplit: %v\n", err)
		}
		os.Exit(2)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("perfsplit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	top := fs.Int("top", 20, "leaf functions listed by their difference from the base")
	base := fs.String("base", "", "the subject the others are compared with (default the last)")
	own := fs.String("own", "github.com/retrysafe/retrysafe/", "the symbol prefix of the subjects' own code")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: perfsplit [flags] NAME=FILE[,FILE...]:REQUESTS ...")
		fmt.Fprintln(stderr)
		fmt.Fprintln(stderr, "Splits each subject's CPU time per request by where in the process it went,")
		fmt.Fprintln(stderr, "from `perf script -F period,ip,sym` output, and compares it with the base's.")
		fmt.Fprintln(stderr)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() < 1 {
		fs.Usage()
		return errors.New("no subject")
	}
	var subjects []*subject
	for _, a := range fs.Args() {
		s, err := load(a, *own)
		if err != nil {
			return err
		}
		subjects = append(subjects, s)
	}
	b := subjects[len(subjects)-1]
	if *base != "" {
		i := slices.IndexFunc(subjects, func(s *subject) bool { return s.name == *base })
		if i < 0 {
			return fmt.Errorf("--base %s: no such subject", *base)
		}
		b = subjects[i]
	}
	return report(stdout, subjects, b, *top)
}

// subject is one process's samples, per request.
type subject struct {
	name     string
	requests int
	samples  int
	byBucket map[string]float64 // ns per request
	byLeaf   map[string]float64
	byOwn    map[string]float64 // by the innermost frame of the own code, when there is one
	own      string             // its symbols' prefix
	total    float64
}

// load reads the subject arg names: NAME=FILE[,FILE...]:REQUESTS.
func load(arg, own string) (*subject, error) {
	name, rest, ok := strings.Cut(arg, "=")
	i := strings.LastIndexByte(rest, ':')
	if !ok || name == "" || i <= 0 {
		return nil, fmt.Errorf("subject %q: want NAME=FILE[,FILE...]:REQUESTS", arg)
	}
	n, err := strconv.Atoi(rest[i+1:])
	if err != nil || n <= 0 {
		return nil, fmt.Errorf("subject %q: REQUESTS must be a positive integer", arg)
	}
	s := &subject{name: name, requests: n, byBucket: map[string]float64{}, byLeaf: map[string]float64{},
		byOwn: map[string]float64{}, own: own}
	for _, path := range strings.Split(rest[:i], ",") {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("subject %s: %w", name, err)
		}
		err = s.read(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("subject %s: %s: %w", name, path, err)
		}
	}
	if s.samples == 0 {
		return nil, fmt.Errorf("subject %s: no samples (was the output made with -F period,ip,sym?)", name)
	}
	return s, nil
}

// read adds the samples of one perf script output: each a line with its period, then
// a line per frame (address, symbol) from the leaf outwards, then a blank line.
func (s *subject) read(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var period float64
	var frames []frame
	flush := func() {
		if period > 0 && len(frames) > 0 {
			s.add(period, frames)
		}
		period, frames = 0, frames[:0]
	}
	line := 0
	for sc.Scan() {
		line++
		t := strings.TrimSpace(sc.Text())
		switch {
		case t == "":
			flush()
		case period == 0:
			p, err := strconv.ParseFloat(strings.Fields(t)[0], 64)
			if err != nil || p <= 0 {
				return fmt.Errorf("line %d: %q is not a sample's period", line, t)
			}
			period = p
		default:
			addr, sym, _ := strings.Cut(t, " ")
			frames = append(frames, frame{kernel: strings.HasPrefix(addr, "ffff"), sym: strings.TrimSpace(sym)})
		}
	}
	flush()
	return sc.Err()
}

type frame struct {
	kernel bool
	sym    string
}

func (s *subject) add(period float64, frames []frame) {
	s.samples++
	per := period / float64(s.requests)
	b := bucket(frames)
	if frames[0].kernel {
		b += " (kernel)"
	}
	s.byBucket[b] += per
	leaf := frames[0].sym
	if frames[0].kernel {
		leaf = "[kernel] " + leaf
	}
	s.byLeaf[leaf] += per
	if s.own != "" {
		for _, f := range frames {
			if strings.HasPrefix(f.sym, s.own) {
				s.byOwn[f.sym] += per
				break
			}
		}
	}
	s.total += per
}

// buckets name where a sample was, by a frame its stack holds: the first rule that
// matches decides, so the garbage collector's assists count as collection wherever they
// happened, and the ReverseProxy as itself inside the handler.
var buckets = []struct{ name, frame string }{
	{"garbage collector", "runtime.gcBgMarkWorker"},
	{"garbage collector", "runtime.gcAssistAlloc"},
	{"garbage collector", "runtime.bgsweep"},
	{"garbage collector", "runtime.bgscavenge"},
	{"handler: httputil.ReverseProxy", "net/http/httputil.(*ReverseProxy).ServeHTTP"},
	{"handler: the rest", "net/http.serverHandler.ServeHTTP"},
	{"server: reading requests", "net/http.(*conn).readRequest"},
	{"server: finishing responses", "net/http.(*response).finishRequest"},
	{"server: background read", "net/http.(*connReader).backgroundRead"},
	{"server: the rest", "net/http.(*conn).serve"},
	{"transport: writing requests", "net/http.(*persistConn).writeLoop"},
	{"transport: reading responses", "net/http.(*persistConn).readLoop"},
	{"scheduler", "runtime.mcall"},
	{"scheduler", "runtime.mstart"},
}

func bucket(frames []frame) string {
	for _, b := range buckets {
		for _, f := range frames {
			if f.sym == b.frame {
				return b.name
			}
		}
	}
	return "other"
}

func report(w io.Writer, subjects []*subject, base *subject, top int) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "where (µs per request)\t"
	for _, s := range subjects {
		head += s.name + "\t"
	}
	fmt.Fprintln(tw, head)
	names := map[string]bool{}
	for _, s := range subjects {
		for b := range s.byBucket {
			names[b] = true
		}
	}
	order := make([]string, 0, len(names))
	for n := range names {
		order = append(order, n)
	}
	slices.Sort(order)
	for _, n := range order {
		row := n + "\t"
		for _, s := range subjects {
			row += fmt.Sprintf("%.1f\t", s.byBucket[n]/1e3)
		}
		fmt.Fprintln(tw, row)
	}
	row := "total\t"
	for _, s := range subjects {
		row += fmt.Sprintf("%.1f\t", s.total/1e3)
	}
	fmt.Fprintln(tw, row)
	row = "samples, requests\t"
	for _, s := range subjects {
		row += fmt.Sprintf("%d, %d\t", s.samples, s.requests)
	}
	fmt.Fprintln(tw, row)
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range subjects {
		if s == base {
			continue
		}
		fmt.Fprintf(w, "\n%s − %s: %+.1f µs per request (%.2f×); the leaf functions that differ most:\n", s.name, base.name, (s.total-base.total)/1e3, s.total/base.total)
		type diff struct {
			leaf string
			d    float64
		}
		var ds []diff
		for l, v := range s.byLeaf {
			ds = append(ds, diff{l, v - base.byLeaf[l]})
		}
		for l, v := range base.byLeaf {
			if _, ok := s.byLeaf[l]; !ok {
				ds = append(ds, diff{l, -v})
			}
		}
		slices.SortFunc(ds, func(a, b diff) int {
			switch {
			case a.d > b.d:
				return -1
			case a.d < b.d:
				return 1
			}
			return strings.Compare(a.leaf, b.leaf)
		})
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, d := range ds[:min(top, len(ds))] {
			fmt.Fprintf(tw, "  %+.2f\t%s\n", d.d/1e3, d.leaf)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, s := range subjects {
		if len(s.byOwn) == 0 {
			continue
		}
		var sum float64
		names := make([]string, 0, len(s.byOwn))
		for n, v := range s.byOwn {
			names = append(names, n)
			sum += v
		}
		slices.SortFunc(names, func(a, b string) int {
			switch va, vb := s.byOwn[a], s.byOwn[b]; {
			case va > vb:
				return -1
			case va < vb:
				return 1
			}
			return strings.Compare(a, b)
		})
		fmt.Fprintf(w, "\n%s: %.1f µs per request under its own functions (%s…), by the innermost:\n", s.name, sum/1e3, s.own)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, n := range names[:min(top, len(names))] {
			fmt.Fprintf(tw, "  %.2f\t%s\n", s.byOwn[n]/1e3, strings.TrimPrefix(n, s.own))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}
