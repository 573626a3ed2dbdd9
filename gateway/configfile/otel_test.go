package configfile_test

import (
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/gateway/configfile"
)

func TestConfigOtel(t *testing.T) {
	t.Parallel()
	const base = "upstreams:\n  api: http://127.0.0.1:3000\n"
	for _, c := range []struct {
		src  string
		want bool
	}{{"", false}, {"otel: true\n", true}, {"otel: false\n", false}} {
		if f := mustParse(t, base+c.src, configfile.Options{}); f.Otel != c.want {
			t.Errorf("%q: Otel %v, want %v", c.src, f.Otel, c.want)
		}
	}
	_, err := parse(base+"otel: yes please\n", configfile.Options{})
	if err == nil || !strings.Contains(err.Error(), "otel") || !strings.Contains(err.Error(), "true or false") {
		t.Errorf("otel: yes please: %v, want an error naming otel and true or false", err)
	}
}
