// Package otelsetup builds the OpenTelemetry TracerProvider of the retrysafe binary:
// the SDK's, exporting OTLP over HTTP through a batch span processor, configured by the
// standard OTEL_ environment variables.
//
// Tracing is on when the caller asks for it (Config.Enabled, the --otel flag) or when
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set: someone who
// points the process at a collector wants its spans. OTEL_SDK_DISABLED=true turns it off
// whatever else says. Everything else is the SDK's and the exporter's own reading of the
// environment: the endpoint (default http://localhost:4318, path /v1/traces), headers,
// timeout and compression (OTEL_EXPORTER_OTLP_*), the sampler (OTEL_TRACES_SAMPLER,
// default parent-based always-on), the batch processor (OTEL_BSP_*), and the resource
// (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES).
package otelsetup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Config says whether and how to trace. Its zero value traces only when the environment
// says so, as the service DefaultServiceName.
type Config struct {
	// Enabled turns tracing on without an endpoint in the environment (the exporter's
	// default is then http://localhost:4318). Default false.
	Enabled bool
	// ServiceName is the service.name of the spans when OTEL_SERVICE_NAME is unset.
	// Default DefaultServiceName.
	ServiceName string
	// ServiceVersion, when set, is the service.version of the spans.
	ServiceVersion string
	// ShutdownTimeout bounds Provider.Shutdown's flush of the last spans, for a caller
	// whose context has no deadline. Default DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// Getenv reads the environment. Default os.Getenv. The exporter and the SDK read
	// their own variables from the process's environment.
	Getenv func(string) string
}

// Defaults of Config.
const (
	DefaultServiceName     = "retrysafe-gateway"
	DefaultShutdownTimeout = 5 * time.Second
)

// On reports whether cfg and the environment turn tracing on.
func (cfg Config) On() bool {
	getenv := cfg.getenv()
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	return cfg.Enabled || getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

func (cfg Config) getenv() func(string) string {
	if cfg.Getenv != nil {
		return cfg.Getenv
	}
	return os.Getenv
}

// Provider is the process's tracing, or its absence.
type Provider struct {
	sdk     *sdktrace.TracerProvider // nil: tracing is off
	timeout time.Duration
}

// Start returns the Provider that cfg and the environment ask for. Off, its
// TracerProvider is nil and Shutdown does nothing. The exporter connects lazily: an
// unreachable collector is not an error here, and its failures to export later are
// reported to OpenTelemetry's error handler (otel.SetErrorHandler).
func Start(ctx context.Context, cfg Config) (*Provider, error) {
	p := &Provider{timeout: cfg.ShutdownTimeout}
	if p.timeout <= 0 {
		p.timeout = DefaultShutdownTimeout
	}
	if !cfg.On() {
		return p, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("otel: the OTLP exporter: %w", err)
	}
	name := cfg.ServiceName
	if name == "" {
		name = DefaultServiceName
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", name)}
	if cfg.ServiceVersion != "" {
		attrs = append(attrs, attribute.String("service.version", cfg.ServiceVersion))
	}
	// Later detectors win: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES over the
	// defaults above.
	res, err := resource.New(ctx, resource.WithTelemetrySDK(), resource.WithAttributes(attrs...), resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("otel: the resource: %w", err)
	}
	p.sdk = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return p, nil
}

// TracerProvider returns the provider to trace with, or nil when tracing is off (nil
// is what gateway.Config.TracerProvider takes for "no tracing").
func (p *Provider) TracerProvider() trace.TracerProvider {
	if p == nil || p.sdk == nil {
		return nil
	}
	return p.sdk
}

// Shutdown exports the spans still queued and stops the exporter, within ctx and at
// most Config.ShutdownTimeout: the spans of the last requests are not lost when the
// process exits. Off, it does nothing.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil || p.sdk == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.timeout)
	defer cancel()
	if err := p.sdk.Shutdown(ctx); err != nil {
		return fmt.Errorf("otel: flushing the last spans: %w", err)
	}
	return nil
}
