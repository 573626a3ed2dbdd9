// Package httpname checks the names HTTP gives things: header field names and methods,
// which RFC 9110 makes tokens. It is the one such check of the module, so that the
// middleware, the gateway and the endpoint battery agree on what a name is.
package httpname

// Valid reports whether s is an RFC 9110 token: one or more of the letters, digits and
// !#$%&'*+-.^_`|~. Header names and methods are tokens.
func Valid(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !tokenChar(s[i]) {
			return false
		}
	}
	return true
}

func tokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}
