package otelsetup_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/otlprecv"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/internal/otelsetup"
)

func TestEnabled(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		flag bool
		env  map[string]string
		want bool
	}{
		{"nothing", false, nil, false},
		{"flag", true, nil, true},
		{"endpoint", false, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, true},
		{"traces endpoint", false, map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, true},
		{"disabled beats flag", true, map[string]string{"OTEL_SDK_DISABLED": "true"}, false},
		{"disabled beats endpoint", false, map[string]string{"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false},
		{"disabled false", true, map[string]string{"OTEL_SDK_DISABLED": "false"}, true},
	} {
		cfg := otelsetup.Config{Enabled: c.flag, Getenv: func(k string) string { return c.env[k] }}
		if got := cfg.On(); got != c.want {
			t.Errorf("%s: On() = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestOffIsNil(t *testing.T) {
	t.Parallel()
	p, err := otelsetup.Start(context.Background(), otelsetup.Config{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	if p.TracerProvider() != nil {
		t.Error("tracing off, yet a TracerProvider")
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Error(err)
	}
}

// TestExportsOnShutdown: the spans queued in the batch processor reach the collector
// when the provider shuts down, with the service name of the environment, or the
// default.
func TestExportsOnShutdown(t *testing.T) {
	for _, c := range []struct{ name, envName, want string }{
		{"default name", "", otelsetup.DefaultServiceName},
		{"OTEL_SERVICE_NAME", "payments-edge", "payments-edge"},
	} {
		t.Run(c.name, func(t *testing.T) {
			recv := otlprecv.Start(t)
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", recv.URL)
			t.Setenv("OTEL_SERVICE_NAME", c.envName)
			t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "600000") // only the shutdown exports
			p, err := otelsetup.Start(context.Background(), otelsetup.Config{ServiceVersion: "v9"})
			if err != nil {
				t.Fatal(err)
			}
			_, span := p.TracerProvider().Tracer("test").Start(context.Background(), "last span")
			span.End()
			if n := len(recv.Spans()); n != 0 {
				t.Fatalf("%d spans exported before shutdown", n)
			}
			if err := p.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, 5*time.Second, func() bool { return len(recv.Spans()) == 1 }, "the span at the receiver")
			s := recv.Spans()[0]
			if s.Name != "last span" || s.Resource["service.name"] != c.want || s.Resource["service.version"] != "v9" {
				t.Errorf("received %q from %v, want \"last span\" from %s v9", s.Name, s.Resource, c.want)
			}
		})
	}
}

// TestShutdownTimeout: a collector that does not answer does not hold the exit
// longer than the shutdown timeout.
func TestShutdownTimeout(t *testing.T) {
	hung := make(chan struct{})
	stuck := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-hung }))
	t.Cleanup(stuck.Close)
	t.Cleanup(func() { close(hung) })
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", stuck.URL)
	p, err := otelsetup.Start(context.Background(), otelsetup.Config{ShutdownTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	_, span := p.TracerProvider().Tracer("test").Start(context.Background(), "lost")
	span.End()
	start := time.Now()
	err = p.Shutdown(context.Background())
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Shutdown took %v with a 300ms timeout", took)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown: %v, want the timeout", err)
	}
}
