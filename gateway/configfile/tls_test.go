package configfile_test

import (
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/gateway/configfile"
)

func TestConfigTLS(t *testing.T) {
	t.Parallel()
	const base = "upstreams:\n  api: http://127.0.0.1:3000\n"
	for _, c := range []struct {
		src           string
		tls, adminTLS configfile.TLSFiles
		overrides     []configfile.Override
	}{
		{src: ""},
		{src: "tls: {}\n"},
		{src: "tls: {cert: /etc/gw/tls.crt, key: /etc/gw/tls.key}\n", tls: configfile.TLSFiles{Cert: "/etc/gw/tls.crt", Key: "/etc/gw/tls.key"}},
		{src: "tls:\n  cert: a.crt\n  key: a.key\nadmin_tls:\n  cert: b.crt\n  key: b.key\n",
			tls: configfile.TLSFiles{Cert: "a.crt", Key: "a.key"}, adminTLS: configfile.TLSFiles{Cert: "b.crt", Key: "b.key"}},
		// The flags override the file's keys one by one.
		{src: "tls: {cert: a.crt, key: a.key}\n", tls: configfile.TLSFiles{Cert: "c.crt", Key: "a.key"},
			overrides: []configfile.Override{{Key: "tls.cert", Value: "c.crt", Source: "--tls-cert"}}},
		{src: "", adminTLS: configfile.TLSFiles{Cert: "c.crt", Key: "c.key"},
			overrides: []configfile.Override{{Key: "admin_tls.cert", Value: "c.crt", Source: "--admin-tls-cert"}, {Key: "admin_tls.key", Value: "c.key", Source: "--admin-tls-key"}}},
	} {
		f := mustParse(t, base+c.src, configfile.Options{Overrides: c.overrides})
		if f.TLS != c.tls || f.AdminTLS != c.adminTLS {
			t.Errorf("%q %v: TLS %+v AdminTLS %+v, want %+v %+v", c.src, c.overrides, f.TLS, f.AdminTLS, c.tls, c.adminTLS)
		}
	}
	for _, c := range []struct {
		src       string
		overrides []configfile.Override
		want      string // the only error, whole
	}{
		{"tls: {cert: a.crt}\n", nil, "gw.yaml:3: tls: want both cert and key (the certificate's file and its private key's), or neither"},
		{"admin_tls:\n  key: a.key\n", nil, "gw.yaml:3: admin_tls: want both cert and key (the certificate's file and its private key's), or neither"},
		{"tls: {cert: a.crt, key: ''}\n", nil, "gw.yaml:3: tls.key: is empty: want a file name"},
		{"tls: {cert: a.crt, key: [a]}\n", nil, "gw.yaml:3: tls.key: want a string, not a list"},
		{"tls: {cert: a.crt, kye: a.key}\n", nil, `gw.yaml:3: unknown field "kye" in tls (did you mean key?)`},
		{"tls: a.crt\n", nil, `gw.yaml:3: tls: want a mapping of keys, not "a.crt"`},
		{"", []configfile.Override{{Key: "tls.cert", Value: "c.crt", Source: "--tls-cert"}},
			"--tls-cert: tls: want both cert and key (the certificate's file and its private key's), or neither"},
	} {
		_, err := parse(base+c.src, configfile.Options{Overrides: c.overrides})
		if errs := errorsOf(t, err); len(errs) != 1 || errs[0].Error() != c.want {
			t.Errorf("%q %v:\n%v\nwant only %s", c.src, c.overrides, err, c.want)
		}
	}
	if _, err := parse(base+"tls: {cert: a.crt}\nadmin_tls: {key: b.key}\n", configfile.Options{}); err == nil ||
		!strings.Contains(err.Error(), "gw.yaml:3: tls:") || !strings.Contains(err.Error(), "gw.yaml:4: admin_tls:") {
		t.Errorf("two half pairs: %v", err)
	}
}
