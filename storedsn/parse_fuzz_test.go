package storedsn

import (
	"errors"
	"net/url"
	"strings"
	"testing"
)

// shift maps each letter and digit to another of its class (hexadecimal letters among
// themselves, so that a percent escape stays valid or invalid) and leaves every other
// byte alone: a DSN with a shifted password has the same structure as the original.
func shift(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case c >= '0' && c <= '9':
			b[i] = '0' + (c-'0'+1)%10
		case c >= 'a' && c <= 'f':
			b[i] = 'a' + (c-'a'+1)%6
		case c >= 'A' && c <= 'F':
			b[i] = 'A' + (c-'A'+1)%6
		case c >= 'g' && c <= 'z':
			b[i] = 'g' + (c-'g'+1)%20
		case c >= 'G' && c <= 'Z':
			b[i] = 'G' + (c-'G'+1)%20
		}
	}
	return string(b)
}

// secret is a password found in a DSN, and the same DSN with that password shifted once
// and twice.
type secret struct {
	value string
	dsn   func(shifts int) string
}

// secrets returns the passwords dsn holds: in a URL with a host part, the password of
// its user info and the values of its query parameters whose name holds "password"; in a
// string url.Parse rejects, what lies between "scheme://user:" and the last "@"; and in
// what is no such URL, the values of password keywords (password=…, sslpassword=… at the
// start of the string or after one of " \t&?;#", up to one of " \t&#", as in
// PostgreSQL's keyword/value form).
func secrets(dsn string) []secret {
	t := strings.TrimSpace(dsn)
	var out []secret
	add := func(v string, dsn func(pw string) string) {
		if v != "" {
			out = append(out, secret{v, func(n int) string {
				pw := v
				for range n {
					pw = shift(pw)
				}
				return dsn(pw)
			}})
		}
	}
	u, err := url.Parse(t)
	isURL := err == nil && u.Scheme != "" && u.Opaque == "" && strings.HasPrefix(t[len(u.Scheme)+1:], "//")
	if isURL {
		if pw, ok := u.User.Password(); ok {
			add(pw, func(pw string) string {
				u2 := *u
				u2.User = url.UserPassword(u.User.Username(), pw)
				return u2.String()
			})
		}
		for k, vs := range u.Query() {
			if !strings.Contains(strings.ToLower(k), "password") {
				continue
			}
			for i, v := range vs {
				add(v, func(pw string) string {
					q := u.Query()
					q[k][i] = pw
					u2 := *u
					u2.RawQuery = q.Encode()
					return u2.String()
				})
			}
		}
	} else if i, at := strings.Index(t, "://"), strings.LastIndex(t, "@"); err != nil && i >= 0 && at > i+3 {
		if c := strings.IndexByte(t[i+3:at], ':'); c >= 0 {
			from := i + 3 + c + 1
			add(t[from:at], func(pw string) string { return t[:from] + pw + t[at:] })
		}
	}
	for i := 0; i < len(t) && !isURL; i++ {
		if i > 0 && !strings.ContainsRune(" \t&?;#", rune(t[i-1])) {
			continue
		}
		for _, kw := range []string{"password=", "sslpassword="} {
			if strings.HasPrefix(t[i:], kw) {
				from := i + len(kw)
				to := from + strings.IndexAny(t[from:]+"&", "& \t#")
				add(t[from:to], func(pw string) string { return t[:from] + pw + t[to:] })
			}
		}
	}
	return out
}

// exposed is what parse lets out of a DSN: its error, or the name Open logs.
func exposed(dsn string) string {
	sp, err := parse(dsn)
	if err != nil {
		return err.Error()
	}
	return sp.name
}

// leaked reports a piece of the password (four bytes) that the text exposed for the DSN
// holds while the texts exposed for the DSN with the password shifted once and twice
// hold the piece shifted as much: the text reproduces the password, as opposed to
// holding those bytes by chance (elsewhere in the DSN, or in a mask such as xxxxx).
func leaked(s secret, got string) (string, bool) {
	const piece = 4
	pw1, pw2 := shift(s.value), shift(shift(s.value))
	var got1, got2 string
	for i := 0; i+piece <= len(s.value); i++ {
		w, w1, w2 := s.value[i:i+piece], pw1[i:i+piece], pw2[i:i+piece]
		if w == w1 || !strings.Contains(got, w) {
			continue
		}
		if got1 == "" {
			got1, got2 = exposed(s.dsn(1)), exposed(s.dsn(2))
		}
		if strings.Contains(got1, w1) && strings.Contains(got2, w2) {
			return w, true
		}
	}
	return "", false
}

var kindSchemes = map[string][]string{
	KindSQLite:   {"sqlite", "sqlite3"},
	KindPostgres: {"postgres", "postgresql"},
	KindRedis:    {"redis", "rediss"},
	KindMemory:   {"memory", "mem"},
}

// FuzzParse: parse never panics; what parses has a known kind matching its scheme and a
// name on one line; what fails matches ErrUnknownScheme or ErrInvalid, on one line;
// surrounding white space changes nothing; and neither the error nor the name holds a
// password of the DSN, in whole or in part (an SQLite DSN is a path, with no password).
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"",
		"sqlite:retrysafe.db",
		"sqlite:///var/lib/rs.db?batch=false",
		"memory:",
		"mem://",
		"memory://u:hunter2secret@x",
		"postgres://u:hunter2secret@db.internal:5432/app?sslmode=disable&schema=rs&batch=false",
		"postgresql://u:hunter2secret@db/app?sslmode=bogus",
		"postgres://db/app?password=hunter2secret&pool_max_conns=4",
		"postgres://u:hunter2/secret@db/app",
		"postgres://u:hunter2%zzsecret@db/app",
		"postgres:host=db password=hunter2secret",
		"redis://:hunter2secret@cache:6379/0?prefix=rs:",
		"rediss://user:hunter2secret@cache/1?addr=cache2:6379&addr=cache3:6379",
		"redis://:hunter2secret@cache/0?nope=1",
		"mysql://u:hunter2secret@db/app",
		"retrysafe.db",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, dsn string) {
		sp, err := parse(dsn)
		got := exposed(dsn)
		if strings.ContainsAny(got, "\r\n") {
			t.Errorf("parse(%q) exposes more than one line: %q", dsn, got)
		}
		if err != nil {
			if !errors.Is(err, ErrUnknownScheme) && !errors.Is(err, ErrInvalid) {
				t.Errorf("parse(%q): %v matches neither ErrUnknownScheme nor ErrInvalid", dsn, err)
			}
		} else {
			scheme, _, _ := strings.Cut(strings.TrimSpace(dsn), ":")
			if strings.TrimSpace(dsn) == "" {
				scheme = "sqlite"
			}
			schemes, known := kindSchemes[sp.kind]
			found := false
			for _, s := range schemes {
				found = found || strings.EqualFold(s, scheme)
			}
			if !known || !found || sp.name == "" {
				t.Errorf("parse(%q) = kind %q, name %q: not the kind of scheme %q", dsn, sp.kind, sp.name, scheme)
			}
			if sp.kind == KindPostgres {
				for _, k := range []string{"schema", "batch"} {
					if _, ok := sp.pg.ConnConfig.RuntimeParams[k]; ok {
						t.Errorf("parse(%q): %s reaches PostgreSQL as a run-time parameter", dsn, k)
					}
				}
			}
		}
		if got2 := exposed(" \t" + dsn + "\n"); got2 != got {
			t.Errorf("parse(%q) exposes %q, with white space around %q", dsn, got, got2)
		}
		scheme, _, _ := strings.Cut(strings.TrimSpace(dsn), ":")
		if s := strings.ToLower(scheme); s == "sqlite" || s == "sqlite3" {
			return // a path, with no password in it
		}
		for _, s := range secrets(dsn) {
			if piece, ok := leaked(s, got); ok {
				t.Errorf("parse(%q) exposes %q of the password %q: %s", dsn, piece, s.value, got)
			}
		}
	})
}
