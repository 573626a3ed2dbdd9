package image

import (
	"fmt"
	"maps"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Options says what to build.
type Options struct {
	// Root is the repository's root: the build context, where go build runs.
	Root string
	// Dockerfile is the file to read; default Root/Dockerfile.
	Dockerfile string
	// Version is the build argument VERSION (the release; may be empty).
	Version string
	// GOARCH is the target architecture (TARGETARCH); the OS is linux.
	GOARCH string
}

// Plan is what a Dockerfile's final stage makes: the image's config and the files of
// its one layer. Load makes it without building anything.
type Plan struct {
	Config v1.Config
	// Files are the layer's entries by absolute path, parents included.
	Files map[string]*Entry
	opts  Options
}

// Entry is one file or directory of the layer.
type Entry struct {
	Dir      bool
	Mode     int64 // permission bits and the set-id and sticky bits (01777), as in a tar header
	UID, GID int
	// A file's content comes from a file of the build machine (HostPath) or from a go
	// build (Build).
	HostPath string
	Build    *goBuild
}

// goBuild is one `go build` of a RUN line: its environment assignments and its
// arguments, -o left out.
type goBuild struct {
	env  []string
	args []string
	dir  string // the directory it runs in, relative to the build context
}

// stage is one FROM and the instructions under it.
type stage struct {
	name, base string
	insts      []instruction
	fromLine   instruction
}

// Load reads the Dockerfile and interprets its final stage, and the stages it copies
// from, into a Plan. Any instruction, flag or shell construct it does not interpret is
// an error: the image it would build could differ from what a container engine builds.
func Load(opts Options) (*Plan, error) {
	if opts.Root == "" {
		return nil, fmt.Errorf("image: Options.Root is empty")
	}
	if opts.GOARCH == "" {
		return nil, fmt.Errorf("image: Options.GOARCH is empty")
	}
	file := opts.Dockerfile
	if file == "" {
		file = path.Join(opts.Root, "Dockerfile")
	}
	src, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	p, err := plan(string(src), opts)
	if err != nil {
		return nil, fmt.Errorf("image: %s: %w", file, err)
	}
	return p, nil
}

func plan(src string, opts Options) (*Plan, error) {
	insts, err := parseDockerfile(src)
	if err != nil {
		return nil, err
	}
	// Build arguments as buildx passes them for a linux/GOARCH target built on this
	// machine; VERSION is the one the Dockerfile declares.
	buildArgs := map[string]string{
		"VERSION": opts.Version, "TARGETOS": "linux", "TARGETARCH": opts.GOARCH,
		"TARGETPLATFORM": "linux/" + opts.GOARCH, "BUILDPLATFORM": "linux/" + opts.GOARCH,
		"BUILDOS": "linux", "BUILDARCH": opts.GOARCH,
	}
	// ARGs before the first FROM are for the FROM lines.
	global := map[string]string{"BUILDPLATFORM": buildArgs["BUILDPLATFORM"], "TARGETPLATFORM": buildArgs["TARGETPLATFORM"]}
	var stages []*stage
	for _, in := range insts {
		switch {
		case in.cmd == "FROM":
			ws, err := words(in.rest, lookupIn(global))
			if err != nil {
				return nil, in.errorf("%v", err)
			}
			st := &stage{fromLine: in}
			switch {
			case len(ws) == 1:
			case len(ws) == 3 && strings.EqualFold(ws[1], "AS"):
				st.name = strings.ToLower(ws[2])
			default:
				return nil, in.errorf("want FROM IMAGE [AS NAME]")
			}
			st.base = ws[0]
			for name := range in.flags {
				if name != "platform" {
					return nil, in.errorf("flag --%s is not interpreted", name)
				}
			}
			stages = append(stages, st)
		case len(stages) == 0 && in.cmd == "ARG":
			if err := declareArgs(in, global, buildArgs); err != nil {
				return nil, err
			}
		case len(stages) == 0:
			return nil, in.errorf("before the first FROM")
		default:
			st := stages[len(stages)-1]
			st.insts = append(st.insts, in)
		}
	}
	if len(stages) == 0 {
		return nil, fmt.Errorf("no FROM")
	}
	final := stages[len(stages)-1]
	if final.base != "scratch" {
		return nil, final.fromLine.errorf("the final stage must be FROM scratch (the builder makes the one layer of the image), not %s", final.base)
	}
	return finalStage(final, stages[:len(stages)-1], buildArgs, opts)
}

func lookupIn(m map[string]string) lookupFunc {
	return func(name string) (string, bool) { v, ok := m[name]; return v, ok }
}

// declareArgs declares the ARGs of in in vars, with the build argument's value if one
// is given, else the default.
func declareArgs(in instruction, vars, buildArgs map[string]string) error {
	ws, err := words(in.rest, lookupIn(vars))
	if err != nil {
		return in.errorf("%v", err)
	}
	if len(ws) == 0 {
		return in.errorf("no name")
	}
	for _, w := range ws {
		name, def, _ := strings.Cut(w, "=")
		if !validName(name) {
			return in.errorf("%q is not a name", name)
		}
		if v, ok := buildArgs[name]; ok {
			def = v
		}
		vars[name] = def
	}
	return nil
}

// finalStage interprets the final stage: its copies from the earlier stages make the
// layer, the rest the config.
func finalStage(final *stage, earlier []*stage, buildArgs map[string]string, opts Options) (*Plan, error) {
	p := &Plan{Files: map[string]*Entry{"/": {Dir: true, Mode: 0o755}}, opts: opts}
	vars := map[string]string{} // ARGs, then ENV over them
	var env [][2]string
	cfg := &p.Config
	evaluated := map[string]map[string]*Entry{}
	for _, in := range final.insts {
		lookup := lookupIn(vars)
		switch in.cmd {
		case "ARG":
			if err := declareArgs(in, vars, buildArgs); err != nil {
				return nil, err
			}
		case "COPY":
			from, ok := in.flags["from"]
			if !ok || len(in.flags) != 1 {
				return nil, in.errorf("only COPY --from=STAGE SRC DEST is interpreted in the final stage (flags %v)", slices.Sorted(maps.Keys(in.flags)))
			}
			ws, err := words(in.rest, lookup)
			if err != nil {
				return nil, in.errorf("%v", err)
			}
			if len(ws) != 2 {
				return nil, in.errorf("want one SRC and one DEST")
			}
			src := findStage(earlier, from)
			if src == nil {
				return nil, in.errorf("--from=%s is not an earlier stage of this file", from)
			}
			files, ok := evaluated[from]
			if !ok {
				if files, err = sourceStage(src, buildArgs); err != nil {
					return nil, err
				}
				evaluated[from] = files
			}
			if err := copyFrom(p.Files, files, ws[0], ws[1]); err != nil {
				return nil, in.errorf("%v", err)
			}
		case "USER":
			ws, err := words(in.rest, lookup)
			if err != nil || len(ws) != 1 {
				return nil, in.errorf("want one USER (%v)", err)
			}
			if _, _, err := numericUser(ws[0]); err != nil {
				return nil, in.errorf("%v", err)
			}
			cfg.User = ws[0]
		case "WORKDIR":
			ws, err := words(in.rest, lookup)
			if err != nil || len(ws) != 1 || !path.IsAbs(ws[0]) {
				return nil, in.errorf("want one absolute directory (%v)", err)
			}
			cfg.WorkingDir = path.Clean(ws[0])
			// An engine creates a missing one, with an owner that depends on the engine
			// and on USER: the builder wants it copied in, its owner said.
			if e, ok := p.Files[cfg.WorkingDir]; !ok || !e.Dir {
				return nil, in.errorf("%s is not a directory copied in before it", cfg.WorkingDir)
			}
		case "ENV":
			kvs, err := keyValues(in.rest, lookup, true)
			if err != nil {
				return nil, in.errorf("%v", err)
			}
			for _, kv := range kvs {
				env = slices.DeleteFunc(env, func(e [2]string) bool { return e[0] == kv[0] })
				env = append(env, kv)
				vars[kv[0]] = kv[1]
			}
		case "LABEL":
			kvs, err := keyValues(in.rest, lookup, false)
			if err != nil {
				return nil, in.errorf("%v", err)
			}
			if cfg.Labels == nil {
				cfg.Labels = map[string]string{}
			}
			for _, kv := range kvs {
				cfg.Labels[kv[0]] = kv[1]
			}
		case "EXPOSE":
			ws, err := words(in.rest, lookup)
			if err != nil || len(ws) == 0 {
				return nil, in.errorf("want ports (%v)", err)
			}
			if cfg.ExposedPorts == nil {
				cfg.ExposedPorts = map[string]struct{}{}
			}
			for _, w := range ws {
				port, proto, _ := strings.Cut(w, "/")
				if proto == "" {
					proto = "tcp"
				}
				if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || (proto != "tcp" && proto != "udp" && proto != "sctp") {
					return nil, in.errorf("%q is not PORT[/tcp|udp|sctp]", w)
				}
				cfg.ExposedPorts[port+"/"+proto] = struct{}{}
			}
		case "VOLUME":
			vols, ok := execForm(in.rest)
			if !ok {
				var err error
				if vols, err = words(in.rest, lookup); err != nil {
					return nil, in.errorf("%v", err)
				}
			}
			if cfg.Volumes == nil {
				cfg.Volumes = map[string]struct{}{}
			}
			for _, v := range vols {
				if !path.IsAbs(v) {
					return nil, in.errorf("%q is not an absolute path", v)
				}
				// A new volume starts as a copy of the image's directory, its owner
				// included: the builder wants it copied in, its owner said.
				if e, ok := p.Files[path.Clean(v)]; !ok || !e.Dir {
					return nil, in.errorf("%s is not a directory copied in before it", v)
				}
				cfg.Volumes[path.Clean(v)] = struct{}{}
			}
		case "STOPSIGNAL":
			ws, err := words(in.rest, lookup)
			if err != nil || len(ws) != 1 {
				return nil, in.errorf("want one signal (%v)", err)
			}
			cfg.StopSignal = ws[0]
		case "ENTRYPOINT", "CMD":
			args, ok := execForm(in.rest)
			if !ok {
				return nil, in.errorf("want the JSON form: the shell form runs /bin/sh, which an empty base has not")
			}
			if in.cmd == "ENTRYPOINT" {
				cfg.Entrypoint = args
			} else {
				cfg.Cmd = args
			}
		default:
			return nil, in.errorf("not interpreted in the final stage by the image builder (deploy/image)")
		}
	}
	for _, kv := range env {
		cfg.Env = append(cfg.Env, kv[0]+"="+kv[1])
	}
	if len(cfg.Entrypoint) == 0 {
		return nil, fmt.Errorf("the final stage has no ENTRYPOINT")
	}
	if e, ok := p.Files[cfg.Entrypoint[0]]; !ok || e.Dir || e.Mode&0o111 == 0 {
		return nil, fmt.Errorf("ENTRYPOINT %s is not an executable file of the image", cfg.Entrypoint[0])
	}
	return p, nil
}

func findStage(stages []*stage, name string) *stage {
	for i, st := range stages {
		if st.name == strings.ToLower(name) || strconv.Itoa(i) == name {
			return st
		}
	}
	return nil
}

// numericUser reads USER UID[:GID]: numeric, as an empty base has no /etc/passwd.
func numericUser(u string) (uid, gid int, err error) {
	us, gs, hasGroup := strings.Cut(u, ":")
	uid, err = strconv.Atoi(us)
	if err == nil && hasGroup {
		gid, err = strconv.Atoi(gs)
	}
	if err != nil || uid < 0 || gid < 0 {
		return 0, 0, fmt.Errorf("USER %q: want numeric UID[:GID] (an empty base has no /etc/passwd to look a name up in)", u)
	}
	return uid, gid, nil
}

// mkdirAll adds dir and its missing parents to files, owned by root, mode 0755.
func mkdirAll(files map[string]*Entry, dir string) {
	for d := dir; ; d = path.Dir(d) {
		if _, ok := files[d]; !ok {
			files[d] = &Entry{Dir: true, Mode: 0o755}
		}
		if d == "/" {
			return
		}
	}
}

// copyFrom does COPY --from: a file goes to dest (into it when dest ends in /); a
// directory's contents go under dest, with their owners and modes.
func copyFrom(dst, src map[string]*Entry, from, dest string) error {
	if !path.IsAbs(from) || !path.IsAbs(dest) {
		return fmt.Errorf("COPY %s %s: the builder wants absolute paths", from, dest)
	}
	from = path.Clean(from)
	e, ok := src[from]
	if !ok {
		return fmt.Errorf("%s: the stage makes no such file (the builder knows only what mkdir, cp and go build make)", from)
	}
	if !e.Dir {
		to := path.Clean(dest)
		if strings.HasSuffix(dest, "/") {
			to = path.Join(to, path.Base(from))
		}
		mkdirAll(dst, path.Dir(to))
		if d, ok := dst[to]; ok && d.Dir {
			return fmt.Errorf("%s is a directory", to)
		}
		c := *e
		dst[to] = &c
		return nil
	}
	dest = path.Clean(dest)
	mkdirAll(dst, dest)
	for _, p := range slices.Sorted(maps.Keys(src)) {
		rel, ok := strings.CutPrefix(p, strings.TrimSuffix(from, "/")+"/")
		if !ok || rel == "" {
			continue
		}
		to := path.Join(dest, rel)
		if d, ok := dst[to]; ok && d.Dir != src[p].Dir {
			return fmt.Errorf("%s: a file and a directory", to)
		}
		c := *src[p]
		dst[to] = &c
	}
	return nil
}

// sourceStage interprets a stage the final stage copies from. Its base image is stood
// in for by the build machine: cp takes the machine's file of the same path, and go
// build runs the machine's toolchain on the repository (the build context). It knows
// ARG, ENV, WORKDIR, COPY of the context, and RUN of && chains of mkdir, cp, chown,
// chmod, go mod download and go build.
func sourceStage(st *stage, buildArgs map[string]string) (map[string]*Entry, error) {
	files := map[string]*Entry{}
	vars := map[string]string{}
	var env []string
	cwd := "/"
	contextAt := "" // where COPY . put the build context
	for _, in := range st.insts {
		lookup := lookupIn(vars)
		switch in.cmd {
		case "ARG":
			if err := declareArgs(in, vars, buildArgs); err != nil {
				return nil, err
			}
		case "ENV":
			kvs, err := keyValues(in.rest, lookup, true)
			if err != nil {
				return nil, in.errorf("%v", err)
			}
			for _, kv := range kvs {
				vars[kv[0]] = kv[1]
				env = append(env, kv[0]+"="+kv[1])
			}
		case "WORKDIR":
			ws, err := words(in.rest, lookup)
			if err != nil || len(ws) != 1 {
				return nil, in.errorf("want one directory (%v)", err)
			}
			cwd = resolve(cwd, ws[0])
		case "COPY":
			if len(in.flags) != 0 {
				return nil, in.errorf("only a COPY of the build context, without flags, is interpreted here")
			}
			ws, err := words(in.rest, lookup)
			if err != nil || len(ws) < 2 {
				return nil, in.errorf("want SRC… DEST (%v)", err)
			}
			if len(ws) == 2 && ws[0] == "." {
				contextAt = resolve(cwd, ws[1])
			}
			// Other copies of the context's files (go.mod go.sum ./, for a layer of
			// modules the engine can cache) bring nothing COPY . does not.
		case "RUN":
			if len(in.flags) != 0 {
				return nil, in.errorf("RUN flags are not interpreted")
			}
			if _, ok := execForm(in.rest); ok {
				return nil, in.errorf("the JSON form of RUN is not interpreted")
			}
			ws, err := splitWords(in.rest, func(name string) (string, bool) { v, ok := vars[name]; return v, ok })
			if err != nil {
				return nil, in.errorf("%v", err)
			}
			for _, c := range commands(ws) {
				if err := runCommand(files, c, cwd, contextAt, env); err != nil {
					return nil, in.errorf("%v", err)
				}
			}
		default:
			return nil, in.errorf("not interpreted in a stage the final stage copies from")
		}
	}
	return files, nil
}

func resolve(cwd, p string) string {
	if path.IsAbs(p) {
		return path.Clean(p)
	}
	return path.Join(cwd, p)
}

// commands splits words at &&.
func commands(ws []word) [][]string {
	out := [][]string{nil}
	for _, w := range ws {
		if w.op {
			out = append(out, nil)
			continue
		}
		out[len(out)-1] = append(out[len(out)-1], w.text)
	}
	return out
}

func runCommand(files map[string]*Entry, args []string, cwd, contextAt string, stageEnv []string) error {
	// NAME=VALUE before the command: its environment.
	var assign []string
	for len(args) > 0 && strings.Contains(args[0], "=") && validName(strings.SplitN(args[0], "=", 2)[0]) {
		assign, args = append(assign, args[0]), args[1:]
	}
	if len(args) == 0 {
		return fmt.Errorf("an empty command")
	}
	if len(assign) > 0 && args[0] != "go" {
		return fmt.Errorf("%s: environment assignments are interpreted for go only", args[0])
	}
	name, args := args[0], args[1:]
	switch name {
	case "mkdir":
		mode, parents := int64(0o755), false
		for len(args) > 0 && strings.HasPrefix(args[0], "-") {
			switch args[0] {
			case "-p":
				parents = true
			case "-m":
				if len(args) < 2 {
					return fmt.Errorf("mkdir -m: no mode")
				}
				m, err := strconv.ParseInt(args[1], 8, 64)
				if err != nil {
					return fmt.Errorf("mkdir -m %s: an octal mode is interpreted", args[1])
				}
				mode, args = m, args[1:]
			default:
				return fmt.Errorf("mkdir %s: not interpreted", args[0])
			}
			args = args[1:]
		}
		for _, a := range args {
			d := resolve(cwd, a)
			if parents {
				for p := path.Dir(d); p != "/"; p = path.Dir(p) {
					if _, ok := files[p]; !ok {
						files[p] = &Entry{Dir: true, Mode: 0o755}
					}
				}
			}
			if e, ok := files[d]; ok {
				if !parents || !e.Dir {
					return fmt.Errorf("mkdir %s: exists", a)
				}
				continue // mkdir -p leaves an existing directory as it is
			}
			files[d] = &Entry{Dir: true, Mode: mode}
		}
	case "cp":
		if len(args) != 2 || strings.HasPrefix(args[0], "-") {
			return fmt.Errorf("cp: only cp SRC DEST of one file is interpreted")
		}
		src := resolve(cwd, args[0])
		fi, err := os.Stat(src)
		if err != nil {
			return fmt.Errorf("cp %s: the build machine stands in for the base image, and has no such file: %w", src, err)
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("cp %s: not a regular file", src)
		}
		to := resolve(cwd, args[1])
		if e, ok := files[to]; ok && e.Dir {
			to = path.Join(to, path.Base(src))
		}
		files[to] = &Entry{Mode: int64(fi.Mode().Perm() &^ 0o022), HostPath: src}
	case "chown":
		if len(args) < 2 {
			return fmt.Errorf("chown: want UID:GID PATH…")
		}
		uid, gid, err := numericUser(args[0])
		if err != nil || !strings.Contains(args[0], ":") {
			return fmt.Errorf("chown %s: numeric UID:GID is interpreted", args[0])
		}
		for _, a := range args[1:] {
			e, ok := files[resolve(cwd, a)]
			if !ok {
				return fmt.Errorf("chown %s: not made in this stage", a)
			}
			e.UID, e.GID = uid, gid
		}
	case "chmod":
		if len(args) < 2 {
			return fmt.Errorf("chmod: want MODE PATH…")
		}
		m, err := strconv.ParseInt(args[0], 8, 64)
		if err != nil || m > 0o7777 {
			return fmt.Errorf("chmod %s: an octal mode is interpreted", args[0])
		}
		for _, a := range args[1:] {
			e, ok := files[resolve(cwd, a)]
			if !ok {
				return fmt.Errorf("chmod %s: not made in this stage", a)
			}
			e.Mode = m
		}
	case "go":
		switch {
		case len(args) == 2 && args[0] == "mod" && args[1] == "download":
			// Fills the module cache; the build below does the same.
		case len(args) > 0 && args[0] == "build":
			if contextAt == "" || !strings.HasPrefix(cwd+"/", contextAt+"/") {
				return fmt.Errorf("go build outside the build context (COPY . DIR, then WORKDIR in it)")
			}
			b := &goBuild{env: append(slices.Clone(stageEnv), assign...), dir: strings.TrimPrefix(strings.TrimPrefix(cwd, contextAt), "/")}
			out := ""
			for i := 1; i < len(args); i++ {
				switch a := args[i]; {
				case a == "-o" && i+1 < len(args):
					out, i = resolve(cwd, args[i+1]), i+1
				case strings.HasPrefix(a, "-o="):
					out = resolve(cwd, strings.TrimPrefix(a, "-o="))
				default:
					b.args = append(b.args, a)
				}
			}
			if out == "" || strings.HasSuffix(out, "/") {
				return fmt.Errorf("go build: want -o FILE")
			}
			files[out] = &Entry{Mode: 0o755, Build: b}
		default:
			return fmt.Errorf("go %s: not interpreted", strings.Join(args, " "))
		}
	default:
		return fmt.Errorf("%s: a command the image builder does not interpret", name)
	}
	return nil
}

// sortedPaths returns the layer's paths, parents before children.
func (p *Plan) sortedPaths() []string {
	return slices.Sorted(maps.Keys(p.Files))
}
