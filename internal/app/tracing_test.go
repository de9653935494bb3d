package app

import (
	"context"
	"testing"
)

func TestTracingFollowsOTELEnvironment(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	if TracingEnabled() {
		t.Fatal("tracing must be off by default")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
	if !TracingEnabled() {
		t.Fatal("an OTLP endpoint turns tracing on")
	}
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	if TracingEnabled() {
		t.Fatal("OTEL_TRACES_EXPORTER=none turns it off")
	}
	tr, stop, err := TracerFromEnv(context.Background(), "test")
	if err != nil || tr != nil || stop(context.Background()) != nil {
		t.Fatalf("off: tracer %v err %v", tr, err)
	}
}
