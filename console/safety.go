package console

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"net/url"
	"strings"
)

// contentSecurityPolicy allows the console's own stylesheet and script and nothing
// else: no inline script or style, no other origin, no framing, forms posting only
// back to the console.
const contentSecurityPolicy = "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// sessionCookie holds a MAC of the admin token under the process's secret, never the
// token itself: it proves the token was given to the login form of this process.
const sessionCookie = "retrysafe_console"

// csrfField is the form field of the CSRF token.
const csrfField = "csrf"

func (c *Console) mac(parts ...string) string {
	m := hmac.New(sha256.New, c.secret)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return hex.EncodeToString(m.Sum(nil))
}

// sessionValue is the session cookie's value for the configured token.
func (c *Console) sessionValue() string { return c.mac("session", c.opt.AdminToken) }

// authorized reports whether r may use the console: no token is set, or r carries it
// as a bearer token, or r has the session cookie; each compared in constant time.
func (c *Console) authorized(r *http.Request) bool {
	if c.opt.AdminToken == "" {
		return true
	}
	if got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return subtle.ConstantTimeCompare([]byte(got), []byte(c.opt.AdminToken)) == 1
	}
	if ck, err := r.Cookie(sessionCookie); err == nil {
		return subtle.ConstantTimeCompare([]byte(ck.Value), []byte(c.sessionValue())) == 1
	}
	return false
}

// unauthorized answers a request without the token: the login form for a browser's
// page load, a bare 401 otherwise.
func (c *Console) unauthorized(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="retrysafe console"`)
	if r.Method == http.MethodGet {
		p := c.newPage(r, "", "Log in", map[string]string{"Next": safeNext(r.URL.RequestURI())})
		c.render(w, r, http.StatusUnauthorized, "login", p)
		return
	}
	http.Error(w, "the admin token is required", http.StatusUnauthorized)
}

// csrfToken is the token every form of a state-changing action carries: a MAC, under
// the process's secret, of the session (so a token seen by one session is useless to
// another once a token is set).
func (c *Console) csrfToken(r *http.Request) string {
	session := ""
	if c.opt.AdminToken != "" {
		session = c.sessionValue()
	}
	return c.mac("csrf", session)
}

// sameOrigin checks the browser's own statements about where a POST comes from, when
// it makes them: Sec-Fetch-Site must be same-origin (or none: typed by the user), and
// Origin must be this host.
func sameOrigin(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
	default:
		return false
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	return strings.EqualFold(u.Host, r.Host)
}

// action wraps the handler of a state-changing POST: refused with 403 in read-only
// mode, from another origin, or without the CSRF token.
func (c *Console) action(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if c.opt.ReadOnly {
			c.fail(w, r, http.StatusForbidden, "This console is read-only: it evicts, replays and purges nothing.")
			return
		}
		if !sameOrigin(r) {
			c.fail(w, r, http.StatusForbidden, "Refused: the request comes from another site.")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
		if err := r.ParseForm(); err != nil {
			c.fail(w, r, http.StatusBadRequest, "Unreadable form: "+err.Error())
			return
		}
		if subtle.ConstantTimeCompare([]byte(r.PostForm.Get(csrfField)), []byte(c.csrfToken(r))) != 1 {
			c.fail(w, r, http.StatusForbidden, "Refused: the form's CSRF token is missing or stale. Reload the page and try again.")
			return
		}
		h(w, r)
	}
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	if c.opt.AdminToken == "" || c.authorized(r) {
		http.Redirect(w, r, "/keys", http.StatusSeeOther)
		return
	}
	p := c.newPage(r, "", "Log in", map[string]string{"Next": safeNext(r.URL.Query().Get("next"))})
	c.render(w, r, http.StatusOK, "login", p)
}

// login checks the token of the login form and sets the session cookie.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if c.opt.AdminToken == "" {
		http.Redirect(w, r, "/keys", http.StatusSeeOther)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if !sameOrigin(r) || r.ParseForm() != nil {
		c.fail(w, r, http.StatusForbidden, "Refused: the request comes from another site.")
		return
	}
	next := safeNext(r.PostForm.Get("next"))
	if subtle.ConstantTimeCompare([]byte(r.PostForm.Get("token")), []byte(c.opt.AdminToken)) != 1 {
		c.log.Warn("console: login refused: wrong admin token", "remote", r.RemoteAddr)
		p := c.newPage(r, "", "Log in", map[string]string{"Next": next})
		p.Error = "Wrong token."
		c.render(w, r, http.StatusUnauthorized, "login", p)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: c.sessionValue(), Path: "/",
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// logout clears the session cookie. It changes nothing but the caller's own session,
// yet it is still refused from another site, so that no page can log an operator out.
func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	if !sameOrigin(r) {
		c.fail(w, r, http.StatusForbidden, "Refused: the request comes from another site.")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// safeNext keeps a redirect target on this console: a path, never another host.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") ||
		strings.HasPrefix(next, "/login") {
		return "/keys"
	}
	return next
}
