package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"

	"github.com/retrysafe/retrysafe/gateway/configfile"
	"github.com/retrysafe/retrysafe/internal/tlsreload"
)

// listenerCerts are the certificate pairs the gateway's listeners serve HTTPS with;
// nil for a listener that serves plain HTTP. The admin listener shares the proxy's
// pair unless it has its own.
type listenerCerts struct {
	proxy, admin *tlsreload.Pair
}

// loadListenerCerts checks the pairs the setup names (both files of each, or neither;
// the admin listener's own only when there is one, adminOn) and reads them, each
// logging its certificate on logger. Its errors name the flag or key and the file.
func loadListenerCerts(s gatewaySetup, adminOn bool, logger *slog.Logger) (listenerCerts, error) {
	var c listenerCerts
	if err := halfPair("--tls-cert", "--tls-key", s.tls); err != nil {
		return c, err
	}
	if err := halfPair("--admin-tls-cert", "--admin-tls-key", s.adminTLS); err != nil {
		return c, err
	}
	ownAdmin := s.adminTLS != configfile.TLSFiles{}
	if ownAdmin && !adminOn {
		return c, errors.New("--admin-tls-cert and --admin-tls-key (admin_tls) are for the admin listener, which --admin off leaves out")
	}
	var err error
	if s.tls.Cert != "" {
		listeners := []string{"proxy"}
		if adminOn && !ownAdmin {
			listeners = append(listeners, "admin")
		}
		if c.proxy, err = loadPair(s.tls, listeners, logger); err != nil {
			return c, err
		}
		if adminOn && !ownAdmin {
			c.admin = c.proxy
		}
	}
	if ownAdmin {
		if c.admin, err = loadPair(s.adminTLS, []string{"admin"}, logger); err != nil {
			return c, err
		}
	}
	return c, nil
}

// halfPair reports a certificate without its key, or a key without its certificate.
func halfPair(certFlag, keyFlag string, t configfile.TLSFiles) error {
	switch {
	case t.Cert != "" && t.Key == "":
		return fmt.Errorf("%s needs %s: give both (the certificate's file and its private key's), or neither", certFlag, keyFlag)
	case t.Cert == "" && t.Key != "":
		return fmt.Errorf("%s needs %s: give both (the certificate's file and its private key's), or neither", keyFlag, certFlag)
	}
	return nil
}

// loadPair loads t, served on the listeners named (proxy, admin or both), whose
// names its log lines and its error carry.
func loadPair(t configfile.TLSFiles, listeners []string, logger *slog.Logger) (*tlsreload.Pair, error) {
	p, err := tlsreload.Load(t.Cert, t.Key, tlsreload.Options{Logger: logger.With("listener", strings.Join(listeners, ", "))})
	if err != nil {
		what := "the " + listeners[0] + " listener"
		if len(listeners) == 2 {
			what = "the " + listeners[0] + " and " + listeners[1] + " listeners"
		}
		return nil, fmt.Errorf("TLS of %s: %w", what, err)
	}
	return p, nil
}

// pairs returns the distinct pairs, those SIGHUP reads again.
func (c listenerCerts) pairs() []*tlsreload.Pair {
	var out []*tlsreload.Pair
	for _, p := range []*tlsreload.Pair{c.proxy, c.admin} {
		if p != nil && (len(out) == 0 || out[0] != p) {
			out = append(out, p)
		}
	}
	return out
}

// reload reads each pair again; each logs what came of it, and a pair that does not
// load leaves the one served.
func (c listenerCerts) reload() {
	for _, p := range c.pairs() {
		_ = p.Reload() // logged by Reload: its line names the file and the reason
	}
}

// serveTLS returns ln, or a TLS listener over it serving p when p is not nil.
func serveTLS(ln net.Listener, p *tlsreload.Pair) net.Listener {
	if ln == nil || p == nil {
		return ln
	}
	return tls.NewListener(ln, p.ServerConfig())
}

// describe names the listeners that serve HTTPS, for the start-up line; "" for none.
func (c listenerCerts) describe() string {
	var on []string
	if c.proxy != nil {
		on = append(on, "proxy")
	}
	if c.admin != nil {
		on = append(on, "admin")
	}
	return strings.Join(on, ", ")
}
