package image

import (
	"encoding/json"
	"fmt"
	"strings"
)

// instruction is one instruction of a Dockerfile, its continuation lines joined.
type instruction struct {
	line  int               // where it starts, 1-based
	cmd   string            // upper case: FROM, RUN, COPY, …
	flags map[string]string // leading --name=value flags (FROM, COPY)
	rest  string            // what follows the command and its flags
}

func (in instruction) String() string { return fmt.Sprintf("line %d: %s", in.line, in.cmd) }

// errorf returns an error that names the instruction's line.
func (in instruction) errorf(format string, args ...any) error {
	return fmt.Errorf("Dockerfile line %d: %s: %s", in.line, in.cmd, fmt.Sprintf(format, args...))
}

// parseDockerfile splits a Dockerfile into instructions: comment lines are dropped,
// lines ending in a backslash are joined with the next. The escape character is the
// backslash; a file that changes it (# escape=`) is refused.
func parseDockerfile(src string) ([]instruction, error) {
	var (
		out     []instruction
		buf     strings.Builder
		start   int
		inBlock bool // continuation lines pending
		header  = true
	)
	lines := strings.Split(strings.ReplaceAll(src, "\r\n", "\n"), "\n")
	for i, raw := range lines {
		trimmed := strings.TrimSpace(raw)
		if strings.HasPrefix(trimmed, "#") {
			if header {
				d := strings.ToLower(strings.ReplaceAll(strings.TrimSpace(trimmed[1:]), " ", ""))
				if strings.HasPrefix(d, "escape=") && d != `escape=\` {
					return nil, fmt.Errorf("Dockerfile line %d: parser directive %q: only the backslash escape is interpreted", i+1, trimmed)
				}
			}
			continue // a comment, also between continuation lines
		}
		header = false
		if trimmed == "" {
			continue
		}
		if !inBlock {
			start = i + 1
			buf.Reset()
		}
		body := strings.TrimRight(raw, " \t")
		if strings.HasSuffix(body, `\`) {
			buf.WriteString(strings.TrimSuffix(body, `\`))
			inBlock = true
			continue
		}
		buf.WriteString(body)
		inBlock = false
		in, err := parseInstruction(start, buf.String())
		if err != nil {
			return nil, err
		}
		out = append(out, in)
	}
	if inBlock {
		return nil, fmt.Errorf("Dockerfile line %d: the file ends inside a continued line", start)
	}
	return out, nil
}

func parseInstruction(line int, s string) (instruction, error) {
	s = strings.TrimSpace(s)
	cmd, rest, _ := strings.Cut(s, " ")
	if i := strings.IndexByte(cmd, '\t'); i >= 0 {
		cmd, rest = s[:i], s[i+1:]
	}
	in := instruction{line: line, cmd: strings.ToUpper(cmd), flags: map[string]string{}}
	rest = strings.TrimSpace(rest)
	if in.cmd == "FROM" || in.cmd == "COPY" || in.cmd == "ADD" || in.cmd == "RUN" {
		for strings.HasPrefix(rest, "--") {
			word, after, _ := strings.Cut(rest, " ")
			name, value, ok := strings.Cut(strings.TrimPrefix(word, "--"), "=")
			if !ok {
				return in, in.errorf("flag %q: want --name=value", word)
			}
			in.flags[name] = value
			rest = strings.TrimSpace(after)
		}
	}
	in.rest = rest
	return in, nil
}

// execForm reads the JSON array form of ENTRYPOINT, CMD or VOLUME; ok is false when
// rest is not one.
func execForm(rest string) (args []string, ok bool) {
	if !strings.HasPrefix(rest, "[") {
		return nil, false
	}
	if err := json.Unmarshal([]byte(rest), &args); err != nil {
		return nil, false
	}
	return args, true
}

// lookupFunc returns the value of a variable that a Dockerfile may expand, and whether
// it is declared.
type lookupFunc func(name string) (string, bool)

// word is one word of a split line; op is true for an unquoted "&&".
type word struct {
	text string
	op   bool
}

// splitWords splits s into words as a POSIX shell would for the subset the builder
// interprets: single and double quotes, backslash escapes, $NAME and ${NAME}
// expansion (not inside single quotes), and && between commands. Anything else the
// shell would interpret (; | < > & ` $( ${NAME:-…} and the like) is refused, as is a
// variable not declared: the builder must not guess what a shell would do.
func splitWords(s string, lookup lookupFunc) ([]word, error) {
	var (
		out    []word
		cur    strings.Builder
		inWord bool
	)
	flush := func() {
		if inWord {
			out = append(out, word{text: cur.String()})
		}
		cur.Reset()
		inWord = false
	}
	expand := func(i int) (int, error) { // s[i] == '$'
		j := i + 1
		var name string
		switch {
		case j < len(s) && s[j] == '{':
			end := strings.IndexByte(s[j:], '}')
			if end < 0 {
				return 0, fmt.Errorf("unclosed ${ in %q", s)
			}
			name = s[j+1 : j+end]
			j += end + 1
		default:
			k := j
			for k < len(s) && (s[k] == '_' || s[k] >= 'A' && s[k] <= 'Z' || s[k] >= 'a' && s[k] <= 'z' || k > j && s[k] >= '0' && s[k] <= '9') {
				k++
			}
			if k == j {
				return 0, fmt.Errorf("a lone $ or $%c in %q: not interpreted", s[j:][0], s)
			}
			name, j = s[j:k], k
		}
		if !validName(name) {
			return 0, fmt.Errorf("${%s} in %q: only plain ${NAME} is interpreted", name, s)
		}
		v, ok := lookup(name)
		if !ok {
			return 0, fmt.Errorf("$%s in %q is not declared (ARG or ENV)", name, s)
		}
		cur.WriteString(v)
		return j, nil
	}
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n':
			flush()
			i++
		case c == '&' && i+1 < len(s) && s[i+1] == '&':
			flush()
			out = append(out, word{text: "&&", op: true})
			i += 2
		case strings.IndexByte(";|<>&`()*?[]~!#", c) >= 0:
			return nil, fmt.Errorf("%q in %q: shell syntax the image builder does not interpret", c, s)
		case c == '\\':
			if i+1 >= len(s) {
				return nil, fmt.Errorf("a trailing backslash in %q", s)
			}
			cur.WriteByte(s[i+1])
			inWord = true
			i += 2
		case c == '\'':
			end := strings.IndexByte(s[i+1:], '\'')
			if end < 0 {
				return nil, fmt.Errorf("unclosed ' in %q", s)
			}
			cur.WriteString(s[i+1 : i+1+end])
			inWord = true
			i += end + 2
		case c == '"':
			inWord = true
			i++
			for {
				if i >= len(s) {
					return nil, fmt.Errorf("unclosed \" in %q", s)
				}
				c := s[i]
				if c == '"' {
					i++
					break
				}
				switch {
				case c == '\\' && i+1 < len(s) && strings.IndexByte(`"\$`+"`", s[i+1]) >= 0:
					cur.WriteByte(s[i+1])
					i += 2
				case c == '`':
					return nil, fmt.Errorf("` in %q: shell syntax the image builder does not interpret", s)
				case c == '$':
					if i+1 < len(s) && s[i+1] == '(' {
						return nil, fmt.Errorf("$( in %q: shell syntax the image builder does not interpret", s)
					}
					j, err := expand(i)
					if err != nil {
						return nil, err
					}
					i = j
				default:
					cur.WriteByte(c)
					i++
				}
			}
		case c == '$':
			if i+1 < len(s) && s[i+1] == '(' {
				return nil, fmt.Errorf("$( in %q: shell syntax the image builder does not interpret", s)
			}
			j, err := expand(i)
			if err != nil {
				return nil, err
			}
			inWord = true
			i = j
		default:
			cur.WriteByte(c)
			inWord = true
			i++
		}
	}
	flush()
	return out, nil
}

func validName(name string) bool {
	if name == "" {
		return false
	}
	for i, c := range name {
		if c != '_' && !(c >= 'A' && c <= 'Z') && !(c >= 'a' && c <= 'z') && !(i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// words splits s (see splitWords) into plain words, refusing &&.
func words(s string, lookup lookupFunc) ([]string, error) {
	ws, err := splitWords(s, lookup)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(ws))
	for i, w := range ws {
		if w.op {
			return nil, fmt.Errorf("&& in %q", s)
		}
		out[i] = w.text
	}
	return out, nil
}

// keyValues reads the NAME=VALUE pairs of ENV, LABEL and ARG, and the older one-pair
// form of ENV (ENV NAME VALUE) when legacy is true.
func keyValues(s string, lookup lookupFunc, legacy bool) ([][2]string, error) {
	ws, err := words(s, lookup)
	if err != nil {
		return nil, err
	}
	if len(ws) == 0 {
		return nil, fmt.Errorf("no NAME=VALUE")
	}
	if legacy && !strings.Contains(ws[0], "=") {
		name, value, _ := strings.Cut(strings.TrimSpace(s), " ")
		v, err := words(value, lookup)
		if err != nil {
			return nil, err
		}
		return [][2]string{{name, strings.Join(v, " ")}}, nil
	}
	var out [][2]string
	for _, w := range ws {
		k, v, ok := strings.Cut(w, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q: want NAME=VALUE", w)
		}
		out = append(out, [2]string{k, v})
	}
	return out, nil
}
