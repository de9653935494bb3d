package app

import (
	"context"
	"os"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"

	"github.com/idemkit/dedupworker/consumer/tracing"
)

// TracingEnabled reports whether the environment asks for traces:
// OTEL_TRACES_EXPORTER=otlp, or an OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; OTEL_TRACES_EXPORTER=none turns it
// off.
func TracingEnabled() bool {
	switch strings.ToLower(os.Getenv("OTEL_TRACES_EXPORTER")) {
	case "none":
		return false
	case "otlp":
		return true
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// TracerFromEnv returns a Tracer exporting over OTLP/HTTP as the OTEL_*
// variables say (the exporter reads its headers, timeout and TLS from them
// too), and the function that flushes and stops it; nil and a no-op when
// tracing is off. The binary's SDK and exporter live here, so that the
// tracing package needs only the OpenTelemetry API.
func TracerFromEnv(ctx context.Context, version string) (*tracing.Tracer, func(context.Context) error, error) {
	if !TracingEnabled() {
		return nil, func(context.Context) error { return nil }, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, err
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		semconv.ServiceName(serviceName()), semconv.ServiceVersion(version)))
	if err != nil {
		res = resource.Default()
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return tracing.New(tp), tp.Shutdown, nil
}

func serviceName() string {
	if s := os.Getenv("OTEL_SERVICE_NAME"); s != "" {
		return s
	}
	return "dedupworker"
}
