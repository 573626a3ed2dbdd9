package configfile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/internal/bytesize"
)

// pos is where a value was written: a line of the file, or an Override.
type pos struct {
	line   int
	source string // the Override's Source
}

// parser reads one file. Its errors are collected, not returned, so that all of them
// are reported at once.
type parser struct {
	file      string
	opt       Options
	synthetic map[*yaml.Node]string // the nodes Overrides made, and their Sources
	errs      []*Error
	reported  map[string]bool // the path and message of each error, so that each is reported once
	unset     []*Error        // the uses of variables not set, with Options.AllowUnsetEnv
}

// doc is what the file holds, read but not yet checked as a whole.
type doc struct {
	own           map[string]pos // the top-level keys set, where
	maxBodyMemory int64
	maxWaiters    int
	upstreamNames []string        // in the file's order
	badUpstream   map[string]bool // upstreams whose URL is in error (reported)
	upstreamsAt   pos
	defaults      *spec
	routes        []*spec
}

// spec is one policy as the file writes it: defaults, or a route.
type spec struct {
	path  string          // "defaults", "routes[2]"
	at    pos             // the mapping; a route's match
	match string          // routes only
	own   map[string]pos  // the keys set here, and their members ("key.pointer"), where
	bad   map[string]bool // the keys (top level of the policy) whose values are in error

	upstream               string // a name or a URL, ${NAME} expanded
	upstreamUnset          bool   // upstream names a variable not set (Options.AllowUnsetEnv)
	mode                   string // required, optional, off
	methods                []string
	keyHeader, keyPointer  string
	scopeKind, scopeName   string // authorization, none, header, cookie; the header or cookie
	fingerprintMode        string // full, json
	fingerprintIgnore      []string
	ttl, lease             time.Duration
	upstreamTimeout        time.Duration
	storeTimeout           time.Duration
	bodyTimeout            time.Duration
	waitTimeout            time.Duration
	maxBody, maxResponse   int64
	onStoreError, conflict string // closed, open; reject, wait
	maxWaitersPerKey       int
}

func newSpec(path string, at pos) *spec {
	return &spec{path: path, at: at, own: map[string]pos{}, bad: map[string]bool{}}
}

func (p *parser) at(n *yaml.Node) pos {
	if src, ok := p.synthetic[n]; ok {
		return pos{source: src}
	}
	return pos{line: n.Line}
}

// atKV is where the value v of key k was written: the Override that set it, else the
// key's line (a list's items may start on the next one).
func (p *parser) atKV(k, v *yaml.Node) pos {
	if src, ok := p.synthetic[v]; ok {
		return pos{source: src}
	}
	return p.at(k)
}

func (p *parser) report(at pos, path string, err error) {
	id := path + "\x00" + err.Error()
	if p.reported[id] {
		return
	}
	p.reported[id] = true
	p.errs = append(p.errs, &Error{File: p.file, Line: at.line, Source: at.source, Path: path, Err: err})
}

func (p *parser) errorf(at pos, path, format string, args ...any) {
	p.report(at, path, fmt.Errorf(format, args...))
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// in names a mapping in a message: " in defaults", "" for the top level.
func in(path string) string {
	if path == "" {
		return ""
	}
	return " in " + path
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

// describe names what a node is, for "want …, not …" messages.
func describe(n *yaml.Node) string {
	switch {
	case n.Kind == yaml.MappingNode:
		return "a mapping"
	case n.Kind == yaml.SequenceNode:
		return "a list"
	case n.Kind == yaml.AliasNode:
		return "an alias"
	case isNull(n):
		return "nothing"
	}
	return strconv.Quote(n.Value)
}

// parse reads data into a File; the errors are in p.errs.
func (p *parser) parse(data []byte) *File {
	root := p.document(data)
	if root == nil {
		return nil
	}
	for _, o := range p.opt.Overrides {
		p.override(root, o)
	}
	f := &File{Upstreams: map[string]*url.URL{}}
	d := &doc{own: map[string]pos{}, badUpstream: map[string]bool{}}
	p.mapping(root, "", func(key string, k, v *yaml.Node) {
		if !documented(SectionTop, key) {
			p.unknown(k, "", knownKeys(SectionTop))
			return
		}
		at := p.atKV(k, v)
		ok := true
		switch key {
		case "listen":
			f.Listen, ok = p.address(k, v, key, false)
		case "admin":
			f.Admin, ok = p.address(k, v, key, true)
		case "store":
			var raw string
			if raw, at, ok = p.scalar(k, v, key); ok {
				var unset bool
				if f.Store, ok, unset = p.expand(at, key, raw); ok && !unset && p.opt.CheckStore != nil {
					if err := p.opt.CheckStore(f.Store); err != nil {
						p.report(at, key, err)
						ok = false
					}
				}
			}
		case "log":
			p.mapping(v, key, func(sub string, k, v *yaml.Node) {
				path := join(key, sub)
				if !documented(SectionLog, sub) {
					p.unknown(k, key, knownKeys(SectionLog))
					return
				}
				switch sub {
				case "format":
					if s, _, ok := p.enum(k, v, path, "log format", "text", "json"); ok {
						f.LogFormat = s
					}
				case "level":
					if s, at, ok := p.scalar(k, v, path); ok {
						var lv slog.Level
						if lv.UnmarshalText([]byte(s)) != nil {
							p.errorf(at, path, "%q is not a log level: want debug, info, warn or error", s)
						} else {
							f.LogLevel = s
						}
					}
				default:
					p.unknown(k, key, knownKeys(SectionLog))
				}
			})
		case "otel":
			var s string
			s, at, ok = p.enum(k, v, key, "boolean", "true", "false")
			f.Otel = s == "true"
		case "console":
			f.Console, at, ok = p.enum(k, v, key, "console mode", "on", "off", "read-only")
		case "admin_token":
			var raw string
			if raw, at, ok = p.scalar(k, v, key); ok {
				f.AdminToken, ok, _ = p.expand(at, key, raw)
			}
		case "tls":
			f.TLS, ok = p.tlsFiles(k, v, key)
		case "admin_tls":
			f.AdminTLS, ok = p.tlsFiles(k, v, key)
		case "shutdown_timeout":
			f.Gateway.ShutdownTimeout, at, ok = p.duration(k, v, key)
		case "max_body_memory":
			d.maxBodyMemory, at, ok = p.size(k, v, key)
		case "max_waiters":
			d.maxWaiters, at, ok = p.count(k, v, key)
		case "upstreams":
			d.upstreamsAt = at
			p.mapping(v, key, func(name string, k, v *yaml.Node) {
				p.upstream(f, d, name, k, v)
			})
		case "defaults":
			d.defaults = p.policy(v, p.atKV(k, v), key, false)
		case "routes":
			p.routes(k, v, d)
		default:
			p.unknown(k, "", knownKeys(SectionTop))
			return
		}
		if ok {
			d.own[key] = at
		}
	})
	p.build(f, d)
	return f
}

// document parses data as one YAML document holding a mapping, and returns that
// mapping, or nil after reporting why not.
func (p *parser) document(data []byte) *yaml.Node {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var d yaml.Node
	if err := decode(dec, &d); err != nil {
		if errors.Is(err, io.EOF) {
			p.errorf(pos{}, "", "the file is empty: want a mapping of keys (upstreams, defaults, routes, …)")
			return nil
		}
		line, msg := syntaxError(err)
		p.errorf(pos{line: line}, "", "invalid YAML: %s", msg)
		return nil
	}
	var next yaml.Node
	switch err := decode(dec, &next); {
	case err == nil:
		p.errorf(pos{line: next.Line}, "", "a second YAML document: a file describes one gateway")
	case !errors.Is(err, io.EOF):
		line, msg := syntaxError(err)
		p.errorf(pos{line: line}, "", "invalid YAML: %s", msg)
	}
	if d.Kind != yaml.DocumentNode || len(d.Content) != 1 || isNull(d.Content[0]) {
		p.errorf(pos{}, "", "the file is empty: want a mapping of keys (upstreams, defaults, routes, …)")
		return nil
	}
	root := d.Content[0]
	if root.Kind != yaml.MappingNode {
		p.errorf(pos{line: root.Line}, "", "the file is %s: want a mapping of keys (upstreams, defaults, routes, …)", describe(root))
		return nil
	}
	return root
}

// decode reads the next document. The YAML parser is not this module's: a panic on
// some malformed input must still be an error, never a crash of the command.
func decode(dec *yaml.Decoder, n *yaml.Node) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("yaml: %v", v)
		}
	}()
	return dec.Decode(n)
}

// syntaxError splits a YAML syntax error into its line (0 if it names none) and its
// message. The parser reports them only as text, "yaml: line 3: message".
func syntaxError(err error) (int, string) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if num, m, ok := strings.Cut(rest, ": "); ok {
			if n, err := strconv.Atoi(num); err == nil && n > 0 {
				return n, m
			}
		}
	}
	return 0, msg
}

// mapping calls fn with each key of n and its value, in order, when n is a mapping or
// nothing (no keys). It reports anything else, keys that are not strings, keys written
// twice and aliases.
func (p *parser) mapping(n *yaml.Node, path string, fn func(key string, k, v *yaml.Node)) bool {
	switch {
	case n.Kind == yaml.AliasNode:
		p.alias(n, path)
		return false
	case isNull(n):
		return true
	case n.Kind != yaml.MappingNode:
		p.errorf(p.at(n), path, "want a mapping of keys, not %s", describe(n))
		return false
	}
	seen := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || isNull(k) {
			p.errorf(p.at(k), path, "a key must be a string, not %s", describe(k))
			continue
		}
		if first, dup := seen[k.Value]; dup {
			p.report(p.at(k), "", fmt.Errorf("%w %q%s: also at %s", ErrDuplicateKey, k.Value, in(path), p.where(first)))
			continue
		}
		seen[k.Value] = k
		fn(k.Value, k, v)
	}
	return true
}

// where names where a node was written in a message: "line 3", or the Override.
func (p *parser) where(n *yaml.Node) string {
	if at := p.at(n); at.source != "" {
		return at.source
	}
	return "line " + strconv.Itoa(n.Line)
}

// alias reports an alias (*name): the file format has no use for them (shared
// settings go in defaults), and following them would let a small file expand
// exponentially.
func (p *parser) alias(n *yaml.Node, path string) {
	p.errorf(p.at(n), path, "aliases (*%s) are not supported: put shared settings in defaults", n.Value)
}

// unknown reports a key the mapping at path does not have, with the known key
// closest to it when there is one.
func (p *parser) unknown(k *yaml.Node, path string, known []string) {
	err := fmt.Errorf("%w %q%s", ErrUnknownField, k.Value, in(path))
	if s := closest(k.Value, known); s != "" {
		err = fmt.Errorf("%w (did you mean %s?)", err, s)
	}
	p.report(p.at(k), "", err)
}

// closest returns the known key within two edits of s, or "".
func closest(s string, known []string) string {
	best, dist := "", 3
	for _, k := range known {
		if d := editDistance(strings.ToLower(s), k); d < dist {
			best, dist = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, bytes for characters (keys
// are ASCII).
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 64 // not a typo of a key
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// scalar returns the string that v, the value of key k, holds.
func (p *parser) scalar(k, v *yaml.Node, path string) (string, pos, bool) {
	at := p.atKV(k, v)
	switch {
	case v.Kind == yaml.AliasNode:
		p.alias(v, path)
	case v.Kind != yaml.ScalarNode:
		p.errorf(at, path, "want a string, not %s", describe(v))
	case isNull(v):
		p.errorf(at, path, "has no value")
	default:
		return v.Value, at, true
	}
	return "", at, false
}

// list returns the strings of v: a list of them, or one alone.
func (p *parser) list(k, v *yaml.Node, path string) ([]string, pos, bool) {
	at := p.atKV(k, v)
	if v.Kind != yaml.SequenceNode {
		s, at, ok := p.scalar(k, v, path)
		return []string{s}, at, ok
	}
	if len(v.Content) == 0 {
		p.errorf(at, path, "is empty: leave it out for the default")
		return nil, at, false
	}
	out := make([]string, 0, len(v.Content))
	ok := true
	for i, item := range v.Content {
		s, _, good := p.scalar(item, item, fmt.Sprintf("%s[%d]", path, i))
		ok = ok && good
		out = append(out, s)
	}
	return out, at, ok
}

func (p *parser) enum(k, v *yaml.Node, path, what string, allowed ...string) (string, pos, bool) {
	s, at, ok := p.scalar(k, v, path)
	if !ok {
		return "", at, false
	}
	for _, a := range allowed {
		if s == a {
			return s, at, true
		}
	}
	want := strings.Join(allowed[:len(allowed)-1], ", ") + " or " + allowed[len(allowed)-1]
	p.errorf(at, path, "%q is not a %s: want %s", s, what, want)
	return "", at, false
}

func (p *parser) duration(k, v *yaml.Node, path string) (time.Duration, pos, bool) {
	return positive(p, k, v, path, func(s string) (time.Duration, error) {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			return 0, fmt.Errorf("%q is not a duration (such as 30s, 5m, 24h)", s)
		}
		return d, nil
	})
}

func (p *parser) size(k, v *yaml.Node, path string) (int64, pos, bool) {
	return positive(p, k, v, path, bytesize.Parse)
}

func (p *parser) count(k, v *yaml.Node, path string) (int, pos, bool) {
	return positive(p, k, v, path, func(s string) (int, error) {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return 0, fmt.Errorf("%q is not a whole number", s)
		}
		return n, nil
	})
}

// positive reads a scalar with parse, which must give a positive quantity: zero means
// the default, which leaving the key out says more plainly.
func positive[T int | int64 | time.Duration](p *parser, k, v *yaml.Node, path string, parse func(string) (T, error)) (T, pos, bool) {
	s, at, ok := p.scalar(k, v, path)
	if !ok {
		return 0, at, false
	}
	n, err := parse(s)
	switch {
	case err != nil:
		p.report(at, path, err)
	case n <= 0:
		p.errorf(at, path, "must be positive, not %s (leave it out for the default)", s)
	default:
		return n, at, true
	}
	return 0, at, false
}

// address reads a listen address, HOST:PORT, or with allowOff "off".
func (p *parser) address(k, v *yaml.Node, path string, allowOff bool) (string, bool) {
	s, at, ok := p.scalar(k, v, path)
	if !ok {
		return "", false
	}
	if allowOff && strings.EqualFold(s, "off") {
		return "off", true
	}
	if _, _, err := net.SplitHostPort(s); err != nil {
		off := ""
		if allowOff {
			off = `, or "off"`
		}
		p.errorf(at, path, "%q is not an address: want HOST:PORT (127.0.0.1:8080, :8080)%s", s, off)
		return "", false
	}
	return s, true
}

// tlsFiles reads {cert: FILE, key: FILE}: both, or neither (an empty mapping).
func (p *parser) tlsFiles(k, v *yaml.Node, path string) (TLSFiles, bool) {
	var t TLSFiles
	bad := false // an error reported in a member: a member missing too says nothing more
	ok := p.mapping(v, path, func(sub string, k, v *yaml.Node) {
		var dst *string
		switch sub {
		case "cert":
			dst = &t.Cert
		case "key":
			dst = &t.Key
		default:
			p.unknown(k, path, knownKeys(SectionTLS))
			bad = true
			return
		}
		s, at, good := p.scalar(k, v, join(path, sub))
		switch {
		case !good:
			bad = true
		case s == "":
			p.errorf(at, join(path, sub), "is empty: want a file name")
			bad = true
		default:
			*dst = s
		}
	})
	if !ok || bad {
		return TLSFiles{}, false
	}
	if (t.Cert == "") != (t.Key == "") {
		p.errorf(p.atKV(k, v), path, "want both cert and key (the certificate's file and its private key's), or neither")
		return TLSFiles{}, false
	}
	return t, true
}

// expand replaces each ${NAME} in s, a value of the file, with the environment
// variable NAME, so that secrets (a store's password) need not be written in the file.
// A "$" not followed by "{" is kept; a literal "${" is written %24{ in a URL. Values
// from Overrides are taken as they are. unset is true when a variable was not set and
// Options.AllowUnsetEnv made that no error (it is listed): the value is then not whole,
// and nothing that needs it can be checked.
func (p *parser) expand(at pos, path, s string) (_ string, ok, unset bool) {
	if at.source != "" || !strings.Contains(s, "${") {
		return s, true, false
	}
	var b strings.Builder
	ok = true
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			break
		}
		b.WriteString(s[:i])
		end := strings.IndexByte(s[i:], '}')
		if end < 0 {
			p.errorf(at, path, "${ without its closing }")
			return "", false, false
		}
		name := s[i+2 : i+end]
		s = s[i+end+1:]
		if !envName(name) {
			p.errorf(at, path, "${%s}: not a variable name (letters, digits and _)", name)
			ok = false
			continue
		}
		v, set := p.opt.LookupEnv(name)
		switch {
		case !set && p.opt.AllowUnsetEnv:
			p.unset = append(p.unset, &Error{File: p.file, Line: at.line, Path: path, Err: fmt.Errorf("${%s}: %w", name, ErrUnsetEnv)})
			unset = true
			b.WriteString("${" + name + "}")
		case !set:
			p.report(at, path, fmt.Errorf("${%s}: %w", name, ErrUnsetEnv))
			ok = false
		default:
			b.WriteString(v)
		}
	}
	return b.String(), ok, unset
}

func envName(s string) bool {
	if s == "" || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// upstreamName reports whether s can name an upstream: letters, digits, '-', '_' and
// '.', so that a name can never be read as a URL.
func upstreamName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || c == '-' || c == '.' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// upstream reads one entry of upstreams.
func (p *parser) upstream(f *File, d *doc, name string, k, v *yaml.Node) {
	path := "upstreams." + name
	d.upstreamNames = append(d.upstreamNames, name)
	if !upstreamName(name) {
		p.errorf(p.at(k), "upstreams", "%q is not an upstream name: use letters, digits, '-', '_' and '.'", name)
		d.badUpstream[name] = true
		return
	}
	raw, at, ok := p.scalar(k, v, path)
	unset := false
	if ok {
		raw, ok, unset = p.expand(at, path, raw)
	}
	if !ok {
		d.badUpstream[name] = true
		return
	}
	if unset {
		f.Upstreams[name] = placeholder()
		return
	}
	u, err := gateway.ParseUpstream(raw)
	if err != nil {
		p.report(at, path, plain(err))
		d.badUpstream[name] = true
		return
	}
	f.Upstreams[name] = u
}

// routes reads the list of routes.
func (p *parser) routes(k, v *yaml.Node, d *doc) {
	switch {
	case v.Kind == yaml.AliasNode:
		p.alias(v, "routes")
		return
	case isNull(v):
		return
	case v.Kind != yaml.SequenceNode:
		p.errorf(p.atKV(k, v), "routes", "want a list of routes (- match: POST /payments), not %s", describe(v))
		return
	}
	for i, item := range v.Content {
		d.routes = append(d.routes, p.policy(item, p.at(item), fmt.Sprintf("routes[%d]", i), true))
	}
}

// policy reads defaults (route false) or a route.
func (p *parser) policy(n *yaml.Node, at pos, path string, route bool) *spec {
	s := newSpec(path, at)
	if !p.mapping(n, path, func(key string, k, v *yaml.Node) {
		kp := join(path, key)
		known := knownKeys(SectionPolicy)
		if !route {
			known = slices.DeleteFunc(known, func(s string) bool { return s == "match" })
		}
		if !slices.Contains(known, key) && key != "match" {
			p.unknown(k, path, known)
			return
		}
		at := p.atKV(k, v)
		ok := true
		switch key {
		case "match":
			if !route {
				p.report(p.at(k), "", fmt.Errorf("%w %q in defaults: only a route has a pattern", ErrUnknownField, key))
				return
			}
			if s.match, at, ok = p.scalar(k, v, kp); ok {
				s.at = at
				if strings.TrimSpace(s.match) == "" {
					p.errorf(at, kp, "is empty: want a net/http pattern (POST /payments)")
					ok = false
				}
			}
		case "upstream":
			var raw string
			if raw, at, ok = p.scalar(k, v, kp); ok {
				s.upstream, ok, s.upstreamUnset = p.expand(at, kp, raw)
			}
		case "mode":
			s.mode, at, ok = p.enum(k, v, kp, "mode", "required", "optional", "off")
		case "methods":
			s.methods, at, ok = p.list(k, v, kp)
		case "key":
			ok = p.key(k, v, kp, s)
		case "scope":
			ok = p.scope(k, v, kp, s)
		case "fingerprint":
			ok = p.fingerprint(k, v, kp, s)
		case "ttl":
			s.ttl, at, ok = p.duration(k, v, kp)
		case "lease":
			s.lease, at, ok = p.duration(k, v, kp)
		case "upstream_timeout":
			s.upstreamTimeout, at, ok = p.duration(k, v, kp)
		case "store_timeout":
			s.storeTimeout, at, ok = p.duration(k, v, kp)
		case "body_timeout":
			s.bodyTimeout, at, ok = p.duration(k, v, kp)
		case "wait_timeout":
			s.waitTimeout, at, ok = p.duration(k, v, kp)
		case "max_body":
			s.maxBody, at, ok = p.size(k, v, kp)
		case "max_response":
			s.maxResponse, at, ok = p.size(k, v, kp)
		case "on_store_error":
			s.onStoreError, at, ok = p.enum(k, v, kp, "store-error policy", "closed", "open")
		case "conflict":
			s.conflict, at, ok = p.enum(k, v, kp, "conflict policy", "reject", "wait")
		case "max_waiters_per_key":
			s.maxWaitersPerKey, at, ok = p.count(k, v, kp)
		default:
			p.unknown(k, path, known)
			return
		}
		if ok {
			s.own[key] = at
		} else {
			s.bad[key] = true
		}
	}) {
		s.bad["match"] = true // not a mapping: nothing to check further
		return s
	}
	if route && s.match == "" && !s.bad["match"] {
		p.errorf(s.at, path, "no match: every route needs its pattern (match: POST /payments)")
		s.bad["match"] = true
	}
	return s
}

// key reads key: {header: NAME} or {pointer: /id}.
func (p *parser) key(k, v *yaml.Node, path string, s *spec) bool {
	at := p.atKV(k, v)
	if v.Kind == yaml.ScalarNode && !isNull(v) {
		p.errorf(at, path, "want {header: NAME} or {pointer: /json/pointer}, not %s", describe(v))
		return false
	}
	ok, n := true, 0
	if !p.mapping(v, path, func(sub string, k, v *yaml.Node) {
		var val string
		var at pos
		var good bool
		switch {
		case documented(SectionKey, sub):
			val, at, good = p.scalar(k, v, join(path, sub))
		default:
			p.unknown(k, path, knownKeys(SectionKey))
			ok = false
			return
		}
		if !good {
			ok = false
			return
		}
		if strings.TrimSpace(val) == "" {
			// An empty header or pointer would fall back to the default key unseen.
			p.errorf(at, join(path, sub), "is empty: want the key's %s", sub)
			ok = false
			return
		}
		n++
		s.own["key."+sub] = at
		if sub == "header" {
			s.keyHeader = val
		} else {
			s.keyPointer = val
		}
	}) {
		return false
	}
	if ok && n != 1 {
		p.errorf(at, path, "want exactly one of header and pointer")
		return false
	}
	s.own["key"] = at
	return ok
}

// scope reads scope: authorization, none, {header: NAME} or {cookie: NAME}.
func (p *parser) scope(k, v *yaml.Node, path string, s *spec) bool {
	at := p.atKV(k, v)
	const want = "want authorization, none, {header: NAME} or {cookie: NAME}"
	if v.Kind == yaml.ScalarNode && !isNull(v) {
		switch v.Value {
		case "authorization", "none":
			s.scopeKind = v.Value
			s.own["scope"] = at
			return true
		}
		p.errorf(at, path, "%q is not a scope: %s", v.Value, want)
		return false
	}
	ok, n := true, 0
	if !p.mapping(v, path, func(sub string, k, v *yaml.Node) {
		if !documented(SectionScope, sub) {
			p.unknown(k, path, knownKeys(SectionScope))
			ok = false
			return
		}
		switch sub {
		case "header", "cookie":
			val, at, good := p.scalar(k, v, join(path, sub))
			if !good {
				ok = false
				return
			}
			if strings.TrimSpace(val) == "" {
				// An empty name would fall back to the Authorization scope unseen.
				p.errorf(at, join(path, sub), "is empty: want the %s's name", sub)
				ok = false
				return
			}
			n++
			s.scopeKind, s.scopeName = sub, val
			s.own["scope."+sub] = at
		default:
			p.unknown(k, path, knownKeys(SectionScope))
			ok = false
		}
	}) {
		return false
	}
	if ok && n != 1 {
		p.errorf(at, path, "%s: exactly one", want)
		return false
	}
	s.own["scope"] = at
	return ok
}

// fingerprint reads fingerprint: {mode: full|json, ignore: [pointers]}.
func (p *parser) fingerprint(k, v *yaml.Node, path string, s *spec) bool {
	at := p.atKV(k, v)
	if v.Kind == yaml.ScalarNode && !isNull(v) {
		p.errorf(at, path, "want {mode: full|json, ignore: [/json/pointer, …]}, not %s", describe(v))
		return false
	}
	ok := true
	if !p.mapping(v, path, func(sub string, k, v *yaml.Node) {
		var good bool
		var at pos
		if !documented(SectionFingerprint, sub) {
			p.unknown(k, path, knownKeys(SectionFingerprint))
			ok = false
			return
		}
		switch sub {
		case "mode":
			s.fingerprintMode, at, good = p.enum(k, v, join(path, sub), "fingerprint mode", "full", "json")
		case "ignore":
			s.fingerprintIgnore, at, good = p.list(k, v, join(path, sub))
		default:
			p.unknown(k, path, knownKeys(SectionFingerprint))
			ok = false
			return
		}
		if good {
			s.own["fingerprint."+sub] = at
		}
		ok = ok && good
	}) {
		return false
	}
	if ok && s.fingerprintMode == "full" && len(s.fingerprintIgnore) > 0 {
		p.errorf(at, path, "ignore compares bodies as JSON, which mode full does not: leave mode out, or set it to json")
		return false
	}
	s.own["fingerprint"] = at
	return ok
}
