package main

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/internal/otelsetup"
)

// otelHelp is the --otel flag's entry in retrysafe gateway --help.
const otelHelp = "trace requests with OpenTelemetry, exported over OTLP/HTTP to OTEL_EXPORTER_OTLP_ENDPOINT (default http://localhost:4318; OTEL_SERVICE_NAME, default " +
	otelsetup.DefaultServiceName + "). Also on when OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set; OTEL_SDK_DISABLED=true turns it off. Spans hold a hash of the key, never the key, bodies or header values"

// startTracing turns the gateway's tracing on when --otel (on) or the environment asks
// for it, giving cfg its TracerProvider. The returned stop exports the spans still
// queued, within otelsetup.DefaultShutdownTimeout: call it once the gateway has
// stopped, so that the last requests' spans are not lost. Export failures are logged
// as warnings.
func startTracing(ctx context.Context, on bool, cfg *gateway.Config, logger *slog.Logger) (stop func(), err error) {
	p, err := otelsetup.Start(ctx, otelsetup.Config{Enabled: on, ServiceVersion: version()})
	if err != nil {
		return nil, err
	}
	tp := p.TracerProvider()
	if tp == nil {
		return func() {}, nil
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		logger.Warn("otel: exporting spans failed", "err", oneLine(err))
	}))
	cfg.TracerProvider = tp
	logger.Info("tracing with OpenTelemetry")
	return func() {
		if err := p.Shutdown(context.WithoutCancel(ctx)); err != nil {
			logger.Warn("otel: the last spans were not all exported", "err", oneLine(err))
		}
	}, nil
}
